"""``TraceExplorer``: one Nsight Systems trace in tabs, with a shared kernel and time selection.

Tabs: overview, top kernels (filter, sort), NVTX tree with GPU time, timeline (window
selection), communication, GPU metrics, memory (in use over time, and per NVTX layer range:
entry/exit, peak, net growth), findings (``tracekit.diagnose``: picking one
shows its evidence's time span on the timeline). Two traits tie them together:
``selected_kernel`` (a kernel name) and ``window`` (``(start_ns, end_ns)`` or ``None``).
Clicking a kernel in a chart, picking it in the list, dragging over the timeline or a metric
plot, or setting the traits from Python updates every tab. CUDA graph launches traced whole
(``trace.graph_trace``: their kernels are in no table) are GPU work in the overview, the
timeline and the NVTX tree.
"""

from __future__ import annotations

import html
from typing import Any

import polars as pl

from tracekit.viz._deps import import_ipywidgets
from tracekit.viz.window import ViewWindow, steady_window, whole_window
from tracekit.widgets._common import (
    ChartView,
    selected_points,
    selected_range,
)
from tracekit.widgets.explorer_views import SORT_KEYS, ExplorerViews

widgets = import_ipywidgets()
import traitlets  # noqa: E402  (ipywidgets depends on it; imported after the helpful error)

#: Widths that keep button labels whole (ipywidgets' default 148 px cuts "steady window").
BUTTON = {"width": "auto", "min_width": "130px"}


class TraceExplorer(ExplorerViews, widgets.VBox):  # type: ignore[misc,name-defined]
    """Explore one trace in a notebook.

    Parameters
    ----------
    trace
        An :class:`~tracekit.nsys.trace.NsysTrace` (or any object with ``kernels``,
        ``memcpys``, ``memsets``, ``nvtx``, ``cuda_api``, ``gpu_metrics``, ``memory_usage``).
    max_marks
        Most marks a timeline draws before it aggregates into time bins.
    top_n
        Rows of the top-kernels table and chart.

    Examples
    --------
    >>> from tracekit.widgets import TraceExplorer
    >>> ex = TraceExplorer(tracekit.open("trace.sqlite"))  # doctest: +SKIP
    >>> ex.selected_kernel = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"  # doctest: +SKIP
    >>> ex.window = (ex.origin_ns, ex.origin_ns + 50_000_000)  # first 50 ms  # doctest: +SKIP
    """

    selected_kernel = traitlets.Unicode(None, allow_none=True)
    window = traitlets.Tuple(None, allow_none=True)

    TAB_TITLES = (
        "Overview",
        "Top kernels",
        "NVTX",
        "Timeline",
        "Communication",
        "GPU metrics",
        "Memory",
        "Findings",
    )
    #: Chart views of each tab: a hidden tab's charts are created when the tab is first shown.
    TAB_VIEWS: tuple[tuple[str, ...], ...] = (
        ("overview", "iterations"), ("top",), (), ("timeline",), ("breakdown", "nccl"), ("metrics",), ("memory", "layer_memory", "layer_growth"), (),
    )  # fmt: skip
    #: Index of the Findings tab (built on first show: it runs ``tracekit.diagnose``).
    FINDINGS_TAB = 7

    def __init__(
        self, trace: Any = None, *, max_marks: int = 2000, top_n: int = 25, window: Any = "steady",
        folder: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        from tracekit.viz import prep

        self.max_marks = max_marks
        self.prep = prep
        self._top_n = top_n
        self._initial_window = window
        self.picker: Any = None
        self.tabs: Any = None
        self.message = widgets.HTML()
        if folder is not None or isinstance(trace, str) or trace is None or hasattr(trace, "__fspath__"):
            from tracekit.widgets.picker import TracePicker

            self.picker = TracePicker(folder or "", "" if trace is None else str(trace))
            self.picker.on_pick(lambda path: self.load(path))
            trace = self._open_path(self.picker.value) if self.picker.value else None
        self._set_trace(trace)

    def _open_path(self, path: str) -> Any:
        """``tracekit.open(path)``, or ``None`` with the error's line shown above the tabs."""
        import tracekit
        from tracekit.errors import one_line

        try:
            return tracekit.open(path)
        except Exception as exc:  # a bad file must not break the notebook
            self.message.value = f"<b style='color:#b00020'>cannot open {html.escape(path)}: {html.escape(one_line(str(exc)))}</b>"
            return None

    def load(self, trace: Any) -> None:
        """Show another trace (an ``NsysTrace`` or a path) in this explorer."""
        if isinstance(trace, str) or hasattr(trace, "__fspath__"):
            trace = self._open_path(str(trace))
            if trace is None:
                return
        self.message.value = ""
        self._set_trace(trace)

    def _set_trace(self, trace: Any) -> None:
        prep = self.prep
        self.errors: dict[str, str] = {}
        self._attributed: pl.DataFrame | None = None
        self._diagnosis: Any = None
        self._structure: Any = None
        self._loading = True
        self._syncing = False
        self.selected_kernel = None
        self.trace = trace
        if trace is None:
            self.kernels = pl.DataFrame()
            self.tabs = None
            hint = "pick a trace file in the list above" if self.picker is not None else "no trace"
            self.children = tuple(c for c in (self.picker, self.message, widgets.HTML(f"<i>{hint}</i>")) if c is not None)
            self._loading = False
            return
        self.kernels = prep.gpu_ops(trace.kernels, name_column="name")
        self._raw_kernels = trace.kernels
        #: CUDA graph launches traced whole (``graph_trace`` rows), or ``None``.
        self.graph_ops = prep.whole_graphs(self._graph_table("graph_trace"))
        self.whole = whole_window(trace)
        self.full_window = self.whole.bounds
        self.origin_ns = self.full_window[0]
        #: The run's steady window (the whole trace, saying why, when the run has none).
        self.steady = self._steady()

        # state the views show (read by tests and by users)
        self.top = pl.DataFrame()
        self.instances = pl.DataFrame()
        self.nvtx_rows = pl.DataFrame()
        self.timeline_lanes = pl.DataFrame()
        self.nccl_calls = pl.DataFrame()
        #: ``layer_memory`` rows of the ranges matching ``layer_ranges`` (in the window) and
        #: their summary per name and phase.
        self.layer_rows = pl.DataFrame()
        self.layer_summary = pl.DataFrame()
        self._layer_cache: tuple[str, pl.DataFrame, str | None] | None = None

        self.views = {
            name: ChartView(self._on_chart_select, active=name in self.TAB_VIEWS[0])
            for name in (
                "overview",
                "top",
                "timeline",
                "breakdown",
                "nccl",
                "metrics",
                "memory",
                "layer_memory",
                "layer_growth",
                "iterations",
            )
        }
        self._build(self._top_n)
        self.window = None  # type: ignore[assignment]
        initial = self._initial_window
        if initial == "steady":
            self.window = self.steady.bounds if self.steady.kind == "steady" else None  # type: ignore[assignment]
        elif initial not in (None, "whole"):
            self.window = (int(initial[0]), int(initial[1]))
        self._loading = False
        self._window_changed({})

    def _steady(self) -> ViewWindow:
        try:
            return steady_window(self.trace, structure=self.structure)
        except Exception as exc:  # keep the explorer alive: the whole trace, saying why
            from tracekit.errors import one_line

            self.errors["structure"] = f"{type(exc).__name__}: {exc}"
            return whole_window(self.trace, detail=f"no run structure: {one_line(str(exc), 120)}")

    def current_window(self) -> ViewWindow:
        """The window every tab shows, with its label: the steady window, the whole trace or
        a selected window."""
        if self.window is None:  # the whole trace; when the run has no steady window, saying why
            return self.steady if self.steady.kind == "whole" else self.whole
        if self.steady.kind == "steady" and tuple(self.window) == self.steady.bounds:
            return self.steady
        return ViewWindow(int(self.window[0]), int(self.window[1]), "selected")

    # -- layout -------------------------------------------------------------------------------------
    def _build(self, top_n: int) -> None:
        w = widgets
        self.summary = w.HTML()
        self.filter_text = w.Text(
            placeholder="filter kernels (regex)", description="filter", continuous_update=False
        )
        self.sort_by = w.Dropdown(options=list(SORT_KEYS), value="GPU time", description="sort by",
                                  layout=w.Layout(width="auto"))
        self.top_n = w.IntSlider(
            value=top_n, min=5, max=200, step=5, description="rows", continuous_update=False
        )
        self.kernel_picker = w.Dropdown(options=[("(none)", "")], value="", description="kernel",
                                        layout=w.Layout(width="60%"))  # fmt: skip
        self.top_table = w.HTML()
        self.instances_html = w.HTML()
        for control in (self.filter_text, self.sort_by, self.top_n):
            control.observe(lambda _c: self._refresh_top(), names="value")
        self.kernel_picker.observe(self._on_pick, names="value")

        self.nvtx_depth = w.IntSlider(
            value=3, min=1, max=8, description="depth", continuous_update=False
        )
        self.nvtx_depth.observe(lambda _c: self._refresh_nvtx(), names="value")
        self.nvtx_html = w.HTML()

        span_ms = (self.full_window[1] - self.full_window[0]) / 1e6
        self.window_slider = w.FloatRangeSlider(
            value=(0.0, span_ms), min=0.0, max=span_ms, step=max(span_ms / 1000, 1e-3),
            description="ms", continuous_update=False, readout_format=".3f", layout=w.Layout(width="95%"),
        )  # fmt: skip
        self.window_slider.observe(self._on_slider, names="value")
        self.reset_button = w.Button(description="whole trace", icon="expand", layout=w.Layout(**BUTTON),
                                     tooltip="everything the capture holds: start-up, warm-up and tear-down included")
        self.reset_button.on_click(lambda _b: setattr(self, "window", None))
        self.steady_button = w.Button(description="steady window", icon="compress", layout=w.Layout(**BUTTON),
                                      tooltip="the run's steady iterations (tracekit.structure): no start-up, warm-up or tear-down",
                                      disabled=self.steady.kind != "steady")
        self.steady_button.on_click(lambda _b: self.show_steady())
        self.show_nvtx = w.Checkbox(value=True, description="NVTX lanes", indent=False, layout=w.Layout(width="auto"))
        self.show_nvtx.observe(lambda _c: self._refresh_timeline(), names="value")
        self.show_api = w.Checkbox(value=True, description="CUDA API lanes", indent=False, layout=w.Layout(width="auto"))
        self.show_api.observe(lambda _c: self._refresh_timeline(), names="value")
        #: The window every tab shows, said above the tabs.
        self.window_bar = w.HTML()
        self.window_label = w.HTML()
        self.comm_html = w.HTML()
        self.layer_ranges = w.Text(
            value=self.prep.LAYER_MEMORY_PATTERN, description="ranges", continuous_update=False,
            placeholder="NVTX ranges (regex)", layout=w.Layout(width="80%"),
        )  # fmt: skip
        self.layer_ranges.observe(lambda _c: self._refresh_memory(), names="value")
        self.layer_html = w.HTML()
        self.findings_select = w.Select(options=[], rows=8, layout=w.Layout(width="100%"))
        self.findings_select.observe(self._on_finding, names="value")
        self.findings_html = w.HTML()
        self.timeline_button = w.Button(description="Show on the timeline", icon="arrow-right", disabled=True,
                                        layout=w.Layout(**BUTTON),
                                        tooltip="the selected finding's evidence as the timeline's window")
        self.timeline_button.on_click(lambda _b: self._show_timeline())

        v = self.views
        tabs = [
            w.VBox([self.summary, v["overview"].widget, v["iterations"].widget]),
            w.VBox([w.HBox([self.filter_text, self.sort_by, self.top_n]), self.kernel_picker, v["top"].widget,
                    self.top_table, self.instances_html]),
            w.VBox([self.nvtx_depth, self.nvtx_html]),
            w.VBox([self.window_slider, w.HBox([self.show_nvtx, self.show_api, self.window_label]),
                    v["timeline"].widget]),
            w.VBox([v["breakdown"].widget, v["nccl"].widget, self.comm_html]),
            w.VBox([v["metrics"].widget]),
            w.VBox([v["memory"].widget, w.HTML("<b>Memory per NVTX range</b> (tracekit.analysis.memory.layer_memory)"),
                    self.layer_ranges, v["layer_memory"].widget, v["layer_growth"].widget, self.layer_html]),
            w.VBox([w.HTML("<b>Findings</b> (tracekit.diagnose): pick one for its card — time at stake, evidence, "
                           "advice, next commands — and show its evidence on the timeline"),
                    self.findings_select, self.timeline_button, self.findings_html]),
        ]  # fmt: skip
        self.tabs = w.Tab(children=tabs)
        for i, title in enumerate(self.TAB_TITLES):
            self.tabs.set_title(i, title)
        self.tabs.observe(self._on_tab, names="selected_index")
        bar = w.HBox([self.window_bar, self.steady_button, self.reset_button],
                     layout=w.Layout(align_items="center", flex_flow="row wrap"))
        self.children = tuple(c for c in (self.picker, self.message, bar, self.tabs) if c is not None)

    def _on_tab(self, change: dict[str, Any]) -> None:
        index = change["new"]
        if index is not None:
            for name in self.TAB_VIEWS[index]:
                self.views[name].activate()
            if index == self.FINDINGS_TAB and not self.findings_select.options:
                self._guard("findings", None, self._refresh_findings)

    # -- the run's structure -------------------------------------------------------------------------
    @property
    def structure(self) -> Any:
        """The run's structure (:func:`tracekit.structure`: kind, iterations, warm-up,
        start-up, requests), computed once: the diagnosis's when it was made first."""
        if getattr(self, "_structure", None) is None:
            if self._diagnosis is not None and self._diagnosis.structure is not None:
                self._structure = self._diagnosis.structure
            else:
                from tracekit.diagnosis import structure

                self._structure = structure(self.trace)
        return self._structure

    def show_steady(self) -> None:
        """Set :attr:`window` to the run's steady iterations (no start-up, warm-up or tear-down)."""
        if self.steady.kind == "steady":
            self.window = self.steady.bounds

    # -- findings ---------------------------------------------------------------------------------------
    @property
    def diagnosis(self) -> Any:
        """``tracekit.diagnose(trace)``, computed once (on first use)."""
        if self._diagnosis is None:
            from tracekit.diagnosis import diagnose

            self._diagnosis = diagnose(self.trace)
        return self._diagnosis

    def _refresh_findings(self) -> None:
        from tracekit.diagnosis.html import time_bar

        d = self.diagnosis
        self.findings_select.options = [
            (f"{i}. [{f.severity}] {f.category}: {f.title}", i) for i, f in enumerate(d.items)
        ]
        self.findings_html.value = f"<i>{html.escape(d.window_text())}</i>{time_bar(d)}"

    def evidence_window(self, i: int) -> tuple[int, int]:
        """The time span of finding ``i``'s evidence rows (``start_ns``…``end_ns``), or the
        diagnosis window when its evidence has no times."""
        d = self.diagnosis
        ev = d.evidence(i)
        if ev.height and "start_ns" in ev.columns and "end_ns" in ev.columns:
            lo, hi = ev["start_ns"].min(), ev["end_ns"].max()
            if lo is not None and hi is not None and hi > lo:
                return int(lo), int(hi)  # type: ignore[arg-type]
        return d.window.start_ns, d.window.end_ns

    def select_finding(self, i: int, *, show_timeline: bool = False) -> None:
        """Show finding ``i``: its card (:func:`tracekit.diagnosis.html.finding_card`, the one
        ``Diagnosis`` displays in a notebook), its evidence's time span as the window and the
        kernel it names (if any) as the selected kernel; with ``show_timeline`` (the "Show on
        the timeline" button) also switch to the Timeline tab."""
        from tracekit.diagnosis.html import finding_card

        d = self.diagnosis
        f = d.items[i]
        ev = d.evidence(i)
        self.findings_html.value = finding_card(f, i)
        for col in ("short_name", "kernel"):
            if col in ev.columns and ev.height and ev[col][0] is not None:
                self.selected_kernel = str(ev[col][0])
                break
        lo, hi = self.evidence_window(i)
        self.window = (lo, hi)
        self.timeline_button.disabled = False
        if show_timeline:
            self._show_timeline()

    def _show_timeline(self) -> None:
        self.tabs.selected_index = 3

    def _on_finding(self, change: dict[str, Any]) -> None:
        if change["new"] is not None and not self._syncing:
            self.select_finding(int(change["new"]))

    # -- selection plumbing ---------------------------------------------------------------------------
    def _on_chart_select(self, name: str, value: Any) -> None:
        if name == "kernel":
            names = selected_points(value, "name")
            self.selected_kernel = str(names[0]) if names else None
        elif name == "window":
            rng = selected_range(value, "start_ms") or selected_range(value, "time_ms")
            if rng is not None:
                self.window = (
                    self.origin_ns + int(rng[0] * 1e6),
                    self.origin_ns + int(rng[1] * 1e6),
                )

    def _on_pick(self, change: dict[str, Any]) -> None:
        if not self._syncing:
            self.selected_kernel = change["new"] or None

    def _set_picker(self, options: list[tuple[str, str]], value: str) -> None:
        self._syncing = True
        try:
            self.kernel_picker.options = options
            self.kernel_picker.value = value
        finally:
            self._syncing = False

    def _on_slider(self, change: dict[str, Any]) -> None:
        if self._syncing:
            return
        lo, hi = change["new"]
        win = (self.origin_ns + int(lo * 1e6), self.origin_ns + int(hi * 1e6))
        if win != self._effective_window():
            self.window = None if (lo <= 0 and hi >= self.window_slider.max) else win  # type: ignore[assignment]

    @traitlets.validate("window")
    def _valid_window(self, proposal: dict[str, Any]) -> Any:
        win = proposal["value"]
        if win is None:
            return None
        lo, hi = int(win[0]), int(win[1])
        if hi <= lo:
            msg = f"window end ({hi}) must be after its start ({lo})"
            raise traitlets.TraitError(msg)
        return (lo, hi)

    @traitlets.observe("window")
    def _window_changed(self, _change: dict[str, Any]) -> None:
        if getattr(self, "_loading", False) or getattr(self, "tabs", None) is None:
            return
        lo, hi = self._effective_window()
        win = self.current_window()
        color = {"steady": "#1b7f3b", "whole": "#555", "selected": "#8a5a00"}[win.kind]
        self.window_bar.value = (f"<span style='font-size:13px'>window: <b style='color:{color}'>"
                                 f"{html.escape(win.label())}</b></span>")
        self._syncing = True
        try:
            self.window_slider.value = ((lo - self.origin_ns) / 1e6, (hi - self.origin_ns) / 1e6)
        finally:
            self._syncing = False
        self._refresh_all()

    @traitlets.observe("selected_kernel")
    def _kernel_changed(self, change: dict[str, Any]) -> None:
        if getattr(self, "_loading", False) or getattr(self, "tabs", None) is None:
            return
        self._refresh_top()
        self._refresh_instances()
        self._refresh_nvtx()
        self._refresh_timeline()

    # -- data -------------------------------------------------------------------------------------------
    def _graph_table(self, name: str) -> pl.DataFrame | None:
        """``trace.graph_trace`` or ``trace.graphs``; ``None`` for a trace object without it
        (or when reading it fails: the error is kept in :attr:`errors`)."""
        try:
            frame = getattr(self.trace, name, None)
        except Exception as exc:  # keep the explorer alive
            self.errors[name] = f"{type(exc).__name__}: {exc}"
            return None
        return frame if isinstance(frame, pl.DataFrame) else None

    def _effective_window(self) -> tuple[int, int]:
        window: tuple[int, int] = self.window if self.window is not None else self.full_window
        return window

    def _in_window(self, frame: pl.DataFrame) -> pl.DataFrame:
        if self.window is None or frame.is_empty():
            return frame
        lo, hi = self.window
        return frame.filter((pl.col("end_ns") > lo) & (pl.col("start_ns") < hi))

    @property
    def attributed(self) -> pl.DataFrame:
        """Kernels with their NVTX path (computed once)."""
        if self._attributed is None:
            try:
                graphs = self._graph_table("graphs") if self.graph_ops is not None else None
                self._attributed = self.prep.attributed_kernels(
                    self._raw_kernels, self.trace.cuda_api, self.trace.nvtx, graphs
                )
            except Exception as exc:  # keep the other tabs alive
                self.errors["nvtx"] = f"{type(exc).__name__}: {exc}"
                self._attributed = self._raw_kernels.with_columns(
                    pl.lit(None, pl.Utf8).alias("nvtx_path")
                )
        return self._attributed

    def _guard(self, key: str, view: ChartView | None, build: Any) -> None:
        try:
            build()
        except Exception as exc:  # one failing view must not break the explorer
            self.errors[key] = f"{type(exc).__name__}: {exc}"
            if view is not None:
                view.message(f"could not draw this view: {self.errors[key]}")
