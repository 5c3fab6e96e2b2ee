"""``tracekit report``: write one self-contained, offline HTML report of a trace."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def report(
    traces: Annotated[
        list[Path],
        typer.Argument(
            help="Nsight Systems export (.sqlite, .nsys-rep, or an nsys parquetdir/arrowdir folder), or an Nsight Compute report alone; "
                 "several exports, or a folder of them, = one per rank (sections per rank)."
        ),
    ],
    ncu: Annotated[
        Path | None, typer.Option("--ncu", help="Nsight Compute report (.ncu-rep) to add.")
    ] = None,
    output: Annotated[Path, typer.Option("-o", "--output", help="HTML file to write.")] = Path(
        "report.html"
    ),
    title: Annotated[str | None, typer.Option("--title", help="Title of the page.")] = None,
    max_marks: Annotated[
        int, typer.Option("--max-marks", min=1, help="Most timeline marks before binning.")
    ] = 2000,
) -> None:
    """Write an HTML report (overview, top kernels, NVTX, timeline, communication, GPU metrics, memory, memory per layer).

    Memory per layer: for NVTX ranges named layer.N, backward or optimizer, the device memory each adds (entry, exit, peak, net growth; tracekit.analysis.memory.layer_memory). The memory sections need a capture with --cuda-memory-usage=true.

    The file embeds its JavaScript and data: it opens offline in any browser.
    """
    import time

    from tracekit.cli.inputs import is_many, open_traces
    from tracekit.report import write_report

    started = time.perf_counter()
    if is_many(traces):  # one report per rank: opened here as a set (read where the HTML is built)
        trace: object = open_traces(traces, command="tracekit report")
        title = title or f"{len(trace.reports)} ranks: {Path(str(traces[0])).name}"  # type: ignore[attr-defined]
    else:
        trace = traces[0]
    path = write_report(trace, output, ncu_path=ncu, title=title, max_marks=max_marks)
    size = path.stat().st_size / 1e6
    typer.echo(f"wrote {path} ({size:.1f} MB) in {time.perf_counter() - started:.1f} s")


def register(parent: typer.Typer) -> None:
    """Add the ``report`` command to ``parent``."""
    parent.command("report")(report)
