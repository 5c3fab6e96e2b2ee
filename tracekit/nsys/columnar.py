"""A folder that ``nsys export --type parquetdir`` or ``--type arrowdir`` wrote, read as an export.

nsys writes one file per export table — ``<TABLE>.parquet`` (Parquet) or ``<TABLE>.arrow``
(an Arrow IPC *stream*, not an IPC file) — with the columns and rows of the SQLite export's
table of the same name, in the same order (checked against nsys 2023.4's SQLite export of the
same report in ``tests/test_columnar.py``). :class:`ExportFolder` answers the questions the
readers of :mod:`tracekit.nsys.readers` ask an :class:`~tracekit.nsys.database.ExportDatabase`
(tables, columns, ``query_table``, small ``SELECT``s and ``PRAGMA table_info``), so every table,
report and analysis works on a folder as on the ``.sqlite`` file.

How it reads: each table is a polars ``LazyFrame`` — ``pl.scan_parquet`` for Parquet; for
Arrow streams (which polars cannot scan) an IO source that reads the stream one record batch
at a time and converts only the columns asked for. The SQL the readers write is run by polars'
own SQL engine over those frames, so only the referenced columns are read (projection
push-down) and ``WHERE`` filters reach the scan (predicate push-down). The SQLite idioms that
typed columns make unnecessary are rewritten first: :data:`~tracekit.nsys.readers.EXACT_INT`
(a cell that is text in an INTEGER column cannot exist in a typed file) becomes the column, and
``CAST(… AS INTEGER)`` becomes a 64-bit cast (polars' SQL ``INTEGER`` is 32-bit).

Differences from the SQLite export of the same report: nsys's columnar exports have no
``META_DATA_CAPTURE`` table (so ``meta.processes`` — the capture command — is empty), and
``META_DATA_EXPORT`` names the folder instead of the ``.sqlite`` file. There is no column
cache: the folder is columnar already. The folder is never written to.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import polars as pl

from tracekit.errors import TraceFormatError

#: File suffix → format name, as nsys names them.
SUFFIXES = {".parquet": "parquet", ".arrow": "arrow"}
#: Tables one of which every nsys export has (as :class:`~tracekit.nsys.trace.NsysTrace` checks).
MARKER_TABLES = ("StringIds", "ThreadNames", "TARGET_INFO_SESSION_START_TIME")


def folder_format(path: Path) -> str | None:
    """``"parquet"`` or ``"arrow"`` when ``path`` is a folder holding nsys's columnar export
    (a ``StringIds``, ``ThreadNames`` or ``TARGET_INFO_SESSION_START_TIME`` file), else None."""
    for suffix, fmt in SUFFIXES.items():
        if any((path / f"{t}{suffix}").is_file() for t in MARKER_TABLES):
            return fmt
    return None


def _declared(dtype: pl.DataType) -> str:
    """The SQLite type nsys declares for a column of this Arrow type."""
    if dtype.is_integer() or dtype == pl.Boolean:
        return "INTEGER"
    if dtype.is_float():
        return "REAL"
    if dtype == pl.Binary:
        return "BLOB"
    return "TEXT"


def _exact_int_pattern() -> re.Pattern[str]:
    from tracekit.nsys.readers import EXACT_INT

    # EXACT_INT with its {col} placeholders as one quoted name, the same name each time
    parts = [re.escape(p) for p in EXACT_INT.split("{col}")]
    pattern = parts[0] + r'(?P<col>"[^"]+")' + "(?P=col)".join(parts[1:])
    return re.compile(pattern)


_PRAGMA = re.compile(r'^\s*PRAGMA\s+table_info\(\s*"?([^")]+)"?\s*\)\s*$', re.IGNORECASE)
_INTEGER_CAST = re.compile(r"\bAS\s+INTEGER\s*\)", re.IGNORECASE)
_ROWID = re.compile(r"\browid\b", re.IGNORECASE)


class ExportFolder:
    """A read-only nsys ``parquetdir``/``arrowdir`` export folder with the query interface of
    :class:`~tracekit.nsys.database.ExportDatabase` (see the module docstring).

    Parameters
    ----------
    path
        The folder ``nsys export --type parquetdir`` (or ``arrowdir``) wrote.
    """

    engine = "columnar"
    column_cache = None

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        fmt = folder_format(self.path)
        if fmt is None:
            msg = (
                f"{self.path} is a folder but not an nsys parquetdir/arrowdir export (no StringIds.parquet "
                "or .arrow in it); pass the folder `nsys export --type parquetdir` wrote"
            )
            raise TraceFormatError(msg)
        self.format = fmt
        suffix = next(s for s, f in SUFFIXES.items() if f == fmt)
        self._files = {p.name[: -len(suffix)]: p for p in sorted(self.path.glob(f"*{suffix}")) if p.is_file()}
        self._schemas: dict[str, dict[str, pl.DataType]] = {}

    # -- files ----------------------------------------------------------------------
    def _damaged(self, table: str, exc: BaseException) -> TraceFormatError:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        msg = (
            f"{self._files.get(table, self.path)} could not be read ({first}); the export is truncated "
            f"or corrupt: export the report again with `nsys export --type {self.format}dir`"
        )
        return TraceFormatError(msg)

    def schema(self, table: str) -> dict[str, pl.DataType]:
        """Column names and polars dtypes of ``table`` as stored (empty when absent)."""
        if table not in self._files:
            return {}
        if table not in self._schemas:
            try:
                if self.format == "parquet":
                    schema = dict(pl.read_parquet_schema(self._files[table]))
                else:
                    import pyarrow as pa

                    with pa.OSFile(str(self._files[table])) as fh:
                        arrow_schema = pa.ipc.open_stream(fh).schema
                    schema = dict(pl.from_arrow(arrow_schema.empty_table()).schema)  # type: ignore[union-attr]
            except BaseException as exc:  # polars' Rust panics are BaseExceptions
                if isinstance(exc, KeyboardInterrupt | SystemExit | MemoryError):
                    raise
                raise self._damaged(table, exc) from None
            self._schemas[table] = schema
        return self._schemas[table]

    def scan(self, table: str) -> pl.LazyFrame:
        """``table`` as stored (nsys's column names and types), lazily: only the columns and
        rows a query asks for are read. Raises ``KeyError`` when the folder has no such table."""
        if table not in self._files:
            msg = f"{self.path.name} has no table {table!r}"
            raise KeyError(msg)
        if self.format == "parquet":
            return pl.scan_parquet(self._files[table])
        return _scan_arrow_stream(self._files[table], self.schema(table))

    def _mentioned(self, sql: str) -> list[str]:
        """The folder's tables that ``sql`` names (quoted or as a whole word)."""
        return [t for t in self._files if f'"{t}"' in sql or re.search(rf"(?<![\w\"]){re.escape(t)}(?![\w\"])", sql)]

    def _context(self, sql: str, rowid: bool) -> pl.SQLContext[Any]:
        """A SQL context with the tables ``sql`` names registered (each with a 1-based
        ``rowid`` column, as SQLite numbers the rows of an nsys export, when ``rowid``). Only
        those: an Arrow stream's schema is read when it is registered, so a damaged table must
        not stop queries of the others."""
        frames = {t: self.scan(t) for t in self._mentioned(sql)}
        if rowid:
            frames = {t: f.with_row_index("rowid", offset=1).with_columns(pl.col("rowid").cast(pl.Int64))
                      for t, f in frames.items()}
        return pl.SQLContext(frames)  # type: ignore[arg-type]

    def _sql(self, sql: str) -> pl.LazyFrame:
        """``sql`` (SQLite as the readers write it) as a polars lazy query over the folder."""
        sql = _exact_int().sub(lambda m: m.group("col"), sql)
        sql = _INTEGER_CAST.sub("AS BIGINT)", sql)
        try:
            return self._context(sql, bool(_ROWID.search(sql))).execute(sql, eager=False)
        except BaseException as exc:
            raise self._read_error(exc, sql) from None

    def _collect(self, lazy: pl.LazyFrame, sql: str) -> pl.DataFrame:
        try:
            return lazy.collect()
        except BaseException as exc:
            raise self._read_error(exc, sql) from None

    def _read_error(self, exc: BaseException, sql: str) -> BaseException:
        """What to raise for ``exc`` from running ``sql``: a damaged file is one
        :class:`TraceFormatError` naming it; SQL that polars cannot run, or a column that is not
        there, is tracekit's mistake (the readers ask which columns exist first) and is raised
        as it is, as are interrupts and ``MemoryError``."""
        ours = (pl.exceptions.SQLInterfaceError, pl.exceptions.SQLSyntaxError, pl.exceptions.ColumnNotFoundError)
        if isinstance(exc, (KeyboardInterrupt, SystemExit, MemoryError, TraceFormatError, *ours)):  # named already
            return exc
        table = next((t for t in sorted(self._files, key=len, reverse=True) if f'"{t}"' in sql or f" {t}" in sql), "")
        return self._damaged(table, exc)

    # -- the ExportDatabase interface ---------------------------------------------------
    def close(self) -> None:
        """Nothing to close (kept for the interface)."""

    def __enter__(self) -> ExportFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @cached_property
    def tables(self) -> frozenset[str]:
        """Names of the tables (one file each)."""
        return frozenset(self._files)

    def has_table(self, table: str) -> bool:
        """Whether ``table`` exists."""
        return table in self._files

    def columns(self, table: str) -> tuple[str, ...]:
        """Column names of ``table`` (empty when the table is absent)."""
        return tuple(self.schema(table))

    def has_column(self, table: str, column: str) -> bool:
        """Whether ``table`` exists and has ``column``."""
        return column in self.schema(table)

    def row_count(self, table: str) -> int:
        """Number of rows in ``table`` (0 when absent)."""
        if table not in self._files:
            return 0
        return int(self._collect(self.scan(table).select(pl.len()), f'"{table}"').item())  # names the file

    def row_estimate(self, table: str) -> int:
        """:meth:`row_count` (Parquet and Arrow files say how many rows they hold)."""
        return self.row_count(table)

    def is_rowid_table(self, table: str) -> bool:
        """False: no rowid index to bisect (a ``WHERE`` on a column reaches the scan instead)."""
        return False

    def caches(self, table: str) -> bool:
        """True when ``table`` exists: one column reads on its own (what the column cache gives
        a SQLite export), so pipelines read columns one at a time. For an Arrow stream each
        such read passes over the file again, which costs less than holding every column
        (cuda_kern_exec_sum on 1 M kernels: 591 -> 524 MB peak, same time)."""
        return table in self._files

    def all_cached(self, table: str, exprs: Sequence[str]) -> bool:
        """As :meth:`caches`."""
        return self.caches(table)

    def cache_integer_columns(
        self, table: str, only: Collection[str] | None = None, *, scan_bytes: int | None = None, hold: bool = False
    ) -> bool:
        """As :meth:`caches` (nothing to fill: the folder is columnar already)."""
        return self.caches(table)

    def derived_column(self, table: str, key: str, make: Callable[[], pl.Series]) -> pl.Series:
        """``make()``: a folder has no column cache to keep derived columns in."""
        return make()

    def query(self, sql: str, schema: Mapping[str, pl.DataType | type[pl.DataType]]) -> pl.DataFrame:
        """Run ``sql`` and return a frame cast to ``schema`` (same names, same order)."""
        from tracekit.nsys.database import _cast

        frame = self._collect(self._sql(sql), sql)
        frame.columns = list(schema)
        return _cast(frame, schema)

    def query_table(
        self,
        table: str,
        exprs: Sequence[str],
        schema: Mapping[str, pl.DataType | type[pl.DataType]],
        where: str = "",
    ) -> pl.DataFrame:
        """``SELECT exprs FROM table [WHERE where]`` cast to ``schema``, in file order."""
        from tracekit.nsys.database import select_sql

        return self.query(select_sql(table, exprs, where), schema)

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        """All rows of ``sql`` as tuples (``PRAGMA table_info`` answered from the file's schema)."""
        pragma = _PRAGMA.match(sql)
        if pragma:
            return [(i, name, _declared(dtype), 0, None, 0) for i, (name, dtype) in enumerate(self.schema(pragma.group(1)).items())]
        return self._collect(self._sql(sql), sql).rows()

    def scalar(self, sql: str) -> Any:
        """First column of the first row of ``sql`` (``None`` when no row)."""
        rows = self.rows(sql)
        return rows[0][0] if rows else None

    def key_values(self, table: str) -> dict[str, str]:
        """A ``(name, value)`` table such as ``META_DATA_EXPORT`` as a dict (empty when absent)."""
        if not {"name", "value"} <= set(self.columns(table)):
            return {}
        rows = self.rows(f'SELECT name, value FROM "{table}"')
        return {str(k): "" if v is None else str(v) for k, v in rows}


_EXACT: list[re.Pattern[str]] = []


def _exact_int() -> re.Pattern[str]:
    if not _EXACT:
        _EXACT.append(_exact_int_pattern())
    return _EXACT[0]


#: Rows of an Arrow stream's record batches handed on together.
ARROW_GROUP_ROWS = 1_000_000


def _scan_arrow_stream(path: Path, schema: Mapping[str, pl.DataType]) -> pl.LazyFrame:
    """An Arrow IPC stream file as a LazyFrame: read one record batch at a time, converting only
    the projected columns and filtering each batch by the pushed-down predicate. The file is
    read, never memory-mapped (a file truncated underneath must not crash the process)."""
    from polars.io.plugins import register_io_source

    def source(
        with_columns: list[str] | None, predicate: pl.Expr | None, n_rows: int | None, batch_size: int | None
    ) -> Iterator[pl.DataFrame]:
        import pyarrow as pa

        left = n_rows  # raw rows still to read: ``head(n).filter(...)`` cuts before it filters
        group: list[pl.DataFrame] = []
        rows = 0
        with pa.OSFile(str(path)) as fh:
            for batch in pa.ipc.open_stream(fh):
                if left is not None:
                    if left <= 0:
                        break
                    batch = batch.slice(0, left)
                    left -= batch.num_rows
                if with_columns is not None and not with_columns:
                    # no column asked for (``count(*)``, the unused side of a cross join): the
                    # rows still count, and a batch of no columns would have none
                    frame = pl.DataFrame(height=batch.num_rows)
                else:
                    if with_columns is not None and len(with_columns) < len(schema):
                        # copies of the selected columns: a column sliced from the batch would keep
                        # the batch's whole message body (every column) alive (1 M kernels, 2 of 28
                        # columns: 372 -> 155 MB peak)
                        batch = pa.record_batch(
                            [pa.concat_arrays([batch.column(c)]) for c in with_columns], names=with_columns
                        )
                    converted = pl.from_arrow(batch)
                    assert isinstance(converted, pl.DataFrame)  # noqa: S101 - a record batch gives a frame
                    frame = converted
                if predicate is not None:
                    frame = frame.filter(predicate)
                group.append(frame)
                rows += frame.height
                if rows >= ARROW_GROUP_ROWS:
                    yield pl.concat(group, rechunk=False)
                    group, rows = [], 0
        if group:
            yield pl.concat(group, rechunk=False)

    return register_io_source(io_source=source, schema=dict(schema))
