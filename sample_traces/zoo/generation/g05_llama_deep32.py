"""A deep, narrow Llama (32 layers, hidden 256), batch 1, two requests after a warm-up: many
small kernels per forward, a host-bound decode."""
import torch

from clock import Clock
from common import dry, llama, prompt

model = llama(32, hidden=256, ffn=688, heads=8, kv=4)
clock = Clock("g05_llama_deep32")
clock.watch(model, "llama32")
with torch.inference_mode():
    for i, (p, n, warm) in enumerate([(16, 4, True), (64, 12, False), (256, 12, False)]):
        ids = prompt(model, dry(p, 16), seed=i)
        n = dry(n, 4)
        with clock.request(prompt=ids.shape[1], new=n, batch=1, warmup=warm):
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, streamer=clock)
clock.report()
