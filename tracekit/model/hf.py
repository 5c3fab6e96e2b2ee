"""A Hugging Face ``config.json`` read as :class:`~tracekit.model.config.TransformerConfig` fields.

The field names of the common decoder-only families: Llama, Mistral, Mixtral, Qwen2/2.5,
Qwen2-MoE, Qwen3, Qwen3-MoE, Gemma, Gemma-2, Gemma-3, DeepSeek (MoE, V2, V3), GPT-2 and GPT-NeoX;
a multimodal config's ``text_config`` is read as the language model. What each field becomes:

========================================================  =========================================
``config.json``                                           ``TransformerConfig``
========================================================  =========================================
hidden_size | n_embd; num_hidden_layers | n_layer;        hidden; layers; heads; kv_heads
num_attention_heads | n_head; num_key_value_heads
head_dim (when given, else hidden / heads)                head_dim
intermediate_size | n_inner (else 4 · hidden)             ffn_hidden
vocab_size; tie_word_embeddings (default: true for        vocab; tie_embeddings
GPT-2 and Gemma, false elsewhere, as transformers)
torch_dtype | dtype                                       dtype
num_local_experts | num_experts | n_routed_experts;       experts; top_k
num_experts_per_tok
moe_intermediate_size                                     moe_ffn_hidden
shared_expert_intermediate_size;                          shared_ffn_hidden
n_shared_experts × moe_intermediate_size
first_k_dense_replace, moe_layer_freq (DeepSeek);         dense_layers
mlp_only_layers, decoder_sparse_step (Qwen-MoE)
attention_bias; mlp_bias; Qwen2's q/k/v biases;           qkv_bias, out_bias; mlp_bias;
GPT-2/NeoX biases and LayerNorms                          norm_bias
Qwen3 q_norm/k_norm; Gemma-2/3 four norms per layer       qk_norm; norms_per_layer
n_positions (GPT-2's learned position table)              position_embeddings
sliding_window with layer_types, use_sliding_window /     sliding_window, full_attention_layers
max_window_layers (Qwen), Gemma-2's alternation,
sliding_window_pattern (Gemma-3)
========================================================  =========================================

Fields that change the cost of a step but are not modelled (:data:`UNMODELLED_FIELDS`) are named
in one :class:`~tracekit.errors.ModelConfigWarning`; fields that change nothing the model counts
(``rope_scaling``, ``rope_theta``, ``norm_topk_prob``, dropout …) are read no further.
"""

from __future__ import annotations

import warnings
from typing import Any

from tracekit.errors import ModelConfigWarning, TracekitError

__all__ = ["UNMODELLED_FIELDS", "hf_fields", "is_hf_config"]

_DTYPE_ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
                  "float8": "fp8", "float8_e4m3fn": "fp8"}
_HF_KEYS = frozenset({"hidden_size", "num_hidden_layers", "n_layer", "n_embd", "text_config"})
# an up and a down projection, no gate
_PLAIN_MLP = frozenset({"gpt2", "gpt_neox", "gptj", "gpt_bigcode", "opt", "bloom", "falcon", "phi", "starcoder2"})
# gated whatever the activation is called (Gemma's GeGLU says gelu_pytorch_tanh)
_GATED_FAMILIES = ("llama", "mistral", "mixtral", "qwen", "gemma", "deepseek", "phi3", "olmo", "granite", "internlm")
_TIED_BY_DEFAULT = frozenset({"gpt2", "gemma", "gemma2", "gemma3", "gemma3_text"})
# sliding_window, when set, applies to every layer (Mistral's rule)
_SLIDING_EVERYWHERE = frozenset({"mistral", "mixtral", "phi3", "starcoder2"})
_QWEN = frozenset({"qwen2", "qwen2_moe", "qwen3", "qwen3_moe"})

#: Fields that change the cost of a step and that the model leaves out, with what they do.
#: Present with a value other than null, false, 0 or empty, they are named in a warning.
UNMODELLED_FIELDS: dict[str, str] = {
    "attn_logit_softcapping": "tanh soft-capping of the attention scores (Gemma-2)",
    "final_logit_softcapping": "tanh soft-capping of the logits (Gemma-2)",
    "kv_lora_rank": "multi-head latent attention (DeepSeek-V2/V3): a compressed KV cache",
    "q_lora_rank": "multi-head latent attention: compressed queries",
    "qk_nope_head_dim": "multi-head latent attention: head widths",
    "qk_rope_head_dim": "multi-head latent attention: head widths",
    "v_head_dim": "multi-head latent attention: head widths",
    "num_nextn_predict_layers": "multi-token-prediction layers (DeepSeek-V3)",
    "quantization_config": "quantized weights (bytes are counted at dtype)",
    "vision_config": "a vision encoder (only the language model is modelled)",
    "audio_config": "an audio encoder (only the language model is modelled)",
    "cross_attention_layers": "cross-attention layers",
    "ffn_config": "DBRX's MoE description",
    "ssm_state_size": "state-space (Mamba) layers",
    "mamba_d_state": "state-space (Mamba) layers",
    "hybrid_override_pattern": "hybrid attention/state-space layers",
    "layers_block_type": "hybrid attention/state-space layers",
    "num_kv_shared_layers": "KV cache shared between layers (Gemma-3n)",
}


def is_hf_config(obj: dict[str, Any]) -> bool:
    """Whether a mapping uses Hugging Face field names rather than ``TransformerConfig``'s."""
    return bool(_HF_KEYS & set(obj))


def _active(value: Any) -> bool:
    return value is not None and value is not False and value != 0 and value != "" and value != [] and value != {}


def _first(cfg: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return None


def _dtype(value: Any) -> str:
    text = str(value).lower().replace("torch.", "")
    return _DTYPE_ALIASES.get(text, text)


def _dense_layers(cfg: dict[str, Any], layers: int) -> list[int]:
    """Layers whose MLP is dense in an MoE model: DeepSeek's first ``first_k_dense_replace``
    and those off ``moe_layer_freq``; Qwen-MoE's ``mlp_only_layers`` and those off
    ``decoder_sparse_step`` (MoE where (i + 1) % step == 0)."""
    dense: set[int] = set()
    first_k = int(cfg.get("first_k_dense_replace") or 0)
    dense.update(range(min(first_k, layers)))
    freq = cfg.get("moe_layer_freq")
    if isinstance(freq, int) and freq > 1:
        dense.update(i for i in range(layers) if i % freq)
    step = cfg.get("decoder_sparse_step")
    if isinstance(step, int) and step > 1:
        dense.update(i for i in range(layers) if (i + 1) % step)
    dense.update(int(i) for i in cfg.get("mlp_only_layers") or [] if 0 <= int(i) < layers)
    return sorted(dense)


def _sliding(cfg: dict[str, Any], model_type: str, layers: int, unmodelled: list[str]) -> tuple[int | None, list[int]]:
    """``(sliding_window, full_attention_layers)``: the window and the layers that attend to
    every key despite it."""
    window = cfg.get("sliding_window")
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        other = sorted(set(layer_types) - {"sliding_attention", "full_attention"})
        if other:
            unmodelled.append(f"layer_types ({', '.join(map(str, other))})")
        if window is None or "sliding_attention" not in layer_types:
            return None, []
        return int(window), [i for i, kind in enumerate(layer_types[:layers]) if kind != "sliding_attention"]
    if window is None:
        return None, []
    if model_type in _QWEN:  # the window is on only with use_sliding_window, from layer max_window_layers on
        if not cfg.get("use_sliding_window"):
            return None, []
        return int(window), list(range(min(int(cfg.get("max_window_layers") or 0), layers)))
    if model_type == "gemma2":  # sliding and global layers alternate, sliding first
        return int(window), list(range(1, layers, 2))
    if model_type in ("gemma3", "gemma3_text"):
        pattern = int(cfg.get("sliding_window_pattern") or 6)
        return int(window), [i for i in range(layers) if (i + 1) % pattern == 0]
    if model_type in _SLIDING_EVERYWHERE:
        return int(window), []
    unmodelled.append("sliding_window")
    return None, []


def hf_fields(config: dict[str, Any], name: str) -> dict[str, Any]:
    """``TransformerConfig`` fields from a Hugging Face ``config.json`` mapping (module table).

    Parameters
    ----------
    config
        The parsed ``config.json``.
    name
        Becomes the config's ``name`` and prefixes messages.

    Returns
    -------
    A mapping of ``TransformerConfig`` field names to values (shapes, biases, MoE, window; no
    step fields). Warns once with :class:`~tracekit.errors.ModelConfigWarning` naming every
    field of :data:`UNMODELLED_FIELDS` that is set, and a ``sliding_window`` or ``layer_types``
    the model cannot place; raises :class:`~tracekit.errors.TracekitError` on a config without
    the sizes of a transformer.
    """
    text = config.get("text_config")
    cfg = {**{k: v for k, v in config.items() if k != "text_config"}, **text} if isinstance(text, dict) else config
    model_type = str(cfg.get("model_type") or "").lower()
    hidden = _first(cfg, "hidden_size", "n_embd", "d_model")
    layers = _first(cfg, "num_hidden_layers", "n_layer", "num_layers")
    heads = _first(cfg, "num_attention_heads", "n_head")
    if hidden is None or layers is None or heads is None:
        raise TracekitError(f"{name}: not a transformer config.json (no hidden_size/num_hidden_layers/num_attention_heads)")
    hidden, layers, heads = int(hidden), int(layers), int(heads)
    kv_heads = _first(cfg, "num_key_value_heads", "num_kv_heads", "n_head_kv")
    if kv_heads is None and cfg.get("multi_query"):
        kv_heads = 1
    act = str(_first(cfg, "hidden_act", "hidden_activation", "activation_function") or "").lower()
    if model_type in _PLAIN_MLP:
        gated = False
    else:
        gated = model_type.startswith(_GATED_FAMILIES) or act in ("silu", "swiglu", "swish")
    ffn = int(_first(cfg, "intermediate_size", "n_inner", "ffn_dim") or 4 * hidden)
    experts = int(_first(cfg, "num_local_experts", "num_experts", "n_routed_experts") or 0)
    moe_ffn = cfg.get("moe_intermediate_size") if experts else None
    shared = int(cfg.get("shared_expert_intermediate_size") or 0) if experts else 0
    if experts and cfg.get("n_shared_experts"):
        shared += int(cfg["n_shared_experts"]) * int(moe_ffn or ffn)
    attention_bias = bool(cfg.get("attention_bias", model_type == "gpt_neox"))
    plain = model_type in ("gpt2", "gpt_neox")  # biases on every projection, LayerNorm with bias
    unmodelled = [key for key in UNMODELLED_FIELDS if _active(cfg.get(key))]
    window, full_layers = _sliding(cfg, model_type, layers, unmodelled)
    dtype = _first(cfg, "torch_dtype", "dtype")
    fields: dict[str, Any] = {
        "layers": layers, "hidden": hidden, "heads": heads, "kv_heads": int(kv_heads) if kv_heads is not None else heads,
        "head_dim": int(cfg["head_dim"]) if cfg.get("head_dim") is not None else None,
        "ffn_hidden": ffn, "vocab": int(cfg.get("vocab_size") or 0), "dtype": _dtype(dtype) if dtype else "bf16",
        "gated_mlp": gated, "experts": experts, "top_k": int(cfg.get("num_experts_per_tok") or 0) if experts else 0,
        "moe_ffn_hidden": int(moe_ffn) if moe_ffn is not None else None, "shared_ffn_hidden": shared,
        "dense_layers": _dense_layers(cfg, layers) if experts else [],
        "tie_embeddings": bool(cfg.get("tie_word_embeddings", model_type in _TIED_BY_DEFAULT)),
        "qkv_bias": plain or attention_bias or model_type in ("qwen2", "qwen2_moe"),
        "out_bias": plain or attention_bias, "mlp_bias": plain or bool(cfg.get("mlp_bias", False)),
        "norm_bias": plain, "norms_per_layer": 4 if model_type in ("gemma2", "gemma3", "gemma3_text") else 2,
        "qk_norm": model_type in ("qwen3", "qwen3_moe", "gemma3", "gemma3_text"),
        "position_embeddings": int(_first(cfg, "n_positions", "n_ctx") or 0) if model_type == "gpt2" else 0,
        "sliding_window": window, "full_attention_layers": full_layers, "name": name,
    }
    if unmodelled:
        msg = (f"model config {name!r}: fields not modelled, left out of its FLOPs, bytes and parameters: "
               f"{', '.join(unmodelled)} (docs/model.md)")
        warnings.warn(msg, ModelConfigWarning, stacklevel=3)
    return fields
