"""`tracekit diagnose` vs `tracekit summary` on the same big export (issue: diagnose takes at
most 2× the time of summary, warm column cache).

Both run as fresh CLI processes (rounds interleaved: summary, diagnose, …); ``summary`` runs
with ``--findings 0`` so it is the summary alone. A first, unmeasured run of each fills the
column cache (``$TRACEKIT_CACHE`` under benchmarks/out); the table gives median wall time, the
largest peak RSS and the ratio diagnose ÷ summary of this run's medians. The input's SHA-256 is
checked before and after.

    python benchmarks/bench_diagnose.py [--file benchmarks/out/big.sqlite] [--rounds 3]
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
    fmt_ratio,
    fmt_s,
    markdown_table,
    precompile_tracekit,
    print_table,
    python,
    run_measured,
    sha256,
    source_state,
    table_info,
    wait_for_idle,
    warm_page_cache,
    write_results,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", type=Path, default=DEFAULT_BIG)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    path: Path = args.file
    if not path.is_file():
        sys.exit(f"{path} not found: build it with benchmarks/make_big_trace.py (see benchmarks/README.md)")
    precompile_tracekit()
    exe = str(Path(python()).with_name("tracekit"))
    env = {**os.environ, "TRACEKIT_CACHE": str(OUT / "cache_diagnose"), "COLUMNS": "200"}
    commands = {
        "summary": [exe, "summary", "--findings", "0", str(path)],
        "diagnose": [exe, "diagnose", "--format", "json", str(path)],
    }
    before = sha256(path)
    warm_page_cache(path)
    for argv in commands.values():  # fill the column cache; not timed
        first = run_measured(argv, env=env)
        if first.returncode != 0:
            sys.exit(f"{argv} failed: {first.stderr.strip()}")
    runs: dict[str, list] = {k: [] for k in commands}
    for _ in range(args.rounds):
        for name, argv in commands.items():
            wait_for_idle()
            m = run_measured(argv, env=env)
            if m.returncode != 0:
                sys.exit(f"{name} failed: {m.stderr.strip()}")
            runs[name].append(m)
    after = sha256(path)
    med = {k: statistics.median(m.wall_s for m in v) for k, v in runs.items()}
    rss = {k: max(m.peak_rss_mb for m in v) for k, v in runs.items()}
    ratio = med["diagnose"] / med["summary"]
    header = ["command", "median wall", "peak RSS (MB)", "runs (s)"]
    rows = [[k, fmt_s(med[k]), f"{rss[k]:.0f}", " ".join(f"{m.wall_s:.2f}" for m in runs[k])] for k in commands]
    rows.append(["diagnose ÷ summary", fmt_ratio(ratio), "", "target ≤ 2×"])
    print_table(f"tracekit diagnose vs summary on {path.name}", header, rows)
    write_results(
        "bench_diagnose",
        {"file": str(path), "tables": table_info(path), "sha256_before": before, "sha256_after": after,
         "unchanged": before == after, "median_s": med, "peak_rss_mb": rss, "ratio": ratio,
         "runs": {k: [m.wall_s for m in v] for k, v in runs.items()}, "source": source_state()},
        markdown_table(header, rows),
    )


if __name__ == "__main__":
    main()
