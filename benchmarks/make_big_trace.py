"""Build a large Nsight Systems SQLite export by repeating a real export's timeline.

The seed file is copied whole (every table, StringIds, enums, metadata); then the rows of the
activity tables are appended again and again, copy ``k`` (k = 1 … copies-1) with

* every timestamp shifted by ``k × (span + gap)``, where ``span`` runs from the earliest to the
  latest timestamp of the repeated tables, so copies follow one another and never overlap;
* ``correlationId`` offset by ``k × (max correlationId + 1)`` in every CUDA table, so a kernel
  still joins to exactly one API call (same process, same offset);
* NVTX ``rangeId`` offset by ``k × (max rangeId + 1)`` (NULLs stay NULL);
* string ids, device, context, stream, thread and process ids unchanged.

Rows go in copy by copy, so each table stays in time order as nsys writes it. The session end in
``ANALYSIS_DETAILS`` is moved to the new last timestamp. Tables not listed in ``REPEATED`` (OS
runtime, memory-usage events, CUDA events, sampling …) keep the seed's rows only.

Example
-------
    python benchmarks/make_big_trace.py --kernels 1000000 \\
        --seed sample_traces/llm_decode_1gpu/llm_decode_1gpu.sqlite -o benchmarks/out/big.sqlite
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sqlite3
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DEFAULT_BIG, DEFAULT_SEEDS, sha256  # noqa: E402

#: table → (time columns, id columns offset by the correlation stride, … by the NVTX range stride)
REPEATED: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "CUPTI_ACTIVITY_KIND_KERNEL": (("start", "end"), ("correlationId",), ()),
    "CUPTI_ACTIVITY_KIND_RUNTIME": (("start", "end"), ("correlationId",), ()),
    "CUPTI_ACTIVITY_KIND_MEMCPY": (("start", "end"), ("correlationId",), ()),
    "CUPTI_ACTIVITY_KIND_MEMSET": (("start", "end"), ("correlationId",), ()),
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": (("start", "end"), ("correlationId",), ()),
    "NVTX_EVENTS": (("start", "end"), (), ("rangeId",)),
    "GPU_METRICS": (("timestamp", "rawTimestamp"), (), ()),
}
KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"


def _columns(con: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]


def _present(con: sqlite3.Connection, skip: set[str]) -> dict[str, list[str]]:
    names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    return {t: _columns(con, t) for t in REPEATED if t in names and t not in skip}


def _bounds(con: sqlite3.Connection, tables: dict[str, list[str]]) -> tuple[int, int, int, int]:
    """(earliest time, latest time, max correlationId, max rangeId) over the repeated tables."""
    lo, hi, corr, rng = None, None, 0, 0
    for table, cols in tables.items():
        times, corr_cols, range_cols = REPEATED[table]
        for c in times:
            if c not in cols or c == "rawTimestamp":  # raw GPU clock: not the session timeline
                continue
            a, b = con.execute(f'SELECT min("{c}"), max("{c}") FROM "{table}"').fetchone()
            if a is not None:
                lo = a if lo is None else min(lo, a)
                hi = b if hi is None else max(hi, b)
        for c in corr_cols:
            if c in cols:
                corr = max(
                    corr,
                    con.execute(f'SELECT coalesce(max("{c}"), 0) FROM "{table}"').fetchone()[0],
                )
        for c in range_cols:
            if c in cols:
                rng = max(
                    rng, con.execute(f'SELECT coalesce(max("{c}"), 0) FROM "{table}"').fetchone()[0]
                )
    if lo is None or hi is None:
        msg = "the seed has no timestamps in any repeated table; pick an export with CUDA activity"
        raise SystemExit(msg)
    return lo, hi, corr, rng


def build(
    seed: Path,
    output: Path,
    *,
    kernels: int,
    gap_ns: int = 1_000_000,
    skip: set[str] | None = None,
    gpu_metrics_every: int = 1,
) -> dict[str, object]:
    """Write ``output`` with at least ``kernels`` kernel rows; return what was done.

    ``gpu_metrics_every`` = K repeats ``GPU_METRICS`` only in the copies k with k % K == 0 (the
    seed's copy 0 included), so a many-kernel export keeps a realistic GPU-metrics share without
    its size growing 13× (sampled metrics are ~93 % of a fully repeated export's bytes).
    """
    if gpu_metrics_every < 1:
        msg = "--gpu-metrics-every must be ≥ 1"
        raise SystemExit(msg)
    t0 = time.perf_counter()
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + ".partial")
    tmp.unlink(missing_ok=True)
    shutil.copyfile(seed, tmp)
    con = sqlite3.connect(tmp, isolation_level=None)
    try:
        # a scratch file: no journal, no fsync (a crash leaves only the .partial file)
        con.execute("PRAGMA journal_mode = OFF")
        con.execute("PRAGMA synchronous = OFF")
        con.execute("PRAGMA cache_size = -262144")  # 256 MiB
        con.execute("PRAGMA temp_store = MEMORY")
        tables = _present(con, skip or set())
        if KERNEL_TABLE not in tables:
            msg = f"{seed} has no {KERNEL_TABLE} table; pick an export captured with --trace=cuda"
            raise SystemExit(msg)
        seed_kernels = con.execute(f"SELECT count(*) FROM {KERNEL_TABLE}").fetchone()[0]
        if seed_kernels == 0:
            msg = f"{seed} has no kernel rows"
            raise SystemExit(msg)
        copies = max(1, math.ceil(kernels / seed_kernels))
        lo, hi, max_corr, max_range = _bounds(con, tables)
        time_stride = hi - lo + gap_ns
        corr_stride = max_corr + 1
        range_stride = max_range + 1
        con.execute("BEGIN")
        # the copy numbers 1 … copies-1, outer loop of every INSERT … SELECT below
        con.execute("CREATE TEMP TABLE _k (k INTEGER PRIMARY KEY)")
        con.executemany("INSERT INTO _k VALUES (?)", ((k,) for k in range(1, copies)))
        counts: dict[str, dict[str, int]] = {}
        for table, cols in tables.items():
            times, corr_cols, range_cols = REPEATED[table]
            exprs = []
            for c in cols:
                q = f'o."{c}"'
                if c in times:
                    exprs.append(f"{q} + _k.k * {time_stride}")
                elif c in corr_cols:
                    exprs.append(f"{q} + _k.k * {corr_stride}")
                elif c in range_cols:
                    exprs.append(f"{q} + _k.k * {range_stride}")
                else:
                    exprs.append(q)
            quoted = ", ".join(f'"{c}"' for c in cols)
            before = con.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]
            # snapshot the seed rows first: reading and appending one table in one statement
            # would make SQLite buffer the whole result anyway
            con.execute(
                f'CREATE TEMP TABLE _o AS SELECT {quoted} FROM main."{table}" ORDER BY rowid'
            )
            every = gpu_metrics_every if table == "GPU_METRICS" else 1
            where = f"WHERE _k.k % {every} = 0 " if every > 1 else ""
            con.execute(
                f'INSERT INTO main."{table}" ({quoted}) SELECT {", ".join(exprs)} '
                f"FROM _k CROSS JOIN _o AS o {where}ORDER BY _k.k, o.rowid"
            )
            con.execute("DROP TABLE _o")
            n_copies = 1 + (copies - 1) // every
            counts[table] = {"seed": before, "total": before * n_copies}
        end = hi + (copies - 1) * time_stride
        cols = _columns(con, "ANALYSIS_DETAILS") if "ANALYSIS_DETAILS" in _table_names(con) else []
        if {"startTime", "stopTime", "duration"} <= set(cols):
            # ANALYSIS_DETAILS is on the session clock; our shifts are on the same clock
            con.execute(
                "UPDATE ANALYSIS_DETAILS SET stopTime = stopTime + ?, duration = duration + ?",
                ((copies - 1) * time_stride, (copies - 1) * time_stride),
            )
        con.execute("COMMIT")
        for table in tables:
            got = con.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]
            if got != counts[table]["total"]:
                msg = f"{table}: expected {counts[table]['total']} rows, found {got}"
                raise SystemExit(msg)
    finally:
        con.close()
    os.replace(tmp, output)
    info: dict[str, object] = {
        "seed": str(seed),
        "seed_sha256": sha256(seed),
        "output": str(output),
        "output_bytes": output.stat().st_size,
        "copies": copies,
        "gap_ns": gap_ns,
        "time_stride_ns": time_stride,
        "correlation_stride": corr_stride,
        "range_stride": range_stride,
        "timeline_ns": [lo, end],
        "rows": counts,
        "skipped_tables": sorted(skip or ()),
        "gpu_metrics_every": gpu_metrics_every,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    output.with_name(output.name + ".json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def _table_names(con: sqlite3.Connection) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def default_seed() -> Path:
    for cand in DEFAULT_SEEDS:
        if cand.exists():
            return cand
    msg = "no seed export found; pass --seed PATH (a real `nsys export --type sqlite` file)"
    raise SystemExit(msg)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--kernels",
        type=int,
        default=1_000_000,
        help="at least this many kernel rows (default 1e6)",
    )
    parser.add_argument(
        "--seed", type=Path, default=None, help="real export to repeat (default: llm_decode_1gpu)"
    )
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        default=DEFAULT_BIG,
        help="output .sqlite (default %(default)s)",
    )
    parser.add_argument(
        "--gap-ns", type=int, default=1_000_000, help="idle time between copies (default 1 ms)"
    )
    parser.add_argument(
        "--no-gpu-metrics",
        action="store_true",
        help="keep GPU_METRICS at the seed's rows (it is the largest table when repeated)",
    )
    parser.add_argument(
        "--gpu-metrics-every",
        type=int,
        default=1,
        metavar="K",
        help="repeat GPU_METRICS only in every K-th copy (default 1: every copy)",
    )
    parser.add_argument(
        "--force", action="store_true", help="rebuild even if the output is up to date"
    )
    args = parser.parse_args(argv)
    seed = (args.seed or default_seed()).resolve()
    skip = {"GPU_METRICS"} if args.no_gpu_metrics else set()
    sidecar = args.output.with_name(args.output.name + ".json")
    if args.output.exists() and sidecar.exists() and not args.force:
        info = json.loads(sidecar.read_text())
        k = info["rows"].get(KERNEL_TABLE, {}).get("total", 0)
        if (
            Path(info.get("seed", "")).resolve() == seed
            and k >= args.kernels
            and info.get("gap_ns") == args.gap_ns
            and sorted(info.get("skipped_tables", [])) == sorted(skip)
            and info.get("gpu_metrics_every", 1) == args.gpu_metrics_every
            and info.get("output_bytes") == args.output.stat().st_size
        ):
            print(f"{args.output} is up to date ({k:,} kernels); --force rebuilds it")
            return 0
    info = build(
        seed,
        args.output,
        kernels=args.kernels,
        gap_ns=args.gap_ns,
        skip=skip,
        gpu_metrics_every=args.gpu_metrics_every,
    )
    rows = info["rows"]
    assert isinstance(rows, dict)
    print(
        f"wrote {args.output} ({int(str(info['output_bytes'])) / 1e9:.2f} GB) in {info['seconds']} s: "
        f"{info['copies']} copies of {seed.name}"
    )
    for table, c in rows.items():
        print(f"  {table:38s} {c['seed']:>9,} → {c['total']:>12,}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
