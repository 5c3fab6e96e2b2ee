"""Training steps of a 4-layer Llama (bf16 autocast, AdamW), with the memory each decoder
layer's forward adds (its activations, kept for backward): 4 optimizer steps, recorded whole.
The program's own per-layer memory (``memtruth``: allocator readings in its own hooks) is
printed as ``LAYERMEM`` lines."""
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from memtruth import dry, watch

dev = "cuda" if torch.cuda.is_available() else "cpu"
cfg = LlamaConfig(vocab_size=dry(8192, 256), hidden_size=dry(512, 64), intermediate_size=dry(2048, 128),
                  num_hidden_layers=dry(4, 2), num_attention_heads=dry(8, 4), num_key_value_heads=dry(8, 4),
                  max_position_embeddings=2048)
torch.manual_seed(0)
model = LlamaForCausalLM(cfg).to(dev)
watch(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
g = torch.Generator().manual_seed(0)
data = [torch.randint(0, cfg.vocab_size, (4, dry(512, 16)), generator=g) for _ in range(4)]
ctx = torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda")
for step, x in enumerate(data):
    x = x.to(dev)
    with ctx:
        loss = model(input_ids=x, labels=x).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    print(f"step {step} loss {loss.item():.3f}", flush=True)
