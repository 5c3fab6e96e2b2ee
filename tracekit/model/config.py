"""A transformer described by a few numbers, from Python, YAML or a Hugging Face ``config.json``."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from tracekit.errors import TracekitError

__all__ = ["DTYPE_BYTES", "TransformerConfig", "load_model"]

#: Bytes per element of the weights and activations.
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5, "fp4": 0.5}
_DTYPE_ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
                  "float8": "fp8", "float8_e4m3fn": "fp8"}


@dataclass(frozen=True)
class TransformerConfig:
    """A decoder-only transformer and the work of one step.

    Shapes: ``layers``, ``hidden`` (model width), ``heads``, ``kv_heads`` (grouped-query
    attention; = heads for multi-head), ``ffn_hidden`` (MLP inner width), ``vocab``,
    ``gated_mlp`` (SwiGLU-style: gate, up and down projections; else up and down),
    ``experts``/``top_k`` (MoE MLP; 0 = dense), ``tie_embeddings``. Numbers: ``dtype`` of
    weights and activations (``bf16``, ``fp16``, ``fp8``, ``fp32``), ``kv_dtype`` (the KV
    cache's, default ``dtype``). The step: ``phase`` (``prefill``: ``batch`` sequences of
    ``prompt_len`` tokens; ``decode``: one new token for each of ``batch`` sequences attending
    to ``context_len`` tokens), ``tp``/``pp`` (tensor/pipeline parallel degrees).
    """

    layers: int
    hidden: int
    heads: int
    ffn_hidden: int
    vocab: int
    kv_heads: int | None = None
    dtype: str = "bf16"
    kv_dtype: str | None = None
    gated_mlp: bool = True
    experts: int = 0
    top_k: int = 0
    tie_embeddings: bool = False
    batch: int = 1
    prompt_len: int = 1
    context_len: int = 1
    phase: str = "decode"
    tp: int = 1
    pp: int = 1
    name: str = "model"

    def __post_init__(self) -> None:
        problems = []
        if self.hidden % self.heads:
            problems.append(f"hidden ({self.hidden}) is not a multiple of heads ({self.heads})")
        if self.heads % self.n_kv_heads:
            problems.append(f"heads ({self.heads}) is not a multiple of kv_heads ({self.n_kv_heads})")
        if self.phase not in ("prefill", "decode"):
            problems.append(f"phase {self.phase!r} is neither 'prefill' nor 'decode'")
        if self.dtype not in DTYPE_BYTES or (self.kv_dtype is not None and self.kv_dtype not in DTYPE_BYTES):
            problems.append(f"dtype must be one of {', '.join(DTYPE_BYTES)}")
        if self.layers % self.pp:
            problems.append(f"layers ({self.layers}) are not divisible by pp ({self.pp})")
        if min(self.layers, self.hidden, self.heads, self.ffn_hidden, self.vocab, self.batch, self.tp, self.pp) < 1:
            problems.append("sizes must be positive")
        if problems:
            raise TracekitError(f"model config {self.name!r}: " + "; ".join(problems))

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def bytes_per_element(self) -> float:
        return float(DTYPE_BYTES[self.dtype])

    @property
    def kv_bytes_per_element(self) -> float:
        return float(DTYPE_BYTES[self.kv_dtype or self.dtype])

    def with_(self, **changes: Any) -> TransformerConfig:
        """A copy with fields changed (``cfg.with_(phase="prefill", batch=8)``)."""
        return replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _dtype(value: Any) -> str:
    text = str(value).lower().replace("torch.", "")
    return _DTYPE_ALIASES.get(text, text)


def _from_hf(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    """Field names of Llama/Mistral/Qwen2/Mixtral (``num_hidden_layers`` …), GPT-2 (``n_layer``)
    and GPT-NeoX configs."""
    get = cfg.get
    hidden = get("hidden_size", get("n_embd", get("d_model")))
    layers = get("num_hidden_layers", get("n_layer", get("num_layers")))
    heads = get("num_attention_heads", get("n_head"))
    if hidden is None or layers is None or heads is None:
        raise TracekitError(f"{name}: not a transformer config.json (no hidden_size/num_hidden_layers/num_attention_heads)")
    act = str(get("hidden_act", get("activation_function", ""))).lower()
    gated = act in ("silu", "swiglu", "swish") or "llama" in str(get("model_type", "")).lower()
    if get("model_type") in ("gpt2", "gpt_neox"):
        gated = False
    ffn = get("intermediate_size", get("n_inner")) or 4 * hidden
    return {
        "layers": int(layers), "hidden": int(hidden), "heads": int(heads),
        "kv_heads": int(get("num_key_value_heads", heads) or heads), "ffn_hidden": int(ffn),
        "vocab": int(get("vocab_size") or 0), "dtype": _dtype(get("torch_dtype", "bf16")) if get("torch_dtype") else "bf16",
        "gated_mlp": gated, "experts": int(get("num_local_experts", get("num_experts", 0)) or 0),
        "top_k": int(get("num_experts_per_tok", 0) or 0),
        "tie_embeddings": bool(get("tie_word_embeddings", get("model_type") == "gpt2")), "name": name,
    }


def load_model(obj: Any, **overrides: Any) -> TransformerConfig:
    """A :class:`TransformerConfig` from itself, a mapping, a YAML file (the dataclass fields;
    ``hf_config: path/to/config.json`` may supply the shapes) or a Hugging Face ``config.json``;
    ``overrides`` replace fields (``batch=8``, ``phase="prefill"``)."""
    if isinstance(obj, TransformerConfig):
        return obj.with_(**overrides) if overrides else obj
    base = Path(".")
    if isinstance(obj, str | os.PathLike):
        path = Path(obj)
        if not path.is_file():
            raise TracekitError(f"model config {path} does not exist; give a YAML file or a Hugging Face config.json")
        base = path.parent
        text = path.read_text()
        if path.suffix == ".json":
            data: dict[str, Any] = _from_hf(json.loads(text), path.stem)
        else:
            import yaml

            try:
                loaded = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                raise TracekitError(f"model config {path}: not valid YAML ({str(exc).splitlines()[0]})") from None
            if not isinstance(loaded, dict):
                raise TracekitError(f"model config {path}: expected a mapping of fields")
            data = dict(loaded)
            data.setdefault("name", path.stem)
    elif isinstance(obj, dict):
        hf_keys = {"hidden_size", "num_hidden_layers", "n_layer", "n_embd"}
        data = _from_hf(dict(obj), str(obj.get("_name_or_path", "model"))) if hf_keys & set(obj) else dict(obj)
    else:
        raise TracekitError(f"model: expected a TransformerConfig, a mapping or a file, got {type(obj).__name__}")
    hf = data.pop("hf_config", None)
    if hf is not None:
        hf_path = (base / hf) if not Path(hf).is_absolute() else Path(hf)
        data = {**_from_hf(json.loads(hf_path.read_text()), hf_path.stem), **data}
    known = {f.name for f in fields(TransformerConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise TracekitError(f"model config: unknown field(s) {', '.join(unknown)}; valid: {', '.join(sorted(known))}")
    try:
        return TransformerConfig(**{**data, **overrides})
    except TypeError as exc:
        raise TracekitError(f"model config: {exc}") from None
