#!/usr/bin/env bash
# Capture tracekit's sample traces on a GPU machine with the real nsys and ncu.
#
#   bash sample_traces/workloads/capture.sh OUTDIR TARGET...
#
# TARGETs: decode1 train1 tp2 tp2ranks tp2pp2 customar ncu_drill ncu_full ncu_prec planted planted_metrics planted_sync planted_ncu ncu_int8 reexport
#          hf_eager graph1 compile compile_functional tp2graph overhead (issue 26: HF generate, CUDA graphs, torch.compile)
#          dp_ddp dp_exposed dp_fsdp2 gen_calls gen_calls_annot serve_inproc serve_child micro compile_where (issue 36: run structure)
# NSYS / NCU name the tools (default: nsys/ncu on PATH, else the nsys shipped inside
# Nsight Compute 2025.3.1). Each nsys target leaves NAME.nsys-rep, NAME.sqlite and the
# `nsys stats --format csv` output of that same nsys in OUTDIR/NAME/; each ncu target
# leaves NAME.ncu-rep and `ncu --import --csv` pages beside it.
set -uo pipefail
OUT=$(realpath -m "$1"); shift
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
NSYS=${NSYS:-$(command -v nsys || echo /opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys)}
NCU=${NCU:-$(command -v ncu || echo /opt/nvidia/nsight-compute/2025.3.1/ncu)}
PY=${PYTHON:-python3}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
cd "$HERE"

REPORTS=cuda_gpu_kern_sum,cuda_gpu_mem_time_sum,cuda_gpu_mem_size_sum,cuda_api_sum,nvtx_sum,nvtx_gpu_proj_trace,nvtx_gpu_proj_sum,nvtx_kern_sum,cuda_kern_exec_sum,cuda_kern_exec_trace,cuda_gpu_trace
BLOBS=()
# Read the whole help first: `nsys export --help | grep -q` under pipefail fails (grep -q
# exits early, nsys gets SIGPIPE), which left the first capture's sqlite files without blobs.
EXPORT_HELP=$("$NSYS" export --help 2>&1 || true)
if grep -q -- "--include-blobs" <<<"$EXPORT_HELP"; then BLOBS=(--include-blobs=true); fi
COMMON=(--trace=cuda,nvtx,osrt --cuda-memory-usage=true --capture-range=cudaProfilerApi
        --capture-range-end=stop --force-overwrite=true)
METRICS=(--gpu-metrics-devices=all --gpu-metrics-frequency=2000)
# planted-problem captures: small, the whole run (the first step is the warm-up to detect)
PLANTED=(--trace=cuda,nvtx --sample=none --cpuctxsw=none --cuda-memory-usage=true --force-overwrite=true)
# 4 GPUs: 250 Hz and 4 steps (at 1000 Hz GPU_METRICS alone took 3.7 MB of a 6.2 MB sqlite)
METRICS_PP=(--gpu-metrics-devices=all --gpu-metrics-frequency=250)

export_and_stats() {  # DIR NAME: .nsys-rep -> .sqlite -> stats CSVs
  local dir=$1 name=$2
  "$NSYS" export --type=sqlite "${BLOBS[@]}" --force-overwrite=true \
      -o "$dir/$name.sqlite" "$dir/$name.nsys-rep" || return 1
  "$NSYS" stats --format=csv --report="$REPORTS" --force-overwrite=true \
      --output="$dir/stats/$name" "$dir/$name.sqlite" >/dev/null 2>"$dir/stats/$name.stderr.txt"
  ls "$dir/stats" | head -40
}

# issue 26 captures: no OS-runtime trace, no CPU sampling (smaller files)
LLM=(--trace=cuda,nvtx --sample=none --cpuctxsw=none --cuda-memory-usage=true --capture-range=cudaProfilerApi
     --capture-range-end=stop --force-overwrite=true)
llm_target() {  # NAME -- NSYS-OPTIONS... COMMAND...
  local name=$1; shift; shift
  local dir="$OUT/$name"; mkdir -p "$dir/stats"
  echo "== $name: $NSYS profile ${LLM[*]} -o $dir/$name $*" | tee "$dir/command.txt"
  "$NSYS" profile "${LLM[@]}" -o "$dir/$name" "$@" > "$dir/profile_log.txt" 2>&1; tail -25 "$dir/profile_log.txt"
  export_and_stats "$dir" "$name"
}

nsys_target() {  # NAME -- COMMAND...
  local name=$1; shift; shift
  local dir="$OUT/$name"; mkdir -p "$dir/stats"
  echo "== $name: $NSYS profile ${COMMON[*]} -o $dir/$name $*" | tee "$dir/command.txt"
  "$NSYS" profile "${COMMON[@]}" -o "$dir/$name" "$@" 2>&1 | tail -25
  export_and_stats "$dir" "$name"
}

ncu_csv() {  # DIR NAME
  local dir=$1 name=$2
  "$NCU" --import "$dir/$name.ncu-rep" --csv --page raw --print-units base > "$dir/$name.raw.csv"
  "$NCU" --import "$dir/$name.ncu-rep" --csv --page details --print-details all > "$dir/$name.details.csv"
  "$NCU" --import "$dir/$name.ncu-rep" --csv --page session > "$dir/$name.session.csv"
}

# SpeedOfLight_HierarchicalTensorRooflineChart is left out here: it added ~760 detail rows
# and ~500 KB of report per kernel (a 60-kernel drill-down came to 39 MB); --set full keeps it.
DRILL_SECTIONS=(--section SpeedOfLight --section SpeedOfLight_RooflineChart
  --section ComputeWorkloadAnalysis
  --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats)
TENSOR_METRICS=sm__ops_path_tensor_src_bf16_dst_fp32.sum,sm__ops_path_tensor_src_fp16.sum,sm__ops_path_tensor_src_tf32_dst_fp32.sum,sm__ops_path_tensor_src_fp8.sum,sm__ops_path_tensor_src_fp64.sum,sm__inst_executed_pipe_tensor_op_gmma.sum,dram__bytes_read.sum,dram__bytes_write.sum

# issue 36 (run structure): whole runs as users profile them (start-up included, no capture
# range, no NVTX unless said), summary stats only (the *_trace reports would be larger than the files)
RS=(--trace=cuda,nvtx --sample=none --cpuctxsw=none --cuda-memory-usage=true --force-overwrite=true)
SUM_REPORTS=cuda_gpu_kern_sum,cuda_gpu_mem_time_sum,cuda_gpu_mem_size_sum,cuda_api_sum,nvtx_sum,nvtx_gpu_proj_sum,cuda_kern_exec_sum
export_sum() {  # DIR NAME: .nsys-rep -> .sqlite -> summary stats CSVs
  local dir=$1 name=$2
  "$NSYS" export --type=sqlite "${BLOBS[@]}" --force-overwrite=true -o "$dir/$name.sqlite" "$dir/$name.nsys-rep" >/dev/null || return 1
  "$NSYS" stats --format=csv --report="$SUM_REPORTS" --force-overwrite=true \
      --output="$dir/stats/$name" "$dir/$name.sqlite" >/dev/null 2>"$dir/stats/$name.stderr.txt"
  ls -la "$dir"
}
rs_target() {  # NAME -- NSYS-OPTIONS... COMMAND...
  local name=$1; shift; shift
  local dir="$OUT/$name"; mkdir -p "$dir/stats"
  local rs=("${RS[@]}"); [ -n "${RS_TRACE:-}" ] && rs[0]="--trace=$RS_TRACE"
  echo "== $name: $NSYS profile ${rs[*]} -o $dir/$name $*" | tee "$dir/command.txt"
  "$NSYS" profile "${rs[@]}" -o "$dir/$name" "$@" > "$dir/profile_log.txt" 2>&1; grep -v -i warn "$dir/profile_log.txt" | tail -8
  export_sum "$dir" "$name"
}
ANNOTATE=(env "PYTHONPATH=$ROOT/tracekit/capture/torch_autoload" "TRACEKIT_ANNOTATE_TORCH={}")
SERVE=(--layout child --requests 12 --rate 12)

for target in "$@"; do
  SECONDS=0
  case $target in
    decode1) nsys_target llm_decode_1gpu -- "${METRICS[@]/all/0}" "$PY" decode.py --steps 8 ;;
    train1) nsys_target llm_train_emit_nvtx_1gpu -- "$PY" train_emit_nvtx.py --steps 2 ;;
    tp2) nsys_target llm_tp2_nccl -- "${METRICS[@]}" "$PY" -m torch.distributed.run --nproc-per-node 2 decode.py --tp 2 --steps 8 ;;
    tp2pp2) nsys_target llm_tp2pp2_nccl -- "${METRICS_PP[@]}" "$PY" -m torch.distributed.run --nproc-per-node 4 decode.py --tp 2 --pp 2 --steps 4 ;;
    customar) nsys_target custom_allreduce_2gpu -- "$PY" -m torch.distributed.run --nproc-per-node 2 custom_allreduce.py ;;
    tp2ranks)
      name=llm_tp2_nccl_per_rank; dir="$OUT/$name"; mkdir -p "$dir/stats"
      echo "== $name: $PY -m torch.distributed.run --nproc-per-node 2 --no-python $NSYS profile ${COMMON[*]} -o $dir/${name}_rank%q{RANK} $PY decode.py --tp 2 --steps 8" | tee "$dir/command.txt"
      "$PY" -m torch.distributed.run --nproc-per-node 2 --no-python "$NSYS" profile "${COMMON[@]}" \
          -o "$dir/${name}_rank%q{RANK}" "$PY" decode.py --tp 2 --steps 8 2>&1 | tail -25
      for r in 0 1; do export_and_stats "$dir" "${name}_rank$r"; done ;;
    ncu_drill)
      dir="$OUT/ncu_decode_drilldown"; mkdir -p "$dir"
      "$NCU" --nvtx --nvtx-include "step.1/" "${DRILL_SECTIONS[@]}" --import-sass no \
          --clock-control none -f -o "$dir/ncu_decode_drilldown" "$PY" decode.py --steps 2 --warmup 1 2>&1 | tail -8
      ncu_csv "$dir" ncu_decode_drilldown ;;
    ncu_full)
      dir="$OUT/ncu_probe_full"; mkdir -p "$dir"
      "$NCU" --nvtx --nvtx-include "full/" --set full --import-sass no --clock-control none \
          -f -o "$dir/ncu_probe_full" "$PY" ncu_probe.py --mode full 2>&1 | tail -8
      ncu_csv "$dir" ncu_probe_full ;;
    ncu_prec)
      dir="$OUT/ncu_precisions"; mkdir -p "$dir"
      "$NCU" --nvtx --nvtx-include "prec/" "${DRILL_SECTIONS[@]}" --metrics "$TENSOR_METRICS" \
          --import-sass no --clock-control none -f -o "$dir/ncu_precisions" "$PY" ncu_probe.py --mode prec 2>&1 | tail -8
      ncu_csv "$dir" ncu_precisions ;;
    planted|planted_metrics|planted_sync)  # one capture per planted problem (planted.py); planted_metrics: the two with GPU metrics
      probs=(clean clean_nonvtx host_bound launch_bound sync_stall pageable_memcpy no_tensor_cores memory_growth)
      [ "$target" = planted_metrics ] && probs=(clean no_tensor_cores)
      [ "$target" = planted_sync ] && probs=(sync_stall)
      for prob in "${probs[@]}"; do
        name=planted_$prob; dir="$OUT/$name"; mkdir -p "$dir/stats"
        # GPU metrics only inside the loop (10 kHz over the whole run made a 40 MB export)
        extra=(); args=(); case $prob in clean|no_tensor_cores) extra=(--gpu-metrics-devices=0 --gpu-metrics-frequency=10000
          --capture-range=cudaProfilerApi --capture-range-end=stop); args=(--profile-range --steps 20) ;; esac
        cmd=("$NSYS" profile "${PLANTED[@]}" "${extra[@]}" -o "$dir/$name" "$PY" planted.py --problem "$prob" "${args[@]}")
        echo "== $name: ${cmd[*]}" | tee "$dir/command.txt"
        "${cmd[@]}" 2>&1 | tail -6
        if [ ! -f "$dir/$name.nsys-rep" ] && [ ${#extra[@]} -gt 0 ]; then  # GPU metrics refused: retry without
          cmd=("$NSYS" profile "${PLANTED[@]}" -o "$dir/$name" "$PY" planted.py --problem "$prob")
          echo "== retry without GPU metrics: ${cmd[*]}" | tee -a "$dir/command.txt"
          "${cmd[@]}" 2>&1 | tail -6
        fi
        export_and_stats "$dir" "$name" >/dev/null
        "$NSYS" analyze --format csv --output "$dir/stats/$name" --force-overwrite=true "$dir/$name.sqlite" \
            >"$dir/stats/$name.analyze.txt" 2>&1 || true
      done ;;
    planted_ncu)  # ncu drill-down of one steady-state step of two planted workloads
      for prob in clean no_tensor_cores; do
        name=ncu_planted_$prob; dir="$OUT/$name"; mkdir -p "$dir"
        "$NCU" --nvtx --nvtx-include "step.3/" "${DRILL_SECTIONS[@]}" --metrics "$TENSOR_METRICS" --import-sass no \
            --clock-control none -f -o "$dir/$name" "$PY" planted.py --problem "$prob" --steps 5 2>&1 | tail -8
        ncu_csv "$dir" "$name"
      done ;;
    ncu_int8)  # an INT8 tensor-core GEMM with every section (integer tensor ops in the roofline)
      dir="$OUT/ncu_int8"; mkdir -p "$dir"
      "$NCU" --nvtx --nvtx-include "int8/" --set full --import-sass no --clock-control none \
          -f -o "$dir/ncu_int8" "$PY" ncu_probe.py --mode int8 2>&1 | tail -8
      ncu_csv "$dir" ncu_int8 ;;
    reexport)  # re-run export + stats on every OUTDIR/*/*.nsys-rep already there
      for rep in "$OUT"/*/*.nsys-rep; do
        d=$(dirname "$rep"); n=$(basename "$rep" .nsys-rep); mkdir -p "$d/stats"
        echo "== reexport $n: $NSYS export --type=sqlite ${BLOBS[*]}"
        export_and_stats "$d" "$n" >/dev/null
      done ;;
    # --- issue 26: LLM stacks (HF generate, CUDA graphs, torch.compile, TP decode in graphs) ---
    hf_eager)  # HF generate(), unmodified script, per-module ranges from tracekit's --annotate-torch
      name=hf_generate_eager; dir="$OUT/$name"; mkdir -p "$dir/stats"
      cmd=("$PY" -m tracekit.cli.main capture nsys --annotate-torch --trace cuda,nvtx --sample none --cpuctxsw none
           --capture-range cudaProfilerApi --cuda-memory-usage --nsys-path "$NSYS" --name "$name" --out "$dir/run"
           -- "$PY" hf_generate.py --mode eager --batch 8 --prompt 512 --new-tokens 24)
      echo "== $name: PYTHONPATH=$ROOT ${cmd[*]}" | tee "$dir/command.txt"
      PYTHONPATH="$ROOT" "${cmd[@]}" 2>&1 | tail -30
      run=$(ls -d "$dir"/run/*/ | head -1)
      for f in report.nsys-rep report.sqlite experiment.json command.txt env.json nsys.stdout.log nsys.stderr.log summary.json; do
        [ -f "$run/$f" ] && cp "$run/$f" "$dir/$([ "${f%%.*}" = report ] && echo "$name.${f#*.}" || echo "tracekit_$f")"
      done
      rm -rf "$dir/run"
      "$NSYS" stats --format=csv --report="$REPORTS" --force-overwrite=true \
          --output="$dir/stats/$name" "$dir/$name.sqlite" >/dev/null 2>"$dir/stats/$name.stderr.txt" ;;
    graph1)  # the serving-style decode replayed from a CUDA graph, graph and node tracing
      llm_target graph_decode_graphtrace -- --cuda-graph-trace=graph --gpu-metrics-devices=0 --gpu-metrics-frequency=1000 \
          "$PY" graph_decode.py --mode graph --nvtx --batch 4 --prompt 128 --steps 32
      llm_target graph_decode_nodetrace -- --cuda-graph-trace=node "$PY" graph_decode.py --mode graph --nvtx --batch 4 --prompt 128 --steps 32 ;;
    compile)  # torch.compile(mode="reduce-overhead"): HF static cache, and a decode step that writes / replaces plain-tensor caches
      llm_target hf_generate_compile -- --cuda-graph-trace=node \
          env TORCH_LOGS=perf_hints "$PY" hf_generate.py --mode static-compile --layers 8 --batch 8 --prompt 512 --new-tokens 24
      llm_target compile_kvcopy -- env TORCH_LOGS=perf_hints "$PY" graph_decode.py --mode compile-kvcopy --nvtx --layers 8 --batch 8 --prompt 512 --steps 24
      llm_target compile_functional -- env TORCH_LOGS=perf_hints "$PY" graph_decode.py --mode compile-functional --nvtx --layers 8 --batch 8 --prompt 512 --steps 24 ;;
    compile_functional)  # the functional-cache compiled decode alone (each step copies the whole KV cache)
      llm_target compile_functional -- env TORCH_LOGS=perf_hints "$PY" graph_decode.py --mode compile-functional --nvtx --layers 8 --batch 8 --prompt 512 --steps 24 ;;
    tp2graph)  # vLLM-style 2-GPU tensor-parallel decode: NCCL all-reduce per layer inside the decode graph, prefill eager, no NVTX
      llm_target tp2_graph_decode_graphtrace -- --cuda-graph-trace=graph --gpu-metrics-devices=all --gpu-metrics-frequency=500 \
          "$PY" -m torch.distributed.run --nproc-per-node 2 graph_decode.py --tp 2 --mode graph --batch 4 --prompt 128 --steps 32
      llm_target tp2_graph_decode_nodetrace -- --cuda-graph-trace=node \
          "$PY" -m torch.distributed.run --nproc-per-node 2 graph_decode.py --tp 2 --mode graph --batch 4 --prompt 128 --steps 32 ;;
    overhead)  # cost of one annotate() range: plain, then under nsys
      dir="$OUT/annotate_overhead"; mkdir -p "$dir"
      "$PY" annotate_overhead.py > "$dir/plain.json" 2> "$dir/plain.stderr.txt"; cat "$dir/plain.json"
      "$NSYS" profile --trace=cuda,nvtx --sample=none --cpuctxsw=none --force-overwrite=true -o "$dir/overhead" \
          "$PY" annotate_overhead.py > "$dir/under_nsys.json" 2> "$dir/under_nsys.stderr.txt"
      grep '^{' "$dir/under_nsys.json"; rm -f "$dir/overhead.nsys-rep" ;;
    # --- issue 36: run structure (training without NVTX, generate() calls, serving, microbenchmarks) ---
    dp_ddp) rs_target train_ddp_2gpu -- "$PY" -m torch.distributed.run --nproc-per-node 2 train_dp.py --mode ddp ;;
    dp_exposed) rs_target train_ddp_exposed_2gpu -- "$PY" -m torch.distributed.run --nproc-per-node 2 train_dp.py --mode allreduce-after-backward ;;
    dp_fsdp2)  # one nsys per rank
      name=train_fsdp2_2gpu; dir="$OUT/$name"; mkdir -p "$dir/stats"
      echo "== $name: $PY -m torch.distributed.run --nproc-per-node 2 --no-python $NSYS profile ${RS[*]} -o $dir/${name}_rank%q{RANK} $PY train_dp.py --mode fsdp2" | tee "$dir/command.txt"
      "$PY" -m torch.distributed.run --nproc-per-node 2 --no-python "$NSYS" profile "${RS[@]}" \
          -o "$dir/${name}_rank%q{RANK}" "$PY" train_dp.py --mode fsdp2 > "$dir/profile_log.txt" 2>&1; grep -v -i warn "$dir/profile_log.txt" | tail -8
      for r in 0 1; do export_sum "$dir" "${name}_rank$r"; done ;;
    gen_calls) rs_target hf_generate_calls -- "$PY" hf_generate_calls.py --calls 3 ;;
    gen_calls_annot) rs_target hf_generate_calls_annotated -- "${ANNOTATE[@]}" "$PY" hf_generate_calls.py --calls 3 ;;
    serve_inproc) rs_target serve_cb_1gpu -- "$PY" serve.py --layout inproc --requests 12 --rate 12 ;;
    serve_child)  # the engine in a forked child: not followed (the default), then followed; GPU metrics on both
      rs_target serve_child_nofollow -- --gpu-metrics-devices=0 --gpu-metrics-frequency=500 "$PY" serve.py "${SERVE[@]}"
      rs_target serve_child_follow -- --trace-fork-before-exec=true --gpu-metrics-devices=0 --gpu-metrics-frequency=500 \
          "$PY" serve.py "${SERVE[@]}" ;;
    micro_jax) RS_TRACE=cuda rs_target microbench_jax -- env XLA_PYTHON_CLIENT_PREALLOCATE=false "$PY" microbench.py --kind jax --reps 500 ;;
    micro)
      # XLA's NVTX ranges (registered strings) made nsys 2025.3's importer fail ("Cannot find string for an
      # exterior index": no kernel table in the export), so the JAX run is traced without NVTX
      RS_TRACE=cuda rs_target microbench_jax -- env XLA_PYTHON_CLIENT_PREALLOCATE=false "$PY" microbench.py --kind jax --reps 500
      rs_target microbench_triton -- "$PY" microbench.py --kind triton ;;
    compile_where) rs_target compile_where_decode -- env TORCH_LOGS=perf_hints "$PY" graph_decode.py --mode compile-where \
          --layers 8 --batch 8 --prompt 512 --steps 24 --max-seq 4096 ;;
    *) echo "unknown target $target" ;;
  esac
  echo "== $target took ${SECONDS}s"
done
