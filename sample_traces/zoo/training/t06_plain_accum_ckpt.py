"""A hand-written loop as research code has it: gradient accumulation 3, activation
checkpointing (HF's gradient_checkpointing_enable), the loss logged with ``.item()`` every
step, an evaluation of 4 batches every 6 steps and a checkpoint saved every 10 steps."""
import torch

from common import batches, device, llama
from tclock import TrainClock, dry

clock = TrainClock("t06_plain_accum_ckpt")
ACCUM, STEPS, EVAL_EVERY, SAVE_EVERY = 3, dry(20, 3), 6, 10
dev = device()
model = llama(layers=4).to(dev)
model.gradient_checkpointing_enable()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
data = batches(ACCUM * STEPS, 4, dry(512, 16), dry(8192, 256))
held = batches(4, 8, dry(512, 16), dry(8192, 256), seed=1)
ctx = torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda")
for step in range(STEPS):
    clock.mark("step")
    for k in range(ACCUM):
        x = data[step * ACCUM + k].to(dev)
        clock.mark("micro")
        clock.mark("forward:start")
        with ctx:
            loss = model(input_ids=x, labels=x).loss / ACCUM
        clock.mark("forward:end")
        clock.mark("backward:start")
        loss.backward()
        clock.mark("backward:end")
    clock.mark("optimizer:start")
    opt.step()
    opt.zero_grad(set_to_none=True)
    clock.mark("optimizer:end")
    print(f"step {step} loss {loss.item() * ACCUM:.3f}", flush=True)
    if (step + 1) % EVAL_EVERY == 0:
        clock.mark("evaluate:start")
        model.eval()
        with torch.no_grad(), ctx:
            val = sum(model(input_ids=h.to(dev), labels=h.to(dev)).loss.item() for h in held)
        model.train()
        clock.mark("evaluate:end")
    if (step + 1) % SAVE_EVERY == 0:
        clock.mark("save:start")
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, "/tmp/t06_ckpt.pt")
        clock.mark("save:end")
clock.mark("end")
clock.report(accumulation=ACCUM, eval_every=EVAL_EVERY, save_every=SAVE_EVERY)
