"""GPU time spent moving bytes rather than computing: copies, concatenations, dtype casts,
layout changes, index writes and fills, by kernel and by kind.

A GPU operation moves data when its kernel family is ``copy`` (:mod:`tracekit.taxonomy`:
``direct_copy``, ``CatArrayBatchedCopy``, transposes, fills, ``index_copy``, and Inductor
pointwise kernels that fuse nothing but data-movement ops, ``triton_poi_fused_cat_…``), or
it is a device-to-device memcpy or a memset. Host↔device copies are transfers, not data
movement on the GPU (``copies`` and the ``pageable_memcpy`` rule look at those).

Each such operation gets a ``kind`` (first match wins):

``concat``
    ``CatArrayBatchedCopy`` (eager ``torch.cat``) and Inductor kernels fusing ``cat``: the
    KV cache grown with ``torch.cat`` (Hugging Face ``DynamicCache``) rewrites the whole cache
    every step.
``index_write``
    ``index_copy``/``index_put``/``scatter``: writes into a preallocated buffer (a static KV
    cache's per-token write); cheap unless it rewrites the whole buffer out of place.
``dtype_cast``
    copies that convert (``LoadWithCast``/``StoreWithCast``, ``bfloat16_copy_kernel``,
    Inductor ``_to_copy``): fp32 up-casts around normalisations, mixed-precision glue.
``layout``
    transposes, permutes, ``.contiguous()``, ``clone``, other ``direct_copy`` kernels.
``memcpy``
    device-to-device ``cudaMemcpy*`` (``tensor.copy_`` of contiguous tensors).
``fill``
    memsets and fill kernels (``zeros``, ``fill_``).
"""

from __future__ import annotations

import polars as pl

from tracekit.analysis._frames import rank_keys
from tracekit.analysis.families import with_family

__all__ = ["DATA_MOVEMENT_KINDS", "data_movement", "data_movement_ops"]

#: ``kind`` values, in the order they are tested.
DATA_MOVEMENT_KINDS: tuple[str, ...] = ("concat", "index_write", "dtype_cast", "layout", "memcpy", "fill")

_KIND_PATTERNS: tuple[tuple[str, str], ...] = (
    ("concat", r"(?i)cat_?array|batched_?copy|^triton_[a-z]+_fused_(?:[a-z0-9_]*_)?cat_"),
    ("index_write", r"(?i)index_?copy|index_?put|scatter"),
    ("dtype_cast", r"(?i)withcast|bfloat16_copy|half_copy|float_copy|_to_copy|to_copy_kernel"),
    ("fill", r"(?i)fill|memset|zero_"),
)


def _kind() -> pl.Expr:
    name = pl.col("name")
    expr: pl.Expr = pl.lit("layout")
    for label, pattern in reversed(_KIND_PATTERNS):
        expr = pl.when(name.str.contains(pattern).fill_null(False)).then(pl.lit(label)).otherwise(expr)
    op = pl.col("op_kind")
    return pl.when(op == "memcpy").then(pl.lit("memcpy")).when(op == "memset").then(pl.lit("fill")).otherwise(expr)


def data_movement_ops(ops: pl.DataFrame) -> pl.DataFrame:
    """The operations of ``ops`` that move data on the GPU, with ``family`` and ``kind``.

    Parameters
    ----------
    ops
        :func:`~tracekit.analysis._frames.gpu_ops` (``name``, ``op_kind``, ``duration_ns``;
        memcpys with ``[CUDA memcpy Device-to-Device]`` names), or kernels (``name``).

    Returns
    -------
    The data-movement rows of ``ops`` (same columns, same order) plus ``family`` (``copy`` or
    the memcpy/memset kind) and ``kind`` (:data:`DATA_MOVEMENT_KINDS`). Host↔device and
    peer-to-peer copies and whole-graph launches are left out.
    """
    frame = ops if "op_kind" in ops.columns else ops.with_columns(pl.lit("kernel").alias("op_kind"))
    frame = with_family(frame, name_column="name")
    dtod = pl.col("name").str.contains(r"(?i)device-to-device|dtod").fill_null(False)
    keep = ((pl.col("op_kind") == "kernel") & (pl.col("family") == "copy")) | ((pl.col("op_kind") == "memcpy") & dtod) | (
        pl.col("op_kind") == "memset")
    return frame.filter(keep).with_columns(_kind().alias("kind"))


def data_movement(ops: pl.DataFrame, *, by: tuple[str, ...] = ("kind", "name")) -> pl.DataFrame:
    """GPU time moving data, per ``by`` group (default: per kind and kernel name).

    Parameters
    ----------
    ops
        As :func:`data_movement_ops` takes them; the share is of the GPU time of every
        operation in ``ops`` but host↔device and peer-to-peer transfers (whole-graph launches
        count in it: their time is GPU time, though their kernels are not seen).
    by
        Grouping columns among ``kind``, ``name``, ``device_id`` … (``rank`` is added when
        present).

    Returns
    -------
    (``rank``,) ``by``, ``ops`` (count), ``gpu_time_ns`` (summed durations, ns), ``mean_ns``,
    ``bytes`` (memcpy/memset bytes; null for kernels), ``share`` (of the GPU time described),
    largest first.
    """
    rk = rank_keys(ops)
    keys = list(dict.fromkeys([*rk, *by]))
    moved = data_movement_ops(ops)
    base = ops if "op_kind" in ops.columns else ops.with_columns(pl.lit("kernel").alias("op_kind"))
    htod = pl.col("name").str.contains(r"(?i)host-to-device|device-to-host|htod|dtoh|peer-to-peer|ptop").fill_null(False)
    counted = base.filter(~((pl.col("op_kind") == "memcpy") & htod))
    total = counted.group_by(rk).agg(pl.col("duration_ns").sum().alias("_total")) if rk else counted.select(
        pl.col("duration_ns").sum().alias("_total"))
    out = moved.group_by(keys).agg(
        pl.len().cast(pl.Int64).alias("ops"),
        pl.col("duration_ns").sum().alias("gpu_time_ns"),
        pl.col("duration_ns").mean().alias("mean_ns"),
        (pl.col("bytes").sum() if "bytes" in moved.columns else pl.lit(None, pl.Int64)).alias("bytes"),
    )
    out = out.join(total, on=rk, how="left") if rk else out.join(total, how="cross")
    out = out.with_columns((pl.col("gpu_time_ns") / pl.col("_total")).alias("share")).drop("_total")
    return out.sort("gpu_time_ns", descending=True)
