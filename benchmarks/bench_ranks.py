"""Many-rank benchmark: ``tracekit.open_many`` + cross-rank collective matching on N copies.

The N reports are copies of the two per-rank samples
(``sample_traces/llm_tp2_nccl_per_rank/…_rank{0,1}.sqlite``, 1.06 MB each, 538 kernels and
81 NCCL calls per rank), named ``job_rank<i>.sqlite``; every copy's environment says RANK=0
or 1, so ranks come from the file names (the fallback that a set of copies exercises). Each
variant runs in a fresh subprocess pinned to ``--cores`` CPUs (``os.sched_setaffinity``,
inherited by the worker processes); rounds are interleaved and the table reports medians.

* ``load s``: ``open_many(folder, max_workers=W, tables=T)`` (worker start-up included);
* ``match s``: ``match_collectives`` + ``collective_skew`` + ``skew_by_rank`` on ``ts.nccl``;
* ``process s``: the child's whole wall time (interpreter and imports too);
* ``peak RSS``: largest resident set of the child or of one of its workers (``os.wait4``).

    python benchmarks/bench_ranks.py [--ranks 64] [--cores 0,1] [--rounds 3] [--keep]
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
    OUT,
    REPO,
    fmt_s,
    machine,
    markdown_table,
    print_table,
    run_measured,
    versions,
    write_results,
)

SOURCES = [
    REPO / "sample_traces" / "llm_tp2_nccl_per_rank" / f"llm_tp2_nccl_per_rank_rank{r}.sqlite"
    for r in (0, 1)
]
#: (label, max_workers, tables)
VARIANTS: tuple[tuple[str, int, tuple[str, ...]], ...] = (
    ("2 workers, nccl only", 2, ("nccl",)),
    (
        "2 workers, default tables",
        2,
        ("kernels", "memcpys", "memsets", "cuda_api", "nvtx", "nccl", "gpus"),
    ),
    ("in-process, nccl only", 1, ("nccl",)),
    ("in-process, default tables", 1, ("kernels", "memcpys", "memsets", "cuda_api", "nvtx", "nccl", "gpus")),
)


def make_copies(folder: Path, n: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.sqlite"):
        old.unlink()
    out = []
    for i in range(n):
        dst = folder / f"job_rank{i}.sqlite"
        shutil.copyfile(SOURCES[i % 2], dst)
        out.append(dst)
    return out


def child(folder: str, workers: int, tables: list[str], cores: list[int]) -> None:
    """Runs in the measured subprocess: prints one JSON line."""
    os.sched_setaffinity(0, cores)
    from tracekit.analysis.ranks import collective_skew, match_collectives, skew_by_rank
    from tracekit.multi import open_many

    t0 = time.perf_counter()
    ts = open_many(folder, max_workers=workers, tables=tuple(tables), policy="raise")
    t1 = time.perf_counter()
    matched = match_collectives(ts.nccl)
    skew = collective_skew(matched)
    by_rank = skew_by_rank(matched)
    t2 = time.perf_counter()
    print(
        json.dumps(
            {
                "load_s": t1 - t0,
                "match_s": t2 - t1,
                "reports": len(ts),
                "calls": ts.nccl.height,
                "collectives": skew.height,
                "complete": int(skew["complete"].sum()),
                "ranks_per_collective": sorted(set(skew["match_ranks"].to_list())),
                "ranks": by_rank.height,
                "rank_sources": sorted(set(ts.ranks["rank_source"].to_list())),
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--cores", default="0,1", help="CPUs the run may use (comma-separated)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--folder", type=Path, default=OUT / "ranks")
    ap.add_argument("--keep", action="store_true", help="keep the copies (deleted by default)")
    ap.add_argument(
        "--child", nargs=4, metavar=("FOLDER", "WORKERS", "TABLES", "CORES"), help=argparse.SUPPRESS
    )
    args = ap.parse_args()
    if args.child:
        folder, workers, tables, cores = args.child
        child(folder, int(workers), tables.split(","), [int(c) for c in cores.split(",")])
        return
    cores = [int(c) for c in args.cores.split(",")]
    files = make_copies(args.folder, args.ranks)
    size = sum(f.stat().st_size for f in files)
    for f in files:  # warm page cache
        f.read_bytes()
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in VARIANTS}
    for _ in range(args.rounds):
        for label, workers, tables in VARIANTS:
            argv = [
                sys.executable,
                __file__,
                "--child",
                str(args.folder),
                str(workers),
                ",".join(tables),
                args.cores,
            ]
            m = run_measured(argv)
            if m.returncode != 0:
                raise SystemExit(f"{label} failed:\n{m.stderr}")
            result = json.loads(m.stdout.strip().splitlines()[-1])
            result.update(process_s=m.wall_s, peak_rss_mb=m.peak_rss_mb)
            runs[label].append(result)
    header = ["variant", "load s", "match s", "load+match s", "process s", "peak RSS MB"]
    rows = []
    summary = {}
    for label, _, _ in VARIANTS:
        r = runs[label]
        med = {
            k: statistics.median(x[k] for x in r)
            for k in ("load_s", "match_s", "process_s", "peak_rss_mb")
        }
        med["load_match_s"] = statistics.median(x["load_s"] + x["match_s"] for x in r)
        summary[label] = med
        rows.append(
            [
                label,
                fmt_s(med["load_s"]),
                fmt_s(med["match_s"]),
                fmt_s(med["load_match_s"]),
                fmt_s(med["process_s"]),
                f"{med['peak_rss_mb']:.0f}",
            ]
        )
    first = runs[VARIANTS[0][0]][0]
    title = (
        f"open_many + match_collectives, {args.ranks} reports ({size / 1e6:.0f} MB), "
        f"CPUs {args.cores}, median of {args.rounds}"
    )
    print_table(title, header, rows)
    facts = (
        f"{first['reports']} reports, {first['calls']} NCCL calls, {first['collectives']} matched collectives "
        f"({first['complete']} complete, ranks per collective {first['ranks_per_collective']}), "
        f"rank sources {first['rank_sources']}"
    )
    print(facts)
    md = f"### {title}\n\n" + markdown_table(header, rows) + f"\n{facts}\n"
    payload = {
        "machine": machine(),
        "versions": versions(),
        "ranks": args.ranks,
        "cores": cores,
        "bytes": size,
        "runs": runs,
        "median": summary,
        "facts": first,
    }
    jpath, mpath = write_results("bench_ranks", payload, md)
    print(f"wrote {jpath} and {mpath}")
    if not args.keep:
        shutil.rmtree(args.folder)


if __name__ == "__main__":
    main()
