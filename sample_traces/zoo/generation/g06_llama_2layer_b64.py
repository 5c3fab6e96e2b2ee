"""A 2-layer Llama at batch 64, short prompts (16 tokens), three equal calls: a throughput
test where each forward is a few kernels and the batch is wide."""
import torch

from clock import Clock
from common import dry, llama, prompt

model = llama(2)
clock = Clock("g06_llama_2layer_b64")
clock.watch(model, "llama2")
ids = prompt(model, 16, batch=dry(64, 4))
with torch.inference_mode():
    for call in range(3):
        n = dry(32, 4)
        with clock.request(prompt=16, new=n, batch=ids.shape[0], warmup=call == 0):
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, streamer=clock)
clock.report()
