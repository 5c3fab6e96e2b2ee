#!/usr/bin/env bash
# Set up everything the test suite needs on a fresh machine, then run it.
#   bash tests/run.sh [pytest args...]
# Creates .venv (Python >= 3.11), installs tracekit with all extras and the dev group,
# installs Debian's chromium for the browser tests when apt is available, and runs pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[all]' --group dev
# PyTorch's CPU build for the per-module NVTX tests (tests/test_torch_annotate.py): only a local
# or CPU-index wheel, never the several-GB CUDA build; without one those tests are skipped
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install -q "torch==2.13.0+cpu" 2>/dev/null \
    || echo "tests/run.sh: no CPU build of torch 2.13.0 here; the torch annotation tests will be skipped" >&2
fi
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "tests/run.sh: could not install chromium; browser tests will be skipped" >&2
fi
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then
  echo "tests/run.sh: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
