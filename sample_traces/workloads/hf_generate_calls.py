"""Hugging Face ``generate()`` called several times in a benchmark loop, as people time models.

The model is ``hf_generate.build`` (Qwen3-0.6B's public config, random bf16 weights,
``--layers`` deep; nothing downloaded). ``--calls`` calls of ``generate()`` on the same batch:
the first is the warm-up (cold: cuBLAS and cuDNN heuristics, the caching allocator's first
blocks), the others are measured. EOS is disabled (``min_new_tokens`` = ``max_new_tokens``).
Nothing emits NVTX unless the run is captured with ``--annotate-torch`` (then every module's
forward is a range) and nothing calls ``cudaProfilerStart``: the whole run is captured, model
construction included.

Prints one JSON line per call (``call``, ``s``: wall time of the call, ``ttft_ms``: until
``generate()`` hands its first new token to a streamer, which copies it to the host, and
``tpot_ms``: the rest of the call per further token) and a summary.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from hf_generate import build


class FirstToken:
    """A ``generate()`` streamer that notes when the first new token is handed out."""

    def __init__(self) -> None:
        self.calls = 0
        self.first_at: float | None = None

    def put(self, value) -> None:  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.calls == 2 and self.first_at is None:  # the first put is the prompt
            self.first_at = time.perf_counter()

    def end(self) -> None:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=3, help="generate() calls; the first is the warm-up")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()

    model, cfg = build(args.layers, args.device, torch.bfloat16)
    gen = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.prompt), generator=gen).to(args.device)
    mask = torch.ones_like(ids)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    rows = []
    for call in range(args.calls):
        streamer = FirstToken()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=args.new_tokens,
                                 min_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0, streamer=streamer)
        sync()
        s = time.perf_counter() - t0
        ttft = (streamer.first_at - t0) if streamer.first_at else None
        n = out.shape[1] - args.prompt
        row = {"call": call, "warmup": call == 0, "s": round(s, 4), "new_tokens": n,
               "ttft_ms": round(1e3 * ttft, 3) if ttft else None,
               "tpot_ms": round(1e3 * (s - ttft) / max(n - 1, 1), 3) if ttft else None}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(json.dumps({"calls": rows, "batch": args.batch, "prompt": args.prompt, "layers": cfg.num_hidden_layers,
                      "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
