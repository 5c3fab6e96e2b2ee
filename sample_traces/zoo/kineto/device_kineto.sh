#!/usr/bin/env bash
# The device call for the Kineto zoo: record the machine, run the programs under torch.profiler
# (capture_kineto.sh), pack the results into $OUT (≤ 8 files of < 16 MiB).
#   bash sample_traces/zoo/kineto/device_kineto.sh TAG PROGRAM...
set -uo pipefail
tag=$1; shift
HERE=$(cd "$(dirname "$0")" && pwd)
res=/tmp/$tag; mkdir -p "$res"
{ echo "date: $(date -u +%FT%TZ)"; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; nproc
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
} > "$res/machine.txt" 2>&1
cat "$res/machine.txt"
bash "$HERE/capture_kineto.sh" "$res" "$@" 2>&1 | tee "$res/capture_log.txt"
# gzip to xz (the zoo keeps .json.xz: 3-4x smaller than torch's gzip on these traces)
for f in "$res"/*/*.pt.trace.json.gz; do [ -e "$f" ] && zcat "$f" | xz -T0 -6 > "${f%.gz}.xz" && rm "$f"; done
cd /tmp && tar -cf - "$tag" | xz -T0 -6 > "/tmp/$tag.tar.xz"
split -b 15M -d "/tmp/$tag.tar.xz" "$OUT/$tag.tar.xz.part"
ls -la "$OUT"
