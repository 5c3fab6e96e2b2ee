"""``tracekit model``: FLOPs, bytes and the roofline minimum of a transformer step; with a trace,
how far its layers are from it."""

from __future__ import annotations

import typer


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
    trace: str | None = typer.Option(None, "--trace", help="A trace whose NVTX layer ranges are compared with the model."),
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
    if gpu is None and opened is not None and opened.gpus.height:
        row = opened.gpus.row(0, named=True)
        from tracekit.ncu.specs import find_spec

        spec = find_spec(row["name"], row.get("total_memory_bytes"))
        gpu_arg = spec if spec is not None else None
    else:
        gpu_arg = gpu  # type: ignore[assignment]
    costs = model_costs(cfg, gpu=gpu_arg)
    summary = model_summary(cfg, gpu=gpu_arg)
    cmp = compare(opened, cfg, gpu=gpu_arg) if opened is not None else None
    if fmt == "json":
        print(json.dumps({"config": cfg.as_dict(), "summary": summary, "blocks": costs.to_dicts(),
                          "compare": cmp.to_dicts() if cmp is not None else None}, indent=2, default=str))
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
    if cmp is not None:
        if cmp.height == 0:
            console.print("the trace has no NVTX layer ranges (layer.N, model.layers.N …; capture with --annotate-torch): "
                          "nothing to compare")
            return
        med = cmp.group_by("layer").agg(pl.col("measured_ns").median(), pl.col("predicted_min_ns").first(),
                                        pl.col("efficiency").median(), pl.col("mfu").median(), pl.col("mbu").median()).sort("layer", nulls_last=True)
        n_steps = cmp["step"].n_unique()
        phases = sorted({p for p in cmp["phase"].to_list() if p is not None})
        kind = f"{'/'.join(phases)} forwards" if phases else "steady steps"
        t2 = Table(title=f"measured vs predicted (median over {n_steps} {kind}; layer blank = whole step)")
        for c in med.columns:
            t2.add_column(c, justify="right")
        for r in med.iter_rows():
            t2.add_row(*["" if v is None else (f"{v:,.4g}" if isinstance(v, float) else str(v)) for v in r])
        console.print(t2)
