"""Where tracekit keeps files it can rebuild: exports of reports, column caches, widget assets."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$TRACEKIT_CACHE``, else ``$XDG_CACHE_HOME/tracekit``, else ``~/.cache/tracekit``."""
    if os.environ.get("TRACEKIT_CACHE"):
        return Path(os.environ["TRACEKIT_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tracekit"
