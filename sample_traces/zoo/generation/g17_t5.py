"""An encoder-decoder (T5-shaped: 4 encoder layers, 6 decoder layers), batch 4: the encoder runs
once per request over the source, the decoder once per output token with cross-attention. A
warm-up then two requests."""
import torch
from transformers import DynamicCache, EncoderDecoderCache, T5Config, T5ForConditionalGeneration

from clock import Clock
from common import build, dry, prompt

cfg = T5Config(vocab_size=dry(32128, 512), d_model=dry(512, 64), d_kv=64, d_ff=dry(2048, 128), num_layers=dry(4, 2),
               num_decoder_layers=dry(6, 3), num_heads=8, decoder_start_token_id=0, pad_token_id=0)
model = build(T5ForConditionalGeneration, cfg)
clock = Clock("g17_t5")
clock.watch(model, "t5_decoder_steps")
clock.watch(model.get_encoder(), "t5_encoder")
with torch.inference_mode():
    for i, (p, n, warm) in enumerate([(32, 4, True), (256, 24, False), (96, 24, False)]):
        ids = prompt(model, dry(p, 16), batch=4, seed=i)
        n = dry(n, 4)
        with clock.request(prompt=ids.shape[1], new=n, batch=4, warmup=warm):
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, streamer=clock,
                           # fresh caches: the default one is sized by the encoder's depth (6 decoder layers here)
                           past_key_values=EncoderDecoderCache(DynamicCache(), DynamicCache()))
clock.report()
