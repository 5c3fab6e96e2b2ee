"""A columnar cache of an export's large tables: Arrow IPC files keyed by the file's identity.

Reading rows out of SQLite is what costs time on a big export (about 2.5 M rows per second
per thread here); a column once read is kept as one uncompressed Arrow IPC file, which
later opens memory-mapped in milliseconds. Only full-table reads of tables with at least
:data:`MIN_ROWS` rows are cached (filtered queries and small tables are read directly).

Key: a hash of the export's resolved path, size, modification time (ns), inode,
:data:`FORMAT` and a content fingerprint (the SQLite header — whose file change counter moves
with every committed write — and the first and last pages), so an export rewritten in place
with its size and mtime kept (``cp -p``, ``rsync -t --inplace``) gets a new key too. Each
column is one file named after its table and the hash of the SQL expression that produced it,
with an XXH3-128 checksum beside it (``.b2`` file; BLAKE2b where xxhash is missing) that every read verifies: a damaged file (a flipped
byte, a broken footer) is dropped with one warning and the column is read from the export
again. Files are written through ``tempfile.mkstemp`` (a fresh name, no symlink followed) and
renamed; folders are created ``0700``, and a cache folder owned by another user is not used
(one warning; the export is read directly). A cached file is opened once, checksummed
through that descriptor and read through it (:func:`_read_verified`), so what is read is
what was verified even when another process renames a fresh copy over it meanwhile; polars
maps the file only for the moment of the read and copies the column out, so nothing stays
mapped (cache files are replaced by rename, never rewritten in place).

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
import io
import json
import logging
import math
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import polars as pl

from tracekit.cache import (
    COLUMN_CACHE_FORMAT,
    cache_dir,
    checksum_file,
    column_cache_enabled,
    export_key,
    folder_state,
    verify_file,
    write_atomic,
)
from tracekit.errors import TracekitError

log = logging.getLogger(__name__)

#: Bumped when the stored layout or the way columns are read changes.
FORMAT = COLUMN_CACHE_FORMAT
#: Tables with fewer rows than this are not cached (SQLite reads them in well under 0.1 s).
MIN_ROWS = 200_000
#: Default size limit of all cached columns, in GB (``TRACEKIT_COLUMN_CACHE_MAX_GB``).
DEFAULT_MAX_GB = 5.0


def enabled_by_default() -> bool:
    """False when ``TRACEKIT_COLUMN_CACHE`` is ``0``, ``off``, ``false`` or ``no``."""
    return column_cache_enabled()


#: Where an open file can be opened again, with an offset of its own, by its descriptor
#: (Linux's ``/proc/self/fd``; None elsewhere: ``/dev/fd`` would share the offset).
_FD_FOLDER = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else None


#: Bytes of room, beyond twice the file, below which a cached column is read into memory
#: first rather than through its descriptor (:func:`_read_verified`).
DESCRIPTOR_READ_SLACK = 256 << 20


def _read_verified(fh: BinaryIO, *, by_descriptor: bool = True) -> pl.DataFrame:
    """The Arrow IPC file open as ``fh``, whose checksum was just verified through it.

    Read by polars through the same descriptor (``/proc/self/fd/N``), so the bytes read are
    those of the file verified even if another process renames a new file over its name
    meanwhile (cache files are only ever replaced that way, never rewritten in place). Polars
    maps the file for the moment of the read and copies the column out: one copy instead of
    two (reading the file into Python bytes, then polars copying those), 0.32–0.44 s → 0.18 s
    and no 40 MB transient buffer for four 5 M-row columns. Without a descriptor folder, or
    with ``by_descriptor=False``, the file is read into memory first, as before: under a tight
    address-space limit polars' read of a mapped file aborted the process where the read from
    memory fitted (warm ``summary`` of 300 k kernels with 150 MB left; the caller decides by
    :data:`DESCRIPTOR_READ_SLACK`)."""
    if by_descriptor and _FD_FOLDER is not None:
        return pl.read_ipc(f"{_FD_FOLDER}/{fh.fileno()}")
    fh.seek(0)
    return pl.read_ipc(io.BytesIO(fh.read()))


class CacheIntegrityWarning(UserWarning):
    """A cached column failed its checksum or could not be read; it was read from the export."""


class ColumnCache:
    """Cached columns of one export (see the module docstring)."""

    def __init__(
        self, export: Path, root: Path | None = None, free_memory: Callable[[], int | None] | None = None
    ) -> None:
        """``free_memory``: bytes the process can still allocate (None: unknown), checked
        before a column is written (:meth:`put`); without it columns are written regardless."""
        st = export.stat()
        self._free_memory = free_memory
        max_bytes()  # a nonsense size limit is one clear error now, not a failure later
        self.key = export_key(export, FORMAT)
        self.root = root or cache_dir() / "columns"
        self.folder = self.root / self.key
        self._export = export
        self._used = False
        self._warned = False
        #: columns just written that the next get() of each returns without reading the file
        self._held: dict[Path, pl.Series] = {}
        self._stamp = {"export": str(export.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        state = folder_state(self.root)
        self.usable = state == "ok"
        if state == "foreign":
            warnings.warn(
                f"column cache folder {self.root} belongs to another user: not using it; "
                "set TRACEKIT_CACHE to a folder of your own",
                CacheIntegrityWarning, stacklevel=3,
            )
        elif state == "unwritable":
            log.debug("column cache folder %s cannot be created: not caching", self.root)

    def _path(self, table: str, expr: str) -> Path:
        digest = hashlib.sha256(expr.encode()).hexdigest()[:16]
        safe = "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in table)
        return self.folder / f"{safe}.{digest}.arrow"

    def has(self, table: str, expr: str) -> bool:
        """Whether column ``expr`` of ``table`` is cached (a later :meth:`get` may still miss
        if the file turns out damaged)."""
        path = self._path(table, expr)
        return self.usable and path.is_file() and _sum_path(path).is_file()

    def size(self, table: str, expr: str) -> int | None:
        """Bytes of the cached file of column ``expr`` of ``table`` (about the column's size in
        memory once read: the file is uncompressed Arrow), or None when it is not cached."""
        if not self.has(table, expr):
            return None
        try:
            return self._path(table, expr).stat().st_size
        except OSError:
            return None

    def _drop(self, path: Path, why: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"cached column {path.name} of {self._export.name} {why}; dropped it and read the export instead",
                CacheIntegrityWarning, stacklevel=4,
            )
        for p in (path, _sum_path(path)):
            with contextlib.suppress(OSError):
                p.unlink()

    def get(self, table: str, expr: str) -> pl.Series | None:
        """The cached column ``expr`` of ``table``, or None (also when its checksum fails)."""
        path = self._path(table, expr)
        held = self._held.pop(path, None)
        if held is not None:  # written by this process a moment ago (put(..., hold=True))
            return held
        if not self.has(table, expr):
            return None
        if not self._used:  # the eviction order: least recently used folders go first
            self._used = True
            with contextlib.suppress(OSError):
                os.utime(self.folder)
        try:
            expected = _sum_path(path).read_text().strip()
            fh = path.open("rb")
        except OSError as exc:
            log.debug("cached column %s unreadable (%s)", path, exc)
            return None
        with fh:
            try:
                intact = verify_file(fh, expected)
            except OSError as exc:
                log.debug("cached column %s unreadable (%s)", path, exc)
                return None
            if not intact:
                self._drop(path, "failed its checksum")
                return None
            free = self._free_memory() if self._free_memory is not None else None
            roomy = free is None or free >= 2 * os.fstat(fh.fileno()).st_size + DESCRIPTOR_READ_SLACK
            try:
                series = _read_verified(fh, by_descriptor=roomy).to_series()
                # one buffer makes gathers ~2x faster; files written by put() have one record
                # batch already (older ones: polars' ~120 k-row batches): usually no copy
                return series if series.n_chunks() == 1 else series.rechunk()
            except BaseException as exc:  # polars' Rust panics are BaseExceptions
                if isinstance(exc, KeyboardInterrupt | SystemExit | MemoryError):
                    raise
                self._drop(path, f"could not be read ({type(exc).__name__})")
                return None

    def put(self, table: str, expr: str, column: pl.Series, *, hold: bool = False) -> None:
        """Store ``column`` with its checksum (best effort: a full disk, a read-only cache or too
        little memory to write it only logs).

        Not written when less than three times the column's size is left in memory
        (the ``free_memory`` given to the cache): the writer may buffer the column while
        it writes (pyarrow's buffer, used before, grew by doubling, so the old and the new
        buffer lived together for a moment: a cold ``tracekit stats`` on 3 M kernels under
        ``ulimit -v`` 1.3 GB failed with ``ArrowMemoryError`` while caching a column although
        the report itself fitted). The file is written by polars straight into a temporary
        file beside it and checksummed from that file.

        With ``hold``, the column written is also kept in memory and the next :meth:`get` of
        it returns it (once) instead of reading the file back."""
        if not self.usable:
            return
        free = self._free_memory() if self._free_memory is not None else None
        if free is not None and 3 * column.estimated_size() > free:
            log.debug("not caching %s.%s: %d bytes and %d left", table, expr, column.estimated_size(), free)
            return
        path = self._path(table, expr)
        tmp_names: list[str] = []
        try:
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            stamp = self.folder / "export.json"
            if not stamp.exists():
                write_atomic(stamp, json.dumps(self._stamp, indent=1).encode(), tmp_names)
            # written by polars straight into a fresh temporary file (no copy of the column in
            # a Python buffer: 15-25 ms less per 20 MB column), then checksummed from the file
            fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=self.folder)
            tmp_names.append(name)
            with os.fdopen(fd, "w+b") as fh:
                _write_one_batch(column, fh)
                fh.flush()
                fh.seek(0)
                digest = checksum_file(fh)
            write_atomic(_sum_path(path), digest.encode(), tmp_names)
            os.replace(name, path)
            tmp_names.remove(name)
            evict(self.root, keep=self.folder, limit_bytes=max_bytes())
            if hold:  # as get() gives it: one buffer
                self._held[path] = column if column.n_chunks() == 1 else column.rechunk()
        except (OSError, MemoryError, pl.exceptions.PolarsError) as exc:  # a full disk may come back as either
            log.debug("not caching %s.%s (%s)", table, expr, exc)
            for name in tmp_names:
                with contextlib.suppress(OSError):
                    os.unlink(name)

    def clear(self) -> None:
        """Delete this export's cached columns."""
        shutil.rmtree(self.folder, ignore_errors=True)


def _write_one_batch(column: pl.Series, sink: BinaryIO) -> None:
    """``column`` as an uncompressed Arrow IPC file of one record batch: polars' default
    (~120 k-row batches) needs a third copy of the column to make it contiguous when read back.

    Written by polars itself (``record_batch_size`` = the column's length), not through
    pyarrow: importing pyarrow cost 0.07–0.1 s of every cold ``tracekit stats`` run (a third
    of a cold ``cuda_gpu_kern_sum`` on 1 M kernels) and its writer took 0.05 s a 20 MB column
    where polars takes 0.02 s."""
    column.to_frame().write_ipc(sink, record_batch_size=max(1, len(column)))


def _sum_path(path: Path) -> Path:
    return path.with_name(path.name + ".b2")


def max_bytes() -> int:
    """The size limit of the whole column cache: ``TRACEKIT_COLUMN_CACHE_MAX_GB`` in GB
    (default :data:`DEFAULT_MAX_GB`; ``inf``, ``none`` or ``unlimited`` for no limit). Anything
    else that is not a number ≥ 0 is a one-line error naming the variable."""
    raw = os.environ.get("TRACEKIT_COLUMN_CACHE_MAX_GB", "").strip()
    if not raw:
        return int(DEFAULT_MAX_GB * 1e9)
    if raw.lower() in ("inf", "infinity", "none", "unlimited", "no", "off"):
        return 2**63 - 1
    try:
        gb = float(raw)
    except ValueError:
        gb = math.nan
    if math.isinf(gb) and gb > 0:
        return 2**63 - 1
    if math.isnan(gb) or gb < 0 or gb * 1e9 >= 2**63:
        msg = (f"TRACEKIT_COLUMN_CACHE_MAX_GB={raw!r} is not a size: give a number of GB (e.g. 5), "
               "or inf/none for no limit")
        raise TracekitError(msg)
    return int(gb * 1e9)


def evict(root: Path, *, keep: Path, limit_bytes: int) -> list[Path]:
    """Delete the least recently used export folders under ``root`` (never ``keep``) until
    the folders' files total at most ``limit_bytes``; return the deleted folders."""
    folders = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(root):
            try:  # another process may be deleting or writing folders at the same time
                if entry.is_dir(follow_symlinks=False):
                    size = 0
                    for f in os.scandir(entry.path):
                        with contextlib.suppress(OSError):
                            if f.is_file(follow_symlinks=False):
                                size += f.stat().st_size
                    folders.append((entry.stat().st_mtime, Path(entry.path), size))
            except OSError:
                continue
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
