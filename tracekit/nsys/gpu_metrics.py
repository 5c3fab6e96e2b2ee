"""``GPU_METRICS`` (``--gpu-metrics-devices``) → a long table with stable metric names.

nsys renames its metrics between versions ("SM Active" became "SMs Active [Throughput %]");
:func:`stable_metric_name` maps every label seen to one snake_case name, keeping the
original in ``metric_label``. The GPU of a sample is the low byte of ``typeId``
(observed: ``0x1000100000000`` = GPU 0, ``0x1000100000001`` = GPU 1), cross-checked with the
``GPU n`` text of ``TARGET_INFO_GPU_METRICS.typeName`` when it has one.
"""

from __future__ import annotations

import re

import polars as pl

from tracekit.nsys import schema as S
from tracekit.nsys.database import ExportDatabase
from tracekit.nsys.readers import Col, select

#: Labels of older nsys versions → the base name newer versions use.
_ALIASES = {
    "sm active": "sms active",
    "sm issue": "sm issue",
    "dram read throughput": "dram read bandwidth",
    "dram write throughput": "dram write bandwidth",
    "tensor active": "tensor active",
    "gr active": "gr active",
    "pcie rx throughput": "pcie rx throughput",
    "pcie tx throughput": "pcie tx throughput",
}


#: Units that are a metric's primary unit: dropped from the stable name, so that the
#: unit-less 2023.x label and the bracketed 2025.x one map to the same name.
_PRIMARY_UNITS = {"throughput %", "%", "mhz", "hz", ""}


def stable_metric_name(label: str) -> str:
    """Stable snake_case name of an nsys GPU-metric label.

    The primary unit in brackets is dropped (``"Tensor Active [Throughput %]"`` →
    ``tensor_active``, ``"GPC Clock Frequency [MHz]"`` → ``gpc_clock_frequency``), old
    spellings are mapped to new ones (``"SM Active"`` → ``sms_active``,
    ``"DRAM Read Throughput"`` → ``dram_read_bandwidth``). Other units stay as a suffix,
    because nsys 2025.x reports some metrics in several units at once:
    ``"Compute Warps in Flight [Throughput %]"`` → ``compute_warps_in_flight``,
    ``"… [Avg]"`` → ``compute_warps_in_flight_avg``, ``"… [Avg Warps per Cycle]"`` →
    ``compute_warps_in_flight_avg_warps_per_cycle``.
    """
    units = re.findall(r"\[([^\]]*)\]", label)
    base = re.sub(r"\s*\[[^\]]*\]\s*", " ", label).strip().lower()
    base = _ALIASES.get(base, base)
    extra = [u for u in (u.strip().lower() for u in units) if u not in _PRIMARY_UNITS]
    name = " ".join([base, *extra])
    return re.sub(r"[^0-9a-z]+", "_", name).strip("_")


def metric_descriptions(db: ExportDatabase) -> pl.DataFrame:
    """``TARGET_INFO_GPU_METRICS`` with the device id and stable name of each metric."""
    info = select(
        db,
        "TARGET_INFO_GPU_METRICS",
        [
            Col("type_id", "typeId"),
            Col("type_name", "typeName", pl.Utf8),
            Col("metric_id", "metricId"),
            Col("metric_label", "metricName", pl.Utf8),
        ],
    ).unique(subset=["type_id", "metric_id"], keep="first", maintain_order=True)
    from_name = pl.col("type_name").str.extract(r"GPU\s*(\d+)", 1).cast(pl.Int64, strict=False)
    return info.with_columns(
        pl.coalesce(from_name, pl.col("type_id") % 256).alias("device_id"),
        pl.col("metric_label").map_elements(stable_metric_name, return_dtype=pl.Utf8).alias("metric"),
    )


def gpu_metrics(db: ExportDatabase) -> pl.DataFrame:
    """Samples of every GPU metric: ``device_id, timestamp_ns, metric, metric_label, value``.

    Values are nsys's raw integers (percent for throughput metrics). Timestamps can be
    negative (samples taken before the analysis start).
    """
    if not db.has_table("GPU_METRICS"):
        return S.empty("gpu_metrics")
    samples = select(
        db,
        "GPU_METRICS",
        [Col("timestamp_ns", "timestamp"), Col("type_id", "typeId"), Col("metric_id", "metricId"), Col("value", "value")],
    )
    info = metric_descriptions(db).select("type_id", "metric_id", "device_id", "metric", "metric_label")
    frame = samples.join(info, on=["type_id", "metric_id"], how="left", maintain_order="left")
    frame = frame.with_columns(
        pl.coalesce(pl.col("device_id"), pl.col("type_id") % 256).alias("device_id"),
        pl.coalesce(pl.col("metric"), pl.format("metric_{}", pl.col("metric_id"))).alias("metric"),
    )
    return S.conform(frame, "gpu_metrics")
