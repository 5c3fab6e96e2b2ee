"""A LoRA fine-tune with peft (rank 8 on q/v projections of a Llama-shaped model, 6 layers, the
base frozen), bf16 autocast, a plain loop; the clock marks each phase."""
import torch
from peft import LoraConfig, get_peft_model

from common import batches, device, llama
from tclock import TrainClock, dry

clock = TrainClock("t08_peft_lora")
dev = device()
model = get_peft_model(llama(layers=6), LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])).to(dev)
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
for x in batches(dry(20, 3), 8, dry(256, 16), dry(8192, 256)):
    x = x.to(dev)
    clock.mark("step")
    clock.mark("micro")
    clock.mark("forward:start")
    with torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
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
clock.report(trainable=sum(p.numel() for p in model.parameters() if p.requires_grad))
