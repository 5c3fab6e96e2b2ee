"""PyTorch operators from NVTX: latency of every torch op in every layer, without touching
the model.

``torch.autograd.profiler.emit_nvtx(record_shapes=True)`` (or nsys ``--pytorch=
autograd-shapes-nvtx``) wraps every operator in an NVTX range named like
``aten::linear, seq = 144, op_id = 25, sizes = [[4, 64, 1024], [3072, 1024], []],
input_op_ids = [...]``. Backward work runs on autograd's thread as
``autograd::engine::evaluate_function: MmBackward0`` > ``MmBackward0, seq = 278, …`` >
``aten::mm, …``; the ``seq`` of a backward node is the ``seq`` of the forward operator that
created it, which links backward work to the forward op's place in the model (its layer).

An operator *instance* is one such range. Its GPU time is the time of the kernels, memcpys and
memsets launched inside it (nested operators included); its *self* GPU time counts only work
whose innermost operator range it is. CPU time is the range's duration; self CPU time
subtracts the durations of nested operator ranges.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from tracekit.analysis._frames import max_int, rank_keys
from tracekit.analysis.attribution import _nvtx_tree, enclosing_ranges
from tracekit.analysis.breakdowns import DEFAULT_LAYER_PATTERN, layer_of

__all__ = [
    "TORCH_OP_PATTERN",
    "link_backward",
    "op_layer_matrix",
    "parse_torch_op",
    "torch_op_summary",
    "torch_ops",
]

#: Names of operator ranges: ``ns::op`` (``aten::mm``, ``c10d::allreduce_``), autograd nodes
#: (``MmBackward0``, ``torch::autograd::AccumulateGrad``) and anything with emit_nvtx's
#: ``, seq = `` / ``, op_id = `` suffix.
TORCH_OP_PATTERN = r"^[A-Za-z_][\w.]*::[\w.]+(?:,|$)|^\w+Backward\d*(?:,|$)|^autograd::engine::evaluate_function: |, (?:seq|op_id) = \d+"

_BACKWARD_NODE = r"^\w+Backward\d*$|^autograd::engine::evaluate_function: "


def parse_torch_op(name: pl.Expr) -> list[pl.Expr]:
    """Expressions parsing an emit_nvtx range name into ``op``, ``seq``, ``op_id`` and
    ``input_shapes`` (the ``sizes = [...]`` text, null without ``record_shapes``)."""
    return [
        name.str.extract(r"^([^,]+)", 1).str.strip_chars().alias("op"),
        name.str.extract(r", seq = (\d+)", 1).cast(pl.Int64).alias("seq"),
        name.str.extract(r"op_id = (\d+)", 1).cast(pl.Int64).alias("op_id"),
        name.str.extract(r"sizes = (\[.*?\])(?:, input_op_ids|$)", 1).alias("input_shapes"),
    ]


def _op_instances(nvtx: pl.DataFrame, keys: list[str], pattern: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(tree, operator instances with tree indices)."""
    tree = _nvtx_tree(nvtx, keys)
    is_op = pl.col("name").str.contains(pattern).fill_null(False)
    t = tree.with_columns(is_op.alias("_is_op"), *parse_torch_op(pl.col("name")))
    t = t.with_columns(pl.col("op").str.contains(_BACKWARD_NODE).fill_null(False).alias("_bwd_node"))
    # propagate down the tree: number of operator ancestors, the backward node above, and
    # whether a backward node is an ancestor (levels run parents before children)
    t = t.with_columns(
        pl.lit(0, pl.Int64).alias("torch_level"),
        pl.when(pl.col("_bwd_node") & pl.col("seq").is_not_null()).then(pl.col("seq")).alias("_bseq"),
        pl.col("_bwd_node").alias("_in_bwd"),
    )
    for level in range(1, max_int(t["level"]) + 1):
        par = pl.col("_parent_idx")
        at = pl.col("level") == level
        t = t.with_columns(
            pl.when(at).then(pl.col("torch_level").gather(par) + pl.col("_is_op").gather(par).cast(pl.Int64)).otherwise(pl.col("torch_level")).alias("torch_level"),
            pl.when(at & pl.col("_bseq").is_null()).then(pl.col("_bseq").gather(par)).otherwise(pl.col("_bseq")).alias("_bseq"),
            pl.when(at).then(pl.col("_in_bwd") | pl.col("_in_bwd").gather(par)).otherwise(pl.col("_in_bwd")).alias("_in_bwd"),
        )
    # an evaluate_function wrapper takes the seq of its backward node child
    child_seq = (
        t.filter(pl.col("_bwd_node") & pl.col("seq").is_not_null() & pl.col("_parent_idx").is_not_null())
        .group_by("_parent_idx").agg(pl.col("seq").first().alias("_cseq"))
        .rename({"_parent_idx": "_idx"})
    )
    t = t.join(child_seq, on="_idx", how="left", maintain_order="left").with_columns(
        pl.coalesce("_bseq", "_cseq").alias("_bseq")
    ).drop("_cseq")
    # self CPU time: minus the nested operator ranges directly below
    child_cpu = (
        t.filter(pl.col("_is_op") & pl.col("_parent_idx").is_not_null())
        .group_by("_parent_idx").agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("_child_ns"))
        .rename({"_parent_idx": "_idx"})
    )
    t = t.join(child_cpu, on="_idx", how="left", maintain_order="left")
    return tree, t


def torch_ops(
    ops_with_launch: pl.DataFrame,
    nvtx: pl.DataFrame,
    *,
    pattern: str = TORCH_OP_PATTERN,
    layer_pattern: str = DEFAULT_LAYER_PATTERN,
) -> pl.DataFrame:
    """One row per PyTorch operator instance with its CPU and GPU time.

    Parameters
    ----------
    ops_with_launch
        Kernels (or :func:`~tracekit.analysis.gpu_time.gpu_ops`) passed through
        :func:`~tracekit.analysis.attribution.launch_info` (``duration_ns``,
        ``global_tid``, ``api_start_ns``, ``api_end_ns``; ``op_kind`` when present).
    nvtx
        The whole ``nvtx`` table.
    pattern
        Regular expression selecting operator range names (:data:`TORCH_OP_PATTERN`).
    layer_pattern
        How to read the layer and block from a path (see
        :func:`~tracekit.analysis.breakdowns.layer_matrix`).

    Returns
    -------
    (``rank``,) ``range_id``, ``pid``, ``tid``, ``op`` (``aten::linear``, ``MmBackward0``),
    ``seq``, ``op_id``, ``input_shapes`` (``[[4, 64, 1024], [3072, 1024], []]`` or null),
    ``direction`` (``backward`` inside autograd's backward nodes, else ``forward``),
    ``torch_level`` (0 = not nested in another operator), ``start_ns``, ``end_ns``,
    ``cpu_ns``, ``cpu_self_ns``, ``gpu_ns`` (work launched inside, nested operators
    included), ``gpu_self_ns``, ``kernels`` (launched inside), ``path`` (NVTX path),
    ``forward_path`` (for backward work: the path of the forward operator with the same
    ``seq`` in the same process; else ``path``), ``layer`` and ``block`` (read from
    ``forward_path``).
    """
    keys = rank_keys(ops_with_launch, nvtx)
    _, t = _op_instances(nvtx, keys, pattern)
    inst = t.filter(pl.col("_is_op"))
    ops = ops_with_launch.with_row_index("_op").select(
        pl.col("_op").cast(pl.Int64).alias("op_index"), "duration_ns",
        ((pl.col("op_kind") == "kernel") if "op_kind" in ops_with_launch.columns else pl.lit(True)).alias("_is_kernel"),
    )
    pairs = enclosing_ranges(ops_with_launch, nvtx).join(ops, on="op_index")
    pairs = pairs.join(inst.select(*keys, "range_id", "level"), on=[*keys, "range_id"], how="semi")
    incl = pairs.group_by([*keys, "range_id"]).agg(
        pl.col("duration_ns").sum().alias("gpu_ns"), pl.col("_is_kernel").sum().cast(pl.Int64).alias("kernels")
    )
    innermost = pairs.sort("level", descending=True).unique(subset="op_index", keep="first")
    self_ = innermost.group_by([*keys, "range_id"]).agg(pl.col("duration_ns").sum().alias("gpu_self_ns"))
    inst = inst.join(incl, on=[*keys, "range_id"], how="left", maintain_order="left").join(
        self_, on=[*keys, "range_id"], how="left", maintain_order="left"
    )
    # forward operator of each backward seq: the innermost forward range with that seq
    fwd = (
        inst.filter(~pl.col("_in_bwd") & pl.col("seq").is_not_null())
        .sort("level", descending=True)
        .unique(subset=[*keys, "pid", "seq"], keep="first")
        .select(*keys, "pid", pl.col("seq").alias("_bseq"), pl.col("path").alias("_fpath"))
    )
    inst = inst.join(fwd, on=[*keys, "pid", "_bseq"], how="left", maintain_order="left")
    inst = inst.with_columns(
        pl.when(pl.col("_in_bwd")).then(pl.lit("backward")).otherwise(pl.lit("forward")).alias("direction"),
        pl.when(pl.col("_in_bwd")).then(pl.col("_fpath")).otherwise(pl.col("path")).alias("forward_path"),
    )
    layer, block = layer_of(pl.col("forward_path"), layer_pattern)
    return inst.select(
        *keys, "range_id", "pid", "tid", "op", "seq", "op_id", "input_shapes", "direction", "torch_level",
        "start_ns", "end_ns",
        (pl.col("end_ns") - pl.col("start_ns")).alias("cpu_ns"),
        (pl.col("end_ns") - pl.col("start_ns") - pl.col("_child_ns").fill_null(0)).alias("cpu_self_ns"),
        pl.col("gpu_ns").fill_null(0), pl.col("gpu_self_ns").fill_null(0), pl.col("kernels").fill_null(0),
        "path", "forward_path", layer.alias("layer"), block.alias("block"),
    ).sort([*keys, "start_ns"])


def torch_op_summary(
    instances: pl.DataFrame,
    *,
    by: Sequence[str] = ("op", "input_shapes"),
    top_level_only: bool = False,
) -> pl.DataFrame:
    """Per-operator table from :func:`torch_ops`: ``calls``, CPU and GPU time totals and means.

    ``by`` picks the grouping (default operator and input shapes; add ``"direction"`` or
    ``"layer"``). ``top_level_only`` keeps operators not nested in another one, so that GPU
    times add up without double counting.

    Returns (``rank``,) ``by``, ``calls``, ``cpu_ns``, ``cpu_mean_ns``, ``cpu_self_ns``,
    ``gpu_ns``, ``gpu_mean_ns``, ``gpu_self_ns``, ``kernels``, ``gpu_share`` (of the summed
    ``gpu_self_ns``, which counts every launch once), largest ``gpu_ns`` first.
    """
    rk = rank_keys(instances)
    frame = instances.filter(pl.col("torch_level") == 0) if top_level_only else instances
    keys = [*rk, *by]
    out = frame.group_by(keys).agg(
        pl.len().cast(pl.Int64).alias("calls"),
        pl.col("cpu_ns").sum(),
        pl.col("cpu_ns").mean().alias("cpu_mean_ns"),
        pl.col("cpu_self_ns").sum(),
        pl.col("gpu_ns").sum(),
        pl.col("gpu_ns").mean().alias("gpu_mean_ns"),
        pl.col("gpu_self_ns").sum(),
        pl.col("kernels").sum(),
    )
    total = instances.group_by(rk).agg(pl.col("gpu_self_ns").sum().alias("_t")) if rk else None
    if total is not None:
        out = out.join(total, on=rk).with_columns((pl.col("gpu_ns") / pl.col("_t")).alias("gpu_share")).drop("_t")
    else:
        grand = instances["gpu_self_ns"].sum() or 0
        out = out.with_columns((pl.col("gpu_ns") / grand if grand else pl.lit(None, pl.Float64)).alias("gpu_share"))
    return out.sort([*rk, "gpu_ns"], descending=[*([False] * len(rk)), True])


def op_layer_matrix(instances: pl.DataFrame, *, top_level_only: bool = False) -> pl.DataFrame:
    """Operator × layer: ``calls``, ``gpu_ns``, ``gpu_self_ns``, ``cpu_ns`` per (``rank``,)
    ``layer``, ``block``, ``direction``, ``op`` for operators inside a layer (backward
    operators placed by their forward operator)."""
    rk = rank_keys(instances)
    frame = instances.filter(pl.col("layer").is_not_null())
    if top_level_only:
        frame = frame.filter(pl.col("torch_level") == 0)
    return (
        frame.group_by([*rk, "layer", "block", "direction", "op"])
        .agg(
            pl.len().cast(pl.Int64).alias("calls"),
            pl.col("gpu_ns").sum(),
            pl.col("gpu_self_ns").sum(),
            pl.col("cpu_ns").sum(),
        )
        .sort([*rk, "layer", "block", "direction", "gpu_ns"], descending=[*([False] * len(rk)), False, False, False, True], nulls_last=False)
    )


def link_backward(attributed: pl.DataFrame, nvtx: pl.DataFrame, *, pattern: str = TORCH_OP_PATTERN) -> pl.DataFrame:
    """Add ``direction`` and ``forward_path`` to an ``attribute_nvtx`` result.

    Work launched inside a backward node (``MmBackward0, seq = N``) gets the path of the
    forward operator with the same ``seq`` (``step.0/layer.2/attn/aten::linear/aten::mm``),
    so that :func:`~tracekit.analysis.breakdowns.layer_matrix` with
    ``column="forward_path"`` places backward kernels in their layer. Other work keeps its
    ``nvtx_path`` and is ``forward``; unattributed work has null ``direction``.
    """
    keys = rank_keys(attributed, nvtx)
    _, t = _op_instances(nvtx, keys, pattern)
    fwd = (
        t.filter(pl.col("_is_op") & ~pl.col("_in_bwd") & pl.col("seq").is_not_null())
        .sort("level", descending=True)
        .unique(subset=[*keys, "pid", "seq"], keep="first")
        .select(*keys, "pid", pl.col("seq").alias("_bseq"), pl.col("path").alias("_fpath"))
    )
    info = t.join(fwd, on=[*keys, "pid", "_bseq"], how="left").select(
        *keys, pl.col("range_id").alias("nvtx_range_id"), "_in_bwd", "_fpath"
    )
    out = attributed.drop([c for c in ("direction", "forward_path") if c in attributed.columns])
    out = out.join(info, on=[*keys, "nvtx_range_id"], how="left", maintain_order="left")
    return out.with_columns(
        pl.when(pl.col("nvtx_range_id").is_null()).then(None)
        .when(pl.col("_in_bwd")).then(pl.lit("backward")).otherwise(pl.lit("forward")).alias("direction"),
        pl.when(pl.col("_in_bwd")).then(pl.col("_fpath")).otherwise(pl.col("nvtx_path")).alias("forward_path"),
    ).drop("_in_bwd", "_fpath")
