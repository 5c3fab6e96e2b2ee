"""GPU time per kernel family (GEMM, attention, normalization …; see :mod:`tracekit.taxonomy`)."""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from tracekit.analysis._frames import rank_keys
from tracekit.taxonomy import FamilyRule, classify

__all__ = ["family_breakdown", "with_family"]


def with_family(
    kernels: pl.DataFrame, *, name_column: str = "name", rules: Sequence[FamilyRule] | None = None
) -> pl.DataFrame:
    """``kernels`` (same order) with a ``family`` column; memcpy/memset rows of a
    :func:`~tracekit.analysis.gpu_time.gpu_ops` frame (``op_kind``) are ``copy``."""
    out = classify(kernels, name_column=name_column, rules=rules)
    if "op_kind" in out.columns:
        out = out.with_columns(
            pl.when(pl.col("op_kind").is_in(["memcpy", "memset"])).then(pl.lit("copy")).otherwise(pl.col("family")).alias("family")
        )
    return out


def family_breakdown(
    kernels: pl.DataFrame,
    *,
    name_column: str = "name",
    rules: Sequence[FamilyRule] | None = None,
    by: Sequence[str] = (),
) -> pl.DataFrame:
    """GPU time, count and share per kernel family.

    Input: ``kernels`` (or ``gpu_ops``) with ``duration_ns`` and ``name_column``; ``rank``
    when present; ``by`` adds grouping columns (e.g. ``["device_id"]``).

    Returns (``rank``,) ``by``, ``family``, ``gpu_time_ns``, ``kernels`` (rows),
    ``distinct_names``, ``share`` (of the group's GPU time, 0–1), largest first.
    """
    rk = rank_keys(kernels)
    frame = with_family(kernels, name_column=name_column, rules=rules)
    keys = list(dict.fromkeys([*rk, *by]))  # "rank" may be given too
    out = frame.group_by([*keys, "family"]).agg(
        pl.col("duration_ns").sum().alias("gpu_time_ns"),
        pl.len().cast(pl.Int64).alias("kernels"),
        pl.col(name_column).n_unique().cast(pl.Int64).alias("distinct_names"),
    )
    total = pl.col("gpu_time_ns").sum().over(keys) if keys else pl.col("gpu_time_ns").sum()
    out = out.with_columns((pl.col("gpu_time_ns") / total).alias("share"))
    return out.sort([*keys, "gpu_time_ns"], descending=[*([False] * len(keys)), True])
