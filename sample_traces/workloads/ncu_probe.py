"""Kernels for the Nsight Compute sample reports.

--mode full: one GEMM, one attention and one elementwise kernel, in NVTX ranges
             ``full/gemm``, ``full/attn``, ``full/elementwise``.
--mode prec: GEMMs in bf16, fp16, tf32, fp8 (e4m3, ``torch._scaled_mm``), fp64 and a plain
             fp32 (SIMT, TF32 off) GEMM, in ranges ``prec/<precision>``.
Each is run once untimed first so that ncu sees the steady-state kernel choice.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F


def rng(name: str, fn) -> None:
    fn()  # warm-up outside the range
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(name)
    fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["full", "prec"], required=True)
    p.add_argument("--n", type=int, default=4096)
    args = p.parse_args()
    torch.manual_seed(0)
    dev = "cuda"
    n = args.n
    if args.mode == "full":
        a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        q = torch.randn(4, 16, 1024, 64, device=dev, dtype=torch.bfloat16)
        k = torch.randn_like(q)
        v = torch.randn_like(q)
        x = torch.randn(1 << 24, device=dev, dtype=torch.bfloat16)
        torch.cuda.nvtx.range_push("full")
        rng("gemm", lambda: a @ b)
        rng("attn", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        rng("elementwise", lambda: F.silu(x))
        torch.cuda.nvtx.range_pop()
    else:
        torch.cuda.nvtx.range_push("prec")
        for name, dtype in [("bf16", torch.bfloat16), ("fp16", torch.float16)]:
            a = torch.randn(n, n, device=dev, dtype=dtype)
            b = torch.randn(n, n, device=dev, dtype=dtype)
            rng(name, lambda a=a, b=b: a @ b)
        a = torch.randn(n, n, device=dev)
        b = torch.randn(n, n, device=dev)
        torch.backends.cuda.matmul.allow_tf32 = True
        rng("tf32", lambda: a @ b)
        torch.backends.cuda.matmul.allow_tf32 = False
        rng("fp32_simt", lambda: a @ b)
        a8 = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn)
        b8 = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn)
        one = torch.ones((), device=dev)
        rng("fp8", lambda: torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
        a64 = torch.randn(2048, 2048, device=dev, dtype=torch.float64)
        rng("fp64", lambda: a64 @ a64)
        torch.cuda.nvtx.range_pop()
    print("done", args.mode)


if __name__ == "__main__":
    main()
