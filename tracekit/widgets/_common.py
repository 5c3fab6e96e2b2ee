"""Shared pieces of the widgets: chart views that report selections, HTML tables, formatting."""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from tracekit.viz._deps import has_anywidget, import_altair, import_ipywidgets
from tracekit.viz.tables import fmt_bytes, fmt_ns, html_table

__all__ = [
    "ChartView",
    "ensure_offline",
    "fmt_bytes",
    "fmt_ns",
    "html_table",
    "selected_points",
    "selected_range",
]


def ensure_offline() -> None:
    """Load altair's JupyterChart JavaScript from vl-convert's bundle, never from a CDN."""
    if has_anywidget():
        from tracekit.viz.notebook import enable_offline_widgets

        enable_offline_widgets()


class ChartView:
    """A chart inside a widget; calls ``on_select(name, value)`` when a selection changes.

    With ``anywidget`` installed the chart is an ``alt.JupyterChart`` (selections come back to
    Python); otherwise an ``Output`` showing the chart (selections stay in the browser).
    ``chart`` holds the altair chart last shown, ``widget`` the ipywidget to lay out.
    """

    def __init__(
        self, on_select: Callable[[str, Any], None] | None = None, *, active: bool = True
    ) -> None:
        self.widgets = import_ipywidgets()
        self.on_select = on_select
        self.widget = self.widgets.Box(layout=self.widgets.Layout(width="100%", overflow="auto"))
        self.chart: Any = None
        self.jupyter_chart: Any = None
        self.error: str | None = None
        self.active = active
        self._pending = False

    def activate(self) -> None:
        """Create the chart widget now (views of hidden tabs wait until their tab is shown)."""
        self.active = True
        if self._pending and self.chart is not None:
            self.show(self.chart)

    def show(self, chart: Any) -> None:
        """Replace the chart shown (the same ``JupyterChart`` widget is reused).

        While the view is not ``active`` only ``chart`` is updated: each chart widget loads
        about 1 MB of JavaScript in the browser, so hidden tabs do not create theirs.
        """
        self.chart = chart
        self.error = None
        if not self.active:
            self._pending = True
            return
        self._pending = False
        if has_anywidget():
            ensure_offline()
            if self.jupyter_chart is None:
                alt = import_altair()
                self.jupyter_chart = alt.JupyterChart(chart, debounce_wait=50)
            else:
                # reusing the widget: replacing it would close models the page may still be loading
                self.jupyter_chart.chart = chart
            jc = self.jupyter_chart
            for name in _param_names(chart):
                if name in jc.selections.trait_names():
                    jc.selections.observe(self._changed, names=[name])
            self.widget.children = (jc,)
        else:
            out = self.widgets.Output()
            with out:
                from IPython.display import display

                display(chart)  # type: ignore[no-untyped-call]
            self.widget.children = (out,)

    def message(self, text: str) -> None:
        """Show a line of text instead of a chart (no data, or an error)."""
        self.chart = None
        self.error = text
        self.widget.children = (self.widgets.HTML(f"<i>{html.escape(text)}</i>"),)

    def _changed(self, change: dict[str, Any]) -> None:
        if self.on_select is None:
            return
        value = getattr(change["new"], "value", change["new"])
        self.on_select(change["name"], value)


def _param_names(chart: Any) -> list[str]:
    names: list[str] = []
    try:
        spec = chart.to_dict(validate=False)
    except Exception:  # a chart that cannot serialise shows its own error when displayed
        return names

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for p in node.get("params", []) or []:
                if isinstance(p, dict) and "select" in p and p.get("name"):
                    names.append(str(p["name"]))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(spec)
    return list(dict.fromkeys(names))


def selected_points(value: Any, field: str) -> list[Any]:
    """Values of ``field`` in a point selection's value (a list of dicts, or a dict)."""
    if isinstance(value, dict):
        value = [value]
    out = []
    for item in value or []:
        if isinstance(item, dict) and field in item:
            out.append(item[field])
    return out


def selected_range(value: Any, field: str) -> tuple[float, float] | None:
    """``(low, high)`` of an interval selection on ``field`` (``None`` when cleared)."""
    if isinstance(value, dict) and field in value:
        lo_hi = value[field]
        if isinstance(lo_hi, list | tuple) and len(lo_hi) == 2:
            return (float(min(lo_hi)), float(max(lo_hi)))
    return None
