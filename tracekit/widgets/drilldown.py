"""``KernelDrilldown``: one Nsight Compute kernel at a time, with its nsys instances when given.

A kernel picker drives: speed-of-light bars, Tensor Core / DRAM / occupancy numbers, ncu's rule
findings, the kernel's position on the roofline, and — with the Nsight Systems trace of the
same program — its instances on the timeline and their duration statistics.
"""

from __future__ import annotations

import html
from typing import Any

import polars as pl

from tracekit.viz._deps import import_ipywidgets
from tracekit.widgets._common import ChartView, fmt_bytes, fmt_ns, html_table, selected_points

widgets = import_ipywidgets()
import traitlets  # noqa: E402


def pct(value: float | None) -> str:
    """A percentage for the tables (``–`` when missing)."""
    return "–" if value is None else f"{value:.1f}%"


def match_instances(
    trace_kernels: pl.DataFrame, short_name: str | None, name: str | None = None
) -> pl.DataFrame:
    """The nsys kernels of the same function as an ncu kernel (by demangled, then short name)."""
    if name and "name" in trace_kernels.columns:
        exact = trace_kernels.filter(pl.col("name") == name)
        if not exact.is_empty():
            return exact
    if short_name and "short_name" in trace_kernels.columns:
        return trace_kernels.filter(pl.col("short_name") == short_name)
    return trace_kernels.clear()


class KernelDrilldown(widgets.VBox):  # type: ignore[misc,name-defined]
    """Drill into the kernels of an Nsight Compute report.

    Parameters
    ----------
    report
        An :class:`~tracekit.ncu.report.NcuReport`.
    trace
        Optionally the :class:`~tracekit.nsys.trace.NsysTrace` of the same program: the
        selected kernel's instances are then shown on its timeline.

    The ``kernel_id`` trait (ncu's kernel ``id``) is the selection; set it from Python, pick
    in the list, or click a point of the roofline.
    """

    kernel_id = traitlets.Int(None, allow_none=True)

    def __init__(self, report: Any, trace: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        from tracekit.viz import prep_ncu

        self.report = report
        self.trace = trace
        self.errors: dict[str, str] = {}
        self.table = prep_ncu.kernel_metrics(report).sort(
            "duration_ns", descending=True, nulls_last=True
        )
        self.points: pl.DataFrame = pl.DataFrame()
        self.roofs: pl.DataFrame = pl.DataFrame()
        self._flop_sources: dict[int, str | None] = {}
        try:
            from tracekit.analysis.ncu_views import roofline as _roofline

            rf = _roofline(report)
            self._flop_sources = dict(zip(rf["id"].to_list(), rf["flop_sources"].to_list(), strict=True))
        except Exception as exc:
            self.errors["flops"] = f"{type(exc).__name__}: {exc}"
        try:
            self.points = prep_ncu.roofline_points(report)
            self.roofs = prep_ncu.roofline_roofs(report, self.points)
        except Exception as exc:
            self.errors["roofline"] = f"{type(exc).__name__}: {exc}"
        self.current: dict[str, Any] | None = None
        self.rules = pl.DataFrame()
        self.instances = pl.DataFrame()

        w = widgets
        options = [
            (f"{r['kernel']}  ({fmt_ns(r['duration_ns'])})", int(r["id"]))
            for r in self.table.iter_rows(named=True)
        ]
        self.picker = w.Dropdown(
            options=options, description="kernel", layout=w.Layout(width="90%")
        )
        self.picker.observe(lambda c: setattr(self, "kernel_id", c["new"]), names="value")
        self.header = w.HTML()
        self.numbers = w.HTML()
        self.rules_html = w.HTML()
        self.instances_html = w.HTML()
        self.sol_view = ChartView()
        self.roofline_view = ChartView(self._on_chart_select)
        self.timeline_view = ChartView()
        left = w.VBox([self.sol_view.widget, self.numbers], layout=w.Layout(width="45%"))
        right = w.VBox([self.roofline_view.widget], layout=w.Layout(width="55%"))
        parts = [self.picker, self.header, w.HBox([left, right]), self.rules_html]
        if trace is not None:
            parts += [self.instances_html, self.timeline_view.widget]
        self.children = tuple(parts)
        if options:
            self.kernel_id = options[0][1]

    def _on_chart_select(self, name: str, value: Any) -> None:
        labels = selected_points(value, "kernel")
        if name == "kernel" and labels:
            kernel_id = int(str(labels[0]).split(" ", 1)[0].lstrip("#"))
            self.kernel_id = kernel_id

    @traitlets.observe("kernel_id")
    def _changed(self, change: dict[str, Any]) -> None:
        kernel_id = change["new"]
        if kernel_id is None:
            return
        if self.picker.value != kernel_id:
            self.picker.value = kernel_id
        rows = self.table.filter(pl.col("id") == kernel_id)
        if rows.is_empty():
            self.current = None
            self.header.value = f"<i>no kernel with id {kernel_id}</i>"
            return
        row = rows.row(0, named=True)
        self.current = row
        self._show_header(row)
        self._show_charts(rows, row)
        self._show_rules(kernel_id)
        if self.trace is not None:
            self._show_instances(row)

    def _show_header(self, row: dict[str, Any]) -> None:
        k = self.report.kernels.filter(pl.col("id") == row["id"])
        launch = k.row(0, named=True) if not k.is_empty() else {}
        grid = "×".join(str(launch.get(f"grid_{a}", "?")) for a in "xyz")
        block = "×".join(str(launch.get(f"block_{a}", "?")) for a in "xyz")
        self.header.value = (
            f"<h3>{html.escape(str(row['kernel']))}</h3>"
            f"<p><b>{html.escape(str(launch.get('name') or ''))[:300]}</b><br>"
            f"family {html.escape(str(row.get('family')))} · duration {fmt_ns(row.get('duration_ns'))} · "
            f"grid {grid} · block {block} · registers {launch.get('registers_per_thread', '?')} · "
            f"bound: <b>{html.escape(str(row.get('bound')))}</b> · NVTX {html.escape(str(row.get('nvtx_path') or '–'))}</p>"
        )
        facts = [
            ("Tensor pipe active", pct(row.get("tensor_pipe_pct")), str(row.get("tensor_precision") or "")),
            ("DRAM bandwidth", "–" if row.get("bandwidth_gbps") is None else f"{row['bandwidth_gbps']:.1f} GB/s",
             pct(row.get("dram_throughput_pct"))),
            ("DRAM traffic", fmt_bytes(row.get("dram_bytes")), ""),
            ("Occupancy (achieved / theoretical)", pct(row.get("achieved_occupancy_pct")), pct(row.get("theoretical_occupancy_pct"))),
            ("Arithmetic intensity", "–" if row.get("arithmetic_intensity") is None else f"{row['arithmetic_intensity']:.2f} FLOP/B", ""),
            ("Performance", *self._performance(row)),
        ]  # fmt: skip
        self.numbers.value = (
            "<table>"
            + "".join(
                f"<tr><td>{a}</td><td><b>{b}</b></td><td>{html.escape(c)}</td></tr>"
                for a, b, c in facts
            )
            + "</table>"
        )

    def _performance(self, row: dict[str, Any]) -> tuple[str, str]:
        """The kernel's FLOP rate in a unit that shows it (TFLOP/s, GFLOP/s), and its share of
        the roof; a GEMM whose report has no tensor-pipe counters says so instead of 0."""
        flops = row.get("flops_per_s")
        sources = self._flop_sources.get(int(row["id"])) if row.get("id") is not None else None
        if flops is None or flops <= 0:
            if row.get("family") in ("gemm", "attention") and (sources or "") in ("", "simt"):
                return ("not counted", "the report has no tensor-pipe counters: profile with ncu --section "
                        "SpeedOfLight_HierarchicalTensorRooflineChart (tracekit capture ncu --preset kernel-drilldown)")
            return ("–", "no FLOPs counted" if flops is not None else "")
        text = f"{flops / 1e12:,.2f} TFLOP/s" if flops >= 1e12 else f"{flops / 1e9:,.1f} GFLOP/s"
        roof = "" if row.get("pct_of_attainable") is None else f"{row['pct_of_attainable']:.0f}% of roof"
        if row.get("family") in ("gemm", "attention") and sources == "simt":
            roof = (roof + "; " if roof else "") + "SIMT FLOPs only: no tensor-pipe counters in the report"
        return (text, roof)

    def _show_charts(self, rows: pl.DataFrame, row: dict[str, Any]) -> None:
        from tracekit.viz import roofline_chart, sol_chart

        try:
            self.sol_view.show(sol_chart(rows, title="Speed of light"))
        except Exception as exc:
            self.errors["sol"] = f"{type(exc).__name__}: {exc}"
            self.sol_view.message(self.errors["sol"])
        if self.points.is_empty():
            from tracekit.viz.notes import hint

            self.roofline_view.message(hint("roofline"))
            return
        try:
            chart = roofline_chart(
                self.points,
                self.roofs,
                highlight=str(row["kernel"]),
                title="Roofline",
                width=380,
                height=260,
            )
            self.roofline_view.show(chart)
        except Exception as exc:
            self.errors["roofline"] = f"{type(exc).__name__}: {exc}"
            self.roofline_view.message(self.errors["roofline"])

    def _show_rules(self, kernel_id: int) -> None:
        from tracekit.viz.prep_ncu import rules_for

        try:
            self.rules = rules_for(self.report, kernel_id)
        except Exception as exc:
            self.errors["rules"] = f"{type(exc).__name__}: {exc}"
            self.rules = pl.DataFrame()
        if self.rules.is_empty():
            self.rules_html.value = "<i>no rule findings</i>"
            return
        self.rules_html.value = "<h4>ncu rules</h4>" + html_table(
            self.rules,
            formats={"estimated_speedup_pct": lambda v: "–" if v is None else f"{v:.0f}%"},
            left=("rule_name", "section", "type", "message"),
        )

    def _show_instances(self, row: dict[str, Any]) -> None:
        k = self.report.kernels.filter(pl.col("id") == row["id"])
        name = k["name"][0] if not k.is_empty() and "name" in k.columns else None
        inst = match_instances(self.trace.kernels, row.get("short_name"), name).sort("start_ns")
        self.instances = inst
        if inst.is_empty():
            self.instances_html.value = "<i>no instances of this kernel in the nsys trace</i>"
            self.timeline_view.widget.children = ()  # said once, above
            self.timeline_view.chart = None
            return
        d = inst["duration_ns"]
        self.instances_html.value = (
            f"<h4>{inst.height} instances in the nsys trace</h4><p>total {fmt_ns(d.sum())} · mean "
            f"{fmt_ns(d.mean())} · median {fmt_ns(d.median())} · min {fmt_ns(d.min())} · max {fmt_ns(d.max())} · "
            f"ncu duration {fmt_ns(row.get('duration_ns'))}</p>"
        )
        from tracekit.viz import timeline_chart

        try:
            self.timeline_view.show(
                timeline_chart(inst, title="Instances on the timeline", width=700)
            )
        except Exception as exc:
            self.errors["timeline"] = f"{type(exc).__name__}: {exc}"
            self.timeline_view.message(self.errors["timeline"])
