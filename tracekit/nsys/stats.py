"""Moved: the nsys-compatible reports are :mod:`tracekit.stats` (a report layer, above the
analyses it uses). ``tracekit.nsys.stats.run_report`` and the other top-level names still
resolve here, by name, for code written against the old path."""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    return getattr(importlib.import_module("tracekit.stats"), name)
