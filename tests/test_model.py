"""tracekit.model: formulas against published counts and hand calculation, and against the
decode sample (H200) measured by plain SQL."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit.errors import TracekitError
from tracekit.model import TransformerConfig, compare, load_model, model_costs, model_summary
from tracekit.ncu.specs import find_spec

from .conftest import ROOT, SAMPLES

LLAMA2_7B = {  # meta-llama/Llama-2-7b-hf config.json (the fields the model reads)
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 32, "vocab_size": 32000, "hidden_act": "silu",
    "torch_dtype": "float16", "tie_word_embeddings": False,
}
DECODE = SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
TINY = ROOT / "configs" / "models" / "tinyllm_decode.yaml"


def _hf(tmp_path: Path, cfg: dict[str, object]) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def test_llama2_7b_counts(tmp_path: Path) -> None:
    """6.74 B parameters (published: 6,738,415,616 with 2·4096 norm weights per layer and the
    final norm's 4,096, counted in the logits block); ≈ 2·N FLOPs per token; KV cache
    2·layers·kv_heads·head_dim·bytes = 524,288 bytes per token in fp16."""
    cfg = load_model(_hf(tmp_path, LLAMA2_7B), context_len=16)
    s = model_summary(cfg)
    assert s["params"] == 6_738_415_616
    assert s["kv_bytes_per_token"] == 2 * 32 * 32 * 128 * 2
    assert s["flops_per_token"] == pytest.approx(2 * s["params"], rel=0.03)
    assert cfg.dtype == "fp16" and cfg.gated_mlp


def test_gqa_and_moe_published_sizes() -> None:
    llama3 = TransformerConfig(layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256)
    assert model_summary(llama3)["params"] == pytest.approx(8.03e9, rel=0.002)  # Llama-3-8B: 8.03 B
    assert model_summary(llama3)["kv_bytes_per_token"] == 2 * 32 * 8 * 128 * 2
    mixtral = TransformerConfig(layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=32000,
                                experts=8, top_k=2, context_len=16)
    s = model_summary(mixtral)
    assert s["params"] == pytest.approx(46.7e9, rel=0.003)  # Mixtral-8x7B: 46.7 B total
    assert s["flops_per_token"] == pytest.approx(2 * 12.9e9, rel=0.03)  # 12.9 B active


def test_roofline_time_by_hand() -> None:
    """Decode, batch 1, H100 SXM (989.4 TFLOP/s bf16, 3.35 TB/s): every block is memory-bound
    and its minimum is bytes / 3.35e12 s."""
    cfg = load_model(LLAMA2_7B, dtype="bf16", context_len=512)
    costs = model_costs(cfg, gpu="NVIDIA H100 80GB HBM3")
    assert set(costs["bound"]) == {"memory"}
    expected = costs["bytes"] / 3.35e12 * 1e9
    assert (costs["min_time_ns"] - expected).abs().max() < 1e-6
    mlp = costs.filter((pl.col("layer") == 0) & (pl.col("block") == "mlp")).row(0, named=True)
    assert mlp["weight_bytes"] == 3 * 4096 * 11008 * 2 and mlp["flops"] == 2 * 3 * 4096 * 11008
    prefill = model_costs(cfg.with_(phase="prefill", batch=8, prompt_len=2048), gpu="NVIDIA H100 80GB HBM3")
    assert prefill.filter(pl.col("block") == "mlp")["bound"].unique().to_list() == ["compute"]


def test_tensor_parallel_shards_and_communication() -> None:
    one = model_costs(load_model(LLAMA2_7B, batch=4))
    two = model_costs(load_model(LLAMA2_7B, batch=4, tp=2))
    a = one.filter(pl.col("layer") == 0).select("block", "params").to_dict(as_series=False)
    b = two.filter(pl.col("layer") == 0).select("block", "params").to_dict(as_series=False)
    for blk, pa, pb in zip(a["block"], a["params"], b["params"], strict=True):
        assert pb == (pa if blk == "norm" else pa / 2)
    # two ring all-reduces per layer of T·d·b, each sending 2·(tp−1)/tp of it
    assert two.filter(pl.col("layer") == 0)["comm_bytes"].sum() == 2 * (2 * 0.5 * 4 * 4096 * 2)


def test_decode_sample_measured_by_hand() -> None:
    """The decode sample's layer.2 in step.3: GPU time of the work launched inside it, by SQL;
    the model's minimum of that layer on the sample's H200; efficiency in (0, 1]."""
    cfg = load_model(TINY)
    trace = tracekit.open(DECODE)
    cmp = compare(trace, cfg)
    row = cmp.filter((pl.col("step") == 3) & (pl.col("layer") == 2)).row(0, named=True)
    con = sqlite3.connect(f"file:{DECODE}?mode=ro", uri=True)
    s0, s1, tid = con.execute("SELECT start, end, globalTid FROM NVTX_EVENTS WHERE text = 'step.3'").fetchone()
    l0, l1 = con.execute(
        "SELECT start, end FROM NVTX_EVENTS WHERE text = 'layer.2' AND start >= ? AND end <= ? AND globalTid = ?", (s0, s1, tid)
    ).fetchone()
    total = 0
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        if table not in tables:
            continue
        total += con.execute(
            f"SELECT coalesce(sum(o.end - o.start), 0) FROM {table} o JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
            "ON r.correlationId = o.correlationId WHERE r.globalTid = ? AND r.start >= ? AND r.start <= ?", (tid, l0, l1),
        ).fetchone()[0]
    con.close()
    assert row["measured_ns"] == total
    spec = find_spec("NVIDIA H200")
    layer_bytes = model_costs(cfg).filter(pl.col("layer") == 2)
    expected = sum(max(f / (spec.tensor_tflops["bf16"] * 1e12), b / (spec.bandwidth_gbps * 1e9)) * 1e9  # type: ignore[union-attr]
                   for f, b in zip(layer_bytes["flops"], layer_bytes["bytes"], strict=True))
    assert row["predicted_min_ns"] == pytest.approx(expected)
    assert 0 < row["efficiency"] <= 1 and row["gpu"] == "H200 SXM"
    assert row["mbu"] == pytest.approx(layer_bytes["bytes"].sum() / (total * 1e-9 * 4.8e12))


def test_diagnose_with_a_model() -> None:
    d = tracekit.diagnose(DECODE, model=TINY)
    f = d.findings.filter(pl.col("category") == "below_model_bound")
    assert f.height == 1 and "4 of 4 layers" in f["title"][0]


def test_bad_configs_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(TracekitError, match="not a multiple of kv_heads"):
        TransformerConfig(layers=2, hidden=64, heads=8, kv_heads=3, ffn_hidden=128, vocab=10)
    bad = tmp_path / "m.yaml"
    bad.write_text("layers: 2\nhidden: 64\nwidth: 3\n")
    with pytest.raises(TracekitError, match="unknown field"):
        load_model(bad)
    r = subprocess.run([sys.executable, "-m", "tracekit.cli.main", "model", str(bad)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1


def test_a_trace_given_as_the_config_is_one_line(tmp_path: Path) -> None:
    """``tracekit model run.sqlite`` (the trace where the config goes) was an internal error
    (UnicodeDecodeError) on every bundled export."""
    with pytest.raises(TracekitError, match=r"is an SQLite database \(an Nsight Systems export\?\), not text; .* pass it with --trace"):
        load_model(DECODE)
    with pytest.raises(TracekitError, match="is a binary file, not text; .* pass it with --trace"):
        load_model(DECODE.with_suffix(".nsys-rep"))
    ref = tmp_path / "m.yaml"
    ref.write_text("hf_config: missing.json\n")
    with pytest.raises(TracekitError, match=r"hf_config .*missing.json does not exist"):
        load_model(ref)
    r = subprocess.run([sys.executable, "-m", "tracekit.cli.main", "model", str(DECODE)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("tracekit: error: model config ") and r.stderr.count("\n") == 1


def test_cli_model_json() -> None:
    r = subprocess.run([sys.executable, "-m", "tracekit.cli.main", "model", str(TINY), "--trace", str(DECODE), "-f", "json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    payload = json.loads(r.stdout)
    assert payload["summary"]["gpu"] == "H200 SXM" and len(payload["compare"]) > 0


def test_peaks_from_an_ncu_report() -> None:
    """An Nsight Compute report gives its own peaks (roofline_ceilings: the report's counters,
    the spec table where it has none): DRAM from dram__bytes.sum.peak_sustained × clock."""
    from tracekit.analysis.ncu_views import roofline_ceilings
    from tracekit.model import peaks

    rep = tracekit.open(SAMPLES / "ncu" / "ncu_planted_clean" / "ncu_planted_clean.ncu-rep")
    flops, bw, name = peaks(rep, "bf16")
    c = roofline_ceilings(rep)
    assert bw == pytest.approx(c.filter((pl.col("ceiling") == "dram") & (pl.col("source") == "report"))["value"].median())
    assert bw != 3350e9 and flops == pytest.approx(989.4e12) and "H100" in name  # type: ignore[operator]
    cfg = load_model(TINY)
    assert model_summary(cfg, gpu=rep)["min_step_ns"] > model_summary(cfg, gpu="NVIDIA H100 80GB HBM3")["min_step_ns"]
