"""``tracekit.open_many``: ranks, one clock, failure policy, parallel loading."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tests.conftest import SAMPLES
from tracekit.multi import (
    ALL_TABLES,
    DEFAULT_TABLES,
    ReportLoadError,
    ReportSkippedWarning,
    TraceSet,
    is_time_column,
    open_many,
)
from tracekit.nsys.trace import NsysTrace

PER_RANK = SAMPLES / "llm_tp2_nccl_per_rank"
TP2 = SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"
RANK_FILES = [PER_RANK / f"llm_tp2_nccl_per_rank_rank{r}.sqlite" for r in (0, 1)]


@pytest.fixture(scope="module")
def per_rank() -> TraceSet:
    if not all(p.exists() for p in RANK_FILES):
        pytest.skip("per-rank samples not present")
    return open_many(PER_RANK, max_workers=1)


def test_public_entry_point_and_directory(per_rank: TraceSet) -> None:
    assert len(per_rank) == 2 and not per_rank.failures
    assert [Path(p).name for p in per_rank.reports["path"]] == [p.name for p in RANK_FILES]
    assert per_rank.ranks.select("report", "rank", "rank_source").rows() == [(0, 0, "env:RANK"), (1, 1, "env:RANK")]
    assert per_rank.reports["ranks"].to_list() == [[0], [1]]
    ts = tracekit.open_many(RANK_FILES, max_workers=1, tables=("nccl",))
    assert ts.nccl.height == per_rank.nccl.height


def test_every_table_has_rank_and_report(per_rank: TraceSet) -> None:
    for name in ALL_TABLES:
        frame = per_rank.table(name)
        assert frame.columns[:2] == ["report", "rank"], name
        if frame.height:
            assert frame["rank"].null_count() == 0, name
            assert (frame["rank"] == frame["report"]).all(), name  # rank i is report i here
    single = [NsysTrace(p) for p in RANK_FILES]
    assert per_rank.kernels.height == sum(t.kernels.height for t in single)
    assert per_rank.cuda_api.height == sum(t.cuda_api.height for t in single)


def test_clocks_aligned_on_the_session_epoch(per_rank: TraceSet) -> None:
    epochs = per_rank.reports["session_epoch_ns"].to_list()
    assert per_rank.epoch_ns == min(epochs)
    assert per_rank.reports["offset_ns"].to_list() == [e - min(epochs) for e in epochs]
    offset = per_rank.reports["offset_ns"][0]
    assert offset > 0  # rank 0's nsys session started ~9 ms after rank 1's
    raw = NsysTrace(RANK_FILES[0])
    k0 = per_rank.kernels.filter(pl.col("report") == 0)
    assert (k0["start_ns"] - raw.kernels["start_ns"]).unique().to_list() == [offset]
    assert (k0["duration_ns"] == raw.kernels["duration_ns"]).all()  # durations untouched
    n0 = per_rank.nccl.filter(pl.col("report") == 0)
    assert (n0["gpu_start_ns"] - raw.nccl["gpu_start_ns"]).unique().to_list() == [offset]
    assert (n0["host_start_ns"] - raw.nccl["host_start_ns"]).unique().to_list() == [offset]
    # on one clock the two ranks' all-reduce kernels end together (they finish as one)
    ar = per_rank.nccl.filter(pl.col("dtype") == "bf16").select("rank", "call_index", "gpu_end_ns")
    pairs = ar.filter(pl.col("rank") == 0).join(ar.filter(pl.col("rank") == 1), on="call_index")
    spread = (pairs["gpu_end_ns"] - pairs["gpu_end_ns_right"]).abs()
    assert pairs.height == 64
    assert spread.median() < 1_000  # ns; without the shift it would be ~9 ms


def test_time_columns() -> None:
    for name in ("start_ns", "end_ns", "timestamp_ns", "gpu_start_ns", "host_end_ns", "api_start_ns", "launch_ns"):
        assert is_time_column(name)
    for name in ("duration_ns", "gpu_duration_ns", "wait_ns", "skew_ns", "session_epoch_ns", "offset_ns"):
        assert not is_time_column(name)


def test_nranks_inferred_across_reports(per_rank: TraceSet) -> None:
    nccl = per_rank.nccl
    assert set(nccl["comm_nranks"]) == {2} and set(nccl["nranks_source"]) == {"inferred"}
    assert set(nccl["rank_source"]) == {"env:RANK"}


def test_parallel_equals_serial(per_rank: TraceSet) -> None:
    par = open_many(RANK_FILES, max_workers=2)
    for name in DEFAULT_TABLES:
        assert par.table(name).equals(per_rank.table(name)), name
    assert par.gpu_metrics.equals(per_rank.gpu_metrics)  # lazily read, in parallel too


def test_single_report_with_several_rank_processes() -> None:
    if not TP2.exists():
        pytest.skip("sample not present")
    ts = open_many([TP2], max_workers=1, tables=("nccl", "kernels", "gpus", "gpu_metrics", "processes"))
    assert ts.ranks.select("rank", "device_id", "rank_source").rows() == [(0, 0, "device_order"), (1, 1, "device_order")]
    assert ts.reports["ranks"].to_list() == [[0, 1]]
    # rows get the rank of their process, or of their device in tables without a pid
    assert ts.kernels.group_by("rank").agg(pl.col("device_id").unique()).sort("rank")["device_id"].to_list() == [[0], [1]]
    assert ts.gpus.sort("device_id")["rank"].to_list() == [0, 1]
    metrics = ts.gpu_metrics.group_by("device_id").agg(pl.col("rank").unique()).sort("device_id")
    assert metrics["rank"].to_list() == [[0], [1]]
    procs = ts.processes
    assert procs.filter(pl.col("rank").is_not_null()).height == 2  # kernel threads etc. have none
    assert ts.nccl.select("rank", "pid").unique().height == 2


def test_failure_policy(tmp_path: Path) -> None:
    if not RANK_FILES[0].exists():
        pytest.skip("sample not present")
    bad = tmp_path / "rank9.sqlite"
    bad.write_bytes(b"SQLite format 3\x00" + b"\x00" * 200)  # a truncated export
    good = tmp_path / "rank0.sqlite"
    shutil.copy(RANK_FILES[0], good)
    ts = open_many(tmp_path, policy="skip", max_workers=1, tables=("kernels",))
    assert len(ts) == 1 and len(ts.failures) == 1
    assert ts.failures[0].path == bad and ts.failures[0].error == "TraceFormatError"
    with pytest.warns(ReportSkippedWarning, match="rank9.sqlite"):
        open_many(tmp_path, policy="warn", max_workers=1, tables=("kernels",))
    with pytest.raises(ReportLoadError, match="1 of 2 reports"):
        open_many(tmp_path, policy="raise", max_workers=1, tables=("kernels",))
    with pytest.raises(ReportLoadError, match="none of the 1"):
        open_many([bad], policy="skip", max_workers=1)
    with pytest.raises(ValueError, match="policy"):
        open_many(tmp_path, policy="ignore")
    # a failure inside a worker process is reported the same way
    ts = open_many(tmp_path, policy="skip", max_workers=2, tables=("kernels",))
    assert len(ts) == 1 and ts.failures[0].error == "TraceFormatError"


def test_copies_are_not_ranks_and_ranks_fall_back_to_file_names(tmp_path: Path) -> None:
    """Copies of two captures under six rank names were read as six ranks (issue 44: a folder
    is now checked for being one run); the file-name fallback of the rank choice itself, for
    reports whose environments collide, still holds on those reports' candidates."""
    from tracekit.analysis.ranks import choose_ranks, rank_candidates
    from tracekit.errors import UnrelatedReportsError
    from tracekit.multi import _rank_processes

    if not all(p.exists() for p in RANK_FILES):
        pytest.skip("sample not present")
    for i in range(6):
        shutil.copy(RANK_FILES[i % 2], tmp_path / f"job_rank{i}.sqlite")
    with pytest.raises(UnrelatedReportsError, match=r"job_rank2.sqlite and job_rank0.sqlite are the same capture"):
        open_many(tmp_path, max_workers=2, tables=("nccl",))
    parts = []
    for i in range(6):
        trace = NsysTrace(RANK_FILES[i % 2])
        cand = rank_candidates(_rank_processes(trace), None, environments=[p.environment for p in trace.meta.processes],
                               file_name=f"job_rank{i}.sqlite")
        parts.append(cand.with_columns(pl.lit(i, pl.Int64).alias("report")))
    chosen, notes = choose_ranks(pl.concat(parts), keys=["report"])
    # every copy claims RANK=0 or 1: the file names give unique ranks
    assert chosen["rank"].to_list() == list(range(6))
    assert set(chosen["rank_source"]) == {"file_name"}
    assert any("file_name" in n for n in notes)
