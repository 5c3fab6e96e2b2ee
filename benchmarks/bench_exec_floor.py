"""How fast can any polars program answer ``cuda_kern_exec_sum`` cold? (issue 44 §4)

The grid's target is ``cuda_kern_exec_sum`` cold (no column cache, a whole process) at least
3.5 × faster than ``nsys stats`` of the same report. This script times, interleaved, in fresh
processes, on one export:

- ``python -c pass`` (the interpreter alone);
- ``python -c "import polars"`` (the table engine tracekit is built on);
- *polars + the two scans*: the kernels (6 columns) and the launching calls (5 columns; only
  those whose correlation id a kernel has, filtered in SQLite, as tracekit reads them) in two
  SQLite scans through the same ADBC driver tracekit uses, on two threads started before
  ``import polars`` so that the scans and the import overlap, into polars frames, and nothing
  else; the process ends without tearing the interpreter down (as tracekit's CLI does): a
  lower bound for any polars program that reads this export;
- *bare polars, whole report*: a plain program that prints this report: the two scans, one
  join on the correlation id, the four durations, one group-by with count and mean, median,
  min, max and standard deviation of each, the names' ``StringIds`` rows by key, CSV to
  stdout. No column cache, no checks, no CLI, no tracekit import, no nsys formatting: what a
  straightforward polars program costs, for reference (its numbers equal tracekit's);
- ``tracekit stats -r cuda_kern_exec_sum -f csv --convention 2023`` cold (empty cache);
- ``nsys stats -r cuda_kern_exec_sum -f csv``.

The table's last column is what is left of the 3.5 × budget (nsys's median ÷ 3.5 minus the
process's median): negative for *polars + the two scans* means no polars program that reads
the export this way meets the target on this machine.

    python benchmarks/bench_exec_floor.py benchmarks/out/shapes/k200_a1_v0_n1k.sqlite [...] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    OUT,
    REPO,
    find_nsys,
    fmt_ratio,
    fmt_s,
    markdown_table,
    precompile_tracekit,
    print_table,
    python,
    run_measured,
    wait_for_idle,
    warm_page_cache,
    write_results,
)

#: The target of issue 44 §4: tracekit cold at least this many times faster than nsys.
TARGET = 3.5

#: The two SQLite scans alone, into polars: what any polars program reading the export pays.
#: Both run to the end inside ``execute_query`` (one batch of up to 10⁹ rows; the driver releases
#: the GIL) on two threads started before ``import polars``, which overlaps them.
SCANS = """
import os, sys, sqlite3, threading
import adbc_driver_manager, adbc_driver_sqlite
path = sys.argv[1]
uri = f"file:{path}?mode=ro&immutable=1"
K = "CUPTI_ACTIVITY_KIND_KERNEL"
streams = {}
def execute(key, sql):
    db = adbc_driver_manager.AdbcDatabase(driver=adbc_driver_sqlite._driver_path(), uri=uri)
    conn = adbc_driver_manager.AdbcConnection(db)
    st = adbc_driver_manager.AdbcStatement(conn)
    st.set_options(**{"adbc.sqlite.query.batch_rows": str(10**9)})
    st.set_sql_query(sql)
    streams[key] = (db, conn, st, st.execute_query()[0])
threads = [threading.Thread(target=execute, args=a) for a in [
    ("kern", f"SELECT correlationId AS c, globalPid AS gp, deviceId AS dev, demangledName AS kn, start AS ks, end AS ke FROM {K}"),
    ("api", "SELECT correlationId AS c, globalTid AS gt, nameId AS an, start AS s, end AS e FROM CUPTI_ACTIVITY_KIND_RUNTIME "
     f"WHERE +correlationId IN (SELECT correlationId FROM {K})")]]
for t in threads:
    t.start()
import polars as pl
for t in threads:
    t.join()
kern, api = (pl.DataFrame(streams[k][3]) for k in ("kern", "api"))
"""

#: :data:`SCANS`, then the join, the statistics, the names and the CSV.
BARE_POLARS = SCANS + """
j = kern.join(api, on="c", how="inner").select(
    (pl.col("gt") % (1 << 48)).alias("pt"), "dev", "an", "kn",
    (pl.max_horizontal("ke", "e") - pl.col("s")).alias("T"), (pl.col("e") - pl.col("s")).alias("A"),
    pl.when(pl.col("ks") >= pl.col("e")).then(pl.col("ks") - pl.col("e")).alias("Q"), (pl.col("ke") - pl.col("ks")).alias("K"))
stats = [e for p in "TAQK" for e in (pl.col(p).mean().alias(p + "avg"), pl.col(p).median().alias(p + "med"),
         pl.col(p).min().alias(p + "min"), pl.col(p).max().alias(p + "max"), pl.col(p).std().alias(p + "sd"))]
s = j.group_by("pt", "dev", "an", "kn").agg(pl.len().alias("n"), pl.col("Q").count().alias("qn"), *stats)
ids = pl.concat([s["an"], s["kn"]]).unique().to_list()
con = sqlite3.connect(uri, uri=True)
names = pl.DataFrame(con.execute(f"SELECT id, value FROM StringIds WHERE id IN ({','.join(map(str, ids))})").fetchall(),
                     schema={"id": pl.Int64, "v": pl.Utf8}, orient="row")
s = s.join(names.rename({"id": "an", "v": "api"}), on="an").join(names.rename({"id": "kn", "v": "kernel"}), on="kn")
s.drop("an", "kn").sort(["Tavg", "n", "kernel"], descending=[True, False, False]).write_csv(sys.stdout.buffer)
sys.stdout.flush()
os._exit(0)
"""


def measure(path: Path, rounds: int) -> tuple[list[list[str]], dict[str, list[float]]]:
    """Interleaved runs of each process on ``path``: the table's rows and every wall time (s)."""
    cache = OUT / f"exec_floor_cache_{path.stem}"
    nsys = find_nsys()
    variants: dict[str, list[str]] = {
        "python -c pass": [python(), "-c", "pass"],
        "python -c 'import polars'": [python(), "-c", "import polars"],
        "polars + the two scans": [python(), "-c", SCANS + "print(kern.height, api.height, flush=True); os._exit(0)", str(path)],
        "bare polars, whole report": [python(), "-c", BARE_POLARS, str(path)],
        "tracekit stats, cold": [python(), "-m", "tracekit.cli.entry", "stats", "-f", "csv", "--convention", "2023",
                                 "-r", "cuda_kern_exec_sum", str(path)],
    }
    if nsys:
        variants["nsys stats"] = [str(nsys), "stats", "-q", "-f", "csv", "-r", "cuda_kern_exec_sum",
                                  "--force-export=false", str(path)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRACEKIT_CACHE": str(cache)}
    runs: dict[str, list[float]] = {k: [] for k in variants}
    warm_page_cache(path)
    for rnd in range(rounds):
        for label, argv in variants.items():
            shutil.rmtree(cache, ignore_errors=True)
            wait_for_idle(5.0)
            m = run_measured(argv, env=env, cwd=REPO)
            if m.returncode != 0:
                raise SystemExit(f"{label} failed on {path.name}: {m.stderr.strip()[-400:]}")
            runs[label].append(m.wall_s)
        print(f"{path.name} round {rnd + 1}/{rounds}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in runs.items()),
              flush=True)
    shutil.rmtree(cache, ignore_errors=True)
    nsys_s = statistics.median(runs["nsys stats"]) if nsys else None
    rows = []
    for label, times in runs.items():
        med = statistics.median(times)
        rows.append([path.stem, label, f"{med:.3f}", f"{min(times):.3f}", fmt_ratio(nsys_s / med if nsys_s else None),
                     fmt_s(nsys_s / TARGET - med if nsys_s else None)])
    return rows, runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", type=Path, nargs="+", help="nsys SQLite exports (the grid's shapes)")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.files if not p.is_file()]
    if missing:
        print(f"not found: {', '.join(missing)} (make the shapes with benchmarks/bench_shapes.py)", file=sys.stderr)
        return 2
    precompile_tracekit(REPO)
    header = ["export", "process", "median s", "min s", "nsys ÷ this (median)", f"{TARGET}× budget left (s)"]
    rows: list[list[str]] = []
    runs: dict[str, dict[str, list[float]]] = {}
    for path in args.files:
        r, runs[path.name] = measure(path.resolve(), args.rounds)
        rows += r
    title = f"cuda_kern_exec_sum cold: the floor of a polars process, {args.rounds} interleaved rounds"
    print_table(title, header, rows)
    write_results("bench_exec_floor", {"files": [str(p) for p in args.files], "rounds": args.rounds, "runs_s": runs},
                  f"### {title}\n\n" + markdown_table(header, rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
