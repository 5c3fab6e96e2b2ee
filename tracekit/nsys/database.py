"""Read-only access to an Nsight Systems SQLite export, returning Arrow/polars data.

The file is opened with ``mode=ro&immutable=1`` so that neither tracekit nor SQLite ever
writes to it (no journal, no WAL, no locks). When a non-empty ``-wal`` file lies beside it
(an export whose committed rows were not yet checkpointed into the main file), it is opened
``mode=ro`` without ``immutable`` so that SQLite reads those rows too (still read-only; SQLite
may create the ``-shm`` index beside it), with one warning and no column cache. A non-empty
``-journal`` (a write that never finished) is refused with one line saying what to do. Queries go through the ADBC SQLite driver when
it is installed (fast, columnar) and through the standard-library ``sqlite3`` module
otherwise, or when ADBC cannot type a column (for example a column whose first rows are
NULL and later rows text). Every result is cast to the caller's schema, so the two paths
give identical frames.

Speed (measured in ``benchmarks/``): the driver is used through its low-level API
(``adbc_driver_manager``), whose result stream polars reads through the Arrow C stream
interface; the DB-API wrapper would import ``pyarrow.dataset`` (about 1 s per process).
Large tables are read in rowid slices on several threads, each with its own connection
(the driver releases the GIL while SQLite steps); slices are concatenated in rowid order,
which is the order of a plain full scan, so the frame is the same as a single read.
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import threading
import weakref
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

import polars as pl

from tracekit.errors import TraceFormatError, TraceMemoryError, one_line
from tracekit.nsys import readahead
from tracekit.nsys.column_cache import ColumnCache
from tracekit.nsys.column_cache import enabled_by_default as column_cache_enabled_by_default
from tracekit.nsys.memory import free_memory
from tracekit.nsys.sqlite_file import rowid_bounds, sqlite_uri

log = logging.getLogger(__name__)

#: An expression that is one quoted column name (``"start"``), and that name.
_PLAIN_COLUMN = re.compile(r'"([^"]+)"')
#: Rows per Arrow batch the ADBC driver produces (its default, 1024, is slower).
ADBC_BATCH_ROWS = 65536
#: Tables with at least this many rows are read in parallel rowid slices.
PARALLEL_MIN_ROWS = 200_000
#: Full reads of tables with at least this many rows go through the column cache.
CACHE_MIN_ROWS = 200_000
#: Upper bound on reader threads (SQLite scans scale to a few cores; more only costs memory).
MAX_READ_THREADS = 4


def read_threads() -> int:
    """Threads used to read one large table: ``TRACEKIT_READ_THREADS``, else the usable
    cores (at most :data:`MAX_READ_THREADS`)."""
    env = os.environ.get("TRACEKIT_READ_THREADS", "")
    if env.strip().isdigit() and int(env) > 0:
        return int(env)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_READ_THREADS))


def _adbc_available() -> bool:
    # only look for the driver here; it is imported on the first query
    import importlib.util

    try:
        return importlib.util.find_spec("adbc_driver_sqlite") is not None
    except (ImportError, ValueError):
        return False


def _beside(path: Path, suffix: str) -> Path | None:
    """``path`` + ``suffix`` (``-wal``, ``-journal``) when that file exists and is not empty."""
    other = path.with_name(path.name + suffix)
    try:
        return other if other.is_file() and other.stat().st_size > 0 else None
    except OSError:
        return None


class ExportSource(Protocol):
    """What the readers ask of an export: :class:`ExportDatabase` (a ``.sqlite`` file) and
    :class:`tracekit.nsys.columnar.ExportFolder` (an nsys ``parquetdir``/``arrowdir``) both
    answer it. SQL arguments are SQLite as the readers write it."""

    path: Path

    @property
    def tables(self) -> frozenset[str]: ...
    def has_table(self, table: str) -> bool: ...
    def columns(self, table: str) -> tuple[str, ...]: ...
    def has_column(self, table: str, column: str) -> bool: ...
    def row_count(self, table: str) -> int: ...
    def row_estimate(self, table: str) -> int: ...
    def is_rowid_table(self, table: str) -> bool: ...
    def caches(self, table: str) -> bool: ...
    def derived_column(self, table: str, key: str, make: Callable[[], pl.Series]) -> pl.Series: ...
    def all_cached(self, table: str, exprs: Sequence[str]) -> bool: ...
    def cache_integer_columns(
        self, table: str, only: Collection[str] | None = None, *, scan_bytes: int | None = None, hold: bool = False
    ) -> bool: ...
    def query(self, sql: str, schema: Mapping[str, pl.DataType | type[pl.DataType]]) -> pl.DataFrame: ...
    def query_table(
        self, table: str, exprs: Sequence[str], schema: Mapping[str, pl.DataType | type[pl.DataType]], where: str = ""
    ) -> pl.DataFrame: ...
    def rows(self, sql: str) -> list[tuple[Any, ...]]: ...
    def scalar(self, sql: str) -> Any: ...
    def key_values(self, table: str) -> dict[str, str]: ...
    def close(self) -> None: ...


#: The most bytes of columns :meth:`ExportDatabase.cache_integer_columns` reads in one scan
#: of a table (more columns take more scans): :data:`CACHE_FILL_SHARE` of the export's bytes,
#: at least :data:`CACHE_FILL_BYTES` and at most :data:`CACHE_FILL_MAX_BYTES`. A scan holds
#: its columns, and one column copied while it is written out. A scan costs a pass over the
#: table's pages however few columns it reads (the 5 M-call API table's eight columns: 1.55 s
#: in one scan, 1.9–2.4 s in four), so the budget grows with the export: small on a 363 MB
#: one, where the scan is the run's peak (one scan: 685 MB; two columns a scan: 191 MB), 1 GiB
#: on an 11 GB one, where a column alone is 0.6 GB (benchmarks/README.md, "Issue 28,
#: thirteenth session").
CACHE_FILL_BYTES = 96 << 20
CACHE_FILL_SHARE = 0.1
CACHE_FILL_MAX_BYTES = 1 << 30
#: The most bytes of columns a report's first (cold) run reads in one scan when it puts the
#: columns it is about to read one at a time into the cache (:func:`prefetch_columns`): a
#: scan holds its columns twice over for a moment, so this bounds that moment to ~256 MB.
PREFETCH_SCAN_BYTES = 128 << 20
#: The most bytes of prefetched columns kept in memory until the report reads them
#: (:func:`prefetch_columns`); beyond it they are read back from the cache files.
PREFETCH_HOLD_BYTES = 512 << 20


class ExportDatabase:
    """A read-only Nsight Systems SQLite export.

    Parameters
    ----------
    path
        The ``.sqlite`` file.
    engine
        ``"auto"`` (ADBC when installed, else sqlite3), ``"adbc"`` or ``"sqlite3"``.
    column_cache
        Keep full-table column reads of large tables as Arrow files for later runs
        (:mod:`tracekit.nsys.column_cache`); default on unless ``TRACEKIT_COLUMN_CACHE=0``.
    """

    def __init__(self, path: str | Path, *, engine: str = "auto", column_cache: bool | None = None) -> None:
        self.path = Path(path)
        if engine not in ("auto", "adbc", "sqlite3"):
            msg = f"unknown engine {engine!r}; use 'auto', 'adbc' or 'sqlite3'"
            raise ValueError(msg)
        has_adbc = _adbc_available()
        if engine == "adbc" and not has_adbc:
            from tracekit.errors import missing_extra

            raise missing_extra("adbc-driver-sqlite", "all")
        self.engine = "adbc" if (engine != "sqlite3" and has_adbc) else "sqlite3"
        self._sqlite: sqlite3.Connection | None = None
        self._adbc_db: Any = None
        self._adbc_conns: list[Any] = []  # idle low-level connections, reused by threads
        self._adbc_closer: weakref.finalize | None = None
        self._adbc_lock = threading.Lock()
        self._immutable = self._check_logs()
        self._check_readable()
        use_cache = column_cache_enabled_by_default() if column_cache is None else column_cache
        use_cache = use_cache and self._immutable  # a WAL's rows are not in the cache's fingerprint
        self.column_cache: ColumnCache | None = ColumnCache(self.path, free_memory=free_memory) if use_cache else None

    # -- connections -------------------------------------------------------------
    def _stdlib(self) -> sqlite3.Connection:
        if self._sqlite is None:
            uri = sqlite_uri(self.path, immutable=self._immutable)
            self._sqlite = sqlite3.connect(uri, uri=True, check_same_thread=False)
            self._sqlite.text_factory = lambda b: b.decode("utf-8", errors="replace")
            # traces opened in notebooks are rarely closed: close with the object
            weakref.finalize(self, self._sqlite.close)
        return self._sqlite

    def _take_adbc_connection(self) -> Any:
        """An idle low-level ADBC connection (a new one when all are busy)."""
        with self._adbc_lock:
            if self._adbc_conns:
                return self._adbc_conns.pop()
            if self._adbc_db is None:
                import adbc_driver_sqlite

                self._adbc_db = adbc_driver_sqlite.connect(sqlite_uri(self.path, immutable=self._immutable))
                self._adbc_conns = []
                # traces opened in notebooks are rarely closed: close with the object
                self._adbc_closer = weakref.finalize(self, _close_adbc, self._adbc_db, self._adbc_conns)
            db = self._adbc_db
        import adbc_driver_manager

        return adbc_driver_manager.AdbcConnection(db)

    def _give_back_adbc_connection(self, conn: Any) -> None:
        with self._adbc_lock:
            self._adbc_conns.append(conn)

    def close(self) -> None:
        """Close open connections (the object can be used again; it reopens lazily)."""
        if self._sqlite is not None:
            self._sqlite.close()
            self._sqlite = None
        with self._adbc_lock:
            if self._adbc_closer is not None:
                self._adbc_closer()  # runs _close_adbc once and disarms the finalizer
                self._adbc_closer = None
            self._adbc_db = None

    def __enter__(self) -> ExportDatabase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_logs(self) -> bool:
        """Whether the file can be opened ``immutable`` (no pending WAL or journal beside it)."""
        journal = _beside(self.path, "-journal")
        if journal is not None:
            msg = (
                f"{journal} is not empty: a write to {self.path.name} never finished, so its rows "
                "may be half-written; make a copy of both files and open the copy once with "
                "`sqlite3 COPY.sqlite 'PRAGMA integrity_check'` (which rolls the journal back), "
                "or export the report again"
            )
            raise TraceFormatError(msg)
        wal = _beside(self.path, "-wal")
        if wal is None:
            return True
        import warnings

        warnings.warn(
            f"{wal.name} holds committed rows not yet in {self.path.name}; reading them too "
            "(opened read-only without 'immutable'; the column cache is off for this file)",
            stacklevel=3,
        )
        return False

    def _check_readable(self) -> None:
        try:
            self._stdlib().execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.DatabaseError as exc:
            msg = (
                f"{self.path} is not a readable SQLite database ({one_line(str(exc))}); it may be truncated "
                "or corrupt: export the report again with `nsys export --type sqlite`"
            )
            raise TraceFormatError(msg) from None
        except UnicodeDecodeError:
            # SQLite's "malformed database schema (…)" message quotes the damaged CREATE
            # statement, and Python's sqlite3 fails decoding its non-UTF-8 bytes
            msg = (
                f"{self.path} has a damaged schema (the table definitions SQLite keeps hold bytes that are not text); "
                "the file is corrupt: export the report again with `nsys export --type sqlite`"
            )
            raise TraceFormatError(msg) from None

    # -- schema --------------------------------------------------------------------
    @cached_property
    def tables(self) -> frozenset[str]:
        """Names of the tables (and views) in the file."""
        rows = self.rows("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")
        return frozenset(r[0] for r in rows)

    def has_table(self, table: str) -> bool:
        """Whether ``table`` exists."""
        return table in self.tables

    def columns(self, table: str) -> tuple[str, ...]:
        """Column names of ``table`` (empty when the table is absent)."""
        cache: dict[str, tuple[str, ...]] = self.__dict__.setdefault("_column_cache", {})
        if table not in cache:
            if table not in self.tables:
                cache[table] = ()
            else:
                rows = self.rows(f'PRAGMA table_info("{table}")')
                cache[table] = tuple(r[1] for r in rows)
        return cache[table]

    def has_column(self, table: str, column: str) -> bool:
        """Whether ``table`` exists and has ``column``."""
        return column in self.columns(table)

    def row_count(self, table: str) -> int:
        """Number of rows in ``table`` (0 when absent)."""
        if table not in self.tables:
            return 0
        return int(self.scalar(f'SELECT count(*) FROM "{table}"'))

    def row_estimate(self, table: str) -> int:
        """Rows of ``table`` without counting them (two b-tree lookups): the rowid span of
        an ordinary table (its row count when no row was deleted, as in nsys exports), else
        :meth:`row_count`."""
        span = self._row_span(table)
        return span if span > 0 or table not in self.tables else self.row_count(table)

    # -- queries ---------------------------------------------------------------------
    def query(self, sql: str, schema: Mapping[str, pl.DataType | type[pl.DataType]], *, rechunk: bool = True) -> pl.DataFrame:
        """Run ``sql`` and return a frame cast to ``schema`` (same names, same order).

        The query's result columns must come in the order of ``schema``. With
        ``rechunk=False`` the ADBC reader's batches are kept as they came (no contiguous copy).
        """
        if self.engine == "adbc":
            try:
                return self._query_adbc(sql, schema, rechunk=rechunk)
            except Exception as exc:  # ADBC mis-typing: fall back to the exact path
                log.debug("ADBC query failed (%s); falling back to sqlite3", exc)
        try:
            return self._query_stdlib(sql, schema)
        except sqlite3.DatabaseError as exc:
            raise self._corrupt(exc) from None

    def _corrupt(self, exc: Exception) -> TraceFormatError:
        msg = (
            f"{self.path} could not be read ({exc}); the export is truncated or corrupt: "
            "export the report again with `nsys export --type sqlite`"
        )
        return TraceFormatError(msg)

    def query_table(
        self,
        table: str,
        exprs: Sequence[str],
        schema: Mapping[str, pl.DataType | type[pl.DataType]],
        where: str = "",
    ) -> pl.DataFrame:
        """``SELECT exprs FROM table [WHERE where]`` cast to ``schema`` (one name per
        expression), in rowid order.

        Full reads of large tables come from the column cache when it holds them and go
        into it otherwise. With ADBC and a large table the scan is split into rowid slices
        read on :func:`read_threads` threads; either way the result equals :meth:`query`
        of the same SQL.
        """
        cache = None if where else self._cache_for(table)
        if cache is None:
            return self._read_table(table, exprs, schema, where)
        names = list(schema)
        wanted = [(n, e) for n, e in zip(names, exprs, strict=True) if e != "NULL"]  # NULL: built below
        try:
            hits = self._cached_columns(cache, table, [e for _, e in wanted])
        except MemoryError as exc:
            if isinstance(exc, TraceMemoryError):
                raise
            raise _out_of_memory(self.path, table, self._row_span(table), len(wanted), "ran out of memory") from exc
        columns = {n: hit for (n, _), hit in zip(wanted, hits, strict=True) if hit is not None}
        missing = [(n, e) for (n, e), hit in zip(wanted, hits, strict=True) if hit is None]
        # the text columns in a scan of their own: a scan's batches and their contiguous copy
        # are alive together, and text is the bulk of a table of names (1 M NVTX ranges: a
        # cold diagnose's peak)
        text = [(n, e) for n, e in missing if schema[n] in (pl.Utf8, pl.Binary)]
        for group in ([m for m in missing if m not in text], text) if text else (missing,):
            if not group:
                continue
            fresh = self._read_table(table, [e for _, e in group], {n: schema[n] for n, _ in group})
            for name, expr in group:
                cache.put(table, expr, fresh.get_column(name))
                columns[name] = fresh.get_column(name)
            del fresh
        heights = {len(c) for c in columns.values()}
        if len(heights) > 1:  # cannot happen for one unchanged export: distrust the cache
            log.warning("column cache of %s is inconsistent; clearing it", self.path)
            cache.clear()
            return self._read_table(table, exprs, schema, where)
        height = heights.pop() if heights else self.row_count(table)
        frame = pl.DataFrame(
            [
                columns[n].alias(n) if n in columns else pl.repeat(None, height, dtype=schema[n], eager=True).alias(n)
                for n in names
            ]
        )
        return _cast(frame, schema)

    def _cache_for(self, table: str) -> ColumnCache | None:
        """The column cache when it is on and ``table`` is large enough to be cached."""
        return self.column_cache if self.column_cache is not None and self._row_span(table) >= CACHE_MIN_ROWS else None

    def cache_integer_columns(
        self, table: str, only: Collection[str] | None = None, *, scan_bytes: int | None = None, hold: bool = False
    ) -> bool:
        """Put every INTEGER column of ``table`` (those named in ``only``, when given) into the
        column cache (one scan for those it lacks, or more: at most ``scan_bytes`` of columns
        per scan, :func:`fill_budget` of the export by default); True when they are all there afterwards.
        With ``hold``, each column written stays in memory until the next read of it
        (:meth:`ColumnCache.put`), for a caller that reads them all next. False, reading nothing, when the
        cache is off or the table is too small to be cached. Integer columns are the ones
        the readers cache as Int64 under their plain quoted names."""
        cache = self._cache_for(table)
        if cache is None:
            return False
        declared = self.rows(f'PRAGMA table_info("{table}")')
        exprs = [f'"{r[1]}"' for r in declared if str(r[2]).upper() == "INTEGER" and (only is None or r[1] in only)]
        missing = [e for e in exprs if not cache.has(table, e)]
        if missing:
            # as many columns per scan as fit in scan_bytes (fill_budget: two of a 5 M-row table's
            # on a 363 MB export): a 76 M-row API table's eight columns would be 4.9 GB in one read
            rows = max(min(self._row_span(table), self._file_bytes), 1)
            budget = scan_bytes if scan_bytes is not None else fill_budget(self._file_bytes)
            per_scan = max(1, budget // (rows * 8))
            for i in range(0, len(missing), per_scan):
                group = missing[i : i + per_scan]
                # the reader's batches, not a contiguous copy of every column: each column is
                # written as one record batch (one column copied at a time); columns held for
                # the caller are made contiguous once, as they are read back
                fresh = self._read_table(table, group, {e: pl.Int64 for e in group}, rechunk=hold)
                for expr in group:
                    cache.put(table, expr, fresh.get_column(expr), hold=hold)
                del fresh
        return all(cache.has(table, e) for e in exprs)

    def derived_column(self, table: str, key: str, make: Callable[[], pl.Series]) -> pl.Series:
        """A column that ``make`` computes from this export (``table`` and others), kept in the
        column cache under ``key`` beside ``table``'s columns and read from there next time.

        For results that cost more to compute than to read back, such as the launch join's
        per-kernel API columns. ``key`` must name what is computed and how (bump a version in
        it when the computation changes): the cache is keyed by the export's identity only.
        Without a cache (off, unusable, or ``table`` below :data:`CACHE_MIN_ROWS` rows) the
        column is computed every time."""
        cache = self._cache_for(table)
        if cache is None or not cache.usable:
            return make()
        if cache.has(table, key):
            hit = self._cached_columns(cache, table, [key])[0]
            if hit is not None:
                return hit
        column = make()
        cache.put(table, key, column)
        return column

    def caches(self, table: str) -> bool:
        """Whether full reads of ``table`` go through the column cache (on, usable, and the
        table large enough)."""
        cache = self._cache_for(table)
        return cache is not None and cache.usable

    def all_cached(self, table: str, exprs: Sequence[str]) -> bool:
        """Whether :meth:`query_table` of these expressions (no ``WHERE``) would be answered
        from the column cache alone."""
        cache = self._cache_for(table)
        return cache is not None and all(e == "NULL" or cache.has(table, e) for e in exprs)

    def _cached_columns(self, cache: ColumnCache, table: str, exprs: list[str]) -> list[pl.Series | None]:
        """``cache.get`` of each expression, one after the other: since cached columns are one
        record batch (no copy to make them contiguous), two reader threads saved no time on a
        1 M-kernel export and held two columns' read buffers at once (15–60 MB more peak RSS
        per report, measured on the stats reports).

        Refused up front (:class:`~tracekit.errors.TraceMemoryError`) when the cached columns
        cannot fit in the memory left: all of them together, plus one file's bytes (the file
        and the column read from it live together for a moment); and again before each
        column, against what is left then. polars aborts the process when an allocation
        fails, so this check is what keeps a warm read from ending in ``SIGABRT``."""
        sizes = [cache.size(table, e) for e in exprs]
        known = [s for s in sizes if s is not None]
        if known:
            # polars' reader threads, started now unless there is no room for them: then
            # the read needs that room too (it would start them itself)
            extra = 0 if start_reader() else reader_start_bytes()
            self._check_fits(table, len(exprs), sum(known) + max(known) + extra)
        out = []
        for expr, size in zip(exprs, sizes, strict=True):
            if size is not None:
                self._check_fits(table, len(exprs), 2 * size)
            out.append(cache.get(table, expr))
        return out

    def _check_fits(self, table: str, columns: int, need: int) -> None:
        """Raise :class:`~tracekit.errors.TraceMemoryError` naming ``table`` when ``need``
        bytes exceed :func:`free_memory`."""
        ensure_memory(self.path, table, self._row_span(table), columns, need)

    def _row_bounds(self, table: str) -> tuple[int, int]:
        """``(min(rowid), max(rowid))`` of an ordinary table; ``(0, -1)`` for views, absent
        or empty tables. Cheap: two b-tree lookups."""
        bounds: dict[str, tuple[int, int]] = self.__dict__.setdefault("_row_bounds_cache", {})
        if table not in bounds:
            lo_hi = (0, -1)
            if table in self.tables and self.is_rowid_table(table):
                lo_hi = rowid_bounds(self.scalar, table)
            bounds[table] = lo_hi
        return bounds[table]

    @cached_property
    def _file_bytes(self) -> int:
        """Size of the export (an upper bound on any table's row count)."""
        try:
            return self.path.stat().st_size + sum(
                p.stat().st_size for p in (self.path.with_name(self.path.name + "-wal"),) if p.is_file()
            )
        except OSError:
            return 1 << 62

    def _row_span(self, table: str) -> int:
        """``max(rowid) - min(rowid) + 1`` (the row count when no row was deleted, as in
        nsys exports); 0 for views and absent or empty tables."""
        lo, hi = self._row_bounds(table)
        return hi - lo + 1

    def _read_table(
        self,
        table: str,
        exprs: Sequence[str],
        schema: Mapping[str, pl.DataType | type[pl.DataType]],
        where: str = "",
        *,
        rechunk: bool = True,
    ) -> pl.DataFrame:
        """:meth:`_scan_table`, refused up front when its columns alone cannot fit in the memory
        left (:func:`free_memory`), and with an out-of-memory error turned into one
        :class:`~tracekit.errors.TraceMemoryError` that names the table and the ways around it."""
        ahead = self._read_ahead(table, exprs, schema, where, rechunk=rechunk)
        if ahead is not None:
            return ahead
        columns = sum(e != "NULL" for e in exprs)
        rows = min(self._row_span(table), _rowid_span(where), self._file_bytes) if columns else 0  # a damaged rowid cannot inflate it
        # Int64/Float64 values only (strings need more), twice: the reader's record batches and
        # the frame made of them are alive together for a moment. polars aborts the process
        # when an allocation fails, so a read that would just fit is refused instead
        need = 2 * rows * columns * 8
        slices = len(self._rowid_slices(table))
        if slices > 1:
            # a split read starts a thread per slice, each with its stack (``ulimit -s``, 8 MB
            # by default): with 40 MB left, a 24 MB read on two threads passed the check and
            # the SQLite reader crashed (SIGSEGV) in a thread. The first time, each thread's
            # malloc arena too (64 MB of address space, kept for later threads): under
            # ``ulimit -v`` 1.1 GB a 3 M-row read passed the check and then aborted
            first = slices > _split_threads_started[0]
            need += slices * (thread_start_bytes() if first else _thread_stack_bytes())
        free = free_memory()
        if free is not None and need > free:
            raise _out_of_memory(self.path, table, rows, columns, f"needs about {_gb(need)} and {_gb(free)} is left")
        try:
            return self._scan_table(table, exprs, schema, where, rechunk=rechunk)
        except MemoryError as exc:
            if isinstance(exc, TraceMemoryError):
                raise
            raise _out_of_memory(self.path, table, rows, columns, "ran out of memory") from exc

    def _read_ahead(
        self,
        table: str,
        exprs: Sequence[str],
        schema: Mapping[str, pl.DataType | type[pl.DataType]],
        where: str,
        *,
        rechunk: bool,
    ) -> pl.DataFrame | None:
        """The columns ``exprs`` (plain quoted column names) of a scan that the CLI started
        before polars was imported (:mod:`tracekit.nsys.readahead`), cast to ``schema``; None
        (then the table is read as usual) when there is none for this table and filter, it
        lacks one of them, or not every column it read is 64-bit integers."""
        if self.engine != "adbc" or not self._immutable or not readahead.pending(self.path):
            return None
        names = [m.group(1) if (m := _PLAIN_COLUMN.fullmatch(e)) else None for e in exprs]
        if None in names or len(set(names)) != len(names):
            return None
        frame = readahead.take(self.path, table, where, names, pl.DataFrame,  # type: ignore[arg-type]
                               lambda f, c: f.schema[c] == pl.Int64)
        if frame is None:
            return None
        frame.columns = list(schema)
        frame = _cast(frame, schema)
        return frame.rechunk() if rechunk else frame

    def _scan_table(
        self,
        table: str,
        exprs: Sequence[str],
        schema: Mapping[str, pl.DataType | type[pl.DataType]],
        where: str = "",
        *,
        rechunk: bool = True,
    ) -> pl.DataFrame:
        """``exprs`` of ``table`` (``where``) in rowid order (whatever index the export
        carries), read in rowid slices on threads when the table is big; one chunk per column
        unless ``rechunk=False`` (the reader's batches as they came: no second copy of every
        column, for a caller that writes them out one at a time)."""
        base = select_sql(table, exprs, rowid_order=True)
        cond = f" AND ({where})" if where else ""
        whole = select_sql(table, exprs, where, rowid_order=True)
        slices = self._rowid_slices(table)
        if len(slices) < 2:
            return self.query(whole, schema, rechunk=rechunk)
        sqls = [f"{base} WHERE rowid > {lo} AND rowid <= {hi}{cond}" for lo, hi in slices]
        try:
            _split_threads_started[0] = max(_split_threads_started[0], len(sqls))
            with ThreadPoolExecutor(len(sqls), thread_name_prefix="tracekit-read") as pool:
                parts = list(pool.map(lambda sql: self._query_adbc(sql, schema, rechunk=False), sqls))
        except Exception as exc:  # ADBC mis-typing in a slice: the exact single-threaded path
            log.debug("parallel ADBC read failed (%s); reading in one query", exc)
            return self.query(whole, schema, rechunk=rechunk)
        return pl.concat(parts, rechunk=rechunk)

    def _rowid_slices(self, table: str) -> list[tuple[int, int]]:
        """``(lo, hi]`` rowid bounds splitting ``table`` for parallel reading ([] = don't)."""
        threads = read_threads()
        span = self._row_span(table)
        if self.engine != "adbc" or threads < 2 or span < PARALLEL_MIN_ROWS:
            return []
        lo = self._row_bounds(table)[0] - 1
        bounds = [lo + span * i // threads for i in range(threads + 1)]
        return list(zip(bounds[:-1], bounds[1:], strict=True))

    def is_rowid_table(self, table: str) -> bool:
        """Whether ``table`` is an ordinary table (not a view, not ``WITHOUT ROWID``)."""
        sql = self.scalar(f"SELECT sql FROM sqlite_master WHERE type = 'table' AND name = '{table}'")
        return sql is not None and "WITHOUT ROWID" not in str(sql).upper()

    def _query_adbc(self, sql: str, schema: Mapping[str, Any], *, rechunk: bool = True) -> pl.DataFrame:
        import adbc_driver_manager

        conn = self._take_adbc_connection()
        try:
            stmt = adbc_driver_manager.AdbcStatement(conn)
            try:
                stmt.set_options(**{"adbc.sqlite.query.batch_rows": str(ADBC_BATCH_ROWS)})
                stmt.set_sql_query(sql)
                stream, _ = stmt.execute_query()
                frame = pl.DataFrame(stream)  # Arrow C stream: no pyarrow needed
            finally:
                stmt.close()
        finally:
            self._give_back_adbc_connection(conn)
        frame.columns = list(schema)
        frame = _cast(frame, schema)
        # one contiguous chunk per column: later joins and group-bys are faster (measured)
        return frame.rechunk() if rechunk else frame

    def _query_stdlib(self, sql: str, schema: Mapping[str, Any]) -> pl.DataFrame:
        cur = self._stdlib().execute(sql)
        rows = cur.fetchall()
        names = list(schema)
        if not rows:
            return pl.DataFrame(schema={k: schema[k] for k in names})
        columns = list(zip(*rows, strict=True))
        data = {}
        for name, values in zip(names, columns, strict=True):
            dtype = schema[name]
            if dtype == pl.Binary:
                values = tuple(v.encode() if isinstance(v, str) else v for v in values)
            data[name] = pl.Series(name, values, dtype=None if dtype != pl.Binary else pl.Binary, strict=False)
        return _cast(pl.DataFrame(data), schema)

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        """All rows of ``sql`` as tuples (stdlib sqlite3; for small metadata tables)."""
        try:
            return self._stdlib().execute(sql).fetchall()
        except sqlite3.DatabaseError as exc:
            raise self._corrupt(exc) from None

    def scalar(self, sql: str) -> Any:
        """First column of the first row of ``sql`` (``None`` when no row)."""
        try:
            row = self._stdlib().execute(sql).fetchone()
        except sqlite3.DatabaseError as exc:
            raise self._corrupt(exc) from None
        return None if row is None else row[0]

    def key_values(self, table: str) -> dict[str, str]:
        """A ``(name, value)`` table such as ``META_DATA_EXPORT`` as a dict (empty when absent)."""
        if not {"name", "value"} <= set(self.columns(table)):
            return {}
        rows = self.rows(f'SELECT name, value FROM "{table}"')
        return {str(k): "" if v is None else str(v) for k, v in rows}


def _close_adbc(db: Any, conns: list[Any]) -> None:
    while conns:
        conns.pop().close()
    db.close()


class TypeMismatchWarning(UserWarning):
    """Cells of an export whose type does not match their column (SQLite allows it)."""


class InvalidTextWarning(UserWarning):
    """Text cells of an export that are not valid UTF-8 (decoded with U+FFFD replacing bad bytes)."""


def _exact(values: list[Any], dtype: Any) -> tuple[pl.Series, int]:
    """Values of mixed SQLite types (a damaged or edited export: text in an INTEGER column)
    converted exactly to ``dtype`` — ``'123'`` → 123, 5.0 → 5 — or null when they cannot be
    (never reinterpreted); returns the series and how many became null."""
    out: list[Any] = []
    bad = 0
    numeric = dtype in (pl.Int64, pl.Int32, pl.UInt32, pl.UInt64, pl.Int16, pl.Int8)
    for v in values:
        if v is None:
            out.append(None)
            continue
        try:
            if numeric:
                if isinstance(v, bytes | str):
                    v = v.decode() if isinstance(v, bytes) else v
                    iv = int(v.strip())
                elif isinstance(v, float):
                    if not v.is_integer():
                        raise ValueError
                    iv = int(v)
                else:
                    iv = int(v)
                out.append(iv)
            elif dtype == pl.Float64:
                out.append(float(v.decode() if isinstance(v, bytes) else v))
            elif dtype == pl.Utf8:
                out.append(v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v))
            else:
                out.append(v)
        except (TypeError, ValueError):
            out.append(None)
            bad += 1
    return pl.Series(out, dtype=dtype, strict=False), bad


def _cast(frame: pl.DataFrame, schema: Mapping[str, Any]) -> pl.DataFrame:
    exprs = []
    for name, dtype in schema.items():
        col = frame.get_column(name)
        if col.dtype == pl.Object:
            fixed, bad = _exact(col.to_list(), dtype)
            if bad:
                import warnings

                warnings.warn(
                    f"{bad} value(s) of column {name} are not {dtype} (text in a number column?): "
                    "read as null, not reinterpreted", TypeMismatchWarning, stacklevel=4,
                )
            exprs.append(pl.lit(fixed).alias(name))
        elif col.dtype == dtype:
            exprs.append(pl.col(name))
        elif col.dtype == pl.Null:
            exprs.append(pl.lit(None, dtype=dtype).alias(name))
        elif dtype == pl.Utf8 and col.dtype == pl.Binary:
            exprs.append(pl.col(name).cast(pl.Utf8, strict=False))
        else:
            exprs.append(pl.col(name).cast(dtype, strict=False))
    return frame.select(exprs)


_ROWID_BETWEEN = re.compile(r"\browid\s+BETWEEN\s+(-?\d+)\s+AND\s+(-?\d+)", re.IGNORECASE)
_ROWID_ABOVE = re.compile(r"\browid\s*>\s*(-?\d+)\s+AND\s+rowid\s*<=\s*(-?\d+)", re.IGNORECASE)


def _rowid_span(where: str) -> int:
    """The most rows a ``WHERE`` that bounds the rowid (``rowid BETWEEN a AND b``, ``rowid > a
    AND rowid <= b``, ANDed with the rest) can select; unbounded otherwise. A window's read
    (``gpu_metric_samples`` of a short window) was refused up front for the size of the whole
    table."""
    top = where
    while True:  # the conditions outside parentheses: those every selected row meets
        inner = re.sub(r"\([^()]*\)", " ", top)
        if inner == top:
            break
        top = inner
    span = 1 << 62
    if re.search(r"\bOR\b", top, re.IGNORECASE):  # an OR at the top level may select rows outside the range
        return span
    for m in _ROWID_BETWEEN.finditer(top):
        span = min(span, int(m.group(2)) - int(m.group(1)) + 1)
    for m in _ROWID_ABOVE.finditer(top):
        span = min(span, int(m.group(2)) - int(m.group(1)))
    return max(span, 0)


def prefetch_columns(db: ExportSource, table: str, columns: Collection[str]) -> None:
    """Put ``columns`` (INTEGER columns of ``table``, by their names in the export) in the
    column cache, as few scans as :data:`PREFETCH_SCAN_BYTES` allows, before a report reads
    them one at a time: on a cold run each of those reads was its own scan of the table (five
    scans of 2.5 M API calls for ``cuda_kern_exec_sum``, where one scan of the five columns
    costs 0.5 s of SQLite time instead of 0.85 s, and reads the table's pages once). Each
    column read is also held in memory until the report asks for it, which then costs no file
    read (cold ``cuda_kern_exec_sum`` on 1 M kernels: 1.10-1.39 -> 0.95-0.97 s, and no higher
    peak: the column is not allocated twice). Nothing is read when the cache is off, the table
    too small to be cached or the columns cached already; a scan that would not fit in memory
    is left to the report's own reads, which need less."""
    # held only while they are few bytes: on 30 M kernels and 76 M calls the held columns were
    # 0.4 GB more at the cold peak of the target stats command (3,350 -> 3,770 MB)
    hold = db.row_estimate(table) * 8 * len(columns) <= PREFETCH_HOLD_BYTES
    try:
        db.cache_integer_columns(table, columns, scan_bytes=PREFETCH_SCAN_BYTES, hold=hold)
    except TraceMemoryError as exc:
        log.debug("not prefetching %s of %s: %s", ", ".join(columns), table, exc)


def ensure_memory(path: Path, table: str, rows: int, columns: int, need: int, what: str = "reading") -> None:
    """Raise :class:`~tracekit.errors.TraceMemoryError` (one line naming the export, the
    table, its rows and columns and the ways around it) when ``need`` bytes exceed
    :func:`free_memory`. polars aborts the process when an allocation fails, so a step that
    cannot fit has to be refused before it starts."""
    free = free_memory()
    if free is not None and need > free:
        raise _out_of_memory(path, table, rows, columns, f"needs about {_gb(need)} and {_gb(free)} is left", what)


#: The GPU activity tables: a whole-trace view (the HTML report, ``diff``) holds a row of each.
GPU_OP_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
#: Tables whose rows tracekit holds as GPU operations: :data:`GPU_OP_TABLES` (what nsys's
#: ``cuda_gpu_trace`` lists) and the CUDA graph launches traced whole, which it does not list.
GPU_OP_ESTIMATE_TABLES = (*GPU_OP_TABLES, "CUPTI_ACTIVITY_KIND_GRAPH_TRACE")


def gpu_op_estimate(db: ExportSource) -> int:
    """Kernels, memcpys, memsets and CUDA graph launches traced whole of an export, without
    counting them (row estimates)."""
    return sum(db.row_estimate(t) for t in GPU_OP_ESTIMATE_TABLES if db.has_table(t))


def refuse_unless_fits(need: int, doing: str, instead: str) -> None:
    """Raise :class:`~tracekit.errors.TraceMemoryError`, one line ``"<doing> needs about N GB
    and M GB is left; <instead>"``, when ``need`` bytes exceed :func:`free_memory`: for a
    command that holds whole tables and would otherwise end in polars' abort."""
    free = free_memory()
    if free is not None and need > free:
        msg = f"{doing} needs about {need / 1e9:.1f} GB and {free / 1e9:.1f} GB is left; {instead}"
        raise TraceMemoryError(msg)


#: Address space glibc reserves for a thread's malloc arena (64-bit: 2 × 32 MB).
MALLOC_ARENA_BYTES = 64 << 20
#: The most threads one split read of this process has started (their arenas are kept).
_split_threads_started = [0]


def fill_budget(export_bytes: int) -> int:
    """Bytes of columns one cache-filling scan reads on an export of ``export_bytes``
    (:data:`CACHE_FILL_SHARE`, within :data:`CACHE_FILL_BYTES` … :data:`CACHE_FILL_MAX_BYTES`)."""
    return int(min(max(CACHE_FILL_BYTES, CACHE_FILL_SHARE * export_bytes), CACHE_FILL_MAX_BYTES))


def thread_start_bytes() -> int:
    """Address space a new thread can take: its stack and a malloc arena of its own."""
    return _thread_stack_bytes() + MALLOC_ARENA_BYTES


_reader = {"started": False}


def reader_start_bytes() -> int:
    """Address space :func:`start_reader` may take: 3 threads per pool thread + 2 (5 with a
    pool of 1, 8 with 2, measured), each with a stack and a malloc arena (+370 MB with a pool
    of 1, +586 MB with 2, measured; this gives 360 and 576 MB)."""
    return (3 * pl.thread_pool_size() + 2) * thread_start_bytes()


def start_reader() -> bool:
    """Start what polars' first IPC read starts (its thread pool, I/O threads and jemalloc's
    background threads: +370 MB of address space here, all at once), with a read of one
    value, so that the memory check before a cached column's read sees what is really left.
    Started inside the first real read under ``ulimit -v``, after the check had let it
    through, it aborted the process ("memory allocation of 384 bytes failed"). The CLI
    calls it at start-up (:func:`tracekit.cli.main.prepare_process`), where there is the most
    room; a cached read calls it again (nothing to do once started). Skipped when less than
    :func:`reader_start_bytes` is left, where starting them aborted too (``ulimit -v``
    0.8 GB): False then, and the cached read's check counts those bytes, so it refuses.
    (Started lazily, at the first cached read, some runs under ``ulimit -v`` aborted in it
    although the estimate said it fitted.)"""
    if _reader["started"]:
        return True
    free = free_memory()
    if free is not None and free <= reader_start_bytes():
        return False
    _reader["started"] = True
    import io

    try:
        buf = io.BytesIO()
        pl.DataFrame({"a": [0]}).write_ipc(buf)
        pl.read_ipc(io.BytesIO(buf.getvalue()))
    except BaseException as exc:  # polars' panics are BaseExceptions; the real read reports the problem
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        log.debug("starting polars' IPC reader failed: %s", exc)
    return True


def _thread_stack_bytes() -> int:
    """Address space a new thread's stack takes: ``threading.stack_size()`` when set, else
    the soft ``RLIMIT_STACK`` (glibc's default for new threads), else 8 MB."""
    import resource
    import threading

    size = threading.stack_size()
    if size:
        return size
    soft = resource.getrlimit(resource.RLIMIT_STACK)[0]
    return soft if 0 < soft != resource.RLIM_INFINITY and soft < 1 << 30 else 8 << 20


def _gb(n: int) -> str:
    return f"{n / 1e9:.2g} GB" if n >= 10**8 else f"{n / 1e6:.3g} MB"


def select_sql(table: str, exprs: Sequence[str], where: str = "", *, rowid_order: bool = False) -> str:
    """``SELECT exprs FROM "table" [WHERE where]`` with each expression under its own name
    (``_c0``, ``_c1`` …): the ADBC driver panics on an empty result whose columns share a name
    (``SELECT NULL, NULL`` of an old export's empty table); callers rename the frame to their
    schema anyway. ``rowid_order`` (SQLite only): ``NOT INDEXED``, so that the rows come in
    rowid order whatever index the export carries (SQLite answered a read of columns that an
    index holds from the index, in its order, and the columns of one table read apart no
    longer lined up); the rowid still finds rows by key."""
    named = ", ".join(f'{e} AS "_c{i}"' for i, e in enumerate(exprs))
    source = f'"{table}" NOT INDEXED' if rowid_order else f'"{table}"'
    return f"SELECT {named} FROM {source}" + (f" WHERE {where}" if where else "")


def _out_of_memory(path: Path, table: str, rows: int, columns: int, what: str, doing: str = "reading") -> TraceMemoryError:
    msg = (
        f"{path.name}: {doing} {table} ({rows:,} rows x {columns} column(s)) {what}; read fewer columns "
        "(trace.table(name, columns=[...])), one column at a time (trace.columns_on_demand(name, columns)), "
        "with the column cache on (TRACEKIT_COLUMN_CACHE, the default: cached columns come back one at a time), "
        "or on a machine with more memory"
    )
    return TraceMemoryError(msg)
