"""Small helpers shared by the analysis modules (rank keys, GPU-op unions, interval unions)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import polars as pl

from tracekit.nsys.readers import implausible_end

#: A ``globalTid``'s thread bits: ``globalTid // PID_UNIT * PID_UNIT`` is the process key
#: (vm and pid bits, the ``globalPid`` of GPU activity rows).
PID_UNIT = 1 << 24


class ColumnSource(Protocol):
    """Anything with ``columns`` and ``source[name] -> Series``: a frame, or
    :class:`tracekit.nsys.readers.TableColumns`, which reads each column when asked."""

    @property
    def columns(self) -> list[str]: ...

    def __getitem__(self, name: str) -> pl.Series: ...


def rank_keys(*frames: pl.DataFrame | ColumnSource) -> list[str]:
    """``["rank"]`` when every frame has a ``rank`` column (a multi-rank table set), else ``[]``."""
    return ["rank"] if frames and all("rank" in f.columns for f in frames) else []


def max_int(series: pl.Series) -> int:
    """Largest value of an integer column, 0 when empty or all null."""
    value = series.max()
    return int(value) if isinstance(value, int | float) else 0


def is_identity(rows: pl.Series, height: int) -> bool:
    """Whether ``rows`` is ``0, 1, …, height - 1``: gathering a frame by it would copy the
    frame unchanged (sorted, no repeats, none missing)."""
    if rows.len() != height:
        return False
    return height == 0 or (rows.is_sorted() and rows[0] == 0 and rows[-1] == height - 1 and rows.n_unique() == height)


def process_key(global_tid: str | pl.Expr = "global_tid") -> pl.Expr:
    """The ``globalPid`` of a ``globalTid`` (thread bits cleared)."""
    e = pl.col(global_tid) if isinstance(global_tid, str) else global_tid
    return e // PID_UNIT * PID_UNIT


def row_index(frame: pl.DataFrame, name: str = "_row") -> pl.DataFrame:
    """``frame`` with a 0-based ``UInt32``/``Int64`` row index column ``name``."""
    return frame.with_row_index(name)


#: ``name`` of a CUDA graph launch traced whole (``graph_trace`` rows) in :func:`gpu_ops`.
GRAPH_OP_NAME = "[CUDA graph {}]"


def gpu_ops(
    kernels: pl.DataFrame,
    memcpys: pl.DataFrame | None = None,
    memsets: pl.DataFrame | None = None,
    graphs: pl.DataFrame | None = None,
    *,
    columns: Sequence[str] = (),
    end_bound: int | None = None,
) -> pl.DataFrame:
    """Kernels, memcpys, memsets and CUDA graph launches stacked into one frame: the GPU's
    work. ``op_kind`` is ``"kernel"``, ``"memcpy"``, ``"memset"`` or ``"graph"``; ``name`` the
    kernel name, ``[CUDA memcpy <kind>]``, ``[CUDA memset]`` or ``[CUDA graph <graph_id>]``.

    ``graphs`` are the ``graph_trace`` rows: graph launches that nsys traced whole
    (``--cuda-graph-trace=graph``, its default), whose kernels are in no other table. Every
    analysis that asks whether the GPU was busy reads this frame, so graph-replayed work counts
    as GPU work (busy time, idle gaps, iterations, NVTX projection, diagnose). With per-node
    tracing the graphs' kernels are ordinary ``kernels`` rows (with ``graph_node_id``) and
    ``graph_trace`` is empty, so nothing is counted twice.

    Keeps the GPU-op identity columns (``rank`` when present, ``pid``, ``global_pid``,
    ``device_id``, ``context_id``, ``stream_id``, ``correlation_id``, ``start_ns``, ``end_ns``,
    ``duration_ns``) plus ``bytes`` and any extra ``columns`` the inputs share.

    Operations whose end lies far past every start (:func:`~tracekit.nsys.readers.implausible_end`:
    an end of ``INT64_MAX`` in a damaged export; the trace's loader warns with their count)
    are left out: busy time, utilization and idle gaps would otherwise span 292 years.
    ``end_bound`` (ns) replaces the frame's own bound (:func:`ops_end_bound`) when the inputs
    are a part of bigger tables: rows ending after it are left out.
    """
    keys = rank_keys(*(f for f in (kernels, memcpys, memsets, graphs) if f is not None and f.width))
    base = [*keys, "pid", "global_pid", "device_id", "context_id", "stream_id", "correlation_id",
            "start_ns", "end_ns", "duration_ns"]
    extra = [c for c in columns if c not in base and c not in ("name", "bytes", "op_kind")]
    parts = []
    k = kernels.select(*base, *extra, pl.col("name"), pl.lit(None, pl.Int64).alias("bytes"),
                       pl.lit("kernel").alias("op_kind"))
    parts.append(k)
    if memcpys is not None:
        label = pl.coalesce(pl.col("copy_kind_label"), pl.col("copy_kind")) if "copy_kind_label" in memcpys.columns else pl.col("copy_kind")
        parts.append(memcpys.select(*base, *extra, pl.format("[CUDA memcpy {}]", label).alias("name"),
                                    pl.col("bytes"), pl.lit("memcpy").alias("op_kind")))
    if memsets is not None:
        parts.append(memsets.select(*base, *extra, pl.lit("[CUDA memset]").alias("name"),
                                    pl.col("bytes"), pl.lit("memset").alias("op_kind")))
    if graphs is not None and graphs.height:
        fill = [pl.col(c) if c in graphs.columns else pl.lit(None, k.schema[c]).alias(c) for c in extra]
        label = pl.format(GRAPH_OP_NAME, pl.col("graph_id")) if "graph_id" in graphs.columns else pl.lit("[CUDA graph]")
        parts.append(graphs.select(*base, *fill, label.alias("name"), pl.lit(None, pl.Int64).alias("bytes"),
                                   pl.lit("graph").alias("op_kind")))
    ops = pl.concat(parts, how="vertical_relaxed")
    if end_bound is not None:
        return ops.filter((pl.col("end_ns") <= end_bound).fill_null(True)) if ops.height else ops
    return ops.filter(~implausible_end()) if ops.height else ops


#: Shifted times (:func:`interval_union`) must stay below this.
_SHIFT_LIMIT = 1 << 62


def rows_between(frame: pl.DataFrame, column: str, lo: int, hi: int) -> pl.DataFrame:
    """The rows of ``frame`` whose ``column`` lies in ``[lo, hi)`` (ns), in their order: a
    slice, which shares the frame's memory, when the column is sorted without nulls (the
    diagnosis' window of operations and calls sorted by start), else a filter."""
    col = frame.get_column(column)
    if col.null_count() == 0 and col.is_sorted():
        first = int(col.search_sorted(lo, side="left"))
        return frame.slice(first, int(col.search_sorted(hi, side="left")) - first)
    return frame.filter((pl.col(column) >= lo) & (pl.col(column) < hi))


def sorted_by(frame: pl.DataFrame, by: Sequence[str]) -> pl.DataFrame:
    """``frame`` sorted by ``by`` (ties in their order): the frame itself, not a copy, when
    it is in that order already (a sort copies every column; the gaps of a one-step sample of
    2 M kernels were the diagnosis' peak)."""
    order = frame.select(pl.arg_sort_by(list(by), maintain_order=True)).to_series()
    return frame if is_identity(order, frame.height) else frame[order]


def rows_where(frame: pl.DataFrame, keep: pl.Expr) -> pl.DataFrame:
    """``frame.filter(keep)``, as a slice that shares the frame's memory where the kept rows
    are one run (a window's rows of a frame sorted by time): same rows, same order. A filter
    copies every column (the gaps of a one-step sample of 2 M kernels: 50 MB)."""
    mask = frame.select(keep.fill_null(False)).to_series()
    if mask.len() != frame.height:  # a literal: all rows or none
        return frame if mask.len() and mask[0] else frame.clear()
    kept = int(mask.sum())
    if kept == frame.height:
        return frame
    if kept == 0:
        return frame.clear()
    first = int(mask.arg_max())  # type: ignore[arg-type]
    if bool(mask.slice(first, kept).all()):
        return frame.slice(first, kept)
    return frame.filter(mask)


def interval_union(frame: pl.DataFrame, by: Sequence[str], start: str = "start_ns", end: str = "end_ns") -> pl.DataFrame:
    """Merge overlapping or touching ``[start, end)`` intervals within each ``by`` group.

    Returns ``by`` columns plus ``start_ns``, ``end_ns`` of the merged intervals, sorted.
    """
    import numpy as np

    by = list(by)
    f = frame.select(*by, pl.col(start).alias("start_ns"), pl.col(end).alias("end_ns")).drop_nulls(["start_ns", "end_ns"])
    if f.height == 0:
        return f
    f = sorted_by(f, [*by, "start_ns"])  # a window's operations by start, on one device: no copy
    # the merged intervals are runs of consecutive rows: a run starts where a row starts after
    # every end before it in its group and ends at the running maximum of its last row. One
    # running maximum serves every group: each group's times are shifted by its number times
    # the span of all times plus one, so that groups never overlap (no window function per
    # group, no group-by of a million one-row groups); in numpy, a few arrays of the rows'
    # length at a time
    s = f.get_column("start_ns").cast(pl.Int64).to_numpy()
    e = f.get_column("end_ns").cast(pl.Int64).to_numpy()
    lo = int(min(s.min(), e.min()))
    step = int(max(s.max(), e.max())) - lo + 1
    group = f.select(pl.struct(by).rle_id()).to_series().to_numpy() if by else None
    groups = int(group[-1]) + 1 if group is not None else 1
    if groups == 1:  # one group (one device): no shift, no group arrays
        new, last, running = _runs(s, e)
        ends = running[last]
    elif step * (groups + 1) < _SHIFT_LIMIT:
        assert group is not None  # more than one group
        base = group.astype(np.int64) * step - lo
        new, last, running = _runs(s + base, e + base)
        ends = running[last] - base[last]
    else:  # times too far apart to shift: one running maximum per group
        new = np.empty(len(s), dtype=bool)
        cuts = np.flatnonzero(np.diff(group)) + 1 if group is not None else np.empty(0, dtype=np.int64)
        parts = []
        for lo_i, hi_i in zip([0, *cuts.tolist()], [*cuts.tolist(), len(s)], strict=True):
            new[lo_i:hi_i], last, running = _runs(s[lo_i:hi_i], e[lo_i:hi_i])
            parts.append(running[last])
        ends = np.concatenate(parts)
    rows = np.flatnonzero(new)
    return f.select(*by, "start_ns")[rows].with_columns(pl.Series("end_ns", ends, dtype=pl.Int64).cast(f.schema["end_ns"]))


def _runs(start: Any, end: Any) -> tuple[Any, Any, Any]:
    """Of intervals sorted by start (numpy int64 arrays, at least one): which rows open a run of
    overlapping or touching intervals (``new``), which close one (``last``), and the running
    maximum of the ends (a closing row's value is its run's end)."""
    import numpy as np

    running = np.maximum.accumulate(end)
    new = np.empty(len(start), dtype=bool)
    new[0] = True
    np.greater(start[1:], running[:-1], out=new[1:])
    return new, np.append(new[1:], True), running


def span_and_busy(group: Any, device: Any, start: Any, end: Any, groups: int) -> dict[str, Any]:
    """Per group ``0 … groups-1`` of operations (one value per operation: the group, a numpy
    array, negative for an operation in none; the GPU, start and end in ns, numpy arrays or
    polars Series, without nulls in the grouped operations): ``gpu_start_ns`` (first start),
    ``gpu_end_ns`` (last end), ``gpu_busy_ns`` (length of the union of the operations'
    ``[start, end)`` intervals per GPU, summed over the GPUs: :func:`interval_union`'s
    merging, touching intervals joined) and ``ops`` (count); numpy int64 arrays of length
    ``groups``, zero where a group has no operation.

    Works on :data:`_SPAN_BLOCK` operations at a time, by consecutive groups, so that a
    million operations never need a sorted copy of all of them at once."""
    import numpy as np

    group = np.asarray(group, dtype=np.int64)
    out = {k: np.zeros(groups, dtype=np.int64) for k in ("gpu_start_ns", "gpu_end_ns", "gpu_busy_ns", "ops")}
    grouped = group >= 0
    counts = np.bincount(group[grouped], minlength=groups)
    total = int(counts.sum())
    if total == 0:
        return out
    # consecutive groups holding about _SPAN_BLOCK operations each
    cuts = np.searchsorted(np.cumsum(counts), np.arange(_SPAN_BLOCK, total, _SPAN_BLOCK), side="left") + 1
    bounds = [0, *sorted({int(c) for c in cuts if 0 < c < groups}), groups]

    def take(values: Any, rows: Any) -> Any:
        return values.gather(rows).to_numpy() if isinstance(values, pl.Series) else np.asarray(values)[rows]

    for g0, g1 in zip(bounds[:-1], bounds[1:], strict=False):
        rows = np.flatnonzero(grouped if len(bounds) == 2 else (group >= g0) & (group < g1))
        if rows.size == 0:
            continue
        g, d, s, e = group[rows], take(device, rows), take(start, rows), take(end, rows)
        del rows
        order = np.lexsort((s, d, g))
        g, d, s, e = g[order], d[order], s[order], e[order]
        del order
        first = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
        at = g[first]
        out["gpu_start_ns"][at] = np.minimum.reduceat(s, first)
        out["gpu_end_ns"][at] = np.maximum.reduceat(e, first)
        out["ops"][at] = np.diff(np.r_[first, g.size])
        out["gpu_busy_ns"][at] = _busy_sorted(g, d, s, e, first)
    return out


def _busy_sorted(g: Any, d: Any, s: Any, e: Any, first: Any) -> Any:
    """Union length per group of operations sorted by group, device and start (``first``:
    where each group begins); :func:`span_and_busy`'s busy time."""
    import numpy as np

    seg = np.cumsum(np.r_[True, (g[1:] != g[:-1]) | (d[1:] != d[:-1])]) - 1
    lo = int(min(s.min(), e.min()))
    step = int(max(s.max(), e.max())) - lo + 1
    if step * (int(seg[-1]) + 2) >= 1 << 62:  # the shifted times would not fit: polars, group by group
        f = pl.DataFrame({"g": g, "d": d, "start_ns": s, "end_ns": e})
        busy = interval_union(f, ["g", "d"]).group_by("g").agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("b")).sort("g")
        return busy["b"].to_numpy()
    # each (group, device) segment shifted past the last one: one running maximum for all
    base = seg * step - lo
    del seg
    ss = s + base
    run = np.maximum.accumulate(e + base)
    del base
    new = np.r_[True, ss[1:] > run[:-1]]
    last = np.r_[new[1:], True]
    length = run[last] - ss[new]
    owner = g[new]
    heads = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
    return np.add.reduceat(length, heads)


#: Operations :func:`span_and_busy` sorts at a time.
_SPAN_BLOCK = 1 << 18


def within_any(values: pl.Series, starts: pl.Series, ends: pl.Series) -> pl.Series:
    """Boolean mask: ``values[i]`` lies in some ``[starts[j], ends[j]]`` (nulls never do).
    One binary search per value over the ranges sorted by start, with the running maximum of
    their ends, so overlapping ranges are handled and no value is sorted. Values are searched
    in slices of :data:`_SLICE` (the temporaries of 76 M values were 2 GB)."""
    import numpy as np  # here: the stats reports import this module and need no numpy (~10 MB)

    lo = np.iinfo(np.int64).min
    order = np.argsort(starts.fill_null(lo).to_numpy(), kind="stable")
    s = starts.fill_null(lo).to_numpy()[order]
    e = np.maximum.accumulate(ends.fill_null(lo).to_numpy()[order]) if order.size else np.empty(0, np.int64)
    parts = []
    for off in range(0, max(values.len(), 1), _SLICE):
        part = values.slice(off, _SLICE)
        v = part.fill_null(lo).to_numpy()
        idx = np.searchsorted(s, v, side="right") - 1
        ok = (idx >= 0) & part.is_not_null().to_numpy()
        ok[ok] &= v[ok] <= e[idx[ok]]
        parts.append(pl.Series(values.name, ok))
    return pl.concat(parts) if len(parts) > 1 else parts[0]


_SLICE = 4_000_000
