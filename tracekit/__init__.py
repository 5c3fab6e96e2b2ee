"""tracekit: GPU profiler output (Nsight Systems, Nsight Compute) as tidy polars tables.

Entry points: :func:`open` for one file, :func:`open_many` for one file per rank.
Heavy modules (polars, altair, ncu_report) load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "CaptureError",
    "MissingDependencyError",
    "NcuReport",
    "NsysTrace",
    "TraceFormatError",
    "TracekitError",
    "UnsupportedReportError",
    "__version__",
    "diagnose",
    "diff",
    "hta",
    "open",
    "open_many",
    "structure",
]

if TYPE_CHECKING:
    from tracekit.comparison import diff
    from tracekit.diagnosis import diagnose, structure
    from tracekit.errors import (
        CaptureError,
        MissingDependencyError,
        TraceFormatError,
        TracekitError,
        UnsupportedReportError,
    )
    from tracekit.hta import hta
    from tracekit.ncu.report import NcuReport
    from tracekit.nsys.trace import NsysTrace
    from tracekit.opening import open
    from tracekit.scale.reduced import open_many

_LAZY = {
    "open": ("tracekit.opening", "open"),
    "open_many": ("tracekit.scale.reduced", "open_many"),
    "diagnose": ("tracekit.diagnosis", "diagnose"),
    "structure": ("tracekit.diagnosis", "structure"),
    "diff": ("tracekit.comparison", "diff"),
    "hta": ("tracekit.hta", "hta"),
    "NsysTrace": ("tracekit.nsys.trace", "NsysTrace"),
    "NcuReport": ("tracekit.ncu.report", "NcuReport"),
    "TracekitError": ("tracekit.errors", "TracekitError"),
    "TraceFormatError": ("tracekit.errors", "TraceFormatError"),
    "UnsupportedReportError": ("tracekit.errors", "UnsupportedReportError"),
    "MissingDependencyError": ("tracekit.errors", "MissingDependencyError"),
    "CaptureError": ("tracekit.errors", "CaptureError"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tracekit' has no attribute {name!r}")
