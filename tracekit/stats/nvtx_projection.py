"""NVTX ranges projected onto the GPU: ``nvtx_gpu_proj_trace``, ``nvtx_gpu_proj_sum``, ``nvtx_kern_sum``.

A GPU operation (kernel, memcpy, memset) belongs to every NVTX range that encloses its
launching API call on the launching thread (nsys's rule; see
:mod:`tracekit.analysis.attribution`, which computes it with sorted joins). A range's
*projection* runs from the first start to the last end of its operations.

Version conventions: nsys 2025.x prefixes default-domain range names with ``:``
(``:step.0``) in all three reports and drops operations outside every range from
``nvtx_gpu_proj_trace``; 2023.x prints bare names and gives all those operations one row
with an empty name (and the PID/TID of the last of them, in launch order, that started
earlier or ended later than all before it: SQLite's bare columns beside min/max). ``nvtx_kern_sum`` lists kernels outside every range, with
an empty range name, in both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import polars as pl

from tracekit.analysis._frames import PID_UNIT, is_identity, max_int
from tracekit.analysis.attribution import (
    NVTX_COLUMNS,
    _enclosing,
    _innermost,
    _launch_join,
    _nvtx_tree,
    innermost_starts,
    launch_pairs,
)
from tracekit.analysis.op_launches import KERNEL_TABLE, api_rows, lean_api_rows, op_launches
from tracekit.errors import UnsupportedReportError
from tracekit.nsys import database, readers
from tracekit.nsys.database import ensure_memory
from tracekit.nsys.nvtx import qualified_name
from tracekit.nsys.readers import Col
from tracekit.stats.common import Report, group_numbers, stat_aggs
from tracekit.stats.kern_sum_windows import KernSumWindows
from tracekit.stats.summaries import nvtx_range_name

if TYPE_CHECKING:
    from tracekit.nsys.trace import NsysTrace


# -- inputs: only the columns the reports need ----------------------------------------------
# A report reads narrow integer columns straight from the export (names stay string ids until
# the end) unless the trace already built the full table, which it then reuses. On a
# 1M-kernel export this halves the reading time and cuts memory by ~4×.
_OP_COLUMNS = {
    "start_ns": "start", "end_ns": "end", "device_id": "deviceId", "correlation_id": "correlationId",
    "global_pid": "globalPid", "grid_x": "gridX", "grid_y": "gridY", "grid_z": "gridZ",
    "block_x": "blockX", "block_y": "blockY", "block_z": "blockZ",
}


def _loaded(trace: NsysTrace, table: str) -> pl.DataFrame | None:
    """The trace's ``table`` if it was already built, else None."""
    return trace.table(table) if trace.is_loaded(table) else None


def op_rows(trace: NsysTrace, table: str, columns: list[str], *, names: bool = False, duration: bool = True) -> pl.DataFrame:
    """``columns`` (loader names, from :data:`_OP_COLUMNS`) of a GPU activity table, plus
    ``duration_ns`` (unless ``duration=False``) and, with ``names``, ``name``: the kernel's
    demangled name, as its ``StringIds`` id (Int64) when read here or as text when reused
    from ``trace.kernels``."""
    loader = {KERNEL_TABLE: "kernels", "CUPTI_ACTIVITY_KIND_MEMCPY": "memcpys", "CUPTI_ACTIVITY_KIND_MEMSET": "memsets"}[table]
    extra = [*(["duration_ns"] if duration else []), *(["name"] if names else [])]
    cached = _loaded(trace, loader)
    if cached is not None:
        return cached.select(*columns, *extra)
    read = [*columns, *(c for c in ("start_ns", "end_ns") if duration and c not in columns)]
    cols = [Col(c, _OP_COLUMNS[c]) for c in read] + ([Col("name", "demangledName")] if names else [])
    frame = readers.select(trace.db, table, cols)  # an absent table gives an empty frame of these columns
    if duration:
        frame = frame.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("duration_ns"))
    return frame.select(*columns, *extra)


def resolve_names(frame: pl.DataFrame, strings: pl.DataFrame, *columns: str) -> pl.DataFrame:
    """``frame`` with its string-id ``columns`` turned into text by ``strings`` (``StringIds``
    rows holding at least the ids in them; text columns pass through)."""
    ids = [c for c in columns if frame.schema[c] != pl.Utf8]
    if not ids:
        return frame
    return frame.with_columns(readers.lookup_strings(pl.col(c), strings).alias(c) for c in ids)


def names_are_ids(frame: pl.DataFrame, column: str, strings: pl.DataFrame) -> bool:
    """Whether ``column`` holds string ids that can be grouped on instead of the text: no two
    of its values have one text by ``strings`` (``StringIds`` rows holding at least its ids),
    a null or an id without a text counting as the text null (a damaged export's unknown ids
    are one group by text, as :func:`resolve_names` then makes them)."""
    if frame.schema[column] != pl.Int64:
        return False
    ids = frame.get_column(column).unique()
    return _one_id_per_text(ids, _texts(ids, strings))


def _texts(ids: pl.Series, strings: pl.DataFrame) -> pl.Series:
    """The text of each of ``ids`` by ``strings`` (null where it has none)."""
    return ids.to_frame("i").select(readers.lookup_strings(pl.col("i"), strings)).to_series()


def _one_id_per_text(ids: pl.Series, texts: pl.Series) -> bool:
    """Whether the distinct ``ids`` have distinct ``texts`` (theirs, in order; null one text)."""
    return bool(texts.n_unique() == ids.len())


@dataclass
class Projection:
    """Inputs shared by the three reports: the range tree, the GPU ops with their launching
    call (row ``i`` has ``_op == i``), the calls searched (``_op``, ``_thr``, ``_s``, ``_e``),
    each call's innermost range (``inner``: ``_op``, ``_idx``) and whether each op has an
    enclosing range (``inside``, aligned with ``ops``)."""

    tree: pl.DataFrame
    ops: pl.DataFrame
    calls: pl.DataFrame
    inner: pl.DataFrame
    inside: pl.Series
    #: (op, range) memberships beyond the innermost range's ancestors: a call that starts
    #: exactly where a sibling range ends belongs to both (nsys's closed interval).
    extra: pl.DataFrame | None = None

    def pairs(self) -> pl.DataFrame:
        """Every (op, enclosing range): ``_op`` (Int64) and ``_idx``; an op inside
        ``step/layer/attn`` gives three rows."""
        base = _enclosing(self.calls, self.tree, self.inner).with_columns(pl.col("_op").cast(pl.Int64))
        if self.extra is None or self.extra.height == 0:
            return base
        return pl.concat([base, self.extra.select(pl.col("_op").cast(pl.Int64), pl.col("_idx").cast(base.schema["_idx"]))]).unique(
            maintain_order=True
        )

    def range_totals(self) -> pl.DataFrame:
        """Per range with GPU work: ``_idx``, ``_ps`` (first op start), ``_pe`` (last op
        end) and ``_n`` (distinct correlation ids of its ops and its descendants' ops)."""
        return _range_totals(self)


def _require_nvtx(trace: NsysTrace, report: str) -> None:
    if not trace.db.has_table("NVTX_EVENTS"):
        msg = f"{trace.path.name} has no NVTX_EVENTS table, so it cannot give {report}: capture with --trace=nvtx and annotate the program with NVTX ranges"
        raise UnsupportedReportError(msg)


#: The ``nvtx`` columns the range tree needs (``range_id`` numbers every row, so all rows stay).
_TREE_COLUMNS = list(NVTX_COLUMNS)


def projection(trace: NsysTrace, *, kernels_only: bool = False) -> Projection:
    """Attribute every GPU operation of ``trace`` to all ranges enclosing its launch.

    ``ops`` has one row per (operation, matching API row), ``_op`` numbering the rows. With
    ``kernels_only`` (``nvtx_kern_sum``) every kernel has a row (null launch columns when no
    call matched) and ``_gpu`` numbers the kernels; otherwise only the operations some call
    launched have rows (the others can be in no range), from :func:`op_launches`. Exports where
    another tracer wrapped the CUDA call (``eventClass`` 67) match twice; nsys counts such
    kernels twice in ``nvtx_kern_sum``'s times.
    """
    cols = ["global_pid", "correlation_id", "start_ns", "end_ns"]
    if kernels_only:  # nvtx_kern_sum: kernel names and durations
        ops = op_rows(trace, KERNEL_TABLE, cols, names=True)
        launch = ["tid", "global_tid", "api_start_ns", "api_end_ns"]
        ops = _launch_join(ops.with_row_index("_gpu"), api_rows(trace, names=False), dedupe=False, columns=launch)
    else:  # the projections: times and ids of every kind of op, those a call launched
        tables = (KERNEL_TABLE, "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
        ops = pl.concat([op_rows(trace, t, cols, duration=False) for t in tables], how="vertical_relaxed")
        pairs = op_launches(trace, lambda: ops.select("global_pid", "correlation_id"))
        if not is_identity(pairs["_lrow"], ops.height):
            ops = ops.select(pl.all().gather(pairs["_lrow"]))
        ops = ops.with_columns(
            (pairs["global_tid"] % PID_UNIT).alias("tid"), pairs["global_tid"], pairs["api_start_ns"], pairs["api_end_ns"]
        )
        del pairs
    ops = ops.with_row_index("_op")
    tree = _nvtx_tree(trace.table("nvtx", _TREE_COLUMNS), [], paths=False)
    calls = _on_tree_threads(
        ops.select("_op", "global_tid", pl.col("api_start_ns").alias("_s"), pl.col("api_end_ns").alias("_e")), tree)
    inner = _innermost(calls, tree)
    found = inner.filter(pl.col("_idx").is_not_null())["_op"].cast(pl.Int64)
    inside = pl.repeat(False, ops.height, dtype=pl.Boolean, eager=True)
    if found.len():
        inside = inside.scatter(found, True)
    return Projection(tree, ops, calls, inner, inside, _boundary_memberships(calls, tree, inner))


#: Calls searched for their innermost range at a time (:func:`projection_for_totals`).
INNERMOST_CHUNK = 2_000_000
#: Operations of one table below which :func:`projection_for_totals` reads its four columns
#: once and keeps them, when the column cache does not serve the table (at most ~6 MB).
SMALL_OP_ROWS = 200_000
_OP_KEEP = ["global_pid", "correlation_id", "start_ns", "end_ns"]


def projection_for_totals(trace: NsysTrace) -> Projection:
    """:func:`projection` with only what :meth:`Projection.range_totals` reads, built to hold
    little at a time: the launch join keeps row pairs, the calls' columns are gathered one
    API column at a time, their innermost ranges are searched :data:`INNERMOST_CHUNK` calls at
    a time, and the operations' four columns are read once the calls are done with (unless a
    crossing or boundary case needs them). ``ops`` has ``start_ns``, ``end_ns``,
    ``correlation_id`` and ``global_pid`` of the operations that matched a call (row ``i`` is
    ``_op == i``); ``inside`` is left empty. On 8.3 M operations / 20 M calls the peak fell from
    1.95 GB to ~1 GB (``nvtx_gpu_proj_sum``)."""
    tables = (KERNEL_TABLE, "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
    # tables too small for the column cache (memcpys, memsets: each column read was a scan of
    # the export, six per table) are read once, their four columns kept
    small: dict[str, pl.DataFrame] = {}

    def op_column(column: str) -> pl.Series:
        parts = []
        for t in tables:
            if t not in small:
                part = op_rows(trace, t, [column], duration=False)
                if part.height >= SMALL_OP_ROWS or trace.db.caches(t):
                    parts.append(part)
                    continue
                small[t] = op_rows(trace, t, _OP_KEEP, duration=False)
            parts.append(small[t].select(column))
        return pl.concat(parts, how="vertical_relaxed").to_series()

    # the matched calls' columns before the range tree is built: the whole API columns a
    # join reads are then freed before the tree's many small allocations, which reuse their
    # pages (gathered after the tree, they needed fresh memory: on h1x this report alone
    # peaked at 444–488 MiB, then 367–407); a warm run reads them from the column cache
    pairs = op_launches(trace, lambda: pl.DataFrame([op_column("global_pid"), op_column("correlation_id")]))
    lrow = pairs["_lrow"]
    calls = pairs.select(
        "global_tid", pl.col("api_start_ns").alias("_s"), pl.col("api_end_ns").alias("_e")
    ).with_row_index("_op")
    del pairs
    tree = _nvtx_tree(trace.table("nvtx", _TREE_COLUMNS), [], paths=False)
    calls = _on_tree_threads(calls, tree)
    tree = tree.drop("global_tid", "is_open", "event_type_id")
    inners, extras = [], []
    starts = innermost_starts(tree)  # the per-tree work, once (per chunk it grew with chunks × ranges)
    ends = tree["end_ns"].drop_nulls().unique().sort()
    for at in range(0, max(calls.height, 1), INNERMOST_CHUNK):  # each call's ranges depend on it alone
        part = calls.slice(at, INNERMOST_CHUNK)
        inners.append(_innermost(part, tree, starts=starts))
        # only calls that end exactly where some range ends can have boundary memberships
        maybe = part.filter(_in_sorted(part["_e"], ends))
        extras.append(_boundary_memberships(maybe, tree, inners[-1].join(maybe.select("_op"), on="_op", how="semi")))
    del starts, ends
    inner = pl.concat(inners, how="vertical_relaxed")
    extra = pl.concat(extras, how="vertical_relaxed")
    del inners, extras
    keep_calls = bool(tree["_crossing"].any() or extra.height)
    if not keep_calls:
        calls = calls.clear()
    ops = _OpColumns(op_column, lrow)
    return Projection(tree, ops, calls, inner, pl.Series("inside", [], pl.Boolean), extra)  # type: ignore[arg-type]


def _on_tree_threads(calls: pl.DataFrame, tree: pl.DataFrame) -> pl.DataFrame:
    """``calls`` (``_op``, ``global_tid``, ``_s``, ``_e``) as ``_op``, ``_thr`` (the thread's
    number in ``tree``), ``_s``, ``_e``, in their order; calls without a start or on a thread
    without ranges are dropped. The thread is looked up, not joined: a join copied every call's
    columns while the calls were held (s30x, 30 M calls: +534 MiB at ``nvtx_gpu_proj_sum``'s peak)."""
    threads = tree.select("global_tid", "_thr").unique(subset=["global_tid"], keep="first")
    thr = calls["global_tid"].replace_strict(threads["global_tid"], threads["_thr"], default=None,
                                             return_dtype=threads.schema["_thr"])
    keep = thr.is_not_null() & calls["_s"].is_not_null()
    out = calls.select("_op", thr.alias("_thr"), "_s", "_e")
    return out if keep.all() else out.filter(keep)


class _OpColumns:
    """The matched operations' columns (``ops[name]``, aligned with the launch pairs), each
    read when asked for and not kept: :func:`_range_totals` gathers them one at a time, so
    the four whole columns are never held together (8.3 M operations: ~0.27 GB)."""

    def __init__(self, read: Callable[[str], pl.Series], rows: pl.Series) -> None:
        self._read, self._rows = read, rows

    def __getitem__(self, name: str) -> pl.Series:
        return self._read(name).gather(self._rows)


def _in_sorted(values: pl.Series, sorted_unique: pl.Series) -> pl.Series:
    """Whether each of ``values`` is in ``sorted_unique`` (a binary search; nulls: False)."""
    if sorted_unique.len() == 0:
        return pl.repeat(False, values.len(), dtype=pl.Boolean, eager=True)
    at = sorted_unique.search_sorted(values, side="left").clip(upper_bound=sorted_unique.len() - 1)
    return (sorted_unique.gather(at) == values).fill_null(False)


def _boundary_memberships(calls: pl.DataFrame, tree: pl.DataFrame, inner: pl.DataFrame) -> pl.DataFrame:
    """(op, range) pairs nsys counts beyond the innermost range's ancestors: nsys puts a call in
    every range with ``start <= call start`` and ``call end <= end`` (closed), so a call that
    ends exactly where a range ends belongs to it even when a later sibling (that starts at the
    same tick, with coarse timestamps) is its innermost range. Such ranges, with their
    ancestors; empty in the usual case."""
    ends = tree.select("_thr", pl.col("end_ns").alias("_e"), pl.col("start_ns").alias("_bs"), pl.col("_idx").alias("_b"))
    hit = calls.select("_op", "_thr", "_s", "_e").join(ends, on=["_thr", "_e"], how="inner").filter(pl.col("_bs") <= pl.col("_s"))
    if hit.height == 0:
        return pl.DataFrame(schema={"_op": pl.Int64, "_idx": tree.schema["_idx"]})
    parent = tree["_parent_idx"]
    # the ranges each call already belongs to: its innermost range and the ancestors
    chain = inner.filter(pl.col("_idx").is_not_null() & pl.col("_op").is_in(hit["_op"].implode()))
    have = []
    cur = chain
    while cur.height:
        have.append(cur.select("_op", "_idx"))
        cur = cur.with_columns(parent.gather(cur["_idx"]).alias("_idx")).filter(pl.col("_idx").is_not_null())
    owned = pl.concat(have) if have else pl.DataFrame(schema={"_op": inner.schema["_op"], "_idx": tree.schema["_idx"]})
    extra = hit.select("_op", pl.col("_b").alias("_idx"))
    if extra.height == 0:
        return pl.DataFrame(schema={"_op": pl.Int64, "_idx": tree.schema["_idx"]})
    out = []
    cur = extra
    while cur.height:
        out.append(cur)
        cur = cur.with_columns(parent.gather(cur["_idx"]).alias("_idx")).filter(pl.col("_idx").is_not_null())
    extra = pl.concat(out).unique()
    return extra.join(owned.select(pl.col("_op").cast(extra.schema["_op"]), "_idx"), on=["_op", "_idx"], how="anti")


def _range_totals(p: Projection) -> pl.DataFrame:
    """:meth:`Projection.range_totals`.

    A range's ops are its own (the calls whose innermost range it is) and its children's, so
    the totals are gathered once per op and folded up the tree level by level, instead of
    expanding every op into one row per enclosing range (2.9 M rows for 1 M ops). This
    needs nested ranges and each correlation id under one innermost range (true unless a
    GPU op matched two API rows on different threads); otherwise the pairs are expanded.
    """
    tree, ops = p.tree, p.ops
    if tree["_crossing"].any() or (p.extra is not None and p.extra.height):
        return _range_totals_from_pairs(p)
    inner = p.inner.filter(pl.col("_idx").is_not_null())
    # the times' columns, then the keys': two gathered columns of a million rows at a time
    own = inner.select("_idx", ops["start_ns"].gather(inner["_op"]).alias("_ps"), ops["end_ns"].gather(inner["_op"]).alias("_pe"))
    per = own.group_by("_idx").agg(pl.col("_ps").min(), pl.col("_pe").max(), pl.len().cast(pl.Int64).alias("_n"))
    own = own.select("_idx")
    key = _op_key(ops["global_pid"].gather(inner["_op"]), ops["correlation_id"].gather(inner["_op"]))
    if not _all_distinct(key):  # processes reuse ids; CUDA graphs launch many kernels with one
        pairs = pl.DataFrame({"_k": key, "_idx": own["_idx"]}).sort("_k", "_idx")
        del key
        new_op = pairs["_k"].ne_missing(pairs["_k"].shift(1))
        new_pair = new_op | pairs["_idx"].ne_missing(pairs["_idx"].shift(1))
        if new_pair.sum() != new_op.sum():  # an operation under two innermost ranges
            return _range_totals_from_pairs(p)
        counts = pairs.filter(new_pair).group_by("_idx").agg(pl.len().cast(pl.Int64).alias("_n"))
        per = per.drop("_n").join(counts, on="_idx")
    # dense per-range columns, children folded into parents from the deepest level up
    n = tree.height
    ps = pl.repeat(None, n, dtype=pl.Int64, eager=True).scatter(per["_idx"], per["_ps"])
    pe = pl.repeat(None, n, dtype=pl.Int64, eager=True).scatter(per["_idx"], per["_pe"])
    count = pl.repeat(0, n, dtype=pl.Int64, eager=True).scatter(per["_idx"], per["_n"])
    parent, level = tree["_parent_idx"], tree["level"]
    for depth in range(max_int(level), 0, -1):
        rows = pl.DataFrame({"_parent": parent, "_ps": ps, "_pe": pe, "_n": count}).filter((level == depth) & ps.is_not_null())
        up = rows.group_by("_parent").agg(pl.col("_ps").min(), pl.col("_pe").max(), pl.col("_n").sum())
        at = up["_parent"]
        merged = up.select(
            pl.min_horizontal(ps.gather(at), "_ps").alias("_ps"),
            pl.max_horizontal(pe.gather(at), "_pe").alias("_pe"),
            (count.gather(at) + pl.col("_n")).alias("_n"),
        )
        ps.scatter(at, merged["_ps"])
        pe.scatter(at, merged["_pe"])
        count.scatter(at, merged["_n"])
    totals = pl.DataFrame({"_idx": tree["_idx"], "_ps": ps, "_pe": pe, "_n": count})
    return totals.filter(pl.col("_ps").is_not_null())


def _op_key(proc: pl.Series, corr: pl.Series) -> pl.Series:
    """One value per operation, equal exactly when (process, correlation id) are: the id times
    the number of processes plus the process's index when that fits an Int64, else a struct."""
    procs = proc.unique(maintain_order=True)
    if proc.null_count() == 0 and corr.null_count() == 0 and corr.len():
        lo, hi = corr.min(), corr.max()
        n = procs.len()
        if lo >= 0 and hi < (1 << 62) // max(n, 1):  # type: ignore[operator]
            code = proc.replace_strict(procs, pl.int_range(n, dtype=pl.Int64, eager=True), return_dtype=pl.Int64)
            return corr * n + code
    return pl.DataFrame({"p": proc, "c": corr}).select(pl.struct("p", "c")).to_series()


def _all_distinct(key: pl.Series) -> bool:
    """Whether no two values of ``key`` are equal (integers: sorted and neighbours compared,
    lighter than a hash set of millions)."""
    if key.len() < 2:
        return True
    if key.dtype != pl.Int64:
        return key.n_unique() == key.len()
    ordered = key.sort()
    return not ordered.slice(1).eq_missing(ordered.slice(0, ordered.len() - 1)).any()


def _range_totals_from_pairs(p: Projection) -> pl.DataFrame:
    """:func:`_range_totals` by expanding every (op, enclosing range) pair."""
    pairs = p.pairs()
    idx = pairs["_op"]
    return (
        pairs.with_columns(
            _take(p.ops["start_ns"], idx).alias("start_ns"),
            _take(p.ops["end_ns"], idx).alias("end_ns"),
            _take(p.ops["correlation_id"], idx).alias("correlation_id"),
        )
        .group_by("_idx")
        .agg(
            pl.col("start_ns").min().alias("_ps"),
            pl.col("end_ns").max().alias("_pe"),
            pl.col("correlation_id").n_unique().cast(pl.Int64).alias("_n"),
        )
    )


def _take(series: pl.Series, index: pl.Series) -> pl.Series:
    """``series[index]`` (dense row ids: a gather, much cheaper than a join)."""
    return series.gather(index)


def _stacks(tree: pl.DataFrame) -> pl.Series:
    """``RangeStack`` of every range: ``:<root id>:…:<own id>``, level by level, each level's
    rows only (their parents' stacks are complete by then)."""
    stacks = tree.select(pl.format(":{}", pl.col("range_id")).alias("s")).to_series()
    parent, level = tree["_parent_idx"], tree["level"]
    for depth in range(1, max_int(level) + 1):
        rows = (level == depth).arg_true()
        if rows.len():
            stacks.scatter(rows, stacks.gather(parent.gather(rows)) + stacks.gather(rows))
    return stacks


_TRACE_KINDS = {
    "Projected Start (ns)": "int", "Projected Duration (ns)": "int", "Orig Start (ns)": "int",
    "Orig Duration (ns)": "int", "PID": "int", "TID": "int", "NumGPUOps": "int", "Lvl": "int",
    "NumChild": "int", "RangeId": "int", "ParentId": "int",
}


def _trace_frame(p: Projection, convention: str, *, for_sum: bool = False) -> pl.DataFrame:
    """The rows of ``nvtx_gpu_proj_trace``; ``for_sum``: only the ranges (no row for the
    operations outside every range) and no ``RangeStack`` text (``nvtx_gpu_proj_sum`` needs
    neither; on 1.7 M ranges the stacks took ~0.1 GB)."""
    per_range = p.range_totals()
    tree = p.tree.with_columns(pl.lit(None, pl.Utf8).alias("_stack") if for_sum else _stacks(p.tree).alias("_stack"))
    # row i of the tree is range i (the range tree numbers its rows; _stacks and the totals
    # gather by _parent_idx on that): the ranges with GPU work are gathered, not joined
    if not per_range["_idx"].is_sorted():
        per_range = per_range.sort("_idx")
    ranges = tree.gather(per_range["_idx"]).hstack(per_range.drop("_idx"))
    children = ranges.group_by("_parent_idx").len("_nchild")
    ranges = ranges.join(children, left_on="_idx", right_on="_parent_idx", how="left")
    frame = ranges.select(
        nvtx_range_name(convention).alias("Name"),
        pl.col("_ps").alias("Projected Start (ns)"),
        (pl.col("_pe") - pl.col("_ps")).alias("Projected Duration (ns)"),
        pl.col("start_ns").alias("Orig Start (ns)"),
        (pl.col("end_ns") - pl.col("start_ns")).alias("Orig Duration (ns)"),
        pl.col("style").alias("Style"),
        pl.col("pid").alias("PID"),
        pl.col("tid").alias("TID"),
        pl.col("_n").cast(pl.Int64).alias("NumGPUOps"),
        pl.col("level").alias("Lvl"),
        pl.col("_nchild").fill_null(0).cast(pl.Int64).alias("NumChild"),
        pl.col("range_id").alias("RangeId"),
        pl.col("parent_id").alias("ParentId"),
        pl.col("_stack").alias("RangeStack"),
    )
    if convention == "2023" and not for_sum:
        # one row for every operation outside all ranges. Its PID and TID are SQLite's "bare
        # columns" of nsys's GROUP BY beside min(start) and max(end): the values of the last
        # row, in launch order, at which either aggregate changed (a start earlier or an end
        # later than every operation before it). nsys 2023.4.4 on the DDP and FSDP2 captures
        # printed the main thread where the last outside launch came from autograd's thread
        rest_ops = p.ops.filter(pl.col("api_start_ns").is_not_null() & ~p.inside)
        ordered = rest_ops.sort(["api_start_ns", "_op"]).select(
            "global_tid", "tid", "start_ns", "end_ns", "correlation_id",
            ((pl.col("start_ns") < pl.col("start_ns").cum_min().shift(1)).fill_null(True)
             | (pl.col("end_ns") > pl.col("end_ns").cum_max().shift(1)).fill_null(True)).alias("_hit"),
        )
        hit = ordered.filter(pl.col("_hit")).tail(1)
        outside = ordered.select(
            pl.lit(hit["global_tid"][0] // (1 << 24) % (1 << 24) if hit.height else None, pl.Int64).alias("_pid"),
            pl.lit(hit["tid"][0] if hit.height else None, pl.Int64).alias("tid"),
            pl.col("start_ns").min().alias("_ps"),
            pl.col("end_ns").max().alias("_pe"),
            pl.col("correlation_id").n_unique().alias("_n"),
        ).filter(pl.col("_n") > 0)
        none_i = pl.lit(None, pl.Int64)
        rest = outside.select(
            pl.lit("").alias("Name"),
            pl.col("_ps").alias("Projected Start (ns)"),
            (pl.col("_pe") - pl.col("_ps")).alias("Projected Duration (ns)"),
            none_i.alias("Orig Start (ns)"),
            none_i.alias("Orig Duration (ns)"),
            pl.lit(None, pl.Utf8).alias("Style"),
            pl.col("_pid").alias("PID"),
            pl.col("tid").alias("TID"),
            pl.col("_n").cast(pl.Int64).alias("NumGPUOps"),
            none_i.alias("Lvl"),
            pl.lit(0, pl.Int64).alias("NumChild"),
            none_i.alias("RangeId"),
            none_i.alias("ParentId"),
            pl.lit(None, pl.Utf8).alias("RangeStack"),
        )
        frame = pl.concat([rest, frame])
    return frame.sort(["Orig Start (ns)", "RangeId", "PID", "TID"], nulls_last=False, maintain_order=True)


def nvtx_gpu_proj_trace(trace: NsysTrace, *, convention: str = "2025") -> Report:
    """Each NVTX range with GPU work, projected onto the GPU (``nvtx_gpu_proj_trace``).

    Columns: ``Name``, ``Projected Start (ns)`` (first start of the range's operations),
    ``Projected Duration (ns)`` (last end − first start), ``Orig Start (ns)``,
    ``Orig Duration (ns)`` (the range on the CPU), ``Style``, ``PID``, ``TID``, ``NumGPUOps``
    (distinct correlation ids among kernels, memcpys and memsets launched inside),
    ``Lvl`` (0 = outermost), ``NumChild`` (child ranges with GPU work), ``RangeId`` (the
    ``NVTX_EVENTS`` row), ``ParentId`` and ``RangeStack`` (``:outer:…:own`` ids). Ordered by
    original start.
    """
    _require_nvtx(trace, "nvtx_gpu_proj_trace")
    frame = _trace_frame(projection(trace), convention)
    return Report("nvtx_gpu_proj_trace", frame, dict(_TRACE_KINDS), convention)


def nvtx_gpu_proj_sum(trace: NsysTrace, *, convention: str = "2025") -> Report:
    """``nvtx_gpu_proj_trace`` summed per range name and style (``nvtx_gpu_proj_sum``).

    ``Total Proj Time`` and the ``Proj`` statistics are over projected durations,
    ``Total Range Time`` over the ranges' CPU durations, ``Total GPU Ops`` sums ``NumGPUOps``,
    ``Avg Range Lvl`` and ``Avg Num Child`` average the tree columns. Ordered by total
    projected time, descending.
    """
    _require_nvtx(trace, "nvtx_gpu_proj_sum")
    t = _trace_frame(projection_for_totals(trace), convention, for_sum=True).filter(pl.col("RangeId").is_not_null())
    s = t.group_by("Name", "Style").agg(
        *stat_aggs("Projected Duration (ns)"),
        pl.col("Orig Duration (ns)").sum().alias("_range_total"),
        pl.col("NumGPUOps").sum().alias("_ops"),
        pl.col("NumGPUOps").mean().alias("_avg_ops"),
        pl.col("Lvl").mean().alias("_lvl"),
        pl.col("NumChild").mean().alias("_child"),
    )
    s = s.sort(["_total", "Name", "Style"], descending=[True, False, False])
    frame = s.select(
        pl.col("Name").alias("Range"),
        "Style",
        pl.col("_total").alias("Total Proj Time (ns)"),
        pl.col("_range_total").alias("Total Range Time (ns)"),
        pl.col("_count").cast(pl.Int64).alias("Range Instances"),
        pl.col("_avg").alias("Proj Avg (ns)"),
        pl.col("_med").alias("Proj Med (ns)"),
        pl.col("_min").alias("Proj Min (ns)"),
        pl.col("_max").alias("Proj Max (ns)"),
        pl.col("_std").alias("Proj StdDev (ns)"),
        pl.col("_ops").alias("Total GPU Ops"),
        pl.col("_avg_ops").alias("Avg GPU Ops"),
        pl.col("_lvl").alias("Avg Range Lvl"),
        pl.col("_child").alias("Avg Num Child"),
    )
    kinds = {
        "Total Proj Time (ns)": "int", "Total Range Time (ns)": "int", "Range Instances": "int",
        "Proj Avg (ns)": "float1", "Proj Med (ns)": "float1", "Proj Min (ns)": "int", "Proj Max (ns)": "int",
        "Proj StdDev (ns)": "float1", "Total GPU Ops": "int", "Avg GPU Ops": "float1",
        "Avg Range Lvl": "float1", "Avg Num Child": "float1",
    }
    return Report("nvtx_gpu_proj_sum", frame, kinds, convention)


#: Kernels (the table's row estimate) from which ``nvtx_kern_sum`` builds its (kernel, range)
#: pairs a window of kernels at a time instead of as one table; the environment variable
#: ``TRACEKIT_KERN_SUM_WINDOWED_FROM`` overrides it. Below it the whole table is faster
#: (1 M kernels: 2.9 M pairs, ~0.6 GB peak).
KERN_SUM_WINDOWED_FROM = 4_000_000
#: Kernel launches (kernel × matching API row) per window of the windowed path.
KERN_SUM_WINDOW = 2_000_000


def _windowed_from() -> int:
    """:data:`KERN_SUM_WINDOWED_FROM`, or the environment's ``TRACEKIT_KERN_SUM_WINDOWED_FROM``."""
    from tracekit.env import count_from_env

    return count_from_env("TRACEKIT_KERN_SUM_WINDOWED_FROM", KERN_SUM_WINDOWED_FROM)


def nvtx_kern_sum(trace: NsysTrace, *, convention: str = "2025") -> Report:
    """Kernel statistics per enclosing NVTX range, thread and kernel name (``nvtx_kern_sum``).

    A kernel counts once in *every* range enclosing its launch (not only the innermost).
    ``NVTX Inst`` = distinct ranges, ``Kern Inst`` = kernels; time statistics over kernel
    durations. Kernels outside every range form rows with an empty range name (their
    launching thread's PID and TID; empty when the launch was not traced).

    From :data:`KERN_SUM_WINDOWED_FROM` kernels (or when the whole pair table cannot fit) the
    pairs are built :data:`KERN_SUM_WINDOW` launches at a time and merged
    (:mod:`tracekit.stats.kern_sum_windows`): on 30 M kernels, 86 M pairs, the whole table
    did not fit 12 GB.
    """
    _require_nvtx(trace, "nvtx_kern_sum")
    kernels = trace.db.row_estimate(KERNEL_TABLE) if trace.db.has_table(KERNEL_TABLE) else 0
    s = _kern_sum_windowed(trace, convention) if kernels >= _windowed_from() else _kern_sum_whole(trace, convention)
    s = s.sort(["_range", "_style", "_gpid", "_gtid", "_total", "_kname"], descending=[False, False, False, False, True, False], nulls_last=False)
    frame = s.select(
        pl.col("_range").alias("NVTX Range"),
        pl.col("_style").alias("Style"),
        pl.col("_gpid").alias("PID"),
        pl.col("_gtid").alias("TID"),
        pl.col("_ninst").cast(pl.Int64).alias("NVTX Inst"),
        pl.col("_kinst").cast(pl.Int64).alias("Kern Inst"),
        pl.col("_total").alias("Total Time (ns)"),
        pl.col("_avg").alias("Avg (ns)"),
        pl.col("_med").alias("Med (ns)"),
        pl.col("_min").alias("Min (ns)"),
        pl.col("_max").alias("Max (ns)"),
        pl.col("_std").alias("StdDev (ns)"),
        pl.col("_kname").alias("Kernel Name"),
    )
    kinds = {
        "PID": "int", "TID": "int", "NVTX Inst": "int", "Kern Inst": "int", "Total Time (ns)": "int",
        "Avg (ns)": "float1", "Med (ns)": "float1", "Min (ns)": "int", "Max (ns)": "int", "StdDev (ns)": "float1",
    }
    return Report("nvtx_kern_sum", frame, kinds, convention)


#: Bytes of the whole-table path per (kernel, range) pair: seven integer columns and the
#: kernel name (a 16-byte view), and as much again for the grouping.
_WHOLE_PAIR_BYTES = 2 * (7 * 8 + 16)


def _kern_sum_whole(trace: NsysTrace, convention: str) -> pl.DataFrame:
    """``nvtx_kern_sum``'s groups from one table of every (kernel, enclosing range) pair:
    ``_range``, ``_style`` (text), ``_gpid``, ``_gtid``, ``_kname`` (text), ``_ninst``,
    ``_kinst`` and :func:`~tracekit.stats.common.stat_aggs` of the durations (ns). When that
    table cannot fit, the windowed path's groups instead."""
    p = projection(trace, kernels_only=True)
    pairs = p.pairs()
    # polars aborts the process when an allocation fails (s30x: 86 M pairs, SIGABRT at 7.5 GB
    # under a 12 GB cap), so a table that cannot fit is not started
    free = database.free_memory()
    if free is not None and pairs.height * _WHOLE_PAIR_BYTES > free:
        del p, pairs
        return _kern_sum_windowed(trace, convention)
    ops = p.ops.select(
        "_op", "_gpu", "duration_ns", "name",
        (pl.col("global_tid") // (1 << 24) % (1 << 24)).alias("_pid"), "tid",
    )
    idx, ridx = pairs["_op"], pairs["_idx"]
    tree = p.tree
    # the range name and style as small integer codes made once per range (a kernel counts in
    # every range around it: 2.9 M (kernel, range) rows for 1 M kernels, whose name and style
    # strings took 0.12 s to gather and made the group-by 0.44 s; on codes, 0.03 and 0.14 s)
    names, name_codes = _codes(tree.select(pl.col("name").alias("_rname"), "domain").select(_range_name(convention)).to_series())
    styles, style_codes = _codes(tree["style"])
    inside = pl.DataFrame({
        "_range": _take(name_codes, ridx),
        "_style": _take(style_codes, ridx),
        "_gpid": _take(tree["pid"], ridx),
        "_gtid": _take(tree["tid"], ridx),
        "range_id": _take(tree["range_id"], ridx).cast(pl.Int64),
        "_gpu": _take(ops["_gpu"], idx),
        "duration_ns": _take(ops["duration_ns"], idx),
        "_kname": _take(ops["name"], idx),
    })
    outside = ops.filter(~p.inside).select(
        pl.lit(None, pl.Int64).alias("_range"),
        pl.lit(None, pl.Int64).alias("_style"),
        pl.col("_pid").alias("_gpid"),
        pl.col("tid").alias("_gtid"),
        pl.lit(None, pl.Int64).alias("range_id"),
        "_gpu", "duration_ns", pl.col("name").alias("_kname"),
    )
    both = pl.concat([outside, inside], how="vertical_relaxed")
    del inside, outside
    by_id = False
    if both.schema["_kname"] == pl.Int64:  # ids (text when the kernels table is loaded)
        strings = trace.strings_of(both["_kname"].unique())  # those names' rows only, on a cold export
        by_id = names_are_ids(both, "_kname", strings)
        if not by_id:
            both = resolve_names(both, strings, "_kname")
    keys = ["_range", "_style", "_gpid", "_gtid", "_kname"]
    gid, decode = group_numbers(both.select(keys))
    stats = both.select("range_id", "_gpu", "duration_ns").with_columns(gid).group_by("_g").agg(
        pl.col("range_id").drop_nulls().n_unique().alias("_ninst"),
        pl.col("_gpu").n_unique().alias("_kinst"),
        *stat_aggs("duration_ns"),
    )
    del both, gid
    s = pl.concat([decode(stats["_g"]).drop("_g"), stats.drop("_g")], how="horizontal")
    s = s.with_columns(names.gather(s["_range"]).alias("_range"), styles.gather(s["_style"]).alias("_style"))
    return resolve_names(s, strings, "_kname") if by_id else s


#: Bytes the windowed path holds per kernel launch (its row, launching thread, call start
#: and end, duration, name code) and per range (the tree's search columns and group code),
#: and works with per launch of a window (its pairs and their group-by; ~3 pairs a launch).
_LAUNCH_BYTES, _RANGE_BYTES, _WINDOW_LAUNCH_BYTES = 40, 120, 600


def _kern_sum_windowed(trace: NsysTrace, convention: str) -> pl.DataFrame:
    """:func:`_kern_sum_whole`'s groups, built :data:`KERN_SUM_WINDOW` kernel launches at a
    time: the launch join keeps row pairs, the calls' thread, start and end and the kernels'
    duration and name code are gathered once (~40 bytes a launch), and each window's
    innermost ranges, enclosing ranges and (kernel, range) rows are made, folded into a
    :class:`~tracekit.stats.kern_sum_windows.KernSumWindows` and freed. Groups are numbered by
    codes made once for the whole trace (range name, style, thread, kernel name), so windows
    merge. On s30x (30 M kernels, 86 M pairs) the peak was 3.4 GB (the whole table: > 12 GB)."""
    # the range tree first, reduced to what the searches need, while little else is held
    tree = _nvtx_tree(trace.table("nvtx", _TREE_COLUMNS), [], paths=False)
    threads = tree.select("global_tid", "_thr").unique(subset=["global_tid"], keep="first")
    names, name_codes = _codes(tree.select(pl.col("name").alias("_rname"), "domain").select(_range_name(convention)).to_series())
    styles, style_codes = _codes(tree["style"])
    range_threads = tree.select(pl.col("pid").cast(pl.Int64).alias("_gpid"), pl.col("tid").cast(pl.Int64).alias("_gtid"))
    tree = tree.select("_thr", "_idx", "start_ns", "end_ns", "_parent_idx", "_crossing")
    kernel_keys = [op_rows(trace, KERNEL_TABLE, [c], duration=False).to_series() for c in ("global_pid", "correlation_id")]
    launches = kernel_keys[0].len()
    need = launches * (_LAUNCH_BYTES + 16) + tree.height * _RANGE_BYTES + min(KERN_SUM_WINDOW, launches) * _WINDOW_LAUNCH_BYTES
    ensure_memory(trace.path, "nvtx_kern_sum's kernel/range pairs, window by window", launches, 6, need, "building")
    api = lean_api_rows(trace, launches, names=False)
    pairs = launch_pairs(pl.DataFrame(kernel_keys), api, how="left")  # every kernel, its calls in row order
    del kernel_keys
    lrow, arow = pairs["_lrow"], pairs["_arow"]
    del pairs
    gtid = api["global_tid"].gather(arow)
    call_start = api["start_ns"].gather(arow)
    call_end = api["end_ns"].gather(arow)
    del api, arow
    identity = is_identity(lrow, lrow.len())  # each kernel matched one call: no gathers below
    duration = op_rows(trace, KERNEL_TABLE, [])["duration_ns"]
    kname, decode_kname = _kernel_name_codes(op_rows(trace, KERNEL_TABLE, [], names=True, duration=False)["name"], trace)
    if not identity:
        duration, kname = duration.gather(lrow), kname.gather(lrow)

    # a thread's code: its (PID, TID) among those of the ranges and of the launching calls
    call_tids = gtid.unique()
    thread_keys = pl.concat([
        range_threads,
        call_tids.to_frame("g").select((pl.col("g") // (1 << 24) % (1 << 24)).alias("_gpid"), (pl.col("g") % (1 << 24)).alias("_gtid")),
    ]).unique(maintain_order=True).with_row_index("_t")
    tcode_of_tid = call_tids.to_frame("g").select(
        (pl.col("g") // (1 << 24) % (1 << 24)).alias("_gpid"), (pl.col("g") % (1 << 24)).alias("_gtid"), "g",
    ).join(thread_keys, on=["_gpid", "_gtid"], how="left", nulls_equal=True, maintain_order="left")
    known = tcode_of_tid.drop_nulls("g")
    untraced = tcode_of_tid.filter(pl.col("g").is_null())["_t"].cast(pl.Int64).first()  # kernels no call launched
    radix = (names.len() + 1, styles.len() + 1, thread_keys.height, decode_kname.len())
    range_tcode = range_threads.join(
        thread_keys, on=["_gpid", "_gtid"], how="left", nulls_equal=True, maintain_order="left")["_t"]
    # group number = ((name × styles + style) × threads + thread) × kernel names + kernel name;
    # code 0 of name and style: none (outside every range)
    range_part = ((name_codes + 1).fill_null(0) * radix[1] + (style_codes + 1).fill_null(0)) * radix[2] + range_tcode.cast(pl.Int64)
    del name_codes, style_codes, range_tcode, range_threads
    starts = innermost_starts(tree)
    ends = tree["end_ns"].drop_nulls().unique().sort()

    acc = KernSumWindows()
    lo, n = 0, lrow.len()
    while lo < n:
        hi = min(lo + KERN_SUM_WINDOW, n)
        while hi < n and lrow[hi] == lrow[hi - 1]:  # a kernel's calls stay in one window (Kern Inst adds up)
            hi += 1
        calls = pl.DataFrame({
            "_op": pl.int_range(lo, hi, dtype=pl.Int64, eager=True), "global_tid": gtid.slice(lo, hi - lo),
            "_s": call_start.slice(lo, hi - lo), "_e": call_end.slice(lo, hi - lo),
        })
        kernel = pl.int_range(lo, hi, dtype=pl.Int64, eager=True) if identity else lrow.slice(lo, hi - lo)
        window = pl.DataFrame({
            "_tc": calls["global_tid"].replace_strict(known["g"], known["_t"], return_dtype=pl.Int64).fill_null(pl.lit(untraced, pl.Int64)),
            "_k": kname.slice(lo, hi - lo).cast(pl.Int64), "duration_ns": duration.slice(lo, hi - lo), "_gpu": kernel,
        })
        calls = calls.filter(pl.col("_s").is_not_null()).join(threads, on="global_tid", how="inner", maintain_order="left").select("_op", "_thr", "_s", "_e")
        inner = _innermost(calls, tree, starts=starts)
        maybe = calls.filter(_in_sorted(calls["_e"], ends))
        extra = _boundary_memberships(maybe, tree, inner.join(maybe.select("_op"), on="_op", how="semi"))
        member = _enclosing(calls, tree, inner).with_columns(pl.col("_op").cast(pl.Int64))
        if extra.height:
            member = pl.concat([member, extra.select(pl.col("_op").cast(pl.Int64), pl.col("_idx").cast(member.schema["_idx"]))]).unique(maintain_order=True)
        found = inner.filter(pl.col("_idx").is_not_null())["_op"].cast(pl.Int64) - lo
        del calls, inner, maybe, extra
        inside = pl.repeat(False, hi - lo, dtype=pl.Boolean, eager=True)
        if found.len():
            inside = inside.scatter(found, True)
        at = member["_op"] - lo
        rows = pl.concat([
            window.filter(~inside).select((pl.col("_tc") * radix[3] + pl.col("_k")).alias("_g"), "duration_ns", "_gpu", pl.lit(None, pl.Int64).alias("_r")),
            pl.DataFrame({
                "_g": range_part.gather(member["_idx"]) * radix[3] + window["_k"].gather(at),
                "duration_ns": window["duration_ns"].gather(at), "_gpu": window["_gpu"].gather(at),
                "_r": member["_idx"].cast(pl.Int64) * radix[3] + window["_k"].gather(at),
            }),
        ])
        del window, member, at, inside
        acc.add(rows)
        del rows
        lo = hi
    del gtid, call_start, call_end, duration, kname, lrow, tree, starts, ends
    # a (range, kernel name) key's group: the range's part and the kernel name's code
    stats = acc.finish(lambda keys: range_part.gather(keys // radix[3]) * radix[3] + keys % radix[3])
    # the group number back to its keys
    rest = stats["_g"]
    kcode = rest % radix[3]
    rest = rest // radix[3]
    tcode = rest % radix[2]
    rest = rest // radix[2]
    scode, rcode = rest % radix[1], rest // radix[1]
    keys = thread_keys.select(pl.col("_gpid", "_gtid").gather(tcode))
    none = pl.Series([None], dtype=pl.Utf8)
    return pl.DataFrame({
        "_range": pl.concat([none, names.cast(pl.Utf8)]).gather(rcode),
        "_style": pl.concat([none, styles.cast(pl.Utf8)]).gather(scode),
        "_gpid": keys["_gpid"], "_gtid": keys["_gtid"],
        **{c: stats[c] for c in ("_ninst", "_kinst", "_total", "_count", "_avg", "_med", "_min", "_max", "_std")},
        "_kname": decode_kname.gather(kcode),
    })


def _kernel_name_codes(name: pl.Series, trace: NsysTrace) -> tuple[pl.Series, pl.Series]:
    """Each kernel's name as a dense code (UInt32) and the names of the codes (text; null: no
    name). Names are grouped as :func:`_kern_sum_whole` groups them: by string id when each
    text has one id, else by text."""
    distinct = name.drop_nulls().unique()
    if name.dtype == pl.Int64:
        texts = _texts(distinct, trace.strings_of(distinct))
        by_id = _one_id_per_text(distinct, texts)
    else:
        by_id, texts = True, distinct
    keys = distinct if by_id else texts
    values, key_codes = _codes(keys)
    # a key that is null (an id with no text, grouped by text) and a null name share the last code
    key_codes = key_codes.fill_null(values.len())
    codes = name.replace_strict(distinct, key_codes, default=values.len(), return_dtype=pl.UInt32)
    shown = texts.to_frame("t").with_columns(key_codes.alias("c")).unique("c", keep="first").sort("c")["t"] if by_id else values
    return codes, pl.concat([shown.cast(pl.Utf8), pl.Series([None], dtype=pl.Utf8)])


def _codes(values: pl.Series) -> tuple[pl.Series, pl.Series]:
    """``values``' distinct non-null values and each value's Int64 code, its index there
    (null stays null): ``distinct.gather(codes)`` gives ``values`` back."""
    distinct = values.drop_nulls().unique(maintain_order=True)
    codes = values.replace_strict(distinct, pl.int_range(distinct.len(), dtype=pl.Int64, eager=True), default=None, return_dtype=pl.Int64)
    return distinct, codes


def _range_name(convention: str) -> pl.Expr:
    return qualified_name(pl.col("_rname"), colon_default=convention == "2025").alias("_range")
