"""On a GPU machine with nsys: tracekit.open() on an .nsys-rep exports it with the nsys it
finds (no NSYS variable), caches the export beside the report, reuses it, and falls back to
the cache folder when the report's folder is read-only.

    python3 tests/gpu/open_report_e2e.py REPORT.nsys-rep
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import tracekit
from tracekit.tools import find_tool


def main() -> int:
    source = Path(sys.argv[1])
    os.environ.pop("NSYS", None)
    tool = find_tool("nsys")
    print(f"discovered nsys: {tool.path} version {tool.version}")
    work = Path(tempfile.mkdtemp())
    report = work / "copy.nsys-rep"
    shutil.copy(source, report)
    t0 = time.perf_counter()
    trace = tracekit.open(report)
    first = time.perf_counter() - t0
    print(f"exported beside the report: {trace.path} ({trace.path.stat().st_size} bytes) in {first:.1f}s; "
          f"kernels={trace.kernels.height} blobs={trace.meta.has_blobs} nsys={trace.meta.version}")
    t0 = time.perf_counter()
    again = tracekit.open(report)
    print(f"reopened from cache in {time.perf_counter() - t0:.2f}s: same file {again.path == trace.path}")
    locked = work / "ro"
    locked.mkdir()
    shutil.copy(source, locked / "r.nsys-rep")
    locked.chmod(0o555)
    os.environ["TRACEKIT_CACHE"] = str(work / "cache")
    cached = tracekit.open(locked / "r.nsys-rep")
    print(f"read-only folder -> export in cache: {cached.path} kernels={cached.kernels.height}")
    # root may write into a 0555 folder, so the cache fallback only shows as another user
    expect_cache = not os.access(locked, os.W_OK)
    in_cache = str(cached.path).startswith(str(work / "cache"))
    ok = trace.kernels.height > 0 and again.path == trace.path and in_cache == expect_cache
    print("OPEN_REPORT_E2E", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
