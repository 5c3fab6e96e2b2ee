"""Speed of tracekit's analyses against `nsys stats` on a ≥1M-kernel trace.

Each variant runs in a fresh Python (or nsys) process, measured whole — reading the SQLite
export included — for wall time and peak RSS of the process tree (``common.run_measured``):

* ``attribution``: open the export, stack kernels/memcpys/memsets, ``launch_info`` and
  ``attribute_nvtx`` (1 M operations), ``nvtx_coverage``;
* ``nvtx_gpu_proj_trace``, ``nvtx_gpu_proj_sum``, ``nvtx_kern_sum``, ``cuda_kern_exec_sum``,
  ``cuda_kern_exec_trace``: tracekit's report written as CSV, against ``nsys stats -r`` of the
  same report (``--force-export=false`` on the same ``.sqlite``);
* ``gpu_metrics``: per-kernel averages of every default metric over a second trace with
  ≥5 M GPU-metric samples, then per kernel name.

Every tracekit variant runs twice: *cold*, with tracekit's column cache (``$TRACEKIT_CACHE``,
a folder under benchmarks/out) emptied first, so it reads SQLite and fills the cache, then
*warm*, reading what the cold run cached. The ``tracekit stats`` reports also run a third
time, *repeat*: the warm run's kept CSV dropped before it (so *warm* is computed), *repeat*
prints it again when the report was eligible (≤ 8 MB, no warning; tracekit/cli/stats_cache.py).
nsys runs once per report (it has no such cache).

Each tracekit variant prints its own split (``load_s``/``compute_s`` for analyses over the
loader's tables; ``open_s``/``report_s``/``csv_s`` for reports, which read the columns they
need themselves). The "same rows" column compares tracekit's CSV (convention "2023") with the
one nsys wrote.

The traces come from ``benchmarks/make_big_trace.py`` (repeated real exports). Results go to
``benchmarks/out/bench_analysis.{json,md}``.

Example
-------
    python benchmarks/make_big_trace.py --kernels 1000000
    python benchmarks/make_big_trace.py --kernels 100000 -o benchmarks/out/metrics.sqlite
    python benchmarks/bench_analysis.py
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    DEFAULT_BIG,
    OUT,
    REPO,
    Measured,
    drop_kept_reports,
    find_nsys,
    fmt_ratio,
    fmt_s,
    machine,
    markdown_table,
    nsys_version,
    precompile_tracekit,
    print_table,
    python,
    run_measured,
    table_info,
    tracekit_command,
    versions,
    warm_page_cache,
    write_results,
)

DEFAULT_METRICS_TRACE = OUT / "metrics.sqlite"
REPORTS = (
    "nvtx_gpu_proj_trace",
    "nvtx_gpu_proj_sum",
    "nvtx_kern_sum",
    "cuda_kern_exec_sum",
    "cuda_kern_exec_trace",
)

_ATTRIBUTION = """
import sys, time, tracekit
from tracekit.analysis.attribution import attribute_nvtx, attribute_trace, launch_info, nvtx_coverage
from tracekit.analysis.gpu_time import gpu_ops
t0 = time.perf_counter()
trace = tracekit.open(sys.argv[1])
if sys.argv[2] == "attribute_trace":  # reads only the columns it needs, the API calls one at a time
    t1 = time.perf_counter()
    a = attribute_trace(trace)
else:  # the full tables, as a notebook that also looks at other columns has them
    ops = gpu_ops(trace.kernels, trace.memcpys, trace.memsets)
    api, nvtx = trace.cuda_api, trace.nvtx
    t1 = time.perf_counter()
    a = attribute_nvtx(launch_info(ops, api), nvtx)
cov = nvtx_coverage(a)
t2 = time.perf_counter()
print(f"ops={a.height} coverage={cov['coverage'][0]:.4f} load_s={t1 - t0:.2f} compute_s={t2 - t1:.2f}")
"""

_METRICS = """
import sys, time, tracekit
from tracekit.analysis.metrics import kernel_metrics, metrics_by
t0 = time.perf_counter()
trace = tracekit.open(sys.argv[1])
samples, kernels = trace.gpu_metrics, trace.kernels
t1 = time.perf_counter()
km = kernel_metrics(kernels, samples)
by_name = metrics_by(km, ["name"])
t2 = time.perf_counter()
print(f"samples={samples.height} kernels={km.height} names={by_name.height} load_s={t1 - t0:.2f} compute_s={t2 - t1:.2f}")
"""


CACHE = OUT / "bench_analysis" / "column_cache"
#: cold: cache emptied; warm: columns cached, kept report CSVs dropped (computed from the
#: cached columns); repeat: the same command again (a kept CSV is printed when there is one)
VARIANTS = ("cold", "warm", "repeat")


def _tracekit(code: str, *args: str, variant: str = "cold") -> Measured:
    """Run ``code`` in a fresh Python; ``cold`` empties the column cache first."""
    return _run([python(), "-W", "ignore", "-c", code, *args], variant)


def _tracekit_stats(prefix: list[str], trace: Path, report: str, csv: Path, variant: str) -> Measured:
    """``tracekit stats -f csv --convention 2023 -r REPORT TRACE > CSV``: the command users
    run, compared with ``nsys stats`` whole process against whole process."""
    return _run([*prefix, report, str(trace)], variant, stdout_path=csv)


def _run(argv: list[str], variant: str, stdout_path: Path | None = None) -> Measured:
    if variant == "cold":
        shutil.rmtree(CACHE, ignore_errors=True)
    elif variant == "warm":
        drop_kept_reports(CACHE)
    env = {**os.environ, "TRACEKIT_CACHE": str(CACHE)}
    return run_measured(argv, cwd=REPO, env=env, stdout_path=stdout_path)


def _nsys_report(nsys: Path, trace: Path, report: str, out: Path) -> Measured:
    prefix = out / f"nsys_{report}"
    Path(f"{prefix}_{report}.csv").unlink(missing_ok=True)  # nsys skips reports whose CSV exists
    argv = [str(nsys), "stats", "--format", "csv", "--force-export=false", "--force-overwrite=true",
            "--report", report, "-o", str(prefix), str(trace)]
    return run_measured(argv)


def _median_run(ms: list[Measured]) -> Measured:
    """The run with the median wall time (its RSS and printout go in the table), with the
    largest peak RSS of all runs."""
    ordered = sorted(ms, key=lambda m: m.wall_s)
    mid = ordered[(len(ordered) - 1) // 2]
    return dataclasses.replace(mid, peak_rss_mb=max(m.peak_rss_mb for m in ms))


def _same_csv(a: Path, b: Path) -> bool | None:
    """Whether two CSVs hold the same rows (as multisets); None when one is missing.

    Compared by an order-independent digest (line count and the sum of 64-bit line hashes),
    streamed: reading million-row CSVs into this process would raise its RSS, and every
    later child, forked from it, would then report at least that peak RSS."""
    if not (a.is_file() and b.is_file()):
        return None
    return _multiset_digest(a) == _multiset_digest(b)


def _multiset_digest(path: Path) -> tuple[int, int]:
    count = total = 0
    with path.open("rb") as fh:
        for line in fh:
            line = line.rstrip(b"\r\n")
            count += 1
            total = (total + int.from_bytes(hashlib.blake2b(line, digest_size=8).digest(), "little")) % (1 << 64)
    return count, total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--trace", type=Path, default=DEFAULT_BIG, help="≥1M-kernel export (make_big_trace.py)"
    )
    parser.add_argument(
        "--metrics-trace",
        type=Path,
        default=DEFAULT_METRICS_TRACE,
        help="export with ≥5M GPU-metric samples",
    )
    parser.add_argument(
        "--reports", default=",".join(REPORTS), help="reports to time (comma-separated)"
    )
    parser.add_argument("--skip-nsys", action="store_true", help="time tracekit only")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per variant; tables give the median (default 3)")
    args = parser.parse_args(argv)
    if not args.trace.is_file():
        print(
            f"{args.trace} is missing; build it with: python benchmarks/make_big_trace.py --kernels 1000000"
        )
        return 2
    OUT.mkdir(parents=True, exist_ok=True)
    work = OUT / "bench_analysis"
    work.mkdir(exist_ok=True)
    nsys = None if args.skip_nsys else find_nsys()
    warm_page_cache(args.trace)
    precompile_tracekit()
    tk_prefix, tk_how = tracekit_command(python())
    print(f"tracekit reports run as: {tk_how}")
    results: dict[str, dict[str, object]] = {}

    runs: dict[str, dict[str, list[Measured]]] = {}

    def record(name: str, who: str, m: Measured) -> None:
        runs.setdefault(name, {}).setdefault(who, []).append(m)

    for rnd in range(args.rounds):
        for variant in ("cold", "warm"):
            for how in ("attribute_trace", "full tables"):
                m = _tracekit(_ATTRIBUTION, str(args.trace), how.split()[0], variant=variant)
                record(f"attribution, {how} ({variant})", "tracekit", m)
        for report in [r for r in args.reports.split(",") if r]:
            theirs = _nsys_report(nsys, args.trace, report, work) if nsys is not None else None
            for variant in VARIANTS:
                ours_csv = work / f"tracekit_{variant}_{report}.csv"
                ours_csv.unlink(missing_ok=True)
                ours = _tracekit_stats(tk_prefix, args.trace, report, ours_csv, variant)
                name = f"{report} ({variant})"
                record(name, "tracekit", ours)
                if theirs is not None:
                    record(name, "nsys", theirs)
                    same = _same_csv(ours_csv, work / f"nsys_{report}_{report}.csv")
                    if ours_csv.is_file():
                        results.setdefault(name, {})["rows"] = _multiset_digest(ours_csv)[0] - 1  # minus the header
                    previous = results.get(name, {}).get("same_rows", True)
                    results.setdefault(name, {})["same_rows"] = same if previous is True else previous
        if args.metrics_trace.is_file():
            warm_page_cache(args.metrics_trace)
            for variant in ("cold", "warm"):
                mm = _tracekit(_METRICS, str(args.metrics_trace), variant=variant)
                record(f"gpu_metrics ({variant})", "tracekit", mm)
        print(f"round {rnd + 1}/{args.rounds} done", flush=True)
    for name, by_who in runs.items():
        entry = results.setdefault(name, {})
        for who, ms in by_who.items():
            entry[who] = _median_run(ms)
            entry[f"{who}_runs_s"] = [m.wall_s for m in ms]
        ours_m = entry["tracekit"]
        assert isinstance(ours_m, Measured)
        entry["note"] = ours_m.stdout.strip() or ours_m.stderr[-500:] or (f"rows={entry['rows']}" if "rows" in entry else "")

    header = [
        "variant",
        "tracekit s",
        "tracekit MB",
        "nsys s",
        "nsys MB",
        "speed-up",
        "same rows",
        "notes",
    ]
    rows = []
    for name, entry in results.items():
        ours_m = entry["tracekit"]
        theirs_m = entry.get("nsys")
        assert isinstance(ours_m, Measured)
        speedup = (
            theirs_m.wall_s / ours_m.wall_s
            if isinstance(theirs_m, Measured) and ours_m.wall_s
            else None
        )
        rows.append(
            [
                name,
                fmt_s(ours_m.wall_s) + ("" if ours_m.returncode == 0 else " (failed)"),
                f"{ours_m.peak_rss_mb:.0f}",
                fmt_s(theirs_m.wall_s) + ("" if theirs_m.returncode == 0 else " (failed)")
                if isinstance(theirs_m, Measured)
                else "–",
                f"{theirs_m.peak_rss_mb:.0f}" if isinstance(theirs_m, Measured) else "–",
                fmt_ratio(speedup),
                {True: "yes", False: "no", None: "–"}[entry.get("same_rows")],  # type: ignore[index]
                str(entry.get("note", ""))[:120],
            ]
        )
    info = {
        "machine": machine(),
        "versions": versions(),
        "nsys": None if nsys is None else {"path": str(nsys), "version": nsys_version(nsys)},
        "trace": {"path": str(args.trace), "rows": table_info(args.trace)},
        "metrics_trace": {"path": str(args.metrics_trace), "rows": table_info(args.metrics_trace)}
        if args.metrics_trace.is_file()
        else None,
        "results": results,
    }
    title = "tracekit analyses vs nsys stats (whole process, warm page cache)"
    print_table(title, header, rows)
    md = f"# {title}\n\n```\n{json.dumps({k: info[k] for k in ('machine', 'versions', 'nsys')}, indent=2)}\n```\n\n"
    md += markdown_table(header, rows)
    jpath, mpath = write_results("bench_analysis", info, md)
    print(f"wrote {jpath} and {mpath}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
