"""The charts' data preparation on small hand-made frames: exact numbers."""

from __future__ import annotations

import polars as pl
import pytest

from tracekit.viz import prep


def _ops(rows: list[tuple[int, str, int, int]]) -> pl.DataFrame:
    return pl.DataFrame(
        {"device_id": [r[0] for r in rows], "stream_id": [7] * len(rows), "short_name": [r[1] for r in rows],
         "name": [r[1] for r in rows], "start_ns": [r[2] for r in rows], "end_ns": [r[3] for r in rows]},
        schema={"device_id": pl.Int64, "stream_id": pl.Int64, "short_name": pl.Utf8, "name": pl.Utf8,
                "start_ns": pl.Int64, "end_ns": pl.Int64},
    ).with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("duration_ns"))  # fmt: skip


_IDS = {"pid": 1, "global_pid": 1 << 24, "context_id": 1, "correlation_id": 1}


@pytest.mark.parametrize("full_schema", [True, False], ids=["analysis", "fallback"])
def test_temporal_breakdown_is_exact(full_schema: bool) -> None:
    kernels = _ops([
        (0, "gemm_kernel", 0, 100),            # compute 0-100
        (0, "ncclDevKernel_AllReduce", 50, 150),  # comm 50-150 → overlap 50-100
        (1, "gemm_kernel", 0, 40),
    ])  # fmt: skip
    copies = pl.DataFrame({"device_id": [0], "stream_id": [7], "start_ns": [170], "end_ns": [190], "bytes": [64],
                           "copy_kind": ["1"], "copy_kind_label": ["HtoD"], "src_kind": ["Pinned"], "dst_kind": ["Device"],
                           "src_device_id": [None], "dst_device_id": [0]},
                          schema_overrides={"src_device_id": pl.Int64}).with_columns(
        (pl.col("end_ns") - pl.col("start_ns")).alias("duration_ns"))  # fmt: skip
    if full_schema:
        kernels = kernels.with_columns(
            *(pl.lit(v, dtype=pl.Int64).alias(k) for k, v in _IDS.items())
        )
        copies = copies.with_columns(*(pl.lit(v, dtype=pl.Int64).alias(k) for k, v in _IDS.items()))
    else:
        copies = copies.select("device_id", "start_ns", "end_ns")
    b = prep.temporal_breakdown(kernels, copies)
    got = {(r["device_id"], r["category"]): r["time_ns"] for r in b.iter_rows(named=True)}
    assert (
        got[(0, "compute")] == 50 and got[(0, "overlap")] == 50 and got[(0, "communication")] == 50
    )
    assert got[(0, "memcpy")] == 20 and got[(0, "idle")] == 20  # window 0-190
    assert got[(1, "compute")] == 40 and got[(1, "idle")] == 150
    assert b.group_by("device_id").agg(pl.col("time_ns").sum())["time_ns"].to_list() == [190, 190]
    assert b["group"].unique().sort().to_list() == ["GPU 0", "GPU 1"]


def test_top_kernels_and_histogram() -> None:
    k = _ops([(0, "a_gemm", 0, 10), (0, "a_gemm", 20, 50), (0, "b_softmax", 60, 65)])
    top = prep.top_kernels(k, n=5)
    assert top["name"].to_list() == ["a_gemm", "b_softmax"]
    assert top["total_ns"].to_list() == [40, 5] and top["instances"].to_list() == [2, 1]
    assert top["family"].to_list() == ["gemm", "softmax"]
    assert abs(top["share"].sum() - 1.0) < 1e-12
    hist = prep.duration_histogram(k, bins_per_decade=1)
    assert hist["count"].sum() == 3
    assert (hist["bin_start_ns"] <= 30).all()


def test_binned_timeline_conserves_busy_time() -> None:
    k = _ops([(0, "gemm", i * 100, i * 100 + 60) for i in range(1000)])
    lanes = prep.timeline_ops(prep.gpu_ops(k), max_marks=100)
    assert lanes.height <= 100 and lanes["binned"].all()
    busy = ((lanes["end_ns"] - lanes["start_ns"]) * lanes["busy_fraction"]).sum()
    assert busy == pytest.approx(60 * 1000, rel=1e-6)


def test_layer_block_matrix_and_nvtx_tree() -> None:
    a = pl.DataFrame({
        "nvtx_path": ["step.0/layer.0/attn", "step.0/layer.0/mlp", "step.0/layer.1/attn", "step.0/layer.1", "step.0", None],
        "duration_ns": [10, 20, 30, 5, 7, 100],
        "pid": [1] * 6,
    })  # fmt: skip
    m = prep.layer_block_matrix(a)
    assert m.select("layer", "block", "time_ns").rows() == [
        (0, "attn", 10),
        (0, "mlp", 20),
        (1, "(layer)", 5),
        (1, "attn", 30),
    ]
    tree = prep.nvtx_tree(a, max_depth=2)
    got = dict(zip(tree["path"].to_list(), tree["gpu_time_ns"].to_list(), strict=True))
    assert got == {"step.0": 72, "step.0/layer.0": 30, "step.0/layer.1": 35}


def test_iterations_memory_and_metrics() -> None:
    nvtx = pl.DataFrame({
        "pid": [1, 1, 1], "tid": [1, 1, 1], "name": ["step.0", "step.1", "layer.0"], "event_type": ["PushPop"] * 3,
        "start_ns": [0, 100, 10], "end_ns": [90, 250, 20],
    })  # fmt: skip
    it = prep.iteration_times(nvtx)
    assert it["iteration"].to_list() == [0, 1] and it["duration_ns"].to_list() == [90, 150]
    mem = pl.DataFrame({
        "device_id": [0, 0, 0], "start_ns": [0, 10, 20], "bytes": [100, 50, 100], "operation": ["alloc", "alloc", "free"],
    })  # fmt: skip
    series = prep.memory_series(mem, max_points=100)
    assert series["in_use_bytes"].to_list() == [100, 150, 50]
    g = pl.DataFrame({
        "device_id": [0, 0, 0, 0], "timestamp_ns": [0, 1, 2, 3], "metric": ["tensor_active"] * 4,
        "metric_label": ["Tensor Active [Throughput %]"] * 4, "value": [10, 20, 30, 40],
    })  # fmt: skip
    s = prep.gpu_metrics_series(g, max_points=2)
    assert s["label"].unique().to_list() == ["Tensor Active"] and s["value_pct"].to_list() == [
        15.0,
        35.0,
    ]


def test_nccl_bus_bandwidth_follows_nccl_tests() -> None:
    calls = pl.DataFrame({"op": ["AllReduce", "AllGather", "Send"], "bytes": [1000, 1000, 1000],
                          "comm_nranks": [4, 4, 2], "gpu_duration_ns": [100, 100, 100]})  # fmt: skip
    out = prep.nccl_bandwidth(calls)
    busbw = dict(zip(out["op"].to_list(), out["bus_bandwidth_gbps"].to_list(), strict=True))
    assert busbw["AllReduce"] == pytest.approx(15.0)  # 1000 B / 100 ns × 2(n-1)/n, n = 4
    assert busbw["Send"] == pytest.approx(10.0)
    assert prep.nccl_bandwidth(out) is out  # already computed: unchanged
