"""The launch join of an export's GPU operations, kept in the column cache.

Every kernel, memcpy and memset of an Nsight Systems export has a launching CUDA call (same
``correlationId`` and process). Several reports and analyses need that call's thread and
times for millions of operations: the NVTX projections, the generation phases, the NCCL
calls. :func:`op_launches` computes the join once per export and keeps its result as
derived columns beside the kernel table's in the column cache (one value per operation), so
that a later run reads four columns of one value per operation instead of the operations'
keys and three whole API columns (5 M calls: 40 MB each), and makes no join.

:func:`api_rows` and :func:`lean_api_rows` give the API columns such a join reads, one at a
time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import polars as pl

from tracekit.analysis._frames import PID_UNIT
from tracekit.analysis.attribution import launch_pairs
from tracekit.errors import TraceMemoryError
from tracekit.nsys import database, readers
from tracekit.nsys.launch_scans import (
    API_TABLE,
    KERNEL_TABLE,
    LAUNCH_API_COLUMNS,
    LAUNCHING_CALLS,
    narrows_by_rows,
)
from tracekit.nsys.readers import Col

if TYPE_CHECKING:
    from tracekit.nsys.trace import NsysTrace

__all__ = [
    "KERNEL_TABLE", "LEAN_FROM_OPS", "OP_LAUNCH_KEY", "api_rows", "derived_source",
    "kernel_launch_calls", "launches_at", "lean_api_rows", "matches_twice", "narrows_launch_calls", "op_keys",
    "op_launches",
]

log = logging.getLogger(__name__)


def _loaded(trace: NsysTrace, table: str) -> pl.DataFrame | None:
    """The trace's ``table`` if it was already built, else None."""
    return trace.table(table) if trace.is_loaded(table) else None


#: The API columns of :func:`api_rows` (``name`` last).
_API_COLS = tuple(Col(name, source) for name, source in zip(
    ("global_tid", "correlation_id", "start_ns", "end_ns", "name"), LAUNCH_API_COLUMNS, strict=True))


def api_rows(trace: NsysTrace, *, names: bool = True) -> pl.DataFrame | readers.TableColumns:
    """CUDA API calls for the launch join: ``global_tid``, ``correlation_id``, ``start_ns``,
    ``end_ns`` and, with ``names``, ``name`` (string id, or text when reused from
    ``trace.cuda_api``). The join derives ``tid`` from ``global_tid`` for the rows it keeps.

    Whole columns, unfiltered: the launch join
    (:func:`~tracekit.analysis.attribution.launch_pairs`) reads the correlation ids, then
    gathers the rows it matched from one column at a time (a
    :class:`~tracekit.nsys.readers.TableColumns`; on a 1M-kernel export the 2.5 M calls'
    columns are never all in memory at once). The reports join with ``dedupe=False``, so the
    runtime/driver preference (the ``api`` column) is not needed."""
    cols = ["global_tid", "correlation_id", "start_ns", "end_ns", *(["name"] if names else [])]
    cached = _loaded(trace, "cuda_api")
    if cached is not None:
        return cached.select(cols)
    return readers.TableColumns(trace.db, API_TABLE, _API_COLS if names else _API_COLS[:-1])




def narrows_launch_calls(trace: NsysTrace) -> bool:
    """Whether a kernel launch join of ``trace`` reads only the CUDA API calls that some
    kernel names (:func:`kernel_launch_calls`): not where the trace holds ``kernels`` or
    ``cuda_api`` already, the export is not an SQLite file, the column cache holds the calls'
    columns, or the export has fewer than
    :data:`~tracekit.nsys.launch_scans.NARROW_FROM_CALLS_PER_KERNEL` calls per
    kernel (row estimates: nothing is counted)."""
    db = trace.db
    if trace.is_loaded("kernels") or trace.is_loaded("cuda_api") or not isinstance(db, database.ExportDatabase):
        return False
    tables = (API_TABLE, KERNEL_TABLE)
    if not all(db.has_table(t) and "correlationId" in db.columns(t) for t in tables):
        return False
    if db.all_cached(API_TABLE, [f'"{c.source}"' for c in _API_COLS]):
        return False
    return narrows_by_rows(db.row_estimate(KERNEL_TABLE), db.row_estimate(API_TABLE))


def kernel_launch_calls(trace: NsysTrace) -> pl.DataFrame | None:
    """The CUDA API calls whose correlation id some kernel of the export has, with the
    columns of :func:`api_rows` (``name`` as string ids), read with that filter in SQLite;
    None where :func:`narrows_launch_calls` says a full read is the better one.

    The launch join on these calls equals the join on all of them (a call whose correlation
    id no kernel has pairs with none), in the same order: the unary ``+`` keeps SQLite from
    answering through an index on ``correlationId`` (which would give the calls in its order),
    so the table is scanned in rowid order, as a full read does. On a cold export with 6 calls
    per kernel the read takes 0.17 s where all 1.2 M calls took 0.40 s (200 k kernels), and no
    column of the calls is written to the cache. None too where the filtered read is refused
    for memory: it is checked as if every call came back, and the full read takes one column
    at a time."""
    if not narrows_launch_calls(trace):
        return None
    try:
        return readers.select(trace.db, API_TABLE, _API_COLS, where=LAUNCHING_CALLS)
    except TraceMemoryError as exc:
        log.debug("reading every call instead of the kernels' launches: %s", exc)
        return None


class _Unpinned:
    """The CUDA API columns of :func:`api_rows`, each read afresh when asked for and kept by
    no one but the caller (a :class:`~tracekit.nsys.readers.TableColumns` keeps the last column
    read: in the launch join that pinned the whole ``globalTid`` column, 160 MB on 20 M calls,
    through the merge). Used only where the columns come from the column cache, so that a
    second read of a column is a file read, not a scan of the export."""

    def __init__(self, trace: NsysTrace, names: bool) -> None:
        self._trace, self._names = trace, names
        self.columns = ["global_tid", "correlation_id", "start_ns", "end_ns", *(["name"] if names else [])]

    def __getitem__(self, name: str) -> pl.Series:
        return api_rows(self._trace, names=self._names)[name]

    def gather_columns(self, names: list[str], rows: pl.Series) -> list[pl.Series]:
        return [self[n].gather(rows) for n in names]


#: GPU operations from which the launch join reads each API column afresh (:func:`lean_api_rows`).
LEAN_FROM_OPS = 2_000_000


def lean_api_rows(trace: NsysTrace, ops: int, *, names: bool = True) -> pl.DataFrame | readers.TableColumns | _Unpinned:
    """:func:`api_rows`, with no column pinned between reads where the column cache serves them
    and there are at least :data:`LEAN_FROM_OPS` ``ops`` (below, a column read twice costs
    more time than it saves memory)."""
    source = api_rows(trace, names=names)
    if ops >= LEAN_FROM_OPS and isinstance(source, readers.TableColumns) and trace.db.caches("CUPTI_ACTIVITY_KIND_RUNTIME"):
        return _Unpinned(trace, names)
    return source


def derived_source(trace: NsysTrace) -> database.ExportSource | None:
    """Where a launch join may keep its derived columns (``derived_column``, which computes
    them each time when the column cache is off or the table too small): the export, unless
    the trace has built ``kernels`` or ``cuda_api`` (the reports then join those tables)."""
    return None if trace.is_loaded("kernels") or trace.is_loaded("cuda_api") else trace.db


#: Names the projections' launch join in the column cache's keys (:func:`op_launches`):
#: bump it when what the join keeps or how it matches changes.
OP_LAUNCH_KEY = "derived:op-launch-join.v1"
#: The launch columns :func:`op_launches` gives, from these API columns.
_OP_LAUNCH_API = {"global_tid": "global_tid", "api_start_ns": "start_ns", "api_end_ns": "end_ns"}


def op_launches(trace: NsysTrace, keys: Callable[[], pl.DataFrame]) -> pl.DataFrame:
    """The launch join of the GPU operations (kernels, then memcpys, then memsets: their rows
    numbered in that order) to their API calls, inner and with every matching pair kept (as
    nsys's SQL joins): ``_lrow`` (UInt32, the operation's row, ascending) and the call's
    ``global_tid``, ``api_start_ns`` and ``api_end_ns``. ``keys()`` gives the operations'
    ``global_pid`` and ``correlation_id``.

    Computed once per export and kept in the column cache (derived columns under
    :data:`OP_LAUNCH_KEY`) where it serves the kernel table and the trace has built neither
    ``kernels`` nor ``cuda_api``: a warm projection then reads four 1 M-row columns instead of
    the operations' keys, the calls' correlation ids and three whole 5 M-row API columns, and
    makes no join (h1x: four 40 MB column reads and the join saved). Otherwise the join is
    made each time, each API column read and gathered in turn."""
    db = derived_source(trace)
    state: dict[str, pl.Series] = {}

    def join() -> pl.Series:
        k = keys()
        api = lean_api_rows(trace, k.height, names=False)
        pairs = launch_pairs(k, api, how="inner")
        del k
        arow = pairs["_arow"]
        for out, src in _OP_LAUNCH_API.items():  # one whole API column in memory at a time
            state[out] = api[src].gather(arow)
        return pairs["_lrow"]

    def derived(name: str, make: Callable[[], pl.Series]) -> pl.Series:
        return make() if db is None else db.derived_column(KERNEL_TABLE, f"{OP_LAUNCH_KEY}:{name}", make)

    lrow = derived("lrow", join)

    def launch(out: str) -> pl.Series:
        if out not in state:  # the join's row pairs came from the cache, this column did not
            join()
        return state.pop(out)

    columns = {out: derived(out, partial(launch, out)) for out in _OP_LAUNCH_API}
    if any(c.len() != lrow.len() for c in columns.values()):  # cannot happen for one unchanged export
        state.clear()
        lrow = join()
        columns = {out: state.pop(out) for out in _OP_LAUNCH_API}
    return pl.DataFrame({"_lrow": lrow, **columns})


def matches_twice(pairs: pl.DataFrame) -> bool:
    """Whether some operation of :func:`op_launches`' ``pairs`` matches two calls (its rows
    are ascending: a repeated row). ``launch_info`` then picks one call by the calls' kind and
    start, which the kept join does not record: its readers join instead."""
    lrow = pairs["_lrow"]
    return lrow.len() > 1 and bool((lrow.diff().drop_nulls() == 0).any())


def op_keys(trace: NsysTrace, kernels: Any) -> pl.DataFrame:
    """``keys()`` for :func:`op_launches`: ``global_pid`` and ``correlation_id`` of the
    kernels (from ``kernels``, a column source read a column at a time, let go after), then
    of the memcpys and the memsets, in its numbering."""
    head = pl.DataFrame([kernels["global_pid"], kernels["correlation_id"]])
    release = getattr(kernels, "release", None)
    if release is not None:
        release()
    others = [trace.table(t, ["global_pid", "correlation_id"]) for t in ("memcpys", "memsets")]
    return pl.concat([head, *others], how="vertical_relaxed")


def launches_at(
    trace: NsysTrace, keys: Callable[[], pl.DataFrame], rows: pl.Series, columns: tuple[str, ...] = ("tid", "global_tid", "api_start_ns", "api_end_ns"),
) -> pl.DataFrame | None:
    """The launching call's ``columns`` (of ``tid``, ``global_tid``, ``api_start_ns``,
    ``api_end_ns``) of the operations at ``rows`` (in :func:`op_launches`' numbering:
    kernels, then memcpys, then memsets; a null row gets nulls), null where no call matched:
    what :func:`~tracekit.analysis.attribution.launch_info` adds to them, same values, from
    the kept join (``keys`` as for :func:`op_launches`). ``None`` when some operation
    matches two calls: ``launch_info`` then picks one by the calls' kind and start, which
    the kept join does not record, so the caller joins instead."""
    pairs = op_launches(trace, keys)
    if matches_twice(pairs):
        return None
    lrow = pairs["_lrow"]
    want = rows.cast(pl.Int64)
    n = max(int(lrow.max() if lrow.len() else -1), int(want.max() if want.drop_nulls().len() else -1)) + 1  # type: ignore[arg-type]
    out = {}
    for c in columns:  # one dense column (one value per operation) at a time
        source = "global_tid" if c == "tid" else c
        dense = pl.repeat(None, n, dtype=pl.Int64, eager=True).scatter(lrow, pairs[source])
        out[c] = dense.gather(want) % PID_UNIT if c == "tid" else dense.gather(want)
        del dense
    return pl.DataFrame(out)
