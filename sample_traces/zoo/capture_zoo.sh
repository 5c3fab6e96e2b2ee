#!/usr/bin/env bash
# Capture zoo programs under Nsight Systems on a GPU machine, one after another (the GPU is
# never shared), exporting each report to SQLite in the background while the next runs.
#
#   bash sample_traces/zoo/capture_zoo.sh OUTDIR PROGRAM...      (PROGRAM: generation/g01_llama_b1_prompts …)
#
# Per program, OUTDIR/NAME/ gets command.txt (the exact commands), NAME.program.log (what the
# program printed: its TRUTH line), NAME.profile.log (nsys), NAME.sqlite.xz. NSYS names nsys
# (default: nsys on PATH, else the copy shipped inside Nsight Compute 2025.3.1).
set -uo pipefail
OUT=$(realpath -m "$1"); shift
HERE=$(cd "$(dirname "$0")" && pwd)
NSYS=${NSYS:-$(command -v nsys || echo /opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys)}
PY=${PYTHON:-python3}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export TORCHINDUCTOR_COMPILE_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
mkdir -p "$OUT"
# the whole run is captured (start-up, warm-up and tear-down are part of what is read)
BASE=(--trace=cuda,nvtx --sample=none --cpuctxsw=none --force-overwrite=true)
pids=()
START=$(date +%s)
BUDGET=${BUDGET:-100000}  # seconds: no program starts after this much time
for prog in "$@"; do
  if (( $(date +%s) - START > BUDGET )); then echo "== budget spent: $prog and the rest not run"; continue; fi
  name=$(basename "$prog"); dir="$OUT/$name"; mkdir -p "$dir"
  opts=("${BASE[@]}")
  args=()
  case "$name" in
    g11_*) opts=(--trace=cuda,nvtx,osrt --sample=process-tree --cpuctxsw=process-tree --python-sampling=true
                 --python-sampling-frequency=250 --force-overwrite=true) ;;  # a slow host: OS runtime + Python sampling
    g12_*) opts+=(--trace-fork-before-exec=true) ;;
    g19_*) args=(--requests 2) ;;
  esac
  run=("$PY" "$(basename "$prog").py" "${args[@]}")
  case "$name" in
    t07_*) run=("$PY" -m torch.distributed.run --standalone --nproc_per_node=1 "$(basename "$prog").py") ;;  # torchrun
  esac
  cmd=("$NSYS" profile "${opts[@]}" -o "$dir/$name" "${run[@]}")
  echo "cd sample_traces/zoo/$(dirname "$prog") && ${cmd[*]}" > "$dir/command.txt"
  echo "$NSYS export --type=sqlite --force-overwrite=true -o $name.sqlite $name.nsys-rep" >> "$dir/command.txt"
  echo "== $name $(date -u +%T)"
  t0=$(date +%s)
  (cd "$HERE/$(dirname "$prog")" && timeout ${PROGRAM_TIMEOUT:-240} "${cmd[@]}" > "$dir/$name.program.log" 2> "$dir/$name.profile.log")
  echo "   rc=$? $(( $(date +%s) - t0 )) s; $(grep -c '^TRUTH' "$dir/$name.program.log") TRUTH line(s)"
  tail -3 "$dir/$name.profile.log" | cut -c1-200
  ( "$NSYS" export --type=sqlite --force-overwrite=true -o "$dir/$name.sqlite" "$dir/$name.nsys-rep" > "$dir/export.log" 2>&1 \
      && rm -f "$dir/$name.nsys-rep" && xz -T2 -6 "$dir/$name.sqlite" ) &
  pids+=($!)
done
wait "${pids[@]}"
du -sh "$OUT"/*/*.xz
