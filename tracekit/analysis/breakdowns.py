"""Where GPU time goes by NVTX range: per range name, per path level, and a layer × sub-block
matrix (the data behind a layer heatmap).

Inputs are :func:`tracekit.analysis.attribution.attribute_nvtx` results: GPU operations with
``duration_ns``, ``nvtx_range``, ``nvtx_path``, ``nvtx_range_id`` and ``attribution``.
Shares are of the input's total GPU time (per ``rank`` when the input has one), so
unattributed work is visible as its own row.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from tracekit.analysis._frames import max_int, rank_keys
from tracekit.analysis.attribution import _nvtx_tree
from tracekit.analysis.layers import DEFAULT_LAYER_PATTERN, layer_of

__all__ = [
    "DEFAULT_LAYER_PATTERN",
    "layer_matrix",
    "layer_of",
    "level_breakdown",
    "range_breakdown",
]

_UNATTRIBUTED = "(none)"


def _aggregate(frame: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    kinds = "op_kind" in frame.columns
    aggs = [
        pl.col("duration_ns").sum().alias("gpu_time_ns"),
        pl.len().alias("ops"),
        (pl.col("op_kind") == "kernel").sum().alias("kernels") if kinds else pl.len().alias("kernels"),
        pl.col("duration_ns").mean().alias("mean_ns"),
    ]
    out = frame.group_by(keys).agg(aggs)
    rk = rank_keys(frame)
    total = pl.col("gpu_time_ns").sum().over(rk) if rk else pl.col("gpu_time_ns").sum()
    out = out.with_columns((pl.col("gpu_time_ns") / total).alias("share"))
    return out.with_columns(pl.col("ops").cast(pl.Int64), pl.col("kernels").cast(pl.Int64)).sort(
        [*rk, "gpu_time_ns"], descending=[*([False] * len(rk)), True]
    )


def range_breakdown(attributed: pl.DataFrame, *, by: str = "nvtx_range", extra: Sequence[str] = ()) -> pl.DataFrame:
    """GPU time, operation count and share per innermost range name or per full path.

    Parameters
    ----------
    attributed
        An ``attribute_nvtx`` result (``duration_ns``, ``by``; ``op_kind`` when stacked with
        :func:`tracekit.analysis.gpu_time.gpu_ops`).
    by
        ``"nvtx_range"`` (innermost range name, self time) or ``"nvtx_path"``.
    extra
        More grouping columns, e.g. ``["device_id"]``.

    Returns one row per (``rank``,) ``extra``, ``by`` value — ``"(none)"`` for unattributed
    work — with ``gpu_time_ns``, ``ops``, ``kernels``, ``mean_ns`` and ``share`` (0–1),
    largest first. Each operation counts once, in its innermost range.
    """
    if by not in ("nvtx_range", "nvtx_path"):
        msg = f"by must be 'nvtx_range' or 'nvtx_path', got {by!r}"
        raise ValueError(msg)
    keys = list(dict.fromkeys([*rank_keys(attributed), *extra, by]))  # "rank" may be given too
    frame = attributed.with_columns(pl.col(by).fill_null(_UNATTRIBUTED))
    return _aggregate(frame, keys)


def _ancestor_at(tree: pl.DataFrame, level: int) -> pl.DataFrame:
    """``_idx`` → ``_anc`` (index of the ancestor-or-self at ``level``; null above it)."""
    t = tree.select("_idx", "_parent_idx", "level").with_columns(
        pl.when(pl.col("level") >= level).then(pl.col("_idx")).alias("_anc")
    )
    max_level = max_int(tree["level"])
    for _ in range(max(0, max_level - level)):
        lvl = pl.col("level").gather(pl.col("_anc"))
        t = t.with_columns(
            pl.when(pl.col("_anc").is_not_null() & (lvl > level))
            .then(pl.col("_parent_idx").gather(pl.col("_anc")))
            .otherwise(pl.col("_anc"))
            .alias("_anc")
        )
    return t.select("_idx", "_anc")


def level_breakdown(attributed: pl.DataFrame, nvtx: pl.DataFrame, *, level: int = 0, extra: Sequence[str] = ()) -> pl.DataFrame:
    """GPU time per range at one nesting level, inner work included.

    ``level=0`` gives the outermost ranges (``step.3``), ``level=1`` their children
    (``layer.2``) and so on. An operation counts in the range at ``level`` on its path;
    operations whose path is shorter (or unattributed) go to ``"(none)"``.

    Inputs: an ``attribute_nvtx`` result and the ``nvtx`` table it was computed from.
    Returns (``rank``,) ``extra``, ``range`` (label), ``path`` (the range's path),
    ``gpu_time_ns``, ``ops``, ``kernels``, ``mean_ns``, ``share``. Instances of a name are
    summed (``step.3`` and ``step.4`` stay apart; every ``attn`` at level 2 sums into
    one ``range`` row per distinct path).
    """
    if level < 0:
        msg = f"level must be >= 0, got {level}"
        raise ValueError(msg)
    keys = rank_keys(attributed, nvtx)
    tree = _nvtx_tree(nvtx, keys)
    anc = _ancestor_at(tree, level)
    info = anc.join(tree.select("_idx", *keys, "range_id"), on="_idx").join(
        tree.select(pl.col("_idx").alias("_anc"), pl.col("label").alias("range"), pl.col("path")), on="_anc", how="left"
    ).select(*keys, pl.col("range_id").alias("nvtx_range_id"), "range", "path")
    frame = attributed.join(info, on=[*keys, "nvtx_range_id"], how="left", maintain_order="left").with_columns(
        pl.col("range").fill_null(_UNATTRIBUTED), pl.col("path").fill_null(_UNATTRIBUTED)
    )
    return _aggregate(frame, [*keys, *extra, "range", "path"])


def layer_matrix(
    attributed: pl.DataFrame,
    *,
    pattern: str = DEFAULT_LAYER_PATTERN,
    column: str = "nvtx_path",
    extra: Sequence[str] = (),
) -> pl.DataFrame:
    """GPU time per layer and sub-block: the data of a layer × block heatmap.

    Works with nested ranges (``step.0/layer.2/attn``) and the module paths of
    ``--annotate-torch`` (``Qwen3ForCausalLM/model/model.layers.2/model.layers.2.self_attn``:
    layer 2, block ``self_attn``): ``pattern`` is searched in ``column`` (the path by
    default; :func:`tracekit.analysis.layers.layer_of`). Group 1 of the pattern is the layer
    number, group 2 the sub-block; work directly inside a layer range has a null ``block``.

    Returns long rows (``rank``,) ``extra``, ``layer``, ``block``, ``gpu_time_ns``, ``ops``,
    ``kernels``, ``mean_ns``, ``share`` (of all GPU time in the input) sorted by layer and
    block. Pivot for a wide matrix:
    ``m.pivot(on="block", index="layer", values="gpu_time_ns")``.
    """
    layer, block = layer_of(pl.col(column), pattern)
    frame = attributed.with_columns(layer.alias("layer"), block.alias("block"))
    rk = rank_keys(attributed)
    total = frame.group_by(rk).agg(pl.col("duration_ns").sum().alias("_total")) if rk else None
    inside = frame.filter(pl.col("layer").is_not_null())
    kinds = "op_kind" in frame.columns
    out = inside.group_by(list(dict.fromkeys([*rk, *extra, "layer", "block"]))).agg(
        pl.col("duration_ns").sum().alias("gpu_time_ns"),
        pl.len().cast(pl.Int64).alias("ops"),
        ((pl.col("op_kind") == "kernel").sum() if kinds else pl.len()).cast(pl.Int64).alias("kernels"),
        pl.col("duration_ns").mean().alias("mean_ns"),
    )
    if total is not None:
        out = out.join(total, on=rk).with_columns((pl.col("gpu_time_ns") / pl.col("_total")).alias("share")).drop("_total")
    else:
        grand = frame["duration_ns"].sum() or 0
        out = out.with_columns((pl.col("gpu_time_ns") / grand if grand else pl.lit(None, pl.Float64)).alias("share"))
    return out.sort([*rk, *extra, "layer", "block"], nulls_last=False)
