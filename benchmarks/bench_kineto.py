"""Opening a PyTorch profiler (Kineto) trace against parsing its JSON bare.

Each step runs in a fresh child process (so each peak RSS is its own), three times; the table
gives the median time of the step itself and the child's peak RSS (``VmHWM``, MiB):

* ``gunzip``: the file's text in memory (``gzip.decompress``; a plain file read), the floor of
  every parser;
* ``json``: gunzip + the standard library's ``json.loads`` (dicts of every field);
* ``orjson``: gunzip + ``orjson.loads`` (dicts, faster);
* ``msgspec``: gunzip + ``msgspec.json.decode`` untyped (dicts, like ``json``);
* ``open cold``: ``tracekit.open`` on an empty cache: read the events as a stream, build the
  nsys-shaped tables, write the Parquet folder, and read ``kernels``;
* ``open cold, decay 0``: the same with polars' allocator (jemalloc) told to hand freed memory
  back at once (``_RJEM_MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0``; by default it keeps
  it for 10 s, which the peak RSS counts);
* ``open warm``: ``tracekit.open`` again (the converted folder cached) and ``kernels``.

Then the ratios: cold open ÷ ``json.loads`` and ÷ ``orjson.loads`` (time), and the cold open's
peak RSS less the import's, ÷ the JSON's size (with and without decay 0).

    python benchmarks/bench_kineto.py [--tracekit SRC] [TRACE.json.gz ...]

``--tracekit`` runs the open steps with the ``tracekit`` package of another source tree (a
checkout of an older revision, to compare).

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
STEPS = ("import", "gunzip", "json", "orjson", "msgspec", "open cold", "open cold, decay 0", "open warm")
DECAY_0 = {"_RJEM_MALLOC_CONF": "dirty_decay_ms:0,muzzy_decay_ms:0"}
SOURCE = ROOT
EXTRA = [Path("/tmp/hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"),
         Path("/tmp/hta/trace_diff/control/control.json.gz")]


def _step(step: str, path: Path) -> float:
    """Run one step in this process; the seconds it took."""
    import gzip

    import msgspec
    import polars  # noqa: F401 - imported before timing, as tracekit.open's caller has it

    import tracekit

    def text() -> bytes:
        data = path.read_bytes()
        return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data

    t0 = time.perf_counter()
    if step == "gunzip":
        text()
    elif step == "json":
        json.loads(text())
    elif step == "orjson":
        import orjson

        orjson.loads(text())
    elif step == "msgspec":
        msgspec.json.decode(text())
    elif step.startswith("open"):
        tracekit.open(path).kernels  # noqa: B018 - built on access
    return time.perf_counter() - t0


def _peak_rss_mib() -> float:
    """This process's peak RSS (MiB): ``VmHWM``, which starts afresh at ``exec``, where
    ``ru_maxrss`` keeps the forking parent's (this script's, which read the trace to size it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _child(step: str, path: Path, cache: Path) -> tuple[float, float]:
    env = {**os.environ, "TRACEKIT_CACHE": str(cache), "PYTHONPATH": str(SOURCE), **(DECAY_0 if "decay 0" in step else {})}
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
        print(f"{path.name}: done", file=sys.stderr, flush=True)
    print(f"{'trace':40} {'JSON MB':>8} " + " ".join(f"{s:>19}" for s in STEPS))
    for name, size, results in rows:
        cells = " ".join(f"{results[s][0]:9.3f}s {results[s][1]:6.0f}MB" for s in STEPS)
        print(f"{name[:40]:40} {size / 1e6:8.1f} {cells}")
    print(f"\n{'trace':40} {'JSON MB':>8} {'cold/json':>10} {'cold/orjson':>12} {'RSS/size':>9} {'decay 0':>8}")
    for name, size, r in rows:
        base = r["import"][1]
        print(f"{name[:40]:40} {size / 1e6:8.1f} {r['open cold'][0] / r['json'][0]:10.2f} "
              f"{r['open cold'][0] / r['orjson'][0]:12.2f} {(r['open cold'][1] - base) * 2**20 / size:9.2f} "
              f"{(r['open cold, decay 0'][1] - base) * 2**20 / size:8.2f}")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--step":
        seconds = _step(sys.argv[2], Path(sys.argv[3]))
        print(seconds, _peak_rss_mib())
    else:
        args = sys.argv[1:]
        if args[:1] == ["--tracekit"]:
            SOURCE, args = Path(args[1]).resolve(), args[2:]
        given = [Path(a) for a in args]
        main(given or sorted((ROOT / "sample_traces" / "kineto").glob("*/*.json.gz")) + [p for p in EXTRA if p.is_file()])
