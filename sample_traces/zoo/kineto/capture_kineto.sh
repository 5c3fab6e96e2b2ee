#!/usr/bin/env bash
# Run zoo programs under torch.profiler, unmodified, through tracekit's start-up hook (what
# `tracekit capture torch` does), one after another on one GPU:
#
#   bash sample_traces/zoo/kineto/capture_kineto.sh OUTDIR PROGRAM...   (PROGRAM: training/t04_accelerate_accum …)
#
# Training programs get a schedule (3 optimizer steps waited, 1 warmed up, 5 recorded);
# generation programs are recorded whole (they step no optimizer); the memory programs
# (kineto/memory/m*) are recorded whole with profile_memory and a range per module. Per program, OUTDIR/NAME/
# gets command.txt, NAME.program.log (the program's TRUTH line, its own CUDA-event clock, in
# the profiled run) and NAME.pt.trace.json.gz (torch.profiler's trace; one per rank).
set -uo pipefail
OUT=$(realpath -m "$1"); shift
HERE=$(cd "$(dirname "$0")/.." && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PY=${PYTHON:-python3}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export TORCHINDUCTOR_COMPILE_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
export PYTHONPATH="$ROOT/tracekit/capture/torch_autoload${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"
START=$(date +%s)
BUDGET=${BUDGET:-100000}  # seconds: no program starts after this much time
for prog in "$@"; do
  name=$(basename "$prog"); dir="$OUT/$name"
  if (( $(date +%s) - START > BUDGET )); then echo "== budget spent: $name not run"; continue; fi
  mkdir -p "$dir"
  annotate=""
  case "$name" in
    t*) cfg="{\"out\": \"$dir\", \"skip\": 3, \"steps\": 5, \"record_shapes\": true}" ;;
    # the memory programs: allocator events and a record_function range per module (depth 3),
    # what `tracekit capture torch --profile-memory --annotate-torch` sets; recorded whole
    m*) cfg="{\"out\": \"$dir\", \"record_shapes\": true, \"profile_memory\": true}"; annotate='{"depth": 3}' ;;
    *)  cfg="{\"out\": \"$dir\", \"record_shapes\": true}" ;;
  esac
  run=("$PY" "$name.py")
  case "$name" in
    t07_*) run=("$PY" -m torch.distributed.run --standalone --nproc_per_node=1 "$name.py") ;;
  esac
  echo "cd sample_traces/zoo/$(dirname "$prog") && PYTHONPATH=tracekit/capture/torch_autoload TRACEKIT_TORCH_PROFILE='$cfg'${annotate:+ TRACEKIT_ANNOTATE_TORCH='$annotate'} ${run[*]}" > "$dir/command.txt"
  echo "== $name"
  t0=$(date +%s)
  (cd "$HERE/$(dirname "$prog")" && TRACEKIT_TORCH_PROFILE="$cfg" TRACEKIT_ANNOTATE_TORCH="$annotate" timeout 400 "${run[@]}") > "$dir/$name.program.log" 2>&1
  echo "   rc=$? $(( $(date +%s) - t0 )) s; $(grep -c TRUTH "$dir/$name.program.log") TRUTH line(s); $(grep 'tracekit:' "$dir/$name.program.log" | tail -2)"
  i=0
  for f in "$dir"/*.pt.trace.json.gz; do
    [ -e "$f" ] || continue
    case "$(basename "$f")" in "$name"*) continue ;; esac
    rank=$(basename "$f" | sed -n 's/.*\.rank\([0-9]*\)\.pt\.trace\.json\.gz/\1/p')
    mv "$f" "$dir/$name${rank:+.rank$rank}.pt.trace.json.gz"; i=$((i+1))
  done
  ls -la "$dir" | tail -n +4
done
