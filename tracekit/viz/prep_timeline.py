"""The timeline's lanes: GPU operations per stream, CUDA API calls per CPU thread, NVTX ranges per
thread and level, iteration boundaries (re-exported by :mod:`tracekit.viz.prep`)."""

from __future__ import annotations

from typing import Any

import polars as pl

from tracekit.analysis.graphs import whole_graphs
from tracekit.viz._prep_base import _name_column, _with_family, data_window, graph_names
from tracekit.viz.prep_series import Window


def gpu_ops(
    kernels: pl.DataFrame,
    memcpys: pl.DataFrame | None = None,
    memsets: pl.DataFrame | None = None,
    graphs: pl.DataFrame | None = None,
    *,
    name_column: str = "short_name",
) -> pl.DataFrame:
    """Kernels, copies, memsets and CUDA graph replays in one frame for the timeline.

    Parameters
    ----------
    kernels, memcpys, memsets
        ``trace.kernels``, ``trace.memcpys``, ``trace.memsets``.
    graphs
        ``trace.graph_trace`` (or ``trace.graphs``): each graph launch traced whole
        (``--cuda-graph-trace=graph``, nsys's default) is one operation spanning its replay,
        since its kernels are in no other table (:func:`whole_graphs`; launches traced per
        node are left out, their kernels are in ``kernels``).

    Returns
    -------
    ``device_id``, ``stream_id``, ``start_ns``, ``end_ns``, ``duration_ns`` (ns), ``name``,
    ``family`` (copies are ``memcpy``, memsets ``memset``, graph replays ``graph`` named
    ``[CUDA graph <graph_id>]``), plus ``rank`` when the inputs have it.
    """
    rank = ["rank"] if "rank" in kernels.columns else []
    col = _name_column(kernels, name_column)
    parts = [
        _with_family(kernels, col).select(
            *rank, "device_id", "stream_id", "start_ns", "end_ns", "duration_ns",
            pl.col(col).alias("name"), "family",
        )
    ]  # fmt: skip
    for frame, family, label in ((memcpys, "memcpy", "copy_kind_label"), (memsets, "memset", None)):
        if frame is None or frame.is_empty():
            continue
        name = (
            pl.concat_str(pl.lit(f"{family} "), pl.col(label).fill_null(""))
            if label and label in frame.columns
            else pl.lit(family)
        )
        parts.append(
            frame.select(
                *[c for c in rank if c in frame.columns], "device_id", "stream_id", "start_ns",
                "end_ns", "duration_ns", name.alias("name"), pl.lit(family).alias("family"),
            )
        )  # fmt: skip
    g = whole_graphs(graphs)
    if g is not None:
        parts.append(
            g.select(
                *[c for c in rank if c in g.columns], "device_id", "stream_id", "start_ns", "end_ns",
                "duration_ns", graph_names(g).alias("name"), pl.lit("graph").alias("family"),
            )
        )  # fmt: skip
    return pl.concat(parts, how="diagonal_relaxed").sort("start_ns")


def _lane_label(frame: pl.DataFrame) -> pl.Expr:
    parts: list[pl.Expr | str] = []
    if "rank" in frame.columns:
        parts += [pl.lit("rank "), pl.col("rank").cast(pl.Utf8), pl.lit(" · ")]
    parts += [
        pl.lit("GPU "),
        pl.col("device_id").cast(pl.Utf8).fill_null("?"),
        pl.lit(" · stream "),
        pl.col("stream_id").cast(pl.Utf8).fill_null("?"),
    ]
    return pl.concat_str(parts)


def timeline_ops(
    ops: pl.DataFrame, *, window: Window | None = None, max_marks: int = 2000
) -> pl.DataFrame:
    """GPU work per device/stream lane, exact when few, binned when many.

    Parameters
    ----------
    ops
        :func:`gpu_ops` output (``device_id``, ``stream_id``, ``start_ns``, ``end_ns``,
        ``name``, ``family``; ``rank`` optional).
    window
        ``(start_ns, end_ns)`` to show; the whole data by default.
    max_marks
        Above this many operations in the window, each lane is cut into
        ``max_marks // lanes`` equal time bins and one mark per busy bin is returned.

    Returns
    -------
    ``lane`` (``GPU 0 · stream 7``), ``lane_order``, ``start_ns``, ``end_ns`` (clipped to the
    window), ``name`` (the op, or the bin's busiest name), ``family`` (the op's, or the bin's
    busiest family), ``count`` (ops in the mark), ``busy_fraction`` (share of the mark's time
    the lane was busy, 1 for single ops) and ``binned`` (bool).
    """
    window = window or data_window(ops)
    if window is None or ops.is_empty():
        return pl.DataFrame(
            schema={"lane": pl.Utf8, "lane_order": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64,
                    "name": pl.Utf8, "family": pl.Utf8, "count": pl.Int64, "busy_fraction": pl.Float64,
                    "binned": pl.Boolean}
        )  # fmt: skip
    w0, w1 = window
    rank = ["rank"] if "rank" in ops.columns else []
    o = ops.filter((pl.col("end_ns") > w0) & (pl.col("start_ns") < w1)).with_columns(
        _lane_label(ops).alias("lane"),
        pl.col("start_ns").clip(w0, w1).alias("start_ns"),
        pl.col("end_ns").clip(w0, w1).alias("end_ns"),
    )
    lanes = (
        o.select(*rank, "device_id", "stream_id", "lane")
        .unique()
        .sort([*rank, "device_id", "stream_id"], nulls_last=True)
        .with_row_index("lane_order")
        .select("lane", pl.col("lane_order").cast(pl.Int64))
    )
    return _lane_marks(o.join(lanes, on="lane", how="left"), (w0, w1), max_marks, lanes.height)


def _lane_marks(o: pl.DataFrame, window: Window, max_marks: int, n_lanes: int) -> pl.DataFrame:
    """Marks of lanes (``lane``, ``lane_order``, ``start_ns``, ``end_ns`` clipped to the window,
    ``name``, ``family``): one per operation while they are at most ``max_marks``, else one per
    busy time bin of each lane (its busiest family and name, ``busy_fraction``)."""
    w0, w1 = window
    if o.height <= max_marks:
        return o.select(
            "lane", "lane_order", "start_ns", "end_ns", "name", "family",
            pl.lit(1, dtype=pl.Int64).alias("count"), pl.lit(1.0).alias("busy_fraction"),
            pl.lit(False).alias("binned"),
        ).sort("lane_order", "start_ns")  # fmt: skip
    bins = max(max_marks // max(n_lanes, 1), 1)
    width = max(-(-(w1 - w0) // bins), 1)  # ceil: never more than ``bins`` bins
    b0 = (pl.col("start_ns") - w0) // width
    b1 = pl.max_horizontal((pl.col("end_ns") - 1 - w0) // width, b0)
    exploded = (
        o.with_columns(pl.int_ranges(b0, b1 + 1).alias("_bin"))
        .explode("_bin")
        .with_columns((pl.col("_bin") * width + w0).alias("_bs"))
        .with_columns(
            (
                pl.min_horizontal(pl.col("end_ns"), pl.col("_bs") + width)
                - pl.max_horizontal(pl.col("start_ns"), pl.col("_bs"))
            ).alias("_ov")
        )
    )
    per_family = exploded.group_by("lane", "lane_order", "_bin", "family").agg(
        pl.col("_ov").sum().alias("_busy"), pl.len().alias("_n")
    )
    per_name = (
        exploded.group_by("lane", "_bin", "name")
        .agg(pl.col("_ov").sum().alias("_nb"))
        .sort("_nb", "name", descending=[True, False])
        .group_by("lane", "_bin")
        .agg(pl.col("name").first())
    )
    return (
        per_family.sort("_busy", "family", descending=[True, False])
        .group_by("lane", "lane_order", "_bin")
        .agg(
            pl.col("family").first(),
            pl.col("_busy").sum().alias("_busy"),
            pl.col("_n").sum().cast(pl.Int64).alias("count"),
        )
        .join(per_name, on=["lane", "_bin"], how="left")
        .with_columns(
            (pl.col("_bin") * width + w0).alias("start_ns"),
            pl.min_horizontal(pl.col("_bin") * width + w0 + width, pl.lit(w1)).alias("end_ns"),
        )
        .with_columns(
            (pl.col("_busy") / (pl.col("end_ns") - pl.col("start_ns")).clip(lower_bound=1))
            .clip(0.0, 1.0)
            .alias("busy_fraction"),
            pl.lit(True).alias("binned"),
        )
        .select(
            "lane",
            "lane_order",
            "start_ns",
            "end_ns",
            "name",
            "family",
            "count",
            "busy_fraction",
            "binned",
        )
        .sort("lane_order", "start_ns")
    )


#: Kinds of CUDA API calls on the timeline's CPU lanes, first matching pattern wins.
API_KINDS: tuple[tuple[str, str], ...] = (
    ("sync", r"(?i)synchroni[sz]e|Query|StreamWaitEvent"),
    ("launch", r"(?i)Launch"),
    ("memory", r"(?i)Memcpy|Memset|Prefetch"),
    ("alloc", r"(?i)Malloc|Free|MemCreate|MemMap|MemUnmap|MemAddress|MemRelease|MemSetAccess"),
)
#: Colours of the CUDA API kinds (apart from the kernel families': the CPU side is greys,
#: synchronisation in red because that is where a host waits).
API_COLORS: dict[str, str] = {"launch": "#6E6E6E", "sync": "#C0392B", "memory": "#A6761D", "alloc": "#9E9AC8",
                              "other": "#C8C8C8"}  # fmt: skip


def timeline_api(
    cuda_api: pl.DataFrame,
    *,
    window: Window | None = None,
    max_marks: int = 1000,
    max_threads: int = 4,
    lane_offset: int = 5_000,
) -> pl.DataFrame:
    """CUDA API calls as timeline lanes: one lane per CPU thread, the ``max_threads`` threads
    with the most API time in the window (those that launch the GPU work).

    Returns the columns of :func:`timeline_ops` (``lane`` is ``CPU <pid>:<tid> · CUDA API``,
    ``family`` the call's kind: ``launch``, ``sync``, ``memory``, ``alloc``, ``other``;
    binned beyond ``max_marks`` calls), after the GPU lanes in ``lane_order``.
    """
    empty = pl.DataFrame(
        schema={"lane": pl.Utf8, "lane_order": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64,
                "name": pl.Utf8, "family": pl.Utf8, "count": pl.Int64, "busy_fraction": pl.Float64,
                "binned": pl.Boolean}
    )  # fmt: skip
    if cuda_api is None or cuda_api.is_empty() or not {"start_ns", "end_ns", "name", "tid"} <= set(cuda_api.columns):
        return empty
    window = window or data_window(cuda_api)
    if window is None:
        return empty
    w0, w1 = window
    rank = ["rank"] if "rank" in cuda_api.columns else []
    pid = ["pid"] if "pid" in cuda_api.columns else []
    a = cuda_api.filter(pl.col("end_ns").is_not_null() & (pl.col("end_ns") > w0) & (pl.col("start_ns") < w1)).with_columns(
        pl.col("start_ns").clip(w0, w1), pl.col("end_ns").clip(w0, w1))
    if a.is_empty():
        return empty
    keys = [*rank, *pid, "tid"]
    busiest = (a.group_by(keys).agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("_t"))
               .sort("_t", *keys, descending=[True] + [False] * len(keys)).head(max_threads).sort(keys))
    prefix: list[pl.Expr] = [pl.lit("rank "), pl.col("rank").cast(pl.Utf8), pl.lit(" · ")] if rank else []
    who: list[pl.Expr] = [pl.col("pid").cast(pl.Utf8), pl.lit(":")] if pid else []
    lanes = busiest.with_row_index("_o").select(
        *keys, pl.concat_str([*prefix, pl.lit("CPU "), *who, pl.col("tid").cast(pl.Utf8), pl.lit(" · CUDA API")]).alias("lane"),
        (pl.col("_o").cast(pl.Int64) + lane_offset).alias("lane_order"))
    kind: pl.Expr = pl.lit("other")
    for label, pattern in reversed(API_KINDS):
        kind = pl.when(pl.col("name").str.contains(pattern)).then(pl.lit(label)).otherwise(kind)
    o = a.join(lanes, on=keys, how="inner").with_columns(
        pl.col("name").str.replace(r"_v\d+$", "").alias("name"), kind.alias("family"))
    return _lane_marks(o, (w0, w1), max_marks, lanes.height)


def timeline_steps(structure: Any, *, window: Window | None = None, max_marks: int = 400) -> pl.DataFrame:
    """Iteration boundaries of a run's structure (:func:`tracekit.structure`) for the
    timeline: ``start_ns`` of each iteration in the window and ``phase`` (``warm-up`` or
    ``steady``); empty without iterations, or with more than ``max_marks`` in the window (a
    rule per iteration would then be a solid band)."""
    schema = {"start_ns": pl.Int64, "iteration": pl.Int64, "phase": pl.Utf8}
    its = getattr(structure, "iterations", None)
    if not isinstance(its, pl.DataFrame) or its.is_empty() or "w_start" not in its.columns:
        return pl.DataFrame(schema=schema)
    out = its.select(
        pl.col("w_start").cast(pl.Int64).alias("start_ns"),
        pl.col("iteration").cast(pl.Int64) if "iteration" in its.columns else pl.int_range(pl.len()).cast(pl.Int64).alias("iteration"),
        pl.when(pl.col("warmup")).then(pl.lit("warm-up")).otherwise(pl.lit("steady")).alias("phase")
        if "warmup" in its.columns else pl.lit("steady").alias("phase"),
    ).unique("start_ns", keep="first").sort("start_ns")
    if window is not None:
        out = out.filter(pl.col("start_ns").is_between(window[0], window[1]))
    return out if out.height <= max_marks else pl.DataFrame(schema=schema)


def nvtx_ranges(nvtx: pl.DataFrame) -> pl.DataFrame:
    """NVTX ranges with their nesting level (see :func:`tracekit.analysis.attribution.nvtx_ranges`).

    Returns ``pid``, ``tid``, ``start_ns``, ``end_ns``, ``name``, ``label``, ``level``, ``path``
    (plus ``rank`` when present). Marks and domain rows are left out.
    """
    from tracekit.analysis.attribution import nvtx_ranges as _ranges

    if nvtx.is_empty():
        return pl.DataFrame(
            schema={"pid": pl.Int64, "tid": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64,
                    "name": pl.Utf8, "label": pl.Utf8, "level": pl.Int64, "path": pl.Utf8}
        )  # fmt: skip
    r = _ranges(nvtx)
    keep = [
        c
        for c in ("rank", "pid", "tid", "start_ns", "end_ns", "name", "label", "level", "path")
        if c in r.columns
    ]
    return r.select(keep).with_columns(pl.col("level").cast(pl.Int64))


def timeline_nvtx(
    ranges: pl.DataFrame,
    *,
    window: Window | None = None,
    max_level: int = 2,
    max_marks: int = 1500,
    lane_offset: int = 10_000,
) -> pl.DataFrame:
    """NVTX ranges as timeline lanes (one lane per thread and nesting level).

    Parameters
    ----------
    ranges
        :func:`nvtx_ranges` output (``pid``, ``tid``, ``start_ns``, ``end_ns``, ``label`` or
        ``name``, ``level``).
    max_level
        Deepest nesting level shown (0 = outermost ranges).
    max_marks
        When more ranges fall in the window, the shortest are dropped (a range narrower than
        a pixel cannot be seen anyway).

    Returns
    -------
    ``lane`` (``NVTX 884:884 · L1``), ``lane_order`` (after the GPU lanes), ``start_ns``,
    ``end_ns`` (clipped), ``name``, ``level``.
    """
    empty = pl.DataFrame(
        schema={"lane": pl.Utf8, "lane_order": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64,
                "name": pl.Utf8, "level": pl.Int64}
    )  # fmt: skip
    if ranges.is_empty():
        return empty
    window = window or data_window(ranges)
    if window is None:
        return empty
    w0, w1 = window
    name = "label" if "label" in ranges.columns else "name"
    rank = ["rank"] if "rank" in ranges.columns else []
    r = ranges.filter(
        pl.col("end_ns").is_not_null()
        & (pl.col("end_ns") > w0)
        & (pl.col("start_ns") < w1)
        & (pl.col("level") <= max_level)
    ).with_columns(
        pl.col("start_ns").clip(w0, w1), pl.col("end_ns").clip(w0, w1), pl.col(name).alias("name")
    )
    if r.height > max_marks:
        r = r.sort(pl.col("end_ns") - pl.col("start_ns"), descending=True).head(max_marks)
    prefix: list[pl.Expr] = (
        [pl.lit("rank "), pl.col("rank").cast(pl.Utf8), pl.lit(" · ")] if rank else []
    )
    r = r.with_columns(
        pl.concat_str(
            [*prefix, pl.lit("NVTX "), pl.col("pid").cast(pl.Utf8), pl.lit(":"),
             pl.col("tid").cast(pl.Utf8), pl.lit(" · L"), pl.col("level").cast(pl.Utf8)]
        ).alias("lane")
    )  # fmt: skip
    lanes = (
        r.select(*rank, "pid", "tid", "level", "lane")
        .unique()
        .sort([*rank, "pid", "tid", "level"])
        .with_row_index("lane_order")
        .select("lane", (pl.col("lane_order").cast(pl.Int64) + lane_offset).alias("lane_order"))
    )
    return (
        r.join(lanes, on="lane", how="left")
        .select("lane", "lane_order", "start_ns", "end_ns", "name", "level")
        .sort("lane_order", "start_ns")
    )


