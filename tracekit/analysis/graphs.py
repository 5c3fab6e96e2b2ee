"""CUDA graph launches: what each replay cost on the GPU and on the CPU, in either trace mode.

nsys traces a graph launch in one of two ways (``--cuda-graph-trace``, recorded as
``trace.meta.cuda_graph_trace``):

* ``graph`` (nsys's default): one ``graph_trace`` row per launch (start, end on the GPU,
  ``graph_id``, ``graph_exec_id``); the graph's kernels are not traced.
* ``node``: every kernel, memcpy and memset of the graph is traced, with ``graph_node_id`` and
  the ``correlation_id`` of the ``cudaGraphLaunch`` call that launched the graph; there is no
  ``graph_trace`` row.

:func:`graph_launches` gives one row per launch in both modes (the launching call, its thread
and NVTX path; in node mode also the kernels per replay), :func:`graph_summary` one row per
graph, and :func:`graph_launch_cost` the CPU cost of a launch against the kernel launches it
replaces. ``trace.graphs`` is :func:`graph_launches` of a trace (built here, registered as a
derived table of :class:`~tracekit.nsys.trace.NsysTrace`).

Where both modes can say a number — launches, GPU time per replay (the replay's span on the
GPU), the launching call — they give the same number for the same program
(``tests/test_llm_stacks.py`` compares two captures of one decode loop).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from tracekit.analysis._frames import ColumnSource, interval_union, rank_keys
from tracekit.analysis.attribution import NVTX_COLUMNS, attribute_nvtx, launch_info

__all__ = [
    "GRAPH_LAUNCH_PATTERN",
    "LAUNCH_COLUMNS",
    "graph_launch_cost",
    "graph_launches",
    "graph_summary",
    "graph_trace_of",
    "node_operations",
    "trace_graph_launches",
    "whole_graphs",
]

#: Calls that launch a CUDA graph (runtime and driver API).
GRAPH_LAUNCH_PATTERN = r"^cu(?:da)?GraphLaunch"
#: Calls that launch one kernel each (what a graph replay replaces).
KERNEL_LAUNCH_PATTERN = r"^cu(?:da)?LaunchKernel|^cuLaunchKernelEx|^cudaLaunchKernelExC|^cuLaunchCooperativeKernel|^cudaLaunchCooperativeKernel"

#: Columns of :func:`graph_launches`, in order.
LAUNCH_COLUMNS = (
    "pid", "global_pid", "device_id", "stream_id", "correlation_id", "graph_id", "graph_exec_id",
    "start_ns", "end_ns", "duration_ns", "gpu_time_ns", "kernels", "memcpys", "memsets", "mode",
    "tid", "global_tid", "api_name", "api_start_ns", "api_end_ns", "launch_api_ns", "nvtx_path",
)


def whole_graphs(graphs: pl.DataFrame | None) -> pl.DataFrame | None:
    """The CUDA graph launches traced whole among ``graphs`` (``trace.graph_trace``, or
    ``trace.graphs`` whose ``mode`` says how each was traced), with ``duration_ns``; ``None``
    when there are none. Launches traced per node are left out: their kernels, copies and
    memsets are rows of the other tables already, and would count twice."""
    if graphs is None or graphs.is_empty():
        return None
    g = graphs.filter(pl.col("mode") == "graph") if "mode" in graphs.columns else graphs
    g = g.filter(pl.col("start_ns").is_not_null() & pl.col("end_ns").is_not_null())
    if g.is_empty():
        return None
    if "duration_ns" not in g.columns:
        g = g.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("duration_ns"))
    return g


def graph_trace_of(trace: Any, columns: list[str] | None = None) -> pl.DataFrame | None:
    """``trace``'s ``graph_trace`` rows (only ``columns`` when given), or ``None`` when the
    trace object has no such table (an object that predates it)."""
    frame = getattr(trace, "graph_trace", None)
    if not isinstance(frame, pl.DataFrame):
        return None
    if columns is None:
        return frame
    return frame.select([c for c in ["rank", *columns] if c in frame.columns])


def _schema(rk: list[str]) -> dict[str, Any]:
    s: dict[str, Any] = {c: pl.Int64 for c in LAUNCH_COLUMNS}
    s.update(mode=pl.Utf8, api_name=pl.Utf8, nvtx_path=pl.Utf8)
    return {**{k: pl.Int64 for k in rk}, **s}


def _node_ops(kernels: pl.DataFrame, memcpys: pl.DataFrame | None, memsets: pl.DataFrame | None) -> pl.DataFrame:
    """The graph-node operations (``graph_node_id`` set) of the three tables, stacked."""
    parts = []
    for frame, kind in ((kernels, "kernel"), (memcpys, "memcpy"), (memsets, "memset")):
        if frame is None or frame.height == 0 or "graph_node_id" not in frame.columns:
            continue
        rk = rank_keys(frame)
        parts.append(frame.filter(pl.col("graph_node_id").is_not_null()).select(
            *rk, "pid", "global_pid", "device_id", "stream_id", "correlation_id", "start_ns", "end_ns",
            "graph_node_id", pl.lit(kind).alias("_kind"),
        ))
    if not parts:
        return pl.DataFrame()
    return pl.concat(parts, how="vertical_relaxed")


def graph_launches(
    graph_trace: pl.DataFrame | None,
    cuda_api: pl.DataFrame | ColumnSource,
    *,
    kernels: pl.DataFrame | None = None,
    memcpys: pl.DataFrame | None = None,
    memsets: pl.DataFrame | None = None,
    nvtx: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """One row per CUDA graph launch, from whole-graph rows or from graph-node operations.

    Parameters
    ----------
    graph_trace
        The ``graph_trace`` table (``--cuda-graph-trace=graph``); ``None`` or empty when graphs
        were traced per node.
    cuda_api
        The ``cuda_api`` table (or a column source of it): the launching calls.
    kernels, memcpys, memsets
        With ``graph_node_id`` (``--cuda-graph-trace=node``): each launch's operations are
        those with its ``correlation_id`` in its process.
    nvtx
        The whole ``nvtx`` table: adds ``nvtx_path``, the ranges that enclosed the launching
        call (nsys's thread rule, :func:`~tracekit.analysis.attribution.attribute_nvtx`).

    Returns
    -------
    :data:`LAUNCH_COLUMNS` (``rank`` first for a trace set): the launch on the GPU
    (``device_id``, ``stream_id``, ``start_ns``/``end_ns``: the replay's span, ``duration_ns``,
    ns), ``gpu_time_ns`` (busy time inside it: the union of its operations in node mode, the
    span in graph mode), ``kernels``/``memcpys``/``memsets`` per replay (node mode; null in
    graph mode, where nsys does not trace them), ``graph_id`` and ``graph_exec_id`` (graph mode;
    in node mode ``graph_exec_id`` is the high 32 bits of the nodes' ``graph_node_id``, which
    nsys 2025.3 numbers per executable graph), ``mode`` (``"graph"``/``"node"``), the launching
    call (``api_name``, ``api_start_ns``, ``api_end_ns``, ``launch_api_ns`` = its duration,
    ``tid``, ``global_tid``) and ``nvtx_path`` (null without ``nvtx``). Sorted by start.
    """
    frames: list[pl.DataFrame] = []
    if graph_trace is not None and graph_trace.height:
        rk = rank_keys(graph_trace)
        frames.append(graph_trace.select(
            *rk, "pid", "global_pid", "device_id", "stream_id", "correlation_id", "graph_id", "graph_exec_id",
            "start_ns", "end_ns", "duration_ns", pl.col("duration_ns").alias("gpu_time_ns"),
            *(pl.lit(None, pl.Int64).alias(c) for c in ("kernels", "memcpys", "memsets")), pl.lit("graph").alias("mode"),
        ))
    nodes = _node_ops(kernels if kernels is not None else pl.DataFrame(), memcpys, memsets)
    if nodes.height:
        rk = rank_keys(nodes)
        launch = [*rk, "global_pid", "correlation_id"]
        busy = interval_union(nodes, launch).group_by(launch).agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("gpu_time_ns"))
        per = nodes.group_by(launch).agg(
            pl.col("pid").first(), pl.col("device_id").first(), pl.col("stream_id").mode().first(),
            (pl.col("graph_node_id").first() // (1 << 32)).alias("graph_exec_id"),
            pl.col("start_ns").min(), pl.col("end_ns").max(),
            (pl.col("_kind") == "kernel").sum().cast(pl.Int64).alias("kernels"),
            (pl.col("_kind") == "memcpy").sum().cast(pl.Int64).alias("memcpys"),
            (pl.col("_kind") == "memset").sum().cast(pl.Int64).alias("memsets"),
        ).join(busy, on=launch)
        frames.append(per.select(
            *rk, "pid", "global_pid", "device_id", "stream_id", "correlation_id", pl.lit(None, pl.Int64).alias("graph_id"),
            "graph_exec_id", "start_ns", "end_ns", (pl.col("end_ns") - pl.col("start_ns")).alias("duration_ns"),
            "gpu_time_ns", "kernels", "memcpys", "memsets", pl.lit("node").alias("mode"),
        ))
    rk = rank_keys(*frames) if frames else []
    if not frames:
        return pl.DataFrame(schema=_schema(rk))
    out = pl.concat(frames, how="vertical_relaxed")
    out = launch_info(out, cuda_api).with_columns((pl.col("api_end_ns") - pl.col("api_start_ns")).alias("launch_api_ns"))
    if nvtx is not None and nvtx.height:
        out = attribute_nvtx(out, nvtx, fallback="none")
    else:
        out = out.with_columns(pl.lit(None, pl.Utf8).alias("nvtx_path"))
    schema = _schema(rk)
    return out.select([pl.col(c).cast(t) for c, t in schema.items()]).sort([*rk, "start_ns"])


#: Columns of the graph-node operations :func:`node_operations` reads.
NODE_COLUMNS = ["pid", "global_pid", "device_id", "stream_id", "correlation_id", "start_ns", "end_ns", "graph_node_id"]


def node_operations(trace: Any) -> dict[str, pl.DataFrame]:
    """The kernels, memcpys and memsets of ``trace`` that ran inside CUDA graphs traced per
    node (``graph_node_id`` set; :data:`NODE_COLUMNS`), by table name. Empty when the capture
    traced graphs whole or recorded no graph nodes (``trace.meta.cuda_graph_trace``, else no
    ``CUDA_GRAPH_NODE_EVENTS`` and no pre-2024.5 ``CUDA_GRAPH_EVENTS`` without graph rows): the
    kernels are then not read for a per-node column at all."""
    db = getattr(trace, "db", None)
    if db is not None:
        meta = getattr(trace, "meta", None)
        mode = getattr(meta, "cuda_graph_trace", None)
        if mode == "graph":
            return {}
        # nsys ≥ 2024.5 records node creations in CUDA_GRAPH_NODE_EVENTS; before, in
        # CUDA_GRAPH_EVENTS, which later versions keep for graph creations in graph mode too
        nodes = db.has_table("CUDA_GRAPH_NODE_EVENTS") or (
            db.has_table("CUDA_GRAPH_EVENTS") and not db.has_table("CUPTI_ACTIVITY_KIND_GRAPH_TRACE"))
        if mode != "node" and not nodes:
            return {}
    out: dict[str, pl.DataFrame] = {}
    for name in ("kernels", "memcpys", "memsets"):
        if db is not None:
            frame = trace.table(name, NODE_COLUMNS)
        else:  # a trace set: its tables are whole
            frame = getattr(trace, name, None)
            if not isinstance(frame, pl.DataFrame) or "graph_node_id" not in frame.columns:
                continue
            frame = frame.select([c for c in ["rank", *NODE_COLUMNS] if c in frame.columns])
        frame = frame.filter(pl.col("graph_node_id").is_not_null())
        if frame.height:
            out[name] = frame
    return out


def trace_graph_launches(trace: Any) -> pl.DataFrame:
    """:func:`graph_launches` of a trace (``trace.graphs``): its ``graph_trace`` rows, or its
    graph-node operations, with the launching calls and NVTX paths."""
    nodes = node_operations(trace)
    nvtx = trace.table("nvtx", list(NVTX_COLUMNS))
    api = trace.columns_on_demand("cuda_api", ["correlation_id", "global_tid", "name", "start_ns", "end_ns", "api"])
    return graph_launches(graph_trace_of(trace), api, kernels=nodes.get("kernels"), memcpys=nodes.get("memcpys"),
                          memsets=nodes.get("memsets"), nvtx=nvtx)


def graph_launch_cost(launches: pl.DataFrame, cuda_api: pl.DataFrame) -> pl.DataFrame:
    """The CPU cost of a graph launch against the kernel launches it replaces.

    Parameters
    ----------
    launches
        :func:`graph_launches` (node mode gives ``kernels`` per replay).
    cuda_api
        The ``cuda_api`` table: the median kernel-launch call (``cudaLaunchKernel``,
        ``cuLaunchKernelEx`` …) of the same process is what launching one kernel costs there.

    Returns
    -------
    One row per (``rank``,) ``pid``, ``graph_exec_id``: ``launches``, ``launch_api_median_ns``
    (the ``cudaGraphLaunch`` call), ``kernels_per_replay`` (median; null in graph mode),
    ``kernel_launch_median_ns`` (null when the process launched no kernel itself),
    ``replaced_launch_ns`` = kernels per replay × that median (the host time the same kernels
    would take launched one by one), ``saved_per_launch_ns`` = replaced − graph launch.
    """
    rk = rank_keys(launches, cuda_api)
    keys = [*rk, "pid", "graph_exec_id"]
    if launches.height == 0:
        return pl.DataFrame(schema={**{k: pl.Int64 for k in keys}, "launches": pl.Int64, "launch_api_median_ns": pl.Float64,
                                    "kernels_per_replay": pl.Float64, "kernel_launch_median_ns": pl.Float64,
                                    "replaced_launch_ns": pl.Float64, "saved_per_launch_ns": pl.Float64})
    per = launches.group_by(keys).agg(
        pl.len().cast(pl.Int64).alias("launches"),
        pl.col("launch_api_ns").median().alias("launch_api_median_ns"),
        pl.col("kernels").median().alias("kernels_per_replay"),
    )
    api = cuda_api.filter(pl.col("name").str.contains(KERNEL_LAUNCH_PATTERN))
    eager = api.group_by([*rk, "pid"]).agg(pl.col("duration_ns").median().alias("kernel_launch_median_ns"))
    out = per.join(eager, on=[*rk, "pid"], how="left").with_columns(
        (pl.col("kernels_per_replay") * pl.col("kernel_launch_median_ns")).alias("replaced_launch_ns"),
    ).with_columns((pl.col("replaced_launch_ns") - pl.col("launch_api_median_ns")).alias("saved_per_launch_ns"))
    return out.sort(keys)


def graph_summary(launches: pl.DataFrame, *, total_gpu_ns: int | None = None) -> pl.DataFrame:
    """One row per graph (``graph_exec_id`` within a process): how often it ran and what a
    replay cost.

    Parameters
    ----------
    launches
        :func:`graph_launches`.
    total_gpu_ns
        The GPU time of everything (for ``share``: this graph's ``gpu_time_ns`` / it).

    Returns
    -------
    (``rank``,) ``pid``, ``graph_exec_id``, ``graph_id``, ``mode``, ``devices`` (sorted
    distinct ``device_id`` joined by ``,``), ``launches``, ``gpu_time_ns`` (sum over replays),
    ``replay_median_ns``, ``replay_p90_ns``, ``replay_min_ns``, ``replay_max_ns`` (a replay's
    span, ns), ``busy_median_ns`` (busy time of a replay), ``kernels_per_replay`` (median;
    null in graph mode), ``launch_api_median_ns``, ``first_nvtx_path`` (the NVTX path of the
    first launch) and ``share`` (null without ``total_gpu_ns``). Largest ``gpu_time_ns`` first.
    """
    rk = rank_keys(launches)
    keys = [*rk, "pid", "graph_exec_id"]
    if launches.height == 0:
        return pl.DataFrame(schema={**{k: pl.Int64 for k in keys}, "graph_id": pl.Int64, "mode": pl.Utf8, "devices": pl.Utf8,
                                    "launches": pl.Int64, "gpu_time_ns": pl.Int64, "replay_median_ns": pl.Float64,
                                    "replay_p90_ns": pl.Float64, "replay_min_ns": pl.Int64, "replay_max_ns": pl.Int64,
                                    "busy_median_ns": pl.Float64, "kernels_per_replay": pl.Float64,
                                    "launch_api_median_ns": pl.Float64, "first_nvtx_path": pl.Utf8, "share": pl.Float64})
    out = launches.sort("start_ns").group_by(keys, maintain_order=True).agg(
        pl.col("graph_id").drop_nulls().first(),
        pl.col("mode").first(),
        pl.col("device_id").unique().sort().cast(pl.Utf8).str.join(",").alias("devices"),
        pl.len().cast(pl.Int64).alias("launches"),
        pl.col("gpu_time_ns").sum().cast(pl.Int64),
        pl.col("duration_ns").median().alias("replay_median_ns"),
        pl.col("duration_ns").quantile(0.9, interpolation="nearest").cast(pl.Float64).alias("replay_p90_ns"),
        pl.col("duration_ns").min().alias("replay_min_ns"),
        pl.col("duration_ns").max().alias("replay_max_ns"),
        pl.col("gpu_time_ns").median().alias("busy_median_ns"),
        pl.col("kernels").median().alias("kernels_per_replay"),
        pl.col("launch_api_ns").median().alias("launch_api_median_ns"),
        pl.col("nvtx_path").first().alias("first_nvtx_path"),
    )
    share = (pl.col("gpu_time_ns") / total_gpu_ns) if total_gpu_ns else pl.lit(None, pl.Float64)
    return out.with_columns(share.alias("share")).sort("gpu_time_ns", descending=True)


def _register() -> None:
    """Make ``trace.graphs`` (and ``trace.table("graphs")``) build with :func:`trace_graph_launches`."""
    from tracekit.nsys.trace import DERIVED_TABLES

    DERIVED_TABLES["graphs"] = trace_graph_launches


_register()
