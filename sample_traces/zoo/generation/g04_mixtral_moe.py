"""A Mixtral-style mixture of experts (4 layers, 8 experts, top-2 routing), batch 1, three
prompts after a warm-up call: each token's layers run the experts its router picked."""
import torch
from transformers import MixtralConfig, MixtralForCausalLM

from clock import Clock
from common import build, dry, prompt

cfg = MixtralConfig(vocab_size=dry(32000, 512), hidden_size=dry(1024, 64), intermediate_size=dry(2048, 128),
                    num_hidden_layers=dry(4, 2), num_attention_heads=dry(16, 4), num_key_value_heads=dry(8, 2),
                    num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=4096)
model = build(MixtralForCausalLM, cfg)
clock = Clock("g04_mixtral_moe")
clock.watch(model, "mixtral4")
with torch.inference_mode():
    for i, (p, n, warm) in enumerate([(32, 4, True), (128, 24, False), (512, 24, False), (64, 24, False)]):
        ids = prompt(model, dry(p, 16), seed=i)
        n = dry(n, 4)
        with clock.request(prompt=ids.shape[1], new=n, batch=1, warmup=warm):
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, streamer=clock)
clock.report()
