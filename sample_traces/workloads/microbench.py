"""Kernel microbenchmarks, as people write them to time one operation.

* ``--kind jax``: a jitted ``gelu(x @ w)`` (bf16, 4096 x 4096) timed over ``--reps`` calls,
  each followed by ``block_until_ready`` (after three warm-up calls, which compile).
* ``--kind triton``: the Triton tutorial's fused softmax against ``torch.softmax`` on a
  4096 x 8192 fp32 matrix, each timed with ``triton.testing.do_bench`` (which clears the L2
  between runs by zeroing a 256 MB buffer).

Nothing emits NVTX and nothing calls ``cudaProfilerStart``: the whole run is captured.
Prints the measured times as JSON (the ground truth for the tracekit reading).
"""

from __future__ import annotations

import argparse
import json
import time


def bench_jax(reps: int) -> dict:
    import jax
    import jax.numpy as jnp

    kx, kw = jax.random.split(jax.random.PRNGKey(0))
    x = jax.random.normal(kx, (4096, 4096), dtype=jnp.bfloat16)
    w = jax.random.normal(kw, (4096, 4096), dtype=jnp.bfloat16)
    f = jax.jit(lambda a, b: jax.nn.gelu(a @ b))
    for _ in range(3):
        f(x, w).block_until_ready()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f(x, w).block_until_ready()
        times.append(time.perf_counter() - t0)
    times.sort()
    return {"kind": "jax", "reps": reps, "median_us": round(1e6 * times[len(times) // 2], 2), "jax": jax.__version__}


def bench_triton() -> dict:
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def softmax_kernel(out_ptr, in_ptr, in_stride, out_stride, n_cols, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        x = tl.load(in_ptr + row * in_stride + cols, mask=cols < n_cols, other=-float("inf"))
        x = x - tl.max(x, axis=0)
        num = tl.exp(x)
        tl.store(out_ptr + row * out_stride + cols, num / tl.sum(num, axis=0), mask=cols < n_cols)

    def softmax(x):  # type: ignore[no-untyped-def]
        y = torch.empty_like(x)
        softmax_kernel[(x.shape[0],)](y, x, x.stride(0), y.stride(0), x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
        return y

    x = torch.randn(4096, 8192, device="cuda")
    assert torch.allclose(softmax(x), torch.softmax(x, dim=-1), atol=1e-6)
    ms_triton = triton.testing.do_bench(lambda: softmax(x))
    ms_torch = triton.testing.do_bench(lambda: torch.softmax(x, dim=-1))
    gbps = lambda ms: 2 * x.numel() * x.element_size() / (ms * 1e-3) / 1e9  # noqa: E731
    return {"kind": "triton", "triton_ms": round(ms_triton, 4), "torch_ms": round(ms_torch, 4),
            "triton_gbps": round(gbps(ms_triton), 1), "torch_gbps": round(gbps(ms_torch), 1), "triton": triton.__version__}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", choices=["jax", "triton"], required=True)
    ap.add_argument("--reps", type=int, default=500)
    args = ap.parse_args()
    print(json.dumps(bench_jax(args.reps) if args.kind == "jax" else bench_triton()), flush=True)


if __name__ == "__main__":
    main()
