"""``KinetoTrace``: a PyTorch profiler trace as an :class:`~tracekit.nsys.trace.NsysTrace` (the
nsys-shaped folder it was converted into) plus the tables only Kineto has."""

from __future__ import annotations

import json
import shutil
import weakref
from functools import cached_property
from pathlib import Path
from typing import Any

import polars as pl

from tracekit.kineto import convert as C
from tracekit.nsys.meta import CapturedProcess, TraceMeta
from tracekit.nsys.trace import NsysTrace

#: c10 scalar type names (lower-cased) → bytes per element.
_DTYPE_BYTES = {
    "float": 4, "double": 8, "half": 2, "bfloat16": 2, "long": 8, "int": 4, "short": 2, "char": 1, "byte": 1,
    "bool": 1, "complexfloat": 8, "complexdouble": 16, "complexhalf": 4, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "uint16": 2, "uint32": 4, "uint64": 8,
}


class KinetoTrace(NsysTrace):
    """A ``torch.profiler`` (Kineto) trace, ``*.pt.trace.json`` or ``.json.gz``.

    The trace is converted once into a folder shaped like nsys's ``parquetdir`` export (cached;
    :func:`tracekit.kineto.convert.converted_folder`), so every table, analysis and report of
    :class:`NsysTrace` reads it; columns Kineto does not record are null (``docs/kineto.md``).
    Tables only Kineto has: :attr:`cpu_ops`, :attr:`memory_events`, :attr:`flows`,
    :attr:`gpu_annotations`, :attr:`gpu_args`, :attr:`distributed_info`,
    :attr:`device_properties`.

    Parameters
    ----------
    path
        The trace file. It is only read.
    source
        Kept for the interface of :class:`NsysTrace` (defaults to ``path``).

    Examples
    --------
    >>> import tracekit
    >>> trace = tracekit.open("sample_traces/kineto/vit_2rank/rank-0.json.gz")  # doctest: +SKIP
    >>> trace.cpu_ops.filter(pl.col("name") == "aten::mm").select("duration_ns").sum()  # doctest: +SKIP
    """

    profiler = "torch.profiler"

    def __init__(self, path: str | Path, *, source: Path | None = None, **_options: Any) -> None:
        trace_file = Path(path)
        folder, temporary = C.converted_folder(trace_file)
        if temporary is not None:
            self._cleanup = weakref.finalize(self, shutil.rmtree, temporary, True)
        super().__init__(folder, source=source or trace_file)
        #: The converted folder (nsys ``parquetdir`` shape) the tables are read from.
        self.folder = folder
        self.path = trace_file
        self.meta.path = trace_file

    def __repr__(self) -> str:
        return f"KinetoTrace({str(self.path)!r})"

    def __enter__(self) -> KinetoTrace:
        return self

    @cached_property
    def meta(self) -> TraceMeta:
        """As :attr:`NsysTrace.meta`; ``processes`` holds one entry whose environment carries
        ``distributedInfo``'s rank and world size as ``RANK``/``WORLD_SIZE`` (as torchrun sets
        them), which is how :func:`tracekit.open_many` tells the ranks apart."""
        meta = super().meta
        info = self.distributed_info
        if info.height:
            env = {}
            if info["rank"][0] is not None:
                env["RANK"] = str(info["rank"][0])
            if info["world_size"][0] is not None:
                env["WORLD_SIZE"] = str(info["world_size"][0])
            if env:
                meta.processes = [CapturedProcess(command=[], environment=env)]
        return meta

    def _kineto_table(self, name: str, schema: dict[str, Any]) -> pl.DataFrame:
        if not self.db.has_table(name):
            return pl.DataFrame(schema=schema)
        return self.db.scan(name).collect()  # type: ignore[attr-defined]

    @cached_property
    def cpu_ops(self) -> pl.DataFrame:
        """CPU events: aten operators (``category`` ``cpu_op``), ``record_function`` /
        ``ProfilerStep#N`` annotations (``user_annotation``, also in :attr:`nvtx`) and, with
        ``with_stack=True``, Python functions (``python_function``); shapes, types, strides and
        concrete inputs are Kineto's JSON text (``record_shapes=True``). Sorted by start."""
        return self._kineto_table("KINETO_CPU_OPS", C.CPU_OPS_SCHEMA)

    @cached_property
    def memory_events(self) -> pl.DataFrame:
        """The ``[memory]`` events (``profile_memory=True``): one per allocation (``bytes`` > 0)
        or free (< 0) of PyTorch's allocators, with the totals after it; ``device_type`` is
        c10's (0 CPU, 1 CUDA), ``device_id`` -1 for the CPU."""
        return self._kineto_table("KINETO_MEMORY_EVENTS", C.MEMORY_SCHEMA)

    @cached_property
    def memory_usage(self) -> pl.DataFrame:
        """:attr:`memory_events` in the columns of nsys's ``memory_usage``, so that every
        memory analysis reads them (:func:`~tracekit.analysis.memory.memory_timeline`,
        ``memory_peak``, ``layer_memory``, the report, the ``memory_growth`` rule).

        What they count differs from an nsys capture's: these are PyTorch's allocator handing
        out and taking back tensors' blocks (``torch.cuda.memory_allocated()``), where nsys's
        ``--cuda-memory-usage`` sees the driver's allocations (the allocator's segments, which it
        keeps cached). CUDA events are ``mem_kind`` ``"Device"``, the CPU allocator's
        ``"Pageable"`` (host memory: left out of the device analyses); ``operation`` is
        ``"alloc"`` or ``"free"`` and ``bytes`` the block's size. Stream, context and
        correlation are not recorded by Kineto (null). Empty without ``profile_memory=True``."""
        from tracekit.nsys import schema as S

        ev = self.memory_events
        if ev.height == 0:
            return S.empty("memory_usage")
        kind = (pl.when(pl.col("device_type") == 1).then(pl.lit("Device"))
                .when(pl.col("device_type") == 0).then(pl.lit("Pageable")).otherwise(pl.lit("Unknown")))
        out = ev.select(
            "pid", C._global_tid("pid", pl.lit(0, pl.Int64)).alias("global_pid"),
            pl.when(pl.col("device_type") == 0).then(None).otherwise(pl.col("device_id")).alias("device_id"),
            pl.lit(None, pl.Int64).alias("context_id"), pl.lit(None, pl.Int64).alias("stream_id"),
            pl.lit(None, pl.Int64).alias("correlation_id"), "start_ns", "address", pl.col("bytes").abs().alias("bytes"),
            kind.alias("mem_kind"), pl.when(pl.col("bytes") < 0).then(pl.lit("free")).otherwise(pl.lit("alloc")).alias("operation"),
            pl.lit("PyTorch allocator").alias("name"),
        )
        return S.conform(out, "memory_usage")

    @cached_property
    def gpu_annotations(self) -> pl.DataFrame:
        """``gpu_user_annotation`` events: a ``record_function`` range as the GPU ran it (the
        span of its kernels on one stream)."""
        return self._kineto_table("KINETO_GPU_ANNOTATIONS", {
            "name": pl.Utf8, "device_id": pl.Int64, "stream_id": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64,
            "duration_ns": pl.Int64, "external_id": pl.Int64})

    @cached_property
    def gpu_args(self) -> pl.DataFrame:
        """Arguments of kernels, copies and memsets that the nsys tables have no column for:
        ``shared_memory_bytes`` (static + dynamic), blocks and warps per SM, estimated occupancy,
        copy bandwidth, and on NCCL kernels the collective's name, element counts and process
        group (recent PyTorch). Join on ``correlation_id`` (and ``device_id``)."""
        return self._kineto_table("KINETO_GPU_ARGS", C.GPU_ARGS_SCHEMA)

    @cached_property
    def operators(self) -> pl.DataFrame:
        """Every CPU operator that launched kernels, with their GPU time, its shapes, FLOPs,
        bytes, achieved TFLOP/s and TB/s and a roofline verdict against this trace's GPU
        (:func:`tracekit.analysis.op_costs.operator_costs`, which builds it;
        :func:`~tracekit.analysis.op_costs.op_cost_summary` per op and shape, module or step)."""
        from tracekit.nsys.trace import derived_table

        return derived_table(self, "operators")

    @cached_property
    def flows(self) -> pl.DataFrame:
        """One row per GPU operation: the CPU operator that launched it, through the launch call.

        ``kind`` (kernel, memcpy, memset), ``correlation_id``, ``device_id``, ``gpu_start_ns``,
        the runtime call's ``api_name``, ``api_start_ns``, ``pid``, ``tid``, its ``external_id``
        and the CPU operator of that id: ``op_name``, ``op_start_ns``, ``sequence_number``
        (null where Kineto recorded no operator, e.g. a launch outside any). Where a call's
        External id is no operator's (older PyTorch wrote the correlation id there:
        DeepSeek's and PARAM's published traces), ``external_id`` is that of the innermost CPU
        operator of the launching thread running when the call started."""
        gpu = self.gpu_args.select("kind", "correlation_id", "device_id", pl.col("start_ns").alias("gpu_start_ns"))
        api = self._kineto_table("KINETO_RUNTIME_ARGS", {"correlation_id": pl.Int64, "global_tid": pl.Int64,
                                                          "start_ns": pl.Int64, "external_id": pl.Int64, "cbid": pl.Int64})
        calls = self.table("cuda_api", ["correlation_id", "name", "start_ns"]).rename(
            {"name": "api_name", "start_ns": "api_start_ns"})
        api = api.select("correlation_id", "external_id", (pl.col("global_tid") // C.TID_BITS % C.TID_BITS).alias("pid"),
                         (pl.col("global_tid") % C.TID_BITS).alias("tid"), pl.col("start_ns").alias("api_start_ns"))
        api = api.join(calls, on=["correlation_id", "api_start_ns"], how="left")
        ops = self.cpu_ops.filter(pl.col("category").is_in(["cpu_op", "user_annotation"]) & pl.col("external_id").is_not_null())
        api = _enclosing_operator(api, ops)
        ops = ops.select("external_id", pl.col("name").alias("op_name"), pl.col("start_ns").alias("op_start_ns"),
                         "sequence_number").unique("external_id", keep="first", maintain_order=True)
        out = gpu.join(api.unique("correlation_id", keep="first", maintain_order=True), on="correlation_id", how="left")
        out = out.join(ops, on="external_id", how="left")
        return out.select("kind", "correlation_id", "device_id", "gpu_start_ns", "api_name", "api_start_ns", "pid", "tid",
                          "external_id", "op_name", "op_start_ns", "sequence_number").sort("gpu_start_ns")

    @cached_property
    def nccl(self) -> pl.DataFrame:
        """As :attr:`NsysTrace.nccl` (from the kernel names: Kineto records no NCCL NVTX ranges),
        with what PyTorch recorded about each collective: ``bytes`` (the smaller of the input
        and output element counts × the element size, as NCCL counts a message) with
        ``size_source`` ``"kineto"``, and ``comm_nranks`` (``Group size``) with
        ``nranks_source`` ``"kineto"``. Read from the NCCL kernel's own arguments (PyTorch ≥
        2.3), else from the ``record_param_comms`` operator around the launch call."""
        from tracekit.nsys.trace import derived_table

        calls = derived_table(self, "nccl")
        comm = self._comm_args()
        if calls.height == 0 or comm.height == 0:
            return calls
        comm = comm.with_columns(
            (pl.min_horizontal("in_msg_nelems", "out_msg_nelems")
             * pl.col("dtype").str.to_lowercase().replace_strict(_DTYPE_BYTES, default=None, return_dtype=pl.Int64)).alias("_bytes"),
            pl.col("group_size").alias("_n"),
        ).select("correlation_id", "_bytes", "_n").unique("correlation_id", keep="first")
        out = calls.join(comm, on="correlation_id", how="left", maintain_order="left")
        fill_bytes = pl.col("bytes").is_null() & pl.col("_bytes").is_not_null()
        fill_n = (pl.col("nranks_source") != "payload") & pl.col("_n").is_not_null()
        out = out.with_columns(
            pl.when(fill_bytes).then(pl.col("_bytes")).otherwise(pl.col("bytes")).alias("bytes"),
            pl.when(fill_bytes).then(pl.lit("kineto")).otherwise(pl.col("size_source")).alias("size_source"),
            pl.when(fill_n).then(pl.col("_n")).otherwise(pl.col("comm_nranks")).alias("comm_nranks"),
            pl.when(fill_n).then(pl.lit("kineto")).otherwise(pl.col("nranks_source")).alias("nranks_source"),
        )
        return out.select(calls.columns)

    def _comm_args(self) -> pl.DataFrame:
        """Per NCCL kernel correlation id: ``in_msg_nelems``, ``out_msg_nelems``, ``dtype``,
        ``group_size``, from the kernel's arguments, else the ``record_param_comms`` operator
        that holds the launch call on its thread."""
        cols = ["in_msg_nelems", "out_msg_nelems", "dtype", "group_size"]
        args = self.gpu_args.filter((pl.col("kind") == "kernel") & pl.col("correlation_id").is_not_null())
        own = args.filter(pl.col("in_msg_nelems").is_not_null()).select("correlation_id", *cols)
        ops = self.cpu_ops.filter((pl.col("name") == "record_param_comms") & pl.col("in_msg_nelems").is_not_null())
        if ops.height == 0:
            return own
        api = self._kineto_table("KINETO_RUNTIME_ARGS", {"correlation_id": pl.Int64, "global_tid": pl.Int64,
                                                          "start_ns": pl.Int64, "external_id": pl.Int64, "cbid": pl.Int64})
        api = api.join(args.select("correlation_id"), on="correlation_id", how="semi").join(own, on="correlation_id", how="anti")
        api = api.select("correlation_id", (pl.col("global_tid") % C.TID_BITS).alias("tid"), "start_ns").sort("start_ns")
        ops = ops.select("tid", pl.col("start_ns").alias("op_start"), pl.col("end_ns").alias("op_end"), *cols).sort("op_start")
        found = api.join_asof(ops, left_on="start_ns", right_on="op_start", by="tid", strategy="backward", check_sortedness=False)
        found = found.filter(pl.col("op_end") >= pl.col("start_ns")).select("correlation_id", *cols)
        return pl.concat([own, found], how="vertical_relaxed")

    @cached_property
    def kineto_meta(self) -> dict[str, Any]:
        """The trace's top-level fields other than ``traceEvents`` (decoded JSON)."""
        frame = self._kineto_table("KINETO_META", {"name": pl.Utf8, "value": pl.Utf8})
        return {k: json.loads(v) for k, v in frame.iter_rows()}

    @cached_property
    def distributed_info(self) -> pl.DataFrame:
        """``distributedInfo``: one row of ``rank``, ``world_size``, ``backend``, ``pg_count``,
        ``nccl_version`` and ``pg_config`` (JSON text); no row when the trace has none."""
        info = self.kineto_meta.get("distributedInfo")
        schema = {"rank": pl.Int64, "world_size": pl.Int64, "backend": pl.Utf8, "pg_count": pl.Int64,
                  "nccl_version": pl.Utf8, "pg_config": pl.Utf8}
        if not isinstance(info, dict):
            return pl.DataFrame(schema=schema)
        from tracekit.kineto.parse import as_int, as_text

        row = {"rank": as_int(info.get("rank")), "world_size": as_int(info.get("world_size")),
               "backend": as_text(info.get("backend")), "pg_count": as_int(info.get("pg_count")),
               "nccl_version": as_text(info.get("nccl_version")), "pg_config": as_text(info.get("pg_config"))}
        return pl.DataFrame([row], schema=schema)

    @cached_property
    def device_properties(self) -> pl.DataFrame:
        """``deviceProperties`` as Kineto wrote them: one row per device, its keys as columns
        (``id``, ``name``, ``totalGlobalMem``, ``computeMajor``, ``numSms`` …)."""
        props = self.kineto_meta.get("deviceProperties") or []
        rows = [p for p in props if isinstance(p, dict)]
        return pl.DataFrame(rows, infer_schema_length=None) if rows else pl.DataFrame(schema={"id": pl.Int64, "name": pl.Utf8})

    @property
    def base_time_ns(self) -> int | None:
        """``baseTimeNanoseconds``: the Unix time (ns) of the trace's time 0, when recorded."""
        value = self.kineto_meta.get("baseTimeNanoseconds")
        return int(value) if value is not None else None


def _enclosing_operator(api: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """``api`` (``pid``, ``tid``, ``api_start_ns``, ``external_id``) with the ``external_id`` of
    each call that names no operator of ``ops`` (or none at all) replaced by that of the
    innermost operator of ``ops`` on the call's thread whose time holds the call's start (null
    where none does; :func:`tracekit.analysis.attribution.innermost_ranges`)."""
    from tracekit.analysis.attribution import innermost_ranges

    known = api.get_column("external_id").is_in(ops.get_column("external_id").implode()).fill_null(False)
    if bool(known.all()) or ops.height == 0:
        return api
    lost = api.filter(~known)
    ids = innermost_ranges(ops.select("pid", "tid", "start_ns", "end_ns", pl.col("external_id").alias("range_id")),
                           lost.select("pid", "tid", pl.col("api_start_ns").alias("time_ns")))
    where = known.not_().arg_true()
    return api.with_columns(api.get_column("external_id").clone().scatter(where, ids.cast(pl.Int64)).alias("external_id"))
