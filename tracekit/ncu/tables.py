"""Frame-level builders shared by both loaders: kernels, devices and wide pivots.

Each loader produces per-result identity rows and a long ``(id, metric, value, text)``
frame; the functions here turn those into the documented tables, so the binary and CSV
paths agree column for column.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from tracekit.ncu import schema
from tracekit.taxonomy import kernel_family

#: ``kernels`` column ← launch metric (values are Float64 in ``metrics``; cast here).
LAUNCH_COLUMNS = {
    "device_id": "launch__device_id",
    "context_id": "launch__context_id",
    "stream_id": "launch__stream_id",
    "grid_x": "launch__grid_dim_x",
    "grid_y": "launch__grid_dim_y",
    "grid_z": "launch__grid_dim_z",
    "block_x": "launch__block_dim_x",
    "block_y": "launch__block_dim_y",
    "block_z": "launch__block_dim_z",
    "registers_per_thread": "launch__registers_per_thread",
    "static_shared_memory_bytes": "launch__shared_mem_per_block_static",
    "dynamic_shared_memory_bytes": "launch__shared_mem_per_block_dynamic",
}

DURATION_METRIC = "gpu__time_duration.sum"
CC_MAJOR = "device__attribute_compute_capability_major"
CC_MINOR = "device__attribute_compute_capability_minor"
DEVICE_PREFIX = "device__attribute_"


def pivot_values(long: pl.DataFrame, metrics: Sequence[str], ids: pl.Series) -> pl.DataFrame:
    """``id`` plus one ``Float64`` column per metric in ``metrics`` (null where absent)."""
    base = pl.DataFrame({"id": ids.cast(pl.Int64)})
    picked = long.filter(pl.col("metric").is_in(list(metrics)))
    if picked.height:
        wide = picked.pivot(on="metric", index="id", values="value", aggregate_function="first")
        base = base.join(wide, on="id", how="left")
    missing = [pl.lit(None, pl.Float64).alias(m) for m in metrics if m not in base.columns]
    return base.with_columns(missing).select(
        "id", *[pl.col(m).cast(pl.Float64) for m in dict.fromkeys(metrics)]
    )


def build_kernels(identity: pl.DataFrame, launch: pl.DataFrame) -> pl.DataFrame:
    """The ``kernels`` table from identity rows and a long frame of launch metrics.

    ``identity`` holds what the loader knows directly (``id``, names, NVTX, and for CSV the
    fixed columns such as ``device_id`` or ``grid_x``); launch metrics win where present.
    """
    metric_names = [*LAUNCH_COLUMNS.values(), DURATION_METRIC, CC_MAJOR, CC_MINOR]
    wide = pivot_values(launch, metric_names, identity["id"])
    frame = identity.join(wide, on="id", how="left")
    exprs: list[pl.Expr] = []
    for column, metric in LAUNCH_COLUMNS.items():
        from_metric = pl.col(metric).round(0).cast(pl.Int64)
        if column in identity.columns:
            from_metric = pl.coalesce(from_metric, pl.col(column).cast(pl.Int64))
        exprs.append(from_metric.alias(column))
    cc = pl.format("{}.{}", pl.col(CC_MAJOR).cast(pl.Int64), pl.col(CC_MINOR).cast(pl.Int64))
    if "compute_capability" in identity.columns:
        cc = pl.coalesce(cc, pl.col("compute_capability"))
    exprs.append(cc.alias("compute_capability"))
    exprs.append(pl.col(DURATION_METRIC).round(0).cast(pl.Int64).alias("duration_ns"))
    frame = frame.with_columns(exprs)
    if "short_name" not in frame.columns or frame["short_name"].null_count() == frame.height:
        frame = frame.with_columns(
            pl.col("name")
            .map_elements(schema.short_name_of, return_dtype=pl.Utf8)
            .alias("short_name")
        )
    frame = frame.with_columns(families(pl.coalesce(pl.col("name"), pl.col("short_name")), frame))
    return schema.conform(frame, schema.KERNELS).sort("id")


def families(names: pl.Expr, frame: pl.DataFrame) -> pl.Expr:
    """``family`` of each kernel name, classified once per distinct name with
    :func:`tracekit.taxonomy.kernel_family` (Python ``re``: the shared rules use look-ahead,
    which polars' regex engine rejects)."""
    distinct = frame.select(names.alias("n"))["n"].unique().to_list()
    mapping = {n: kernel_family(n) for n in distinct if n is not None}
    return names.replace_strict(mapping, default="other", return_dtype=pl.Utf8).alias("family")


def build_devices(metrics: pl.DataFrame, kernels: pl.DataFrame) -> pl.DataFrame:
    """One row per device: ``device_id``, ``display_name``, ``compute_capability``, then one
    column per ``device__attribute_*`` metric (prefix removed; integers as Int64)."""
    attrs = metrics.filter(pl.col("metric").str.starts_with(DEVICE_PREFIX)).join(
        kernels.select("id", "device_id"), on="id", how="left"
    )
    if attrs.height == 0:
        return schema.empty(schema.DEVICES_LEADING)
    attrs = attrs.with_columns(pl.col("device_id").fill_null(0))
    first = (
        attrs.sort("id")
        .group_by("device_id", "metric", maintain_order=True)
        .agg(pl.col("value").first(), pl.col("text").first())
    )
    device_ids = first["device_id"].unique().sort()
    columns: dict[str, pl.Series] = {"device_id": device_ids}
    for metric in first["metric"].unique(maintain_order=True):
        part = pl.DataFrame({"device_id": device_ids}).join(
            first.filter(pl.col("metric") == metric), on="device_id", how="left"
        )
        name = metric[len(DEVICE_PREFIX) :]
        values = part["value"]
        if values.null_count() < part.height:
            integral = ((values.drop_nulls() % 1) == 0).all()
            columns[name] = values.cast(pl.Int64) if integral else values
        else:
            columns[name] = part["text"]
    devices = pl.DataFrame({k: v.rename(k) for k, v in columns.items()})
    if {"compute_capability_major", "compute_capability_minor"} <= set(devices.columns):
        cc = pl.format(
            "{}.{}", pl.col("compute_capability_major"), pl.col("compute_capability_minor")
        )
    else:
        cc = pl.lit(None, pl.Utf8)
    devices = devices.with_columns(cc.alias("compute_capability"))
    if "display_name" not in devices.columns:
        devices = devices.with_columns(pl.lit(None, pl.Utf8).alias("display_name"))
    leading = list(schema.DEVICES_LEADING)
    rest = [c for c in devices.columns if c not in leading]
    return devices.select(leading + rest).with_columns(pl.col("device_id").cast(pl.Int64))


def wide(metrics: pl.DataFrame, kernels: pl.DataFrame, names: Sequence[str]) -> pl.DataFrame:
    """``id`` plus one column per metric: Float64 for numbers, Utf8 for string metrics."""
    names = list(dict.fromkeys(names))
    out = pivot_values(metrics, names, kernels["id"])
    picked = metrics.filter(pl.col("metric").is_in(names))
    textual = (
        picked.group_by("metric")
        .agg(
            pl.col("value").is_null().all().alias("no_number"),
            pl.col("text").is_not_null().any().alias("has_text"),
        )
        .filter(pl.col("no_number") & pl.col("has_text"))["metric"]
        .to_list()
    )
    if textual:
        texts = picked.filter(pl.col("metric").is_in(textual)).pivot(
            on="metric", index="id", values="text", aggregate_function="first"
        )
        out = out.drop(textual).join(texts, on="id", how="left").select(["id", *names])
    return out
