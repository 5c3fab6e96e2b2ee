#!/usr/bin/env bash
# Wrapper used on the lent GPU machine: unpack libdw (needed by the nsys report importer
# shipped inside Nsight Compute), record the machine, run capture.sh with a time budget,
# and pack the results into $OUT (at most 8 files of < 16 MiB each).
#   bash sample_traces/workloads/device_run.sh BUDGET_S TARGET...
set -uo pipefail
budget=$1; shift
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p /tmp/dw
for f in "$ROOT"/.dw/*.deb; do dpkg -x "$f" /tmp/dw; done
export LD_LIBRARY_PATH=/tmp/dw/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
NSYS=${NSYS:-/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys}
export NSYS
name=${CAPTURE_NAME:-capture}
res=/tmp/$name
mkdir -p $res
{
  echo "date: $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
  nvidia-smi topo -m 2>/dev/null | head -8
  echo "nsys: $($NSYS --version)"
  echo "ncu: $(ncu --version | tail -1)"
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
} > $res/machine.txt 2>&1
cat $res/machine.txt
timeout "$budget" bash "$ROOT/sample_traces/workloads/capture.sh" $res "$@" 2>&1 | tee $res/capture_log.txt
cd /tmp && tar --exclude="*.nsys-rep" -cf - "$name" | xz -T0 -6 > "/tmp/$name.tar.xz"
split -b 15M -d "/tmp/$name.tar.xz" "$OUT/$name.tar.xz.part"
ls -la "$OUT"; du -sh $res/*
