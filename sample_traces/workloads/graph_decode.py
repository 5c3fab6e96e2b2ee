"""A serving-engine-style decode loop: prefill eager, every decode step replayed from a CUDA graph.

The model is written here, the way serving engines (vLLM, SGLang) write theirs, with the
shapes of Qwen3-0.6B (``qwen3_0.6b_config.json``: hidden 1024, 16 query / 8 KV heads of
head_dim 128, q/k RMSNorm, RoPE, SwiGLU 3072, tied 151936-token embedding), random bf16
weights, and a static KV cache held as module buffers. Tensor parallelism over
``torchrun --nproc-per-node N`` (Megatron style: column-parallel QKV and gate/up, row-parallel
output and down projections followed by an NCCL all-reduce, a vocabulary-parallel LM head
followed by an all-gather), so with ``--tp 2`` the NCCL kernels are inside the graph.

Each step, as an engine does: the next positions are copied host → device, the graph is
replayed (embedding, all layers, logits, argmax into a static buffer), and the sampled ids
are copied device → host (one synchronisation per token).

Modes:

* ``graph`` (default): decode steps replayed from one ``torch.cuda.CUDAGraph``.
* ``eager``: the same decode step launched kernel by kernel (the baseline the graph replaces).
* ``compile-kvcopy``: the decode step compiled with ``torch.compile(mode="reduce-overhead")``
  with the KV cache passed as plain tensors that the step writes into: PyTorch skips CUDA
  graphs for it ("mutated inputs").
* ``compile-functional``: the same, but each step returns new caches
  (``cache.index_copy(2, pos, k)``, the functional style of code ported from JAX), and, as
  PyTorch's CUDA-graph error for outputs fed back as inputs asks, the step is marked
  (``torch.compiler.cudagraph_mark_step_begin``) and the new caches are cloned outside the
  compiled code: every step copies every layer's whole KV cache, more than once.

* ``compile-where``: the step compiled with ``torch.compile`` (default mode) writing the new
  token into its KV cache the way code ported from JAX does, ``cache.copy_(torch.where(pos ==
  positions, k, cache))``: Inductor turns it into pointwise Triton kernels that read and write
  every layer's whole cache each step (``--max-seq`` sizes the cache, as an engine sizes it
  for the longest context).

NVTX: ``prefill`` and ``decode.<i>`` ranges when ``--nvtx`` is given (a serving engine has
none by default; the TP capture leaves them out). The profiled part runs between
``cudaProfilerStart`` and ``cudaProfilerStop``; the script then leaves with ``os._exit(0)``
(NCCL teardown after graph-captured collectives can hang at exit).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

HERE = Path(__file__).resolve().parent
#: ``--mode compile-functional``: decode steps return new KV caches instead of writing in place.
FUNCTIONAL = False
#: ``--mode compile-where``: decode steps rewrite the whole cache through ``torch.where``.
WHERE = False


class Shape:
    def __init__(self, cfg: dict, layers: int | None) -> None:
        self.hidden = cfg["hidden_size"]
        self.heads = cfg["num_attention_heads"]
        self.kv_heads = cfg["num_key_value_heads"]
        self.head_dim = cfg.get("head_dim") or self.hidden // self.heads
        self.ffn = cfg["intermediate_size"]
        self.vocab = cfg["vocab_size"]
        self.layers = layers or cfg["num_hidden_layers"]
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.theta = cfg.get("rope_theta", 10000.0)


def rope_tables(shape: Shape, max_seq: int, device, dtype):  # type: ignore[no-untyped-def]
    inv = 1.0 / (shape.theta ** (torch.arange(0, shape.head_dim, 2, device=device, dtype=torch.float32) / shape.head_dim))
    t = torch.arange(max_seq, device=device, dtype=torch.float32)
    freqs = torch.outer(t, inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin


class Attention(nn.Module):
    def __init__(self, s: Shape, tp: int, batch: int, max_seq: int, dtype) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.h, self.g, self.e, self.tp = s.heads // tp, s.kv_heads // tp, s.head_dim, tp
        self.qkv_proj = nn.Linear(s.hidden, (self.h + 2 * self.g) * self.e, bias=False)
        self.o_proj = nn.Linear(self.h * self.e, s.hidden, bias=False)
        self.q_norm = nn.RMSNorm(self.e, eps=s.eps)
        self.k_norm = nn.RMSNorm(self.e, eps=s.eps)
        self.register_buffer("k_cache", torch.zeros(batch, self.g, max_seq, self.e, dtype=dtype), persistent=False)
        self.register_buffer("v_cache", torch.zeros(batch, self.g, max_seq, self.e, dtype=dtype), persistent=False)

    def forward(self, x, pos, cos, sin, mask, caches=None):  # type: ignore[no-untyped-def]
        b, t, _ = x.shape
        q, k, v = self.qkv_proj(x).split([self.h * self.e, self.g * self.e, self.g * self.e], dim=-1)
        q = self.q_norm(q.view(b, t, self.h, self.e)).transpose(1, 2)
        k = self.k_norm(k.view(b, t, self.g, self.e)).transpose(1, 2)
        v = v.view(b, t, self.g, self.e).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k_cache, v_cache = caches if caches is not None else (self.k_cache, self.v_cache)
        if t > 1:  # prefill: positions 0..t-1
            k_cache[:, :, :t] = k
            v_cache[:, :, :t] = v
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        elif WHERE and caches is not None:  # decode, JAX style: every position rewritten, the new one selected
            sel = torch.arange(k_cache.shape[2], device=k.device).view(1, 1, -1, 1) == pos.view(1, 1, 1, 1)
            k_cache.copy_(torch.where(sel, k, k_cache))
            v_cache.copy_(torch.where(sel, v, v_cache))
            y = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask, enable_gqa=True)
        elif FUNCTIONAL and caches is not None:  # decode, functional style: a new cache each step
            k_cache, v_cache = k_cache.index_copy(2, pos, k), v_cache.index_copy(2, pos, v)
            caches[0], caches[1] = k_cache, v_cache
            y = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask, enable_gqa=True)
        else:  # decode: write at pos (a device tensor: graph-safe), attend over the masked cache
            k_cache.index_copy_(2, pos, k)
            v_cache.index_copy_(2, pos, v)
            y = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask, enable_gqa=True)
        y = self.o_proj(y.transpose(1, 2).reshape(b, t, self.h * self.e))
        if self.tp > 1:
            torch.distributed.all_reduce(y)
        return y


class MLP(nn.Module):
    def __init__(self, s: Shape, tp: int) -> None:
        super().__init__()
        self.tp, f = tp, s.ffn // tp
        self.gate_up_proj = nn.Linear(s.hidden, 2 * f, bias=False)
        self.down_proj = nn.Linear(f, s.hidden, bias=False)

    def forward(self, x):  # type: ignore[no-untyped-def]
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        y = self.down_proj(F.silu(gate) * up)
        if self.tp > 1:
            torch.distributed.all_reduce(y)
        return y


class Layer(nn.Module):
    def __init__(self, s: Shape, tp: int, batch: int, max_seq: int, dtype) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.input_layernorm = nn.RMSNorm(s.hidden, eps=s.eps)
        self.self_attn = Attention(s, tp, batch, max_seq, dtype)
        self.post_attention_layernorm = nn.RMSNorm(s.hidden, eps=s.eps)
        self.mlp = MLP(s, tp)

    def forward(self, x, pos, cos, sin, mask, caches=None):  # type: ignore[no-untyped-def]
        x = x + self.self_attn(self.input_layernorm(x), pos, cos, sin, mask, caches)
        return x + self.mlp(self.post_attention_layernorm(x))


class Model(nn.Module):
    def __init__(self, s: Shape, tp: int, batch: int, max_seq: int, dtype, device) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.s, self.tp = s, tp
        self.vocab_shard = s.vocab // tp
        self.embed_tokens = nn.Embedding(self.vocab_shard, s.hidden)  # vocabulary-parallel, tied to the head
        self.layers = nn.ModuleList(Layer(s, tp, batch, max_seq, dtype) for _ in range(s.layers))
        self.norm = nn.RMSNorm(s.hidden, eps=s.eps)
        cos, sin = rope_tables(s, max_seq, device, dtype)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.register_buffer("positions", torch.arange(max_seq, device=device), persistent=False)
        self.rank = torch.distributed.get_rank() if tp > 1 else 0

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp == 1:
            return self.embed_tokens(ids)
        lo = self.rank * self.vocab_shard
        local = ids - lo
        inside = (local >= 0) & (local < self.vocab_shard)
        x = self.embed_tokens(local.clamp(0, self.vocab_shard - 1)) * inside.unsqueeze(-1)
        torch.distributed.all_reduce(x)
        return x

    def forward(self, ids, pos, caches=None):  # type: ignore[no-untyped-def]
        """``ids`` [batch, tokens]; ``pos`` the positions of those tokens (a device tensor)."""
        x = self.embed(ids)
        cos = self.cos.index_select(0, pos).view(1, 1, pos.shape[0], -1)
        sin = self.sin.index_select(0, pos).view_as(cos)
        mask = (self.positions <= pos).view(1, 1, 1, -1) if ids.shape[1] == 1 else None
        for i, layer in enumerate(self.layers):
            x = layer(x, pos, cos, sin, mask, None if caches is None else caches[i])
        logits = F.linear(self.norm(x[:, -1]), self.embed_tokens.weight)
        if self.tp > 1:
            parts = torch.empty(self.tp, *logits.shape, dtype=logits.dtype, device=logits.device)
            torch.distributed.all_gather_into_tensor(parts, logits)
            logits = parts.permute(1, 0, 2).reshape(logits.shape[0], -1)
        return logits.argmax(dim=-1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["graph", "eager", "compile-kvcopy", "compile-functional", "compile-where"], default="graph")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--max-seq", type=int, default=None, help="KV cache length (default: prompt + steps, rounded up to 64)")
    ap.add_argument("--nvtx", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()

    cuda = args.device == "cuda"
    rank = 0
    if args.tp > 1:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        torch.distributed.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
        rank = torch.distributed.get_rank()
    device = torch.device(f"cuda:{torch.cuda.current_device()}") if cuda else torch.device("cpu")
    dtype = getattr(torch, args.dtype)
    cfg = json.loads((HERE / "qwen3_0.6b_config.json").read_text())
    s = Shape(cfg, args.layers)
    total = args.prompt + args.warmup + args.steps + 1
    max_seq = max(64 * math.ceil(total / 64), args.max_seq or 0)
    torch.manual_seed(rank)
    with torch.device(device):
        model = Model(s, args.tp, args.batch, max_seq, dtype, device).to(dtype).eval()
    nvtx_push = torch.cuda.nvtx.range_push if (args.nvtx and cuda) else (lambda n: None)
    nvtx_pop = torch.cuda.nvtx.range_pop if (args.nvtx and cuda) else (lambda: None)
    gen = torch.Generator(device="cpu").manual_seed(7)
    prompt = torch.randint(0, s.vocab, (args.batch, args.prompt), generator=gen).to(device)

    # static decode inputs, filled before each step (what an engine's input buffers are)
    ids_buf = torch.zeros(args.batch, 1, dtype=torch.long, device=device)
    pos_buf = torch.zeros(1, dtype=torch.long, device=device)
    host_pos = torch.zeros(1, dtype=torch.long, pin_memory=cuda)

    caches = None
    step_fn = model
    if args.mode.startswith("compile-"):
        # the caches as plain tensors the compiled step writes into (not module buffers), or
        # (functional) replaces by new ones
        global FUNCTIONAL, WHERE
        FUNCTIONAL = args.mode == "compile-functional"
        WHERE = args.mode == "compile-where"
        caches = [[torch.zeros_like(layer.self_attn.k_cache), torch.zeros_like(layer.self_attn.v_cache)] for layer in model.layers]
        step_fn = torch.compile(model) if WHERE else torch.compile(model, mode="reduce-overhead")

    @torch.inference_mode()
    def prefill() -> torch.Tensor:
        pos = torch.arange(args.prompt, device=device)
        return model(prompt, pos, caches)

    def set_inputs(next_ids: torch.Tensor, p: int) -> None:
        ids_buf.copy_(next_ids.view(-1, 1))
        host_pos.fill_(p)
        pos_buf.copy_(host_pos, non_blocking=True)

    @torch.inference_mode()
    def eager_step() -> torch.Tensor:
        if FUNCTIONAL and cuda:
            # what PyTorch's error asks for when a step feeds its outputs back in: mark the step
            # and clone the new caches outside the compiled code (each clone copies the whole cache)
            torch.compiler.cudagraph_mark_step_begin()
        out = step_fn(ids_buf, pos_buf, caches)
        if FUNCTIONAL:
            for c in caches:
                c[0], c[1] = c[0].clone(), c[1].clone()
            out = out.clone()
        return out

    with torch.inference_mode():
        next_ids = prefill()
        p = args.prompt
        # warm-up steps (and, in graph mode, the capture), outside the profiled range
        if args.mode == "graph" and cuda:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(args.warmup):
                    set_inputs(next_ids, p)
                    next_ids = eager_step()
                    next_ids.tolist()  # the host buffer of the position is free again
                    p += 1
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            set_inputs(next_ids, p)
            with torch.cuda.graph(graph):
                out_buf = model(ids_buf, pos_buf)
            replay = graph.replay
        else:
            for _ in range(args.warmup):
                set_inputs(next_ids, p)
                next_ids = eager_step()
                next_ids.tolist()
                p += 1
            out_buf = None
            replay = None
        if cuda:
            torch.cuda.synchronize()
            if args.tp > 1:
                torch.distributed.barrier()
            torch.cuda.profiler.start()
            if args.tp > 1:  # every rank collecting before the work starts (a start takes ~50 ms)
                torch.distributed.barrier()
                torch.cuda.synchronize()
        # a fresh request: prefill, then the decode steps
        t0 = time.perf_counter()
        nvtx_push("prefill")
        next_ids = prefill()
        first = next_ids.tolist()  # the first token reaches the host
        nvtx_pop()
        ttft = time.perf_counter() - t0
        p = args.prompt
        tokens = [first]
        for i in range(args.steps):
            nvtx_push(f"decode.{i}")
            set_inputs(next_ids, p)
            if replay is not None:
                replay()
                next_ids = out_buf
            else:
                next_ids = eager_step()
            tokens.append(next_ids.tolist())  # device -> host copy, one sync per token
            p += 1
            nvtx_pop()
        wall = time.perf_counter() - t0
        if cuda:
            torch.cuda.synchronize()
            if args.tp > 1:  # no rank stops (and ends the capture for all) while another still runs
                torch.distributed.barrier()
                torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            if args.tp > 1:
                torch.distributed.barrier()
    if rank == 0:
        print(json.dumps({"mode": args.mode, "tp": args.tp, "batch": args.batch, "prompt": args.prompt,
                          "steps": args.steps, "layers": s.layers, "ttft_ms": round(1e3 * ttft, 3),
                          "ms_per_token": round(1e3 * (wall - ttft) / max(args.steps, 1), 3),
                          "tokens": len(tokens)}), flush=True)
    if args.tp > 1:  # NCCL teardown after graph-captured collectives can hang; one GPU exits normally
        os._exit(0)     # (os._exit skips the CUDA profiler's final flush: a whole-run capture would lose kernels)


if __name__ == "__main__":
    main()
