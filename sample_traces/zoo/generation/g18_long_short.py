"""Prompts at both extremes in one run: 16 and 4,096 tokens, batch 1, a Llama-shaped model
(8 layers); no warm-up call."""
import torch

from clock import Clock
from common import dry, llama, prompt

model = llama(8)
clock = Clock("g18_long_short")
clock.watch(model, "llama8")
with torch.inference_mode():
    for i, p in enumerate((16, 4096, 16, 1024)):
        ids = prompt(model, dry(p, 16), seed=i)
        n = dry(16, 4)
        with clock.request(prompt=ids.shape[1], new=n, batch=1, warmup=False):
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, streamer=clock)
clock.report()
