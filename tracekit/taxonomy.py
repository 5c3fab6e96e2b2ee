"""Kernel families: one taxonomy for nsys and ncu kernel names (short, demangled, mangled).

A family is decided by the first rule, in order, whose regular expression matches the
kernel name (case-insensitive). Users prepend their own rules with :func:`add_rule` or pass
a rule list to :func:`classify`. Families, in default rule order:

``communication``, ``attention``, ``gemm``, ``normalization``, ``softmax``,
``embedding``, ``reduction``, ``copy``, ``elementwise``, ``other``.

Communication is checked first so that an NCCL kernel with ``Reduce`` in its name is not
a reduction, attention before GEMM so that fused attention kernels built on cutlass are
attention, and elementwise last because its patterns are the loosest.
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
    """``pattern`` (a case-insensitive regular expression) → ``family``."""

    family: str
    pattern: str


#: Communication kernels beyond NCCL (vLLM/SGLang custom all-reduce, DeepEP, NVSHMEM,
#: torch symmetric memory, MSCCL++). Shared with the NCCL analyses.
COMMUNICATION_PATTERNS: tuple[str, ...] = (
    r"nccl",
    r"cross_device_reduce",
    r"custom_?all_?reduce",
    r"all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|alltoall",
    r"deep_?ep|internode|intranode",
    r"nvshmem",
    r"symm_?mem|one_shot_all_reduce|two_shot_all_reduce|multimem",
    r"mscclpp|msccl",
    r"\bpeer_?copy|p2p_?copy",
)

DEFAULT_RULES: tuple[FamilyRule, ...] = (
    *(FamilyRule("communication", p) for p in COMMUNICATION_PATTERNS),
    FamilyRule(
        "attention",
        r"flash|fmha|attention|attn|sdpa|mha_|paged_?attention|decode_?attention|"
        r"flashinfer|xformers|efficient_attention|cudnn_?.*mha|_fwd_kernel.*(?:q|kv)",
    ),
    FamilyRule(
        "gemm",
        r"gemm|nvjet|cutlass|xmma|cublas|sgemm|hgemm|dgemm|igemm|wgmma|gmma|"
        r"matmul|_mm_|sm\d+_xmma|ampere_.*(?:h|s|bf16)\d*|volta_.*gemm|turing_.*gemm|"
        r"splitkreduce|splitk|cudnn.*conv|implicit_convolve|conv2d|convolution|scaled_mm|fp8_gemm",
    ),
    FamilyRule("normalization", r"norm(?!al_)|rmsnorm|layernorm|layer_norm|rms_norm|batch_norm|group_norm"),
    FamilyRule("softmax", r"softmax"),
    FamilyRule(
        "embedding",
        r"embedding|gather|scatter|index_select|indexselect|index_put|take_along|"
        r"rotary|rope",
    ),
    FamilyRule(
        "reduction",
        r"reduce|reduction|argmax|argmin|\bsum\b|_sum|mean|cumsum|scan|topk|sort|radix|max_kernel|norm_kernel",
    ),
    FamilyRule("copy", r"memcpy|memset|copy_kernel|direct_copy|catarray|cat_?kernel|transpose|fill_kernel|zero_"),
    FamilyRule(
        "elementwise",
        r"elementwise|vectorized|unrolled_elementwise|pointwise|silu|gelu|relu|swiglu|"
        r"activation|act_and_mul|triton_poi|add_kernel|mul_kernel|binary|unary|"
        r"fused_|triton_|cast|multi_tensor_apply|adam|sgd|copy",
    ),
)

_user_rules: list[FamilyRule] = []


def add_rule(family: str, pattern: str) -> None:
    """Add a rule checked before the built-in ones (later calls are checked first)."""
    re.compile(pattern)
    _user_rules.insert(0, FamilyRule(family, pattern))


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
        result = (
            pl.when(expr.str.contains(f"(?i){rule.pattern}")).then(pl.lit(rule.family)).otherwise(result)
        )
    return result


def classify(
    frame: pl.DataFrame, *, name_column: str = "name", rules: Sequence[FamilyRule] | None = None
) -> pl.DataFrame:
    """Return ``frame`` with a ``family`` column computed from ``name_column``.

    Each distinct name is classified once, so this is cheap on million-row tables.
    """
    names = frame.select(pl.col(name_column).unique())
    mapping = names.with_columns(family_expr(name_column, rules).alias("family"))
    return frame.join(mapping, on=name_column, how="left", nulls_equal=True)
