"""What reading an ``.ncu-rep`` in a child process costs (issue 18.6: ``isolate=``), on the
repo's ncu reports.

Each round runs a fresh Python process that imports tracekit, polars and ``ncu_report``
first (a notebook has them loaded; not timed) and then times, with ``perf_counter``:

* ``walk`` — the container walk alone (every open pays it);
* ``open`` — ``NcuReport.from_path(isolate=False)`` then ``.kernels`` (lazy: the metrics are
  not read yet);
* ``all`` — the same, then ``.metrics`` and ``.rules``;
* ``isolated`` — ``NcuReport.from_path(isolate=True)`` then ``.kernels``, ``.metrics``,
  ``.rules``: the child process builds kernels, metrics and rules at open, whatever is used.

Rounds are interleaved; the table gives medians and the ratios isolated ÷ all (a user who
reads the metrics) and isolated ÷ open (a user who only looks at the kernels), which decide the
default of ``isolate`` (docs/ncu.md, "Damaged reports"). ``--baseline DIR`` also runs ``open``
and ``all`` with the tracekit of another checkout (e.g. one without the damage checks), to
show what validation costs in process.

    python benchmarks/bench_ncu_isolate.py [--rounds 5] [--baseline ../main] [REPORT ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    REPO,
    fmt_ratio,
    markdown_table,
    precompile_tracekit,
    print_table,
    python,
    wait_for_idle,
    write_results,
)

CHILD = """
import json, sys, time, warnings
from pathlib import Path
import polars, ncu_report, tracekit
from tracekit.ncu import NcuReport, container
path, variant = Path(sys.argv[1]), sys.argv[2]
t0 = time.perf_counter()
if variant == "walk":
    container.walk(path)
else:
    options = {"isolate": True} if variant == "isolated" else {}  # a baseline may lack isolate=
    report = NcuReport.from_path(path, **options)
    report.kernels
    if variant != "open":
        report.metrics
        report.rules
print(json.dumps({"s": time.perf_counter() - t0}))
"""
VARIANTS = ("walk", "open", "all", "isolated")


def measure(path: Path, variant: str, baseline: Path | None = None) -> float:
    source = REPO
    if variant.endswith("@base"):
        assert baseline is not None
        variant, source = variant.removesuffix("@base"), baseline
    proc = subprocess.run(
        [python(), "-c", CHILD, str(path.resolve()), variant],
        capture_output=True,
        text=True,
        cwd=source,
        env={**os.environ, "PYTHONPATH": str(source)},
        check=False,
    )
    if proc.returncode != 0:
        sys.exit(f"{variant} on {path} failed: {proc.stderr[-500:]}")
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reports", nargs="*", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--baseline", type=Path, help="another tracekit checkout for open/all")
    args = ap.parse_args()
    variants = VARIANTS + (("open@base", "all@base") if args.baseline else ())
    reports: list[Path] = args.reports or sorted((REPO / "sample_traces" / "ncu").glob("*/*.ncu-rep"))
    precompile_tracekit()
    times: dict[str, dict[str, list[float]]] = {p.name: {v: [] for v in variants} for p in reports}
    busy: list[float] = []
    for _ in range(args.rounds):
        busy.append(wait_for_idle(max_wait_s=10))
        for path in reports:
            for variant in variants:
                times[path.name][variant].append(measure(path, variant, args.baseline))
    header = ["report", "MB", "walk s", "open s", "all s", "isolated s", "isolated ÷ all", "isolated ÷ open"]
    if args.baseline:
        header += ["open s (baseline)", "all s (baseline)"]
    rows = []
    medians: dict[str, dict[str, float]] = {}
    for path in reports:
        med = {v: statistics.median(times[path.name][v]) for v in variants}
        medians[path.name] = med
        rows.append(
            [
                path.name,
                f"{path.stat().st_size / 1e6:.1f}",
                f"{med['walk']:.3f}",
                f"{med['open']:.3f}",
                f"{med['all']:.3f}",
                f"{med['isolated']:.3f}",
                fmt_ratio(med["isolated"] / med["all"]),
                fmt_ratio(med["isolated"] / med["open"]),
            ]
            + ([f"{med['open@base']:.3f}", f"{med['all@base']:.3f}"] if args.baseline else [])
        )
    title = f"ncu report: in process vs child process (median of {args.rounds} rounds)"
    print_table(title, header, rows)
    md = f"### {title}\n\n" + markdown_table(header, rows)
    md += f"\nOther load during the rounds (busy cores at start): {', '.join(f'{b:.2f}' for b in busy)}\n"
    jpath, mpath = write_results("bench_ncu_isolate", {"times_s": times, "medians_s": medians, "busy_cores": busy}, md)
    print(f"wrote {jpath} and {mpath}")


if __name__ == "__main__":
    main()
