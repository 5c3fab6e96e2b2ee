"""What the terminal allows: the help's layout for its width, and escape sequences on stderr."""

from __future__ import annotations

import re
import shutil
import sys

__all__ = ["HELP_PANELS_MIN_COLUMNS", "echo_err", "help_markup_mode"]

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


#: An ANSI escape sequence (colour, cursor), as click matches them.
_ANSI = re.compile(r"\033\[[;?0-9]*[a-zA-Z]")


def echo_err(message: str) -> None:
    """``message`` and a newline on stderr as ``typer.echo(message, err=True)`` prints it,
    without importing typer: ANSI escape sequences dropped unless stderr is a terminal (a name
    from the command line is echoed back; its escapes reach a log file as text, not colour)."""
    stream = sys.stderr
    if not stream.isatty():
        message = _ANSI.sub("", message)
    print(message, file=stream, flush=True)
