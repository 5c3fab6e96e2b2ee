"""What the terminal allows: the help's layout for its width."""

from __future__ import annotations

import shutil
import sys

__all__ = ["HELP_PANELS_MIN_COLUMNS", "help_markup_mode"]

#: Below this width (and in a pipe) the help is click's plain layout: typer's panels cut
#: option names (``--gpu-metrics-devi…``) and words in the help (``(model.layers.3.self_at…``)
#: to fit, while the plain layout wraps them.
HELP_PANELS_MIN_COLUMNS = 100


def help_markup_mode() -> str | None:
    """``"rich"`` (typer's panels) on a terminal at least :data:`HELP_PANELS_MIN_COLUMNS`
    wide, else ``None`` (click's plain help, which never cuts a name)."""
    if not sys.stdout.isatty():
        return None
    return "rich" if shutil.get_terminal_size().columns >= HELP_PANELS_MIN_COLUMNS else None
