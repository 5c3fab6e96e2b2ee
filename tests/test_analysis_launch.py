"""Launch cost (against nsys's cuda_kern_exec_sum) and launch-bound stretches."""

from __future__ import annotations

import warnings

import polars as pl

import tracekit
from tracekit.analysis.launch import kernel_launch_times, launch_bound_stretches, launch_cost
from tracekit.stats.summaries import api_display_name

from .conftest import SAMPLES
from .nsys_reference import read_reference

DECODE = SAMPLES / "llm_decode_1gpu"


def _open() -> tracekit.NsysTrace:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tracekit.open(DECODE / "llm_decode_1gpu.sqlite")  # type: ignore[return-value]


def test_launch_cost_agrees_with_nsys_kern_exec_sum() -> None:
    t = _open()
    k = kernel_launch_times(t.kernels, t.cuda_api).with_columns(api_display_name(pl.col("api_name")).alias("api"))
    ours = launch_cost(k, by=("api", "name"))
    ref = read_reference(DECODE / "stats" / "llm_decode_1gpu_cuda_kern_exec_sum.csv")
    h = ref[0]
    for row in ref[1:]:
        r = dict(zip(h, row, strict=True))
        mine = ours.filter((pl.col("api") == r["API Name"]) & (pl.col("name") == r["Kernel Name"])).row(0, named=True)
        assert mine["kernels"] == int(r["Count"]) and mine["queued"] == int(r["QCount"])
        assert round(mine["api_mean_ns"], 1) == float(r["AAvg (ns)"])
        assert round(mine["kernel_mean_ns"], 1) == float(r["KAvg (ns)"])
        if r["QAvg (ns)"]:
            assert round(mine["queue_mean_ns"], 1) == float(r["QAvg (ns)"])
            assert mine["queue_median_ns"] == float(r["QMed (ns)"])


def test_launch_bound_stretches_are_runs_of_starved_short_kernels() -> None:
    t = _open()
    k = kernel_launch_times(t.kernels, t.cuda_api).sort("start_ns")
    stretches = launch_bound_stretches(k, short_kernel_ns=20_000, max_gap_ns=1_000_000, min_kernels=5)
    assert stretches.height > 0
    prev_end = k["end_ns"].cum_max().shift(1)
    starved = (
        (k["duration_ns"] < 20_000) & (k["api_end_ns"] >= prev_end) & ((k["start_ns"] - prev_end) <= 1_000_000)
    ).fill_null(False)
    for row in stretches.iter_rows(named=True):
        inside = k.filter((pl.col("end_ns") > row["start_ns"]) & (pl.col("end_ns") <= row["end_ns"]))
        flags = starved.filter((k["end_ns"] > row["start_ns"]) & (k["end_ns"] <= row["end_ns"]))
        assert inside.height == row["kernels"] and flags.all()
        assert row["busy_ns"] == inside["duration_ns"].sum()
        assert row["idle_ns"] == row["end_ns"] - row["start_ns"] - row["busy_ns"] > 0
    none = launch_bound_stretches(k, short_kernel_ns=1)
    assert none.height == 0
