"""A small decoder-only transformer used to make tracekit's sample traces.

Llama-shaped (RMSNorm, rotary-free attention through ``scaled_dot_product_attention``,
SiLU-gated MLP), bf16, with optional Megatron-style tensor parallelism: QKV and the MLP
up-projection are column-parallel, the attention output and MLP down-projection are
row-parallel and followed by an all-reduce, and the vocabulary projection is split across
ranks and all-gathered.

NVTX ranges: ``layer.N`` > ``attn`` / ``mlp``; the caller wraps each step in ``step.N``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class Config:
    vocab: int = 8192
    hidden: int = 1024
    heads: int = 8
    ffn: int = 2816
    layers: int = 4
    max_seq: int = 256


def nvtx_push(name: str) -> None:
    torch.cuda.nvtx.range_push(name)


def nvtx_pop() -> None:
    torch.cuda.nvtx.range_pop()


class Attention(nn.Module):
    def __init__(self, cfg: Config, tp: int, group) -> None:
        super().__init__()
        self.local_heads = cfg.heads // tp
        self.head_dim = cfg.hidden // cfg.heads
        local = self.local_heads * self.head_dim
        self.qkv = nn.Linear(cfg.hidden, 3 * local, bias=False)
        self.out = nn.Linear(local, cfg.hidden, bias=False)
        self.group = group
        self.tp = tp

    def forward(self, x: torch.Tensor, cache: dict, pos: int) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).split(self.local_heads * self.head_dim, dim=-1)
        q = q.view(b, t, self.local_heads, self.head_dim).transpose(1, 2)
        k = k.view(b, t, self.local_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.local_heads, self.head_dim).transpose(1, 2)
        if cache is not None:
            cache["k"][:, :, pos : pos + t] = k
            cache["v"][:, :, pos : pos + t] = v
            k = cache["k"][:, :, : pos + t]
            v = cache["v"][:, :, : pos + t]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=(t > 1))
        y = self.out(y.transpose(1, 2).reshape(b, t, -1))
        if self.tp > 1:
            torch.distributed.all_reduce(y, group=self.group)
        return y


class MLP(nn.Module):
    def __init__(self, cfg: Config, tp: int, group) -> None:
        super().__init__()
        local = cfg.ffn // tp
        self.gate_up = nn.Linear(cfg.hidden, 2 * local, bias=False)
        self.down = nn.Linear(local, cfg.hidden, bias=False)
        self.group = group
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        y = self.down(F.silu(gate) * up)
        if self.tp > 1:
            torch.distributed.all_reduce(y, group=self.group)
        return y


class Block(nn.Module):
    def __init__(self, cfg: Config, index: int, tp: int, group) -> None:
        super().__init__()
        self.index = index
        self.norm1 = nn.RMSNorm(cfg.hidden)
        self.attn = Attention(cfg, tp, group)
        self.norm2 = nn.RMSNorm(cfg.hidden)
        self.mlp = MLP(cfg, tp, group)

    def forward(self, x: torch.Tensor, cache: dict, pos: int) -> torch.Tensor:
        nvtx_push(f"layer.{self.index}")
        nvtx_push("attn")
        x = x + self.attn(self.norm1(x), cache, pos)
        nvtx_pop()
        nvtx_push("mlp")
        x = x + self.mlp(self.norm2(x))
        nvtx_pop()
        nvtx_pop()
        return x


class TinyLLM(nn.Module):
    """Layers ``first_layer .. first_layer + n_layers - 1`` of the model (a pipeline stage)."""

    def __init__(
        self,
        cfg: Config,
        *,
        tp: int = 1,
        group=None,
        first_layer: int = 0,
        n_layers: int | None = None,
        embed: bool = True,
        head: bool = True,
    ) -> None:
        super().__init__()
        n_layers = cfg.layers if n_layers is None else n_layers
        self.cfg = cfg
        self.tp = tp
        self.group = group
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden) if embed else None
        self.blocks = nn.ModuleList(
            Block(cfg, first_layer + i, tp, group) for i in range(n_layers)
        )
        self.norm = nn.RMSNorm(cfg.hidden) if head else None
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab // tp, bias=False) if head else None

    def new_cache(self, batch: int, device, dtype) -> list[dict]:
        shape = (batch, self.cfg.heads // self.tp, self.cfg.max_seq, self.cfg.hidden // self.cfg.heads)
        return [
            {"k": torch.zeros(shape, device=device, dtype=dtype), "v": torch.zeros(shape, device=device, dtype=dtype)}
            for _ in self.blocks
        ]

    def forward(self, x: torch.Tensor, caches: list[dict] | None, pos: int) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for i, block in enumerate(self.blocks):
            x = block(x, None if caches is None else caches[i], pos)
        if self.lm_head is None:
            return x
        logits = self.lm_head(self.norm(x[:, -1]))
        if self.tp > 1:
            parts = [torch.empty_like(logits) for _ in range(self.tp)]
            torch.distributed.all_gather(parts, logits, group=self.group)
            logits = torch.cat(parts, dim=-1)
        return logits
