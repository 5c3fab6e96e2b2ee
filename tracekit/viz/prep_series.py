"""Data preparation of the time-series and communication charts (re-exported by :mod:`tracekit.viz.prep`).

GPU metrics and memory in use binned to a bounded number of points; NCCL bus bandwidth.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from tracekit.analysis.layers import LAYER_RANGE_PATTERN

Window = tuple[int, int]

#: GPU metrics shown by default (nsys ``--gpu-metrics-devices``; stable names of ``gpu_metrics``).
DEFAULT_GPU_METRICS: tuple[str, ...] = (
    "tensor_active",
    "dram_read_bandwidth",
    "dram_write_bandwidth",
    "sms_active",
)


# -- time series -------------------------------------------------------------------------------
def _bin_width(window: Window, max_points: int) -> int:
    return max(-(-(window[1] - window[0]) // max(max_points, 1)), 1)


def gpu_metrics_series(
    gpu_metrics: pl.DataFrame,
    *,
    metrics: Sequence[str] = DEFAULT_GPU_METRICS,
    window: Window | None = None,
    max_points: int = 600,
) -> pl.DataFrame:
    """GPU metric samples averaged into at most ``max_points`` time bins per device and metric.

    Parameters
    ----------
    gpu_metrics
        ``trace.gpu_metrics`` (long: ``device_id``, ``timestamp_ns``, ``metric``,
        ``metric_label``, ``value``).
    metrics
        Stable metric names (``tensor_active``, ``dram_read_bandwidth`` …); only their
        percentage series (``[Throughput %]``) are kept.

    Returns
    -------
    ``device_id``, ``metric``, ``label`` (``Tensor Active``), ``time_ns`` (bin start, Int64),
    ``value_pct`` (mean, Float64) and ``max_pct``.
    """
    g = gpu_metrics.filter(
        pl.col("metric").is_in(list(metrics))
        & pl.col("metric_label").str.contains("%", literal=True)
    )
    if window is not None:
        g = g.filter(pl.col("timestamp_ns").is_between(window[0], window[1]))
    if g.is_empty():
        return pl.DataFrame(
            schema={"device_id": pl.Int64, "metric": pl.Utf8, "label": pl.Utf8, "time_ns": pl.Int64,
                    "value_pct": pl.Float64, "max_pct": pl.Float64}
        )  # fmt: skip
    lo, hi = g["timestamp_ns"].min(), g["timestamp_ns"].max()
    win = window or (int(lo), int(hi) + 1)  # type: ignore[arg-type]
    width = _bin_width(win, max_points)
    return (
        g.with_columns(
            (((pl.col("timestamp_ns") - win[0]) // width) * width + win[0]).alias("time_ns"),
            pl.col("metric_label").str.replace(r"\s*\[.*\]$", "").alias("label"),
        )
        .group_by("device_id", "metric", "label", "time_ns")
        .agg(
            pl.col("value").cast(pl.Float64).mean().alias("value_pct"),
            pl.col("value").cast(pl.Float64).max().alias("max_pct"),
        )
        .sort("device_id", "metric", "time_ns")
    )


def memory_series(
    memory_usage: pl.DataFrame,
    *,
    by: Sequence[str] = ("device_id",),
    window: Window | None = None,
    max_points: int = 800,
) -> pl.DataFrame:
    """Device memory in use over time from allocation and free events.

    Per device this is :func:`tracekit.analysis.memory.memory_timeline` (frees matched to their
    allocation by address, host memory left out), binned; otherwise a running sum of
    ``bytes`` (+ for allocations, − for frees) per ``by`` group.

    The running sum starts at zero when the capture starts: memory allocated before the
    capture (or by allocators that nsys does not see) is not counted.

    Returns
    -------
    the ``by`` columns, ``time_ns`` (bin start), ``in_use_bytes`` (at the bin's end, Int64) and
    ``peak_bytes`` (highest within the bin); at most ``max_points`` rows per group.
    """
    keys = [c for c in by if c in memory_usage.columns]
    if tuple(by) == ("device_id",) and not memory_usage.is_empty():
        try:
            from tracekit.analysis.memory import memory_timeline

            m = memory_timeline(memory_usage)
        except (ImportError, pl.exceptions.ColumnNotFoundError):
            m = None
        if m is not None:
            keys = [c for c in ("rank", "device_id") if c in m.columns]
            return _bin_memory(
                m.select(*keys, "start_ns", "in_use_bytes"), keys, window, max_points
            )
    sign = (
        pl.when(pl.col("operation").str.to_lowercase().str.contains("free")).then(-1).otherwise(1)
    )
    running = (pl.col("bytes").fill_null(0) * sign).cum_sum()
    m = (
        memory_usage.filter(pl.col("start_ns").is_not_null())
        .sort("start_ns")
        .with_columns((running.over(keys) if keys else running).alias("in_use_bytes"))
    )
    return _bin_memory(m, keys, window, max_points)


def _bin_memory(
    m: pl.DataFrame, keys: list[str], window: Window | None, max_points: int
) -> pl.DataFrame:
    if window is not None:
        m = m.filter(pl.col("start_ns").is_between(window[0], window[1]))
    if m.is_empty():
        return pl.DataFrame(
            schema={**{k: pl.Int64 for k in keys}, "time_ns": pl.Int64, "in_use_bytes": pl.Int64,
                    "peak_bytes": pl.Int64}
        )  # fmt: skip
    win = window or (int(m["start_ns"].min()), int(m["start_ns"].max()) + 1)  # type: ignore[arg-type]
    width = _bin_width(win, max_points)
    return (
        m.with_columns((((pl.col("start_ns") - win[0]) // width) * width + win[0]).alias("time_ns"))
        .group_by(*keys, "time_ns")
        .agg(pl.col("in_use_bytes").last(), pl.col("in_use_bytes").max().alias("peak_bytes"))
        .sort(*keys, "time_ns")
    )


# -- memory per NVTX range (layer) ----------------------------------------------------------------
#: Ranges the memory views show by default: a layer's own range (``layer.N``, ``layers.N``,
#: ``block N``, ``h.N`` and module paths such as ``model.layers.N``:
#: :data:`tracekit.analysis.layers.LAYER_RANGE_PATTERN`), ``backward`` and ``optimizer``.
LAYER_MEMORY_PATTERN = LAYER_RANGE_PATTERN + r"|^(?:backward|optimizer)$"


def _lane_keys(per_range: pl.DataFrame) -> list[str]:
    return [c for c in ("rank", "pid", "device_id") if c in per_range.columns]


def _lane(per_range: pl.DataFrame) -> pl.Expr:
    """``GPU d``, prefixed by the rank or the pid when the frame has several of them."""
    gpu = pl.concat_str(pl.lit("GPU "), pl.col("device_id").cast(pl.Utf8))
    if "rank" in per_range.columns and per_range["rank"].n_unique() > 1:
        return pl.concat_str(pl.lit("rank "), pl.col("rank").cast(pl.Utf8), pl.lit(" · "), gpu)
    if per_range["pid"].n_unique() > 1:
        return pl.concat_str(pl.lit("pid "), pl.col("pid").cast(pl.Utf8), pl.lit(" · "), gpu)
    return gpu


def layer_bands(per_range: pl.DataFrame, *, max_bands: int = 400) -> pl.DataFrame:
    """The ranges drawn as bands behind the memory line.

    Input: :func:`tracekit.analysis.memory.layer_memory` output. Nested ranges would overlap,
    so only the outermost level present is kept (select the ranges you want to see with
    ``layer_memory(..., ranges=r"^layer\\.\\d+$")``); the earliest ``max_bands`` of them.

    Returns (``rank``,) ``pid``, ``device_id``, ``lane``, ``name``, ``phase``, ``step``,
    ``start_ns``, ``end_ns``, ``in_use_at_entry_bytes``, ``in_use_at_exit_bytes``,
    ``peak_inside_bytes``, ``net_growth_bytes``, ``allocated_bytes``, ``freed_bytes``.
    """
    cols = [*_lane_keys(per_range), "lane", "name", "phase", "step", "start_ns", "end_ns", "in_use_at_entry_bytes",
            "in_use_at_exit_bytes", "peak_inside_bytes", "net_growth_bytes", "allocated_bytes", "freed_bytes"]
    if per_range.is_empty():
        return per_range.with_columns(pl.lit(None, pl.Utf8).alias("lane")).select(cols)
    top = per_range.filter(pl.col("level") == pl.col("level").min())
    return top.with_columns(_lane(per_range).alias("lane")).sort("start_ns").head(max_bands).select(cols)


def layer_memory_series(
    memory_usage: pl.DataFrame,
    per_range: pl.DataFrame,
    *,
    window: Window | None = None,
    max_points: int = 800,
) -> pl.DataFrame:
    """Memory in use by each process on each device of ``per_range``, the line under the bands.

    The running total is :func:`tracekit.analysis.memory.memory_timeline` with
    ``per_process=True`` (the total :func:`~tracekit.analysis.memory.layer_memory` reports),
    binned to at most ``max_points`` per lane over ``window`` (default: from the first range's
    start to the last range's end), with the total at the window's start and end as points.

    Returns (``rank``,) ``pid``, ``device_id``, ``lane``, ``time_ns``, ``in_use_bytes`` (at
    the bin's end) and ``peak_bytes`` (highest within the bin).
    """
    from tracekit.analysis.memory import memory_timeline

    lanes = _lane_keys(per_range)
    out_schema = {**{k: pl.Int64 for k in lanes}, "lane": pl.Utf8, "time_ns": pl.Int64, "in_use_bytes": pl.Int64,
                  "peak_bytes": pl.Int64}
    if per_range.is_empty() or memory_usage.is_empty():
        return pl.DataFrame(schema=out_schema)
    win = window or (int(per_range["start_ns"].min()), int(per_range["end_ns"].max()))  # type: ignore[arg-type]
    pairs = per_range.select(lanes).unique()
    tl = memory_timeline(memory_usage, per_process=True).join(pairs, on=lanes)
    before = tl.filter(pl.col("start_ns") < win[0]).group_by(lanes).agg(pl.col("in_use_bytes").last())
    inside = tl.filter(pl.col("start_ns").is_between(win[0], win[1])).select(*lanes, "start_ns", "in_use_bytes")
    first = pairs.join(before, on=lanes, how="left").with_columns(
        pl.lit(win[0], pl.Int64).alias("start_ns"), pl.col("in_use_bytes").fill_null(0)
    ).select(*lanes, "start_ns", "in_use_bytes")
    pts = pl.concat([first, inside], how="vertical_relaxed").sort([*lanes, "start_ns"])
    last = pts.group_by(lanes).agg(pl.col("in_use_bytes").last()).with_columns(pl.lit(win[1], pl.Int64).alias("start_ns"))
    pts = pl.concat([pts, last.select(pts.columns)], how="vertical_relaxed")
    binned = _bin_memory(pts, lanes, win, max_points)
    return binned.with_columns(_lane(per_range).alias("lane")).select(*lanes, "lane", "time_ns", "in_use_bytes", "peak_bytes")


def layer_growth(data: pl.DataFrame, *, by: str = "name") -> pl.DataFrame:
    """Net memory growth per layer name and phase, for the growth bar chart.

    Input: :func:`tracekit.analysis.memory.layer_memory` output (summarised with
    :func:`~tracekit.analysis.memory.layer_memory_summary` by ``by`` and ``phase``), or that
    summary already. Returns its columns (``by``, ``phase``, ``instances``,
    ``mean_net_growth_bytes``, …), in order of first appearance.
    """
    if "mean_net_growth_bytes" in data.columns:
        return data
    from tracekit.analysis.memory import layer_memory_summary

    return layer_memory_summary(data, by=(by, "phase"))


# -- communication -----------------------------------------------------------------------------
#: nccl-tests' bus-bandwidth factors: busbw = algbw × factor(n ranks).
BUS_FACTORS: dict[str, str] = {
    "allreduce": "2*(n-1)/n",
    "allgather": "(n-1)/n",
    "reducescatter": "(n-1)/n",
    "alltoall": "(n-1)/n",
    "broadcast": "1",
    "reduce": "1",
    "send": "1",
    "recv": "1",
}


def nccl_bandwidth(calls: pl.DataFrame) -> pl.DataFrame:
    """Algorithm and bus bandwidth of each NCCL call (nccl-tests' definitions).

    Uses :func:`tracekit.analysis.comm_bandwidth.collective_bandwidth` (then ``busbw_gbps``
    is copied to ``bus_bandwidth_gbps`` and calls without a size are dropped). Without it:
    ``algbw = bytes / GPU duration``; ``busbw = algbw × 2(n-1)/n`` for all-reduce,
    ``× (n-1)/n`` for all-gather, reduce-scatter and all-to-all, ``× 1`` otherwise, with ``n``
    the communicator size. Frames that already have ``bus_bandwidth_gbps`` pass unchanged.

    Parameters
    ----------
    calls
        ``trace.nccl`` (``op``, ``bytes``, ``comm_nranks``, ``gpu_duration_ns``; ``rank``,
        ``gpu_start_ns`` and ``gpu_end_ns`` are kept).

    Returns
    -------
    ``calls`` with ``algbw_gbps`` and ``bus_bandwidth_gbps`` (1e9 bytes/s; null without a size
    or a GPU duration), plus ``start_ns``/``end_ns`` copied from the GPU times.
    """
    if "bus_bandwidth_gbps" in calls.columns:
        return calls
    needed = {"op", "bytes", "gpu_duration_ns", "comm_nranks"}
    try:
        from tracekit.analysis.comm_bandwidth import collective_bandwidth
    except ImportError:
        needed.add("(tracekit.analysis.comm_bandwidth)")  # never a column: use the fallback
    if needed <= set(calls.columns):
        out = collective_bandwidth(calls).with_columns(
            pl.col("busbw_gbps").alias("bus_bandwidth_gbps")
        )
        if "gpu_start_ns" in out.columns and "start_ns" not in out.columns:
            out = out.with_columns(
                pl.col("gpu_start_ns").alias("start_ns"), pl.col("gpu_end_ns").alias("end_ns")
            )
        return out
    n = (
        pl.col("comm_nranks").cast(pl.Float64)
        if "comm_nranks" in calls.columns
        else pl.lit(None, pl.Float64)
    )
    op = pl.col("op").str.to_lowercase().str.replace_all(r"[^a-z]", "")
    factor = (
        pl.when(op == "allreduce").then(2 * (n - 1) / n)
        .when(op.is_in(["allgather", "reducescatter", "alltoall"])).then((n - 1) / n)
        .otherwise(pl.lit(1.0))
    )  # fmt: skip
    algbw = pl.col("bytes").cast(pl.Float64) / pl.col("gpu_duration_ns").cast(pl.Float64)
    out = calls.with_columns(
        pl.when(pl.col("gpu_duration_ns") > 0).then(algbw).alias("algbw_gbps"),
    ).with_columns((pl.col("algbw_gbps") * factor).alias("bus_bandwidth_gbps"))
    if "gpu_start_ns" in calls.columns and "start_ns" not in calls.columns:
        out = out.with_columns(
            pl.col("gpu_start_ns").alias("start_ns"), pl.col("gpu_end_ns").alias("end_ns")
        )
    return out
