"""``cuda_gpu_trace``: every kernel, memcpy and memset, one row each, ordered by start."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from tracekit.errors import UnsupportedReportError
from tracekit.stats.common import Report

if TYPE_CHECKING:
    from tracekit.nsys.trace import NsysTrace

_KINDS = {
    "Start (ns)": "int", "Duration (ns)": "int", "CorrId": "int", "GrdX": "int", "GrdY": "int",
    "GrdZ": "int", "BlkX": "int", "BlkY": "int", "BlkZ": "int", "Reg/Trd": "int",
    "StcSMem (MB)": "mb3", "DymSMem (MB)": "mb3", "Bytes (MB)": "mb3", "Throughput (MB/s)": "mb3",
    "Device": "str", "Ctx": "int", "GreenCtx": "int", "Strm": "int",
}


_OP = ["start_ns", "duration_ns", "correlation_id", "device_id", "context_id", "green_context_id", "stream_id"]
_KERNEL_COLUMNS = [
    *_OP, "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "registers_per_thread",
    "static_shared_memory_bytes", "dynamic_shared_memory_bytes", "name",
]
_COPY_COLUMNS = [*_OP, "bytes", "src_kind", "dst_kind", "copy_kind_label"]
_SET_COLUMNS = [*_OP, "bytes", "mem_kind"]


def cuda_gpu_trace(trace: NsysTrace, *, convention: str = "2025") -> Report:
    """One row per GPU operation with launch geometry, sizes and throughput (``cuda_gpu_trace``).

    ``Throughput (MB/s)`` reproduces nsys's integer arithmetic: bytes × (10⁹ div duration),
    so it is quantised exactly as nsys prints it. ``Device`` is ``"<GPU name> (<id>)"``; an
    export without a GPU list (time-sliced files) prints ``"GPU <id> (<id>)"``.
    """
    tables = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
    if not any(trace.db.has_table(t) for t in tables):
        msg = f"{trace.path.name} has no kernel, memcpy or memset table, so it cannot give cuda_gpu_trace: capture with --trace=cuda"
        raise UnsupportedReportError(msg)
    k = trace.table("kernels", _KERNEL_COLUMNS).select(
        "start_ns", "duration_ns", "correlation_id",
        "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "registers_per_thread",
        pl.col("static_shared_memory_bytes").cast(pl.Float64).alias("smem_static"),
        pl.col("dynamic_shared_memory_bytes").cast(pl.Float64).alias("smem_dynamic"),
        pl.lit(None, pl.Int64).alias("bytes"),
        pl.lit(None, pl.Utf8).alias("src"), pl.lit(None, pl.Utf8).alias("dst"),
        "device_id", "context_id", "green_context_id", "stream_id", "name",
    )
    null_i = pl.lit(None, pl.Int64)
    m = trace.table("memcpys", _COPY_COLUMNS).select(
        "start_ns", "duration_ns", "correlation_id",
        *(null_i.alias(c) for c in ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "registers_per_thread")),
        pl.lit(None, pl.Float64).alias("smem_static"), pl.lit(None, pl.Float64).alias("smem_dynamic"),
        "bytes", pl.col("src_kind").alias("src"), pl.col("dst_kind").alias("dst"),
        "device_id", "context_id", "green_context_id", "stream_id",
        pl.format("[CUDA memcpy {}]", pl.col("copy_kind_label")).alias("name"),
    )
    s = trace.table("memsets", _SET_COLUMNS).select(
        "start_ns", "duration_ns", "correlation_id",
        *(null_i.alias(c) for c in ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "registers_per_thread")),
        pl.lit(None, pl.Float64).alias("smem_static"), pl.lit(None, pl.Float64).alias("smem_dynamic"),
        # nsys prints a memset's memory kind under SrcMemKd (seen with 2025.3)
        "bytes", pl.col("mem_kind").alias("src"), pl.lit(None, pl.Utf8).alias("dst"),
        "device_id", "context_id", "green_context_id", "stream_id",
        pl.lit("[CUDA memset]").alias("name"),
    )
    ops = pl.concat([k, m, s]).sort(["start_ns", "correlation_id"], maintain_order=True)
    gpus = trace.gpus.select("device_id", pl.col("name").alias("gpu_name"))
    ops = ops.join(gpus, on="device_id", how="left", maintain_order="left")
    throughput = pl.when(pl.col("bytes").is_not_null() & (pl.col("duration_ns") > 0)).then(
        (pl.col("bytes") * (1_000_000_000 // pl.col("duration_ns"))).cast(pl.Float64)
    )
    frame = ops.select(
        pl.col("start_ns").alias("Start (ns)"),
        pl.col("duration_ns").alias("Duration (ns)"),
        pl.col("correlation_id").alias("CorrId"),
        pl.col("grid_x").alias("GrdX"), pl.col("grid_y").alias("GrdY"), pl.col("grid_z").alias("GrdZ"),
        pl.col("block_x").alias("BlkX"), pl.col("block_y").alias("BlkY"), pl.col("block_z").alias("BlkZ"),
        pl.col("registers_per_thread").alias("Reg/Trd"),
        pl.col("smem_static").alias("StcSMem (MB)"),
        pl.col("smem_dynamic").alias("DymSMem (MB)"),
        pl.col("bytes").cast(pl.Float64).alias("Bytes (MB)"),
        throughput.alias("Throughput (MB/s)"),
        pl.col("src").alias("SrcMemKd"),
        pl.col("dst").alias("DstMemKd"),
        pl.format("{} ({})", pl.coalesce(pl.col("gpu_name"), pl.format("GPU {}", pl.col("device_id"))), pl.col("device_id")).alias("Device"),
        pl.col("context_id").alias("Ctx"),
        # nsys prints no green context for 0 (an ordinary context)
        pl.when(pl.col("green_context_id") != 0).then(pl.col("green_context_id")).alias("GreenCtx"),
        pl.col("stream_id").alias("Strm"),
        pl.col("name").alias("Name"),
    )
    return Report("cuda_gpu_trace", frame, _KINDS, convention)
