"""Hugging Face ``generate()`` on a Qwen3-0.6B-shaped model with random weights (no download).

The model is ``AutoModelForCausalLM.from_config`` of ``qwen3_0.6b_config.json`` (the public
Qwen3-0.6B config; ``--layers`` may cut the depth), bf16 on GPU 0. Nothing in this script
emits NVTX: the per-layer ranges of the bundled capture come from
``tracekit capture nsys --annotate-torch`` (an unmodified script, as users run theirs).

Modes:

* ``eager`` (default): the default ``DynamicCache``, which grows the KV cache with
  ``torch.cat`` every step (``CatArrayBatchedCopy`` kernels).
* ``static-compile``: ``cache_implementation="static"``; transformers then compiles the forward
  with ``torch.compile(mode="reduce-overhead", fullgraph=True)`` (CUDA graphs, Inductor/Triton
  kernels).

One warm-up ``generate`` (compilation, cuBLAS heuristics) runs before
``cudaProfilerStart``; the profiled ``generate`` runs between ``cudaProfilerStart`` and
``cudaProfilerStop`` (use ``--capture-range=cudaProfilerApi``). EOS is disabled
(``min_new_tokens`` = ``max_new_tokens``) so random weights generate exactly ``--new-tokens``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def build(layers: int | None, device: str, dtype: torch.dtype):  # type: ignore[no-untyped-def]
    from transformers import AutoConfig, AutoModelForCausalLM

    data = json.loads((HERE / "qwen3_0.6b_config.json").read_text())
    if layers:
        data["num_hidden_layers"] = layers
        data["max_window_layers"] = layers
    cfg = AutoConfig.for_model(**{k: v for k, v in data.items() if k not in ("transformers_version", "architectures")})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).to(device).eval()
    return model, cfg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["eager", "static-compile"], default="eager")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--warmup-tokens", type=int, default=4)
    ap.add_argument("--layers", type=int, default=None, help="cut the model to this many layers")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()

    dtype = getattr(torch, args.dtype)
    model, cfg = build(args.layers, args.device, dtype)
    gen = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.prompt), generator=gen).to(args.device)
    mask = torch.ones_like(ids)
    extra: dict = {}
    if args.mode == "static-compile":
        extra["cache_implementation"] = "static"
        if args.device == "cpu":  # only to try the script without a GPU
            from transformers import CompileConfig

            cc = CompileConfig()
            cc._compile_all_devices = True
            extra["compile_config"] = cc

    def generate(n: int) -> torch.Tensor:
        with torch.inference_mode():
            return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                  do_sample=False, pad_token_id=0, **extra)

    t0 = time.perf_counter()
    # warm-up: static caches and their compiled graphs depend on max_new_tokens, so the
    # warm-up asks for the same length as the profiled run in that mode
    generate(args.new_tokens if args.mode == "static-compile" else args.warmup_tokens)
    if args.mode == "static-compile":
        generate(args.new_tokens)  # reduce-overhead records its CUDA graphs on a later call
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    sync()
    warm_s = time.perf_counter() - t0
    if args.device == "cuda":
        torch.cuda.profiler.start()
    t0 = time.perf_counter()
    out = generate(args.new_tokens)
    sync()
    wall = time.perf_counter() - t0
    if args.device == "cuda":
        torch.cuda.profiler.stop()
    print(json.dumps({
        "mode": args.mode, "batch": args.batch, "prompt": args.prompt, "new_tokens": out.shape[1] - args.prompt,
        "layers": cfg.num_hidden_layers, "warmup_s": round(warm_s, 3), "generate_s": round(wall, 4),
        "ms_per_token": round(1e3 * wall / max(args.new_tokens, 1), 3),
        "torch": torch.__version__, "annotate": os.environ.get("TRACEKIT_ANNOTATE_TORCH"),
    }), flush=True)


if __name__ == "__main__":
    main()
