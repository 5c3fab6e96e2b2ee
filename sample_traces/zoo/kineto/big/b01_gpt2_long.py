"""g03's GPT-2-shaped model (12 layers) sampling at batch 4, run long enough that its
torch.profiler trace is about 1 GB of JSON: eleven requests of 100 new tokens (1,100 forward
passes), prompts 32-320. The program's own clock (the generation zoo's ``Clock``: a streamer's
token times on CUDA events) prints its TRUTH line. For issue 45's 1 GB open benchmark."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "generation"))

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

from clock import Clock  # noqa: E402
from common import build, dry, prompt  # noqa: E402

cfg = GPT2Config(n_layer=dry(12, 2), n_embd=dry(768, 64), n_head=dry(12, 4), n_positions=2048, vocab_size=dry(50257, 512))
model = build(GPT2LMHeadModel, cfg)
clock = Clock("b01_gpt2_long")
clock.watch(model, "gpt2_12")
torch.manual_seed(1)
with torch.inference_mode():
    for i in range(dry(11, 2)):
        ids = prompt(model, dry(32 * (1 + i % 10), 16), batch=4, seed=i)
        n = dry(100, 4)
        with clock.request(prompt=ids.shape[1], new=n, batch=4, warmup=False):
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=True,
                           temperature=0.8, top_k=50, top_p=0.9, streamer=clock)
clock.report()
