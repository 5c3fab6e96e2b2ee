"""Data preparation for the Nsight Compute charts (roofline, Tensor Core vs DRAM, speed of light).

Thin shapes over :mod:`tracekit.analysis.ncu_views`: one row per kernel with the columns the
charts read. A chart accepts any frame with those columns.
"""

from __future__ import annotations

from typing import Any

import polars as pl


def _views() -> Any:
    from tracekit.analysis import ncu_views

    return ncu_views


def kernel_label(frame: pl.DataFrame) -> pl.Expr:
    """``#id short_name`` (ids keep two launches of one kernel apart)."""
    name = "short_name" if "short_name" in frame.columns else "name"
    return pl.concat_str(
        pl.lit("#"), pl.col("id").cast(pl.Utf8), pl.lit(" "), pl.col(name).fill_null("?")
    )


def roofline_points(report: Any) -> pl.DataFrame:
    """Roofline coordinates per kernel.

    Returns
    -------
    ``id``, ``kernel`` (``#id short_name``), ``short_name``, ``family``, ``duration_ns``,
    ``time_share`` (0–1 of the profiled kernels' time), ``arithmetic_intensity`` (FLOP/byte),
    ``flops_per_s`` (FLOP/s), ``dominant`` (``tensor_bf16``, ``simt_fp32``…), ``bound``;
    kernels without FLOPs or DRAM bytes are left out.
    """
    r: pl.DataFrame = _views().roofline(report)
    total = r["duration_ns"].sum() or 1
    return (
        r.with_columns(
            kernel_label(r).alias("kernel"), (pl.col("duration_ns") / total).alias("time_share")
        )
        .filter(
            pl.col("arithmetic_intensity").is_not_null()
            & (pl.col("arithmetic_intensity") > 0)
            & (pl.col("flops_per_s") > 0)
        )
        .select(
            "id",
            "kernel",
            "short_name",
            "family",
            "duration_ns",
            "time_share",
            "arithmetic_intensity",
            "flops_per_s",
            "dominant",
            "bound",
        )  # fmt: skip
    )


def roofline_roofs(report: Any, points: pl.DataFrame | None = None) -> pl.DataFrame:
    """One value per ceiling (the median over kernels: peaks follow each kernel's clock).

    Returns
    -------
    ``ceiling`` (``simt_fp32``, ``tensor_bf16``…, ``dram``), ``value`` (FLOP/s, or byte/s for
    ``dram``), ``unit``: a roof for every floating-point precision the GPU has (the report's
    peak counters, else its published peaks: tensor BF16/FP16/FP8/TF32/FP64, FP32, FP64), plus
    integer tensor ceilings that some kernel is dominated by.
    """
    c: pl.DataFrame = _views().roofline_ceilings(report)
    roofs = c.group_by("ceiling", "unit").agg(pl.col("value").median()).sort("ceiling")
    dominant: set[str] = set()
    if points is not None and "dominant" in points.columns:
        dominant = {d for d in points["dominant"].drop_nulls().to_list()}
    return roofs.filter((pl.col("unit") != "op/s") | pl.col("ceiling").is_in(sorted(dominant)))


def tensor_dram(report: Any) -> pl.DataFrame:
    """Tensor pipe and DRAM bandwidth utilisation per kernel.

    Returns
    -------
    ``id``, ``kernel``, ``short_name``, ``family``, ``duration_ns``, ``time_share``,
    ``tensor_pct`` (tensor pipe busy, % of elapsed cycles) and ``dram_pct`` (DRAM bandwidth,
    % of peak).
    """
    v = _views()
    tc: pl.DataFrame = v.tensor_core_utilization(report).select(
        "id", "short_name", "family", "duration_ns", "tensor_pipe_pct"
    )
    dr = v.dram_bandwidth(report).select("id", "bandwidth_pct_of_peak", "dram_throughput_pct")
    out = tc.join(dr, on="id", how="left")
    total = out["duration_ns"].sum() or 1
    return out.select(
        "id",
        kernel_label(out).alias("kernel"),
        "short_name",
        "family",
        "duration_ns",
        (pl.col("duration_ns") / total).alias("time_share"),
        pl.col("tensor_pipe_pct").fill_null(0.0).alias("tensor_pct"),
        pl.coalesce("bandwidth_pct_of_peak", "dram_throughput_pct")
        .fill_null(0.0)
        .alias("dram_pct"),
    )


SOL_LABELS: dict[str, str] = {
    "compute_throughput_pct": "Compute (SM)",
    "memory_throughput_pct": "Memory",
    "dram_throughput_pct": "DRAM",
    "l1_throughput_pct": "L1/TEX",
    "l2_throughput_pct": "L2",
    "achieved_occupancy_pct": "Achieved occupancy",
    "theoretical_occupancy_pct": "Theoretical occupancy",
    "tensor_pipe_pct": "Tensor pipe",
}


def kernel_metrics(report: Any) -> pl.DataFrame:
    """One wide row per kernel: speed of light, occupancy, Tensor Core, DRAM, roofline position.

    Returns
    -------
    ``id``, ``kernel``, ``short_name``, ``family``, ``nvtx_path``, ``duration_ns``, the
    :data:`SOL_LABELS` columns (%), ``bound``, ``dram_bytes``, ``bandwidth_gbps``,
    ``tensor_precision``, ``arithmetic_intensity``, ``flops_per_s``, ``pct_of_attainable``.
    """
    v = _views()
    sol: pl.DataFrame = v.speed_of_light(report)
    tc: pl.DataFrame = v.tensor_core_utilization(report).select(
        "id", "tensor_pipe_pct", "tensor_precision"
    )
    dr = v.dram_bandwidth(report).select("id", "dram_bytes", "bandwidth_gbps")
    rf = v.roofline(report).select("id", "arithmetic_intensity", "flops_per_s", "pct_of_attainable")
    out = (
        sol.join(tc, on="id", how="left")
        .join(dr, on="id", how="left")
        .join(rf, on="id", how="left")
    )
    return out.with_columns(kernel_label(out).alias("kernel"))


def sol_long(row: pl.DataFrame) -> pl.DataFrame:
    """The :data:`SOL_LABELS` columns of one or more :func:`kernel_metrics` rows as long ``kernel, metric, pct``."""
    present = [c for c in SOL_LABELS if c in row.columns]
    return (
        row.select("kernel", *present)
        .unpivot(index="kernel", on=present, variable_name="column", value_name="pct")
        .with_columns(
            pl.col("column").replace_strict(SOL_LABELS, return_dtype=pl.Utf8).alias("metric")
        )
        .select("kernel", "metric", "pct")
    )


def rules_for(report: Any, kernel_id: int) -> pl.DataFrame:
    """ncu's rule findings for one kernel: ``rule_name``, ``section``, ``type``, ``estimated_speedup_pct``, ``message``."""
    rules: pl.DataFrame = report.rules
    if rules.is_empty():
        return rules
    keep = [
        c
        for c in ("rule_name", "section", "type", "estimated_speedup_pct", "message")
        if c in rules.columns
    ]
    return (
        rules.filter(pl.col("id") == kernel_id)
        .select(keep)
        .sort("estimated_speedup_pct", descending=True, nulls_last=True)
    )
