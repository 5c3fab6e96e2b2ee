"""Algorithm and bus bandwidth of NCCL calls (nccl-tests' definitions) against the link peak."""

from __future__ import annotations

import polars as pl
import pytest

from tests.conftest import SAMPLES
from tracekit.analysis.comm_bandwidth import (
    bandwidth_by_size,
    bandwidth_summary,
    collective_bandwidth,
    link_peaks,
    sync_bandwidth,
)
from tracekit.analysis.ranks import collective_skew, match_collectives
from tracekit.nsys.trace import NsysTrace

TP2 = SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"
TP2PP2 = SAMPLES / "llm_tp2pp2_nccl" / "llm_tp2pp2_nccl.sqlite"


@pytest.fixture(scope="module", params=[TP2, TP2PP2], ids=["tp2", "tp2pp2"])
def trace(request: pytest.FixtureRequest) -> NsysTrace:
    if not request.param.exists():
        pytest.skip("sample not present")
    return NsysTrace(request.param)


def test_link_peak_of_h200(trace: NsysTrace) -> None:
    peaks = link_peaks(trace.gpus)
    assert set(peaks["gpu_name"]) == {"NVIDIA H200"}
    assert set(peaks["link_peak_gbps"]) == {450.0} and set(peaks["link"]) == {"NVLink 4"}
    given = link_peaks(trace.gpus, override_gbps={0: 100.0})
    assert given.filter(pl.col("device_id") == 0)["link_peak_gbps"].item() == 100.0


def test_bus_bandwidth_below_link_peak(trace: NsysTrace) -> None:
    bw = collective_bandwidth(trace.nccl, gpus=trace.gpus)
    assert bw.height == trace.nccl.height  # every call has a size and a kernel
    assert bw["busbw_gbps"].null_count() == 0
    assert (bw["busbw_gbps"] > 0).all()
    assert (bw["busbw_gbps"] < bw["link_peak_gbps"]).all()
    assert (bw["peak_fraction"] < 1).all()


def test_nccl_tests_factors(trace: NsysTrace) -> None:
    bw = collective_bandwidth(trace.nccl, gpus=trace.gpus)
    for row in bw.iter_rows(named=True):
        n, t, size = row["bw_nranks"], row["gpu_duration_ns"], row["bytes"]
        alg = {"AllReduce": size / t, "AllGather": n * size / t, "Send": size / t, "Recv": size / t}[row["op"]]
        bus = {"AllReduce": 2 * (n - 1) / n, "AllGather": (n - 1) / n, "Send": 1.0, "Recv": 1.0}[row["op"]]
        assert row["algbw_gbps"] == pytest.approx(alg)
        assert row["busbw_gbps"] == pytest.approx(alg * bus)


def test_unknown_ranks_leave_bus_bandwidth_null() -> None:
    path = SAMPLES / "llm_tp2_nccl_per_rank" / "llm_tp2_nccl_per_rank_rank0.sqlite"
    if not path.exists():
        pytest.skip("sample not present")
    trace = NsysTrace(path)
    bw = collective_bandwidth(trace.nccl, gpus=trace.gpus)
    ar = bw.filter(pl.col("op") == "AllReduce")
    assert ar["busbw_gbps"].null_count() == ar.height  # n unknown in a one-rank report
    given = collective_bandwidth(trace.nccl, gpus=trace.gpus, nranks=2).filter(pl.col("op") == "AllReduce")
    assert given["busbw_gbps"].null_count() == 0


def test_summaries(trace: NsysTrace) -> None:
    bw = collective_bandwidth(trace.nccl, gpus=trace.gpus)
    per_op = bandwidth_summary(bw)
    assert per_op["calls"].sum() == bw.height
    assert (per_op["busbw_gbps"] <= per_op["max_busbw_gbps"] + 1e-9).all()
    by_size = bandwidth_by_size(bw)
    assert by_size.select("op", "bytes").is_unique().all()


def test_sync_bandwidth_excludes_waiting(trace: NsysTrace) -> None:
    skew = collective_skew(match_collectives(trace.nccl))
    sync = sync_bandwidth(skew)
    assert sync.height > 0
    assert (sync["busbw_gbps"] < 450.0).all()
    # the shared window is never longer than the kernel, so its bandwidth is at least the
    # median kernel-based figure of the same op
    kern = collective_bandwidth(trace.nccl, gpus=trace.gpus)
    ar_sync = sync.filter((pl.col("op") == "AllReduce") & (pl.col("bytes") == 8192))["busbw_gbps"].median()
    ar_kern = kern.filter((pl.col("op") == "AllReduce") & (pl.col("bytes") == 8192))["busbw_gbps"].median()
    assert ar_sync >= ar_kern
