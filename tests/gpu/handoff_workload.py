"""GPU workload for the nsys -> ncu handoff test: the most frequent kernel is not the longest.

Each step (NVTX range ``step.<i>``) first launches ``--small`` tiny in-place multiplies of a
1 Mi-element fp32 vector (``vectorized_elementwise_kernel``, a few microseconds each), then
``--gemms`` bf16 and ``--gemms`` fp16 ``--n``-cubed matrix products (two different cuBLAS
kernels, ~0.2 ms each on an H100). The elementwise kernel comes first in every step and
launches ~100 times as often as each GEMM, so one ``--launch-count`` shared by the three
kernels goes to it. The steps run between cudaProfilerStart and cudaProfilerStop (nsys
``--capture-range=cudaProfilerApi``) after ``--warmup`` untraced steps.

    python3 tests/gpu/handoff_workload.py [--steps 3] [--small 512] [--gemms 4] [--n 4096]
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--small", type=int, default=512, help="elementwise launches per step")
    parser.add_argument("--gemms", type=int, default=4, help="GEMMs per precision per step")
    parser.add_argument("--n", type=int, default=4096, help="GEMM size (n x n x n)")
    args = parser.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    x = torch.ones(1 << 20, device=dev, dtype=torch.float32)
    a16 = torch.randn(args.n, args.n, device=dev, dtype=torch.bfloat16)
    b16 = torch.randn(args.n, args.n, device=dev, dtype=torch.bfloat16)
    c16 = torch.empty(args.n, args.n, device=dev, dtype=torch.bfloat16)
    ah = a16.to(torch.float16)
    bh = b16.to(torch.float16)
    ch = torch.empty(args.n, args.n, device=dev, dtype=torch.float16)

    def step() -> None:
        for _ in range(args.small):
            x.mul_(1.0001)
        for _ in range(args.gemms):
            torch.matmul(a16, b16, out=c16)
        for _ in range(args.gemms):
            torch.matmul(ah, bh, out=ch)

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.cuda.cudart().cudaProfilerStart()
    for i in range(args.steps):
        torch.cuda.nvtx.range_push(f"step.{i}")
        step()
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"{args.steps} steps in {time.perf_counter() - t0:.3f} s; x[0] = {x[0].item():.4f}")


if __name__ == "__main__":
    main()
