"""How `tracekit summary`, `tracekit stats` and `tracekit diagnose` scale with the trace (issue 14 §1).

Every command runs in a fresh process under an address-space cap (``prlimit --as``), so a run
that outgrows the machine fails alone instead of taking the machine down. Each command runs
twice per export: *cold*, with the column cache (``$TRACEKIT_CACHE``, a folder under
benchmarks/out) emptied first, and *warm*, right after, on the columns the cold run cached
(the stats CSVs that run kept dropped first, so the warm stats run computes its reports). The
table gives wall time, peak RSS (``ru_maxrss`` of the child) and the wall time per million kernels,
which stays flat when the cost grows linearly.

Build the exports first (GPU metrics in every 16th copy keeps the 30× file at ~11 GB):

    for n in 1 8 30; do python benchmarks/make_big_trace.py --kernels ${n}000000 --gpu-metrics-every 16 \\
        --seed sample_traces/llm_decode_1gpu/llm_decode_1gpu.sqlite -o benchmarks/out/s${n}x.sqlite; done
    python benchmarks/bench_scale.py benchmarks/out/s1x.sqlite benchmarks/out/s8x.sqlite benchmarks/out/s30x.sqlite

``--rounds N`` repeats each pair (the table shows the median wall time and the highest RSS);
``--source DIR`` runs another tracekit checkout (e.g. ``git worktree add /tmp/base <commit>``)
for a before/after comparison; ``--as-limit-gb`` sets the cap (default 8).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    OUT,
    drop_kept_reports,
    markdown_table,
    precompile_tracekit,
    print_table,
    python,
    run_measured,
    table_info,
    warm_page_cache,
    write_results,
)

STATS_REPORTS = "cuda_gpu_kern_sum,nvtx_gpu_proj_sum,cuda_kern_exec_sum"
COMMANDS: dict[str, list[str]] = {
    "summary": ["summary"],
    "stats": ["stats", "-f", "csv", "--convention", "2023", "-r", STATS_REPORTS],
    "stats-default": ["stats", "-f", "csv", "--convention", "2023"],  # tracekit stats' default report (cuda_gpu_kern_sum)
    "nvtx_kern_sum": ["stats", "-f", "csv", "--convention", "2023", "-r", "nvtx_kern_sum"],
    "diagnose": ["diagnose"],
    "report": ["report", "-o", "{out}.html"],
    "perfetto": ["export", "perfetto", "--window", "steady", "-o", "{out}.pftrace"],
    "diff": ["diff"],  # FILE --against OTHER: the export compared with a second run of its size
}
TARGET_MB = 4096.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="exports, smallest first")
    parser.add_argument("--commands", default=",".join(COMMANDS), help="summary,stats,diagnose")
    parser.add_argument("--variants", default="cold,warm", help="cold,warm")
    parser.add_argument(
        "--as-limit-gb", type=float, default=8.0, help="address-space cap per run (default 8 GB)"
    )
    parser.add_argument("--rounds", type=int, default=1, help="rounds (table: median wall, highest RSS)")
    parser.add_argument(
        "--source", type=Path, default=None,
        help="tracekit checkout to run (PYTHONPATH), e.g. a `git worktree` of an older commit (default: this one)",
    )
    parser.add_argument("--name", default="bench_scale", help="out/<name>.json and .md")
    parser.add_argument(
        "--against", type=Path, action="append", default=[],
        help="second run for `diff` (one per file, same order; `tracekit diff FILE AGAINST`)",
    )
    args = parser.parse_args(argv)
    commands = [c for c in args.commands.split(",") if c]
    variants = [v for v in args.variants.split(",") if v]
    cap = ["prlimit", f"--as={int(args.as_limit_gb * 1e9)}", "--"] if shutil.which("prlimit") else []
    exe = [python(), "-m", "tracekit.cli.entry"]
    source = (args.source or Path(__file__).resolve().parents[1]).resolve()
    precompile_tracekit(source)
    env_base = {**os.environ, "PYTHONPATH": str(source)}
    OUT.mkdir(parents=True, exist_ok=True)
    rows: list[list[str]] = []
    results: list[dict[str, object]] = []
    for index, path in enumerate(args.files):
        path = path.resolve()
        counts = table_info(path)
        kernels = counts.get("CUPTI_ACTIVITY_KIND_KERNEL", 0)
        size_gb = path.stat().st_size / 1e9
        print(f"{path.name}: {size_gb:.2f} GB, {kernels:,} kernels", flush=True)
        warm_page_cache(path)
        cache = OUT / f"scale_cache_{path.stem}" if args.source is None else OUT / f"scale_cache_{path.stem}_other"
        for cmd in commands:
            runs: dict[str, list] = {v: [] for v in variants}
            for _ in range(args.rounds):
                for variant in variants:
                    if variant == "cold":
                        shutil.rmtree(cache, ignore_errors=True)
                    else:
                        drop_kept_reports(cache)
                    out = OUT / f"scale_{path.stem}_{cmd}_{variant}.txt"
                    inputs = [str(path)]
                    if cmd == "diff":
                        if index >= len(args.against):
                            raise SystemExit("`diff` needs --against OTHER for each file")
                        inputs.append(str(args.against[index].resolve()))
                    made = [a.format(out=OUT / f"scale_{path.stem}_{cmd}_{variant}") for a in COMMANDS[cmd]]
                    argv_ = [*cap, *exe, *made, *inputs]
                    # cwd = the checkout run: ``python -m`` puts the working folder before PYTHONPATH
                    m = run_measured(argv_, stdout_path=out, env={**env_base, "TRACEKIT_CACHE": str(cache)}, cwd=source)
                    print(
                        f"  {cmd:8s} {variant:4s} {m.wall_s:7.1f} s  peak RSS {m.peak_rss_mb:6.0f} MB"
                        f"  others {m.others_cores:4.2f} cores  exit {m.returncode}"
                        + ("" if m.returncode == 0 else f": {m.stderr.strip()[-300:]}"),
                        flush=True,
                    )
                    runs[variant].append(m)
                    results.append({
                        "file": str(path), "bytes": path.stat().st_size, "rows": counts, "command": cmd,
                        "variant": variant, "argv": argv_, "wall_s": m.wall_s, "cpu_s": m.cpu_s,
                        "peak_rss_mb": m.peak_rss_mb, "returncode": m.returncode,
                        "others_cores": m.others_cores, "stderr_tail": m.stderr[-2000:],
                    })
            for variant in variants:
                ms = runs[variant]
                failed = [m.returncode for m in ms if m.returncode != 0]
                wall = statistics.median(m.wall_s for m in ms)
                cpu = statistics.median(m.cpu_s for m in ms)
                rss = max(m.peak_rss_mb for m in ms)
                per_m = wall / (kernels / 1e6) if kernels else float("nan")
                rows.append([
                    path.name, f"{size_gb:.2f}", f"{kernels / 1e6:.1f}", cmd, variant,
                    f"{wall:.1f}", f"{cpu:.1f}", f"{per_m:.1f}", f"{rss:,.0f}", f"{max(m.others_cores for m in ms):.2f}",
                    f"failed ({failed[0]})" if failed else ("≤ 4 GB" if rss <= TARGET_MB else "> 4 GB"),
                ])
    header = ["export", "GB", "M kernels", "command", "run", "wall s", "CPU s", "wall s / M kernels", "peak RSS MB", "others' cores", "target"]
    print_table("tracekit at scale (issue 14 §1)", header, rows)
    payload = {
        "results": results, "as_limit_gb": args.as_limit_gb, "tracekit_run": str(source), "rounds": args.rounds, "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    write_results(args.name, payload, markdown_table(header, rows))
    print(json.dumps({"written": str(OUT / f"{args.name}.md")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
