#!/bin/bash
# tracekit stats on one report's three forms: the .sqlite export (column cache cold, then warm)
# and its nsys-style parquetdir / arrowdir folders (benchmarks/make_columnar_export.py).
# One process per report and form under /usr/bin/time (peak RSS, wall); each CSV is compared
# byte for byte with the cold SQLite run's. Usage (from the repository root):
#   python benchmarks/make_big_trace.py --kernels 1000000 -o benchmarks/out/big.sqlite
#   python benchmarks/make_columnar_export.py benchmarks/out/big.sqlite
#   bash benchmarks/bench_columnar.sh benchmarks/out/big
set -u
B=${1:-benchmarks/out/big}
PY=${PYTHON:-python}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
warm=$T/cache_warm
TRACEKIT_CACHE=$warm $PY -m tracekit.cli.entry stats -f csv \
  -r cuda_gpu_kern_sum,cuda_api_sum,nvtx_sum,cuda_kern_exec_sum,nvtx_gpu_proj_sum "$B.sqlite" > /dev/null
for r in cuda_gpu_kern_sum cuda_api_sum nvtx_sum cuda_kern_exec_sum nvtx_gpu_proj_sum; do
  for mode in sqlite-cold sqlite-warm parquetdir arrowdir; do
    case $mode in
      sqlite-cold) f=$B.sqlite; c=$T/cache_cold; rm -rf "$c";;
      sqlite-warm) f=$B.sqlite; c=$warm; rm -rf "$warm"/columns/*/reports;;  # columns kept, CSVs not
      *) f=$B.$mode; c=$T/cache_none; rm -rf "$c";;
    esac
    TRACEKIT_CACHE=$c /usr/bin/time -f "%M %e" -o "$T/time" $PY -m tracekit.cli.entry stats -f csv \
      --convention 2023 -r $r "$f" > "$T/$r.$mode.csv"
    read -r kb s < "$T/time"
    same=$(cmp -s "$T/$r.sqlite-cold.csv" "$T/$r.$mode.csv" && echo identical || echo DIFFERENT)
    echo "$r $mode peak_rss_mb=$((kb / 1024)) wall_s=$s csv=$same"
  done
done
