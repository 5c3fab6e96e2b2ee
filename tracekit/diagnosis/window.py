"""The steady-state window: iterations from NVTX ranges or from the repeating kernel sequence,
warm-up iterations excluded.

Iterations come from NVTX ranges named step, iter, iteration, batch, epoch, decode or forward
(as words; :func:`tracekit.analysis.iterations.iterations`), when at least two of them repeat;
else the ranges that each run the model's layers once (:func:`tracekit.analysis.layers.
forward_ranges`: a forward per generated token in a Hugging Face trace with ``--annotate-torch``).
Without them, a CUDA graph replayed at least ``min_repeats`` times that holds at least
:data:`GRAPH_STEP_SHARE` of its device's GPU time gives one step per replay
(:func:`graph_replay_iterations`: how serving engines and ``torch.compile`` run decode). Without such ranges, the kernel names of the busiest GPU are searched for a
period: the smallest ``p`` such that, over a repeating part of the sequence that covers at
least ``period_coverage`` of it, at least ``period_match`` of the names equal the name ``p``
operations later, repeated at least ``min_repeats`` times. The phase is the one whose boundary kernels follow the longest GPU
idle gaps (an iteration normally starts after the host has prepared it). A leading iteration
that takes more than ``warmup_factor`` times the median of the iterations after it (CPU range
or GPU span, whichever is longer) is warm-up; at most half of them are dropped.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import polars as pl

from tracekit.analysis._frames import within_any
from tracekit.analysis.iterations import (
    DEFAULT_ITERATION_PATTERN,
    ITERATION_WORDS,
    iteration_ranges,
    iterations,
)
from tracekit.analysis.layers import forward_ranges
from tracekit.analysis.period import find_period
from tracekit.diagnosis.config import DiagnoseConfig
from tracekit.diagnosis.context import Context
from tracekit.diagnosis.result import Window

__all__ = ["find_period", "graph_replay_iterations", "kernel_period_iterations", "search_window", "steady_ops", "steady_window"]

#: The operations with their launch columns, or a function of CPU ranges (``start_ns``,
#: ``end_ns``; ``None`` for all) that gives at least those launched inside them.
OpsWithLaunch = pl.DataFrame | Callable[[pl.DataFrame | None], pl.DataFrame]

#: The operations, or a function that gives some of their columns (those of ``columns`` they
#: have, ``ops.select(...)``; ``name`` may come as integer codes, equal for equal names).
Ops = pl.DataFrame | Callable[[list[str]], pl.DataFrame]


def kernel_period_iterations(kernels: pl.DataFrame, config: DiagnoseConfig) -> pl.DataFrame:
    """Iterations found from the sequence of GPU operations (kernels, copies and memsets of
    a :func:`~tracekit.analysis.gpu_time.gpu_ops` frame, or kernels alone) of the busiest GPU
    (see the module doc).

    Returns one row per iteration: ``iteration``, ``start_ns`` (first kernel start),
    ``end_ns`` (next iteration's first kernel start; last kernel end for the last one),
    ``duration_ns``, ``gpu_span_ns`` (same), ``kernels``; empty when nothing repeats.
    """
    empty = pl.DataFrame(schema={"iteration": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64,
                                 "duration_ns": pl.Int64, "gpu_span_ns": pl.Int64, "kernels": pl.Int64})
    if kernels.height == 0:
        return empty
    keys = [c for c in ("rank", "device_id") if c in kernels.columns]
    # ties go to the lowest rank / device, whatever order group_by returns them in
    busiest = kernels.group_by(keys).agg(pl.col("duration_ns").sum()).sort(
        ["duration_ns", *keys], descending=[True, *([False] * len(keys))], nulls_last=True).head(1)
    k = kernels.join(busiest.select(keys), on=keys).sort("start_ns").select("start_ns", "end_ns", "name")
    names = k["name"]
    codes = (names if names.dtype.is_integer() else names.cast(pl.Categorical).to_physical()).to_numpy().astype(np.int64)
    found = find_period(codes, match=config.period_match, min_repeats=config.min_repeats, coverage=config.period_coverage)
    if found is None:
        return empty
    p, first, stop = found
    k = k.slice(0, stop)
    codes = codes[:stop]
    starts = k["start_ns"].to_numpy()
    ends = k["end_ns"].to_numpy()
    prev_end = np.maximum.accumulate(ends)
    gap = np.empty_like(starts)
    gap[0] = 0
    gap[1:] = starts[1:] - prev_end[:-1]
    # phase: the offset whose boundary kernels follow the longest idle gaps
    reps = (codes.size - first) // p
    best = max(range(p), key=lambda o: gap[first + o : first + o + reps * p : p].sum() if first + o < codes.size else -1)
    bounds = list(range(first + best, codes.size, p))
    if len(bounds) < config.min_repeats:
        return empty
    rows = []
    for i, b in enumerate(bounds):
        last = bounds[i + 1] - 1 if i + 1 < len(bounds) else codes.size - 1
        if i + 1 == len(bounds) and last - b + 1 < p:
            break  # an incomplete last period
        start = int(starts[b])
        end = int(starts[bounds[i + 1]]) if i + 1 < len(bounds) else int(prev_end[last])
        rows.append((i, start, end, end - start, end - start, last - b + 1))
    return pl.DataFrame(rows, schema=empty.schema, orient="row")


#: Graph replays define the steps only when the replayed graph holds at least this share of
#: its device's GPU time (a graph captured for one small part of a step does not).
GRAPH_STEP_SHARE = 0.25


def graph_replay_iterations(launches: pl.DataFrame, ops: pl.DataFrame, config: DiagnoseConfig) -> pl.DataFrame:
    """Iterations from CUDA graph replays: serving engines and ``torch.compile`` replay each
    decode step as one graph, so without NVTX step ranges the replays of the graph that holds
    the most GPU time are the steps.

    Parameters
    ----------
    launches
        :func:`~tracekit.analysis.graphs.graph_launches` (either trace mode).
    ops
        The GPU operations (``device_id``, ``duration_ns``; ``rank``), to weigh the graph
        against its device's work (:data:`GRAPH_STEP_SHARE`).

    Returns the columns of :func:`kernel_period_iterations`: step ``i`` runs from the start of
    replay ``i`` to the start of replay ``i + 1`` (the last one to its end); ``kernels`` is the
    replay's kernels in per-node traces, else 1. Empty when no graph was launched at least
    ``min_repeats`` times or none holds enough of its device's time.
    """
    empty = pl.DataFrame(schema={"iteration": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64,
                                 "duration_ns": pl.Int64, "gpu_span_ns": pl.Int64, "kernels": pl.Int64})
    if launches.height < config.min_repeats:
        return empty
    dev = [c for c in ("rank", "device_id") if c in launches.columns]
    graph = [*dev, "pid", "graph_exec_id"]
    per = launches.group_by(graph).agg(pl.len().alias("n"), pl.col("gpu_time_ns").sum().alias("g")).filter(pl.col("n") >= config.min_repeats)
    if per.height == 0:
        return empty
    busy = ops.group_by([c for c in dev if c in ops.columns]).agg(pl.col("duration_ns").sum().alias("_all")) if ops.height else None
    if busy is not None and busy.height:
        per = per.join(busy, on=[c for c in dev if c in ops.columns], how="left").filter(
            pl.col("_all").is_null() | (pl.col("g") >= GRAPH_STEP_SHARE * pl.col("_all")))
    if per.height == 0:
        return empty
    top = per.sort(["g", *graph], descending=[True, *([False] * len(graph))], nulls_last=True).head(1).select(graph)
    reps = launches.join(top, on=graph).sort("start_ns")
    starts = reps["start_ns"].to_list()
    ends = reps["end_ns"].to_list()
    kernels = reps["kernels"].fill_null(1).to_list()
    rows = []
    for i, (s0, e0, k) in enumerate(zip(starts, ends, kernels, strict=True)):
        e = starts[i + 1] if i + 1 < len(starts) else e0
        rows.append((i, s0, e, e - s0, e - s0, int(k)))
    return pl.DataFrame(rows, schema=empty.schema, orient="row")


def _warmup_count(lengths: list[int], factor: float) -> int:
    n = len(lengths)
    count = 0
    while count < n // 2:
        rest = lengths[count + 1 :]
        if not rest:
            break
        if lengths[count] > factor * float(np.median(rest)):
            count += 1
        else:
            break
    return count


def _nvtx_iterations(ops_with_launch: OpsWithLaunch, nvtx: pl.DataFrame, config: DiagnoseConfig) -> pl.DataFrame:
    """``iterations`` of the process with the most iteration ranges; with more than
    ``exact_steps`` of them, measured only for the first 50, a middle stretch of
    ``sample_steps`` + some and the last two (the others keep their CPU range, null GPU times).
    ``ops_with_launch`` may be a function of the measured ranges (``None``: all of them)
    giving the operations with their launch columns, at least those launched in the ranges
    (:meth:`tracekit.diagnosis.context.Context.launched_ops`)."""
    ranges = iteration_ranges(nvtx, pattern=config.iteration_pattern)
    if ranges.height == 0:
        return pl.DataFrame()
    proc = [c for c in ("rank", "pid") if c in ranges.columns]
    main = ranges.group_by(proc).len().sort(["len", *proc], descending=[True, *([False] * len(proc))],
                                              nulls_last=True).head(1).select(proc)
    ranges = ranges.join(main, on=proc).sort("iteration")
    n = ranges.height
    if n < 2:  # one matching range is not a loop (a compiler's one-off "…iter…" range)
        return pl.DataFrame()
    if n > config.exact_steps:
        mid = n // 2
        half = config.sample_steps // 2 + 5
        keep = sorted({*range(min(50, n // 2)), *range(max(mid - half, 0), min(mid + half, n)), n - 2, n - 1})
        chosen = ranges.filter(pl.col("iteration").is_in(keep))
        ops = ops_with_launch(chosen) if callable(ops_with_launch) else ops_with_launch
        # first the operations launched inside some chosen range (of any rank: a superset of
        # those the join below keeps), so that only these few are sorted and joined
        if "api_start_ns" in ops.columns:
            ops = ops.filter(within_any(ops["api_start_ns"], chosen["start_ns"], chosen["end_ns"]))
        keys = [c for c in ("rank",) if c in ops.columns and c in chosen.columns]
        win = chosen.select(*keys, pl.col("start_ns").alias("api_start_ns"), pl.col("end_ns").alias("_iend")).sort([*keys, "api_start_ns"])
        # only the columns ``iterations`` reads are filtered and sorted (not every op column)
        needed = [c for c in ("rank", "global_tid", "api_start_ns", "device_id", "start_ns", "end_ns", "duration_ns", "op_kind")
                  if c in ops.columns]
        ops = (
            ops.lazy().select(needed).filter(pl.col("api_start_ns").is_not_null()).collect().sort([*keys, "api_start_ns"])
            .join_asof(win, on="api_start_ns", by=keys or None, strategy="backward", check_sortedness=False)
            .filter(pl.col("_iend").is_not_null() & (pl.col("api_start_ns") <= pl.col("_iend"))).drop("_iend")
        )
    else:
        ops = ops_with_launch(None) if callable(ops_with_launch) else ops_with_launch
    its = iterations(ops, nvtx, pattern=config.iteration_pattern)
    its = its.join(main, on=proc).sort("iteration")
    if n > config.exact_steps:
        its = its.filter(pl.col("ops") > 0)
    return its


def _sample(it: pl.DataFrame, warm: int, n_steady: int, config: DiagnoseConfig) -> tuple[int, int, int] | None:
    """``(start, end, steps)`` of ``sample_steps`` consecutive steady iterations in the middle."""
    steady = it.slice(warm)
    if steady.height <= config.sample_steps:
        return None
    if "iteration" in steady.columns:
        idx = steady["iteration"].to_list()
        mid = len(idx) // 2
        # the longest run of consecutive iteration numbers around the middle
        lo = hi = mid
        while lo > 0 and idx[lo - 1] == idx[lo] - 1 and hi - lo + 1 < config.sample_steps:
            lo -= 1
        while hi + 1 < len(idx) and idx[hi + 1] == idx[hi] + 1 and hi - lo + 1 < config.sample_steps:
            hi += 1
        part = steady.slice(lo, hi - lo + 1)
    else:
        part = steady.slice((steady.height - config.sample_steps) // 2, config.sample_steps)
    return int(part["w_start"].min()), int(part["w_end"].max()), part.height  # type: ignore[arg-type]


def steady_window(
    kernels: Ops,
    ops_with_launch: OpsWithLaunch,
    nvtx: pl.DataFrame,
    config: DiagnoseConfig,
    *,
    trace_start_ns: int | None = None,
    trace_end_ns: int | None = None,
    graph_launches: pl.DataFrame | None = None,
) -> Window:
    """The analysed window of a trace (see the module doc). ``kernels`` is the sequence
    searched for a period: the busiest GPU's operations (``gpu_ops``) or kernels, or a
    function giving some of their columns (:data:`Ops`: read only those, and only when needed).
    ``ops_with_launch``: the operations with their launch columns (``launch_info``), or a
    function that gives them for some CPU ranges (see :func:`_nvtx_iterations`)."""
    if callable(kernels):
        get = kernels
    else:
        frame = kernels

        def get(columns: list[str]) -> pl.DataFrame:
            return frame.select([c for c in columns if c in frame.columns])

    its = _nvtx_iterations(ops_with_launch, nvtx, config) if nvtx.height else pl.DataFrame()
    forwards_why = None
    if its.height == 0 and nvtx.height:
        # no step ranges: the ranges that each run the model's layers once (a forward per token
        # of generate(), as --annotate-torch's root-module ranges give them) are the steps
        fwd = forward_ranges(nvtx)
        if fwd.height >= 2:
            names = fwd["name"].drop_nulls().unique().sort().to_list()
            exact = "^(?:" + "|".join(re.escape(n) for n in names) + ")$"
            its = _nvtx_iterations(ops_with_launch, nvtx, replace(config, iteration_pattern=exact))
            shown = ", ".join(names[:3]) + (" …" if len(names) > 3 else "")
            layers = int(fwd["layers"].max() or 0)  # type: ignore[arg-type]
            forwards_why = f"NVTX forward ranges ({shown}: each runs the model's {layers} layers once)"
    named = ("named " + ", ".join(ITERATION_WORDS[:-1]) + f" or {ITERATION_WORDS[-1]}" if config.iteration_pattern == DEFAULT_ITERATION_PATTERN
             else f"matching {config.iteration_pattern!r}")
    method, why = ("forwards", forwards_why) if forwards_why else ("nvtx", f"NVTX iteration ranges ({named})")
    n_total = its.height
    if its.height:
        n_total = int(its["iteration"].max()) + 1  # type: ignore[arg-type]
        it = its.with_columns(
            pl.min_horizontal("start_ns", "gpu_start_ns").alias("w_start"),
            pl.max_horizontal("end_ns", "gpu_end_ns").alias("w_end"),
            pl.max_horizontal("duration_ns", pl.col("gpu_span_ns").fill_null(0)).alias("length_ns"),
        )
    else:
        it = pl.DataFrame()
        if graph_launches is not None and graph_launches.height:
            it = graph_replay_iterations(graph_launches, get(["rank", "device_id", "duration_ns"]), config)
            method, why = "graph_replays", "no NVTX iteration ranges: one step per replay of the CUDA graph that holds the most GPU time"
        if it.height == 0:
            it = kernel_period_iterations(get(["rank", "device_id", "start_ns", "end_ns", "duration_ns", "name"]), config)
            method, why = "kernel_period", "no NVTX iteration ranges: iterations from the repeating kernel sequence"
        n_total = it.height
        if it.height:
            it = it.with_columns(
                pl.col("start_ns").alias("w_start"), pl.col("end_ns").alias("w_end"), pl.col("duration_ns").alias("length_ns")
            )
        if nvtx.height == 0 and method == "kernel_period":
            why = "no NVTX ranges: iterations from the repeating kernel sequence"
    if it.height:  # iterations without a time (a damaged NVTX table) cannot bound a window
        it = it.filter(pl.col("w_start").is_not_null() & pl.col("w_end").is_not_null() & pl.col("length_ns").is_not_null())
    if it.height == 0:
        times = get(["start_ns", "end_ns"])
        lo = trace_start_ns if trace_start_ns is not None else (int(times["start_ns"].min()) if times.height else 0)  # type: ignore[arg-type]
        hi = trace_end_ns if trace_end_ns is not None else (int(times["end_ns"].max()) if times.height else 0)  # type: ignore[arg-type]
        window = Window(lo, hi, "whole_trace", "no iterations (no NVTX step ranges, no repeating kernel sequence): the whole trace")
        return _sample_whole(window, times, config)
    lengths = it["length_ns"].to_list()
    warm = _warmup_count(lengths, config.warmup_factor)
    steady = it.slice(warm)
    start = int(steady["w_start"].min())  # type: ignore[arg-type]
    if warm:
        # the window opens when the warm-up's own GPU work is over (the host may run ahead)
        gpu_end = "gpu_end_ns" if "gpu_end_ns" in it.columns else "end_ns"
        prev = it.slice(0, warm)[gpu_end].max()
        if prev is not None:
            start = max(start, int(prev))  # type: ignore[arg-type]
    end = int(steady["w_end"].max())  # type: ignore[arg-type]
    step_ns = int(float(np.median(steady["length_ns"].to_numpy())))
    if warm:
        why += f"; the first {warm} iteration(s) took over {config.warmup_factor}× the median of the rest (warm-up)"
    n_steady = n_total - warm
    window = Window(start, end, method, why, steps=n_steady, warmup_steps=warm, step_ns=step_ns, iterations=it)
    n_ops = get(["start_ns"]).filter((pl.col("start_ns") >= start) & (pl.col("start_ns") < end)).height
    if n_ops > config.max_window_ops:
        sample = _sample(it, warm, n_steady, config)
        if sample is not None:
            return replace(window, sample_start_ns=sample[0], sample_end_ns=sample[1], sample_steps=sample[2])
    return window


def search_window(ctx: Context) -> Window:
    """:func:`steady_window` of a diagnosis context, as ``diagnose`` finds it: launch columns
    only for the operations of the measured steps, the operations a column at a time on a big
    export (``Context.ops_for_window``)."""
    return steady_window(ctx.ops_for_window, ctx.launched_ops, ctx.nvtx, ctx.config, graph_launches=ctx.graph_launches)


def _sample_whole(window: Window, ops: pl.DataFrame, config: DiagnoseConfig) -> Window:
    """A whole-trace window over ``max_window_ops``: the middle span holding that many operations."""
    inside = ops.filter((pl.col("start_ns") >= window.start_ns) & (pl.col("start_ns") < window.end_ns)).sort("start_ns")
    if inside.height <= config.max_window_ops:
        return window
    first = (inside.height - config.max_window_ops) // 2
    part = inside.slice(first, config.max_window_ops)
    return replace(window, sample_start_ns=int(part["start_ns"].min()), sample_end_ns=int(part["end_ns"].max()))  # type: ignore[arg-type]


def steady_ops(trace: Any) -> tuple[pl.DataFrame, list[int], str]:
    """Every GPU operation of the steady steps (``gpu_ops`` with the launch columns) with its
    ``step`` (the iteration number), the steady steps' numbers, and how steps were found.

    An operation belongs to the step whose CPU range holds its launch call (NVTX steps) or
    whose GPU span holds its start (steps from the kernel sequence); without steps every
    operation is in step 0. Every step is measured (no sampling)."""
    from tracekit.diagnosis.config import DiagnoseConfig
    from tracekit.diagnosis.context import Context
    from tracekit.diagnosis.window import steady_window

    cfg = DiagnoseConfig(exact_steps=10**9, max_window_ops=10**12)  # every step measured, no sampling
    ctx = Context(trace, cfg)
    w = steady_window(ctx.ops, ctx.ops_with_launch, ctx.nvtx, cfg, graph_launches=ctx.graph_launches)
    ops = ctx.ops_with_launch
    it = w.iterations
    if it.height == 0:
        return ops.with_columns(pl.lit(0, pl.Int64).alias("step")), [0], w.method
    steady = it.slice(w.warmup_steps).select(pl.col("iteration").cast(pl.Int64).alias("step"), "start_ns", "end_ns", "w_start", "w_end")
    if w.method in ("nvtx", "forwards"):  # steps are CPU ranges: an operation is in the step its launch is in
        j = ops.filter(pl.col("api_start_ns").is_not_null()).sort("api_start_ns").join_asof(
            steady.select("step", pl.col("start_ns").alias("api_start_ns"), pl.col("end_ns").alias("_e")).sort("api_start_ns"),
            on="api_start_ns", strategy="backward",
        ).filter(pl.col("step").is_not_null() & (pl.col("api_start_ns") <= pl.col("_e"))).drop("_e")
    else:
        j = ops.sort("start_ns").join_asof(
            steady.select("step", pl.col("w_start").alias("start_ns"), pl.col("w_end").alias("_e")).sort("start_ns"),
            on="start_ns", strategy="backward",
        ).filter(pl.col("step").is_not_null() & (pl.col("start_ns") < pl.col("_e"))).drop("_e")
    return j, steady["step"].to_list(), w.method
