"""Greedy decode loop of TinyLLM, on one GPU or tensor/pipeline parallel under torchrun.

One GPU:   python3 decode.py --steps 8
TP=2:      torchrun --nproc-per-node 2 decode.py --tp 2
TP2 x PP2: torchrun --nproc-per-node 4 decode.py --tp 2 --pp 2

Each step: host->device copy of the token ids (pinned, async), the model forward,
argmax, a device->host copy of the new ids. Profiled steps are wrapped in NVTX ranges
``step.N`` and bracketed by cudaProfilerStart/Stop so that ``nsys profile
--capture-range=cudaProfilerApi`` skips start-up and warm-up. With --tp 2 (no pipeline),
rank 0 samples and sends the ids to the other ranks (one NCCL send/recv hop per step).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

from tinyllm import Config, TinyLLM, nvtx_pop, nvtx_push


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    args = p.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    assert world == args.tp * args.pp, "WORLD_SIZE must equal tp * pp"
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    tp_group = None
    if world > 1:
        dist.init_process_group("nccl", device_id=device)
        groups = [dist.new_group(list(range(s * args.tp, (s + 1) * args.tp))) for s in range(args.pp)]
        tp_group = groups[rank // args.tp]
    stage = rank // args.tp
    last_stage = stage == args.pp - 1
    cfg = Config()
    per_stage = cfg.layers // args.pp
    torch.manual_seed(0)
    model = TinyLLM(
        cfg, tp=args.tp, group=tp_group, first_layer=stage * per_stage, n_layers=per_stage,
        embed=(stage == 0), head=last_stage,
    ).to(device=device, dtype=torch.bfloat16).eval()
    caches = model.new_cache(args.batch, device, torch.bfloat16)

    ids_host = torch.randint(0, cfg.vocab, (args.batch, args.prompt), pin_memory=True)
    hidden = torch.empty(args.batch, args.prompt, cfg.hidden, device=device, dtype=torch.bfloat16)
    pos = 0
    total = args.warmup + args.steps
    with torch.inference_mode():
        for step in range(total):
            if step == args.warmup:
                if world > 1:
                    dist.barrier()
                torch.cuda.synchronize()
                torch.cuda.profiler.start()
            profiled = step >= args.warmup
            name = f"step.{step - args.warmup}" if profiled else f"warmup.{step}"
            nvtx_push(name)
            t = ids_host.shape[1]
            if stage == 0:
                ids = ids_host.to(device, non_blocking=True)
                x = ids
            else:
                if hidden.shape[1] != t:
                    hidden = torch.empty(args.batch, t, cfg.hidden, device=device, dtype=torch.bfloat16)
                dist.recv(hidden, src=rank - args.tp)
                x = hidden
            out = model(x, caches, pos)
            if not last_stage:
                dist.send(out.contiguous(), dst=rank + args.tp)
                next_ids = torch.empty(args.batch, dtype=torch.long, device=device)
                dist.recv(next_ids, src=rank + args.tp)
            else:
                next_ids = out.argmax(dim=-1)
                if args.pp > 1:
                    dist.send(next_ids, dst=rank - args.tp)
                elif world > 1:
                    # rank 0 samples; the others receive its choice (one p2p hop)
                    if rank == 0:
                        for peer in range(1, world):
                            dist.send(next_ids, dst=peer)
                    else:
                        dist.recv(next_ids, src=0)
            new_host = next_ids.cpu()  # device->host copy, synchronous
            ids_host = new_host.view(args.batch, 1).pin_memory()
            pos += t
            nvtx_pop()
        torch.cuda.synchronize()
        if world > 1:
            dist.barrier()
        torch.cuda.profiler.stop()
    if world > 1:
        dist.destroy_process_group()
    print(f"rank {rank}: decoded {args.steps} profiled steps, last ids {ids_host.view(-1).tolist()}")


if __name__ == "__main__":
    main()
