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
