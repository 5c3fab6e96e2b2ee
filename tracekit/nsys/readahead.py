"""Scans of an export started before polars is imported, and taken by the export reader.

A cold ``tracekit stats`` spends 0.16–0.2 s importing polars (``python -c "import polars"`` on
the 2-core benchmark machine) before its first scan of the export, and a scan of 200 k kernels
and their launching calls takes about as long again. The CLI starts the scans the first report
will make (:func:`tracekit.cli.stats_readahead.start_reads`) on threads before it imports
polars: the ADBC SQLite driver runs each to its end inside ``execute_query`` (one batch of
every row), with the GIL released, while the interpreter loads polars
(``benchmarks/bench_exec_floor.py``). The export reader then takes a started scan's columns
instead of scanning the table again (:func:`take`, from
:meth:`tracekit.nsys.database.ExportDatabase._read_table`).

What is read ahead is whole columns, by name, with the scan's SQL filter, in rowid order (as
the reader scans: ``NOT INDEXED``, whatever index the export carries). A column is taken only
where the usual read would have asked for exactly it (same table, same filter), only while
the file at the export's path is the one the scan read (device, inode, size, modification
time), and only when the driver typed it as 64-bit integers (it types each column from its
values; any other type is left to the usual read, which handles every type). So a column
taken equals the usual read's: the same rows in the same order. A scan that failed is never
taken; each column is taken at most once; a scan is dropped once all its columns have been,
and at once when any of its columns is not 64-bit integers, the file changed, or its table is
read with another filter. Nothing here imports polars.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from tracekit.nsys.sqlite_file import sqlite_uri

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

log = logging.getLogger(__name__)

#: Rows per Arrow batch of a scan read ahead: every row in one batch, so that the whole scan
#: runs inside ``execute_query`` (the driver takes a C ``int``; 2**31 - 1 is refused).
BATCH_ROWS = 10**9


class Scan:
    """Whole ``columns`` of ``table`` (names in the export), rows matching ``where`` (SQL; ""
    for every row), in rowid order. (A plain class: ``dataclasses`` costs 6 ms to import,
    on the path this module exists to shorten.)"""

    __slots__ = ("columns", "table", "where")

    def __init__(self, table: str, columns: tuple[str, ...], where: str = "") -> None:
        self.table, self.columns, self.where = table, tuple(columns), where

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Scan) and (self.table, self.columns, self.where) == (other.table, other.columns, other.where)

    def __hash__(self) -> int:
        return hash((self.table, self.columns, self.where))

    def __repr__(self) -> str:
        return f"Scan({self.table!r}, {self.columns!r}, {self.where!r})"

    def sql(self) -> str:
        """The scan as one ``SELECT`` (each column under its own name), in rowid order whatever
        index the export carries (``NOT INDEXED``, as the export reader scans)."""
        named = ", ".join(f'"{c}"' for c in self.columns)
        return f'SELECT {named} FROM "{self.table}" NOT INDEXED' + (f" WHERE {self.where}" if self.where else "")


class _Started:
    """A scan running (then done) on its own thread and connection."""

    def __init__(self, uri: str, scan: Scan) -> None:
        self.scan = scan
        self.left = set(scan.columns)  # columns not taken yet
        self.frame: Any = None  # the stream made a frame by the first taker
        self._stream: Any = None
        self._handles: list[Any] = []
        self._done = False
        self._finished = False  # the thread has read all it will
        self._abandoned = False  # dropped: what it read is freed, now or when it is finished
        self._result_lock = threading.Lock()  # one taker makes the frame; the others wait for it
        self._thread = threading.Thread(target=self._run, args=(uri,), name="tracekit-readahead", daemon=True)
        self._thread.start()

    def _run(self, uri: str) -> None:
        try:
            import adbc_driver_manager
            import adbc_driver_sqlite

            self._handles.append(adbc_driver_sqlite.connect(uri))
            self._handles.insert(0, adbc_driver_manager.AdbcConnection(self._handles[0]))
            stmt = adbc_driver_manager.AdbcStatement(self._handles[0])
            self._handles.insert(0, stmt)
            stmt.set_options(**{"adbc.sqlite.query.batch_rows": str(BATCH_ROWS)})
            stmt.set_sql_query(self.scan.sql())
            self._stream = stmt.execute_query()[0]
        except Exception as exc:  # the usual read runs instead, and reports any real problem
            log.debug("reading %s ahead failed: %s", self.scan.table, exc)
        with self._result_lock:
            self._finished = True
            if self._abandoned:  # dropped while it ran: its rows and connection go now
                self._make(lambda stream: None)

    def abandon(self) -> None:
        """Free what the scan read and close its connection: now where it is finished, else
        as soon as it is (it runs to its end; SQLite's step is not interrupted)."""
        with self._result_lock:
            self._abandoned = True
            self.frame = None
            if self._finished:
                self._make(lambda stream: None)

    def result(self, make_frame: Callable[[Any], Any]) -> Any:
        """The scan's rows as ``make_frame(stream)`` (the driver's Arrow stream; made once),
        or None when the scan failed."""
        self._thread.join()
        with self._result_lock:
            self._make(make_frame)
        return self.frame

    def _make(self, make_frame: Callable[[Any], Any]) -> None:
        if not self._done:
            self._done = True
            if self._stream is not None:
                try:
                    self.frame = make_frame(self._stream)
                except Exception as exc:
                    log.debug("reading %s ahead failed: %s", self.scan.table, exc)
            self._stream = None
            for handle in self._handles:  # statement, connection, database
                try:
                    handle.close()
                except Exception as exc:  # closing is best effort
                    log.debug("closing a read-ahead handle: %s", exc)
            self._handles = []


_started: dict[tuple[str, str, str], _Started] = {}
#: The identity of each export whose scans were started (device, inode, size, mtime): a file
#: put in its place since is not the one they read.
_identity: dict[str, tuple[int, int, int, int]] = {}
_lock = threading.Lock()


def _key(path: Path, table: str, where: str) -> tuple[str, str, str]:
    return str(path.resolve()), table, where


def _stat(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def start(path: Path, scans: Sequence[Scan]) -> None:
    """Start ``scans`` of the SQLite export ``path`` (opened read-only, immutable), each on a
    thread of its own; the first scan of a table and filter counts."""
    identity = _stat(path)
    if identity is None:
        return
    uri = sqlite_uri(path)
    with _lock:
        _identity[str(path.resolve())] = identity
        for scan in scans:
            key = _key(path, scan.table, scan.where)
            if key not in _started:
                _started[key] = _Started(uri, scan)


def pending(path: Path) -> bool:
    """Whether scans of ``path`` were started and are not all taken."""
    with _lock:
        return any(k[0] == str(path.resolve()) for k in _started)


def take(path: Path, table: str, where: str, columns: Sequence[str], make_frame: Callable[[Any], Any],
         is_int64: Callable[[Any, str], bool]) -> Any:
    """A frame of ``columns`` of ``table`` (rows matching ``where``) from a scan started for
    exactly that table and filter, or None: none was started, it failed, some column was not
    read ahead or was taken already, or the file at ``path`` is no longer the one it read.
    ``make_frame`` turns the driver's Arrow stream into a frame (once per scan); the frame
    returned holds exactly ``columns``, in that order, under their names in the export.

    A scan is dropped (its rows freed) once all its columns are taken; at once, none taken,
    when any of its columns is not 64-bit integers (``is_int64(frame, column)``: a damaged
    export's cells, which the usual read then handles; its columns share one batch's memory,
    which a column taken would keep), when the file changed, and when the table's plain
    columns are asked for with another filter (the report reads it another way)."""
    key = _key(path, table, where)
    with _lock:
        if _identity.get(key[0]) != _stat(path):
            gone = _drop_locked(key[0])
        else:
            gone = [_started.pop(k) for k in [k for k in _started if k[:2] == key[:2] and k != key]]
        started = _started.get(key)
    _release(gone)
    if started is None or not set(columns) <= started.left:
        return None
    frame = started.result(make_frame)
    with _lock:
        if _started.get(key) is not started or not set(columns) <= started.left:
            return None
        # every column of the scan, not only those asked for: the columns of one scan share
        # their memory (the driver's one batch), which a column taken would keep alive
        if frame is None or not all(is_int64(frame, c) for c in started.scan.columns):
            del _started[key]
            started.frame = None
            return None
        started.left -= set(columns)
        if not started.left:
            del _started[key]
            started.frame = None
    return frame.select(list(columns))


def _drop_locked(export: str) -> list[_Started]:
    """Forget the scans of the export ``export`` (a resolved path); ``_lock`` held."""
    _identity.pop(export, None)
    return [_started.pop(k) for k in [k for k in _started if k[0] == export]]


def drop(path: Path | None = None) -> None:
    """Forget the scans of ``path`` (of every export when None), freeing what they read and
    closing their connections: at once where they are finished, when they finish where they
    still run (not waited for)."""
    with _lock:
        exports = {k[0] for k in _started} | set(_identity) if path is None else {str(path.resolve())}
        gone = [started for export in exports for started in _drop_locked(export)]
    _release(gone)


def _release(gone: list[_Started]) -> None:
    """Free what scans no longer in the registry read, and close their connections: at once
    where they are finished, when they finish where they still run."""
    for started in gone:
        started.abandon()
