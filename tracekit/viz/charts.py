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

from collections.abc import Callable, Sequence
from typing import Any

import polars as pl

from tracekit.viz import prep
from tracekit.viz._deps import import_altair
from tracekit.viz.theme import BREAKDOWN_COLORS, family_scale, register_themes

KERNEL_PARAM = "kernel"
WINDOW_PARAM = "window"


def _alt() -> Any:
    alt = import_altair()
    register_themes()
    return alt


def _short(column: str, limit: int = 48) -> pl.Expr:
    c = pl.col(column).cast(pl.Utf8).fill_null("?")
    return pl.when(c.str.len_chars() > limit).then(c.str.slice(0, limit - 1) + "…").otherwise(c)


def _ms(column: str, origin: int) -> pl.Expr:
    return ((pl.col(column) - origin).cast(pl.Float64) / 1e6).round(6)


def _family_color(alt: Any, frame: pl.DataFrame, field: str = "family", legend: bool = True) -> Any:
    present = sorted(set(frame[field].drop_nulls().to_list())) if field in frame.columns else []
    scale = family_scale(present or None)
    return alt.Color(
        f"{field}:N",
        scale=alt.Scale(domain=scale["domain"], range=scale["range"]),
        title="family",
        legend=alt.Legend() if legend else None,
    )


def _titled(chart: Any, title: str | None) -> Any:
    return chart.properties(title=title) if title else chart


#: Most rows a binned series chart embeds: altair refuses a dataset of more than 5,000 rows
#: (MaxRowsError) when the chart is drawn or saved.
ROW_BUDGET = 4500


def within_row_budget(make: Callable[[int], pl.DataFrame], max_points: int) -> pl.DataFrame:
    """``make(max_points)`` (a binned series, ``max_points`` per series), with fewer points per
    series when all series together pass
    :data:`ROW_BUDGET` (``max_points`` is per series: 3 metrics on each of 4 GPUs at 600 points
    each were 7,200 rows, and the chart raised MaxRowsError)."""
    series = make(max_points)
    while series.height > ROW_BUDGET and max_points > 10:
        max_points = max(int(max_points * ROW_BUDGET / series.height * 0.95), 10)
        series = make(max_points)
    return series


# -- kernels -------------------------------------------------------------------------------------
def _kernel_pick(alt: Any, highlight: str | None, field: str = "name") -> Any:
    value = [{field: highlight}] if highlight else alt.Undefined
    return alt.selection_point(
        name=KERNEL_PARAM, fields=[field], on="click", clear="dblclick", value=value
    )


def top_kernels_chart(
    data: pl.DataFrame,
    *,
    n: int = 20,
    by: str = "short_name",
    highlight: str | None = None,
    title: str | None = None,
) -> Any:
    """Horizontal bars of the kernels with the most GPU time, coloured by family.

    Parameters
    ----------
    data
        ``trace.kernels``, or :func:`tracekit.viz.prep.top_kernels` output (``name``,
        ``family``, ``total_ns``, ``instances``, ``mean_ns``, ``share``).
    n
        How many kernels (ignored for an already aggregated frame).
    highlight
        A kernel name to show selected.

    Selections: ``kernel`` (click a bar).
    """
    alt = _alt()
    top = data if "total_ns" in data.columns else prep.top_kernels(data, n=n, by=by)
    frame = top.with_columns(
        _short("name").alias("label"),
        (pl.col("total_ns") / 1e6).alias("total_ms"),
        (pl.col("mean_ns") / 1e3).alias("mean_us")
        if "mean_ns" in top.columns
        else pl.lit(None).alias("mean_us"),
        (pl.col("share") * 100).round(2).alias("share_pct")
        if "share" in top.columns
        else pl.lit(None).alias("share_pct"),
    )
    pick = _kernel_pick(alt, highlight)
    chart = (
        alt.Chart(frame)
        .mark_bar()
        .encode(
            y=alt.Y(
                "label:N", sort=alt.EncodingSortField("total_ms", order="descending"), title=None
            ),
            x=alt.X("total_ms:Q", title="GPU time (ms)"),
            color=_family_color(alt, frame),
            opacity=alt.condition(pick, alt.value(1.0), alt.value(0.35)),
            tooltip=[
                alt.Tooltip("name:N", title="kernel"),
                "family:N",
                alt.Tooltip("instances:Q"),
                alt.Tooltip("total_ms:Q", format=".3f", title="total (ms)"),
                alt.Tooltip("mean_us:Q", format=".1f", title="mean (µs)"),
                alt.Tooltip("share_pct:Q", format=".2f", title="share (%)"),
            ],
        )
        .add_params(pick)
    )
    return _titled(chart, title)


def duration_chart(
    data: pl.DataFrame, *, bins_per_decade: int = 5, title: str | None = None
) -> Any:
    """Distribution of kernel durations (log bins), stacked by family.

    Parameters
    ----------
    data
        ``trace.kernels`` or :func:`tracekit.viz.prep.duration_histogram` output
        (``group``, ``bin_start_ns``, ``bin_end_ns``, ``count``).
    """
    alt = _alt()
    hist = (
        data
        if "bin_start_ns" in data.columns
        else prep.duration_histogram(data, bins_per_decade=bins_per_decade)
    )
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
    return _titled(chart, title)


# -- timeline ------------------------------------------------------------------------------------
def timeline_chart(
    data: pl.DataFrame,
    *,
    memcpys: pl.DataFrame | None = None,
    memsets: pl.DataFrame | None = None,
    nvtx: pl.DataFrame | None = None,
    window: tuple[int, int] | None = None,
    origin_ns: int | None = None,
    max_marks: int = 2000,
    graphs: pl.DataFrame | None = None,
    nvtx_max_level: int = 2,
    highlight: str | None = None,
    lane_height: int = 16,
    width: int = 800,
    title: str | None = None,
) -> Any:
    """GPU timeline: one lane per device/stream, NVTX lanes below, aggregated beyond ``max_marks``.

    Parameters
    ----------
    data
        ``trace.kernels`` (with ``memcpys``/``memsets`` to add copies, ``graphs`` to add CUDA
        graph replays), or lanes built by :func:`tracekit.viz.prep.timeline_ops` (``lane``,
        ``lane_order``, ``start_ns``, ``end_ns``, ``name``, ``family``, ``count``,
        ``busy_fraction``).
    graphs
        ``trace.graph_trace``: CUDA graph launches traced whole (nsys's default), whose
        kernels are in no table; each replay is a mark ``[CUDA graph <graph_id>]`` of family
        ``graph`` on its stream's lane (:func:`tracekit.viz.prep.gpu_ops`).
    nvtx
        ``trace.nvtx``, :func:`tracekit.viz.prep.nvtx_ranges` output or
        :func:`tracekit.viz.prep.timeline_nvtx` lanes; optional.
    window
        ``(start_ns, end_ns)`` to show (the whole trace by default). Pass the visible window
        when zooming: marks are re-aggregated for it.
    max_marks
        Above this many GPU operations in the window, each lane shows time bins whose opacity is
        the busy fraction and whose colour is the busiest family.
    highlight
        A kernel name to show selected (the others are faded).

    Selections: ``window`` (drag horizontally, ms from the origin) and ``kernel`` (click).
    """
    alt = _alt()
    if "lane" in data.columns:
        lanes = data
    else:
        ops = prep.gpu_ops(data, memcpys, memsets, graphs)
        lanes = prep.timeline_ops(ops, window=window, max_marks=max_marks)
    nv_lanes = None
    if nvtx is not None and not nvtx.is_empty():
        if "lane" in nvtx.columns:
            nv_lanes = nvtx
        else:
            ranges = nvtx if "level" in nvtx.columns else prep.nvtx_ranges(nvtx)
            win = window or prep.data_window(lanes)
            nv_lanes = prep.timeline_nvtx(ranges, window=win, max_level=nvtx_max_level)
    if origin_ns is None:
        w = window or prep.data_window(lanes, nv_lanes)
        origin_ns = w[0] if w else 0
    gpu = lanes.with_columns(
        _ms("start_ns", origin_ns).alias("start_ms"),
        _ms("end_ns", origin_ns).alias("end_ms"),
        ((pl.col("end_ns") - pl.col("start_ns")) / 1e3).alias("duration_us"),
        _short("name", 60).alias("label"),
    )
    order = gpu.select("lane", "lane_order").unique()
    if nv_lanes is not None and not nv_lanes.is_empty():
        order = pl.concat([order, nv_lanes.select("lane", "lane_order").unique()])
    lane_sort = order.sort("lane_order")["lane"].to_list()
    y = alt.Y("lane:N", sort=lane_sort, title=None, axis=alt.Axis(labelLimit=220))
    brush = alt.selection_interval(name=WINDOW_PARAM, encodings=["x"])
    pick = _kernel_pick(alt, highlight)
    x = alt.X("start_ms:Q", title="time (ms)", scale=alt.Scale(zero=False, nice=False))
    gpu_layer = (
        alt.Chart(gpu)
        .mark_rect()
        .encode(
            x=x,
            x2="end_ms:Q",
            y=y,
            color=_family_color(alt, gpu),
            opacity=alt.condition(
                pick,
                alt.Opacity(
                    "busy_fraction:Q", scale=alt.Scale(domain=[0, 1], range=[0.25, 1]), legend=None
                ),
                alt.value(0.12),
            ),
            tooltip=[
                alt.Tooltip("label:N", title="name"),
                "family:N",
                "lane:N",
                alt.Tooltip("start_ms:Q", format=".4f", title="start (ms)"),
                alt.Tooltip("duration_us:Q", format=".2f", title="span (µs)"),
                alt.Tooltip("count:Q", title="ops"),
                alt.Tooltip("busy_fraction:Q", format=".0%", title="busy"),
            ],
        )  # fmt: skip
        .add_params(brush, pick)
    )
    layers = [gpu_layer]
    if nv_lanes is not None and not nv_lanes.is_empty():
        nv = nv_lanes.with_columns(
            _ms("start_ns", origin_ns).alias("start_ms"),
            _ms("end_ns", origin_ns).alias("end_ms"),
            ((pl.col("end_ns") - pl.col("start_ns")) / 1e3).alias("duration_us"),
            _short("name", 60).alias("label"),
        )
        layers.append(
            alt.Chart(nv)
            .mark_rect(color="#8E8E8E", stroke="white", strokeWidth=0.5)
            .encode(
                x=x, x2="end_ms:Q", y=y,
                tooltip=[alt.Tooltip("label:N", title="NVTX range"), "lane:N",
                         alt.Tooltip("start_ms:Q", format=".4f", title="start (ms)"),
                         alt.Tooltip("duration_us:Q", format=".2f", title="duration (µs)")],
            )
        )  # fmt: skip
    chart = alt.layer(*layers).properties(width=width, height=max(lane_height * len(lane_sort), 40))
    return _titled(chart, title)


# -- breakdowns ----------------------------------------------------------------------------------
def breakdown_chart(data: pl.DataFrame, *, title: str | None = None) -> Any:
    """Stacked bars: share of time in compute, communication, overlap, memcpy and idle per GPU/rank.

    Parameters
    ----------
    data
        :func:`tracekit.viz.prep.temporal_breakdown` output (``group``, ``category``,
        ``time_ns``, ``fraction``), the same columns from ``tracekit.analysis``, or
        ``trace.kernels`` (then computed per device).
    """
    alt = _alt()
    frame = data if "category" in data.columns else prep.temporal_breakdown(data)
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
    return _titled(chart, title)


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


def iterations_chart(data: pl.DataFrame, *, title: str | None = None) -> Any:
    """Duration of each iteration (``step.N`` NVTX ranges) per rank/process.

    Parameters
    ----------
    data
        ``trace.nvtx`` or :func:`tracekit.viz.prep.iteration_times` output (``group``,
        ``iteration``, ``duration_ns``). More than :data:`tracekit.viz.prep.MAX_ITERATION_POINTS`
        iterations are drawn binned (:func:`tracekit.viz.prep.binned_iterations`: each point the
        median of that many consecutive ones, said in the subtitle).
    """
    alt = _alt()
    frame = data if "iteration" in data.columns else prep.iteration_times(data)
    if "group" not in frame.columns:
        frame = frame.with_columns(pl.lit("all").alias("group"))
    frame, size = prep.binned_iterations(frame)
    frame = frame.with_columns((pl.col("duration_ns") / 1e6).alias("duration_ms"))
    chart = (
        alt.Chart(frame)
        .mark_line(point=True)
        .encode(
            x=alt.X("iteration:O", title="iteration", axis=alt.Axis(labelAngle=0)),
            y=alt.Y("duration_ms:Q", title="duration (ms)", scale=alt.Scale(zero=True)),
            color=alt.Color("group:N", title=None),
            tooltip=[
                "group:N",
                "iteration:O",
                alt.Tooltip("duration_ms:Q", format=".3f", title="ms"),
            ]
            + (["name:N"] if "name" in frame.columns else []),
        )
    )
    if size > 1:
        return chart.properties(title=alt.TitleParams(
            title or "", subtitle=f"each point: the median of {size:,} consecutive iterations"))
    return _titled(chart, title)


# -- time series ---------------------------------------------------------------------------------
def gpu_metrics_chart(
    data: pl.DataFrame,
    *,
    metrics: Sequence[str] = prep.DEFAULT_GPU_METRICS,
    window: tuple[int, int] | None = None,
    origin_ns: int | None = None,
    max_points: int = 600,
    width: int = 800,
    height: int = 120,
    title: str | None = None,
) -> Any:
    """GPU metrics over time (Tensor Active, DRAM read/write, SMs Active …), one row per GPU.

    Parameters
    ----------
    data
        ``trace.gpu_metrics`` or :func:`tracekit.viz.prep.gpu_metrics_series` output
        (``device_id``, ``label``, ``time_ns``, ``value_pct``).

    Selections: ``window`` (drag horizontally).
    """
    alt = _alt()
    series = (
        data
        if "value_pct" in data.columns
        else within_row_budget(lambda n: prep.gpu_metrics_series(data, metrics=metrics, window=window, max_points=n),
                            max_points)
    )
    if origin_ns is None:
        origin_ns = window[0] if window else int(series["time_ns"].min() or 0)  # type: ignore[arg-type]
    frame = series.with_columns(
        _ms("time_ns", origin_ns).alias("time_ms"),
        pl.concat_str(pl.lit("GPU "), pl.col("device_id").cast(pl.Utf8)).alias("gpu"),
    )
    brush = alt.selection_interval(name=WINDOW_PARAM, encodings=["x"])
    base = (
        alt.Chart(frame)
        .mark_line(interpolate="step-after")
        .encode(
            x=alt.X("time_ms:Q", title="time (ms)", scale=alt.Scale(zero=False, nice=False)),
            y=alt.Y("value_pct:Q", title="% of peak"),
            color=alt.Color("label:N", title=None),
            tooltip=[
                "gpu:N",
                "label:N",
                alt.Tooltip("time_ms:Q", format=".3f", title="ms"),
                alt.Tooltip("value_pct:Q", format=".1f", title="mean %"),
                alt.Tooltip("max_pct:Q", format=".0f", title="max %"),
            ],
        )  # fmt: skip
        .add_params(brush)
        .properties(width=width, height=height)
    )
    gpus = frame["gpu"].unique().to_list()
    chart = base.facet(row=alt.Row("gpu:N", title=None)) if len(gpus) > 1 else base
    return _titled(chart, title)


def memory_chart(
    data: pl.DataFrame,
    *,
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
    series = (
        data if "in_use_bytes" in data.columns
        else within_row_budget(lambda n: prep.memory_series(data, max_points=n), max_points)
    )
    if origin_ns is None:
        origin_ns = int(series["time_ns"].min() or 0)  # type: ignore[arg-type]
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
    return _titled(chart, title)


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


def nccl_bandwidth_chart(data: pl.DataFrame, *, title: str | None = None) -> Any:
    """NCCL bus bandwidth against message size, one colour per collective, median line on top.

    Parameters
    ----------
    data
        One row per NCCL call with a collective name (``collective``/``op``), a message size
        in bytes (``bytes``/``message_bytes``) and ``bus_bandwidth_gbps`` (1e9 B/s), e.g.
        ``trace.nccl`` or :func:`tracekit.analysis.nccl` output. Rows without size or
        bandwidth are dropped. Beyond :data:`NCCL_MAX_POINTS` calls the points are a random
        sample (the subtitle says so); the median line is over every call.
    """
    alt = _alt()
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
    if frame.height < calls:
        return chart.properties(title=alt.TitleParams(
            title or "", subtitle=f"{frame.height:,} of {calls:,} calls drawn (a random sample); medians over all"))
    return _titled(chart, title)
