"""The documented schema of every table :class:`~tracekit.nsys.trace.NsysTrace` returns.

``docs/tables.md`` describes each column (unit, source); a test keeps the two in step.
Times are ``Int64`` nanoseconds on the capture's timeline; a change here is a schema
change and bumps :data:`SCHEMA_VERSION`.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

SCHEMA_VERSION = "1.0"

I64 = pl.Int64
STR = pl.Utf8
F64 = pl.Float64

_GPU_OP_ID = {
    "pid": I64,
    "global_pid": I64,
    "device_id": I64,
    "context_id": I64,
    "stream_id": I64,
    "correlation_id": I64,
    "start_ns": I64,
    "end_ns": I64,
    "duration_ns": I64,
}

KERNELS: dict[str, pl.DataType | type[pl.DataType]] = {
    **_GPU_OP_ID,
    "green_context_id": I64,
    "name": STR,
    "short_name": STR,
    "mangled_name": STR,
    "grid_x": I64,
    "grid_y": I64,
    "grid_z": I64,
    "block_x": I64,
    "block_y": I64,
    "block_z": I64,
    "registers_per_thread": I64,
    "static_shared_memory_bytes": I64,
    "dynamic_shared_memory_bytes": I64,
    "local_memory_per_thread_bytes": I64,
    "launch_type": STR,
    "graph_node_id": I64,
    "graph_id": I64,
}

MEMCPYS: dict[str, pl.DataType | type[pl.DataType]] = {
    **_GPU_OP_ID,
    "green_context_id": I64,
    "bytes": I64,
    "copy_kind": STR,
    "copy_kind_label": STR,
    "src_kind": STR,
    "dst_kind": STR,
    "src_device_id": I64,
    "dst_device_id": I64,
    "graph_node_id": I64,
    "copy_count": I64,
}

MEMSETS: dict[str, pl.DataType | type[pl.DataType]] = {
    **_GPU_OP_ID,
    "green_context_id": I64,
    "bytes": I64,
    "value": I64,
    "mem_kind": STR,
    "graph_node_id": I64,
}

SYNCS: dict[str, pl.DataType | type[pl.DataType]] = {
    **_GPU_OP_ID,
    "sync_type": STR,
    "event_id": I64,
}

GRAPH_TRACE: dict[str, pl.DataType | type[pl.DataType]] = {
    **_GPU_OP_ID,
    "green_context_id": I64,
    "graph_id": I64,
    "graph_exec_id": I64,
}

CUDA_API: dict[str, pl.DataType | type[pl.DataType]] = {
    "pid": I64,
    "tid": I64,
    "global_tid": I64,
    "start_ns": I64,
    "end_ns": I64,
    "duration_ns": I64,
    "name": STR,
    "api": STR,
    "correlation_id": I64,
    "return_value": I64,
    "callchain_id": I64,
}

NVTX: dict[str, pl.DataType | type[pl.DataType]] = {
    "pid": I64,
    "tid": I64,
    "global_tid": I64,
    "event_type": STR,
    "event_type_id": I64,
    "start_ns": I64,
    "end_ns": I64,
    "duration_ns": I64,
    "name": STR,
    "domain_id": I64,
    "domain": STR,
    "category": I64,
    "color": I64,
    "range_id": I64,
    "end_global_tid": I64,
    "uint64_value": I64,
    "int64_value": I64,
    "double_value": F64,
    "uint32_value": I64,
    "int32_value": I64,
    "float_value": F64,
    "json_text": STR,
    "binary_data": pl.Binary,
}

GPUS: dict[str, pl.DataType | type[pl.DataType]] = {
    "device_id": I64,
    "name": STR,
    "bus_location": STR,
    "uuid": STR,
    "chip_name": STR,
    "compute_capability": STR,
    "sm_count": I64,
    "total_memory_bytes": I64,
    "memory_bandwidth_bytes_per_s": I64,
    "clock_rate_hz": I64,
    "l2_cache_bytes": I64,
}

PROCESSES: dict[str, pl.DataType | type[pl.DataType]] = {
    "pid": I64,
    "global_pid": I64,
    "name": STR,
}

THREADS: dict[str, pl.DataType | type[pl.DataType]] = {
    "pid": I64,
    "tid": I64,
    "global_tid": I64,
    "name": STR,
}

MEMORY_USAGE: dict[str, pl.DataType | type[pl.DataType]] = {
    "pid": I64,
    "global_pid": I64,
    "device_id": I64,
    "context_id": I64,
    "stream_id": I64,
    "correlation_id": I64,
    "start_ns": I64,
    "address": I64,
    "bytes": I64,
    "mem_kind": STR,
    "operation": STR,
    "name": STR,
}

GPU_METRICS: dict[str, pl.DataType | type[pl.DataType]] = {
    "device_id": I64,
    "timestamp_ns": I64,
    "metric": STR,
    "metric_label": STR,
    "value": I64,
}

TABLES: dict[str, dict[str, pl.DataType | type[pl.DataType]]] = {
    "kernels": KERNELS,
    "memcpys": MEMCPYS,
    "memsets": MEMSETS,
    "syncs": SYNCS,
    "graph_trace": GRAPH_TRACE,
    "cuda_api": CUDA_API,
    "nvtx": NVTX,
    "gpus": GPUS,
    "processes": PROCESSES,
    "threads": THREADS,
    "memory_usage": MEMORY_USAGE,
    "gpu_metrics": GPU_METRICS,
}


#: Columns given only when asked for by name (``trace.table("kernels", ["name_id", …])``): the
#: ``StringIds`` ids behind a text column. A million kernel names are ~170 MB of text but 8 MB of
#: ids; reports that group or sort by name and print it once per group or per written chunk use them.
ON_REQUEST: dict[str, dict[str, pl.DataType | type[pl.DataType]]] = {
    "kernels": {"name_id": I64, "short_name_id": I64, "mangled_name_id": I64},
    "cuda_api": {"name_id": I64},
}


def columns_of(table: str) -> dict[str, pl.DataType | type[pl.DataType]]:
    """Every column ``table`` can give: its documented schema, then its on-request columns."""
    return {**TABLES[table], **ON_REQUEST.get(table, {})}


def empty(table: str, columns: Sequence[str] | None = None) -> pl.DataFrame:
    """An empty frame with the documented schema of ``table`` (only ``columns``, in that
    order, when given: on-request columns included)."""
    if columns is None:
        return pl.DataFrame(schema=TABLES[table])
    every = columns_of(table)
    return pl.DataFrame(schema={c: every[c] for c in columns})


def conform(frame: pl.DataFrame, table: str, columns: Sequence[str] | None = None) -> pl.DataFrame:
    """Select and cast ``frame``'s columns to the documented schema of ``table`` (only
    ``columns`` of it, in schema order, when given).

    Columns the frame lacks are added as nulls.
    """
    schema = TABLES[table] if columns is None else columns_of(table)
    exprs = []
    for name, dtype in schema.items():
        if columns is not None and name not in columns:
            continue
        if name in frame.columns:
            col = pl.col(name)
            exprs.append(col if frame.schema[name] == dtype else col.cast(dtype, strict=False))
        else:
            exprs.append(pl.lit(None, dtype=dtype).alias(name))
    return frame.select(exprs)
