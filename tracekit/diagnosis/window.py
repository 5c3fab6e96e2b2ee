"""The steady-state window of the diagnosis: the steady iterations of the run's structure.

Iterations, warm-up and start-up are found once, by :mod:`tracekit.analysis.run.structure` (NVTX
step ranges, per-forward ranges, CUDA graph replays or the kernel loop of each GPU); this
module turns that structure into the :class:`~tracekit.diagnosis.result.Window` the rules
read, and, on big traces, picks the sample of consecutive steady iterations they run on.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import polars as pl

from tracekit.analysis.run.structure import (
    Ops,
    OpsWithLaunch,
    RunStructure,
    build_structure,
    find_iterations,
)
from tracekit.diagnosis.config import DiagnoseConfig
from tracekit.diagnosis.context import Context
from tracekit.diagnosis.result import Window

__all__ = ["search_window", "steady_ops", "steady_window", "window_of"]


def _sample(it: pl.DataFrame, warm: int, n_steady: int, config: DiagnoseConfig, n_ops: int = 0) -> tuple[int, int, int] | None:
    """``(start, end, steps)`` of ``sample_steps`` consecutive steady iterations in the middle;
    of a window of few but long steps (no more than ``sample_steps`` of them, ``n_ops``
    operations in all), as many steps as hold about ``max_window_ops`` operations (issue 44:
    20 steps of 48 k kernels were analysed whole, 1.9 GB for a 0.3 GB export)."""
    steady = it.slice(warm)
    want = config.sample_steps
    if steady.height <= want and n_ops > config.max_window_ops:
        want = max(1, steady.height * config.max_window_ops // n_ops)
    if steady.height <= want:
        return None
    config = replace(config, sample_steps=want)
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
    """The analysed window of a trace: :func:`~tracekit.analysis.run.structure.find_iterations`
    and :func:`~tracekit.analysis.run.structure.build_structure` (no kind), as :func:`window_of`
    turns them into a window. ``kernels``: the GPU operations (``gpu_ops``) or a function giving
    some of their columns; ``ops_with_launch``: the operations with their launch columns, or a
    function that gives them for some CPU ranges."""
    get = kernels if callable(kernels) else (lambda cols: kernels.select([c for c in cols if c in kernels.columns]))
    found = find_iterations(get, ops_with_launch, nvtx, config, graph_launches=graph_launches)
    times = get(["start_ns", "end_ns"])
    lo = trace_start_ns if trace_start_ns is not None else (int(times["start_ns"].min()) if times.height else 0)  # type: ignore[arg-type]
    hi = trace_end_ns if trace_end_ns is not None else (int(times["end_ns"].max()) if times.height else 0)  # type: ignore[arg-type]
    return window_of(build_structure(found, config, trace_start_ns=lo, trace_end_ns=hi), get, config)


def window_of(structure: RunStructure, get: Any, config: DiagnoseConfig) -> Window:
    """The :class:`~tracekit.diagnosis.result.Window` of a run's structure: its steady
    iterations, or the whole capture when it has none; on a window of more than
    ``max_window_ops`` operations, a sample of ``sample_steps`` consecutive steady iterations
    from the middle (of the whole capture without iterations: its middle ``max_window_ops``
    operations). ``get(columns)`` gives columns of the GPU operations."""
    s = structure
    if s.total == 0:  # the span of the GPU's work (not the capture's: nothing ran before the first operation)
        times = get(["start_ns", "end_ns"])
        lo = int(times["start_ns"].min()) if times.height else s.trace_start_ns  # type: ignore[arg-type]
        hi = int(times["end_ns"].max()) if times.height else s.trace_end_ns  # type: ignore[arg-type]
        window = Window(lo, hi, "whole_trace", "no iterations (no NVTX step ranges, no repeating kernel sequence): the whole trace")
        return _sample_whole(window, times, config)
    it = s.iterations
    window = Window(s.start_ns, s.end_ns, s.method, s.reason, steps=s.steps, warmup_steps=s.warmup_steps, step_ns=s.step_ns,
                    iterations=it)
    n_ops = get(["start_ns"]).filter((pl.col("start_ns") >= s.start_ns) & (pl.col("start_ns") < s.end_ns)).height
    if n_ops > config.max_window_ops:
        sample = _sample(it, s.warmup_steps, s.steps, config, n_ops)
        if sample is not None:
            return replace(window, sample_start_ns=sample[0], sample_end_ns=sample[1], sample_steps=sample[2])
    return window


def search_window(ctx: Context) -> Window:
    """The window of a diagnosis context: :func:`window_of` its run structure
    (``Context.structure``: launch columns only for the operations of the measured steps, the
    operations a column at a time on a big export)."""
    return window_of(ctx.structure, ctx.ops_for_window, ctx.config)


def _sample_whole(window: Window, ops: pl.DataFrame, config: DiagnoseConfig) -> Window:
    """A whole-trace window over ``max_window_ops``: the middle span holding that many operations."""
    inside = ops.filter((pl.col("start_ns") >= window.start_ns) & (pl.col("start_ns") < window.end_ns)).sort("start_ns")
    if inside.height <= config.max_window_ops:
        return window
    first = (inside.height - config.max_window_ops) // 2
    part = inside.slice(first, config.max_window_ops)
    return replace(window, sample_start_ns=int(part["start_ns"].min()), sample_end_ns=int(part["end_ns"].max()))  # type: ignore[arg-type]


def steady_ops(trace: Any) -> tuple[pl.DataFrame, list[int], str]:
    """Every GPU operation of the run structure's steady steps (``gpu_ops`` with the launch
    columns) with its ``step`` (the iteration number), the steady steps' numbers, and how steps
    were found.

    An operation belongs to the step whose CPU range holds its launch call (NVTX steps) or
    whose GPU span holds its start (steps from the kernel sequence); without steps every
    operation is in step 0. Every step is measured (no sampling)."""
    cfg = DiagnoseConfig(exact_steps=10**9, max_window_ops=10**12)  # every step measured, no sampling
    ctx = Context(trace, cfg)
    w = window_of(ctx.structure, ctx.ops_for_window, cfg)
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
