"""Small models for the training zoo, built from configs (random weights, nothing downloaded)."""

from __future__ import annotations

import torch

from tclock import dry


def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def llama(layers: int = 4, hidden: int = 512, vocab: int = 8192):  # noqa: ANN201
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=dry(vocab, 256), hidden_size=dry(hidden, 64), intermediate_size=dry(4 * hidden, 128),
                      num_hidden_layers=dry(layers, 2), num_attention_heads=dry(8, 4), num_key_value_heads=dry(8, 4),
                      max_position_embeddings=2048)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


def batches(n: int, batch: int, seq: int, vocab: int, seed: int = 0):  # noqa: ANN201
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (batch, seq), generator=g) for _ in range(n)]
