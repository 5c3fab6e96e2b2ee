"""Memory handed back between the steps of a long command on a big export.

polars allocates with jemalloc, which keeps freed pages for reuse for about 10 s. A command
that works through an 11 GB export in steps (``diff``: one run, then the other; ``report``:
section by section) then holds each step's freed working memory on top of the next step's:
on two 30 M-kernel runs ``tracekit diff`` peaked at 4.14 GB. With ``dirty_decay_ms:0`` the
pages go back as they are freed, for some system time (page faults when they are touched
again: +0.7 s on a 3 s command over a 1 M-kernel export, so small exports keep the default).

:func:`tune_allocator` sets ``_RJEM_MALLOC_CONF`` (jemalloc's variable in polars' build) for
such commands on an input of at least :data:`BIG_INPUT_BYTES`, before polars is imported; a
value the user set is left alone.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping, Sequence
from pathlib import Path

__all__ = ["BIG_INPUT_BYTES", "DECAY_NOW", "STEPPED_COMMANDS", "tune_allocator"]

#: Inputs from this size on (bytes; a folder: its files) count as big.
BIG_INPUT_BYTES = 1 << 30
#: jemalloc options: freed pages go back to the system at once.
DECAY_NOW = "dirty_decay_ms:0,muzzy_decay_ms:0"
#: Commands that work through a whole export in steps.
STEPPED_COMMANDS = frozenset({"diff", "report", "summary", "diagnose", "export"})
_VARIABLE = "_RJEM_MALLOC_CONF"


def _size(path: Path) -> int:
    """Bytes of a file, or of the files directly in a folder (an nsys parquetdir/arrowdir, a
    folder of per-rank exports); 0 when neither."""
    try:
        if path.is_file():
            return path.stat().st_size
        if path.is_dir():
            return sum(e.stat().st_size for e in os.scandir(path) if e.is_file())
    except OSError:
        return 0
    return 0


def tune_allocator(argv: Sequence[str], env: MutableMapping[str, str] | None = None,
                   *, min_bytes: int = BIG_INPUT_BYTES) -> str | None:
    """Set :data:`DECAY_NOW` in ``env`` (default ``os.environ``) when ``argv`` (the command
    line without the program) runs a :data:`STEPPED_COMMANDS` command on an input of at least
    ``min_bytes``, and ``env`` has no jemalloc setting yet; return the value set, else None.
    Must run before polars is imported (jemalloc reads it once)."""
    env = os.environ if env is None else env
    if _VARIABLE in env or not argv or argv[0] not in STEPPED_COMMANDS:
        return None
    total = 0
    for arg in argv[1:]:
        if arg.startswith("-"):
            continue
        total += _size(Path(arg))
        if total >= min_bytes:
            env[_VARIABLE] = DECAY_NOW
            return DECAY_NOW
    return None
