"""The NCCL calls table (``trace.nccl``) on the real 2- and 4-GPU samples and the corpus slice."""

from __future__ import annotations

import ast
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import NSYS_CORPUS, SAMPLES
from tracekit.analysis.nccl import NCCL_COLUMNS, is_nccl_kernel
from tracekit.nsys.trace import NsysTrace

TP2 = SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"
PER_RANK = SAMPLES / "llm_tp2_nccl_per_rank"
TP2PP2 = SAMPLES / "llm_tp2pp2_nccl" / "llm_tp2pp2_nccl.sqlite"
CUSTOM = SAMPLES / "custom_allreduce_2gpu" / "custom_allreduce_2gpu.sqlite"
SLICE = NSYS_CORPUS / "nsys2026.2_nsysai_mfu_2xh100_nccl_slice.sqlite"
WORKLOADS = SAMPLES / "workloads"


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"sample {path} not present")
    return path


@pytest.fixture(scope="module")
def tp2() -> NsysTrace:
    return NsysTrace(_need(TP2))


@pytest.fixture(scope="module")
def tp2pp2() -> NsysTrace:
    return NsysTrace(_need(TP2PP2))


@pytest.fixture(scope="module")
def sliced() -> NsysTrace:
    return NsysTrace(_need(SLICE))


def _workload_sizes() -> dict[str, int]:
    """Tensor shapes of the decode workload, read from its source (no torch needed)."""
    cfg: dict[str, int] = {}
    tree = ast.parse((_need(WORKLOADS / "tinyllm.py")).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "Config":
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.value, ast.Constant):
                    cfg[item.target.id] = item.value.value  # type: ignore[union-attr]
    tree = ast.parse((WORKLOADS / "decode.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            flag = node.args[0].value  # type: ignore[attr-defined]
            default = next((k.value.value for k in node.keywords if k.arg == "default"), None)  # type: ignore[attr-defined]
            cfg[flag.lstrip("-")] = default
    return cfg


def test_schema_and_one_row_per_call(tp2: NsysTrace) -> None:
    nccl = tp2.nccl
    assert dict(nccl.schema) == NCCL_COLUMNS
    # 8 steps × (8 all-reduces + 1 all-gather + 1 send or recv) + the final barrier, per rank
    counts = {(r["rank"], r["op"]): r["len"] for r in nccl.group_by("rank", "op").len().iter_rows(named=True)}
    assert counts == {(0, "AllReduce"): 65, (0, "AllGather"): 8, (0, "Send"): 8,
                      (1, "AllReduce"): 65, (1, "AllGather"): 8, (1, "Recv"): 8}
    assert set(nccl["source"]) == {"nvtx+kernel"}


def test_calls_equal_nccl_kernels_launched(tp2: NsysTrace) -> None:
    nccl = tp2.nccl
    kernels = tp2.kernels.filter(is_nccl_kernel(pl.col("name")))
    assert nccl.height == kernels.height == 162
    linked = nccl.explode("correlation_ids").select("pid", pl.col("correlation_ids").alias("correlation_id"))
    assert linked.height == kernels.height
    assert linked.sort("pid", "correlation_id").equals(
        kernels.select("pid", "correlation_id").sort("pid", "correlation_id")
    )
    # each call's GPU span is its kernel, on the device of its process
    k = kernels.select("pid", "correlation_id", "start_ns", "end_ns", "device_id")
    j = nccl.join(k, on=["pid", "correlation_id"])
    assert (j["gpu_start_ns"] == j["start_ns"]).all() and (j["gpu_end_ns"] == j["end_ns"]).all()
    assert (j["device_id"] == j["device_id_right"]).all()
    # the kernel starts after its host range began (grouped p2p launch at group end)
    assert (nccl["gpu_start_ns"] > nccl["host_start_ns"]).all()
    assert (nccl["launch_ns"] >= nccl["host_start_ns"]).all()


def test_bytes_from_payloads_match_workload_tensors(tp2: NsysTrace) -> None:
    w = _workload_sizes()
    tp = 2
    tokens = 1  # every profiled step decodes one token (the prompt runs in warm-up step 0)
    assert w["warmup"] >= 1
    bf16, int64, f32 = 2, 8, 4
    expected = {
        ("AllReduce", "bf16"): w["batch"] * tokens * w["hidden"] * bf16,  # 8192
        ("AllGather", None): w["batch"] * (w["vocab"] // tp) * bf16,  # per-rank logits, 32768
        ("Send", None): w["batch"] * int64,  # sampled token ids, 32
        ("Recv", None): w["batch"] * int64,
        ("AllReduce", "f32"): 1 * f32,  # dist.barrier()
    }
    nccl = tp2.nccl
    assert (nccl["size_source"] == "payload").all()
    got = nccl.group_by("op", "dtype").agg(pl.col("bytes").unique())
    assert {(r["op"], r["dtype"]): r["bytes"] for r in got.iter_rows(named=True)} == {
        k: [v] for k, v in expected.items()
    }
    assert expected[("AllReduce", "bf16")] == 8192 and expected[("AllGather", None)] == 32768


def test_kernel_name_fields_and_payload_fields(tp2: NsysTrace) -> None:
    nccl = tp2.nccl
    ar = nccl.filter(pl.col("dtype") == "bf16")
    assert set(ar["kernel_name"]) == {"ncclDevKernel_AllReduce_Sum_bf16_RING_LL"}
    assert set(ar["algorithm"]) == {"RING"} and set(ar["protocol"]) == {"LL"}
    assert set(ar["naming_era"]) == {"ncclDevKernel"}
    assert set(ar["reduction"]) == {"Sum"} and set(ar["reduction_source"]) == {"payload"}
    p2p = nccl.filter(pl.col("op").is_in(["Send", "Recv"]))
    assert set(p2p["kernel_name"]) == {"ncclDevKernel_SendRecv"}
    assert set(p2p["group_size"]) == {1} and p2p["group_id"].null_count() == 0
    # the TP all-reduces and the p2p/barrier run on two communicators, both seen by both ranks
    comms = nccl.group_by("comm_id").agg(pl.col("rank").n_unique().alias("ranks"), pl.col("op").unique().sort())
    assert comms.height == 2 and set(comms["ranks"]) == {2}
    assert set(nccl["comm_nranks"]) == {2} and set(nccl["nranks_source"]) == {"inferred"}


def test_ranks_per_process_agree_with_p2p_peers(tp2: NsysTrace) -> None:
    nccl = tp2.nccl
    assert set(nccl["rank_source"]) == {"device_order"}
    assert nccl.group_by("rank").agg(pl.col("device_id").unique()).sort("rank")["device_id"].to_list() == [[0], [1]]
    send = nccl.filter(pl.col("op") == "Send")
    recv = nccl.filter(pl.col("op") == "Recv")
    # rank 0 sends the sampled ids to rank 1 (decode.py)
    assert set(send["rank"]) == {0} and set(send["peer"]) == {1}
    assert set(recv["rank"]) == {1} and set(recv["peer"]) == {0}


def test_rank_from_capture_environment() -> None:
    for rank in (0, 1):
        trace = NsysTrace(_need(PER_RANK / f"llm_tp2_nccl_per_rank_rank{rank}.sqlite"))
        nccl = trace.nccl
        assert set(nccl["rank"]) == {rank} and set(nccl["rank_source"]) == {"env:RANK"}
        # one rank per report: the communicator's size is unknown here (open_many infers it)
        assert set(nccl["nranks_source"]) == {"unknown"}
        assert nccl.height == 81


def test_pipeline_parallel_peers(tp2pp2: NsysTrace) -> None:
    nccl = tp2pp2.nccl
    assert sorted(nccl["rank"].unique()) == [0, 1, 2, 3]
    p2p = nccl.filter(pl.col("op").is_in(["Send", "Recv"]))
    # stage 0 (ranks 0, 1) sends hidden states to stage 1 (ranks 2, 3), which sends ids back
    pairs = {(r["rank"], r["op"], r["peer"], r["bytes"]) for r in p2p.iter_rows(named=True)}
    assert pairs == {
        (0, "Send", 2, 8192), (0, "Recv", 2, 32), (1, "Send", 3, 8192), (1, "Recv", 3, 32),
        (2, "Recv", 0, 8192), (2, "Send", 0, 32), (3, "Recv", 1, 8192), (3, "Send", 1, 32),
    }
    # p2p runs on the 4-rank world communicator, all-reduces on the two 2-rank TP groups
    world = p2p["comm_id"].unique()
    assert world.len() == 1
    assert set(p2p["comm_nranks"]) == {4}
    tp = nccl.filter(pl.col("dtype") == "bf16").group_by("comm_id").agg(pl.col("rank").unique().sort())
    assert sorted(tp["rank"].to_list()) == [[0, 1], [2, 3]]
    kernels = tp2pp2.kernels.filter(is_nccl_kernel(pl.col("name")))
    assert nccl["kernel_count"].sum() == kernels.height == nccl.height


def test_without_blobs_sizes_are_unknown_and_groups_share_kernels(sliced: NsysTrace) -> None:
    nccl = sliced.nccl
    assert nccl["bytes"].null_count() == nccl.height
    assert set(nccl["size_source"]) == {"unknown"}
    assert nccl["comm_id"].null_count() == nccl.height
    assert set(nccl["nranks_source"]) == {"unknown"}
    # pipeline exchange: ncclGroupStart, 2 × (ncclSend, ncclRecv), ncclGroupEnd → 1 SendRecv kernel
    grouped = nccl.filter(pl.col("group_id").is_not_null())
    assert set(grouped["group_size"]) == {4}
    per_group = grouped.filter(pl.col("kernel_count") > 0).group_by("pid", "group_id").agg(
        pl.col("correlation_id").n_unique().alias("kernels"), pl.len().alias("calls")
    )
    assert set(per_group["kernels"]) == {1} and set(per_group["calls"]) == {4}
    # every NCCL kernel of the slice is accounted for exactly once: by a group, or by a
    # kernel-only row when its ncclGroupEnd fell before the slice
    kernels = sliced.kernels.filter(is_nccl_kernel(pl.col("name")))
    linked = nccl.select("pid", "correlation_id").drop_nulls().unique()
    assert linked.height == kernels.height == 66
    orphans = nccl.filter(pl.col("source") == "kernel")
    assert orphans.height == 2 and set(orphans["op"]) == {"SendRecv"}
    # the slice's last group ended after the slice: calls without a kernel
    assert set(nccl.filter(pl.col("source") == "nvtx")["op"]) == {"Send", "Recv"}


def test_non_nccl_collectives_give_no_nccl_rows() -> None:
    trace = NsysTrace(_need(CUSTOM))
    nccl = trace.nccl
    # only dist.barrier() went through NCCL; one_shot_all_reduce and the peer copies did not
    assert nccl.height == 2 and set(nccl["op"]) == {"AllReduce"} and set(nccl["bytes"]) == {4}


def test_trace_without_nccl_gives_an_empty_table() -> None:
    trace = NsysTrace(_need(SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"))
    nccl = trace.nccl
    assert nccl.height == 0 and dict(nccl.schema) == NCCL_COLUMNS


def test_grouped_p2p_calls_share_their_kernels() -> None:
    """The nsys-ai 2×H100 slice runs 4 Send/Recv calls per ncclGroupEnd as one kernel: every
    call carries that kernel, so gpu_duration_ns.sum() counts it 4 times; weighted by
    kernel_share the calls' time equals the NCCL kernels' time by SQL."""
    import sqlite3

    import polars as pl

    import tracekit

    from .conftest import NSYS_CORPUS

    path = NSYS_CORPUS / "nsys2026.2_nsysai_mfu_2xh100_nccl_slice.sqlite"
    n = tracekit.open(path).nccl
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    kernel_ns = con.execute(
        "SELECT sum(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName "
        "WHERE s.value LIKE '%nccl%'"
    ).fetchone()[0]
    con.close()
    assert n.filter(pl.col("kernel_share") == 0.25).height > 0
    assert n["gpu_duration_ns"].sum() > 3 * kernel_ns
    assert (n["gpu_duration_ns"] * n["kernel_share"].fill_null(1.0)).sum() == pytest.approx(kernel_ns)


def _nccl_exports() -> list[Path]:
    from tests.conftest import llm_capture

    return [p for p in (TP2, TP2PP2, CUSTOM, SLICE, *sorted(PER_RANK.glob("*.sqlite"))) if p.exists()] + [
        llm_capture("tp2_graph_decode_graphtrace"), llm_capture("tp2_graph_decode_nodetrace")]


@pytest.mark.parametrize("path", _nccl_exports(), ids=lambda p: p.stem)
def test_the_table_read_a_column_at_a_time_equals_the_whole_tables(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``trace.nccl`` of a trace that holds no table (NVTX columns read projected, NCCL kernels
    found by their name ids and gathered from a real column cache, API columns one at a time)
    equals the one built from the whole kernel, API and NVTX tables."""
    from tracekit.nsys import database

    whole = NsysTrace(path, column_cache=False)
    whole.kernels, whole.cuda_api, whole.nvtx  # noqa: B018  (held: the whole-table inputs)
    expected = whole.nccl
    monkeypatch.setattr(database, "CACHE_MIN_ROWS", 1)  # the samples' tables go through the cache
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    lean = NsysTrace(path)
    assert lean.columns_on_demand("kernels", ["name_id"]).one_at_a_time  # the cached path ran
    got = lean.nccl
    assert not lean.is_loaded("kernels") and not lean.is_loaded("nvtx") and not lean.is_loaded("cuda_api")
    assert expected.height > 0
    assert got.equals(expected)
