"""A columnar cache of an export's large tables: Arrow IPC files keyed by the file's identity.

Reading rows out of SQLite is what costs time on a big export (about 2.5 M rows per second
per thread here); a column once read is kept as one uncompressed Arrow IPC file, which
later opens memory-mapped in milliseconds. Only full-table reads of tables with at least
:data:`MIN_ROWS` rows are cached (filtered queries and small tables are read directly).

Key: a hash of the export's resolved path, size, modification time (ns), inode and
:data:`FORMAT`; a changed or replaced export gets a new key, so a stale column is never
read. Each column is one file named after its table and the hash of the SQL expression
that produced it. Files are written to a temporary name and renamed, so a crash leaves no
half-written column; an unreadable one is ignored and replaced.

Location: ``<cache_dir>/columns/<key>/`` (:func:`tracekit.cache.cache_dir`, i.e.
``$TRACEKIT_CACHE`` or ``~/.cache/tracekit``). ``TRACEKIT_COLUMN_CACHE=0`` (or
``tracekit.open(path, column_cache=False)``) turns it off; deleting the folder is always
safe. The export itself is never written to.

Size: after each write, when all exports' columns together exceed
``TRACEKIT_COLUMN_CACHE_MAX_GB`` (default :data:`DEFAULT_MAX_GB`), the folders of the
exports used least recently (a folder's modification time is refreshed whenever one of its
columns is read) are deleted until the rest fit; the folder being written is kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

import polars as pl

from tracekit.cache import cache_dir

log = logging.getLogger(__name__)

#: Bumped when the stored layout or the way columns are read changes.
FORMAT = "1"
#: Tables with fewer rows than this are not cached (SQLite reads them in well under 0.1 s).
MIN_ROWS = 200_000
#: Default size limit of all cached columns, in GB (``TRACEKIT_COLUMN_CACHE_MAX_GB``).
DEFAULT_MAX_GB = 5.0


def enabled_by_default() -> bool:
    """False when ``TRACEKIT_COLUMN_CACHE`` is ``0``, ``off``, ``false`` or ``no``."""
    return os.environ.get("TRACEKIT_COLUMN_CACHE", "1").strip().lower() not in ("0", "off", "false", "no")


class ColumnCache:
    """Cached columns of one export (see the module docstring)."""

    def __init__(self, export: Path, root: Path | None = None) -> None:
        st = export.stat()
        identity = f"{export.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}|{FORMAT}"
        self.key = hashlib.sha256(identity.encode()).hexdigest()[:24]
        self.folder = (root or cache_dir() / "columns") / self.key
        self._export = export
        self._used = False
        self._stamp = {"export": str(export.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}

    def _path(self, table: str, expr: str) -> Path:
        digest = hashlib.sha256(expr.encode()).hexdigest()[:16]
        safe = "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in table)
        return self.folder / f"{safe}.{digest}.arrow"

    def has(self, table: str, expr: str) -> bool:
        """Whether column ``expr`` of ``table`` is cached (a later :meth:`get` may still miss
        if the file turns out damaged)."""
        return self._path(table, expr).is_file()

    def get(self, table: str, expr: str) -> pl.Series | None:
        """The cached column ``expr`` of ``table``, or None."""
        path = self._path(table, expr)
        if not path.is_file():
            return None
        if not self._used:  # the eviction order: least recently used folders go first
            self._used = True
            with contextlib.suppress(OSError):
                os.utime(self.folder)
        try:
            # polars reads the file in chunks of ~120 k rows; one buffer makes gathers ~2x faster
            return pl.read_ipc(path).to_series().rechunk()
        except (OSError, pl.exceptions.PolarsError) as exc:  # damaged: rebuilt from the export
            log.debug("ignoring unreadable cached column %s (%s)", path, exc)
            with contextlib.suppress(OSError):
                path.unlink()
            return None

    def put(self, table: str, expr: str, column: pl.Series) -> None:
        """Store ``column`` (best effort: a full disk or read-only cache only logs)."""
        path = self._path(table, expr)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            stamp = self.folder / "export.json"
            if not stamp.exists():
                stamp.write_text(json.dumps(self._stamp, indent=1))
            pl.DataFrame([column]).write_ipc(tmp, compression="uncompressed")
            os.replace(tmp, path)
            evict(self.folder.parent, keep=self.folder, limit_bytes=max_bytes())
        except OSError as exc:
            log.debug("not caching %s.%s (%s)", table, expr, exc)
            with contextlib.suppress(OSError):
                tmp.unlink()

    def clear(self) -> None:
        """Delete this export's cached columns."""
        shutil.rmtree(self.folder, ignore_errors=True)


def max_bytes() -> int:
    """The size limit of the whole column cache: ``TRACEKIT_COLUMN_CACHE_MAX_GB`` (a number of
    GB; an unreadable value means the default, :data:`DEFAULT_MAX_GB`)."""
    raw = os.environ.get("TRACEKIT_COLUMN_CACHE_MAX_GB", "")
    try:
        gb = float(raw) if raw.strip() else DEFAULT_MAX_GB
    except ValueError:
        log.warning("TRACEKIT_COLUMN_CACHE_MAX_GB=%r is not a number; using %s", raw, DEFAULT_MAX_GB)
        gb = DEFAULT_MAX_GB
    return int(max(gb, 0.0) * 1e9)


def evict(root: Path, *, keep: Path, limit_bytes: int) -> list[Path]:
    """Delete the least recently used export folders under ``root`` (never ``keep``) until
    the folders' files total at most ``limit_bytes``; return the deleted folders."""
    folders = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(root):
            if entry.is_dir(follow_symlinks=False):
                size = sum(f.stat().st_size for f in os.scandir(entry.path) if f.is_file(follow_symlinks=False))
                folders.append((entry.stat().st_mtime, Path(entry.path), size))
    total = sum(size for _, _, size in folders)
    deleted = []
    for _, folder, size in sorted(folders):
        if total <= limit_bytes:
            break
        if folder == keep:
            continue
        shutil.rmtree(folder, ignore_errors=True)
        log.info("column cache over %.1f GB: removed %s (%.0f MB)", limit_bytes / 1e9, folder.name, size / 1e6)
        deleted.append(folder)
        total -= size
    return deleted
