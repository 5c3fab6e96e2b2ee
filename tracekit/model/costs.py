"""Parameters, FLOPs and bytes of one step, per layer and sub-block, and the roofline minimum.

Per tensor-parallel shard (``tp`` GPUs share each layer: attention heads, MLP columns and the
vocabulary are split; norms and the MoE router are replicated) and per pipeline stage
(``layers / pp`` layers). ``T`` = tokens of the step (prefill: batch × prompt_len; decode: batch),
``S`` = keys each new token attends to (prefill: (prompt_len + 1) / 2 on average under the causal
mask; decode: context_len; in a sliding-window layer of window ``W``: decode min(context_len, W),
prefill (W·(W + 1)/2 + (prompt_len − W)·W) / prompt_len once prompt_len > W), ``d`` = hidden,
``h`` = heads, ``g`` = kv_heads, ``e`` = head_dim (the config's, else d / h), ``f`` = ffn_hidden
(dense layer) or moe_ffn_hidden (one routed expert), ``f_s`` = shared_ffn_hidden, ``E`` = experts,
``k`` = top_k, ``b`` = bytes per element, ``bk`` = bytes per KV-cache element, ``m`` = 3 gated
else 2, ``n`` = norms_per_layer.

==============  ===============================  ==============================  ==========================================
block           params                           FLOPs                           bytes moved (DRAM)
==============  ===============================  ==============================  ==========================================
attn_qkv        d·(h + 2g)·e (+ (h + 2g)·e       2·T·params                      params·b + T·d·b + T·(h + 2g)·e·b
                with qkv_bias)
attn_core       –                                4·T·S·h·e (QKᵀ and AV)          KV read 2·batch·S_kv·g·e·bk + KV write 2·T·g·e·bk + 2·T·h·e·b
attn_out        h·e·d (+ d with out_bias)        2·T·params                      params·b + 2·T·d·b
mlp (dense)     F(f) = m·d·f (+ (m − 1)·f + d    2·T·params                      params·b + T·(d + (m − 1)·f)·b
                with mlp_bias)
mlp (MoE)       E·F(f) + F(f_s) + E·d (router)   2·T·(k·F(f) + F(f_s) + E·d)     weights of the experts touched (prefill: E;
                                                                                 decode: min(E, T·k)), shared and router +
                                                                                 T·(k·(d + (m − 1)·f) + d + (m − 1)·f_s)·b
norm            n·d (×2 with norm_bias;          4 per normalised element:       2 × (elements normalised)·b
                + 2·e with qk_norm)              4·T·(n·d + qk_norm·(h + g)·e)
embedding       vocab·d (first stage) +          –                               T·d·b gathered (twice with positions)
                position_embeddings·d
logits          vocab·d (last stage; 0 when      2·B·vocab·d (B = batch: the     params·b + B·vocab·b
                tied) + the final norm's d       last position only)
==============  ===============================  ==============================  ==========================================

``S_kv`` = context_len in decode (min(context_len, W) in a sliding-window layer), prompt_len in
prefill (the keys/values read once from the cache or the fresh projections). Which layers are
MoE (not in ``dense_layers``) and which slide (not in ``full_attention_layers``) is decided per
layer. Each block's ``min_time_ns`` = max(FLOPs / peak FLOP/s, bytes / peak bandwidth) on the
GPU (:mod:`tracekit.ncu.specs`, dense tensor peak of ``dtype``; FP32 SIMT peak for ``fp32``);
``bound`` is the side that sets it. ``comm_bytes`` per GPU for tensor parallelism: two ring
all-reduces per layer of T·d·b (2·(tp − 1)/tp of it sent), and for pipeline parallelism the
T·d·b activation sent to the next stage.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from tracekit.model.config import TransformerConfig
from tracekit.ncu.specs import GpuSpec, dense_peaks, find_spec

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
    flops, bandwidth = dense_peaks(spec, dtype)
    return flops, bandwidth, spec.name


def _tokens(cfg: TransformerConfig) -> int:
    return cfg.batch * (cfg.prompt_len if cfg.phase == "prefill" else 1)


def _keys(cfg: TransformerConfig, window: int | None) -> tuple[float, float]:
    """``(S, S_kv)``: keys each new token attends to (mean) and keys read per sequence."""
    if cfg.phase == "prefill":
        p = cfg.prompt_len
        if window is None or window >= p:
            return (p + 1) / 2, float(p)
        return (window * (window + 1) / 2 + (p - window) * window) / p, float(p)
    s = float(cfg.context_len if window is None else min(cfg.context_len, window))
    return s, s


def _ffn_params(cfg: TransformerConfig, f: int) -> float:
    """Parameters of one MLP of inner width ``f`` (gate, up, down or up, down; biases)."""
    m = 3 if cfg.gated_mlp else 2
    return float(m * cfg.hidden * f + (((m - 1) * f + cfg.hidden) if cfg.mlp_bias else 0))


def _mlp(cfg: TransformerConfig, moe: bool, t: int) -> dict[str, float | str]:
    d, b, tp = cfg.hidden, cfg.bytes_per_element, cfg.tp
    m = 3 if cfg.gated_mlp else 2
    if not moe:
        one = _ffn_params(cfg, cfg.ffn_hidden) / tp
        return {"block": "mlp", "params": one, "flops": 2 * t * one, "weight_bytes": one * b,
                "bytes": one * b + t * (d + (m - 1) * cfg.ffn_hidden / tp) * b, "kv_bytes": 0.0}
    f, fs, e, k = cfg.expert_ffn_hidden, cfg.shared_ffn_hidden, cfg.experts, cfg.top_k
    one = _ffn_params(cfg, f) / tp
    shared = _ffn_params(cfg, fs) / tp if fs else 0.0
    router = float(e * d)  # replicated on every shard
    touched = e if cfg.phase == "prefill" else min(e, t * k)
    weights = (touched * one + shared + router) * b
    act = t * b * (k * (d + (m - 1) * f / tp) + ((d + (m - 1) * fs / tp) if fs else 0.0))
    return {"block": "mlp", "params": e * one + shared + router, "flops": 2 * t * (k * one + shared + router),
            "weight_bytes": weights, "bytes": weights + act, "kv_bytes": 0.0}


def _blocks(cfg: TransformerConfig, *, moe: bool, sliding: bool) -> list[dict[str, float | str]]:
    """The blocks of one layer of one shard (see the module table): an MoE or dense MLP, a
    sliding-window or full attention."""
    d, h, g, e = cfg.hidden, cfg.heads, cfg.n_kv_heads, cfg.head_size
    b, bk, tp = cfg.bytes_per_element, cfg.kv_bytes_per_element, cfg.tp
    t = _tokens(cfg)
    s_att, s_kv = _keys(cfg, cfg.sliding_window if sliding else None)
    proj = (h + 2 * g) * e
    qkv = (d * proj + (proj if cfg.qkv_bias else 0)) / tp
    out = (h * e * d + (d if cfg.out_bias else 0)) / tp
    kv_read = 2 * cfg.batch * s_kv * g * e * bk / tp
    kv_write = 2 * t * g * e * bk / tp
    width = 2 if cfg.norm_bias else 1
    norm_params = float(width * (cfg.norms_per_layer * d + (2 * e if cfg.qk_norm else 0)))
    normalised = t * (cfg.norms_per_layer * d + ((h + g) * e / tp if cfg.qk_norm else 0))
    return [
        {"block": "attn_qkv", "params": qkv, "flops": 2 * t * qkv, "weight_bytes": qkv * b,
         "bytes": qkv * b + t * d * b + t * proj * b / tp, "kv_bytes": 0.0},
        {"block": "attn_core", "params": 0.0, "flops": 4 * t * s_att * h * e / tp, "weight_bytes": 0.0,
         "bytes": kv_read + kv_write + 2 * t * h * e * b / tp, "kv_bytes": kv_read + kv_write},
        {"block": "attn_out", "params": out, "flops": 2 * t * out, "weight_bytes": out * b,
         "bytes": out * b + 2 * t * d * b, "kv_bytes": 0.0},
        _mlp(cfg, moe, t),
        {"block": "norm", "params": norm_params, "flops": 4.0 * normalised, "weight_bytes": norm_params * b,
         "bytes": 2.0 * normalised * b, "kv_bytes": 0.0},
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
    t = _tokens(cfg)
    act = t * cfg.hidden * cfg.bytes_per_element
    allreduce = 2 * (cfg.tp - 1) / cfg.tp * act if cfg.tp > 1 else 0.0
    rows: list[dict[str, Any]] = []
    kinds: dict[tuple[bool, bool], list[dict[str, float | str]]] = {}
    for layer in range(first_layer, first_layer + per_stage):
        kind = (cfg.is_moe_layer(layer), cfg.is_sliding_layer(layer))
        if kind not in kinds:
            kinds[kind] = _blocks(cfg, moe=kind[0], sliding=kind[1])
        for blk in kinds[kind]:
            comm = allreduce if blk["block"] in ("attn_out", "mlp") else 0.0
            if blk["block"] == "mlp" and layer == first_layer + per_stage - 1 and stage < cfg.pp - 1:
                comm += act
            rows.append({"layer": layer, **blk, "comm_bytes": comm})
    b, d = cfg.bytes_per_element, cfg.hidden
    vocab_shard = cfg.vocab * d / cfg.tp
    if stage == 0:
        gathered = (2 if cfg.position_embeddings else 1) * t * d * b
        rows.append({"layer": None, "block": "embedding", "params": vocab_shard + cfg.position_embeddings * d, "flops": 0.0,
                     "weight_bytes": gathered, "bytes": gathered + t * d * b, "kv_bytes": 0.0, "comm_bytes": 0.0})
    if stage == cfg.pp - 1:
        final_norm = (2 if cfg.norm_bias else 1) * d
        lp = (0.0 if cfg.tie_embeddings and cfg.pp == 1 else vocab_shard) + final_norm
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
    """Whole-model numbers, as model cards report them.

    Returns
    -------
    ``params`` (all shards and stages; a tied LM head counted once, with norms, biases, router
    and position table), ``params_non_embedding`` (``params`` less the embedding matrix, the
    untied LM head and the position table), ``params_active`` (per token: ``params`` less the
    routed experts a token does not use, ``(experts − top_k)`` per MoE layer; = ``params`` for a
    dense model), ``flops_per_token`` (forward, the step's FLOPs / tokens), ``kv_bytes_per_token``
    (2·layers·kv_heads·head_dim·bytes: the cache each token adds), and with a GPU
    ``min_step_ns`` (sum over the stage-0 shard's blocks) and the peaks used.
    """
    whole = cfg.with_(tp=1, pp=1)
    costs = model_costs(whole, gpu=gpu)
    params = float(costs["params"].sum())
    embedding = whole.vocab * whole.hidden
    head = 0 if whole.tie_embeddings else embedding
    moe_layers = sum(whole.is_moe_layer(layer) for layer in range(whole.layers))
    idle_experts = moe_layers * (whole.experts - whole.top_k) * _ffn_params(whole, whole.expert_ffn_hidden)
    flops_s, bw, name = peaks(gpu, cfg.dtype)
    stage = model_costs(cfg, gpu=gpu)
    return {
        "params": params,
        "params_non_embedding": params - embedding - head - whole.position_embeddings * whole.hidden,
        "params_active": params - idle_experts,
        "flops_per_token": float(costs["flops"].sum()) / _tokens(whole),
        "kv_bytes_per_token": 2 * whole.layers * whole.n_kv_heads * whole.head_size * whole.kv_bytes_per_element,
        "min_step_ns": float(stage["min_time_ns"].sum()) if flops_s is not None else None,
        "gpu": name, "peak_flops_per_s": flops_s, "peak_bytes_per_s": bw,
    }
