"""Training steps of TinyLLM under ``torch.autograd.profiler.emit_nvtx(record_shapes=True)``.

Every PyTorch operator becomes an NVTX range (``aten::linear, seq = 12, op_id = 40,
sizes = [[4, 64, 1024], [3072, 1024]], ...``) around the module ranges ``layer.N`` >
``attn``/``mlp``. Backward kernels launch from autograd's own thread, which holds no
user ranges. Profiled steps sit between cudaProfilerStart/Stop.
"""

from __future__ import annotations

import argparse

import torch

from tinyllm import Config, TinyLLM, nvtx_pop, nvtx_push


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    args = p.parse_args()
    device = torch.device("cuda", 0)
    cfg = Config(layers=4)
    torch.manual_seed(0)
    model = TinyLLM(cfg).to(device=device, dtype=torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    tokens = torch.randint(0, cfg.vocab, (args.batch, args.seq + 1), device=device)
    for step in range(args.warmup + args.steps):
        profiled = step >= args.warmup
        if step == args.warmup:
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
        with torch.autograd.profiler.emit_nvtx(enabled=profiled, record_shapes=True):
            nvtx_push(f"step.{step - args.warmup}" if profiled else f"warmup.{step}")
            x = model.embed(tokens[:, :-1])
            for block in model.blocks:
                x = block(x, None, 0)
            logits = model.lm_head(model.norm(x))
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
            nvtx_push("backward")
            loss.backward()
            nvtx_pop()
            nvtx_push("optimizer")
            opt.step()
            opt.zero_grad(set_to_none=True)
            nvtx_pop()
            nvtx_pop()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(f"loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
