"""FSDP2 on two GPUs (``fully_shard`` per decoder layer and on the root) of a Llama-shaped model
(6 layers, bf16 mixed precision policy), each rank its own batches; the clock (``tclock.py``:
CUDA events at the program's own step and phase marks) prints one ``TRUTH`` line per rank.
Run: torchrun --standalone --nproc_per_node=2 r01_fsdp2_2gpu.py"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "training"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: E402

from common import batches, llama  # noqa: E402
from tclock import TrainClock, dry  # noqa: E402

gpu = torch.cuda.is_available()
dist.init_process_group("nccl" if gpu else "gloo")
rank = dist.get_rank()
dev = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if gpu else "cpu"
if gpu:
    torch.cuda.set_device(dev)
clock = TrainClock("r01_fsdp2_2gpu")
model = llama(layers=6).to(dev)
mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if gpu else MixedPrecisionPolicy()
for layer in model.model.layers:
    fully_shard(layer, mp_policy=mp)
fully_shard(model, mp_policy=mp)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for x in batches(dry(14, 3), 8, dry(256, 16), dry(8192, 256), seed=rank):
    x = x.to(dev)
    clock.mark("step")
    clock.mark("micro")
    clock.mark("forward:start")
    loss = model(input_ids=x, labels=x).loss
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
