"""PyTorch operator table from emit_nvtx(record_shapes=True) ranges (sample
llm_train_emit_nvtx_1gpu), checked against the raw NVTX and kernel rows."""

from __future__ import annotations

import sqlite3
import warnings

import polars as pl
import pytest

import tracekit
from tracekit.analysis.attribution import attribute_nvtx, launch_info
from tracekit.analysis.breakdowns import layer_matrix
from tracekit.analysis.gpu_time import gpu_ops
from tracekit.analysis.torch_ops import (
    link_backward,
    op_layer_matrix,
    parse_torch_op,
    torch_op_summary,
    torch_ops,
)

from .conftest import SAMPLES

TRAIN = SAMPLES / "llm_train_emit_nvtx_1gpu" / "llm_train_emit_nvtx_1gpu.sqlite"


@pytest.fixture(scope="module")
def trace() -> tracekit.NsysTrace:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tracekit.open(TRAIN)  # type: ignore[return-value]


@pytest.fixture(scope="module")
def ops(trace: tracekit.NsysTrace) -> pl.DataFrame:
    return launch_info(gpu_ops(trace.kernels, trace.memcpys, trace.memsets), trace.cuda_api)


@pytest.fixture(scope="module")
def inst(ops: pl.DataFrame, trace: tracekit.NsysTrace) -> pl.DataFrame:
    return torch_ops(ops, trace.nvtx)


def _sql(query: str, *args: object) -> list[tuple]:
    con = sqlite3.connect(f"file:{TRAIN}?mode=ro", uri=True)
    try:
        return con.execute(query, args).fetchall()
    finally:
        con.close()


def test_parse_emit_nvtx_names() -> None:
    name = "aten::linear, seq = 144, op_id = 25, sizes = [[4, 64, 1024], [3072, 1024], []], input_op_ids = [(20,0), (0,-1), (0,-1)]"
    row = pl.select(parse_torch_op(pl.lit(name))).row(0, named=True)
    assert row == {"op": "aten::linear", "seq": 144, "op_id": 25, "input_shapes": "[[4, 64, 1024], [3072, 1024], []]"}
    bare = pl.select(parse_torch_op(pl.lit("autograd::engine::evaluate_function: MmBackward0, op_id = 438"))).row(0, named=True)
    assert bare["op"] == "autograd::engine::evaluate_function: MmBackward0" and bare["seq"] is None and bare["input_shapes"] is None


def test_one_row_per_operator_range(inst: pl.DataFrame) -> None:
    n_ops = _sql("SELECT count(*) FROM NVTX_EVENTS WHERE eventType = 59 AND text LIKE '%op_id = %'")[0][0]
    assert inst.height == n_ops
    assert set(inst["direction"]) == {"forward", "backward"}


def test_gpu_time_is_the_work_launched_inside(inst: pl.DataFrame) -> None:
    """An aten::mm instance: kernels whose launch call lies inside its range, from SQL."""
    row = inst.filter((pl.col("op") == "aten::mm") & (pl.col("direction") == "forward")).row(0, named=True)
    s, e, g = _sql("SELECT start, end, globalTid FROM NVTX_EVENTS WHERE rowid = ?", row["range_id"])[0]
    durations = [d for (d,) in _sql(
        "SELECT k.end - k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId "
        "AND k.globalPid = (r.globalTid / 16777216) * 16777216 WHERE r.globalTid = ? AND r.start >= ? AND r.end <= ?", g, s, e)]
    assert row["gpu_ns"] == sum(durations) and row["kernels"] == len(durations) > 0
    assert row["cpu_ns"] == e - s
    assert row["input_shapes"].startswith("[[")


def test_self_times_partition_the_attributed_gpu_time(inst: pl.DataFrame, ops: pl.DataFrame) -> None:
    # every kernel of this sample is launched inside some operator range
    assert inst["gpu_self_ns"].sum() == ops["duration_ns"].sum()
    top = torch_op_summary(inst, top_level_only=True)
    assert top["gpu_ns"].sum() == ops["duration_ns"].sum()
    assert top["gpu_share"].sum() == pytest.approx(1.0)
    assert (inst["cpu_self_ns"] <= inst["cpu_ns"]).all() and (inst["cpu_self_ns"] >= 0).all()


def test_backward_work_is_placed_in_its_forward_layer(inst: pl.DataFrame, ops: pl.DataFrame, trace: tracekit.NsysTrace) -> None:
    mm_b = inst.filter(pl.col("op") == "MmBackward0")
    assert mm_b.height and mm_b["seq"].null_count() == 0
    # the forward range with the same seq, by SQL
    seq = mm_b.filter(pl.col("layer").is_not_null())["seq"][0]
    fwd = _sql("SELECT text FROM NVTX_EVENTS WHERE globalTid % 16777216 = 1030 AND text LIKE ?", f"%, seq = {seq}, %")
    assert fwd and all("Backward" not in t for (t,) in fwd)
    row = mm_b.filter(pl.col("seq") == seq).row(0, named=True)
    assert row["forward_path"].split("/")[-1] == fwd[-1][0].split(",")[0]
    m = op_layer_matrix(inst, top_level_only=True)
    assert set(m["direction"]) == {"forward", "backward"} and set(m["layer"]) == {0, 1, 2, 3}
    linked = link_backward(attribute_nvtx(ops, trace.nvtx), trace.nvtx)
    lm = layer_matrix(linked, column="forward_path", extra=["direction"])
    back = lm.filter(pl.col("direction") == "backward")
    assert back.height == 8  # 4 layers × attn/mlp
    bwd_kernels = linked.filter(pl.col("direction") == "backward")
    assert bwd_kernels.height == ops.filter(pl.col("global_tid") % (1 << 24) == 1102).height


def test_summary_by_shapes(inst: pl.DataFrame) -> None:
    s = torch_op_summary(inst.filter(pl.col("op") == "aten::linear"))
    assert s.height == s.select("op", "input_shapes").n_unique()
    assert s["calls"].sum() == inst.filter(pl.col("op") == "aten::linear").height
