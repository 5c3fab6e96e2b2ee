"""Iterations from NVTX step ranges, checked against SQL on the raw rows."""

from __future__ import annotations

import sqlite3
import warnings
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit.analysis.attribution import launch_info
from tracekit.analysis.gpu_time import gpu_ops
from tracekit.analysis.run.iterations import iteration_stats, iterations

from .conftest import NSYS_CORPUS, SAMPLES

DECODE = SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
TRAIN = SAMPLES / "llm_train_emit_nvtx_1gpu" / "llm_train_emit_nvtx_1gpu.sqlite"
TP2 = SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"


def _ops(path: Path) -> tuple[tracekit.NsysTrace, pl.DataFrame]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = tracekit.open(path)
    return t, launch_info(gpu_ops(t.kernels, t.memcpys, t.memsets), t.cuda_api)  # type: ignore[union-attr]


def test_steps_of_the_decode_sample() -> None:
    t, ops = _ops(DECODE)
    it = iterations(ops, t.nvtx)
    assert it["name"].to_list() == [f"step.{i}" for i in range(8)]
    assert it["iteration"].to_list() == list(range(8))
    con = sqlite3.connect(f"file:{DECODE}?mode=ro", uri=True)
    for row in it.iter_rows(named=True):
        s, e = con.execute("SELECT start, end FROM NVTX_EVENTS WHERE rowid = ?", (row["range_id"],)).fetchone()
        ops_sql = []
        for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY"):
            ops_sql += con.execute(
                f"SELECT o.start, o.end FROM {table} o JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = o.correlationId "
                "AND o.globalPid = (r.globalTid / 16777216) * 16777216 WHERE r.start >= ? AND r.start <= ?", (s, e)
            ).fetchall()
        assert row["duration_ns"] == e - s and row["ops"] == len(ops_sql)
        assert row["gpu_start_ns"] == min(a for a, _ in ops_sql) and row["gpu_end_ns"] == max(b for _, b in ops_sql)
        assert row["gpu_busy_ns"] + row["gpu_idle_ns"] == row["gpu_span_ns"]
    con.close()
    stats = iteration_stats(it)
    kern = stats.filter(pl.col("metric") == "kernels").row(0, named=True)
    assert kern["n"] == 8 and kern["std"] == 0.0
    dur = stats.filter(pl.col("metric") == "duration_ns").row(0, named=True)
    assert dur["mean"] == pytest.approx(it["duration_ns"].mean())
    assert dur["spread"] == pytest.approx((it["duration_ns"].max() - it["duration_ns"].min()) / it["duration_ns"].median())
    assert iteration_stats(it, skip=2).row(0, named=True)["n"] == 6


def test_backward_thread_work_counts_in_its_step() -> None:
    t, ops = _ops(TRAIN)
    it = iterations(ops, t.nvtx)
    assert it["name"].to_list() == ["step.0", "step.1"]  # "Optimizer.step" inside them is not an iteration
    assert it["ops"].sum() == ops.height  # autograd-thread kernels included


def test_each_process_numbers_its_own_iterations() -> None:
    t, ops = _ops(TP2)
    it = iterations(ops, t.nvtx)
    assert it.group_by("pid").len()["len"].to_list() == [8, 8]


def test_no_matching_ranges_gives_an_empty_table() -> None:
    from tracekit.errors import EmptyResultWarning

    t, ops = _ops(NSYS_CORPUS / "nsys2023.1_memfusion_tensorrt.sqlite")
    with pytest.warns(EmptyResultWarning, match="no NVTX range name matches"):
        it = iterations(ops, t.nvtx)
    assert it.height == 0 and "gpu_busy_ns" in it.columns
    custom = iterations(ops, t.nvtx, pattern="ExecutionContext::execute")
    assert custom.height == 1 and custom["kernels"].item() == t.kernels.height  # type: ignore[union-attr]


def test_multi_rank_tables_give_each_rank_its_own_iterations() -> None:
    files = [SAMPLES / "llm_tp2_nccl_per_rank" / f"llm_tp2_nccl_per_rank_rank{r}.sqlite" for r in (0, 1)]
    singles, ops_all, nvtx_all = [], [], []
    for rank, path in enumerate(files):
        t, ops = _ops(path)
        singles.append(iterations(ops, t.nvtx))
        ops_all.append(ops.with_columns(pl.lit(rank).alias("rank")))
        nvtx_all.append(t.nvtx.with_columns(pl.lit(rank).alias("rank")))
    both = iterations(pl.concat(ops_all), pl.concat(nvtx_all))
    for rank, single in enumerate(singles):
        mine = both.filter(pl.col("rank") == rank).drop("rank")
        assert mine.equals(single)
    stats = iteration_stats(both)
    assert set(stats["rank"]) == {0, 1}
