#!/usr/bin/env bash
# Run the two-GPU programs twice each, one after the other: under torch.profiler per rank
# (tracekit's start-up hook, what `tracekit capture torch` runs) and under Nsight Systems per
# rank (`torchrun --no-python nsys profile … python3 PROGRAM.py`), so that every answer can be
# compared between the two sources of the same program.
#
#   bash sample_traces/zoo/ranks/capture_ranks.sh OUTDIR PROGRAM...     (PROGRAM: r01_fsdp2_2gpu …)
#
# Per program, OUTDIR/NAME/ gets command.txt, NAME.kineto.log and NAME.nsys.log (what the
# program printed in each run: one TRUTH line per rank, its own CUDA-event clock),
# NAME.rank{0,1}.pt.trace.json.gz and NAME.rank{0,1}.sqlite.xz. NSYS names nsys.
set -uo pipefail
OUT=$(realpath -m "$1"); shift
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
NSYS=${NSYS:-$(command -v nsys || echo /opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys)}
PY=${PYTHON:-python3}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export TORCHINDUCTOR_COMPILE_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
RUN=("$PY" -m torch.distributed.run --standalone --nproc_per_node=2)
mkdir -p "$OUT"
pids=()
for name in "$@"; do
  dir="$OUT/$name"; mkdir -p "$dir"
  case "$name" in
    # training: 3 optimizer steps waited, 1 warmed up, 5 recorded, with shapes, allocator events and stacks
    r01_*|r02_*) cfg="{\"out\": \"$dir/kineto\", \"skip\": 3, \"steps\": 5, \"record_shapes\": true, \"profile_memory\": true, \"with_stack\": true}" ;;
    *) cfg="{\"out\": \"$dir/kineto\", \"record_shapes\": true}" ;;  # generation: recorded whole
  esac
  nsys_opts=(profile --trace=cuda,nvtx,osrt --sample=none --cpuctxsw=none --force-overwrite=true -o "$dir/$name.rank%q{RANK}")
  {
    echo "cd sample_traces/zoo/ranks && PYTHONPATH=tracekit/capture/torch_autoload TRACEKIT_TORCH_PROFILE='$cfg' ${RUN[*]} $name.py"
    echo "cd sample_traces/zoo/ranks && ${RUN[*]} --no-python $NSYS ${nsys_opts[*]} $PY $name.py"
    echo "$NSYS export --type=sqlite --force-overwrite=true -o $name.rankN.sqlite $name.rankN.nsys-rep"
  } > "$dir/command.txt"
  echo "== $name kineto $(date -u +%T)"; t0=$(date +%s)
  (cd "$HERE" && PYTHONPATH="$ROOT/tracekit/capture/torch_autoload" TRACEKIT_TORCH_PROFILE="$cfg" timeout ${PROGRAM_TIMEOUT:-200} "${RUN[@]}" "$name.py") \
    > "$dir/$name.kineto.log" 2>&1
  echo "   rc=$? $(( $(date +%s) - t0 )) s; $(grep -c '^TRUTH' "$dir/$name.kineto.log") TRUTH line(s)"
  for f in "$dir"/kineto/*.pt.trace.json.gz; do
    [ -e "$f" ] || continue
    rank=$(basename "$f" | sed -n 's/.*\.rank\([0-9]*\)\.pt\.trace\.json\.gz/\1/p')
    mv "$f" "$dir/$name.rank$rank.pt.trace.json.gz"
  done
  rmdir "$dir/kineto" 2>/dev/null
  echo "== $name nsys $(date -u +%T)"; t0=$(date +%s)
  (cd "$HERE" && timeout ${PROGRAM_TIMEOUT:-200} "${RUN[@]}" --no-python "$NSYS" "${nsys_opts[@]}" "$PY" "$name.py") > "$dir/$name.nsys.log" 2>&1
  echo "   rc=$? $(( $(date +%s) - t0 )) s; $(grep -c '^TRUTH' "$dir/$name.nsys.log") TRUTH line(s)"
  for rep in "$dir"/*.nsys-rep; do
    [ -e "$rep" ] || continue
    ( "$NSYS" export --type=sqlite --force-overwrite=true -o "${rep%.nsys-rep}.sqlite" "$rep" > "${rep%.nsys-rep}.export.log" 2>&1 \
        && rm -f "$rep" && xz -T2 -6 "${rep%.nsys-rep}.sqlite" ) &
    pids+=($!)
  done
  ls -la "$dir" | tail -n +4
done
wait "${pids[@]}"
du -sh "$OUT"/*/*
