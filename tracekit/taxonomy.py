"""Kernel families: one taxonomy for nsys and ncu kernel names (short, demangled, mangled).

A family is decided by the first rule, in order, whose regular expression matches the
kernel name (case-insensitive substring search, Rust ``regex`` syntax: no look-around). The
patterns look for identifiers, so the same rule fits a demangled name
(``void at::native::elementwise_kernel<…direct_copy_kernel_cuda…>``), a short name
(``elementwise_kernel``) and a mangled one (``_ZN2at6native18elementwise_kernel…``).
Users prepend their own rules with :func:`add_rule` or pass a rule list to :func:`classify`.

Families, in default rule order:

``communication``
    NCCL (``ncclDevKernel_*``, ``ncclKernel_*``), custom and symmetric-memory all-reduce,
    NVSHMEM, DeepEP, MSCCL++. First, so that an NCCL ``…Reduce…`` kernel is not a reduction.
Inductor kernels (``torch.compile``: ``triton_<kind>_fused_<ops>_<n>``)
    by their prefix: ``triton_tem_`` (templates: matmuls) → ``gemm``; ``triton_per_``/
    ``triton_red_`` → ``normalization`` or ``softmax`` when they fuse one, else ``reduction``;
    ``triton_poi_`` → ``copy`` when every fused op only moves data (``cat``, ``_to_copy``,
    ``clone``, ``index_copy``, views …: :data:`INDUCTOR_MOVE_OPS`), else ``elementwise``. Before
    the name-fragment rules below: a pointwise kernel named after the attention it surrounds
    is not attention.
``attention``
    flash / fmha / SDPA (cuDNN's ``*_sdpa_*`` and its backward helpers), paged and decode
    attention, FlashInfer, xFormers, KV-cache writes. Before GEMM: fused attention is built on
    cutlass.
``reduction`` (pooling only)
    ``*_pooling_*`` kernels, which TensorRT names ``xmma`` too.
``gemm``
    cuBLAS/cuBLASLt (``nvjet_*``, ``splitKreduce``), cutlass, ``xmma`` GEMM and implicit-GEMM
    convolutions, ``*gemm*``, ``matmul``, ``scaled_mm``.
``normalization``
    layer/RMS/batch/group/instance norm forward and backward (``GammaBetaBackward``).
``softmax``
    softmax and log-softmax.
``embedding``
    embedding, gather/scatter, index_select/index_put, rotary embeddings.
``copy``
    memcpy/memset kernels, fills, ``direct_copy`` (dtype casts, ``.contiguous()``), concat,
    transposes and permutations, TensorRT reformats.
``reduction``
    reductions, arg-max/min, scans, sorts, top-k, losses.
``elementwise``
    elementwise and activation kernels (``vectorized_elementwise_kernel``, SiLU, GELU,
    Triton pointwise), optimizer steps (``multi_tensor_apply``), ``axpy``. Last: its patterns
    are the loosest.
``other``
    no rule matched.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import polars as pl

FAMILIES: tuple[str, ...] = (
    "gemm",
    "attention",
    "normalization",
    "softmax",
    "elementwise",
    "reduction",
    "embedding",
    "communication",
    "copy",
    "other",
)


@dataclass(frozen=True)
class FamilyRule:
    """``pattern`` (a case-insensitive regular expression, searched anywhere) → ``family``."""

    family: str
    pattern: str


#: Communication kernels beyond NCCL (vLLM/SGLang custom all-reduce, DeepEP, NVSHMEM,
#: torch symmetric memory, MSCCL++). Shared with the NCCL analyses.
COMMUNICATION_PATTERNS: tuple[str, ...] = (
    r"nccl",
    r"cross_device_reduce",
    r"custom_?all_?reduce",
    r"all_?reduce|all_?gather|reduce_?scatter|all_?to_?all",
    r"deep_?ep|internode|intranode",
    r"nvshmem",
    r"symmetric_?memory|symm_?mem|one_?shot_all_reduce|two_?shot_all_reduce|multimem",
    r"mscclpp|msccl",
    r"peer_?copy|p2p_?copy",
)

#: Data-movement ops that Inductor names in its fused kernels (``triton_poi_fused__to_copy_cat_3``).
INDUCTOR_MOVE_OPS: tuple[str, ...] = (
    "_unsafe_view", "_to_copy", "index_copy", "index_put", "copy", "clone", "cat", "view", "transpose", "permute",
    "expand", "slice_scatter", "slice", "select_scatter", "select", "unsqueeze", "squeeze", "t", "reshape", "alias",
    "split_with_sizes", "split", "stack", "lift_fresh_copy", "zeros_like", "zeros", "fill", "full", "detach",
    "as_strided", "constant_pad_nd", "new_zeros", "empty",
)

#: Inductor's generated kernels (``triton_{poi,red,per,tem}_fused_<ops>_<n>``): the prefix says
#: what kind of kernel it is; the fused op names list everything it absorbed, so a pointwise
#: kernel that fuses a softmax's neighbours must not be taken for attention.
INDUCTOR_RULES: tuple[FamilyRule, ...] = (
    FamilyRule("copy", r"^triton_poi_fused_(?:(?:" + "|".join(INDUCTOR_MOVE_OPS) + r")_)+\d+$"),
    FamilyRule("gemm", r"^triton_tem_"),
    FamilyRule("normalization", r"^triton_(?:per|red)_fused_.*(?:rms_norm|layer_norm|group_norm|batch_norm|var_mean)"),
    FamilyRule("softmax", r"^triton_(?:per|red)_fused_.*softmax"),
    FamilyRule("reduction", r"^triton_(?:per|red)_"),
    FamilyRule("elementwise", r"^triton_poi_"),
)

DEFAULT_RULES: tuple[FamilyRule, ...] = (
    *(FamilyRule("communication", p) for p in COMMUNICATION_PATTERNS),
    *INDUCTOR_RULES,
    FamilyRule(
        "attention",
        r"flash|fmha|attention|attn|sdpa|mha_|paged_?attention|decode_?attention|flashinfer|"
        r"xformers|dot_do_o|convert_dq|reshape_and_cache|kv_?cache",
    ),
    FamilyRule("reduction", r"pooling"),
    FamilyRule(
        "gemm",
        r"gemm|nvjet|cutlass|xmma|cublas|wgmma|matmul|splitk|scaled_mm|implicit_?convolve|"
        r"conv2d|convolution|_fprop_|_dgrad_|_wgrad_|tensorop",
    ),
    FamilyRule(
        "normalization",
        r"layer_?norm|rms_?norm|batch_?norm|group_?norm|instance_?norm|gamma_?beta",
    ),
    FamilyRule("softmax", r"softmax"),
    FamilyRule(
        "embedding",
        r"embedding|gather|scatter|index_?select|index_?put|index_?add|indexing|take_along|"
        r"rotary|rope_",
    ),
    FamilyRule(
        "copy",
        r"memcpy|memset|copy_kernel|direct_copy|cat_?array|batched_?copy|copy_?vectorized|"
        r"transpose|permut|fill_?kernel|fillfunctor|zero_|reformat|contiguous|to_copy",
    ),
    FamilyRule(
        "reduction",
        r"reduce|reduction|argmax|argmin|cum_?sum|scan|topk|sort|radix|nll_loss|"
        r"cross_?entropy|_sum_|sum_kernel|mean_kernel|norm_kernel|max_kernel|min_kernel",
    ),
    FamilyRule(
        "elementwise",
        r"elementwise|vectorized|unrolled|pointwise|silu|gelu|relu|swiglu|geglu|"
        r"activation|act_and_mul|triton_poi|triton_|add_kernel|mul_kernel|binary|unary|fused_|"
        r"cast|multi_tensor_apply|adam|sgd|dropout|sigmoid|tanh|axpy|functor",
    ),
)

_user_rules: list[FamilyRule] = []


def add_rule(family: str, pattern: str) -> None:
    """Add a rule checked before the built-in ones (later calls are checked first).

    ``pattern`` is a case-insensitive regular expression in the syntax polars accepts (Rust
    ``regex``: no look-around or back-references); it is searched anywhere in the name.
    """
    _check_pattern(pattern)
    _user_rules.insert(0, FamilyRule(family, pattern))


def _check_pattern(pattern: str) -> None:
    re.compile(pattern)
    try:
        pl.select(pl.lit("x").str.contains(f"(?i){pattern}"))
    except pl.exceptions.ComputeError as exc:
        msg = f"kernel family pattern {pattern!r} is not valid polars regex syntax (no look-around): {exc}"
        raise ValueError(msg) from None


def reset_rules() -> None:
    """Forget the rules added with :func:`add_rule`."""
    _user_rules.clear()


def active_rules(extra: Iterable[FamilyRule] = ()) -> list[FamilyRule]:
    """Rules in the order they are tried: ``extra``, then user rules, then defaults."""
    return [*extra, *_user_rules, *DEFAULT_RULES]


def kernel_family(name: str | None, rules: Sequence[FamilyRule] | None = None) -> str:
    """Family of one kernel name (``"other"`` when no rule matches or the name is empty)."""
    if not name:
        return "other"
    for rule in rules if rules is not None else active_rules():
        if re.search(rule.pattern, name, flags=re.IGNORECASE):
            return rule.family
    return "other"


def family_expr(column: str | pl.Expr, rules: Sequence[FamilyRule] | None = None) -> pl.Expr:
    """A polars expression giving the family of each kernel name in ``column`` (Utf8)."""
    expr = pl.col(column) if isinstance(column, str) else column
    chosen = list(rules) if rules is not None else active_rules()
    result: pl.Expr = pl.lit("other")
    for rule in reversed(chosen):
        result = pl.when(expr.str.contains(f"(?i){rule.pattern}")).then(pl.lit(rule.family)).otherwise(result)
    return pl.when(expr.is_null()).then(pl.lit("other")).otherwise(result)


def classify(
    frame: pl.DataFrame, *, name_column: str = "name", rules: Sequence[FamilyRule] | None = None
) -> pl.DataFrame:
    """Return ``frame`` (same row order) with a ``family`` column computed from ``name_column``.

    Each distinct name is classified once, so this is cheap on million-row tables.
    """
    names = frame.select(pl.col(name_column).unique())
    mapping = names.with_columns(family_expr(name_column, rules).alias("family"))
    out = frame.drop("family") if "family" in frame.columns else frame
    return out.join(mapping, on=name_column, how="left", nulls_equal=True, maintain_order="left")
