"""Each generation step's GPU span, busy time and operation count (``_cpu_steps`` through
:func:`tracekit.analysis._frames.span_and_busy`, numpy in blocks) against the same figures
computed by hand from the export in SQL, and ``span_and_busy`` against ``interval_union`` on a
real two-GPU capture's operations, in blocks as small as a few hundred operations."""

from __future__ import annotations

import sqlite3

import numpy as np
import polars as pl
import pytest

import tracekit
from tracekit.analysis import _frames
from tracekit.analysis._frames import interval_union, span_and_busy

from .conftest import SAMPLES


def _by_hand(path) -> list[tuple[int, int, int, int, int]]:  # type: ignore[no-untyped-def]
    """Per NVTX ``step.N`` range: (range start, first GPU start, last GPU end, union of the
    operations' intervals per GPU, operations) of the kernels and copies whose runtime call
    starts inside it, from SQL and a plain loop."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    ranges = con.execute("SELECT start, end FROM NVTX_EVENTS WHERE text LIKE 'step.%' ORDER BY start").fetchall()
    ops = con.execute(
        "SELECT r.start, k.deviceId, k.start, k.end FROM ("
        " SELECT correlationId, globalPid, deviceId, start, end FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL"
        " SELECT correlationId, globalPid, deviceId, start, end FROM CUPTI_ACTIVITY_KIND_MEMCPY) k"
        " JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId"
        " AND r.globalTid / 16777216 = k.globalPid / 16777216").fetchall()
    con.close()
    rows = []
    for lo, hi in ranges:
        mine = sorted((d, a, b) for call, d, a, b in ops if lo <= call <= hi)
        busy, cur = 0, None
        for d, a, b in mine:
            if cur is not None and cur[0] == d and a <= cur[2]:
                cur[2] = max(cur[2], b)
            else:
                busy += 0 if cur is None else cur[2] - cur[1]
                cur = [d, a, b]
        busy += 0 if cur is None else cur[2] - cur[1]
        rows.append((lo, min(a for _, a, _ in mine), max(b for _, _, b in mine), busy, len(mine)))
    return rows


@pytest.mark.parametrize("block", [1 << 18, 100])
def test_step_gpu_figures_equal_sql_by_hand(block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """llm_decode_1gpu's eight ``step.N`` ranges, as if they made tokens: every step's figures
    equal the hand computation, whether the operations are taken whole or 100 at a time."""
    from tracekit.analysis.run.phases import generation_steps
    from tracekit.diagnosis.config import DiagnoseConfig
    from tracekit.diagnosis.context import Context

    monkeypatch.setattr(_frames, "_SPAN_BLOCK", block)
    path = SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
    ctx = Context(tracekit.open(path), DiagnoseConfig())
    ctx.prepare_reads()
    steps = generation_steps(ctx._phase_ops(), ctx.nvtx, ctx.graph_launches, tokens=True)
    got = steps.select("start_ns", "gpu_start_ns", "gpu_end_ns", "gpu_busy_ns", "ops").rows()
    want = _by_hand(path)
    assert len(want) == 8 and all(r[4] == 62 for r in want)
    assert got == want


@pytest.mark.parametrize("block", [1 << 18, 500, 7])
def test_span_and_busy_equals_interval_union_on_a_real_capture(block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The two-GPU TP sample's kernels grouped in runs of 37 by start (overlapping GPUs in a
    group, some kernels in no group): the same span, count and per-GPU union as polars."""
    monkeypatch.setattr(_frames, "_SPAN_BLOCK", block)
    k = tracekit.open(SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite").table("kernels", ["device_id", "start_ns", "end_ns"])
    k = k.sort("start_ns").with_row_index("i").with_columns(
        pl.when(pl.col("i") % 11 == 3).then(-1).otherwise(pl.col("i") // 37).cast(pl.Int64).alias("g"))
    groups = int(k["g"].max()) + 1
    got = span_and_busy(k["g"].to_numpy(), k["device_id"], k["start_ns"], k["end_ns"], groups)
    f = k.filter(pl.col("g") >= 0)
    busy = interval_union(f, ["g", "device_id"]).group_by("g").agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("busy"))
    want = f.group_by("g").agg(pl.col("start_ns").min(), pl.col("end_ns").max(), pl.len().alias("ops")).join(busy, on="g").sort("g")
    at = want["g"].to_numpy()
    assert k["device_id"].n_unique() == 2 and f.height > 900
    assert np.array_equal(got["gpu_start_ns"][at], want["start_ns"].to_numpy())
    assert np.array_equal(got["gpu_end_ns"][at], want["end_ns"].to_numpy())
    assert np.array_equal(got["gpu_busy_ns"][at], want["busy"].to_numpy())
    assert np.array_equal(got["ops"][at], want["ops"].to_numpy())
    assert int(got["ops"].sum()) == f.height  # the kernels in no group are in none
