"""Parameters, FLOPs and bytes of one step, per layer and sub-block, and the roofline minimum.

Per tensor-parallel shard (``tp`` GPUs share each layer: attention heads, MLP columns and the
vocabulary are split; norms are replicated) and per pipeline stage (``layers / pp`` layers).
``T`` = tokens of the step (prefill: batch × prompt_len; decode: batch), ``S`` = keys each new
token attends to (prefill: (prompt_len + 1) / 2 on average under the causal mask; decode:
context_len), ``d`` = hidden, ``h`` = heads, ``g`` = kv_heads, ``e`` = head_dim, ``f`` =
ffn_hidden, ``b`` = bytes per element, ``bk`` = bytes per KV-cache element.

==============  ==========================  ==============================  ==========================================
block           params                      FLOPs                           bytes moved (DRAM)
==============  ==========================  ==============================  ==========================================
attn_qkv        d·(h + 2g)·e                2·T·params                      params·b + T·d·b + T·(h + 2g)·e·b
attn_core       –                           4·T·S·h·e (QKᵀ and AV)          KV read 2·batch·S_kv·g·e·bk + KV write 2·T·g·e·bk + 2·T·h·e·b
attn_out        h·e·d                       2·T·params                      params·b + 2·T·d·b
mlp             (3 gated | 2)·d·f           2·T·params_active               weights touched·b + T·(d + m·f)·b, m = 2 gated else 1
                MoE: × experts (total)      × top_k active per token        decode: min(experts, T·top_k) experts' weights
norm            2·d (two RMS/LayerNorms)    ≈ 8·T·d (ignored in bound)      2 × 2·T·d·b
embedding       vocab·d (first stage)       –                               T·d·b (rows gathered)
logits          vocab·d (last stage;        2·B·vocab·d (B = batch: the     params·b + B·vocab·b
                0 when tied)                last position only)
==============  ==========================  ==============================  ==========================================

``S_kv`` = context_len in decode, prompt_len in prefill (the keys/values read once from the
cache or the fresh projections). Each block's ``min_time_ns`` = max(FLOPs / peak FLOP/s, bytes /
peak bandwidth) on the GPU (:mod:`tracekit.ncu.specs`, dense tensor peak of ``dtype``; FP32 SIMT
peak for ``fp32``); ``bound`` is the side that sets it. ``comm_bytes`` per GPU for tensor
parallelism: two ring all-reduces per layer of T·d·b (2·(tp − 1)/tp of it sent), and for
pipeline parallelism the T·d·b activation sent to the next stage.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from tracekit.model.config import TransformerConfig
from tracekit.ncu.specs import GpuSpec, find_spec

__all__ = ["COST_SCHEMA", "model_costs", "model_summary", "peaks"]

COST_SCHEMA = {
    "layer": pl.Int64, "block": pl.Utf8, "params": pl.Float64, "flops": pl.Float64, "bytes": pl.Float64,
    "weight_bytes": pl.Float64, "kv_bytes": pl.Float64, "comm_bytes": pl.Float64,
    "intensity_flop_per_byte": pl.Float64, "min_time_ns": pl.Float64, "bound": pl.Utf8,
}


def _report_peaks(report: Any, dtype: str) -> tuple[float | None, float | None, str | None]:
    """Peaks measured by an Nsight Compute report (``roofline_ceilings``: the report's own
    ``peak_sustained`` counters × clock, the spec table where it lacks them), median over its
    kernels."""
    import polars as pl

    from tracekit.analysis.ncu_views import roofline_ceilings

    c = roofline_ceilings(report)
    compute = "simt_fp32" if dtype == "fp32" else f"tensor_{ {'int8': 'fp8', 'int4': 'fp8'}.get(dtype, dtype)}"
    f = c.filter(pl.col("ceiling") == compute)["value"].median()
    b = c.filter(pl.col("ceiling") == "dram")["value"].median()
    name = None
    devices = getattr(report, "devices", None)
    if devices is not None and devices.height and "display_name" in devices.columns:
        name = f"{devices['display_name'][0]} (ncu report peaks)"
    return (float(f) if f is not None else None), (float(b) if b is not None else None), name  # type: ignore[arg-type]


def peaks(gpu: Any, dtype: str) -> tuple[float | None, float | None, str | None]:
    """``(FLOP/s, bytes/s, name)`` for ``dtype`` on a GPU given by name, spec, or an Nsight
    Compute report (its own measured peaks); Nones when unknown."""
    if gpu is not None and hasattr(gpu, "metrics") and hasattr(gpu, "kernels"):  # an NcuReport
        return _report_peaks(gpu, dtype)
    spec = gpu if isinstance(gpu, GpuSpec) else find_spec(gpu) if gpu else None
    if spec is None:
        return None, None, None
    if dtype in ("fp32",):
        tf = spec.fp32_tflops
    else:
        key = {"int8": "fp8", "int4": "fp8", "fp4": "fp4"}.get(dtype, dtype)
        tf = spec.tensor_tflops.get(key) or spec.tensor_tflops.get("fp16") or spec.fp32_tflops
    return tf * 1e12, spec.bandwidth_gbps * 1e9, spec.name


def _blocks(cfg: TransformerConfig) -> list[dict[str, float | str]]:
    """Per-layer blocks of one shard (see the module table)."""
    d, h, g, e, f = cfg.hidden, cfg.heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_hidden
    b, bk, tp = cfg.bytes_per_element, cfg.kv_bytes_per_element, cfg.tp
    if cfg.phase == "prefill":
        t = cfg.batch * cfg.prompt_len
        s_att = (cfg.prompt_len + 1) / 2
        s_kv = cfg.prompt_len
    else:
        t = cfg.batch
        s_att = s_kv = cfg.context_len
    qkv = d * (h + 2 * g) * e / tp
    out = h * e * d / tp
    m = 3 if cfg.gated_mlp else 2
    mlp_one = m * d * f / tp
    experts = max(cfg.experts, 1)
    k = cfg.top_k if cfg.experts else 1
    touched = experts if cfg.phase == "prefill" or not cfg.experts else min(experts, t * k)
    kv_read = 2 * cfg.batch * s_kv * g * e * bk / tp
    kv_write = 2 * t * g * e * bk / tp
    return [
        {"block": "attn_qkv", "params": qkv, "flops": 2 * t * qkv, "weight_bytes": qkv * b,
         "bytes": qkv * b + t * d * b + t * (h + 2 * g) * e * b / tp, "kv_bytes": 0.0},
        {"block": "attn_core", "params": 0.0, "flops": 4 * t * s_att * h * e / tp, "weight_bytes": 0.0,
         "bytes": kv_read + kv_write + 2 * t * h * e * b / tp, "kv_bytes": kv_read + kv_write},
        {"block": "attn_out", "params": out, "flops": 2 * t * out, "weight_bytes": out * b,
         "bytes": out * b + 2 * t * d * b, "kv_bytes": 0.0},
        {"block": "mlp", "params": mlp_one * experts, "flops": 2 * t * k * mlp_one, "weight_bytes": touched * mlp_one * b,
         "bytes": touched * mlp_one * b + t * (d + (m - 1) * f / tp) * b * k, "kv_bytes": 0.0},
        {"block": "norm", "params": 2.0 * d, "flops": 8.0 * t * d, "weight_bytes": 2.0 * d * b,
         "bytes": 4.0 * t * d * b, "kv_bytes": 0.0},
    ]


def model_costs(cfg: TransformerConfig, *, gpu: Any = None, stage: int = 0) -> pl.DataFrame:
    """One row per (layer, block) of pipeline stage ``stage`` plus ``embedding`` (first stage)
    and ``logits`` (last stage) rows with null ``layer``, per tensor-parallel shard.

    Columns (see the module doc for the formulas): ``layer``, ``block``, ``params``, ``flops``
    (FLOP), ``bytes``, ``weight_bytes``, ``kv_bytes``, ``comm_bytes`` (bytes; TP all-reduce per
    GPU on ``attn_out``/``mlp``, the PP send on the stage's last layer), ``intensity_flop_per_byte``,
    ``min_time_ns`` (null without a GPU), ``bound`` (``compute``/``memory``).
    """
    per_stage = cfg.layers // cfg.pp
    first_layer = stage * per_stage
    t = cfg.batch * (cfg.prompt_len if cfg.phase == "prefill" else 1)
    act = t * cfg.hidden * cfg.bytes_per_element
    allreduce = 2 * (cfg.tp - 1) / cfg.tp * act if cfg.tp > 1 else 0.0
    rows: list[dict[str, Any]] = []
    blocks = _blocks(cfg)
    for layer in range(first_layer, first_layer + per_stage):
        for blk in blocks:
            comm = allreduce if blk["block"] in ("attn_out", "mlp") else 0.0
            if blk["block"] == "mlp" and layer == first_layer + per_stage - 1 and stage < cfg.pp - 1:
                comm += act
            rows.append({"layer": layer, **blk, "comm_bytes": comm})
    b = cfg.bytes_per_element
    vocab_shard = cfg.vocab * cfg.hidden / cfg.tp
    if stage == 0:
        rows.append({"layer": None, "block": "embedding", "params": vocab_shard, "flops": 0.0, "weight_bytes": t * cfg.hidden * b,
                     "bytes": 2 * t * cfg.hidden * b, "kv_bytes": 0.0, "comm_bytes": 0.0})
    if stage == cfg.pp - 1:
        lp = 0.0 if cfg.tie_embeddings and cfg.pp == 1 else vocab_shard
        rows.append({"layer": None, "block": "logits", "params": lp, "flops": 2 * cfg.batch * vocab_shard,
                     "weight_bytes": vocab_shard * b, "bytes": vocab_shard * b + cfg.batch * cfg.vocab / cfg.tp * b,
                     "kv_bytes": 0.0, "comm_bytes": 0.0})
    frame = pl.DataFrame(rows, schema={k: v for k, v in COST_SCHEMA.items() if k not in ("intensity_flop_per_byte", "min_time_ns", "bound")})
    flops_s, bw, _ = peaks(gpu, cfg.dtype)
    frame = frame.with_columns(
        pl.when(pl.col("bytes") > 0).then(pl.col("flops") / pl.col("bytes")).alias("intensity_flop_per_byte"),
    )
    if flops_s is None or bw is None:
        return frame.with_columns(pl.lit(None, pl.Float64).alias("min_time_ns"), pl.lit(None, pl.Utf8).alias("bound")).select(list(COST_SCHEMA))
    tc = pl.col("flops") / flops_s * 1e9
    tm = pl.col("bytes") / bw * 1e9
    return frame.with_columns(
        pl.max_horizontal(tc, tm).alias("min_time_ns"),
        pl.when(tc >= tm).then(pl.lit("compute")).otherwise(pl.lit("memory")).alias("bound"),
    ).select(list(COST_SCHEMA))


def model_summary(cfg: TransformerConfig, *, gpu: Any = None) -> dict[str, Any]:
    """Whole-model numbers: ``params`` (all shards and stages), ``params_non_embedding``,
    ``flops_per_token`` (forward, the step's FLOPs / tokens), ``kv_bytes_per_token``
    (2·layers·kv_heads·head_dim·bytes), and with a GPU ``min_step_ns`` (sum over the stage-0
    shard's blocks) and the peaks used."""
    whole = cfg.with_(tp=1, pp=1)
    costs = model_costs(whole, gpu=gpu)
    tokens = whole.batch * (whole.prompt_len if whole.phase == "prefill" else 1)
    emb = whole.vocab * whole.hidden
    params = float(costs["params"].sum()) + (emb if whole.tie_embeddings else 0.0)
    flops_s, bw, name = peaks(gpu, cfg.dtype)
    stage = model_costs(cfg, gpu=gpu)
    return {
        "params": params,
        "params_non_embedding": params - emb * (1 if whole.tie_embeddings else 2),
        "flops_per_token": float(costs["flops"].sum()) / tokens,
        "kv_bytes_per_token": 2 * whole.layers * whole.n_kv_heads * whole.head_dim * whole.kv_bytes_per_element,
        "min_step_ns": float(stage["min_time_ns"].sum()) if flops_s is not None else None,
        "gpu": name, "peak_flops_per_s": flops_s, "peak_bytes_per_s": bw,
    }
