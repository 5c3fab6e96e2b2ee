"""Readers that turn the export's raw tables into tidy frames (one function per table).

Each reader asks the file which tables and columns exist, selects only those it needs
(absent optional columns become NULL), decodes packed ids and enum codes, resolves string
ids, and returns a frame with the documented schema of :mod:`tracekit.nsys.schema`.

The readers of the large tables (kernels, memcpys, memsets, syncs, cuda_api, nvtx) take
``columns``: a subset of the documented columns. They then read only the raw columns those
depend on and return just them, in schema order (reading two columns of a 1M-kernel export
instead of twenty-five is several times faster and uses a fraction of the memory).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from tracekit.errors import DamagedRowsWarning
from tracekit.nsys import enums
from tracekit.nsys import schema as S
from tracekit.nsys.database import (
    ExportSource,
    InvalidTextWarning,
    TypeMismatchWarning,
    ensure_memory,
    select_sql,
)

PID_MASK = 0xFFFFFF
PROCESS_KEY_MASK = -0x1000000  # == 0xFFFFFFFFFF000000 as a signed 64-bit mask


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Col:
    """One selected column: ``target`` name, ``source`` column in the file, dtype."""

    target: str
    source: str | None
    dtype: pl.DataType | type[pl.DataType] = pl.Int64
    sql: str | None = None  # expression over ``source`` ({col} is replaced), e.g. a CAST


def select(db: ExportSource, table: str, cols: Sequence[Col], where: str = "") -> pl.DataFrame:
    """``SELECT`` the present ``cols`` of ``table``; absent ones come back as NULL.

    Text columns are read as bytes and decoded (:func:`decode_text`): SQLite hands over TEXT
    cells as they are stored, and invalid UTF-8 in an Arrow string column made polars panic
    later (``summary`` on an NVTX ``text`` with a stray 0xFF byte)."""
    present = set(db.columns(table))
    schema = {c.target: c.dtype for c in cols}
    if not present:
        return pl.DataFrame(schema=schema)
    if not where and not any(c.source in present for c in cols):
        # only absent columns: ``SELECT NULL FROM t`` gives one row in polars' SQL (an nsys
        # columnar export, a converted Kineto trace), not one per row of the table
        n = db.row_count(table)
        return pl.DataFrame([pl.Series(c.target, [None] * n, dtype=c.dtype) for c in cols])
    exprs, read_as, text = _read_plan(cols, present)
    return _decoded(db, table, db.query_table(table, exprs, read_as, where), text)


def _read_plan(cols: Sequence[Col], present: Collection[str]) -> tuple[list[str], dict[str, Any], list[str]]:
    """The SQL expressions of ``cols`` (present text columns cast to bytes), the schema they
    are read with, and the text columns to decode after (:func:`_decoded`)."""
    text = [c.target for c in cols if c.dtype == pl.Utf8 and c.sql is None and c.source in present]
    as_bytes = [Col(c.target, c.source, pl.Binary, "CAST({col} AS BLOB)") if c.target in text else c for c in cols]
    return _sql_exprs(as_bytes, present), {c.target: c.dtype for c in as_bytes}, text


def _decoded(db: ExportSource, table: str, frame: pl.DataFrame, text: Sequence[str]) -> pl.DataFrame:
    """``frame`` with its ``text`` columns, read as bytes, decoded (:func:`decode_text`)."""
    if not text:
        return frame
    return frame.with_columns(decode_text(frame.get_column(c), f"{db.path.name}: {table}.{c}") for c in text)


def decode_text(values: pl.Series, where: str) -> pl.Series:
    """Bytes → text as UTF-8; values that are not valid UTF-8 are decoded with U+FFFD
    replacing the bad bytes, after one :class:`InvalidTextWarning` that counts them (``where``
    names the column). The exact bytes stay in the export."""
    try:
        return values.cast(pl.Utf8)
    except pl.exceptions.ComputeError:  # some value is not valid UTF-8: decode each, lossily
        raw = values.to_list()
        decoded = [b.decode("utf-8", errors="replace") if b is not None else None for b in raw]
        bad = sum(1 for b in raw if b is not None and not _is_utf8(b))
        msg = f"{where}: {bad} value(s) are not valid UTF-8; decoded with replacement characters (U+FFFD)"
        warnings.warn(msg, InvalidTextWarning, stacklevel=3)
        return pl.Series(values.name, decoded, dtype=pl.Utf8)


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _sql_exprs(cols: Sequence[Col], present: Collection[str]) -> list[str]:
    parts = []
    for col in cols:
        if col.source is not None and col.source in present:
            quoted = f'"{col.source}"'
            parts.append(col.sql.format(col=quoted) if col.sql else quoted)
        else:
            parts.append("NULL")
    return parts


class TableColumns:
    """Some columns of one export table, read one at a time when asked for: a stand-in for a
    frame (``columns``, ``frame[name]``) where a pipeline needs a few rows of several huge
    columns, e.g. the API calls that launched each kernel. A column comes from the column
    cache (or, the first time, from its own scan of the export, which fills the cache) and is
    not kept (the last one read is), so only one is in memory at a time. With the cache off
    (or a table too small for it) the first access reads them all in one scan and keeps them.
    """

    def __init__(self, db: ExportSource, table: str, cols: Sequence[Col]) -> None:
        self._db, self._table, self._cols = db, table, {c.target: c for c in cols}
        self._frame: pl.DataFrame | None = None
        self._last: tuple[str, pl.Series] | None = None

    @property
    def columns(self) -> list[str]:
        return list(self._cols)

    def __getitem__(self, name: str) -> pl.Series:
        if self._frame is not None:
            return self._frame[name]
        if self._last is not None and self._last[0] == name:
            return self._last[1]
        if not self._db.caches(self._table):  # no column cache: one scan of all, kept
            self._frame = select(self._db, self._table, list(self._cols.values()))
            return self._frame[name]
        # one column per read (a scan of SQLite that fills the cache, or the cached file): a
        # scan of all of them at once held every column twice over while it was read (cold
        # nvtx_gpu_proj_trace on 2.5 M calls: ~0.15 GB), for ~0.2 s less SQLite time per column;
        # the column kept from the last read is let go first, not held while this one is read
        self._last = None
        column = select(self._db, self._table, [self._cols[name]]).to_series()
        self._last = (name, column)
        return column

    def gather_columns(self, names: Sequence[str], rows: pl.Series) -> list[pl.Series]:
        """``self[name].gather(rows)`` for each name, one column after the other (so one whole
        column is in memory at a time; reading cached columns on two threads saved no time).

        Each gather is checked first (:func:`~tracekit.nsys.database.ensure_memory`): its
        result (16 bytes a row for a string, a view, else 8) twice over, since polars aborts
        the process when the allocation fails (warm diagnose's launch join on 300 k kernels
        with 150 MB of address space left: SIGABRT in the gather)."""
        out = []
        for name in names:
            column = self[name]
            width = 16 if column.dtype in (pl.String, pl.Binary) else 8
            ensure_memory(self._db.path, self._table, len(rows), 1, 2 * width * len(rows), "gathering rows of")
            out.append(column.gather(rows))
        return out


def wanted_columns(table: str, columns: Collection[str] | None) -> list[str]:
    """The documented columns of ``table`` to build: all of them, or ``columns`` in schema order.

    Raises ``KeyError`` naming the unknown ones.
    """
    if columns is None:
        return list(S.TABLES[table])
    schema = S.columns_of(table)
    unknown = sorted(set(columns) - set(schema))
    if unknown:
        msg = f"{table} has no column {', '.join(map(repr, unknown))}; its columns are {', '.join(schema)}"
        raise KeyError(msg)
    return [c for c in schema if c in columns]  # documented order, then the on-request columns


def read_projected(
    db: ExportSource,
    source: str,
    table: str,
    raw: Sequence[Col],
    derived: Mapping[str, pl.Expr],
    wanted: Sequence[str],
    where: str = "",
    direct: Mapping[str, Col] | None = None,
) -> pl.DataFrame:
    """Read the ``raw`` columns of ``source`` that ``wanted`` needs, add the ``derived``
    columns among ``wanted`` (each an expression over raw columns), and return ``wanted``
    with the documented dtypes of ``table``.

    ``direct`` gives SQL for derived columns that SQLite can compute (``duration_ns`` as
    ``"end" - "start"``); it is used when nothing else needs that column's inputs, so one
    column is read instead of two.
    """
    exprs = {name: expr for name, expr in derived.items() if name in wanted}
    shortcuts = []
    for name, col in (direct or {}).items():
        if name not in exprs:
            continue
        others = (set(wanted) - {name}) | {r for n, e in exprs.items() if n != name for r in e.meta.root_names()}
        if not set(exprs[name].meta.root_names()) & others:
            del exprs[name]
            shortcuts.append(col)
    needed = set(wanted) | {root for expr in exprs.values() for root in expr.meta.root_names()}
    frame = select(db, source, [c for c in raw if c.target in needed] + shortcuts, where)
    for col in shortcuts:  # NULL only where a start or end is not an integer: say so
        lost = frame.get_column(col.target).null_count()
        if lost:
            msg = (
                f"{db.path.name}: {source}: {lost:,} {col.target} cell(s) not computed: start or end is not "
                "an integer (a damaged export); read as null"
            )
            warnings.warn(msg, TypeMismatchWarning, stacklevel=3)
    # the derived columns, then the casts to the documented dtypes: each a new column (16
    # bytes a row for a string, a view, else 8) and as much again that its expression works
    # in (a name lookup, a code map), plus an 8-byte column to spare; checked first, since
    # polars aborts the process when one of them cannot be allocated (warm diagnose on
    # 300 k kernels with 40-60 MB of address space left: SIGABRT here; counting 8 bytes a
    # row for the names, 60 MB still did)
    if exprs:
        out = frame.lazy().select(**exprs).collect_schema()  # the dtypes only: nothing computed
        width = sum(16 if dtype in (pl.String, pl.Binary) else 8 for dtype in out.values())
        need = (2 * width + 8) * frame.height
        ensure_memory(db.path, source, frame.height, len(exprs), need, "deriving columns of")
        frame = frame.with_columns(**exprs)
    documented = S.columns_of(table)
    casts = sum(n in documented and (n not in frame.columns or frame.schema[n] != documented[n]) for n in wanted)
    if casts:
        ensure_memory(db.path, source, frame.height, casts, (casts + 1) * frame.height * 8, "converting")
    return one_value_columns(S.conform(frame, table, wanted))


#: Tables from this many rows on hold a column of a single value as that value (polars'
#: scalar column) rather than a row each: below it the saving is a few kilobytes.
ONE_VALUE_FROM_ROWS = 1 << 14
_ONE_VALUE_DTYPES = (pl.Int8, pl.Int16, pl.Int32, pl.Int64, pl.UInt8, pl.UInt16, pl.UInt32, pl.UInt64, pl.String, pl.Boolean)


def one_value_columns(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with each column whose rows all hold one value, or are all null, held as
    that value once (same values, dtypes and order). On one GPU and one thread the process,
    thread, device and context ids are such columns, and so are a table's unused fields
    (NVTX payloads, domains): a million NVTX ranges held ~60 MB of them. A column someone
    takes out as a Series (``frame["pid"]``) becomes a row each again, as before.

    Integer, string and boolean columns, and all-null columns of any type; frames from
    :data:`ONE_VALUE_FROM_ROWS` rows on."""
    if frame.height < ONE_VALUE_FROM_ROWS or frame.width == 0:
        return frame
    n = frame.height
    nulls = dict(zip(frame.columns, frame.null_count().row(0), strict=True))
    one = [pl.lit(None, t).alias(c) for c, t in frame.schema.items() if nulls[c] == n]
    # of the others without a null, those whose least and greatest values are equal (by
    # expressions, not Series: a column that is one value already stays so while measured)
    cols = [c for c, t in frame.schema.items() if nulls[c] == 0 and t in _ONE_VALUE_DTYPES]
    if cols:
        bounds = frame.select(*(pl.col(c).min().alias(f"a{i}") for i, c in enumerate(cols)),
                              *(pl.col(c).max().alias(f"b{i}") for i, c in enumerate(cols))).row(0)
        one += [pl.lit(lo, frame.schema[c]).alias(c) for c, lo, hi in zip(cols, bounds, bounds[len(cols):], strict=False)
                if lo is not None and lo == hi]
    return frame.with_columns(one) if one else frame


#: How far past the latest start of a table an end may lie, at least (the table's own span
#: of starts counts too): one hour. INT64_MAX or a flipped high bit lands far beyond.
END_SLACK_NS = 3_600 * 10**9


def implausible_end(start: str = "start_ns", end: str = "end_ns") -> pl.Expr:
    """True for rows whose ``end`` lies past the latest ``start`` of the frame by more than
    the frame's span of starts and at least :data:`END_SLACK_NS` (a damaged export: one
    ``INT64_MAX`` end made summaries report 9.2e15 ms of GPU time); False where unknown."""
    s = pl.col(start)
    bound = s.max() + pl.max_horizontal(s.max() - s.min(), pl.lit(END_SLACK_NS))
    return (pl.col(end) > bound).fill_null(False)


def pid_from_global(expr: pl.Expr) -> pl.Expr:
    """The process id bits of a ``globalTid``/``globalPid``."""
    return (expr // 0x1000000) % 0x1000000


def tid_from_global(expr: pl.Expr) -> pl.Expr:
    """The thread id bits of a ``globalTid``."""
    return expr % 0x1000000


def lookup_strings(expr: pl.Expr, strings: pl.DataFrame) -> pl.Expr:
    """Map ``StringIds`` ids (integers) to their text (unknown ids → null); the result keeps
    ``expr``'s name. nsys numbers its strings 0, 1, 2 …: then each text is taken by position, which needs
    no hash table of the whole ``StringIds`` (300 k strings: ~30 MB for each lookup); other
    ids go through a ``replace_strict``."""
    ids = strings["id"]
    n = strings.height
    try:
        name = expr.meta.output_name()
    except Exception:  # noqa: BLE001 - a name polars cannot tell without the frame
        name = None
    # 0, 1, 2 …: no null, each id one more than the one before
    dense = (name is not None and n > 0 and ids.dtype.is_integer() and ids.null_count() == 0
             and (n == 1 or bool((ids.diff().slice(1) == 1).all())))
    if not dense:
        return expr.replace_strict(ids, strings["value"], default=None, return_dtype=pl.Utf8)
    at = expr.cast(pl.Int64, strict=False) - int(ids[0])  # an id that is no integer: null, as replace_strict gives
    text = pl.lit(strings["value"].cast(pl.Utf8)).gather(at.clip(0, n - 1))
    return pl.when((at >= 0) & (at < n)).then(text).otherwise(pl.lit(None, pl.Utf8)).alias(name)


def canonical_string_ids(expr: pl.Expr, strings: pl.DataFrame) -> pl.Expr:
    """Map ``StringIds`` ids to the smallest id with the same text (unknown ids → null), so
    that grouping by the result groups by text: 8-byte keys instead of the strings."""
    first = strings.group_by("value").agg(pl.col("id").min().alias("first"))
    canon = strings.join(first, on="value", how="left", nulls_equal=True)
    return expr.replace_strict(canon["id"], canon["first"], default=None, return_dtype=pl.Int64)


def string_ids(db: ExportSource) -> pl.DataFrame:
    """The ``StringIds(id, value)`` table.

    Values are read as bytes and decoded as UTF-8; a value that is not valid UTF-8 (a damaged
    export, a name from a non-UTF-8 locale) is decoded with U+FFFD replacing the bad bytes
    (the exact bytes stay in the export: ``SELECT CAST(value AS BLOB) FROM StringIds WHERE
    id = …``). Reading them as text would hand invalid UTF-8 to Arrow and crash later.
    An id that appears twice (damage: it is the table's key) keeps its first text, with one
    :class:`~tracekit.errors.DamagedRowsWarning`. An export without the table (damaged: nsys always writes it) gets one
    :class:`~tracekit.errors.DamagedRowsWarning`, since every name would come back empty.
    """
    if not db.has_table("StringIds"):
        users = [t for t in _NAMED_TABLES if db.has_table(t)]
        if users:
            msg = (f"{db.path.name}: the export has no StringIds table, so the names in {', '.join(users)} "
                   "are empty; export the report again (nsys export --type sqlite)")
            warnings.warn(msg, DamagedRowsWarning, stacklevel=3)
    return _one_text_per_id(db, select(db, "StringIds", _STRING_COLS))


def string_ids_of(db: ExportSource, ids: pl.Series) -> pl.DataFrame:
    """The ``StringIds(id, value)`` rows of ``ids`` (integers; nulls, repeats and other values
    ignored; an id the table lacks has no row), in id order, looked up by the table's key when
    it has one (:func:`strings_keyed`; else the whole table, :func:`string_ids`): 40 k names of a
    300 k-row table in half the time of reading it all. Values are decoded as
    :func:`string_ids` decodes them; a value not read is not checked (no warning for it)."""
    if not strings_keyed(db):
        return string_ids(db)
    wanted = ids.cast(pl.Int64, strict=False).drop_nulls().unique().sort()
    if wanted.len() == 0:
        return pl.DataFrame(schema={c.target: c.dtype for c in _STRING_COLS})
    exprs, read_as, text = _read_plan(_STRING_COLS, db.columns("StringIds"))
    where = f'"id" IN ({",".join(map(str, wanted.to_list()))})'
    # one query: split in rowid slices on threads, each slice scanned its half of the table
    # for the keys (0.07 s against 0.03 for 40 k of 300 k). The key is the rowid: one row per
    # id looked up, so no repeated id to set apart (as string_ids must)
    return _decoded(db, "StringIds", db.query(select_sql("StringIds", exprs, where), read_as), text)


def strings_keyed(db: ExportSource) -> bool:
    """Whether ``StringIds.id`` is the table's ``INTEGER PRIMARY KEY`` (as nsys writes it): its
    rows can be looked up by id, and every id is an integer held once."""
    if not db.has_table("StringIds"):
        return False
    return any(str(r[1]) == "id" and str(r[2]).upper() == "INTEGER" and int(r[5]) == 1
               for r in db.rows('PRAGMA table_info("StringIds")'))


_STRING_COLS = [Col("id", "id"), Col("value", "value", pl.Utf8)]
#: The SQL expressions :func:`string_ids` reads (its column-cache keys).
STRING_EXPRS = tuple(_read_plan(_STRING_COLS, ("id", "value"))[0])


def _one_text_per_id(db: ExportSource, strings: pl.DataFrame) -> pl.DataFrame:
    """``strings`` with one row per id (the first), after one warning when an id repeats."""
    dup = strings["id"].is_duplicated() if strings.height else None
    if dup is not None and dup.any():
        # ids are the table's primary key: a repeated one is damage (a flipped byte in the
        # B-tree), and every id → text lookup needs one text per id
        n = int(strings.filter(dup)["id"].n_unique())
        warnings.warn(f"{db.path.name}: {n} StringIds id(s) appear more than once (a damaged export?); the first text of "
                      "each is used; export the report again (nsys export --type sqlite)", DamagedRowsWarning, stacklevel=3)
        strings = strings.unique("id", keep="first", maintain_order=True)
    return strings


#: Tables whose names are StringIds ids.
_NAMED_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS")


def _first_table(db: ExportSource, *names: str) -> str | None:
    return next((n for n in names if db.has_table(n)), None)


# -- GPU activity ---------------------------------------------------------------------
_GPU_OP_COLS = [
    Col("start_ns", "start"),
    Col("end_ns", "end"),
    Col("device_id", "deviceId"),
    Col("context_id", "contextId"),
    Col("stream_id", "streamId"),
    Col("correlation_id", "correlationId"),
    Col("global_pid", "globalPid"),
]


_OP_IDS = {
    "pid": pid_from_global(pl.col("global_pid")),
    "duration_ns": pl.col("end_ns") - pl.col("start_ns"),
}
#: An integer cell as itself, a text or real cell only when it is exactly an integer
#: (``'123'`` → 123), else NULL: SQLite's own arithmetic reads the text ``'abc'`` as 0, which
#: turned ``"end" - "start"`` into an absolute timestamp (issue 19.2).
EXACT_INT = (
    "(CASE typeof({col}) WHEN 'integer' THEN {col}"
    " WHEN 'text' THEN (CASE WHEN CAST(CAST({col} AS INTEGER) AS TEXT) = {col} THEN CAST({col} AS INTEGER) END)"
    " WHEN 'real' THEN (CASE WHEN CAST({col} AS INTEGER) = {col} THEN CAST({col} AS INTEGER) END) END)"
)
#: ``duration_ns`` computed by SQLite when ``start_ns``/``end_ns`` are not wanted: NULL where
#: either is not an integer, as the polars path gives after casting them
_EXACT_START = EXACT_INT.format(col='"start"')
_DURATION = {"duration_ns": Col("duration_ns", "end", sql=EXACT_INT + " - " + _EXACT_START)}


def kernels(db: ExportSource, strings: pl.DataFrame, columns: Collection[str] | None = None) -> pl.DataFrame:
    """``CUPTI_ACTIVITY_KIND_KERNEL`` → ``kernels`` (see docs/tables.md); only ``columns`` when given."""
    wanted = wanted_columns("kernels", columns)
    if not db.has_table(KERNEL_SOURCE):
        return S.empty("kernels", wanted)
    raw, derived = kernels_spec(db, strings)
    return read_projected(db, KERNEL_SOURCE, "kernels", raw, derived, wanted, direct=_DURATION)


KERNEL_SOURCE = "CUPTI_ACTIVITY_KIND_KERNEL"


def kernels_spec(db: ExportSource, strings: pl.DataFrame) -> tuple[list[Col], dict[str, pl.Expr]]:
    """The raw columns of ``CUPTI_ACTIVITY_KIND_KERNEL`` and the expressions that derive the
    other ``kernels`` columns from them (for :func:`kernels` and :func:`gather_derived_frame`)."""
    raw = [
        *_GPU_OP_COLS,
        Col("green_context_id", "greenContextId"),
        Col("demangled_id", "demangledName"),
        Col("short_id", "shortName"),
        Col("mangled_id", "mangledName"),
        Col("grid_x", "gridX"),
        Col("grid_y", "gridY"),
        Col("grid_z", "gridZ"),
        Col("block_x", "blockX"),
        Col("block_y", "blockY"),
        Col("block_z", "blockZ"),
        Col("registers_per_thread", "registersPerThread"),
        Col("static_shared_memory_bytes", "staticSharedMemory"),
        Col("dynamic_shared_memory_bytes", "dynamicSharedMemory"),
        Col("local_memory_per_thread_bytes", "localMemoryPerThread"),
        Col("launch_type_id", "launchType"),
        Col("graph_node_id", "graphNodeId"),
        Col("graph_id", "graphId"),
    ]
    launch = enums.enum_map(
        db,
        _first_table(db, "ENUM_CUDA_KERNEL_LAUNCH_TYPE", "ENUM_CUDA_KRENEL_LAUNCH_TYPE") or "",
        enums.KERNEL_LAUNCH_TYPE,
    )
    derived = {
        **_OP_IDS,
        "name": lookup_strings(pl.col("demangled_id"), strings),
        "short_name": lookup_strings(pl.col("short_id"), strings),
        "name_id": pl.col("demangled_id"),
        "short_name_id": pl.col("short_id"),
        "mangled_name_id": pl.col("mangled_id"),
        "mangled_name": lookup_strings(pl.col("mangled_id"), strings),
        "launch_type": enums.map_codes(pl.col("launch_type_id"), launch),
    }
    return raw, derived


def memcpys(db: ExportSource, columns: Collection[str] | None = None) -> pl.DataFrame:
    """``CUPTI_ACTIVITY_KIND_MEMCPY`` → ``memcpys``; only ``columns`` when given."""
    table = "CUPTI_ACTIVITY_KIND_MEMCPY"
    wanted = wanted_columns("memcpys", columns)
    if not db.has_table(table):
        return S.empty("memcpys").select(wanted)
    raw = [
        *_GPU_OP_COLS,
        Col("green_context_id", "greenContextId"),
        Col("bytes", "bytes"),
        Col("copy_kind_id", "copyKind"),
        Col("src_kind_id", "srcKind"),
        Col("dst_kind_id", "dstKind"),
        Col("src_device_id", "srcDeviceId"),
        Col("dst_device_id", "dstDeviceId"),
        Col("graph_node_id", "graphNodeId"),
        Col("copy_count", "copyCount"),
    ]
    labels = enums.enum_map(db, "ENUM_CUDA_MEMCPY_OPER", enums.MEMCPY_KIND_LABEL)
    kinds = enums.enum_map(db, "ENUM_CUDA_MEM_KIND", enums.MEM_KIND)
    derived = {
        **_OP_IDS,
        "copy_kind": enums.map_codes(pl.col("copy_kind_id"), enums.MEMCPY_KIND_SHORT),
        "copy_kind_label": enums.map_codes(pl.col("copy_kind_id"), labels),
        "src_kind": enums.map_codes(pl.col("src_kind_id"), kinds),
        "dst_kind": enums.map_codes(pl.col("dst_kind_id"), kinds),
    }
    return read_projected(db, table, "memcpys", raw, derived, wanted, direct=_DURATION)


def memsets(db: ExportSource, columns: Collection[str] | None = None) -> pl.DataFrame:
    """``CUPTI_ACTIVITY_KIND_MEMSET`` → ``memsets``; only ``columns`` when given."""
    table = "CUPTI_ACTIVITY_KIND_MEMSET"
    wanted = wanted_columns("memsets", columns)
    if not db.has_table(table):
        return S.empty("memsets").select(wanted)
    raw = [
        *_GPU_OP_COLS,
        Col("green_context_id", "greenContextId"),
        Col("bytes", "bytes"),
        Col("value", "value"),
        Col("mem_kind_id", "memKind"),
        Col("graph_node_id", "graphNodeId"),
    ]
    kinds = enums.enum_map(db, "ENUM_CUDA_MEM_KIND", enums.MEM_KIND)
    derived = {**_OP_IDS, "mem_kind": enums.map_codes(pl.col("mem_kind_id"), kinds)}
    return read_projected(db, table, "memsets", raw, derived, wanted, direct=_DURATION)


def syncs(db: ExportSource, columns: Collection[str] | None = None) -> pl.DataFrame:
    """``CUPTI_ACTIVITY_KIND_SYNCHRONIZATION`` → ``syncs``; only ``columns`` when given."""
    table = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
    wanted = wanted_columns("syncs", columns)
    if not db.has_table(table):
        return S.empty("syncs").select(wanted)
    raw = [*_GPU_OP_COLS, Col("sync_type_id", "syncType"), Col("event_id", "eventId")]
    types = enums.enum_map(db, "ENUM_CUPTI_SYNC_TYPE", enums.SYNC_TYPE)
    derived = {
        **_OP_IDS,
        "sync_type": enums.map_codes(pl.col("sync_type_id"), types),
        "event_id": pl.when(pl.col("event_id") == 4294967295).then(None).otherwise(pl.col("event_id")),
    }
    return read_projected(db, table, "syncs", raw, derived, wanted, direct=_DURATION)


GRAPH_TRACE_SOURCE = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"


def graph_trace(db: ExportSource, columns: Collection[str] | None = None) -> pl.DataFrame:
    """``CUPTI_ACTIVITY_KIND_GRAPH_TRACE`` → ``graph_trace``: one row per CUDA graph launch
    as the GPU ran it, when nsys traced graphs whole (``--cuda-graph-trace=graph``, its
    default); the graph's kernels are then not in ``kernels``. Only ``columns`` when given."""
    wanted = wanted_columns("graph_trace", columns)
    if not db.has_table(GRAPH_TRACE_SOURCE):
        return S.empty("graph_trace").select(wanted)
    raw = [*_GPU_OP_COLS, Col("green_context_id", "greenContextId"), Col("graph_id", "graphId"),
           Col("graph_exec_id", "graphExecId")]
    return read_projected(db, GRAPH_TRACE_SOURCE, "graph_trace", raw, dict(_OP_IDS), wanted, direct=_DURATION)


# -- CPU side --------------------------------------------------------------------------
def cuda_api(db: ExportSource, strings: pl.DataFrame, columns: Collection[str] | None = None) -> pl.DataFrame:
    """``CUPTI_ACTIVITY_KIND_RUNTIME`` (runtime and driver calls) → ``cuda_api``; only
    ``columns`` when given."""
    wanted = wanted_columns("cuda_api", columns)
    if not db.has_table(CUDA_API_SOURCE):
        return S.empty("cuda_api", wanted)
    raw, derived = cuda_api_spec(strings)
    return read_projected(db, CUDA_API_SOURCE, "cuda_api", raw, derived, wanted, direct=_DURATION)


CUDA_API_SOURCE = "CUPTI_ACTIVITY_KIND_RUNTIME"


def cuda_api_named(db: ExportSource, strings: pl.DataFrame, pattern: str) -> pl.DataFrame:
    """``start_ns`` and ``end_ns`` of the CUDA API calls whose name matches the regular
    expression ``pattern``, read with a ``WHERE`` on their name ids: only the matching rows
    are read (the whole ``name`` column of a big export's API table is not held; polars
    aborted filtering it under an address-space limit)."""
    schema = {"start_ns": pl.Int64, "end_ns": pl.Int64}
    ids = strings.filter(pl.col("value").str.contains(pattern))["id"] if strings.height else pl.Series([], dtype=pl.Int64)
    if ids.len() == 0 or not db.has_table(CUDA_API_SOURCE):
        return pl.DataFrame(schema=schema)
    where = f"nameId IN ({', '.join(str(int(i)) for i in ids)})"
    return select(db, CUDA_API_SOURCE, [Col("start_ns", "start"), Col("end_ns", "end")], where).sort("start_ns")


def cuda_api_spec(strings: pl.DataFrame) -> tuple[list[Col], dict[str, pl.Expr]]:
    """The raw columns of ``CUPTI_ACTIVITY_KIND_RUNTIME`` and the expressions that derive the
    other ``cuda_api`` columns from them (for :func:`cuda_api` and for gathering a few rows
    of raw columns before deriving, :func:`gather_derived_frame`)."""
    raw = [
        Col("start_ns", "start"),
        Col("end_ns", "end"),
        Col("event_class", "eventClass"),
        Col("global_tid", "globalTid"),
        Col("correlation_id", "correlationId"),
        Col("name_id", "nameId"),
        Col("return_value", "returnValue"),
        Col("callchain_id", "callchainId"),
    ]
    api_labels = enums.API_CLASS  # 0/1 in every version; ENUM_NSYS_EVENT_CLASS agrees
    derived = {
        "pid": pid_from_global(pl.col("global_tid")),
        "tid": tid_from_global(pl.col("global_tid")),
        "duration_ns": pl.col("end_ns") - pl.col("start_ns"),
        "name": lookup_strings(pl.col("name_id"), strings),
        "api": enums.map_codes(pl.col("event_class"), api_labels),
    }
    return raw, derived


def gathered(source: Any, columns: list[str], rows: pl.Series) -> pl.DataFrame:
    """``columns`` of a column source (``NsysTrace.columns_on_demand``, a frame's stand-in
    with ``gather_columns``) at ``rows``, as a frame: through its ``gather_frame`` where it
    has one (a column of one value then held once), else its ``gather_columns``."""
    columns = list(dict.fromkeys(columns))  # a frame holds a name once
    gather = getattr(source, "gather_frame", None)
    if gather is not None:
        return gather(columns, rows)  # type: ignore[no-any-return]
    return pl.DataFrame(source.gather_columns(columns, rows))


def gather_derived_frame(
    db: ExportSource, source: str, table: str, raw: Sequence[Col], derived: Mapping[str, pl.Expr],
    columns: Sequence[str], rows: pl.Series,
) -> pl.DataFrame:
    """Columns ``columns`` of ``table`` at ``rows`` only: each raw input is read once, one at
    a time, and gathered at ``rows`` before the next is read; each column is derived as soon
    as its inputs are in (names looked up for those rows only), and an input is let go once
    no column still to derive needs it. Inputs and columns of one value are held as that
    value once (:func:`one_value_columns`). Holds one whole input column at a time, not one
    per output column; on 3 M of 12 M calls (k2m_a6's window) the inputs no longer sat
    beside the columns made of them (name ids, event classes: 48 MB)."""
    exprs = {c: derived.get(c, pl.col(c)) for c in columns}
    pending = {c: set(e.meta.root_names()) for c, e in exprs.items()}
    inputs: dict[str, pl.DataFrame] = {}  # one column each
    made: list[pl.DataFrame] = []

    def derive(ready: list[str], frame: pl.DataFrame) -> None:
        # with_columns, not select: a literal is one value for each of the frame's rows
        made.append(one_value_columns(frame.with_columns(exprs[c].alias(c) for c in ready).select(ready)))
        for c in ready:
            del pending[c]

    for col in raw:
        if not any(col.target in needs for needs in pending.values()):
            continue
        inputs[col.target] = one_value_columns(select(db, source, [col]).to_series().gather(rows).to_frame())
        ready = [c for c, needs in pending.items() if needs and needs <= inputs.keys()]
        if ready:
            derive(ready, pl.concat(inputs.values(), how="horizontal"))
        wanted = set().union(*pending.values()) if pending else set()
        inputs = {c: f for c, f in inputs.items() if c in wanted}
    if pending:  # columns of no input (literals), last: one per row asked for
        derive(list(pending), pl.DataFrame({"_n": pl.int_range(rows.len(), eager=True)}))
    frame = pl.concat(made, how="horizontal") if made else pl.DataFrame()
    return S.conform(frame, table, list(columns))


def processes(db: ExportSource) -> pl.DataFrame:
    """``PROCESSES`` (nsys ≥ 2022.2), else the processes seen in thread names."""
    if db.has_table("PROCESSES"):
        raw = select(
            db, "PROCESSES", [Col("global_pid", "globalPid"), Col("pid", "pid"), Col("name", "name", pl.Utf8)]
        )
        return S.conform(raw.unique(subset=["global_pid"], keep="first", maintain_order=True), "processes")
    names = select(db, "ThreadNames", [Col("global_tid", "globalTid")])
    frame = names.select(
        (pl.col("global_tid") // 0x1000000 * 0x1000000).alias("global_pid")
    ).unique(maintain_order=True)
    frame = frame.with_columns(pid_from_global(pl.col("global_pid")).alias("pid"))
    return S.conform(frame, "processes")


def threads(db: ExportSource, strings: pl.DataFrame) -> pl.DataFrame:
    """``ThreadNames`` → ``threads`` (one row per named thread)."""
    raw = select(
        db, "ThreadNames", [Col("name_id", "nameId"), Col("priority", "priority"), Col("global_tid", "globalTid")]
    )
    frame = raw.with_columns(
        pid_from_global(pl.col("global_tid")).alias("pid"),
        tid_from_global(pl.col("global_tid")).alias("tid"),
        lookup_strings(pl.col("name_id"), strings).alias("name"),
    ).unique(subset=["global_tid"], keep="first", maintain_order=True)
    return S.conform(frame, "threads")


def gpus(db: ExportSource) -> pl.DataFrame:
    """``TARGET_INFO_GPU`` (or 2020.x's ``TARGET_INFO_CUDA_GPU``) → ``gpus``."""
    full_gpu_table = db.has_table("TARGET_INFO_GPU") and db.has_column("TARGET_INFO_GPU", "totalMemory")
    if full_gpu_table:
        id_col = "id" if db.has_column("TARGET_INFO_GPU", "id") else "deviceId"
        raw = select(
            db,
            "TARGET_INFO_GPU",
            [
                Col("device_id", id_col),
                Col("name", "name", pl.Utf8),
                Col("bus_location", "busLocation", pl.Utf8),
                Col("uuid", "uuid", pl.Utf8),
                Col("chip_name", "chipName", pl.Utf8),
                Col("major", "computeMajor"),
                Col("minor", "computeMinor"),
                Col("sm_count", "smCount"),
                Col("total_memory_bytes", "totalMemory"),
                Col("memory_bandwidth_bytes_per_s", "memoryBandwidth"),
                Col("clock_rate_hz", "clockRate"),
                Col("l2_cache_bytes", "l2CacheSize"),
            ],
        )
    elif db.has_table("TARGET_INFO_CUDA_GPU"):
        # nsys 2020.x: TARGET_INFO_GPU (if any) holds only ids and names; the device properties
        # are here, one row per device and process, with the id in deviceId (id in older ones),
        # the clock in kHz and the bandwidth in kB/s
        id_col = "deviceId" if db.has_column("TARGET_INFO_CUDA_GPU", "deviceId") else "id"
        khz = "CAST({col} AS INTEGER) * 1000"
        raw = select(
            db,
            "TARGET_INFO_CUDA_GPU",
            [
                Col("device_id", id_col),
                Col("name", "name", pl.Utf8),
                Col("bus_location", "pciBusId", pl.Utf8),
                Col("uuid", "uuid", pl.Utf8),
                Col("chip_name", None, pl.Utf8),
                Col("major", "computeCapabilityMajor"),
                Col("minor", "computeCapabilityMinor"),
                Col("sm_count", "numMultiprocessors"),
                Col("total_memory_bytes", "globalMemorySize" if db.has_column("TARGET_INFO_CUDA_GPU", "globalMemorySize") else "totalMemory"),
                Col("memory_bandwidth_bytes_per_s", "globalMemoryBandwidth", pl.Int64, khz),
                Col("clock_rate_hz", "coreClockRate", pl.Int64, khz),
                Col("l2_cache_bytes", "l2CacheSize"),
            ],
        ).unique(subset=["device_id"], keep="first", maintain_order=True)
        if db.has_table("TARGET_INFO_GPU"):  # the 2020.x id/name table may list devices no process used
            gid = "id" if db.has_column("TARGET_INFO_GPU", "id") else "deviceId"
            names = select(db, "TARGET_INFO_GPU", [Col("device_id", gid), Col("name", "name", pl.Utf8),
                                                   Col("bus_location", "busLocation", pl.Utf8)])
            extra = names.join(raw.select("device_id"), on="device_id", how="anti")
            raw = pl.concat([raw, extra], how="diagonal_relaxed").sort("device_id")
    elif db.has_table("TARGET_INFO_GPU"):
        gid = "id" if db.has_column("TARGET_INFO_GPU", "id") else "deviceId"
        raw = select(db, "TARGET_INFO_GPU", [Col("device_id", gid), Col("name", "name", pl.Utf8),
                                             Col("bus_location", "busLocation", pl.Utf8), Col("uuid", "uuid", pl.Utf8),
                                             Col("chip_name", None, pl.Utf8), Col("major", None), Col("minor", None),
                                             Col("sm_count", None), Col("total_memory_bytes", None),
                                             Col("memory_bandwidth_bytes_per_s", None), Col("clock_rate_hz", None),
                                             Col("l2_cache_bytes", None)])
    else:
        return S.empty("gpus")
    frame = raw.with_columns(
        pl.when(pl.col("major").is_not_null())
        .then(pl.format("{}.{}", pl.col("major"), pl.col("minor")))
        .otherwise(None)
        .alias("compute_capability")
    ).unique(subset=["device_id"], keep="first", maintain_order=True)
    return S.conform(frame.sort("device_id"), "gpus")


def memory_usage(db: ExportSource, strings: pl.DataFrame) -> pl.DataFrame:
    """``CUDA_GPU_MEMORY_USAGE_EVENTS`` (``--cuda-memory-usage=true``) → ``memory_usage``."""
    table = "CUDA_GPU_MEMORY_USAGE_EVENTS"
    if not db.has_table(table):
        return S.empty("memory_usage")
    raw = select(
        db,
        table,
        [
            Col("start_ns", "start"),
            Col("global_pid", "globalPid"),
            Col("device_id", "deviceId"),
            Col("context_id", "contextId"),
            Col("stream_id", "streamId"),
            Col("correlation_id", "correlationId"),
            Col("address", "address"),
            Col("bytes", "bytes"),
            Col("mem_kind_id", "memKind"),
            Col("operation_id", "memoryOperationType"),
            Col("name_raw", "name", pl.Utf8),
        ],
    )
    # ``name`` is declared TEXT and holds the text itself (a symbol such as
    # ``ncclDevFuncTable``); it was read as a StringIds id, so every name came back null
    declared = {r[1]: str(r[2]).upper() for r in db.rows(f'PRAGMA table_info("{table}")')}
    if declared.get("name") == "INTEGER":
        name = lookup_strings(pl.col("name_raw").cast(pl.Int64, strict=False), strings)
    else:
        name = pl.col("name_raw")
    ops = enums.MEMORY_OPERATION  # ENUM_CUDA_DEV_MEM_EVENT_OPER: 0 Allocation, 1 Deallocation
    kinds = enums.enum_map(db, "ENUM_CUDA_MEM_KIND", enums.MEM_KIND)
    frame = raw.with_columns(
        pid_from_global(pl.col("global_pid")).alias("pid"),
        enums.map_codes(pl.col("mem_kind_id"), kinds).alias("mem_kind"),
        enums.map_codes(pl.col("operation_id"), ops).alias("operation"),
        name.alias("name"),
    )
    return S.conform(frame, "memory_usage")
