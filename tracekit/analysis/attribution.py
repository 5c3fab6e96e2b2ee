"""Attribute GPU work to the API call that launched it and to the NVTX ranges around that call.

The rules are those of Nsight Systems (``docs/analysis.md`` § Attribution):

* **GPU op → API call**: same ``correlation_id`` *and* same process
  (``op.global_pid == api.global_tid & 0xFFFFFFFFFF000000``). Correlation ids repeat across
  processes, so they are never joined alone.
* **API call → NVTX range**: push/pop and start/end ranges (event types 59, 60, 70, 71) that
  begin and end on the launching thread (``end_global_tid`` null) and contain the whole call
  (``range.start <= api.start`` and ``range.end >= api.end``). A range left open ends at the
  last timestamp of the range rows. The innermost range is the containing one that starts
  last; the path is its chain of enclosing ranges, outermost first.
* **Fallback** (not in nsys): work launched from a thread with no enclosing range on that
  thread (PyTorch's autograd threads, NCCL proxy threads) can take the innermost range open
  on another thread of the same process; such rows say ``attribution == "process_fallback"``.

The containment is computed with sorted joins, not an N×M join: ranges of a thread are a
nested family (push/pop ranges always are), so each range's parent is found by pointer jumping
over the ranges sorted by start, and each call's innermost range by an as-of join on its start
followed by a climb to the first ancestor that also covers its end. Threads whose ranges
overlap without nesting (start/end ranges can) are detected and handled by an exact join on
that thread alone.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

import polars as pl

from tracekit.analysis._frames import (
    PID_UNIT,
    ColumnSource,
    gpu_ops,
    is_identity,
    max_int,
    process_key,
    rank_keys,
)
from tracekit.errors import DamagedRowsWarning
from tracekit.nsys.nvtx import qualified_name
from tracekit.nsys.readers import implausible_end

if TYPE_CHECKING:
    from tracekit.nsys.trace import NsysTrace

#: ``NVTX_EVENTS.eventType`` codes of ranges: push/pop (59, NVTXT 70), start/end (60, 71).
RANGE_TYPES: tuple[int, ...] = (59, 60, 70, 71)
PUSHPOP_TYPES: tuple[int, ...] = (59, 70)
FALLBACKS: tuple[str, ...] = ("process", "none")

#: PyTorch ``emit_nvtx`` range names: ``aten::mm, seq = 146, op_id = 32, sizes = [...]``.
TORCH_OP_NAME = re.compile(r"^(?P<op>[^,\s]+), (?:seq|op_id|stashed seq|sizes) = ")

_LAUNCH_COLUMNS = ("tid", "global_tid", "api_name", "api_start_ns", "api_end_ns")
_NVTX_COLUMNS = ("nvtx_range", "nvtx_path", "nvtx_depth", "nvtx_range_id", "attribution")


# -- GPU op → API call -----------------------------------------------------------------------
def launch_info(
    ops: pl.DataFrame, cuda_api: pl.DataFrame | ColumnSource, *, columns: Sequence[str] | None = None
) -> pl.DataFrame:
    """Add the launching CUDA API call to each GPU operation.

    Parameters
    ----------
    ops
        ``kernels``, ``memcpys`` or ``memsets`` (or any frame with ``correlation_id`` and
        ``global_pid``; ``rank`` too for a multi-rank table set).
    cuda_api
        The ``cuda_api`` table (``correlation_id``, ``global_tid``, ``tid``, ``name``,
        ``start_ns``, ``end_ns``; ``api`` and ``rank`` when present).
    columns
        Which launch columns to add (default: all five below); fewer is lighter on millions
        of operations (the ``api_name`` strings are the biggest).

    Returns
    -------
    ``ops`` in its order with ``tid``, ``global_tid`` (the launching thread), ``api_name``
    (e.g. ``cudaLaunchKernel_v7000``), ``api_start_ns`` and ``api_end_ns`` (Int64 ns; null when
    no call matches, e.g. when the API trace was off). The join is on ``correlation_id`` and
    the process (``global_pid == global_tid & 0xFFFFFFFFFF000000``), plus ``rank`` when both
    frames have one. Where another tracer recorded a wrapper row with the same correlation id
    (some 2022 exports, ``eventClass`` 67), the CUDA runtime/driver row wins.

    Examples
    --------
    >>> ops = launch_info(trace.kernels, trace.cuda_api)  # doctest: +SKIP
    >>> (ops["start_ns"] - ops["api_end_ns"]).median()  # launch-to-start latency  # doctest: +SKIP
    """
    return _launch_join(ops, cuda_api, dedupe=True, columns=_LAUNCH_COLUMNS if columns is None else tuple(columns))


def _launch_join(
    ops: pl.DataFrame,
    cuda_api: pl.DataFrame | ColumnSource,
    *,
    dedupe: bool,
    columns: Sequence[str] = _LAUNCH_COLUMNS,
    how: str = "left",
) -> pl.DataFrame:
    """:func:`launch_info`; with ``dedupe=False`` an op matching several API rows appears once
    per row (as in nsys's SQL joins, which ``nvtx_kern_sum`` reproduces); ``columns`` picks
    which of the launch columns to add (fewer is cheaper on millions of ops); ``how="inner"``
    drops the ops no call matches."""
    pairs = launch_pairs(ops, cuda_api, how=how)
    if dedupe and pairs.height > pairs["_lrow"].n_unique():
        # a (correlation id, process) repeats among the API rows (rare): keep the CUDA
        # runtime/driver row, else the earliest
        arow = pairs["_arow"]
        pref = (
            (~cuda_api["api"].gather(arow).is_in(["runtime", "driver"])).fill_null(True)
            if "api" in cuda_api.columns
            else pl.repeat(False, pairs.height, eager=True)
        )
        pairs = (
            pairs.with_columns(pref.alias("_pref"), cuda_api["start_ns"].gather(arow).alias("_s"))
            .sort(["_lrow", "_pref", "_s"], nulls_last=True, maintain_order=True)
            .unique(subset="_lrow", keep="first", maintain_order=True)
            .select("_lrow", "_arow")
        )
    _release(cuda_api)  # a column source keeps the last whole column the pairing read
    base = ops.drop([c for c in _LAUNCH_COLUMNS if c in ops.columns])
    if not is_identity(pairs["_lrow"], base.height):
        base = base.select(pl.all().gather(pairs["_lrow"]))
    sources = {"global_tid": "global_tid", "api_name": "name", "api_start_ns": "start_ns", "api_end_ns": "end_ns"}
    arow = pairs["_arow"]
    wanted = [c for c in _LAUNCH_COLUMNS if c in columns and c != "tid"]
    api_tid = "tid" in columns and "tid" in cuda_api.columns  # else the low bits of global_tid
    got = _gathered(cuda_api, [*(sources[c] for c in wanted), *(["tid"] if api_tid else [])], arow)
    out = base.with_columns(s.alias(c) for c, s in zip(wanted, got[: len(wanted)], strict=True))
    if "tid" in columns:
        if api_tid:
            tid = got[-1]
        else:
            tid = (out["global_tid"] if "global_tid" in columns else cuda_api["global_tid"].gather(arow)) % PID_UNIT
        out = out.with_columns(tid.alias("tid"))
    return out.select(*base.columns, *(c for c in _LAUNCH_COLUMNS if c in columns))


def _release(source: pl.DataFrame | ColumnSource) -> None:
    """Let a column source (:class:`~tracekit.nsys.trace.ColumnsOnDemand`) drop the column it
    keeps from its last read; nothing for a frame."""
    release = getattr(source, "release", None)
    if release is not None:
        release()


def _gathered(source: pl.DataFrame | ColumnSource, names: list[str], rows: pl.Series) -> list[pl.Series]:
    """``source[name].gather(rows)`` for each name; a source that reads its columns on
    demand (``gather_columns``) reads them in parallel and keeps none."""
    gather = getattr(source, "gather_columns", None)
    if gather is not None:
        return list(gather(names, rows))
    return [source[n].gather(rows) for n in names]


def launch_pairs(ops: pl.DataFrame, cuda_api: pl.DataFrame | ColumnSource, *, how: str = "left") -> pl.DataFrame:
    """Row pairs of the launch join: ``_lrow`` (row of ``ops``, ascending) and ``_arow`` (row
    of ``cuda_api`` with the same (``rank``,) ``correlation_id`` and process; null in a left
    join when none matches). Both UInt32.

    The keys are folded into one Int64 when they fit, and joined by a merge of the sorted
    keys (each side sorted only when it is not already, as in nsys exports): on 1 M kernels
    against 2.5 M calls that takes ~0.02 s where a hash join takes ~0.25 s.
    """
    keys = rank_keys(ops, cuda_api)
    cols = [*keys, "correlation_id", "_process"]
    left = right = pl.DataFrame()
    folded: tuple[pl.Series, pl.Series] | None
    api_corr = cuda_api["correlation_id"]
    # the calls whose correlation id some op has: the join's right side when they are few
    # (NCCL kernels, or a kernel per 5 calls), so that no key is built for the others
    narrow = _calls_of(ops["correlation_id"], api_corr)
    if narrow is not None:
        api_corr = api_corr.gather(narrow)
        _release(cuda_api)  # the whole column read (5 M calls: 40 MB)
    # the narrowed calls' threads only (gathered, the whole column not kept): the calls of
    # other correlation ids can pair with no op, so one process among these is enough to fold
    api_tid = cuda_api["global_tid"] if narrow is None else _gathered(cuda_api, ["global_tid"], narrow)[0]
    if not keys and _one_process(ops["global_pid"], api_tid):
        folded = ops["correlation_id"], api_corr
    else:
        left = ops.select(*keys, "correlation_id", pl.col("global_pid").alias("_process"))
        # the correlation ids already read, not a second copy (20 M calls: 160 MB)
        right = pl.DataFrame([
            api_corr if c == "correlation_id" else api_tid if c == "global_tid"
            else (cuda_api[c] if narrow is None else cuda_api[c].gather(narrow))
            for c in (*keys, "correlation_id", "global_tid")
        ])
        right = right.select(*keys, "correlation_id", process_key("global_tid").alias("_process"))
        folded = _fold_keys(left, right, [*keys, "_process"])
        if folded is not None:  # the key columns are all the join needs
            left = right = pl.DataFrame()
    del api_corr, api_tid
    if folded is None:  # keys too wide for one integer: a hash join on the columns
        lk = _without_nulls(left.with_row_index("_lrow"), cols)
        rk = _without_nulls(right.with_row_index("_arow"), cols)
        pairs = lk.join(rk, on=cols, how="inner").select("_lrow", "_arow")
    else:
        lk = _without_nulls(folded[0].to_frame("_key").with_row_index("_lrow"), ["_key"])
        rk = _without_nulls(folded[1].to_frame("_key").with_row_index("_arow"), ["_key"])
        pairs = _merge_join(lk, rk)
    if how not in ("left", "inner"):
        msg = f"how must be 'left' or 'inner', not {how!r}"
        raise ValueError(msg)
    if narrow is not None:  # rows of the narrowed calls → rows of ``cuda_api``
        pairs = pairs.with_columns(narrow.gather(pairs["_arow"]).cast(pl.UInt32).alias("_arow"))
    if not pairs["_lrow"].is_sorted():
        pairs = pairs.sort("_lrow", maintain_order=True)
    if how == "left" and not is_identity(pairs["_lrow"], ops.height):  # some ops matched no call
        unmatched = pl.int_range(0, ops.height, dtype=pl.UInt32, eager=True).to_frame("_lrow")
        unmatched = unmatched.filter(~pl.col("_lrow").is_in(pairs["_lrow"].implode()))
        if unmatched.height:
            pairs = pl.concat([pairs, unmatched.with_columns(pl.lit(None, pl.UInt32).alias("_arow"))])
            pairs = pairs.sort("_lrow", maintain_order=True)
    return pairs


#: The join narrows the calls to those sharing an op's correlation id when the ops are fewer
#: than this share of the calls.
NARROW_SHARE = 0.5


def _calls_of(op_corr: pl.Series, api_corr: pl.Series) -> pl.Series | None:
    """Rows (UInt32, ascending) of the calls whose correlation id is among ``op_corr``'s, when
    the ops are fewer than :data:`NARROW_SHARE` of the calls and some calls have other ids;
    else ``None`` (join every call). Rows of other ids can match no op, so the join's pairs
    are the same either way."""
    if api_corr.len() == 0 or op_corr.len() >= NARROW_SHARE * api_corr.len():
        return None
    rows = api_corr.is_in(op_corr.drop_nulls().unique().implode()).arg_true()
    return None if rows.len() == api_corr.len() else rows.cast(pl.UInt32)


def _without_nulls(frame: pl.DataFrame, columns: list[str]) -> pl.DataFrame:
    """``frame`` without rows that have a null in ``columns`` (no copy when there are none)."""
    return frame.drop_nulls(columns) if frame.select(columns).null_count().sum_horizontal().item() else frame


#: Sorted runs of the left keys up to which :func:`_merge_join` merges run by run.
MERGE_RUNS = 16


def _merge_join(left: pl.DataFrame, right: pl.DataFrame) -> pl.DataFrame:
    """Inner join of ``_key`` (no nulls) as a merge of sorted sides; ``_lrow``, ``_arow``.

    When the left side is a few sorted runs (kernels, memcpys and memsets stacked into one
    frame are sorted per part, the API calls overall), each run is merged with the right
    side in turn. Otherwise, when the right side has unique keys, each left key is looked up
    by binary search: no sort of the left side and no re-sort of the result (a million ops:
    ~70 MB less memory, and faster)."""
    if not right["_key"].is_sorted():
        right = right.sort("_key", maintain_order=True)
    if not left["_key"].is_sorted():
        # a few sorted runs (kernels, memcpys, memsets stacked): merge each run with the
        # right side, linear where the binary search below costs log n per row (a million
        # ops against 2.5 M calls: 0.01-0.02 s instead of 0.05 s)
        descents = (left["_key"].diff() < 0).arg_true()
        if descents.len() < MERGE_RUNS:
            bounds = [0, *descents.to_list(), left.height]
            sorted_right = right.set_sorted("_key")
            parts = [
                left.slice(lo, hi - lo).set_sorted("_key").join(sorted_right, on="_key", how="inner").select("_lrow", "_arow")
                for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)
            ]
            return pl.concat(parts)
    keys = right["_key"]
    # sorted: unique when no two neighbours are equal (a hash set of 20 M keys took ~0.2 GB)
    unique = keys.len() < 2 or not (keys.slice(1) == keys.slice(0, keys.len() - 1)).any()
    if not left["_key"].is_sorted() and unique:
        at = keys.search_sorted(left["_key"], side="left")
        found = keys.gather(at.clip(upper_bound=max(keys.len() - 1, 0))) == left["_key"] if keys.len() else at != at
        return pl.DataFrame({"_lrow": left["_lrow"].filter(found), "_arow": right["_arow"].gather(at.filter(found))})
    if not left["_key"].is_sorted():
        left = left.sort("_key", maintain_order=True)
    joined = left.set_sorted("_key").join(right.set_sorted("_key"), on="_key", how="inner")
    return joined.select("_lrow", "_arow")


def _one_process(global_pid: pl.Series, global_tid: pl.Series) -> bool:
    """Whether every op and every call belong to one process (the usual case), from the
    columns' minima and maxima: no per-row work on millions of calls."""
    if global_pid.null_count() or global_tid.null_count():
        return False
    bounds = {v for v in (global_pid.min(), global_pid.max()) if v is not None}
    bounds |= {int(v) // PID_UNIT * PID_UNIT for v in (global_tid.min(), global_tid.max()) if v is not None}  # type: ignore[arg-type]
    return len(bounds) <= 1


def _fold_keys(left: pl.DataFrame, right: pl.DataFrame, proc_cols: list[str]) -> tuple[pl.Series, pl.Series] | None:
    """One Int64 per row of each side, equal exactly when (``proc_cols``, correlation id)
    are: ``correlation_id × processes + process index``; the correlation id alone when every
    row has the same process. None when a process column is null or the product overflows."""
    procs = pl.concat([left.select(proc_cols).unique(), right.select(proc_cols).unique()]).unique(maintain_order=True)
    if procs.null_count().sum_horizontal().item():
        return None
    n = procs.height
    if n <= 1:
        return left["correlation_id"], right["correlation_id"]
    corr_max = max(max_int(left["correlation_id"]), max_int(right["correlation_id"]))
    if corr_max >= (1 << 62) // n:
        return None
    procs = procs.with_row_index("_pidx").with_columns(pl.col("_pidx").cast(pl.Int64))
    key = (pl.col("correlation_id") * n + pl.col("_pidx")).alias("_key")
    if proc_cols == ["_process"]:
        # one process column: map it in place (a join would copy the whole frame)
        pidx = pl.col("_process").replace_strict(procs["_process"], procs["_pidx"], return_dtype=pl.Int64).alias("_pidx")
        inline = (pl.col("correlation_id") * n + pidx).alias("_key")
        return tuple(side.select(inline).to_series() for side in (left, right))  # type: ignore[return-value]
    return tuple(  # type: ignore[return-value]
        side.join(procs, on=proc_cols, how="left", maintain_order="left").select(key).to_series() for side in (left, right)
    )


# -- the range table -------------------------------------------------------------------------
def range_label(name: pl.Expr, domain: pl.Expr) -> pl.Expr:
    """``domain:name`` for ranges of a named domain, the bare name in the default domain."""
    return qualified_name(name, domain)


def path_label(label: pl.Expr) -> pl.Expr:
    """The step of a range in ``nvtx_path``: the label, except that PyTorch ``emit_nvtx``
    names (``aten::mm, seq = 146, op_id = 32, sizes = [...]``) keep only the operator name."""
    return pl.coalesce(label.str.extract(TORCH_OP_NAME.pattern, 1), label)


#: The column of an ``nvtx`` table cut to a span (:func:`nvtx_overlapping`) that holds each
#: row's number in the whole table (per ``rank``, as :func:`nvtx_ranges` numbers them).
WHOLE_ROW = "_whole_row"


def nvtx_overlapping(nvtx: pl.DataFrame, start_ns: int, end_ns: int) -> pl.DataFrame:
    """The rows of the whole ``nvtx`` table that overlap ``[start_ns, end_ns)`` (ns), and those
    without an end (marks, open ranges), each keeping its row number in the whole table in
    :data:`WHOLE_ROW`: :func:`nvtx_ranges` of the result gives each closed range the
    ``range_id``, ``parent_id``, ``level`` and ``path`` it has over the whole table (the ranges
    enclosing one that overlaps the span overlap it too, so they stay). An open range ends at
    the last time stamp of the rows kept, not of the whole table."""
    if WHOLE_ROW not in nvtx.columns:
        rk = rank_keys(nvtx)
        row = pl.int_range(1, pl.len() + 1, dtype=pl.Int64)
        nvtx = nvtx.with_columns((row.over(rk) if rk else row).alias(WHOLE_ROW))
    return nvtx.filter(pl.col("end_ns").is_null() | ((pl.col("end_ns") > start_ns) & (pl.col("start_ns") < end_ns)))


def nvtx_ranges(nvtx: pl.DataFrame) -> pl.DataFrame:
    """NVTX ranges that can enclose a CUDA call, with their nesting on each thread.

    Parameters
    ----------
    nvtx
        The whole ``nvtx`` table in file order (row ``i`` is ``NVTX_EVENTS`` row ``i + 1``; a
        multi-rank table counts rows per ``rank``), or a cut of it by :func:`nvtx_overlapping`.
        Pass it unfiltered otherwise: ``range_id`` is the row number.

    Returns
    -------
    One row per push/pop or start/end range that ends on the thread it began on, sorted by
    (``rank``,) ``global_tid``, ``start_ns``, longest first:

    ``[rank,] range_id`` (the ``NVTX_EVENTS`` row number, nsys's ``RangeId``), ``pid``,
    ``tid``, ``global_tid``, ``start_ns``, ``end_ns`` (an open range ends at the last
    timestamp of the range rows), ``is_open``, ``name``, ``domain``, ``label``
    (``domain:name`` or ``name``), ``style`` (``PushPop``/``StartEnd``), ``event_type_id``,
    ``parent_id`` (``range_id`` of the enclosing range on the thread: the containing range
    that minimises (start gap + end gap); null at top level), ``level`` (0 = outermost) and
    ``path`` (``path_label`` of each enclosing range and itself, outermost first, joined
    by ``/``).
    """
    tree = _nvtx_tree(nvtx, rank_keys(nvtx))
    return tree.drop("_thr", "_idx", "_parent_idx", "_crossing")


def _thread_ids(frame: pl.DataFrame, thread_keys: list[str]) -> pl.Expr:
    """Dense 0-based id of each thread in a frame sorted by ``thread_keys``."""
    changed = pl.any_horizontal([pl.col(k) != pl.col(k).shift(1) for k in thread_keys]).fill_null(True)
    return changed.cast(pl.Int64).cum_sum() - 1


def _range_tree(ranges: pl.DataFrame, keys: list[str], *, paths: bool = True) -> pl.DataFrame:
    """Sort ranges per thread and add ``_thr``, ``_idx``, ``_parent_idx``, ``parent_id``,
    ``level`` and (with ``paths``) ``path``."""
    tkeys = [*keys, "global_tid"]
    r = ranges.sort([*tkeys, "start_ns", "end_ns", "range_id"], descending=[*([False] * len(tkeys)), False, True, False])
    r = r.with_columns(_thread_ids(r, tkeys).alias("_thr")).with_row_index("_idx").with_columns(pl.col("_idx").cast(pl.Int64))
    prev = pl.when(pl.col("_thr") == pl.col("_thr").shift(1)).then(pl.col("_idx") - 1)
    r = r.with_columns(prev.alias("_parent_idx"))
    r = r.with_columns(_pointer_jump_parents(r["_parent_idx"], r["end_ns"]).alias("_parent_idx"))
    r = r.with_columns(_levels(r["_parent_idx"]).alias("level"))
    bad = _crossing_threads(r)
    if bad.len():
        r = _exact_parents(r, bad)
    r = r.with_columns(pl.col("_thr").is_in(bad.implode()).alias("_crossing"))
    r = r.with_columns(pl.col("range_id").gather(pl.col("_parent_idx")).alias("parent_id"))
    return r.with_columns(_paths(r).alias("path")) if paths else r


def _pointer_jump_parents(prev: pl.Series, end: pl.Series) -> pl.Series:
    """Parent index of each range of a nested family sorted by (thread, start, -end).

    Invariant: ``parent(r) <= cand(r) < r`` in sort order. A candidate that ends at or after
    ``r`` contains it and is the parent; one that ends before ``r`` ended before ``r`` began,
    and the parent of ``r`` then also encloses the candidate, so it can jump to the
    candidate's candidate. Synchronous jumps need O(log n) rounds; a range whose candidate
    contains it never jumps again, so each round works on the rows still jumping only (most
    settle in the first: 377 k ranges 0.10 -> 0.05 s).
    """
    cand = prev.clone()
    rows = pl.int_range(prev.len(), dtype=pl.UInt32, eager=True).filter(prev.is_not_null() & end.is_not_null())
    for _ in range(200):
        c = cand.gather(rows)
        jumping = (end.gather(c) < end.gather(rows)).fill_null(False)
        rows, c = rows.filter(jumping), c.filter(jumping)
        if rows.len() == 0:
            break
        cand.scatter(rows, cand.gather(c))  # every jump from the candidates before this round
    return cand


def _levels(parent: pl.Series) -> pl.Series:
    """Number of ancestors of each node of a forest given by parent indices (list ranking)."""
    t = pl.DataFrame({"anc": parent}).with_columns(pl.col("anc").is_not_null().cast(pl.Int64).alias("d"))
    while t["anc"].null_count() < t.height:
        t = t.with_columns(
            (pl.col("d") + pl.col("d").gather(pl.col("anc")).fill_null(0)).alias("d"),
            pl.col("anc").gather(pl.col("anc")).alias("anc"),
        )
    return t["d"]


def _crossing_threads(r: pl.DataFrame) -> pl.Series:
    """Threads whose ranges are not nested: for some range, the ranges still open at its
    start outnumber its computed ancestors."""
    first = pl.col("_idx").min().over("_thr")
    ends = r.select("_thr", pl.col("end_ns").alias("_t")).sort("_thr", "_t")
    ends = ends.with_columns(pl.int_range(1, pl.len() + 1, dtype=pl.Int64).over("_thr").alias("_ended"))
    starts = r.select("_thr", "_idx", "level", (pl.col("_idx") - first).alias("_pos"), pl.col("start_ns").alias("_t")).sort("_thr", "_t")
    j = starts.join_asof(ends, on="_t", by="_thr", strategy="backward", check_sortedness=False)
    opened = pl.col("_pos") - pl.col("_ended").fill_null(0)
    return j.filter(opened != pl.col("level"))["_thr"].unique()


def _containing(inner: pl.DataFrame, outer: pl.DataFrame) -> pl.DataFrame:
    """Every (inner row, outer range) pair of the same ``_thr`` where the range contains the
    interval (``_rs <= _s`` and ``_e <= _re``): ``inner``'s columns plus ``outer``'s.

    ``inner`` has ``_thr``, ``_s``, ``_e``; ``outer`` has ``_thr``, ``_rs``, ``_re`` (other
    columns ride along; names must not clash). Rows with a null time match nothing. Only the
    matching pairs are built (an inequality join on times ranked and offset per thread), so
    memory follows the number of containments, not (ranges of a thread)²: the self-join this
    replaced took 2.3 GB on a 2 MB export whose crossing ranges were damaged.
    """
    inner = inner.drop_nulls(["_thr", "_s", "_e"])
    outer = outer.drop_nulls(["_thr", "_rs", "_re"])
    if inner.height == 0 or outer.height == 0:
        return inner.head(0).join(outer.head(0).drop("_thr"), how="cross")
    times = pl.concat([inner["_s"], inner["_e"], outer["_rs"], outer["_re"]]).unique().sort()
    width = times.len()

    def ranked(frame: pl.DataFrame, cols: tuple[str, str], names: tuple[str, str]) -> pl.DataFrame:
        # (thread, time rank) folded into one integer: no range of one thread can contain an
        # interval of another, whatever their times (ranks are < width)
        base = frame["_thr"].cast(pl.Int64) * width
        return frame.with_columns(
            (base + times.search_sorted(frame[cols[0]]).cast(pl.Int64)).alias(names[0]),
            (base + times.search_sorted(frame[cols[1]]).cast(pl.Int64)).alias(names[1]),
        )

    a = ranked(inner, ("_s", "_e"), ("_ks", "_ke"))
    b = ranked(outer, ("_rs", "_re"), ("_krs", "_kre")).rename({"_thr": "_thr_o"})
    pairs = a.join_where(b, pl.col("_krs") <= pl.col("_ks"), pl.col("_kre") >= pl.col("_ke"))
    return pairs.drop("_ks", "_ke", "_krs", "_kre", "_thr_o")


def _exact_parents(r: pl.DataFrame, bad: pl.Series) -> pl.DataFrame:
    """Parents on threads with crossing ranges, by nsys's rule: the containing range (earlier
    in sort order) with the smallest (start gap + end gap)."""
    sub = r.filter(pl.col("_thr").is_in(bad.implode())).select("_thr", "_idx", pl.col("start_ns").alias("_s"), pl.col("end_ns").alias("_e"))
    outer = sub.select("_thr", pl.col("_idx").alias("_idx_o"), pl.col("_s").alias("_rs"), pl.col("_e").alias("_re"))
    pairs = _containing(sub, outer).filter(pl.col("_idx_o") < pl.col("_idx")).select(
        "_idx", "_idx_o", pl.col("_s").alias("start_ns"), pl.col("_e").alias("end_ns"),
        pl.col("_rs").alias("start_ns_o"), pl.col("_re").alias("end_ns_o"),
    )
    cost = (pl.col("start_ns") - pl.col("start_ns_o")) + (pl.col("end_ns_o") - pl.col("end_ns"))
    best = (
        pairs.with_columns(cost.alias("_cost"))
        .sort(["_idx", "_cost", "start_ns_o", "_idx_o"], descending=[False, False, True, True])
        .unique(subset=["_idx"], keep="first")
        .select("_idx", pl.col("_idx_o").alias("_exact"))
    )
    r = r.join(best, on="_idx", how="left", maintain_order="left").with_columns(
        pl.when(pl.col("_thr").is_in(bad.implode())).then(pl.col("_exact")).otherwise(pl.col("_parent_idx")).alias("_parent_idx")
    ).drop("_exact")
    return r.with_columns(_levels(r["_parent_idx"]).alias("level"))


def _paths(r: pl.DataFrame) -> pl.Series:
    """``path`` of every range: parents' paths are complete before their children's level."""
    t = r.select("_parent_idx", "level", path_label(pl.col("label")).alias("path"))
    for level in range(1, max_int(t["level"]) + 1):
        t = t.with_columns(
            pl.when(pl.col("level") == level)
            .then(pl.format("{}/{}", pl.col("path").gather(pl.col("_parent_idx")), pl.col("path")))
            .otherwise(pl.col("path"))
            .alias("path")
        )
    return t["path"]


# -- API call → innermost range --------------------------------------------------------------
def innermost_starts(tree: pl.DataFrame) -> pl.DataFrame:
    """What :func:`_innermost` searches: one row per (thread, start), the last in sort order
    (the innermost of equal starts). Computed once when calls are searched in chunks.

    The tree is sorted by thread and start, so equal (thread, start) rows are neighbours and
    the last of each run is kept by comparing each row with the next (217 k ranges: ~2 ms
    where an order-keeping ``unique`` took ~20 ms); a tree not sorted so takes the ``unique``."""
    s = tree.select("_thr", pl.col("start_ns").alias("_s"), "_idx")
    thr, start = pl.col("_thr"), pl.col("_s")
    ordered = s.select(
        (s.null_count().sum_horizontal() == 0).first()
        & ((thr.diff() > 0) | ((thr.diff() == 0) & (start.diff() >= 0))).slice(1).all()
    ).item()
    if not ordered:
        return s.unique(subset=["_thr", "_s"], keep="last", maintain_order=True)
    last = ((thr != thr.shift(-1)) | (start != start.shift(-1))).fill_null(True)
    return s.filter(last)


def _innermost(calls: pl.DataFrame, tree: pl.DataFrame, *, starts: pl.DataFrame | None = None) -> pl.DataFrame:
    """Innermost range of ``tree`` containing each call.

    ``calls`` has ``_op``, ``_thr`` (the thread to search, as in ``tree``), ``_s``, ``_e``;
    the result has ``_op`` and ``_idx`` (null when no range contains the call). ``starts``:
    :func:`innermost_starts` of ``tree``, when already computed.
    """
    if calls.height == 0 or tree.height == 0:
        return calls.select("_op", pl.lit(None, pl.Int64).alias("_idx"))
    if starts is None:
        starts = innermost_starts(tree)
    c = _sort_by_thread_time(calls)
    one_thread = starts["_thr"].n_unique() == 1 and c["_thr"].n_unique() == 1 and starts["_thr"][0] == c["_thr"][0]
    by = {} if one_thread else {"by": "_thr"}  # the asof join is ~2x faster without groups
    c = c.join_asof(starts, on="_s", strategy="backward", check_sortedness=False, **by)  # type: ignore[arg-type]
    end = tree["end_ns"]
    parent = tree["_parent_idx"]
    frame = pl.DataFrame({"end": end, "parent": parent})
    c = c.with_columns(pl.col("_idx").cast(pl.Int64))
    for _ in range(10_000):
        ends = frame["end"].gather(c["_idx"])
        climb = (ends < c["_e"]).fill_null(False)
        if not climb.any():
            break
        c = c.with_columns(pl.when(climb).then(frame["parent"].gather(c["_idx"])).otherwise(pl.col("_idx")).alias("_idx"))
    bad = _crossing_thread_set(tree)
    if bad.len():
        exact = _innermost_exact(c.filter(pl.col("_thr").is_in(bad.implode())), tree)
        c = c.join(exact, on="_op", how="left", maintain_order="left").with_columns(
            pl.when(pl.col("_thr").is_in(bad.implode())).then(pl.col("_exact")).otherwise(pl.col("_idx")).alias("_idx")
        )
    return c.select("_op", "_idx")


def innermost_ranges(ranges: pl.DataFrame, calls: pl.DataFrame) -> pl.Series:
    """For each row of ``calls`` (``pid``, ``tid``, ``time_ns``), the ``range_id`` of the
    innermost row of ``ranges`` (``pid``, ``tid``, ``start_ns``, ``end_ns``, ``range_id``;
    properly nested per thread, as CPU operators and ``record_function`` ranges are) on the
    same thread whose time holds ``time_ns``; null where none does. In ``calls``' order."""
    r = ranges.select("pid", pl.col("tid").alias("global_tid"), "start_ns", "end_ns", "range_id").drop_nulls(["start_ns", "end_ns"])
    if r.height == 0 or calls.height == 0:
        return pl.Series("range_id", [None] * calls.height, dtype=pl.Int64)
    tree = _range_tree(r, ["pid"], paths=False)
    threads = tree.select("pid", pl.col("global_tid").alias("tid"), "_thr").unique(["pid", "tid"])
    c = calls.select("pid", "tid", "time_ns").with_row_index("_op").with_columns(pl.col("_op").cast(pl.Int64))
    c = c.join(threads, on=["pid", "tid"], how="inner").select("_op", "_thr", pl.col("time_ns").alias("_s"), pl.col("time_ns").alias("_e"))
    inner = _innermost(c, tree).filter(pl.col("_idx").is_not_null())
    found = inner.select("_op", tree.get_column("range_id").gather(inner.get_column("_idx")).cast(pl.Int64).alias("range_id"))
    out = pl.DataFrame({"_op": pl.int_range(calls.height, dtype=pl.Int64, eager=True)}).join(found, on="_op", how="left", maintain_order="left")
    return out.get_column("range_id")


def _sort_by_thread_time(calls: pl.DataFrame) -> pl.DataFrame:
    """``calls`` sorted by (``_thr``, ``_s``). Both fold into one Int64 key when they fit
    (``_thr`` × time span + time offset): a one-column sort of 1 M calls takes ~0.03 s where
    the two-column sort takes ~0.2 s."""
    if calls.height == 0 or calls.select(pl.col("_thr", "_s").null_count()).sum_horizontal().item():
        return calls.sort("_thr", "_s")
    lo, hi = calls["_s"].min(), calls["_s"].max()
    threads = max_int(calls["_thr"]) + 1
    span = int(hi) - int(lo) + 1  # type: ignore[arg-type]
    if calls["_thr"].min() < 0 or threads * span >= 1 << 62:  # type: ignore[operator]
        return calls.sort("_thr", "_s")
    key = pl.col("_thr") * span + (pl.col("_s") - lo)
    return calls.sort(key, maintain_order=True)


def _crossing_thread_set(tree: pl.DataFrame) -> pl.Series:
    """Threads of ``tree`` whose ranges cross (see :func:`_range_tree`)."""
    return tree.filter(pl.col("_crossing"))["_thr"].unique()


def _innermost_exact(calls: pl.DataFrame, tree: pl.DataFrame) -> pl.DataFrame:
    sub = tree.select("_thr", "_idx", pl.col("start_ns").alias("_rs"), pl.col("end_ns").alias("_re"))
    pairs = _containing(calls.select("_op", "_thr", "_s", "_e"), sub)
    return (
        pairs.sort(["_op", "_rs", "_idx"], descending=[False, True, True])
        .unique(subset=["_op"], keep="first")
        .select("_op", pl.col("_idx").alias("_exact"))
    )


def _possible(ranges: pl.DataFrame) -> pl.DataFrame:
    """``ranges`` without those whose times are impossible (no start, or an end before the
    start: a damaged export), after one warning with their count. nsys 2023.4 stops on such
    ranges in the projection reports (``rtree constraint failed``); kept, they made the
    threads they are on look crossing and the exact joins grew to gigabytes."""
    impossible = pl.col("start_ns").is_null() | (pl.col("end_ns") < pl.col("start_ns")).fill_null(False)
    bad = ranges.select(impossible.sum()).item()
    if bad:
        msg = (
            f"{bad} NVTX range(s) end before they start or have no start (a damaged export?); "
            "they are left out of the NVTX attribution and projections"
        )
        warnings.warn(msg, DamagedRowsWarning, stacklevel=4)
        ranges = ranges.filter(~impossible)
    if ranges.height:
        # an end of INT64_MAX (a flipped high bit): kept, as nsys keeps it in its projections,
        # but said — such a range holds everything its thread launches after its start
        far = ranges.select(implausible_end().sum()).item()
        if far:
            msg = (f"{far} NVTX range(s) end far past the capture (INT64_MAX or a flipped high bit: a damaged export?); "
                   "kept as nsys keeps them, so they hold every operation launched after their start on their thread")
            warnings.warn(msg, DamagedRowsWarning, stacklevel=4)
    return ranges


def _nvtx_tree(
    nvtx: pl.DataFrame, keys: list[str], *, paths: bool = True, labels: bool | None = None, lean: bool = False
) -> pl.DataFrame:
    """:func:`nvtx_ranges` with the internal ``_thr``, ``_idx``, ``_parent_idx`` and ``_crossing``;
    without ``paths``, no ``path`` text and, unless ``labels``, no ``label`` either (the nsys
    projection reports print neither; on 6.5 M ranges they took ~0.3 GB). ``labels=True``
    with ``paths=False`` is what a caller that matches range names but never reads paths
    needs: the paths, rebuilt level by level, were the tree's biggest step (377 k ranges:
    ~+100 MB). ``lean``: only the keys, ``range_id``, ``pid``, ``tid``, ``global_tid``,
    ``start_ns``, ``end_ns`` and ``label`` besides the internal columns (no ``name``,
    ``domain``, ``style``, ``event_type_id``, ``is_open``: the tree is sorted and held with
    every column it carries)."""
    labels = paths if labels is None else labels or paths
    rid = pl.int_range(1, pl.len() + 1, dtype=pl.Int64)
    read = [*keys, "pid", "tid", "global_tid", "start_ns", "end_ns", "name", "domain", "event_type_id", "end_global_tid"]
    # only what the ranges keep is filtered (a loaded table has payloads, colours, JSON …)
    # a cut of the table (nvtx_overlapping) carries its rows' numbers in the whole table
    number = pl.col(WHOLE_ROW) if WHOLE_ROW in nvtx.columns else rid.over(keys) if keys else rid
    events = nvtx.select(*read, number.alias("range_id"))
    ranges = events.filter(
        pl.col("event_type_id").is_in(list(RANGE_TYPES)) & pl.col("end_global_tid").is_null()
    )
    ranges = _possible(ranges)
    last = pl.max_horizontal(pl.col("start_ns").max(), pl.col("end_ns").max())
    ranges = ranges.with_columns(
        pl.col("end_ns").is_null().alias("is_open"),
        pl.col("end_ns").fill_null(last.over(keys) if keys else last).alias("end_ns"),
    ).select(
        *keys, "range_id", "pid", "tid", "global_tid", "start_ns", "end_ns", "is_open", "name", "domain",
        *([range_label(pl.col("name"), pl.col("domain")).alias("label")] if labels else []),
        pl.when(pl.col("event_type_id").is_in(list(PUSHPOP_TYPES))).then(pl.lit("PushPop")).otherwise(pl.lit("StartEnd")).alias("style"),
        "event_type_id",
    )
    if lean:
        ranges = ranges.select(*keys, "range_id", "pid", "tid", "global_tid", "start_ns", "end_ns", *(["label"] if labels else []))
    return _range_tree(ranges, keys, paths=paths)


def _enclosing(calls: pl.DataFrame, tree: pl.DataFrame, inner: pl.DataFrame | None = None) -> pl.DataFrame:
    """Every range of ``tree`` containing each call: rows ``_op``, ``_idx`` (the innermost
    range's ancestors on nested threads, an exact join on crossing ones). ``inner`` is
    :func:`_innermost`'s result when already computed."""
    inner = (_innermost(calls, tree) if inner is None else inner).filter(pl.col("_idx").is_not_null())
    bad = _crossing_thread_set(tree)
    parent = tree["_parent_idx"]
    parts = []
    cur = inner
    if bad.len():
        on_bad = calls.filter(pl.col("_thr").is_in(bad.implode()))
        cur = cur.join(on_bad.select("_op"), on="_op", how="anti")
        sub = tree.filter(pl.col("_thr").is_in(bad.implode())).select(
            "_thr", "_idx", pl.col("start_ns").alias("_rs"), pl.col("end_ns").alias("_re")
        )
        exact = _containing(on_bad.select("_op", "_thr", "_s", "_e"), sub)
        parts.append(exact.select("_op", "_idx"))
    while cur.height:
        parts.append(cur)
        cur = cur.with_columns(parent.gather(cur["_idx"]).alias("_idx")).filter(pl.col("_idx").is_not_null())
    if not parts:
        return inner.select("_op", "_idx")
    return pl.concat(parts)


# -- ops → ranges ----------------------------------------------------------------------------
def attribute_nvtx(ops_with_launch: pl.DataFrame, nvtx: pl.DataFrame, *, fallback: str = "process") -> pl.DataFrame:
    """Add the NVTX ranges that enclosed each operation's launching call.

    Parameters
    ----------
    ops_with_launch
        The output of :func:`launch_info` (needs ``global_tid``, ``api_start_ns``,
        ``api_end_ns``; ``rank`` for a multi-rank table set).
    nvtx
        The whole ``nvtx`` table, unfiltered and in file order (see :func:`nvtx_ranges`).
    fallback
        ``"process"`` (default): a call with no enclosing range on its own thread takes the
        innermost range that encloses it on another thread of the same process (the one that
        started last), flagged ``"process_fallback"``. ``"none"``: such calls stay
        unattributed.

    Returns
    -------
    ``ops_with_launch`` in its order with:

    ``nvtx_range``
        label of the innermost enclosing range (``domain:name`` in a named domain).
    ``nvtx_path``
        the enclosing ranges, outermost first, joined by ``/`` (``step.3/layer.2/attn``);
        PyTorch ``emit_nvtx`` names appear as their operator name (``aten::mm``).
    ``nvtx_depth``
        number of ranges on the path (0 when none).
    ``nvtx_range_id``
        ``range_id`` of the innermost range (the ``NVTX_EVENTS`` row number; join with
        :func:`nvtx_ranges` for its thread, times and parent).
    ``attribution``
        ``"thread"`` (nsys's rule), ``"process_fallback"`` or ``"none"``.
    """
    if fallback not in FALLBACKS:
        msg = f"unknown fallback {fallback!r}; use one of {', '.join(FALLBACKS)}"
        raise ValueError(msg)
    missing = [c for c in ("global_tid", "api_start_ns", "api_end_ns") if c not in ops_with_launch.columns]
    if missing:
        msg = f"ops lack {', '.join(missing)}; pass them through tracekit.analysis.attribution.launch_info first"
        raise ValueError(msg)
    keys = rank_keys(ops_with_launch, nvtx)
    tkeys = [*keys, "global_tid"]
    base = ops_with_launch.drop([c for c in _NVTX_COLUMNS if c in ops_with_launch.columns])
    n = base.height
    tree = _nvtx_tree(nvtx, keys)
    threads = tree.select(*tkeys, "_thr").unique(subset=tkeys, keep="first", maintain_order=True)

    calls = base.select(*tkeys, "api_start_ns", "api_end_ns").with_row_index("_op").filter(
        pl.col("api_start_ns").is_not_null()
    ).select(pl.col("_op").cast(pl.Int64), *tkeys, pl.col("api_start_ns").alias("_s"), pl.col("api_end_ns").alias("_e"))
    own = calls.join(threads, on=tkeys, how="inner")
    found = _innermost(own.select("_op", "_thr", "_s", "_e"), tree).filter(pl.col("_idx").is_not_null())
    # dense per-op columns: the range index and how it was found
    idx = pl.repeat(None, n, dtype=pl.Int64, eager=True)
    how = pl.repeat("none", n, dtype=pl.Utf8, eager=True)
    if found.height:
        idx = idx.scatter(found["_op"], found["_idx"])
        how = how.scatter(found["_op"], "thread")

    if fallback == "process":
        rest = calls.filter(idx.gather(calls["_op"]).is_null())
        proc_threads = threads.with_columns(process_key("global_tid").alias("_process")).rename({"global_tid": "_cand_tid"})
        cand = rest.with_columns(process_key("global_tid").alias("_process")).join(
            proc_threads, on=[*keys, "_process"], how="inner"
        ).filter(pl.col("_cand_tid") != pl.col("global_tid"))
        if cand.height:
            # one search per (call, other thread of its process): key the searches by pair id
            cand = cand.with_row_index("_pair").with_columns(pl.col("_pair").cast(pl.Int64))
            hits = _innermost(cand.select(pl.col("_pair").alias("_op"), "_thr", "_s", "_e"), tree)
            hits = hits.filter(pl.col("_idx").is_not_null())
            hits = hits.with_columns(
                cand["_op"].gather(hits["_op"]).alias("_call"),
                tree["start_ns"].gather(hits["_idx"]).alias("_rs"),
            )
            best = hits.sort(["_call", "_rs", "_idx"], descending=[False, True, True]).unique(subset=["_call"], keep="first")
            if best.height:
                idx = idx.scatter(best["_call"], best["_idx"])
                how = how.scatter(best["_call"], "process_fallback")

    return base.with_columns(
        tree["label"].gather(idx).alias("nvtx_range"),
        tree["path"].gather(idx).alias("nvtx_path"),
        (tree["level"].gather(idx) + 1).fill_null(0).cast(pl.Int64).alias("nvtx_depth"),
        tree["range_id"].gather(idx).alias("nvtx_range_id"),
        how.alias("attribution"),
    )


#: The ``nvtx`` columns :func:`attribute_nvtx` reads (all rows are needed: ``range_id`` is
#: the row number).
NVTX_COLUMNS: tuple[str, ...] = (
    "pid", "tid", "global_tid", "event_type_id", "start_ns", "end_ns", "name", "domain", "end_global_tid",
)
_OP_COLUMNS = ("pid", "global_pid", "device_id", "context_id", "stream_id", "correlation_id", "start_ns", "end_ns", "duration_ns")
# no "tid": launch_info derives it from the gathered global_tid, as the cuda_api reader does
_API_COLUMNS = ("correlation_id", "global_tid", "name", "start_ns", "end_ns", "api")


def attribute_trace(trace: NsysTrace, *, fallback: str = "process") -> pl.DataFrame:
    """Every kernel, memcpy, memset and whole-graph launch of ``trace`` with its launching
    call and NVTX ranges.

    The same frame as ``attribute_nvtx(launch_info(gpu_ops(trace.kernels, trace.memcpys,
    trace.memsets, trace.graph_trace), trace.cuda_api), trace.nvtx, fallback=fallback)``, built from only the
    columns those functions read; the API calls come one column at a time
    (:meth:`~tracekit.nsys.trace.NsysTrace.columns_on_demand`), so the 2.5 M calls of a
    1 M-kernel trace are never all in memory (tables the trace already built are used as
    they are). Columns: those of :func:`~tracekit.analysis._frames.gpu_ops`, then
    :func:`launch_info`'s and :func:`attribute_nvtx`'s.
    """
    ops = gpu_ops(
        trace.table("kernels", [*_OP_COLUMNS, "name"]),
        trace.table("memcpys", [*_OP_COLUMNS, "bytes", "copy_kind", "copy_kind_label"]),
        trace.table("memsets", [*_OP_COLUMNS, "bytes"]),
        _graph_rows(trace),
    )
    launched = launch_info(ops, trace.columns_on_demand("cuda_api", _API_COLUMNS))
    return attribute_nvtx(launched, trace.table("nvtx", NVTX_COLUMNS), fallback=fallback)


def _graph_rows(trace: NsysTrace) -> pl.DataFrame | None:
    """The trace's whole-graph launches (``graph_trace``), or ``None`` for an object without them."""
    frame = getattr(trace, "graph_trace", None)
    if not isinstance(frame, pl.DataFrame):
        return None
    return frame.select([c for c in ["rank", *_OP_COLUMNS, "graph_id"] if c in frame.columns])


def enclosing_ranges(ops_with_launch: pl.DataFrame, nvtx: pl.DataFrame) -> pl.DataFrame:
    """Every NVTX range enclosing each operation's launching call (nsys's thread rule).

    Unlike :func:`attribute_nvtx`, which keeps the innermost range, this lists all of them:
    an operation inside ``step.3/layer.2/attn`` gives three rows. Inputs as for
    :func:`attribute_nvtx`.

    Returns ``op_index`` (0-based row of ``ops_with_launch``), ``[rank,] range_id``, ``level``
    (0 = outermost) and ``label`` of the range.
    """
    keys = rank_keys(ops_with_launch, nvtx)
    tkeys = [*keys, "global_tid"]
    tree = _nvtx_tree(nvtx, keys)
    threads = tree.select(*tkeys, "_thr").unique(subset=tkeys, keep="first", maintain_order=True)
    calls = (
        ops_with_launch.with_row_index("_op")
        .filter(pl.col("api_start_ns").is_not_null())
        .join(threads, on=tkeys, how="inner")
        .select("_op", "_thr", pl.col("api_start_ns").alias("_s"), pl.col("api_end_ns").alias("_e"))
    )
    pairs = _enclosing(calls, tree)
    out = pairs.join(tree.select("_idx", *keys, "range_id", "level", "label"), on="_idx")
    return out.select(pl.col("_op").cast(pl.Int64).alias("op_index"), *keys, "range_id", "level", "label").sort("op_index", "level")


def nvtx_coverage(attributed: pl.DataFrame, *, by: list[str] | None = None) -> pl.DataFrame:
    """Share of GPU time whose launch :func:`attribute_nvtx` tied to some range.

    Input: an :func:`attribute_nvtx` result (``duration_ns``, ``attribution``; ``rank`` and
    the ``by`` columns when given, e.g. ``["device_id"]``).

    Returns one row per (``rank``,) ``by`` group: ``ops``, ``gpu_time_ns`` (sum of
    ``duration_ns``), ``thread_ns``, ``process_fallback_ns``, ``none_ns`` and
    ``coverage`` (= (thread + fallback) / total, 0–1) and ``thread_coverage`` (thread only).
    """
    keys = [*rank_keys(attributed), *(by or [])]
    d = pl.col("duration_ns")
    a = pl.col("attribution")
    aggs = [
        pl.len().alias("ops"),
        d.sum().alias("gpu_time_ns"),
        d.filter(a == "thread").sum().alias("thread_ns"),
        d.filter(a == "process_fallback").sum().alias("process_fallback_ns"),
        d.filter(a == "none").sum().alias("none_ns"),
    ]
    out = attributed.group_by(keys, maintain_order=True).agg(aggs) if keys else attributed.select(aggs)
    total = pl.col("gpu_time_ns").cast(pl.Float64)
    return out.with_columns(
        pl.when(total > 0).then((pl.col("thread_ns") + pl.col("process_fallback_ns")) / total).alias("coverage"),
        pl.when(total > 0).then(pl.col("thread_ns") / total).alias("thread_coverage"),
    )


__all__ = [
    "FALLBACKS",
    "PID_UNIT",
    "RANGE_TYPES",
    "NVTX_COLUMNS",
    "WHOLE_ROW",
    "attribute_nvtx",
    "attribute_trace",
    "enclosing_ranges",
    "launch_info",
    "launch_pairs",
    "nvtx_coverage",
    "nvtx_overlapping",
    "nvtx_ranges",
    "path_label",
    "range_label",
]
