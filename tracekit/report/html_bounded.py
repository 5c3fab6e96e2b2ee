"""The report's sections of an export too big to hold (see :mod:`tracekit.report.bounded`).

Same sections, order and HTML as :func:`tracekit.report.html.build_report` draws from whole
tables; the whole-trace numbers come from :class:`~tracekit.report.bounded.KernelColumns` and
two streaming passes over the GPU metrics, the timeline and the NVTX breakdown from one
window of the trace (a note says which). Sections run in page order and hold only what they
need: the diagnosis (Findings) is released before the overview's busy/idle sweep starts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import polars as pl

from tracekit.report import bounded as B
from tracekit.report.sections import (
    _activity_note,
    _communication_html,
    _diagnose,
    _findings,
    _graph_launches,
    _graph_rows,
    _graphs,
    _has_graph_launches,
    _hidden_graphs_note,
    _kernels_html,
    _layer_memory,
    _memo,
    _memory,
    _metrics_html,
    _note,
    _nvtx_html,
    _overview_facts,
    _Page,
    _run,
)
from tracekit.viz import prep
from tracekit.viz.tables import fmt_ns

log = logging.getLogger(__name__)

#: The ``cuda_api`` columns the launch join reads (one at a time).
_API_COLUMNS = ("correlation_id", "global_tid", "name", "start_ns", "end_ns", "api")

#: Tables a trace caches that the sections below do not read again (the diagnosis builds some).
_RELEASED = ("kernels", "cuda_api", "nvtx", "gpu_metrics", "syncs", "nccl")


def _release(trace: Any) -> None:
    """Drop the big tables a finished step left cached on ``trace`` (the diagnosis's), so that
    the next section's peak does not sit on top of them."""
    import gc

    trace.unload(*_RELEASED)
    gc.collect()


def add_sections(page: _Page, trace: Any, ncu: Any, *, top_n: int, max_marks: int) -> None:
    """Add the nsys sections of ``trace`` to ``page``, in bounded memory."""
    from tracekit.analysis.attribution import NVTX_COLUMNS

    kc = B.KernelColumns(trace)
    windows: list[Any] = []
    # the copy tables (small) are read once, before the diagnosis as in the whole-table report,
    # and kept for the overview's span and breakdown
    memcpys, memsets = trace.memcpys, trace.memsets
    diagnosis = _memo(lambda: _diagnose(trace, ncu))
    page.section("findings", "Findings", lambda: _findings(diagnosis(), windows))
    page.section("run", "Run", lambda: _run(page, diagnosis().structure))
    _release(trace)
    facts = _memo(kc.facts)
    graphs = _graph_rows(trace)
    nvtx = _memo(lambda: trace.table("nvtx", list(NVTX_COLUMNS)))
    metrics = _memo(lambda: B.gpu_metric_figures(trace))

    def span() -> tuple[int, int] | None:  # prep.data_window of the kernels and the small tables
        f = facts()
        lows: list[Any] = [f.first_start_ns]
        highs: list[Any] = [f.last_end_ns]
        for frame in (memcpys, memsets, graphs):
            if frame is not None and not frame.is_empty():
                lows.append(frame["start_ns"].min())
                highs.append(frame["end_ns"].max())
        lo = min((int(v) for v in lows if v is not None), default=None)
        hi = max((int(v) for v in highs if v is not None), default=None)
        return None if lo is None or hi is None else (lo, max(hi, lo + 1))

    breakdown = _memo(lambda: kc.breakdown(memcpys, memsets, graphs))
    page.section("overview", "Overview", lambda: _overview(page, trace, facts(), span(), graphs, breakdown, nvtx, metrics))
    page.section("kernels", "Top kernels", lambda: _kernels(page, kc, facts(), graphs, top_n))
    if _has_graph_launches(trace):
        page.section("graphs", "CUDA graphs", lambda: _graphs(page, trace, breakdown))
    detail = _memo(lambda: _detail(kc, windows, facts()))
    page.section("nvtx", "NVTX breakdown", lambda: _nvtx(page, trace, kc, detail(), nvtx()))
    page.section("timeline", "Timeline", lambda: _timeline(page, kc, detail(), memcpys, memsets, graphs, nvtx(), max_marks))
    page.section("communication", "Communication", lambda: _communication(page, trace, kc))
    origin = (span() or (None, None))[0]
    page.section("metrics", "GPU metrics", lambda: _metrics(page, trace, metrics(), origin))
    page.section("memory", "Memory", lambda: _memory(page, trace, origin))
    page.section("layer_memory", "Memory per layer", lambda: _layer_memory(page, trace, nvtx()))


def _overview(page: _Page, trace: Any, facts: B.KernelFacts, window: tuple[int, int] | None, graphs: pl.DataFrame | None,
              breakdown: Callable[[], pl.DataFrame], nvtx: Callable[[], pl.DataFrame],
              metrics: Callable[[], tuple[int, pl.DataFrame, pl.DataFrame]]) -> str:
    """:func:`tracekit.report.html._overview` from the kernel columns."""
    out = _overview_facts(
        page, trace, used_devices=set(facts.devices), window=window, graphs=graphs,
        kernels_text=f"{facts.launches:,} launches, {facts.distinct:,} distinct, {fmt_ns(facts.gpu_time_ns)} GPU time",
        breakdown=breakdown, nvtx_events=nvtx().height, metric_samples=metrics()[0],
    )
    return out


def _kernels(page: _Page, kc: B.KernelColumns, facts: B.KernelFacts, graphs: pl.DataFrame | None, top_n: int) -> str:
    """:func:`tracekit.report.html._kernels` from the kernel columns: every instance counts."""
    hidden = _hidden_graphs_note(graphs)
    if facts.launches == 0:
        return _note("No kernels in this trace.") + hidden
    top = kc.top_kernels(top_n)
    return hidden + _kernels_html(page, top, kc.duration_histogram(), top_n)


class _Detail:
    """The window the detail sections draw (ns), what it is, and its kernels."""

    def __init__(self, window: tuple[int, int], what: str, kernels: pl.DataFrame, capped: bool) -> None:
        self.window, self.what, self.kernels, self.capped = window, what, kernels, capped

    def note(self, why: str) -> str:
        w0, w1 = self.window
        cap = f" (its first {B.MAX_DETAIL_KERNELS:,} kernels)" if self.capped else ""
        return _note(
            f"Drawn from one window of the trace: {self.what}{cap}, {fmt_ns(w1 - w0)} with {self.kernels.height:,} kernels "
            f"({w0:,} → {w1:,} ns on the capture's timeline). {why}"
        )


def _detail(kc: B.KernelColumns, windows: list[Any], facts: B.KernelFacts) -> _Detail | None:
    """The kernels (launch and name columns) of :func:`tracekit.report.bounded.detail_window`
    of the diagnosis's window, at most :data:`~tracekit.report.bounded.MAX_DETAIL_KERNELS`."""
    got = B.detail_window(windows[0] if windows else None, facts)
    if got is None:
        return None
    window, what = got
    small = kc.capped(window, B.MAX_DETAIL_KERNELS)
    kernels = kc.kernels_in(small, [*B._OP_COLUMNS, "name", "short_name"])
    return _Detail(small, what, kernels, small != window)


def _starts_in(frame: pl.DataFrame | None, window: tuple[int, int]) -> pl.DataFrame | None:
    if frame is None:
        return None
    return frame.filter(pl.col("start_ns").is_between(window[0], window[1], closed="left"))


def _nvtx(page: _Page, trace: Any, kc: B.KernelColumns, detail: _Detail | None, nvtx: pl.DataFrame) -> str:
    """:func:`tracekit.report.html._nvtx` of the operations launched in the detail window."""
    if nvtx.is_empty():
        return _note("No NVTX ranges in this trace (annotate the program with NVTX to get a breakdown).")
    if detail is None:
        return _note("No window to attribute: the diagnosis found none (see Findings).")
    api = trace.columns_on_demand("cuda_api", _API_COLUMNS)
    launches = _starts_in(_graph_launches(trace), detail.window)
    attributed = prep.attributed_kernels(detail.kernels, api, nvtx, launches)
    why = ("The tree over the whole trace would join every kernel to its launching call and NVTX ranges at once, "
           "more than this report's memory bound allows; shares are of the window's attributed GPU time.")
    return detail.note(why) + _nvtx_html(page, attributed)


def _timeline(page: _Page, kc: B.KernelColumns, detail: _Detail | None, memcpys: pl.DataFrame, memsets: pl.DataFrame,
              graphs: pl.DataFrame | None, nvtx: pl.DataFrame, max_marks: int) -> str:
    """:func:`tracekit.report.html._timeline` of the detail window."""
    from tracekit.viz import timeline_chart

    if detail is None:
        return _note("No GPU work to show.")
    w0, w1 = detail.window
    ranges = prep.nvtx_ranges(nvtx)  # levels from the whole table, then the window's ranges
    ranges = ranges.filter((pl.col("start_ns") < w1) & (pl.col("end_ns").is_null() | (pl.col("end_ns") > w0)))
    chart = timeline_chart(
        detail.kernels, memcpys=_starts_in(memcpys, detail.window), memsets=_starts_in(memsets, detail.window),
        graphs=_starts_in(graphs, detail.window), nvtx=ranges, window=detail.window, max_marks=max_marks,
        width=1000, title="GPU timeline (drag to select a window)",
    )  # fmt: skip
    why = "A timeline of the whole trace would be bins too coarse to show single operations."
    return detail.note(why) + _note(
        f"Lanes with more than {max_marks:,} operations are shown as time bins (opacity = busy share)."
    ) + page.chart(chart)


def _communication(page: _Page, trace: Any, kc: B.KernelColumns) -> str:
    """:func:`tracekit.report.html._communication` from the kernel columns."""
    top = kc.top_kernels(30, family="communication")
    if top.is_empty():
        return _note("No communication kernels (NCCL or custom collectives) in this trace.")
    return _communication_html(page, trace, top)


def _metrics(page: _Page, trace: Any, figures: tuple[int, pl.DataFrame, pl.DataFrame], origin: int | None) -> str:
    """:func:`tracekit.report.html._metrics` from the streamed GPU-metric figures."""
    total, series, summary = figures
    if total == 0:
        return _note("No GPU metrics (capture with nsys --gpu-metrics-devices=all).")
    return _activity_note(trace) + _metrics_html(page, series, summary, origin)
