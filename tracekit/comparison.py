"""``tracekit.diff(before, after)``: did my change help? Per kernel, family, NVTX range and step,
the per-step GPU time of two runs with a verdict against the step-to-step noise.

Each run's steady steps come from the diagnosis' window (NVTX ``step|iter`` ranges, else the
repeating kernel sequence; warm-up excluded: :mod:`tracekit.diagnosis.window`). A GPU operation
belongs to the step whose CPU range holds its launch call (NVTX steps), or whose GPU span holds
its start (steps found from the kernel sequence). Without steps the whole trace is one step and
a fixed threshold decides. The statistic is :func:`tracekit.analysis.compare.compare_per_step`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from tracekit.analysis.attribution import attribute_nvtx
from tracekit.analysis.compare import compare_per_step
from tracekit.analysis.families import with_family
from tracekit.diagnosis.window import steady_ops

__all__ = ["LEVELS", "Diff", "diff"]

#: What a diff compares: kernel names, kernel families, innermost NVTX ranges (GPU time of
#: the work launched inside), and per-step totals (``step_time``: the iteration's length;
#: ``gpu_time``: summed GPU operation time; ``kernels``: kernel launches).
LEVELS = ("kernel", "family", "range", "step")


def _level_values(trace: Any, level: str, ops: pl.DataFrame, steps_frame: pl.DataFrame | None) -> pl.DataFrame:
    kern = ops.filter(pl.col("op_kind") == "kernel") if "op_kind" in ops.columns else ops
    if level == "kernel":
        col = "name"
        if "short_name" not in kern.columns:
            short = trace.kernels.select("correlation_id", "short_name").unique("correlation_id")
            kern = kern.join(short, on="correlation_id", how="left")
            col = "short_name"
        return kern.select("step", pl.coalesce(col, "name").alias("key"), pl.col("duration_ns").alias("value"))
    if level == "family":
        return with_family(kern).select("step", pl.col("family").alias("key"), pl.col("duration_ns").alias("value"))
    if level == "range":
        nvtx = trace.nvtx
        if nvtx.height == 0:
            return pl.DataFrame(schema={"step": pl.Int64, "key": pl.Utf8, "value": pl.Int64})
        att = attribute_nvtx(ops, nvtx)
        return att.select("step", pl.col("nvtx_range").fill_null("(none)").alias("key"), pl.col("duration_ns").alias("value"))
    # step metrics
    parts = [
        ops.group_by("step").agg(pl.col("duration_ns").sum().alias("value")).with_columns(pl.lit("gpu_time").alias("key")),
        kern.group_by("step").agg(pl.len().cast(pl.Int64).alias("value")).with_columns(pl.lit("kernels").alias("key")),
    ]
    if steps_frame is not None and steps_frame.height:
        parts.append(steps_frame.select("step", pl.lit("step_time").alias("key"), pl.col("length_ns").alias("value")))
    return pl.concat([p.select("step", "key", pl.col("value").cast(pl.Int64)) for p in parts])


@dataclass
class Diff:
    """The comparison of two runs: one frame per level (``kernel``, ``family``, ``range``,
    ``step``) with the columns of :func:`tracekit.analysis.compare.compare_per_step` (values
    in ns, ``kernels`` in launches), plus what each side's steps were."""

    before: str
    after: str
    levels: dict[str, pl.DataFrame]
    steps: dict[str, int]
    methods: dict[str, str]
    settings: dict[str, float] = field(default_factory=dict)

    def regressions(self, threshold: float = 0.05) -> pl.DataFrame:
        """Rows of every level that are ``slower`` by at least ``threshold`` (relative, per
        step); ``level`` says which table each comes from. Only times count (the step level's
        ``kernels`` count is reported, never a regression by itself)."""
        parts = [
            f.filter((pl.col("verdict") == "slower") & (pl.col("delta_pct").fill_null(float("inf")) >= threshold)
                     & ~((pl.lit(name) == "step") & (pl.col("key") == "kernels")))
            .with_columns(pl.lit(name).alias("level"))
            for name, f in self.levels.items()
        ]
        return pl.concat(parts, how="diagonal_relaxed") if parts else pl.DataFrame()

    def to_dict(self, threshold: float = 0.05) -> dict[str, Any]:
        return {
            "before": self.before, "after": self.after, "steps": self.steps, "step_source": self.methods,
            "settings": {**self.settings, "threshold": threshold},
            "levels": {k: v.to_dicts() for k, v in self.levels.items()},
            "regressions": self.regressions(threshold).to_dicts(),
        }

    def to_json(self, threshold: float = 0.05) -> str:
        return json.dumps(self.to_dict(threshold), indent=2, default=str)


def diff(
    before: Any,
    after: Any,
    *,
    levels: tuple[str, ...] = LEVELS,
    k: float = 3.0,
    min_effect: float = 0.02,
    fixed: float = 0.05,
) -> Diff:
    """Compare two runs (traces, trace sets or paths): see the module doc.

    Returns a :class:`Diff`; ``Diff.regressions(threshold)`` lists what got slower by at least
    ``threshold`` per step, ``tracekit diff`` exits 1 when that list is not empty.
    """
    from tracekit.opening import open as tk_open

    bad = [lv for lv in levels if lv not in LEVELS]
    if bad:
        from tracekit.errors import TracekitError

        msg = f"unknown level(s) {', '.join(bad)}; choose from {', '.join(LEVELS)}"
        raise TracekitError(msg)
    sides = {}
    for label, obj in (("before", before), ("after", after)):
        t = tk_open(os.fspath(obj)) if isinstance(obj, str | os.PathLike) else obj
        ops, steps, method = steady_ops(t)
        from tracekit.diagnosis.config import DiagnoseConfig
        from tracekit.diagnosis.context import Context
        from tracekit.diagnosis.window import steady_window

        sf = None
        if "step" in levels and method != "whole_trace":
            cfg = DiagnoseConfig(exact_steps=10**9, max_window_ops=10**12)
            c = Context(t, cfg)
            w = steady_window(c.ops, c.ops_with_launch, c.nvtx, cfg)
            sf = w.iterations.slice(w.warmup_steps).select(pl.col("iteration").cast(pl.Int64).alias("step"), "length_ns")
        sides[label] = (t, ops, steps, method, sf)
    out: dict[str, pl.DataFrame] = {}
    for level in levels:
        va = _level_values(sides["before"][0], level, sides["before"][1], sides["before"][4])
        vb = _level_values(sides["after"][0], level, sides["after"][1], sides["after"][4])
        out[level] = compare_per_step(va, vb, sides["before"][2], sides["after"][2], k=k, min_effect=min_effect, fixed=fixed)

    def name(obj: Any) -> str:
        return os.path.basename(str(getattr(obj, "path", obj)))

    return Diff(
        name(before), name(after), out,
        steps={"before": len(sides["before"][2]), "after": len(sides["after"][2])},
        methods={"before": sides["before"][3], "after": sides["after"][3]},
        settings={"k": k, "min_effect": min_effect, "fixed": fixed},
    )
