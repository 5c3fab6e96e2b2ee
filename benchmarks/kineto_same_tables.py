"""Whether two versions of tracekit convert Kineto traces into the same tables.

Each trace is converted by the working tree's ``tracekit`` and by the one of a git revision
(extracted with ``git archive`` into a temporary folder), each in a child process of its own;
every Parquet file of the two folders is read back and compared with ``DataFrame.equals``
(names, dtypes, values, nulls and row order), and the two folders must hold the same files.

    python benchmarks/kineto_same_tables.py --old REV TRACE.json.gz [...]

Prints one line per trace and exits 1 when any differs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_CONVERT = """
import sys, time
from pathlib import Path
from tracekit.kineto.convert import convert
t0 = time.perf_counter()
convert(Path(sys.argv[1]), Path(sys.argv[2]))
print(time.perf_counter() - t0)
"""


def _convert(source: Path, trace: Path, folder: Path) -> float | str:
    """Seconds the conversion took, or the last line of its error."""
    env = {**os.environ, "PYTHONPATH": str(source)}
    out = subprocess.run([sys.executable, "-c", _CONVERT, str(trace), str(folder)], capture_output=True, text=True,
                         env=env, check=False)
    if out.returncode:
        return out.stderr.strip().splitlines()[-1]
    return float(out.stdout.split()[-1])


def compare(old_source: Path, trace: Path) -> list[str]:
    """The differences between the two conversions of ``trace`` (empty when none)."""
    import polars as pl

    with tempfile.TemporaryDirectory() as tmp:
        old, new = Path(tmp, "old"), Path(tmp, "new")
        old.mkdir()
        new.mkdir()
        t_old = _convert(old_source, trace, old)
        t_new = _convert(ROOT, trace, new)
        if isinstance(t_old, str) or isinstance(t_new, str):  # refused: by both, in the same words
            same = t_old == t_new
            print(f"{'same' if same else 'DIFFERENT':9} refused: {t_new}", flush=True)
            return [] if same else [f"old: {t_old}", f"new: {t_new}"]
        problems = []
        names = sorted({p.name for p in old.iterdir()} | {p.name for p in new.iterdir()})
        rows = 0
        for name in names:
            if not (old / name).is_file() or not (new / name).is_file():
                problems.append(f"{name} only in {'old' if (old / name).is_file() else 'new'}")
                continue
            a, b = pl.read_parquet(old / name), pl.read_parquet(new / name)
            rows += a.height
            if not a.equals(b, null_equal=True) or a.schema != b.schema:
                problems.append(f"{name} differs ({a.shape} vs {b.shape})")
        print(f"{'same' if not problems else 'DIFFERENT':9} {len(names):2} tables {rows:9,} rows  "
              f"old {t_old:6.2f}s new {t_new:6.2f}s  {trace}", flush=True)
        return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True, help="git revision of the tracekit to compare with")
    parser.add_argument("traces", nargs="+", type=Path)
    args = parser.parse_args()
    bad = 0
    with tempfile.TemporaryDirectory() as src:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.old, "tracekit"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", src], input=archive.stdout, check=True)
        t0 = time.perf_counter()
        for trace in args.traces:
            for line in compare(Path(src), trace):
                print(f"    {line}")
                bad += 1
        print(f"{len(args.traces)} traces, {bad} differences, {time.perf_counter() - t0:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
