"""Opening a PyTorch profiler (Kineto) trace against parsing its JSON bare.

Each step runs in a fresh child process (so each peak RSS is its own), three times; the table
gives the median time of the step itself and the child's peak RSS (``ru_maxrss``, MiB):

* ``gunzip``: the file's text in memory (``gzip.decompress``), the floor of every parser;
* ``json``: gunzip + the standard library's ``json.loads`` (dicts of every field);
* ``orjson``: gunzip + ``orjson.loads`` (dicts, faster);
* ``msgspec``: gunzip + ``msgspec`` typed decoding into :class:`tracekit.kineto.parse.Document`
  (only the fields tracekit reads; the others are skipped unread);
* ``open cold``: ``tracekit.open`` on an empty cache: decode, build the nsys-shaped tables,
  write the Parquet folder, and read ``kernels``;
* ``open warm``: ``tracekit.open`` again (the converted folder cached) and ``kernels``.

    python benchmarks/bench_kineto.py [TRACE.json.gz ...]

Without arguments it uses the traces of ``sample_traces/kineto`` and, when they are beside
(``/tmp/hta``: ``ns_resolution_trace/…`` 15 MB, ``trace_diff/control/control.json.gz`` 35 MB of
JSON from HolisticTraceAnalysis' tests/data), those too.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = ("import", "gunzip", "json", "orjson", "msgspec", "open cold", "open warm")
EXTRA = [Path("/tmp/hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"),
         Path("/tmp/hta/trace_diff/control/control.json.gz")]


def _step(step: str, path: Path) -> float:
    """Run one step in this process; the seconds it took."""
    import gzip

    import polars  # noqa: F401 - imported before timing, as tracekit.open's caller has it

    import tracekit
    from tracekit.kineto.parse import _DECODER

    t0 = time.perf_counter()
    if step == "gunzip":
        gzip.decompress(path.read_bytes())
    elif step == "json":
        json.loads(gzip.decompress(path.read_bytes()))
    elif step == "orjson":
        import orjson

        orjson.loads(gzip.decompress(path.read_bytes()))
    elif step == "msgspec":
        _DECODER.decode(gzip.decompress(path.read_bytes()))
    elif step in ("open cold", "open warm"):
        tracekit.open(path).kernels  # noqa: B018 - built on access
    return time.perf_counter() - t0


def _child(step: str, path: Path, cache: Path) -> tuple[float, float]:
    env = {**os.environ, "TRACEKIT_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, __file__, "--step", step, str(path)], capture_output=True, text=True,
                         env=env, check=True)
    seconds, rss = out.stdout.split()
    return float(seconds), float(rss)


def main(paths: list[Path]) -> None:
    rows = []
    for path in paths:
        import gzip

        size = len(gzip.decompress(path.read_bytes())) if path.read_bytes()[:2] == b"\x1f\x8b" else path.stat().st_size
        results: dict[str, tuple[float, float]] = {}
        for step in STEPS:
            runs = []
            for _ in range(3):
                with tempfile.TemporaryDirectory() as cache:
                    if step == "open warm":
                        _child("open cold", path, Path(cache))
                    runs.append(_child(step, path, Path(cache)))
            results[step] = (statistics.median(r[0] for r in runs), max(r[1] for r in runs))
        rows.append((path.name, size, results))
    print(f"{'trace':40} {'JSON MB':>8} " + " ".join(f"{s:>17}" for s in STEPS))
    for name, size, results in rows:
        cells = " ".join(f"{results[s][0]:7.3f}s {results[s][1]:6.0f}MB" for s in STEPS)
        print(f"{name[:40]:40} {size / 1e6:8.1f} {cells}")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--step":
        seconds = _step(sys.argv[2], Path(sys.argv[3]))
        print(seconds, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    else:
        given = [Path(a) for a in sys.argv[1:]]
        main(given or sorted((ROOT / "sample_traces" / "kineto").glob("*/*.json.gz")) + [p for p in EXTRA if p.is_file()])
