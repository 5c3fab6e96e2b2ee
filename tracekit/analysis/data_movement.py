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
``inplace_copy``
    Inductor kernels that fuse ATen's in-place ``copy_`` (``triton_poi_fused_copy__19``,
    ``…_arange_copy__eq_…_where_4``): compiled code writing a buffer it was given (a KV cache
    updated as ``cache.copy_(torch.where(pos == positions, k, cache))``) rewrites the whole
    buffer every call, whatever else the kernel computes.

:func:`large_pointwise` adds what no name tells: pointwise kernels of a decode step that last
far longer than its matrix products, which at one token per step can only be moving memory.
"""

from __future__ import annotations

import polars as pl

from tracekit.analysis._frames import rank_keys
from tracekit.analysis.families import with_family

__all__ = ["DATA_MOVEMENT_KINDS", "INPLACE_COPY_PATTERN", "NOT_INPLACE_COPY", "data_movement", "data_movement_ops", "inplace_copy", "large_pointwise"]

#: ``kind`` values, in the order they are tested.
DATA_MOVEMENT_KINDS: tuple[str, ...] = ("inplace_copy", "concat", "index_write", "dtype_cast", "layout", "memcpy", "fill")

#: Inductor kernels that fuse the in-place ``copy_`` (its name, ``copy_``, and the ``_``
#: that joins fused op names: ``…_copy__…``), once :data:`NOT_INPLACE_COPY` (``_to_copy``,
#: ``index_copy``, ``lift_fresh_copy``) is taken out of the name.
INPLACE_COPY_PATTERN = r"^triton_[a-z]+_fused.*_copy__"
NOT_INPLACE_COPY = r"(?:_to|index|fresh)_copy__"


def inplace_copy(name: pl.Expr) -> pl.Expr:
    """Whether a kernel name is an Inductor kernel that fuses ``copy_`` (see
    :data:`INPLACE_COPY_PATTERN`)."""
    return name.str.replace_all(NOT_INPLACE_COPY, "_").str.contains(INPLACE_COPY_PATTERN).fill_null(False)


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
    expr = pl.when(inplace_copy(name)).then(pl.lit("inplace_copy")).otherwise(expr)
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
    # decided once per distinct name, then only the rows kept are classified (not a family
    # string per operation of a million)
    names = with_family(frame.get_column("name").unique().drop_nulls().to_frame("name"), name_column="name")
    copying = names.filter((pl.col("family") == "copy") | inplace_copy(pl.col("name"))).get_column("name")
    dtod = names.filter(pl.col("name").str.contains(r"(?i)device-to-device|dtod")).get_column("name")
    kind = pl.col("op_kind")
    keep = ((kind == "kernel") & pl.col("name").is_in(copying.implode())) | (
        (kind == "memcpy") & pl.col("name").is_in(dtod.implode())) | (kind == "memset")
    return with_family(frame.filter(keep.fill_null(False)), name_column="name").with_columns(_kind().alias("kind"))


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


#: :func:`large_pointwise`: a pointwise kernel whose median lasts at least this many times the
#: median matrix product of the same operations …
POINTWISE_OVER_GEMM = 2.0
#: … and at least this long (ns) …
POINTWISE_MIN_NS = 20_000
#: … and that takes at least this share of their GPU time.
POINTWISE_MIN_SHARE = 0.05


def large_pointwise(ops: pl.DataFrame) -> pl.DataFrame:
    """Pointwise kernels (family ``elementwise``: Inductor's ``triton_poi_…``, eager
    elementwise kernels) that outlast the matrix products around them: a median duration of at
    least :data:`POINTWISE_OVER_GEMM` times the median GEMM launch's (and
    :data:`POINTWISE_MIN_NS`), and at least :data:`POINTWISE_MIN_SHARE` of the GPU time of
    ``ops``. In a decode step, where each matrix product reads its weights once for one token,
    a pointwise kernel that lasts longer moves more memory than the model's weights: a cache
    rewritten whole, a buffer copied in and out.

    Parameters
    ----------
    ops
        The operations of one window (``name``, ``duration_ns``; ``op_kind``): a generation's
        steady decode steps.

    Returns
    -------
    (``rank``,) ``name``, ``ops``, ``gpu_time_ns``, ``median_ns``, ``gemm_median_ns`` (the
    median GEMM launch), ``over_gemm`` (the ratio), ``share`` (of the GPU time of ``ops``),
    largest first; empty without GEMMs.
    """
    rk = rank_keys(ops)
    frame = ops if "op_kind" in ops.columns else ops.with_columns(pl.lit("kernel").alias("op_kind"))
    kern = with_family(frame.filter(pl.col("op_kind") == "kernel"), name_column="name")
    gemm = kern.filter(pl.col("family") == "gemm")
    schema = {**{k: pl.Int64 for k in rk}, "name": pl.Utf8, "ops": pl.Int64, "gpu_time_ns": pl.Int64, "median_ns": pl.Float64,
              "gemm_median_ns": pl.Float64, "over_gemm": pl.Float64, "share": pl.Float64}
    if gemm.height == 0:
        return pl.DataFrame(schema=schema)
    total = float(frame["duration_ns"].sum() or 0)
    g_med = float(gemm["duration_ns"].median())  # type: ignore[arg-type]
    per = kern.filter(pl.col("family") == "elementwise").group_by([*rk, "name"]).agg(
        pl.len().cast(pl.Int64).alias("ops"), pl.col("duration_ns").sum().alias("gpu_time_ns"),
        pl.col("duration_ns").median().alias("median_ns"))
    per = per.with_columns(pl.lit(g_med).alias("gemm_median_ns"), (pl.col("median_ns") / g_med).alias("over_gemm"),
                           (pl.col("gpu_time_ns") / total if total else pl.lit(None, pl.Float64)).alias("share"))
    per = per.filter((pl.col("over_gemm") >= POINTWISE_OVER_GEMM) & (pl.col("median_ns") >= POINTWISE_MIN_NS)
                     & (pl.col("share") >= POINTWISE_MIN_SHARE))
    return per.select(list(schema)).sort("gpu_time_ns", descending=True)
