"""Opening a PyTorch profiler (Kineto) trace against parsing its JSON bare.

Each step runs in a fresh child process (so each peak RSS is its own), ``--runs`` times (3); the
table gives the median time of the step itself and the largest peak RSS (``VmHWM``, MiB):

* ``gunzip``: the file's text in memory (``gzip.decompress``; a plain file read), the floor of
  every parser;
* ``json``: gunzip + the standard library's ``json.loads`` (dicts of every field);
* ``orjson``: gunzip + ``orjson.loads`` (dicts, faster);
* ``msgspec``: gunzip + ``msgspec.json.decode`` untyped (dicts, like ``json``);
* ``open cold``: ``tracekit.open`` on an empty cache, default settings: a trace of 2 MiB or more
  is converted by a child process (``python -m tracekit.kineto.convert``: read the events as a
  stream, build the nsys-shaped tables, write the Parquet folder), then ``kernels`` is read from
  the folder. Two peaks: the opening process's, and the converting child's (``conv.``: its own
  ``VmHWM``, reported at its exit by a ``sitecustomize`` hook this script puts on the child's
  ``PYTHONPATH``; nothing in tracekit is changed for it);
* ``in-process``: the same converted in the opening process (``TRACEKIT_KINETO_IN_PROCESS=1``),
  polars' allocator (jemalloc) with its default settings: it keeps freed memory for 10 s,
  which the peak RSS counts;
* ``in-process, decay 0``: the same with jemalloc told to hand freed memory back at once
  (``_RJEM_MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0``, what the child gets);
* ``open warm``: ``tracekit.open`` again (the converted folder cached) and ``kernels``.

Then the ratios: cold open ÷ each bare parse (time), and the peaks ÷ the JSON's size: the
converting child's peak, the child's and the opening process's together (both are alive while
the child runs), and the in-process peaks less the import's (as in earlier runs).

    python benchmarks/bench_kineto.py [--tracekit SRC] [--runs N] [--steps A,B,...] [TRACE.json[.gz] ...]

``--tracekit`` runs the open steps with the ``tracekit`` package of another source tree (a
checkout of an older revision, to compare). ``--runs`` (default 3): runs per step, median time
and largest peak. ``--steps``: only these steps (``import`` always runs: its peak is the base).

Without arguments it uses the traces of ``sample_traces/kineto`` and, when they are beside
(``/tmp/hta``: ``ns_resolution_trace/…`` 15 MB, ``trace_diff/control/control.json.gz`` 35 MB of
JSON from HolisticTraceAnalysis' tests/data), those too.
"""

from __future__ import annotations

import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = ("import", "gunzip", "json", "orjson", "msgspec", "open cold", "in-process", "in-process, decay 0", "open warm")
DECAY_0 = {"_RJEM_MALLOC_CONF": "dirty_decay_ms:0,muzzy_decay_ms:0"}
SOURCE = ROOT
EXTRA = [Path("/tmp/hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"),
         Path("/tmp/hta/trace_diff/control/control.json.gz")]
#: env var naming the file the converting child's ``VmHWM`` (MiB) is appended to
HWM_FILE = "BENCH_KINETO_CONVERTER_HWM"
#: put on the children's PYTHONPATH: at exit, ``python -m tracekit.kineto.convert`` appends its
#: own peak RSS to $BENCH_KINETO_CONVERTER_HWM
SITECUSTOMIZE = f"""
import atexit, os, sys

def _bench_kineto_hwm():
    out = os.environ.get("{HWM_FILE}")
    if not out or not sys.argv or not sys.argv[0].endswith(os.path.join("kineto", "convert.py")):
        return
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            with open(out, "a") as fh:
                fh.write(str(int(line.split()[1]) / 1024) + "\\n")

atexit.register(_bench_kineto_hwm)
"""


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
    elif step.startswith(("open", "in-process")):
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


def _child(step: str, path: Path, cache: Path, hook: Path) -> tuple[float, float, float]:
    """(seconds, the step's process's peak MiB, the converting child's peak MiB or nan)."""
    hwm = cache / "converter-hwm.txt"
    env = {**os.environ, "TRACEKIT_CACHE": str(cache / "cache"), "PYTHONPATH": os.pathsep.join([str(SOURCE), str(hook)]),
           HWM_FILE: str(hwm)}
    if step.startswith("in-process"):
        env["TRACEKIT_KINETO_IN_PROCESS"] = "1"
    else:
        env.pop("TRACEKIT_KINETO_IN_PROCESS", None)
    if "decay 0" in step:
        env.update(DECAY_0)
    out = subprocess.run([sys.executable, __file__, "--step", step, str(path)], capture_output=True, text=True,
                         env=env, check=True)
    seconds, rss = out.stdout.split()
    peaks = [float(v) for v in hwm.read_text().split()] if hwm.is_file() else []
    hwm.unlink(missing_ok=True)
    return float(seconds), float(rss), max(peaks) if peaks else math.nan


def _json_size(path: Path) -> int:
    import gzip

    with path.open("rb") as fh:
        if fh.read(2) != b"\x1f\x8b":
            return path.stat().st_size
    with gzip.open(path, "rb") as fh:
        return sum(len(block) for block in iter(lambda: fh.read(1 << 24), b""))


def main(paths: list[Path], steps: tuple[str, ...] = STEPS, runs: int = 3) -> None:
    rows = []
    with tempfile.TemporaryDirectory() as hook:
        Path(hook, "sitecustomize.py").write_text(SITECUSTOMIZE)
        for path in paths:
            size = _json_size(path)
            results: dict[str, tuple[float, float, float]] = {}
            for step in steps:
                got = []
                for _ in range(runs):
                    with tempfile.TemporaryDirectory() as cache:
                        if step == "open warm":
                            _child("open cold", path, Path(cache), Path(hook))
                        got.append(_child(step, path, Path(cache), Path(hook)))
                results[step] = (statistics.median(r[0] for r in got), max(r[1] for r in got), max(r[2] for r in got))
                print(f"{path.name}: {step}: {results[step][0]:.2f} s, {results[step][1]:.0f} MiB"
                      + (f", converter {results[step][2]:.0f} MiB" if results[step][2] == results[step][2] else "")
                      + f"  ({[round(r[0], 2) for r in got]})", file=sys.stderr, flush=True)
            rows.append((path.name, size, results))
    print(f"\nmedian of {runs}; peaks MiB (VmHWM, largest of the runs)")
    print(f"{'trace':40} {'JSON MB':>8} " + " ".join(f"{s:>19}" for s in steps) + f" {'conv. peak':>10}")
    for name, size, results in rows:
        cells = " ".join(f"{results[s][0]:9.3f}s {results[s][1]:6.0f}MB" for s in steps)
        conv = results.get("open cold", (0, 0, math.nan))[2]
        print(f"{name[:40]:40} {size / 1e6:8.1f} {cells} {conv:8.0f}MB")

    def ratio(r: dict[str, tuple[float, float, float]], a: str, b: str) -> str:
        return f"{r[a][0] / r[b][0]:.2f}" if a in r and b in r else "-"

    def per_byte(mib: float, size: int) -> str:
        return f"{mib * 2**20 / size:.2f}" if mib == mib else "-"

    print(f"\n{'trace':40} {'JSON MB':>8} {'cold/json':>9} {'/orjson':>8} {'/msgspec':>9} {'conv/size':>10} "
          f"{'(conv+open)/size':>17} {'(inproc-imp)/size':>18} {'decay 0':>8}")
    for name, size, r in rows:
        base = r["import"][1]
        cold = r.get("open cold", (math.nan, math.nan, math.nan))
        inproc = r.get("in-process", (math.nan, math.nan, math.nan))[1]
        decay = r.get("in-process, decay 0", (math.nan, math.nan, math.nan))[1]
        print(f"{name[:40]:40} {size / 1e6:8.1f} {ratio(r, 'open cold', 'json'):>9} {ratio(r, 'open cold', 'orjson'):>8} "
              f"{ratio(r, 'open cold', 'msgspec'):>9} {per_byte(cold[2], size):>10} {per_byte(cold[2] + cold[1], size):>17} "
              f"{per_byte(inproc - base, size):>18} {per_byte(decay - base, size):>8}")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--step":
        seconds = _step(sys.argv[2], Path(sys.argv[3]))
        print(seconds, _peak_rss_mib())
    else:
        args = sys.argv[1:]
        runs, steps = 3, STEPS
        while args[:1] and args[0].startswith("--"):
            if args[0] == "--tracekit":
                SOURCE = Path(args[1]).resolve()
            elif args[0] == "--runs":
                runs = int(args[1])
            elif args[0] == "--steps":
                chosen = {s.strip() for s in args[1].split(",")} | {"import"}
                unknown = chosen - set(STEPS)
                if unknown:
                    raise SystemExit(f"unknown steps {sorted(unknown)}; steps: {', '.join(STEPS)}")
                steps = tuple(s for s in STEPS if s in chosen)
            else:
                raise SystemExit(f"unknown option {args[0]}")
            args = args[2:]
        given = [Path(a) for a in args]
        main(given or sorted((ROOT / "sample_traces" / "kineto").glob("*/*.json.gz")) + [p for p in EXTRA if p.is_file()],
             steps, runs)
