"""Built-in GPU peak table: the fallback when a report lacks ``.peak_sustained`` metrics.

Dense (no 2:4 sparsity) datasheet figures at NVIDIA's boost clocks, in TFLOP/s (tensor rates
with FP32 accumulate) and GB/s. Peaks read from a report (``<counter>.peak_sustained`` ×
measured clock) are preferred: they match the exact SKU and the clock the kernel ran at,
whereas these numbers assume the datasheet clock (H100: 1.83 GHz for tensor rates, 1.98 GHz
for FP32/FP64). Sources are listed in ``/docs/ncu.md``; B200 figures vary by SKU and were not
measured.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import polars as pl


@dataclass(frozen=True)
class GpuSpec:
    """Peak rates of one GPU model. ``tensor_tflops`` maps precision → dense TFLOP/s."""

    name: str
    pattern: str
    compute_capability: str
    sm_count: int
    fp32_tflops: float
    fp64_tflops: float
    bandwidth_gbps: float
    memory_gb: float
    tensor_tflops: dict[str, float] = field(default_factory=dict)


GPU_SPECS: tuple[GpuSpec, ...] = (
    GpuSpec(
        "H100 PCIe",
        r"H100.*PCIe",
        "9.0",
        114,
        51.0,
        26.0,
        2000.0,
        80,
        {"tf32": 378.0, "bf16": 756.0, "fp16": 756.0, "fp8": 1513.0, "fp64": 51.0},
    ),
    GpuSpec(
        "H200 SXM",
        r"H200",
        "9.0",
        132,
        66.9,
        33.5,
        4800.0,
        141,
        {"tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "fp64": 66.9},
    ),
    GpuSpec(
        "H100 SXM5",
        r"H100",
        "9.0",
        132,
        66.9,
        33.5,
        3350.0,
        80,
        {"tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "fp64": 66.9},
    ),
    GpuSpec(
        "A100 SXM4 80GB",
        r"A100.*80\s*GB",
        "8.0",
        108,
        19.5,
        9.7,
        2039.0,
        80,
        {"tf32": 156.0, "bf16": 312.0, "fp16": 312.0, "fp64": 19.5},
    ),
    GpuSpec(
        "A100 SXM4 40GB",
        r"A100",
        "8.0",
        108,
        19.5,
        9.7,
        1555.0,
        40,
        {"tf32": 156.0, "bf16": 312.0, "fp16": 312.0, "fp64": 19.5},
    ),
    GpuSpec(
        "L40S",
        r"L40S",
        "8.9",
        142,
        91.6,
        1.4,
        864.0,
        48,
        {"tf32": 183.0, "bf16": 362.0, "fp16": 362.0, "fp8": 733.0},
    ),
    GpuSpec("V100 SXM2", r"V100", "7.0", 80, 15.7, 7.8, 900.0, 32, {"fp16": 125.0}),
    GpuSpec("T4", r"\bT4\b", "7.5", 40, 8.1, 0.25, 320.0, 16, {"fp16": 65.0}),
    GpuSpec(
        "B200",
        r"B200",
        "10.0",
        148,
        75.0,
        37.0,
        8000.0,
        180,
        {
            "tf32": 1100.0,
            "bf16": 2250.0,
            "fp16": 2250.0,
            "fp8": 4500.0,
            "fp4": 9000.0,
            "fp64": 37.0,
        },
    ),
)


def find_spec(display_name: str | None) -> GpuSpec | None:
    """The first spec whose pattern matches ``display_name`` (``"NVIDIA H200"``), else None."""
    if not display_name:
        return None
    for spec in GPU_SPECS:
        if re.search(spec.pattern, display_name, flags=re.IGNORECASE):
            return spec
    return None


def tensor_peak_tflops(spec: GpuSpec, precision: str | None) -> float | None:
    """Dense tensor TFLOP/s for an ``sm__ops_path_tensor_src_<precision>`` label.

    Combined labels (``fp4_fp6_fp8``, ``fp16_bf16_tf32``) take the rate of their widest type.
    """
    if not precision:
        return None
    if precision in spec.tensor_tflops:
        return spec.tensor_tflops[precision]
    for key in ("fp64", "tf32", "fp16", "bf16", "fp8", "fp6", "fp4"):
        if key in precision.split("_") and key in spec.tensor_tflops:
            return spec.tensor_tflops[key]
    return None


def spec_table() -> pl.DataFrame:
    """The built-in table as a frame (one row per GPU; tensor rates as ``tensor_<p>_tflops``)."""
    precisions = sorted({p for s in GPU_SPECS for p in s.tensor_tflops})
    return pl.DataFrame(
        [
            {
                "name": s.name,
                "pattern": s.pattern,
                "compute_capability": s.compute_capability,
                "sm_count": s.sm_count,
                "fp32_tflops": s.fp32_tflops,
                "fp64_tflops": s.fp64_tflops,
                **{f"tensor_{p}_tflops": s.tensor_tflops.get(p) for p in precisions},
                "bandwidth_gbps": s.bandwidth_gbps,
                "memory_gb": s.memory_gb,
            }
            for s in GPU_SPECS
        ]
    )
