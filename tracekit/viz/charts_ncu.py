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
from tracekit.viz.charts import _alt, _family_color, _kernel_pick, _titled

CEILING_LABELS = {
    "dram": "DRAM",
    "simt_fp32": "FP32",
    "simt_fp64": "FP64",
    "simt_fp16": "FP16",
}


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
    x = alt.X(
        "ai:Q",
        scale=alt.Scale(type="log", domain=[lo, hi]),
        title="arithmetic intensity (FLOP/byte)",
    )
    y = alt.Y("tflops:Q", scale=alt.Scale(type="log"), title="performance (TFLOP/s)")
    pick = _kernel_pick(alt, highlight, "kernel")
    roof_lines = (
        alt.Chart(roof_frame)
        .mark_line(color="#555555", strokeWidth=1)
        .encode(x=x, y=y, detail="ceiling:N", tooltip=["ceiling:N"])
    )
    labels = (
        alt.Chart(roof_frame.group_by("ceiling").agg(pl.col("ai").max(), pl.col("tflops").last()))
        .mark_text(align="right", dy=-6, fontSize=9, color="#333333")
        .encode(x="ai:Q", y="tflops:Q", text="ceiling:N")
    )
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
    chart = alt.layer(roof_lines, labels, dots).properties(width=width, height=height)
    return _titled(chart, title)


def tensor_dram_chart(
    data: Any,
    *,
    highlight: str | None = None,
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

    Selections: ``kernel`` (click a point).
    """
    alt = _alt()
    frame = data if isinstance(data, pl.DataFrame) else prep_ncu.tensor_dram(data)
    if "time_share" not in frame.columns:
        total = frame["duration_ns"].sum() or 1
        frame = frame.with_columns((pl.col("duration_ns") / total).alias("time_share"))
    frame = frame.with_columns((pl.col("time_share") * 100).alias("time_pct"))
    pick = _kernel_pick(alt, highlight, "kernel")
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
