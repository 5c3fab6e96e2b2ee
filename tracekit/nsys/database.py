"""Read-only access to an Nsight Systems SQLite export, returning Arrow/polars data.

The file is opened with ``mode=ro&immutable=1`` so that neither tracekit nor SQLite ever
writes to it (no journal, no WAL, no locks). Queries go through the ADBC SQLite driver when
it is installed (fast, columnar) and through the standard-library ``sqlite3`` module
otherwise, or when ADBC cannot type a column (for example a column whose first rows are
NULL and later rows text). Every result is cast to the caller's schema, so the two paths
give identical frames.
"""

from __future__ import annotations

import logging
import sqlite3
import urllib.parse
import weakref
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

import polars as pl

from tracekit.errors import TraceFormatError

log = logging.getLogger(__name__)

def _adbc_available() -> bool:
    # importing the driver pulls in pyarrow.dataset (~1.5 s): only look for it here
    import importlib.util

    try:
        return importlib.util.find_spec("adbc_driver_sqlite") is not None
    except (ImportError, ValueError):
        return False


def _uri(path: Path) -> str:
    quoted = urllib.parse.quote(str(path.resolve()))
    return f"file:{quoted}?mode=ro&immutable=1"


class ExportDatabase:
    """A read-only Nsight Systems SQLite export.

    Parameters
    ----------
    path
        The ``.sqlite`` file.
    engine
        ``"auto"`` (ADBC when installed, else sqlite3), ``"adbc"`` or ``"sqlite3"``.
    """

    def __init__(self, path: str | Path, *, engine: str = "auto") -> None:
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
        self._adbc_conn: Any = None
        self._check_readable()

    # -- connections -------------------------------------------------------------
    def _stdlib(self) -> sqlite3.Connection:
        if self._sqlite is None:
            self._sqlite = sqlite3.connect(_uri(self.path), uri=True, check_same_thread=False)
            self._sqlite.text_factory = lambda b: b.decode("utf-8", errors="replace")
            # traces opened in notebooks are rarely closed: close with the object
            weakref.finalize(self, self._sqlite.close)
        return self._sqlite

    def _adbc_connection(self) -> Any:
        if self._adbc_conn is None:
            import adbc_driver_sqlite.dbapi as adbc

            self._adbc_conn = adbc.connect(_uri(self.path))
            weakref.finalize(self, self._adbc_conn.close)
        return self._adbc_conn

    def close(self) -> None:
        """Close open connections (the object can be used again; it reopens lazily)."""
        if self._sqlite is not None:
            self._sqlite.close()
            self._sqlite = None
        if self._adbc_conn is not None:
            self._adbc_conn.close()
            self._adbc_conn = None

    def __enter__(self) -> ExportDatabase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_readable(self) -> None:
        try:
            self._stdlib().execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.DatabaseError as exc:
            msg = (
                f"{self.path} is not a readable SQLite database ({exc}); it may be truncated "
                "or corrupt: export the report again with `nsys export --type sqlite`"
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

    # -- queries ---------------------------------------------------------------------
    def query(self, sql: str, schema: Mapping[str, pl.DataType | type[pl.DataType]]) -> pl.DataFrame:
        """Run ``sql`` and return a frame cast to ``schema`` (same names, same order).

        The query's result columns must come in the order of ``schema``.
        """
        if self.engine == "adbc":
            try:
                return self._query_adbc(sql, schema)
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

    def _query_adbc(self, sql: str, schema: Mapping[str, Any]) -> pl.DataFrame:
        cur = self._adbc_connection().cursor()
        try:
            cur.execute(sql)
            table = cur.fetch_arrow_table()
        finally:
            cur.close()
        # one contiguous chunk per column: later joins and group-bys are faster (measured)
        frame = pl.from_arrow(table, rechunk=True)
        assert isinstance(frame, pl.DataFrame)
        frame.columns = list(schema)
        return _cast(frame, schema)

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


def _cast(frame: pl.DataFrame, schema: Mapping[str, Any]) -> pl.DataFrame:
    exprs = []
    for name, dtype in schema.items():
        col = frame.get_column(name)
        if col.dtype == dtype:
            exprs.append(pl.col(name))
        elif col.dtype == pl.Null:
            exprs.append(pl.lit(None, dtype=dtype).alias(name))
        elif dtype == pl.Utf8 and col.dtype == pl.Binary:
            exprs.append(pl.col(name).cast(pl.Utf8, strict=False))
        else:
            exprs.append(pl.col(name).cast(dtype, strict=False))
    return frame.select(exprs)
