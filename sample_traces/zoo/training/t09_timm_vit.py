"""A vision transformer from timm (vit_small_patch16_224, random init) trained on random images,
bf16 autocast, AdamW; the clock marks each phase."""
import timm
import torch

from common import device
from tclock import TrainClock, dry

clock = TrainClock("t09_timm_vit")
dev = device()
model = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=100).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
g = torch.Generator().manual_seed(0)
for _ in range(dry(20, 2)):
    x = torch.randn(dry(64, 2), 3, 224, 224, generator=g).to(dev)
    y = torch.randint(0, 100, (x.shape[0],), generator=g).to(dev)
    clock.mark("step")
    clock.mark("micro")
    clock.mark("forward:start")
    with torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    clock.mark("forward:end")
    clock.mark("backward:start")
    loss.backward()
    clock.mark("backward:end")
    clock.mark("optimizer:start")
    opt.step()
    opt.zero_grad()
    clock.mark("optimizer:end")
clock.mark("end")
clock.report()
