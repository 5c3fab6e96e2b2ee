"""The first half of a conversion: ``traceEvents`` decoded a batch at a time, each batch sorted
into the kinds tracekit converts and turned into columns (one small polars frame per kind and
batch), so the typed events of one batch at most are alive at once.

Each column holds the event's own values, converted exactly as the tables want them (times in
ns, ids as Int64, JSON text for shapes); what needs every event of a kind (the string ids,
the launching process, sorting) is left to :mod:`tracekit.kineto.convert`.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from tracekit.errors import TraceFormatError
from tracekit.kineto.parse import (
    Document,
    Event,
    EventStream,
    Unstreamable,
    args_struct,
    as_int,
    decode,
    decode_args,
    event_batches,
    floats,
    ints,
    raw_texts,
    strs,
    texts,
    to_ns,
)

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
#: The kinds whose events become rows (staged as frames), in the order tables concatenate them.
KINDS = ("kernel", "memcpy", "memset", "sync", "runtime", "driver", "cpu_op", "annotation", "python_function",
         "memory", "gpu_annotation")
_STEP = re.compile(r"^ProfilerStep#\d+$")
#: ``Memcpy HtoD (Pageable -> Device)`` → copy kind, source and destination memory.
_MEMCPY = re.compile(r"Memcpy\s+(\w+)(?:\s*\((\w[\w ]*?)\s*->\s*(\w[\w ]*?)\))?")
_MEMSET = re.compile(r"\((\w+)\)")
_COPY_KIND = {"HtoD": 1, "DtoH": 2, "HtoA": 3, "AtoH": 4, "AtoA": 5, "AtoD": 6, "DtoA": 7, "DtoD": 8, "HtoH": 9,
              "PtoP": 10}
_MEM_KIND = {"pageable": 0, "pinned": 1, "device": 2, "array": 3, "managed": 4, "host": 0}
_SYNC_TYPE = {"event sync": 1, "stream wait event": 2, "stream sync": 3, "context sync": 4}
_COMMS = ("collective_name", "in_msg_nelems", "out_msg_nelems", "group_size", "dtype", "pg_name", "pg_desc", "pg_ranks")
_EXTERNAL = ("external_id", "external_id_old")
#: The ``args`` keys each kind reads.
_ARGS = {
    "gpu": ("device", "context", "stream", "correlation", "registers_per_thread", "grid", "block", "bytes", "sync_kind",
            *_EXTERNAL, "queued", "shared_memory", "blocks_per_sm", "warps_per_sm", "occupancy", "bandwidth", *_COMMS),
    "runtime": ("correlation", *_EXTERNAL, "cbid"),
    "cpu_op": (*_EXTERNAL, "record_function_id", "ev_idx", "sequence_number", "fwd_thread_id", "input_dims",
               "input_types", "input_strides", "concrete_inputs", "call_stack", "module_hierarchy", *_COMMS),
    "memory": ("mem_device_type", "mem_device_id", "addr", "mem_bytes", "total_allocated", "total_reserved"),
    "gpu_annotation": ("device", "stream", *_EXTERNAL),
    "names": ("name",),
}
_FAMILY = {"kernel": "gpu", "memcpy": "gpu", "memset": "gpu", "sync": "gpu", "runtime": "runtime", "driver": "runtime",
           "cpu_op": "cpu_op", "annotation": "cpu_op", "python_function": "cpu_op", "memory": "memory",
           "gpu_annotation": "gpu_annotation", "process_name": "names", "thread_name": "names"}
_STRUCTS = {family: args_struct(f"{family.title().replace('_', '')}Args", fields) for family, fields in _ARGS.items()}
_DECODERS = {family: msgspec.json.Decoder(list[struct | None]) for family, struct in _STRUCTS.items()}  # type: ignore[valid-type]
_NO_ARGS = {family: struct() for family, struct in _STRUCTS.items()}
_I, _F, _S = pl.Int64, pl.Float64, pl.Utf8

#: The extra arguments of kernels, copies and memsets (``KINETO_GPU_ARGS`` less its keys).
GPU_EXTRA: dict[str, Any] = {
    "external_id": _I, "queued_ns": _I, "shared_memory_bytes": _I, "blocks_per_sm": _F, "warps_per_sm": _F,
    "est_achieved_occupancy_pct": _F, "bandwidth_gbps": _F, "collective_name": _S, "in_msg_nelems": _I,
    "out_msg_nelems": _I, "group_size": _I, "dtype": _S, "process_group_name": _S, "process_group_desc": _S,
    "process_group_ranks": _S,
}
_GPU = {"start": _I, "end": _I, "deviceId": _I, "contextId": _I, "streamId": _I, "correlationId": _I}
#: Columns of each kind's staged frames.
SCHEMA: dict[str, dict[str, Any]] = {
    "kernel": {**_GPU, "name": _S, "registersPerThread": _I, "gridX": _I, "gridY": _I, "gridZ": _I, "blockX": _I,
               "blockY": _I, "blockZ": _I, **GPU_EXTRA},
    "memcpy": {**_GPU, "bytes": _I, "copyKind": _I, "srcKind": _I, "dstKind": _I, **GPU_EXTRA},
    "memset": {**_GPU, "bytes": _I, "memKind": _I, **GPU_EXTRA},
    "sync": {**_GPU, "syncType": _I},
    "runtime": {"start": _I, "end": _I, "pid": _I, "tid": _I, "correlationId": _I, "name": _S, "external_id": _I,
                "cbid": _I},
    "cpu_op": {
        "category": _S, "name": _S, "pid": _I, "tid": _I, "start_ns": _I, "end_ns": _I, "duration_ns": _I,
        "external_id": _I, "record_function_id": _I, "ev_idx": _I, "sequence_number": _I, "fwd_thread_id": _I,
        "input_dims": _S, "input_types": _S, "input_strides": _S, "concrete_inputs": _S, "call_stack": _S,
        "module_hierarchy": _S, "collective_name": _S, "in_msg_nelems": _I, "out_msg_nelems": _I, "group_size": _I,
        "dtype": _S, "process_group_name": _S, "process_group_desc": _S, "process_group_ranks": _S,
    },
    "memory": {"pid": _I, "tid": _I, "start_ns": _I, "device_type": _I, "device_id": _I, "address": _I, "bytes": _I,
               "total_allocated_bytes": _I, "total_reserved_bytes": _I},
    "gpu_annotation": {"name": _S, "device_id": _I, "stream_id": _I, "start_ns": _I, "end_ns": _I, "duration_ns": _I,
                       "external_id": _I},
}
SCHEMA |= {"driver": SCHEMA["runtime"], "annotation": SCHEMA["cpu_op"], "python_function": SCHEMA["cpu_op"]}


class Staged:
    """What the first half learned from every event: per kind its frames (one per batch) and
    count, the categories not converted, whether Kineto's own marks were seen, the first
    ``trace`` span's (start, end) ns, and the process and thread names."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.parts: dict[str, list[pl.DataFrame]] = {k: [] for k in KINDS}
        self.counts: Counter[str] = Counter()
        self.other: Counter[str] = Counter()
        self.kineto_seen = False
        self.span: tuple[Any, Any] | None = None
        self.process_names: dict[int | None, str] = {}
        self.thread_names: dict[tuple[int | None, int | None], str] = {}

    def take(self, *kinds: str) -> pl.DataFrame:
        """The rows of ``kinds``, in that order and each in the file's order; handed over (the
        staged frames are dropped here, so that their memory goes with the table's)."""
        parts = [f for k in kinds for f in self.parts[k]]
        for k in kinds:
            self.parts[k] = []
        return pl.concat(parts) if parts else pl.DataFrame(schema=SCHEMA[kinds[0]])

    def add(self, events: list[Event]) -> None:
        """Sort one batch by kind and stage its columns."""
        path = self.path
        groups: dict[str, list[Event]] = {k: [] for k in (*KINDS, "process_name", "thread_name")}
        other = self.other
        span: list[Event] = []
        for e in events:
            cat = e.cat.lower() if isinstance(e.cat, str) else ""
            kind = CATEGORY.get(cat)
            if cat in KINETO_CATEGORIES:
                self.kineto_seen = True
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
        if span and self.span is None:
            start, end = _times(_head(span[:1]))
            self.span = (start[0], end[0])
        for e, a in zip(groups["process_name"], decode_args(_DECODERS["names"], groups.pop("process_name"), path), strict=True):
            if a is not None and isinstance(a.name, str):
                self.process_names[as_int(e.pid)] = a.name
        for e, a in zip(groups["thread_name"], decode_args(_DECODERS["names"], groups.pop("thread_name"), path), strict=True):
            if a is not None and isinstance(a.name, str):
                self.thread_names[(as_int(e.pid), as_int(e.tid))] = a.name
        for kind, ev in groups.items():
            if ev:
                self.counts[kind] += len(ev)
                family = _FAMILY[kind]
                args = _transpose(decode_args(_DECODERS[family], ev, path), family)
                self.parts[kind].append(pl.DataFrame(_STAGE[kind](kind, _head(ev), args), schema=SCHEMA[kind]))


def stage(path: Path) -> tuple[Staged, Document]:
    """Every event of the trace at ``path`` staged, and the trace's top-level fields.

    The file is read as a stream (:class:`~tracekit.kineto.parse.EventStream`); text that
    cannot be followed so (truncated, damaged, oddly shaped) is read whole instead, which says
    in one line what is wrong with it (:class:`TraceFormatError`)."""
    staged = Staged(path)
    stream = EventStream(path)
    try:
        for batch in stream:
            staged.add(batch)
        if stream.doc is None:
            raise Unstreamable
        doc, count = stream.doc, stream.events
    except Unstreamable:
        staged = Staged(path)
        doc = decode(path)
        events, doc.traceEvents = doc.traceEvents, None
        if events is None:
            msg = (f"{path} is JSON but has no traceEvents list: not a Chrome/PyTorch profiler trace; pass a "
                   "*.pt.trace.json(.gz)")
            raise TraceFormatError(msg) from None
        count = len(events)
        for batch in event_batches(events, path):
            staged.add(batch)
        del events
    if not count:
        msg = (f"{path} has an empty traceEvents list: the profiler recorded nothing (was the schedule's active "
               "window reached, or the trace written before the profiled steps?); profile again")
        raise TraceFormatError(msg)
    staged.kineto_seen = (staged.kineto_seen or doc.schemaVersion is not None or doc.deviceProperties is not None
                          or doc.distributedInfo is not None)
    return staged, doc


# -- one batch of one kind → columns ------------------------------------------------------------
def _head(events: list[Event]) -> dict[str, tuple[Any, ...]]:
    """The events' own fields, each as a column."""
    return dict(zip(Event.__struct_fields__, zip(*map(msgspec.structs.astuple, events), strict=True), strict=True))


def _transpose(args: list[Any], family: str) -> dict[str, tuple[Any, ...]]:
    """Decoded ``args`` (None: the event has none, every key absent), each key as a column."""
    none = _NO_ARGS[family]
    rows = [none if a is None else a for a in args]
    return dict(zip(_ARGS[family], zip(*map(msgspec.structs.astuple, rows), strict=True), strict=True))


def _times(head: dict[str, tuple[Any, ...]]) -> tuple[pl.Series, pl.Series]:
    """(start, end) ns: ``ts`` and ``ts + dur`` (end = start without a ``dur``)."""
    start = to_ns(raw_texts(head["ts"]))
    dur = to_ns(raw_texts(head["dur"])).fill_null(0)
    return start, start + dur


def _external(args: dict[str, tuple[Any, ...]]) -> pl.Series:
    return ints([a if a is not None else b for a, b in zip(args["external_id"], args["external_id_old"], strict=True)])


def _or(first: pl.Series, then: pl.Series) -> pl.Series:
    return first.fill_null(then)


def _dims(values: tuple[Any, ...]) -> list[pl.Series]:
    """x, y and z of ``[x, y, z]`` lists (null where absent or short)."""
    out: list[list[Any]] = [[None] * len(values) for _ in range(3)]
    for j, v in enumerate(values):
        if isinstance(v, list):
            for i, item in enumerate(v[:3]):
                out[i][j] = item
    return [ints(col) for col in out]


def _per_name(names: pl.Series, conv: Any) -> list[pl.Series]:
    """``conv(name) → tuple of ints`` applied once per distinct name, as Int64 columns."""
    distinct = names.unique(maintain_order=True).to_list()
    found = [conv(n) for n in distinct]
    width = len(found[0]) if found else 0
    return [names.replace_strict(distinct, [f[i] for f in found], return_dtype=pl.Int64) for i in range(width)]


def _copy_kinds(name: str) -> tuple[int, int | None, int | None]:
    m = _MEMCPY.match(name)
    if not m:
        return 0, None, None
    return _COPY_KIND.get(m.group(1), 0), _MEM_KIND.get((m.group(2) or "").lower()), _MEM_KIND.get((m.group(3) or "").lower())


def _memset_kind(name: str) -> tuple[int | None]:
    m = _MEMSET.search(name)
    return (_MEM_KIND.get(m.group(1).lower()) if m else None,)


def _gpu(kind: str, head: dict[str, tuple[Any, ...]], args: dict[str, tuple[Any, ...]]) -> dict[str, Any]:
    start, end = _times(head)
    cols: dict[str, Any] = {
        "start": start, "end": end, "deviceId": _or(ints(args["device"]), ints(head["pid"])),
        "contextId": ints(args["context"]), "streamId": _or(ints(args["stream"]), ints(head["tid"])),
        "correlationId": ints(args["correlation"]),
    }
    if kind == "kernel":
        grid, block = _dims(args["grid"]), _dims(args["block"])
        cols |= {"name": strs(head["name"], keep_none=True), "registersPerThread": ints(args["registers_per_thread"]),
                 **{f"grid{a}": grid[i] for i, a in enumerate("XYZ")}, **{f"block{a}": block[i] for i, a in enumerate("XYZ")}}
    elif kind == "memcpy":
        copy, src, dst = _per_name(strs(head["name"]), _copy_kinds)
        cols |= {"bytes": ints(args["bytes"]), "copyKind": copy, "srcKind": src, "dstKind": dst}
    elif kind == "memset":
        (mem,) = _per_name(strs(head["name"]), _memset_kind)
        cols |= {"bytes": ints(args["bytes"]), "memKind": mem}
    else:
        sync = [str(s or n).lower() for s, n in zip(texts(args["sync_kind"]).to_list(), head["name"], strict=True)]
        cols |= {"syncType": pl.Series([_SYNC_TYPE.get(s, 0) for s in sync], dtype=pl.Int64)}
        return cols
    return cols | {
        "external_id": _external(args), "queued_ns": ints(args["queued"]),
        "shared_memory_bytes": ints(args["shared_memory"]), "blocks_per_sm": floats(args["blocks_per_sm"]),
        "warps_per_sm": floats(args["warps_per_sm"]), "est_achieved_occupancy_pct": floats(args["occupancy"]),
        "bandwidth_gbps": floats(args["bandwidth"]), **_comms(args),
    }


def _comms(args: dict[str, tuple[Any, ...]]) -> dict[str, pl.Series]:
    return {
        "collective_name": texts(args["collective_name"]), "in_msg_nelems": ints(args["in_msg_nelems"]),
        "out_msg_nelems": ints(args["out_msg_nelems"]), "group_size": ints(args["group_size"]),
        "dtype": texts(args["dtype"]), "process_group_name": texts(args["pg_name"]),
        "process_group_desc": texts(args["pg_desc"]), "process_group_ranks": texts(args["pg_ranks"]),
    }


def _runtime(kind: str, head: dict[str, tuple[Any, ...]], args: dict[str, tuple[Any, ...]]) -> dict[str, Any]:
    start, end = _times(head)
    return {"start": start, "end": end, "pid": ints(head["pid"]), "tid": ints(head["tid"]),
            "correlationId": ints(args["correlation"]), "name": strs(head["name"], keep_none=True),
            "external_id": _external(args), "cbid": ints(args["cbid"])}


def _cpu_op(kind: str, head: dict[str, tuple[Any, ...]], args: dict[str, tuple[Any, ...]]) -> dict[str, Any]:
    start, end = _times(head)
    return {
        "category": strs(head["cat"]), "name": strs(head["name"]), "pid": ints(head["pid"]), "tid": ints(head["tid"]),
        "start_ns": start, "end_ns": end, "duration_ns": end - start, "external_id": _external(args),
        "record_function_id": ints(args["record_function_id"]), "ev_idx": ints(args["ev_idx"]),
        "sequence_number": ints(args["sequence_number"]), "fwd_thread_id": ints(args["fwd_thread_id"]),
        "input_dims": raw_texts(args["input_dims"]), "input_types": raw_texts(args["input_types"]),
        "input_strides": raw_texts(args["input_strides"]), "concrete_inputs": raw_texts(args["concrete_inputs"]),
        "call_stack": texts(args["call_stack"]), "module_hierarchy": texts(args["module_hierarchy"]), **_comms(args),
    }


def _memory(kind: str, head: dict[str, tuple[Any, ...]], args: dict[str, tuple[Any, ...]]) -> dict[str, Any]:
    start, _ = _times(head)
    addr = [as_int_wrapped(a) for a in args["addr"]]
    return {
        "pid": ints(head["pid"]), "tid": ints(head["tid"]), "start_ns": start,
        "device_type": ints(args["mem_device_type"]), "device_id": ints(args["mem_device_id"]),
        "address": pl.Series(addr, dtype=pl.Int64), "bytes": ints(args["mem_bytes"]),
        "total_allocated_bytes": ints(args["total_allocated"]), "total_reserved_bytes": ints(args["total_reserved"]),
    }


def as_int_wrapped(value: Any) -> int | None:
    """An address: :func:`~tracekit.kineto.parse.as_int`, past 2⁶³ wrapped to the negative
    Int64 of the same 64 bits."""
    a = as_int(value)
    return a if a is None or a < 2**63 else a - 2**64


def _gpu_annotation(kind: str, head: dict[str, tuple[Any, ...]], args: dict[str, tuple[Any, ...]]) -> dict[str, Any]:
    start, end = _times(head)
    return {"name": strs(head["name"]), "device_id": _or(ints(args["device"]), ints(head["pid"])),
            "stream_id": _or(ints(args["stream"]), ints(head["tid"])), "start_ns": start, "end_ns": end,
            "duration_ns": end - start, "external_id": _external(args)}


_STAGE: dict[str, Any] = {
    "kernel": _gpu, "memcpy": _gpu, "memset": _gpu, "sync": _gpu, "runtime": _runtime, "driver": _runtime,
    "cpu_op": _cpu_op, "annotation": _cpu_op, "python_function": _cpu_op, "memory": _memory,
    "gpu_annotation": _gpu_annotation,
}
