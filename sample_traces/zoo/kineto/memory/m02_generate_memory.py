"""generate() at batch 1 on a 4-layer Llama (bf16), two prompts of 64 and 384 tokens, 12 new
tokens each: the KV cache each layer adds per token, prefill against decode. The program's own
per-layer memory (``memtruth``) is printed as ``LAYERMEM`` lines."""
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from memtruth import dry, watch

dev = "cuda" if torch.cuda.is_available() else "cpu"
dtype = torch.bfloat16 if dev == "cuda" else torch.float32
cfg = LlamaConfig(vocab_size=dry(32000, 512), hidden_size=dry(1024, 64), intermediate_size=dry(2816, 128),
                  num_hidden_layers=dry(4, 2), num_attention_heads=dry(16, 4), num_key_value_heads=dry(8, 2),
                  max_position_embeddings=4096)
torch.manual_seed(0)
model = LlamaForCausalLM(cfg).to(dev, dtype).eval()
watch(model)
g = torch.Generator().manual_seed(0)
for n in (dry(64, 8), dry(384, 16)):
    ids = torch.randint(0, cfg.vocab_size, (1, n), generator=g).to(dev)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, min_new_tokens=12,
                             do_sample=False, pad_token_id=0)
    print(f"prompt {n}: {out.shape[1] - n} new tokens", flush=True)
