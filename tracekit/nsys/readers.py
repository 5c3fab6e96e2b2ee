"""Readers that turn the export's raw tables into tidy frames (one function per table).

Each reader asks the file which tables and columns exist, selects only those it needs
(absent optional columns become NULL), decodes packed ids and enum codes, resolves string
ids, and returns a frame with the documented schema of :mod:`tracekit.nsys.schema`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from tracekit.nsys import enums
from tracekit.nsys import schema as S
from tracekit.nsys.database import ExportDatabase

PID_MASK = 0xFFFFFF
PROCESS_KEY_MASK = -0x1000000  # == 0xFFFFFFFFFF000000 as a signed 64-bit mask


@dataclass(frozen=True)
class Col:
    """One selected column: ``target`` name, ``source`` column in the file, dtype."""

    target: str
    source: str | None
    dtype: pl.DataType | type[pl.DataType] = pl.Int64
    sql: str | None = None  # expression over ``source`` ({col} is replaced), e.g. a CAST


def select(db: ExportDatabase, table: str, cols: Sequence[Col], where: str = "") -> pl.DataFrame:
    """``SELECT`` the present ``cols`` of ``table``; absent ones come back as NULL."""
    present = set(db.columns(table))
    parts = []
    for col in cols:
        if col.source is not None and col.source in present:
            quoted = f'"{col.source}"'
            parts.append(col.sql.format(col=quoted) if col.sql else quoted)
        else:
            parts.append("NULL")
    schema = {c.target: c.dtype for c in cols}
    if not present:
        return pl.DataFrame(schema=schema)
    sql = f'SELECT {", ".join(parts)} FROM "{table}"' + (f" WHERE {where}" if where else "")
    return db.query(sql, schema)


def pid_from_global(expr: pl.Expr) -> pl.Expr:
    """The process id bits of a ``globalTid``/``globalPid``."""
    return (expr // 0x1000000) % 0x1000000


def tid_from_global(expr: pl.Expr) -> pl.Expr:
    """The thread id bits of a ``globalTid``."""
    return expr % 0x1000000


def lookup_strings(expr: pl.Expr, strings: pl.DataFrame) -> pl.Expr:
    """Map ``StringIds`` ids to their text (unknown ids → null)."""
    return expr.replace_strict(strings["id"], strings["value"], default=None, return_dtype=pl.Utf8)


def string_ids(db: ExportDatabase) -> pl.DataFrame:
    """The ``StringIds(id, value)`` table."""
    return select(db, "StringIds", [Col("id", "id"), Col("value", "value", pl.Utf8)])


def _first_table(db: ExportDatabase, *names: str) -> str | None:
    return next((n for n in names if db.has_table(n)), None)


# -- GPU activity ---------------------------------------------------------------------
_GPU_OP_COLS = [
    Col("start_ns", "start"),
    Col("end_ns", "end"),
    Col("device_id", "deviceId"),
    Col("context_id", "contextId"),
    Col("stream_id", "streamId"),
    Col("correlation_id", "correlationId"),
    Col("global_pid", "globalPid"),
]


def _with_op_ids(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.with_columns(
        pid_from_global(pl.col("global_pid")).alias("pid"),
        (pl.col("end_ns") - pl.col("start_ns")).alias("duration_ns"),
    )


def kernels(db: ExportDatabase, strings: pl.DataFrame) -> pl.DataFrame:
    """``CUPTI_ACTIVITY_KIND_KERNEL`` → ``kernels`` (see docs/tables.md)."""
    table = "CUPTI_ACTIVITY_KIND_KERNEL"
    if not db.has_table(table):
        return S.empty("kernels")
    raw = select(
        db,
        table,
        [
            *_GPU_OP_COLS,
            Col("green_context_id", "greenContextId"),
            Col("demangled_id", "demangledName"),
            Col("short_id", "shortName"),
            Col("mangled_id", "mangledName"),
            Col("grid_x", "gridX"),
            Col("grid_y", "gridY"),
            Col("grid_z", "gridZ"),
            Col("block_x", "blockX"),
            Col("block_y", "blockY"),
            Col("block_z", "blockZ"),
            Col("registers_per_thread", "registersPerThread"),
            Col("static_shared_memory_bytes", "staticSharedMemory"),
            Col("dynamic_shared_memory_bytes", "dynamicSharedMemory"),
            Col("local_memory_per_thread_bytes", "localMemoryPerThread"),
            Col("launch_type_id", "launchType"),
            Col("graph_node_id", "graphNodeId"),
            Col("graph_id", "graphId"),
        ],
    )
    launch = enums.enum_map(
        db,
        _first_table(db, "ENUM_CUDA_KERNEL_LAUNCH_TYPE", "ENUM_CUDA_KRENEL_LAUNCH_TYPE") or "",
        enums.KERNEL_LAUNCH_TYPE,
    )
    frame = _with_op_ids(raw).with_columns(
        lookup_strings(pl.col("demangled_id"), strings).alias("name"),
        lookup_strings(pl.col("short_id"), strings).alias("short_name"),
        lookup_strings(pl.col("mangled_id"), strings).alias("mangled_name"),
        enums.map_codes(pl.col("launch_type_id"), launch).alias("launch_type"),
    )
    return S.conform(frame, "kernels")


def memcpys(db: ExportDatabase) -> pl.DataFrame:
    """``CUPTI_ACTIVITY_KIND_MEMCPY`` → ``memcpys``."""
    table = "CUPTI_ACTIVITY_KIND_MEMCPY"
    if not db.has_table(table):
        return S.empty("memcpys")
    raw = select(
        db,
        table,
        [
            *_GPU_OP_COLS,
            Col("green_context_id", "greenContextId"),
            Col("bytes", "bytes"),
            Col("copy_kind_id", "copyKind"),
            Col("src_kind_id", "srcKind"),
            Col("dst_kind_id", "dstKind"),
            Col("src_device_id", "srcDeviceId"),
            Col("dst_device_id", "dstDeviceId"),
            Col("graph_node_id", "graphNodeId"),
            Col("copy_count", "copyCount"),
        ],
    )
    labels = enums.enum_map(db, "ENUM_CUDA_MEMCPY_OPER", enums.MEMCPY_KIND_LABEL)
    kinds = enums.enum_map(db, "ENUM_CUDA_MEM_KIND", enums.MEM_KIND)
    frame = _with_op_ids(raw).with_columns(
        enums.map_codes(pl.col("copy_kind_id"), enums.MEMCPY_KIND_SHORT).alias("copy_kind"),
        enums.map_codes(pl.col("copy_kind_id"), labels).alias("copy_kind_label"),
        enums.map_codes(pl.col("src_kind_id"), kinds).alias("src_kind"),
        enums.map_codes(pl.col("dst_kind_id"), kinds).alias("dst_kind"),
    )
    return S.conform(frame, "memcpys")


def memsets(db: ExportDatabase) -> pl.DataFrame:
    """``CUPTI_ACTIVITY_KIND_MEMSET`` → ``memsets``."""
    table = "CUPTI_ACTIVITY_KIND_MEMSET"
    if not db.has_table(table):
        return S.empty("memsets")
    raw = select(
        db,
        table,
        [
            *_GPU_OP_COLS,
            Col("green_context_id", "greenContextId"),
            Col("bytes", "bytes"),
            Col("value", "value"),
            Col("mem_kind_id", "memKind"),
            Col("graph_node_id", "graphNodeId"),
        ],
    )
    kinds = enums.enum_map(db, "ENUM_CUDA_MEM_KIND", enums.MEM_KIND)
    frame = _with_op_ids(raw).with_columns(
        enums.map_codes(pl.col("mem_kind_id"), kinds).alias("mem_kind")
    )
    return S.conform(frame, "memsets")


def syncs(db: ExportDatabase) -> pl.DataFrame:
    """``CUPTI_ACTIVITY_KIND_SYNCHRONIZATION`` → ``syncs``."""
    table = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
    if not db.has_table(table):
        return S.empty("syncs")
    raw = select(db, table, [*_GPU_OP_COLS, Col("sync_type_id", "syncType"), Col("event_id", "eventId")])
    types = enums.enum_map(db, "ENUM_CUPTI_SYNC_TYPE", enums.SYNC_TYPE)
    frame = _with_op_ids(raw).with_columns(
        enums.map_codes(pl.col("sync_type_id"), types).alias("sync_type"),
        pl.when(pl.col("event_id") == 4294967295).then(None).otherwise(pl.col("event_id")).alias("event_id"),
    )
    return S.conform(frame, "syncs")


# -- CPU side --------------------------------------------------------------------------
def cuda_api(db: ExportDatabase, strings: pl.DataFrame) -> pl.DataFrame:
    """``CUPTI_ACTIVITY_KIND_RUNTIME`` (runtime and driver calls) → ``cuda_api``."""
    table = "CUPTI_ACTIVITY_KIND_RUNTIME"
    if not db.has_table(table):
        return S.empty("cuda_api")
    raw = select(
        db,
        table,
        [
            Col("start_ns", "start"),
            Col("end_ns", "end"),
            Col("event_class", "eventClass"),
            Col("global_tid", "globalTid"),
            Col("correlation_id", "correlationId"),
            Col("name_id", "nameId"),
            Col("return_value", "returnValue"),
            Col("callchain_id", "callchainId"),
        ],
    )
    api_labels = enums.API_CLASS  # 0/1 in every version; ENUM_NSYS_EVENT_CLASS agrees
    frame = raw.with_columns(
        pid_from_global(pl.col("global_tid")).alias("pid"),
        tid_from_global(pl.col("global_tid")).alias("tid"),
        (pl.col("end_ns") - pl.col("start_ns")).alias("duration_ns"),
        lookup_strings(pl.col("name_id"), strings).alias("name"),
        enums.map_codes(pl.col("event_class"), api_labels).alias("api"),
    )
    return S.conform(frame, "cuda_api")


def processes(db: ExportDatabase) -> pl.DataFrame:
    """``PROCESSES`` (nsys ≥ 2022.2), else the processes seen in thread names."""
    if db.has_table("PROCESSES"):
        raw = select(
            db, "PROCESSES", [Col("global_pid", "globalPid"), Col("pid", "pid"), Col("name", "name", pl.Utf8)]
        )
        return S.conform(raw.unique(subset=["global_pid"], keep="first", maintain_order=True), "processes")
    names = select(db, "ThreadNames", [Col("global_tid", "globalTid")])
    frame = names.select(
        (pl.col("global_tid") // 0x1000000 * 0x1000000).alias("global_pid")
    ).unique(maintain_order=True)
    frame = frame.with_columns(pid_from_global(pl.col("global_pid")).alias("pid"))
    return S.conform(frame, "processes")


def threads(db: ExportDatabase, strings: pl.DataFrame) -> pl.DataFrame:
    """``ThreadNames`` → ``threads`` (one row per named thread)."""
    raw = select(
        db, "ThreadNames", [Col("name_id", "nameId"), Col("priority", "priority"), Col("global_tid", "globalTid")]
    )
    frame = raw.with_columns(
        pid_from_global(pl.col("global_tid")).alias("pid"),
        tid_from_global(pl.col("global_tid")).alias("tid"),
        lookup_strings(pl.col("name_id"), strings).alias("name"),
    ).unique(subset=["global_tid"], keep="first", maintain_order=True)
    return S.conform(frame, "threads")


def gpus(db: ExportDatabase) -> pl.DataFrame:
    """``TARGET_INFO_GPU`` (or 2020.x's ``TARGET_INFO_CUDA_GPU``) → ``gpus``."""
    if db.has_table("TARGET_INFO_GPU"):
        id_col = "id" if db.has_column("TARGET_INFO_GPU", "id") else "deviceId"
        raw = select(
            db,
            "TARGET_INFO_GPU",
            [
                Col("device_id", id_col),
                Col("name", "name", pl.Utf8),
                Col("bus_location", "busLocation", pl.Utf8),
                Col("uuid", "uuid", pl.Utf8),
                Col("chip_name", "chipName", pl.Utf8),
                Col("major", "computeMajor"),
                Col("minor", "computeMinor"),
                Col("sm_count", "smCount"),
                Col("total_memory_bytes", "totalMemory"),
                Col("memory_bandwidth_bytes_per_s", "memoryBandwidth"),
                Col("clock_rate_hz", "clockRate"),
                Col("l2_cache_bytes", "l2CacheSize"),
            ],
        )
    elif db.has_table("TARGET_INFO_CUDA_GPU"):
        raw = select(
            db,
            "TARGET_INFO_CUDA_GPU",
            [
                Col("device_id", "id"),
                Col("name", "name", pl.Utf8),
                Col("bus_location", "pciBusId", pl.Utf8),
                Col("uuid", "uuid", pl.Utf8),
                Col("chip_name", None, pl.Utf8),
                Col("major", "computeCapabilityMajor"),
                Col("minor", "computeCapabilityMinor"),
                Col("sm_count", "numMultiprocessors"),
                Col("total_memory_bytes", "totalMemory"),
                Col("memory_bandwidth_bytes_per_s", None),
                Col("clock_rate_hz", "coreClockRate"),
                Col("l2_cache_bytes", "l2CacheSize"),
            ],
        )
    else:
        return S.empty("gpus")
    frame = raw.with_columns(
        pl.when(pl.col("major").is_not_null())
        .then(pl.format("{}.{}", pl.col("major"), pl.col("minor")))
        .otherwise(None)
        .alias("compute_capability")
    ).unique(subset=["device_id"], keep="first", maintain_order=True)
    return S.conform(frame.sort("device_id"), "gpus")


def memory_usage(db: ExportDatabase, strings: pl.DataFrame) -> pl.DataFrame:
    """``CUDA_GPU_MEMORY_USAGE_EVENTS`` (``--cuda-memory-usage=true``) → ``memory_usage``."""
    table = "CUDA_GPU_MEMORY_USAGE_EVENTS"
    if not db.has_table(table):
        return S.empty("memory_usage")
    raw = select(
        db,
        table,
        [
            Col("start_ns", "start"),
            Col("global_pid", "globalPid"),
            Col("device_id", "deviceId"),
            Col("context_id", "contextId"),
            Col("stream_id", "streamId"),
            Col("correlation_id", "correlationId"),
            Col("address", "address"),
            Col("bytes", "bytes"),
            Col("mem_kind_id", "memKind"),
            Col("operation_id", "memoryOperationType"),
            Col("name_id", "name"),
        ],
    )
    ops = enums.MEMORY_OPERATION  # ENUM_CUDA_DEV_MEM_EVENT_OPER: 0 Allocation, 1 Deallocation
    kinds = enums.enum_map(db, "ENUM_CUDA_MEM_KIND", enums.MEM_KIND)
    frame = raw.with_columns(
        pid_from_global(pl.col("global_pid")).alias("pid"),
        enums.map_codes(pl.col("mem_kind_id"), kinds).alias("mem_kind"),
        enums.map_codes(pl.col("operation_id"), ops).alias("operation"),
        lookup_strings(pl.col("name_id"), strings).alias("name"),
    )
    return S.conform(frame, "memory_usage")
