"""Assisted generation: a 12-layer Llama verifies the guesses of a 2-layer draft model of the
same vocabulary (speculative decoding), batch 1, after a plain warm-up call."""
import torch

from clock import Clock
from common import dry, llama, prompt

target = llama(12)
draft = llama(2, hidden=512, ffn=1408, heads=8, kv=4)
clock = Clock("g09_assisted")
clock.watch(target, "target12")
clock.watch(draft, "draft2")
with torch.inference_mode():
    ids = prompt(target, 32)
    with clock.request(prompt=32, new=4, batch=1, warmup=True, assisted=False):
        target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, min_new_tokens=4, do_sample=False,
                        streamer=clock)
    for i, p in enumerate((128, 512)):
        ids = prompt(target, dry(p, 16), seed=i + 1)
        n = dry(40, 6)
        with clock.request(prompt=ids.shape[1], new=n, batch=1, warmup=False, assisted=True):
            target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=draft, max_new_tokens=n,
                            min_new_tokens=n, do_sample=False, streamer=clock)
clock.report()
