"""The timeline chart: GPU streams, CUDA API lanes, NVTX, iteration boundaries, the steady window.

Re-exported by :mod:`tracekit.viz.charts`; the lanes come from :mod:`tracekit.viz.prep`
(``timeline_ops``, ``timeline_api``, ``timeline_nvtx``, ``timeline_steps``).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from tracekit.viz import prep
from tracekit.viz._chart_base import (
    WINDOW_PARAM,
    _alt,
    _bounds,
    _family_color,
    _kernel_pick,
    _ms,
    _nothing,
    _short,
    _titled,
)
from tracekit.viz.window import window_label


def timeline_chart(
    data: pl.DataFrame,
    *,
    memcpys: pl.DataFrame | None = None,
    memsets: pl.DataFrame | None = None,
    nvtx: pl.DataFrame | None = None,
    cuda_api: pl.DataFrame | None = None,
    structure: Any = None,
    window: Any = None,
    origin_ns: int | None = None,
    max_marks: int = 2000,
    graphs: pl.DataFrame | None = None,
    nvtx_max_level: int = 2,
    highlight: str | None = None,
    lane_height: int = 20,
    width: int = 640,
    title: str | None = None,
) -> Any:
    """The timeline: a lane per GPU stream, a CUDA API lane per busiest CPU thread, NVTX lanes,
    the run's iteration boundaries and its steady window; aggregated beyond ``max_marks``.

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
    cuda_api
        ``trace.cuda_api`` (or :func:`tracekit.viz.prep.timeline_api` lanes): a lane of CUDA
        API calls for each of the CPU threads that spend most time in them (launches grey,
        synchronisation red).
    structure
        :func:`tracekit.structure` of the trace: a rule at the start of each iteration
        (dashed for warm-up) and the steady window shaded.
    window
        ``(start_ns, end_ns)`` or a :class:`~tracekit.viz.window.ViewWindow` to show (the
        whole trace by default; the subtitle names it). Pass the visible window when zooming:
        marks are re-aggregated for it.
    max_marks
        Above this many GPU operations in the window, each lane shows time bins whose opacity is
        the busy fraction and whose colour is the busiest family.
    highlight
        A kernel name to show selected (the others are faded).

    Zoom with the mouse wheel, pan with shift-drag. Selections: ``window`` (drag horizontally,
    ms from the origin) and ``kernel`` (click).
    """
    alt = _alt()
    win = _bounds(window)
    if "lane" in data.columns:
        lanes = data
    else:
        ops = prep.gpu_ops(data, memcpys, memsets, graphs)
        lanes = prep.timeline_ops(ops, window=win, max_marks=max_marks)
    win = win or prep.data_window(lanes)
    api = None
    if cuda_api is not None and not cuda_api.is_empty() and win is not None:
        api = cuda_api if "lane" in cuda_api.columns else prep.timeline_api(cuda_api, window=win, max_marks=max(max_marks // 2, 200))
    nv_lanes = None
    if nvtx is not None and not nvtx.is_empty():
        if "lane" in nvtx.columns:
            nv_lanes = nvtx
        else:
            ranges = nvtx if "level" in nvtx.columns else prep.nvtx_ranges(nvtx)
            nv_lanes = prep.timeline_nvtx(ranges, window=win or prep.data_window(ranges), max_level=nvtx_max_level)
    if lanes.is_empty() and (api is None or api.is_empty()) and (nv_lanes is None or nv_lanes.is_empty()):
        return _nothing("kernels" if window is None else "no GPU work", window, title or "GPU timeline")
    if origin_ns is None:
        w = win or prep.data_window(lanes, nv_lanes)
        origin_ns = w[0] if w else 0

    def ms(frame: pl.DataFrame) -> pl.DataFrame:
        return frame.with_columns(
            _ms("start_ns", origin_ns).alias("start_ms"),
            _ms("end_ns", origin_ns).alias("end_ms"),
            ((pl.col("end_ns") - pl.col("start_ns")) / 1e3).alias("duration_us"),
            _short("name", 60).alias("label"),
        )

    gpu = ms(lanes)
    parts = [gpu.select("lane", "lane_order")]
    if api is not None and not api.is_empty():
        parts.append(api.select("lane", "lane_order"))
    if nv_lanes is not None and not nv_lanes.is_empty():
        parts.append(nv_lanes.select("lane", "lane_order"))
    lane_sort = pl.concat(parts).unique().sort("lane_order")["lane"].to_list()
    y = alt.Y("lane:N", sort=lane_sort, title=None, axis=alt.Axis(labelLimit=200))
    bottom: dict[str, Any] = {"orient": "bottom", "direction": "horizontal"}  # legends below: lanes keep the width
    # a drag selects a window; the wheel zooms and shift-drag pans (the x scale only)
    brush = alt.selection_interval(name=WINDOW_PARAM, encodings=["x"],
                                   on="[pointerdown[!event.shiftKey], window:pointerup] > window:pointermove!")
    zoom = alt.selection_interval(name="zoom", encodings=["x"], bind="scales", zoom="wheel!",
                                  translate="[pointerdown[event.shiftKey], window:pointerup] > window:pointermove!")
    pick = _kernel_pick(alt, highlight)
    x = alt.X("start_ms:Q", title="time (ms)", scale=alt.Scale(zero=False, nice=False))
    layers: list[Any] = []
    if structure is not None and win is not None:
        steady = (int(structure.start_ns), int(structure.end_ns)) if getattr(structure, "steps", 0) else None
        if steady and steady[1] > win[0] and steady[0] < win[1]:
            band = pl.DataFrame({"start_ns": [max(steady[0], win[0])], "end_ns": [min(steady[1], win[1])],
                                 "name": ["steady window"]})
            layers.append(alt.Chart(ms(band)).mark_rect(color="#2E7D32", opacity=0.07).encode(
                x=x, x2="end_ms:Q", tooltip=[alt.Tooltip("name:N", title=" "),
                                             alt.Tooltip("duration_us:Q", format=",.0f", title="µs")]))
    has_gpu = not gpu.is_empty()
    gpu_layer = (
        alt.Chart(gpu)
        .mark_rect()
        .encode(
            x=x,
            x2="end_ms:Q",
            y=y,
            color=_family_color(alt, gpu, **bottom, columns=7),
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
    )
    if has_gpu:  # an empty layer would give Vega an infinite extent
        layers.append(gpu_layer.add_params(brush, zoom, pick))
    if api is not None and not api.is_empty():
        kinds = [k for k in prep.API_COLORS if k in set(api["family"].to_list())]
        api_layer = (
            alt.Chart(ms(api)).mark_rect().encode(
                x=x, x2="end_ms:Q", y=y,
                fill=alt.Fill("family:N", title="CUDA API", scale=alt.Scale(domain=kinds, range=[prep.API_COLORS[k] for k in kinds]),
                              legend=alt.Legend(**bottom)),
                opacity=alt.Opacity("busy_fraction:Q", scale=alt.Scale(domain=[0, 1], range=[0.25, 1]), legend=None),
                tooltip=[alt.Tooltip("label:N", title="CUDA API"), alt.Tooltip("family:N", title="kind"), "lane:N",
                         alt.Tooltip("start_ms:Q", format=".4f", title="start (ms)"),
                         alt.Tooltip("duration_us:Q", format=".2f", title="span (µs)"), alt.Tooltip("count:Q", title="calls")],
            )
        )  # fmt: skip
        layers.append(api_layer if has_gpu else api_layer.add_params(brush, zoom))
    if nv_lanes is not None and not nv_lanes.is_empty():
        nv = ms(nv_lanes)
        nv_layer = (
            alt.Chart(nv)
            .mark_rect(color="#8E8E8E", stroke="white", strokeWidth=0.5)
            .encode(
                x=x, x2="end_ms:Q", y=y,
                tooltip=[alt.Tooltip("label:N", title="NVTX range"), "lane:N",
                         alt.Tooltip("start_ms:Q", format=".4f", title="start (ms)"),
                         alt.Tooltip("duration_us:Q", format=".2f", title="duration (µs)")],
            )
        )  # fmt: skip
        data_layers = has_gpu or (api is not None and not api.is_empty())
        layers.append(nv_layer if data_layers else nv_layer.add_params(brush, zoom))
    if structure is not None and win is not None:
        steps = prep.timeline_steps(structure, window=win)
        if steps.height:
            rules = steps.with_columns(_ms("start_ns", origin_ns).alias("start_ms"))
            layers.append(alt.Chart(rules).mark_rule(color="#2E7D32", strokeWidth=1, opacity=0.7).encode(
                x="start_ms:Q",
                strokeDash=alt.StrokeDash("phase:N", title="iteration start", legend=alt.Legend(**bottom),
                                          scale=alt.Scale(domain=["warm-up", "steady"], range=[[3, 3], [1, 0]])),
                tooltip=[alt.Tooltip("iteration:Q", title="iteration"), "phase:N",
                         alt.Tooltip("start_ms:Q", format=".3f", title="start (ms)")]))
    height = max(lane_height * len(lane_sort), 60)
    chart = alt.layer(*layers).properties(width=width, height=height)
    label = window_label(window)
    return _titled(chart, title, label)


