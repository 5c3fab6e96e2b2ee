"""Altair charts of Nsight Systems data: kernels, timeline, breakdowns, metrics, memory (per layer too), NCCL.

Each function takes tracekit tables (or the small frames of :mod:`tracekit.viz.prep`, which
it recognises by their columns), aggregates with polars and returns an ``alt.Chart`` (or a
layered / concatenated chart). Times are shown in milliseconds from ``origin_ns`` (by default
the first event shown). Charts that support drill-down carry named selections:

``kernel``
    a point selection on the kernel ``name`` (click a bar or a timeline mark);
``window``
    an interval selection on time (drag on the timeline or a time series), in ms from the
    origin.

Read them back in a notebook with ``alt.JupyterChart(chart).selections`` (what
:class:`tracekit.widgets.TraceExplorer` does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl

from tracekit.viz import prep
from tracekit.viz._chart_base import (  # noqa: F401  (re-exported: charts.within_row_budget …)
    KERNEL_PARAM,
    ROW_BUDGET,
    WINDOW_PARAM,
    _alt,
    _bounds,
    _family_color,
    _in_window,
    _kernel_pick,
    _lines,
    _ms,
    _nothing,
    _short,
    _titled,
    within_row_budget,
)
from tracekit.viz.charts_timeline import timeline_chart  # noqa: F401  (re-exported)
from tracekit.viz.theme import BREAKDOWN_COLORS
from tracekit.viz.window import window_label

#: Axis of each sort of the top-kernels chart: (column, axis title, scale to ms/µs).
_TOP_AXES = {
    "total_ns": ("total_ms", "GPU time (ms)", 1e6),
    "mean_ns": ("mean_us", "mean duration (µs)", 1e3),
    "median_ns": ("median_us", "median duration (µs)", 1e3),
    "max_ns": ("max_us", "longest instance (µs)", 1e3),
    "instances": ("instances", "instances", None),
}


def top_kernels_chart(
    data: pl.DataFrame,
    *,
    n: int = 20,
    by: str = "name",
    sort: str = "total",
    window: Any = None,
    highlight: str | None = None,
    title: str | None = None,
    label_chars: int = 56,
) -> Any:
    """Horizontal bars of the kernels with the most GPU time (or the largest ``sort``
    value), one bar per kernel, coloured by family.

    Parameters
    ----------
    data
        ``trace.kernels``, or :func:`tracekit.viz.prep.top_kernels` output (``name``,
        ``family``, ``total_ns``, ``instances``, ``mean_ns``, ``share``; ``label`` optional).
    n
        How many kernels (ignored for an already aggregated frame).
    by
        ``name`` (default: one bar per kernel, keyed by its full demangled name, labelled
        with a distinct short label) or ``short_name`` (template variants merged).
    sort
        ``total`` (GPU time), ``mean``, ``median``, ``max`` or ``instances``: the bars' length,
        their order and the title follow it.
    window
        ``(start_ns, end_ns)`` or a :class:`~tracekit.viz.window.ViewWindow`: only kernels
        overlapping it; the subtitle names it.
    highlight
        A kernel name to show selected.
    label_chars
        Longest bar label, in characters (labels stay distinct at any length: 28 fits a
        one-column paper figure).

    Selections: ``kernel`` (click a bar; the value is the full name).
    """
    alt = _alt()
    key = prep._sort_column(sort)
    words = next(w for c, w in prep.TOP_SORTS.values() if c == key)
    title = title if title is not None else f"Top kernels by {words}"
    subtitle = window_label(window)
    if "total_ns" in data.columns:
        top = data
        kernels = None
    else:
        kernels = _in_window(data, window)
        if kernels is None or kernels.is_empty():
            return _nothing("kernels" if data.is_empty() else "no kernels", window, title)
        top = prep.top_kernels(kernels, n=n, by=by, sort=sort)
    if top.is_empty():
        return _nothing("no kernels", window, title)
    if "label" in top.columns and top["label"].str.len_chars().max() > label_chars:  # type: ignore[operator]
        top = top.drop("label")
    top = prep.with_kernel_labels(top, kernels, limit=label_chars)
    col, axis_title, scale = _TOP_AXES[key]
    frame = top.with_columns(
        *[(pl.col(c) / f).alias(a) for c, (a, _t, f) in _TOP_AXES.items() if f is not None and c in top.columns],
        (pl.col("share") * 100).round(2).alias("share_pct") if "share" in top.columns else pl.lit(None, pl.Float64).alias("share_pct"),
        pl.col("name").cast(pl.Utf8).str.slice(0, 300).alias("full_name"),
    )
    order = frame.sort(key, "name", descending=[True, False])["label"].to_list()
    pick = _kernel_pick(alt, highlight)
    tooltip = [alt.Tooltip("full_name:N", title="kernel"), "family:N", alt.Tooltip("instances:Q", format=",")]
    tooltip += [alt.Tooltip(f"{a}:Q", format=".3f" if a.endswith("ms") else ".1f", title=t)
                for c, (a, t, f) in _TOP_AXES.items() if f is not None and a in frame.columns]
    tooltip.append(alt.Tooltip("share_pct:Q", format=".2f", title="share of GPU time (%)"))
    chart = (
        alt.Chart(frame)
        .mark_bar()
        .encode(
            y=alt.Y("label:N", sort=order, title=None, axis=alt.Axis(labelLimit=round(label_chars * 6.8))),
            x=alt.X(f"{col}:Q", title=axis_title),
            color=_family_color(alt, frame),
            opacity=alt.condition(pick, alt.value(1.0), alt.value(0.35)),
            tooltip=tooltip,
        )
        .add_params(pick)
    )
    return _titled(chart, title, subtitle)


def duration_chart(
    data: pl.DataFrame, *, bins_per_decade: int = 5, window: Any = None, title: str | None = None
) -> Any:
    """Distribution of kernel durations (log bins), stacked by family.

    Parameters
    ----------
    data
        ``trace.kernels`` or :func:`tracekit.viz.prep.duration_histogram` output
        (``group``, ``bin_start_ns``, ``bin_end_ns``, ``count``).
    """
    alt = _alt()
    if "bin_start_ns" not in data.columns:
        data = _in_window(data, window)  # type: ignore[assignment]
    hist = (
        data
        if "bin_start_ns" in data.columns
        else prep.duration_histogram(data, bins_per_decade=bins_per_decade)
    )
    if hist.is_empty():
        return _nothing("kernels" if window is None else "no kernels", window, title)
    frame = hist.with_columns(
        (pl.col("bin_start_ns") / 1e3).alias("start_us"),
        (pl.col("bin_end_ns") / 1e3).alias("end_us"),
        pl.col("group").alias("family"),
    )
    chart = (
        alt.Chart(frame)
        .mark_bar(stroke="white", strokeWidth=0.3)
        .encode(
            x=alt.X("start_us:Q", scale=alt.Scale(type="log"), title="kernel duration (µs)"),
            x2="end_us:Q",
            y=alt.Y("sum(count):Q", stack="zero", title="kernels"),
            color=_family_color(alt, frame),
            tooltip=["family:N", alt.Tooltip("start_us:Q", format=".2f", title="from (µs)"),
                     alt.Tooltip("end_us:Q", format=".2f", title="to (µs)"), alt.Tooltip("sum(count):Q", title="kernels")],
        )
    )  # fmt: skip
    return _titled(chart, title, window_label(window))


# -- breakdowns ----------------------------------------------------------------------------------
def breakdown_chart(data: pl.DataFrame, *, window: Any = None, title: str | None = None) -> Any:
    """Stacked bars: share of time in compute, communication, overlap, memcpy and idle per GPU/rank.

    Parameters
    ----------
    data
        :func:`tracekit.viz.prep.temporal_breakdown` output (``group``, ``category``,
        ``time_ns``, ``fraction``), the same columns from ``tracekit.analysis``, or
        ``trace.kernels`` (then computed per device).
    window
        The window the breakdown covers (``(start_ns, end_ns)`` or a
        :class:`~tracekit.viz.window.ViewWindow`): computed over it from ``trace.kernels``,
        named in the subtitle either way.
    """
    alt = _alt()
    frame = data if "category" in data.columns else prep.temporal_breakdown(data, window=_bounds(window))
    if frame.is_empty() or frame["time_ns"].sum() == 0:
        return _nothing("kernels" if window is None else "no GPU work", window, title)
    if "group" not in frame.columns:
        key = "rank" if "rank" in frame.columns else "device_id"
        frame = frame.with_columns(
            pl.concat_str(pl.lit(f"{key} "), pl.col(key).cast(pl.Utf8)).alias("group")
        )
    if "fraction" not in frame.columns:
        frame = frame.with_columns(
            (pl.col("time_ns") / pl.col("time_ns").sum().over("group")).alias("fraction")
        )
    cats = [c for c in BREAKDOWN_COLORS if c in set(frame["category"].to_list())]
    frame = frame.with_columns(
        (pl.col("fraction") * 100).alias("percent"),
        (pl.col("time_ns") / 1e6).alias("time_ms"),
        pl.col("category")
        .replace_strict(
            {c: i for i, c in enumerate(BREAKDOWN_COLORS)}, default=99, return_dtype=pl.Int64
        )
        .alias("order"),
    )
    chart = (
        alt.Chart(frame)
        .mark_bar()
        .encode(
            y=alt.Y("group:N", title=None),
            x=alt.X("percent:Q", stack="zero", title="share of time (%)", scale=alt.Scale(domain=[0, 100])),
            color=alt.Color("category:N", scale=alt.Scale(domain=cats, range=[BREAKDOWN_COLORS[c] for c in cats]), title=None),
            order=alt.Order("order:Q"),
            tooltip=["group:N", "category:N", alt.Tooltip("time_ms:Q", format=".3f", title="time (ms)"),
                     alt.Tooltip("percent:Q", format=".1f", title="%")],
        )
    )  # fmt: skip
    return _titled(chart, title, window_label(window))


def layer_heatmap(data: pl.DataFrame, *, value: str = "time_ns", title: str | None = None) -> Any:
    """Heatmap of GPU time per layer (rows) and block (columns), with the ms in each cell.

    Parameters
    ----------
    data
        :func:`tracekit.viz.prep.layer_block_matrix` output (``layer``, ``block``,
        ``time_ns``) or the same shape from ``tracekit.analysis`` (``gpu_time_ns`` is
        accepted for ``time_ns``).
    """
    alt = _alt()
    if value not in data.columns and "gpu_time_ns" in data.columns:
        value = "gpu_time_ns"
    if data.is_empty() or value not in data.columns or data.filter(pl.col(value) > 0).is_empty():
        return _nothing("layers", None, title)
    data = data.filter(pl.col("layer").is_not_null())
    frame = data.with_columns(
        (pl.col(value) / 1e6).alias("time_ms"), pl.col("layer").cast(pl.Int64)
    )
    base = alt.Chart(frame).encode(
        x=alt.X("block:N", title="block", axis=alt.Axis(labelAngle=0)),
        y=alt.Y("layer:O", title="layer"),
    )
    cells = base.mark_rect().encode(
        color=alt.Color("time_ms:Q", scale=alt.Scale(scheme="blues"), title="GPU time (ms)"),
        tooltip=[
            "layer:O",
            "block:N",
            alt.Tooltip("time_ms:Q", format=".3f", title="GPU time (ms)"),
        ]
        + ([alt.Tooltip("instances:Q", title="kernels")] if "instances" in frame.columns else []),
    )
    mid = float(frame["time_ms"].max() or 0) / 2  # type: ignore[arg-type]
    text = base.mark_text(baseline="middle").encode(
        text=alt.Text("time_ms:Q", format=".2f"),
        color=alt.condition(f"datum.time_ms > {mid}", alt.value("white"), alt.value("black")),
    )
    n_blocks = max(frame["block"].n_unique(), 1)
    n_layers = max(frame["layer"].n_unique(), 1)
    chart = alt.layer(cells, text).properties(
        width=min(max(90 * n_blocks, 180), 700), height=min(max(24 * n_layers, 80), 900)
    )
    return _titled(chart, title)


def iterations_chart(
    data: pl.DataFrame, *, log: bool | None = None, title: str | None = None, subtitle: str | None = None
) -> Any:
    """Duration of each iteration per GPU, rank or process, warm-up marked.

    Parameters
    ----------
    data
        ``trace.nvtx`` (``step.N`` ranges), :func:`tracekit.viz.prep.iteration_times` or
        :func:`tracekit.viz.prep.structure_iterations` output (``group``, ``iteration``,
        ``duration_ns``; ``name`` ``warm-up``/``steady`` marks the phase, ``evaluation``/
        ``checkpoint`` a training step that holds that periodic work). More than
        :data:`tracekit.viz.prep.MAX_ITERATION_POINTS` iterations are drawn binned
        (:func:`tracekit.viz.prep.binned_iterations`: each point the median of that many
        consecutive ones, said in the subtitle).
    log
        A logarithmic duration axis, so that a warm-up of seconds does not flatten steps of
        milliseconds; by default when the longest iteration is over 5× the median.
    """
    alt = _alt()
    frame = data if "iteration" in data.columns else prep.iteration_times(data)
    if frame.is_empty():
        return _nothing("iterations", None, title)
    if "group" not in frame.columns:
        frame = frame.with_columns(pl.lit("all").alias("group"))
    phases = ["warm-up", "steady", "evaluation", "checkpoint"]
    phase = "name" in frame.columns and set(frame["name"].drop_nulls().unique().to_list()) <= set(phases)
    frame, size = prep.binned_iterations(frame)
    frame = frame.with_columns(
        (pl.col("duration_ns").clip(lower_bound=1) / 1e6).alias("duration_ms"),
        (pl.col("name") if phase else pl.lit("iteration")).alias("phase"),
    )
    if log is None:
        median = frame["duration_ms"].median() or 0
        log = bool(median) and float(frame["duration_ms"].max()) > 5 * float(median)  # type: ignore[arg-type]
    groups = frame["group"].n_unique()
    color = (alt.Color("group:N", title=None) if groups > 1 or not phase
             else alt.Color("phase:N", title=None, scale=alt.Scale(domain=phases, range=["#E69F00", "#0072B2", "#009E73", "#CC79A7"])))
    y = alt.Y("duration_ms:Q", title="duration (ms, log scale)" if log else "duration (ms)",
              scale=alt.Scale(type="log") if log else alt.Scale(zero=True))
    line = alt.Chart(frame).mark_line(opacity=0.5).encode(
        x=alt.X("iteration:Q", title="iteration", axis=alt.Axis(format="d", tickMinStep=1)),
        y=y, detail="group:N",
        color=alt.Color("group:N", legend=None) if groups > 1 else alt.value("#999999"))
    points = alt.Chart(frame).mark_point(filled=True).encode(
        x="iteration:Q", y=y, color=color,
        shape=alt.Shape("phase:N", title=None, scale=alt.Scale(domain=phases, range=["triangle-up", "circle", "square", "diamond"]))
        if phase and groups > 1 else alt.Undefined,
        tooltip=["group:N", "iteration:Q", alt.Tooltip("duration_ms:Q", format=",.3f", title="ms"), "phase:N"]
        + ([alt.Tooltip("name:N", title="iterations")] if size > 1 else []),
    )
    layers = [line, points]
    steady = frame.filter(pl.col("phase") == "steady") if phase else frame
    if steady.height:
        med = float(steady["duration_ms"].median())  # type: ignore[arg-type]
        ref = pl.DataFrame({"duration_ms": [med], "text": [f"steady median {med:,.3g} ms"]})
        layers += [alt.Chart(ref).mark_rule(strokeDash=[4, 3], color="#0072B2", opacity=0.6).encode(y="duration_ms:Q"),
                   alt.Chart(ref).mark_text(align="right", baseline="bottom", dy=-2, x="width", fontSize=10,
                                            color="#0072B2").encode(y="duration_ms:Q", text="text:N")]
    chart = alt.layer(*layers)
    note = f"each point: the median of {size:,} consecutive iterations" if size > 1 else None
    sub = " · ".join(t for t in (subtitle, note) if t)
    return _titled(chart, title, sub or None)


# -- time series ---------------------------------------------------------------------------------
def gpu_metrics_chart(
    data: pl.DataFrame,
    *,
    metrics: Sequence[str] = prep.DEFAULT_GPU_METRICS,
    window: Any = None,
    gpus: pl.DataFrame | None = None,
    origin_ns: int | None = None,
    max_points: int = 600,
    width: int = 800,
    height: int = 80,
    title: str | None = None,
) -> Any:
    """GPU metrics over time in stacked panels, one per metric (SMs active, Tensor active,
    DRAM read and write), each titled with its mean over the window; one line per GPU.

    Parameters
    ----------
    data
        ``trace.gpu_metrics``, or :func:`tracekit.viz.prep.gpu_metric_panels` output
        (``device_id``, ``panel``, ``panel_order``, ``time_ns``, ``value``), or
        :func:`tracekit.viz.prep.gpu_metrics_series` output (``label``, ``value_pct``).
    window
        ``(start_ns, end_ns)`` or a :class:`~tracekit.viz.window.ViewWindow`: the samples in
        it and the means over it (named in the subtitle); the whole capture by default.
    gpus
        ``trace.gpus``: with each GPU's peak DRAM bandwidth, the DRAM panels are in GB/s
        (their titles also say the share of the peak).

    Selections: ``window`` (drag horizontally).
    """
    alt = _alt()
    win = _bounds(window)
    if "panel" in data.columns:
        series = data
    elif "value_pct" in data.columns:
        series = data.with_columns(
            (pl.col("label") + " (% of peak)").alias("panel"), pl.lit(0, pl.Int64).alias("panel_order"),
            pl.col("value_pct").alias("value"))
    elif data.is_empty():
        return _nothing("gpu_metrics", None, title)
    else:
        series = within_row_budget(
            lambda n: prep.gpu_metric_panels(data, metrics=metrics, window=win, gpus=gpus, max_points=n), max_points)
    if series.is_empty():
        return _nothing("no GPU metric samples", window, title)
    if origin_ns is None:
        origin_ns = win[0] if win else int(series["time_ns"].min() or 0)  # type: ignore[arg-type]
    frame = series.with_columns(
        _ms("time_ns", origin_ns).alias("time_ms"),
        pl.concat_str(pl.lit("GPU "), pl.col("device_id").cast(pl.Utf8)).alias("gpu"),
    )
    if "max_pct" not in frame.columns:
        frame = frame.with_columns(pl.lit(None, pl.Float64).alias("max_pct"))
    panels = frame.select("panel", "panel_order").unique().sort("panel_order", "panel")["panel"].to_list()
    several = frame["gpu"].n_unique() > 1
    color = (alt.Color("gpu:N", title=None) if several
             else alt.Color("panel:N", legend=None, scale=alt.Scale(
                 domain=panels, range=[_panel_color(p) for p in panels])))
    brush = alt.selection_interval(name=WINDOW_PARAM, encodings=["x"])
    x_scale = alt.Scale(zero=False, nice=False, domain=[0, (win[1] - win[0]) / 1e6]) if win and origin_ns == win[0] \
        else alt.Scale(zero=False, nice=False)
    base = (
        alt.Chart(frame)
        .mark_line(interpolate="step-after")
        .encode(
            x=alt.X("time_ms:Q", title="time (ms)", scale=x_scale),
            y=alt.Y("value:Q", title=None, scale=alt.Scale(zero=True)),
            color=color,
            tooltip=[
                "gpu:N",
                alt.Tooltip("panel:N", title="metric"),
                alt.Tooltip("time_ms:Q", format=".3f", title="ms"),
                alt.Tooltip("value:Q", format=",.1f", title="mean in bin"),
                alt.Tooltip("value_pct:Q", format=".1f", title="% of peak"),
                alt.Tooltip("max_pct:Q", format=".0f", title="max %"),
            ],
        )  # fmt: skip
        .add_params(brush)
        .properties(width=width, height=height)
    )
    chart = base.facet(
        row=alt.Row("panel:N", sort=panels, title=None,
                    header=alt.Header(labelAngle=0, labelOrient="top", labelAnchor="start", labelAlign="left",
                                      labelFontWeight="bold", labelPadding=2)),
        spacing=8,
    ).resolve_scale(y="independent")
    return _titled(chart, title, window_label(window))


def _panel_color(panel: str) -> str:
    for name, color in prep.METRIC_PANELS.values():
        if panel.startswith(name):
            return color
    return "#555555"


def memory_chart(
    data: pl.DataFrame,
    *,
    window: Any = None,
    origin_ns: int | None = None,
    max_points: int = 800,
    width: int = 800,
    height: int = 160,
    title: str | None = None,
) -> Any:
    """Device memory allocated during the capture, over time, per GPU.

    Parameters
    ----------
    data
        ``trace.memory_usage`` or :func:`tracekit.viz.prep.memory_series` output
        (``device_id``, ``time_ns``, ``in_use_bytes``).
    """
    alt = _alt()
    if data.is_empty():
        return _nothing("memory_usage", None, title)
    win = _bounds(window)
    series = (
        data if "in_use_bytes" in data.columns
        else within_row_budget(lambda n: prep.memory_series(data, window=win, max_points=n), max_points)
    )
    if series.is_empty():
        return _nothing("no memory events", window, title)
    if origin_ns is None:
        origin_ns = win[0] if win else int(series["time_ns"].min() or 0)  # type: ignore[arg-type]
    frame = series.with_columns(
        _ms("time_ns", origin_ns).alias("time_ms"),
        (pl.col("in_use_bytes") / 2**20).alias("in_use_mib"),
        pl.concat_str(pl.lit("GPU "), pl.col("device_id").cast(pl.Utf8)).alias("gpu")
        if "device_id" in series.columns
        else pl.lit("all").alias("gpu"),
    )
    chart = (
        alt.Chart(frame)
        .mark_line(interpolate="step-after")
        .encode(
            x=alt.X("time_ms:Q", title="time (ms)", scale=alt.Scale(zero=False, nice=False)),
            y=alt.Y("in_use_mib:Q", title="allocated (MiB)"),
            color=alt.Color("gpu:N", title=None),
            tooltip=[
                "gpu:N",
                alt.Tooltip("time_ms:Q", format=".3f", title="ms"),
                alt.Tooltip("in_use_mib:Q", format=",.1f", title="MiB"),
            ],
        )  # fmt: skip
        .properties(width=width, height=height)
    )
    return _titled(chart, title, window_label(window))


def layer_memory_chart(
    per_range: pl.DataFrame,
    memory: pl.DataFrame,
    *,
    origin_ns: int | None = None,
    max_points: int = 800,
    max_bands: int = 400,
    width: int = 800,
    height: int = 160,
    title: str | None = None,
) -> Any:
    """Memory in use as a line over bands of the NVTX ranges (layers), one panel per process
    and GPU.

    Parameters
    ----------
    per_range
        :func:`tracekit.analysis.memory.layer_memory` output, best with the ranges to show
        (``ranges=r"^layer\\.\\d+$"``), or :func:`tracekit.viz.prep.layer_bands` output.
        Only the outermost level present becomes bands.
    memory
        ``trace.memory_usage`` or :func:`tracekit.viz.prep.layer_memory_series` output
        (``lane``, ``time_ns``, ``in_use_bytes``).

    Bands are coloured by range name (tooltip: entry, peak, net growth, allocated, freed);
    the line is the memory of the range's process on that GPU (step-after).
    """
    alt = _alt()
    if per_range.is_empty():
        return _nothing("layers" if not memory.is_empty() else "memory_usage", None, title)
    bands = per_range if "lane" in per_range.columns else prep.layer_bands(per_range, max_bands=max_bands)
    series = memory if "lane" in memory.columns else prep.layer_memory_series(memory, per_range, max_points=max_points)
    if origin_ns is None:
        starts = [int(v) for v in (bands["start_ns"].min(), series["time_ns"].min()) if isinstance(v, int)]
        origin_ns = min(starts) if starts else 0
    mib = 2**20
    b = bands.with_columns(
        _ms("start_ns", origin_ns).alias("start_ms"), _ms("end_ns", origin_ns).alias("end_ms"),
        *((pl.col(c) / mib).alias(c.replace("_bytes", "_mib")) for c in (
            "in_use_at_entry_bytes", "peak_inside_bytes", "net_growth_bytes", "allocated_bytes", "freed_bytes")),
    )
    line = series.with_columns(_ms("time_ns", origin_ns).alias("time_ms"), (pl.col("in_use_bytes") / mib).alias("in_use_mib"))
    names = b["name"].unique(maintain_order=True).to_list()
    x = alt.X("start_ms:Q", title="time (ms)", scale=alt.Scale(zero=False, nice=False))

    def panel(lane: str | None) -> Any:
        bb = b if lane is None else b.filter(pl.col("lane") == lane)
        ll = line if lane is None else line.filter(pl.col("lane") == lane)
        rect = alt.Chart(bb).mark_rect(opacity=0.25).encode(
            x=x, x2="end_ms:Q",
            color=alt.Color("name:N", title="range", scale=alt.Scale(domain=names),
                            legend=alt.Legend() if len(names) <= 16 else None),
            tooltip=["name:N", "phase:N", "step:O",
                     alt.Tooltip("in_use_at_entry_mib:Q", format=",.1f", title="entry MiB"),
                     alt.Tooltip("peak_inside_mib:Q", format=",.1f", title="peak MiB"),
                     alt.Tooltip("net_growth_mib:Q", format=",.2f", title="net growth MiB"),
                     alt.Tooltip("allocated_mib:Q", format=",.2f", title="allocated MiB"),
                     alt.Tooltip("freed_mib:Q", format=",.2f", title="freed MiB")],
        )
        mem = alt.Chart(ll).mark_line(interpolate="step-after", color="black").encode(
            x=alt.X("time_ms:Q", title="time (ms)", scale=alt.Scale(zero=False, nice=False)),
            y=alt.Y("in_use_mib:Q", title="in use (MiB)", scale=alt.Scale(zero=False)),
            tooltip=[alt.Tooltip("time_ms:Q", format=".3f", title="ms"),
                     alt.Tooltip("in_use_mib:Q", format=",.1f", title="MiB")],
        )
        chart = alt.layer(rect, mem).properties(width=width, height=height)
        return chart.properties(title=lane) if lane is not None else chart

    lanes = line["lane"].unique(maintain_order=True).to_list() or b["lane"].unique(maintain_order=True).to_list()
    chart = alt.vconcat(*(panel(lane) for lane in lanes[:8])) if len(lanes) > 1 else panel(None)
    return _titled(chart, title)


def layer_growth_chart(data: pl.DataFrame, *, by: str = "name", title: str | None = None) -> Any:
    """Mean net memory growth per layer (one bar per name, coloured by phase): what each layer
    adds in the forward pass and what backward releases (negative).

    Parameters
    ----------
    data
        :func:`tracekit.analysis.memory.layer_memory` output or
        :func:`tracekit.viz.prep.layer_growth` / ``layer_memory_summary`` output
        (``by``, ``phase``, ``mean_net_growth_bytes``).
    """
    alt = _alt()
    frame = prep.layer_growth(data, by=by)
    if frame.is_empty():
        return _nothing("layers", None, title)
    mib = 2**20
    frame = frame.with_columns(
        _short(by).alias("_label"),
        *((pl.col(c) / mib).alias(c.replace("_bytes", "_mib")) for c in (
            "mean_net_growth_bytes", "mean_allocated_bytes", "mean_freed_bytes", "max_peak_above_entry_bytes")),
    )
    order = frame["_label"].unique(maintain_order=True).to_list()
    chart = alt.Chart(frame).mark_bar().encode(
        y=alt.Y("_label:N", title=None, sort=order),
        x=alt.X("mean_net_growth_mib:Q", title="mean net growth (MiB)"),
        color=alt.Color("phase:N", title="phase"),
        tooltip=[alt.Tooltip(f"{by}:N"), "phase:N", "instances:Q",
                 alt.Tooltip("mean_net_growth_mib:Q", format=",.2f", title="mean net growth MiB"),
                 alt.Tooltip("mean_allocated_mib:Q", format=",.2f", title="mean allocated MiB"),
                 alt.Tooltip("mean_freed_mib:Q", format=",.2f", title="mean freed MiB"),
                 alt.Tooltip("max_peak_above_entry_mib:Q", format=",.2f", title="max peak above entry MiB")],
    ).properties(width=480, height=alt.Step(16))
    return _titled(chart, title)


# -- communication -------------------------------------------------------------------------------
_NCCL_ALIASES = {
    "collective": ("collective", "op", "operation", "name", "call"),
    "bytes": ("bytes", "message_bytes", "size_bytes", "message_size_bytes", "msg_bytes"),
    "bus_bandwidth_gbps": ("bus_bandwidth_gbps", "busbw_gbps", "bus_bw_gbps"),
}


def _pick(frame: pl.DataFrame, key: str) -> str | None:
    return next((c for c in _NCCL_ALIASES[key] if c in frame.columns), None)


#: Most NCCL calls :func:`nccl_bandwidth_chart` draws as points (a random sample beyond).
NCCL_MAX_POINTS = 4000


def nccl_bandwidth_chart(data: pl.DataFrame, *, window: Any = None, title: str | None = None) -> Any:
    """NCCL bus bandwidth against message size, one colour per collective, median line on top.

    Parameters
    ----------
    data
        One row per NCCL call with a collective name (``collective``/``op``), a message size
        in bytes (``bytes``/``message_bytes``) and ``bus_bandwidth_gbps`` (1e9 B/s), e.g.
        ``trace.nccl`` or :func:`tracekit.analysis.nccl` output. Rows without size or
        bandwidth are dropped. Beyond :data:`NCCL_MAX_POINTS` calls the points are a random
        sample (the subtitle says so); the median line is over every call.
    window
        ``(start_ns, end_ns)`` or a :class:`~tracekit.viz.window.ViewWindow`: the calls whose
        GPU work overlaps it (``start_ns``/``end_ns``), named in the subtitle.
    """
    alt = _alt()
    if data.is_empty():
        return _nothing("nccl", None, title)
    if window is not None and "start_ns" in data.columns:
        data = _in_window(data.filter(pl.col("start_ns").is_not_null()), window)  # type: ignore[assignment]
        if data.is_empty():
            return _nothing("no NCCL calls", window, title)
    cols = {k: _pick(data, k) for k in _NCCL_ALIASES}
    missing = [k for k, v in cols.items() if v is None]
    if missing:
        msg = f"the NCCL frame lacks {', '.join(missing)} (columns: {', '.join(data.columns)})"
        raise ValueError(msg)
    frame = data.select(
        pl.col(cols["collective"]).cast(pl.Utf8).alias("collective"),  # type: ignore[arg-type]
        pl.col(cols["bytes"]).cast(pl.Float64).alias("bytes"),  # type: ignore[arg-type]
        pl.col(cols["bus_bandwidth_gbps"]).cast(pl.Float64).alias("bus_bandwidth_gbps"),  # type: ignore[arg-type]
        *(["rank"] if "rank" in data.columns else []),
    ).filter(
        (pl.col("bytes") > 0)
        & pl.col("bus_bandwidth_gbps").is_not_null()
        & (pl.col("bus_bandwidth_gbps") > 0)
    )
    if frame.is_empty():  # no sizes: a log axis over nothing would be infinitely wide
        return _nothing("nccl_sizes", None, title)
    medians = (  # over every call, before the points are thinned
        frame.group_by("collective", "bytes")
        .agg(pl.col("bus_bandwidth_gbps").median())
        .sort("collective", "bytes")
    )
    calls = frame.height
    if calls > NCCL_MAX_POINTS:  # altair embeds at most 5,000 rows; a random sample of the points
        frame = frame.sample(NCCL_MAX_POINTS, seed=0).sort("bytes")
    binary = (
        "datum.value >= 1073741824 ? format(datum.value / 1073741824, '~g') + ' GiB' : "
        "datum.value >= 1048576 ? format(datum.value / 1048576, '~g') + ' MiB' : "
        "datum.value >= 1024 ? format(datum.value / 1024, '~g') + ' KiB' : datum.value + ' B'"
    )
    x = alt.X(
        "bytes:Q",
        scale=alt.Scale(type="log", base=2),
        title="message size",
        axis=alt.Axis(labelExpr=binary, labelOverlap="greedy", labelSeparation=4),
    )
    y = alt.Y("bus_bandwidth_gbps:Q", title="bus bandwidth (GB/s)")
    color = alt.Color("collective:N", title=None)
    points = alt.Chart(frame).mark_point(opacity=0.5, filled=True).encode(
        x=x, y=y, color=color,
        tooltip=["collective:N", alt.Tooltip("bytes:Q", format=",.0f"), alt.Tooltip("bus_bandwidth_gbps:Q", format=".2f", title="busbw (GB/s)")],
    )  # fmt: skip
    lines = alt.Chart(medians).mark_line().encode(x=x, y=y, color=color)
    chart = alt.layer(points, lines)
    notes = [window_label(window)]
    if frame.height < calls:
        notes.append(f"{frame.height:,} of {calls:,} calls drawn (a random sample); medians over all")
    return _titled(chart, title, " · ".join(n for n in notes if n) or None)

