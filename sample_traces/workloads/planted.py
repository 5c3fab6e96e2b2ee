"""Small GPU workloads with one planted performance problem each, for tracekit's diagnosis tests.

    python3 planted.py --problem clean|clean_nonvtx|host_bound|launch_bound|sync_stall|
                                 pageable_memcpy|no_tensor_cores|memory_growth [--steps 12]

Every variant runs the same shape of loop: ``steps`` iterations of a 4-layer MLP stack
(``x -> norm -> up -> gelu -> down -> residual``), bf16, on one GPU, each iteration in an
NVTX range ``step.N`` with ``layer.K`` ranges inside (``clean_nonvtx`` has no NVTX ranges at
all, so iterations must be found from the repeating kernel sequence). The first iteration is
captured too: it pays for cuBLAS start-up and is the warm-up that the diagnosis excludes.
Only ``clean`` and ``clean_nonvtx`` are meant to be well-behaved: the GPU is kept busy by
large GEMMs queued ahead of it and the host synchronises once, after the loop.

Planted problems (the rest of the loop as in ``clean``):

``host_bound``
    before each step the host spends ~3 ms in Python (range ``prepare_batch``) while the
    GPU has ~1 ms of work queued: the GPU idles ~2 ms per step outside CUDA calls.
``launch_bound``
    tiny tensors (8 x 256) and 60 elementwise ops per layer: ~500 kernels of a few
    microseconds per step, launch calls take longer than the kernels.
``sync_stall``
    after every layer ``x.abs().max().item()`` (a NaN check): a synchronous device->host
    copy per layer; the host waits for the layer, the GPU drains and waits for the host to
    launch again.
``pageable_memcpy``
    each step uploads a 32 MiB batch from pageable numpy memory (``torch.from_numpy(a).cuda()``):
    a synchronous, staged host->device copy.
``no_tensor_cores``
    the layers run in fp32 with TF32 disabled: the GEMMs are SIMT ``sgemm`` kernels.
``memory_growth``
    each step keeps a reference to a new 64 MiB activation buffer (a list that grows, as when
    outputs are accumulated with their graph): device memory in use rises every step.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F

PROBLEMS = (
    "clean", "clean_nonvtx", "host_bound", "launch_bound", "sync_stall",
    "pageable_memcpy", "no_tensor_cores", "memory_growth",
)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--problem", choices=PROBLEMS, default="clean")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--profile-range", action="store_true",
                   help="cudaProfilerStart/Stop around the loop (nsys --capture-range=cudaProfilerApi)")
    args = p.parse_args()
    prob = args.problem
    nvtx = prob != "clean_nonvtx"

    def push(name: str) -> None:
        if nvtx:
            torch.cuda.nvtx.range_push(name)

    def pop() -> None:
        if nvtx:
            torch.cuda.nvtx.range_pop()

    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    if prob == "launch_bound":
        tokens, hidden, ffn = 8, 256, 512
    else:
        tokens, hidden, ffn = 2048, 2048, 8192
    dtype = torch.float32 if prob == "no_tensor_cores" else torch.bfloat16
    if prob == "no_tensor_cores":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        tokens, hidden, ffn = 1024, 1024, 4096
    w_up = [torch.randn(hidden, ffn, device=dev, dtype=dtype) * 0.02 for _ in range(args.layers)]
    w_down = [torch.randn(ffn, hidden, device=dev, dtype=dtype) * 0.02 for _ in range(args.layers)]
    x0 = torch.randn(tokens, hidden, device=dev, dtype=dtype)
    batch_host = np.random.default_rng(0).standard_normal((4096, 2048), dtype=np.float32)  # 32 MiB
    kept: list[torch.Tensor] = []
    checks = 0.0

    if args.profile_range:
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
    with torch.inference_mode():
        for step in range(args.steps):
            push(f"step.{step}")
            if prob == "host_bound":
                push("prepare_batch")
                t_end = time.perf_counter() + 0.003
                acc = 0
                while time.perf_counter() < t_end:  # tokenisation / batching in Python
                    acc += sum(range(200))
                pop()
            if prob == "pageable_memcpy":
                push("upload_batch")
                upload = torch.from_numpy(batch_host).to(dev)  # pageable: staged, synchronous
                pop()
                x = x0 + upload[: tokens, : hidden].to(dtype).mul_(1e-3)
            else:
                x = x0.clone()
            for layer in range(args.layers):
                push(f"layer.{layer}")
                if prob == "launch_bound":
                    h = x
                    for _ in range(30):
                        h = h * 1.0001
                        h = h + 0.0001
                    x = x + h
                else:
                    h = F.layer_norm(x, (hidden,))
                    h = F.gelu(h @ w_up[layer])
                    x = x + h @ w_down[layer]
                if prob == "sync_stall":
                    checks += x.abs().max().item()  # NaN check: device->host copy, host waits
                pop()
            if prob == "memory_growth":
                kept.append(torch.empty(64 << 20, dtype=torch.uint8, device=dev).fill_(step))
            pop()
        torch.cuda.synchronize()
    if args.profile_range:
        torch.cuda.profiler.stop()
    print(f"{prob}: {args.steps} steps done, x.sum={float(x.float().sum()):.3f}, kept={len(kept)}, checks={checks:.1f}")


if __name__ == "__main__":
    main()
