"""The field program ``serve_like.py --mode requests`` (../shared/field/, whose 28-layer run is
the 217,644-kernel export ``serve_requests_h200``), cut short: the same warm-up and the first
``--requests`` requests, the same model and batch 1, plus this zoo's clock. The short and the
long capture of one program must read alike."""
import argparse
import time

import torch

from clock import Clock
from common import dry, prompt, qwen3

REQS = [(64, 4), (512, 32), (128, 32), (1024, 32), (256, 32)]  # (prompt, new tokens); the first is warm-up

ap = argparse.ArgumentParser()
ap.add_argument("--requests", type=int, default=2)
ap.add_argument("--layers", type=int, default=28)
a = ap.parse_args()
model = qwen3(a.layers)
clock = Clock("g19_serve_like_short")
clock.watch(model, f"qwen3_{a.layers}")
with torch.no_grad():
    for i, (p, n) in enumerate(REQS[: a.requests]):
        ids = prompt(model, dry(p, 16), seed=i)
        n = dry(n, 4)
        t = time.perf_counter()
        with clock.request(prompt=ids.shape[1], new=n, batch=1, warmup=i == 0):
            model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, streamer=clock)
        print(f"request {i}: prompt {p}, {n} new tokens, {1e3 * (time.perf_counter() - t):.1f} ms", flush=True)
        time.sleep(0.05)  # requests arrive apart
clock.report()
