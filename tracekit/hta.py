"""``tracekit.hta(trace)``: HolisticTraceAnalysis's five views of a trace, one call away.

The definitions live in :mod:`tracekit.analysis.hta_views`; this facade reads the tables they
need from a trace (or one trace per rank) and cuts them to HTA's window, as
``hta.trace_analysis.TraceAnalysis`` does when it loads a folder of rank traces.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any

import polars as pl

from tracekit.analysis import hta_views as V

__all__ = ["HtaViews", "hta"]

_API = ["correlation_id", "name", "start_ns", "end_ns"]


def _annotations(trace: Any) -> pl.DataFrame:
    """``name``/``start_ns`` of the ranges HTA looks for ``ProfilerStep#N`` in (CPU and GPU side)."""
    parts = [trace.nvtx.select("name", "start_ns")]
    gpu = getattr(trace, "gpu_annotations", None)
    if gpu is not None and gpu.height:
        parts.append(gpu.select("name", "start_ns"))
    return pl.concat(parts, how="vertical_relaxed")


def _rank_of(trace: Any, index: int) -> int:
    info = getattr(trace, "distributed_info", None)
    if info is not None and info.height and info["rank"][0] is not None:
        return int(info["rank"][0])
    return index


class HtaViews:
    """HTA's views of one trace, or of one trace per rank (each table gains ``rank``).

    Parameters
    ----------
    traces
        A trace (:func:`tracekit.open`) or a sequence of them, one per rank (ranks from
        Kineto's ``distributedInfo``, else their order).
    window
        Cut to the window HTA analyses (:func:`~tracekit.analysis.hta_views.hta_window`: the
        last ``ProfilerStep`` left out); ``False`` analyses every GPU event.

    Examples
    --------
    >>> views = tracekit.hta(tracekit.open("rank-0.pt.trace.json.gz"))  # doctest: +SKIP
    >>> views.temporal_breakdown()  # doctest: +SKIP
    """

    def __init__(self, traces: Any, *, window: bool = True) -> None:
        many = isinstance(traces, Sequence) and not isinstance(traces, str)
        self._traces = list(traces) if many else [traces]
        self._many = many
        self.window = window

    def _stack(self, read: Any) -> pl.DataFrame:
        frames = [read(t) for t in self._traces]
        if not self._many:
            return frames[0]  # type: ignore[no-any-return]
        ranks = [_rank_of(t, i) for i, t in enumerate(self._traces)]
        return pl.concat([f.with_columns(pl.lit(r, pl.Int64).alias("rank")) for f, r in zip(frames, ranks, strict=True)],
                         how="vertical_relaxed")

    @cached_property
    def cuda_api(self) -> pl.DataFrame:
        """The launch calls: ``correlation_id``, ``name``, ``start_ns``, ``end_ns`` (``rank``)."""
        return self._stack(lambda t: t.cuda_api.select(_API))

    @cached_property
    def ops(self) -> pl.DataFrame:
        """:func:`~tracekit.analysis.hta_views.hta_ops` of the trace(s), in HTA's window when
        :attr:`window` is set."""
        ops = self._stack(lambda t: V.hta_ops(t.kernels, t.memcpys, t.memsets))
        if not self.window:
            return ops
        return V.hta_window(ops, self.cuda_api, self._stack(_annotations))

    def temporal_breakdown(self) -> pl.DataFrame:
        """:func:`~tracekit.analysis.hta_views.temporal_breakdown` (HTA ``get_temporal_breakdown``)."""
        return V.temporal_breakdown(self.ops)

    def idle_time_breakdown(self, *, consecutive_kernel_delay_ns: int = 30_000) -> pl.DataFrame:
        """:func:`~tracekit.analysis.hta_views.idle_time_breakdown` (HTA ``get_idle_time_breakdown``)."""
        return V.idle_time_breakdown(self.ops, self.cuda_api, consecutive_kernel_delay_ns=consecutive_kernel_delay_ns)

    def kernel_type_breakdown(self) -> pl.DataFrame:
        """:func:`~tracekit.analysis.hta_views.kernel_type_breakdown` (HTA ``get_gpu_kernel_breakdown``)."""
        return V.kernel_type_breakdown(self.ops)

    def kernel_breakdown(self) -> pl.DataFrame:
        """:func:`~tracekit.analysis.hta_views.kernel_breakdown` (HTA ``get_gpu_kernel_breakdown``, per kernel)."""
        return V.kernel_breakdown(self.ops)

    def comm_comp_overlap(self) -> pl.DataFrame:
        """:func:`~tracekit.analysis.hta_views.comm_comp_overlap` (HTA ``get_comm_comp_overlap``)."""
        return V.comm_comp_overlap(self.ops)

    def kernel_launch_stats(self, *, apis: Sequence[str] | None = V.HTA_LAUNCH_APIS) -> pl.DataFrame:
        """:func:`~tracekit.analysis.hta_views.kernel_launch_stats` (HTA ``get_cuda_kernel_launch_stats``)."""
        return V.kernel_launch_stats(self.ops, self.cuda_api, apis=apis)


def hta(traces: Any, *, window: bool = True) -> HtaViews:
    """HolisticTraceAnalysis's views of a trace or of one trace per rank (:class:`HtaViews`)."""
    if isinstance(traces, str) or hasattr(traces, "__fspath__"):
        from tracekit.opening import open as open_trace

        traces = open_trace(traces)
    return HtaViews(traces, window=window)
