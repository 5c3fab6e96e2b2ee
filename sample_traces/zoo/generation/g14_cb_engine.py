"""A continuous-batching engine (sample_traces/workloads/engine.py: prefills admitted while
other requests decode, one batched decode forward per engine step) serving 14 requests that
arrive at random times (Poisson, 25 per second), 6 layers; a single test request and a pause
first, as a benchmark client sends. The engine's own step log and per-request latencies are
the truth."""
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workloads"))
from engine import Engine, Request, Shape, latency_summary, make_requests  # noqa: E402
from serve import serve  # noqa: E402

from common import dry  # noqa: E402

dev = "cuda" if torch.cuda.is_available() else "cpu"
engine = Engine(layers=dry(6, 2), slots=16, device=dev)
engine.warm_up()
vocab = Shape(1).vocab
test = [Request(1000, list(range(1, 97)), 12, time.perf_counter())]
first = serve(engine, test)
test_steps = engine.steps
time.sleep(0.4)
load = make_requests(dry(14, 4), 25.0, 11, vocab, time.perf_counter())
done = serve(engine, load)
log = engine.step_log
steps = [s for s in log[test_steps:]]
iv = sorted(b["start"] - a["start"] for a, b in zip(steps, steps[1:]))
truth = {"program": "g14_cb_engine", "kind": "serving", "test_request": latency_summary(first)["requests"],
         "test_steps": test_steps, "load_steps": len(steps), "prefills": sum(s["prefills"] for s in steps),
         "steps_with_prefill_and_decode": sum(1 for s in steps if s["prefills"] and s["decodes"]),
         "max_decode_batch": max(s["decodes"] for s in steps),
         "step_interval_median_ms": round(1e3 * iv[len(iv) // 2], 3) if iv else None,
         **latency_summary(done)}
print("TRUTH " + json.dumps(truth), flush=True)
