"""``NsysTrace.scan(name)``: a trace table as a polars ``LazyFrame``.

The frame is a polars IO source (:func:`polars.io.plugins.register_io_source`). When the query
is collected, polars tells the source which columns the query needs (projection push-down) and
which rows it keeps (predicate push-down); the source then reads only the raw export columns
that those table columns are built from, with the same readers as the eager tables (so a
scanned table equals the eager one, column for column), and filters what it read before
anything else in the query sees it.

- nsys ``parquetdir``/``arrowdir`` folders (:mod:`tracekit.nsys.columnar`): the six event
  tables (``kernels``, ``memcpys``, ``memsets``, ``syncs``, ``cuda_api``, ``nvtx``) are read in
  windows of :data:`SCAN_BATCH_ROWS` raw rows (a ``LIMIT … OFFSET`` that reaches the Parquet
  scan), each window built, filtered and handed on before the next is read: what a selective
  query holds at a time is one window's needed columns, not the table. (``nvtx`` with its
  ``domain`` column is read whole: a domain's name comes from its create row, anywhere in
  the table.)
- SQLite exports: the needed columns are read whole (through the column cache for large
  tables, :mod:`tracekit.nsys.column_cache`), then filtered.
- ``gpu_metrics`` (often the largest table) is read in windows of
  :data:`tracekit.nsys.gpu_metrics.WINDOW_ROWS` raw samples from either kind of export (rowid
  ranges of SQLite, row slices of a folder); a filter on ``metric``, ``metric_label`` or
  ``device_id`` leaves the other metrics' samples out of the read itself.
- The small tables (``gpus``, ``processes``, ``threads``, ``memory_usage``) are built whole,
  then projected and filtered.

A table already built eagerly is served from memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import polars as pl

from tracekit.nsys import readers
from tracekit.nsys import schema as S
from tracekit.nsys.columnar import ExportFolder
from tracekit.nsys.database import select_sql
from tracekit.nsys.gpu_metrics import gpu_metric_windows
from tracekit.nsys.nvtx import nvtx

if TYPE_CHECKING:
    from tracekit.nsys.trace import NsysTrace

#: Raw rows per window when a folder's event table is scanned.
SCAN_BATCH_ROWS = 1_000_000

#: The event tables' raw source and reader (``reader(db, strings, columns)``).
_EVENT_READERS: dict[str, tuple[str, Callable[[Any, pl.DataFrame, Sequence[str]], pl.DataFrame]]] = {
    "kernels": ("CUPTI_ACTIVITY_KIND_KERNEL", readers.kernels),
    "memcpys": ("CUPTI_ACTIVITY_KIND_MEMCPY", lambda db, _s, cols: readers.memcpys(db, cols)),
    "memsets": ("CUPTI_ACTIVITY_KIND_MEMSET", lambda db, _s, cols: readers.memsets(db, cols)),
    "syncs": ("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", lambda db, _s, cols: readers.syncs(db, cols)),
    "graph_trace": ("CUPTI_ACTIVITY_KIND_GRAPH_TRACE", lambda db, _s, cols: readers.graph_trace(db, cols)),
    "cuda_api": ("CUPTI_ACTIVITY_KIND_RUNTIME", readers.cuda_api),
    "nvtx": ("NVTX_EVENTS", nvtx),
}


class _Window:
    """An :class:`ExportFolder` whose ``query_table`` of one table returns only rows
    ``[offset, offset + length)`` (everything else is the folder's)."""

    def __init__(self, folder: ExportFolder, table: str, offset: int, length: int) -> None:
        self._folder, self._table, self._offset, self._length = folder, table, offset, length

    def __getattr__(self, name: str) -> Any:
        return getattr(self._folder, name)

    def query_table(self, table: str, exprs: Sequence[str], schema: Any, where: str = "") -> pl.DataFrame:
        if table != self._table:
            return self._folder.query_table(table, exprs, schema, where)
        sql = select_sql(table, exprs, where)
        return self._folder.query(f"{sql} LIMIT {self._length} OFFSET {self._offset}", schema)


def scan(trace: NsysTrace, name: str) -> pl.LazyFrame:
    """Table ``name`` of ``trace`` (one of ``docs/tables.md``'s tables) as a ``LazyFrame`` with
    the documented schema (see the module docstring for what is pushed down where)."""
    if name not in S.TABLES:
        msg = f"unknown table {name!r}; choose one of {', '.join(sorted(S.TABLES))}"
        raise KeyError(msg)
    schema = dict(S.TABLES[name])

    def source(
        with_columns: list[str] | None, predicate: pl.Expr | None, n_rows: int | None, batch_size: int | None
    ) -> Iterator[pl.DataFrame]:
        out = list(with_columns) if with_columns is not None else list(schema)
        needed = set(out) | (set(predicate.meta.root_names()) if predicate is not None else set())
        columns = [c for c in schema if c in needed] or out[:1] or list(schema)[:1]
        # polars hands over ``n_rows`` with a predicate only for ``head(n).filter(...)``: the
        # first n rows of the table, then filtered; the read may not filter before the cut
        left = n_rows
        for frame in _frames(trace, name, columns, predicate if n_rows is None else None):
            if left is not None:
                frame = frame.head(left)
                left -= frame.height
            if predicate is not None:
                frame = frame.filter(predicate)
            # no column asked for (``count(*)``, the unused side of a cross join): the rows still
            # count; a frame selected down to no columns would have none
            yield frame.select(out) if out else pl.DataFrame(height=frame.height)
            if left is not None and left <= 0:
                return

    return register(source, schema, name)


def register(source: Callable[..., Iterator[pl.DataFrame]], schema: dict[str, Any], name: str) -> pl.LazyFrame:
    from polars.io.plugins import register_io_source

    return register_io_source(io_source=source, schema=schema, explain_name=f"tracekit {name}")


def _frames(trace: NsysTrace, name: str, columns: list[str], predicate: pl.Expr | None) -> Iterator[pl.DataFrame]:
    """``columns`` of table ``name``, in one frame or in windows of raw rows (folders; and
    ``gpu_metrics`` of any export, whose windows leave out the metrics ``predicate`` rejects)."""
    db = trace.db
    if name == "gpu_metrics" and not trace.is_loaded(name):
        for frame in gpu_metric_windows(db, predicate):
            yield frame.select(columns)
        return
    # an nvtx domain's name comes from its create row, anywhere in the table: not windowed
    whole_nvtx = name == "nvtx" and "domain" in columns
    if trace.is_loaded(name) or name not in _EVENT_READERS or not isinstance(db, ExportFolder) or whole_nvtx:
        yield trace.table(name, columns)
        return
    table, reader = _EVENT_READERS[name]
    rows = db.row_count(table)
    if rows == 0:
        yield trace.table(name, columns)
        return
    strings = trace.strings if name in ("kernels", "cuda_api", "nvtx") else pl.DataFrame()
    for offset in range(0, rows, SCAN_BATCH_ROWS):
        yield reader(_Window(db, table, offset, SCAN_BATCH_ROWS), strings, columns)
