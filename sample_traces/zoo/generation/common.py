"""Model builders for the generation zoo: Hugging Face models from a config (random weights,
nothing downloaded), as a user builds them for a quick benchmark. ``ZOO_DRY=1`` shrinks every
size for a dry run on a CPU."""

from __future__ import annotations

import os

import torch

DRY = bool(os.environ.get("ZOO_DRY"))


def dry(full, small):  # noqa: ANN001, ANN201
    return small if DRY else full


def llama(layers: int, hidden: int = 1024, ffn: int = 2816, heads: int = 16, kv: int = 8, vocab: int = 32000):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=dry(vocab, 512), hidden_size=dry(hidden, 64), intermediate_size=dry(ffn, 128),
                      num_hidden_layers=dry(layers, min(layers, 3)), num_attention_heads=dry(heads, 4),
                      num_key_value_heads=dry(kv, 2), max_position_embeddings=8192)
    return build(LlamaForCausalLM, cfg)


def qwen3(layers: int, vocab: int = 151936):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=dry(vocab, 512), hidden_size=dry(1024, 64), intermediate_size=dry(3072, 128),
                      num_hidden_layers=dry(layers, min(layers, 3)), num_attention_heads=dry(16, 4),
                      num_key_value_heads=dry(8, 2), head_dim=dry(128, 16), max_position_embeddings=8192,
                      tie_word_embeddings=True)
    return build(Qwen3ForCausalLM, cfg)


def build(cls, cfg):  # noqa: ANN001, ANN201
    from clock import device_and_dtype

    dev, dtype = device_and_dtype()
    torch.manual_seed(0)
    model = cls(cfg).to(dev, dtype).eval()
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None  # random weights: never stop early
    return model


def prompt(model, length: int, batch: int = 1, seed: int = 0) -> torch.Tensor:  # noqa: ANN001
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, model.config.vocab_size, (batch, length), generator=g).to(model.device)
