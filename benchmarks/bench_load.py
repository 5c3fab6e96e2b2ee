"""Load benchmark: tracekit's kernels + cuda_api + nvtx vs a raw Arrow read and pandas.read_sql.

Each variant runs in a fresh subprocess, rounds interleaved (A B C D, A B C D, …) so that
background load hits every variant alike; the table reports the median of the rounds, and
the ratios are computed from those medians in the same run.

* ``tracekit`` — ``tracekit.open(path, column_cache=False)`` then ``.kernels``, ``.cuda_api``,
  ``.nvtx`` (ADBC; large tables read in rowid slices on parallel threads);
* ``tracekit-cached`` — the same with the column cache on and already filled (by one load
  before the rounds): what every later process that opens the same export pays;
* ``tracekit-fill`` — the same with the column cache on and emptied before each round: a
  first open, which reads SQLite and fills the cache on the way (issue 28's target: within
  1.3× of the raw Arrow read);
* ``tracekit-sqlite3`` — the same with ``engine="sqlite3"`` (stdlib path; for information);
* ``arrow`` — ADBC ``cursor.execute`` + ``fetch_arrow_table`` of the very SELECTs tracekit
  runs for those tables (recorded from tracekit itself), nothing else;
* ``connectorx`` — ``connectorx.read_sql(..., return_type="arrow")`` of the same SELECTs (declared
  columns, without NVTX's BLOB ``binaryData``, which connectorx cannot return as Arrow)
  (issue 37's baseline; skipped with a note when connectorx is not installed);
* ``pandas`` — ``pandas.read_sql`` of the same SELECTs on a stdlib ``sqlite3`` connection;

``load s`` is measured inside the child from just before the open to the last table; imports
and first-use set-up (tracekit imports its ADBC driver lazily, ADBC loads its driver library on
the first connect) are done before it by a warm-up load of the small seed export; ``process s`` is the child's whole wall time (interpreter, imports, load);
``peak RSS`` is the child's maximum resident set size (``os.wait4``).

    python benchmarks/bench_load.py [--file benchmarks/out/big.sqlite] [--rounds 3]
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    DEFAULT_BIG,
    DEFAULT_SEEDS,
    OUT,
    fmt_ratio,
    fmt_s,
    markdown_table,
    precompile_tracekit,
    print_table,
    run_measured,
    source_state,
    table_info,
    wait_for_idle,
    warm_page_cache,
    write_results,
)

TABLES = ("kernels", "cuda_api", "nvtx")
VARIANTS = ("tracekit", "arrow", "connectorx", "pandas", "tracekit-sqlite3", "tracekit-cached", "tracekit-fill")
CACHE = OUT / "bench_load_cache"
FILL_CACHE = OUT / "bench_load_fill_cache"
LABELS = {
    "tracekit": "tracekit (ADBC)",
    "tracekit-cached": "tracekit, column cache filled",
    "tracekit-fill": "tracekit, first open (cache filled on the way)",
    "tracekit-sqlite3": "tracekit engine=sqlite3",
    "arrow": "raw Arrow (ADBC fetch_arrow_table)",
    "connectorx": "raw connectorx (read_sql → Arrow)",
    "pandas": "pandas.read_sql (sqlite3)",
}
TARGETS = {"arrow": ("tracekit / raw Arrow", "≤ 1.3×"), "pandas": ("pandas / tracekit", "≥ 4×")}


def _uri(path: Path) -> str:
    import urllib.parse

    return f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro&immutable=1"


def warmup_file(path: Path) -> Path | None:
    """The small export ``path`` was built from (its ``.json`` sidecar says), else a default seed."""
    sidecar = path.with_name(path.name + ".json")
    if sidecar.exists():
        seed = Path(json.loads(sidecar.read_text()).get("seed", ""))
        if seed.is_file():
            return seed
    return next((s for s in DEFAULT_SEEDS if s.exists()), None)


def record_queries(path: Path) -> list[str]:
    """The SELECTs tracekit runs for kernels, cuda_api, nvtx (whole-table reads, which
    tracekit may split into rowid slices, and any other query).

    Recorded by running tracekit with ``query_table`` and ``query`` stubbed to return empty
    frames, so the list follows the loader as it changes.
    """
    import polars as pl

    import tracekit
    from tracekit.nsys.database import ExportDatabase

    recorded: list[str] = []
    original, original_table = ExportDatabase.query, ExportDatabase.query_table

    def stub(self: ExportDatabase, sql: str, schema: Any) -> pl.DataFrame:
        recorded.append(sql)
        return pl.DataFrame(schema=dict(schema))

    def stub_table(self: ExportDatabase, table: str, exprs: Any, schema: Any, where: str = "") -> pl.DataFrame:
        recorded.append(f'SELECT {", ".join(exprs)} FROM "{table}"' + (f" WHERE {where}" if where else ""))
        return pl.DataFrame(schema=dict(schema))

    ExportDatabase.query = stub  # type: ignore[method-assign]
    ExportDatabase.query_table = stub_table  # type: ignore[method-assign]
    try:
        trace = tracekit.open(path, column_cache=False)
        for name in TABLES:
            getattr(trace, name)
        trace.close()
    finally:
        ExportDatabase.query, ExportDatabase.query_table = original, original_table  # type: ignore[method-assign]
    return recorded


# -- children -------------------------------------------------------------------------------
def _load(variant: str, path: Path, queries: list[str]) -> tuple[dict[str, int], str]:
    """Load the three tables (or run the recorded SELECTs) the way ``variant`` does."""
    if variant.startswith("tracekit"):
        import tracekit

        engine = "sqlite3" if variant == "tracekit-sqlite3" else "auto"
        trace: Any = tracekit.open(path, engine=engine, column_cache=variant in ("tracekit-cached", "tracekit-fill"))
        rows = {name: getattr(trace, name).height for name in TABLES}
        return rows, trace.db.engine
    if variant == "arrow":
        import adbc_driver_sqlite.dbapi as adbc

        con = adbc.connect(_uri(path))
        kept = []
        for sql in queries:
            cur = con.cursor()
            cur.execute(sql)
            kept.append(cur.fetch_arrow_table())
            cur.close()
        return {f"q{i}": t.num_rows for i, t in enumerate(kept)}, "adbc"
    if variant == "connectorx":
        import re

        import connectorx as cx

        # the columns as declared (connectorx infers a type from the declaration; tracekit's
        # CAST(... AS BLOB) of text columns has none, and a NULL first value then fails)
        # (a literal NULL column, which tracekit selects for a column the export lacks, likewise)
        # (a literal NULL column, which tracekit selects for a column the export lacks, likewise;
        # and NVTX's binaryData, a BLOB column connectorx cannot return as Arrow: left out)
        plain = [re.sub(r', (?:NULL|"binaryData")(?=[, ] ?FROM|,)', "", re.sub(r'CAST\(("\w+") AS BLOB\)', r"\1", sql))
                 for sql in queries]
        tables = [cx.read_sql(f"sqlite://{path.resolve()}", sql, return_type="arrow") for sql in plain]
        return {f"q{i}": t.num_rows for i, t in enumerate(tables)}, "connectorx"
    if variant == "pandas":
        import sqlite3

        import pandas as pd

        scon = sqlite3.connect(_uri(path), uri=True)
        frames = [pd.read_sql(sql, scon) for sql in queries]
        return {f"q{i}": len(f) for i, f in enumerate(frames)}, "sqlite3"
    msg = f"unknown variant {variant!r}"
    raise SystemExit(msg)


def child(variant: str, path: Path, queries: list[str], warmup: Path | None) -> dict[str, Any]:
    t_imp = time.perf_counter()
    if variant.startswith("tracekit"):
        import polars  # noqa: F401

        import tracekit  # noqa: F401
        import tracekit.nsys.trace  # noqa: F401  (tracekit.open imports it lazily)
    elif variant == "arrow":
        import adbc_driver_sqlite.dbapi  # noqa: F401
        import pyarrow  # noqa: F401
    elif variant == "connectorx":
        import connectorx  # noqa: F401
        import pyarrow  # noqa: F401
    elif variant == "pandas":
        import pandas  # noqa: F401
    if warmup is not None:
        try:
            _load(variant, warmup, queries)
        except Exception as exc:  # a seed without one of the tables: warm-up is best effort
            print(f"warm-up on {warmup} failed: {exc}", file=sys.stderr)
    import_s = time.perf_counter() - t_imp

    t0, c0 = time.perf_counter(), time.process_time()
    rows, engine = _load(variant, path, queries)
    load_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    return {"import_s": import_s, "load_s": load_s, "cpu_s": cpu_s, "rows": rows, "engine": engine}


# -- parent ---------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--file", type=Path, default=DEFAULT_BIG)
    parser.add_argument(
        "--rounds", type=int, default=3, help="interleaved rounds per variant (default 3)"
    )
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="comma-separated subset of " + ", ".join(VARIANTS),
    )
    parser.add_argument(
        "--idle-wait",
        type=float,
        default=10.0,
        help="before each run, wait up to this many seconds for other processes to go quiet (0: never)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--queries", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        queries = json.loads(args.queries.read_text()) if args.queries else []
        print(json.dumps(child(args.child, args.file, queries, args.warmup)))
        return 0

    precompile_tracekit()
    path: Path = args.file
    if not path.exists():
        print(
            f"{path} is missing: build it with `python benchmarks/make_big_trace.py -o {path}`",
            file=sys.stderr,
        )
        return 2
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    OUT.mkdir(parents=True, exist_ok=True)
    queries = record_queries(path)
    qfile = OUT / "load_queries.json"
    qfile.write_text(json.dumps(queries, indent=2) + "\n")
    counts = table_info(path)
    print(
        f"{path} ({path.stat().st_size / 1e9:.2f} GB): "
        + ", ".join(f"{k} {v:,}" for k, v in counts.items())
    )
    print(f"{len(queries)} SELECTs recorded from tracekit → {qfile}")
    warmup = warmup_file(path)
    print(f"warm-up file (imports, first connect): {warmup}")
    warm_page_cache(path)
    os.environ["TRACEKIT_CACHE"] = str(CACHE)  # children inherit it
    if "tracekit-cached" in variants:
        shutil.rmtree(CACHE, ignore_errors=True)
        fill = run_measured([sys.executable, __file__, "--child", "tracekit-cached", "--file", str(path)])
        print(f"column cache filled in {fill.wall_s:.2f} s (one tracekit process: read + write)")

    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    print(
        f"load average before: {os.getloadavg()[0]:.2f} (2 cores; other sessions may share the machine)"
    )
    t_start = time.perf_counter()
    for r in range(args.rounds):
        for v in variants:
            busy_before = wait_for_idle(args.idle_wait) if args.idle_wait > 0 else None
            env = None
            if v == "tracekit-fill":  # a first open: an empty cache of its own, filled by the run
                shutil.rmtree(FILL_CACHE, ignore_errors=True)
                env = {**os.environ, "TRACEKIT_CACHE": str(FILL_CACHE)}
            m = run_measured(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    v,
                    "--file",
                    str(path),
                    "--queries",
                    str(qfile),
                    *(["--warmup", str(warmup)] if warmup else []),
                ],
                env=env,
            )
            if m.returncode != 0:
                print(m.stderr, file=sys.stderr)
                msg = f"variant {v} failed (exit {m.returncode})"
                raise SystemExit(msg)
            res = json.loads(m.stdout.strip().splitlines()[-1])
            res.update(
                process_s=m.wall_s,
                peak_rss_mb=m.peak_rss_mb,
                others_cores=m.others_cores,
                busy_before=busy_before,
            )
            runs[v].append(res)
            print(
                f"  round {r + 1}/{args.rounds} {v:17s} load {res['load_s']:6.2f} s  cpu {res['cpu_s']:6.2f} s  "
                f"process {m.wall_s:6.2f} s  peak RSS {m.peak_rss_mb:7.0f} MB  others {m.others_cores:4.2f} cores",
                flush=True,
            )
    total_s = time.perf_counter() - t_start

    # every variant must have read the same rows (raw variants also read StringIds)
    data_rows = sum(
        counts.get(t, 0)
        for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS")
    )
    string_rows = counts.get("StringIds", 0)
    for v in variants:
        got = sum(runs[v][0]["rows"].values())
        want = data_rows if v.startswith("tracekit") else data_rows + string_rows
        if got != want:
            msg = f"{v} read {got:,} rows, expected {want:,}"
            raise SystemExit(msg)
    summary: dict[str, dict[str, float]] = {}
    for v in variants:
        rs = runs[v]
        summary[v] = {
            "load_s": statistics.median(r["load_s"] for r in rs),
            "load_min_s": min(r["load_s"] for r in rs),
            "cpu_s": statistics.median(r["cpu_s"] for r in rs),
            "process_s": statistics.median(r["process_s"] for r in rs),
            "import_s": statistics.median(r["import_s"] for r in rs),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in rs),
            "others_cores": statistics.median(r["others_cores"] for r in rs),
        }
    ref = summary.get("tracekit")
    header = [
        "variant",
        "load s (median)",
        "load s (min)",
        "CPU s",
        "process s",
        "peak RSS MB",
        "load ÷ tracekit",
        "others (cores)",
    ]
    rows = []
    for v in variants:
        s = summary[v]
        ratio = s["load_s"] / ref["load_s"] if ref else None
        rows.append(
            [
                LABELS.get(v, v),
                fmt_s(s["load_s"]),
                fmt_s(s["load_min_s"]),
                fmt_s(s["cpu_s"]),
                fmt_s(s["process_s"]),
                f"{s['peak_rss_mb']:.0f}",
                fmt_ratio(ratio),
                f"{s['others_cores']:.2f}",
            ]
        )
    checks: list[list[str]] = []

    def ratio_rows(label: str, num: str, den: str, target: str, ok: Any) -> None:
        """One row per statistic: median wall, min wall, median CPU time of the load."""
        if num not in summary or den not in summary:
            return
        for stat, key in (
            ("wall, median", "load_s"),
            ("wall, min", "load_min_s"),
            ("CPU", "cpu_s"),
        ):
            x = summary[num][key] / summary[den][key]
            verdict = "" if ok is None else ("met" if ok(x) else "MISSED")
            checks.append([f"{label} ({stat})", fmt_ratio(x), target, verdict])

    ratio_rows("tracekit ÷ raw Arrow", "tracekit", "arrow", "≤ 1.30×", lambda x: x <= 1.3)
    ratio_rows("first open, cache filled on the way ÷ raw Arrow", "tracekit-fill", "arrow", "≤ 1.30×", lambda x: x <= 1.3)
    ratio_rows("first open, cache filled on the way ÷ raw connectorx", "tracekit-fill", "connectorx", "≤ 1.30×", lambda x: x <= 1.3)
    ratio_rows("tracekit ÷ raw connectorx", "tracekit", "connectorx", "≤ 1.30×", lambda x: x <= 1.3)
    ratio_rows("pandas.read_sql ÷ tracekit", "pandas", "tracekit", "≥ 4.00×", lambda x: x >= 4)
    for stat, key in (("process wall, median", "process_s"),):
        if "tracekit" in summary and "pandas" in summary and "arrow" in summary:
            tk = summary["tracekit"][key]
            checks.append(
                [
                    f"tracekit ÷ raw Arrow ({stat})",
                    fmt_ratio(tk / summary["arrow"][key]),
                    "info",
                    "",
                ]
            )
            checks.append(
                [
                    f"pandas.read_sql ÷ tracekit ({stat})",
                    fmt_ratio(summary["pandas"][key] / tk),
                    "info",
                    "",
                ]
            )
    ratio_rows("engine=sqlite3 ÷ ADBC", "tracekit-sqlite3", "tracekit", "info", None)

    title = f"load kernels + cuda_api + nvtx: {path.name}, {args.rounds} rounds"
    print_table(title, header, rows)
    print_table("ratios (same run)", ["ratio", "value", "target", ""], checks)
    print(f"benchmark wall time {total_s:.0f} s; {string_rows:,} StringIds rows")

    md = (
        f"### {title}\n\n"
        + markdown_table(header, rows)
        + "\n"
        + markdown_table(["ratio", "value", "target", ""], checks)
        + f"\ntracekit source: {source_state()}; {time.strftime('%Y-%m-%d %H:%M %Z')}.\n"
    )
    payload = {
        "file": str(path),
        "file_bytes": path.stat().st_size,
        "row_counts": counts,
        "queries": queries,
        "rounds": args.rounds,
        "runs": runs,
        "summary": summary,
        "checks": checks,
        "wall_s": total_s,
    }
    jpath, mpath = write_results(
        "bench_load" if path.resolve() == DEFAULT_BIG.resolve() else f"bench_load_{path.stem}",
        payload,
        md,
    )
    print(f"wrote {jpath} and {mpath}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
