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


#: Panels of the GPU metrics chart: stable metric name → (panel title, colour). DRAM
#: bandwidth is also shown in GB/s when the GPU's peak is known (``trace.gpus``).
METRIC_PANELS: dict[str, tuple[str, str]] = {
    "sms_active": ("SMs active", "#0072B2"),
    "sm_issue": ("SM issue", "#56B4E9"),
    "tensor_active": ("Tensor active", "#D55E00"),
    "dram_read_bandwidth": ("DRAM read", "#009E73"),
    "dram_write_bandwidth": ("DRAM write", "#CC79A7"),
}


def _peak_bandwidth(gpus: pl.DataFrame | None) -> pl.DataFrame | None:
    """``device_id`` (``rank``) → ``peak_bytes_per_s`` from ``trace.gpus``, or ``None``."""
    if gpus is None or gpus.is_empty() or "memory_bandwidth_bytes_per_s" not in gpus.columns:
        return None
    keys = [c for c in ("rank", "device_id") if c in gpus.columns]
    peak = gpus.select(*keys, pl.col("memory_bandwidth_bytes_per_s").cast(pl.Float64).alias("peak_bytes_per_s"))
    peak = peak.filter(pl.col("peak_bytes_per_s") > 0).unique(keys)
    return peak if peak.height else None


def metric_means(
    gpu_metrics: pl.DataFrame,
    *,
    window: Window | None = None,
    gpus: pl.DataFrame | None = None,
    metrics: Sequence[str] = ("sms_active", "tensor_active", "dram_read_bandwidth", "dram_write_bandwidth"),
) -> pl.DataFrame:
    """Time-weighted mean of each metric per GPU over ``window`` (default: each GPU's sampled
    span), by exact integration (:func:`tracekit.analysis.metrics.window_metrics`).

    Returns (``rank``,) ``device_id``, ``window_start_ns``, ``window_end_ns`` and, per metric
    present, ``<metric>_pct`` (% of peak); with ``gpus`` (``trace.gpus``) also
    ``dram_read_gbps`` / ``dram_write_gbps`` (10⁹ bytes/s). Empty without samples.
    """
    from tracekit.analysis.metrics import metric_names, window_metrics

    present = [m for m in metrics if gpu_metrics.height and m in set(metric_names(gpu_metrics))]
    keys = [c for c in ("rank", "device_id") if c in gpu_metrics.columns]
    if not present:
        return pl.DataFrame(schema={**{k: pl.Int64 for k in keys}, "window_start_ns": pl.Int64, "window_end_ns": pl.Int64})
    spans = gpu_metrics.group_by(keys).agg(pl.col("timestamp_ns").min().alias("start_ns"),
                                           (pl.col("timestamp_ns").max() + 1).alias("end_ns")).sort(keys)
    if window is not None:
        spans = spans.with_columns(pl.lit(int(window[0]), pl.Int64).alias("start_ns"),
                                   pl.lit(int(window[1]), pl.Int64).alias("end_ns"))
    out = window_metrics(spans, gpu_metrics, metrics=present).rename(
        {"start_ns": "window_start_ns", "end_ns": "window_end_ns", **{m: f"{m}_pct" for m in present}})
    out = out.drop([c for c in out.columns if c == "metric_period_ns"])
    peak = _peak_bandwidth(gpus)
    if peak is not None:
        on = [k for k in keys if k in peak.columns]
        out = out.join(peak, on=on, how="left")
        for m, col in (("dram_read_bandwidth", "dram_read_gbps"), ("dram_write_bandwidth", "dram_write_gbps")):
            if f"{m}_pct" in out.columns:
                out = out.with_columns((pl.col(f"{m}_pct") / 100 * pl.col("peak_bytes_per_s") / 1e9).alias(col))
        out = out.with_columns((pl.col("peak_bytes_per_s") / 1e9).alias("dram_peak_gbps")).drop("peak_bytes_per_s")
    return out.sort(keys)


def _mean(frame: pl.DataFrame, column: str) -> float | None:
    if column not in frame.columns:
        return None
    value = frame[column].mean()
    return None if value is None else float(value)  # type: ignore[arg-type]


def gpu_metric_panels(
    gpu_metrics: pl.DataFrame,
    *,
    metrics: Sequence[str] = DEFAULT_GPU_METRICS,
    window: Window | None = None,
    gpus: pl.DataFrame | None = None,
    max_points: int = 600,
) -> pl.DataFrame:
    """:func:`gpu_metrics_series` as stacked panels, one per metric, each titled with its
    mean over the window: ``device_id``, ``metric``, ``panel`` (``Tensor active (%) — mean
    3.5``, ``DRAM read (GB/s) — mean 321 (6.7 % of 4,814)``), ``panel_order``, ``time_ns``,
    ``value`` (the panel's unit: % of peak, or GB/s for DRAM when ``gpus`` gives the peak),
    ``value_pct`` and ``max_pct``."""
    series = gpu_metrics_series(gpu_metrics, metrics=metrics, window=window, max_points=max_points)
    schema = {"device_id": pl.Int64, "metric": pl.Utf8, "panel": pl.Utf8, "panel_order": pl.Int64, "time_ns": pl.Int64,
              "value": pl.Float64, "value_pct": pl.Float64, "max_pct": pl.Float64}
    if series.is_empty():
        return pl.DataFrame(schema=schema)
    means = metric_means(gpu_metrics, window=window, gpus=gpus, metrics=list(dict.fromkeys(series["metric"].to_list())))
    peak = _peak_bandwidth(gpus)
    if peak is not None:
        series = series.join(peak, on=[k for k in ("rank", "device_id") if k in peak.columns and k in series.columns], how="left")
    else:
        series = series.with_columns(pl.lit(None, pl.Float64).alias("peak_bytes_per_s"))
    dram = pl.col("metric").str.starts_with("dram_") & pl.col("peak_bytes_per_s").is_not_null()
    series = series.with_columns(
        pl.when(dram).then(pl.col("value_pct") / 100 * pl.col("peak_bytes_per_s") / 1e9).otherwise(pl.col("value_pct")).alias("value"))
    titles: dict[str, str] = {}
    order = {m: i for i, m in enumerate(METRIC_PANELS)}
    for m in series["metric"].unique().to_list():
        name = METRIC_PANELS.get(m, (m.replace("_", " "), ""))[0]
        pct = _mean(means, f"{m}_pct")
        short = m.removesuffix("_bandwidth")
        gbps = _mean(means, f"{short}_gbps")
        gpus_n = means.height
        per = f" (mean of {gpus_n} GPUs)" if gpus_n > 1 else ""
        if gbps is not None and m.startswith("dram_"):
            top = float(means["dram_peak_gbps"].max() or 0)  # type: ignore[arg-type]
            share = f" = {pct:.1f} % of {top:,.0f}" if pct is not None else ""
            titles[m] = f"{name} (GB/s) — mean {gbps:,.0f} GB/s{share}{per}"
        elif pct is not None:
            titles[m] = f"{name} (% of peak) — mean {pct:.1f} %{per}"
        else:
            titles[m] = f"{name} (% of peak)"
    return series.with_columns(
        pl.col("metric").replace_strict(titles, return_dtype=pl.Utf8).alias("panel"),
        pl.col("metric").replace_strict(order, default=len(order), return_dtype=pl.Int64).alias("panel_order"),
    ).select(*[c for c in ("rank",) if c in series.columns], *schema)


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
    if window is not None and not m.is_empty():
        # the level at the window's start and end count as points: memory allocated before a
        # steady window is in use all through it, with or without events inside
        before = m.filter(pl.col("start_ns") < window[0]).sort("start_ns")
        carried = (before.group_by(keys).agg(pl.col("in_use_bytes").last()) if keys
                   else before.select(pl.col("in_use_bytes").last()))
        carried = carried.filter(pl.col("in_use_bytes").is_not_null())
        inside = m.filter(pl.col("start_ns").is_between(window[0], window[1])).select(*keys, "start_ns", "in_use_bytes")
        edge = carried.with_columns(pl.lit(int(window[0]), pl.Int64).alias("start_ns")).select(*keys, "start_ns", "in_use_bytes")
        pts = pl.concat([edge, inside], how="vertical_relaxed").sort([*keys, "start_ns"])
        if pts.height:
            last = (pts.group_by(keys).agg(pl.col("in_use_bytes").last()) if keys else pts.select(pl.col("in_use_bytes").last()))
            last = last.with_columns(pl.lit(int(window[1]) - 1, pl.Int64).alias("start_ns")).select(*keys, "start_ns", "in_use_bytes")
            pts = pl.concat([pts, last], how="vertical_relaxed")
        m = pts
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
