"""tracekit.model on real Hugging Face config.json files (tests/data/hf_configs, sources in its
README): parameter counts against published totals and checkpoint sizes, decode FLOPs by hand,
head_dim, tied heads, MoE layouts, sliding windows, and the warning for unmodelled fields."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from tracekit.errors import ModelConfigWarning
from tracekit.model import TransformerConfig, load_model, model_costs, model_summary

from .conftest import ROOT

HF = ROOT / "tests" / "data" / "hf_configs"


def _load(name: str, **overrides: object) -> TransformerConfig:
    if name == "gemma2_2b":  # soft-capping is not modelled: the one expected warning
        with pytest.warns(ModelConfigWarning, match="attn_logit_softcapping, final_logit_softcapping"):
            return load_model(HF / f"{name}.json", **overrides)
    return load_model(HF / f"{name}.json", **overrides)


# (file, published total, exact reference count, its source); the README says where each comes from
PUBLISHED = [
    ("gpt2", 124e6, 124_439_808, "card 124M; transformers count"),
    ("llama3_8b", 8.03e9, 16_060_522_496 // 2, "safetensors index total_size / 2"),
    ("mistral_7b_v0.1", 7.24e9, 14_483_464_192 // 2, "safetensors index total_size / 2"),
    ("mixtral_8x7b_v0.1", 46.7e9, 93_405_585_408 // 2, "safetensors index total_size / 2"),
    ("qwen3_0.6b", 0.6e9, 596_049_920, "card 0.6B (rounded); transformers count"),
    ("qwen3_8b", 8.2e9, 16_381_470_720 // 2, "safetensors index total_size / 2"),
    ("qwen3_30b_a3b", 30.5e9, 61_064_245_248 // 2, "safetensors index total_size / 2"),
    ("gemma2_2b", 2.61e9, 2_614_341_888, "hub 2.61B; transformers count (fp32 checkpoint / 4)"),
    ("qwen2.5_7b", 7.61e9, 7_615_616_512, "card 7.61B; transformers count"),
]


@pytest.mark.parametrize(("name", "published", "exact", "source"), PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_params_match_published_totals(name: str, published: float, exact: int, source: str) -> None:
    """Every parameter counted (embedding once when tied, norms, biases, q/k norms, router,
    GPT-2's position table): exactly the checkpoint's or transformers' count, so within 0.5 % of
    the published total (Qwen3-0.6B's card rounds 0.596 B to 0.6 B: within the rounding)."""
    params = model_summary(_load(name))["params"]
    assert params == exact, source
    tolerance = 0.05 if published == 0.6e9 else 0.005
    assert params == pytest.approx(published, rel=tolerance)


def test_non_embedding_and_active_params_as_cards_report_them() -> None:
    """Non-embedding = params less the embedding matrix and an untied head (and GPT-2's position
    table); active = params less the routed experts a token does not use."""
    q06 = model_summary(_load("qwen3_0.6b"))
    assert q06["params_non_embedding"] == 596_049_920 - 151_936 * 1024 == 440_467_456  # card: 0.44 B
    assert q06["params_non_embedding"] == pytest.approx(0.44e9, rel=0.005)
    q8 = model_summary(_load("qwen3_8b"))
    assert q8["params_non_embedding"] == 8_190_735_360 - 2 * 151_936 * 4096 == 6_946_075_648  # card: 6.95 B
    moe = model_summary(_load("qwen3_30b_a3b"))
    assert moe["params_non_embedding"] == pytest.approx(29.9e9, rel=0.005)  # card: 29.9 B
    # card "3.3B activated" truncates: 48 layers x (128 - 8) idle experts x 3·2048·768
    assert moe["params_active"] == 30_532_122_624 - 48 * 120 * 3 * 2048 * 768 == 3_353_032_704
    mixtral = model_summary(_load("mixtral_8x7b_v0.1"))
    assert mixtral["params_active"] == pytest.approx(12.9e9, rel=0.005)  # 12.9 B per token
    gpt2 = model_summary(_load("gpt2"))
    assert gpt2["params_non_embedding"] == 124_439_808 - 50_257 * 768 - 1024 * 768 == 85_056_000
    assert model_summary(_load("llama3_8b"))["params_active"] == 8_030_261_248  # dense: all active
    qwen_moe = model_summary(load_model(HF / "qwen1.5_moe_a2.7b.json"))
    assert qwen_moe["params"] == pytest.approx(14.3e9, rel=0.005)  # card: 14.3 B total, 2.7 B activated
    assert qwen_moe["params_active"] == pytest.approx(2.7e9, rel=0.005)


def test_qwen3_reads_head_dim_and_counts_the_tied_head_once() -> None:
    """Qwen3-0.6B: hidden 1024 with 16 heads of 128 (not 1024 / 16 = 64): Q is 1024 x 2048; the
    LM head is the embedding, in no block."""
    cfg = _load("qwen3_0.6b")
    assert (cfg.head_dim, cfg.head_size, cfg.n_kv_heads, cfg.tie_embeddings, cfg.qk_norm) == (128, 128, 8, True, True)
    layer = model_costs(cfg).filter(pl.col("layer") == 0)
    params = dict(zip(layer["block"], layer["params"], strict=True))
    assert params["attn_qkv"] == 1024 * (16 + 2 * 8) * 128
    assert params["attn_out"] == 16 * 128 * 1024
    assert params["norm"] == 2 * 1024 + 2 * 128
    rows = model_costs(cfg).filter(pl.col("layer").is_null())
    assert dict(zip(rows["block"], rows["params"], strict=True)) == {"embedding": 151_936 * 1024, "logits": 1024}
    assert model_summary(cfg)["kv_bytes_per_token"] == 2 * 28 * 8 * 128 * 2  # 114,688 (64-wide heads gave half)


def test_decode_flops_by_hand_qwen3_0_6b() -> None:
    """Decode, batch 1: 2 x matmul parameters + 2 x LM head + 4·S·h·e per layer + norms.

    Per layer: qkv 1024·(16 + 16)·128 = 4,194,304; out 2048·1024 = 2,097,152; MLP 3·1024·3072 =
    9,437,184: 15,728,640 x 28 = 440,401,920 → 880,803,840 FLOPs. LM head 2·151,936·1,024 =
    311,164,928. Norms 4·(2·1024 + (16 + 8)·128) = 20,480 x 28 = 573,440. Attention
    4·S·16·128 = 8,192·S per layer, 229,376·S in all.
    """
    at_zero = model_summary(_load("qwen3_0.6b", context_len=0))["flops_per_token"]
    assert at_zero == 880_803_840 + 311_164_928 + 573_440 == 1_192_542_208
    at_1k = model_summary(_load("qwen3_0.6b", context_len=1024))["flops_per_token"]
    assert at_1k == 1_192_542_208 + 229_376 * 1024 == 1_427_423_232
    core = model_costs(_load("qwen3_0.6b", context_len=1024)).filter((pl.col("layer") == 0) & (pl.col("block") == "attn_core"))
    # KV read 2·batch·S·g·e·bk + write 2·T·g·e·bk + Q in / out 2·T·h·e·b, all with e = 128
    assert core["bytes"][0] == 2 * 1024 * 8 * 128 * 2 + 2 * 8 * 128 * 2 + 2 * 16 * 128 * 2


def test_decode_flops_by_hand_qwen3_30b_a3b() -> None:
    """MoE decode, batch 1, S = 512: only the top-8 experts of 768 and the router work.

    Per layer: qkv 2048·(32 + 8)·128 = 10,485,760; out 32·128·2048 = 8,388,608; experts
    8·3·2048·768 = 37,748,736; router 128·2048 = 262,144: 56,885,248 x 48 x 2 = 5,460,983,808.
    Norms 4·(2·2048 + (32 + 4)·128) = 34,816 x 48 = 1,671,168. Attention 4·512·32·128 x 48 =
    402,653,184. LM head 2·151,936·2,048 = 622,329,856.
    """
    cfg = _load("qwen3_30b_a3b", context_len=512)
    assert (cfg.experts, cfg.top_k, cfg.expert_ffn_hidden, cfg.dense_layers) == (128, 8, 768, ())
    flops = model_summary(cfg)["flops_per_token"]
    assert flops == 5_460_983_808 + 1_671_168 + 402_653_184 + 622_329_856 == 6_487_638_016
    mlp = model_costs(cfg).filter((pl.col("layer") == 0) & (pl.col("block") == "mlp")).row(0, named=True)
    # decode of one token touches 8 experts' weights (and the router's), not 128
    assert mlp["weight_bytes"] == (8 * 3 * 2048 * 768 + 128 * 2048) * 2


def test_moe_layouts_shared_experts_and_dense_layers() -> None:
    """DeepSeekMoE-16B (deepseek-ai/deepseek-moe-16b-base config.json fields; card: 16.4 B):
    layer 0 dense (first_k_dense_replace), 64 routed experts of 1408 and 2 shared ones, 6 per
    token. Qwen-MoE: mlp_only_layers and decoder_sparse_step make layers dense."""
    deepseek = {
        "model_type": "deepseek", "hidden_size": 2048, "num_hidden_layers": 28, "num_attention_heads": 16,
        "num_key_value_heads": 16, "intermediate_size": 10944, "moe_intermediate_size": 1408, "n_routed_experts": 64,
        "n_shared_experts": 2, "num_experts_per_tok": 6, "first_k_dense_replace": 1, "moe_layer_freq": 1,
        "vocab_size": 102400, "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }
    cfg = load_model(deepseek)
    assert (cfg.dense_layers, cfg.shared_ffn_hidden, cfg.expert_ffn_hidden) == ((0,), 2 * 1408, 1408)
    attention, norms = 4 * 2048 * 2048, 2 * 2048
    dense_mlp = 3 * 2048 * 10944
    moe_mlp = 64 * 3 * 2048 * 1408 + 3 * 2048 * 2816 + 64 * 2048
    expected = 28 * (attention + norms) + dense_mlp + 27 * moe_mlp + 2 * 102_400 * 2048 + 2048
    assert model_summary(cfg)["params"] == expected == 16_375_728_128
    assert expected == pytest.approx(16.4e9, rel=0.005)
    assert model_summary(cfg)["params_active"] == expected - 27 * (64 - 6) * 3 * 2048 * 1408

    qwen = json.loads((HF / "qwen3_30b_a3b.json").read_text())
    layout = load_model({**qwen, "decoder_sparse_step": 2, "mlp_only_layers": [1]})
    assert layout.dense_layers == (0, 1, *range(2, 48, 2))  # MoE where (i + 1) % 2 == 0, but not 1
    blocks = model_costs(layout).filter(pl.col("block") == "mlp")
    assert blocks.filter(pl.col("layer") == 1)["params"][0] == 3 * 2048 * 6144  # intermediate_size
    assert blocks.filter(pl.col("layer") == 3)["params"][0] == 128 * 3 * 2048 * 768 + 128 * 2048


def test_biases_and_position_table() -> None:
    """GPT-2: biases on every projection, LayerNorms with bias, a 1024-row position table, plain
    GELU MLP. Qwen2.5: q/k/v biases only."""
    gpt2 = _load("gpt2")
    assert (gpt2.qkv_bias, gpt2.out_bias, gpt2.mlp_bias, gpt2.norm_bias, gpt2.gated_mlp) == (True, True, True, True, False)
    layer = model_costs(gpt2).filter(pl.col("layer") == 0)
    assert dict(zip(layer["block"], layer["params"], strict=True)) == {
        "attn_qkv": 768 * 2304 + 2304, "attn_core": 0, "attn_out": 768 * 768 + 768,
        "mlp": 2 * 768 * 3072 + 3072 + 768, "norm": 2 * 2 * 768,
    }
    qwen = _load("qwen2.5_7b")
    assert (qwen.qkv_bias, qwen.out_bias, qwen.mlp_bias) == (True, False, False)
    assert qwen.sliding_window is None  # use_sliding_window is false


def test_sliding_window_layers() -> None:
    """Mistral slides in every layer (4096 keys at most); Gemma-2 in even layers only."""
    mistral = _load("mistral_7b_v0.1", context_len=8192)
    core = model_costs(mistral).filter(pl.col("block") == "attn_core")
    assert core["flops"].unique().to_list() == [4 * 4096 * 32 * 128]
    gemma = _load("gemma2_2b", context_len=8192)
    assert (gemma.head_size, gemma.norms_per_layer, gemma.full_attention_layers) == (256, 4, tuple(range(1, 26, 2)))
    core = model_costs(gemma).filter(pl.col("block") == "attn_core").sort("layer")
    assert core["flops"][:2].to_list() == [4 * 4096 * 8 * 256, 4 * 8192 * 8 * 256]
    # prefill of 8192 tokens with a 4096 window: (4096·4097/2 + 4096·4096) / 8192 keys per query
    prefill = model_costs(mistral.with_(phase="prefill", prompt_len=8192)).filter(pl.col("block") == "attn_core")
    assert prefill["flops"][0] == 4 * 8192 * ((4096 * 4097 / 2 + 4096 * 4096) / 8192) * 32 * 128


def test_yaml_takes_the_new_fields_and_hf_shapes(tmp_path: Path) -> None:
    """A YAML description with ``hf_config:`` gets the shapes of the config.json (its step fields
    win); lists in YAML become the config's tuples."""
    yaml_file = tmp_path / "moe.yaml"
    yaml_file.write_text(f"hf_config: {HF / 'qwen3_30b_a3b.json'}\ncontext_len: 512\nbatch: 4\n")
    assert load_model(yaml_file) == _load("qwen3_30b_a3b", context_len=512, batch=4).with_(name="moe")
    own = tmp_path / "own.yaml"
    own.write_text("layers: 4\nhidden: 100\nheads: 4\nhead_dim: 32\nffn_hidden: 256\nvocab: 1000\nexperts: 8\n"
                   "top_k: 2\nmoe_ffn_hidden: 64\ndense_layers: [0]\nsliding_window: 16\nfull_attention_layers: [3, 1]\n")
    cfg = load_model(own)
    assert (cfg.head_size, cfg.dense_layers, cfg.full_attention_layers) == (32, (0,), (1, 3))
    mlp = model_costs(cfg).filter(pl.col("block") == "mlp")["params"].to_list()
    assert mlp == [3 * 100 * 256] + [8 * 3 * 100 * 64 + 8 * 100] * 3


def test_unmodelled_fields_are_named_in_one_warning() -> None:
    """Fields that change the cost and are not modelled are named, never dropped silently."""
    base = json.loads((HF / "qwen3_8b.json").read_text())
    mla = {**base, "model_type": "deepseek_v2", "kv_lora_rank": 512, "q_lora_rank": None, "qk_rope_head_dim": 64,
           "qk_nope_head_dim": 128, "v_head_dim": 128}
    with pytest.warns(ModelConfigWarning, match=r"kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim \(") as seen:
        load_model(mla)
    assert len(seen) == 1 and "q_lora_rank" not in str(seen[0].message)  # null: not in use
    with pytest.warns(ModelConfigWarning, match="quantization_config"):
        load_model({**base, "quantization_config": {"quant_method": "gptq", "bits": 4}})
    with pytest.warns(ModelConfigWarning, match="sliding_window"):  # a family whose window layout is unknown
        load_model({**base, "model_type": "somenewlm", "sliding_window": 1024})
    with pytest.warns(ModelConfigWarning, match=r"layer_types \(linear_attention\)"):
        load_model({**base, "sliding_window": None, "layer_types": ["linear_attention", "full_attention"] * 18})
    assert load_model({**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}).head_dim == 128  # no cost: no warning


def test_bad_shapes_are_one_line_errors() -> None:
    from tracekit.errors import TracekitError

    with pytest.raises(TracekitError, match="not a multiple of heads .* give head_dim"):
        TransformerConfig(layers=2, hidden=100, heads=8, ffn_hidden=128, vocab=10)
    assert TransformerConfig(layers=2, hidden=100, heads=8, head_dim=16, ffn_hidden=128, vocab=10).head_size == 16
    with pytest.raises(TracekitError, match="top_k"):
        TransformerConfig(layers=2, hidden=64, heads=8, ffn_hidden=128, vocab=10, experts=4)
    with pytest.raises(TracekitError, match="outside 0..1"):
        TransformerConfig(layers=2, hidden=64, heads=8, ffn_hidden=128, vocab=10, experts=4, top_k=1, dense_layers=[2])


def test_cli_model_on_a_hf_config() -> None:
    """`tracekit model qwen3_0.6b.json`: the summary of the hand counts above, in JSON and in the table."""
    cmd = [sys.executable, "-m", "tracekit.cli.main", "model", str(HF / "qwen3_0.6b.json")]
    r = subprocess.run([*cmd, "-f", "json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    payload = json.loads(r.stdout)
    s = payload["summary"]
    assert (s["params"], s["params_non_embedding"], s["kv_bytes_per_token"]) == (596_049_920, 440_467_456, 114_688)
    assert s["flops_per_token"] == 1_192_542_208 + 229_376  # context_len 1
    assert payload["config"]["head_dim"] == 128 and payload["config"]["tie_embeddings"] is True
    table = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert table.returncode == 0, table.stderr
    assert "5.96e+08" in table.stdout and "4.405e+08" in table.stdout and r.stderr == ""
    warned = subprocess.run([*cmd[:-1], str(HF / "gemma2_2b.json"), "-f", "json"], capture_output=True, text=True, timeout=300)
    assert warned.returncode == 0 and json.loads(warned.stdout)["summary"]["params"] == 2_614_341_888
    assert warned.stderr.startswith("tracekit: warning: model config 'gemma2_2b': fields not modelled")
    assert "attn_logit_softcapping" in warned.stderr

