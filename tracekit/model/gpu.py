"""The GPU a trace ran on, as the model's peaks need it (:mod:`tracekit.ncu.specs`)."""

from __future__ import annotations

from typing import Any

import polars as pl

from tracekit.ncu.specs import GpuSpec, find_spec

__all__ = ["gpu_of"]


def gpu_of(trace: Any, gpu: Any) -> Any:
    """``gpu`` as a spec (a name looked up, a spec or an Nsight Compute report kept as they
    are), or without one the spec of the trace's first GPU (name and memory); ``None`` when
    unknown."""
    if isinstance(gpu, GpuSpec) or (gpu is not None and hasattr(gpu, "metrics")):
        return gpu  # a spec, or an NcuReport whose measured peaks are used
    if isinstance(gpu, str):
        return find_spec(gpu)
    g = getattr(trace, "gpus", pl.DataFrame())
    if g.height == 0:
        return None
    row = g.row(0, named=True)
    return find_spec(row.get("name"), row.get("total_memory_bytes"))
