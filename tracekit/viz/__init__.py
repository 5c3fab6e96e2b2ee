"""Charts (altair), the paper theme and figure export; imported lazily (``pip install 'tracekit[notebook]'``).

Charts take tracekit tables or the frames of :mod:`tracekit.viz.prep` and return altair charts;
:func:`save` writes byte-stable SVG/PDF/PNG figures; :func:`enable_notebook` renders offline.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "PAPER_THEME",
    "SCREEN_THEME",
    "Note",
    "ViewWindow",
    "breakdown_chart",
    "duration_chart",
    "enable_notebook",
    "gpu_metrics_chart",
    "iterations_chart",
    "kernel_charts",
    "layer_growth_chart",
    "layer_heatmap",
    "layer_memory_chart",
    "memory_chart",
    "message_chart",
    "missing",
    "nccl_bandwidth_chart",
    "prep",
    "prep_ncu",
    "quietly",
    "roofline_chart",
    "save",
    "save_figures",
    "shown",
    "sol_chart",
    "steady_window",
    "tensor_dram_chart",
    "timeline_chart",
    "to_bytes",
    "to_html",
    "top_kernels_chart",
    "use_theme",
    "view_window",
    "whole_window",
]

if TYPE_CHECKING:
    from tracekit.viz import prep, prep_ncu
    from tracekit.viz.charts import (
        breakdown_chart,
        duration_chart,
        gpu_metrics_chart,
        iterations_chart,
        layer_growth_chart,
        layer_heatmap,
        layer_memory_chart,
        memory_chart,
        nccl_bandwidth_chart,
        timeline_chart,
        top_kernels_chart,
    )
    from tracekit.viz.charts_ncu import kernel_charts, roofline_chart, sol_chart, tensor_dram_chart
    from tracekit.viz.export import save, save_figures, to_bytes, to_html
    from tracekit.viz.notebook import enable_notebook
    from tracekit.viz.notes import Note, message_chart, missing, quietly, shown
    from tracekit.viz.theme import PAPER_THEME, SCREEN_THEME
    from tracekit.viz.theme import use as use_theme
    from tracekit.viz.window import ViewWindow, steady_window, view_window, whole_window

_LAZY: dict[str, tuple[str, str | None]] = {
    **{
        name: ("tracekit.viz.charts", name)
        for name in (
            "breakdown_chart",
            "duration_chart",
            "gpu_metrics_chart",
            "iterations_chart",
            "layer_growth_chart",
            "layer_heatmap",
            "layer_memory_chart",
            "memory_chart",
            "nccl_bandwidth_chart",
            "timeline_chart",
            "top_kernels_chart",
        )
    },  # fmt: skip
    "roofline_chart": ("tracekit.viz.charts_ncu", "roofline_chart"),
    "kernel_charts": ("tracekit.viz.charts_ncu", "kernel_charts"),
    "sol_chart": ("tracekit.viz.charts_ncu", "sol_chart"),
    "tensor_dram_chart": ("tracekit.viz.charts_ncu", "tensor_dram_chart"),
    "save": ("tracekit.viz.export", "save"),
    "save_figures": ("tracekit.viz.export", "save_figures"),
    "to_bytes": ("tracekit.viz.export", "to_bytes"),
    "to_html": ("tracekit.viz.export", "to_html"),
    "enable_notebook": ("tracekit.viz.notebook", "enable_notebook"),
    "steady_window": ("tracekit.viz.window", "steady_window"),
    "whole_window": ("tracekit.viz.window", "whole_window"),
    "view_window": ("tracekit.viz.window", "view_window"),
    "ViewWindow": ("tracekit.viz.window", "ViewWindow"),
    "message_chart": ("tracekit.viz.notes", "message_chart"),
    "missing": ("tracekit.viz.notes", "missing"),
    "shown": ("tracekit.viz.notes", "shown"),
    "quietly": ("tracekit.viz.notes", "quietly"),
    "Note": ("tracekit.viz.notes", "Note"),
    "use_theme": ("tracekit.viz.theme", "use"),
    "PAPER_THEME": ("tracekit.viz.theme", "PAPER_THEME"),
    "SCREEN_THEME": ("tracekit.viz.theme", "SCREEN_THEME"),
    "prep": ("tracekit.viz.prep", None),
    "prep_ncu": ("tracekit.viz.prep_ncu", None),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        mod = importlib.import_module(module)
        value = mod if attr is None else getattr(mod, attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tracekit.viz' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
