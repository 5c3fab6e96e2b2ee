"""Predicted against measured: each layer's GPU time per step next to the model's minimum."""

from __future__ import annotations

from typing import Any

import polars as pl

from tracekit.analysis.attribution import attribute_nvtx
from tracekit.analysis.layers import (
    DEFAULT_LAYER_PATTERN,
    forward_ranges,
    forwards,
    in_forward,
    layer_of,
)
from tracekit.model.config import TransformerConfig, load_model
from tracekit.model.costs import model_costs, peaks
from tracekit.model.gpu import gpu_of as _gpu_of

__all__ = ["compare"]


def _forward_steps(trace: Any, ranges: pl.DataFrame, phase: str) -> tuple[pl.DataFrame, list[int], pl.DataFrame]:
    """Every GPU operation launched in a forward with ``step`` = its forward, the forwards
    of ``phase`` (or of no known phase), and each forward's phase."""
    from tracekit.diagnosis.config import DiagnoseConfig
    from tracekit.diagnosis.context import Context

    ctx = Context(trace, DiagnoseConfig())
    ops = ctx.ops_with_launch
    per = _structure_phases(forwards(ops, ranges), ctx)
    keep = per.filter(pl.col("phase").is_null() | (pl.col("phase") == phase))
    inside = in_forward(ops, ranges).rename({"forward": "step"}).drop("forward_range_id")
    phases = per.group_by(pl.col("forward").alias("step")).agg(pl.col("phase").first())
    return inside, sorted(set(keep["forward"].to_list())), phases


def _structure_phases(per: pl.DataFrame, ctx: Any) -> pl.DataFrame:
    """``per`` (:func:`~tracekit.analysis.layers.forwards`) with each forward's phase from the
    run's structure where its generation steps are these ranges (source ``module``): there the
    kernels' reading of each forward says whether it read a prompt (a prompt of 64 tokens at
    batch 1 is not twice a decode forward's GPU time, so the time rule calls it a decode)."""
    try:
        steps = ctx.structure.steps_table
    except Exception:  # noqa: BLE001 - the time rule stands when the structure cannot be read
        return per
    if steps is None or steps.height == 0 or "source" not in steps.columns or set(steps["source"].to_list()) != {"module"}:
        return per
    known = steps.select("start_ns", pl.col("phase").alias("_phase")).unique("start_ns", keep="first")
    out = per.join(known, on="start_ns", how="left")
    if out["_phase"].null_count():  # not the same ranges
        return per
    return out.with_columns(pl.col("_phase").alias("phase")).drop("_phase")


def compare(
    trace: Any,
    model: Any,
    *,
    gpu: Any = None,
    layer_pattern: str = DEFAULT_LAYER_PATTERN,
) -> pl.DataFrame:
    """Per step and layer: measured GPU time against the model's minimum.

    The trace's layers are the NVTX ranges whose path matches ``layer_pattern``
    (``layer.3``, ``model.layers.3``; :func:`tracekit.analysis.layers.layer_of`); a GPU
    operation counts in the layer of its launching call's innermost range.

    Steps are found in this order:

    1. NVTX iteration ranges (``step.N``, ``iter``, ``decode`` …): the steady steps of
       :func:`tracekit.diagnosis.window.steady_ops`, warm-up left out.
    2. Otherwise forward ranges (:func:`tracekit.analysis.layers.forward_ranges`: the
       outermost range around each run of the layers, e.g. ``--annotate-torch``'s root module
       ``Qwen3ForCausalLM``, one per ``generate()`` token): one step per forward, numbered
       from 0 per process, an operation in the forward whose range holds its launching call
       on the same thread. Each forward has a ``phase``: the run structure's, where its
       generation steps are these ranges (each forward's kernels say whether it read a
       prompt), else :func:`tracekit.analysis.layers.forwards`' (the ones taking over twice
       the median GPU time are ``prefill``, the others ``decode``; null when all are alike);
       only those of the model's ``phase`` (or null) are compared: in a ``generate()`` trace a decode model sees the decode forwards, a
       prefill model the prompt's.
    3. Otherwise the steady steps of ``steady_ops`` (CUDA graph replays or the repeating
       kernel sequence).

    The model is a :class:`TransformerConfig` (or anything :func:`load_model` takes); its
    layers are this trace's shard (``tp``) and stage (``pp``); the GPU is ``gpu`` (a name, a
    spec, or an Nsight Compute report whose own measured peaks are used) or the trace's
    first GPU (name and memory).

    Returns
    -------
    One row per (``step``, ``layer``) plus one per step with ``layer`` null (the whole step:
    every operation of the step, the model's whole stage): ``step``, ``phase`` (forward
    steps: ``prefill``/``decode``/null; null for the others), ``layer``, ``measured_ns``
    (summed GPU operation time, ns), ``predicted_min_ns`` (Σ of the layer's blocks'
    ``min_time_ns``), ``flops``, ``bytes`` (the model's), ``efficiency`` (predicted /
    measured, 0–1 when the model's bound holds), ``mfu`` (FLOPs / (measured × peak
    FLOP/s)), ``mbu`` (bytes / (measured × peak bandwidth)), ``bound`` (of the layer's
    biggest block), ``gpu``. Empty (same columns) when the trace has no layer ranges.
    """
    from tracekit.diagnosis.window import steady_ops

    cfg: TransformerConfig = load_model(model)
    spec = _gpu_of(trace, gpu)
    costs = model_costs(cfg, gpu=spec)
    flops_s, bw, name = peaks(spec, cfg.dtype)
    schema = {"step": pl.Int64, "phase": pl.Utf8, "layer": pl.Int64, "measured_ns": pl.Int64,
              "predicted_min_ns": pl.Float64, "flops": pl.Float64, "bytes": pl.Float64, "efficiency": pl.Float64,
              "mfu": pl.Float64, "mbu": pl.Float64, "bound": pl.Utf8, "gpu": pl.Utf8}
    nvtx = getattr(trace, "nvtx", pl.DataFrame())
    ops, steps, method = steady_ops(trace)
    if ops.height == 0 or nvtx.height == 0:
        return pl.DataFrame(schema=schema)
    phases = pl.DataFrame(schema={"step": pl.Int64, "phase": pl.Utf8})
    if method != "nvtx":
        fr = forward_ranges(nvtx, pattern=layer_pattern)
        if fr.height:
            ops, steps, phases = _forward_steps(trace, fr, cfg.phase)
    att = attribute_nvtx(ops, nvtx)
    layer, _block = layer_of(pl.col("nvtx_path"), layer_pattern)
    att = att.with_columns(layer.alias("layer"))
    if att.filter(pl.col("layer").is_not_null()).height == 0:
        return pl.DataFrame(schema=schema)
    per_layer = att.filter(pl.col("layer").is_not_null()).group_by("step", "layer").agg(pl.col("duration_ns").sum().alias("measured_ns"))
    per_step = att.group_by("step").agg(pl.col("duration_ns").sum().alias("measured_ns")).with_columns(pl.lit(None, pl.Int64).alias("layer"))
    model_layers = costs.filter(pl.col("layer").is_not_null()).group_by("layer").agg(
        pl.col("min_time_ns").sum().alias("predicted_min_ns"), pl.col("flops").sum(), pl.col("bytes").sum(),
        pl.col("bound").sort_by("min_time_ns").last().alias("bound"),
    )
    # the trace's layer numbers are global (layer.N); on a pipeline stage they start at its first layer
    whole = costs.select(
        pl.col("min_time_ns").sum().alias("predicted_min_ns"), pl.col("flops").sum(), pl.col("bytes").sum(),
        pl.col("bound").sort_by("min_time_ns").last().alias("bound"),
    )
    rows = pl.concat([
        per_layer.join(model_layers, on="layer", how="left"),
        per_step.join(whole, how="cross"),
    ], how="diagonal_relaxed")
    rows = rows.filter(pl.col("step").is_in(steps)).join(phases, on="step", how="left")
    m = pl.col("measured_ns").cast(pl.Float64)
    out = rows.with_columns(
        pl.when(m > 0).then(pl.col("predicted_min_ns") / m).alias("efficiency"),
        (pl.col("flops") / (m * 1e-9 * flops_s) if flops_s else pl.lit(None, pl.Float64)).alias("mfu"),
        (pl.col("bytes") / (m * 1e-9 * bw) if bw else pl.lit(None, pl.Float64)).alias("mbu"),
        pl.lit(name, pl.Utf8).alias("gpu"),
    )
    return out.select([pl.col(c).cast(t) for c, t in schema.items()]).sort("step", "layer", nulls_last=True)
