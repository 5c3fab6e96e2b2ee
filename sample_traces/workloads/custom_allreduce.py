"""Collectives that are not NCCL, on 2 GPUs under torchrun.

1. ``ce_allgather``: a copy-engine all-gather. Each rank rendezvouses a symmetric-memory
   buffer and pulls every peer's shard with a device-to-device (peer) memcpy.
2. ``symm_allreduce``: ``torch.ops.symm_mem.one_shot_all_reduce`` (peer loads, no NVLink
   multicast), when this PyTorch build provides it.
NVLink multicast stays off (TORCH_SYMM_MEM_DISABLE_MULTICAST=1).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem


def main() -> None:
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", device_id=device)
    group_name = dist.group.WORLD.group_name
    n = 1 << 20
    buf = symm_mem.empty(n, dtype=torch.bfloat16, device=device)
    handle = symm_mem.rendezvous(buf, group_name)
    gathered = torch.empty(world, n, dtype=torch.bfloat16, device=device)
    ok_allreduce = hasattr(torch.ops.symm_mem, "one_shot_all_reduce")
    for it in range(6):
        if it == 2:
            dist.barrier()
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
        torch.cuda.nvtx.range_push(f"iter.{it}")
        buf.fill_(rank + it)
        handle.barrier()
        torch.cuda.nvtx.range_push("ce_allgather")
        for peer in range(world):
            src = handle.get_buffer(peer, (n,), torch.bfloat16)
            gathered[peer].copy_(src, non_blocking=True)
        torch.cuda.nvtx.range_pop()
        handle.barrier()
        if ok_allreduce:
            torch.cuda.nvtx.range_push("symm_allreduce")
            try:
                out = torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", group_name)
            except Exception as exc:  # keep the trace even where the op is missing
                ok_allreduce = False
                print(f"rank {rank}: one_shot_all_reduce unavailable: {exc}")
            torch.cuda.nvtx.range_pop()
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    dist.barrier()
    torch.cuda.profiler.stop()
    expect = sum(r + 5 for r in range(world))
    check = gathered[:, 0].float().tolist()
    print(f"rank {rank}: gathered {check}, one_shot_all_reduce={'ran' if ok_allreduce else 'absent'}"
          + (f" sum={out[0].item()} expected {expect}" if ok_allreduce else ""))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
