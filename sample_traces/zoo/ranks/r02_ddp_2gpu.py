"""DistributedDataParallel on two GPUs: a Llama-shaped model (4 layers), bf16 autocast, AdamW,
two micro-batches per optimizer step (the first under ``no_sync``: one gradient all-reduce per
step), each rank its own batches; one ``TRUTH`` line per rank (``tclock.py``).
Run: torchrun --standalone --nproc_per_node=2 r02_ddp_2gpu.py"""
import contextlib
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "training"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from common import batches, llama  # noqa: E402
from tclock import TrainClock, dry  # noqa: E402

gpu = torch.cuda.is_available()
dist.init_process_group("nccl" if gpu else "gloo")
rank = dist.get_rank()
local = int(os.environ.get("LOCAL_RANK", 0))
dev = f"cuda:{local}" if gpu else "cpu"
if gpu:
    torch.cuda.set_device(dev)
clock = TrainClock("r02_ddp_2gpu")
model = DDP(llama(layers=4).to(dev), device_ids=[local] if gpu else None)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
data = list(batches(dry(24, 4), 4, dry(512, 16), dry(8192, 256), seed=rank))
for s in range(0, len(data), 2):
    clock.mark("step")
    for i, x in enumerate(data[s:s + 2]):
        x = x.to(dev)
        clock.mark("micro")
        sync = model.no_sync() if i == 0 else contextlib.nullcontext()
        with sync:
            clock.mark("forward:start")
            with torch.autocast("cuda" if gpu else "cpu", dtype=torch.bfloat16, enabled=gpu):
                loss = model(input_ids=x, labels=x).loss / 2
            clock.mark("forward:end")
            clock.mark("backward:start")
            loss.backward()
            clock.mark("backward:end")
    clock.mark("optimizer:start")
    opt.step()
    opt.zero_grad()
    clock.mark("optimizer:end")
clock.mark("end")
clock.report(world_size=dist.get_world_size(), rank=rank)
dist.destroy_process_group()
