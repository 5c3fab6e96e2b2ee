"""A Llama-shaped model (6 layers) decoding with beam search (4 beams), batch 2, two requests
after a warm-up: each step scores and reorders the beams (no streamer: beam search has none)."""
import torch

from clock import Clock
from common import dry, llama, prompt

model = llama(6)
clock = Clock("g08_beam_search")
clock.watch(model, "llama6")
with torch.inference_mode():
    for i, (p, n, warm) in enumerate([(32, 4, True), (64, 24, False), (200, 24, False)]):
        ids = prompt(model, dry(p, 16), batch=2, seed=i)
        n = dry(n, 4)
        with clock.request(prompt=ids.shape[1], new=n, batch=2, beams=4, warmup=warm):
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                           num_beams=4, do_sample=False, early_stopping=False)
clock.report()
