"""Altair charts of Nsight Compute data: roofline, Tensor Core vs DRAM, speed of light.

Each takes an :class:`~tracekit.ncu.report.NcuReport` or the frames of
:mod:`tracekit.viz.prep_ncu` (recognised by their columns). Kernel marks carry the ``kernel``
point selection (field ``kernel``, ``#id short_name``) for drill-down.
"""

from __future__ import annotations

import math
from typing import Any

import polars as pl

from tracekit.viz import prep_ncu
from tracekit.viz._chart_base import (
    KERNEL_PARAM,
    _alt,
    _family_color,
    _kernel_pick,
    _nothing,
    _titled,
)

CEILING_LABELS = {
    "dram": "DRAM",
    "simt_fp32": "FP32",
    "simt_fp64": "FP64",
    "simt_fp16": "FP16 (SIMT)",
}


def _roof_labels(roofs: list[tuple[str, float]], y_lo: float, y_hi: float, height: float) -> list[dict[str, Any]]:
    """One label per distinct roof height (``Tensor BF16 · FP16 989 TFLOP/s``), placed at
    the plot's right edge at the roof's height, pushed down where it would overlap the label
    above it (at least 12 px apart on the log axis)."""
    groups: list[tuple[float, list[str]]] = []
    for name, value in sorted(roofs, key=lambda r: -r[1]):
        if groups and abs(math.log10(groups[-1][0]) - math.log10(value)) < 1e-3:
            groups[-1][1].append(name)
        else:
            groups.append((value, [name]))
    decades = max(math.log10(y_hi) - math.log10(y_lo), 1e-6)
    gap = decades * 12.0 / max(height, 1.0)
    out: list[dict[str, Any]] = []
    last: float | None = None
    for value, names in groups:
        y = math.log10(value)
        if last is not None and y > last - gap:
            y = last - gap
        last = y
        tensor = [n.removeprefix("Tensor ") for n in names if n.startswith("Tensor ")]
        other = [n for n in names if not n.startswith("Tensor ")]
        text = " · ".join(([f"Tensor {' · '.join(tensor)}"] if tensor else []) + other)
        out.append({"text": f"{text}: {value / 1e12:,.0f} TFLOP/s" if value >= 1e12 else f"{text}: {value / 1e9:,.0f} GFLOP/s",
                    "tflops": 10**y})
    return out


def _ceiling_label(name: str) -> str:
    if name in CEILING_LABELS:
        return CEILING_LABELS[name]
    if name.startswith("tensor_"):
        return "Tensor " + name.removeprefix("tensor_").upper()
    return name


def roofline_chart(
    data: Any,
    roofs: pl.DataFrame | None = None,
    *,
    highlight: str | None = None,
    title: str | None = None,
    width: int = 520,
    height: int = 320,
) -> Any:
    """Roofline: DRAM slope and compute ceilings, one point per kernel sized by its time share.

    Parameters
    ----------
    data
        An ``NcuReport``, or :func:`tracekit.viz.prep_ncu.roofline_points` output
        (``kernel``, ``family``, ``arithmetic_intensity`` FLOP/byte, ``flops_per_s``,
        ``time_share``).
    roofs
        :func:`tracekit.viz.prep_ncu.roofline_roofs` output (``ceiling``, ``value``: FLOP/s,
        or byte/s for ``dram``); computed from the report when ``data`` is one.
    highlight
        A ``kernel`` label (``#id short_name``) to show selected.

    Selections: ``kernel`` (click a point).
    """
    alt = _alt()
    if isinstance(data, pl.DataFrame):
        points = data
        if roofs is None:
            msg = "pass roofs= (tracekit.viz.prep_ncu.roofline_roofs(report)) with a points frame"
            raise ValueError(msg)
    else:
        points = prep_ncu.roofline_points(data)
        roofs = prep_ncu.roofline_roofs(data, points)
    if points.is_empty():
        return _nothing("roofline", None, title)
    ai = points["arithmetic_intensity"].drop_nulls()
    lo = 10 ** math.floor(math.log10(max(float(ai.min() or 0.01), 1e-3))) if len(ai) else 0.01  # type: ignore[arg-type]
    hi = 10 ** math.ceil(math.log10(max(float(ai.max() or 100), 1.0) * 10)) if len(ai) else 1e4  # type: ignore[arg-type]
    dram = roofs.filter(pl.col("ceiling") == "dram")["value"]
    bandwidth = float(dram[0]) if len(dram) else None
    compute = roofs.filter(pl.col("ceiling") != "dram")
    xs = [lo * (hi / lo) ** (i / 48) for i in range(49)]
    rows = []
    for ceiling, peak in compute.select("ceiling", "value").iter_rows():
        for x in xs:
            y = min(peak, bandwidth * x) if bandwidth else peak
            rows.append({"ceiling": _ceiling_label(ceiling), "ai": x, "tflops": y / 1e12})
    roof_frame = pl.DataFrame(
        rows, schema={"ceiling": pl.Utf8, "ai": pl.Float64, "tflops": pl.Float64}
    )
    frame = points.with_columns(
        (pl.col("flops_per_s") / 1e12).alias("tflops"),
        (pl.col("time_share") * 100).alias("time_pct"),
        pl.col("arithmetic_intensity").alias("ai"),
    )
    peaks = [float(v) for v in compute["value"].to_list()] or [float(frame["flops_per_s"].max())]  # type: ignore[arg-type]
    lows = [float(frame["flops_per_s"].min())] + ([bandwidth * lo] if bandwidth else [])  # type: ignore[arg-type]
    y_lo = 10 ** math.floor(math.log10(max(min(lows), 1.0)))
    y_hi = 10 ** math.ceil(math.log10(max(peaks) * 1.2))
    x = alt.X(
        "ai:Q",
        scale=alt.Scale(type="log", domain=[lo, hi]),
        title="arithmetic intensity (FLOP/byte)",
    )
    y = alt.Y("tflops:Q", scale=alt.Scale(type="log", domain=[y_lo / 1e12, y_hi / 1e12]), title="performance (TFLOP/s)")
    pick = _kernel_pick(alt, highlight, "kernel")
    roof_lines = (
        alt.Chart(roof_frame)
        .mark_line(color="#555555", strokeWidth=1)
        .encode(x=x, y=y, detail="ceiling:N", tooltip=["ceiling:N"])
    )
    labels = pl.DataFrame(
        _roof_labels([(_ceiling_label(c), float(v)) for c, v in compute.select("ceiling", "value").iter_rows()],
                     y_lo, y_hi, float(height)),
        schema={"text": pl.Utf8, "tflops": pl.Float64},
    ).with_columns((pl.col("tflops") / 1e12).alias("tflops"), pl.lit(hi).alias("ai"))
    layers: list[Any] = [roof_lines]
    if labels.height:
        layers.append(alt.Chart(labels).mark_text(align="right", baseline="bottom", dy=-1, fontSize=9, color="#333333")
                      .encode(x=x, y=y, text="text:N"))
    if bandwidth:
        # the DRAM slope's label under its foot (horizontal: a slanted label's angle would
        # depend on the size the figure is drawn at)
        slope = pl.DataFrame({"ai": [lo * 1.08], "tflops": [bandwidth * lo / 1e12], "text": [f"DRAM {bandwidth / 1e12:.2f} TB/s"]})
        layers.append(alt.Chart(slope).mark_text(align="left", baseline="top", dy=3, fontSize=9, color="#333333")
                      .encode(x=x, y=y, text="text:N"))
    dots = (
        alt.Chart(frame)
        .mark_circle(stroke="black", strokeWidth=0.4)
        .encode(
            x=x,
            y=y,
            size=alt.Size("time_pct:Q", title="time (%)", scale=alt.Scale(range=[15, 400])),
            color=_family_color(alt, frame),
            opacity=alt.condition(pick, alt.value(0.9), alt.value(0.25)),
            tooltip=[
                "kernel:N",
                "family:N",
                alt.Tooltip("ai:Q", format=".2f", title="FLOP/byte"),
                alt.Tooltip("tflops:Q", format=".3f", title="TFLOP/s"),
                alt.Tooltip("time_pct:Q", format=".1f", title="time (%)"),
            ]
            + (["dominant:N"] if "dominant" in frame.columns else []),
        )  # fmt: skip
        .add_params(pick)
    )
    layers.append(dots)
    chart = alt.layer(*layers).properties(width=width, height=height)
    return _titled(chart, title)


def tensor_dram_chart(
    data: Any,
    *,
    highlight: str | None = None,
    selection: str = KERNEL_PARAM,
    title: str | None = None,
    width: int = 360,
    height: int = 300,
) -> Any:
    """Tensor pipe utilisation against DRAM bandwidth utilisation, one point per kernel.

    Parameters
    ----------
    data
        An ``NcuReport``, or :func:`tracekit.viz.prep_ncu.tensor_dram` output (``kernel``,
        ``family``, ``tensor_pct``, ``dram_pct``, ``time_share``). Any frame with those
        columns works, e.g. per-kernel averages of nsys GPU metrics.
    selection
        The name of the point selection (``kernel``); give another name to place this chart
        beside :func:`roofline_chart` (altair merges two selections of one name, with a
        warning): :func:`kernel_charts` does.

    Selections: ``kernel`` (click a point).
    """
    alt = _alt()
    frame = data if isinstance(data, pl.DataFrame) else prep_ncu.tensor_dram(data)
    if frame.is_empty():
        return _nothing("no kernel with Tensor Core or DRAM counters in the Nsight Compute report", None, title)
    if "time_share" not in frame.columns:
        total = frame["duration_ns"].sum() or 1
        frame = frame.with_columns((pl.col("duration_ns") / total).alias("time_share"))
    frame = frame.with_columns((pl.col("time_share") * 100).alias("time_pct"))
    pick = _kernel_pick(alt, highlight, "kernel")
    if selection != KERNEL_PARAM:
        pick = alt.selection_point(name=selection, fields=["kernel"], on="click", clear="dblclick",
                                   value=[{"kernel": highlight}] if highlight else alt.Undefined)
    pct = alt.Scale(domain=[0, 100])
    chart = (
        alt.Chart(frame)
        .mark_circle(stroke="black", strokeWidth=0.4)
        .encode(
            x=alt.X("dram_pct:Q", scale=pct, title="DRAM bandwidth (% of peak)"),
            y=alt.Y("tensor_pct:Q", scale=pct, title="Tensor pipe active (%)"),
            size=alt.Size("time_pct:Q", title="time (%)", scale=alt.Scale(range=[15, 400])),
            color=_family_color(alt, frame),
            opacity=alt.condition(pick, alt.value(0.9), alt.value(0.25)),
            tooltip=[
                "kernel:N",
                "family:N",
                alt.Tooltip("tensor_pct:Q", format=".1f"),
                alt.Tooltip("dram_pct:Q", format=".1f"),
                alt.Tooltip("time_pct:Q", format=".1f"),
            ],
        )  # fmt: skip
        .add_params(pick)
        .properties(width=width, height=height)
    )
    return _titled(chart, title)


def sol_chart(data: pl.DataFrame, *, title: str | None = None, width: int = 360) -> Any:
    """Speed-of-light bars (% of peak) for one kernel or a few side by side.

    Parameters
    ----------
    data
        :func:`tracekit.viz.prep_ncu.sol_long` output (``kernel``, ``metric``, ``pct``) or
        :func:`tracekit.viz.prep_ncu.kernel_metrics` rows.
    """
    alt = _alt()
    frame = data if "metric" in data.columns else prep_ncu.sol_long(data)
    frame = frame.filter(pl.col("pct").is_not_null())
    if frame.is_empty():
        return _nothing("no speed-of-light counters for this kernel (profile with ncu --section SpeedOfLight)", None, title)
    order = list(prep_ncu.SOL_LABELS.values())
    several = frame["kernel"].n_unique() > 1
    base = alt.Chart(frame).encode(
        y=alt.Y("metric:N", sort=order, title=None),
        x=alt.X("pct:Q", scale=alt.Scale(domain=[0, 100]), title="% of peak"),
    )
    bars = base.mark_bar(color="#0072B2").encode(
        tooltip=["kernel:N", "metric:N", alt.Tooltip("pct:Q", format=".1f")],
        **(
            {"yOffset": alt.YOffset("kernel:N"), "color": alt.Color("kernel:N", title=None)}
            if several
            else {}
        ),
    )
    text = base.mark_text(align="left", dx=3, fontSize=9).encode(
        text=alt.Text("pct:Q", format=".0f")
    )
    layers = [bars] if several else [bars, text]
    return _titled(alt.layer(*layers).properties(width=width), title)


def kernel_charts(report: Any, *, highlight: str | None = None, width: int = 420, height: int = 300) -> Any:
    """:func:`roofline_chart` and :func:`tensor_dram_chart` of ``report`` side by side (each
    with its own selection: ``kernel`` on the roofline, ``kernel_tensor_dram`` beside it); a
    message chart for a report without the counters either needs."""
    alt = _alt()
    roof = roofline_chart(report, highlight=highlight, title="Roofline", width=width, height=height)
    td = tensor_dram_chart(report, highlight=highlight, selection="kernel_tensor_dram", title="Tensor pipe vs DRAM",
                           width=int(width * 0.75), height=height)
    return alt.hconcat(roof, td).resolve_scale(color="shared", size="independent")
