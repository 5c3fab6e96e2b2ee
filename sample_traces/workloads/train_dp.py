"""Data-parallel training of a Llama-shaped Hugging Face model, as training scripts run it.

``torchrun --nproc-per-node N train_dp.py --mode ddp|fsdp2|allreduce-after-backward``.
The model is ``LlamaForCausalLM`` built from a config (random weights, nothing downloaded):
hidden 1024, ``--layers`` decoder layers, 16 heads (8 KV heads), SwiGLU 2816, vocabulary
32000. Each step is what HF Trainer and most hand-written loops do: a batch of random token
ids made on the host and copied to the GPU (pinned, non-blocking), a forward under bf16
autocast with the loss from ``labels=``, backward, gradient clipping to norm 1.0, AdamW
(PyTorch's default multi-tensor implementation), ``zero_grad``, and a ``loss.item()`` every
``--log-every`` steps. Nothing emits NVTX and nothing calls ``cudaProfilerStart``: the whole
run is captured, start-up included, as a user profiling ``nsys profile torchrun ...`` gets it.

Modes:

* ``ddp``: ``DistributedDataParallel`` (gradients all-reduced in buckets during backward).
* ``fsdp2``: ``torch.distributed.fsdp.fully_shard`` on every decoder layer and the root,
  bf16 parameters, fp32 gradient reduce-scatter.
* ``allreduce-after-backward`` (a planted problem): no DDP; after ``backward()`` every
  gradient is all-reduced one by one, so no communication overlaps the backward.

Each rank prints one JSON line per step (``step``, ``ms``: wall time of the step measured
after a ``torch.cuda.synchronize()``, so the host waits at the end of each step) and a final
summary: the ground truth the tracekit reading is compared with.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist


def build(layers: int, vocab: int):  # type: ignore[no-untyped-def]
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=1024, intermediate_size=2816, num_hidden_layers=layers,
        num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=4096,
        rms_norm_eps=1e-5, tie_word_embeddings=False,
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg), cfg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["ddp", "fsdp2", "allreduce-after-backward"], default="ddp")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--batch", type=int, default=8, help="sequences per GPU")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--log-every", type=int, default=1)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()

    cuda = args.device == "cuda"
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local) if cuda else torch.device("cpu")

    model, cfg = build(args.layers, args.vocab)
    model.to(device)
    params = sum(p.numel() for p in model.parameters())
    if args.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        train_model = DDP(model, device_ids=[local] if cuda else None)
    elif args.mode == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.model.layers:
            fully_shard(layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        train_model = model
    else:
        for p in model.parameters():  # the same start as DDP's broadcast from rank 0
            dist.broadcast(p.data, 0)
        train_model = model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    gen = torch.Generator().manual_seed(1000 + rank)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.mode != "fsdp2")

    times = []
    t_start = time.perf_counter()
    for step in range(args.steps):
        t0 = time.perf_counter()
        batch = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen)
        if cuda:
            batch = batch.pin_memory()
        ids = batch.to(device, non_blocking=True)
        with autocast:
            out = train_model(input_ids=ids, labels=ids)
        out.loss.backward()
        if args.mode == "allreduce-after-backward":
            for p in model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad.div_(world)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = out.loss.item() if (step + 1) % args.log_every == 0 else None
        if cuda:
            torch.cuda.synchronize()
        ms = 1e3 * (time.perf_counter() - t0)
        times.append(ms)
        print(json.dumps({"rank": rank, "step": step, "ms": round(ms, 3), "loss": None if loss is None else round(loss, 4)}),
              flush=True)
    total = time.perf_counter() - t_start
    steady = sorted(times[3:]) or times
    if rank == 0:
        tokens = args.batch * args.seq * world
        med = steady[len(steady) // 2]
        print(json.dumps({
            "mode": args.mode, "world": world, "layers": args.layers, "params": params, "batch_per_gpu": args.batch,
            "seq": args.seq, "steps": args.steps, "step_ms": [round(t, 3) for t in times],
            "steady_median_ms": round(med, 3), "tokens_per_step": tokens,
            "tokens_per_s": round(tokens / (med / 1e3), 1), "loop_s": round(total, 3),
            "torch": torch.__version__,
        }), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
