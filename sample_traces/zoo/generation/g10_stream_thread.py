"""Streaming as chat front ends do it: generate() runs in a worker thread and hands tokens to a
queue that the main thread reads as they come. A Qwen3-0.6B-shaped model (28 layers), batch 1,
prompts from 128 to 2,048 tokens, after a warm-up request."""
import queue
import threading

import torch

from clock import Clock
from common import dry, prompt, qwen3

model = qwen3(28)
clock = Clock("g10_stream_thread")
clock.watch(model, "qwen3_28")


class QueueStreamer:
    """Tokens to a queue (what TextIteratorStreamer does, without a tokenizer), noted by the clock."""

    def __init__(self) -> None:
        self.q: queue.Queue = queue.Queue()

    def put(self, value: torch.Tensor) -> None:
        clock.put(value)
        self.q.put(value)

    def end(self) -> None:
        self.q.put(None)


with torch.inference_mode():
    for i, (p, n, warm) in enumerate([(16, 4, True), (128, 12, False), (2048, 12, False), (512, 12, False)]):
        ids = prompt(model, dry(p, 16), seed=i)
        n = dry(n, 4)
        streamer = QueueStreamer()
        with clock.request(prompt=ids.shape[1], new=n, batch=1, warmup=warm):
            worker = threading.Thread(target=model.generate, kwargs=dict(
                input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                do_sample=False, streamer=streamer))
            worker.start()
            got = 0
            while streamer.q.get() is not None:
                got += 1
            worker.join()
clock.report()
