"""``tracekit summary``: what is in a trace, at a glance."""

from __future__ import annotations

import typer


def register(parent: typer.Typer) -> None:
    """Add the ``summary`` command to ``parent``."""
    parent.command("summary")(summary)


def summary(
    file: str = typer.Argument(..., help="Nsight Systems export (.sqlite, or an nsys parquetdir/arrowdir folder) or report (.nsys-rep)."),
    top: int = typer.Option(10, "--top", "-n", min=0, help="Rows in the top-kernel and NVTX tables."),
    findings: int = typer.Option(3, "--findings", help="Top findings of `tracekit diagnose` shown at the end (0: none)."),
) -> None:
    """Capture info, GPUs, time window, top kernels, memcpy totals and top NVTX ranges."""
    import tracekit
    from tracekit.errors import TraceFormatError
    from tracekit.nsys.summary import trace_summary
    from tracekit.nsys.trace import NsysTrace

    trace = tracekit.open(file)
    if not isinstance(trace, NsysTrace):
        msg = f"{file} is an Nsight Compute report; `tracekit summary` reads Nsight Systems exports"
        raise TraceFormatError(msg)
    _render(trace_summary(trace, top=top))
    if findings > 0:
        from tracekit.cli.diagnose import render
        from tracekit.diagnosis import diagnose

        d = diagnose(trace)
        render(d, findings, title=f"top findings (tracekit diagnose {file})")


def _render(s) -> None:  # type: ignore[no-untyped-def]
    from rich.console import Console
    from rich.table import Table

    console = Console()
    info = Table(title=f"tracekit summary: {s.path.name}", show_header=False)
    info.add_column("field", style="bold")
    info.add_column("value", overflow="fold")
    for key, value in s.info.items():
        info.add_row(key, value)
    console.print(info)
    for title, frame in s.tables.items():
        table = Table(title=title)
        for col in frame.columns:
            table.add_column(col, justify="left" if frame.schema[col].is_(__import__("polars").Utf8) else "right",
                             overflow="fold", max_width=70)
        for row in frame.iter_rows():
            table.add_row(*("" if v is None else (f"{v:,.3f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v)) for v in row))
        console.print(table)
    for note in s.notes:
        console.print(f"[yellow]note:[/yellow] {note}")
