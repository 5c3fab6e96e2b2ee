"""Cross-rank matching of NCCL calls: pairing, skew, wait, straggler."""

from __future__ import annotations

import polars as pl
import pytest

from tests.conftest import SAMPLES
from tracekit.analysis.ranks import (
    choose_ranks,
    collective_skew,
    match_collectives,
    rank_candidates,
    rank_from_environment,
    rank_from_file_name,
    skew_by_op,
    skew_by_rank,
)
from tracekit.multi import open_many
from tracekit.nsys.trace import NsysTrace

PER_RANK = SAMPLES / "llm_tp2_nccl_per_rank"
TP2 = SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"
TP2PP2 = SAMPLES / "llm_tp2pp2_nccl" / "llm_tp2pp2_nccl.sqlite"


def _need(path):
    if not path.exists():
        pytest.skip(f"{path} not present")
    return path


@pytest.fixture(scope="module")
def tp2_matched() -> pl.DataFrame:
    return match_collectives(NsysTrace(_need(TP2)).nccl)


def test_every_call_matched_across_the_two_ranks(tp2_matched: pl.DataFrame) -> None:
    m = tp2_matched
    assert m["match_id"].null_count() == 0
    assert (m["match_ranks"] == 2).all() and m["complete"].all()
    assert set(m["match_basis"]) == {"comm"} and set(m["time_base"]) == {"gpu"}
    per = collective_skew(m)
    assert per.height == 81  # 65 all-reduces, 8 all-gathers, 8 send/recv pairs
    assert per.group_by("op").len().sort("op").rows() == [("AllGather", 8), ("AllReduce", 65), ("Recv/Send", 8)]
    # the n-th call of each communicator pairs calls of the same size and op on both ranks
    same = m.group_by("match_id").agg(pl.col("bytes").n_unique().alias("b"), pl.col("call_index").n_unique().alias("c"))
    assert (same["b"] == 1).all()


def test_skew_wait_and_straggler_definitions(tp2_matched: pl.DataFrame) -> None:
    m = tp2_matched
    for mid, rows in m.group_by("match_id"):
        starts = dict(zip(rows["rank"], rows["gpu_start_ns"], strict=True))
        last = max(starts.values())
        assert rows["skew_ns"][0] == last - min(starts.values())
        for r, w in zip(rows["rank"], rows["wait_ns"], strict=True):
            assert w == last - starts[r]
        late = [r for r, s in sorted(starts.items()) if s == last][0]
        assert rows["straggler_rank"][0] == late, mid
        assert rows.filter(pl.col("is_straggler"))["wait_ns"].to_list() == [0]


def test_summaries(tp2_matched: pl.DataFrame) -> None:
    by_rank = skew_by_rank(tp2_matched)
    assert by_rank["collectives"].to_list() == [81, 81]
    assert by_rank["straggler_count"].sum() == 81
    total = tp2_matched.unique(subset=["match_id", "rank"])["wait_ns"].sum()
    assert by_rank["total_wait_ns"].sum() == total
    by_op = skew_by_op(tp2_matched)
    assert by_op["collectives"].sum() == 81 and by_op["incomplete"].sum() == 0
    assert abs(by_op["total_wait_ns"].sum() - total) <= 3  # rounding of means


def test_per_rank_reports_match_like_one_report() -> None:
    if not all((PER_RANK / f"llm_tp2_nccl_per_rank_rank{r}.sqlite").exists() for r in (0, 1)):
        pytest.skip("per-rank samples not present")
    ts = open_many(PER_RANK, max_workers=1, tables=("nccl",))
    m = match_collectives(ts.nccl)
    per = collective_skew(m)
    assert per.height == 81 and per["complete"].all()
    # aligned clocks: collectives end together on both ranks
    assert (per["last_end_ns"] - per["first_end_ns"]).median() < 1_000
    assert (per.filter(pl.col("op") != "Recv/Send")["sync_duration_ns"] > 0).all()


def test_tp_times_pp_matches_groups_and_pairs() -> None:
    m = match_collectives(NsysTrace(_need(TP2PP2)).nccl)
    per = collective_skew(m)
    assert per["complete"].all()
    # TP all-reduces involve 2 ranks, the final barrier on the world communicator 4
    ar = per.filter(pl.col("op") == "AllReduce")
    assert set(ar.filter(pl.col("bytes") == 8192)["match_ranks"]) == {2}
    assert ar.filter(pl.col("bytes") == 4)["match_ranks"].to_list() == [4]
    # p2p on the world communicator pairs (0, 2) and (1, 3), never all four
    p2p = m.filter(pl.col("op").is_in(["Send", "Recv"]))
    pairs = p2p.group_by("match_id").agg(pl.col("rank").unique().sort())
    assert {tuple(r) for r in pairs["rank"]} == {(0, 2), (1, 3)}
    assert pairs.height == 16  # 4 steps × 2 directions × 2 pairs


def test_rank_sources() -> None:
    assert rank_from_file_name("llm_tp2_nccl_per_rank_rank1.sqlite") == 1
    assert rank_from_file_name("report.r12.nsys-rep") == 12
    assert rank_from_file_name("node3_gpu5.sqlite") is None  # a bare number is not a rank
    assert rank_from_file_name("nsys2022.4_pipit_saxpy_mpi_cuda.sqlite") is None
    assert rank_from_file_name("job_rank_7.nsys-rep") == 7
    assert rank_from_file_name("trace.sqlite") is None
    assert rank_from_environment([{"LOCAL_RANK": "3", "RANK": "11"}]) == (11, "env:RANK")
    assert rank_from_environment([{"OMPI_COMM_WORLD_RANK": "2"}]) == (2, "env:OMPI_COMM_WORLD_RANK")
    assert rank_from_environment([{"RANK": "0"}, {"RANK": "1"}]) == (None, None)
    procs = pl.DataFrame({"pid": [10], "device_id": [3]})
    inits = pl.DataFrame({"pid": [10, 10], "comm_nranks": [2, 8], "comm_rank": [1, 5]})
    c = rank_candidates(procs, inits, environments=[{"RANK": "4"}], file_name="x_rank6.sqlite")
    assert c.select("rank_nccl", "rank_env", "rank_file", "rank_device").row(0) == (5, 4, 6, None)
    chosen, notes = choose_ranks(c)
    assert chosen.select("rank", "rank_source").row(0) == (5, "nccl") and not notes


def test_missing_sizes_inferred_from_matching_ranks() -> None:
    nccl = NsysTrace(_need(TP2)).nccl
    # as if rank 1's report had been exported without --include-blobs
    stripped = nccl.with_columns(
        pl.when(pl.col("rank") == 1).then(None).otherwise(pl.col("bytes")).alias("bytes"),
        pl.when(pl.col("rank") == 1).then(pl.lit("unknown")).otherwise(pl.col("size_source")).alias("size_source"),
    )
    m = match_collectives(stripped)
    r1 = m.filter(pl.col("rank") == 1)
    assert set(r1["size_source"]) == {"inferred"}
    assert r1.sort("call_index")["bytes"].to_list() == nccl.filter(pl.col("rank") == 1).sort("call_index")["bytes"].to_list()
    assert set(m.filter(pl.col("rank") == 0)["size_source"]) == {"payload"}
