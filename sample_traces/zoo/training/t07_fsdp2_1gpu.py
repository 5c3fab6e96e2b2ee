"""FSDP2 on one GPU under torchrun (``fully_shard`` per decoder layer and on the root), as a
job is first tried out: a Llama-shaped model (6 layers), bf16 mixed precision policy; the clock
marks each phase. Run: torchrun --standalone --nproc_per_node=1 t07_fsdp2_1gpu.py"""
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from common import batches, llama
from tclock import TrainClock, dry

gpu = torch.cuda.is_available()
dist.init_process_group("nccl" if gpu else "gloo")
dev = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if gpu else "cpu"
if gpu:
    torch.cuda.set_device(dev)
clock = TrainClock("t07_fsdp2_1gpu")
model = llama(layers=6).to(dev)
mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if gpu else MixedPrecisionPolicy()
for layer in model.model.layers:
    fully_shard(layer, mp_policy=mp)
fully_shard(model, mp_policy=mp)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for x in batches(dry(20, 3), 8, dry(256, 16), dry(8192, 256)):
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
clock.report(world_size=dist.get_world_size())
dist.destroy_process_group()
