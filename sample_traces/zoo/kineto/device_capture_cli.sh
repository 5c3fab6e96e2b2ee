#!/usr/bin/env bash
# `tracekit capture torch` end to end on the GPU machine: the CLI itself (the experiment folder,
# the start-up hook, the opening and summary of what it wrote), not only its hook. The machine
# has torch but no package index: tracekit's own dependencies come as py3.12 wheels in .whl/
# (git-ignored: polars' runtime as a tar.xz, the rest as wheels), unpacked to a site folder.
#   bash sample_traces/zoo/kineto/device_capture_cli.sh        # on the GPU machine; results in $OUT
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
SP=/tmp/tk-site; mkdir -p "$SP"
tar -xJf "$ROOT/.whl/polars_rt.tar.xz" -C "$SP"
for w in "$ROOT"/.whl/*.whl; do python3 -m zipfile -e "$w" "$SP"; done
export PYTHONPATH="$SP:$ROOT" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
TK=(python3 -m tracekit.cli.entry)
res=/tmp/cli; mkdir -p "$res"
{ echo "date: $(date -u +%FT%TZ)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, polars; print('torch', torch.__version__, 'polars', polars.__version__)"; } > "$res/machine.txt" 2>&1
cd "$ROOT/sample_traces/zoo/kineto/memory"
# generate(): recorded whole, allocator events, a range per module (depth 3)
"${TK[@]}" capture torch --steps 0 --profile-memory --annotate-torch -o "$res/gen" -- python3 m02_generate_memory.py > "$res/gen.log" 2>&1
echo "rc=$?" >> "$res/gen.log"
# training: a schedule of optimizer steps (1 waited, 2 recorded), ranges to depth 2
"${TK[@]}" capture torch --skip 1 --steps 2 --profile-memory --annotate-torch=2 -o "$res/train" -- python3 m01_train_memory.py > "$res/train.log" 2>&1
echo "rc=$?" >> "$res/train.log"
for t in "$res"/gen/*/*.pt.trace.json.gz; do
  "${TK[@]}" diagnose "$t" > "$res/gen.diagnose.txt" 2>&1; echo "rc=$?" >> "$res/gen.diagnose.txt"
done
tail -n 25 "$res"/*.log
cd /tmp && tar -cf - cli | xz -T0 -6 > "$OUT/cli.tar.xz"
ls -la "$OUT"
