"""A slow host: a Python logits processor (a repetition penalty written with a loop over the
recent token ids, which it copies to the host each step), run under nsys with OS-runtime
tracing and Python sampling. A Llama-shaped model (8 layers), batch 1, three requests."""
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from clock import Clock
from common import dry, llama, prompt

model = llama(8)
clock = Clock("g11_slow_host")
clock.watch(model, "llama8")


class PythonRepetitionPenalty(LogitsProcessor):
    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        recent = input_ids[0, -32:].tolist()  # a sync and a small copy to the host
        for tok in set(recent):
            scores[0, tok] = scores[0, tok] / 1.3  # a few tiny kernels per token id
        return scores


with torch.inference_mode():
    for i, (p, n, warm) in enumerate([(32, 4, True), (256, 16, False), (64, 16, False), (1024, 16, False)]):
        ids = prompt(model, dry(p, 16), seed=i)
        n = dry(n, 4)
        with clock.request(prompt=ids.shape[1], new=n, batch=1, warmup=warm):
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                           logits_processor=LogitsProcessorList([PythonRepetitionPenalty()]), streamer=clock)
clock.report()
