"""GPU metrics (``nsys --gpu-metrics-devices``) resampled, and attributed to kernels, kernel
names and NVTX ranges.

**How samples are read.** nsys samples each GPU's counters periodically (10 kHz by default);
the sample at ``t_i`` holds the metric's average over the interval since the previous sample,
``(t_{i-1}, t_i]``. tracekit treats a metric as that piecewise-constant function of time (the
first sample covers one median period before it) and averages it over any window by exact
integration:

    mean over [a, b) = (∫_a^b v(t) dt) / (b − a)

computed from cumulative sums of ``v_i · (t_i − t_{i-1})`` and one as-of join per window
end, so cost is O((samples + windows) log) — never a samples × kernels join.

**Short kernels.** A kernel shorter than the sample period lies inside one or two sample
intervals; its mean is the value of those intervals, which also covers time when the kernel
was not running. Such rows have ``metric_period_ns`` > ``duration_ns``
(``below_sample_period`` is true) and their values are an upper context, not the kernel's
own counters; aggregate them by duration weight (:func:`metrics_by`), where they weigh
little, or drill down with Nsight Compute. Windows outside the sampled span get nulls.

Metric names are the loader's stable names (:func:`tracekit.nsys.gpu_metrics.
stable_metric_name`): ``tensor_active``, ``sms_active``, ``sm_issue``,
``dram_read_bandwidth``, ``dram_write_bandwidth``, ``pcie_rx_throughput``,
``nvlink_tx_requests_user_data`` …, the same across nsys versions.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from tracekit.analysis._frames import rank_keys

__all__ = [
    "DEFAULT_METRICS",
    "metric_activity",
    "kernel_metrics",
    "metric_names",
    "metrics_by",
    "resample_metrics",
    "window_metrics",
]

#: Metrics reported by default when present: activity, issue, DRAM, and every NVLink/PCIe
#: throughput metric the export has.
DEFAULT_METRICS: tuple[str, ...] = (
    "tensor_active",
    "sms_active",
    "sm_issue",
    "dram_read_bandwidth",
    "dram_write_bandwidth",
)


#: The metric that says whether a GPU computed: any SM active in the sample interval.
ACTIVITY_METRIC = "sms_active"


def metric_activity(gpu_metrics: pl.DataFrame, ops: pl.DataFrame | None = None) -> pl.DataFrame:
    """What each GPU did according to its metrics alone, and how much of it the traced GPU
    operations account for.

    Parameters
    ----------
    gpu_metrics
        The ``gpu_metrics`` table (stable names; values in percent).
    ops
        The traced GPU operations (``device_id``, ``start_ns``, ``end_ns``; ``rank``), or
        ``None``: then ``untraced_active_ns`` is ``active_ns``.

    Returns
    -------
    One row per (``rank``,) ``device_id``: ``samples``, ``period_ns`` (median sample
    interval), ``start_ns``/``end_ns`` (the sampled span: the first interval's start to the last
    sample), ``span_ns``; the time-weighted mean over the span of each of
    :data:`DEFAULT_METRICS` present (``<metric>_mean``, percent); ``active_ns`` (summed sample
    intervals in which some SM was active, :data:`ACTIVITY_METRIC` > 0), ``active_share``
    (``active_ns / span_ns``), ``sm_active_during_active`` (mean SM active over those
    intervals, percent) and ``untraced_active_ns`` (the part of ``active_ns`` in intervals that
    no traced operation of the device overlaps: GPU work the capture did not trace). Empty
    without samples.
    """
    keys = [*rank_keys(gpu_metrics), "device_id"]
    present = set(metric_names(gpu_metrics)) if gpu_metrics.height else set()
    if gpu_metrics.height == 0 or ACTIVITY_METRIC not in present:
        return pl.DataFrame()
    chosen = [m for m in DEFAULT_METRICS if m in present]
    series, keys = _series(gpu_metrics, chosen)
    act = series[ACTIVITY_METRIC].select(*keys, "_t0", "timestamp_ns", "_dt", "_v", "metric_period_ns")
    active = act.filter(pl.col("_v") > 0)
    if ops is not None and ops.height and active.height:
        okeys = [k for k in keys if k in ops.columns]
        o = ops.select(*okeys, "start_ns", "end_ns").filter(pl.col("end_ns") > pl.col("start_ns")).sort([*okeys, "start_ns"])
        # an interval is traced when some operation of its device ends after its start and
        # starts before its end: the last operation starting before the interval's end
        # (as-of) ends after the interval's start, or one starts inside it
        iv = active.with_row_index("_i").sort([*okeys, "timestamp_ns"])
        last = iv.join_asof(o.with_columns(pl.col("end_ns").cum_max().over(okeys).alias("_reach")).select(
            *okeys, pl.col("start_ns").alias("timestamp_ns"), "_reach"), on="timestamp_ns", by=okeys or None, strategy="backward",
            check_sortedness=False)
        traced = last.filter(pl.col("_reach").is_not_null() & (pl.col("_reach") > pl.col("_t0")))["_i"]
        untraced = active.with_row_index("_i").filter(~pl.col("_i").is_in(traced))
    else:
        untraced = active
    out = act.group_by(keys).agg(
        pl.len().cast(pl.Int64).alias("samples"), pl.col("metric_period_ns").first().alias("period_ns"),
        pl.col("_t0").min().cast(pl.Int64).alias("start_ns"), pl.col("timestamp_ns").max().alias("end_ns"))
    out = out.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("span_ns"))
    for m in chosen:
        part = series[m].group_by(keys).agg((pl.col("_v") * pl.col("_dt")).sum().alias("_i"), pl.col("_dt").sum().alias("_t"))
        out = out.join(part.select(*keys, (pl.col("_i") / pl.col("_t")).alias(f"{m}_mean")), on=keys, how="left")
    busy = active.group_by(keys).agg(pl.col("_dt").sum().cast(pl.Int64).alias("active_ns"),
                                     ((pl.col("_v") * pl.col("_dt")).sum() / pl.col("_dt").sum()).alias("sm_active_during_active"))
    lost = untraced.group_by(keys).agg(pl.col("_dt").sum().cast(pl.Int64).alias("untraced_active_ns"))
    out = out.join(busy, on=keys, how="left").join(lost, on=keys, how="left").with_columns(
        pl.col("active_ns").fill_null(0), pl.col("untraced_active_ns").fill_null(0))
    out = out.with_columns((pl.col("active_ns") / pl.col("span_ns")).alias("active_share"))
    return out.sort(keys)


def metric_names(gpu_metrics: pl.DataFrame) -> list[str]:
    """Stable metric names present in ``gpu_metrics``, sorted."""
    return sorted(gpu_metrics["metric"].unique().drop_nulls().to_list())


def _choose(gpu_metrics: pl.DataFrame, metrics: Sequence[str] | None) -> list[str]:
    present = set(metric_names(gpu_metrics))
    if metrics is None:
        chosen = [m for m in DEFAULT_METRICS if m in present]
        chosen += sorted(m for m in present if (m.startswith(("nvlink_", "pcie_"))) and m not in chosen)
        return chosen
    missing = [m for m in metrics if m not in present]
    if missing:
        msg = f"metrics {', '.join(missing)} are not in this trace; it has: {', '.join(sorted(present)) or 'none'}"
        raise ValueError(msg)
    return list(metrics)


def _series(gpu_metrics: pl.DataFrame, metrics: list[str]) -> tuple[dict[str, pl.DataFrame], list[str]]:
    """Per metric: the samples of each device in time order with ``_dt`` (interval length),
    ``_t0`` (interval start), ``_v`` (value) and ``_C`` (cumulative integral at the sample)."""
    keys = [*rank_keys(gpu_metrics), "device_id"]
    # the metric name repeats on millions of rows: compare it as a categorical
    f = gpu_metrics.select(
        *keys, "timestamp_ns", pl.col("metric").cast(pl.Categorical), pl.col("value").cast(pl.Float64).alias("_v")
    ).filter(pl.col("metric").is_in(metrics))
    parts = f.partition_by("metric", as_dict=True, include_key=False)
    out = {}
    for (name,), part in parts.items():
        part = part.sort([*keys, "timestamp_ns"])
        dt = pl.col("timestamp_ns").diff().over(keys)
        period = dt.median().over(keys)
        part = part.with_columns(dt.fill_null(period).alias("_dt"), period.round().cast(pl.Int64).alias("metric_period_ns"))
        part = part.with_columns(
            (pl.col("timestamp_ns") - pl.col("_dt")).alias("_t0"),
            (pl.col("_v") * pl.col("_dt")).cum_sum().over(keys).alias("_C"),
        )
        out[str(name)] = part
    return out, keys


def _integral_at(points: pl.DataFrame, series: pl.DataFrame, keys: list[str], col: str) -> pl.DataFrame:
    """``points`` (``_w``, keys, ``col``) with ``_I`` = ∫ v from the sampled start to ``col``
    (null after the last sample) and ``_v``, the value of the interval holding ``col``."""
    right = series.select(*keys, pl.col("timestamp_ns").alias(col), pl.col("timestamp_ns").alias("_ts"), "_t0", "_dt", "_C", "_v")
    j = points.sort([*keys, col]).join_asof(right, on=col, by=keys, strategy="forward", check_sortedness=False)
    inside = pl.col(col) >= pl.col("_t0")
    integral = (
        pl.when(inside)
        .then(pl.col("_C") - pl.col("_v") * (pl.col("_ts") - pl.col(col)))
        # before the first sample's interval: clamp to its start
        .otherwise(pl.col("_C") - pl.col("_v") * pl.col("_dt"))
    )
    return j.select("_w", integral.alias("_I"), "_v")


def window_metrics(
    windows: pl.DataFrame,
    gpu_metrics: pl.DataFrame,
    *,
    metrics: Sequence[str] | None = None,
    start: str = "start_ns",
    end: str = "end_ns",
) -> pl.DataFrame:
    """Time-weighted mean of each metric over each window ``[start, end)`` on its device.

    ``windows`` needs ``device_id``, ``start``, ``end`` (``rank`` when the metrics have one).
    Returns ``windows`` (same order) plus one Float64 column per metric (null when the
    window is outside the sampled span; for a zero-length window, the value of the sample
    interval holding it) and ``metric_period_ns`` (median sample period of the device).
    """
    chosen = _choose(gpu_metrics, metrics)
    if not chosen:
        return windows.with_columns(pl.lit(None, pl.Int64).alias("metric_period_ns"))
    series, keys = _series(gpu_metrics, chosen)
    base = windows.select(*keys, pl.col(start).alias("_a"), pl.col(end).alias("_b")).with_row_index("_w")
    width = (base["_b"] - base["_a"]).cast(pl.Float64)
    cols: dict[str, pl.Series] = {}
    for m in chosen:
        s = series[m]
        a = _integral_at(base.select("_w", *keys, "_a"), s, keys, "_a").sort("_w")
        b = _integral_at(base.select("_w", *keys, "_b"), s, keys, "_b").sort("_w")
        value = pl.select(
            pl.when(width > 0).then((b["_I"] - a["_I"]) / width).otherwise(a["_v"])
        ).to_series()
        cols[m] = value.alias(m)
    period = next(iter(series.values())).group_by(keys).agg(pl.col("metric_period_ns").first())
    per = base.select("_w", *keys).join(period, on=keys, how="left").sort("_w")["metric_period_ns"]
    out = windows.drop([c for c in (*chosen, "metric_period_ns") if c in windows.columns])
    return out.with_columns(*cols.values(), per.alias("metric_period_ns"))


def kernel_metrics(kernels: pl.DataFrame, gpu_metrics: pl.DataFrame, *, metrics: Sequence[str] | None = None) -> pl.DataFrame:
    """Each kernel (any frame with ``device_id``, ``start_ns``, ``end_ns``,
    ``duration_ns``) with the mean of each metric over its execution (see the module
    docstring), ``metric_period_ns`` and ``below_sample_period`` (the kernel is shorter than
    one sample period)."""
    out = window_metrics(kernels, gpu_metrics, metrics=metrics)
    return out.with_columns((pl.col("duration_ns") < pl.col("metric_period_ns")).alias("below_sample_period"))


def metrics_by(kernel_metrics_frame: pl.DataFrame, by: Sequence[str], *, metrics: Sequence[str] | None = None) -> pl.DataFrame:
    """Duration-weighted mean of each metric per group of :func:`kernel_metrics` rows.

    ``by``: e.g. ``["name"]`` (per kernel name) or ``["nvtx_range"]``/``["nvtx_path"]``
    when the kernels came through :func:`~tracekit.analysis.attribution.attribute_nvtx`.
    The weighted mean equals the metric's time average over all the group's kernel
    executions. ``metrics`` defaults to the :data:`DEFAULT_METRICS` and NVLink/PCIe columns
    present. Returns (``rank``,) ``by``, ``kernels``, ``gpu_time_ns``,
    ``below_sample_period`` (count) and one column per metric.
    """
    if metrics is None:
        metrics = [
            c for c in kernel_metrics_frame.columns
            if c in DEFAULT_METRICS or c.startswith(("nvlink_", "pcie_"))
        ]
    keys = list(dict.fromkeys([*rank_keys(kernel_metrics_frame), *by]))  # "rank" may be given too
    w = pl.col("duration_ns").cast(pl.Float64)
    aggs = [
        pl.len().cast(pl.Int64).alias("kernels"),
        pl.col("duration_ns").sum().alias("gpu_time_ns"),
        pl.col("below_sample_period").sum().cast(pl.Int64).alias("below_sample_period"),
    ]
    for m in metrics:
        valid = pl.col(m).is_not_null()
        aggs.append(((pl.col(m) * w).filter(valid).sum() / w.filter(valid).sum()).alias(m))
    return kernel_metrics_frame.group_by(keys).agg(aggs).sort("gpu_time_ns", descending=True)


def resample_metrics(
    gpu_metrics: pl.DataFrame,
    *,
    bin_ns: int = 1_000_000,
    metrics: Sequence[str] | None = None,
) -> pl.DataFrame:
    """Per-device time series on a regular grid of ``bin_ns`` bins.

    Bins start at the first sample interval of each device and cover the sampled span.
    Returns long rows (``rank``,) ``device_id``, ``bin_start_ns``, ``metric``, ``value``
    (time-weighted mean over the bin).
    """
    if bin_ns <= 0:
        msg = f"bin_ns must be positive, got {bin_ns}"
        raise ValueError(msg)
    chosen = _choose(gpu_metrics, metrics)
    keys = [*rank_keys(gpu_metrics), "device_id"]
    if not chosen:
        return pl.DataFrame(schema={**{k: pl.Int64 for k in keys}, "bin_start_ns": pl.Int64, "metric": pl.Utf8, "value": pl.Float64})
    series, keys = _series(gpu_metrics, chosen)
    first = next(iter(series.values()))
    span = first.group_by(keys).agg(pl.col("_t0").min().alias("_s"), pl.col("timestamp_ns").max().alias("_e"))
    grid = span.with_columns(pl.int_ranges(pl.col("_s"), pl.col("_e"), bin_ns).alias("start_ns")).explode("start_ns")
    grid = grid.with_columns(pl.min_horizontal(pl.col("start_ns") + bin_ns, pl.col("_e")).alias("end_ns")).drop("_s", "_e")
    grid = grid.filter(pl.col("start_ns").is_not_null())
    out = window_metrics(grid, gpu_metrics, metrics=chosen)
    long = out.unpivot(index=[*keys, "start_ns"], on=chosen, variable_name="metric", value_name="value")
    return long.rename({"start_ns": "bin_start_ns"}).sort([*keys, "metric", "bin_start_ns"])
