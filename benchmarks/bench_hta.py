"""Loading a Kineto trace and computing HolisticTraceAnalysis's five views: HTA against tracekit.

Each measurement runs in a fresh child process (so its peak RSS is its own), ``--repeat`` times
(median time; largest peak RSS, ``ru_maxrss`` of the child and of any process it started, MiB):

* ``hta load``: ``hta.trace_analysis.TraceAnalysis(trace_dir=…)`` (HTA's parse, alignment and
  window), then ``hta views``: its temporal, idle-time, kernel-type, overlap and launch views;
* ``tk open cold``: ``tracekit.open`` on an empty cache (decode the JSON, write the Parquet
  folder), then ``tk views``: :func:`tracekit.hta`'s same five views (tables read on first use);
* ``tk open warm``: the same with the converted folder cached (a trace opened before).

HTA runs in its own environment (``--hta-python``, never a dependency of tracekit):

    .venv/bin/python benchmarks/bench_hta.py --hta-python /work/x/htavenv/bin/python DIR [DIR ...]

A DIR holds one trace file per rank (``*.json`` / ``*.json.gz``), as HTA wants.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _rss_mib() -> float:
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, kids) / 1024


def child_hta(trace_dir: str) -> dict:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    from hta.trace_analysis import TraceAnalysis

    t0 = time.perf_counter()
    analysis = TraceAnalysis(trace_dir=trace_dir)
    t1 = time.perf_counter()
    ranks = analysis.t.get_ranks()
    for view in (lambda: analysis.get_temporal_breakdown(visualize=False),
                 lambda: analysis.get_idle_time_breakdown(ranks=ranks, visualize=False),
                 lambda: analysis.get_gpu_kernel_breakdown(visualize=False),
                 lambda: analysis.get_comm_comp_overlap(visualize=False),
                 lambda: analysis.get_cuda_kernel_launch_stats(ranks=ranks, visualize=False)):
        with contextlib.suppress(AssertionError):  # HTA's own checks fail on some µs-rounded traces
            view()
    t2 = time.perf_counter()
    return {"load": t1 - t0, "views": t2 - t1, "rss": _rss_mib()}


def child_tracekit(trace_dir: str) -> dict:
    import warnings

    warnings.filterwarnings("ignore")
    import polars  # noqa: F401 - the caller has it imported

    import tracekit

    files = sorted(p for p in Path(trace_dir).iterdir() if p.name.endswith((".json", ".json.gz")))
    t0 = time.perf_counter()
    traces = [tracekit.open(p) for p in files]
    views = tracekit.hta(traces if len(traces) > 1 else traces[0])
    _ = views.ops  # the tables the views read
    t1 = time.perf_counter()
    views.temporal_breakdown()
    views.idle_time_breakdown()
    views.kernel_type_breakdown()
    views.kernel_breakdown()
    views.comm_comp_overlap()
    views.kernel_launch_stats()
    t2 = time.perf_counter()
    return {"load": t1 - t0, "views": t2 - t1, "rss": _rss_mib()}


def _run(python: str, tool: str, trace_dir: Path, cache: Path) -> dict:
    env = {**os.environ, "TRACEKIT_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([python, __file__, "--child", tool, str(trace_dir)], env=env, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="*", type=Path)
    parser.add_argument("--hta-python", default="/work/x/htavenv/bin/python")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--child", nargs=2, metavar=("TOOL", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        tool, trace_dir = args.child
        print(json.dumps((child_hta if tool == "hta" else child_tracekit)(trace_dir)))
        return
    print("| trace | file MB | HTA load s | HTA views s | HTA RSS MiB | tk open cold s | tk open warm s "
          "| tk views s | tk RSS MiB (cold) | load ratio (HTA / tk cold) | RSS ratio |")
    print("| --- |" + " ---: |" * 10)
    for trace_dir in args.dirs:
        size = sum(p.stat().st_size for p in trace_dir.iterdir() if p.is_file()) / 1e6
        hta, cold, warm = [], [], []
        for _ in range(args.repeat):
            hta.append(_run(args.hta_python, "hta", trace_dir, Path(tempfile.gettempdir())))
            with tempfile.TemporaryDirectory() as cache:
                cold.append(_run(sys.executable, "tracekit", trace_dir, Path(cache)))
                warm.append(_run(sys.executable, "tracekit", trace_dir, Path(cache)))

        def med(rows: list[dict], key: str) -> float:
            return statistics.median(r[key] for r in rows)

        rss_h, rss_t = max(r["rss"] for r in hta), max(r["rss"] for r in cold)
        print(f"| {trace_dir.name} | {size:.1f} | {med(hta, 'load'):.2f} | {med(hta, 'views'):.2f} | {rss_h:.0f} "
              f"| {med(cold, 'load'):.2f} | {med(warm, 'load'):.2f} | {med(cold, 'views'):.2f} | {rss_t:.0f} "
              f"| {med(hta, 'load') / med(cold, 'load'):.1f} | {rss_h / rss_t:.1f} |", flush=True)


if __name__ == "__main__":
    main()
