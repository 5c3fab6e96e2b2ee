"""A loop with Hugging Face accelerate: gradient accumulation 2 through ``accelerator.accumulate``,
bf16, a Llama-shaped model (4 layers); the clock marks each phase."""
import torch
from accelerate import Accelerator

from common import batches, llama
from tclock import TrainClock, dry

clock = TrainClock("t04_accelerate_accum")
ACCUM, STEPS = 2, dry(20, 3)
acc = Accelerator(gradient_accumulation_steps=ACCUM, mixed_precision="bf16" if torch.cuda.is_available() else "no")
model = llama()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
data = batches(ACCUM * STEPS, 8, dry(256, 16), dry(8192, 256))
model, opt = acc.prepare(model, opt)
for i, x in enumerate(data):
    x = x.to(acc.device)
    if i % ACCUM == 0:
        clock.mark("step")
    with acc.accumulate(model):
        clock.mark("micro")
        clock.mark("forward:start")
        loss = model(input_ids=x, labels=x).loss
        clock.mark("forward:end")
        clock.mark("backward:start")
        acc.backward(loss)
        clock.mark("backward:end")
        clock.mark("optimizer:start")
        opt.step()
        opt.zero_grad()
        clock.mark("optimizer:end")  # a no-op on micro-batches that do not sync the gradients
clock.mark("end")
clock.report(accumulation=ACCUM)
