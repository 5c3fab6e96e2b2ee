"""``cuda_gpu_trace``: every kernel, memcpy and memset, one row each, ordered by start."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import polars as pl

from tracekit.errors import UnsupportedReportError
from tracekit.nsys.database import GPU_OP_TABLES
from tracekit.nsys.readers import lookup_strings
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
    "static_shared_memory_bytes", "dynamic_shared_memory_bytes", "name_id",
]
_COPY_COLUMNS = [*_OP, "bytes", "src_kind", "dst_kind", "copy_kind_label"]
_SET_COLUMNS = [*_OP, "bytes", "mem_kind"]


def cuda_gpu_trace(trace: NsysTrace, *, convention: str = "2025") -> Report:
    """One row per GPU operation with launch geometry, sizes and throughput (``cuda_gpu_trace``).

    ``Throughput (MB/s)`` reproduces nsys's integer arithmetic: bytes × (10⁹ div duration),
    so it is quantised exactly as nsys prints it. ``Device`` is ``"<GPU name> (<id>)"``; an
    export without a GPU list (time-sliced files) prints ``"GPU <id> (<id>)"``.
    """
    if not any(trace.db.has_table(t) for t in GPU_OP_TABLES):
        msg = f"{trace.path.name} has no kernel, memcpy or memset table, so it cannot give cuda_gpu_trace: capture with --trace=cuda"
        raise UnsupportedReportError(msg)
    # The rows are written in start order a chunk at a time: only the sort keys of all rows and
    # the source tables are held (kernel names as StringIds ids), never the whole report, whose
    # text columns took ~0.4 GB for a million kernels.
    k = _narrow_kernels(trace)
    m = trace.table("memcpys", _COPY_COLUMNS)
    s = trace.table("memsets", _SET_COLUMNS)
    order = pl.concat(
        [
            t.select("start_ns", "correlation_id", pl.lit(i, pl.Int8).alias("src"), pl.int_range(pl.len(), dtype=pl.UInt32).alias("row"))
            for i, t in enumerate((k, m, s))
        ]
    ).sort(["start_ns", "correlation_id"], maintain_order=True).select("src", "row")
    strings = trace.strings
    gpus = trace.gpus.select("device_id", pl.col("name").alias("gpu_name"))
    # the Device text of each device id, made once (a million rows have a few devices)
    ids = pl.concat([t.select(pl.col("device_id").cast(pl.Int64)) for t in (k, m, s)]).unique()
    devices = ids.join(gpus, on="device_id", how="left").select(
        "device_id",
        pl.format("{} ({})", pl.coalesce(pl.col("gpu_name"), pl.format("GPU {}", pl.col("device_id"))), pl.col("device_id")).alias("Device"),
    )

    def parts() -> Iterator[pl.DataFrame]:
        for offset in range(0, max(order.height, 1), _CHUNK_ROWS):
            chunk = order.slice(offset, _CHUNK_ROWS).with_row_index("pos")
            pieces = []
            for i, (table, shape) in enumerate(((k, _kernel_rows), (m, _copy_rows), (s, _set_rows))):
                here = chunk.filter(pl.col("src") == i)
                if here.height:
                    rows = table[here.get_column("row")]
                    pieces.append(shape(rows, strings).with_columns(here.get_column("pos")))
            ops = pl.concat(pieces).sort("pos") if pieces else _kernel_rows(k.head(0), strings).with_columns(pl.lit(0, pl.UInt32).alias("pos"))
            yield _report_columns(ops.join(devices, on="device_id", how="left", maintain_order="left"))

    return Report.chunked("cuda_gpu_trace", parts, _KINDS, convention)


#: Rows of ``cuda_gpu_trace`` built and formatted at a time.
_CHUNK_ROWS = 75000
#: Kernel columns whose values are small (ids, launch geometry, bytes of shared memory): held as
#: Int32 when they fit, which halves the kernel table a million-row report keeps.
_SMALL = (
    "device_id", "context_id", "green_context_id", "stream_id", "grid_x", "grid_y", "grid_z",
    "block_x", "block_y", "block_z", "registers_per_thread", "static_shared_memory_bytes",
    "dynamic_shared_memory_bytes", "name_id",
)


def _narrow_kernels(trace: NsysTrace) -> pl.DataFrame:
    """The kernel columns the report prints, read one at a time, small ones as Int32 where every
    value fits (so the Int64 copy of only one column exists at a time)."""
    columns = []
    for name in _KERNEL_COLUMNS:
        column = trace.table("kernels", [name]).to_series()
        if name in _SMALL and column.len() and (column.min() or 0) >= -(2**31) and (column.max() or 0) < 2**31:
            column = column.cast(pl.Int32)
        columns.append(column)
    return pl.DataFrame(columns)
_NULL_I = pl.lit(None, pl.Int64)
_NO_GEOMETRY = [_NULL_I.alias(c) for c in ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "registers_per_thread")]


def _kernel_rows(k: pl.DataFrame, strings: pl.DataFrame) -> pl.DataFrame:
    return k.with_columns(pl.col(pl.Int32).cast(pl.Int64)).select(
        "start_ns", "duration_ns", "correlation_id",
        "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "registers_per_thread",
        pl.col("static_shared_memory_bytes").cast(pl.Float64).alias("smem_static"),
        pl.col("dynamic_shared_memory_bytes").cast(pl.Float64).alias("smem_dynamic"),
        pl.lit(None, pl.Int64).alias("bytes"),
        pl.lit(None, pl.Utf8).alias("src"), pl.lit(None, pl.Utf8).alias("dst"),
        "device_id", "context_id", "green_context_id", "stream_id",
        lookup_strings(pl.col("name_id"), strings).alias("name"),
    )


def _copy_rows(m: pl.DataFrame, strings: pl.DataFrame) -> pl.DataFrame:
    return m.select(
        "start_ns", "duration_ns", "correlation_id", *_NO_GEOMETRY,
        pl.lit(None, pl.Float64).alias("smem_static"), pl.lit(None, pl.Float64).alias("smem_dynamic"),
        "bytes", pl.col("src_kind").alias("src"), pl.col("dst_kind").alias("dst"),
        "device_id", "context_id", "green_context_id", "stream_id",
        pl.format("[CUDA memcpy {}]", pl.col("copy_kind_label")).alias("name"),
    )


def _set_rows(s: pl.DataFrame, strings: pl.DataFrame) -> pl.DataFrame:
    return s.select(
        "start_ns", "duration_ns", "correlation_id", *_NO_GEOMETRY,
        pl.lit(None, pl.Float64).alias("smem_static"), pl.lit(None, pl.Float64).alias("smem_dynamic"),
        # nsys prints a memset's memory kind under SrcMemKd (seen with 2025.3)
        "bytes", pl.col("mem_kind").alias("src"), pl.lit(None, pl.Utf8).alias("dst"),
        "device_id", "context_id", "green_context_id", "stream_id",
        pl.lit("[CUDA memset]").alias("name"),
    )


def _report_columns(ops: pl.DataFrame) -> pl.DataFrame:
    throughput = pl.when(pl.col("bytes").is_not_null() & (pl.col("duration_ns") > 0)).then(
        (pl.col("bytes") * (1_000_000_000 // pl.col("duration_ns"))).cast(pl.Float64)
    )
    return ops.select(
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
        pl.col("Device"),
        pl.col("context_id").alias("Ctx"),
        # nsys prints no green context for 0 (an ordinary context)
        pl.when(pl.col("green_context_id") != 0).then(pl.col("green_context_id")).alias("GreenCtx"),
        pl.col("stream_id").alias("Strm"),
        pl.col("name").alias("Name"),
    )

