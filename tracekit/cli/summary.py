"""``tracekit summary``: what is in a trace, at a glance."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer

from tracekit.cli.inputs import ENGINE_HELP, SCHEDULER_HELP, SIDE_BY_SIDE_HELP, WORKERS_HELP


def register(parent: typer.Typer) -> None:
    """Add the ``summary`` command to ``parent``."""
    parent.command("summary")(summary)


def summary(
    files: list[str] = typer.Argument(  # noqa: B008
        ..., help="Nsight Systems export (.sqlite, an nsys parquetdir/arrowdir folder) or report (.nsys-rep); several, "
                  "or a folder of them, = one per rank (per-rank and cross-rank tables)."),
    top: int = typer.Option(10, "--top", "-n", min=0, help="Rows in the top-kernel and NVTX tables."),
    findings: int = typer.Option(3, "--findings", help="Top findings of `tracekit diagnose` shown at the end (0: none)."),
    model: str | None = typer.Option(None, "--model", help="Transformer description (YAML or HF config.json): MFU/MBU per generation phase."),
    batch: int | None = typer.Option(None, "--batch", help="With --model: sequences per step."),
    prompt_len: int | None = typer.Option(None, "--prompt-len", help="With --model: prompt tokens per sequence."),
    tokens_per_step: int | None = typer.Option(None, "--tokens-per-step", min=1,
                                               help="Training: tokens per step on all GPUs together: tokens per second, and "
                                                    "with --model (or --params) the training MFU (6 × parameters × tokens)."),
    params: float | None = typer.Option(None, "--params", min=1, help="Training: the model's parameters (instead of --model's count)."),
    nvtx_each: bool = typer.Option(False, "--nvtx-each", help="List numbered NVTX ranges one by one (default: step.0 … step.7 → step.*)."),
    engine: str = typer.Option("local", "--engine", help=ENGINE_HELP),
    scheduler: str | None = typer.Option(None, "--scheduler", help=SCHEDULER_HELP),
    workers: int | None = typer.Option(None, "--workers", min=1, help=WORKERS_HELP),
    side_by_side: bool = typer.Option(False, "--side-by-side", help=SIDE_BY_SIDE_HELP),
) -> None:
    """Capture info, GPUs, time window, top kernels, CUDA graphs, memcpy totals, top NVTX
    ranges, generation phases (time to first token, time per output token) and top findings."""
    from tracekit.cli.diagnose import model_with
    from tracekit.cli.inputs import open_traces
    from tracekit.nsys.trace import NsysTrace

    if side_by_side:
        from tracekit.cli.side_by_side import side_by_side_summary

        side_by_side_summary(files, build_summary=build_summary, top=top, findings=findings)
        return

    trace = open_traces(files, engine=engine, scheduler=scheduler, workers=workers, command="tracekit summary")
    file = files[0] if len(files) == 1 else f"{len(files)} files"
    desc = model_with(model, batch, prompt_len)
    diagnosis = None
    if findings > 0 or desc is not None or tokens_per_step is not None:
        from tracekit.diagnosis import diagnose

        def diagnosis() -> Any:
            return diagnose(trace, model=desc if not tokens_per_step else None)

    s, d = build_summary(trace, top=top, nvtx_each=nvtx_each, label=file, diagnosis=diagnosis,
                         tokens_per_step=tokens_per_step, params=params, model=desc)
    _render(s)
    if d is not None and findings > 0:
        from tracekit.cli.diagnose import render

        many = not isinstance(trace, NsysTrace)  # several ranks
        render(d, findings, title=f"top findings{' across ranks' if many else ''} (tracekit diagnose {file})")


def build_summary(trace: Any, *, top: int = 10, nvtx_each: bool = False, label: str = "",
                  diagnosis: Callable[[], Any] | None = None, structure: Callable[[], Any] | None = None,
                  tokens_per_step: int | None = None, params: float | None = None, model: Any = None) -> tuple[Any, Any]:
    """What ``tracekit summary`` shows of ``trace``, before it is printed: the
    :class:`~tracekit.nsys.summary.TraceSummary` (of one export: :func:`~tracekit.nsys.summary.
    trace_summary` with its CUDA graphs and GPU metrics; of ranks: :func:`set_summary`,
    ``label`` naming them) with the generation phases and the training step of the diagnosis
    that ``diagnosis()`` gives (none without it), and the run's structure (the diagnosis',
    else ``structure()``'s, else :func:`tracekit.diagnosis.structure`'s); and that diagnosis.
    Shared by the CLI and the MCP server's ``summary`` tool."""
    from tracekit.nsys.summary import trace_summary
    from tracekit.nsys.trace import NsysTrace

    if not isinstance(trace, NsysTrace):  # several ranks
        s = set_summary(trace, top=top, label=label)
    else:
        s = trace_summary(trace, top=top, nvtx_each=nvtx_each)
        _add_graphs(s, trace)
        _add_metrics(s, trace)
        _add_operators(s, trace, top)
    d = diagnosis() if diagnosis is not None else None
    if d is not None:
        _add_phases(s, d)  # a set's diagnosis has no phases
        _add_training(s, d, trace, tokens_per_step=tokens_per_step, params=params, model=model)
    if not hasattr(trace, "kernels_across_ranks"):
        if d is not None and d.structure is not None:
            st = d.structure
        elif structure is not None:
            st = structure()
        else:
            from tracekit.diagnosis import structure as structure_of

            st = structure_of(trace)
        _add_structure(s, st)
    return s, d


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


def _add_metrics(s, trace) -> None:  # type: ignore[no-untyped-def]
    """The "GPU metrics" table when the trace sampled them: per GPU the means of SM active,
    Tensor active and DRAM bandwidth (percent) over the sampled span, how long some SM was
    active, and how much of that no traced operation explains
    (:func:`tracekit.analysis.metrics.metric_activity`); a capture without kernels shows the
    GPU's work here only."""
    import polars as pl

    from tracekit.analysis.metrics import metric_activity
    from tracekit.diagnosis.context import activity_ops, activity_samples

    samples = activity_samples(trace)
    if samples.height == 0:
        return
    ops = activity_ops(trace)  # only what metric_activity reads of the traced work
    act = metric_activity(samples, ops)
    if act.height == 0:
        return
    pct = {c: label for c, label in (("sms_active_mean", "sm%"), ("tensor_active_mean", "tensor%"),
                                     ("dram_read_bandwidth_mean", "dram_rd%"), ("dram_write_bandwidth_mean", "dram_wr%"))
           if c in act.columns}
    s.tables["GPU metrics: means over the sampled span (%), time with SMs active"] = act.select(
        pl.col("device_id").alias("GPU"), (pl.col("span_ns") / 1e9).alias("span_s"), *[pl.col(c).alias(n) for c, n in pct.items()],
        (pl.col("active_ns") / 1e9).alias("active_s"), (pl.col("untraced_active_ns") / 1e9).alias("untraced_s"))


def _add_structure(s, st) -> None:  # type: ignore[no-untyped-def]
    """The run's structure first (kind, steady iterations, warm-up, start-up: one line, and
    why), its segments per GPU or process, and the requests of a generation or server."""
    import polars as pl

    items = list(s.info.items())
    s.info = dict([("run", st.headline()), *([("why", "; ".join(st.evidence))] if st.evidence else []),
                   ("iterations from", st.reason), *items])
    seg = st.segments
    if seg.height:
        keys = [c for c in ("rank", "pid", "device_id") if c in seg.columns]
        t0 = st.trace_start_ns
        s.tables = {"run structure": seg.select(
            *keys, "segment", ((pl.col("start_ns") - t0) / 1e9).alias("from_s"), (pl.col("duration_ns") / 1e6).alias("ms"),
            "iterations"), **s.tables}
    req = st.requests
    if req.height:
        t0 = st.trace_start_ns
        set_apart = pl.when(pl.col("warmup")).then(pl.lit("warm-up")).when(pl.col("cold").fill_null(False)).then(pl.lit("cold")) \
            .otherwise(pl.lit("")) if "cold" in req.columns else pl.when(pl.col("warmup")).then(pl.lit("warm-up")).otherwise(pl.lit(""))
        extra = [c for c in ("name", "new_tokens", "prompt_rows", "draft_forwards") if c in req.columns and req[c].null_count() < req.height]
        s.tables["requests"] = req.select(
            "request", set_apart.alias("set_apart"), *extra, ((pl.col("start_ns") - t0) / 1e9).alias("from_s"), "decode_steps",
            (pl.col("ttft_ns") / 1e6).alias("ttft_ms"), (pl.col("tpot_median_ns") / 1e6).alias("tpot_median_ms"))


def _add_training(s, d, trace, *, tokens_per_step, params, model) -> None:  # type: ignore[no-untyped-def]
    """The "training step" table (forward, backward, optimizer: median time per step, compute,
    communication and how much of it is exposed) and, with ``--tokens-per-step``, the
    throughput and training MFU (:func:`tracekit.analysis.run.training.training_throughput`)."""
    import polars as pl

    from tracekit.diagnosis.result import fmt_ns

    t = d.training
    if t.height == 0:
        if tokens_per_step:
            s.notes.append("--tokens-per-step: the run is not training (no backward kernels in its steady steps)")
        return
    ms = lambda c: (pl.col(c) / 1e6).alias(c.replace("_ns", "_ms"))  # noqa: E731
    micro = t["micro_batches"].drop_nulls() if "micro_batches" in t.columns else pl.Series([])
    title = "training step (median per step and GPU" + (f", {float(micro[0]):.0f} micro-batches" if micro.len() and micro[0] > 1 else "")
    title += "; read by launching thread" if "by" in t.columns and t["by"][0] == "thread" else "; read by kernel names"
    title += "; forward recomputed in the backward)" if "recompute" in t.columns and t["recompute"][0] else ")"
    s.tables[title] = t.select(
        "phase", ms("time_ns"), (pl.col("share") * 100).alias("step_pct"), ms("compute_ns"), ms("kernel_ns"), ms("communication_ns"),
        ms("exposed_comm_ns"), ms("idle_ns"))
    p = d.periodic
    if p.height:
        s.tables["set apart from the steps (periodic work)"] = p.select(
            "what", "count", ms("median_ns"), ms("max_ns"), ms("total_ns"), ms("kernel_ns"))
    if not tokens_per_step or d.structure is None or not d.structure.step_ns:
        return
    from tracekit.analysis.run.training import training_throughput

    n_params, peak, dtype = params, None, "bf16"
    if model is not None:
        from tracekit.model import load_model
        from tracekit.model.costs import model_summary

        cfg = load_model(model)
        dtype = cfg.dtype
        n_params = n_params or model_summary(cfg)["params"]
    if n_params:
        from tracekit.model.costs import peaks
        from tracekit.model.gpu import gpu_of

        peak = peaks(gpu_of(trace, None), dtype)[0]
    tp = training_throughput(d.structure.step_ns, tokens_per_step, params=n_params, gpus=d.structure.ranks, peak_flops=peak)
    line = f"{tp['tokens_per_s']:,.0f} tokens/s ({tokens_per_step:,} tokens per step of {fmt_ns(tp['step_ns'])})"
    if tp["mfu"] is not None:
        line += (f"; MFU {tp['mfu']:.1%} (6 × {n_params / 1e6:,.1f} M parameters × tokens = {tp['model_flops_per_step'] / 1e12:,.2f} "
                 f"TFLOP per step on {d.structure.ranks} GPU(s), {dtype} peak {peak / 1e12:,.0f} TFLOP/s each)")
    elif n_params:
        line += "; MFU: the GPU's peak is unknown"
    s.info["training throughput"] = line


def _add_operators(s, trace, top: int) -> None:  # type: ignore[no-untyped-def]
    """A torch.profiler trace's top operators by GPU time, per name and shapes, with their
    achieved rate and roofline verdict (:func:`tracekit.analysis.op_costs.op_cost_summary`)."""
    import polars as pl

    if "operators" not in dir(type(trace)):
        return
    from tracekit.analysis.op_costs import op_cost_summary

    ops = trace.operators
    if ops.height == 0:
        s.notes.append("operators: no CPU operator launched a kernel the trace links to it (record the CPU activity too)")
        return
    t = op_cost_summary(ops).head(top)
    s.tables["operators (GPU time by op and input shapes)"] = t.select(
        pl.col("name").alias("op"), pl.col("input_dims").str.slice(0, 40).alias("shapes"), "calls", (pl.col("gpu_ns") / 1e6).alias("gpu_ms"),
        (pl.col("share") * 100).alias("gpu_pct"), "tflops", "tbps", "bound", (pl.col("pct_of_peak") * 100).alias("pct_of_peak"))


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
    import polars as pl

    from tracekit.cli.tables import print_table

    for title, frame in s.tables.items():
        rows = [["" if v is None else (f"{v:,.3f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v)) for v in row]
                for row in frame.iter_rows()]
        print_table(console, frame.columns, rows, text_columns={c for c in frame.columns if frame.schema[c] == pl.Utf8}, title=title)
    for note in s.notes:
        console.print(f"[yellow]note:[/yellow] {note}")


def set_summary(ts, *, top: int = 10, label: str = ""):  # type: ignore[no-untyped-def]
    """What ``tracekit summary`` shows of a multi-rank job (a ``TraceSet``, or a ``ReducedSet``
    reduced on Dask): the reports and ranks, one row per rank
    (:func:`tracekit.analysis.ranks.rank_summary`: GPUs, kernels, GPU time, busy share,
    communication and its exposed part, steps) and the kernels across ranks
    (:func:`~tracekit.analysis.ranks.kernels_across_ranks`: the spread of each kernel's time
    over the ranks)."""
    import statistics
    from pathlib import Path

    import polars as pl

    from tracekit.analysis.ranks import kernels_across_ranks, rank_summary
    from tracekit.runs import require_one_run

    require_one_run(ts, "the summary of ranks")
    from tracekit.nsys.summary import TraceSummary

    names = ("kernel_summary", "busy", "overlap", "iterations")
    if hasattr(ts, "kernels_across_ranks"):  # reduced on Dask: the tables are the reductions
        tables = {n: ts.table(n) for n in names}
    else:
        from tracekit.scale.reduce import reductions_of

        tables = reductions_of(ts, names)
    reports = ts.reports
    s = TraceSummary(path=Path(label or "ranks"))
    shown = ", ".join(Path(p).name for p in reports["path"].head(4).to_list())
    s.info["reports"] = f"{reports.height} ({shown}{' …' if reports.height > 4 else ''})"
    ranks = ts.ranks["rank"].drop_nulls() if "rank" in ts.ranks.columns else pl.Series([], dtype=pl.Int64)
    s.info["ranks"] = f"{ranks.n_unique()} ({ranks.min()!s}–{ranks.max()!s})" if ranks.len() else "none found"
    versions = sorted({str(v) for v in reports["nsys_version"].to_list() if v})
    s.info["nsys version"] = ", ".join(versions) or "?"
    if len(ts.failures):
        s.notes.extend(f"left out: {f}" for f in ts.failures)
    per = rank_summary(tables["kernel_summary"], tables["busy"], tables.get("overlap"), tables.get("iterations"))
    gpu_ms = float(per["gpu_time_ns"].fill_null(0).sum()) / 1e6
    s.info["kernels"] = f"{int(per['kernels'].fill_null(0).sum()):,} launches, {gpu_ms:,.3f} ms GPU time"
    steps = [float(v) for v in per["median_step_ns"].drop_nulls().to_list()]
    if len(steps) > 1:
        slowest = per.sort("median_step_ns", descending=True, nulls_last=True)["rank"][0]
        lo, hi = min(steps), max(steps)
        s.info["step time over ranks"] = (f"median {statistics.median(steps) / 1e6:,.3f} ms, slowest rank {slowest} at "
                                          f"{hi / 1e6:,.3f} ms ({(hi - lo) / hi:.1%} spread)")
    s.tables["per rank"] = per.select(
        "rank", pl.col("devices").alias("GPUs"), "kernels", (pl.col("gpu_time_ns") / 1e6).alias("gpu_ms"),
        (pl.col("busy_share") * 100).alias("busy_%"), (pl.col("communication_ns") / 1e6).alias("comm_ms"),
        (pl.col("exposed_comm_ns") / 1e6).alias("exposed_comm_ms"), "steps", (pl.col("median_step_ns") / 1e6).alias("step_ms"),
        "top_kernel", (pl.col("top_kernel_share") * 100).alias("top_%"))
    s.tables["kernels across ranks"] = kernels_across_ranks(tables["kernel_summary"]).head(top).select(
        pl.col("short_name").alias("kernel"), "ranks", "kernels", (pl.col("total_ns") / 1e6).alias("total_ms"),
        (pl.col("min_rank_ns") / 1e6).alias("min_rank_ms"), (pl.col("max_rank_ns") / 1e6).alias("max_rank_ms"))
    return s
