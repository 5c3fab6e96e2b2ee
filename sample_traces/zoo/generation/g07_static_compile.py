"""A Qwen3-shaped model (4 layers) with a static KV cache: transformers compiles the decode
forward (torch.compile, CUDA graphs) on the first call; then two requests, batch 2."""
import torch

from clock import Clock
from common import dry, prompt, qwen3

model = qwen3(4)
clock = Clock("g07_static_compile")
# no forward hooks: the compiled call would trace them; the streamer's clock only
with torch.inference_mode():
    for i, (p, n, warm) in enumerate([(64, 8, True), (64, 24, False), (300, 24, False)]):
        ids = prompt(model, dry(p, 16), batch=2, seed=i)
        n = dry(n, 4)
        with clock.request(prompt=ids.shape[1], new=n, batch=2, warmup=warm):
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, cache_implementation="static", streamer=clock)
clock.report()
