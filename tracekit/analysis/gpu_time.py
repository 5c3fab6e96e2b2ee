"""GPU busy and idle time: busy time per device, utilization in bins, stream concurrency, and
idle gaps with their probable cause on the CPU side.

*Busy* is the union of kernel, memcpy and memset intervals on a device, so overlapping work on
several streams counts once. Every function groups by ``rank`` as well when its input has one.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from tracekit.analysis._frames import gpu_ops, interval_union, rank_keys, sorted_by
from tracekit.analysis.attribution import launch_info

__all__ = [
    "SYNC_API_PATTERN",
    "busy_time",
    "gpu_ops",
    "idle_gaps",
    "stream_concurrency",
    "utilization",
]

#: CUDA calls that block the host until GPU work finishes.
SYNC_API_PATTERN = r"Synchronize|^cuStreamWaitValue|^cudaStreamQuery|^cudaEventQuery"
#: Host↔device copies issued by the host (the synchronous ones block it).
COPY_API_PATTERN = r"^cu(?:da)?Memcpy|^cu(?:da)?Memset"
#: Calls that launch a CUDA graph.
GRAPH_LAUNCH_API = r"^cu(?:da)?GraphLaunch"
#: Calls that put work on a stream.
LAUNCH_API_PATTERN = r"Launch|^cudaGraphLaunch|Async|^cuGraphLaunch"


#: The kinds of call that :func:`idle_gaps` sums per gap, in the order of their codes.
_CALL_KINDS = ("sync_ns", "copy_ns", "launch_ns", "other_api_ns")
#: Gap × call pairs worked through at a time by :func:`_overlap_by_kind` (bounds its memory on
#: exports with many calls per kernel: about 40 bytes a pair).
_PAIRS_PER_CHUNK = 1 << 16


#: Gaps one binary search of :func:`_call_ranges` takes at a time.
_GAPS_PER_SEARCH = 1 << 16


def _calls_by_thread(cuda_api: pl.DataFrame, rk: list[str], threads: pl.Series) -> pl.DataFrame:
    """The calls of ``threads`` sorted by thread and start: (``rank``,) ``global_tid``, ``_as``,
    ``_ae`` (ns), ``_k`` (the index of the call's kind in :data:`_CALL_KINDS`, the patterns
    matched once per distinct name) and ``_ai``, the row's position. No string column is
    carried, and an API table already in that order (one launching thread) is not copied."""
    kind = (
        pl.when(pl.col("_n").str.contains(SYNC_API_PATTERN)).then(0)
        .when(pl.col("_n").str.contains(COPY_API_PATTERN) & ~pl.col("_n").str.contains("Async")).then(1)
        .when(pl.col("_n").str.contains(LAUNCH_API_PATTERN)).then(2)
        .otherwise(3)
    ).cast(pl.UInt8)
    names = cuda_api.select(pl.col("name").unique()).with_columns(pl.col("name").cast(pl.Utf8).fill_null("").alias("_n"))
    names = names.select("name", kind.alias("_k")).drop_nulls("name")
    # a code per call by membership of its name in each kind's few names: a join on the 3 M
    # names of k2m_a6 copied them, and replace_strict hashed them into a table as large
    code = pl.lit(3, pl.UInt8)
    for k in (2, 1, 0):
        code = pl.when(pl.col("name").is_in(names.filter(pl.col("_k") == k).get_column("name").implode())).then(
            pl.lit(k, pl.UInt8)).otherwise(code)
    codes = cuda_api.select(code.alias("_k")).get_column("_k")
    api = cuda_api.select(*rk, "global_tid", pl.col("start_ns").alias("_as"), pl.col("end_ns").alias("_ae")).with_columns(
        codes.fill_null(3))  # a call without a name: "other", as the patterns give
    keep = api.get_column("global_tid").is_in(threads.drop_nulls().unique().implode())
    if not keep.all():
        api = api.filter(keep)
    del keep
    if rk or not _in_thread_order(api):  # a set of ranks is sorted; one process's calls when not in order
        api = api.sort([*rk, "global_tid", "_as"])
    index = pl.UInt32 if api.height < (1 << 32) else pl.Int64
    return api.with_row_index("_ai").with_columns(pl.col("_ai").cast(index))


def _in_thread_order(api: pl.DataFrame) -> bool:
    """Whether one process's calls (``global_tid``, ``_as``) are in (thread, start) order; the
    calls of one thread by their starts' order alone (no diff columns of 3 M calls)."""
    if api.height < 2:
        return True
    tids, starts = api.get_column("global_tid"), api.get_column("_as")
    if tids.null_count() == 0 and tids.min() == tids.max():
        return starts.null_count() == 0 and bool(starts.is_sorted())
    return bool(api.select(
        ((pl.col("global_tid").diff() > 0) | ((pl.col("global_tid").diff() == 0) & (pl.col("_as").diff() >= 0)))
        .slice(1).fill_null(False).all()
    ).item())


def _call_ranges(g: pl.DataFrame, api: pl.DataFrame, tk: list[str]) -> pl.DataFrame:
    """Per gap (``_gap``, its thread ``tk``, ``start_ns``, ``end_ns``), the index range into
    ``api`` (:func:`_calls_by_thread`: sorted by thread, then start; ``_ai`` its row position)
    of its thread's calls that may overlap it: ``_lo`` the last call starting at or before the
    gap's start, else the first starting after it; ``_hi`` the last call starting before its
    end (null where there is none). A binary search in each thread's run of calls: what three
    as-of joins by thread gave, without their sorted copies of the gaps and hash tables of
    the calls (their peak was the diagnosis' on 200 k to 2 M kernels)."""
    schema = {"_gap": g.schema["_gap"], "_lo": api.schema["_ai"], "_hi": api.schema["_ai"]}
    g = g.drop_nulls(tk).sort([*tk, "start_ns"], maintain_order=True)  # a null key matches nothing, as in a join
    if g.height == 0 or api.height == 0:
        return pl.DataFrame(schema=schema)
    # each thread's run of calls and of gaps, [first row, last row + 1), paired by thread
    pairs = _runs(g, tk, "_c", "_d").join(_runs(api, tk, "_a", "_b"), on=tk, how="inner")
    calls = api.get_column("_as").cast(pl.Int64)
    # the starts as they are (no copy) unless some call has none (damage): those sort first in their run
    at = (calls.fill_null(0) if calls.null_count() else calls).to_numpy()
    g0 = g.get_column("start_ns").cast(pl.Int64).to_numpy()
    g1 = g.get_column("end_ns").cast(pl.Int64).to_numpy()
    lo = np.full(g.height, -1, dtype=np.int64)
    hi = np.full(g.height, -1, dtype=np.int64)
    for a, b, c0, d0 in pairs.select("_a", "_b", "_c", "_d").iter_rows():
        a += calls.slice(a, b - a).null_count()  # past the run's calls without a start: they match no gap
        run = at[a:b]
        # the run's gaps _GAPS_PER_SEARCH at a time: the temporaries are of a block's length
        for c in range(c0, d0, _GAPS_PER_SEARCH):
            d = min(c + _GAPS_PER_SEARCH, d0)
            before = np.searchsorted(run, g0[c:d], side="right") - 1  # last call starting at or before the start
            first = np.searchsorted(run, g0[c:d], side="left")  # first call starting at or after it
            last = np.searchsorted(run, g1[c:d], side="left") - 1  # last call starting before the end
            lo[c:d] = np.where(before >= 0, before + a, np.where(first < b - a, first + a, -1))
            hi[c:d] = np.where(last >= 0, last + a, -1)
    out = pl.DataFrame({"_gap": g.get_column("_gap"), "_lo": lo, "_hi": hi})
    return out.select("_gap", *(pl.when(pl.col(c) >= 0).then(pl.col(c)).cast(schema[c]).alias(c) for c in ("_lo", "_hi")))


def _runs(frame: pl.DataFrame, keys: list[str], first: str, end: str) -> pl.DataFrame:
    """The runs of equal ``keys`` in ``frame`` (sorted by them): the keys, the run's first row
    (``first``) and one past its last (``end``)."""
    change = pl.any_horizontal(pl.col(c).ne_missing(pl.col(c).shift(1)) for c in keys).fill_null(True)
    starts = frame.select(keys).with_row_index(first).filter(change)
    return starts.with_columns(pl.col(first).shift(-1, fill_value=frame.height).alias(end)).select(*keys, first, end)


def _overlap_by_kind(rng: pl.DataFrame, api: pl.DataFrame, g0: pl.Series, g1: pl.Series) -> pl.DataFrame:
    """Time of each gap that calls filled, by kind: ``_gap``, ``_k``, ``_ov`` (ns).

    ``rng`` gives each gap's calls as an index range (``_lo``..``_hi``, inclusive) into ``api``
    (``_as``, ``_ae``, ``_k``); ``g0``/``g1`` are the gaps' bounds by ``_gap``. The ranges are
    expanded :data:`_PAIRS_PER_CHUNK` pairs at a time and the columns gathered by position."""
    n = rng.get_column("_hi") - rng.get_column("_lo") + 1
    chunk = (n.cum_sum() // _PAIRS_PER_CHUNK).rename("_c")
    rng = rng.with_columns(chunk)
    a_s, a_e, a_k = api.get_column("_as"), api.get_column("_ae"), api.get_column("_k")
    parts: list[pl.DataFrame] = []
    for part in rng.partition_by("_c", maintain_order=True, include_key=False):
        pairs = part.select("_gap", pl.int_ranges("_lo", pl.col("_hi") + 1).alias("_ai")).explode("_ai")
        ai, gi = pairs.get_column("_ai"), pairs.get_column("_gap")
        pairs = pl.DataFrame({"_gap": gi, "_k": a_k.gather(ai), "_as": a_s.gather(ai), "_ae": a_e.gather(ai),
                              "_g0": g0.gather(gi), "_g1": g1.gather(gi)})
        pairs = pairs.select("_gap", "_k", (pl.min_horizontal("_ae", "_g1") - pl.max_horizontal("_as", "_g0")).alias("_ov"))
        parts.append(pairs.filter(pl.col("_ov") > 0).group_by("_gap", "_k").agg(pl.col("_ov").sum()))
    if not parts:
        return pl.DataFrame(schema={"_gap": pl.UInt32, "_k": pl.UInt8, "_ov": pl.Int64})
    # a gap is one row of ``rng``, so all of its pairs are in one chunk: the chunks' sums are final
    return pl.concat(parts)


def _with_next(gaps: pl.DataFrame, nxt: pl.DataFrame, on: list[str]) -> pl.DataFrame:
    """``gaps`` left-joined to ``nxt`` on ``on``, in the gaps' order. Where ``nxt`` holds one
    row per gap in the gaps' order (the usual case: the operation that ends each gap, found
    in the same sorted order), its other columns are put beside the gaps' without a join,
    which copied every column of both (490 k gaps with kernel names: a peak of the diagnosis
    on a 2 M-kernel export, issue 44). The gaps' keys are unique (one gap ends where each
    merged busy stretch of a device starts), so row-by-row equal keys are the join's pairs; a
    null key, which a join never matches, takes the join."""
    if nxt.height == gaps.height and gaps.select(on).equals(nxt.select(on), null_equal=False):
        return gaps.hstack(nxt.drop(on).get_columns())
    return gaps.join(nxt, on=on, how="left", maintain_order="left")


def _device_keys(frame: pl.DataFrame) -> list[str]:
    return [*rank_keys(frame), "device_id"]


def busy_time(ops: pl.DataFrame) -> pl.DataFrame:
    """Busy time per device.

    Parameters
    ----------
    ops
        GPU operations with ``device_id``, ``start_ns``, ``end_ns`` (``kernels``, or
        :func:`gpu_ops` of kernels, memcpys and memsets); ``rank`` when present.

    Returns
    -------
    One row per (``rank``,) ``device_id``: ``ops``, ``first_start_ns``, ``last_end_ns``,
    ``span_ns`` (last end − first start), ``busy_ns`` (length of the union of the
    intervals), ``idle_ns`` (span − busy), ``utilization`` (busy / span, 0–1) and
    ``summed_ns`` (sum of durations; above ``busy_ns`` when streams overlap).
    """
    keys = _device_keys(ops)
    merged = interval_union(ops, keys)
    busy = merged.group_by(keys).agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("busy_ns"))
    stats = ops.group_by(keys).agg(
        pl.len().alias("ops"),
        pl.col("start_ns").min().alias("first_start_ns"),
        pl.col("end_ns").max().alias("last_end_ns"),
        (pl.col("end_ns") - pl.col("start_ns")).sum().alias("summed_ns"),
    )
    out = stats.join(busy, on=keys, how="left").with_columns(
        (pl.col("last_end_ns") - pl.col("first_start_ns")).alias("span_ns")
    )
    out = out.with_columns(
        (pl.col("span_ns") - pl.col("busy_ns")).alias("idle_ns"),
        pl.when(pl.col("span_ns") > 0).then(pl.col("busy_ns") / pl.col("span_ns")).alias("utilization"),
    )
    return out.select(*keys, "ops", "first_start_ns", "last_end_ns", "span_ns", "busy_ns", "idle_ns",
                      "utilization", "summed_ns").sort(keys)


#: Most bins :func:`utilization` builds (devices × bins): 50 M rows of four 8-byte columns ≈ 1.6 GB.
MAX_UTILIZATION_BINS = 50_000_000


def utilization(
    ops: pl.DataFrame,
    *,
    bin_ns: int = 1_000_000,
    start_ns: int | None = None,
    end_ns: int | None = None,
) -> pl.DataFrame:
    """Busy share of each time bin per device.

    Bins are ``[start_ns + k·bin_ns, start_ns + (k+1)·bin_ns)``; ``start_ns`` defaults to
    the first operation start on any device of the (rank's) input, ``end_ns`` to the last end.

    Returns one row per (``rank``,) ``device_id``, ``bin_start_ns`` — every bin of the
    window, idle ones included — with ``busy_ns`` (union of the device's intervals inside the
    bin) and ``utilization`` (``busy_ns / bin_ns``; the last bin is divided by its clipped
    width).

    Raises ``ValueError`` when the grid would exceed :data:`MAX_UTILIZATION_BINS` (a single end
    time of ``INT64_MAX`` in a damaged export once asked for 73 TB).
    """
    if bin_ns <= 0:
        msg = f"bin_ns must be positive, got {bin_ns}"
        raise ValueError(msg)
    keys = _device_keys(ops)
    rk = rank_keys(ops)
    merged = interval_union(ops, keys)
    bounds = ops.group_by(rk or pl.lit(0).alias("_all")).agg(
        pl.col("start_ns").min().alias("_w0"), pl.col("end_ns").max().alias("_w1")
    )
    if start_ns is not None:
        bounds = bounds.with_columns(pl.lit(start_ns, pl.Int64).alias("_w0"))
    if end_ns is not None:
        bounds = bounds.with_columns(pl.lit(end_ns, pl.Int64).alias("_w1"))
    on = rk or None
    n_devices = ops.select(keys).n_unique()
    widest = bounds.select((pl.col("_w1") - pl.col("_w0")).max()).item() or 0
    if widest // bin_ns * max(n_devices, 1) > MAX_UTILIZATION_BINS:
        msg = (
            f"utilization: the window spans {widest / 1e9:.3g} s, {widest // bin_ns:,} bins of {bin_ns:,} ns per "
            f"device (limit {MAX_UTILIZATION_BINS:,} in all); pass a larger bin_ns or start_ns/end_ns "
            "(an operation ending far after the others usually means a damaged end time)"
        )
        raise ValueError(msg)
    merged = merged.join(bounds, on=on) if on else merged.join(bounds.drop("_all"), how="cross")
    merged = merged.with_columns(
        pl.max_horizontal("start_ns", "_w0").alias("start_ns"), pl.min_horizontal("end_ns", "_w1").alias("end_ns")
    ).filter(pl.col("end_ns") > pl.col("start_ns"))
    first = (pl.col("start_ns") - pl.col("_w0")) // bin_ns
    last = (pl.col("end_ns") - 1 - pl.col("_w0")) // bin_ns
    pieces = merged.with_columns(pl.int_ranges(first, last + 1).alias("_bin")).explode("_bin")
    b0 = pl.col("_w0") + pl.col("_bin") * bin_ns
    pieces = pieces.with_columns(
        (pl.min_horizontal("end_ns", b0 + bin_ns) - pl.max_horizontal("start_ns", b0)).alias("_ov")
    )
    busy = pieces.group_by([*keys, "_bin"]).agg(pl.col("_ov").sum().alias("busy_ns"))
    # the full grid of bins for every device seen
    devices = ops.select(keys).unique()
    devices = devices.join(bounds, on=on) if on else devices.join(bounds.drop("_all"), how="cross")
    n_bins = ((pl.col("_w1") - pl.col("_w0") + bin_ns - 1) // bin_ns).clip(lower_bound=1)
    grid = devices.with_columns(pl.int_ranges(0, n_bins).alias("_bin")).explode("_bin")
    out = grid.join(busy, on=[*keys, "_bin"], how="left").with_columns(pl.col("busy_ns").fill_null(0))
    width = pl.min_horizontal(pl.lit(bin_ns, pl.Int64), pl.col("_w1") - (pl.col("_w0") + pl.col("_bin") * bin_ns))
    out = out.with_columns(
        (pl.col("_w0") + pl.col("_bin") * bin_ns).alias("bin_start_ns"),
        (pl.col("busy_ns") / width).alias("utilization"),
    )
    return out.select(*keys, "bin_start_ns", "busy_ns", "utilization").sort([*keys, "bin_start_ns"])


def stream_concurrency(ops: pl.DataFrame) -> pl.DataFrame:
    """Time during which exactly k streams of a device were busy, k = 0, 1, 2, …

    Input: ``device_id``, ``stream_id``, ``start_ns``, ``end_ns`` (``rank`` when present).
    Returns one row per (``rank``,) ``device_id``, ``streams`` with ``time_ns`` and
    ``share`` (of the device's span, first start to last end). ``streams == 0`` is idle time
    inside the span.
    """
    keys = _device_keys(ops)
    per_stream = interval_union(ops, [*keys, "stream_id"])
    events = pl.concat(
        [
            per_stream.select(*keys, pl.col("start_ns").alias("t"), pl.lit(1).alias("d")),
            per_stream.select(*keys, pl.col("end_ns").alias("t"), pl.lit(-1).alias("d")),
        ]
    )
    events = events.group_by([*keys, "t"]).agg(pl.col("d").sum()).sort([*keys, "t"])
    events = events.with_columns(
        pl.col("d").cum_sum().over(keys).alias("streams"),
        (pl.col("t").shift(-1).over(keys) - pl.col("t")).alias("time_ns"),
    ).filter(pl.col("time_ns").is_not_null())
    out = events.group_by([*keys, "streams"]).agg(pl.col("time_ns").sum())
    span = out.group_by(keys).agg(pl.col("time_ns").sum().alias("_span"))
    out = out.join(span, on=keys).with_columns((pl.col("time_ns") / pl.col("_span")).alias("share"))
    return out.select(*keys, pl.col("streams").cast(pl.Int64), "time_ns", "share").sort([*keys, "streams"])


def idle_gaps(
    ops: pl.DataFrame,
    cuda_api: pl.DataFrame,
    *,
    min_gap_ns: int = 10_000,
    launch_share: float = 0.5,
    cause_share: float = 0.5,
) -> pl.DataFrame:
    """Idle stretches of each device longer than ``min_gap_ns``, with a probable cause.

    Parameters
    ----------
    ops
        GPU operations (``device_id``, ``start_ns``, ``end_ns``, ``correlation_id``,
        ``global_pid``; ``rank`` when present), e.g. :func:`gpu_ops` of a trace.
    cuda_api
        The ``cuda_api`` table.
    min_gap_ns
        Smallest gap reported.
    launch_share
        Share of the gap that launch calls must fill for ``launch_bound``.
    cause_share
        Share of the gap that calls of one kind must fill for ``sync_wait``, ``host_copy`` and
        ``cuda_api`` (a synchronising call that overlaps a gap by a few microseconds does not
        make it a ``sync_wait`` gap).

    Returns
    -------
    One row per gap: (``rank``,) ``device_id``, ``start_ns`` (end of the previous busy
    stretch), ``end_ns`` (start of the next operation), ``duration_ns``, ``next_op`` (its
    name; of operations that start together, the first in ``ops``' rows: of :func:`gpu_ops`,
    a kernel before a copy, memset or graph), ``next_api`` (the call that launched it),
    ``next_launched_ns`` (start of that call), the time of the gap that calls of the
    launching thread filled, by kind — ``sync_ns`` (``*Synchronize`` and queries),
    ``copy_ns`` (``cudaMemcpy*``/``cudaMemset*`` calls), ``launch_ns`` (kernel/graph launches
    and other ``*Async`` calls), ``other_api_ns`` — and ``cause``, the first that applies of:

    ``graph``
        the next operation is a node of a CUDA graph whose launch call started before the
        gap (per-node traces): a gap between the operations of one replay, which the GPU
        schedules on its own — never the host's doing;
    ``dependency``
        the next operation was launched before the gap began: the GPU waited on something
        else (an event, another stream or device), not on the host;
    ``sync_wait``
        synchronizing calls filled at least ``cause_share`` of the gap: the host sat waiting,
        so it had not queued work ahead;
    ``host_copy``
        memcpy/memset calls filled at least ``cause_share`` of the gap (pageable staging,
        synchronous copies);
    ``launch_bound``
        launch calls filled at least ``launch_share`` of the gap: the host was still issuing
        work (many short kernels);
    ``cuda_api``
        other CUDA calls (``cudaMalloc``, ``cudaStreamCreate``, ``cudaEventCreate`` …) filled at
        least ``cause_share`` of the gap;
    ``untraced``
        none of the above: the host spent most of the gap outside traced CUDA calls (Python,
        data loading, or no activity at all); the ``*_ns`` columns show the calls it did make.

    Calls are those of the thread that launched the next operation; a gap whose next
    operation has no traced launch is ``untraced``.
    """
    rk = rank_keys(ops, cuda_api)
    keys = [*rk, "device_id"]
    merged = interval_union(ops, keys)
    gaps = merged.with_columns(
        pl.col("end_ns").shift(1).over(keys).alias("_g0"),
    ).filter(pl.col("_g0").is_not_null())
    gaps = gaps.select(*keys, pl.col("_g0").alias("start_ns"), pl.col("start_ns").alias("end_ns"))
    gaps = gaps.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("duration_ns")).filter(
        pl.col("duration_ns") >= min_gap_ns
    )
    del merged  # each step's frames are let go as soon as the next is made (a base under the peak)
    schema_cols = [*keys, "start_ns", "end_ns", "duration_ns", "next_op", "next_api", "next_launched_ns",
                   "sync_ns", "copy_ns", "launch_ns", "other_api_ns", "cause"]
    # the operation that ends the gap and the call that launched it: the operations that
    # start where a gap ends (a semi join on the gaps' ends first, so that only those are
    # made unique and sorted: 200 k kernels, 2 k gaps, 22 MB less at the summary's peak),
    # the first in the table's rows of those that start together, in the gaps' order; only
    # these get their other columns and, below, their launch: a row per gap, not per operation
    opcols = [c for c in ("name", "correlation_id", "global_pid", "op_kind") if c in ops.columns]
    firsts = (
        ops.select(*keys, "start_ns").with_row_index("_op")
        .join(gaps.select(*keys, pl.col("end_ns").alias("start_ns")).unique(), on=[*keys, "start_ns"], how="semi",
              maintain_order="left")
        .unique(subset=[*keys, "start_ns"], keep="first", maintain_order=True)
        .sort([*keys, "start_ns"])
    )
    first_ops = ops.select(*keys, "start_ns", *opcols)[firsts.get_column("_op")]
    del firsts
    if "correlation_id" in first_ops.columns and "global_pid" in first_ops.columns:
        first_ops = launch_info(first_ops, cuda_api)
    else:
        first_ops = first_ops.with_columns(
            pl.lit(None, pl.Int64).alias("global_tid"), pl.lit(None, pl.Utf8).alias("api_name"),
            pl.lit(None, pl.Int64).alias("api_start_ns"),
        )
    nxt = first_ops.select(
        *keys, pl.col("start_ns").alias("end_ns"),
        pl.col("name").alias("next_op") if "name" in first_ops.columns else pl.lit(None, pl.Utf8).alias("next_op"),
        pl.col("api_name").alias("next_api"), pl.col("api_start_ns").alias("next_launched_ns"), "global_tid",
        (pl.col("op_kind") if "op_kind" in first_ops.columns else pl.lit(None, pl.Utf8)).alias("_next_kind"),
    )
    del first_ops
    gaps = _with_next(gaps, nxt, [*keys, "end_ns"]).with_row_index("_gap")
    del nxt

    # calls of the launching thread overlapping each gap: the index range of calls that start
    # inside the gap, plus the one call that started before it (it may straddle)
    api = _calls_by_thread(cuda_api, rk, gaps.get_column("global_tid"))
    tk = [*rk, "global_tid"]
    g = gaps.filter(pl.col("global_tid").is_not_null()).select("_gap", *tk, "start_ns", "end_ns")
    rng = _call_ranges(g, api, tk).filter(
        pl.col("_lo").is_not_null() & pl.col("_hi").is_not_null() & (pl.col("_hi") >= pl.col("_lo"))
    )
    del g
    per_kind = _overlap_by_kind(rng.select("_gap", "_lo", "_hi"), api.select("_as", "_ae", "_k"),
                                gaps.get_column("start_ns"), gaps.get_column("end_ns"))
    del api, rng
    # each kind's time put at its gap's row (``_gap`` is the row's position, one sum per gap
    # and kind): a join would copy every column of the gaps, their names among them
    # (scatter writes into the series it is given: a fresh one per kind)
    gaps = gaps.with_columns(
        pl.zeros(gaps.height, pl.Int64, eager=True).scatter(part.get_column("_gap"), part.get_column("_ov")).alias(k)
        for code, k in enumerate(_CALL_KINDS)
        for part in [per_kind.filter(pl.col("_k") == code)]
    )
    del per_kind
    queued = pl.col("next_launched_ns").is_not_null() & (pl.col("next_launched_ns") <= pl.col("start_ns"))
    cause = (
        pl.when(queued & pl.col("next_api").str.contains(GRAPH_LAUNCH_API).fill_null(False)
                & (pl.col("_next_kind").fill_null("kernel") != "graph"))
        .then(pl.lit("graph"))
        .when(queued)
        .then(pl.lit("dependency"))
        .when(pl.col("sync_ns") >= cause_share * pl.col("duration_ns")).then(pl.lit("sync_wait"))
        .when(pl.col("copy_ns") >= cause_share * pl.col("duration_ns")).then(pl.lit("host_copy"))
        .when(pl.col("launch_ns") >= launch_share * pl.col("duration_ns")).then(pl.lit("launch_bound"))
        .when(pl.col("other_api_ns") >= cause_share * pl.col("duration_ns")).then(pl.lit("cuda_api"))
        .otherwise(pl.lit("untraced"))
    )
    # in that order already (the busy stretches'); no two gaps of a device start together
    return sorted_by(gaps.with_columns(cause.alias("cause")).select(schema_cols), [*keys, "start_ns"])
