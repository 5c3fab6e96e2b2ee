"""nsys-stats-compatible reports (``tracekit stats -r NAME``), one function per report.

:data:`REPORTS` maps each report name to ``module:function``; each function takes an
``NsysTrace`` and keyword options and returns a :class:`~tracekit.stats.common.Report`.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tracekit.stats.common import CONVENTIONS, Report

if TYPE_CHECKING:
    from tracekit.nsys.trace import NsysTrace

REPORTS: dict[str, str] = {
    "cuda_gpu_kern_sum": "tracekit.stats.summaries:cuda_gpu_kern_sum",
    "cuda_gpu_mem_time_sum": "tracekit.stats.summaries:cuda_gpu_mem_time_sum",
    "cuda_gpu_mem_size_sum": "tracekit.stats.summaries:cuda_gpu_mem_size_sum",
    "cuda_api_sum": "tracekit.stats.summaries:cuda_api_sum",
    "nvtx_sum": "tracekit.stats.summaries:nvtx_sum",
    "cuda_gpu_trace": "tracekit.stats.gpu_trace:cuda_gpu_trace",
    "nvtx_gpu_proj_trace": "tracekit.stats.nvtx_projection:nvtx_gpu_proj_trace",
    "nvtx_gpu_proj_sum": "tracekit.stats.nvtx_projection:nvtx_gpu_proj_sum",
    "nvtx_kern_sum": "tracekit.stats.nvtx_projection:nvtx_kern_sum",
    "cuda_kern_exec_sum": "tracekit.stats.launch:cuda_kern_exec_sum",
    "cuda_kern_exec_trace": "tracekit.stats.launch:cuda_kern_exec_trace",
}

#: Older report names nsys still accepts.
ALIASES = {"gpukernsum": "cuda_gpu_kern_sum", "cudaapisum": "cuda_api_sum", "gputrace": "cuda_gpu_trace",
           "gpumemtimesum": "cuda_gpu_mem_time_sum", "gpumemsizesum": "cuda_gpu_mem_size_sum", "nvtxsum": "nvtx_sum"}


#: Reports that join kernels to the CUDA calls that launched them, and read only those calls
#: on a cold export with several calls per kernel (``every_call=False``).
LAUNCH_REPORTS = frozenset({"cuda_kern_exec_sum", "cuda_kern_exec_trace"})
#: Reports that read every CUDA call (through the column cache on a big export).
CALL_READERS = frozenset({"cuda_api_sum", "nvtx_gpu_proj_trace", "nvtx_gpu_proj_sum", "nvtx_kern_sum"})


def report_options(names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Options for :func:`run_report` of each of ``names`` run in turn on one trace: a
    :data:`LAUNCH_REPORTS` report followed by one that reads every CUDA call reads every call
    too (its column scan fills the cache the later one reads, as before they read only the
    launches); else none (a reader before it has filled the cache already, with what it needs)."""
    bases = [ALIASES.get(n.partition(":")[0], n.partition(":")[0]) for n in names]
    later = [bool(set(bases[i + 1:]) & CALL_READERS) for i in range(len(bases))]
    return {n: ({"every_call": True} if b in LAUNCH_REPORTS and after else {}) for n, b, after in zip(names, bases, later, strict=True)}


#: ``report:variant`` names nsys accepts: the kernel-name column of ``cuda_gpu_kern_sum``.
VARIANTS: dict[str, tuple[str, ...]] = {"cuda_gpu_kern_sum": ("demangled", "base", "mangled")}


def available_reports() -> list[str]:
    """Names of the reports whose implementation is importable."""
    names = []
    for name, target in REPORTS.items():
        module = target.split(":")[0]
        try:
            importlib.import_module(module)
        except ImportError:
            continue
        names.append(name)
    return names


def run_report(trace: NsysTrace, name: str, *, convention: str = "2025", **options: Any) -> Report:
    """Compute report ``name`` (``"cuda_gpu_kern_sum"``, ``"cuda_api_sum"`` …) on ``trace``."""
    from tracekit.errors import UnsupportedReportError

    base, _, variant = name.partition(":")
    base = ALIASES.get(base, base)
    if base not in REPORTS:
        msg = f"unknown report {name!r}; available: {', '.join(available_reports())}"
        raise UnsupportedReportError(msg)
    if convention not in CONVENTIONS:
        msg = f"unknown rounding convention {convention!r}; use one of {', '.join(CONVENTIONS)}"
        raise UnsupportedReportError(msg)
    if variant:
        allowed = VARIANTS.get(base, ())
        if variant not in allowed:
            takes = f"use {' or '.join(f'{base}:{v}' for v in allowed)}" if allowed else "it takes none"
            msg = f"report {base} has no variant {variant!r}; {takes}"
            raise UnsupportedReportError(msg)
        options.setdefault("name", variant)
    module, func = REPORTS[base].split(":")
    try:
        fn = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError):
        msg = f"report {base} is not implemented in this version of tracekit"
        raise UnsupportedReportError(msg) from None
    return fn(trace, convention=convention, **options)


__all__ = ["REPORTS", "Report", "available_reports", "run_report"]
