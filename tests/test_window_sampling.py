"""A window of few but long steps is sampled too (issue 44 §4): 20 steps of 48 k kernels were
analysed whole (1.9 GB for a 0.3 GB export) because only windows of more than ``sample_steps``
steps were sampled. Now a window over ``max_window_ops`` operations is cut to as many steps as
hold about that many, whatever its number of steps. On a real capture, with a small bound."""

from __future__ import annotations

import polars as pl

import tracekit
from tests.conftest import run_capture
from tracekit.diagnosis import DiagnoseConfig, diagnose


def test_few_long_steps_are_sampled() -> None:
    path = run_capture("train_ddp_2gpu") / "train_ddp_2gpu.sqlite"
    whole = diagnose(tracekit.open(path))
    w = whole.window
    assert w.steps is not None and w.steps <= DiagnoseConfig().sample_steps and w.sample_steps == 0  # analysed whole
    trace = tracekit.open(path)
    inside = (pl.col("start_ns") >= w.start_ns) & (pl.col("start_ns") < w.end_ns)
    in_window = sum(t.filter(inside).height for t in (trace.kernels, trace.memcpys, trace.memsets))  # its GPU operations
    bound = in_window // 4  # a quarter of the window's operations
    cut = diagnose(tracekit.open(path), config=DiagnoseConfig(max_window_ops=bound)).window
    assert (cut.start_ns, cut.end_ns, cut.steps) == (w.start_ns, w.end_ns, w.steps)  # the same steady window
    assert cut.sample_steps is not None and 1 <= cut.sample_steps < w.steps
    assert cut.sample_steps == max(1, w.steps * bound // in_window)  # steady steps holding about `bound` operations
    sampled = trace.kernels.filter((pl.col("start_ns") >= cut.sample_start_ns) & (pl.col("start_ns") < cut.sample_end_ns)).height
    assert sampled <= bound * 1.5  # about the bound: whole steps


def test_sampled_window_gaps_equal_the_whole_trace_gaps_inside_it() -> None:
    """On a sampled window the gaps are found from the operations and calls around it only
    (``Context._gap_span``: from each GPU's last operation before the window to its first
    after it), not from a step's margin on either side: every gap that overlaps the window,
    its bounds, next operation, launch and cause, equals the one found over the whole trace,
    with fewer calls read (issue 44: 9 M calls for a 500 k-kernel step, now 3 M)."""
    from tracekit.analysis._frames import gpu_ops
    from tracekit.analysis.gpu_time import idle_gaps
    from tracekit.diagnosis.context import Context
    from tracekit.diagnosis.window import search_window

    path = run_capture("train_ddp_2gpu") / "train_ddp_2gpu.sqlite"
    trace = tracekit.open(path)
    config = DiagnoseConfig(max_window_ops=(trace.kernels.height + trace.memcpys.height) // 8)
    ctx = Context(tracekit.open(path), config)
    ctx.prepare_reads()
    ctx.full_window = search_window(ctx)
    ctx.window = w = ctx.full_window.analysed()
    assert ctx.full_window.sampled and ctx.kernels_w["device_id"].n_unique() == 2  # both GPUs in the sample
    every = idle_gaps(gpu_ops(trace.kernels, trace.memcpys, trace.memsets), trace.cuda_api, min_gap_ns=config.min_gap_ns)
    want = every.filter((pl.col("end_ns") > w.start_ns) & (pl.col("start_ns") < w.end_ns)).with_columns(
        pl.max_horizontal("start_ns", pl.lit(w.start_ns)).alias("start_ns"), pl.min_horizontal("end_ns", pl.lit(w.end_ns)).alias("end_ns"),
    ).with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("duration_ns"))
    got = ctx.gaps_w
    assert got.height > 50 and got.sort("device_id", "start_ns").equals(want.select(got.columns).sort("device_id", "start_ns"))
    assert ctx.api_near.height < trace.cuda_api.height // 2
