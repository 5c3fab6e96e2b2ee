"""Two runs compared: totals per kernel / NVTX range, and per-step statistics with a verdict.

Pure functions over tracekit's tables (no widgets, no plotting): the Compare widget, the
``tracekit diff`` command and :func:`tracekit.diff` are built on them.

**The verdict** (:func:`compare_per_step`). Each side gives, per steady step, the GPU time of
every key (a kernel name, a family, an NVTX range, or a step metric; a key absent from a step
counts 0). With ``n_a``, ``n_b`` ≥ 2 steps per side, ``delta`` = mean_b − mean_a is
significant when ``|delta| > k · sqrt(sd_a²/n_a + sd_b²/n_b)`` (Welch's standard error,
``k`` = 3 by default: step-to-step noise) **and** ``|delta| / mean_a ≥ min_effect`` (2 %):
``slower`` or ``faster``, else ``no change``. With fewer steps the spread is unknown and a
fixed relative threshold ``fixed`` (5 %) decides; ``noise_basis`` says which. The verdict uses
per-step means, so two runs with different step counts compare fairly; totals are reported too.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from tracekit.analysis.families import with_family

__all__ = ["compare_kernels", "compare_per_step", "compare_ranges", "compare_step_stats", "kernel_totals", "per_step_stats"]


def kernel_totals(kernels: pl.DataFrame, *, by: str = "short_name") -> pl.DataFrame:
    """Per kernel name: ``name``, ``family``, ``instances``, ``total_ns`` (ns), largest first."""
    k = with_family(kernels)
    col = by if by in k.columns else "name"
    return k.group_by(pl.col(col).alias("name")).agg(
        pl.col("family").first(), pl.len().cast(pl.Int64).alias("instances"), pl.col("duration_ns").sum().alias("total_ns")
    ).sort("total_ns", "name", descending=[True, False])


def compare_kernels(a: pl.DataFrame, b: pl.DataFrame, *, by: str = "short_name") -> pl.DataFrame:
    """GPU time per kernel name in two kernel tables, with the difference.

    Returns ``name``, ``family``, ``instances_a``, ``instances_b``, ``total_a_ns``,
    ``total_b_ns`` (Int64, 0 when absent), ``delta_ns`` (b − a), ``ratio`` (b / a, null when a
    is 0), sorted by the larger absolute delta first.
    """
    ta = kernel_totals(a, by=by).rename({"instances": "instances_a", "total_ns": "total_a_ns"})
    tb = kernel_totals(b, by=by).rename({"family": "_fb", "instances": "instances_b", "total_ns": "total_b_ns"})
    return (
        ta.join(tb, on="name", how="full", coalesce=True)
        .with_columns(
            pl.coalesce("family", "_fb").alias("family"),
            *[pl.col(c).fill_null(0) for c in ("instances_a", "instances_b", "total_a_ns", "total_b_ns")],
        )
        .with_columns(
            (pl.col("total_b_ns") - pl.col("total_a_ns")).alias("delta_ns"),
            pl.when(pl.col("total_a_ns") > 0).then(pl.col("total_b_ns") / pl.col("total_a_ns")).alias("ratio"),
        )
        .sort(pl.col("delta_ns").abs(), "name", descending=[True, False])
        .select("name", "family", "instances_a", "instances_b", "total_a_ns", "total_b_ns", "delta_ns", "ratio")
    )


def compare_ranges(a: pl.DataFrame, b: pl.DataFrame) -> pl.DataFrame:
    """Total CPU duration per NVTX range name in two ``nvtx`` tables, with the difference.

    Only closed ranges count (marks and open ranges are left out); NCCL's own ranges keep their
    ``domain:`` prefix. Returns ``range``, ``count_a``, ``count_b``, ``total_a_ns``,
    ``total_b_ns``, ``delta_ns``, ``ratio``, sorted by absolute delta.
    """

    def totals(nvtx: pl.DataFrame, suffix: str) -> pl.DataFrame:
        label = (
            pl.when(pl.col("domain").is_not_null()).then(pl.concat_str(pl.col("domain"), pl.lit(":"), pl.col("name")))
            .otherwise(pl.col("name"))
            if "domain" in nvtx.columns else pl.col("name")
        )
        closed = nvtx.filter(pl.col("end_ns").is_not_null() & pl.col("name").is_not_null() & (pl.col("end_ns") > pl.col("start_ns")))
        return closed.group_by(label.alias("range")).agg(
            pl.len().cast(pl.Int64).alias(f"count_{suffix}"),
            (pl.col("end_ns") - pl.col("start_ns")).sum().alias(f"total_{suffix}_ns"),
        )

    return (
        totals(a, "a").join(totals(b, "b"), on="range", how="full", coalesce=True)
        .with_columns(*[pl.col(c).fill_null(0) for c in ("count_a", "count_b", "total_a_ns", "total_b_ns")])
        .with_columns(
            (pl.col("total_b_ns") - pl.col("total_a_ns")).alias("delta_ns"),
            pl.when(pl.col("total_a_ns") > 0).then(pl.col("total_b_ns") / pl.col("total_a_ns")).alias("ratio"),
        )
        .sort(pl.col("delta_ns").abs(), "range", descending=[True, False])
    )


def per_step_stats(frame: pl.DataFrame, steps: Sequence[int], suffix: str) -> pl.DataFrame:
    """Per key of one run: ``key``, ``mean_<suffix>``, ``sd_<suffix>`` (sample) and
    ``total_<suffix>`` of ``value`` over ``steps`` (a key absent from a step counts 0), in the
    unit of ``value``. ``frame``: ``step`` (Int64), ``key``, ``value`` (see
    :func:`compare_per_step`); one run's share of it, so that two runs need not be held at once
    (:func:`compare_step_stats` puts two together)."""
    grid = frame.select("key").unique().join(pl.DataFrame({"step": list(steps)}, schema={"step": pl.Int64}), how="cross")
    full = grid.join(frame.group_by("key", "step").agg(pl.col("value").sum()), on=["key", "step"], how="left").with_columns(
        pl.col("value").fill_null(0)
    )
    return full.group_by("key").agg(
        pl.col("value").mean().alias(f"mean_{suffix}"), pl.col("value").std().alias(f"sd_{suffix}"),
        pl.col("value").sum().alias(f"total_{suffix}"),
    )


def compare_per_step(
    a: pl.DataFrame,
    b: pl.DataFrame,
    steps_a: Sequence[int],
    steps_b: Sequence[int],
    *,
    k: float = 3.0,
    min_effect: float = 0.02,
    fixed: float = 0.05,
) -> pl.DataFrame:
    """Per-step comparison of two runs (see the module doc for the statistic).

    Parameters
    ----------
    a, b
        Long frames ``step`` (Int64), ``key`` (str), ``value`` (ns, or any additive quantity)
        of each run's steady steps.
    steps_a, steps_b
        The steps of each run (so that a key absent from a step counts as 0 there).

    Returns
    -------
    One row per key: ``key``, ``steps_a``, ``steps_b``, ``mean_a``, ``mean_b`` (per step),
    ``sd_a``, ``sd_b``, ``total_a``, ``total_b``, ``delta`` (mean_b − mean_a), ``delta_pct``
    (delta / mean_a, null when mean_a is 0), ``noise`` (Welch standard error, null with fewer
    than 2 steps), ``noise_basis`` (``"steps"`` or ``"fixed"``), ``verdict`` (``slower``,
    ``faster``, ``no change``); largest |delta| first.
    """
    return compare_step_stats(per_step_stats(a, steps_a, "a"), per_step_stats(b, steps_b, "b"), len(steps_a), len(steps_b),
                              k=k, min_effect=min_effect, fixed=fixed)


def compare_step_stats(
    sa: pl.DataFrame,
    sb: pl.DataFrame,
    na: int,
    nb: int,
    *,
    k: float = 3.0,
    min_effect: float = 0.02,
    fixed: float = 0.05,
) -> pl.DataFrame:
    """:func:`compare_per_step` of two runs' :func:`per_step_stats` (suffixes ``a`` and
    ``b``) over ``na`` and ``nb`` steps: the same columns and rows."""
    out = sa.join(sb, on="key", how="full", coalesce=True).with_columns(
        *[pl.col(c).fill_null(0.0) for c in ("mean_a", "mean_b", "total_a", "total_b")],
        pl.lit(na, pl.Int64).alias("steps_a"), pl.lit(nb, pl.Int64).alias("steps_b"),
    )
    with_noise = na >= 2 and nb >= 2
    noise = ((pl.col("sd_a").fill_null(0) ** 2) / max(na, 1) + (pl.col("sd_b").fill_null(0) ** 2) / max(nb, 1)).sqrt()
    out = out.with_columns(
        (pl.col("mean_b") - pl.col("mean_a")).alias("delta"),
        pl.when(pl.col("mean_a") > 0).then((pl.col("mean_b") - pl.col("mean_a")) / pl.col("mean_a")).alias("delta_pct"),
        (noise if with_noise else pl.lit(None, pl.Float64)).alias("noise"),
        pl.lit("steps" if with_noise else "fixed").alias("noise_basis"),
    )
    rel = pl.col("delta_pct").abs().fill_null(float("inf"))  # a key new in b: any delta is relative ∞
    if with_noise:
        significant = (pl.col("delta").abs() > k * pl.col("noise")) & (rel >= min_effect)
    else:
        significant = rel >= fixed
    significant = significant & (pl.col("delta") != 0)
    out = out.with_columns(
        pl.when(significant & (pl.col("delta") > 0)).then(pl.lit("slower"))
        .when(significant & (pl.col("delta") < 0)).then(pl.lit("faster"))
        .otherwise(pl.lit("no change")).alias("verdict")
    )
    return out.select(
        "key", "steps_a", "steps_b", "mean_a", "mean_b", "sd_a", "sd_b", "total_a", "total_b", "delta", "delta_pct",
        "noise", "noise_basis", "verdict",
    ).sort(pl.col("delta").abs(), "key", descending=[True, False])
