"""``Compare``: two traces side by side — top kernels and NVTX ranges, with deltas."""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import polars as pl

from tracekit.analysis.compare import compare_kernels, compare_ranges
from tracekit.viz._deps import import_ipywidgets
from tracekit.widgets._common import ChartView, fmt_ns, html_table

widgets = import_ipywidgets()
import traitlets  # noqa: E402


def _delta_chart(frame: pl.DataFrame, key: str, labels: tuple[str, str], title: str, unit: str = "ms") -> Any:
    """Paired bars of ``a_ms``/``b_ms`` per ``key`` (the first 20 rows), labels distinct."""
    from tracekit.viz._chart_base import _alt
    from tracekit.viz.prep import kernel_labels

    alt = _alt()
    head = frame.head(20)
    head = head.with_columns(pl.Series("label", kernel_labels(head[key].cast(pl.Utf8).fill_null("?").to_list())
                                       if key == "name" else [str(v)[:56] for v in head[key].to_list()]))
    long = (
        head.unpivot(index=["label"], on=["a_ms", "b_ms"], variable_name="trace", value_name="ms")
        .with_columns(pl.col("trace").replace_strict({"a_ms": labels[0], "b_ms": labels[1]}, return_dtype=pl.Utf8))
    )
    order = head["label"].to_list()
    return (
        alt.Chart(long)
        .mark_bar()
        .encode(
            y=alt.Y("label:N", sort=order, title=None, axis=alt.Axis(labelLimit=380)),
            yOffset=alt.YOffset("trace:N", sort=list(labels)),
            x=alt.X("ms:Q", title=unit),
            color=alt.Color(
                "trace:N",
                sort=list(labels),
                scale=alt.Scale(range=["#0072B2", "#E69F00"]),
                title=None,
            ),
            tooltip=["label:N", "trace:N", alt.Tooltip("ms:Q", format=",.3f", title=unit)],
        )
        .properties(title=title, width=420)
    )


class Compare(widgets.VBox):  # type: ignore[misc,name-defined]
    """Two traces side by side: top kernels (GPU time in each run's steady window and per
    steady step, with the per-step verdict of :func:`tracekit.diff`) and NVTX ranges (CPU
    duration, same windows), with deltas (b − a), and the
    per-step tables of :func:`tracekit.diff` (tab "Verdict": kernels, families, NVTX ranges by
    the GPU time of the work launched inside, steps; slower / faster / no change against the
    step-to-step noise).

    Parameters
    ----------
    a, b
        Two :class:`~tracekit.nsys.trace.NsysTrace` (e.g. before and after a change).
    labels
        Names of the two traces in tables and legends.
    window
        ``"steady"`` (default: each run's steady iterations, :func:`tracekit.structure`; the
        whole trace for a run without them) or ``"whole"``.

    ``n`` (rows shown) and ``sort`` (``"delta"``, ``"a"``, ``"b"``) are traits.
    """

    n = traitlets.Int(20)
    sort = traitlets.Unicode("delta")

    def __init__(
        self, a: Any, b: Any, *, labels: tuple[str, str] = ("A", "B"), window: str = "steady", **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.a, self.b, self.labels = a, b, labels
        from tracekit.comparison import diff
        from tracekit.viz.window import steady_window, whole_window

        self.diff = diff(a, b)
        pick = steady_window if window == "steady" else whole_window
        #: The window of each trace the Kernels and NVTX tabs compare.
        self.windows = (pick(a), pick(b))
        steps = [self._steps(t, w) for t, w in zip((a, b), self.windows, strict=True)]
        #: Steady steps of each run (1 for a whole trace): the per-step columns divide by them.
        self.steps = (steps[0], steps[1])
        ka, kb = (w.filter(t.kernels) for t, w in zip((a, b), self.windows, strict=True))
        verdicts = self.diff.levels["kernel"].select(pl.col("key").alias("name"), "verdict")
        self.kernels = compare_kernels(ka, kb).join(verdicts, on="name", how="left", maintain_order="left").with_columns(
            (pl.col("total_a_ns") / steps[0] / 1e6).alias("per_step_a_ms"),
            (pl.col("total_b_ns") / steps[1] / 1e6).alias("per_step_b_ms"))
        na, nb = (w.filter(t.nvtx) for t, w in zip((a, b), self.windows, strict=True))
        self.ranges = compare_ranges(na, nb)
        self.kernels_shown = pl.DataFrame()
        self.ranges_shown = pl.DataFrame()
        w = widgets
        self.n_slider = w.IntSlider(
            value=self.n, min=5, max=100, step=5, description="rows", continuous_update=False
        )
        self.sort_picker = w.Dropdown(options=[("largest change", "delta"), (f"time in {labels[0]}", "a"), (f"time in {labels[1]}", "b")],
                                      value=self.sort, description="sort")  # fmt: skip
        w.link((self.n_slider, "value"), (self, "n"))
        w.link((self.sort_picker, "value"), (self, "sort"))
        self.summary = w.HTML()
        self.kernel_view = ChartView()
        self.range_view = ChartView()
        self.kernel_html = w.HTML()
        self.range_html = w.HTML()
        self.verdict_html = w.HTML()
        tabs = w.Tab(
            children=[
                w.VBox([self.verdict_html]),
                w.VBox([self.kernel_view.widget, self.kernel_html]),
                w.VBox([self.range_view.widget, self.range_html]),
            ]
        )
        tabs.set_title(0, "Verdict")
        tabs.set_title(1, "Kernels")
        tabs.set_title(2, "NVTX ranges (CPU)")
        self.children = (w.HBox([self.n_slider, self.sort_picker]), self.summary, tabs)
        self._refresh()

    @staticmethod
    def _steps(trace: Any, window: Any) -> int:
        if window.kind != "steady":
            return 1
        from tracekit.diagnosis import structure

        return max(int(structure(trace).steps or 1), 1)

    @traitlets.observe("n", "sort")
    def _on_change(self, _change: dict[str, Any]) -> None:
        self._refresh()

    def _sorted(self, frame: pl.DataFrame, key: str) -> pl.DataFrame:
        if self.sort == "a":
            return frame.sort("total_a_ns", key, descending=[True, False])
        if self.sort == "b":
            return frame.sort("total_b_ns", key, descending=[True, False])
        return frame.sort(pl.col("delta_ns").abs(), key, descending=[True, False])

    def _verdict_html(self) -> str:
        """The answer first (``Diff.verdict_line``: step time before → after against the
        noise), then why (the findings of ``tracekit.diagnose`` that changed) and the notes."""
        colors = {"slower": "#b00020", "faster": "#1b7f3b", "no change": "#555"}
        h = self.diff.headline()
        color = colors.get(h["verdict"], "#555") if h else "#555"
        out = f'<p style="font-size:1.15em;font-weight:600;color:{color}">{html.escape(self.diff.verdict_line())}</p>'
        why = self.diff.why_lines()
        if why:
            out += "<p>Why — findings of <code>tracekit.diagnose</code> that changed:</p><ul>"
            out += "".join(f"<li>{html.escape(line)}</li>" for line in why) + "</ul>"
        out += "".join(f'<p class="note"><i>{html.escape(n)}</i></p>' for n in self.diff.notes)
        return out

    def _graph_line(self) -> str:
        """A line on the CUDA graph replays traced whole (``graph_trace``) of either trace: GPU
        time that the kernel time above and the kernel table do not hold (empty without)."""
        from tracekit.analysis.graphs import graph_trace_of
        from tracekit.viz.prep import whole_graphs

        graphs = [whole_graphs(graph_trace_of(t)) for t in (self.a, self.b)]
        if all(g is None for g in graphs):
            return ""
        parts = [f"{label} {0 if g is None else g.height:,} ({fmt_ns(0 if g is None else g['duration_ns'].sum())})"
                 for label, g in zip(self.labels, graphs, strict=True)]
        return (f"<p>CUDA graph replays traced whole (their kernels are in neither the kernel time nor the table): "
                f"{html.escape(' · '.join(parts))}</p>")

    def _refresh(self) -> None:
        la, lb = self.labels
        ka, kb = self.a.kernels["duration_ns"].sum(), self.b.kernels["duration_ns"].sum()
        self.summary.value = (
            self._verdict_html()
            + f"<p>kernel time: {la} {fmt_ns(ka)} · {lb} {fmt_ns(kb)} · Δ {fmt_ns(kb - ka)}"
            + (f" ({100 * (kb - ka) / ka:+.1f}%)" if ka else "")
            + f" · kernels {self.a.kernels.height:,} → {self.b.kernels.height:,} (whole traces)</p>"
            + f"<p>Kernels and NVTX tabs: {html.escape(la)} {html.escape(self.windows[0].label())} · "
            f"{html.escape(lb)} {html.escape(self.windows[1].label())}; per step = the window's total ÷ its steps</p>"
            + self._graph_line()
        )
        ms = "{:,.3f}".format
        self.kernels_shown = self._sorted(self.kernels, "name").head(self.n)
        self.ranges_shown = self._sorted(self.ranges, "range").head(self.n)
        per_step = self.steps != (1, 1)
        k = self.kernels_shown.select(
            "name", "family", "instances_a", "instances_b",
            *[(pl.col(c) / 1e6).alias(c.replace("_ns", "_ms")) for c in ("total_a_ns", "total_b_ns", "delta_ns")],
            *(["per_step_a_ms", "per_step_b_ms"] if per_step else []), "ratio", "verdict")
        headers = {"total_a_ms": f"{la} (ms)", "total_b_ms": f"{lb} (ms)", "instances_a": f"n {la}", "instances_b": f"n {lb}",
                   "count_a": f"n {la}", "count_b": f"n {lb}", "delta_ms": "Δ (ms)", "per_step_a_ms": f"{la} per step (ms)",
                   "per_step_b_ms": f"{lb} per step (ms)", "ratio": f"{lb} ÷ {la}"}  # fmt: skip
        fmts: dict[str, Callable[[Any], str]] = {c: ms for c in headers if c.endswith("_ms")}
        fmts.update({c: "{:,}".format for c in ("instances_a", "instances_b", "count_a", "count_b")})
        fmts["ratio"] = lambda v: "–" if v is None else f"{v:.2f}×"
        self.kernel_html.value = html_table(k, formats=fmts, left=("name", "family", "verdict"), headers=headers,
                                            clip={"name": "name"})
        if self.ranges.is_empty():
            from tracekit.viz.notes import hint

            self.range_html.value = f"<i>no NVTX ranges in either window: {html.escape(hint('nvtx'))}</i>"
        else:
            r = self.ranges_shown.select(
                "range", "count_a", "count_b",
                *[(pl.col(c) / 1e6).alias(c.replace("_ns", "_ms")) for c in ("total_a_ns", "total_b_ns", "delta_ns")], "ratio")
            self.range_html.value = html_table(r, formats=fmts, left=("range",), headers=headers, clip={"range": "range"})
        levels = {"kernel": "ms per step", "family": "ms per step", "range": "ms per step"}
        parts = []
        for level, frame in self.diff.levels.items():
            shown = frame.head(self.n).with_columns(
                pl.when(pl.col("key") == "kernels").then(pl.lit("kernels per step")).otherwise(pl.lit("ms per step")).alias("unit")
                if level == "step" else pl.lit(levels.get(level, "ms per step")).alias("unit"))
            scale = pl.when(pl.col("unit") == "ms per step").then(1e6).otherwise(1.0)
            shown = shown.select("key", "unit", *[(pl.col(c) / scale).alias(c) for c in ("mean_a", "mean_b", "delta", "noise")],
                                 (pl.col("delta_pct") * 100).alias("delta_pct"), "verdict")
            parts.append(
                f"<h4>{level} (per step, steps {self.diff.steps['before']} / {self.diff.steps['after']})</h4>"
                + html_table(shown, formats={"mean_a": ms, "mean_b": ms, "delta": ms, "noise": ms,
                                             "delta_pct": lambda v: "–" if v is None else f"{v:+.1f}"},
                             left=("key", "unit", "verdict"), clip={"key": "key"},
                             headers={"mean_a": la, "mean_b": lb, "delta": "Δ", "noise": "noise ±", "delta_pct": "Δ %"}))
        self.verdict_html.value = "".join(parts)
        kernels = self.kernels_shown.with_columns(
            (pl.col("per_step_a_ms") if per_step else pl.col("total_a_ns") / 1e6).alias("a_ms"),
            (pl.col("per_step_b_ms") if per_step else pl.col("total_b_ns") / 1e6).alias("b_ms"))
        ranges = self.ranges_shown.with_columns((pl.col("total_a_ns") / 1e6).alias("a_ms"), (pl.col("total_b_ns") / 1e6).alias("b_ms"))
        for view, frame, key, title, unit in (
            (self.kernel_view, kernels, "name", "Top kernels", "GPU time per step (ms)" if per_step else "GPU time (ms)"),
            (self.range_view, ranges, "range", "NVTX ranges", "CPU time in the window (ms)"),
        ):
            if frame.is_empty():
                from tracekit.viz.notes import hint

                view.message(hint("nvtx") if key == "range" else "no kernels in either window")
                continue
            view.show(_delta_chart(frame, key, self.labels, title, unit))
