"""Build the HTML report of an Nsight Systems trace and/or an Nsight Compute report.

The page holds its own JavaScript (Vega, Vega-Lite and vega-embed from vl-convert's bundle),
its CSS and every chart's data: it opens offline, from a file, on an air-gapped cluster.
Sections: overview, top kernels, CUDA graphs (when the program launched any), NVTX breakdown,
timeline, communication, GPU metrics, memory, memory per layer (NVTX ranges) and, with an ncu
report, the kernels' speed of light, roofline and Tensor Core / DRAM use. A section whose data
is missing says so instead of failing the report. CUDA graph launches traced whole
(``trace.graph_trace``) are GPU work in the overview's numbers, the timeline and the NVTX
breakdown: their kernels are in no other table.
"""

from __future__ import annotations

import html
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from tracekit.errors import TracekitError
from tracekit.outputs import write_output
from tracekit.report.sections import (  # noqa: F401  (shared with the bounded report; tests reach them here)
    _MODE_TEXT,
    CSS,
    _activity_note,
    _busy_ns,
    _communication_html,
    _diagnose,
    _facts,
    _findings,
    _graph_launches,
    _graph_rows,
    _graphs,
    _has_graph_launches,
    _hidden_graphs_note,
    _iteration_points,
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
from tracekit.viz.tables import fmt_ns, html_table

log = logging.getLogger(__name__)


# -- nsys sections ------------------------------------------------------------------------------------


def _breakdown(trace: Any) -> pl.DataFrame:
    """:func:`~tracekit.viz.prep.temporal_breakdown` per GPU (per rank for a trace set) of
    every GPU operation (kernels, copies, memsets, graph launches traced whole) over the GPU
    work span; empty when there is none."""
    graphs = _graph_rows(trace)
    if trace.kernels.is_empty() and graphs is None:
        return pl.DataFrame()
    return prep.temporal_breakdown(trace.kernels, trace.memcpys, trace.memsets, graphs)


def _overview(page: _Page, trace: Any, breakdown: Callable[[], pl.DataFrame]) -> str:
    k = trace.kernels
    graphs = _graph_rows(trace)
    out = _overview_facts(
        page, trace, used_devices=set(k["device_id"].drop_nulls().to_list()),
        window=prep.data_window(k, trace.memcpys, trace.memsets, graphs), graphs=graphs,
        kernels_text=f"{k.height:,} launches, {k['short_name'].n_unique():,} distinct, {fmt_ns(k['duration_ns'].sum())} GPU time",
        breakdown=breakdown, nvtx_events=trace.nvtx.height, metric_samples=trace.gpu_metrics.height,
    )  # fmt: skip
    return out


def _kernels(page: _Page, trace: Any, top_n: int) -> str:
    k = trace.kernels
    hidden = _hidden_graphs_note(_graph_rows(trace))
    if k.is_empty():
        return _note("No kernels in this trace.") + hidden
    return hidden + _kernels_html(page, prep.top_kernels(k, n=top_n, by="short_name"), k, top_n)


def _nvtx(page: _Page, trace: Any) -> str:
    if trace.nvtx.is_empty():
        return _note(
            "No NVTX ranges in this trace (annotate the program with NVTX to get a breakdown)."
        )
    attributed = prep.attributed_kernels(trace.kernels, trace.cuda_api, trace.nvtx, _graph_launches(trace))
    return _nvtx_html(page, attributed)


def _timeline(page: _Page, trace: Any, max_marks: int) -> str:
    from tracekit.viz import timeline_chart

    graphs = _graph_rows(trace)
    if trace.kernels.is_empty() and graphs is None:
        return _note("No GPU work to show.")
    chart = timeline_chart(
        trace.kernels, memcpys=trace.memcpys, memsets=trace.memsets, graphs=graphs, nvtx=trace.nvtx, max_marks=max_marks,
        width=1000, title="GPU timeline (drag to select a window)",
    )  # fmt: skip
    return _note(
        f"Lanes with more than {max_marks:,} operations are shown as time bins (opacity = busy share)."
    ) + page.chart(chart)


def _communication(page: _Page, trace: Any) -> str:
    k = prep.gpu_ops(trace.kernels)
    comm = k.filter(pl.col("family") == "communication")
    if comm.is_empty():
        return _note("No communication kernels (NCCL or custom collectives) in this trace.")
    return _communication_html(page, trace, prep.top_kernels(comm, n=30, by="name"))


def _metrics(page: _Page, trace: Any, origin: int | None) -> str:
    g = trace.gpu_metrics
    if g.is_empty():
        return _note("No GPU metrics (capture with nsys --gpu-metrics-devices=all).")
    summary = (
        g.filter(
            pl.col("metric").is_in(list(prep.DEFAULT_GPU_METRICS))
            & pl.col("metric_label").str.contains("%", literal=True)
        )
        .group_by("device_id", "metric_label")
        .agg(
            pl.col("value").cast(pl.Float64).mean().alias("mean_pct"),
            pl.col("value").max().cast(pl.Float64).alias("max_pct"),
        )
        .sort("device_id", "metric_label")
    )
    return _activity_note(trace) + _metrics_html(page, g, summary, origin)


# -- ncu section -----------------------------------------------------------------------------------------
def _ncu(page: _Page, report: Any) -> str:
    from tracekit.viz import prep_ncu, roofline_chart, tensor_dram_chart

    table = prep_ncu.kernel_metrics(report).sort("duration_ns", descending=True, nulls_last=True)
    pct = lambda v: "–" if v is None else f"{v:.0f}%"  # noqa: E731
    shown = table.select(
        "kernel", "family", "duration_ns", "compute_throughput_pct", "memory_throughput_pct", "tensor_pipe_pct",
        "dram_throughput_pct", "achieved_occupancy_pct", "bound",
    )  # fmt: skip
    out = (
        f"<p>{html.escape(str(getattr(report, 'path', '')))}: {table.height} profiled kernels</p>"
        + html_table(
            shown,
            formats={"duration_ns": fmt_ns} | {c: pct for c in shown.columns if c.endswith("_pct")},
            left=("kernel", "family", "bound"),
            headers={
                "compute_throughput_pct": "SM %",
                "memory_throughput_pct": "memory %",
                "tensor_pipe_pct": "tensor %",
                "dram_throughput_pct": "DRAM %",
                "achieved_occupancy_pct": "occupancy",
            },  # fmt: skip
            max_rows=100,
        )
    )
    try:
        out += page.chart(roofline_chart(report, title="Roofline"))
    except Exception as exc:
        out += _note(f"No roofline: {type(exc).__name__}: {exc}")
    out += page.chart(tensor_dram_chart(report, title="Tensor pipe vs DRAM bandwidth"))
    return out


# -- entry points ------------------------------------------------------------------------------------------


def build_report(
    trace: Any = None,
    ncu: Any = None,
    *,
    title: str | None = None,
    top_n: int = 30,
    max_marks: int = 2000,
) -> str:
    """The HTML of the report (a complete document).

    Parameters
    ----------
    trace
        An :class:`~tracekit.nsys.trace.NsysTrace` (optional when ``ncu`` is given).
    ncu
        An :class:`~tracekit.ncu.report.NcuReport` (optional).
    top_n
        Rows of the top-kernels table.
    max_marks
        Most timeline marks before binning.
    """
    if trace is None and ncu is None:
        msg = "give an Nsight Systems trace, an Nsight Compute report, or both"
        raise ValueError(msg)
    from tracekit.viz._deps import import_altair, import_vl_convert

    bounded = trace is not None and _bounded(trace)
    if trace is not None:  # before anything is imported or read
        _ensure_fits(trace, bounded=bounded)
    import_altair()  # a missing extra is one clear error, not a broken section each
    import_vl_convert()
    source = trace if trace is not None else ncu
    name = Path(str(getattr(source, "path", None) or (getattr(source, "paths", None) or ["trace"])[0])).name
    page = _Page(title or f"tracekit report: {name}", time.strftime("generated %Y-%m-%d %H:%M"))
    if trace is not None and bounded:  # whole-trace figures from columns, details from one window
        from tracekit.report.html_bounded import add_sections

        add_sections(page, trace, ncu, top_n=top_n, max_marks=max_marks)
    elif trace is not None:
        origin = (prep.data_window(trace.kernels, trace.memcpys, trace.memsets, _graph_rows(trace)) or (None, None))[0]
        diagnosis = _memo(lambda: _diagnose(trace, ncu))
        page.section("findings", "Findings", lambda: _findings(diagnosis()))
        page.section("run", "Run", lambda: _run(page, diagnosis().structure))
        breakdown = _memo(lambda: _breakdown(trace))
        page.section("overview", "Overview", lambda: _overview(page, trace, breakdown))
        page.section("kernels", "Top kernels", lambda: _kernels(page, trace, top_n))
        if _has_graph_launches(trace):
            page.section("graphs", "CUDA graphs", lambda: _graphs(page, trace, breakdown))
        page.section("nvtx", "NVTX breakdown", lambda: _nvtx(page, trace))
        page.section("timeline", "Timeline", lambda: _timeline(page, trace, max_marks))
        page.section("communication", "Communication", lambda: _communication(page, trace))
        page.section("metrics", "GPU metrics", lambda: _metrics(page, trace, origin))
        page.section("memory", "Memory", lambda: _memory(page, trace, origin))
        page.section("layer_memory", "Memory per layer", lambda: _layer_memory(page, trace))
    if ncu is not None:
        page.section("ncu", "Nsight Compute kernels", lambda: _ncu(page, ncu))
    return page.render()


#: Peak memory of a report, measured with ``/usr/bin/time`` on exports built by
#: ``benchmarks/make_big_trace.py`` (2.5 API calls and 0.2 NVTX ranges per kernel): 1.9 GB for
#: 1 M kernels, 12.0 GB for 8 M; modelled, a little above both, as a fixed part plus a part per
#: GPU operation (kernel, memcpy, memset, CUDA graph launch traced whole).
REPORT_BASE_BYTES = 500 << 20
REPORT_BYTES_PER_OP = 1500


#: Peak memory of a report drawn from columns (:mod:`tracekit.report.bounded`), measured the
#: same way on s8x and s30x (8 M and 30 M kernels); modelled a little above both.
REPORT_BOUNDED_BASE_BYTES = 1 << 30
REPORT_BOUNDED_BYTES_PER_OP = 100


def _bounded(trace: Any) -> bool:
    """Whether the report of ``trace`` is drawn from columns (:func:`tracekit.report.bounded.use_bounded`)."""
    from tracekit.report.bounded import use_bounded

    return use_bounded(trace)


def _ensure_fits(trace: Any, *, bounded: bool = False) -> None:
    """Refuse, as one :class:`~tracekit.errors.TraceMemoryError` line, a report that would not
    fit in the memory left. The whole-table report's sections hold the whole kernel, operation
    and API tables and polars aborts the process when an allocation fails (8 M kernels under a
    12 GB address-space limit: SIGABRT after 42 s, in a group-by of the overview's activity
    segments), so the check is made before anything is read. A report drawn from columns
    (``bounded``) holds a few columns of the kernel table at a time."""
    from tracekit.nsys.database import gpu_op_estimate, refuse_unless_fits

    db = getattr(trace, "db", None)  # an Nsight Systems trace's export (either kind)
    if db is None:
        return
    ops = gpu_op_estimate(db)
    base, per_op = (REPORT_BOUNDED_BASE_BYTES, REPORT_BOUNDED_BYTES_PER_OP) if bounded else (REPORT_BASE_BYTES, REPORT_BYTES_PER_OP)
    refuse_unless_fits(
        base + per_op * ops,
        f"{Path(str(trace.path)).name}: the HTML report of {ops:,} GPU operations",
        "run `tracekit summary` or `tracekit diagnose` (they work in bounded memory), or make the report on a machine with more memory",
    )


def write_report(
    trace_path: str | Path | Any,
    output: str | Path,
    *,
    ncu_path: str | Path | None = None,
    title: str | None = None,
    max_marks: int = 2000,
) -> Path:
    """Open the files, build the report and write it to ``output`` (returned). ``trace_path``
    may also be an open trace or a :class:`~tracekit.multi.TraceSet` (one section per rank)."""
    import tracekit
    from tracekit.ncu.report import NcuReport

    output = Path(output)
    if output.is_dir():  # said before the trace is read and the report built
        msg = f"cannot write {output}: it is a folder; name an HTML file"
        raise TracekitError(msg)
    if trace_path is None or isinstance(trace_path, (str, Path)):
        trace = tracekit.open(trace_path) if trace_path is not None else None
    else:
        trace = trace_path
        if hasattr(trace, "kernels_across_ranks"):  # reduced on Dask: no rows to draw
            msg = "the HTML report draws each rank's rows, which engine='dask' keeps on the workers; open the reports with open_many"
            raise TracekitError(msg)
        from tracekit.runs import require_one_run

        require_one_run(trace, "the HTML report")
    ncu = tracekit.open(ncu_path) if ncu_path is not None else None
    if isinstance(trace, NcuReport):
        if ncu is not None:  # the first report was dropped without a word
            from tracekit.errors import TraceFormatError

            msg = (f"{trace_path} and {ncu_path} are both Nsight Compute reports; a report holds one: pass an "
                   "Nsight Systems trace with --ncu, or one Nsight Compute report alone")
            raise TraceFormatError(msg)
        trace, ncu = None, trace
    if ncu is not None and not isinstance(ncu, NcuReport):
        from tracekit.errors import TraceFormatError

        msg = f"{ncu_path} is not an Nsight Compute report; pass the .ncu-rep file to --ncu"
        raise TraceFormatError(msg)
    document = build_report(trace, ncu, title=title, max_marks=max_marks)
    write_output(output, lambda fh: fh.write(document.encode("utf-8")), make_parents=True)
    return output


