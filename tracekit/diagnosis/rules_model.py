"""``below_model_bound``: layers far from what the theoretical model (:mod:`tracekit.model`)
says the hardware allows. Runs only when ``diagnose(…, model=…)`` is given."""

from __future__ import annotations

from typing import Any

import polars as pl

from tracekit.diagnosis.context import Context
from tracekit.diagnosis.result import Finding, fmt_ns
from tracekit.diagnosis.rules_host import _cmd

__all__ = ["model_findings"]


def _comparison(ctx: Context) -> pl.DataFrame:
    import tracekit.model as tm

    model: Any = ctx.model
    return tm.compare(ctx.trace, model)  # type: ignore[no-any-return]


def model_findings(ctx: Context) -> list[Finding]:
    """Per layer, over compare's steps (the steady NVTX steps, or the forwards of the model's
    phase in a trace of module ranges): measured GPU time against the model's minimum
    (``tracekit.model.compare``). A layer whose median efficiency is below
    ``efficiency_min`` is reported; ``time_ns`` = Σ over the window's steps of (measured −
    predicted minimum) for those layers, what reaching the bound would save."""
    cmp = _comparison(ctx)
    need = {"layer", "measured_ns", "predicted_min_ns", "efficiency"}
    if cmp.height == 0 or not need <= set(cmp.columns):
        steps = phase_findings(ctx)
        if steps is not None:
            return steps
        return [Finding("below_model_bound", "info",
                        "Model not compared: the trace has no NVTX layer ranges the model's layers map to, and no "
                        "prefill/decode steps",
                        advice="Mark layers with NVTX ranges: tracekit capture nsys --annotate-torch (module paths such as "
                        "model.layers.3), or layer.N ranges with torch.cuda.nvtx.")]
    # compare's steps are already the ones to judge (steady NVTX steps, or the forwards of the
    # model's phase): the window's warm-up count numbers other steps
    layers = cmp.filter(pl.col("layer").is_not_null())
    per = layers.group_by("layer").agg(
        pl.col("measured_ns").sum(), pl.col("predicted_min_ns").sum(), pl.col("efficiency").median(),
        pl.col("measured_ns").median().alias("median_step_ns"), pl.col("predicted_min_ns").first().alias("min_step_ns"),
        *[pl.col(c).median() for c in ("mfu", "mbu") if c in layers.columns],
        *[pl.col("bound").first()] if "bound" in layers.columns else [],
    ).sort("layer")
    slow = per.filter(pl.col("efficiency") < ctx.config.efficiency_min)
    if slow.height == 0:
        return []
    slow = slow.with_columns((pl.col("measured_ns") - pl.col("predicted_min_ns")).clip(lower_bound=0).alias("time_at_stake_ns"))
    total = int(slow["time_at_stake_ns"].sum())
    sev = ctx.config.severity(ctx.share(total)) or "low"
    worst = slow.sort("efficiency").row(0, named=True)
    return [Finding(
        "below_model_bound", sev,
        f"{slow.height} of {per.height} layers reach less than {ctx.config.efficiency_min:.0%} of the model's bound; "
        f"layer {worst['layer']} reaches {worst['efficiency']:.0%} ({fmt_ns(worst['median_step_ns'])} per step measured vs "
        f"{fmt_ns(worst['min_step_ns'])} at the roofline)",
        time_ns=total, share=ctx.share(total), evidence=slow,
        advice="Compare each layer's kernels with its bound: decode layers are bound by weight and KV-cache bytes "
        "(raise the batch, quantise weights/KV to fp8/int4, fuse norms and activations into GEMMs); prefill layers by "
        "FLOPs (tensor cores in bf16/fp8, larger GEMM tiles, FlashAttention).",
        next=[f"tracekit capture both --top-n 5 -- {_cmd(ctx)}"],
    )]


def phase_findings(ctx: Context) -> list[Finding] | None:
    """Whole steps against the model when layers cannot be (a decode replayed from a CUDA
    graph hides its layers): each generation phase whose efficiency (the model's minimum ÷
    measured time per token or to first token, :func:`tracekit.model.phases.phase_efficiency`)
    is below ``efficiency_min``, for the decode phase (the steady window; the prefill is a
    one-off, shown in the phases line). ``time_ns`` = (measured − minimum) × the window's
    steps. ``None`` without phases."""
    p = ctx.phases
    if p.height == 0 or "efficiency" not in p.columns:
        return None
    # the decode steps are the steady window; a prefill is a one-off outside it
    slow = p.filter((pl.col("phase") == "decode") & pl.col("efficiency").is_not_null() & (pl.col("efficiency") < ctx.config.efficiency_min))
    if slow.height == 0:
        return []
    out = []
    for r in slow.iter_rows(named=True):
        steps = ctx.window.steps if r["phase"] == "decode" and ctx.window.steps else (r["steps"] if r["phase"] == "decode" else 1)
        total = int(max(r["time_ns"] - r["predicted_min_ns"], 0) * steps)
        sev = ctx.config.severity(ctx.share(total)) or "low"
        what = "time per output token" if r["phase"] == "decode" else "time to first token"
        out.append(Finding(
            "below_model_bound", sev,
            f"{r['phase'].capitalize()} reaches {r['efficiency']:.0%} of the model's bound: {what} {fmt_ns(r['time_ns'])} "
            f"against {fmt_ns(r['predicted_min_ns'])} at the roofline (MFU {r['mfu']:.1%}, MBU {r['mbu']:.1%})",
            time_ns=total, share=ctx.share(total), evidence=slow.filter(pl.col("phase") == r["phase"]),
            advice="A replayed step that keeps the GPU busy is bound by its kernels: decode by weight and KV-cache "
            "bytes (fused attention for decode — a math/fallback SDPA over the whole cache, unfused RoPE and norms, "
            "small GEMMs at low batch; raise the batch, quantise weights/KV), prefill by FLOPs. Trace the graph's kernels "
            "(--cuda-graph-trace node) or profile them with ncu to see which.",
            next=[f"tracekit capture nsys --cuda-graph-trace node -- {_cmd(ctx)}", f"tracekit capture both --top-n 5 -- {_cmd(ctx)}"],
        ))
    return out
