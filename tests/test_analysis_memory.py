"""Copy bandwidth and flags, device memory timeline and peak, against the raw rows."""

from __future__ import annotations

import shutil
import sqlite3
import warnings
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit.analysis.memory import (
    allocations_at_peak,
    copies,
    copy_summary,
    memory_peak,
    memory_timeline,
)

from .conftest import NSYS_CORPUS, SAMPLES

MFU = NSYS_CORPUS / "nsys2026.2_nsysai_mfu_2xh100_nccl_slice.sqlite"
CLOVER = NSYS_CORPUS / "nsys2024.5_pipit_cloverleaf_4xa100.sqlite"
DECODE = SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
TP2 = SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"


def _open(path: Path) -> tracekit.NsysTrace:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tracekit.open(path)  # type: ignore[return-value]


def _sql(path: Path, q: str, *args: object) -> list[tuple]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return con.execute(q, args).fetchall()
    finally:
        con.close()


@pytest.mark.parametrize("path", [MFU, CLOVER], ids=lambda p: p.stem)
def test_copy_summary_sums_the_raw_rows(path: Path) -> None:
    t = _open(path)
    summary = copy_summary(t.memcpys, t.memsets, t.cuda_api)
    kinds = {1: "HtoD", 2: "DtoH", 8: "DtoD", 10: "PtoP"}
    for kind, n, b, ns in _sql(path, "SELECT copyKind, count(*), sum(bytes), sum(end - start) FROM CUPTI_ACTIVITY_KIND_MEMCPY GROUP BY copyKind"):
        row = summary.filter(pl.col("kind") == kinds[kind]).row(0, named=True)
        assert (row["count"], row["bytes"], row["time_ns"]) == (n, b, ns)
        assert row["bandwidth_gbps"] == pytest.approx(b / ns)
    # async calls on pageable host memory, counted in SQL
    pageable_async = _sql(
        path,
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY m JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = m.correlationId "
        "AND m.globalPid = (r.globalTid / 16777216) * 16777216 JOIN StringIds s ON s.id = r.nameId "
        "WHERE s.value LIKE '%Async%' AND (m.srcKind = 0 OR m.dstKind = 0)",
    )[0][0]
    assert summary["pageable_async"].sum() == pageable_async
    sync = _sql(
        path,
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY m JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = m.correlationId "
        "AND m.globalPid = (r.globalTid / 16777216) * 16777216 JOIN StringIds s ON s.id = r.nameId WHERE s.value NOT LIKE '%Async%'",
    )[0][0]
    assert summary.filter(pl.col("kind") != "memset")["synchronous"].sum() == sync


def test_copy_flags_per_row() -> None:
    t = _open(CLOVER)
    c = copies(t.memcpys, t.cuda_api)
    assert c.height == t.memcpys.height
    synchronous = c.filter(pl.col("synchronous"))
    assert set(synchronous["api_name"]) <= {"cudaMemcpy_v3020"}
    assert (c["bandwidth_gbps"] == c["bytes"] / c["duration_ns"]).all()


def test_peak_without_frees_is_everything_allocated() -> None:
    t = _open(DECODE)
    peak = memory_peak(t.memory_usage).row(0, named=True)
    total = _sql(DECODE, "SELECT sum(bytes), count(*) FROM CUDA_GPU_MEMORY_USAGE_EVENTS WHERE memKind NOT IN (0, 1) AND memoryOperationType = 0")[0]
    assert (peak["peak_bytes"], peak["allocations"], peak["frees"]) == (total[0], total[1], 0)
    assert peak["final_bytes"] == peak["peak_bytes"] and peak["live_at_peak"] == total[1]


def test_frees_release_the_matching_allocation(tmp_path: Path) -> None:
    """A copy of the tp2 export where the largest device allocation of GPU 0 is freed (size 0,
    as CUPTI reports some frees) between two later allocations."""
    copy = tmp_path / "freed.sqlite"
    shutil.copyfile(TP2, copy)
    con = sqlite3.connect(copy)
    addr, size, gpid = con.execute(
        "SELECT address, bytes, globalPid FROM CUDA_GPU_MEMORY_USAGE_EVENTS WHERE deviceId = 0 AND memKind = 2 "
        "AND memoryOperationType = 0 ORDER BY bytes DESC LIMIT 1"
    ).fetchone()
    t_free = con.execute("SELECT max(start) FROM CUDA_GPU_MEMORY_USAGE_EVENTS WHERE deviceId = 0").fetchone()[0] - 1
    con.execute(
        "INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS (start, globalPid, deviceId, contextId, address, pc, bytes, memKind, "
        "memoryOperationType, correlationId) VALUES (?, ?, 0, 1, ?, 0, 0, 2, 1, 0)",
        (t_free, gpid, addr),
    )
    con.commit()
    before = con.execute(
        "SELECT sum(bytes) FROM CUDA_GPU_MEMORY_USAGE_EVENTS WHERE deviceId = 0 AND memKind NOT IN (0, 1) AND memoryOperationType = 0 AND start <= ?",
        (t_free,),
    ).fetchone()[0]
    after = con.execute(
        "SELECT coalesce(sum(bytes), 0) FROM CUDA_GPU_MEMORY_USAGE_EVENTS WHERE deviceId = 0 AND memKind NOT IN (0, 1) AND memoryOperationType = 0 AND start > ?",
        (t_free,),
    ).fetchone()[0]
    con.close()
    t = _open(copy)
    tl = memory_timeline(t.memory_usage).filter(pl.col("device_id") == 0)
    free_row = tl.filter(pl.col("operation") == "free").row(0, named=True)
    assert free_row["delta_bytes"] == -size and free_row["in_use_bytes"] == before - size
    peak = memory_peak(t.memory_usage).filter(pl.col("device_id") == 0).row(0, named=True)
    assert peak["peak_bytes"] == before and peak["final_bytes"] == before - size + after and peak["frees"] == 1
    live = allocations_at_peak(t.memory_usage, t.cuda_api).filter(pl.col("device_id") == 0)
    assert live["bytes"].sum() == peak["peak_bytes"] and addr in set(live["address"])
