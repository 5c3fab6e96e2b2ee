"""Communication classification and the compute/communication/memcpy/idle breakdown per GPU."""

from __future__ import annotations

import polars as pl
import pytest

from tests.conftest import NSYS_CORPUS, SAMPLES
from tracekit.analysis.attribution import launch_info
from tracekit.analysis.comm import (
    DEFAULT_COMM_PATTERNS,
    STATES,
    CommPattern,
    activity_segments,
    categorize_ops,
    classify_communication,
    comm_by_range,
    overlap_breakdown,
    range_windows,
)
from tracekit.nsys.trace import NsysTrace

TP2 = SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"
CUSTOM = SAMPLES / "custom_allreduce_2gpu" / "custom_allreduce_2gpu.sqlite"
TRAIN = SAMPLES / "llm_train_emit_nvtx_1gpu" / "llm_train_emit_nvtx_1gpu.sqlite"
SLICE = NSYS_CORPUS / "nsys2026.2_nsysai_mfu_2xh100_nccl_slice.sqlite"


def _open(path) -> NsysTrace:
    if not path.exists():
        pytest.skip(f"sample {path} not present")
    return NsysTrace(path)


@pytest.fixture(scope="module")
def tp2() -> NsysTrace:
    return _open(TP2)


@pytest.fixture(scope="module")
def tp2_ops(tp2: NsysTrace) -> pl.DataFrame:
    return categorize_ops(tp2.kernels, tp2.memcpys, tp2.memsets)


def _brute_force(ops: pl.DataFrame, start: int, end: int) -> dict[str, int]:
    """Time per state in [start, end) of one device, by walking every elementary interval."""
    rows = [(s, e, c) for s, e, c in ops.select("start_ns", "end_ns", "category").iter_rows() if e > start and s < end]
    cuts = sorted({start, end, *(max(start, min(end, t)) for s, e, _ in rows for t in (s, e))})
    out = dict.fromkeys(STATES, 0)
    for a, b in zip(cuts, cuts[1:], strict=False):
        active = {c for s, e, c in rows if s <= a and e >= b}
        if "compute" in active and "communication" in active:
            state = "overlap"
        elif "communication" in active:
            state = "communication_only"
        elif "compute" in active:
            state = "compute_only"
        elif "memcpy" in active:
            state = "memcpy"
        else:
            state = "idle"
        out[state] += b - a
    return out


def test_classification_of_non_nccl_collectives() -> None:
    trace = _open(CUSTOM)
    ops = categorize_ops(trace.kernels, trace.memcpys, trace.memsets)
    got = {(r["category"], r["comm_kind"]): r["len"] for r in ops.group_by("category", "comm_kind").len().iter_rows(named=True)}
    assert got == {
        ("communication", "symmetric_memory"): 24,  # 8 one_shot_all_reduce + 16 symmetric_memory::barrier_kernel
        ("communication", "copy_engine"): 8,  # peer-to-peer copies of the copy-engine all-gather
        ("communication", "nccl"): 2,  # dist.barrier()
        ("memcpy", None): 8,  # each rank's copy of its own shard (DtoD on one device)
        ("compute", None): 10,
    }
    peer = ops.filter(pl.col("comm_kind") == "copy_engine")
    assert set(peer["name"]) == {"[CUDA memcpy Peer-to-Peer]"}


def test_default_patterns_cover_known_libraries() -> None:
    names = pl.DataFrame({"name": [
        "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, __nv_bfloat16*, int, int)",
        "void sglang::cross_device_reduce_2stage<half, 4>(sglang::RankData*)",
        "void tensorrt_llm::kernels::ar_fusion::allreduce_fusion_kernel<true, 8>(AllReduceFusionParams)",
        "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*)",
        "void deep_ep::internode_ll::combine<false>(void*)",
        "nvshmemi_proxy_progress_kernel",
        "void c10d::symmetric_memory::multimem_all_reduce_kernel<float, 2>(float*)",
        "mscclKernel_Sum_half_LL",
        "ncclDevKernel_SendRecv",
        "void at::native::vectorized_elementwise_kernel<4>(int)",
        "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT",
    ]})
    kinds = classify_communication(names)["comm_kind"].to_list()
    assert kinds == ["custom_allreduce", "custom_allreduce", "custom_allreduce", "deepep", "deepep", "nvshmem",
                     "symmetric_memory", "msccl", "nccl", None, None]
    # patterns are configurable: a user list replaces the defaults
    mine = classify_communication(names, patterns=[CommPattern("mine", r"nvjet")])
    assert mine["comm_kind"].drop_nulls().to_list() == ["mine"]
    assert DEFAULT_COMM_PATTERNS[-1].kind == "other"


def test_segments_tile_each_gpu_span(tp2_ops: pl.DataFrame) -> None:
    seg = activity_segments(tp2_ops)
    assert (seg["duration_ns"] > 0).all()
    # contiguous: each segment starts where the previous one ended
    gaps = seg.with_columns(pl.col("end_ns").shift(1).over("device_id").alias("prev")).filter(pl.col("prev").is_not_null())
    assert (gaps["start_ns"] == gaps["prev"]).all()
    br = overlap_breakdown(seg)
    span = tp2_ops.group_by("device_id").agg((pl.col("end_ns").max() - pl.col("start_ns").min()).alias("s")).sort("device_id")
    assert br["span_ns"].to_list() == span["s"].to_list()
    total = sum(br[f"{s}_ns"] for s in STATES)
    assert (total == br["span_ns"]).all()
    # communication = union of the communication kernels (one stream per device here)
    comm = tp2_ops.filter(pl.col("category") == "communication").group_by("device_id").agg(pl.col("duration_ns").sum()).sort("device_id")
    assert br["communication_ns"].to_list() == comm["duration_ns"].to_list()


def test_overlap_by_hand_on_a_small_window(tp2_ops: pl.DataFrame) -> None:
    """Device 0 of llm_tp2_nccl, around the 21st all-reduce of rank 0 (step 2):

    nvjet GEMM        157652690–157657170  compute        (clipped to 157653730: 3440 ns)
    AllReduce kernel  157703730–157709266  communication  5536 ns
    elementwise       157746675–157747571  compute        896 ns
    window            157653730–157759266  = 105536 ns
    → compute only 4336, communication only 5536 (all exposed), overlap 0, idle 95664.
    """
    dev0 = tp2_ops.filter(pl.col("device_id") == 0)
    start, end = 157_703_730 - 50_000, 157_709_266 + 50_000
    br = overlap_breakdown(activity_segments(dev0, start_ns=start, end_ns=end)).row(0, named=True)
    assert br["span_ns"] == 105_536
    assert (br["compute_only_ns"], br["communication_only_ns"], br["overlap_ns"], br["memcpy_ns"], br["idle_ns"]) == (
        4336, 5536, 0, 0, 95_664
    )
    assert br["exposed_comm_ns"] == 5536 and br["exposed_fraction"] == 1.0
    assert br["comm_share"] == pytest.approx(5536 / 105_536)
    assert _brute_force(dev0, start, end) == {s: br[f"{s}_ns"] for s in STATES}


def test_overlap_path_by_hand_with_programmatic_dependent_launch() -> None:
    """cuBLAS's split-K reduce starts before its GEMM ends (PDL, same stream). Declared as
    "communication" through a user pattern, it gives real overlapping intervals:

    nvjet_…_splitK_NNT   ends  109123133
    splitKreduce_kernel  starts 109122973 → 160 ns overlap
    """
    trace = _open(TRAIN)
    ops = categorize_ops(trace.kernels, trace.memcpys, trace.memsets, patterns=[CommPattern("test", r"splitKreduce")])
    red = ops.filter((pl.col("comm_kind") == "test") & (pl.col("start_ns") == 109_122_973)).row(0, named=True)
    gemm = ops.filter((pl.col("category") == "compute") & (pl.col("end_ns") == 109_123_133))
    assert gemm["name"].str.contains("splitK").all() and gemm.height == 1
    start, end = red["start_ns"] - 20_000, red["end_ns"] + 20_000
    br = overlap_breakdown(activity_segments(ops, start_ns=start, end_ns=end)).row(0, named=True)
    assert br["overlap_ns"] == 160
    assert br["exposed_comm_ns"] == red["duration_ns"] - 160
    assert _brute_force(ops, start, end) == {s: br[f"{s}_ns"] for s in STATES}
    whole = overlap_breakdown(activity_segments(ops)).row(0, named=True)
    assert whole["overlap_ns"] == sum([160, 128, 128, 64, 128, 160, 128, 160])


def test_brute_force_on_random_windows() -> None:
    trace = _open(SLICE)
    ops = categorize_ops(trace.kernels, trace.memcpys, trace.memsets).filter(pl.col("device_id") == 0)
    t0, t1 = ops["start_ns"].min(), ops["end_ns"].max()
    step = (t1 - t0) // 7
    for i in range(6):
        start, end = t0 + i * step, t0 + i * step + 2_000_000
        br = overlap_breakdown(activity_segments(ops, start_ns=start, end_ns=end)).row(0, named=True)
        assert _brute_force(ops, start, end) == {s: br[f"{s}_ns"] for s in STATES}


def test_comm_share_per_iteration(tp2: NsysTrace, tp2_ops: pl.DataFrame) -> None:
    seg = activity_segments(tp2_ops)
    windows = range_windows(launch_info(tp2_ops, tp2.cuda_api), tp2.nvtx, pattern=r"^step\.", level=0)
    assert windows.height == 16  # 8 steps × 2 GPUs
    per = comm_by_range(seg, windows)
    parts = sum(per[f"{s}_ns"] for s in STATES)
    assert (parts == per["window_ns"]).all()
    assert ((per["comm_share"] >= 0) & (per["comm_share"] <= 1)).all()
    assert (per["exposed_comm_ns"] <= per["communication_ns"]).all()
    # each step window holds exactly its own communication kernels (one stream, no overlap)
    for row in per.iter_rows(named=True):
        inside = tp2_ops.filter(
            (pl.col("device_id") == row["device_id"]) & (pl.col("category") == "communication")
            & (pl.col("start_ns") >= row["start_ns"]) & (pl.col("end_ns") <= row["end_ns"])
        )
        assert row["communication_ns"] == inside["duration_ns"].sum()
    # the whole-GPU numbers are the sum of the steps plus what ran outside them
    br = overlap_breakdown(seg)
    steps = per.group_by("device_id").agg(pl.col("communication_ns").sum()).sort("device_id")
    assert (steps["communication_ns"] <= br["communication_ns"]).all()


def test_exposed_comm_share_of_the_tp2_sample(tp2_ops: pl.DataFrame) -> None:
    br = overlap_breakdown(activity_segments(tp2_ops)).sort("device_id")
    # decode at batch 4 is host-bound: the GPUs idle most of the time, nothing overlaps,
    # and every communication kernel (most of it waiting for the other rank) is exposed
    assert br["overlap_ns"].to_list() == [0, 0]
    assert br["exposed_fraction"].to_list() == [1.0, 1.0]
    assert br["exposed_share"].to_list() == pytest.approx([0.0512, 0.1756], abs=5e-4)
