"""``tracekit.diff(before, after)``: did my change help? Per kernel, family, NVTX range and step,
the per-step GPU time of two runs with a verdict against the step-to-step noise.

Each run's steady steps come from the diagnosis' window (NVTX ``step|iter`` ranges, else the
repeating kernel sequence; warm-up excluded: :mod:`tracekit.diagnosis.window`). A GPU operation
belongs to the step range of its own process (rank, pid) whose CPU interval holds its launch
call (NVTX steps), or to the step whose GPU span holds its start (steps found from the kernel
sequence). Without steps the whole trace is one step and
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

__all__ = ["LEVELS", "Diff", "diff"]

#: What a diff compares: kernel names, kernel families, innermost NVTX ranges (GPU time of
#: the work launched inside), and per-step totals (``step_time``: the iteration's length;
#: ``gpu_time``: summed GPU operation time; ``kernels``: kernel launches).
LEVELS = ("kernel", "family", "range", "step")


@dataclass
class _Side:
    ops: pl.DataFrame
    steps: list[int]
    method: str
    step_lengths: pl.DataFrame | None
    #: labels of the NVTX step ranges themselves (``step.7``): one key per run, ``step.N``
    step_labels: list[str] = field(default_factory=list)


_EMPTY = {"step": pl.Int64, "key": pl.Utf8, "value": pl.Int64}


def _steady_steps(trace: Any) -> _Side:
    """The steady steps of one run and every GPU operation in them, with its ``step``.

    NVTX steps: an operation belongs to the step range *of its own process* (``rank``,
    ``pid``) whose CPU interval holds its launch call; steps are numbered per process, so
    step N of every rank or process is step N (operations of a process without step ranges
    fall back to the main process's ranges, by time). ``step_time`` of a step is its slowest
    process's length (CPU range or GPU span, the longer). Steps from the kernel sequence: an
    operation belongs to the step whose GPU span holds its start. Without steps every
    operation is in step 0.
    """
    from tracekit.analysis.iterations import iteration_ranges, iterations
    from tracekit.diagnosis.config import DiagnoseConfig
    from tracekit.diagnosis.context import Context
    from tracekit.diagnosis.window import steady_window

    cfg = DiagnoseConfig(exact_steps=10**9, max_window_ops=10**12)  # every step measured, no sampling
    ctx = Context(trace, cfg)
    w = steady_window(ctx.ops, ctx.ops_with_launch, ctx.nvtx, cfg, graph_launches=ctx.graph_launches)
    ops = ctx.ops_with_launch
    it = w.iterations
    if it.height == 0:
        return _Side(ops.with_columns(pl.lit(0, pl.Int64).alias("step")), [0], w.method, None)
    steady = it.slice(w.warmup_steps).select(
        pl.col("iteration").cast(pl.Int64).alias("step"), "start_ns", "end_ns", "w_start", "w_end", "length_ns"
    )
    numbers = steady["step"].to_list()
    if w.method != "nvtx":
        j = ops.sort("start_ns").join_asof(
            steady.select("step", pl.col("w_start").alias("start_ns"), pl.col("w_end").alias("_e")).sort("start_ns"),
            on="start_ns", strategy="backward",
        ).filter(pl.col("step").is_not_null() & (pl.col("start_ns") < pl.col("_e"))).drop("_e")
        return _Side(j, numbers, w.method, steady.select("step", "length_ns"))
    ranges = iteration_ranges(ctx.nvtx, pattern=cfg.iteration_pattern).filter(pl.col("iteration").is_in(numbers))
    proc = [c for c in ("rank", "pid") if c in ranges.columns and c in ops.columns]
    calls = ops.filter(pl.col("api_start_ns").is_not_null())
    win = ranges.select(*proc, pl.col("iteration").cast(pl.Int64).alias("step"), pl.col("start_ns").alias("api_start_ns"),
                        pl.col("end_ns").alias("_e"))
    own = calls.join(win.select(proc).unique(), on=proc, how="semi").sort([*proc, "api_start_ns"]).join_asof(
        win.sort([*proc, "api_start_ns"]), on="api_start_ns", by=proc, strategy="backward", check_sortedness=False,
    )
    main = steady.select("step", pl.col("start_ns").alias("api_start_ns"), pl.col("end_ns").alias("_e")).sort("api_start_ns")
    other = calls.join(win.select(proc).unique(), on=proc, how="anti").sort("api_start_ns").join_asof(
        main, on="api_start_ns", strategy="backward"
    )
    j = pl.concat([own, other], how="diagonal_relaxed").filter(
        pl.col("step").is_not_null() & (pl.col("api_start_ns") <= pl.col("_e"))
    ).drop("_e")
    per_proc = iterations(ops, ctx.nvtx, pattern=cfg.iteration_pattern)
    lengths = (
        per_proc.filter(pl.col("iteration").is_in(numbers))
        .group_by(pl.col("iteration").cast(pl.Int64).alias("step"))
        .agg(pl.max_horizontal("duration_ns", pl.col("gpu_span_ns").fill_null(0)).max().alias("length_ns"))
    )
    labels = iteration_ranges(ctx.nvtx, pattern=cfg.iteration_pattern)["name"].drop_nulls().unique().to_list()
    return _Side(j, numbers, w.method, lengths, labels)


def _level_values(trace: Any, level: str, side: _Side) -> pl.DataFrame:
    ops = side.ops
    kern = ops.filter(pl.col("op_kind") == "kernel") if "op_kind" in ops.columns else ops
    if level == "kernel":
        col = "name"
        if "short_name" not in kern.columns and "short_name" in trace.kernels.columns:
            # a kernel is known by where and when it ran: correlation ids repeat across
            # processes and ranks, and one graph launch has many kernels
            keys = [c for c in ("rank", "global_pid", "pid", "device_id", "stream_id", "correlation_id", "start_ns")
                    if c in kern.columns and c in trace.kernels.columns]
            short = trace.kernels.select(*keys, "short_name").unique(keys, keep="first", maintain_order=True)
            kern = kern.join(short, on=keys, how="left")
            col = "short_name"
        return kern.select("step", pl.coalesce(col, "name").alias("key"), pl.col("duration_ns").alias("value"))
    if level == "family":
        return with_family(kern).select("step", pl.col("family").alias("key"), pl.col("duration_ns").alias("value"))
    if level == "range":
        nvtx = trace.nvtx
        if nvtx.height == 0:
            return pl.DataFrame(schema=_EMPTY)
        att = attribute_nvtx(ops, nvtx)
        key = pl.col("nvtx_range").fill_null("(none)")
        # work launched directly inside a step range: one key (step.N) whatever the step's number
        key = pl.when(key.is_in(side.step_labels)).then(key.str.replace_all(r"\d+", "N")).otherwise(key)
        return att.select("step", key.alias("key"), pl.col("duration_ns").alias("value"))
    # step metrics
    parts = [
        ops.group_by("step").agg(pl.col("duration_ns").sum().alias("value")).with_columns(pl.lit("gpu_time").alias("key")),
        kern.group_by("step").agg(pl.len().cast(pl.Int64).alias("value")).with_columns(pl.lit("kernels").alias("key")),
    ]
    if side.step_lengths is not None and side.step_lengths.height:
        parts.append(side.step_lengths.select("step", pl.lit("step_time").alias("key"), pl.col("length_ns").alias("value")))
    return pl.concat([p.select("step", "key", pl.col("value").cast(pl.Int64)) for p in parts])


@dataclass
class Diff:
    """The comparison of two runs: one frame per level (``kernel``, ``family``, ``range``,
    ``step``) with the columns of :func:`tracekit.analysis.compare.compare_per_step` (values
    in ns, ``kernels`` in launches), plus what each side's steps were.

    ``threshold`` (relative, per step) is the default bar of :meth:`regressions`,
    :meth:`to_dict` and :meth:`to_json`."""

    before: str
    after: str
    levels: dict[str, pl.DataFrame]
    steps: dict[str, int]
    methods: dict[str, str]
    settings: dict[str, float] = field(default_factory=dict)
    threshold: float = 0.05

    def regressions(self, threshold: float | None = None) -> pl.DataFrame:
        """Rows of every level that are ``slower`` by at least ``threshold`` (relative, per
        step; default :attr:`threshold`); ``level`` says which table each comes from. Only
        times count (the step level's ``kernels`` count is reported, never a regression by
        itself)."""
        bar = self.threshold if threshold is None else _check_threshold(threshold)
        parts = [
            f.filter((pl.col("verdict") == "slower") & (pl.col("delta_pct").fill_null(float("inf")) >= bar)
                     & ~((pl.lit(name) == "step") & (pl.col("key") == "kernels")))
            .with_columns(pl.lit(name).alias("level"))
            for name, f in self.levels.items()
        ]
        return pl.concat(parts, how="diagonal_relaxed") if parts else pl.DataFrame()

    def to_dict(self, threshold: float | None = None) -> dict[str, Any]:
        """The structure ``tracekit diff --format json`` prints (docs/diff.md)."""
        bar = self.threshold if threshold is None else _check_threshold(threshold)
        return {
            "before": self.before, "after": self.after, "steps": self.steps, "step_source": self.methods,
            "settings": {**self.settings, "threshold": bar},
            "levels": {k: v.to_dicts() for k, v in self.levels.items()},
            "regressions": self.regressions(bar).to_dicts(),
        }

    def to_json(self, threshold: float | None = None) -> str:
        return json.dumps(self.to_dict(threshold), indent=2, default=str)


def _check_threshold(value: float) -> float:
    if not (isinstance(value, int | float) and value >= 0 and value == value):
        from tracekit.errors import TracekitError

        msg = f"threshold {value!r}: give a relative change of 0 or more (0.05 = 5 % slower per step)"
        raise TracekitError(msg)
    return float(value)


#: Peak memory of ``diff`` on two single exports, measured with ``/usr/bin/time`` on copies of
#: one export built by ``benchmarks/make_big_trace.py``: 1.8 GB for 2 × 1 M kernels, 11.9 GB
#: for 2 × 8 M; modelled, a little above both, per GPU operation of the two runs together.
DIFF_BASE_BYTES = 500 << 20
DIFF_BYTES_PER_OP = 750


def _ensure_fits(before: Any, after: Any) -> None:
    """Refuse, in one :class:`~tracekit.errors.TraceMemoryError` line, a comparison of two
    single exports that would not fit in the memory left: it holds both runs' whole tables,
    and polars aborted the process (2 × 8 M kernels under a 12 GB address-space limit:
    SIGABRT after 19 s). Trace sets (per-rank folders) are not estimated."""
    from tracekit.nsys.database import gpu_op_estimate, refuse_unless_fits

    dbs = [getattr(t, "db", None) for t in (before, after)]  # None for a trace set
    if None in dbs:
        return
    ops = sum(gpu_op_estimate(db) for db in dbs)
    names = " vs ".join(os.path.basename(str(t.path)) for t in (before, after))
    refuse_unless_fits(
        DIFF_BASE_BYTES + DIFF_BYTES_PER_OP * ops,
        f"{names}: comparing {ops:,} GPU operations",
        "compare shorter captures (nsys --capture-range, or a few steps of each run), or run the diff on a machine with more memory",
    )


def _open_run(obj: Any) -> Any:
    """A path (an export, or a folder of per-rank exports) opened; a trace or trace set as is."""
    from tracekit.errors import TracekitError

    if isinstance(obj, str | os.PathLike):
        path = os.fspath(obj)
        if os.path.isdir(path):
            from tracekit.scale.reduced import open_many

            obj = open_many(path)
        else:
            from tracekit.opening import open as tk_open

            obj = tk_open(path)
    # asked of the class: hasattr on the trace built its kernel table (4 s and 4 GB on 8 M kernels)
    if type(obj).__name__ == "NcuReport" or not hasattr(type(obj), "kernels"):
        what = getattr(obj, "path", obj)
        msg = f"{what} is not an Nsight Systems trace; tracekit diff compares two Nsight Systems exports (.sqlite, .nsys-rep)"
        raise TracekitError(msg)
    return obj


def diff(
    before: Any,
    after: Any,
    *,
    threshold: float = 0.05,
    levels: tuple[str, ...] = LEVELS,
    k: float = 3.0,
    min_effect: float = 0.02,
    fixed: float = 0.05,
) -> Diff:
    """Compare two runs: see the module doc and docs/diff.md.

    Parameters
    ----------
    before, after
        Each an :class:`~tracekit.nsys.trace.NsysTrace`, a trace set of
        :func:`tracekit.open_many`, a path to an export, or a folder of per-rank exports.
    threshold
        Relative per-step slowdown that counts as a regression (0.05 = 5 %).
    levels
        Which tables to build, from :data:`LEVELS`.
    k, min_effect, fixed
        The verdict's settings (:func:`tracekit.analysis.compare.compare_per_step`).

    Returns
    -------
    A :class:`Diff`; ``Diff.regressions()`` lists what got slower by at least ``threshold``
    per step, ``tracekit diff`` exits 1 when that list is not empty.
    """
    from tracekit.errors import TracekitError

    bad = [lv for lv in levels if lv not in LEVELS]
    if bad or not levels:
        msg = f"unknown level(s) {', '.join(bad) or '(none given)'}; choose from {', '.join(LEVELS)}"
        raise TracekitError(msg)
    for option, value in (("k", k), ("min_effect", min_effect), ("fixed", fixed)):
        if not (isinstance(value, int | float) and value >= 0 and value == value):
            msg = f"{option}={value!r}: give a number of 0 or more"
            raise TracekitError(msg)
    _check_threshold(threshold)
    ta, tb = _open_run(before), _open_run(after)
    _ensure_fits(ta, tb)
    sa, sb = _steady_steps(ta), _steady_steps(tb)
    out = {
        level: compare_per_step(
            _level_values(ta, level, sa), _level_values(tb, level, sb), sa.steps, sb.steps,
            k=k, min_effect=min_effect, fixed=fixed,
        )
        for level in levels
    }

    def name(obj: Any) -> str:
        return os.path.basename(str(getattr(obj, "path", obj)).rstrip("/"))

    return Diff(
        name(before), name(after), out,
        steps={"before": len(sa.steps), "after": len(sb.steps)},
        methods={"before": sa.method, "after": sb.method},
        settings={"k": k, "min_effect": min_effect, "fixed": fixed},
        threshold=float(threshold),
    )
