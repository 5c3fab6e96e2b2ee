#!/usr/bin/env bash
# tracekit.capture end to end on a GPU machine: nsys, ncu, nsys+ncu, the torchrun preset on two
# GPUs, a 2x2 sweep, the CLI, exit codes, timeouts and the missing-libdw diagnosis.
#
#   bash tests/gpu/capture_e2e.sh          (from the repository root; see tests/gpu/README.md)
#
# Needs .whl/ (tracekit's dependencies as cp312 wheels) and .dw/ (libdw1 and libelf1 .debs).
# Results: $OUT (or /tmp/capture_e2e_out) gets e2e_results.json, e2e_summary.txt, machine.txt
# and capture_e2e.tar.xz.partNN (the whole work folder, at most 5 parts of 15 MiB).
# BUDGET_S (default 470) bounds the whole script, packing included.
set -uo pipefail
ROOT=$(pwd)
[ -f "$ROOT/tracekit/capture/__init__.py" ] || { echo "run this from the repository root" >&2; exit 2; }
RESULTS=${OUT:-/tmp/capture_e2e_out}
WORK=/tmp/capture_e2e
BUDGET=${BUDGET_S:-470}
start=$SECONDS
rm -rf "$WORK" && mkdir -p "$WORK" "$RESULTS" /tmp/dw

# libdw for the nsys report importer shipped inside Nsight Compute (as in sample_traces/workloads/device_run.sh)
for f in "$ROOT"/.dw/*.deb; do dpkg -x "$f" /tmp/dw; done
LIBDW=/tmp/dw/usr/lib/x86_64-linux-gnu
[ -e "$LIBDW/libdw.so.1" ] || echo "warning: no libdw.so.1 under $LIBDW (is .dw/ carried?)" >&2

# tracekit's dependencies from carried wheels; tracekit itself from the working tree
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$ROOT"/.whl/*.whl || { echo "installing .whl/*.whl failed (is .whl/ carried?)" >&2; exit 1; }
export PYTHONPATH=/tmp/site:$ROOT${PYTHONPATH:+:$PYTHONPATH}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export NCU=${NCU:-$(command -v ncu || echo /opt/nvidia/nsight-compute/2025.3.1/ncu)}
export NSYS=${NSYS:-$(command -v nsys || echo /opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys)}

{
  echo "date: $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
  echo "nsys: $NSYS $("$NSYS" --version 2>&1 | tail -1)"
  echo "ncu: $NCU $("$NCU" --version 2>&1 | tail -1)"
  echo "uid: $(id -u)  RmProfilingAdminOnly: $(grep -s RmProfilingAdminOnly /proc/driver/nvidia/params | awk '{print $2}')"
  python3 -c "import sys, torch, polars; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'polars', polars.__version__)"
} > "$WORK/machine.txt" 2>&1
cat "$WORK/machine.txt"

# the checks get what is left after set-up, less 50 s for packing; each run inside is capped to fit
left=$((BUDGET - (SECONDS - start) - 50))
timeout -s TERM -k 45 "$left" python3 "$ROOT/tests/gpu/capture_e2e.py" \
    --work "$WORK" --libdw "$LIBDW" --budget $((left - 15)) 2>&1 | tee "$WORK/e2e_log.txt"

cp "$WORK/machine.txt" "$RESULTS/"
cp "$WORK/e2e_results.json" "$RESULTS/" 2>/dev/null || echo '{"error": "no results written"}' > "$RESULTS/e2e_results.json"
sed -n '/^== summary/,$p' "$WORK/e2e_log.txt" > "$RESULTS/e2e_summary.txt"
pack() { (cd /tmp && tar cf - "$@" capture_e2e | xz -T0 -6 > /tmp/capture_e2e.tar.xz); }
pack
limit=$((5 * 15 * 1024 * 1024))
if [ "$(stat -c %s /tmp/capture_e2e.tar.xz)" -gt $limit ]; then  # keep the .sqlite exports, drop the raw reports
  pack --exclude='*.nsys-rep' --exclude='*.qdstrm'
fi
if [ "$(stat -c %s /tmp/capture_e2e.tar.xz)" -gt $limit ]; then  # keep logs, JSON, CSV and YAML only
  pack --exclude='*.nsys-rep' --exclude='*.qdstrm' --exclude='*.sqlite' --exclude='*.ncu-rep'
fi
split -b 15M -d /tmp/capture_e2e.tar.xz "$RESULTS/capture_e2e.tar.xz.part"
echo "== packed in $((SECONDS - start)) s total"
ls -la "$RESULTS"
cat "$RESULTS/e2e_summary.txt"
