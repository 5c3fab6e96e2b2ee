#!/usr/bin/env bash
# The device call: unpack libdw/libelf (the nsys importer needs them), record the machine,
# capture, and pack the results into $OUT (≤ 8 files of < 16 MiB).
#   bash sample_traces/zoo/device_zoo.sh TAG PROGRAM...
set -uo pipefail
tag=$1; shift
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p /tmp/dw; for f in "$ROOT"/.dw/*.deb; do dpkg -x "$f" /tmp/dw; done
export LD_LIBRARY_PATH=/tmp/dw/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
NSYS=${NSYS:-/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys}; export NSYS
res=/tmp/$tag; mkdir -p $res
{ echo "date: $(date -u +%FT%TZ)"; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
  echo "nsys: $($NSYS --version)"; nproc
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
} > $res/machine.txt 2>&1
cat $res/machine.txt
"$NSYS" profile --help 2>&1 | grep -i -A2 python | head -20
bash "$ROOT/sample_traces/zoo/capture_zoo.sh" $res "$@" 2>&1 | tee $res/capture_log.txt
find $res -name '*.nsys-rep' -delete
cd /tmp && tar -cf - "$tag" | xz -T0 -1 > "/tmp/$tag.tar.xz"   # the exports are xz already
split -b 15M -d "/tmp/$tag.tar.xz" "$OUT/$tag.tar.xz.part"
ls -la "$OUT"
