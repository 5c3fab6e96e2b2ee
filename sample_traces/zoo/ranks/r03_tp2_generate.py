"""Tensor-parallel generation on two GPUs with Hugging Face's ``tp_plan="auto"``: a Llama-shaped
model (8 layers, random weights saved once by rank 0) sharded over both GPUs, ``generate()`` at
batch 1, greedy, prompts of different lengths after one short warm-up call; every layer
all-reduces its attention and MLP outputs. The generation clock (``clock.py``: a streamer's
token times on CUDA events) prints one ``TRUTH`` line per rank.
Run: torchrun --standalone --nproc_per_node=2 r03_tp2_generate.py"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "generation"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from clock import Clock  # noqa: E402
from common import dry, llama, prompt  # noqa: E402

gpu = torch.cuda.is_available()
dist.init_process_group("nccl" if gpu else "gloo")
rank = dist.get_rank()
if gpu:
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
where = os.environ.get("R03_MODEL_DIR", "/tmp/r03_tp2_model")
if rank == 0:
    llama(8).save_pretrained(where)
dist.barrier()
from transformers import LlamaForCausalLM  # noqa: E402

model = LlamaForCausalLM.from_pretrained(where, tp_plan="auto", dtype=torch.bfloat16 if gpu else torch.float32).eval()
model.generation_config.pad_token_id = 0
model.generation_config.eos_token_id = None  # random weights: never stop early
clock = Clock("r03_tp2_generate")
clock.watch(model, "llama8_tp2")
plan = [(32, 4, True)] + [(p, dry(16, 4), False) for p in (128, 1024, 64)]
with torch.inference_mode():
    for i, (p, n, warm) in enumerate(plan):
        ids = prompt(model, dry(p, min(p, 64)), seed=i)
        with clock.request(prompt=ids.shape[1], new=n, batch=1, warmup=warm):
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, streamer=clock)
clock.report(rank=rank, world_size=dist.get_world_size())
dist.destroy_process_group()
