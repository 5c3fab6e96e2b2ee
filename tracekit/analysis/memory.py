"""Copies and device memory: bandwidth per copy kind with flags for costly copy patterns, and
device memory in use over time with its peak.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from tracekit.analysis._frames import rank_keys
from tracekit.analysis.attribution import launch_info

__all__ = ["HOST_MEMORY_KINDS", "allocations_at_peak", "copies", "copy_summary", "memory_peak", "memory_timeline"]

#: Memory kinds that live on the host; excluded from device memory in use.
HOST_MEMORY_KINDS: tuple[str, ...] = ("Pageable", "Pinned")


def copies(memcpys: pl.DataFrame, cuda_api: pl.DataFrame | None = None) -> pl.DataFrame:
    """Each memcpy with its achieved bandwidth and flags.

    Input: ``memcpys`` (``bytes``, ``duration_ns``, ``copy_kind``, ``src_kind``,
    ``dst_kind``, ``correlation_id``, ``global_pid``) and, for the API-based flags,
    ``cuda_api`` (or ``memcpys`` already through
    :func:`~tracekit.analysis.attribution.launch_info`).

    Adds ``bandwidth_gbps`` (bytes / ns = 10⁹ B/s; null for zero duration), ``pageable``
    (either side is pageable host memory), ``api_name`` and the launch columns,
    ``is_async`` (the call was an ``*Async`` one), ``pageable_async`` (an async call on
    pageable memory: the driver stages it synchronously, so it does not overlap with the
    host), ``synchronous`` (a blocking call such as ``cudaMemcpy``; null when the call is
    unknown).
    """
    m = memcpys
    if cuda_api is not None and "api_name" not in m.columns:
        m = launch_info(m, cuda_api)
    if "api_name" not in m.columns:
        m = m.with_columns(pl.lit(None, pl.Utf8).alias("api_name"))
    pageable = (pl.col("src_kind") == "Pageable") | (pl.col("dst_kind") == "Pageable")
    is_async = pl.col("api_name").str.contains("Async")
    return m.with_columns(
        pl.when(pl.col("duration_ns") > 0).then(pl.col("bytes") / pl.col("duration_ns")).alias("bandwidth_gbps"),
        pageable.fill_null(False).alias("pageable"),
        is_async.alias("is_async"),
        (is_async & pageable.fill_null(False)).alias("pageable_async"),
        (~is_async).alias("synchronous"),
    )


def copy_summary(
    memcpys: pl.DataFrame,
    memsets: pl.DataFrame | None = None,
    cuda_api: pl.DataFrame | None = None,
    *,
    by: Sequence[str] = ("kind",),
) -> pl.DataFrame:
    """Bytes, time and bandwidth per copy kind (``HtoD``, ``DtoH``, ``DtoD``, ``PtoP`` …, and
    ``memset``).

    ``by`` may add columns of the copy tables (``device_id``, ``src_kind``, ``dst_kind``).
    Returns (``rank``,) ``by``, ``count``, ``bytes``, ``time_ns``, ``bandwidth_gbps`` (total
    bytes / total time), ``median_bandwidth_gbps`` (per copy), ``max_bandwidth_gbps``,
    ``pageable_async`` and ``synchronous`` (counts; null without ``cuda_api``), largest
    time first.
    """
    c = copies(memcpys, cuda_api).with_columns(pl.col("copy_kind").alias("kind"))
    parts = [c]
    if memsets is not None and memsets.height:
        s = memsets.with_columns(
            pl.lit("memset").alias("kind"),
            pl.when(pl.col("duration_ns") > 0).then(pl.col("bytes") / pl.col("duration_ns")).alias("bandwidth_gbps"),
            pl.lit(False).alias("pageable_async"),
            pl.lit(None, pl.Boolean).alias("synchronous"),
        )
        cols = [x for x in c.columns if x in s.columns]
        parts = [c.select(cols), s.select(cols)]
    frame = pl.concat(parts, how="vertical_relaxed")
    keys = list(dict.fromkeys([*rank_keys(frame), *by]))  # "rank" may be given too
    has_api = cuda_api is not None or "api_name" in memcpys.columns
    out = frame.group_by(keys).agg(
        pl.len().cast(pl.Int64).alias("count"),
        pl.col("bytes").sum(),
        pl.col("duration_ns").sum().alias("time_ns"),
        pl.col("bandwidth_gbps").median().alias("median_bandwidth_gbps"),
        pl.col("bandwidth_gbps").max().alias("max_bandwidth_gbps"),
        pl.col("pageable_async").sum().cast(pl.Int64).alias("pageable_async") if has_api else pl.lit(None, pl.Int64).alias("pageable_async"),
        pl.col("synchronous").sum().cast(pl.Int64).alias("synchronous") if has_api else pl.lit(None, pl.Int64).alias("synchronous"),
    )
    out = out.with_columns(
        pl.when(pl.col("time_ns") > 0).then(pl.col("bytes") / pl.col("time_ns")).alias("bandwidth_gbps")
    )
    rk = rank_keys(frame)
    return out.select(*keys, "count", "bytes", "time_ns", "bandwidth_gbps", "median_bandwidth_gbps",
                      "max_bandwidth_gbps", "pageable_async", "synchronous").sort(
        [*rk, "time_ns"], descending=[*([False] * len(rk)), True]
    )


def _device_events(memory_usage: pl.DataFrame, kinds: Sequence[str] | None) -> pl.DataFrame:
    keys = rank_keys(memory_usage)
    m = memory_usage.with_row_index("_ev")
    m = m.filter(pl.col("mem_kind").is_in(list(kinds))) if kinds is not None else m.filter(
        ~pl.col("mem_kind").is_in(list(HOST_MEMORY_KINDS)).fill_null(False)
    )
    by = [*keys, "global_pid", "device_id", "address"]
    allocs = m.filter(pl.col("operation") == "alloc")
    frees = m.filter(pl.col("operation") == "free")
    if frees.height:
        # the size freed is the size of the latest allocation at that address
        matched = frees.sort([*by, "start_ns"]).join_asof(
            allocs.select(*by, "start_ns", pl.col("bytes").alias("_alloc_bytes")).sort([*by, "start_ns"]),
            on="start_ns", by=by, strategy="backward", check_sortedness=False,
        )
        frees = matched.with_columns(
            pl.when(pl.col("bytes").fill_null(0) > 0).then(pl.col("bytes")).otherwise(pl.col("_alloc_bytes")).fill_null(0).alias("bytes")
        ).drop("_alloc_bytes")
    ev = pl.concat([
        allocs.with_columns(pl.col("bytes").alias("delta_bytes"), pl.lit(1).alias("_order")),
        frees.with_columns((-pl.col("bytes")).alias("delta_bytes"), pl.lit(0).alias("_order")),
    ], how="vertical_relaxed")
    return ev


def memory_timeline(memory_usage: pl.DataFrame, *, kinds: Sequence[str] | None = None) -> pl.DataFrame:
    """Device memory in use after each allocation and free.

    Input: ``memory_usage`` (``--cuda-memory-usage=true``). ``kinds`` selects memory kinds
    (default: all but host memory, :data:`HOST_MEMORY_KINDS`). Frees count the bytes of the
    allocation they release (matched by address). Events at the same nanosecond apply frees
    first.

    Returns (``rank``,) ``device_id``, ``start_ns``, ``operation``, ``mem_kind``, ``address``,
    ``delta_bytes``, ``in_use_bytes`` (running total per device, from the first event in the
    trace: memory allocated before the capture began is not known), in time order.
    """
    keys = [*rank_keys(memory_usage), "device_id"]
    ev = _device_events(memory_usage, kinds).sort([*keys, "start_ns", "_order", "_ev"])
    ev = ev.with_columns(pl.col("delta_bytes").cum_sum().over(keys).alias("in_use_bytes"))
    return ev.select(*keys, "start_ns", "operation", "mem_kind", "address", "delta_bytes", "in_use_bytes")


def memory_peak(memory_usage: pl.DataFrame, *, kinds: Sequence[str] | None = None) -> pl.DataFrame:
    """Peak device memory in use per device.

    Returns (``rank``,) ``device_id``, ``peak_bytes``, ``peak_ns`` (first time the peak was
    reached), ``final_bytes``, ``allocations``, ``frees`` and ``live_at_peak`` (allocations
    live at the peak; list them with :func:`allocations_at_peak`).
    """
    keys = [*rank_keys(memory_usage), "device_id"]
    tl = memory_timeline(memory_usage, kinds=kinds)
    peak = tl.sort([*keys, "in_use_bytes", "start_ns"], descending=[*([False] * len(keys)), True, False]).unique(
        subset=keys, keep="first", maintain_order=True
    ).select(*keys, pl.col("in_use_bytes").alias("peak_bytes"), pl.col("start_ns").alias("peak_ns"))
    stats = tl.group_by(keys).agg(
        pl.col("in_use_bytes").last().alias("final_bytes"),
        (pl.col("operation") == "alloc").sum().cast(pl.Int64).alias("allocations"),
        (pl.col("operation") == "free").sum().cast(pl.Int64).alias("frees"),
    )
    live = allocations_at_peak(memory_usage, kinds=kinds).group_by(keys).agg(pl.len().cast(pl.Int64).alias("live_at_peak"))
    return peak.join(stats, on=keys).join(live, on=keys, how="left").sort(keys)


def allocations_at_peak(
    memory_usage: pl.DataFrame, cuda_api: pl.DataFrame | None = None, *, kinds: Sequence[str] | None = None
) -> pl.DataFrame:
    """The allocations live when each device reached its peak: what filled the memory.

    Returns (``rank``,) ``device_id``, ``address``, ``bytes``, ``mem_kind``, ``start_ns``
    (allocation time), ``correlation_id``, ``name`` (allocation name when the allocator set
    one) and, with ``cuda_api``, ``api_name`` (``cudaMalloc``, ``cuMemCreate`` …) and the
    launching thread; largest first.
    """
    keys = [*rank_keys(memory_usage), "device_id"]
    tl = memory_timeline(memory_usage, kinds=kinds)
    peak = tl.sort([*keys, "in_use_bytes", "start_ns"], descending=[*([False] * len(keys)), True, False]).unique(
        subset=keys, keep="first", maintain_order=True
    ).select(*keys, pl.col("start_ns").alias("_peak_ns"))
    ev = _device_events(memory_usage, kinds)
    by = [*rank_keys(memory_usage), "global_pid", "device_id", "address"]
    allocs = ev.filter(pl.col("operation") == "alloc").sort([*by, "start_ns"])
    frees = ev.filter(pl.col("operation") == "free").select(*by, "start_ns", pl.col("start_ns").alias("_freed_ns")).sort([*by, "start_ns"])
    allocs = allocs.join_asof(frees, on="start_ns", by=by, strategy="forward", check_sortedness=False) if frees.height else allocs.with_columns(pl.lit(None, pl.Int64).alias("_freed_ns"))
    live = allocs.join(peak, on=keys).filter(
        (pl.col("start_ns") <= pl.col("_peak_ns")) & (pl.col("_freed_ns").is_null() | (pl.col("_freed_ns") > pl.col("_peak_ns")))
    )
    cols = [*keys, "address", "bytes", "mem_kind", "start_ns", "correlation_id", "name"]
    if cuda_api is not None:
        live = launch_info(live, cuda_api)
        cols += ["api_name", "tid", "api_start_ns"]
    return live.select(cols).sort([*keys, "bytes"], descending=[*([False] * len(keys)), True])
