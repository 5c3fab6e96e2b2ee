"""Thresholds a user can move with an environment variable (``TRACEKIT_…``)."""

from __future__ import annotations

import os

from tracekit.errors import TracekitError

__all__ = ["count_from_env"]


def count_from_env(name: str, default: int) -> int:
    """The whole number ≥ 0 in environment variable ``name``, or ``default`` when it is unset
    or empty; anything else is one :class:`~tracekit.errors.TracekitError` line naming the
    variable (as ``TRACEKIT_COLUMN_CACHE_MAX_GB`` does)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit():
        msg = f"{name}={raw!r} is not a count: give a whole number of 0 or more (e.g. {default}), or unset it for the default"
        raise TracekitError(msg)
    return int(raw)
