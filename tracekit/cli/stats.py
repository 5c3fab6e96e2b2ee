"""``tracekit stats``: nsys-stats-compatible reports without nsys."""

from __future__ import annotations

import typer

from tracekit.cli.stats_run import TABLE_ROWS, run_stats


def register(parent: typer.Typer) -> None:
    """Add the ``stats`` command to ``parent``."""
    parent.command("stats")(stats)


def stats(
    file: str = typer.Argument(..., help="Nsight Systems export (.sqlite, or an nsys parquetdir/arrowdir folder) or report (.nsys-rep)."),
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
    rows: int = typer.Option(
        TABLE_ROWS, "--rows", help="Rows of each report shown as a table (0: all); csv and -o always write all."
    ),
) -> None:
    """Reproduce `nsys stats` reports: same columns, numbers, rounding and order."""
    run_stats(file, report, fmt, output, convention, rows)
