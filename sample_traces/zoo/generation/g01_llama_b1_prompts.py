"""A Llama-shaped model (16 layers) answering requests one at a time, batch 1, prompts of very
different lengths, greedy, after one short warm-up call: a latency benchmark loop."""
import torch

from clock import Clock
from common import dry, llama, prompt

model = llama(16)
clock = Clock("g01_llama_b1_prompts")
clock.watch(model, "llama16")
plan = [(32, 4, True)] + [(p, dry(16, 4), False) for p in (16, 512, 128, 2048)]
with torch.inference_mode():
    for i, (p, n, warm) in enumerate(plan):
        ids = prompt(model, dry(p, min(p, 64)), seed=i)
        with clock.request(prompt=ids.shape[1], new=n, batch=1, warmup=warm):
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, streamer=clock)
clock.report()
