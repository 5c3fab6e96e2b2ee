"""Finished ``tracekit stats`` CSVs, kept beside the export's cached columns and printed again
by the next identical command without computing anything.

Standard library only: :func:`cached_stats` runs before the CLI imports typer or polars, so a
repeated ``tracekit stats FILE -r R -f csv`` costs the Python start-up and one file read.

What is kept: the CSV of each report that ``tracekit stats FILE -f csv`` printed to stdout,
when it is at most :data:`MAX_BYTES` and the run printed no warning (a damaged export, a
WAL file beside it: those runs are always recomputed so the warning is seen again).
Where: ``<cache_dir>/columns/<export key>/reports/`` — the export's column-cache folder, so
the same size limit, eviction, ``TRACEKIT_COLUMN_CACHE=0`` switch and ownership check
apply (docs/tables.md). Key: the export's identity and content fingerprint (as the column
cache: path, size, mtime, inode, first and last pages), the report name, the rounding
convention, and a stamp of tracekit's own source files (size and mtime of every module, so
an upgraded or edited tracekit never prints an old result). Each file has a checksum that
every read verifies; a mismatch or any read error means "not cached".
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

from tracekit.cache import (
    COLUMN_CACHE_FORMAT,
    cache_dir,
    checksum,
    column_cache_enabled,
    export_key,
    folder_state,
    verify,
    write_atomic,
)

#: Largest CSV kept (bytes): the summaries are kilobytes; million-row trace reports are not kept.
MAX_BYTES = 8 << 20
#: Bumped when what is stored changes.
FORMAT = "1"

_stamp: list[str] = []


def code_stamp() -> str:
    """A hash of every tracekit module's relative path, size and modification time (ns)."""
    if not _stamp:
        root = Path(__file__).resolve().parents[1]
        h = hashlib.sha256()
        for folder, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith(".py"):
                    st = os.stat(os.path.join(folder, name))
                    rel = os.path.relpath(os.path.join(folder, name), root)
                    h.update(f"{rel}|{st.st_size}|{st.st_mtime_ns}\n".encode())
        _stamp.append(h.hexdigest()[:16])
    return _stamp[0]


def usable_export(export: Path) -> bool:
    """An ordinary ``.sqlite`` export with nothing beside it that changes how it reads (a WAL or
    rollback journal), and the column cache on."""
    if not column_cache_enabled() or export.suffix != ".sqlite" or not export.is_file():
        return False
    return not any(Path(f"{export}{tail}").exists() for tail in ("-wal", "-journal"))


def _path(export: Path, report: str, convention: str) -> Path:
    folder = cache_dir() / "columns" / export_key(export, COLUMN_CACHE_FORMAT) / "reports"
    digest = hashlib.sha256(f"{report}|{convention}|{FORMAT}|{code_stamp()}".encode()).hexdigest()[:20]
    safe = "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in report)
    return folder / f"{safe}.{digest}.csv"


def load(export: Path, report: str, convention: str) -> bytes | None:
    """The kept CSV of ``report`` on ``export``, or None (not kept, damaged, or not usable)."""
    try:
        if not usable_export(export) or folder_state(cache_dir() / "columns") != "ok":
            return None
        path = _path(export, report, convention)
        data = path.read_bytes()
        expected = Path(f"{path}.b2").read_text().strip()
    except OSError:
        return None
    if not verify(data, expected):
        with contextlib.suppress(OSError):
            path.unlink()
        return None
    with contextlib.suppress(OSError):
        os.utime(path.parent.parent)  # the export's folder was used: evicted last
    return data


def store(export: Path, report: str, convention: str, data: bytes) -> None:
    """Keep ``data`` (best effort: an unwritable cache keeps nothing, silently)."""
    if len(data) > MAX_BYTES or not usable_export(export) or folder_state(cache_dir() / "columns") != "ok":
        return
    tmp: list[str] = []
    try:
        path = _path(export, report, convention)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_atomic(Path(f"{path}.b2"), checksum(data).encode(), tmp)
        write_atomic(path, data, tmp)
    except OSError:
        for name in tmp:
            with contextlib.suppress(OSError):
                os.unlink(name)


class _Counter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


@contextlib.contextmanager
def warnings_counted() -> Iterator[list[int]]:
    """Count the warnings shown and log records of level WARNING or above inside the block
    (the list's one element, read after the block); they are still printed as usual."""
    counted = [0]
    shown = warnings.showwarning
    handler = _Counter()

    def counting(*args: object, **kwargs: object) -> None:
        counted[0] += 1
        shown(*args, **kwargs)  # type: ignore[arg-type]

    warnings.showwarning = counting
    logging.getLogger().addHandler(handler)
    try:
        yield counted
    finally:
        warnings.showwarning = shown
        logging.getLogger().removeHandler(handler)
        counted[0] += handler.count


def parse_stats(argv: Sequence[str]) -> tuple[str, str, str, str] | None:
    """``stats FILE [-r R] [-f F] [--convention C]`` → (file, report, convention, format), as
    given (``report`` may name several, comma-separated: :func:`report_names`); None for
    anything else (another command or option, ``-o``, ``--rows``, ``--help``, no report)."""
    if not argv or argv[0] != "stats":
        return None
    values = {"report": "cuda_gpu_kern_sum", "format": "table", "convention": "2025"}
    names = {"-r": "report", "--report": "report", "-f": "format", "--format": "format", "--convention": "convention"}
    files: list[str] = []
    args = list(argv[1:])
    while args:
        arg = args.pop(0)
        key, eq, value = arg.partition("=")
        if key in names and key.startswith("--") and eq:
            values[names[key]] = value
        elif arg in names and args:
            values[names[arg]] = args.pop(0)
        elif not arg.startswith("-") and not files:
            files.append(arg)
        else:
            return None
    if len(files) != 1 or not report_names(values["report"]):
        return None
    return files[0], values["report"], values["convention"], values["format"]


def report_names(report: str) -> list[str]:
    """The report names of a ``-r`` value (comma-separated, blanks dropped)."""
    return [r.strip() for r in report.split(",") if r.strip()]


def cached_stats(argv: Sequence[str]) -> int | None:
    """Print the kept CSVs for a ``tracekit stats … -f csv`` command line and return 0, or
    return None (the command runs as usual) unless every report asked for is kept."""
    try:
        parsed = parse_stats(argv)
        if parsed is None or parsed[3] != "csv":
            return None
        file, report, convention, _ = parsed
        kept = [load(Path(file), r, convention) for r in report_names(report)]
    except Exception:  # never fail here: the ordinary path reports any problem properly
        return None
    if any(k is None for k in kept):
        return None
    out = sys.stdout.buffer
    for data in kept:
        out.write(data)  # type: ignore[arg-type]
    out.flush()
    return 0
