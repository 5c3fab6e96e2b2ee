"""``tracekit report``: placeholder module; filled in by its issue."""

from __future__ import annotations

import typer

app = typer.Typer(help="report", no_args_is_help=True)


def register(parent: typer.Typer) -> None:
    """Add this module's commands to ``parent``."""
