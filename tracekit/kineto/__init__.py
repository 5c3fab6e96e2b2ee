"""PyTorch profiler (Kineto) traces: ``*.pt.trace.json(.gz)`` converted once into an nsys-shaped
Parquet folder (:mod:`tracekit.kineto.convert`) and opened as :class:`KinetoTrace`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["KinetoTrace", "converted_folder", "is_kineto"]

if TYPE_CHECKING:
    from tracekit.kineto.convert import converted_folder
    from tracekit.kineto.sniff import is_kineto
    from tracekit.kineto.trace import KinetoTrace

_LAZY = {
    "KinetoTrace": "tracekit.kineto.trace",
    "converted_folder": "tracekit.kineto.convert",
    "is_kineto": "tracekit.kineto.sniff",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tracekit.kineto' has no attribute {name!r}")
