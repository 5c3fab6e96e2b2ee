"""A GPT-2-shaped model (12 layers) sampling with temperature, top-k and top-p, batch 4, three
prompts; no warm-up call (the first request is cold)."""
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from clock import Clock
from common import build, dry, prompt

cfg = GPT2Config(n_layer=dry(12, 2), n_embd=dry(768, 64), n_head=dry(12, 4), n_positions=2048, vocab_size=dry(50257, 512))
model = build(GPT2LMHeadModel, cfg)
clock = Clock("g03_gpt2_sampling")
clock.watch(model, "gpt2_12")
torch.manual_seed(1)
with torch.inference_mode():
    for i, (p, n) in enumerate([(64, 32), (256, 32), (32, 32)]):
        ids = prompt(model, dry(p, 16), batch=4, seed=i)
        n = dry(n, 4)
        with clock.request(prompt=ids.shape[1], new=n, batch=4, warmup=False):
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=True,
                           temperature=0.8, top_k=50, top_p=0.9, streamer=clock)
clock.report()
