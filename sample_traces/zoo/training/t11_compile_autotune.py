"""A plain training loop with ``torch.compile(mode="max-autotune-no-cudagraphs")`` and fused
AdamW: Inductor benchmarks Triton templates (``triton_tem_…``) and cuBLAS for each matrix
product before the first step, then runs the winners. A Llama-shaped model (4 layers), bf16
autocast; the clock marks forward, backward and optimizer of each step."""
import os

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "8")  # autotuning compiles many candidates
os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "8"

import torch  # noqa: E402

from common import batches, device, llama  # noqa: E402
from tclock import TrainClock, dry  # noqa: E402

clock = TrainClock("t11_compile_autotune")
dev = device()
model = llama().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev == "cuda")
step_fn = torch.compile(model, mode="max-autotune-no-cudagraphs")
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
