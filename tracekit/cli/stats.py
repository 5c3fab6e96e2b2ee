"""``tracekit stats``: nsys-stats-compatible reports without nsys."""

from __future__ import annotations

import sys
from pathlib import Path

import typer


def register(parent: typer.Typer) -> None:
    """Add the ``stats`` command to ``parent``."""
    parent.command("stats")(stats)


def stats(
    file: str = typer.Argument(..., help="Nsight Systems export (.sqlite) or report (.nsys-rep)."),
    report: str = typer.Option(
        "cuda_gpu_kern_sum",
        "--report",
        "-r",
        help="Report name(s), comma-separated (cuda_gpu_kern_sum, cuda_api_sum, nvtx_sum, cuda_gpu_trace, …).",
    ),
    fmt: str = typer.Option("table", "--format", "-f", help="csv or table."),
    output: str | None = typer.Option(
        None, "--output", "-o", help="Write each report to PREFIX_<report>.csv instead of stdout."
    ),
    convention: str = typer.Option(
        "2025", "--convention", help="Rounding of nsys 2025.x (default) or 2023.x reports."
    ),
) -> None:
    """Reproduce `nsys stats` reports: same columns, numbers, rounding and order."""
    import tracekit
    from tracekit.errors import TraceFormatError, TracekitError
    from tracekit.nsys.trace import NsysTrace
    from tracekit.stats import run_report

    if fmt not in ("csv", "table"):
        msg = f"unknown format {fmt!r}; use csv or table"
        raise TraceFormatError(msg)
    trace = tracekit.open(file)
    if not isinstance(trace, NsysTrace):
        msg = f"{file} is an Nsight Compute report; `tracekit stats` reads Nsight Systems exports"
        raise TraceFormatError(msg)
    names = [r.strip() for r in report.split(",") if r.strip()]
    skipped: list[str] = []
    for name in names:
        try:
            result = run_report(trace, name, convention=convention)
        except TracekitError as exc:
            if len(names) == 1:
                raise
            typer.echo(f"tracekit: skipping {name}: {exc}", err=True)
            skipped.append(name)
            continue
        if output:
            path = Path(f"{output}_{result.name}.csv")
            with path.open("wb") as fh:
                result.write_csv(fh)
            typer.echo(f"wrote {path}", err=True)
        elif fmt == "csv":
            sys.stdout.flush()
            result.write_csv(sys.stdout.buffer)
            sys.stdout.buffer.flush()
        else:
            _print_table(result)
    if names and len(skipped) == len(names):
        msg = f"none of the {len(names)} reports could be made from {file} (each was skipped, reasons above)"
        raise TracekitError(msg)


def _print_table(result) -> None:  # type: ignore[no-untyped-def]
    from rich.console import Console
    from rich.table import Table

    table = Table(title=result.name, show_lines=False)
    for col in result.columns:
        table.add_column(col, justify="left" if col in ("Name", "Range", "Operation", "Style", "Device") else "right",
                         overflow="fold", max_width=80 if col in ("Name", "Range") else None)
    for row in result.formatted_rows():
        table.add_row(*row)
    Console().print(table)
