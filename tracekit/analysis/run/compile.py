"""Compilation and autotuning before the steady steps: what ``torch.compile`` (Inductor,
Triton) and autotuners leave in a trace's start-up and warm-up.

Every kernel that a JIT compiler builds at run time reaches the GPU through a module load
(``cuModuleLoad*``, ``cuLibraryLoad*``: Triton loads each compiled kernel so); Inductor names
its kernels ``triton_<kind>_…``. Autotuning runs each candidate kernel a few times and then only
the chosen one: a Triton kernel first run while modules were being loaded, at least twice, and
never in or after the steady window was a candidate benchmarked and dropped (Inductor's
``max-autotune`` templates, ``triton_tem_…``; the cuBLAS candidates it also times carry library
names that steady steps run too, and are not counted).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

__all__ = ["LOAD_CALLS", "TRITON_KERNELS", "CompileWarmup", "compile_warmup"]

#: CUDA driver calls that load a module (a JIT-compiled kernel, a library's kernels).
LOAD_CALLS = r"^cu(?:Module|Library)Load"
#: Kernel names Inductor gives the Triton kernels it generates (``triton_poi_fused_…``,
#: ``triton_per_…``, ``triton_red_…``, ``triton_tem_…``, ``triton_for_…``) and Triton's own.
TRITON_KERNELS = r"^triton_"


@dataclass(frozen=True)
class CompileWarmup:
    """What :func:`compile_warmup` found before the steady window (times in ns)."""

    #: Module loads before the window, the first and last one's start, the time spent inside them.
    loads: int
    first_load_ns: int | None
    last_load_ns: int | None
    load_call_ns: int
    #: Distinct Triton kernels (Inductor's) first run before the window.
    triton_kernels: int
    #: Kernels run only before the window, at least twice each (autotuning's dropped candidates),
    #: and their launches.
    autotune_candidates: int
    autotune_launches: int

    @property
    def span_ns(self) -> int:
        """From the first module load to the last one before the window."""
        if self.first_load_ns is None or self.last_load_ns is None:
            return 0
        return self.last_load_ns - self.first_load_ns

    def sentence(self) -> str:
        """One clause for a finding, ``""`` when nothing was compiled."""
        parts = []
        if self.triton_kernels:
            parts.append(f"torch.compile/Triton built {self.triton_kernels} kernels before the steady steps "
                         f"({self.loads} module loads over {_s(self.span_ns)})")
        elif self.loads:
            parts.append(f"{self.loads} module loads over {_s(self.span_ns)} before the steady steps (kernels loaded or compiled)")
        if self.autotune_candidates:
            parts.append(f"autotuning launched {self.autotune_launches:,} candidate kernels ({self.autotune_candidates} Triton "
                         "kernel name(s): the configurations of a template share one) that the steady steps never run")
        return "; ".join(parts)


def _s(ns: int) -> str:
    return f"{ns / 1e9:.2f} s" if ns >= 1e8 else f"{ns / 1e6:.1f} ms"


def compile_warmup(loads: pl.DataFrame, kernels: pl.DataFrame, *, window_start_ns: int) -> CompileWarmup:
    """Compilation and autotuning before ``window_start_ns`` (the steady window's start).

    Parameters
    ----------
    loads
        Module-load calls (:data:`LOAD_CALLS`): ``start_ns``, ``end_ns``.
    kernels
        Per kernel name: ``name``, ``first_ns`` (first start), ``before`` (launches starting
        before the window), ``after`` (launches starting at or after it); only the names of
        :data:`TRITON_KERNELS` are read, so a caller may pass those alone.
    window_start_ns
        The steady window's start (ns, the capture's clock).
    """
    early = loads.filter(pl.col("start_ns") < window_start_ns) if loads.height else loads
    n = early.height
    first = int(early["start_ns"].min()) if n else None  # type: ignore[arg-type]
    last = int(early["start_ns"].max()) if n else None  # type: ignore[arg-type]
    inside = int((early["end_ns"] - early["start_ns"]).sum()) if n else 0
    triton = kernels.filter(pl.col("name").str.contains(TRITON_KERNELS) & (pl.col("first_ns") < window_start_ns)).height \
        if kernels.height else 0
    # candidates run while the compiler loads modules (model set-up before it, e.g. weight
    # initialisation, also runs kernels only once but is no autotuning)
    dropped = kernels.filter(pl.col("name").str.contains(TRITON_KERNELS) & (pl.col("after") == 0) & (pl.col("before") >= 2)
                             & (pl.col("first_ns") >= (first or 0))
                             & (pl.col("first_ns") <= (last or 0))) if kernels.height and n else kernels.head(0)
    return CompileWarmup(n, first, last, inside, triton, dropped.height, int(dropped["before"].sum()) if dropped.height else 0)
