"""A Kineto trace → a folder of Parquet files shaped like ``nsys export --type parquetdir``.

One file per nsys export table that Kineto can fill (``CUPTI_ACTIVITY_KIND_KERNEL``,
``…_RUNTIME``, ``…_MEMCPY``, ``…_MEMSET``, ``…_SYNCHRONIZATION``, ``NVTX_EVENTS``,
``StringIds``, ``ThreadNames``, ``PROCESSES``, ``TARGET_INFO_GPU``,
``TARGET_INFO_SESSION_START_TIME``, ``ANALYSIS_DETAILS``, ``META_DATA_EXPORT``), with nsys's
column names and encodings (``globalTid`` = pid·2²⁴ + tid, names as ``StringIds`` ids), so
:class:`~tracekit.nsys.columnar.ExportFolder` and every reader, analysis and report read it as
they read nsys's own export. Columns Kineto does not record are left out (the readers make them
null). What only Kineto has goes to ``KINETO_*`` files in tracekit's own column names (CPU
operators, memory events, GPU-side annotations, the extra kernel and API arguments, the trace's
top-level fields); ``docs/kineto.md`` lists every mapping.

The folder is made once per trace, in tracekit's cache (:func:`converted_folder`): keyed by the
file's identity and content fingerprint, written to a temporary folder then renamed, so a
conversion that fails leaves nothing behind. The trace file is only read.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import logging
import os
import re
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from tracekit.errors import TraceFormatError
from tracekit.kineto.parse import (
    Document,
    Event,
    as_float,
    as_int,
    as_text,
    decode,
    raw_text,
    to_ns,
)

log = logging.getLogger(__name__)

#: Version of the converted folder's layout (part of its cache key): bump on any change.
FORMAT = "kineto-1"
#: nsys ``NVTX_EVENTS.eventType`` of a push/pop range.
NVTX_PUSH_POP = 59
#: Event categories (lower-cased; old Kineto capitalised them) → what tracekit makes of them.
CATEGORY = {
    "kernel": "kernel",
    "cuda_runtime": "runtime", "runtime": "runtime",
    "cuda_driver": "driver",
    "gpu_memcpy": "memcpy", "memcpy": "memcpy",
    "gpu_memset": "memset", "memset": "memset",
    "cuda_sync": "sync",
    "cpu_op": "cpu_op", "operator": "cpu_op",
    "user_annotation": "annotation",
    "gpu_user_annotation": "gpu_annotation",
    "python_function": "python_function",
}
#: Categories Kineto writes that mark a trace as its own even without the top-level keys.
KINETO_CATEGORIES = frozenset(CATEGORY) | {"ac2g", "fwdbwd", "trace", "cpu_instant_event", "cuda_profiler_range"}
_STEP = re.compile(r"^ProfilerStep#\d+$")
#: ``Memcpy HtoD (Pageable -> Device)`` → copy kind, source and destination memory.
_MEMCPY = re.compile(r"Memcpy\s+(\w+)(?:\s*\((\w[\w ]*?)\s*->\s*(\w[\w ]*?)\))?")
_COPY_KIND = {"HtoD": 1, "DtoH": 2, "HtoA": 3, "AtoH": 4, "AtoA": 5, "AtoD": 6, "DtoA": 7, "DtoD": 8, "HtoH": 9,
              "PtoP": 10}
_MEM_KIND = {"pageable": 0, "pinned": 1, "device": 2, "array": 3, "managed": 4, "host": 0}
_SYNC_TYPE = {"event sync": 1, "stream wait event": 2, "stream sync": 3, "context sync": 4}
TID_BITS = 0x1000000


def _global(pid: int | None, tid: int | None) -> int | None:
    if pid is None:
        return None
    return (pid % TID_BITS) * TID_BITS + (0 if tid is None else tid % TID_BITS)


class _Strings:
    """Text → ``StringIds`` id, in first-seen order."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def __call__(self, text: Any) -> int | None:
        if text is None:
            return None
        text = str(text)
        got = self.ids.get(text)
        if got is None:
            got = self.ids[text] = len(self.ids)
        return got

    def frame(self) -> pl.DataFrame:
        return pl.DataFrame({"id": range(len(self.ids)), "value": list(self.ids)}, schema={"id": pl.Int64, "value": pl.Utf8})


def _times(events: list[Event]) -> tuple[pl.Series, pl.Series]:
    """(start, end) ns of ``events``: ``ts`` and ``ts + dur`` (end = start without a ``dur``)."""
    start = to_ns([bytes(e.ts) or None for e in events])
    dur = to_ns([bytes(e.dur) or None for e in events]).fill_null(0)
    return start.alias("start"), (start + dur).alias("end")


def _arg(events: list[Event], key: str, conv: Any = as_int) -> list[Any]:
    return [None if e.args is None else conv(getattr(e.args, key)) for e in events]


def _dims(events: list[Event], key: str, i: int) -> list[int | None]:
    out: list[int | None] = []
    for e in events:
        v = None if e.args is None else getattr(e.args, key)
        out.append(as_int(v[i]) if isinstance(v, list) and len(v) > i else None)
    return out


def _frame(columns: dict[str, Any], schema: dict[str, Any]) -> pl.DataFrame:
    return pl.DataFrame({k: columns[k] for k in schema}, schema=schema)


def _external(events: list[Event]) -> list[int | None]:
    return [None if e.args is None else as_int(e.args.external_id if e.args.external_id is not None else e.args.external_id_old)
            for e in events]


def build_tables(doc: Document, path: Path) -> dict[str, pl.DataFrame]:
    """The folder's tables (file stem → frame) from the decoded trace. Raises
    :class:`TraceFormatError` for a trace with no events, no Kineto events or no GPU work."""
    events = doc.traceEvents
    if events is None:
        msg = f"{path} is JSON but has no traceEvents list: not a Chrome/PyTorch profiler trace; pass a *.pt.trace.json(.gz)"
        raise TraceFormatError(msg)
    if not events:
        msg = (f"{path} has an empty traceEvents list: the profiler recorded nothing (was the schedule's active "
               "window reached, or the trace written before the profiled steps?); profile again")
        raise TraceFormatError(msg)
    groups: dict[str, list[Event]] = {k: [] for k in {*CATEGORY.values(), "memory", "process_name", "thread_name"}}
    other: Counter[str] = Counter()
    kineto_seen = doc.schemaVersion is not None or doc.deviceProperties is not None or doc.distributedInfo is not None
    span: list[Event] = []
    for e in events:
        cat = e.cat.lower() if isinstance(e.cat, str) else ""
        kind = CATEGORY.get(cat)
        if cat in KINETO_CATEGORIES:
            kineto_seen = True
        if e.ph == "X":
            if isinstance(e.name, str) and _STEP.match(e.name) and kind in ("cpu_op", "annotation", None):
                kind = "annotation"
            if kind is not None:
                groups[kind].append(e)
            elif cat == "trace":
                span.append(e)
            else:
                other[cat or "(none)"] += 1
        elif e.ph == "i" and e.name == "[memory]":
            groups["memory"].append(e)
        elif e.ph == "M" and e.name in ("process_name", "thread_name"):
            groups[str(e.name)].append(e)
    if not kineto_seen:
        msg = (f"{path} is a Chrome trace but not a PyTorch profiler (Kineto) trace: no schemaVersion, deviceProperties "
               "or Kineto event categories (kernel, cpu_op, cuda_runtime); tracekit reads torch.profiler's traces")
        raise TraceFormatError(msg)
    gpu = len(groups["kernel"]) + len(groups["memcpy"]) + len(groups["memset"])
    if not gpu:
        cpu = len(groups["cpu_op"]) + len(groups["annotation"])
        msg = (f"{path} is a PyTorch profiler trace with no GPU activity ({cpu:,} CPU events, no kernels or copies): "
               "profile with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] on a GPU run to analyse GPU time")
        raise TraceFormatError(msg)
    if other:
        log.debug("%s: events of categories not converted: %s", path, dict(other))
    strings = _Strings()
    tables: dict[str, pl.DataFrame] = {}

    # processes and threads: the CPU side's pids; GPU events use pid = device, tid = stream
    cpu_events = groups["runtime"] + groups["driver"] + groups["cpu_op"] + groups["annotation"] + groups["python_function"]
    pid_counts = Counter(as_int(e.pid) for e in groups["runtime"] + groups["driver"] or cpu_events)
    pid_counts.pop(None, None)
    main_pid: int = next((p for p, _ in pid_counts.most_common() if p is not None), 0)
    cpu_pids: set[int] = {p for p in (as_int(e.pid) for e in cpu_events) if p is not None} | {main_pid}

    tables.update(_gpu_tables(groups, strings, main_pid))
    runtime = groups["runtime"] + groups["driver"]
    if runtime:
        tables["CUPTI_ACTIVITY_KIND_RUNTIME"], tables["KINETO_RUNTIME_ARGS"] = _runtime(runtime, len(groups["runtime"]), strings)
    annotations = groups["annotation"]
    if annotations:
        start, end = _times(annotations)
        tables["NVTX_EVENTS"] = pl.DataFrame({
            "start": start, "end": end,
            "eventType": pl.Series([NVTX_PUSH_POP] * len(annotations), dtype=pl.Int64),
            "text": pl.Series([str(e.name) for e in annotations], dtype=pl.Utf8),
            "globalTid": pl.Series([_global(as_int(e.pid), as_int(e.tid)) for e in annotations], dtype=pl.Int64),
            "domainId": pl.Series([0] * len(annotations), dtype=pl.Int64),
        }).sort("start", "end", descending=[False, True], maintain_order=True)
    tables["KINETO_CPU_OPS"] = _cpu_ops(groups["cpu_op"] + annotations + groups["python_function"])
    if groups["memory"]:
        tables["KINETO_MEMORY_EVENTS"] = _memory(groups["memory"])
    if groups["gpu_annotation"]:
        ga = groups["gpu_annotation"]
        start, end = _times(ga)
        tables["KINETO_GPU_ANNOTATIONS"] = pl.DataFrame({
            "name": pl.Series([str(e.name) for e in ga], dtype=pl.Utf8),
            "device_id": pl.Series([d if d is not None else as_int(e.pid) for d, e in zip(_arg(ga, "device"), ga, strict=True)], dtype=pl.Int64),
            "stream_id": pl.Series([s if s is not None else as_int(e.tid) for s, e in zip(_arg(ga, "stream"), ga, strict=True)], dtype=pl.Int64),
            "start_ns": start, "end_ns": end, "duration_ns": end - start,
            "external_id": pl.Series(_external(ga), dtype=pl.Int64),
        }).sort("start_ns", maintain_order=True)

    names = {as_int(e.pid): e.args.name for e in groups["process_name"] if e.args is not None and isinstance(e.args.name, str)}
    tables["PROCESSES"] = pl.DataFrame({
        "globalPid": [_global(p, 0) for p in sorted(cpu_pids)], "pid": sorted(cpu_pids),
        "name": [names.get(p) for p in sorted(cpu_pids)],
    }, schema={"globalPid": pl.Int64, "pid": pl.Int64, "name": pl.Utf8})
    thread_names = {(as_int(e.pid), as_int(e.tid)): e.args.name for e in groups["thread_name"]
                    if e.args is not None and isinstance(e.args.name, str)}
    seen = sorted({(p, t) for p, t in ((as_int(e.pid), as_int(e.tid)) for e in cpu_events) if p is not None and t is not None}
                  | {k for k in thread_names if k[0] in cpu_pids and k[1] is not None})
    tables["ThreadNames"] = pl.DataFrame({
        "nameId": [strings(thread_names.get(k)) for k in seen], "priority": [None] * len(seen),
        "globalTid": [_global(*k) for k in seen],
    }, schema={"nameId": pl.Int64, "priority": pl.Int64, "globalTid": pl.Int64})

    tables.update(_target_info(doc, tables, span, path))
    tables["StringIds"] = strings.frame()
    return tables


def _gpu_tables(groups: dict[str, list[Event]], strings: _Strings, main_pid: int) -> dict[str, pl.DataFrame]:
    """Kernels, copies, memsets and syncs with nsys's columns; the extra kernel/copy arguments
    in ``KINETO_GPU_ARGS``. ``globalPid`` is the launching process, found through the runtime
    call of the same correlation id (else the trace's main process)."""
    launcher: dict[int, int] = {}
    for e in groups["runtime"] + groups["driver"]:
        c = None if e.args is None else as_int(e.args.correlation)
        p = as_int(e.pid)
        if c is not None and p is not None:
            launcher.setdefault(c, p)
    out: dict[str, pl.DataFrame] = {}
    extra: list[pl.DataFrame] = []
    for kind, table in (("kernel", "CUPTI_ACTIVITY_KIND_KERNEL"), ("memcpy", "CUPTI_ACTIVITY_KIND_MEMCPY"),
                        ("memset", "CUPTI_ACTIVITY_KIND_MEMSET"), ("sync", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION")):
        ev = groups[kind]
        if not ev:
            continue
        start, end = _times(ev)
        corr = _arg(ev, "correlation")
        cols: dict[str, Any] = {
            "start": start, "end": end,
            "deviceId": pl.Series([d if d is not None else as_int(e.pid) for d, e in zip(_arg(ev, "device"), ev, strict=True)], dtype=pl.Int64),
            "contextId": pl.Series(_arg(ev, "context"), dtype=pl.Int64),
            "streamId": pl.Series([s if s is not None else as_int(e.tid) for s, e in zip(_arg(ev, "stream"), ev, strict=True)], dtype=pl.Int64),
            "correlationId": pl.Series(corr, dtype=pl.Int64),
            "globalPid": pl.Series([_global(launcher.get(c, main_pid) if c is not None else main_pid, 0) for c in corr], dtype=pl.Int64),
        }
        if kind == "kernel":
            ids = pl.Series([strings(e.name) for e in ev], dtype=pl.Int64)
            from tracekit.ncu.schema import short_name_of

            short = {n: short_name_of(n) for n in {str(e.name) for e in ev}}
            cols |= {
                "demangledName": ids, "shortName": pl.Series([strings(short[str(e.name)]) for e in ev], dtype=pl.Int64),
                "registersPerThread": pl.Series(_arg(ev, "registers_per_thread"), dtype=pl.Int64),
                **{f"grid{a}": pl.Series(_dims(ev, "grid", i), dtype=pl.Int64) for i, a in enumerate("XYZ")},
                **{f"block{a}": pl.Series(_dims(ev, "block", i), dtype=pl.Int64) for i, a in enumerate("XYZ")},
            }
        elif kind == "memcpy":
            parsed = [_MEMCPY.match(str(e.name)) for e in ev]
            cols |= {
                "bytes": pl.Series(_arg(ev, "bytes"), dtype=pl.Int64),
                "copyKind": pl.Series([_COPY_KIND.get(m.group(1), 0) if m else 0 for m in parsed], dtype=pl.Int64),
                "srcKind": pl.Series([_MEM_KIND.get((m.group(2) or "").lower()) if m else None for m in parsed], dtype=pl.Int64),
                "dstKind": pl.Series([_MEM_KIND.get((m.group(3) or "").lower()) if m else None for m in parsed], dtype=pl.Int64),
            }
        elif kind == "memset":
            kinds = [re.search(r"\((\w+)\)", str(e.name)) for e in ev]
            cols |= {
                "bytes": pl.Series(_arg(ev, "bytes"), dtype=pl.Int64),
                "memKind": pl.Series([_MEM_KIND.get(k.group(1).lower()) if k else None for k in kinds], dtype=pl.Int64),
            }
        else:
            sync = [str(s or e.name).lower() for s, e in zip(_arg(ev, "sync_kind", as_text), ev, strict=True)]
            cols |= {"syncType": pl.Series([_SYNC_TYPE.get(s, 0) for s in sync], dtype=pl.Int64)}
        out[table] = pl.DataFrame(cols)
        if kind != "sync":
            extra.append(pl.DataFrame({
                "kind": [kind] * len(ev), "correlation_id": corr, "device_id": cols["deviceId"],
                "start_ns": start, "external_id": _external(ev), "queued_ns": _arg(ev, "queued"),
                "shared_memory_bytes": _arg(ev, "shared_memory"), "blocks_per_sm": _arg(ev, "blocks_per_sm", as_float),
                "warps_per_sm": _arg(ev, "warps_per_sm", as_float),
                "est_achieved_occupancy_pct": _arg(ev, "occupancy", as_float),
                "bandwidth_gbps": _arg(ev, "bandwidth", as_float),
                "collective_name": _arg(ev, "collective_name", as_text), "in_msg_nelems": _arg(ev, "in_msg_nelems"),
                "out_msg_nelems": _arg(ev, "out_msg_nelems"), "group_size": _arg(ev, "group_size"),
                "dtype": _arg(ev, "dtype", as_text), "process_group_name": _arg(ev, "pg_name", as_text),
                "process_group_desc": _arg(ev, "pg_desc", as_text), "process_group_ranks": _arg(ev, "pg_ranks", as_text),
            }, schema=GPU_ARGS_SCHEMA))
    if extra:
        out["KINETO_GPU_ARGS"] = pl.concat(extra)
    return out


GPU_ARGS_SCHEMA: dict[str, Any] = {
    "kind": pl.Utf8, "correlation_id": pl.Int64, "device_id": pl.Int64, "start_ns": pl.Int64, "external_id": pl.Int64,
    "queued_ns": pl.Int64, "shared_memory_bytes": pl.Int64, "blocks_per_sm": pl.Float64, "warps_per_sm": pl.Float64,
    "est_achieved_occupancy_pct": pl.Float64, "bandwidth_gbps": pl.Float64, "collective_name": pl.Utf8,
    "in_msg_nelems": pl.Int64, "out_msg_nelems": pl.Int64, "group_size": pl.Int64, "dtype": pl.Utf8,
    "process_group_name": pl.Utf8, "process_group_desc": pl.Utf8, "process_group_ranks": pl.Utf8,
}


def _runtime(events: list[Event], n_runtime: int, strings: _Strings) -> tuple[pl.DataFrame, pl.DataFrame]:
    start, end = _times(events)
    gtid = pl.Series([_global(as_int(e.pid), as_int(e.tid)) for e in events], dtype=pl.Int64)
    corr = pl.Series(_arg(events, "correlation"), dtype=pl.Int64)
    api = pl.DataFrame({
        "start": start, "end": end,
        "eventClass": pl.Series([0] * n_runtime + [1] * (len(events) - n_runtime), dtype=pl.Int64),
        "globalTid": gtid, "correlationId": corr,
        "nameId": pl.Series([strings(e.name) for e in events], dtype=pl.Int64),
    })
    args = pl.DataFrame({"correlation_id": corr, "global_tid": gtid, "start_ns": start,
                         "external_id": pl.Series(_external(events), dtype=pl.Int64),
                         "cbid": pl.Series(_arg(events, "cbid"), dtype=pl.Int64)})
    order = api["start"].arg_sort()
    return api[order], args[order]


CPU_OPS_SCHEMA: dict[str, Any] = {
    "category": pl.Utf8, "name": pl.Utf8, "pid": pl.Int64, "tid": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64,
    "duration_ns": pl.Int64, "external_id": pl.Int64, "record_function_id": pl.Int64, "ev_idx": pl.Int64,
    "sequence_number": pl.Int64, "fwd_thread_id": pl.Int64, "input_dims": pl.Utf8, "input_types": pl.Utf8,
    "input_strides": pl.Utf8, "concrete_inputs": pl.Utf8, "call_stack": pl.Utf8, "module_hierarchy": pl.Utf8,
    "collective_name": pl.Utf8, "in_msg_nelems": pl.Int64, "out_msg_nelems": pl.Int64, "group_size": pl.Int64,
    "dtype": pl.Utf8, "process_group_name": pl.Utf8, "process_group_desc": pl.Utf8, "process_group_ranks": pl.Utf8,
}


def _raw_arg(events: list[Event], key: str) -> list[str | None]:
    return [None if e.args is None else raw_text(getattr(e.args, key)) for e in events]


def _cpu_ops(events: list[Event]) -> pl.DataFrame:
    if not events:
        return pl.DataFrame(schema=CPU_OPS_SCHEMA)
    start, end = _times(events)
    cols: dict[str, Any] = {
        "category": [str(e.cat) for e in events], "name": [str(e.name) for e in events],
        "pid": [as_int(e.pid) for e in events], "tid": [as_int(e.tid) for e in events],
        "start_ns": start, "end_ns": end, "duration_ns": end - start, "external_id": _external(events),
        "record_function_id": _arg(events, "record_function_id"), "ev_idx": _arg(events, "ev_idx"),
        "sequence_number": _arg(events, "sequence_number"), "fwd_thread_id": _arg(events, "fwd_thread_id"),
        "input_dims": _raw_arg(events, "input_dims"), "input_types": _raw_arg(events, "input_types"),
        "input_strides": _raw_arg(events, "input_strides"), "concrete_inputs": _raw_arg(events, "concrete_inputs"),
        "call_stack": _arg(events, "call_stack", as_text), "module_hierarchy": _arg(events, "module_hierarchy", as_text),
        "collective_name": _arg(events, "collective_name", as_text), "in_msg_nelems": _arg(events, "in_msg_nelems"),
        "out_msg_nelems": _arg(events, "out_msg_nelems"), "group_size": _arg(events, "group_size"),
        "dtype": _arg(events, "dtype", as_text), "process_group_name": _arg(events, "pg_name", as_text),
        "process_group_desc": _arg(events, "pg_desc", as_text), "process_group_ranks": _arg(events, "pg_ranks", as_text),
    }
    return _frame(cols, CPU_OPS_SCHEMA).sort("start_ns", "end_ns", descending=[False, True], maintain_order=True)


MEMORY_SCHEMA: dict[str, Any] = {
    "pid": pl.Int64, "tid": pl.Int64, "start_ns": pl.Int64, "device_type": pl.Int64, "device_id": pl.Int64,
    "address": pl.Int64, "bytes": pl.Int64, "total_allocated_bytes": pl.Int64, "total_reserved_bytes": pl.Int64,
}


def _memory(events: list[Event]) -> pl.DataFrame:
    start, _ = _times(events)
    addr = [a if a is None or a < 2**63 else a - 2**64 for a in _arg(events, "addr")]
    cols = {
        "pid": [as_int(e.pid) for e in events], "tid": [as_int(e.tid) for e in events], "start_ns": start,
        "device_type": _arg(events, "mem_device_type"), "device_id": _arg(events, "mem_device_id"), "address": addr,
        "bytes": _arg(events, "mem_bytes"), "total_allocated_bytes": _arg(events, "total_allocated"),
        "total_reserved_bytes": _arg(events, "total_reserved"),
    }
    return _frame(cols, MEMORY_SCHEMA).sort("start_ns", maintain_order=True)


def _target_info(doc: Document, tables: dict[str, pl.DataFrame], span: list[Event], path: Path) -> dict[str, pl.DataFrame]:
    """GPUs, the capture window, the session's epoch and the export's metadata."""
    out: dict[str, pl.DataFrame] = {}
    props = doc.deviceProperties if isinstance(doc.deviceProperties, list) else []
    props = [p for p in props if isinstance(p, dict)]
    used: set[int] = set()
    for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        if t in tables:
            used.update(d for d in tables[t]["deviceId"].drop_nulls().unique().to_list())
    rows = {as_int(p.get("id")): p for p in props}
    ids = sorted({i for i in rows if i is not None} | used)
    out["TARGET_INFO_GPU"] = pl.DataFrame({
        "id": ids,
        "name": [as_text(rows.get(i, {}).get("name")) for i in ids],
        "busLocation": [None] * len(ids), "uuid": [None] * len(ids), "chipName": [None] * len(ids),
        "totalMemory": [as_int(rows.get(i, {}).get("totalGlobalMem")) for i in ids],
        "smCount": [as_int(rows.get(i, {}).get("numSms")) for i in ids],
        "computeMajor": [as_int(rows.get(i, {}).get("computeMajor")) for i in ids],
        "computeMinor": [as_int(rows.get(i, {}).get("computeMinor")) for i in ids],
        "l2CacheSize": [None] * len(ids), "memoryBandwidth": [None] * len(ids), "clockRate": [None] * len(ids),
    }, schema={"id": pl.Int64, "name": pl.Utf8, "busLocation": pl.Utf8, "uuid": pl.Utf8, "chipName": pl.Utf8,
               "totalMemory": pl.Int64, "smCount": pl.Int64, "computeMajor": pl.Int64, "computeMinor": pl.Int64,
               "l2CacheSize": pl.Int64, "memoryBandwidth": pl.Int64, "clockRate": pl.Int64})
    starts = [tables[t]["start"].min() for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME",
                                                  "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET", "NVTX_EVENTS")
              if t in tables]
    ends = [tables[t]["end"].max() for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME",
                                              "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET", "NVTX_EVENTS")
            if t in tables]
    if tables["KINETO_CPU_OPS"].height:
        starts.append(tables["KINETO_CPU_OPS"]["start_ns"].min())
        ends.append(tables["KINETO_CPU_OPS"]["end_ns"].max())
    if span:
        s, e = _times(span[:1])
        starts.append(s[0])
        ends.append(e[0])
    lo = min(int(v) for v in starts if isinstance(v, int))
    hi = max(int(v) for v in ends if isinstance(v, int))
    out["ANALYSIS_DETAILS"] = pl.DataFrame({"startTime": [lo], "stopTime": [hi], "duration": [hi - lo]},
                                           schema={"startTime": pl.Int64, "stopTime": pl.Int64, "duration": pl.Int64})
    base = as_int(doc.baseTimeNanoseconds)
    # without a base time, Kineto counted from the Unix epoch (µs since 2001 are > 1e15)
    epoch = base if base is not None else (0 if lo >= 10**18 else None)
    if epoch is not None:
        utc = _dt.datetime.fromtimestamp((epoch + lo) / 1e9, tz=_dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
        out["TARGET_INFO_SESSION_START_TIME"] = pl.DataFrame({"utcEpochNs": [epoch], "utcTime": [utc], "localTime": [None]},
                                                             schema={"utcEpochNs": pl.Int64, "utcTime": pl.Utf8, "localTime": pl.Utf8})
    schema_version = as_text(doc.schemaVersion)
    meta = {
        "EXPORT_PRODUCT_NAME": "PyTorch Profiler (Kineto)",
        "EXPORT_PRODUCT_VERSION": f"kineto schema {schema_version}" if schema_version else "kineto",
        "EXPORT_SOURCE_FILE": path.name,
        "TRACEKIT_KINETO_FORMAT": FORMAT,
    }
    out["META_DATA_EXPORT"] = pl.DataFrame({"name": list(meta), "value": list(meta.values())}, schema={"name": pl.Utf8, "value": pl.Utf8})
    top = {k: msgspec.json.encode(v).decode() for k, v in msgspec.structs.asdict(doc).items() if k != "traceEvents" and v is not None}
    out["KINETO_META"] = pl.DataFrame({"name": list(top), "value": list(top.values())}, schema={"name": pl.Utf8, "value": pl.Utf8})
    return out


# -- the cached folder --------------------------------------------------------------------------
def convert(path: Path, folder: Path) -> None:
    """Read the trace at ``path`` and write its tables into the existing, empty ``folder``."""
    doc = decode(path)
    tables = build_tables(doc, path)
    del doc
    for name, frame in tables.items():
        frame.write_parquet(folder / f"{name}.parquet", statistics=False)


def _key(path: Path) -> str:
    from tracekit.cache import export_key

    return export_key(path, salt=FORMAT)


def converted_folder(path: str | Path) -> tuple[Path, Path | None]:
    """The nsys-shaped folder of the Kineto trace at ``path`` (made on first use), and a
    temporary folder to delete when done with it (None when the folder is in the cache).

    Cached under ``<cache_dir>/kineto/<name>.<key>``, the key made of the file's path, size,
    modification time, inode and content fingerprint (:func:`tracekit.cache.export_key`), so a
    changed trace is converted again. Written to a temporary folder beside it and renamed into
    place, so a failed or interrupted conversion leaves no folder that looks complete. When the
    cache cannot be written (read-only home, a folder of another user) the conversion goes to a
    temporary folder instead."""
    from tracekit.cache import cache_dir, folder_state

    path = Path(path)
    root = cache_dir() / "kineto"
    key = _key(path)
    final = root / f"{path.name[:80]}.{key}"
    if (final / "META_DATA_EXPORT.parquet").is_file():
        return final, None
    usable = folder_state(root) == "ok"
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}." if usable else "tracekit-kineto-", dir=root if usable else None))
    try:
        convert(path, tmp)
        if not usable:
            return tmp, tmp
        try:
            os.rename(tmp, final)
        except OSError:  # another process converted it meanwhile
            if not (final / "META_DATA_EXPORT.parquet").is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
        return final, None
    except BaseException:
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp)
        raise
