"""CUDA graph launches on the exported timeline (:mod:`tracekit.export.events` draws them).

nsys traces a graph launch in one of two ways (``trace.meta.cuda_graph_trace``):

* ``graph`` (its default): one ``graph_trace`` row per launch, whose kernels are not traced.
  Each row is a GPU operation like a kernel: a slice ``[CUDA graph <graph_id>]`` (category
  ``graph``) on the stream track it ran on, with a flow from its ``cudaGraphLaunch`` call.
* ``node``: the graph's kernels, copies and memsets are ordinary rows on their stream tracks
  (the launch call's flow points to the first of them). Where one replay begins and ends is
  not drawn by them, so each replay (:func:`tracekit.analysis.graphs.graph_launches`: the span
  of its operations) is a slice ``[CUDA graph exec <graph_exec_id>]`` (category ``graph``) on
  a track ``GPU d · CUDA graph replays`` of the launching process, above its stream tracks.

Graph launches are few (one per replay, not per kernel), so both tables are read whole.
"""

from __future__ import annotations

from typing import Any

import polars as pl

__all__ = ["GRAPH_COLS", "REPLAY_COLS", "REPLAY_TRACK", "graph_op_slices", "graph_ops", "node_replays", "replay_slices"]

#: Columns of :func:`graph_ops`.
GRAPH_COLS = ["report", "pid", "device_id", "stream_id", "correlation_id", "start_ns", "end_ns", "graph_id", "graph_exec_id"]
#: Columns of :func:`node_replays`.
REPLAY_COLS = ["report", "pid", "device_id", "stream_id", "correlation_id", "graph_exec_id", "start_ns", "end_ns",
               "kernels", "gpu_time_ns"]
#: Name of the per-device track of replays traced per node (``{}``: the device id).
REPLAY_TRACK = "GPU {} · CUDA graph replays"

_I64 = pl.Int64


def _with_report(frame: pl.DataFrame) -> pl.DataFrame:
    return frame if "report" in frame.columns else frame.with_columns(pl.lit(0, _I64).alias("report"))


def graph_ops(trace: Any) -> pl.DataFrame:
    """The ``graph_trace`` rows of ``trace`` (an ``NsysTrace`` or a ``TraceSet``): one per
    graph launch traced whole.

    Returns
    -------
    :data:`GRAPH_COLS`: ``report`` (0 for one report), ``pid``, ``device_id``, ``stream_id``,
    ``correlation_id`` (of the launching call), ``start_ns``, ``end_ns`` (the replay on the
    GPU, ns), ``graph_id``, ``graph_exec_id``. Empty (same columns) when graphs were traced
    per node, not used, or the trace object has no such table.
    """
    from tracekit.analysis.graphs import graph_trace_of

    frame = graph_trace_of(trace)
    if frame is None or frame.height == 0:
        return pl.DataFrame(schema=dict.fromkeys(GRAPH_COLS, _I64))
    frame = _with_report(frame)
    return frame.select(pl.col(c).cast(_I64) if c in frame.columns else pl.lit(None, _I64).alias(c) for c in GRAPH_COLS)


def node_replays(trace: Any) -> pl.DataFrame:
    """One row per CUDA graph launch traced per node (``--cuda-graph-trace=node``): the span
    of the replay's kernels, copies and memsets (``trace.graphs`` rows of mode ``node``).

    Returns
    -------
    :data:`REPLAY_COLS`: ``report`` (for a trace set, from its ``ranks`` table), ``pid``,
    ``device_id``, ``stream_id`` (the stream most of its operations ran on),
    ``correlation_id`` (of the ``cudaGraphLaunch`` call), ``graph_exec_id``, ``start_ns``,
    ``end_ns`` (first operation's start, last one's end, ns), ``kernels`` (per replay) and
    ``gpu_time_ns`` (busy time inside the replay, ns). Empty when the capture traced graphs
    whole (its kernel table is then not read for graph nodes) or used none.
    """
    empty = pl.DataFrame(schema=dict.fromkeys(REPLAY_COLS, _I64))
    meta = getattr(trace, "meta", None)
    if getattr(meta, "cuda_graph_trace", None) == "graph" or not hasattr(type(trace), "graphs"):
        return empty
    db = getattr(trace, "db", None)
    if db is not None and hasattr(db, "has_table") and not any(
            db.has_table(t) for t in ("CUDA_GRAPH_NODE_EVENTS", "CUDA_GRAPH_EVENTS")):
        return empty  # no graph was captured: neither the kernels nor the NVTX table are read for it
    launches = trace.graphs
    if not isinstance(launches, pl.DataFrame) or launches.height == 0:
        return empty
    launches = launches.filter(pl.col("mode") == "node")
    if launches.height == 0:
        return empty
    if "report" not in launches.columns:
        ranks = getattr(trace, "ranks", None)
        if "rank" in launches.columns and isinstance(ranks, pl.DataFrame) and "report" in ranks.columns:
            # graph_launches keeps ranks, not reports: a process's rank names its report
            which = ranks.select("rank", "pid", "report").unique(["rank", "pid"], keep="first")
            launches = launches.join(which, on=["rank", "pid"], how="left", nulls_equal=True)
        else:
            launches = _with_report(launches)
    return launches.select(pl.col(c).cast(_I64) for c in REPLAY_COLS)


def graph_op_slices(frame: pl.DataFrame) -> pl.DataFrame:
    """Stream-track slices of :func:`graph_ops` rows (with ``track`` and ``flow_in`` added by
    the caller): ``[CUDA graph <graph_id>]``, category ``graph``, arguments ``graph_id``,
    ``graph_exec_id``, ``device_id``, ``stream_id``, ``correlation_id``."""
    name = pl.when(pl.col("graph_id").is_not_null()).then(pl.format("[CUDA graph {}]", pl.col("graph_id"))).otherwise(
        pl.lit("[CUDA graph]"))
    return frame.select(
        "track", "start_ns", "end_ns", name.alias("name"), pl.lit("graph").alias("cat"), "flow_in",
        pl.col("graph_id").alias("a_graph_id"), pl.col("graph_exec_id").alias("a_graph_exec"),
        pl.col("device_id").alias("a_device"), pl.col("stream_id").alias("a_stream"),
        pl.col("correlation_id").alias("a_correlation"),
    )


def replay_slices(frame: pl.DataFrame) -> pl.DataFrame:
    """Replay-track slices of :func:`node_replays` rows (with ``track`` added by the caller):
    ``[CUDA graph exec <graph_exec_id>]``, category ``graph``, arguments ``graph_exec_id``,
    ``kernel_count``, ``gpu_time_ns`` (busy time inside the replay), ``device_id``,
    ``stream_id``, ``correlation_id``. No flow: the launch call's flow goes to the replay's
    first operation on its stream track."""
    name = pl.when(pl.col("graph_exec_id").is_not_null()).then(
        pl.format("[CUDA graph exec {}]", pl.col("graph_exec_id"))).otherwise(pl.lit("[CUDA graph]"))
    return frame.select(
        "track", "start_ns", "end_ns", name.alias("name"), pl.lit("graph").alias("cat"),
        pl.col("graph_exec_id").alias("a_graph_exec"), pl.col("kernels").alias("a_kernel_count"),
        pl.col("gpu_time_ns").alias("a_gpu_time"), pl.col("device_id").alias("a_device"),
        pl.col("stream_id").alias("a_stream"), pl.col("correlation_id").alias("a_correlation"),
    )
