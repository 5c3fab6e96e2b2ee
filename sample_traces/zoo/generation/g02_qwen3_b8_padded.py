"""A Qwen3-shaped model (8 layers) on batches of 8 prompts of unequal lengths, left-padded with
an attention mask, as a batch-inference script does; a warm-up batch first."""
import torch

from clock import Clock
from common import dry, prompt, qwen3

model = qwen3(8)
clock = Clock("g02_qwen3_b8_padded")
clock.watch(model, "qwen3_8")


def padded(lengths, seed):  # noqa: ANN001, ANN201
    longest = max(lengths)
    ids = torch.zeros(len(lengths), longest, dtype=torch.long, device=model.device)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, longest - n:] = prompt(model, n, seed=seed * 100 + row)[0]
        mask[row, longest - n:] = 1
    return ids, mask


batches = [([16] * 8, 4, True), ([20, 45, 300, 120, 64, 220, 33, 180], 24, False),
           ([90, 12, 256, 256, 40, 70, 150, 8], 24, False)]
with torch.inference_mode():
    for i, (lengths, n, warm) in enumerate(batches):
        lengths = [dry(x, min(x, 32)) for x in lengths]
        n = dry(n, 4)
        ids, mask = padded(lengths, i)
        with clock.request(prompt=ids.shape[1], prompt_lengths=lengths, new=n, batch=8, warmup=warm):
            model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False, streamer=clock)
clock.report()
