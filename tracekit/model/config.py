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


@dataclass(frozen=True)
class TransformerConfig:
    """A decoder-only transformer and the work of one step.

    Shapes: ``layers``, ``hidden`` (model width), ``heads``, ``kv_heads`` (grouped-query
    attention; = heads for multi-head), ``head_dim`` (width of one attention head; default
    ``hidden // heads``; Qwen3 and Gemma set it apart), ``ffn_hidden`` (MLP inner width of a
    dense layer), ``vocab``, ``gated_mlp`` (SwiGLU/GeGLU: gate, up and down projections; else up
    and down), ``tie_embeddings`` (the LM head is the embedding matrix: counted once).

    Mixture of experts: ``experts`` routed experts per MoE layer (0 = dense model), ``top_k``
    of them per token, each of inner width ``moe_ffn_hidden`` (default ``ffn_hidden``), plus
    always-active shared experts of total inner width ``shared_ffn_hidden`` (DeepSeek:
    ``n_shared_experts × moe_intermediate_size``; Qwen2-MoE: ``shared_expert_intermediate_size``)
    and a router of ``experts × hidden`` weights; ``dense_layers`` lists the layers (from 0)
    whose MLP is dense (``ffn_hidden``) instead (DeepSeek ``first_k_dense_replace``, Qwen-MoE
    ``mlp_only_layers``/``decoder_sparse_step``).

    Small parameters: ``qkv_bias``, ``out_bias``, ``mlp_bias`` (biases of the Q/K/V, attention
    output and MLP projections: GPT-2 has all three, Qwen2 the first), ``norm_bias`` (LayerNorm
    with a bias; RMSNorm has none), ``norms_per_layer`` (2; Gemma-2/3 have 4), ``qk_norm`` (an
    RMSNorm of ``head_dim`` on queries and keys, Qwen3), ``position_embeddings`` (rows of a
    learned position table, GPT-2: 1024; 0 for rotary). Attention span: ``sliding_window``
    (keys a query attends at most; None = all) in every layer but ``full_attention_layers``.

    Numbers: ``dtype`` of weights and activations (``bf16``, ``fp16``, ``fp8``, ``fp32``),
    ``kv_dtype`` (the KV cache's, default ``dtype``). The step: ``phase`` (``prefill``:
    ``batch`` sequences of ``prompt_len`` tokens; ``decode``: one new token for each of
    ``batch`` sequences attending to ``context_len`` tokens), ``tp``/``pp`` (tensor/pipeline
    parallel degrees).
    """

    layers: int
    hidden: int
    heads: int
    ffn_hidden: int
    vocab: int
    kv_heads: int | None = None
    head_dim: int | None = None
    dtype: str = "bf16"
    kv_dtype: str | None = None
    gated_mlp: bool = True
    experts: int = 0
    top_k: int = 0
    moe_ffn_hidden: int | None = None
    shared_ffn_hidden: int = 0
    dense_layers: tuple[int, ...] = ()
    tie_embeddings: bool = False
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    norm_bias: bool = False
    norms_per_layer: int = 2
    qk_norm: bool = False
    position_embeddings: int = 0
    sliding_window: int | None = None
    full_attention_layers: tuple[int, ...] = ()
    batch: int = 1
    prompt_len: int = 1
    context_len: int = 1
    phase: str = "decode"
    tp: int = 1
    pp: int = 1
    name: str = "model"

    def __post_init__(self) -> None:
        # YAML and JSON give lists; a frozen config keeps sorted tuples
        for key in ("dense_layers", "full_attention_layers"):
            object.__setattr__(self, key, tuple(sorted({int(i) for i in getattr(self, key) or ()})))
        problems = []
        if self.head_dim is None and self.hidden % self.heads:
            problems.append(f"hidden ({self.hidden}) is not a multiple of heads ({self.heads}); give head_dim")
        if self.heads % self.n_kv_heads:
            problems.append(f"heads ({self.heads}) is not a multiple of kv_heads ({self.n_kv_heads})")
        if self.phase not in ("prefill", "decode"):
            problems.append(f"phase {self.phase!r} is neither 'prefill' nor 'decode'")
        if self.dtype not in DTYPE_BYTES or (self.kv_dtype is not None and self.kv_dtype not in DTYPE_BYTES):
            problems.append(f"dtype must be one of {', '.join(DTYPE_BYTES)}")
        if self.layers % self.pp:
            problems.append(f"layers ({self.layers}) are not divisible by pp ({self.pp})")
        optional = [v for v in (self.head_dim, self.moe_ffn_hidden, self.sliding_window) if v is not None]
        sizes = [self.layers, self.hidden, self.heads, self.ffn_hidden, self.vocab, self.batch, self.tp, self.pp, *optional]
        if min(sizes) < 1 or min(self.shared_ffn_hidden, self.norms_per_layer, self.position_embeddings, self.context_len) < 0:
            problems.append("sizes must be positive")
        if self.experts and not 1 <= self.top_k <= self.experts:
            problems.append(f"top_k ({self.top_k}) must be between 1 and experts ({self.experts})")
        outside = [i for i in self.dense_layers + self.full_attention_layers if not 0 <= i < self.layers]
        if outside:
            problems.append(f"layer indices {outside} are outside 0..{self.layers - 1}")
        if problems:
            raise TracekitError(f"model config {self.name!r}: " + "; ".join(problems))

    @property
    def n_kv_heads(self) -> int:
        """Key/value heads (``kv_heads``, or ``heads`` for multi-head attention)."""
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def head_size(self) -> int:
        """Width of one attention head: ``head_dim``, or ``hidden // heads`` when not given."""
        return self.head_dim if self.head_dim is not None else self.hidden // self.heads

    @property
    def expert_ffn_hidden(self) -> int:
        """Inner width of one routed expert: ``moe_ffn_hidden``, or ``ffn_hidden``."""
        return self.moe_ffn_hidden if self.moe_ffn_hidden is not None else self.ffn_hidden

    def is_moe_layer(self, layer: int) -> bool:
        """Whether layer ``layer`` (from 0) has a mixture-of-experts MLP."""
        return self.experts > 0 and layer not in self.dense_layers

    def is_sliding_layer(self, layer: int) -> bool:
        """Whether layer ``layer`` (from 0) attends over at most ``sliding_window`` keys."""
        return self.sliding_window is not None and layer not in self.full_attention_layers

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


def _config_text(path: Path, what: str = "model config") -> str:
    """The text of config file ``path``; a missing file or one that is not UTF-8 text (a trace
    or report given as the config, say) is a :class:`TracekitError`."""
    if not path.is_file():
        raise TracekitError(f"{what} {path} does not exist; give a YAML file or a Hugging Face config.json")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        with open(path, "rb") as f:
            head = f.read(16)
        kind = "an SQLite database (an Nsight Systems export?)" if head.startswith(b"SQLite format 3") else "a binary file"
        hint = "; to compare a trace with the model, pass it with --trace" if "export" in kind or path.suffix in (
            ".nsys-rep", ".qdrep", ".ncu-rep") else ""
        raise TracekitError(f"{what} {path} is {kind}, not text; give a YAML file or a Hugging Face config.json{hint}") from None


def load_model(obj: Any, **overrides: Any) -> TransformerConfig:
    """A :class:`TransformerConfig` from itself, a mapping, a YAML file (the dataclass fields;
    ``hf_config: path/to/config.json`` may supply the shapes) or a Hugging Face ``config.json``;
    ``overrides`` replace fields (``batch=8``, ``phase="prefill"``).

    A Hugging Face config with fields that change the cost but are not modelled (attention
    logit soft-capping, multi-head latent attention …) gives one
    :class:`~tracekit.errors.ModelConfigWarning` naming them (:func:`tracekit.model.hf.hf_fields`).
    """
    from tracekit.model.hf import hf_fields, is_hf_config

    if isinstance(obj, TransformerConfig):
        return obj.with_(**overrides) if overrides else obj
    base = Path(".")
    if isinstance(obj, str | os.PathLike):
        path = Path(obj)
        text = _config_text(path)
        base = path.parent
        if path.suffix == ".json":
            data: dict[str, Any] = hf_fields(_json(text, path), path.stem)
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
        data = hf_fields(dict(obj), str(obj.get("_name_or_path", "model"))) if is_hf_config(obj) else dict(obj)
    else:
        raise TracekitError(f"model: expected a TransformerConfig, a mapping or a file, got {type(obj).__name__}")
    hf = data.pop("hf_config", None)
    if hf is not None:
        hf_path = (base / hf) if not Path(hf).is_absolute() else Path(hf)
        data = {**hf_fields(_json(_config_text(hf_path, "hf_config"), hf_path), hf_path.stem), **data}
    known = {f.name for f in fields(TransformerConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise TracekitError(f"model config: unknown field(s) {', '.join(unknown)}; valid: {', '.join(sorted(known))}")
    try:
        return TransformerConfig(**{**data, **overrides})
    except TypeError as exc:
        raise TracekitError(f"model config: {exc}") from None


def _json(text: str, path: Path) -> dict[str, Any]:
    try:
        loaded = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TracekitError(f"model config {path}: not valid JSON ({exc}); give a Hugging Face config.json") from None
    if not isinstance(loaded, dict):
        raise TracekitError(f"model config {path}: expected a JSON object of fields")
    return loaded
