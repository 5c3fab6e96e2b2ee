"""Thresholds of the diagnosis rules: one dataclass, documented per field, overridable."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from tracekit.analysis.run.iterations import DEFAULT_ITERATION_PATTERN
from tracekit.errors import TracekitError

__all__ = ["DiagnoseConfig"]


@dataclass(frozen=True)
class DiagnoseConfig:
    """Every threshold a rule uses. Shares are fractions of the steady-state window (0–1).

    Change one with ``DiagnoseConfig(high_share=0.3)`` or, from the CLI,
    ``tracekit diagnose FILE --set high_share=0.3``.
    """

    #: An iteration pattern for NVTX step ranges (case-insensitive regex): by default
    #: step, iter, iteration, batch, epoch, decode or forward as a word
    #: (:func:`tracekit.analysis.run.iterations.word_pattern` makes one of other words).
    iteration_pattern: str = DEFAULT_ITERATION_PATTERN
    #: A leading iteration is warm-up when it takes more than this times the median of the
    #: iterations after it (CPU range or GPU span, whichever is longer).
    warmup_factor: float = 1.5
    #: Not read any more (the period search it tuned gave way to the kernel loop,
    #: :mod:`tracekit.analysis.run.loops`); kept so that code that sets it still runs.
    period_match: float = 0.95
    #: Fewest iterations of a loop (kernel loop, CUDA graph replays).
    min_repeats: int = 3
    #: Not read any more, as ``period_match``.
    period_coverage: float = 0.5
    #: Big traces: with more steady iterations than this, iterations are measured for the
    #: first 50 (warm-up), the last two and the sample only.
    exact_steps: int = 400
    #: Big traces: the rules run on this many consecutive steady iterations from the middle of
    #: the window when the window holds more than ``max_window_ops`` GPU operations.
    sample_steps: int = 100
    #: Big traces: above this many GPU operations in the window, the rules run on a sample.
    max_window_ops: int = 200_000
    #: Severity from the share of the window at stake: high / medium / low at or above these.
    high_share: float = 0.20
    medium_share: float = 0.05
    low_share: float = 0.01
    #: Idle gaps shorter than this are not looked at (ns).
    min_gap_ns: int = 10_000
    #: launch_bound: a kernel shorter than this is "short" (ns).
    short_kernel_ns: int = 20_000
    #: launch_bound: a stretch needs this many starved short kernels in a row.
    min_stretch_kernels: int = 10
    #: no_tensor_cores: a GEMM kernel with Tensor Active below this (0–1) runs without tensor cores.
    tensor_active_min: float = 0.02
    #: no_tensor_cores: assumed speed-up of moving a SIMT fp32 GEMM to tensor cores when the
    #: GPU's peaks are unknown (time at stake = time × (1 − 1/speedup)).
    tensor_speedup: float = 2.0
    #: memory_growth: growth per step below this many bytes is ignored.
    growth_min_bytes: int = 1 << 20
    #: memory_growth: share of step-to-step changes that must be increases.
    growth_monotonic: float = 0.75
    #: memory_growth: high severity when the projected OOM is within this many steps.
    oom_high_steps: int = 100_000
    #: low_gpu_utilization: reported when idle is at least this share of the window and the
    #: other idle causes explain less than half of it.
    idle_share: float = 0.20
    #: straggler: a rank that starts last in at least this share of collectives (with two ranks
    #: chance alone makes one last half of the time).
    straggler_share: float = 0.6
    #: load_imbalance: (max − min) / max of per-rank compute time at or above this.
    imbalance_min: float = 0.10
    #: data_movement: copy/concat/cast/layout kernels at or above this share of the window's
    #: GPU time (0–1) are reported.
    data_movement_share: float = 0.15
    #: ncu: kernels that make up this share of the window's kernel time are checked.
    ncu_top_share: float = 0.8
    #: ncu / model: a kernel or layer reaching less than this share of its bound is reported.
    efficiency_min: float = 0.5

    def severity(self, share: float | None) -> str | None:
        """``high``/``medium``/``low`` for a share of the window, ``None`` below ``low_share``."""
        if share is None:
            return None
        if share >= self.high_share:
            return "high"
        if share >= self.medium_share:
            return "medium"
        if share >= self.low_share:
            return "low"
        return None

    def with_overrides(self, items: dict[str, Any] | list[str]) -> DiagnoseConfig:
        """A copy with fields replaced, from a mapping or ``["name=value", …]`` (typed like the field)."""
        pairs: dict[str, Any] = {}
        raw: dict[str, Any] = {}
        if isinstance(items, list):
            for item in items:
                key, _, value = item.partition("=")
                raw[key.strip()] = value.strip()
        else:
            raw = dict(items)
        types: dict[str, type] = {f.name: type(getattr(self, f.name)) for f in fields(self)}
        for key, value in raw.items():
            if key not in types:
                msg = f"unknown diagnosis setting {key!r}; valid: {', '.join(sorted(types))}"
                raise TracekitError(msg)
            try:
                pairs[key] = types[key](value) if isinstance(value, str) else value
            except ValueError:
                msg = f"diagnosis setting {key}={value!r} is not a {types[key].__name__}"
                raise TracekitError(msg) from None
        return replace(self, **pairs)
