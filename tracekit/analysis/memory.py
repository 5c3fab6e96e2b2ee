"""Copies and device memory: bandwidth per copy kind with flags for costly copy patterns,
device memory in use over time with its peak, and the memory each NVTX range (layer) adds.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import polars as pl

from tracekit.analysis._frames import process_key, rank_keys
from tracekit.analysis.attribution import launch_info, nvtx_ranges
from tracekit.analysis.layers import forward_ranges
from tracekit.analysis.run.iterations import DEFAULT_ITERATION_PATTERN, iteration_ranges

__all__ = [
    "DEFAULT_PHASES",
    "HOST_MEMORY_KINDS",
    "allocations_at_peak",
    "copies",
    "copy_summary",
    "layer_memory",
    "layer_memory_summary",
    "memory_peak",
    "memory_timeline",
]

#: Memory kinds that live on the host; excluded from device memory in use.
HOST_MEMORY_KINDS: tuple[str, ...] = ("Pageable", "Pinned")


def copies(memcpys: pl.DataFrame, cuda_api: pl.DataFrame | None = None) -> pl.DataFrame:
    """Each memcpy with its achieved bandwidth and flags.

    Input: ``memcpys`` (``bytes``, ``duration_ns``, ``copy_kind``, ``src_kind``,
    ``dst_kind``, ``correlation_id``, ``global_pid``) and, for the API-based flags,
    ``cuda_api`` (or ``memcpys`` already through
    :func:`~tracekit.analysis.attribution.launch_info`).

    Adds ``bandwidth_gbps`` (bytes / ns = 10⁹ B/s; null for zero duration), ``pageable``
    (either side is pageable host memory), ``api_name`` and the launch columns,
    ``is_async`` (the call was an ``*Async`` one), ``pageable_async`` (an async call on
    pageable memory: the driver stages it synchronously, so it does not overlap with the
    host), ``synchronous`` (a blocking call such as ``cudaMemcpy``; null when the call is
    unknown).
    """
    m = memcpys
    if cuda_api is not None and "api_name" not in m.columns:
        m = launch_info(m, cuda_api)
    if "api_name" not in m.columns:
        m = m.with_columns(pl.lit(None, pl.Utf8).alias("api_name"))
    pageable = (pl.col("src_kind") == "Pageable") | (pl.col("dst_kind") == "Pageable")
    is_async = pl.col("api_name").str.contains("Async")
    return m.with_columns(
        pl.when(pl.col("duration_ns") > 0).then(pl.col("bytes") / pl.col("duration_ns")).alias("bandwidth_gbps"),
        pageable.fill_null(False).alias("pageable"),
        is_async.alias("is_async"),
        (is_async & pageable.fill_null(False)).alias("pageable_async"),
        (~is_async).alias("synchronous"),
    )


def copy_summary(
    memcpys: pl.DataFrame,
    memsets: pl.DataFrame | None = None,
    cuda_api: pl.DataFrame | None = None,
    *,
    by: Sequence[str] = ("kind",),
) -> pl.DataFrame:
    """Bytes, time and bandwidth per copy kind (``HtoD``, ``DtoH``, ``DtoD``, ``PtoP`` …, and
    ``memset``).

    ``by`` may add columns of the copy tables (``device_id``, ``src_kind``, ``dst_kind``).
    Returns (``rank``,) ``by``, ``count``, ``bytes``, ``time_ns``, ``bandwidth_gbps`` (total
    bytes / total time), ``median_bandwidth_gbps`` (per copy), ``max_bandwidth_gbps``,
    ``pageable_async`` and ``synchronous`` (counts; null without ``cuda_api``), largest
    time first.
    """
    c = copies(memcpys, cuda_api).with_columns(pl.col("copy_kind").alias("kind"))
    parts = [c]
    if memsets is not None and memsets.height:
        s = memsets.with_columns(
            pl.lit("memset").alias("kind"),
            pl.when(pl.col("duration_ns") > 0).then(pl.col("bytes") / pl.col("duration_ns")).alias("bandwidth_gbps"),
            pl.lit(False).alias("pageable_async"),
            pl.lit(None, pl.Boolean).alias("synchronous"),
        )
        cols = [x for x in c.columns if x in s.columns]
        parts = [c.select(cols), s.select(cols)]
    frame = pl.concat(parts, how="vertical_relaxed")
    keys = list(dict.fromkeys([*rank_keys(frame), *by]))  # "rank" may be given too
    has_api = cuda_api is not None or "api_name" in memcpys.columns
    out = frame.group_by(keys).agg(
        pl.len().cast(pl.Int64).alias("count"),
        pl.col("bytes").sum(),
        pl.col("duration_ns").sum().alias("time_ns"),
        pl.col("bandwidth_gbps").median().alias("median_bandwidth_gbps"),
        pl.col("bandwidth_gbps").max().alias("max_bandwidth_gbps"),
        pl.col("pageable_async").sum().cast(pl.Int64).alias("pageable_async") if has_api else pl.lit(None, pl.Int64).alias("pageable_async"),
        pl.col("synchronous").sum().cast(pl.Int64).alias("synchronous") if has_api else pl.lit(None, pl.Int64).alias("synchronous"),
    )
    out = out.with_columns(
        pl.when(pl.col("time_ns") > 0).then(pl.col("bytes") / pl.col("time_ns")).alias("bandwidth_gbps")
    )
    rk = rank_keys(frame)
    return out.select(*keys, "count", "bytes", "time_ns", "bandwidth_gbps", "median_bandwidth_gbps",
                      "max_bandwidth_gbps", "pageable_async", "synchronous").sort(
        [*rk, "time_ns"], descending=[*([False] * len(rk)), True]
    )


def _device_events(memory_usage: pl.DataFrame, kinds: Sequence[str] | None) -> pl.DataFrame:
    keys = rank_keys(memory_usage)
    m = memory_usage.with_row_index("_ev")
    m = m.filter(pl.col("mem_kind").is_in(list(kinds))) if kinds is not None else m.filter(
        ~pl.col("mem_kind").is_in(list(HOST_MEMORY_KINDS)).fill_null(False)
    )
    by = [*keys, "global_pid", "device_id", "address"]
    allocs = m.filter(pl.col("operation") == "alloc")
    frees = m.filter(pl.col("operation") == "free")
    if frees.height:
        # the size freed is the size of the latest allocation at that address
        matched = frees.sort([*by, "start_ns"]).join_asof(
            allocs.select(*by, "start_ns", pl.col("bytes").alias("_alloc_bytes")).sort([*by, "start_ns"]),
            on="start_ns", by=by, strategy="backward", check_sortedness=False,
        )
        frees = matched.with_columns(
            pl.when(pl.col("bytes").fill_null(0) > 0).then(pl.col("bytes")).otherwise(pl.col("_alloc_bytes")).fill_null(0).alias("bytes")
        ).drop("_alloc_bytes")
    ev = pl.concat([
        allocs.with_columns(pl.col("bytes").alias("delta_bytes"), pl.lit(1).alias("_order")),
        frees.with_columns((-pl.col("bytes")).alias("delta_bytes"), pl.lit(0).alias("_order")),
    ], how="vertical_relaxed")
    return ev


def _running(ev: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Events of :func:`_device_events` in time order per ``keys`` (frees first at equal
    times), with ``in_use_bytes``, the running total of ``delta_bytes``."""
    ev = ev.sort([*keys, "start_ns", "_order", "_ev"])
    return ev.with_columns(pl.col("delta_bytes").cum_sum().over(keys).alias("in_use_bytes"))


def memory_timeline(
    memory_usage: pl.DataFrame, *, kinds: Sequence[str] | None = None, per_process: bool = False
) -> pl.DataFrame:
    """Device memory in use after each allocation and free.

    Input: ``memory_usage`` (``--cuda-memory-usage=true``). ``kinds`` selects memory kinds
    (default: all but host memory, :data:`HOST_MEMORY_KINDS`). Frees count the bytes of the
    allocation they release (matched by address). Events at the same nanosecond apply frees
    first. ``per_process`` keeps one running total per process and device (what
    :func:`layer_memory` reports) instead of one per device.

    Returns (``rank``,) (``global_pid``, ``pid``,) ``device_id``, ``start_ns``, ``operation``,
    ``mem_kind``, ``address``, ``delta_bytes``, ``in_use_bytes`` (running total per device,
    or per process and device, from the first event in the trace: memory allocated before the
    capture began is not known), in time order.
    """
    keys = [*rank_keys(memory_usage), *(["global_pid"] if per_process else []), "device_id"]
    ev = _running(_device_events(memory_usage, kinds), keys)
    return ev.select(*keys[:-1], *(["pid"] if per_process else []), "device_id", "start_ns", "operation", "mem_kind",
                     "address", "delta_bytes", "in_use_bytes")


def memory_peak(memory_usage: pl.DataFrame, *, kinds: Sequence[str] | None = None) -> pl.DataFrame:
    """Peak device memory in use per device.

    Returns (``rank``,) ``device_id``, ``peak_bytes``, ``peak_ns`` (first time the peak was
    reached), ``final_bytes``, ``allocations``, ``frees`` and ``live_at_peak`` (allocations
    live at the peak; list them with :func:`allocations_at_peak`).
    """
    keys = [*rank_keys(memory_usage), "device_id"]
    tl = memory_timeline(memory_usage, kinds=kinds)
    peak = tl.sort([*keys, "in_use_bytes", "start_ns"], descending=[*([False] * len(keys)), True, False]).unique(
        subset=keys, keep="first", maintain_order=True
    ).select(*keys, pl.col("in_use_bytes").alias("peak_bytes"), pl.col("start_ns").alias("peak_ns"))
    stats = tl.group_by(keys).agg(
        pl.col("in_use_bytes").last().alias("final_bytes"),
        (pl.col("operation") == "alloc").sum().cast(pl.Int64).alias("allocations"),
        (pl.col("operation") == "free").sum().cast(pl.Int64).alias("frees"),
    )
    live = allocations_at_peak(memory_usage, kinds=kinds).group_by(keys).agg(pl.len().cast(pl.Int64).alias("live_at_peak"))
    return peak.join(stats, on=keys).join(live, on=keys, how="left").sort(keys)


def allocations_at_peak(
    memory_usage: pl.DataFrame, cuda_api: pl.DataFrame | None = None, *, kinds: Sequence[str] | None = None
) -> pl.DataFrame:
    """The allocations live when each device reached its peak: what filled the memory.

    Returns (``rank``,) ``device_id``, ``address``, ``bytes``, ``mem_kind``, ``start_ns``
    (allocation time), ``correlation_id``, ``name`` (allocation name when the allocator set
    one) and, with ``cuda_api``, ``api_name`` (``cudaMalloc``, ``cuMemCreate`` …) and the
    launching thread; largest first.
    """
    keys = [*rank_keys(memory_usage), "device_id"]
    tl = memory_timeline(memory_usage, kinds=kinds)
    peak = tl.sort([*keys, "in_use_bytes", "start_ns"], descending=[*([False] * len(keys)), True, False]).unique(
        subset=keys, keep="first", maintain_order=True
    ).select(*keys, pl.col("start_ns").alias("_peak_ns"))
    ev = _device_events(memory_usage, kinds)
    by = [*rank_keys(memory_usage), "global_pid", "device_id", "address"]
    allocs = ev.filter(pl.col("operation") == "alloc").sort([*by, "start_ns"])
    frees = ev.filter(pl.col("operation") == "free").select(*by, "start_ns", pl.col("start_ns").alias("_freed_ns")).sort([*by, "start_ns"])
    allocs = allocs.join_asof(frees, on="start_ns", by=by, strategy="forward", check_sortedness=False) if frees.height else allocs.with_columns(pl.lit(None, pl.Int64).alias("_freed_ns"))
    live = allocs.join(peak, on=keys).filter(
        (pl.col("start_ns") <= pl.col("_peak_ns")) & (pl.col("_freed_ns").is_null() | (pl.col("_freed_ns") > pl.col("_peak_ns")))
    )
    cols = [*keys, "address", "bytes", "mem_kind", "start_ns", "correlation_id", "name"]
    if cuda_api is not None:
        live = launch_info(live, cuda_api)
        cols += ["api_name", "tid", "api_start_ns"]
    return live.select(cols).sort([*keys, "bytes"], descending=[*([False] * len(keys)), True])


#: Phase of a range, from its NVTX path (its own label and those of the ranges enclosing it on
#: its thread): the first pattern that matches names the phase, ``forward`` when none does.
DEFAULT_PHASES: dict[str, str] = {"backward": r"(?i)backward", "optimizer": r"(?i)optimi[sz]er"}

_LAYER_SCHEMA: dict[str, type[pl.DataType] | pl.DataType] = {
    "pid": pl.Int64, "tid": pl.Int64, "range_id": pl.Int64, "name": pl.Utf8, "path": pl.Utf8,
    "level": pl.Int64, "phase": pl.Utf8, "step": pl.Int64, "instance": pl.Int64, "device_id": pl.Int64,
    "start_ns": pl.Int64, "end_ns": pl.Int64, "duration_ns": pl.Int64,
    "in_use_at_entry_bytes": pl.Int64, "in_use_at_exit_bytes": pl.Int64, "peak_inside_bytes": pl.Int64,
    "net_growth_bytes": pl.Int64, "allocated_bytes": pl.Int64, "freed_bytes": pl.Int64,
    "n_allocs": pl.Int64, "n_frees": pl.Int64,
}


def _range_max(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``max(values[lo:hi + 1])`` for each pair (``lo <= hi``), from a sparse table: O(n log n)
    to build, O(1) a query, so nested ranges over many events cost no N × M join."""
    out = np.empty(len(lo), dtype=values.dtype)
    if len(lo) == 0:
        return out
    levels = np.frexp((hi - lo + 1).astype(np.float64))[1] - 1  # floor(log2(length))
    table = values
    for k in range(int(levels.max()) + 1):
        if k:
            half = 1 << (k - 1)
            table = np.maximum(table[:-half], table[half:])
        at = levels == k
        if at.any():
            out[at] = np.maximum(table[lo[at]], table[hi[at] - (1 << k) + 1])
    return out


def _empty_layer_memory(rk: list[str], nvtx: pl.DataFrame, why: str) -> pl.DataFrame:
    warnings.warn(f"layer_memory: no rows: {why}", _empty_warning(), stacklevel=3)
    return pl.DataFrame(schema={**({"rank": nvtx.schema["rank"]} if rk else {}), **_LAYER_SCHEMA})


def _empty_warning() -> type[Warning]:
    from tracekit.errors import EmptyResultWarning

    return EmptyResultWarning


def _check_regex(option: str, pattern: str) -> None:
    """Raise one :class:`~tracekit.errors.TracekitError` line when ``pattern`` is not a regular
    expression polars can run (its error is several lines, naming the expression, not the option)."""
    try:
        pl.Series([""], dtype=pl.Utf8).str.contains(pattern)
    except pl.exceptions.ComputeError as exc:
        from tracekit.errors import TracekitError

        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        why = next((ln.removeprefix("error: ") for ln in lines if ln.startswith("error:")), lines[0] if lines else "")
        msg = f"layer_memory: {option}={pattern!r} is not a valid regular expression ({why})"
        raise TracekitError(msg) from None


def _phase(path: pl.Expr, phases: Mapping[str, str]) -> pl.Expr:
    out: pl.Expr = pl.lit("forward")
    for name, pattern in reversed(list(phases.items())):
        out = pl.when(path.str.contains(pattern).fill_null(False)).then(pl.lit(name)).otherwise(out)
    return out


def layer_memory(
    memory_usage: pl.DataFrame,
    nvtx: pl.DataFrame,
    *,
    ranges: str | None = None,
    kinds: Sequence[str] | None = None,
    per_step: bool | str = True,
    phases: Mapping[str, str] | None = None,
) -> pl.DataFrame:
    """Device memory at the entry and exit of each NVTX range instance, its peak inside, and
    what the range allocated and freed: the activation memory a layer adds in the forward
    pass and what backward releases.

    Parameters
    ----------
    memory_usage
        The ``memory_usage`` table (``--cuda-memory-usage=true``): ``global_pid``,
        ``device_id``, ``start_ns``, ``address``, ``bytes``, ``mem_kind``, ``operation``.
    nvtx
        The whole ``nvtx`` table (see :func:`~tracekit.analysis.attribution.nvtx_ranges`).
    ranges
        Regular expression searched in each range's label (``domain:name`` or ``name``), e.g.
        ``r"^layer\\.\\d+$"``, or :data:`~tracekit.analysis.layers.LAYER_RANGE_PATTERN` for
        every layer's own range (``layer.3``, ``model.layers.3``, ``transformer.h.3``);
        ``None`` keeps every closed push/pop and start/end range.
    kinds
        Memory kinds counted (default: all but host memory, :data:`HOST_MEMORY_KINDS`).
    per_step
        ``True``: ``step`` is the iteration (:func:`~tracekit.analysis.run.iterations.
        iteration_ranges`, default pattern ``step|iter``) of the range's process that contains
        the range's start or, in a trace without iteration ranges, the forward
        (:func:`~tracekit.analysis.layers.forward_ranges`: one per run of the layers, such as
        ``--annotate-torch``'s root-module range, numbered from 0 per process); a string is
        that iteration pattern instead (no forwards); ``False`` leaves ``step`` null.
    phases
        Phase name → regular expression searched in the range's NVTX ``path`` (its own label
        and those of the ranges enclosing it on its thread); the first match names the phase,
        ``forward`` when none matches. Default :data:`DEFAULT_PHASES` (``backward``,
        ``optimizer``).

    A pattern (``ranges``, ``per_step``, ``phases``) that is not a valid regular expression
    (polars' syntax) raises :class:`~tracekit.errors.TracekitError` naming the option.

    Returns
    -------
    One row per range instance and device on which its process has memory events, sorted by
    (``rank``,) ``pid``, ``device_id``, ``start_ns``: (``rank``,) ``pid``, ``tid``,
    ``range_id``, ``name`` (label), ``path``, ``level``, ``phase``, ``step``, ``instance``
    (0-based occurrence of the name in its process, in start order), ``device_id``,
    ``start_ns``, ``end_ns``, ``duration_ns`` (ns), and in bytes:
    ``in_use_at_entry_bytes``, ``in_use_at_exit_bytes``, ``peak_inside_bytes``,
    ``net_growth_bytes`` (exit − entry), ``allocated_bytes``, ``freed_bytes``, with counts
    ``n_allocs`` and ``n_frees``.

    Notes
    -----
    Memory in use is that of the range's process on the device (the running total of
    :func:`memory_timeline` kept per process; it starts at 0 at the first event, so memory
    allocated before the capture is not known). CUPTI's memory events carry no thread, so a
    range counts every event of its process inside its time window, whichever thread made
    it; ranges on different threads that overlap in time share the events.

    A range covers the half-open interval ``[start_ns, end_ns)``: an event at exactly
    ``start_ns`` is inside the range, one at exactly ``end_ns`` is not (it belongs after the
    range, and to a range starting at that time). So ``in_use_at_entry_bytes`` is the total
    after every event before ``start_ns``, ``in_use_at_exit_bytes`` the total after every
    event before ``end_ns``, ``net_growth_bytes = allocated_bytes − freed_bytes``, and
    ``peak_inside_bytes`` is the largest total after any event inside, or the entry total
    when larger (a zero-length range has nothing inside: peak = entry = exit). Frees count
    the size of the allocation they release; at equal times frees apply before allocations
    (as in :func:`memory_timeline`). Ranges still open at the end of the capture are left
    out. Empty (same columns, with an :class:`~tracekit.errors.EmptyResultWarning` that says
    why) when there are no memory events, no ranges, or no range's process has memory events.
    """
    for option, pattern in [("ranges", ranges), ("per_step", per_step if isinstance(per_step, str) else None),
                            *((f"phases[{name!r}]", p) for name, p in (phases or {}).items())]:
        if pattern is not None:
            _check_regex(option, pattern)
    rk = rank_keys(memory_usage, nvtx)
    if not rk:  # a rank column on one side only names nothing to match
        memory_usage = memory_usage.drop("rank", strict=False)
        nvtx = nvtx.drop("rank", strict=False)
    if memory_usage.height == 0:
        return _empty_layer_memory(rk, nvtx, "the trace has no CUDA memory usage events (capture with --cuda-memory-usage=true)")
    tl = memory_timeline(memory_usage, kinds=kinds, per_process=True)
    if tl.height == 0:
        which = f"of kinds {list(kinds)}" if kinds is not None else "of device memory (only host memory events)"
        return _empty_layer_memory(rk, nvtx, f"no memory events {which}")
    r = nvtx_ranges(nvtx).filter(~pl.col("is_open")) if nvtx.height else pl.DataFrame()
    if r.height == 0:
        return _empty_layer_memory(rk, nvtx, "the trace has no closed NVTX push/pop or start/end ranges")
    if ranges is not None:
        r = r.filter(pl.col("label").str.contains(ranges).fill_null(False))
        if r.height == 0:
            return _empty_layer_memory(rk, nvtx, f"no NVTX range label matches {ranges!r}")
    r = r.sort([*rk, "pid", "start_ns", "range_id"]).with_columns(
        process_key("global_tid").alias("global_pid"),
        pl.int_range(pl.len(), dtype=pl.Int64).over([*rk, "pid", "label"]).alias("instance"),
        _phase(pl.col("path"), DEFAULT_PHASES if phases is None else phases).alias("phase"),
    )
    if per_step is not False:
        pattern = DEFAULT_ITERATION_PATTERN if per_step is True else str(per_step)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            its = iteration_ranges(nvtx, pattern=pattern)
        if its.height == 0 and per_step is True:
            # no step ranges: each forward (one run of the layers, e.g. --annotate-torch's
            # root module range) is a step
            its = forward_ranges(nvtx).rename({"forward": "iteration"})
        win = its.select(*rk, "pid", "start_ns", pl.col("iteration").alias("step"), pl.col("end_ns").alias("_step_end"))
        r = r.join_asof(win.sort([*rk, "pid", "start_ns"]), on="start_ns", by=[*rk, "pid"], strategy="backward",
                        check_sortedness=False)
        r = r.with_columns(pl.when(pl.col("start_ns") < pl.col("_step_end")).then(pl.col("step")).alias("step"))
    else:
        r = r.with_columns(pl.lit(None, pl.Int64).alias("step"))

    g = [*rk, "global_pid", "device_id"]
    tl = tl.with_columns(
        pl.col("delta_bytes").clip(lower_bound=0).cum_sum().over(g).alias("_alloc_b"),
        (-pl.col("delta_bytes")).clip(lower_bound=0).cum_sum().over(g).alias("_free_b"),
        (pl.col("operation") == "alloc").cast(pl.Int64).cum_sum().over(g).alias("_alloc_n"),
        (pl.col("operation") == "free").cast(pl.Int64).cum_sum().over(g).alias("_free_n"),
    )
    # one snapshot per nanosecond (the state after all its events): with frees first, the
    # largest state within a nanosecond is never above the larger of the one before it and
    # the one after all its events, so peaks over snapshots are peaks over events
    snaps = tl.unique(subset=[*g, "start_ns"], keep="last", maintain_order=True).with_row_index("_pos").with_columns(
        pl.col("_pos").cast(pl.Int64)
    )
    first = snaps.group_by(g).agg(pl.col("_pos").min().alias("_first"))
    r = r.join(first.select(g), on=[*rk, "global_pid"], how="inner")
    if r.height == 0:
        return _empty_layer_memory(rk, nvtx, "no process with NVTX ranges has memory events")
    state = ["in_use_bytes", "_alloc_b", "_free_b", "_alloc_n", "_free_n", "_pos"]
    right = snaps.select(*g, "start_ns", *state).sort([*g, "start_ns"])

    def before(at: str, suffix: str) -> pl.DataFrame:
        # the state after the last event strictly before `at`
        left = r.select(*g, "range_id", pl.col(at).alias("start_ns")).sort([*g, "start_ns"])
        j = left.join_asof(right, on="start_ns", by=g, strategy="backward", allow_exact_matches=False,
                           check_sortedness=False)
        return j.select(*g, "range_id", *(pl.col(c).alias(c + suffix) for c in state))

    r = r.join(before("start_ns", "_s"), on=[*g, "range_id"]).join(before("end_ns", "_e"), on=[*g, "range_id"])
    r = r.join(first, on=g)
    zero = ["in_use_bytes", "_alloc_b", "_free_b", "_alloc_n", "_free_n"]
    r = r.with_columns(
        *(pl.col(c + sfx).fill_null(0) for c in zero for sfx in ("_s", "_e")),
        pl.col("_pos_s").fill_null(pl.col("_first") - 1).alias("_lo"),
        pl.col("_pos_e").fill_null(pl.col("_first") - 1).alias("_hi"),
    ).with_columns(pl.col("_lo") + 1)
    lo, hi = r["_lo"].to_numpy(), r["_hi"].to_numpy()
    inside = hi >= lo
    peak = r["in_use_bytes_s"].to_numpy().copy()
    peak[inside] = np.maximum(peak[inside], _range_max(snaps["in_use_bytes"].to_numpy(), lo[inside], hi[inside]))
    r = r.with_columns(pl.Series("peak_inside_bytes", peak, dtype=pl.Int64))
    out = r.select(
        *rk, "pid", "tid", "range_id", pl.col("label").alias("name"), "path", "level", "phase", "step", "instance",
        "device_id", "start_ns", "end_ns", (pl.col("end_ns") - pl.col("start_ns")).alias("duration_ns"),
        pl.col("in_use_bytes_s").alias("in_use_at_entry_bytes"), pl.col("in_use_bytes_e").alias("in_use_at_exit_bytes"),
        "peak_inside_bytes", (pl.col("in_use_bytes_e") - pl.col("in_use_bytes_s")).alias("net_growth_bytes"),
        (pl.col("_alloc_b_e") - pl.col("_alloc_b_s")).alias("allocated_bytes"),
        (pl.col("_free_b_e") - pl.col("_free_b_s")).alias("freed_bytes"),
        (pl.col("_alloc_n_e") - pl.col("_alloc_n_s")).alias("n_allocs"),
        (pl.col("_free_n_e") - pl.col("_free_n_s")).alias("n_frees"),
    )
    return out.cast({k: v for k, v in _LAYER_SCHEMA.items() if k not in ("name", "path", "phase")}).sort(
        [*rk, "pid", "device_id", "start_ns", "range_id"]
    )


def layer_memory_summary(per_range: pl.DataFrame, *, by: Sequence[str] = ("name", "phase")) -> pl.DataFrame:
    """Per layer name (and phase): how much memory its instances add and release.

    Input: :func:`layer_memory`. ``by`` are its columns (add ``"step"`` for one row per step,
    ``"device_id"`` per device). Returns (``rank``,) ``by``, ``instances``, and in bytes
    ``mean_net_growth_bytes``, ``min_net_growth_bytes``, ``max_net_growth_bytes``,
    ``total_net_growth_bytes``, ``mean_allocated_bytes``, ``mean_freed_bytes``,
    ``max_peak_above_entry_bytes`` (largest ``peak_inside − in_use_at_entry``), with
    ``n_allocs`` and ``n_frees`` summed; in order of first appearance.
    """
    keys = list(dict.fromkeys([*rank_keys(per_range), *by]))
    f = per_range.with_columns((pl.col("peak_inside_bytes") - pl.col("in_use_at_entry_bytes")).alias("_above"))
    return f.sort([*rank_keys(per_range), "start_ns", "range_id"]).group_by(keys, maintain_order=True).agg(
        pl.len().cast(pl.Int64).alias("instances"),
        pl.col("net_growth_bytes").mean().alias("mean_net_growth_bytes"),
        pl.col("net_growth_bytes").min().alias("min_net_growth_bytes"),
        pl.col("net_growth_bytes").max().alias("max_net_growth_bytes"),
        pl.col("net_growth_bytes").sum().alias("total_net_growth_bytes"),
        pl.col("allocated_bytes").mean().alias("mean_allocated_bytes"),
        pl.col("freed_bytes").mean().alias("mean_freed_bytes"),
        pl.col("_above").max().alias("max_peak_above_entry_bytes"),
        pl.col("n_allocs").sum(),
        pl.col("n_frees").sum(),
    )
