"""Hundreds of ranks: ``open_many(engine="dask")`` (2 local Dask workers) vs the process pool.

Input: N copies of the two per-rank samples (``sample_traces/llm_tp2_nccl_per_rank``) as
``benchmarks/out/dask_ranks/job_rank<i>.sqlite``; copy i's session start is shifted by i µs
(``TARGET_INFO_SESSION_START_TIME``) so every copy has its own clock, and its rank comes from
the file name. Both variants compute the same per-rank reductions (kernel summary, NCCL calls,
iterations, busy, overlap, findings; ``tracekit.scale.reduce``):

* ``dask``: ``open_many(folder, engine="dask", client=…)`` on a ``LocalCluster`` of 2 worker
  processes (1 thread each); the client receives the reductions only;
* ``pool``: ``open_many(folder, max_workers=2)`` (every rank's raw tables come to the client),
  then the same reductions computed in the client on the whole set.

Each variant runs in a fresh subprocess; the table gives wall time, the client's peak RSS
(``ru_maxrss``) and, for dask, each worker's peak RSS (asked from the workers before they
stop). Client RSS should stay flat from 64 to 256 ranks with dask.

    python benchmarks/bench_dask.py [--ranks 64,256]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import OUT, REPO, markdown_table, print_table, python, source_state, write_results  # noqa: E402

SEED = REPO / "sample_traces" / "llm_tp2_nccl_per_rank"

CHILD = r"""
import json, resource, sys, time
import tracekit
from tracekit.scale.reduce import reductions_of

def main():
    variant, folder = sys.argv[1], sys.argv[2]
    t0 = time.perf_counter()
    workers = {}
    if variant == "dask":
        from distributed import Client, LocalCluster
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, Client(cluster) as client:
            rs = tracekit.open_many(folder, engine="dask", client=client)
            workers = client.run(lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
            n, rows = len(rs), rs.kernel_summary.height + rs.iterations.height
    else:
        ts = tracekit.open_many(folder, max_workers=2)
        red = reductions_of(ts)
        n, rows = len(ts), red["kernel_summary"].height + red["iterations"].height
    wall = time.perf_counter() - t0
    print(json.dumps({"wall_s": wall, "client_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "worker_rss_mb": sorted(workers.values()), "reports": n, "rows": rows}))

if __name__ == "__main__":
    main()
"""


def make_copies(n: int) -> Path:
    folder = OUT / f"dask_ranks_{n}"
    if folder.is_dir() and len(list(folder.glob("*.sqlite"))) == n:
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for i in range(n):
        dst = folder / f"job_rank{i}.sqlite"
        shutil.copyfile(SEED / f"llm_tp2_nccl_per_rank_rank{i % 2}.sqlite", dst)
        con = sqlite3.connect(dst)
        con.execute("UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = utcEpochNs + ?", (i * 1000,))
        con.commit()
        con.close()
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="64,256")
    args = ap.parse_args()
    child = OUT / "bench_dask_child.py"
    OUT.mkdir(parents=True, exist_ok=True)
    child.write_text(CHILD)
    results = []
    for n in [int(x) for x in args.ranks.split(",")]:
        folder = make_copies(n)
        for variant in ("dask", "pool"):
            out = subprocess.run([python(), str(child), variant, str(folder)], capture_output=True, text=True, timeout=3600)
            if out.returncode != 0:
                sys.exit(f"{variant} {n}: {out.stderr.strip().splitlines()[-1]}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            results.append({"ranks": n, "variant": variant, **r})
            print(n, variant, r, flush=True)
    header = ["ranks", "variant", "wall s", "client peak RSS MB", "worker peak RSS MB"]
    rows = [[str(r["ranks"]), r["variant"], f"{r['wall_s']:.1f}", f"{r['client_rss_mb']:.0f}",
             ", ".join(f"{w:.0f}" for w in r["worker_rss_mb"]) or "–"] for r in results]
    print_table("open_many(engine='dask') vs process pool", header, rows)
    write_results("bench_dask", {"results": results, "source": source_state()}, markdown_table(header, rows))


if __name__ == "__main__":
    main()
