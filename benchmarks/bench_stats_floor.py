"""How close a fresh Python process can come to ``nsys stats -r cuda_gpu_kern_sum`` (issue 14 §3).

The warm target is 10× nsys in a whole process. For ``cuda_gpu_kern_sum`` on the 1 M-kernel
export nsys takes ~1.4-1.6 s here, so 10× means ≤ 0.14-0.16 s from exec to exit. This script
times, interleaved, in fresh processes:

- ``python -c pass`` (the interpreter alone);
- ``python -c "import polars"`` (the table engine tracekit is built on);
- *bare polars*: the least a polars program can do to print this report: read the two cached
  kernel columns it needs (name id, duration) from the column cache's files, one group-by with
  sum, count, mean, median, min, max and standard deviation, names from ``StringIds``, CSV to
  stdout. No checksum, no CLI, no tracekit import, no nsys formatting: a lower bound, not a
  replacement;
- ``tracekit stats -r cuda_gpu_kern_sum -f csv`` warm (cached columns, kept CSVs dropped);
- ``nsys stats -r cuda_gpu_kern_sum -f csv``.

    python benchmarks/bench_stats_floor.py [--file benchmarks/out/big.sqlite] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    DEFAULT_BIG,
    OUT,
    drop_kept_reports,
    find_nsys,
    fmt_ratio,
    fmt_s,
    markdown_table,
    print_table,
    python,
    run_measured,
    tracekit_command,
    wait_for_idle,
    warm_page_cache,
    write_results,
)

BARE_POLARS = """
import sys, sqlite3
import polars as pl
with open(sys.argv[1], "rb") as fh:
    dur = pl.read_ipc(fh).to_series()
with open(sys.argv[2], "rb") as fh:
    ids = pl.read_ipc(fh).to_series()
con = sqlite3.connect(f"file:{sys.argv[3]}?mode=ro&immutable=1", uri=True)
names = pl.DataFrame(con.execute("SELECT id, value FROM StringIds").fetchall(), schema=["id", "Name"], orient="row")
v = pl.col("d")
s = pl.DataFrame({"id": ids, "d": dur}).group_by("id").agg(
    v.sum().alias("t"), pl.len().alias("n"), v.mean(), v.median().alias("med"), v.min().alias("lo"),
    v.max().alias("hi"), v.std().alias("sd"))
s = s.join(names, on="id").sort(["t", "n", "Name"], descending=[True, False, False])
s.with_columns((pl.col("t") * 100 / pl.col("t").sum()).alias("pct")).write_csv(sys.stdout.buffer)
"""


def _cached_files(path: Path, cache: Path) -> tuple[Path, Path]:
    """Fill the column cache with a cold run, then the files of the two kernel columns
    ``cuda_gpu_kern_sum`` reads (duration, demangled-name id)."""
    env = {**os.environ, "TRACEKIT_CACHE": str(cache)}
    prefix, _ = tracekit_command(python())
    m = run_measured([*prefix, "cuda_gpu_kern_sum", str(path)], env=env)
    if m.returncode != 0:
        raise SystemExit(f"tracekit failed: {m.stderr.strip()[-400:]}")
    import polars as pl

    found: dict[str, Path] = {}
    for file in cache.glob("columns/*/CUPTI_ACTIVITY_KIND_KERNEL.*.arrow"):
        for name in pl.read_ipc_schema(file):
            found[name] = file
    if "duration_ns" not in found or "demangled_id" not in found:
        raise SystemExit(f"expected cached columns are missing: {sorted(found)}")
    files = found["duration_ns"], found["demangled_id"]
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--file", type=Path, default=DEFAULT_BIG)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    path = args.file.resolve()
    if not path.exists():
        print(f"{path} is missing: build it with `python benchmarks/make_big_trace.py -o {path}`", file=sys.stderr)
        return 2
    cache = OUT / "stats_floor_cache"
    duration, names = _cached_files(path, cache)
    warm_page_cache(path)
    prefix, _ = tracekit_command(python())
    nsys = find_nsys()
    variants: dict[str, list[str]] = {
        "python -c pass": [python(), "-c", "pass"],
        "python -c 'import polars'": [python(), "-c", "import polars"],
        "bare polars (lower bound)": [python(), "-c", BARE_POLARS, str(duration), str(names), str(path)],
        "tracekit stats, warm": [*prefix, "cuda_gpu_kern_sum", str(path)],
    }
    if nsys:
        variants["nsys stats"] = [str(nsys), "stats", "-q", "-f", "csv", "-o", "-", "-r", "cuda_gpu_kern_sum", str(path)]
    runs: dict[str, list[float]] = {k: [] for k in variants}
    env = {**os.environ, "TRACEKIT_CACHE": str(cache)}
    for rnd in range(args.rounds):
        for label, argv_ in variants.items():
            if label == "tracekit stats, warm":
                drop_kept_reports(cache)
            wait_for_idle(5.0)
            m = run_measured(argv_, env=env)
            if m.returncode != 0:
                raise SystemExit(f"{label} failed: {m.stderr.strip()[-400:]}")
            runs[label].append(m.wall_s)
        print(f"round {rnd + 1}/{args.rounds}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in runs.items()), flush=True)
    nsys_s = statistics.median(runs["nsys stats"]) if nsys else None
    header = ["process", "median s", "min s", "nsys ÷ this (median)", "10× budget left (s)"]
    rows = []
    for label, times in runs.items():
        med = statistics.median(times)
        rows.append([
            label, f"{med:.3f}", f"{min(times):.3f}",
            fmt_ratio(nsys_s / med if nsys_s else None),
            fmt_s(nsys_s / 10 - med if nsys_s else None),
        ])
    title = f"cuda_gpu_kern_sum start-up floor, {path.name}, {args.rounds} interleaved rounds"
    print_table(title, header, rows)
    write_results("bench_stats_floor", {"file": str(path), "rounds": args.rounds, "runs_s": runs},
                  f"### {title}\n\n" + markdown_table(header, rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
