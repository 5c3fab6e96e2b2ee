"""Kernels for the Nsight Compute sample reports.

--mode full: one GEMM, one attention and one elementwise kernel, in NVTX ranges
             ``full/gemm``, ``full/attn``, ``full/elementwise``.
--mode int8: an INT8 GEMM (``torch._int_mm``) and a bf16 one, in ranges ``int8/<name>``.
--mode prec: GEMMs in bf16, fp16, tf32, fp8 (e4m3, ``torch._scaled_mm``), fp64 and a plain
             fp32 (SIMT, TF32 off) GEMM, in ranges ``prec/<precision>``.
Each is run once first, outside any range, so that ncu sees the steady-state kernel
choice; only the measured call sits inside ``<mode>/<name>`` (input set-up and warm-up
stay outside, so ``--nvtx-include "<mode>/"`` selects only the measured kernels).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F


def rng(outer: str, name: str, fn) -> None:
    fn()  # warm-up outside the ranges
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(outer)
    torch.cuda.nvtx.range_push(name)
    fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    torch.cuda.nvtx.range_pop()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["full", "prec", "int8"], required=True)
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
        rng("full", "gemm", lambda: a @ b)
        rng("full", "attn", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        rng("full", "elementwise", lambda: F.silu(x))
    elif args.mode == "int8":
        # an INT8 tensor-core GEMM (cuBLASLt IGEMM, int32 accumulate) next to a bf16 one
        a8 = torch.randint(-8, 8, (n, n), device=dev, dtype=torch.int8)
        b8 = torch.randint(-8, 8, (n, n), device=dev, dtype=torch.int8)
        rng("int8", "imma", lambda: torch._int_mm(a8, b8))
        a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        rng("int8", "bf16", lambda: a @ a)
    else:
        for name, dtype in [("bf16", torch.bfloat16), ("fp16", torch.float16)]:
            a = torch.randn(n, n, device=dev, dtype=dtype)
            b = torch.randn(n, n, device=dev, dtype=dtype)
            rng("prec", name, lambda a=a, b=b: a @ b)
        a = torch.randn(n, n, device=dev)
        b = torch.randn(n, n, device=dev)
        torch.backends.cuda.matmul.allow_tf32 = True
        rng("prec", "tf32", lambda: a @ b)
        torch.backends.cuda.matmul.allow_tf32 = False
        rng("prec", "fp32_simt", lambda: a @ b)
        a8 = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn)
        b8 = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn)
        one = torch.ones((), device=dev)
        rng("prec", "fp8", lambda: torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
        a64 = torch.randn(2048, 2048, device=dev, dtype=torch.float64)
        rng("prec", "fp64", lambda: a64 @ a64)
    print("done", args.mode)


if __name__ == "__main__":
    main()
