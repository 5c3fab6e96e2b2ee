#!/usr/bin/env bash
# The device call on a two-GPU machine: unpack libdw/libelf (the nsys importer needs them),
# record the machine, run capture_ranks.sh, recompress torch's gzip as xz, pack into $OUT.
#   bash sample_traces/zoo/ranks/device_ranks.sh TAG PROGRAM...
set -uo pipefail
tag=$1; shift
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
mkdir -p /tmp/dw; for f in "$ROOT"/.dw/*.deb; do dpkg -x "$f" /tmp/dw; done
export LD_LIBRARY_PATH=/tmp/dw/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
NSYS=${NSYS:-/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys}; export NSYS
res=/tmp/$tag; mkdir -p "$res"
{ echo "date: $(date -u +%FT%TZ)"; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
  nvidia-smi topo -m 2>&1 | head -4; echo "nsys: $($NSYS --version)"; nproc
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), 'transformers', transformers.__version__)"
} > "$res/machine.txt" 2>&1
cat "$res/machine.txt"
bash "$HERE/capture_ranks.sh" "$res" "$@" 2>&1 | tee "$res/capture_log.txt"
for f in "$res"/*/*.pt.trace.json.gz; do [ -e "$f" ] && zcat "$f" | xz -T0 -6 > "${f%.gz}.xz" && rm "$f"; done
cd /tmp && tar -cf - "$tag" | xz -T0 -1 > "/tmp/$tag.tar.xz"
split -b 15M -d "/tmp/$tag.tar.xz" "$OUT/$tag.tar.xz.part"
ls -la "$OUT"
