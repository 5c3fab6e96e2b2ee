"""The report's page and the sections that the whole-table report (:mod:`tracekit.report.html`)
and the one drawn from columns (:mod:`tracekit.report.html_bounded`) share.
"""

from __future__ import annotations

import html
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import polars as pl

from tracekit.viz import prep
from tracekit.viz.tables import fmt_bytes, fmt_ns, html_table

_T = TypeVar("_T")

log = logging.getLogger(__name__)


CSS = """
body{font-family:-apple-system,"Segoe UI",Roboto,"Liberation Sans",Arial,sans-serif;margin:0;color:#1b1b1b;background:#fafafa}
header{background:#0b3d63;color:#fff;padding:14px 24px}header h1{margin:0;font-size:22px}header p{margin:4px 0 0;opacity:.85;font-size:13px}
nav{position:sticky;top:0;background:#fff;border-bottom:1px solid #ddd;padding:6px 24px;z-index:2;font-size:14px}
nav a{margin-right:14px;color:#0b3d63;text-decoration:none}
main{padding:8px 24px 40px;max-width:1200px}
section{background:#fff;border:1px solid #e3e3e3;border-radius:6px;padding:12px 18px;margin:16px 0}
section h2{margin:4px 0 10px;font-size:18px;color:#0b3d63}
.note{color:#666;font-style:italic}.err{color:#a00}
.facts td{padding:2px 12px 2px 0;font-size:13px}.facts td:first-child{font-weight:600}
.chart{margin:8px 0;overflow-x:auto}
.tk-table{border-collapse:collapse;font-size:12px}.tk-table th,.tk-table td{padding:2px 8px;border-bottom:1px solid #e5e5e5;text-align:right}
.tk-table th{background:#f5f5f5}.tk-table td.l,.tk-table th.l{text-align:left}
footer{color:#888;font-size:12px;padding:0 24px 24px}
"""


class _Page:
    """Accumulates sections and chart specs, then renders one HTML document."""

    def __init__(self, title: str, subtitle: str) -> None:
        self.title = title
        self.subtitle = subtitle
        self.sections: list[tuple[str, str, str]] = []
        self.charts: list[tuple[str, dict[str, Any]]] = []
        self.problems: list[str] = []

    def chart(self, chart: Any) -> str:
        from tracekit.viz.export import chart_spec
        from tracekit.viz.theme import SCREEN_THEME

        element = f"chart-{len(self.charts)}"
        self.charts.append((element, chart_spec(chart, theme=SCREEN_THEME)))
        return f'<div class="chart" id="{element}"></div>'

    def section(self, anchor: str, title: str, build: Callable[[], str]) -> None:
        try:
            body = build()
        except Exception as exc:  # a broken section must not take the report down
            log.debug("report section %s failed", anchor, exc_info=True)
            self.problems.append(f"{title}: {type(exc).__name__}: {exc}")
            body = f'<p class="err">This section could not be built: {html.escape(type(exc).__name__)}: {html.escape(str(exc))}</p>'
        self.sections.append((anchor, title, body))

    def render(self) -> str:
        from tracekit import __version__
        from tracekit.viz.export import embed_script, javascript_bundle

        nav = "".join(f'<a href="#{a}">{html.escape(t)}</a>' for a, t, _ in self.sections)
        body = "".join(
            f'<section id="{a}"><h2>{html.escape(t)}</h2>{b}</section>' for a, t, b in self.sections
        )
        scripts = "\n".join(embed_script(spec, element) for element, spec in self.charts)
        return (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{html.escape(self.title)}</title><style>{CSS}</style>"
            f"<script>{javascript_bundle()}</script></head><body>"
            f"<header><h1>{html.escape(self.title)}</h1><p>{html.escape(self.subtitle)}</p></header>"
            f"<nav>{nav}</nav><main>{body}</main>"
            f"<footer>tracekit {html.escape(__version__)} · self-contained: no network access needed</footer>"
            f"<script>\n{scripts}\n</script></body></html>\n"
        )


def _facts(rows: list[tuple[str, str]]) -> str:
    return (
        '<table class="facts">'
        + "".join(f"<tr><td>{html.escape(a)}</td><td>{html.escape(b)}</td></tr>" for a, b in rows)
        + "</table>"
    )


def _note(text: str) -> str:
    return f'<p class="note">{html.escape(text)}</p>'


def _diagnose(trace: Any, ncu: Any) -> Any:
    """:func:`tracekit.diagnosis.diagnose` of ``trace`` (with ``ncu``), for the Findings and Run sections."""
    from tracekit.diagnosis import diagnose

    return diagnose(trace, ncu=ncu)


def _findings(d: Any, windows: list[Any] | None = None) -> str:
    """The Findings section of a diagnosis (:func:`tracekit.diagnosis.diagnose`); its window
    is appended to ``windows`` when given (the bounded report's detail sections draw it)."""
    from tracekit.diagnosis.result import fmt_ns

    if windows is not None:
        windows.append(d.window)
    colors = {"high": "#b3261e", "medium": "#a15c00", "low": "#0b5cad", "info": "#666"}
    rows = []
    for f in d.items:
        stake = "" if f.time_ns is None else fmt_ns(f.time_ns) + (f" ({f.share:.1%})" if f.share is not None else "")
        nxt = "".join(f"<br><code>{html.escape(c)}</code>" for c in f.next)
        rows.append(
            f'<tr><td style="color:{colors.get(f.severity, "#000")};font-weight:600">{html.escape(f.severity)}</td>'
            f"<td>{html.escape(f.category)}</td><td>{html.escape(stake)}</td><td>{html.escape(f.title)}</td>"
            f"<td>{html.escape(f.advice)}{nxt}</td></tr>"
        )
    table = (
        "<table><tr><th>severity</th><th>category</th><th>time at stake</th><th>finding</th><th>what to try</th></tr>"
        + "".join(rows) + "</table>"
    ) if rows else "<p>No findings.</p>"
    return _note(d.window_text()) + table


def _run(page: _Page, structure: Any) -> str:
    """The Run section: the run's structure (:func:`tracekit.structure`) — its kind and why,
    how iterations were found, start-up and tear-down, each GPU's (or process's) iterations
    over time with warm-up marked, and the requests of a generation or server."""
    from tracekit.viz import iterations_chart

    if structure is None:
        return _note("No run structure (a trace set reduced on Dask keeps no per-operation rows).")
    s = structure
    rows = [("run", s.headline()), ("why", "; ".join(s.evidence) or "–"), ("iterations from", s.reason)]
    if s.startup_ns is not None:
        rows.append(("start-up", f"{fmt_ns(s.startup_ns)} before the first iteration (not in the window)"))
    if s.teardown_ns is not None:
        rows.append(("tear-down", f"{fmt_ns(s.teardown_ns)} after the last iteration (not in the window)"))
    if s.total:
        rows.append(("steady window", f"{fmt_ns(s.end_ns - s.start_ns)}: {s.steps} iterations of {fmt_ns(s.step_ns)} (median)"))
    per = getattr(s, "periodic", pl.DataFrame())
    if per.height:
        rows.append(("set apart", "; ".join(f"{r['what']} before step {r['step']}: {fmt_ns(r['duration_ns'])}" for r in per.iter_rows(named=True))
                     + " (periodic work between steps, not a step's time)"))
    out = _facts(rows)
    its = prep.structure_iterations(s)
    if not its.is_empty():
        shown, note = _iteration_points(its)
        out += note + page.chart(iterations_chart(shown, title="Iterations (warm-up and steady)"))
    req = s.requests
    if req.height:
        t0 = s.trace_start_ns
        out += html_table(
            req.select("request", "warmup", *[c for c in ("cold", "name", "new_tokens", "prompt_rows", "draft_forwards")
                                              if c in req.columns and req[c].null_count() < req.height],
                       ((pl.col("start_ns") - t0) / 1e9).round(3).alias("from_s"), "prefill_steps", "decode_steps", "ttft_ns",
                       "tpot_median_ns"),
            formats={"ttft_ns": fmt_ns, "tpot_median_ns": fmt_ns}, left=("warmup",))
    return out


#: The GPU metrics section's activity lines read the kernels' times whole only up to this many
#: kernels (the metrics: :data:`tracekit.diagnosis.context.MAX_METRIC_ROWS`).
ACTIVITY_MAX_KERNELS = 2_000_000


def _activity_note(trace: Any) -> str:
    """One line per GPU: how long its SMs were active by the metrics, and how much of that no
    traced operation explains (:func:`tracekit.analysis.metrics.metric_activity`); nothing on
    exports too big to read them whole (:data:`tracekit.diagnosis.context.MAX_METRIC_ROWS`,
    :data:`ACTIVITY_MAX_KERNELS`)."""
    from tracekit.analysis.metrics import metric_activity
    from tracekit.diagnosis.context import activity_ops, activity_samples

    db = getattr(trace, "db", None)
    if db is not None and db.has_table("CUPTI_ACTIVITY_KIND_KERNEL") and db.row_count("CUPTI_ACTIVITY_KIND_KERNEL") > ACTIVITY_MAX_KERNELS:
        return ""
    samples = activity_samples(trace)
    if samples.height == 0:
        return ""
    act = metric_activity(samples, activity_ops(trace))
    lines = []
    for r in act.iter_rows(named=True):
        lost = (f"; {fmt_ns(r['untraced_active_ns'])} of it outside every traced operation (work of a process the capture did "
                "not follow)") if r["untraced_active_ns"] else ""
        lines.append(f"GPU {r['device_id']}: SMs active {fmt_ns(r['active_ns'])} of {fmt_ns(r['span_ns'])} sampled "
                     f"({r['active_share']:.0%}){lost}.")
    return "".join(_note(t) for t in lines)


def _graph_rows(trace: Any) -> pl.DataFrame | None:
    """The trace's CUDA graph launches traced whole (``graph_trace``), or ``None``."""
    from tracekit.analysis.graphs import graph_trace_of

    return prep.whole_graphs(graph_trace_of(trace))


def _graph_launches(trace: Any) -> pl.DataFrame:
    """``trace.graphs`` (one row per graph launch, either trace mode); empty when the trace
    object has no such table."""
    graphs = getattr(trace, "graphs", None)
    return graphs if isinstance(graphs, pl.DataFrame) else pl.DataFrame()


def _busy_ns(breakdown: pl.DataFrame) -> pl.DataFrame:
    """``group`` (``GPU 0``, ``rank 1``), ``busy_ns`` (anything running), ``idle_ns`` and
    ``window_ns`` (the GPU work span, ns) of a :func:`_breakdown`."""
    if breakdown.is_empty():
        return pl.DataFrame(schema={"group": pl.Utf8, "busy_ns": pl.Int64, "idle_ns": pl.Int64, "window_ns": pl.Int64})
    idle = pl.col("category") == "idle"
    return breakdown.group_by("group", maintain_order=True).agg(
        pl.col("time_ns").filter(~idle).sum().alias("busy_ns"), pl.col("time_ns").filter(idle).sum().alias("idle_ns"),
        pl.col("window_ns").first(),
    )


def _memo(make: Callable[[], _T]) -> Callable[[], _T]:
    """``make`` run once, on first use: a value (a frame, figures) that several sections show."""
    box: list[_T] = []

    def get() -> _T:
        if not box:
            box.append(make())
        return box[0]

    return get


def _hidden_graphs_note(graphs: pl.DataFrame | None) -> str:
    """The Top kernels note on CUDA graph replays traced whole (their kernels are not listed);
    empty without them."""
    if graphs is None:
        return ""
    return _note(
        f"Not listed: {graphs.height:,} CUDA graph replays traced whole ({fmt_ns(graphs['duration_ns'].sum())} of GPU "
        "time), whose kernels are not in the trace (see CUDA graphs)."
    )


def _iteration_points(its: pl.DataFrame, what: str = "iterations") -> tuple[pl.DataFrame, str]:
    """``its`` (:func:`~tracekit.viz.prep.iteration_times` or a frame like it) as it is when it
    has at most :data:`~tracekit.viz.prep.MAX_ITERATION_POINTS` rows; else binned
    (:func:`~tracekit.viz.prep.binned_iterations`) with a note that says so (``what``: the rows'
    noun)."""
    shown, size = prep.binned_iterations(its)
    if size == 1:
        return its, ""
    return shown, _note(f"{its.height:,} {what}: each point is the median duration of {size:,} consecutive {what} "
                        "(numbered by the first), so that the chart stays readable.")


def _overview_facts(
    page: _Page, trace: Any, *, used_devices: set[Any], window: tuple[int, int] | None, graphs: pl.DataFrame | None,
    kernels_text: str, breakdown: Callable[[], pl.DataFrame], nvtx_events: int, metric_samples: int,
) -> str:
    """The Overview's facts table (capture, span, GPUs used, kernels, copies, graph replays,
    each GPU's busy time, NVTX and GPU-metric counts) and its time-breakdown chart, from what
    each report path counts its own way (whole tables or kernel columns)."""
    import shlex

    from tracekit.viz import breakdown_chart

    meta = getattr(trace, "meta", None)
    processes = list(getattr(meta, "processes", None) or [])
    argv = getattr(processes[0], "command", None) if processes else None
    command = shlex.join(argv) if isinstance(argv, list | tuple) else str(argv or "")
    used = set(used_devices) | (set(graphs["device_id"].drop_nulls().to_list()) if graphs is not None else set())
    gpu_text = (
        ", ".join(
            f"{r['device_id']}: {r['name']}"
            for r in trace.gpus.filter(pl.col("device_id").is_in(sorted(used))).iter_rows(named=True)
        )
        or "–"
    )
    paths = getattr(trace, "paths", None)
    memcpys = trace.memcpys
    rows = [
        ("file", str(getattr(trace, "path", None) or ", ".join(str(p) for p in paths or []))),
        ("Nsight Systems", str(getattr(meta, "version", None) or getattr(meta, "product_version", "?"))),
        ("command", command or "–"),
        ("GPU work span", fmt_ns(window[1] - window[0]) if window else "–"),
        ("GPUs used", gpu_text),
        ("kernels", kernels_text),
        ("memory copies", f"{memcpys.height:,} ({fmt_bytes(memcpys['bytes'].sum())})"),
    ]
    if graphs is not None:
        rows.append((
            "CUDA graph replays",
            f"{graphs.height:,} launches traced whole, {fmt_ns(graphs['duration_ns'].sum())} GPU time "
            "(their kernels are not in the trace: see CUDA graphs)",
        ))  # fmt: skip
    for r in _busy_ns(breakdown()).iter_rows(named=True):
        rows.append((
            f"{r['group']} busy",
            f"{fmt_ns(r['busy_ns'])} of {fmt_ns(r['window_ns'])}, the GPU work span "
            f"({r['busy_ns'] / max(r['window_ns'], 1):.0%}); idle {fmt_ns(r['idle_ns'])}",
        ))  # fmt: skip
    rows += [("NVTX events", f"{nvtx_events:,}"), ("GPU metric samples", f"{metric_samples:,}")]
    out = _facts(rows)
    if not breakdown().is_empty():
        out += page.chart(breakdown_chart(breakdown(), title="Where the GPU time goes"))
    return out


def _kernels_html(page: _Page, top: pl.DataFrame, durations: pl.DataFrame, top_n: int) -> str:
    """The top-kernels chart and table (``top``: :func:`~tracekit.viz.prep.top_kernels`) and
    the duration chart (``durations``: the kernels or their
    :func:`~tracekit.viz.prep.duration_histogram`)."""
    from tracekit.viz import duration_chart, top_kernels_chart

    table = html_table(
        top.select(
            "name", "family", "instances", "total_ns", "mean_ns", "median_ns", "max_ns", "share"
        ),
        formats={c: fmt_ns for c in ("total_ns", "mean_ns", "median_ns", "max_ns")}
        | {"share": lambda v: f"{100 * v:.1f}%"},
        left=("name", "family"),
    )
    return (
        page.chart(
            top_kernels_chart(top.head(25), title=f"Top {min(top_n, 25)} kernels by GPU time")
        )
        + table
        + page.chart(duration_chart(durations, title="Kernel durations"))
    )


def _nvtx_html(page: _Page, attributed: pl.DataFrame) -> str:
    """The layer heatmap and the NVTX tree of ``attributed`` (GPU operations with their
    ``nvtx_path``: :func:`~tracekit.viz.prep.attributed_kernels`)."""
    from tracekit.viz import layer_heatmap

    tree = prep.nvtx_tree(attributed, max_depth=3)
    out = ""
    matrix = prep.layer_block_matrix(attributed)
    if not matrix.is_empty():
        out += page.chart(layer_heatmap(matrix, title="GPU time per layer and block (ms)"))
    if tree.is_empty():
        return out + _note("No GPU work was launched inside NVTX ranges.")
    shown = tree.with_columns(
        pl.concat_str(
            pl.lit("\u2003").repeat_by(pl.col("depth") - 1).list.join(""), pl.col("name")
        ).alias("range")
    )
    return (
        out
        + "<h3>GPU time by NVTX range (inclusive, 3 levels)</h3>"
        + html_table(
            shown.select("range", "gpu_time_ns", "ops", "share"),
            formats={"gpu_time_ns": fmt_ns, "share": lambda v: f"{100 * v:.1f}%"},
            left=("range",),
            max_rows=120,
        )
    )


_MODE_TEXT = {
    "graph": (
        "Traced whole (nsys --cuda-graph-trace=graph, its default): each launch is one GPU operation spanning its "
        "replay, counted as GPU work in the overview, the timeline and the NVTX breakdown; the kernels inside are not "
        "in the trace, so the top-kernels table and the kernel-based findings do not see them. Capture with "
        "--cuda-graph-trace=node to see them (it lengthens every launch call on the host)."
    ),
    "node": (
        "Traced per node (nsys --cuda-graph-trace=node): every kernel, copy and memset of a replay is in the trace; "
        "a replay runs from its first operation's start to its last one's end. Per-node tracing lengthens each "
        "launch call on the host (docs/tables.md), so the launch cost here is above an untraced run's."
    ),
}


def _graphs(page: _Page, trace: Any, breakdown: Callable[[], pl.DataFrame]) -> str:
    from tracekit.analysis.graphs import graph_summary
    from tracekit.viz import iterations_chart

    launches = _graph_launches(trace)
    if launches.is_empty():
        return _note("No CUDA graph launches in this trace.")
    busy = _busy_ns(breakdown())
    total = int(busy["busy_ns"].sum()) if busy.height else None
    summary = graph_summary(launches, total_gpu_ns=total)
    modes = sorted(set(launches["mode"].drop_nulls().to_list()))
    out = "".join(_note(_MODE_TEXT[m]) for m in modes if m in _MODE_TEXT)
    out += _facts([
        ("graph launches", f"{launches.height:,} of {summary.height:,} graph{'s' if summary.height != 1 else ''}"),
        ("GPU time in replays", f"{fmt_ns(summary['gpu_time_ns'].sum())}" + (
            f" ({summary['gpu_time_ns'].sum() / total:.1%} of the GPUs' busy time)" if total else "")),
    ])  # fmt: skip
    pct = lambda v: "–" if v is None else f"{100 * v:.1f}%"  # noqa: E731
    shown = summary.select(
        "pid", "graph_exec_id", "graph_id", "mode", "devices", "launches", "gpu_time_ns", "share", "replay_median_ns",
        "replay_p90_ns", "kernels_per_replay", "launch_api_median_ns", "first_nvtx_path",
    )  # fmt: skip
    out += html_table(
        shown,
        formats={c: fmt_ns for c in ("gpu_time_ns", "replay_median_ns", "replay_p90_ns", "launch_api_median_ns")}
        | {"share": pct, "kernels_per_replay": lambda v: "–" if v is None else f"{v:.0f}"},
        left=("mode", "devices", "first_nvtx_path"),
        headers={
            "graph_exec_id": "graph exec", "graph_id": "graph", "gpu_time_ns": "GPU time", "share": "of busy time",
            "replay_median_ns": "replay median", "replay_p90_ns": "replay p90", "kernels_per_replay": "kernels / replay",
            "launch_api_median_ns": "launch call (median)", "first_nvtx_path": "NVTX path (first launch)",
        },  # fmt: skip
        max_rows=50,
    )
    several = launches.select("pid", "device_id").n_unique() > 1
    label = pl.concat_str(
        pl.lit("graph exec "), pl.col("graph_exec_id").cast(pl.Utf8).fill_null("?"),
        *([pl.lit(" · GPU "), pl.col("device_id").cast(pl.Utf8)] if several else []),
    )  # fmt: skip
    replays = (
        launches.sort("start_ns")
        .with_columns(label.alias("group"))
        .with_columns(pl.int_range(pl.len()).over("group").cast(pl.Int64).alias("iteration"))
        .select("group", "iteration", pl.col("nvtx_path").fill_null("").alias("name"), "start_ns", "end_ns", "duration_ns")
    )
    shown, note = _iteration_points(replays, "launches")
    return out + note + page.chart(iterations_chart(shown, title="Replay span on the GPU, launch by launch"))


def _communication_html(page: _Page, trace: Any, top: pl.DataFrame) -> str:
    """The communication kernels' table (``top``: :func:`~tracekit.viz.prep.top_kernels` of
    them) and the NCCL calls of ``trace.nccl``."""
    from tracekit.viz import nccl_bandwidth_chart

    out = html_table(
        top.select(
            "name", "instances", "total_ns", "mean_ns", "max_ns", "share"
        ),
        formats={
            "total_ns": fmt_ns,
            "mean_ns": fmt_ns,
            "max_ns": fmt_ns,
            "share": lambda v: f"{100 * v:.1f}% of kernel time",
        },
        left=("name",),
    )
    try:
        calls = prep.nccl_bandwidth(trace.nccl)
    except Exception as exc:
        return out + _note(f"NCCL calls could not be read: {type(exc).__name__}: {exc}")
    if calls.is_empty():
        return out + _note("No NCCL calls recognised.")
    per_op = (
        calls.group_by("op")
        .agg(
            pl.len().alias("calls"),
            pl.col("bytes").sum().alias("bytes"),
            ((pl.col("gpu_duration_ns") * pl.col("kernel_share").fill_null(1.0)).sum() if "kernel_share" in calls.columns
             else pl.col("gpu_duration_ns").sum()).alias("gpu_time_ns"),
            pl.col("bus_bandwidth_gbps").median().alias("median_busbw_gbps"),
        )
        .sort("gpu_time_ns", descending=True, nulls_last=True)
    )
    out += "<h3>NCCL calls</h3>" + html_table(
        per_op, formats={"bytes": fmt_bytes, "gpu_time_ns": fmt_ns, "median_busbw_gbps": lambda v: "–" if v is None else f"{v:.2f} GB/s"},
        left=("op",),
    )  # fmt: skip
    if not calls["bus_bandwidth_gbps"].drop_nulls().is_empty():
        out += page.chart(nccl_bandwidth_chart(calls, title="NCCL bus bandwidth vs message size"))
    return out


def _metrics_html(page: _Page, data: pl.DataFrame, summary: pl.DataFrame, origin: int | None) -> str:
    """The GPU-metrics chart (``data``: ``trace.gpu_metrics`` or its
    :func:`~tracekit.viz.prep.gpu_metrics_series`) and the summary table (``device_id``,
    ``metric_label``, ``mean_pct``, ``max_pct``)."""
    from tracekit.viz import gpu_metrics_chart

    g = data
    return page.chart(
        gpu_metrics_chart(g, origin_ns=origin, width=1000, title="GPU metrics over time")  # binned within altair's row limit
    ) + html_table(
        summary,
        formats={"mean_pct": lambda v: f"{v:.1f}%", "max_pct": lambda v: f"{v:.0f}%"},
        left=("metric_label",),
    )


def _memory(page: _Page, trace: Any, origin: int | None) -> str:
    from tracekit.viz import memory_chart

    m = trace.memory_usage
    if m.is_empty():
        return _note("No memory events (capture with nsys --cuda-memory-usage=true).")
    return _note(
        "Allocations seen during the capture, counted from zero at its start."
    ) + page.chart(
        memory_chart(m, origin_ns=origin, width=1000, title="Device memory allocated")
    )


def _layer_memory(page: _Page, trace: Any, nvtx: pl.DataFrame | None = None) -> str:
    """The memory-per-layer section (``nvtx``: the NVTX table, or the columns
    :func:`~tracekit.analysis.memory.layer_memory` reads; ``trace.nvtx`` by default)."""
    import warnings

    from tracekit.analysis.memory import layer_memory, layer_memory_summary
    from tracekit.viz import layer_growth_chart, layer_memory_chart

    if trace.memory_usage.is_empty():
        return _note("No memory events (capture with nsys --cuda-memory-usage=true), so no memory per layer.")
    if nvtx is None:
        nvtx = trace.nvtx
    if nvtx.is_empty():
        return _note("No NVTX ranges in this trace: annotate layers (layer.N) with NVTX to see the memory each adds.")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = layer_memory(trace.memory_usage, nvtx, ranges=prep.LAYER_MEMORY_PATTERN)
    if rows.is_empty():
        why = next((str(c.message) for c in caught), "no rows")
        return _note(f"No memory per layer: {why} (ranges named layer.N, backward or optimizer are shown).")
    summary = layer_memory_summary(rows)
    cols = ["mean_net_growth_bytes", "mean_allocated_bytes", "mean_freed_bytes", "max_peak_above_entry_bytes"]
    return (
        _note(
            "Device memory of each range's process at the range's entry and exit (tracekit.analysis.memory."
            "layer_memory): events at the range's start count inside it, events at its end after it; memory "
            "allocated before the capture is not counted."
        )
        + page.chart(layer_memory_chart(rows, trace.memory_usage, width=1000, title="Memory in use per layer range"))
        + page.chart(layer_growth_chart(summary, title="Mean net growth per range"))
        + html_table(
            summary.select("name", "phase", "instances", *cols), left=("name", "phase"), max_rows=60,
            formats=dict.fromkeys(cols, fmt_bytes), headers={c: c.removesuffix("_bytes").replace("_", " ") for c in cols},
        )
    )


def _has_graph_launches(trace: Any) -> bool:
    """Whether the trace launched CUDA graphs (either trace mode); ``True`` when finding out
    failed, so that the section shows why instead of vanishing."""
    try:
        return not _graph_launches(trace).is_empty()
    except Exception:
        log.debug("reading the CUDA graph launches failed", exc_info=True)
        return True
