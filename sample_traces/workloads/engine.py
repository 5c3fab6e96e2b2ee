"""A small continuous-batching LLM engine, written the way serving engines schedule work.

The model has Qwen3-0.6B's layer shapes (``qwen3_0.6b_config.json``: hidden 1024, 16 query
and 8 KV heads of head_dim 128, q/k RMSNorm, RoPE, SwiGLU 3072, tied 151936-token
embedding) with ``layers`` layers, random bf16 weights, and a KV cache of ``slots`` request
slots by ``max_seq`` positions.

Each engine step (:meth:`Engine.step`), as vLLM's scheduler does with chunked prefill off:
requests that have arrived are admitted while slots are free; each admitted request's prompt
runs as a prefill forward (its first token); then every running request that already had its
prefill gets one decode token in one batched forward (each row at its own position, attention
masked per row, the attended length rounded up to 128 positions). Prefills and decodes therefore share a step whenever a request arrives
while others decode. Sampled ids go to the host once per step (one synchronisation).
Nothing emits NVTX.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

HERE = Path(__file__).resolve().parent
#: Attention as engines run it, with kernels that take any length: not cuDNN's, which builds
#: (compiles) a new plan for every new sequence length (~50 ms each, every decode step).
_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class Shape:
    def __init__(self, layers: int) -> None:
        cfg = json.loads((HERE / "qwen3_0.6b_config.json").read_text())
        self.hidden = cfg["hidden_size"]
        self.heads = cfg["num_attention_heads"]
        self.kv_heads = cfg["num_key_value_heads"]
        self.head_dim = cfg.get("head_dim") or self.hidden // self.heads
        self.ffn = cfg["intermediate_size"]
        self.vocab = cfg["vocab_size"]
        self.layers = layers
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.theta = cfg.get("rope_theta", 10000.0)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class Layer(nn.Module):
    def __init__(self, s: Shape, slots: int, max_seq: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.h, self.g, self.e = s.heads, s.kv_heads, s.head_dim
        self.input_layernorm = nn.RMSNorm(s.hidden, eps=s.eps)
        self.qkv_proj = nn.Linear(s.hidden, (self.h + 2 * self.g) * self.e, bias=False)
        self.o_proj = nn.Linear(self.h * self.e, s.hidden, bias=False)
        self.q_norm = nn.RMSNorm(self.e, eps=s.eps)
        self.k_norm = nn.RMSNorm(self.e, eps=s.eps)
        self.post_attention_layernorm = nn.RMSNorm(s.hidden, eps=s.eps)
        self.gate_up_proj = nn.Linear(s.hidden, 2 * s.ffn, bias=False)
        self.down_proj = nn.Linear(s.ffn, s.hidden, bias=False)
        self.register_buffer("k_cache", torch.zeros(slots, self.g, max_seq, self.e, dtype=dtype), persistent=False)
        self.register_buffer("v_cache", torch.zeros(slots, self.g, max_seq, self.e, dtype=dtype), persistent=False)

    def attention(self, x, cos, sin, slots, pos, prefill):  # type: ignore[no-untyped-def]
        b, t, _ = x.shape
        q, k, v = self.qkv_proj(x).split([self.h * self.e, self.g * self.e, self.g * self.e], dim=-1)
        q = rotate(self.q_norm(q.view(b, t, self.h, self.e)).transpose(1, 2), cos, sin)
        k = rotate(self.k_norm(k.view(b, t, self.g, self.e)).transpose(1, 2), cos, sin)
        v = v.view(b, t, self.g, self.e).transpose(1, 2)
        if prefill:  # one request: its prompt at positions 0..t-1 of its slot
            self.k_cache[slots, :, :t] = k[0]
            self.v_cache[slots, :, :t] = v[0]
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:  # one token per running request, each at its own position
            self.k_cache[slots, :, pos] = k[:, :, 0]
            self.v_cache[slots, :, pos] = v[:, :, 0]
            span = self.span  # set by the engine from the host-side positions (no sync)
            keys = self.k_cache[slots, :, :span]
            values = self.v_cache[slots, :, :span]
            mask = (torch.arange(span, device=x.device).view(1, -1) <= pos.view(-1, 1)).view(b, 1, 1, span)
            y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.h * self.e))

    def forward(self, x, cos, sin, slots, pos, prefill):  # type: ignore[no-untyped-def]
        x = x + self.attention(self.input_layernorm(x), cos, sin, slots, pos, prefill)
        gate, up = self.gate_up_proj(self.post_attention_layernorm(x)).chunk(2, dim=-1)
        return x + self.down_proj(F.silu(gate) * up)


class Model(nn.Module):
    def __init__(self, s: Shape, slots: int, max_seq: int, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(s.vocab, s.hidden)
        self.layers = nn.ModuleList(Layer(s, slots, max_seq, dtype) for _ in range(s.layers))
        self.norm = nn.RMSNorm(s.hidden, eps=s.eps)
        inv = 1.0 / (s.theta ** (torch.arange(0, s.head_dim, 2, dtype=torch.float32) / s.head_dim))
        freqs = torch.outer(torch.arange(max_seq, dtype=torch.float32), inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos().to(dtype), persistent=False)
        self.register_buffer("sin", emb.sin().to(dtype), persistent=False)

    def forward(self, ids, slots, pos, prefill):  # type: ignore[no-untyped-def]
        """Prefill: ``ids`` [1, t] of slot ``slots`` (an int); decode: ``ids`` [b, 1] of
        ``slots`` [b] at positions ``pos`` [b] (device tensors). The next ids [b]."""
        x = self.embed_tokens(ids)
        if prefill:
            t = ids.shape[1]
            cos, sin = self.cos[:t].view(1, 1, t, -1), self.sin[:t].view(1, 1, t, -1)
        else:
            cos, sin = self.cos[pos].view(-1, 1, 1, self.cos.shape[-1]), self.sin[pos].view(-1, 1, 1, self.sin.shape[-1])
        for layer in self.layers:
            x = layer(x, cos, sin, slots, pos, prefill)
        return F.linear(self.norm(x[:, -1]), self.embed_tokens.weight).argmax(dim=-1)


@dataclass
class Request:
    rid: int
    prompt: list[int]
    max_tokens: int
    arrival: float
    slot: int = -1
    out: list[int] = field(default_factory=list)
    first_token_at: float | None = None
    done_at: float | None = None


class Engine:
    def __init__(self, layers: int = 4, slots: int = 16, max_seq: int = 1024, device: str = "cuda") -> None:
        self.device = torch.device(device)
        self.s = Shape(layers)
        self.max_seq = max_seq
        torch.manual_seed(0)
        with torch.device(self.device):
            self.model = Model(self.s, slots, max_seq, torch.bfloat16, self.device).to(torch.bfloat16).eval()
        self.free = list(range(slots))
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.steps = 0
        self.step_log: list[dict] = []

    def _pinned(self, values: list) -> torch.Tensor:  # type: ignore[type-arg]
        t = torch.tensor(values, dtype=torch.long)
        return t.pin_memory() if self.device.type == "cuda" else t

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    @torch.inference_mode()
    def step(self) -> list[Request]:
        """One engine step; the requests that finished in it."""
        now = time.perf_counter()
        admitted = []
        while self.waiting and self.free:
            req = self.waiting.pop(0)
            req.slot = self.free.pop(0)
            admitted.append(req)
        decoding = list(self.running)
        outs = []
        for req in admitted:  # prefill, one forward per new request
            ids = self._pinned([req.prompt]).to(self.device, non_blocking=True)
            with sdpa_kernel(_BACKENDS):
                outs.append(self.model(ids, req.slot, None, True))
        dec_out = None
        if decoding:
            ids = self._pinned([[r.out[-1]] for r in decoding]).to(self.device, non_blocking=True)
            slots = self._pinned([r.slot for r in decoding]).to(self.device, non_blocking=True)
            positions = [len(r.prompt) + len(r.out) - 1 for r in decoding]
            pos = self._pinned(positions).to(self.device, non_blocking=True)
            span = min(128 * math.ceil((max(positions) + 1) / 128), self.max_seq)  # the host knows the longest sequence
            for layer in self.model.layers:
                layer.span = span
            with sdpa_kernel(_BACKENDS):
                dec_out = self.model(ids, slots, pos, False)
        # one device -> host copy of every sampled id: the step's synchronisation
        sampled = torch.cat([*outs, *([dec_out] if dec_out is not None else [])]).tolist() if (outs or decoding) else []
        t = time.perf_counter()
        for req, tok in zip([*admitted, *decoding], sampled, strict=True):
            req.out.append(int(tok))
            if req.first_token_at is None:
                req.first_token_at = t
        finished = [r for r in decoding if len(r.out) >= r.max_tokens] + [r for r in admitted if len(r.out) >= r.max_tokens]
        self.running = [r for r in [*decoding, *admitted] if r not in finished]
        for r in finished:
            r.done_at = t
            self.free.append(r.slot)
        if admitted or decoding:
            self.steps += 1
            self.step_log.append({"step": self.steps, "start": now, "end": t, "prefills": len(admitted), "decodes": len(decoding)})
        return finished

    def warm_up(self) -> None:
        """What engines do at start-up: one dummy prefill and a few decode steps (memory
        profiling, kernel selection)."""
        req = Request(-1, [1] * 64, 4, time.perf_counter())
        self.add(req)
        while req.done_at is None:
            self.step()
        self.steps = 0
        self.step_log.clear()


def make_requests(n: int, rate: float, seed: int, vocab: int, start: float) -> list[Request]:
    """``n`` requests with Poisson arrivals at ``rate`` per second from ``start``, prompts of
    64-512 tokens and 16-48 output tokens."""
    g = torch.Generator().manual_seed(seed)
    t = start
    out = []
    for i in range(n):
        t += float(-math.log(1.0 - torch.rand(1, generator=g).item()) / rate)
        plen = int(torch.randint(64, 513, (1,), generator=g).item())
        out.append(Request(i, torch.randint(0, vocab, (plen,), generator=g).tolist(), int(torch.randint(16, 49, (1,), generator=g).item()), t))
    return out


def latency_summary(done: list[Request]) -> dict:
    """Per request: time to first token (from arrival) and time per output token after it (ms)."""
    rows = []
    for r in sorted(done, key=lambda r: r.rid):
        ttft = 1e3 * (r.first_token_at - r.arrival) if r.first_token_at else None
        tpot = (1e3 * (r.done_at - r.first_token_at) / (len(r.out) - 1)) if r.done_at and len(r.out) > 1 else None
        rows.append({"rid": r.rid, "prompt": len(r.prompt), "tokens": len(r.out), "ttft_ms": round(ttft, 3) if ttft else None,
                     "tpot_ms": round(tpot, 3) if tpot else None})
    return {"requests": rows}
