"""Launch cost and launch-bound stretches.

For each kernel: the API call that launched it (its duration), the queue time (kernel start −
call end, null when the kernel started before the call returned, as in nsys's
``cuda_kern_exec_*`` reports) and the kernel duration. A *launch-bound* stretch is a run of
short kernels that each had to wait for their own launch call: the GPU drained its queue and
sat idle between them while the host issued the next one.
"""

from __future__ import annotations

import polars as pl

from tracekit.analysis._frames import rank_keys
from tracekit.analysis.attribution import launch_info

__all__ = ["kernel_launch_times", "launch_bound_stretches", "launch_cost"]


def _with_launch(kernels: pl.DataFrame, cuda_api: pl.DataFrame | None, columns: tuple[str, ...] | None = None) -> pl.DataFrame:
    """``kernels`` with their launch's ``columns`` (default: all of launch_info's), joined
    only when they lack ``api_start_ns``/``api_end_ns``."""
    if {"api_start_ns", "api_end_ns"} <= set(kernels.columns):
        return kernels
    if cuda_api is None:
        msg = "kernels lack api_start_ns/api_end_ns; pass cuda_api or run tracekit.analysis.attribution.launch_info first"
        raise ValueError(msg)
    return launch_info(kernels, cuda_api, columns=columns)


def kernel_launch_times(kernels: pl.DataFrame, cuda_api: pl.DataFrame | None = None) -> pl.DataFrame:
    """``kernels`` (same order) with ``api_duration_ns``, ``queue_ns`` (kernel start − call
    end when ≥ 0, else null), ``launch_to_end_ns`` (kernel end − call start) and the
    :func:`~tracekit.analysis.attribution.launch_info` columns. Kernels whose call was not
    traced keep nulls."""
    k = _with_launch(kernels, cuda_api)
    queue = pl.col("start_ns") - pl.col("api_end_ns")
    return k.with_columns(
        (pl.col("api_end_ns") - pl.col("api_start_ns")).alias("api_duration_ns"),
        pl.when(queue >= 0).then(queue).alias("queue_ns"),
        (pl.col("end_ns") - pl.col("api_start_ns")).alias("launch_to_end_ns"),
    )


def launch_cost(kernels: pl.DataFrame, cuda_api: pl.DataFrame | None = None, *, by: tuple[str, ...] = ("name",)) -> pl.DataFrame:
    """Launch cost per kernel name (the data of ``cuda_kern_exec_sum``, tidy).

    Input: ``kernels`` (with the launch columns, or with ``cuda_api`` given).
    Returns (``rank``,) ``by``, ``kernels``, ``traced`` (kernels whose launch was found),
    ``api_mean_ns``, ``api_median_ns``, ``queued`` (kernels with a queue time),
    ``queue_mean_ns``, ``queue_median_ns``, ``kernel_mean_ns``, ``kernel_median_ns``,
    ``kernel_total_ns``, ``api_to_kernel`` (mean API time / mean kernel time: above 1, the host
    spends longer launching a kernel than the GPU running it), largest kernel time first.
    """
    k = kernel_launch_times(kernels, cuda_api)
    keys = list(dict.fromkeys([*rank_keys(k), *by]))  # "rank" may be given too
    out = k.group_by(keys).agg(
        pl.len().cast(pl.Int64).alias("kernels"),
        pl.col("api_start_ns").count().cast(pl.Int64).alias("traced"),
        pl.col("api_duration_ns").mean().alias("api_mean_ns"),
        pl.col("api_duration_ns").median().alias("api_median_ns"),
        pl.col("queue_ns").count().cast(pl.Int64).alias("queued"),
        pl.col("queue_ns").mean().alias("queue_mean_ns"),
        pl.col("queue_ns").median().alias("queue_median_ns"),
        pl.col("duration_ns").mean().alias("kernel_mean_ns"),
        pl.col("duration_ns").median().alias("kernel_median_ns"),
        pl.col("duration_ns").sum().alias("kernel_total_ns"),
    )
    out = out.with_columns((pl.col("api_mean_ns") / pl.col("kernel_mean_ns")).alias("api_to_kernel"))
    rk = rank_keys(k)
    return out.sort([*rk, "kernel_total_ns"], descending=[*([False] * len(rk)), True])


def launch_bound_stretches(
    kernels: pl.DataFrame,
    cuda_api: pl.DataFrame | None = None,
    *,
    short_kernel_ns: int = 20_000,
    max_gap_ns: int = 1_000_000,
    min_kernels: int = 10,
) -> pl.DataFrame:
    """Stretches of a device's timeline where the GPU waited on the host's launches.

    Kernels of a device are taken in start order (all streams). A kernel is *starved* when it
    is shorter than ``short_kernel_ns``, it is not the device's first kernel, it was not
    launched by a CUDA graph launch (per-node traces), and its launch
    call returned after the previous kernel had ended (``api_end_ns >= previous end``): the
    queue was empty, so the GPU idled until the call came — and the idle gap before it is at
    most ``max_gap_ns`` (longer gaps are the host doing something else; see
    :func:`~tracekit.analysis.gpu_time.idle_gaps`). A stretch is a maximal run of
    consecutive starved kernels, kept when it has at least ``min_kernels``.

    Returns one row per stretch: (``rank``,) ``device_id``, ``stretch`` (0-based per device),
    ``start_ns`` (previous kernel's end: the first idle gap counts), ``end_ns`` (last kernel
    end), ``kernels``, ``busy_ns`` (summed kernel time), ``idle_ns`` (span − busy),
    ``gpu_utilization`` (busy / span), ``median_kernel_ns``, ``median_gap_ns``,
    ``median_api_ns``.
    """
    # only what a stretch reads goes through the join and the sort (not the names and ids;
    # of the launch, its times and whether it was a graph launch)
    read = ("rank", "device_id", "start_ns", "end_ns", "duration_ns", "correlation_id", "global_pid", "api_name", "api_start_ns", "api_end_ns")
    k = _with_launch(kernels.select([c for c in read if c in kernels.columns]), cuda_api,
                     columns=("api_name", "api_start_ns", "api_end_ns"))
    # a kernel of a CUDA graph replay (per-node traces) never waits on its own launch call
    from_graph = pl.col("api_name").str.contains(r"^cu(?:da)?GraphLaunch").fill_null(False) if "api_name" in k.columns else pl.lit(False)
    dev = [*rank_keys(k), "device_id"]
    k = k.select(*dev, "start_ns", "end_ns", "duration_ns", "api_end_ns",
                 (pl.col("api_end_ns") - pl.col("api_start_ns")).alias("api_duration_ns"), from_graph.alias("_graph"))
    # the latest end of any earlier kernel on the device
    k = k.sort([*dev, "start_ns"]).with_columns(pl.col("end_ns").cum_max().shift(1).over(dev).alias("_prev_end"))
    starved = (
        ~pl.col("_graph")
        & (pl.col("duration_ns") < short_kernel_ns)
        & pl.col("_prev_end").is_not_null()
        & pl.col("api_end_ns").is_not_null()
        & (pl.col("api_end_ns") >= pl.col("_prev_end"))
        & (pl.col("start_ns") - pl.col("_prev_end") <= max_gap_ns)
    ).fill_null(False)
    k = k.with_columns(starved.alias("_starved"))
    k = k.with_columns(
        (pl.col("_starved") != pl.col("_starved").shift(1).over(dev)).fill_null(True).cast(pl.Int64).cum_sum().over(dev).alias("_run")
    )
    runs = k.filter(pl.col("_starved")).group_by([*dev, "_run"]).agg(
        pl.col("_prev_end").first().alias("start_ns"),
        pl.col("end_ns").max().alias("end_ns"),
        pl.len().cast(pl.Int64).alias("kernels"),
        pl.col("duration_ns").sum().alias("busy_ns"),
        pl.col("duration_ns").median().alias("median_kernel_ns"),
        (pl.col("start_ns") - pl.col("_prev_end")).median().alias("median_gap_ns"),
        pl.col("api_duration_ns").median().alias("median_api_ns"),
    ).filter(pl.col("kernels") >= min_kernels)
    runs = runs.sort([*dev, "start_ns"]).with_columns(
        pl.int_range(pl.len()).over(dev).cast(pl.Int64).alias("stretch"),
        (pl.col("end_ns") - pl.col("start_ns") - pl.col("busy_ns")).alias("idle_ns"),
    )
    runs = runs.with_columns((pl.col("busy_ns") / (pl.col("end_ns") - pl.col("start_ns"))).alias("gpu_utilization"))
    return runs.select(*dev, "stretch", "start_ns", "end_ns", "kernels", "busy_ns", "idle_ns", "gpu_utilization",
                       "median_kernel_ns", "median_gap_ns", "median_api_ns")
