"""Not a language model: a diffusion-style sampler. A small convolution + attention denoiser
(a UNet-like stack) runs 20 denoising steps per image batch, three batches of 4 images after
a warm-up batch. No tokens: nothing here must be read as generated tokens."""
import torch
from torch import nn

from clock import Clock, device_and_dtype
from common import dry


class Block(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(8, c)
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.norm2 = nn.GroupNorm(8, c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)
        self.attn = nn.MultiheadAttention(c, 4, batch_first=True)
        self.t = nn.Linear(c, c)

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(nn.functional.silu(self.norm1(x))) + self.t(temb)[:, :, None, None]
        x = x + self.conv2(nn.functional.silu(self.norm2(h)))
        b, c, hh, ww = x.shape
        s = x.flatten(2).transpose(1, 2)
        s = s + self.attn(s, s, s, need_weights=False)[0]
        return s.transpose(1, 2).reshape(b, c, hh, ww)


class Denoiser(nn.Module):
    def __init__(self, c: int = 128, blocks: int = 6) -> None:
        super().__init__()
        self.c = c
        self.inp = nn.Conv2d(4, c, 3, padding=1)
        self.blocks = nn.ModuleList(Block(c) for _ in range(blocks))
        self.out = nn.Conv2d(c, 4, 3, padding=1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        half = self.c // 2
        f = torch.exp(-torch.arange(half, device=x.device, dtype=torch.float32) / half)
        temb = torch.cat([torch.sin(t[:, None] * f), torch.cos(t[:, None] * f)], dim=-1).to(x.dtype)
        h = self.inp(x)
        for blk in self.blocks:
            h = blk(h, temb)
        return self.out(h)


dev, dtype = device_and_dtype()
torch.manual_seed(0)
net = Denoiser(c=dry(128, 32), blocks=dry(6, 2)).to(dev, dtype).eval()
clock = Clock("g15_diffusion")
clock.watch(net, "denoiser")
steps = dry(20, 3)
with torch.inference_mode():
    for b in range(4):
        x = torch.randn(4, 4, dry(32, 8), dry(32, 8), device=dev, dtype=dtype)
        with clock.request(images=4, steps=steps, warmup=b == 0):
            for i in range(steps):  # a DDIM-like update per step
                t = torch.full((4,), 1000.0 * (steps - i) / steps, device=dev)
                eps = net(x, t)
                x = x - eps * (1.0 / steps)
            img = (x.clamp(-1, 1) * 127.5 + 127.5).to(torch.uint8).cpu()  # the images to the host
clock.report(kind="not a generation: denoising steps", steps_per_batch=steps)
