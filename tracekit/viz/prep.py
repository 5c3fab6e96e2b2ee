"""Data preparation for the charts: tracekit tables in, small polars frames out (no altair here).

Every function aggregates so that a chart never ships more than a few thousand marks to a
browser, whatever the size of the trace. The frames are documented and public: the widgets and
the HTML report reuse them, and a chart can be fed a frame built any other way with the same
columns. Times stay ``Int64`` nanoseconds on the capture's timeline; charts convert to ms.

Where :mod:`tracekit.analysis` has the analysis, the functions here call it; the rest are the
minimal aggregations the charts need.
"""

from __future__ import annotations

import re
from typing import Any

import polars as pl

from tracekit.analysis.graphs import whole_graphs
from tracekit.viz._prep_base import _i64, _name_column, _with_family, data_window, graph_names

# Time series and communication live in prep_series (re-exported: ``prep.memory_series`` …).
from tracekit.viz.prep_series import (
    BUS_FACTORS,
    DEFAULT_GPU_METRICS,
    LAYER_MEMORY_PATTERN,
    METRIC_PANELS,
    Window,
    gpu_metric_panels,
    gpu_metrics_series,
    layer_bands,
    layer_growth,
    layer_memory_series,
    memory_series,
    metric_means,
    nccl_bandwidth,
)

# the timeline's lanes live in their own module (re-exported: ``prep.timeline_ops`` …)
from tracekit.viz.prep_timeline import (
    API_COLORS,
    API_KINDS,
    gpu_ops,
    nvtx_ranges,
    timeline_api,
    timeline_nvtx,
    timeline_ops,
    timeline_steps,
)

#: Default NVTX names of one iteration: ``step.3``, ``iter 12``, ``iteration_4``, ``batch-2``.
ITERATION_PATTERN = r"(?i)^(?:train_?)?(?:step|iter|iteration|batch)[ ._#:-]?(\d+)$"
#: A layer's range: ``layer.3``, ``layers.3``, ``decoder_layer_3``, ``block 3``, ``h.3``.
LAYER_PATTERN = r"(?i)^(?:[a-z_]*layers?|blocks?|h)[ ._:-]?(\d+)$"


# -- kernels -----------------------------------------------------------------------------------
#: Sort keys of :func:`top_kernels` → (column, what the chart's title says).
TOP_SORTS: dict[str, tuple[str, str]] = {
    "total": ("total_ns", "GPU time"),
    "mean": ("mean_ns", "mean duration"),
    "median": ("median_ns", "median duration"),
    "max": ("max_ns", "longest instance"),
    "instances": ("instances", "instances"),
}


def _sort_column(sort: str) -> str:
    if sort in TOP_SORTS:
        return TOP_SORTS[sort][0]
    if sort in {c for c, _ in TOP_SORTS.values()}:
        return sort
    msg = f"sort must be one of {', '.join(TOP_SORTS)}, not {sort!r}"
    raise ValueError(msg)


def top_kernels(kernels: pl.DataFrame, *, n: int = 20, by: str = "short_name", sort: str = "total") -> pl.DataFrame:
    """The ``n`` kernels with the most GPU time (or the largest ``sort`` value).

    Parameters
    ----------
    kernels
        ``trace.kernels`` (``duration_ns`` and a name column; ``family`` is added when absent).
    by
        Name column to group by (``name``: one row per kernel, the full demangled name;
        ``short_name`` merges the template variants of a kernel); falls back to what exists.
    sort
        ``total`` (GPU time, default), ``mean``, ``median``, ``max`` or ``instances``.

    Returns
    -------
    ``name``, ``family``, ``instances``, ``total_ns``, ``mean_ns``, ``median_ns``, ``max_ns``
    (Int64 ns) and ``share`` (fraction of all kernel time, 0–1), largest first.
    """
    key = _sort_column(sort)
    col = _name_column(kernels, by)
    k = _with_family(kernels, col)
    total = k["duration_ns"].sum() or 1
    return (
        k.group_by(pl.col(col).alias("name"))
        .agg(
            pl.col("family").first(),
            pl.len().cast(pl.Int64).alias("instances"),
            pl.col("duration_ns").sum().alias("total_ns"),
            pl.col("duration_ns").mean().round(0).cast(pl.Int64).alias("mean_ns"),
            pl.col("duration_ns").median().round(0).cast(pl.Int64).alias("median_ns"),
            pl.col("duration_ns").max().alias("max_ns"),
        )
        .with_columns((pl.col("total_ns") / total).alias("share"))
        .sort([key, "name"], descending=[True, False])
        .head(n)
    )


#: Words of demangled names that tell two variants of a kernel nothing apart.
_GENERIC_TOKENS = frozenset(
    ["void", "at", "native", "std", "cuda", "unnamed", "anonymous", "namespace", "int", "unsigned", "long", "char", "short", "float", "double", "half", "bool", "const", "T", "T1", "T2", "T3", "T4", "T5", "T6", "array", "instance", "lambda", "operator", "Functor", "func_wrapper_t", "TensorIteratorBase", "TensorIterator", "c10", "detail", "impl", "kernel", "cutlass", "cute", "cudnn", "cub"]
)


def _ellipsize(text: str, limit: int) -> str:
    """``text`` cut in the middle to at most ``limit`` characters (``head…tail``)."""
    if len(text) <= limit:
        return text
    if limit <= 3:
        return text[:limit]
    head = (limit - 1) * 3 // 5
    return text[:head] + "…" + text[len(text) - (limit - 1 - head):]


def _short_of(name: str) -> str:
    """A readable short form of a demangled name: the function's own name without its
    namespaces, return type, template and parameter lists."""
    text = name.strip()
    if text.startswith("void "):
        text = text[5:]
    depth, cut = 0, len(text)
    for i, ch in enumerate(text):  # the first '<' or '(' at depth 0 ends the qualified name
        if ch in "<(" and depth == 0:
            cut = i
            break
    qualified = text[:cut] or text
    return qualified.split("::")[-1] or qualified


def kernel_labels(names: list[str], shorts: list[str | None] | None = None, *, limit: int = 56) -> list[str]:
    """One distinct, readable label per kernel name, at most ``limit`` characters.

    A kernel is shown by its short name (``shorts``, nsys's ``short_name``; else read from
    the demangled name). When several kernels share a short name (three cuDNN wgrad
    variants, the template instances of ``elementwise_kernel``), each gets the words of its
    full name the others lack (``vectorized_elementwise_kernel · MulFunctor``); any left
    alike are numbered (``#2``). The full name stays the key: charts group and select by it.
    """
    import re

    base = [(s or _short_of(n)) if shorts is not None else _short_of(n) for n, s in
            zip(names, shorts if shorts is not None else [None] * len(names), strict=True)]
    labels = list(base)
    groups: dict[str, list[int]] = {}
    for i, b in enumerate(base):
        groups.setdefault(b, []).append(i)
    for b, rows in groups.items():
        if len(rows) < 2:
            labels[rows[0]] = _ellipsize(b, limit)
            continue
        tokens = [list(dict.fromkeys(re.findall(r"[A-Za-z_][A-Za-z0-9_]*|\d+", names[i]))) for i in rows]
        counts: dict[str, int] = {}
        for toks in tokens:
            for t in toks:
                counts[t] = counts.get(t, 0) + 1
        for i, toks in zip(rows, tokens, strict=True):
            own = [t for t in toks if counts[t] < len(rows) and t not in _GENERIC_TOKENS and t != b]
            words = [t for t in own if not t.isdigit()]
            # the rarest words first (they tell this variant apart), in name order among equals
            words = sorted(words, key=lambda t: (counts[t], toks.index(t)))
            picked = words[:1] if words and counts[words[0]] == 1 else words[:2]
            tag = " ".join(picked) or " ".join([f"<{t}>" for t in own if t.isdigit()][:2])
            if tag:
                head = _ellipsize(b, max(min(len(b), 30), limit - len(tag) - 3))
                labels[i] = _ellipsize(f"{head} · {tag}", limit)
            else:
                labels[i] = _ellipsize(b, limit)
    seen: dict[str, int] = {}
    for i, label in enumerate(labels):  # whatever is still alike gets a number
        if label in seen:
            seen[label] += 1
            suffix = f" #{seen[label]}"
            labels[i] = _ellipsize(label, limit - len(suffix)) + suffix
        else:
            seen[label] = 1
    return labels


def with_kernel_labels(top: pl.DataFrame, kernels: pl.DataFrame | None = None, *, limit: int = 56) -> pl.DataFrame:
    """``top`` (:func:`top_kernels`) with ``label``: :func:`kernel_labels` of its ``name``
    column (short names looked up in ``kernels`` when it has ``short_name``)."""
    if "label" in top.columns:
        return top
    names = top["name"].cast(pl.Utf8).fill_null("?").to_list()
    shorts: list[str | None] | None = None
    if kernels is not None and {"name", "short_name"} <= set(kernels.columns) and top.height:
        lookup = (kernels.select("name", "short_name").filter(pl.col("name").is_in(names))
                  .unique("name", keep="first"))
        found = dict(zip(lookup["name"].to_list(), lookup["short_name"].to_list(), strict=True))
        shorts = [found.get(n) for n in names]
    return top.with_columns(pl.Series("label", kernel_labels(names, shorts, limit=limit), dtype=pl.Utf8))


def duration_histogram(
    kernels: pl.DataFrame, *, bins_per_decade: int = 5, by: str = "family"
) -> pl.DataFrame:
    """Kernel durations in logarithmic bins.

    Returns
    -------
    ``group`` (the ``by`` column, ``family`` by default), ``bin_start_ns``, ``bin_end_ns``
    (Float64 ns, ``bins_per_decade`` bins per power of ten), ``count`` and ``total_ns``.
    """
    k = _with_family(kernels, _name_column(kernels, "name")) if by == "family" else kernels
    k = k.filter(pl.col("duration_ns") > 0)
    b = pl.lit(bins_per_decade, dtype=pl.Float64)
    idx = (pl.col("duration_ns").cast(pl.Float64).log10() * b).floor()
    return (
        k.with_columns(
            idx.alias("_bin"), pl.col(by).cast(pl.Utf8).fill_null("(none)").alias("group")
        )
        .group_by("group", "_bin")
        .agg(pl.len().cast(pl.Int64).alias("count"), pl.col("duration_ns").sum().alias("total_ns"))
        .with_columns(
            (10 ** (pl.col("_bin") / b)).alias("bin_start_ns"),
            (10 ** ((pl.col("_bin") + 1) / b)).alias("bin_end_ns"),
        )
        .sort("group", "_bin")
        .select("group", "bin_start_ns", "bin_end_ns", "count", "total_ns")
    )


# -- temporal breakdown -------------------------------------------------------------------------
BREAKDOWN_CATEGORIES: tuple[str, ...] = ("compute", "communication", "overlap", "memcpy", "idle")


def temporal_breakdown(
    kernels: pl.DataFrame,
    memcpys: pl.DataFrame | None = None,
    memsets: pl.DataFrame | None = None,
    graphs: pl.DataFrame | None = None,
    *,
    by: str | None = None,
    window: Window | None = None,
) -> pl.DataFrame:
    """Split each GPU's (or rank's) time into compute, communication, overlap, memcpy and idle.

    A moment counts as ``overlap`` when a communication kernel and another kernel run at once,
    ``compute`` / ``communication`` when only one kind runs, ``memcpy`` when only copies or
    memsets run, ``idle`` when nothing does. Computed by :mod:`tracekit.analysis.comm`
    (communication kernels as it classifies them, peer-to-peer copies count as
    communication); without it, communication kernels are those of family
    ``communication`` (:mod:`tracekit.taxonomy`). CUDA graph launches traced whole
    (``graphs``: ``trace.graph_trace``, see :func:`gpu_ops`) count as ``compute`` for their
    whole replay: their kernels were not traced, so what kind of work they hold is not known.

    Parameters
    ----------
    by
        Grouping column: ``rank`` when present, else ``device_id``.
    window
        ``(start_ns, end_ns)``; by default from the first to the last operation of all groups,
        so that idle time is comparable across GPUs.

    Returns
    -------
    ``group`` (Utf8: ``GPU 0`` or ``rank 1``), the ``by`` column, ``category``, ``time_ns``
    (Int64), ``fraction`` (of the window) and ``window_ns``; five rows per group.
    """
    by = by or ("rank" if "rank" in kernels.columns else "device_id")
    g = whole_graphs(graphs)
    if by in ("device_id", "rank") and not (kernels.is_empty() and g is None):
        try:
            return _breakdown_from_analysis(kernels, memcpys, memsets, g, by=by, window=window)
        except (ImportError, pl.exceptions.ColumnNotFoundError):
            pass  # the analysis is not there, or the frames lack its identity columns
    k = _with_family(kernels, _name_column(kernels, "name"))
    parts = [
        k.select(by, "start_ns", "end_ns", pl.when(pl.col("family") == "communication")
                 .then(pl.lit("comm")).otherwise(pl.lit("comp")).alias("_kind"))
    ]  # fmt: skip
    for frame in (memcpys, memsets):
        if frame is not None and not frame.is_empty() and by in frame.columns:
            parts.append(frame.select(by, "start_ns", "end_ns", pl.lit("mem").alias("_kind")))
    if g is not None and by in g.columns:
        parts.append(g.select(by, "start_ns", "end_ns", pl.lit("comp").alias("_kind")))
    ops = pl.concat(parts).filter(pl.col("end_ns").is_not_null() & pl.col(by).is_not_null())
    window = window or data_window(ops)
    if window is None:
        return pl.DataFrame(
            schema={"group": pl.Utf8, by: pl.Int64, "category": pl.Utf8, "time_ns": pl.Int64,
                    "fraction": pl.Float64, "window_ns": pl.Int64}
        )  # fmt: skip
    w0, w1 = window
    ops = ops.with_columns(pl.col("start_ns").clip(w0, w1), pl.col("end_ns").clip(w0, w1)).filter(
        pl.col("end_ns") > pl.col("start_ns")
    )
    groups = ops.select(by).unique().sort(by)
    kinds = ("comp", "comm", "mem")
    edges = pl.concat(
        [
            ops.select(by, pl.col("start_ns").alias("t"), "_kind", _i64(1).alias("_d")),
            ops.select(by, pl.col("end_ns").alias("t"), "_kind", _i64(-1).alias("_d")),
            groups.select(
                by, _i64(w0).alias("t"), pl.lit("comp").alias("_kind"), _i64(0).alias("_d")
            ),
            groups.select(
                by, _i64(w1).alias("t"), pl.lit("comp").alias("_kind"), _i64(0).alias("_d")
            ),
        ]
    )
    steps = (
        edges.group_by(by, "t")
        .agg(*[(pl.col("_d") * (pl.col("_kind") == kind)).sum().alias(kind) for kind in kinds])
        .sort(by, "t")
        .with_columns(
            *[pl.col(kind).cum_sum().over(by).alias(kind) for kind in kinds],
            (pl.col("t").shift(-1).over(by) - pl.col("t")).alias("_len"),
        )
        .filter(pl.col("_len").is_not_null())
    )
    category = (
        pl.when((pl.col("comp") > 0) & (pl.col("comm") > 0)).then(pl.lit("overlap"))
        .when(pl.col("comp") > 0).then(pl.lit("compute"))
        .when(pl.col("comm") > 0).then(pl.lit("communication"))
        .when(pl.col("mem") > 0).then(pl.lit("memcpy"))
        .otherwise(pl.lit("idle"))
    )  # fmt: skip
    sums = (
        steps.with_columns(category.alias("category"))
        .group_by(by, "category")
        .agg(pl.col("_len").sum().alias("time_ns"))
    )
    full = groups.join(pl.DataFrame({"category": list(BREAKDOWN_CATEGORIES)}), how="cross")
    label = "rank " if by == "rank" else ("GPU " if by == "device_id" else f"{by} ")
    order = {c: i for i, c in enumerate(BREAKDOWN_CATEGORIES)}
    return (
        full.join(sums, on=[by, "category"], how="left")
        .with_columns(
            pl.col("time_ns").fill_null(0).cast(pl.Int64),
            pl.concat_str(pl.lit(label), pl.col(by).cast(pl.Utf8)).alias("group"),
            pl.lit(w1 - w0, dtype=pl.Int64).alias("window_ns"),
            pl.col("category").replace_strict(order, return_dtype=pl.Int64).alias("_o"),
        )
        .with_columns((pl.col("time_ns") / pl.col("window_ns")).alias("fraction"))
        .sort(by, "_o")
        .select("group", by, "category", "time_ns", "fraction", "window_ns")
    )


_STATE_CATEGORY = {
    "compute_only": "compute",
    "communication_only": "communication",
    "overlap": "overlap",
    "memcpy": "memcpy",
    "idle": "idle",
}


def _breakdown_from_analysis(
    kernels: pl.DataFrame,
    memcpys: pl.DataFrame | None,
    memsets: pl.DataFrame | None,
    graphs: pl.DataFrame | None,
    *,
    by: str,
    window: Window | None,
) -> pl.DataFrame:
    """:func:`temporal_breakdown` through :mod:`tracekit.analysis.comm` (peer copies count as
    communication; ``graphs``, launches traced whole, as compute)."""
    from tracekit.analysis.comm import activity_segments, categorize_ops

    ops = categorize_ops(kernels, memcpys, memsets)
    if graphs is not None:
        keys = [c for c in ("rank", "device_id") if c in ops.columns]
        ops = pl.concat([ops, graphs.select(*keys, "start_ns", "end_ns", "duration_ns", pl.lit("compute").alias("category"))],
                        how="diagonal_relaxed")
    window = window or data_window(ops)
    if window is None:
        msg = "no operations"
        raise ImportError(msg)
    seg = activity_segments(ops, start_ns=window[0], end_ns=window[1])
    keys = [c for c in ("rank", "device_id") if c in seg.columns]
    if by not in keys:
        msg = f"cannot group by {by}"
        raise ImportError(msg)
    sums = (
        seg.with_columns(
            pl.col("state").replace_strict(_STATE_CATEGORY, return_dtype=pl.Utf8).alias("category")
        )
        .group_by(by, "category")
        .agg(pl.col("duration_ns").sum().alias("time_ns"))
    )
    groups = ops.select(by).unique().sort(by)
    full = groups.join(pl.DataFrame({"category": list(BREAKDOWN_CATEGORIES)}), how="cross")
    label = "rank " if by == "rank" else "GPU "
    order = {c: i for i, c in enumerate(BREAKDOWN_CATEGORIES)}
    w0, w1 = window
    return (
        full.join(sums, on=[by, "category"], how="left")
        .with_columns(
            pl.col("time_ns").fill_null(0).cast(pl.Int64),
            pl.concat_str(pl.lit(label), pl.col(by).cast(pl.Utf8)).alias("group"),
            pl.lit(w1 - w0, dtype=pl.Int64).alias("window_ns"),
            pl.col("category").replace_strict(order, return_dtype=pl.Int64).alias("_o"),
        )
        .with_columns((pl.col("time_ns") / pl.col("window_ns")).alias("fraction"))
        .sort(by, "_o")
        .select("group", by, "category", "time_ns", "fraction", "window_ns")
    )


# -- iterations, layers --------------------------------------------------------------------------
def iteration_times(nvtx: pl.DataFrame, *, pattern: str = ITERATION_PATTERN) -> pl.DataFrame:
    """One row per iteration range (NVTX ranges named like ``step.3``).

    With the default pattern this is :func:`tracekit.analysis.run.iterations.iteration_ranges`
    (the outermost matching ranges, numbered in order); a custom ``pattern`` takes every
    closed range whose name matches and numbers it from its first group.

    Returns
    -------
    ``group`` (``rank N`` or ``pid N``), ``iteration`` (Int64, from the name, else the order),
    ``name``, ``start_ns``, ``end_ns``, ``duration_ns``.
    """
    rank = "rank" if "rank" in nvtx.columns else "pid"
    if pattern == ITERATION_PATTERN and not nvtx.is_empty():
        try:
            from tracekit.analysis.run.iterations import iteration_ranges

            its = iteration_ranges(nvtx)
        except (ImportError, pl.exceptions.ColumnNotFoundError):
            its = None
        if its is not None:
            return its.sort(rank, "start_ns").select(
                pl.concat_str(pl.lit(f"{rank} "), pl.col(rank).cast(pl.Utf8)).alias("group"),
                pl.col("iteration").cast(pl.Int64),
                "name",
                "start_ns",
                "end_ns",
                (pl.col("end_ns") - pl.col("start_ns")).alias("duration_ns"),
            )
    r = nvtx.filter(
        pl.col("end_ns").is_not_null()
        & pl.col("name").is_not_null()
        & pl.col("name").str.contains(pattern)
        & (pl.col("event_type") != "Mark" if "event_type" in nvtx.columns else pl.lit(True))
    )
    return (
        r.with_columns(
            pl.col("name").str.extract(pattern, 1).cast(pl.Int64, strict=False).alias("iteration"),
            pl.concat_str(pl.lit(f"{rank} "), pl.col(rank).cast(pl.Utf8)).alias("group"),
        )
        .sort(rank, "start_ns")
        .with_columns(
            pl.col("iteration").fill_null(pl.int_range(pl.len()).over(rank).cast(pl.Int64)),
            (pl.col("end_ns") - pl.col("start_ns")).alias("duration_ns"),
        )
        .select("group", "iteration", "name", "start_ns", "end_ns", "duration_ns")
    )


def structure_iterations(structure: Any) -> pl.DataFrame:
    """The iterations of a run's structure (:func:`tracekit.structure`), as
    :func:`iteration_times` gives NVTX ranges: every GPU's kernel-loop iterations (``group``
    ``GPU N`` / ``rank N GPU M``), else the NVTX, forward or graph-replay iterations of the
    process that bounds the window.

    Returns ``group``, ``iteration``, ``name`` (``warm-up`` or ``steady``), ``start_ns``,
    ``end_ns``, ``duration_ns`` (the iteration's length: CPU range or GPU span, the longer);
    empty when the run has no iterations.
    """
    schema = {"group": pl.Utf8, "iteration": pl.Int64, "name": pl.Utf8, "start_ns": pl.Int64, "end_ns": pl.Int64,
              "duration_ns": pl.Int64}
    parts = []
    loops = getattr(structure, "loops", None) or []
    if loops:
        for dl in loops:
            label = " ".join(f"{'GPU' if k == 'device_id' else k} {v}" for k, v in dl.keys.items())
            it = dl.iterations
            warm = dl.warmup
            parts.append(it.select(
                pl.lit(label).alias("group"), pl.col("iteration").cast(pl.Int64),
                pl.when(pl.int_range(pl.len()) < warm).then(pl.lit("warm-up")).otherwise(pl.lit("steady")).alias("name"),
                "start_ns", "end_ns", pl.col("duration_ns").cast(pl.Int64)))
    elif structure is not None and structure.iterations.height:
        it = structure.iterations
        keys = [k for k in ("rank", "pid") if k in it.columns]
        group = pl.concat_str([pl.lit(f"{k} ") + pl.col(k).cast(pl.Utf8) for k in keys], separator=" ") if keys else pl.lit("all")
        parts.append(it.select(
            group.alias("group"), pl.col("iteration").cast(pl.Int64),
            pl.when(pl.col("warmup")).then(pl.lit("warm-up")).otherwise(pl.lit("steady")).alias("name"),
            pl.col("w_start").alias("start_ns"), pl.col("w_end").alias("end_ns"), pl.col("length_ns").cast(pl.Int64).alias("duration_ns")))
    if not parts:
        return pl.DataFrame(schema=schema)
    out = pl.concat(parts).select([pl.col(c).cast(t) for c, t in schema.items()])
    periodic = getattr(structure, "periodic", None)
    if isinstance(periodic, pl.DataFrame) and periodic.height:
        # a step that holds an evaluation or a checkpoint save is named by it
        marks = periodic.select(pl.col("start_ns").alias("_p"), pl.col("what")).sort("_p")
        out = out.with_row_index("_r").sort("start_ns").join_asof(marks, left_on="start_ns", right_on="_p", strategy="forward").with_columns(
            pl.when(pl.col("_p").is_not_null() & (pl.col("_p") < pl.col("end_ns")) & (pl.col("name") == "steady"))
            .then(pl.col("what")).otherwise(pl.col("name")).alias("name")).sort("_r").drop("_r", "_p", "what")
    return out


#: Most points an iteration chart draws (all groups together; altair refuses a dataset of more
#: than 5,000 rows when a chart is drawn or saved).
MAX_ITERATION_POINTS = 2000


def binned_iterations(its: pl.DataFrame, max_points: int | None = None) -> tuple[pl.DataFrame, int]:
    """``its`` (:func:`iteration_times`) as it is when it has at most ``max_points`` rows
    (default :data:`MAX_ITERATION_POINTS`), else binned: each row then stands for ``size``
    consecutive iterations of a group — ``iteration`` and ``start_ns`` of the first,
    ``end_ns`` of the last, ``name`` ``"first … last"`` and ``duration_ns`` their median (ns).

    Needs ``group``, ``iteration`` and ``duration_ns``; ``name``, ``start_ns`` and ``end_ns``
    are kept where present. Returns the frame and ``size`` (1 when not binned).
    """
    limit = MAX_ITERATION_POINTS if max_points is None else max_points
    if its.height <= limit:
        return its, 1
    groups = its["group"].n_unique()
    longest = int(its.group_by("group").len()["len"].max())  # type: ignore[arg-type]
    size = -(-longest * groups // max(limit, 1))
    aggs = {
        "name": pl.format("{} … {}", pl.col("name").first(), pl.col("name").last()).alias("name"),
        "start_ns": pl.col("start_ns").first(), "end_ns": pl.col("end_ns").last(),
        "duration_ns": pl.col("duration_ns").median().round(0).cast(pl.Int64),
    }
    shown = (
        its.with_columns((pl.int_range(pl.len()).over("group") // size).alias("_bin"))
        .group_by("group", "_bin", maintain_order=True)
        .agg(pl.col("iteration").first(), *[aggs[c] for c in its.columns if c in aggs])
        .drop("_bin")
    )
    return shown, size


def attributed_kernels(
    kernels: pl.DataFrame, cuda_api: pl.DataFrame, nvtx: pl.DataFrame, graphs: pl.DataFrame | None = None
) -> pl.DataFrame:
    """Kernels with their NVTX path (``nvtx_path``, ``nvtx_range``), via :mod:`tracekit.analysis.attribution`.

    ``graphs``: ``trace.graphs`` (one row per CUDA graph launch with its ``nvtx_path``). Its
    launches traced whole are added as operations ``[CUDA graph <graph_id>]`` (``op_kind``
    ``graph``, ``duration_ns`` = the replay's span, ns) under the path they were launched in,
    so that NVTX trees and layer matrices count graph-replayed GPU time; per-node launches are
    left out (their kernels are in ``kernels``)."""
    from tracekit.analysis.attribution import attribute_nvtx, launch_info

    out = attribute_nvtx(launch_info(kernels, cuda_api), nvtx)
    g = whole_graphs(graphs)
    if g is None or "nvtx_path" not in g.columns:
        return out
    keep = [c for c in ("rank", "pid", "global_pid", "device_id", "stream_id", "correlation_id", "start_ns", "end_ns",
                        "duration_ns", "nvtx_path") if c in g.columns]
    name = graph_names(g)
    extra = g.select(*keep, name.alias("name"), name.alias("short_name"), pl.lit("graph").alias("op_kind"),
                     pl.lit("graph").alias("family"))
    if "op_kind" not in out.columns:
        out = out.with_columns(pl.lit("kernel").alias("op_kind"))
    return pl.concat([out, extra], how="diagonal_relaxed")


def layer_block_matrix(
    attributed: pl.DataFrame, *, layer_pattern: str = LAYER_PATTERN, value: str = "duration_ns"
) -> pl.DataFrame:
    """GPU time per (layer, block) from each kernel's NVTX path.

    With the defaults this is :func:`tracekit.analysis.breakdowns.layer_matrix` summed over
    ranks (it also reads dotted names such as ``model.layers.2.self_attn``). Otherwise the layer is the first path element matching ``layer_pattern`` (``layer.3``); the block is
    the element right after it (``attn``, ``mlp``), or ``(layer)`` for work directly inside
    the layer range.

    Parameters
    ----------
    attributed
        Kernels with ``nvtx_path`` (``step.0/layer.3/attn``) and ``duration_ns``
        (:func:`attributed_kernels` or ``tracekit.analysis.attribution.attribute_nvtx``).

    Returns
    -------
    ``layer`` (Int64), ``layer_name``, ``block``, ``time_ns``, ``instances`` and ``share``
    (fraction of the time of all kernels inside a layer).
    """
    if "nvtx_path" not in attributed.columns:
        msg = "the kernels have no nvtx_path; attribute them first (tracekit.viz.prep.attributed_kernels)"
        raise ValueError(msg)
    if layer_pattern == LAYER_PATTERN and value == "duration_ns":
        try:
            from tracekit.analysis.breakdowns import layer_matrix

            m: pl.DataFrame | None = layer_matrix(attributed)
        except ImportError:
            m = None
        if m is not None:
            total = m["gpu_time_ns"].sum() or 1
            count = "kernels" if "kernels" in m.columns else "ops"
            return (
                m.with_columns(pl.col("block").fill_null("(layer)"))
                .group_by("layer", "block")
                .agg(
                    pl.col("gpu_time_ns").sum().alias("time_ns"),
                    pl.col(count).sum().cast(pl.Int64).alias("instances"),
                )
                .with_columns(
                    pl.col("layer").cast(pl.Int64),
                    pl.concat_str(pl.lit("layer."), pl.col("layer").cast(pl.Utf8)).alias(
                        "layer_name"
                    ),
                    (pl.col("time_ns") / total).alias("share"),
                )
                .sort("layer", "block")
                .select("layer", "layer_name", "block", "time_ns", "instances", "share")
            )
    rx = re.compile(layer_pattern)

    def split(path: str | None) -> dict[str, object]:
        parts = (path or "").split("/")
        for i, part in enumerate(parts):
            m = rx.match(part)
            if m:
                block = parts[i + 1] if i + 1 < len(parts) else "(layer)"
                return {"layer": int(m.group(1)), "layer_name": part, "block": block}
        return {"layer": None, "layer_name": None, "block": None}

    paths = attributed.select(pl.col("nvtx_path").unique())
    parsed = paths.with_columns(
        pl.col("nvtx_path")
        .map_elements(
            split,
            return_dtype=pl.Struct({"layer": pl.Int64, "layer_name": pl.Utf8, "block": pl.Utf8}),
        )
        .alias("_p")
    ).unnest("_p")
    joined = attributed.select("nvtx_path", value).join(
        parsed, on="nvtx_path", how="left", nulls_equal=True
    )
    inside = joined.filter(pl.col("layer").is_not_null())
    total = inside[value].sum() or 1
    return (
        inside.group_by("layer", "block")
        .agg(
            pl.col("layer_name").first(),
            pl.col(value).sum().alias("time_ns"),
            pl.len().cast(pl.Int64).alias("instances"),
        )
        .with_columns((pl.col("time_ns") / total).alias("share"))
        .sort("layer", "block")
        .select("layer", "layer_name", "block", "time_ns", "instances", "share")
    )


def nvtx_tree(
    attributed: pl.DataFrame, *, max_depth: int = 4, by_process: bool | None = None
) -> pl.DataFrame:
    """Inclusive GPU time of every NVTX path prefix (the rows of an NVTX tree).

    Parameters
    ----------
    attributed
        Kernels (or any GPU ops) with ``nvtx_path`` and ``duration_ns``; ``pid``/``rank``
        separate processes when ``by_process`` (default: when there are several).

    Returns
    -------
    ``path`` (``step.0/layer.1``), ``name`` (last element), ``depth`` (1 = outermost),
    ``gpu_time_ns`` (all GPU work launched inside, Int64), ``ops`` and ``share`` (of all
    attributed GPU time), sorted in tree order.
    """
    a = attributed.filter(pl.col("nvtx_path").is_not_null() & (pl.col("nvtx_path") != ""))
    proc = "rank" if "rank" in a.columns else "pid" if "pid" in a.columns else None
    if by_process is None:
        by_process = proc is not None and a[proc].n_unique() > 1
    path = pl.col("nvtx_path")
    if by_process and proc:
        path = pl.concat_str(pl.lit(f"{proc} "), pl.col(proc).cast(pl.Utf8), pl.lit("/"), path)
    parts = a.select(path.str.split("/").alias("_p"), "duration_ns").with_row_index("_r")
    exploded = parts.with_columns(
        pl.int_ranges(1, pl.col("_p").list.len() + 1).alias("_d")
    ).explode("_d")
    exploded = exploded.filter(pl.col("_d") <= max_depth).with_columns(
        pl.col("_p").list.head(pl.col("_d")).list.join("/").alias("path")
    )
    total = a["duration_ns"].sum() or 1
    return (
        exploded.group_by("path", "_d")
        .agg(pl.col("duration_ns").sum().alias("gpu_time_ns"), pl.len().cast(pl.Int64).alias("ops"))
        .with_columns(
            pl.col("_d").cast(pl.Int64).alias("depth"),
            pl.col("path").str.split("/").list.last().alias("name"),
            (pl.col("gpu_time_ns") / total).alias("share"),
        )
        .sort("path")
        .select("path", "name", "depth", "gpu_time_ns", "ops", "share")
    )


__all__ = [
    "BREAKDOWN_CATEGORIES", "BUS_FACTORS", "DEFAULT_GPU_METRICS", "ITERATION_PATTERN", "LAYER_MEMORY_PATTERN", "LAYER_PATTERN",
    "API_COLORS", "API_KINDS", "METRIC_PANELS", "gpu_metric_panels", "metric_means", "MAX_ITERATION_POINTS", "TOP_SORTS", "timeline_api", "timeline_steps", "attributed_kernels", "kernel_labels", "with_kernel_labels", "binned_iterations", "data_window", "duration_histogram",
    "gpu_metrics_series", "gpu_ops", "graph_names", "iteration_times", "layer_bands", "layer_block_matrix", "structure_iterations",
    "layer_growth", "layer_memory_series", "memory_series", "nccl_bandwidth", "nvtx_ranges",
    "nvtx_tree", "temporal_breakdown", "timeline_nvtx", "timeline_ops", "top_kernels", "whole_graphs",
]  # fmt: skip
