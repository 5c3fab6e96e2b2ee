"""Communication on the GPU: which work is communication, and how much of it compute hides.

* :func:`classify_communication` tags kernels with a communication ``comm_kind`` from
  configurable patterns (:data:`DEFAULT_COMM_PATTERNS`): NCCL/RCCL, MSCCL, vLLM/SGLang/TRT-LLM
  custom all-reduce, DeepEP, NVSHMEM, PyTorch symmetric-memory kernels, then
  :data:`tracekit.taxonomy.COMMUNICATION_PATTERNS` as a catch-all (``"other"``).
  Peer-to-peer copies (``copy_kind`` PtoP, or DtoD between two different devices) are
  copy-engine communication (``"copy_engine"``).
* :func:`activity_segments` cuts each GPU's timeline into contiguous segments whose state
  is ``compute_only``, ``communication_only``, ``overlap`` (both), ``memcpy`` (copies or
  memsets and nothing else) or ``idle``. Within each category overlapping work counts once.
* :func:`overlap_breakdown` sums them per GPU. *Exposed communication* is communication not
  covered by compute on the same GPU (= ``communication_only``).
* :func:`range_windows` and :func:`comm_by_range` give the same numbers per NVTX range
  (an iteration such as ``step.3``), on each GPU's projection of the range.

Every function groups by ``rank`` as well when its input has one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from tracekit.analysis._frames import gpu_ops, interval_union, rank_keys
from tracekit.taxonomy import COMMUNICATION_PATTERNS

__all__ = [
    "CATEGORIES",
    "DEFAULT_COMM_PATTERNS",
    "STATES",
    "CommPattern",
    "activity_segments",
    "categorize_ops",
    "classify_communication",
    "comm_by_range",
    "comm_kind_expr",
    "overlap_breakdown",
    "peer_copy_expr",
    "range_windows",
]


@dataclass(frozen=True)
class CommPattern:
    """Kernels whose name matches ``pattern`` (case-insensitive regular expression, searched
    anywhere, polars/Rust syntax) are communication of kind ``kind``."""

    kind: str
    pattern: str


#: Default communication patterns, tried in order (the first match gives the kind).
DEFAULT_COMM_PATTERNS: tuple[CommPattern, ...] = (
    CommPattern("msccl", r"mscclpp|msccl"),
    CommPattern("nccl", r"nccl|rccl"),
    CommPattern(
        "custom_allreduce",
        r"cross_device_reduce|custom_?all_?reduce|tensorrt_llm|trtllm|lamport|quick_?all_?reduce",
    ),
    CommPattern("deepep", r"deep_?ep|internode|intranode"),
    CommPattern("nvshmem", r"nvshmem"),
    CommPattern(
        "symmetric_memory",
        r"symmetric_?memory|symm_?mem|one_?shot_all_reduce|two_?shot_all_reduce|multimem",
    ),
    *(CommPattern("other", p) for p in COMMUNICATION_PATTERNS),
)

#: Kinds of GPU work in the breakdown.
CATEGORIES: tuple[str, ...] = ("compute", "communication", "memcpy")
#: Segment states, in the order the breakdown reports them.
STATES: tuple[str, ...] = ("compute_only", "communication_only", "overlap", "memcpy", "idle")


def comm_kind_expr(name: str | pl.Expr = "name", patterns: Sequence[CommPattern] | None = None) -> pl.Expr:
    """``comm_kind`` of each kernel name (null when it is not communication)."""
    expr = pl.col(name) if isinstance(name, str) else name
    chosen = list(patterns) if patterns is not None else list(DEFAULT_COMM_PATTERNS)
    out: pl.Expr = pl.lit(None, pl.Utf8)
    for p in reversed(chosen):
        out = pl.when(expr.str.contains(f"(?i){p.pattern}")).then(pl.lit(p.kind)).otherwise(out)
    return out


def classify_communication(
    kernels: pl.DataFrame,
    *,
    patterns: Sequence[CommPattern] | None = None,
    name_column: str = "name",
) -> pl.DataFrame:
    """``kernels`` (same order) with ``comm_kind`` (Utf8, null for non-communication) and
    ``is_communication`` (Boolean).

    ``name_column`` is searched; the default ``name`` is the demangled name, which carries
    namespaces (``c10d::symmetric_memory::barrier_kernel``) that short names lose. Each
    distinct name is classified once.
    """
    names = kernels.select(pl.col(name_column).unique())
    mapping = names.with_columns(comm_kind_expr(name_column, patterns).alias("comm_kind"))
    out = kernels.drop([c for c in ("comm_kind", "is_communication") if c in kernels.columns])
    out = out.join(mapping, on=name_column, how="left", nulls_equal=True, maintain_order="left")
    return out.with_columns(pl.col("comm_kind").is_not_null().alias("is_communication"))


def peer_copy_expr() -> pl.Expr:
    """Whether a memcpy row moves data between two GPUs (``PtoP``, or DtoD across devices)."""
    kind = pl.col("copy_kind")
    cross = (
        pl.col("src_device_id").is_not_null()
        & pl.col("dst_device_id").is_not_null()
        & (pl.col("src_device_id") != pl.col("dst_device_id"))
    )
    return ((kind == "PtoP") | ((kind == "DtoD") & cross)).fill_null(False)


def categorize_ops(
    kernels: pl.DataFrame,
    memcpys: pl.DataFrame | None = None,
    memsets: pl.DataFrame | None = None,
    graphs: pl.DataFrame | None = None,
    *,
    patterns: Sequence[CommPattern] | None = None,
) -> pl.DataFrame:
    """Kernels, memcpys, memsets and whole-graph launches stacked
    (:func:`tracekit.analysis._frames.gpu_ops`) with ``category`` (``compute``,
    ``communication``, ``memcpy``) and ``comm_kind``.

    Communication kernels per :func:`classify_communication`; peer copies
    (:func:`peer_copy_expr`) are communication of kind ``copy_engine``; other copies and
    memsets are ``memcpy``; every other kernel is ``compute``. A CUDA graph replay traced whole
    (``graph_trace`` rows) is ``compute``: its kernels are not in the trace, so collectives
    captured inside it cannot be told apart (trace with ``--cuda-graph-trace=node`` to see them,
    where they are ordinary communication kernels).
    """
    k = classify_communication(kernels, patterns=patterns)
    keys = rank_keys(*(f for f in (kernels, memcpys, memsets, graphs) if f is not None and f.width))
    base = [*keys, "pid", "global_pid", "device_id", "context_id", "stream_id", "correlation_id",
            "start_ns", "end_ns", "duration_ns"]
    parts = [k.select(*base, "name", pl.lit(None, pl.Int64).alias("bytes"), pl.lit("kernel").alias("op_kind"),
                      pl.when(pl.col("is_communication")).then(pl.lit("communication")).otherwise(pl.lit("compute")).alias("category"),
                      "comm_kind")]
    if memcpys is not None and memcpys.height:
        ops = gpu_ops(kernels.head(0), memcpys, None).filter(pl.col("op_kind") == "memcpy")
        peer = memcpys.select(peer_copy_expr().alias("_peer"))["_peer"]
        ops = ops.with_columns(peer.alias("_peer")).with_columns(
            pl.when(pl.col("_peer")).then(pl.lit("communication")).otherwise(pl.lit("memcpy")).alias("category"),
            pl.when(pl.col("_peer")).then(pl.lit("copy_engine")).otherwise(pl.lit(None, pl.Utf8)).alias("comm_kind"),
        ).drop("_peer")
        parts.append(ops.select(parts[0].columns))
    if memsets is not None and memsets.height:
        ops = gpu_ops(kernels.head(0), None, memsets).filter(pl.col("op_kind") == "memset")
        parts.append(ops.with_columns(pl.lit("memcpy").alias("category"), pl.lit(None, pl.Utf8).alias("comm_kind"))
                     .select(parts[0].columns))
    if graphs is not None and graphs.height:
        ops = gpu_ops(kernels.head(0), None, None, graphs).filter(pl.col("op_kind") == "graph")
        parts.append(ops.with_columns(pl.lit("compute").alias("category"), pl.lit(None, pl.Utf8).alias("comm_kind"))
                     .select(parts[0].columns))
    return pl.concat(parts, how="vertical_relaxed")


def activity_segments(
    ops: pl.DataFrame,
    *,
    start_ns: int | None = None,
    end_ns: int | None = None,
) -> pl.DataFrame:
    """Cut each GPU's timeline into segments of constant state.

    Parameters
    ----------
    ops
        :func:`categorize_ops` output (``device_id``, ``start_ns``, ``end_ns``, ``category``;
        ``rank`` when present).
    start_ns, end_ns
        Clip to this window (capture timeline, ns). By default each device's span runs from
        its first op start to its last op end.

    Returns
    -------
    ``[rank,] device_id, start_ns, end_ns, duration_ns, compute, communication, memcpy``
    (Booleans: is work of that category running) and ``state`` (one of :data:`STATES`),
    sorted by time; consecutive segments touch, so they tile the span.
    """
    keys = [*rank_keys(ops), "device_id"]
    events = []
    for cat in CATEGORIES:
        merged = interval_union(ops.filter(pl.col("category") == cat), keys)
        if start_ns is not None or end_ns is not None:
            merged = _clip(merged, start_ns, end_ns)
        for col, sign in (("start_ns", 1), ("end_ns", -1)):
            events.append(merged.select(*keys, pl.col(col).alias("t"), *(
                pl.lit(sign if c == cat else 0, pl.Int64).alias(f"_d_{c}") for c in CATEGORIES
            )))
    ev = pl.concat(events)
    if start_ns is not None or end_ns is not None:
        # the window's edges are segment edges too (idle until the first op, after the last)
        devices = ops.select(keys).unique()
        edges = [t for t in (start_ns, end_ns) if t is not None]
        ev = pl.concat([ev, devices.join(pl.DataFrame({"t": edges}, schema={"t": pl.Int64}), how="cross").select(
            *keys, "t", *(pl.lit(0, pl.Int64).alias(f"_d_{c}") for c in CATEGORIES))])
    ev = ev.group_by([*keys, "t"]).agg(pl.col(f"_d_{c}").sum() for c in CATEGORIES).sort([*keys, "t"])
    ev = ev.with_columns(
        *(pl.col(f"_d_{c}").cum_sum().over(keys).gt(0).alias(c) for c in CATEGORIES),
        pl.col("t").shift(-1).over(keys).alias("end_ns"),
    ).rename({"t": "start_ns"})
    seg = ev.filter(pl.col("end_ns").is_not_null()).with_columns(
        (pl.col("end_ns") - pl.col("start_ns")).alias("duration_ns"),
        _state().alias("state"),
    )
    return seg.filter(pl.col("duration_ns") > 0).select(
        *keys, "start_ns", "end_ns", "duration_ns", *CATEGORIES, "state"
    )


def _clip(frame: pl.DataFrame, start_ns: int | None, end_ns: int | None) -> pl.DataFrame:
    s = pl.col("start_ns") if start_ns is None else pl.max_horizontal(pl.col("start_ns"), pl.lit(start_ns))
    e = pl.col("end_ns") if end_ns is None else pl.min_horizontal(pl.col("end_ns"), pl.lit(end_ns))
    return frame.with_columns(s.alias("start_ns"), e.alias("end_ns")).filter(pl.col("end_ns") > pl.col("start_ns"))


def _state() -> pl.Expr:
    c, m, x = pl.col("compute"), pl.col("communication"), pl.col("memcpy")
    return (
        pl.when(c & m).then(pl.lit("overlap"))
        .when(m).then(pl.lit("communication_only"))
        .when(c).then(pl.lit("compute_only"))
        .when(x).then(pl.lit("memcpy"))
        .otherwise(pl.lit("idle"))
    )


def _shares(frame: pl.DataFrame, span: str) -> pl.DataFrame:
    total = pl.col(span).cast(pl.Float64)
    comm = pl.col("communication_ns").cast(pl.Float64)
    return frame.with_columns(
        pl.when(total > 0).then(comm / total).alias("comm_share"),
        pl.when(total > 0).then(pl.col("exposed_comm_ns") / total).alias("exposed_share"),
        pl.when(comm > 0).then(pl.col("exposed_comm_ns") / comm).alias("exposed_fraction"),
    )


def overlap_breakdown(segments: pl.DataFrame) -> pl.DataFrame:
    """Time per state per GPU, from :func:`activity_segments`.

    Returns one row per (``rank``,) ``device_id``: ``span_ns``, ``compute_only_ns``,
    ``communication_only_ns``, ``overlap_ns``, ``memcpy_ns``, ``idle_ns`` (they sum to the
    span), ``compute_ns`` (compute only + overlap), ``communication_ns`` (communication only
    + overlap), ``exposed_comm_ns`` (= communication only: not covered by compute),
    ``comm_share`` (communication / span), ``exposed_share`` (exposed / span) and
    ``exposed_fraction`` (exposed / communication), shares 0–1.
    """
    keys = [*rank_keys(segments), "device_id"]
    d = pl.col("duration_ns")
    out = segments.group_by(keys).agg(
        d.sum().alias("span_ns"),
        *(d.filter(pl.col("state") == s).sum().alias(f"{s}_ns") for s in STATES),
    )
    out = out.with_columns(
        (pl.col("compute_only_ns") + pl.col("overlap_ns")).alias("compute_ns"),
        (pl.col("communication_only_ns") + pl.col("overlap_ns")).alias("communication_ns"),
        pl.col("communication_only_ns").alias("exposed_comm_ns"),
    )
    return _shares(out, "span_ns").sort(keys)


# -- per NVTX range --------------------------------------------------------------------------
def range_windows(
    ops_with_launch: pl.DataFrame,
    nvtx: pl.DataFrame,
    *,
    pattern: str | None = None,
    level: int | None = 0,
) -> pl.DataFrame:
    """Each chosen NVTX range's projection on each GPU: the window from the first start to
    the last end of the GPU work launched inside it (nsys's ``nvtx_gpu_proj_trace`` rule).

    Parameters
    ----------
    ops_with_launch
        GPU ops with their launch (:func:`tracekit.analysis.attribution.launch_info` of
        :func:`categorize_ops` or ``kernels``): ``device_id``, ``start_ns``, ``end_ns``,
        ``global_tid``, ``api_start_ns``, ``api_end_ns``.
    nvtx
        The whole ``nvtx`` table in file order.
    pattern
        Keep ranges whose label matches this regular expression (e.g. ``r"^step\\."``).
    level
        Keep ranges at this nesting level (0 = outermost; None = any).

    Returns
    -------
    ``[rank,] range_id, label, level, device_id, start_ns, end_ns, ops``.
    """
    from tracekit.analysis.attribution import enclosing_ranges

    keys = rank_keys(ops_with_launch, nvtx)
    enc = enclosing_ranges(ops_with_launch, nvtx)
    if level is not None:
        enc = enc.filter(pl.col("level") == level)
    if pattern is not None:
        enc = enc.filter(pl.col("label").str.contains(pattern))
    ops = ops_with_launch.with_row_index("op_index").select(
        pl.col("op_index").cast(pl.Int64), "device_id", pl.col("start_ns").alias("_s"), pl.col("end_ns").alias("_e")
    )
    j = enc.join(ops, on="op_index")
    return (
        j.group_by([*keys, "range_id", "label", "level", "device_id"])
        .agg(pl.col("_s").min().alias("start_ns"), pl.col("_e").max().alias("end_ns"), pl.len().alias("ops"))
        .sort([*keys, "device_id", "start_ns"])
    )


def comm_by_range(segments: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Communication share and exposed share of each window (an NVTX range on a GPU).

    Parameters
    ----------
    segments
        :func:`activity_segments` (whole timeline; windows are clipped against it).
    windows
        ``[rank,] device_id, start_ns, end_ns`` plus any id columns (e.g. from
        :func:`range_windows`).

    Returns
    -------
    ``windows`` plus ``window_ns`` and, inside each window, ``compute_only_ns``,
    ``communication_only_ns``, ``overlap_ns``, ``memcpy_ns``, ``idle_ns`` (time outside the
    device's span counts as idle), ``communication_ns``, ``exposed_comm_ns``, ``comm_share``,
    ``exposed_share`` (of the window) and ``exposed_fraction`` (of communication).
    """
    keys = [*rank_keys(segments, windows), "device_id"]
    seg = segments.sort([*keys, "start_ns"])
    seg = seg.with_columns(
        *(
            (pl.when(pl.col("state") == s).then(pl.col("duration_ns")).otherwise(0).cum_sum().over(keys)
             - pl.when(pl.col("state") == s).then(pl.col("duration_ns")).otherwise(0)).alias(f"_c_{s}")
            for s in STATES
        )
    )
    w = windows.with_row_index("_w")

    def at(col: str) -> pl.DataFrame:
        probe = w.select("_w", *keys, pl.col(col).alias("_t")).sort([*keys, "_t"])
        j = probe.join_asof(
            seg.select(*keys, pl.col("start_ns").alias("_t"), pl.col("start_ns").alias("_ss"), "end_ns", "state",
                       *(f"_c_{s}" for s in STATES)),
            on="_t", by=keys, strategy="backward", check_sortedness=False,
        )
        inside = (pl.min_horizontal(pl.col("_t"), pl.col("end_ns")) - pl.col("_ss")).clip(lower_bound=0)
        return j.select(
            "_w",
            *((pl.col(f"_c_{s}") + pl.when(pl.col("state") == s).then(inside).otherwise(0)).fill_null(0).alias(f"{col}_{s}")
              for s in STATES),
        )

    a = at("start_ns")
    b = at("end_ns")
    out = w.join(a, on="_w").join(b, on="_w").sort("_w")
    out = out.with_columns(
        (pl.col("end_ns") - pl.col("start_ns")).alias("window_ns"),
        *((pl.col(f"end_ns_{s}") - pl.col(f"start_ns_{s}")).alias(f"{s}_ns") for s in STATES),
    )
    busy = sum((pl.col(f"{s}_ns") for s in STATES if s != "idle"), pl.lit(0))
    out = out.with_columns((pl.col("window_ns") - busy).alias("idle_ns")).with_columns(
        (pl.col("communication_only_ns") + pl.col("overlap_ns")).alias("communication_ns"),
        pl.col("communication_only_ns").alias("exposed_comm_ns"),
    )
    out = _shares(out, "window_ns")
    drop = [c for c in out.columns if c.startswith(("start_ns_", "end_ns_"))] + ["_w"]
    return out.drop(drop)
