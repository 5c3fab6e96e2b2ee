"""Enum code → label maps for Nsight Systems exports.

Exports from nsys 2022.4 on carry ``ENUM_*`` tables; older ones do not, so tracekit ships
the same maps (CUPTI's values, stable across versions) and prefers the file's own table
when it has one.
"""

from __future__ import annotations

import polars as pl

from tracekit.nsys.database import ExportSource

#: ``copyKind`` → short label (the CUPTI names nsys 2022.4 printed).
MEMCPY_KIND_SHORT: dict[int, str] = {
    0: "Unknown", 1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA",
    8: "DtoD", 9: "HtoH", 10: "PtoP", 11: "Unified HtoD", 12: "Unified DtoH", 13: "Unified DtoD",
}

#: ``copyKind`` → the label of ``ENUM_CUDA_MEMCPY_OPER`` (nsys ≥ 2022.4).
MEMCPY_KIND_LABEL: dict[int, str] = {
    0: "Unknown", 1: "Host-to-Device", 2: "Device-to-Host", 3: "Host-to-Array",
    4: "Array-to-Host", 5: "Array-to-Array", 6: "Array-to-Device", 7: "Device-to-Array",
    8: "Device-to-Device", 9: "Host-to-Host", 10: "Peer-to-Peer", 11: "Unified Host-to-Device",
    12: "Unified Device-to-Host", 13: "Unified Device-to-Device",
}

#: ``srcKind`` / ``dstKind`` / ``memKind`` (``ENUM_CUDA_MEM_KIND``).
MEM_KIND: dict[int, str] = {
    0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static",
    6: "Managed Static", 7: "Unknown",
}

#: ``syncType`` (``ENUM_CUPTI_SYNC_TYPE``).
SYNC_TYPE: dict[int, str] = {
    0: "Unknown", 1: "Event sync", 2: "Stream wait event", 3: "Stream sync", 4: "Context sync",
}

#: ``eventClass`` of ``CUPTI_ACTIVITY_KIND_RUNTIME`` (``ENUM_NSYS_EVENT_CLASS``).
API_CLASS: dict[int, str] = {0: "runtime", 1: "driver"}

#: ``launchType`` (``ENUM_CUDA_KERNEL_LAUNCH_TYPE``).
KERNEL_LAUNCH_TYPE: dict[int, str] = {0: "Regular", 1: "Cooperative single device", 2: "Cooperative multi device"}

#: ``NVTX_EVENTS.eventType`` (``ENUM_NSYS_EVENT_TYPE``), the codes the reports use.
NVTX_EVENT_TYPE: dict[int, str] = {
    33: "Category", 34: "Mark", 35: "Push", 36: "Pop", 37: "Start", 38: "End", 39: "Thread",
    40: "CudaDevice", 41: "CudaContext", 42: "CudaStream", 43: "CudaEvent",
    59: "PushPop", 60: "StartEnd", 70: "PushPop", 71: "StartEnd", 75: "DomainCreate",
    76: "DomainDestroy",
}
NVTX_RANGE_TYPES: tuple[int, ...] = (59, 60, 70, 71)
NVTX_PUSHPOP_TYPES: tuple[int, ...] = (59, 70)

#: ``memoryOperationType`` of ``CUDA_GPU_MEMORY_USAGE_EVENTS`` (``ENUM_CUDA_DEV_MEM_EVENT_OPER``).
MEMORY_OPERATION: dict[int, str] = {0: "alloc", 1: "free"}

#: ``memKind`` of ``CUDA_GPU_MEMORY_USAGE_EVENTS`` (``ENUM_CUDA_MEM_KIND``).
DEVICE_MEMORY_KIND = MEM_KIND


def enum_map(db: ExportSource, table: str, fallback: dict[int, str], *, column: str = "label") -> dict[int, str]:
    """Codes → labels from the file's ``table`` when present, else ``fallback``.

    Codes the file's table lacks keep their fallback label.
    """
    result = dict(fallback)
    if db.has_table(table) and {"id", column} <= set(db.columns(table)):
        for code, label in db.rows(f'SELECT id, "{column}" FROM "{table}"'):
            if code is not None and label is not None:
                result[int(code)] = str(label)
    return result


def map_codes(expr: pl.Expr, mapping: dict[int, str]) -> pl.Expr:
    """Replace integer codes by labels; unknown codes become ``"<code>"`` strings."""
    return expr.replace_strict(
        list(mapping.keys()), list(mapping.values()), default=expr.cast(pl.Utf8), return_dtype=pl.Utf8
    )
