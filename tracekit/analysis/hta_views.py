"""Meta's HolisticTraceAnalysis (HTA) views, computed from tracekit's tables with HTA's definitions.

HTA (``hta.trace_analysis.TraceAnalysis``, release 0.5.0) answers five questions about a
``torch.profiler`` trace. Each function here answers one of them from tracekit frames, with
HTA's definition (``docs/kineto.md``, "Against HTA", says where and why the numbers differ):

==========================================  ==============================  ===================================
HTA                                          here                            HTA's source
==========================================  ==============================  ===================================
``get_temporal_breakdown``                   :func:`temporal_breakdown`       ``analyzers/breakdown_analysis.py``
``get_idle_time_breakdown``                  :func:`idle_time_breakdown`      ``analyzers/breakdown_analysis.py``
``get_gpu_kernel_breakdown`` (by type)       :func:`kernel_type_breakdown`    ``analyzers/breakdown_analysis.py``
``get_gpu_kernel_breakdown`` (by kernel)     :func:`kernel_breakdown`         ``analyzers/breakdown_analysis.py``
``get_comm_comp_overlap``                    :func:`comm_comp_overlap`        ``analyzers/communication_analysis.py``
``get_cuda_kernel_launch_stats``             :func:`kernel_launch_stats`      ``analyzers/cuda_kernel_analysis.py``
==========================================  ==============================  ===================================

Inputs are :func:`hta_ops` (kernels, memcpys and memsets stacked, with HTA's ``kernel_type``),
optionally cut to HTA's window by :func:`hta_window`. Everything is per ``rank`` when the
frames have one (``tracekit.open_many``), as HTA computes per rank trace. Times are exact
nanoseconds; HTA as shipped rounds every event to whole microseconds first (``ceil`` of the
start, ``floor`` of the end), which is the main source of difference on real traces.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from tracekit.analysis._frames import interval_union, rank_keys

__all__ = [
    "COMMUNICATION",
    "COMPUTATION",
    "HTA_COMM_PATTERN",
    "HTA_LAUNCH_APIS",
    "HTA_MEMORY_PATTERN",
    "HTA_NOT_COMPUTE_PATTERN",
    "MEMORY",
    "OTHER",
    "comm_comp_overlap",
    "hta_ops",
    "hta_window",
    "idle_time_breakdown",
    "kernel_breakdown",
    "kernel_launch_stats",
    "kernel_type_breakdown",
    "temporal_breakdown",
]

COMPUTATION, COMMUNICATION, MEMORY, OTHER = "COMPUTATION", "COMMUNICATION", "MEMORY", "OTHER"
#: HTA 0.5.0's ``NCCL_KERNEL_RE`` (``hta/utils/utils.py``): communication kernels. It matches
#: ``ncclKernel_*`` and ``ncclDevKernel_*`` alike (HTA ≤ 0.2 matched only ``ncclKernel``); no
#: other communication library (custom all-reduce, NVSHMEM, RCCL) is communication to HTA.
HTA_COMM_PATTERN = r"^nccl.*Kernel"
#: HTA's ``MEMORY_KERNEL_RE``: copies and memsets (Kineto names them ``Memcpy DtoD (…)``, ``Memset (…)``).
HTA_MEMORY_PATTERN = r"^(?:Memcpy|Memset|dma)"
#: HTA's ``NCCL_COMPUTE_KERNEL_RE``: what is *not* computation. As HTA writes it, any name
#: containing ``Memcpy`` or ``Sync`` is not computation either (it is then ``OTHER``).
HTA_NOT_COMPUTE_PATTERN = r"^nccl.*Kernel|Memcpy|^Memset|Sync"
#: The launch calls HTA's launch statistics read (``cuda_kernel_launch_stats``); graph
#: launches and the driver API (``cuLaunchKernel``, Triton's launcher) are not among them.
HTA_LAUNCH_APIS: tuple[str, ...] = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cudaMemcpyAsync", "cudaMemsetAsync")
#: Order of the types in an overlap label (``"COMPUTATION overlapping COMMUNICATION"``), as HTA.
_TYPES: tuple[str, ...] = (COMPUTATION, COMMUNICATION, MEMORY)
_BASE = ["device_id", "stream_id", "correlation_id", "start_ns", "end_ns", "duration_ns"]


def kernel_type_expr(name: str | pl.Expr = "name") -> pl.Expr:
    """HTA's ``get_kernel_type`` of each name: COMMUNICATION, MEMORY, COMPUTATION or OTHER."""
    n = pl.col(name) if isinstance(name, str) else name
    return (
        pl.when(n.str.contains(HTA_COMM_PATTERN)).then(pl.lit(COMMUNICATION))
        .when(n.str.contains(HTA_MEMORY_PATTERN)).then(pl.lit(MEMORY))
        .when(~n.str.contains(HTA_NOT_COMPUTE_PATTERN)).then(pl.lit(COMPUTATION))
        .otherwise(pl.lit(OTHER))
    )


def hta_ops(kernels: pl.DataFrame, memcpys: pl.DataFrame | None = None, memsets: pl.DataFrame | None = None) -> pl.DataFrame:
    """The GPU events HTA analyses: kernels, memcpys and memsets stacked, with HTA's names and types.

    Inputs: the ``kernels``, ``memcpys`` (``copy_kind``) and ``memsets`` tables (``rank`` when
    present). Returns (``rank``,) ``op_kind``, ``name`` (kernels as recorded; copies and
    memsets as Kineto names them, ``Memcpy HtoD (Pinned -> Device)``, ``Memset (Device)``),
    ``kernel_type``, ``device_id``, ``stream_id``, ``correlation_id``, ``start_ns``, ``end_ns``,
    ``duration_ns``.
    """
    keys = rank_keys(*(f for f in (kernels, memcpys, memsets) if f is not None))
    parts = [kernels.select(*keys, pl.lit("kernel").alias("op_kind"), "name", *_BASE)]
    if memcpys is not None:
        name = pl.format("Memcpy {} ({} -> {})", *(pl.col(c).fill_null("Unknown") for c in ("copy_kind", "src_kind", "dst_kind")))
        parts.append(memcpys.select(*keys, pl.lit("memcpy").alias("op_kind"), name.alias("name"), *_BASE))
    if memsets is not None:
        name = pl.format("Memset ({})", pl.col("mem_kind").fill_null("Unknown"))
        parts.append(memsets.select(*keys, pl.lit("memset").alias("op_kind"), name.alias("name"), *_BASE))
    ops = pl.concat(parts, how="vertical_relaxed").drop_nulls(["start_ns", "end_ns"])
    return ops.with_columns(kernel_type_expr().alias("kernel_type")).sort([*keys, "start_ns"])


def hta_window(ops: pl.DataFrame, cuda_api: pl.DataFrame, annotations: pl.DataFrame) -> pl.DataFrame:
    """The GPU events HTA keeps when it loads a trace (``Trace._filter_irrelevant_gpu_kernels``).

    When the trace holds at least two ``ProfilerStep#N`` names, HTA keeps only the GPU events
    launched (by a runtime or driver call with their ``correlation_id``) before the *last*
    step began, so the last, possibly cut, iteration is left out; ``annotations`` are the
    ranges with a ``name`` and ``start_ns`` where steps are found (the ``nvtx`` table and, for
    Kineto, ``gpu_annotations``: HTA takes the latest start of either). With fewer than two
    step names every event is kept. Events launched by no traced call are dropped too.

    Inputs: :func:`hta_ops`; ``cuda_api`` (``correlation_id``, ``start_ns``); both with ``rank``
    when present. Returns ``ops`` (same columns) restricted to the window.
    """
    rk = rank_keys(ops, cuda_api)
    steps = annotations.filter(pl.col("name").str.contains("ProfilerStep"))
    if steps.select(pl.col("name").n_unique()).item() < 2:
        return ops
    last = steps.group_by(rk or pl.lit(0).alias("_all")).agg(pl.col("start_ns").max().alias("_last"))
    calls = cuda_api.select(*rk, "correlation_id", "start_ns").drop_nulls("correlation_id")
    calls = calls.join(last, on=rk) if rk else calls.join(last.drop("_all"), how="cross")
    calls = calls.filter(pl.col("start_ns") < pl.col("_last")).select(*rk, "correlation_id").unique()
    return ops.join(calls, on=[*rk, "correlation_id"], how="semi", maintain_order="left")


def _union_length(frame: pl.DataFrame, keys: list[str], name: str) -> pl.DataFrame:
    merged = interval_union(frame, keys)
    return merged.group_by(keys or pl.lit(0).alias("_all")).agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias(name))


def _on(frame: pl.DataFrame, other: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    if keys:
        return frame.join(other, on=keys, how="left")
    return frame.join(other, on="_all", how="left")


def temporal_breakdown(ops: pl.DataFrame) -> pl.DataFrame:
    """Where a rank's GPU time went: idle, computing, or busy with something else.

    HTA's definition (``get_temporal_breakdown``): ``kernel_time`` is the span from the first
    GPU event's start to the last one's end (all devices and streams of the rank); ``idle`` is
    the part of it no event covers; ``compute`` is the union of COMPUTATION kernels;
    ``non_compute`` the rest (communication, copies and memsets not under computation).

    Input: :func:`hta_ops` (after :func:`hta_window` for HTA's window). Returns one row per
    (``rank``): ``idle_time_ns``, ``compute_time_ns``, ``non_compute_time_ns``,
    ``kernel_time_ns`` and ``idle_share``, ``compute_share``, ``non_compute_share`` (0–1).
    """
    rk = rank_keys(ops)
    group: list[str | pl.Expr] = [*rk] or [pl.lit(0).alias("_all")]
    span = ops.group_by(group).agg((pl.col("end_ns").max() - pl.col("start_ns").min()).alias("kernel_time_ns"))
    out = _on(span, _union_length(ops, rk, "_busy"), rk)
    out = _on(out, _union_length(ops.filter(pl.col("kernel_type") == COMPUTATION), rk, "compute_time_ns"), rk)
    out = out.with_columns(pl.col("compute_time_ns").fill_null(0), (pl.col("kernel_time_ns") - pl.col("_busy")).alias("idle_time_ns"))
    out = out.with_columns((pl.col("kernel_time_ns") - pl.col("compute_time_ns") - pl.col("idle_time_ns")).alias("non_compute_time_ns"))
    share = [(pl.col(f"{c}_time_ns") / pl.col("kernel_time_ns")).alias(f"{c}_share") for c in ("idle", "compute", "non_compute")]
    return out.with_columns(share).select(*rk, "idle_time_ns", "compute_time_ns", "non_compute_time_ns", "kernel_time_ns",
                                          "idle_share", "compute_share", "non_compute_share").sort(rk or "kernel_time_ns")


def _type_states(ops: pl.DataFrame) -> pl.DataFrame:
    """Time per combination of kernel types running at once: (``rank``,) ``_state`` (bit i set
    when type ``_TYPES[i]`` runs), ``time_ns``."""
    rk = rank_keys(ops)
    events = []
    for bit, kind in enumerate(_TYPES):
        merged = interval_union(ops.filter(pl.col("kernel_type") == kind), rk)
        events.append(merged.select(*rk, pl.col("start_ns").alias("t"), pl.lit(1 << bit).alias("d")))
        events.append(merged.select(*rk, pl.col("end_ns").alias("t"), pl.lit(-(1 << bit)).alias("d")))
    sweep = pl.concat(events).group_by([*rk, "t"]).agg(pl.col("d").sum()).sort([*rk, "t"])
    state = pl.col("d").cum_sum()
    nxt = pl.col("t").shift(-1)
    sweep = sweep.with_columns((state.over(rk) if rk else state).alias("_state"), ((nxt.over(rk) if rk else nxt) - pl.col("t")).alias("time_ns"))
    sweep = sweep.filter((pl.col("_state") > 0) & pl.col("time_ns").is_not_null())
    return sweep.group_by([*rk, "_state"]).agg(pl.col("time_ns").sum())


def _state_label(state: int) -> str:
    return " overlapping ".join(kind for bit, kind in enumerate(_TYPES) if state & (1 << bit))


def kernel_type_breakdown(ops: pl.DataFrame) -> pl.DataFrame:
    """GPU time by kernel type, overlaps apart (HTA's ``get_gpu_kernel_breakdown``, first table).

    Each type's events (COMPUTATION, COMMUNICATION, MEMORY; OTHER is left out) are merged into
    a union; the rank's timeline is cut where any union starts or ends, and each piece is
    labelled by the types running in it: ``COMPUTATION``, ``COMMUNICATION overlapping
    MEMORY`` … (HTA's labels and their order). Time under no type is not counted.

    Input: :func:`hta_ops`. Returns (``rank``,) ``kernel_type``, ``time_ns`` and ``share`` (of
    the rank's labelled time, 0–1), largest first. HTA reports the sum over ranks; sum
    ``time_ns`` by ``kernel_type`` for it.
    """
    rk = rank_keys(ops)
    states = _type_states(ops)
    out = states.with_columns(pl.col("_state").map_elements(_state_label, return_dtype=pl.Utf8).alias("kernel_type"))
    total = pl.col("time_ns").sum().over(rk) if rk else pl.col("time_ns").sum()
    out = out.with_columns((pl.col("time_ns") / total).alias("share"))
    return out.select(*rk, "kernel_type", "time_ns", "share").sort([*rk, "time_ns"], descending=[*([False] * len(rk)), True])


def kernel_breakdown(ops: pl.DataFrame) -> pl.DataFrame:
    """Time per kernel name within each type (HTA's ``get_gpu_kernel_breakdown``, second table).

    Input: :func:`hta_ops`. Returns (``rank``,) ``kernel_type`` (COMPUTATION, COMMUNICATION,
    MEMORY), ``name``, ``count``, ``sum_ns``, ``max_ns``, ``min_ns``, ``mean_ns``, ``std_ns``
    (sample standard deviation, 0 for one kernel), largest ``sum_ns`` first in each type.
    Every name is kept: HTA folds all but the top ``num_kernels`` names (and those past the
    ``duration_ratio`` quantile) into one ``others`` row, and then reports the *sum* as the
    max, min and mean of the names it kept; ``.head(n)`` per type gives its top names.
    """
    rk = rank_keys(ops)
    out = ops.filter(pl.col("kernel_type").is_in(list(_TYPES))).group_by([*rk, "kernel_type", "name"]).agg(
        pl.len().cast(pl.Int64).alias("count"),
        pl.col("duration_ns").sum().alias("sum_ns"),
        pl.col("duration_ns").max().alias("max_ns"),
        pl.col("duration_ns").min().alias("min_ns"),
        pl.col("duration_ns").mean().alias("mean_ns"),
        pl.col("duration_ns").std().fill_null(0.0).alias("std_ns"),
    )
    return out.sort([*rk, "kernel_type", "sum_ns"], descending=[*([False] * (len(rk) + 1)), True])


def comm_comp_overlap(ops: pl.DataFrame) -> pl.DataFrame:
    """Share of communication time during which computation ran (HTA's ``get_comm_comp_overlap``).

    Both are unions of their kernels on the rank (all devices and streams): ``overlap_ns`` is
    the length of their intersection, ``communication_ns`` the length of the communication
    union. Communication is ``^nccl.*Kernel`` only (:data:`HTA_COMM_PATTERN`); copies are
    neither. For tracekit's own reading, with every communication library and peer copies, see
    :func:`tracekit.analysis.comm.overlap_breakdown`.

    Input: :func:`hta_ops`. Returns (``rank``,) ``communication_ns``, ``overlap_ns`` and
    ``overlap_share`` (0–1; null without communication, where HTA reports NaN).
    """
    rk = rank_keys(ops)
    states = _type_states(ops)
    comm_bit, comp_bit = 1 << _TYPES.index(COMMUNICATION), 1 << _TYPES.index(COMPUTATION)
    state = pl.col("_state")
    out = states.group_by(rk or pl.lit(0).alias("_all")).agg(
        pl.col("time_ns").filter((state & comm_bit) != 0).sum().alias("communication_ns"),
        pl.col("time_ns").filter((state & (comm_bit | comp_bit)) == (comm_bit | comp_bit)).sum().alias("overlap_ns"),
    )
    if not rk:
        out = out.drop("_all")
        if out.height == 0:
            out = pl.DataFrame({"communication_ns": [0], "overlap_ns": [0]}, schema={"communication_ns": pl.Int64, "overlap_ns": pl.Int64})
    share = pl.when(pl.col("communication_ns") > 0).then(pl.col("overlap_ns") / pl.col("communication_ns"))
    return out.with_columns(share.alias("overlap_share")).select(*rk, "communication_ns", "overlap_ns", "overlap_share").sort(rk or "overlap_ns")


def _launches(ops: pl.DataFrame, cuda_api: pl.DataFrame, apis: Sequence[str] | None) -> pl.DataFrame:
    rk = rank_keys(ops, cuda_api)
    calls = cuda_api.select(*rk, "correlation_id", pl.col("name").alias("api_name"),
                            pl.col("start_ns").alias("api_start_ns"), pl.col("end_ns").alias("api_end_ns"))
    if apis is not None:
        calls = calls.filter(pl.col("api_name").is_in(list(apis)))
    return calls.drop_nulls("correlation_id").unique([*rk, "correlation_id"], keep="first", maintain_order=True)


def idle_time_breakdown(ops: pl.DataFrame, cuda_api: pl.DataFrame, *, consecutive_kernel_delay_ns: int = 30_000) -> pl.DataFrame:
    """Idle time of each stream by cause (HTA's ``get_idle_time_breakdown``).

    On each stream, in start order, the gap before an event is its start minus the end of the
    event before it on the stream. The gap is ``host_wait`` when the call that launched the
    event started after the previous event had ended (the host had not queued it yet),
    else ``kernel_wait`` when it is shorter than ``consecutive_kernel_delay_ns`` (HTA's
    ``consecutive_kernel_delay``, 30 in its µs times: 30 µs, although its docstring says
    nanoseconds), else ``other`` (the GPU waited on something else: an event, another stream).
    The first event of a stream has no gap (it counts as ``other`` with 0, as in HTA).

    Inputs: :func:`hta_ops` (copies and memsets are events too), ``cuda_api``
    (``correlation_id``, ``start_ns``). Returns (``rank``,) ``device_id``, ``stream_id``,
    ``idle_category``, ``idle_time_ns`` and ``idle_time_ratio`` (of the stream's idle time).
    HTA keys streams by number alone; a rank whose process drives several GPUs keeps them
    apart here.
    """
    rk = rank_keys(ops, cuda_api)
    keys = [*rk, "device_id", "stream_id"]
    calls = _launches(ops, cuda_api, None).select(*rk, "correlation_id", "api_start_ns")
    f = ops.join(calls, on=[*rk, "correlation_id"], how="left").sort([*keys, "start_ns"])
    f = f.with_columns(pl.col("end_ns").shift(1).over(keys).alias("_prev_end"))
    idle = pl.col("start_ns") - pl.col("_prev_end")
    host = (pl.col("api_start_ns") > pl.col("_prev_end")).fill_null(False)
    category = (pl.when(host).then(pl.lit("host_wait"))
                .when((idle < consecutive_kernel_delay_ns).fill_null(False)).then(pl.lit("kernel_wait"))
                .otherwise(pl.lit("other")))
    f = f.with_columns(category.alias("idle_category"), idle.alias("_idle"))
    out = f.group_by([*keys, "idle_category"]).agg(pl.col("_idle").sum().alias("idle_time_ns"))
    total = pl.col("idle_time_ns").sum().over(keys)
    out = out.with_columns(pl.when(total > 0).then(pl.col("idle_time_ns") / total).otherwise(0.0).alias("idle_time_ratio"))
    return out.sort([*keys, "idle_category"])


def kernel_launch_stats(ops: pl.DataFrame, cuda_api: pl.DataFrame, *, apis: Sequence[str] | None = HTA_LAUNCH_APIS) -> pl.DataFrame:
    """Per GPU event: how long its launch call took and how long it then waited (HTA's
    ``get_cuda_kernel_launch_stats``).

    ``launch_delay_ns`` is the event's start minus the end of its launch call, 0 when negative
    (HTA clips; :func:`tracekit.analysis.launch.kernel_launch_times` keeps such queue times
    null instead). Only events launched by one of ``apis`` are rows: HTA's four runtime calls
    by default, so kernels of CUDA graph replays (``cudaGraphLaunch``) and driver-API launches
    (``cuLaunchKernel``: Triton, torch.compile) are missing from HTA's statistics; pass
    ``apis=None`` for every launch.

    Inputs: :func:`hta_ops`, ``cuda_api`` (``correlation_id``, ``name``, ``start_ns``,
    ``end_ns``). Returns (``rank``,) ``correlation_id``, ``name``, ``api_name``,
    ``cpu_duration_ns``, ``gpu_duration_ns``, ``launch_delay_ns``, in launch order.
    """
    rk = rank_keys(ops, cuda_api)
    calls = _launches(ops, cuda_api, apis)
    f = ops.join(calls, on=[*rk, "correlation_id"], how="inner")
    return f.select(
        *rk, "correlation_id", "name", "api_name",
        (pl.col("api_end_ns") - pl.col("api_start_ns")).alias("cpu_duration_ns"),
        pl.col("duration_ns").alias("gpu_duration_ns"),
        (pl.col("start_ns") - pl.col("api_end_ns")).clip(lower_bound=0).alias("launch_delay_ns"),
        pl.col("api_start_ns").alias("_t"),
    ).sort([*rk, "_t"]).drop("_t")
