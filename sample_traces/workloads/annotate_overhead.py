"""What ``tracekit.torch.annotate`` costs per NVTX range, measured (prints one JSON line).

Two measurements, each the median of ``--repeats`` timed rounds after a warm-up, hooks off and
on in alternation:

* ``identity``: ``nn.Sequential`` of ``--modules`` ``nn.Identity`` modules on a GPU tensor, every
  module ranged (``depth=None``): (time with hooks − time without) / ranges = the cost of one
  range (two hook calls, one NVTX push and pop) with nothing else in the way.
* ``qwen3``: one forward of the Qwen3-0.6B-shaped Hugging Face model (batch 1, 1 token, no
  cache) at the default depth 3: the added time per forward, the ranges per forward, and the
  share of the forward's wall time.

Run it under nsys (``--trace=cuda,nvtx``) too: NVTX calls cost more while a tool records them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def load_annotator():  # type: ignore[no-untyped-def]
    """tracekit's annotator from its file (tracekit need not be installed here)."""
    spec = importlib.util.spec_from_file_location("_tk_torch_nvtx", ROOT / "tracekit" / "capture" / "torch_nvtx.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["_tk_torch_nvtx"] = mod
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def timed(fn, sync, repeats: int, inner: int) -> float:  # type: ignore[no-untyped-def]
    """Median seconds of one call of ``fn`` over ``repeats`` rounds of ``inner`` calls."""
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / inner)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modules", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    tn = load_annotator()
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    out: dict = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"}

    seq = nn.Sequential(*[nn.Identity() for _ in range(args.modules)]).to(dev)
    x = torch.ones(4, device=dev)
    base, hooked, ranges = [], [], 0
    for _ in range(3):
        base.append(timed(lambda: seq(x), sync, args.repeats, 5))
        ann = tn.annotate(seq, depth=None)
        before = ann.ranges_pushed
        hooked.append(timed(lambda: seq(x), sync, args.repeats, 5))
        ranges = (ann.ranges_pushed - before) // (args.repeats * 5)
        ann.remove()
    b, h = statistics.median(base), statistics.median(hooked)
    out["identity"] = {"modules": args.modules, "ranges_per_call": ranges, "us_per_call_plain": round(b * 1e6, 1),
                       "us_per_call_annotated": round(h * 1e6, 1), "us_per_range": round((h - b) * 1e6 / max(ranges, 1), 3),
                       "emitting": ann.emitting}

    sys.path.insert(0, str(HERE))
    from hf_generate import build

    model, cfg = build(None, args.device, torch.bfloat16 if dev.type == "cuda" else torch.float32)
    ids = torch.randint(0, cfg.vocab_size, (1, 1), device=dev)

    def fwd() -> None:
        with torch.inference_mode():
            model(input_ids=ids, use_cache=False)

    emitter = tn._nvtx()
    real_push, real_pop = emitter.push, emitter.pop
    base, hooked, silent = [], [], []
    for _ in range(3):
        base.append(timed(fwd, sync, args.repeats, 3))
        ann = tn.annotate(model)
        before = ann.ranges_pushed
        hooked.append(timed(fwd, sync, args.repeats, 3))
        ranges = (ann.ranges_pushed - before) // (args.repeats * 3)
        emitter.push, emitter.pop = (lambda name: None), (lambda: None)  # the hooks alone, no NVTX call
        silent.append(timed(fwd, sync, args.repeats, 3))
        emitter.push, emitter.pop = real_push, real_pop
        ann.remove()
    b, h, q = statistics.median(base), statistics.median(hooked), statistics.median(silent)
    out["qwen3"] = {"layers": cfg.num_hidden_layers, "depth": 3, "ranges_per_forward": ranges,
                    "ms_per_forward_plain": round(b * 1e3, 3), "ms_per_forward_annotated": round(h * 1e3, 3),
                    "ms_per_forward_hooks_without_nvtx": round(q * 1e3, 3),
                    "us_per_range": round((h - b) * 1e6 / max(ranges, 1), 3), "added_pct": round(100 * (h - b) / b, 2),
                    "all_times_ms": {"plain": [round(x * 1e3, 3) for x in base], "annotated": [round(x * 1e3, 3) for x in hooked],
                                     "hooks_without_nvtx": [round(x * 1e3, 3) for x in silent]}}
    n = 100_000
    t0 = time.perf_counter()
    for _ in range(n):
        real_push("model.layers.3.self_attn")
        real_pop()
    out["nvtx_push_pop_us"] = round((time.perf_counter() - t0) * 1e6 / n, 3)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
