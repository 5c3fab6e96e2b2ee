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
    model: str | None = typer.Option(None, "--model", help="Transformer description (YAML or HF config.json): MFU/MBU per generation phase."),
    batch: int | None = typer.Option(None, "--batch", help="With --model: sequences per step."),
    prompt_len: int | None = typer.Option(None, "--prompt-len", help="With --model: prompt tokens per sequence."),
    nvtx_each: bool = typer.Option(False, "--nvtx-each", help="List numbered NVTX ranges one by one (default: step.0 … step.7 → step.*)."),
) -> None:
    """Capture info, GPUs, time window, top kernels, CUDA graphs, memcpy totals, top NVTX
    ranges, generation phases (time to first token, time per output token) and top findings."""
    import tracekit
    from tracekit.cli.diagnose import model_with
    from tracekit.errors import TraceFormatError
    from tracekit.nsys.summary import trace_summary
    from tracekit.nsys.trace import NsysTrace

    trace = tracekit.open(file)
    if not isinstance(trace, NsysTrace):
        msg = f"{file} is an Nsight Compute report; `tracekit summary` reads Nsight Systems exports"
        raise TraceFormatError(msg)
    desc = model_with(model, batch, prompt_len)
    s = trace_summary(trace, top=top, nvtx_each=nvtx_each)
    _add_graphs(s, trace)
    d = None
    if findings > 0 or desc is not None:
        from tracekit.diagnosis import diagnose

        d = diagnose(trace, model=desc)
        _add_phases(s, d)
    _render(s)
    if d is not None and findings > 0:
        from tracekit.cli.diagnose import render

        render(d, findings, title=f"top findings (tracekit diagnose {file})")


def _add_graphs(s, trace) -> None:  # type: ignore[no-untyped-def]
    """The "CUDA graphs" line and table (:func:`tracekit.analysis.graphs.graph_summary`) when
    the trace launched graphs; nothing otherwise (nothing read beyond the graph rows and, for a
    per-node capture, the graph nodes' columns)."""
    import polars as pl

    from tracekit.analysis.graphs import graph_summary
    from tracekit.diagnosis.result import fmt_ns

    db = trace.db
    if not (db.has_table("CUPTI_ACTIVITY_KIND_GRAPH_TRACE") or db.has_table("CUDA_GRAPH_NODE_EVENTS") or db.has_table("CUDA_GRAPH_EVENTS")):
        return
    launches = trace.graphs
    if launches.height == 0:
        return
    mode = launches["mode"][0]
    kernel_ns = int(trace.table("kernels", ["duration_ns"])["duration_ns"].sum() or 0)
    graph_ns = int(launches["gpu_time_ns"].sum() or 0)
    if mode == "graph":
        total = kernel_ns + graph_ns
        how = "traced whole (--cuda-graph-trace=graph): their kernels are not in the kernel table"
    else:
        total = kernel_ns
        how = "traced per node (--cuda-graph-trace=node): their kernels are in the kernel table"
    share = f" ({graph_ns / total:.0%} of GPU time)" if total else ""
    n_graphs = launches.select(pl.struct("pid", "graph_exec_id").n_unique()).item()
    s.info["CUDA graphs"] = f"{launches.height:,} launches of {n_graphs} graph(s), {fmt_ns(graph_ns)} GPU time{share}, {how}"
    if mode == "graph":
        s.info["GPU time"] = f"{fmt_ns(total)} (kernels {fmt_ns(kernel_ns)} + graph replays {fmt_ns(graph_ns)})"
    g = graph_summary(launches, total_gpu_ns=total or None)
    table = g.select(
        "pid", pl.col("graph_exec_id").alias("graph"), pl.col("devices").alias("GPUs"), "launches",
        (pl.col("gpu_time_ns") / 1e6).alias("gpu_ms"), (pl.col("share") * 100).alias("gpu_%"),
        (pl.col("replay_median_ns") / 1e3).alias("replay_us"), (pl.col("replay_p90_ns") / 1e3).alias("p90_us"),
        pl.col("kernels_per_replay").alias("kernels"), (pl.col("launch_api_median_ns") / 1e3).alias("launch_us"),
        pl.col("first_nvtx_path").alias("nvtx"),
    )
    # right after the kernels: the rest of the GPU's work
    items = list(s.tables.items())
    at = next((i + 1 for i, (k, _) in enumerate(items) if k == "top kernels"), len(items))
    s.tables = dict([*items[:at], ("CUDA graphs", table), *items[at:]])


def _add_phases(s, d) -> None:  # type: ignore[no-untyped-def]
    """The "generation phases" table from the diagnosis (time to first token, time per output
    token, busy share; MFU/MBU with a model)."""
    import polars as pl

    p = d.phases
    if p.height == 0:
        return
    cols = [pl.col("phase"), pl.col("steps"), (pl.col("ttft_ns") / 1e6).alias("ttft_ms"),
            (pl.col("tpot_median_ns") / 1e6).alias("tpot_median_ms"), (pl.col("tpot_p90_ns") / 1e6).alias("tpot_p90_ms"),
            (pl.col("busy_share") * 100).alias("gpu_busy_pct")]
    if "mfu" in p.columns:
        cols += [(pl.col("mfu") * 100).alias("mfu_pct"), (pl.col("mbu") * 100).alias("mbu_pct")]
    s.tables["generation phases"] = p.select(cols)


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
