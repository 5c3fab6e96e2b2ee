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


def _delta_chart(frame: pl.DataFrame, key: str, labels: tuple[str, str], title: str) -> Any:
    from tracekit.viz.charts import _alt, _short

    alt = _alt()
    long = (
        frame.head(20)
        .with_columns(_short(key, 48).alias("label"))
        .unpivot(
            index=["label"], on=["total_a_ns", "total_b_ns"], variable_name="trace", value_name="ns"
        )
        .with_columns(
            pl.col("trace").replace_strict(
                {"total_a_ns": labels[0], "total_b_ns": labels[1]}, return_dtype=pl.Utf8
            ),
            (pl.col("ns") / 1e6).alias("ms"),
        )
    )
    order = frame.head(20).with_columns(_short(key, 48).alias("label"))["label"].to_list()
    return (
        alt.Chart(long)
        .mark_bar()
        .encode(
            y=alt.Y("label:N", sort=order, title=None),
            yOffset=alt.YOffset("trace:N", sort=list(labels)),
            x=alt.X("ms:Q", title="time (ms)"),
            color=alt.Color(
                "trace:N",
                sort=list(labels),
                scale=alt.Scale(range=["#0072B2", "#E69F00"]),
                title=None,
            ),
            tooltip=["label:N", "trace:N", alt.Tooltip("ms:Q", format=".3f")],
        )
        .properties(title=title, width=420)
    )


class Compare(widgets.VBox):  # type: ignore[misc,name-defined]
    """Two traces side by side: top kernels (whole-run GPU time, with the per-step verdict of
    :func:`tracekit.diff`) and NVTX ranges (CPU duration), with deltas (b − a), and the
    per-step tables of :func:`tracekit.diff` (tab "Verdict": kernels, families, NVTX ranges by
    the GPU time of the work launched inside, steps; slower / faster / no change against the
    step-to-step noise).

    Parameters
    ----------
    a, b
        Two :class:`~tracekit.nsys.trace.NsysTrace` (e.g. before and after a change).
    labels
        Names of the two traces in tables and legends.

    ``n`` (rows shown) and ``sort`` (``"delta"``, ``"a"``, ``"b"``) are traits.
    """

    n = traitlets.Int(20)
    sort = traitlets.Unicode("delta")

    def __init__(
        self, a: Any, b: Any, *, labels: tuple[str, str] = ("A", "B"), **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.a, self.b, self.labels = a, b, labels
        from tracekit.comparison import diff

        self.diff = diff(a, b)
        verdicts = self.diff.levels["kernel"].select(pl.col("key").alias("name"), "verdict")
        self.kernels = compare_kernels(a.kernels, b.kernels).join(verdicts, on="name", how="left", maintain_order="left")
        self.ranges = compare_ranges(a.nvtx, b.nvtx)
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
            + f" · kernels {self.a.kernels.height:,} → {self.b.kernels.height:,}</p>"
            + self._graph_line()
        )
        fmts: dict[str, Callable[[Any], str]] = {
            c: fmt_ns for c in ("total_a_ns", "total_b_ns", "delta_ns")
        }
        fmts["ratio"] = lambda v: "–" if v is None else f"{v:.2f}×"
        self.kernels_shown = self._sorted(self.kernels, "name").head(self.n)
        self.ranges_shown = self._sorted(self.ranges, "range").head(self.n)
        headers = {"total_a_ns": la, "total_b_ns": lb, "instances_a": f"n {la}", "instances_b": f"n {lb}",
                   "count_a": f"n {la}", "count_b": f"n {lb}", "delta_ns": "Δ"}  # fmt: skip
        self.kernel_html.value = html_table(
            self.kernels_shown, formats=fmts, left=("name", "family", "verdict"), headers=headers
        )
        self.range_html.value = html_table(
            self.ranges_shown, formats=fmts, left=("range",), headers=headers
        )
        verdict_fmts: dict[str, Callable[[Any], str]] = {c: fmt_ns for c in ("mean_a", "mean_b", "delta", "noise")}
        verdict_fmts["delta_pct"] = lambda v: "–" if v is None else f"{100 * v:+.1f}%"
        self.verdict_html.value = "".join(
            f"<h4>{level} (per step, steps {self.diff.steps['before']} / {self.diff.steps['after']})</h4>"
            + html_table(frame.head(self.n).select("key", "mean_a", "mean_b", "delta", "delta_pct", "noise", "verdict"),
                         formats=verdict_fmts, left=("key", "verdict"), headers={"mean_a": la, "mean_b": lb, "delta": "Δ"})
            for level, frame in self.diff.levels.items()
        )
        for view, frame, key, title in (
            (self.kernel_view, self.kernels_shown, "name", "Top kernels"),
            (self.range_view, self.ranges_shown, "range", "NVTX ranges"),
        ):
            if frame.is_empty():
                view.message("nothing to compare")
                continue
            view.show(_delta_chart(frame, key, self.labels, title))
