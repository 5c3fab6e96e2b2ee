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
