"""Layers of Hugging Face module paths (``--annotate-torch``): layer and block parsing, forwards
as steps, attribution's layer matrix, ``tracekit model --trace``, per-layer memory and the
diagnosis rules that talk about layers, on the real ``hf_generate_eager`` capture (HF
``generate()`` of a 28-layer Qwen3-0.6B-shaped model on an H100: batch 8, prompt 512, 24 new
tokens; one ``Qwen3ForCausalLM`` range per forward). Measured times are recomputed with plain
SQL over the export (nsys's rule: an operation belongs to the ranges that enclose its launching
CUDA call on the same thread)."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import warnings
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit.analysis.attribution import attribute_trace
from tracekit.analysis.breakdowns import layer_matrix
from tracekit.analysis.layers import LAYER_RANGE_PATTERN, forward_ranges, forwards, layer_of
from tracekit.analysis.memory import layer_memory
from tracekit.model import compare, load_model

from .conftest import ROOT, llm_capture

QWEN3 = ROOT / "tests" / "data" / "hf_configs" / "qwen3_0.6b.json"
LAYERS = 28
FORWARDS = 24  # 1 prefill (the prompt) + 23 decode forwards
ROOT_RANGE = "Qwen3ForCausalLM"

# every kernel, copy and memset with its launching call (same process)
_OPS_SQL = """
ops AS (
    SELECT correlationId, globalPid, start, end FROM CUPTI_ACTIVITY_KIND_KERNEL
    UNION ALL SELECT correlationId, globalPid, start, end FROM CUPTI_ACTIVITY_KIND_MEMCPY
    UNION ALL SELECT correlationId, globalPid, start, end FROM CUPTI_ACTIVITY_KIND_MEMSET
),
launched AS (
    SELECT r.globalTid AS tid, r.start AS api_start, r.end AS api_end, o.end - o.start AS ns
    FROM ops o JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
      ON r.correlationId = o.correlationId AND r.globalTid / 16777216 = o.globalPid / 16777216
)"""


@pytest.fixture(scope="module")
def sqlite_path() -> Path:
    return llm_capture("hf_generate_eager")


@pytest.fixture(scope="module")
def trace(sqlite_path: Path) -> tracekit.NsysTrace:
    return tracekit.open(sqlite_path)  # type: ignore[return-value]


def _sql(path: Path, query: str, args: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return con.execute(query, args).fetchall()
    finally:
        con.close()


def _layer_ns_of_forward(path: Path, forward: int) -> dict[int, int]:
    """GPU time of the work launched inside each ``model.layers.N`` range of the forward-th
    ``Qwen3ForCausalLM`` range (start order), by SQL."""
    rows = _sql(path, f"""
        WITH f AS (SELECT start, end, globalTid FROM NVTX_EVENTS WHERE text = ? ORDER BY start LIMIT 1 OFFSET ?),
        l AS (SELECT n.text, n.start, n.end, n.globalTid FROM NVTX_EVENTS n, f
              WHERE n.text GLOB 'model.layers.[0-9]*' AND n.text NOT GLOB 'model.layers.*.*'
                AND n.globalTid = f.globalTid AND n.start >= f.start AND n.end <= f.end),
        {_OPS_SQL}
        SELECT l.text, sum(x.ns) FROM l JOIN launched x
          ON x.tid = l.globalTid AND x.api_start >= l.start AND x.api_end <= l.end
        GROUP BY l.text""", (ROOT_RANGE, forward))
    return {int(str(name).rsplit(".", 1)[1]): int(ns) for name, ns in rows}  # type: ignore[call-overload]


@pytest.mark.parametrize(
    ("text", "layer", "block"),
    [
        # --annotate-torch module paths: the innermost element holding the layer decides the block
        ("Qwen3ForCausalLM/model/model.layers.3/model.layers.3.self_attn", 3, "self_attn"),
        ("Qwen3ForCausalLM/model/model.layers.3", 3, None),
        ("Qwen3ForCausalLM/model/model.layers.3/model.layers.3.mlp/model.layers.3.mlp.down_proj", 3, "mlp"),
        ("Qwen3ForCausalLM/model/model.layers.27/model.layers.27.post_attention_layernorm", 27, "post_attention_layernorm"),
        ("GPT2LMHeadModel/transformer/transformer.h.11/transformer.h.11.attn", 11, "attn"),
        ("OPTForCausalLM/model/model.decoder/model.decoder.layers.5/model.decoder.layers.5.fc1", 5, "fc1"),
        ("model.layers.3.mlp.experts.7.down_proj", 3, "mlp"),
        ("Qwen3ForCausalLM/model/model.layers.3/aten::add", 3, None),
        # dotted names and hand-written nested ranges
        ("transformer.h.11.mlp", 11, "mlp"),
        ("model.decoder.layers.5.fc1", 5, "fc1"),
        ("blocks.2.attn", 2, "attn"),
        ("step.3/layer.2/attn", 2, "attn"),
        ("step.3/layer.2/attn/aten::mm", 2, "attn"),
        ("step.3/layer.2", 2, None),
        ("step.3/decoder_layer_3/attn", 3, "attn"),
        # other numbers are no layers
        ("decode.3", None, None),
        ("step.3", None, None),
        ("model.embed_tokens", None, None),
        ("Qwen3ForCausalLM/model/model.embed_tokens", None, None),
        ("Qwen3ForCausalLM/lm_head", None, None),
        ("decode.3/step.4/batch.5", None, None),
        ("model.layers.3x", None, None),
    ],
)
def test_layer_of_path_shapes(text: str, layer: int | None, block: str | None) -> None:
    lay, blk = layer_of(pl.lit(text))
    assert pl.select(lay.alias("l"), blk.alias("b")).row(0) == (layer, block)


def test_layers_30_is_not_layer_3() -> None:
    lay, blk = layer_of(pl.lit("Qwen3ForCausalLM/model/model.layers.30/model.layers.30.mlp"))
    assert pl.select(lay.alias("l"), blk.alias("b")).row(0) == (30, "mlp")


@pytest.mark.parametrize(
    ("label", "is_layer"),
    [("model.layers.3", True), ("transformer.h.11", True), ("model.decoder.layers.5", True), ("layer.2", True),
     ("decoder_layer_3", True), ("block 3", True), ("model.layers.3.self_attn", False), ("model.embed_tokens", False),
     ("step.3", False), ("decode.3", False), (ROOT_RANGE, False), ("model", False)],
)
def test_layer_range_pattern(label: str, is_layer: bool) -> None:
    assert pl.select(pl.lit(label).str.contains(LAYER_RANGE_PATTERN)).item() is is_layer


def test_forwards_are_the_root_module_ranges(trace: tracekit.NsysTrace, sqlite_path: Path) -> None:
    fr = forward_ranges(trace.nvtx)
    assert fr.height == FORWARDS and set(fr["name"]) == {ROOT_RANGE} and set(fr["layers"]) == {LAYERS}
    starts = [int(s) for (s,) in _sql(sqlite_path, "SELECT start FROM NVTX_EVENTS WHERE text = ? ORDER BY start", (ROOT_RANGE,))]  # type: ignore[call-overload]
    assert fr["start_ns"].to_list() == starts and fr["forward"].to_list() == list(range(FORWARDS))
    per = forwards(attribute_trace(trace), fr)
    # the prompt's forward (8 × 512 tokens) against 23 one-token forwards
    assert per["phase"].to_list() == ["prefill"] + ["decode"] * (FORWARDS - 1)
    total = _sql(sqlite_path, f"""
        WITH f AS (SELECT start, end, globalTid FROM NVTX_EVENTS WHERE text = ? ORDER BY start LIMIT 1 OFFSET 5),
        {_OPS_SQL}
        SELECT sum(x.ns) FROM f JOIN launched x ON x.tid = f.globalTid AND x.api_start >= f.start AND x.api_end <= f.end""",
        (ROOT_RANGE,))[0][0]
    assert per.filter(pl.col("forward") == 5)["gpu_time_ns"].item() == total


def test_a_range_around_many_forwards_is_no_forward(sqlite_path: Path, tmp_path: Path) -> None:
    """A ``generate`` range around every forward holds each layer 24 times: the forwards stay
    the root-module ranges; layer ranges with nothing around them have no forward."""
    copy = tmp_path / "wrapped.sqlite"
    shutil.copyfile(sqlite_path, copy)
    con = sqlite3.connect(copy)
    lo, hi, tid = con.execute("SELECT min(start) - 1, max(end) + 1, globalTid FROM NVTX_EVENTS").fetchone()
    con.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) VALUES (?, ?, 59, 'generate', ?, 0)",
                (lo, hi, tid))
    con.commit()
    con.close()
    nvtx = tracekit.open(copy).nvtx
    fr = forward_ranges(nvtx)
    assert fr.height == FORWARDS and set(fr["name"]) == {ROOT_RANGE}
    assert forward_ranges(nvtx.filter(pl.col("name").str.starts_with("model.layers."))).height == 0


def test_layer_matrix_sees_28_layers_and_their_blocks(trace: tracekit.NsysTrace, sqlite_path: Path) -> None:
    m = layer_matrix(attribute_trace(trace))
    assert m["layer"].unique().sort().to_list() == list(range(LAYERS))
    blocks = {b for b in m["block"].to_list() if b is not None}
    assert blocks == {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}
    assert m.filter(pl.col("block").is_null())["layer"].n_unique() == LAYERS  # residual adds in the layer itself
    total = _sql(sqlite_path, f"""
        WITH l AS (SELECT start, end, globalTid FROM NVTX_EVENTS
                   WHERE text GLOB 'model.layers.[0-9]*' AND text NOT GLOB 'model.layers.*.*'),
        {_OPS_SQL}
        SELECT sum(x.ns) FROM l JOIN launched x ON x.tid = l.globalTid AND x.api_start >= l.start AND x.api_end <= l.end""")[0][0]
    assert m["gpu_time_ns"].sum() == total


def test_compare_per_decode_forward_and_layer_by_sql(trace: tracekit.NsysTrace, sqlite_path: Path) -> None:
    cfg = load_model(QWEN3, phase="decode", batch=8, context_len=512)
    cmp = compare(trace, cfg)
    layers = cmp.filter(pl.col("layer").is_not_null())
    assert layers["step"].unique().sort().to_list() == list(range(1, FORWARDS))  # the prefill forward left out
    assert set(layers.group_by("step").len()["len"]) == {LAYERS} and set(cmp["phase"]) == {"decode"}
    for step in (1, 12, FORWARDS - 1):
        by_sql = _layer_ns_of_forward(sqlite_path, step)
        got = dict(layers.filter(pl.col("step") == step).select("layer", "measured_ns").iter_rows())
        assert got == by_sql and len(got) == LAYERS
    row = layers.row(0, named=True)
    assert 0 < row["efficiency"] < 1 and row["bound"] == "memory" and row["gpu"] == "H100 SXM5"
    # a prefill model is compared with the prompt's forward only
    pre = compare(trace, cfg.with_(phase="prefill", prompt_len=512))
    assert pre["step"].unique().to_list() == [0] and set(pre["phase"]) == {"prefill"}
    assert dict(pre.filter(pl.col("layer").is_not_null()).select("layer", "measured_ns").iter_rows()) == _layer_ns_of_forward(sqlite_path, 0)


def test_cli_model_trace(sqlite_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "tracekit.cli.main", "model", str(QWEN3), "--trace", str(sqlite_path), "--phase", "decode",
         "--batch", "8", "--context-len", "512", "-f", "json"],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr
    payload = json.loads(r.stdout)
    assert payload["config"]["context_len"] == 512 and payload["config"]["batch"] == 8
    rows = pl.DataFrame(payload["compare"])
    per_step = rows.filter(pl.col("layer").is_not_null()).group_by("step").len()
    assert per_step.height == FORWARDS - 1 and set(per_step["len"]) == {LAYERS}


def test_layer_memory_of_the_28_layers(trace: tracekit.NsysTrace) -> None:
    from tracekit.viz.prep import LAYER_MEMORY_PATTERN

    rows = layer_memory(trace.memory_usage, trace.nvtx, ranges=LAYER_RANGE_PATTERN)
    assert rows.height == FORWARDS * LAYERS and rows["name"].n_unique() == LAYERS
    # no step ranges: the step is the forward
    assert rows["step"].unique().sort().to_list() == list(range(FORWARDS))
    assert set(rows.group_by("step").len()["len"]) == {LAYERS}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        shown = layer_memory(trace.memory_usage, trace.nvtx, ranges=LAYER_MEMORY_PATTERN)
    assert shown.height == rows.height


def test_diagnose_compares_the_28_layers(sqlite_path: Path) -> None:
    d = tracekit.diagnose(sqlite_path, model=load_model(QWEN3, batch=8, context_len=512))
    f = d.findings.filter(pl.col("category") == "below_model_bound")
    assert f.height == 1 and f"{LAYERS} of {LAYERS} layers" in f["title"][0]


def test_memory_growth_names_the_layers(sqlite_path: Path, tmp_path: Path) -> None:
    """A copy with 1 MiB allocated at the start of every layer's ``self_attn`` range in each
    decode forward (a KV cache growing by concatenation): 28 MiB per step, all inside the
    layers, most in their ``self_attn``; not 'inside Qwen3ForCausalLM', which holds them."""
    copy = tmp_path / "kv_growth.sqlite"
    shutil.copyfile(sqlite_path, copy)
    con = sqlite3.connect(copy)
    pid, ctx_id = con.execute("SELECT globalPid, contextId FROM CUDA_GPU_MEMORY_USAGE_EVENTS WHERE memKind = 2 LIMIT 1").fetchone()
    forwards_ = con.execute("SELECT start, end FROM NVTX_EVENTS WHERE text = ? ORDER BY start", (ROOT_RANGE,)).fetchall()
    address = 1 << 44
    for lo, hi in forwards_[1:]:
        for (start,) in con.execute("SELECT start FROM NVTX_EVENTS WHERE text GLOB 'model.layers.*.self_attn' "
                                    "AND start >= ? AND end <= ?", (lo, hi)).fetchall():
            address += 1 << 20
            con.execute("INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS (start, globalPid, deviceId, contextId, address, pc, bytes, "
                        "memKind, memoryOperationType) VALUES (?, ?, 0, ?, ?, 0, ?, 2, 0)", (start + 1, pid, ctx_id, address, 1 << 20))
    con.commit()
    con.close()
    d = tracekit.diagnose(copy)
    title = d.findings.filter(pl.col("category") == "memory_growth")["title"][0]
    assert "grows 28.0 MiB per step" in title
    assert "100% of it inside the layer ranges (28 of 28 layers grow), most in their 'self_attn' sub-ranges" in title
