"""Capture: run a program under nsys / ncu / torch.profiler, one recorded experiment folder per run.

Options live in dataclasses (:class:`NsysOptions`, :class:`NcuOptions`, :class:`TorchOptions`,
:class:`Experiment`); :func:`run`, :func:`nsys`, :func:`ncu`, :func:`torch` and :func:`sweep`
run them. Nothing heavy is imported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tracekit.capture.options import MODES, Experiment, NcuOptions, NsysOptions, TorchOptions

__all__ = [
    "MODES",
    "PRESETS",
    "ConsoleReporter",
    "Experiment",
    "ExperimentResult",
    "NcuOptions",
    "NsysOptions",
    "OutputLine",
    "TorchOptions",
    "load_config",
    "ncu",
    "nsys",
    "plan",
    "preflight_check",
    "resolve",
    "run",
    "sweep",
    "torch",
]

if TYPE_CHECKING:
    from tracekit.capture.config import PRESETS, load_config, resolve
    from tracekit.capture.experiment import ExperimentResult, ncu, nsys, run, torch
    from tracekit.capture.output import ConsoleReporter, OutputLine
    from tracekit.capture.prepare import plan, preflight_check
    from tracekit.capture.sweep import sweep

_LAZY = {
    "PRESETS": "tracekit.capture.config",
    "load_config": "tracekit.capture.config",
    "resolve": "tracekit.capture.config",
    "ExperimentResult": "tracekit.capture.experiment",
    "ncu": "tracekit.capture.experiment",
    "nsys": "tracekit.capture.experiment",
    "plan": "tracekit.capture.prepare",
    "preflight_check": "tracekit.capture.prepare",
    "run": "tracekit.capture.experiment",
    "ConsoleReporter": "tracekit.capture.output",
    "OutputLine": "tracekit.capture.output",
    "sweep": "tracekit.capture.sweep",
    "torch": "tracekit.capture.experiment",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tracekit.capture' has no attribute {name!r}")
