"""Attention as plain matrix products (``attn_implementation="eager"``: matmul, softmax, matmul
per layer, no fused attention kernel) and prompts at both ends of the range: 16 and 8,192
tokens. A Llama-shaped model (4 layers), batch 1, a warm-up call first."""
import torch

from clock import Clock
from common import dry, llama, prompt

model = llama(4)
model.config._attn_implementation = "eager"
model.set_attn_implementation("eager") if hasattr(model, "set_attn_implementation") else None
clock = Clock("g20_llama_eager_8k")
clock.watch(model, "llama4_eager")
with torch.inference_mode():
    for i, (p, n, warm) in enumerate([(32, 4, True), (16, 16, False), (8192, 16, False), (512, 16, False)]):
        ids = prompt(model, dry(p, min(p, 64)), seed=i)
        n = dry(n, 4)
        with clock.request(prompt=ids.shape[1], new=n, batch=1, warmup=warm):
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, streamer=clock)
clock.report()
