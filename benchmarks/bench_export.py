"""``tracekit export perfetto`` on the 1 M-kernel export: wall time, peak RSS, file size.

Each variant runs the CLI in a fresh subprocess (``common.run_measured``: wall time and peak RSS
of the process), after one untimed run that fills the column cache. Bytes per million kernels =
file size × 1e6 / kernels written (the summary line the CLI prints gives the counts).

    python benchmarks/bench_export.py [--trace benchmarks/out/big.sqlite] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DEFAULT_BIG, OUT, REPO, run_measured  # noqa: E402

VARIANTS: dict[str, list[str]] = {
    "perfetto, no GPU metrics": ["--metrics", "none"],
    "perfetto, default metrics": [],
    "perfetto, --window steady": ["--window", "steady", "--metrics", "none"],
    "perfetto, --window 0:10s": ["--window", "0:10s", "--metrics", "none"],
    "perfetto, --window 0:100s": ["--window", "0:100s", "--metrics", "none"],
    "perfetto, --window 0:500s": ["--window", "0:500s", "--metrics", "none"],
    "chrome-json, no GPU metrics": ["--format", "chrome-json", "--metrics", "none"],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trace", type=Path, default=DEFAULT_BIG)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--only", nargs="*", default=None, help="variant names to run")
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-export-") as tmp:
        warm = run_measured([sys.executable, "-m", "tracekit.cli.main", "export", "perfetto", str(args.trace), "-o",
                             f"{tmp}/warm.pftrace", "--window", "0:1000000000", "--metrics", "none"], env=env)
        if warm.returncode:
            raise SystemExit(warm.stderr)
        for name, extra in VARIANTS.items():
            if args.only and name not in args.only:
                continue
            out = Path(tmp) / ("out.json" if "chrome-json" in extra else "out.pftrace")
            for r in range(args.rounds):
                m = run_measured([sys.executable, "-m", "tracekit.cli.main", "export", "perfetto", str(args.trace),
                                  "-o", str(out), *extra], env=env)
                if m.returncode:
                    raise SystemExit(f"{name}: {m.stderr}")
                kernels = int(re.search(r"\((\d+) kernel", m.stdout).group(1))  # type: ignore[union-attr]
                size = out.stat().st_size
                row = {"variant": name, "round": r, "wall_s": round(m.wall_s, 2), "peak_rss_mb": round(m.peak_rss_mb),
                       "bytes": size, "kernels": kernels,
                       "mb_per_million_kernels": round(size / 1e6 * 1e6 / kernels, 1) if kernels else None,
                       "others_cores": round(m.others_cores, 2), "summary": m.stdout.strip()}
                print(json.dumps(row), flush=True)
                results.append(row)
                out.unlink()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "bench_export.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
