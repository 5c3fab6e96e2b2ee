"""``tracekit model``: FLOPs, bytes and the roofline minimum of a transformer step; with a trace,
how far its layers are from it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    import polars as pl


def register(parent: typer.Typer) -> None:
    """Add the ``model`` command to ``parent``."""
    parent.command("model")(model)


def model(
    config: str = typer.Argument(..., help="Model description: YAML (docs/model.md) or a Hugging Face config.json."),
    gpu: str | None = typer.Option(None, "--gpu", help="GPU name for the peaks, e.g. 'NVIDIA H100 80GB HBM3' (default: the trace's)."),
    phase: str | None = typer.Option(None, "--phase", help="prefill or decode (overrides the config)."),
    batch: int | None = typer.Option(None, "--batch", help="Sequences per step (overrides the config)."),
    prompt_len: int | None = typer.Option(None, "--prompt-len", help="Prompt tokens per sequence of a prefill step (overrides the config)."),
    context_len: int | None = typer.Option(None, "--context-len", help="Tokens a decode step attends to (overrides the config)."),
    trace: str | None = typer.Option(None, "--trace", help="A trace compared with the model: its NVTX layer ranges per forward, "
                                     "and its generation phases (time to first token and per output token against the model)."),
    fmt: str = typer.Option("table", "--format", "-f", help="table or json."),
) -> None:
    """Per layer and block: parameters, FLOPs, bytes, intensity, minimum time and bound."""
    import json
    from typing import Any

    import polars as pl

    import tracekit
    from tracekit.errors import TracekitError
    from tracekit.model import compare, load_model, model_costs, model_summary

    if fmt not in ("table", "json"):
        raise TracekitError(f"--format {fmt!r}: choose table or json")
    overrides = {k: v for k, v in (("phase", phase), ("batch", batch), ("prompt_len", prompt_len), ("context_len", context_len))
                 if v is not None}
    cfg = load_model(config, **overrides)
    opened: Any = tracekit.open(trace) if trace else None
    if opened is not None and not hasattr(opened, "nvtx"):
        raise TracekitError(f"--trace {trace}: give an Nsight Systems export (an Nsight Compute report has no layer ranges)")
    from tracekit.model.gpu import gpu_of

    gpu_arg = gpu_of(opened, gpu) if (gpu is None and opened is not None) else gpu
    costs = model_costs(cfg, gpu=gpu_arg)
    summary = model_summary(cfg, gpu=gpu_arg)
    cmp = compare(opened, cfg, gpu=gpu_arg) if opened is not None else None
    phases = _phases(opened, cfg, gpu_arg) if opened is not None else None
    if fmt == "json":
        print(json.dumps({"config": cfg.as_dict(), "summary": summary, "blocks": costs.to_dicts(),
                          "compare": cmp.to_dicts() if cmp is not None else None,
                          "phases": phases.to_dicts() if phases is not None else None}, indent=2, default=str))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    info = Table(title=f"{cfg.name}: {cfg.phase}, batch {cfg.batch}, tp {cfg.tp}, pp {cfg.pp}", show_header=False)
    for k, v in summary.items():
        info.add_row(k, f"{v:,.4g}" if isinstance(v, float) else str(v))
    console.print(info)
    per_block = costs.group_by("block", maintain_order=True).agg(
        pl.col("params").sum(), pl.col("flops").sum(), pl.col("bytes").sum(), pl.col("min_time_ns").sum(), pl.col("bound").first()
    )
    t = Table(title="per block, summed over the stage's layers")
    for c in per_block.columns:
        t.add_column(c, justify="left" if c in ("block", "bound") else "right")
    for r in per_block.iter_rows():
        t.add_row(*[f"{v:,.4g}" if isinstance(v, float) else str(v) for v in r])
    console.print(t)
    if phases is not None:
        _print_phases(console, phases)
    if cmp is not None:
        if cmp.height == 0:
            console.print("the trace has no NVTX layer ranges (layer.N, model.layers.N …; capture with --annotate-torch): "
                          "no per-layer comparison")
            return
        med = cmp.group_by("layer").agg(pl.col("measured_ns").median(), pl.col("predicted_min_ns").first(),
                                        pl.col("efficiency").median(), pl.col("mfu").median(), pl.col("mbu").median()).sort("layer", nulls_last=True)
        n_steps = cmp["step"].n_unique()
        names = sorted({p for p in cmp["phase"].to_list() if p is not None})
        kind = f"{'/'.join(names)} forwards" if names else "steady steps"
        t2 = Table(title=f"measured vs predicted (median over {n_steps} {kind}; layer blank = whole step)")
        for c in med.columns:
            t2.add_column(c, justify="right")
        for r in med.iter_rows():
            t2.add_row(*["" if v is None else (f"{v:,.4g}" if isinstance(v, float) else str(v)) for v in r])
        console.print(t2)


def _phases(trace: object, cfg: object, gpu: object) -> pl.DataFrame:
    """The steady requests' generation phases against the model (:func:`tracekit.model.phases.phase_efficiency`);
    empty when the run is no generation or server."""
    import polars as pl

    from tracekit.analysis.run.phases import phase_summary
    from tracekit.diagnosis import structure
    from tracekit.model.phases import phase_efficiency

    s = phase_summary(structure(trace).steady_steps)  # the steady requests of the run's structure
    return phase_efficiency(s, cfg, gpu=gpu) if s.height else pl.DataFrame()


def _print_phases(console: object, p: pl.DataFrame) -> None:
    from rich.table import Table

    from tracekit.diagnosis.result import fmt_ns

    if p.height == 0:
        console.print("the trace shows no generation phases (no prefill/decode steps): no per-phase comparison")  # type: ignore[attr-defined]
        return
    t = Table(title="generation phases vs the model (prefill: time to first token; decode: median time per output token)")
    for c in ("phase", "steps", "measured", "predicted min", "efficiency", "MFU", "MBU", "GPU busy"):
        t.add_column(c, justify="left" if c == "phase" else "right")
    pct = lambda v: "" if v is None else f"{v:.1%}"  # noqa: E731
    for r in p.iter_rows(named=True):
        t.add_row(r["phase"], str(r["steps"]), fmt_ns(r["time_ns"]), fmt_ns(r["predicted_min_ns"]), pct(r["efficiency"]),
                  pct(r["mfu"]), pct(r["mbu"]), pct(r.get("busy_share")))
    console.print(t)  # type: ignore[attr-defined]
