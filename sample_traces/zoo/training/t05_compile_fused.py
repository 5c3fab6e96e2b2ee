"""A plain training loop with ``torch.compile`` (default mode) and fused AdamW: a Llama-shaped
model (4 layers), bf16 autocast; Inductor's kernels carry no "Backward" in their names. The
clock marks forward, backward and optimizer of each step."""
import torch

from common import batches, device, llama
from tclock import TrainClock, dry

clock = TrainClock("t05_compile_fused")
dev = device()
model = llama().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev == "cuda")
step_fn = torch.compile(model)
for x in batches(dry(24, 3), 8, dry(256, 16), dry(8192, 256)):
    x = x.to(dev)
    clock.mark("step")
    clock.mark("micro")
    clock.mark("forward:start")
    with torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
        loss = step_fn(input_ids=x, labels=x).loss
    clock.mark("forward:end")
    clock.mark("backward:start")
    loss.backward()
    clock.mark("backward:end")
    clock.mark("optimizer:start")
    opt.step()
    opt.zero_grad(set_to_none=True)
    clock.mark("optimizer:end")
clock.mark("end")
clock.report()
