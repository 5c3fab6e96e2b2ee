"""Built-in GPU peak table: the fallback when a report lacks ``.peak_sustained`` metrics.

Dense (no 2:4 sparsity) datasheet figures at NVIDIA's boost clocks, in TFLOP/s (tensor rates
with FP32 accumulate) and GB/s: datasheets quote sparse figures, these are half of them. Devices
are matched on the full name and, when known, the memory size (GH200 with 96 GB HBM3 or 144 GB
HBM3e, A100 40/80 GB, the NVL and PCIe cards kept apart from the SXM ones). Peaks read from a report (``<counter>.peak_sustained`` ×
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
    #: Per-direction bandwidth of the GPU's fastest peer link (GB/s): NVLink per GPU, else PCIe x16.
    link_gbps: float = 0.0
    min_memory_gb: float = 0.0
    max_memory_gb: float = 1e9


def _s(name: str, pattern: str, cc: str, sms: int, fp32: float, fp64: float, bw: float, mem: float,
       tensor: dict[str, float], link: float, min_mem: float = 0.0, max_mem: float = 1e9) -> GpuSpec:
    return GpuSpec(name, pattern, cc, sms, fp32, fp64, bw, mem, tensor, link, min_mem, max_mem)


_HOPPER = {"tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "fp64": 66.9}
_HOPPER_NVL = {"tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5, "fp64": 60.0}
_AMPERE = {"tf32": 156.0, "bf16": 312.0, "fp16": 312.0, "fp64": 19.5}

#: Most specific first: the first entry whose ``pattern`` matches the device name (and whose
#: memory range holds the device's memory, when it is known) is the GPU's.
GPU_SPECS: tuple[GpuSpec, ...] = (
    # GH200 96 GB HBM3 ("GH200 480GB": with 480 GB LPDDR5X) and 144 GB HBM3e ("GH200 624GB")
    _s("GH200 144GB HBM3e", r"GH200.*(?:144|624)", "9.0", 132, 66.9, 33.5, 4900.0, 144, _HOPPER, 450.0),
    _s("GH200 144GB HBM3e", r"GH200", "9.0", 132, 66.9, 33.5, 4900.0, 144, _HOPPER, 450.0, min_mem=120),
    _s("GH200 96GB HBM3", r"GH200", "9.0", 132, 66.9, 33.5, 4000.0, 96, _HOPPER, 450.0),
    _s("H200 NVL", r"H200.*NVL", "9.0", 132, 60.0, 30.0, 4800.0, 141, _HOPPER_NVL, 450.0),
    _s("H200 SXM", r"H200", "9.0", 132, 66.9, 33.5, 4800.0, 141, _HOPPER, 450.0),
    _s("H100 NVL", r"H100.*NVL", "9.0", 132, 60.0, 30.0, 3900.0, 94, _HOPPER_NVL, 300.0),
    _s("H100 PCIe", r"H100.*PCIe", "9.0", 114, 51.2, 25.6, 2000.0, 80,
       {"tf32": 378.0, "bf16": 756.0, "fp16": 756.0, "fp8": 1513.0, "fp64": 51.2}, 64.0),
    _s("H100 SXM5", r"H100", "9.0", 132, 66.9, 33.5, 3350.0, 80, _HOPPER, 450.0),
    _s("A100 PCIe 80GB", r"A100.*PCIE.*80|A100.*80\s*GB.*PCIe", "8.0", 108, 19.5, 9.7, 1935.0, 80, _AMPERE, 32.0),
    _s("A100 PCIe 40GB", r"A100.*PCIE", "8.0", 108, 19.5, 9.7, 1555.0, 40, _AMPERE, 32.0),
    _s("A100 SXM4 80GB", r"A100.*80\s*GB", "8.0", 108, 19.5, 9.7, 2039.0, 80, _AMPERE, 300.0),
    _s("A100 SXM4 80GB", r"A100", "8.0", 108, 19.5, 9.7, 2039.0, 80, _AMPERE, 300.0, min_mem=60),
    _s("A100 SXM4 40GB", r"A100", "8.0", 108, 19.5, 9.7, 1555.0, 40, _AMPERE, 300.0),
    _s("L40S", r"L40S", "8.9", 142, 91.6, 1.4, 864.0, 48,
       {"tf32": 183.0, "bf16": 362.0, "fp16": 362.0, "fp8": 733.0}, 32.0),
    _s("L4", r"\bL4\b", "8.9", 58, 30.3, 0.5, 300.0, 24,
       {"tf32": 60.0, "bf16": 121.0, "fp16": 121.0, "fp8": 242.5}, 32.0),
    _s("A10", r"\bA10G?\b", "8.6", 72, 31.2, 1.0, 600.0, 24, {"tf32": 62.5, "bf16": 125.0, "fp16": 125.0}, 32.0),
    _s("V100 PCIe", r"V100.*PCIE", "7.0", 80, 14.0, 7.0, 900.0, 32, {"fp16": 112.0}, 16.0),
    _s("V100 SXM2", r"V100", "7.0", 80, 15.7, 7.8, 900.0, 32, {"fp16": 125.0}, 150.0),
    _s("T4", r"\bT4\b", "7.5", 40, 8.1, 0.25, 320.0, 16, {"fp16": 65.0}, 16.0),
    _s("B200", r"B200", "10.0", 148, 75.0, 37.0, 8000.0, 180,
       {"tf32": 1100.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0, "fp4": 9000.0, "fp64": 37.0}, 900.0),
)


def find_spec(display_name: str | None, memory_bytes: int | float | None = None) -> GpuSpec | None:
    """The spec of a device: the first entry whose pattern matches ``display_name``
    (``"NVIDIA H100 80GB HBM3"``, ``"NVIDIA GH200 480GB"``) and, when ``memory_bytes`` is
    given, whose memory range holds it (GH200 96 GB vs 144 GB, A100 40 vs 80 GB). None when
    nothing matches."""
    if not display_name:
        return None
    gb = None if memory_bytes is None else float(memory_bytes) / 1e9
    for spec in GPU_SPECS:
        if not re.search(spec.pattern, display_name, flags=re.IGNORECASE):
            continue
        if gb is not None and not (spec.min_memory_gb <= gb <= spec.max_memory_gb):
            continue
        if gb is None and spec.min_memory_gb > 0:
            continue  # a memory-qualified entry needs the memory
        return spec
    return None


def dense_peaks(spec: GpuSpec, dtype: str) -> tuple[float, float]:
    """``(FLOP/s, bytes/s)`` of ``spec`` for ``dtype`` (``bf16``, ``fp16``, ``fp8``, ``int8`` …;
    ``fp32`` on the FP32 pipes): the dense Tensor Core peak of that precision, else of fp16,
    else FP32; DRAM bandwidth."""
    if dtype == "fp32":
        tf = spec.fp32_tflops
    else:
        key = {"int8": "fp8", "int4": "fp8", "fp4": "fp4"}.get(dtype, dtype)
        tf = spec.tensor_tflops.get(key) or spec.tensor_tflops.get("fp16") or spec.fp32_tflops
    return tf * 1e12, spec.bandwidth_gbps * 1e9


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
                "link_gbps": s.link_gbps,
            }
            for s in GPU_SPECS
        ]
    )
