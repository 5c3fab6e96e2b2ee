"""Notebook apps (ipywidgets): capture, explore a trace, drill into a kernel, compare two traces.

Imported lazily; needs the ``notebook`` extra. Each app is an ``ipywidgets.VBox`` whose state
is in traits, so it can be driven and tested from Python.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["CaptureForm", "Compare", "KernelDrilldown", "TraceExplorer", "TracePicker"]

if TYPE_CHECKING:
    from tracekit.widgets.capture_form import CaptureForm
    from tracekit.widgets.compare import Compare
    from tracekit.widgets.drilldown import KernelDrilldown
    from tracekit.widgets.explorer import TraceExplorer
    from tracekit.widgets.picker import TracePicker

_LAZY = {
    "CaptureForm": "tracekit.widgets.capture_form",
    "Compare": "tracekit.widgets.compare",
    "KernelDrilldown": "tracekit.widgets.drilldown",
    "TraceExplorer": "tracekit.widgets.explorer",
    "TracePicker": "tracekit.widgets.picker",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tracekit.widgets' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
