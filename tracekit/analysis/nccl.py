"""The NCCL calls table: one row per collective or point-to-point call per rank.

Three sources are combined (``docs/nccl.md``):

* **host ranges**: NCCL's NVTX ranges (domain ``NCCL``; in time-sliced exports without the
  domain-create row, ``nccl*`` ranges of an unnamed non-default domain): the API call, its
  host start/end and, with ``--include-blobs=true``, its payload (communicator, message size,
  reduction, peer, root) decoded by :mod:`tracekit.analysis.nccl_payloads`;
* **kernels**: ``nccl*`` kernels, tied to the range that launched them with nsys's rules
  (:func:`tracekit.analysis.attribution.launch_info`, then the innermost *NCCL* range that
  contains the launching call on its thread). Grouped calls (``ncclGroupStart`` … ``ncclGroupEnd``) launch at group
  end: the group's kernels are shared out to the calls of the group (one each when the counts
  agree, all of them otherwise);
* **kernel names**: op, algorithm, protocol, data type and reduction of every NCCL naming era
  (:func:`parse_kernel_name`).

A call without a kernel (GPU trace off, kernel outside the capture) keeps null GPU columns; a
kernel without a range (NVTX off, ``NCCL_NVTX_DISABLE=1``) becomes a row of its own with
``source == "kernel"`` and the op its name gives.
"""

from __future__ import annotations

import re
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

import polars as pl

from tracekit.analysis._frames import ColumnSource
from tracekit.analysis.attribution import launch_info
from tracekit.analysis.nccl_payloads import (
    PayloadSchemas,
    decode_payloads,
    payload_columns,
    read_payload_schemas,
)
from tracekit.analysis.op_launches import derived_source, launches_at, op_keys
from tracekit.analysis.ranks import choose_ranks, rank_candidates
from tracekit.nsys import schema as S
from tracekit.nsys.readers import lookup_strings

__all__ = [
    "NCCL_COLUMNS",
    "NCCL_KERNEL_PATTERN",
    "OP_OF_API",
    "build_nccl_calls",
    "comm_init_payloads",
    "is_nccl_kernel",
    "nccl_calls",
    "nccl_kernels",
    "nccl_ranges",
    "parse_kernel_name",
]

#: NCCL API range name → op.
OP_OF_API: dict[str, str] = {
    "ncclAllReduce": "AllReduce",
    "ncclAllGather": "AllGather",
    "ncclAllGatherV": "AllGather",
    "ncclReduceScatter": "ReduceScatter",
    "ncclBroadcast": "Broadcast",
    "ncclBcast": "Broadcast",
    "ncclReduce": "Reduce",
    "ncclSend": "Send",
    "ncclRecv": "Recv",
    "ncclAlltoAll": "AllToAll",
    "ncclAllToAll": "AllToAll",
    "ncclAlltoAllv": "AllToAllV",
    "ncclGather": "Gather",
    "ncclScatter": "Scatter",
}
GROUP_START = "ncclGroupStart"
GROUP_END = "ncclGroupEnd"
#: Communicator set-up calls whose payload gives (nranks, rank) of the process.
COMM_INIT_PATTERN = r"^ncclCommInit"

#: Kernel names counted as NCCL's own (RCCL and MSCCL use the same scheme).
NCCL_KERNEL_PATTERN = r"(?i)^(?:void\s+)?(?:nccl|rccl|msccl)"

#: Which kernel ops can serve which call ops (a p2p kernel serves the p2p-based collectives).
_KERNEL_SERVES: dict[str, tuple[str, ...]] = {
    "SendRecv": ("Send", "Recv", "AllToAll", "AllToAllV", "Gather", "Scatter"),
    "AllReduce": ("AllReduce",),
    "AllGather": ("AllGather",),
    "AllGatherV": ("AllGather",),
    "ReduceScatter": ("ReduceScatter",),
    "Broadcast": ("Broadcast",),
    "Reduce": ("Reduce",),
}

#: Columns of the table, in order (see ``docs/nccl.md``).
NCCL_COLUMNS: dict[str, pl.DataType | type[pl.DataType]] = {
    "rank": pl.Int64,
    "rank_source": pl.Utf8,
    "pid": pl.Int64,
    "tid": pl.Int64,
    "global_tid": pl.Int64,
    "call_index": pl.Int64,
    "op": pl.Utf8,
    "api": pl.Utf8,
    "source": pl.Utf8,
    "group_id": pl.Int64,
    "group_size": pl.Int64,
    "comm_id": pl.UInt64,
    "comm_rank": pl.Int64,
    "comm_nranks": pl.Int64,
    "nranks_source": pl.Utf8,
    "peer": pl.Int64,
    "root": pl.Int64,
    "bytes": pl.Int64,
    "size_source": pl.Utf8,
    "reduction": pl.Utf8,
    "reduction_source": pl.Utf8,
    "dtype": pl.Utf8,
    "algorithm": pl.Utf8,
    "protocol": pl.Utf8,
    "kernel_name": pl.Utf8,
    "naming_era": pl.Utf8,
    "host_start_ns": pl.Int64,
    "host_end_ns": pl.Int64,
    "host_duration_ns": pl.Int64,
    "launch_ns": pl.Int64,
    "gpu_start_ns": pl.Int64,
    "gpu_end_ns": pl.Int64,
    "gpu_duration_ns": pl.Int64,
    "kernel_count": pl.Int64,
    "device_id": pl.Int64,
    "stream_id": pl.Int64,
    "context_id": pl.Int64,
    "correlation_id": pl.Int64,
    "correlation_ids": pl.List(pl.Int64),
    "kernel_share": pl.Float64,
}

# -- kernel names -------------------------------------------------------------------------------
_TYPES = {
    "int8_t": "i8", "uint8_t": "u8", "int32_t": "i32", "uint32_t": "u32", "int64_t": "i64",
    "uint64_t": "u64", "half": "f16", "float": "f32", "double": "f64", "__nv_bfloat16": "bf16",
    "__nv_fp8_e4m3": "f8e4m3", "__nv_fp8_e5m2": "f8e5m2", "i8": "i8", "u8": "u8", "i32": "i32",
    "u32": "u32", "i64": "i64", "u64": "u64", "f16": "f16", "f32": "f32", "f64": "f64", "bf16": "bf16",
    "f8e4m3": "f8e4m3", "f8e5m2": "f8e5m2",
}
_REDUCTIONS = {
    "sum": "Sum", "prod": "Prod", "min": "Min", "max": "Max", "minmax": "MinMax", "avg": "Avg",
    "premulsum": "PreMulSum", "sumpostdiv": "SumPostDiv",
}
_COLLS = r"AllReduce|ReduceScatter|Reduce|AllGatherV|AllGather|Broadcast"
_DEV = re.compile(
    rf"^ncclDevKernel_(?P<coll>{_COLLS})(?:_(?P<op>Sum|Prod|MinMax|PreMulSum|SumPostDiv)_(?P<ty>[a-z0-9]+))?"
    r"_(?P<algo>[A-Z][A-Z_]*?)_(?P<proto>LL128|LL|SIMPLE)$"
)
_SYMK = re.compile(
    r"^ncclSym\w*?Kernel_(?P<coll>AllReduce|AllGather|ReduceScatter)_(?P<algo>.+?)"
    r"(?:_(?P<op>sum|avg)_(?P<ty>f32|f16|bf16|f8e4m3|f8e5m2))?(?:_profile)?$"
)
_K = re.compile(
    rf"^ncclKernel_(?P<coll>{_COLLS}|SendRecv)_(?P<algo>[A-Z][A-Z_]*?)_(?P<proto>LL128|LL|SIMPLE)"
    r"_(?P<op>Sum|Prod|Min|Max|MinMax|Avg|PreMulSum|SumPostDiv)_(?P<ty>\w+)$"
)
_LEGACY = re.compile(
    rf"^nccl(?P<coll>{_COLLS}|SendRecv|Send|Recv)(?P<algo>Ring|Tree|CollNet)?(?P<proto>LL128|LL|Simple)?Kernel"
    r"(?:_(?P<op>sum|prod|min|max|copy|avg|premulsum|sumpostdiv)_(?P<ty>[a-z0-9]+))?$"
)
_PARSED_FIELDS = ("kernel_op", "reduction", "dtype", "algorithm", "protocol", "naming_era")


def _base_name(name: str) -> str:
    base = name.strip()
    mangled = re.match(r"^_Z(\d+)", base)
    if mangled:  # Itanium-mangled free function: _Z<length><identifier><parameters>
        n = int(mangled.group(1))
        return base[mangled.end() : mangled.end() + n]
    base = base.removeprefix("void ")
    for stop in ("(", "<"):
        base = base.split(stop, 1)[0]
    return base.split("::")[-1].strip()


@lru_cache(maxsize=4096)
def parse_kernel_name(name: str | None) -> dict[str, str | None]:
    """Op, reduction, data type, algorithm, protocol and naming era of an NCCL kernel name.

    Eras (``naming_era``):

    ``ncclDevKernel`` (NCCL ≥ 2.19)
        ``ncclDevKernel_AllReduce_Sum_bf16_RING_LL``, ``ncclDevKernel_AllGather_RING_LL``,
        ``ncclDevKernel_SendRecv``, ``ncclDevKernel_Generic[_N]`` (no op in the name). NCCL
        builds one kernel per (collective, type) and dispatches the rest inside it, so the
        name gives the *specialisation*: reduction ``Sum`` and protocol ``LL`` also serve
        Prod/Min/Max and LL128/SIMPLE, algorithm is RING or TREE, signed integers appear as
        unsigned (``src/device/generate.py``, NCCL PR #2223).
    ``symmetric`` (NCCL ≥ 2.27)
        ``ncclSymkDevKernel_AllReduce_AGxLL_R_sum_bf16`` (algorithm = NCCL's symmetric
        kernel variant).
    ``ncclKernel`` (NCCL 2.8–2.18)
        ``ncclKernel_AllReduce_RING_LL_Sum_float``; SendRecv's ``RING_SIMPLE_Sum_int8_t`` is
        a placeholder and is dropped.
    ``legacy`` (NCCL < 2.8)
        ``ncclAllReduceRingLLKernel_sum_f32``.
    ``unknown``
        any other ``nccl*`` name.

    Returns a dict with ``kernel_op``, ``reduction``, ``dtype`` (``bf16``, ``f32``, ``i8`` …),
    ``algorithm``, ``protocol`` and ``naming_era`` (values None when the name does not say).
    """
    out: dict[str, str | None] = dict.fromkeys(_PARSED_FIELDS)
    if not name:
        return out
    base = _base_name(name)
    if base.startswith("ncclDevKernel_"):
        out["naming_era"] = "ncclDevKernel"
        rest = base.removeprefix("ncclDevKernel_")
        if rest == "SendRecv":
            out["kernel_op"] = "SendRecv"
        elif (m := _DEV.match(base)) is not None:
            out.update(kernel_op=m["coll"], algorithm=m["algo"], protocol=m["proto"],
                       reduction=m["op"], dtype=_TYPES.get(m["ty"] or "", m["ty"]))
        return out
    if (m := _SYMK.match(base)) is not None:
        out.update(naming_era="symmetric", kernel_op=m["coll"], algorithm=m["algo"],
                   reduction=_REDUCTIONS.get((m["op"] or "").lower()), dtype=m["ty"])
        return out
    if (m := _K.match(base)) is not None:
        out["naming_era"] = "ncclKernel"
        out["kernel_op"] = m["coll"]
        if m["coll"] != "SendRecv":
            out.update(algorithm=m["algo"], protocol=m["proto"], reduction=_REDUCTIONS.get(m["op"].lower()))
            if m["coll"] in ("AllReduce", "ReduceScatter", "Reduce"):
                out["dtype"] = _TYPES.get(m["ty"], m["ty"])
        return out
    if (m := _LEGACY.match(base)) is not None:
        coll = m["coll"]
        out.update(naming_era="legacy", kernel_op="SendRecv" if coll in ("Send", "Recv") else coll,
                   algorithm=(m["algo"] or "").upper() or None, protocol=(m["proto"] or "").upper() or None)
        if m["op"] and m["op"] != "copy":
            out["reduction"] = _REDUCTIONS.get(m["op"])
            out["dtype"] = _TYPES.get(m["ty"] or "", m["ty"])
        return out
    out["naming_era"] = "unknown"
    return out


def is_nccl_kernel(name: pl.Expr) -> pl.Expr:
    """Whether a kernel name (short or demangled) is an NCCL/RCCL kernel."""
    return name.str.contains(NCCL_KERNEL_PATTERN).fill_null(False)


def nccl_kernels(kernels: pl.DataFrame) -> pl.DataFrame:
    """NCCL kernels of a ``kernels`` table, with ``kernel_name`` (the base name) and the
    :func:`parse_kernel_name` columns."""
    name = pl.coalesce(pl.col("short_name"), pl.col("name")) if "short_name" in kernels.columns else pl.col("name")
    k = kernels.filter(is_nccl_kernel(name) | is_nccl_kernel(pl.col("name")))
    # the base name of each distinct name (a few), not one Python call per kernel
    bases = k.select(name.alias("_n")).unique().with_columns(
        pl.col("_n").map_elements(_base_name, return_dtype=pl.Utf8).alias("kernel_name"))
    k = k.with_columns(name.alias("_n")).join(bases, on="_n", how="left", maintain_order="left").drop("_n")
    names = k.select("kernel_name").unique()
    parsed = names.with_columns(
        pl.col("kernel_name")
        .map_elements(lambda n: parse_kernel_name(n), return_dtype=pl.Struct({f: pl.Utf8 for f in _PARSED_FIELDS}))
        .alias("_p")
    ).unnest("_p")
    return k.join(parsed, on="kernel_name", how="left", maintain_order="left")


# -- host ranges ----------------------------------------------------------------------------------
def nccl_ranges(nvtx: pl.DataFrame) -> pl.DataFrame:
    """NCCL's push/pop and start/end ranges of an ``nvtx`` table, in file order.

    A range is NCCL's when its domain is named ``NCCL``, or, in exports that lost the
    domain-create row (time slices), when its domain is unnamed and not the default one and
    its name starts with ``nccl``.
    """
    is_range = pl.col("event_type_id").is_in([59, 60, 70, 71])
    named = pl.col("domain") == "NCCL"
    unnamed = pl.col("domain").is_null() & (pl.col("domain_id").fill_null(0) != 0) & pl.col("name").str.starts_with("nccl")
    return nvtx.filter(is_range & (named.fill_null(False) | unnamed.fill_null(False)))


def _group_structure(ranges: pl.DataFrame) -> pl.DataFrame:
    """``_ridx``, ``group_id`` (the outermost ncclGroupStart/End pair each range belongs to)
    and ``_closes`` (a group end that launches the group)."""
    r = ranges.select("_ridx", "global_tid", "start_ns", "end_ns", "name").sort(
        ["global_tid", "start_ns", "end_ns"], descending=[False, False, True], nulls_last=True
    )
    gids: list[int | None] = []
    closes: list[bool] = []
    next_id = 0
    depth = 0
    cur: int | None = None
    prev_tid = None
    for tid, name in zip(r["global_tid"].to_list(), r["name"].to_list(), strict=True):
        if tid != prev_tid:
            depth, cur, prev_tid = 0, None, tid
        if name == GROUP_START:
            if depth == 0:
                cur, next_id = next_id, next_id + 1
            depth += 1
            gids.append(cur)
            closes.append(False)
        elif name == GROUP_END:
            if depth == 0:  # its ncclGroupStart was before the capture: a group of its own
                gids.append(next_id)
                next_id += 1
                closes.append(True)
                continue
            depth -= 1
            gids.append(cur)
            closes.append(depth == 0)
            if depth == 0:
                cur = None
        else:
            gids.append(cur if depth > 0 else None)
            closes.append(False)
    return pl.DataFrame(
        {"_ridx": r["_ridx"], "group_id": pl.Series(gids, dtype=pl.Int64), "_closes": pl.Series(closes, dtype=pl.Boolean)}
    )


# -- the table ------------------------------------------------------------------------------------
def nccl_calls(trace: Any) -> pl.DataFrame:
    """The NCCL calls table of an :class:`~tracekit.nsys.trace.NsysTrace` (``trace.nccl``).

    Pulls ``kernels``, ``cuda_api``, ``nvtx``, the payload schemas and the capture
    environment from the trace and calls :func:`build_nccl_calls`; see there for the columns.
    """
    # the NVTX columns the calls are built from (the whole table: 23 columns held by the trace),
    # of NCCL's ranges only (build_nccl_calls looks at no other row: the rest is let go here)
    loaded = getattr(trace, "is_loaded", lambda _name: True)
    nvtx = [nccl_ranges(trace.nvtx if loaded("nvtx") else trace.table("nvtx", _NVTX_COLUMNS))]
    has_payload = "binary_data" in nvtx[0].columns and nvtx[0]["binary_data"].null_count() < nvtx[0].height
    schemas = read_payload_schemas(trace.db) if has_payload else PayloadSchemas()
    meta = trace.meta
    cuda_api, devices = _nccl_api(trace)
    # the kernels and NVTX rows are handed over, not kept here: build_nccl_calls lets go of
    # them once it has what it needs of them
    return build_nccl_calls(
        _nccl_kernels(trace),
        cuda_api,
        nvtx.pop(),
        schemas,
        environments=[p.environment for p in meta.processes],
        file_name=Path(trace.path).name,
        process_devices=devices,
    )


#: The ``nvtx`` columns :func:`build_nccl_calls` reads (:func:`nccl_ranges`, the payloads, the calls).
_NVTX_COLUMNS = ("start_ns", "end_ns", "event_type_id", "global_tid", "end_global_tid", "pid", "tid",
                 "domain_id", "domain", "name", "binary_data")

#: The kernel and CUDA API columns :func:`build_nccl_calls` reads.
_KERNEL_COLUMNS = ("pid", "global_pid", "device_id", "context_id", "stream_id", "correlation_id",
                   "start_ns", "end_ns", "duration_ns", "name", "short_name")
_API_COLUMNS = ("pid", "tid", "global_tid", "start_ns", "end_ns", "duration_ns", "name", "api", "correlation_id")
#: The launch columns :func:`_attach_ranges` needs (``launch_info``'s, less ``api_name``).
_LAUNCH = ("tid", "global_tid", "api_start_ns", "api_end_ns")


def _whole(trace: Any) -> bool:
    """Whether :func:`nccl_calls` reads the trace's whole tables (it holds its kernels, or is
    no export)."""
    return not hasattr(trace, "scan") or trace.is_loaded("kernels")


def _nccl_kernels(trace: Any) -> pl.DataFrame:
    """The kernels for :func:`build_nccl_calls`: the trace's table when it holds it; else
    only its NCCL kernels (filtered as they are read), so that a big trace is never held
    whole for a few NCCL rows."""
    return trace.kernels if _whole(trace) else _nccl_kernel_rows(trace)


def _nccl_api(trace: Any) -> tuple[Any, pl.DataFrame | None]:
    """``(cuda_api, process_devices)`` for :func:`build_nccl_calls`: the trace's API table
    and ``None`` when it holds its kernels; else the API columns one at a time
    (:meth:`~tracekit.nsys.trace.NsysTrace.columns_on_demand`) and each process's lowest device."""
    if _whole(trace):
        return trace.cuda_api, None
    devices = trace.table("kernels", ["pid", "device_id"]).group_by("pid").agg(pl.col("device_id").min())
    cuda_api = trace.cuda_api if trace.is_loaded("cuda_api") else trace.columns_on_demand("cuda_api", list(_API_COLUMNS))
    return cuda_api, devices


def _nccl_kernel_rows(trace: Any) -> pl.DataFrame:
    """:data:`_KERNEL_COLUMNS` of the NCCL kernels of a trace that does not hold its kernel
    table, in table order. From the column cache the name ids are read, the distinct ones
    looked up and tested, and the other columns gathered at the NCCL rows only (a million
    kernels: ~80 MB less than filtering a scan of the 11 columns); else that scan."""
    src = trace.columns_on_demand("kernels", [*_KERNEL_COLUMNS, "name_id", "short_name_id"])
    if not src.one_at_a_time or not {"name_id", "short_name_id"} <= set(src.columns):
        name = pl.coalesce(pl.col("short_name"), pl.col("name"))
        return (
            trace.scan("kernels")
            .select(_KERNEL_COLUMNS)
            .filter(is_nccl_kernel(name) | is_nccl_kernel(pl.col("name")))
            .collect()
        )
    # is_nccl_kernel(coalesce(short_name, name)) | is_nccl_kernel(name) is, row by row,
    # is_nccl_kernel(short_name) | is_nccl_kernel(name) (a null name is no NCCL kernel)
    hit: pl.Series | None = None
    for col in ("short_name_id", "name_id"):
        ids = src[col]
        texts = ids.drop_nulls().unique().to_frame("id").with_columns(lookup_strings(pl.col("id"), trace.strings).alias("text"))
        nccl_ids = texts.filter(is_nccl_kernel(pl.col("text")))["id"]
        mine = ids.is_in(nccl_ids.implode()).fill_null(False)
        hit = mine if hit is None else hit | mine
    src.release()
    rows = hit.arg_true().cast(pl.UInt32) if hit is not None else pl.Series([], dtype=pl.UInt32)
    del hit
    if rows.len() == 0:
        return S.empty("kernels", list(_KERNEL_COLUMNS))
    frame = pl.DataFrame(src.gather_columns(list(_KERNEL_COLUMNS), rows))
    if derived_source(trace) is None:
        return frame
    # their launching calls from the launch join kept in the column cache (no API column read
    # when it is there; computed and kept for every operation when not)
    launched = launches_at(trace, partial(op_keys, trace, src), rows)
    return frame if launched is None else pl.concat([frame, launched], how="horizontal")


def comm_init_payloads(trace: Any) -> pl.DataFrame:
    """Decoded ``ncclCommInitRank*`` payloads captured in a trace: ``pid``, ``comm_id``,
    ``comm_nranks``, ``comm_rank`` (empty when the set-up was outside the capture)."""
    ranges = nccl_ranges(trace.nvtx).filter(pl.col("name").str.contains(COMM_INIT_PATTERN))
    if ranges.height == 0:
        return pl.DataFrame(schema={"pid": pl.Int64, "comm_id": pl.UInt64, "comm_nranks": pl.Int64, "comm_rank": pl.Int64})
    return decode_payloads(ranges, read_payload_schemas(trace.db)).select("pid", "comm_id", "comm_nranks", "comm_rank")


def build_nccl_calls(
    kernels: pl.DataFrame,
    cuda_api: pl.DataFrame | ColumnSource,
    nvtx: pl.DataFrame,
    schemas: PayloadSchemas | None = None,
    *,
    environments: list[dict[str, str]] | tuple[dict[str, str], ...] = (),
    file_name: str | None = None,
    process_devices: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """One row per NCCL collective or point-to-point call per rank.

    Parameters
    ----------
    kernels, cuda_api, nvtx
        The tables of one report (``nvtx`` in file order: whole, or at least NCCL's ranges,
        :func:`nccl_ranges`).
    schemas
        Payload schemas (:func:`tracekit.analysis.nccl_payloads.read_payload_schemas`); None
        or empty when the export has none.
    environments, file_name
        Capture environment(s) and report file name, for the rank (:mod:`.ranks`).
    process_devices
        ``pid``, ``device_id``: the lowest device each process ran kernels on (for the rank
        order). When given, ``kernels`` may hold only the NCCL kernels (``cuda_api`` may then
        also be a column source, see :func:`~tracekit.analysis.attribution.launch_info`);
        otherwise it is computed from ``kernels``. ``kernels`` that carry their launching
        call's ``tid``, ``global_tid``, ``api_start_ns`` and ``api_end_ns`` already (as
        ``launch_info`` adds them) are not joined to ``cuda_api`` again.

    Returns
    -------
    A frame with :data:`NCCL_COLUMNS` (``docs/nccl.md`` lists them with units), one row per
    call in (rank, host time) order:

    * identity: ``rank`` and ``rank_source`` (see :mod:`tracekit.analysis.ranks`), ``pid``,
      ``tid``, ``global_tid`` (calling thread), ``call_index`` (0-based per process);
    * what: ``op`` (AllReduce, AllGather, ReduceScatter, Broadcast, Reduce, Send, Recv,
      AllToAll …; kernel-only rows: the kernel's op, ``SendRecv`` for p2p), ``api``
      (``ncclAllReduce`` …; null for kernel-only rows), ``source`` (``"nvtx+kernel"``,
      ``"nvtx"``, ``"kernel"``), ``group_id`` and ``group_size`` (calls of the same
      ``ncclGroupStart/End``; null outside groups);
    * payload: ``comm_id`` (NCCL's communicator hash), ``comm_rank`` and ``comm_nranks`` with
      ``nranks_source`` (``"payload"`` from an ``ncclCommInitRank`` in the capture,
      ``"inferred"`` = processes of this report using the communicator when more than one,
      ``"unknown"``), ``peer``, ``root``, ``bytes`` with ``size_source`` (``"payload"`` or
      ``"unknown"``), ``reduction`` with ``reduction_source`` (``"payload"``,
      ``"kernel_name"``, ``"unknown"``);
    * kernel name: ``dtype``, ``algorithm``, ``protocol``, ``kernel_name``, ``naming_era``
      (see :func:`parse_kernel_name` for what each era's names mean);
    * times (Int64 ns, capture timeline): ``host_start_ns``, ``host_end_ns``,
      ``host_duration_ns`` (the NVTX range; for kernel-only rows the launch call),
      ``launch_ns`` (start of the launching CUDA call; for grouped calls it lies inside
      ``ncclGroupEnd``), ``gpu_start_ns``, ``gpu_end_ns``, ``gpu_duration_ns`` (first kernel
      start to last kernel end), ``kernel_count``;
    * device: ``device_id``, ``stream_id``, ``context_id``, ``correlation_id`` (first kernel)
      and ``correlation_ids`` (all kernels).
    """
    schemas = schemas or PayloadSchemas()
    ranges = nccl_ranges(nvtx).with_row_index("_ridx").with_columns(pl.col("_ridx").cast(pl.Int64))
    del nvtx  # when the caller let go of it (nccl_calls does)
    ranges = decode_payloads(ranges, schemas)
    # the columns the steps below and the table read; the NVTX rows' others (texts, payload
    # blobs, categories) would ride along to the last step (~0.4 KB a call)
    ranges = ranges.select(c for c in ranges.columns if c in _RANGE_COLUMNS or c in NCCL_COLUMNS)
    groups = _group_structure(ranges)
    ranges = ranges.join(groups, on="_ridx", how="left", maintain_order="left")
    ranges = ranges.with_columns(
        pl.col("name").replace_strict(OP_OF_API, default=None, return_dtype=pl.Utf8).alias("op")
    )
    calls = ranges.filter(pl.col("op").is_not_null())
    inits = ranges.filter(pl.col("name").str.contains(COMM_INIT_PATTERN)).select(
        "pid", "comm_id", "comm_nranks", "comm_rank"
    )
    # what _attach_ranges and _assign_kernels read of every range (the calls keep the payload)
    ranges = ranges.select("_ridx", "name", "op", "group_id", "global_tid", "start_ns", "end_ns", "end_global_tid")
    devices = process_devices if process_devices is not None else kernels.group_by("pid").agg(pl.col("device_id").min())

    # the kernels' names are not read past their base name and its parts (long texts, one per kernel)
    kern = nccl_kernels(kernels).drop("name", "short_name", strict=False)
    del kernels  # when the caller let go of it (nccl_calls does)
    kern = kern.with_row_index("_kidx").with_columns(pl.col("_kidx").cast(pl.Int64))
    kern = _attach_ranges(kern, cuda_api, ranges)
    pairs, orphans = _assign_kernels(kern, calls, ranges)
    del ranges  # each step lets go of what it no longer needs: a million-kernel trace's
    rows = _call_rows(calls, pairs, kern)  # intermediates summed to ~0.3 GB at the end
    del calls, pairs, kern
    if orphans.height:
        rows = pl.concat([rows, _kernel_rows(orphans)], how="diagonal_relaxed")
    del orphans
    rows = _with_sources(rows)
    rows = _with_comm_info(rows, inits)
    held = [_with_ranks(rows, devices, inits, environments, file_name)]
    del rows
    return _finish(held)  # handed over: _finish lets go of each column once sorted


#: Range columns :func:`build_nccl_calls` reads besides those of :data:`NCCL_COLUMNS`.
_RANGE_COLUMNS = frozenset({"_ridx", "name", "start_ns", "end_ns", "global_tid", "end_global_tid", *payload_columns()})


def _attach_ranges(kern: pl.DataFrame, cuda_api: pl.DataFrame | ColumnSource, ranges: pl.DataFrame) -> pl.DataFrame:
    """Add the launching call (:func:`~tracekit.analysis.attribution.launch_info`) and
    ``_ridx``, the innermost NCCL range on the launching thread that contains the call.

    nsys's containment rule (same thread, range start ≤ call start, range end ≥ call end,
    innermost = latest start) restricted to NCCL's ranges: an as-of join on the call start
    finds the latest NCCL range that began before it; the few calls that range does not
    contain (nested NCCL ranges) are resolved exactly.
    """
    if kern.height == 0:
        return kern.with_columns(
            pl.lit(None, pl.Int64).alias(c) for c in ("tid", "global_tid", "api_start_ns", "api_end_ns", "_ridx")
        ).with_columns(pl.lit(None, pl.Utf8).alias("api_name"))
    # launch columns already there: from the kept launch join (_nccl_kernel_rows)
    k = kern if all(c in kern.columns for c in _LAUNCH) else launch_info(kern, cuda_api)
    if ranges.height == 0:
        return k.with_columns(pl.lit(None, pl.Int64).alias("_ridx"))
    last = pl.max_horizontal(pl.col("start_ns").max(), pl.col("end_ns").max())
    r = ranges.filter(pl.col("end_global_tid").is_null()).select(
        "global_tid", pl.col("start_ns").alias("_rs"), pl.col("end_ns").fill_null(last).alias("_re"), "_ridx"
    )
    calls = k.select("_kidx", "global_tid", "api_start_ns", "api_end_ns").filter(pl.col("api_start_ns").is_not_null())
    near = calls.sort("global_tid", "api_start_ns").join_asof(
        r.sort("global_tid", "_rs"), left_on="api_start_ns", right_on="_rs", by="global_tid",
        strategy="backward", check_sortedness=False,
    )
    ok = near.filter(pl.col("_re") >= pl.col("api_end_ns")).select("_kidx", "_ridx")
    rest = near.filter(pl.col("_ridx").is_not_null() & (pl.col("_re") < pl.col("api_end_ns"))).select(
        "_kidx", "global_tid", "api_start_ns", "api_end_ns"
    )
    if rest.height:
        exact = (
            rest.join(r, on="global_tid")
            .filter((pl.col("_rs") <= pl.col("api_start_ns")) & (pl.col("_re") >= pl.col("api_end_ns")))
            .sort(["_kidx", "_rs", "_ridx"], descending=[False, True, True])
            .unique(subset=["_kidx"], keep="first")
            .select("_kidx", "_ridx")
        )
        ok = pl.concat([ok, exact])
    return k.join(ok, on="_kidx", how="left", maintain_order="left")


def _op_serves(kernel_op: pl.Expr, call_op: pl.Expr) -> pl.Expr:
    expr = pl.lit(False)
    for kop, serves in _KERNEL_SERVES.items():
        expr = expr | ((kernel_op == kop) & call_op.is_in(list(serves)))
    return expr.fill_null(False)


def _assign_kernels(kern: pl.DataFrame, calls: pl.DataFrame, ranges: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Pairs (``_ridx`` of the call, ``_kidx``) and the kernels left without a call."""
    empty = pl.DataFrame(schema={"_ridx": pl.Int64, "_kidx": pl.Int64})
    if kern.height == 0:
        return empty, kern
    info = ranges.select(pl.col("_ridx").alias("_target"), pl.col("name").alias("_tname"), pl.col("op").alias("_top"),
                         pl.col("group_id").alias("_tgroup"))
    k = kern.join(info, left_on="_ridx", right_on="_target", how="left", maintain_order="left")
    direct = k.filter(pl.col("_top").is_not_null()).select(pl.col("_ridx"), "_kidx")
    at_end = k.filter((pl.col("_tname") == GROUP_END) & pl.col("_tgroup").is_not_null()).select(
        "_kidx", pl.col("_tgroup").alias("group_id"), "kernel_op", "start_ns"
    )
    members = calls.filter(pl.col("group_id").is_not_null()).select("_ridx", "group_id", "op", "start_ns")
    grouped = [empty]
    if at_end.height and members.height:
        cand = at_end.join(members, on="group_id", suffix="_call")
        ok = cand.with_columns(_op_serves(pl.col("kernel_op"), pl.col("op")).alias("_ok"))
        # kernels that serve some call of their group only pair with those calls
        any_ok = ok.group_by("_kidx").agg(pl.col("_ok").any().alias("_any"))
        ok = ok.join(any_ok, on="_kidx").filter(pl.col("_ok") | ~pl.col("_any"))
        ok = ok.with_columns(pl.col("_ok").alias("_class"))
        nk = pl.col("_kidx").n_unique().over("group_id", "_class")
        nc = pl.col("_ridx").n_unique().over("group_id", "_class")
        ok = ok.with_columns((nk == nc).alias("_one_each"))
        one = ok.filter(pl.col("_one_each"))
        if one.height:
            kord = pl.col("start_ns").rank("ordinal").over("group_id", "_class", "_ridx")
            cord = pl.col("start_ns_call").rank("ordinal").over("group_id", "_class", "_kidx")
            one = one.filter(kord == cord)
        grouped.append(one.select("_ridx", "_kidx"))
        grouped.append(ok.filter(~pl.col("_one_each")).select("_ridx", "_kidx"))
    pairs = pl.concat([direct, *grouped]).unique()
    orphans = k.join(pairs.select("_kidx").unique(), on="_kidx", how="anti").drop(
        "_tname", "_top", "_tgroup"
    )
    return pairs, orphans


def _call_rows(calls: pl.DataFrame, pairs: pl.DataFrame, kern: pl.DataFrame) -> pl.DataFrame:
    kcols = kern.select(
        "_kidx", pl.col("start_ns").alias("_ks"), pl.col("end_ns").alias("_ke"), pl.col("device_id").alias("_dev"),
        pl.col("stream_id").alias("_stream"), pl.col("context_id").alias("_ctx"), pl.col("correlation_id").alias("_corr"),
        pl.col("kernel_name").alias("_kname"), "kernel_op", pl.col("reduction").alias("_kred"), "dtype", "algorithm",
        "protocol", "naming_era", pl.col("api_start_ns").alias("_launch"),
    )
    joined = pairs.join(kcols, on="_kidx").sort("_ks")
    del kcols
    agg = joined.group_by("_ridx").agg(
        pl.col("_ks").min().alias("gpu_start_ns"),
        pl.col("_ke").max().alias("gpu_end_ns"),
        pl.len().cast(pl.Int64).alias("kernel_count"),
        pl.col("_dev").first().alias("device_id"),
        pl.col("_stream").first().alias("stream_id"),
        pl.col("_ctx").first().alias("context_id"),
        pl.col("_corr").first().alias("correlation_id"),
        pl.col("_corr").alias("correlation_ids"),
        pl.col("_kname").first().alias("kernel_name"),
        pl.col("_kred").first().alias("_kred"),
        pl.col("dtype").first(),
        pl.col("algorithm").first(),
        pl.col("protocol").first(),
        pl.col("naming_era").first(),
        pl.col("_launch").min().alias("launch_ns"),
    )
    del joined
    size = calls.filter(pl.col("group_id").is_not_null()).group_by("group_id").agg(pl.len().cast(pl.Int64).alias("group_size"))
    out = calls.join(agg, on="_ridx", how="left", maintain_order="left").join(size, on="group_id", how="left", maintain_order="left")
    return out.with_columns(
        pl.col("name").alias("api"),
        pl.col("start_ns").alias("host_start_ns"),
        pl.col("end_ns").alias("host_end_ns"),
        pl.col("kernel_count").fill_null(0),
    )


def _kernel_rows(orphans: pl.DataFrame) -> pl.DataFrame:
    """Rows for NCCL kernels that no NCCL range claims."""
    return orphans.select(
        "pid", "tid", "global_tid",
        pl.coalesce(pl.col("kernel_op"), pl.lit("unknown")).alias("op"),
        pl.lit(None, pl.Utf8).alias("api"),
        pl.col("api_start_ns").alias("host_start_ns"),
        pl.col("api_end_ns").alias("host_end_ns"),
        pl.col("api_start_ns").alias("launch_ns"),
        pl.col("start_ns").alias("gpu_start_ns"),
        pl.col("end_ns").alias("gpu_end_ns"),
        pl.lit(1, pl.Int64).alias("kernel_count"),
        "device_id", "stream_id", "context_id", "correlation_id",
        pl.concat_list(pl.col("correlation_id")).alias("correlation_ids"),
        "kernel_name", pl.col("reduction").alias("_kred"), "dtype", "algorithm", "protocol", "naming_era",
    )


def _with_sources(rows: pl.DataFrame) -> pl.DataFrame:
    for col, dtype in (("reduction", pl.Utf8), ("bytes", pl.Int64), ("group_id", pl.Int64), ("group_size", pl.Int64)):
        if col not in rows.columns:
            rows = rows.with_columns(pl.lit(None, dtype).alias(col))
    has_kernel = pl.col("kernel_count") > 0
    return rows.with_columns(
        pl.when(pl.col("api").is_null()).then(pl.lit("kernel"))
        .when(has_kernel).then(pl.lit("nvtx+kernel"))
        .otherwise(pl.lit("nvtx")).alias("source"),
        pl.when(pl.col("bytes").is_not_null()).then(pl.lit("payload")).otherwise(pl.lit("unknown")).alias("size_source"),
        pl.when(pl.col("reduction").is_not_null()).then(pl.lit("payload"))
        .when(pl.col("_kred").is_not_null()).then(pl.lit("kernel_name"))
        .otherwise(pl.lit("unknown")).alias("reduction_source"),
        pl.coalesce(pl.col("reduction"), pl.col("_kred")).alias("reduction"),
        (pl.col("host_end_ns") - pl.col("host_start_ns")).alias("host_duration_ns"),
        (pl.col("gpu_end_ns") - pl.col("gpu_start_ns")).alias("gpu_duration_ns"),
    )


def _with_comm_info(rows: pl.DataFrame, inits: pl.DataFrame) -> pl.DataFrame:
    """``comm_rank``/``comm_nranks`` from captured communicator set-ups, else the number of
    processes of this report that use the communicator (when more than one)."""
    for col in ("comm_id", "comm_rank", "comm_nranks"):
        if col not in rows.columns:
            rows = rows.with_columns(pl.lit(None, NCCL_COLUMNS[col]).alias(col))
    init = (
        inits.filter(pl.col("comm_id").is_not_null())
        .unique(subset=["pid", "comm_id"], keep="last", maintain_order=True)
        .select("pid", "comm_id", pl.col("comm_nranks").alias("_init_n"), pl.col("comm_rank").alias("_init_r"))
    )
    rows = rows.join(init, on=["pid", "comm_id"], how="left", maintain_order="left")
    seen = pl.col("pid").n_unique().over("comm_id")
    inferred = pl.when(pl.col("comm_id").is_not_null() & (seen > 1)).then(seen.cast(pl.Int64))
    return rows.with_columns(
        pl.coalesce(pl.col("comm_rank"), pl.col("_init_r")).alias("comm_rank"),
        pl.coalesce(pl.col("comm_nranks"), pl.col("_init_n"), inferred).alias("comm_nranks"),
        pl.when(pl.col("comm_nranks").is_not_null() | pl.col("_init_n").is_not_null()).then(pl.lit("payload"))
        .when(inferred.is_not_null()).then(pl.lit("inferred"))
        .otherwise(pl.lit("unknown")).alias("nranks_source"),
    ).drop("_init_n", "_init_r")


def _with_ranks(
    rows: pl.DataFrame,
    devices: pl.DataFrame,
    inits: pl.DataFrame,
    environments: Any,
    file_name: str | None,
) -> pl.DataFrame:
    pids = rows.select("pid").drop_nulls().unique()
    procs = pids.join(devices, on="pid", how="left")
    if procs.height == 0:
        return rows.with_columns(pl.lit(None, pl.Int64).alias("rank"), pl.lit(None, pl.Utf8).alias("rank_source"))
    cands = rank_candidates(procs, inits.drop_nulls(["pid"]), environments=list(environments), file_name=file_name)
    chosen, _ = choose_ranks(cands)
    return rows.join(chosen.select("pid", "rank", "rank_source"), on="pid", how="left", maintain_order="left")


def _sorted_by_column(held: list[pl.DataFrame], by: list[str]) -> pl.DataFrame:
    """``rows.sort(by, nulls_last=True)`` (the same order) of the frame ``held`` holds (taken
    out of it: the caller hands it over), its columns gathered one at a time, each source
    column let go once gathered: one column held twice at a moment, not the whole table
    (150 k calls × 40 columns: 45 MB)."""
    rows = held.pop()
    order = rows.select(pl.arg_sort_by(by, nulls_last=True)).to_series()
    names = rows.columns
    columns = dict(zip(names, rows.get_columns(), strict=True))
    del rows
    out = []
    for name in names:
        out.append(columns.pop(name).gather(order))
    return pl.DataFrame(out)


def _finish(held: list[pl.DataFrame]) -> pl.DataFrame:
    """The calls table from the rows ``held`` holds (taken out of it: the caller hands them over)."""
    rows = held.pop()
    order = pl.coalesce(pl.col("host_start_ns"), pl.col("gpu_start_ns"))
    # the table's columns only, before the sort copies every column
    held.append(rows.select(*(c for c in rows.columns if c in NCCL_COLUMNS), order.alias("_t")))
    del rows
    rows = _sorted_by_column(held, ["rank", "pid", "_t", "gpu_start_ns"])
    rows = rows.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).over("pid").alias("call_index"))
    if "correlation_ids" in rows.columns:
        # grouped point-to-point calls (several ncclSend/ncclRecv in one ncclGroupEnd) share their
        # kernels: each call gets 1/n of them, so that Σ gpu_duration_ns × kernel_share is the
        # kernel time, counted once
        key = pl.col("correlation_ids").list.sort().cast(pl.List(pl.Utf8)).list.join(",")
        has = pl.col("correlation_ids").list.len() > 0
        rows = rows.with_columns(
            pl.when(has).then(1.0 / pl.len().over("pid", key)).alias("kernel_share")
        )
    exprs = []
    for name, dtype in NCCL_COLUMNS.items():
        if name in rows.columns:
            exprs.append(pl.col(name).cast(dtype, strict=False))
        else:
            exprs.append(pl.lit(None, dtype=dtype).alias(name))
    return rows.select(exprs)


def _register() -> None:
    """Make ``trace.nccl`` this module's :func:`nccl_calls` (the loader knows no analyses)."""
    from tracekit.nsys.trace import DERIVED_TABLES

    DERIVED_TABLES["nccl"] = nccl_calls


_register()
