"""Range breakdowns, path levels, the layer × block matrix and kernel families, checked
against sums over the raw rows."""

from __future__ import annotations

import sqlite3
import warnings
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit.analysis.attribution import attribute_nvtx, launch_info
from tracekit.analysis.breakdowns import layer_matrix, layer_of, level_breakdown, range_breakdown
from tracekit.analysis.families import family_breakdown
from tracekit.analysis.gpu_time import gpu_ops

from .conftest import SAMPLES

DECODE = SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
TP2 = SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"


def _attributed(path: Path) -> tuple[tracekit.NsysTrace, pl.DataFrame]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trace = tracekit.open(path)
    ops = gpu_ops(trace.kernels, trace.memcpys, trace.memsets)
    return trace, attribute_nvtx(launch_info(ops, trace.cuda_api), trace.nvtx)  # type: ignore[union-attr]


def _kernel_time_inside(path: Path, *names: str) -> int:
    """Summed kernel time of kernels whose launch lies inside nested ranges ``names`` (outer
    first) on the launching thread — the nsys rule in SQL."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    joins, conds = [], []
    for i, name in enumerate(names):
        joins.append(f"JOIN NVTX_EVENTS n{i} ON n{i}.globalTid = r.globalTid AND n{i}.eventType = 59 "
                     f"AND n{i}.start <= r.start AND n{i}.end >= r.end AND n{i}.text = '{name}'")
        if i:
            conds.append(f"n{i - 1}.start <= n{i}.start AND n{i - 1}.end >= n{i}.end")
    where = ("WHERE " + " AND ".join(conds)) if conds else ""
    q = (f"SELECT coalesce(sum(k.end - k.start), 0) FROM (SELECT DISTINCT k.rowid AS id FROM CUPTI_ACTIVITY_KIND_KERNEL k "
         f"JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId AND k.globalPid = (r.globalTid / 16777216) * 16777216 "
         f"{' '.join(joins)} {where}) x JOIN CUPTI_ACTIVITY_KIND_KERNEL k ON k.rowid = x.id")
    try:
        return con.execute(q).fetchone()[0]
    finally:
        con.close()


def test_range_breakdown_partitions_gpu_time() -> None:
    _, a = _attributed(DECODE)
    by_range = range_breakdown(a)
    assert by_range["gpu_time_ns"].sum() == a["duration_ns"].sum()
    assert by_range["share"].sum() == pytest.approx(1.0)
    attn = by_range.filter(pl.col("nvtx_range") == "attn").row(0, named=True)
    # attn ranges have no sub-ranges, so innermost time = all kernel time inside them
    assert attn["gpu_time_ns"] == _kernel_time_inside(DECODE, "attn")
    by_path = range_breakdown(a, by="nvtx_path")
    assert by_path.filter(pl.col("nvtx_path") == "step.3/layer.1/attn")["gpu_time_ns"].item() == _kernel_time_inside(
        DECODE, "step.3", "layer.1", "attn"
    )
    with pytest.raises(ValueError, match="by must be"):
        range_breakdown(a, by="name")


def test_level_breakdown_counts_inner_work_in_the_level_range() -> None:
    trace, a = _attributed(DECODE)
    steps = level_breakdown(a, trace.nvtx, level=0)
    assert steps["gpu_time_ns"].sum() == a["duration_ns"].sum()
    step3 = steps.filter(pl.col("range") == "step.3")["gpu_time_ns"].item()
    kernels3 = _kernel_time_inside(DECODE, "step.3")
    memcpy3 = a.filter((pl.col("op_kind") == "memcpy") & pl.col("nvtx_path").str.starts_with("step.3"))["duration_ns"].sum()
    assert step3 == kernels3 + memcpy3
    layers = level_breakdown(a, trace.nvtx, level=1)
    assert layers.filter(pl.col("path") == "step.3/layer.1")["gpu_time_ns"].item() == _kernel_time_inside(DECODE, "step.3", "layer.1")
    # deeper than any path: everything is "(none)"
    deep = level_breakdown(a, trace.nvtx, level=9)
    assert deep["range"].to_list() == ["(none)"]


def test_layer_matrix_from_nested_ranges() -> None:
    _, a = _attributed(DECODE)
    m = layer_matrix(a)
    assert m.select("layer", "block").rows() == [(layer, b) for layer in range(4) for b in ("attn", "mlp")]
    for layer in range(4):
        for block in ("attn", "mlp"):
            got = m.filter((pl.col("layer") == layer) & (pl.col("block") == block))["gpu_time_ns"].item()
            expected = sum(_kernel_time_inside(DECODE, f"step.{s}", f"layer.{layer}", block) for s in range(8))
            assert got == expected
    wide = m.pivot(on="block", index="layer", values="gpu_time_ns")
    assert wide.columns == ["layer", "attn", "mlp"]


def test_layer_matrix_multi_rank_and_nccl_blocks() -> None:
    _, a = _attributed(TP2)
    m = layer_matrix(a, extra=["pid"])
    assert set(m["pid"]) == set(a["pid"])
    assert m["share"].sum() <= 1.0


@pytest.mark.parametrize(
    ("text", "layer", "block"),
    [
        ("step.3/layer.2/attn", 2, "attn"),
        ("step.3/layer.2/attn/aten::linear", 2, "attn"),
        ("step.3/layer.2/aten::add", 2, None),
        ("model.layers.5.mlp.down_proj", 5, "mlp"),
        ("transformer.h.11.attn", 11, "attn"),
        ("blocks.0", 0, None),
        ("step.3/embedding", None, None),
    ],
)
def test_layer_pattern_reads_paths_and_dotted_names(text: str, layer: int | None, block: str | None) -> None:
    lay, blk = layer_of(pl.lit(text))
    out = pl.select(lay.alias("l"), blk.alias("b")).row(0)
    assert out == (layer, block)


def test_family_breakdown_sums_to_total() -> None:
    trace, a = _attributed(TP2)
    fam = family_breakdown(a)
    assert fam["gpu_time_ns"].sum() == a["duration_ns"].sum()
    comm = fam.filter(pl.col("family") == "communication")["gpu_time_ns"].item()
    con = sqlite3.connect(f"file:{TP2}?mode=ro", uri=True)
    nccl = con.execute(
        "SELECT sum(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName WHERE s.value LIKE 'nccl%'"
    ).fetchone()[0]
    con.close()
    assert comm == nccl
    assert fam.filter(pl.col("family") == "copy")["kernels"].item() >= trace.memcpys.height  # type: ignore[union-attr]
