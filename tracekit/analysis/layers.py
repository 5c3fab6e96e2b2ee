"""Layers in NVTX paths: which layer, and which of its sub-blocks, a range or a GPU operation is
in; and the forward passes (one run of the model's layers) that are the steps of a trace
without step ranges.

Two naming styles are read. Hand-written nested ranges: ``step.3/layer.2/attn``. Module paths,
as :func:`tracekit.torch.annotate` and ``tracekit capture nsys --annotate-torch`` push them
(each range is the module's dotted path, so a path repeats its prefix):
``Qwen3ForCausalLM/model/model.layers.3/model.layers.3.self_attn`` (Llama, Qwen, Mistral …),
``GPT2LMHeadModel/transformer/transformer.h.11/transformer.h.11.attn`` (GPT-2),
``…/model.decoder.layers.5/model.decoder.layers.5.fc1`` (OPT), ``blocks.2.attn``.
"""

from __future__ import annotations

import polars as pl

from tracekit.analysis._frames import rank_keys
from tracekit.analysis.attribution import _nvtx_tree

__all__ = [
    "DEFAULT_LAYER_PATTERN",
    "LAYER_RANGE_PATTERN",
    "PREFILL_FACTOR",
    "forward_ranges",
    "forwards",
    "in_forward",
    "layer_of",
]

# a layer word: layer(s) or block(s), optionally after a word and "_" (decoder_layer), or GPT-2's h
_WORD = r"(?:(?:[A-Za-z]+_)?(?:[Ll]ayers?|[Bb]locks?)|h)"

#: ``layer.N``, ``layers.N``, ``blocks.N``, ``h.N``, ``decoder_layer_N`` as a path step
#: (``step.3/layer.2/attn``) or inside a dotted module path (``model.layers.5.mlp.down_proj``,
#: ``transformer.h.11.attn``, ``model.decoder.layers.5.fc1``); after a ``/``, ``.`` or ``:``
#: (or at the start) and followed by one (or the end), so ``step.3``, ``decode.3``,
#: ``model.embed_tokens`` and ``layers.30`` for ``layers.3`` are never taken. The leading
#: ``^.*`` makes the *last* occurrence count: the innermost path element that holds the layer
#: decides the block. Group 1 is the layer number, group 2 (optional) the sub-block: the name
#: right after the number in that element (``model.layers.3.self_attn`` → ``self_attn``;
#: ``model.layers.3.mlp.down_proj`` → ``mlp``) or, when the element ends with the number, the
#: next path element when it is a plain name (``layer.2/attn`` → ``attn``; not
#: ``layer.2/aten::add``).
DEFAULT_LAYER_PATTERN = (
    r"^.*(?:^|[/.:])" + _WORD + r"[._/](\d+)(?:[./]([A-Za-z_]\w*)(?:[/.]|$)|[/.:,\s]|$)"
)

#: A range label that is a layer's own range (not one of its sub-blocks): ``layer.3``,
#: ``layers.3``, ``decoder_layer_3``, ``block 3``, ``h.3`` and the module paths
#: ``model.layers.3``, ``transformer.h.11``, ``model.decoder.layers.5``, ``encoder.block.3``
#: (case-insensitive). Pass it as ``layer_memory(..., ranges=LAYER_RANGE_PATTERN)``.
LAYER_RANGE_PATTERN = r"(?i)^(?:[\w-]+[.:])*(?:[a-z_]*layers?|blocks?|h)[ ._:-]?\d+$"

#: A forward whose GPU time is more than this many times the median of its process's forwards
#: processes a prompt (``prefill``); see :func:`forwards`.
PREFILL_FACTOR = 2.0


def layer_of(text: pl.Expr, pattern: str = DEFAULT_LAYER_PATTERN) -> tuple[pl.Expr, pl.Expr]:
    """``(layer, block)`` expressions parsed from an NVTX path or a dotted module name.

    Parameters
    ----------
    text
        A Utf8 expression: an ``nvtx_path`` (ranges joined by ``/``, outermost first) or a
        single name.
    pattern
        Regular expression (polars' syntax); group 1 is the layer number, group 2 the
        sub-block; its match decides (the default takes the innermost element holding a
        layer, see :data:`DEFAULT_LAYER_PATTERN`).

    Returns
    -------
    ``layer`` (Int64; null outside any layer) and ``block`` (Utf8; null for work directly in
    the layer range, outside its sub-block ranges).

    Examples
    --------
    >>> paths = pl.Series(["Qwen3ForCausalLM/model/model.layers.3/model.layers.3.self_attn",
    ...                    "step.3/layer.2/attn", "transformer.h.11.mlp", "model.embed_tokens"])
    >>> layer, block = layer_of(pl.col("p"))
    >>> pl.DataFrame({"p": paths}).select(layer.alias("layer"), block.alias("block")).rows()
    [(3, 'self_attn'), (2, 'attn'), (11, 'mlp'), (None, None)]
    """
    layer = text.str.extract(pattern, 1).cast(pl.Int64, strict=False)
    block = text.str.extract(pattern, 2)
    return layer, block


_FORWARD_SCHEMA: dict[str, type[pl.DataType]] = {
    "pid": pl.Int64, "forward": pl.Int64, "range_id": pl.Int64, "name": pl.Utf8, "tid": pl.Int64,
    "global_tid": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64, "layers": pl.Int64,
}


def forward_ranges(nvtx: pl.DataFrame, *, pattern: str = DEFAULT_LAYER_PATTERN) -> pl.DataFrame:
    """The NVTX ranges that each run the model's layers once: one per forward pass.

    A layer range is the outermost range whose path holds a layer (``layer_of``:
    ``model.layers.3``, ``layer.2``). A forward is, for each layer range, its outermost
    enclosing range in which no layer number occurs twice: the root-module range of
    ``--annotate-torch`` (``Qwen3ForCausalLM``, once per ``generate()`` token), a
    hand-written ``step.N`` or ``forward`` range, but not a ``generate`` range around many
    forwards. Layer ranges at the top level (no enclosing range) have none.

    Parameters
    ----------
    nvtx
        The whole ``nvtx`` table (see :func:`~tracekit.analysis.attribution.nvtx_ranges`).
    pattern
        The layer pattern (:data:`DEFAULT_LAYER_PATTERN`).

    Returns
    -------
    One row per forward, in start order per process: (``rank``,) ``pid``, ``forward``
    (0-based per process), ``range_id``, ``name`` (label), ``tid``, ``global_tid``,
    ``start_ns``, ``end_ns`` (ns) and ``layers`` (distinct layer numbers inside). Empty
    (same columns) without layer ranges inside other ranges.
    """
    keys = rank_keys(nvtx)
    empty = pl.DataFrame(schema={**({"rank": nvtx.schema["rank"]} if keys else {}), **_FORWARD_SCHEMA})
    if nvtx.height == 0:
        return empty
    tree = _nvtx_tree(nvtx, keys)
    layer, _block = layer_of(pl.col("path"), pattern)
    tree = tree.with_columns(layer.alias("_layer"))
    tree = tree.with_columns(pl.col("_layer").gather(pl.col("_parent_idx")).alias("_parent_layer"))
    starts = tree.filter(pl.col("_layer").is_not_null() & pl.col("_parent_layer").is_null())
    parent = tree["_parent_idx"]
    # one row per (layer range, enclosing range), climbing one level a round
    cur = starts.select("_idx", "_layer", pl.col("_parent_idx").alias("_anc")).filter(pl.col("_anc").is_not_null())
    pairs = []
    while cur.height:
        pairs.append(cur)
        cur = cur.with_columns(parent.gather(cur["_anc"]).alias("_anc")).filter(pl.col("_anc").is_not_null())
    if not pairs:
        return empty
    anc = pl.concat(pairs)
    # a range holding a layer number twice runs the layers more than once: not one forward
    once = anc.group_by("_anc", "_layer").len().group_by("_anc").agg((pl.col("len").max() == 1).alias("_once"))
    ok = anc.join(once.filter(pl.col("_once")), on="_anc").join(
        tree.select(pl.col("_idx").alias("_anc"), pl.col("level").alias("_alevel")), on="_anc"
    )
    chosen = ok.sort("_alevel").group_by("_idx").agg(pl.col("_anc").first())
    layers = ok.join(chosen, on=["_idx", "_anc"]).group_by("_anc").agg(pl.col("_layer").n_unique().cast(pl.Int64).alias("layers"))
    out = tree.join(layers.rename({"_anc": "_idx"}), on="_idx").sort([*keys, "pid", "start_ns", "range_id"])
    out = out.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).over([*keys, "pid"]).alias("forward"))
    return out.select(*keys, *[pl.col("label").alias("name") if c == "name" else pl.col(c) for c in _FORWARD_SCHEMA]).cast(
        _FORWARD_SCHEMA  # type: ignore[arg-type]
    )


def in_forward(ops_with_launch: pl.DataFrame, ranges: pl.DataFrame) -> pl.DataFrame:
    """The GPU operations launched inside a forward, each with its ``forward``.

    Parameters
    ----------
    ops_with_launch
        GPU operations with their launching call (:func:`~tracekit.analysis.attribution.
        launch_info`): ``global_tid``, ``api_start_ns``.
    ranges
        :func:`forward_ranges`.

    Returns ``ops_with_launch``'s rows whose launching call starts inside a forward range
    on the same thread (``start_ns <= api_start_ns <= end_ns``, as nsys attributes a kernel to
    the ranges enclosing its launch), with ``forward`` and ``forward_range_id`` (Int64) added;
    others are left out.
    """
    keys = rank_keys(ops_with_launch, ranges)
    by = [*keys, "global_tid"]
    win = ranges.select(
        *by, pl.col("start_ns").alias("api_start_ns"), pl.col("end_ns").alias("_fend"),
        pl.col("forward").cast(pl.Int64), pl.col("range_id").cast(pl.Int64).alias("forward_range_id"),
    ).sort([*by, "api_start_ns"])
    ops = ops_with_launch.drop("forward", "forward_range_id", strict=False)
    ops = ops.filter(pl.col("api_start_ns").is_not_null() & pl.col("global_tid").is_not_null()).sort([*by, "api_start_ns"])
    j = ops.join_asof(win, on="api_start_ns", by=by, strategy="backward", check_sortedness=False)
    return j.filter(pl.col("forward").is_not_null() & (pl.col("api_start_ns") <= pl.col("_fend"))).drop("_fend")


def forwards(ops_with_launch: pl.DataFrame, ranges: pl.DataFrame, *, prefill_factor: float = PREFILL_FACTOR) -> pl.DataFrame:
    """GPU work and phase of each forward.

    Parameters
    ----------
    ops_with_launch
        GPU operations with their launching call (``duration_ns``, ``global_tid``,
        ``api_start_ns``; ``op_kind`` when stacked with ``gpu_ops``).
    ranges
        :func:`forward_ranges`.
    prefill_factor
        A forward taking more than this many times the median GPU time of its process's
        forwards is a ``prefill`` (in ``generate()``, the first forward processes the whole
        prompt, the others one token per sequence).

    Returns
    -------
    :func:`forward_ranges`'s columns with ``ops``, ``kernels``, ``gpu_time_ns`` (summed
    operation time, ns) and ``phase``: ``prefill`` / ``decode`` in a process where some
    forward exceeds the factor, null where none does (all alike: one phase, which the trace
    does not tell).
    """
    keys = rank_keys(ops_with_launch, ranges)
    j = in_forward(ops_with_launch, ranges)
    kind = (pl.col("op_kind") == "kernel") if "op_kind" in j.columns else pl.lit(True)
    per = j.group_by([*keys, "forward_range_id"]).agg(
        pl.len().cast(pl.Int64).alias("ops"), kind.sum().cast(pl.Int64).alias("kernels"),
        pl.col("duration_ns").sum().cast(pl.Int64).alias("gpu_time_ns"),
    ).rename({"forward_range_id": "range_id"})
    out = ranges.join(per, on=[*keys, "range_id"], how="left").with_columns(
        pl.col("ops").fill_null(0), pl.col("kernels").fill_null(0), pl.col("gpu_time_ns").fill_null(0)
    )
    proc = [*keys, "pid"]
    big = pl.col("gpu_time_ns") > prefill_factor * pl.col("gpu_time_ns").median().over(proc)
    phase = pl.when(big.any().over(proc)).then(pl.when(big).then(pl.lit("prefill")).otherwise(pl.lit("decode")))
    return out.with_columns(phase.cast(pl.Utf8).alias("phase")).sort([*keys, "pid", "forward"])
