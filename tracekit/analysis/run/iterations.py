"""Training/inference iterations from NVTX ranges, with per-iteration GPU time and spread.

Iterations are the outermost NVTX ranges whose label matches a pattern (default: one of
:data:`ITERATION_WORDS` — step, iter, iteration, batch, epoch, decode, forward — as a word,
case-insensitive): ``step.3`` and ``decode_12`` count, an ``Optimizer.step`` nested inside
a step does not, and a compiler's ``…IterDomain…`` range is no iteration. A trace without
such ranges has no iterations (empty result). Each process's iterations are numbered in start
order.

A GPU operation belongs to the iteration of its process whose range contains the start of
its launching call, on any thread of that process, so that work launched by autograd or
NCCL threads counts in the step it belongs to.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import polars as pl

from tracekit.analysis._frames import interval_union, max_int, process_key, rank_keys
from tracekit.analysis.attribution import _nvtx_tree

__all__ = ["DEFAULT_ITERATION_PATTERN", "ITERATION_WORDS", "iteration_ranges", "iteration_stats", "iterations", "warmup_count", "word_pattern"]

#: Words that name an iteration range (``step.3``, ``decode_12``, ``Iteration 4``, ``epoch:1``).
ITERATION_WORDS: tuple[str, ...] = ("step", "iter", "iteration", "batch", "epoch", "decode", "forward")


def word_pattern(words: Sequence[str]) -> str:
    """A regular expression matching any of ``words`` as a word: not inside a longer run of
    letters (``step.3`` and ``train_step`` match ``step``; ``stepper`` and a compiler's
    ``…IterDomain`` do not). Case-insensitivity is added where the pattern is used.

    Examples
    --------
    >>> word_pattern(["step", "iter"])
    '(?:^|[^A-Za-z])(?:step|iter)(?:[^A-Za-z]|$)'
    """
    return "(?:^|[^A-Za-z])(?:" + "|".join(re.escape(w) for w in words) + ")(?:[^A-Za-z]|$)"


#: The range ``torch.profiler`` opens around each ``prof.step()`` (``ProfilerStep#12``): a step
#: whatever the words, though ``Step`` follows a letter there.
PROFILER_STEP_PATTERN = r"^ProfilerStep#\d+$"
DEFAULT_ITERATION_PATTERN = word_pattern(ITERATION_WORDS) + "|" + PROFILER_STEP_PATTERN

_SCHEMA = {
    "pid": pl.Int64, "iteration": pl.Int64, "name": pl.Utf8, "range_id": pl.Int64, "tid": pl.Int64,
    "start_ns": pl.Int64, "end_ns": pl.Int64, "duration_ns": pl.Int64, "ops": pl.Int64, "kernels": pl.Int64,
    "kernel_ns": pl.Int64, "devices": pl.Int64, "gpu_start_ns": pl.Int64, "gpu_end_ns": pl.Int64,
    "gpu_span_ns": pl.Int64, "gpu_busy_ns": pl.Int64, "gpu_idle_ns": pl.Int64,
}


#: torch.profiler's step ranges (``ProfilerStep#N``, one per ``prof.step()``).
PROFILER_STEP = r"^ProfilerStep#\d+$"


def iteration_ranges(nvtx: pl.DataFrame, *, pattern: str = DEFAULT_ITERATION_PATTERN) -> pl.DataFrame:
    """The outermost ranges matching ``pattern`` (with the default pattern, only torch.profiler's
    ``ProfilerStep#N`` ranges when the trace has them): (``rank``,) ``pid``, ``iteration``,
    ``name`` (label), ``range_id``, ``tid``, ``global_tid``, ``start_ns``, ``end_ns``."""
    keys = rank_keys(nvtx)
    tree = _nvtx_tree(nvtx, keys, paths=False, labels=True, lean=True)
    if pattern == DEFAULT_ITERATION_PATTERN and tree["label"].str.contains(PROFILER_STEP).any():
        # torch.profiler's own step marker: one range per profiler step, opened where the
        # program's (or tracekit's optimizer hook's) prof.step() is; ranges such as
        # Optimizer.step#AdamW.step cross its boundaries and are not the steps
        pattern = PROFILER_STEP
    t = tree.with_columns(pl.col("label").str.contains(f"(?i){pattern}").fill_null(False).alias("_m"))
    t = t.with_columns(pl.lit(False).alias("_anc"))
    for level in range(1, max_int(t["level"]) + 1):
        par = pl.col("_parent_idx")
        t = t.with_columns(
            pl.when(pl.col("level") == level).then(pl.col("_anc").gather(par) | pl.col("_m").gather(par)).otherwise(pl.col("_anc")).alias("_anc")
        )
    it = t.filter(pl.col("_m") & ~pl.col("_anc")).sort([*keys, "pid", "start_ns", "range_id"])
    it = it.with_columns(pl.int_range(pl.len()).over([*keys, "pid"]).cast(pl.Int64).alias("iteration"))
    return it.select(*keys, "pid", "iteration", pl.col("label").alias("name"), "range_id", "tid", "global_tid", "start_ns", "end_ns")


def iterations(
    ops_with_launch: pl.DataFrame,
    nvtx: pl.DataFrame,
    *,
    pattern: str = DEFAULT_ITERATION_PATTERN,
) -> pl.DataFrame:
    """Per-iteration CPU and GPU time.

    Parameters
    ----------
    ops_with_launch
        GPU operations with their launching call (:func:`~tracekit.analysis.attribution.
        launch_info` of ``kernels`` or ``gpu_ops``): ``device_id``, ``start_ns``, ``end_ns``,
        ``duration_ns``, ``global_tid``, ``api_start_ns``; ``op_kind`` when present.
    nvtx
        The ``nvtx`` table.
    pattern
        Regular expression (case-insensitive) for iteration range names.

    Returns
    -------
    One row per iteration: (``rank``,) ``pid``, ``iteration`` (0-based per process),
    ``name``, ``range_id``, ``tid``, ``start_ns``, ``end_ns``, ``duration_ns`` (the range on
    the CPU), ``ops``, ``kernels``, ``kernel_ns`` (summed kernel time), ``devices``,
    ``gpu_start_ns``/``gpu_end_ns`` (first start, last end of its operations),
    ``gpu_span_ns``, ``gpu_busy_ns`` (union of its operations' intervals, summed over
    devices) and ``gpu_idle_ns`` (per device span − busy, summed). Empty (same columns) when
    no range matches.
    """
    keys = rank_keys(ops_with_launch, nvtx)
    its = iteration_ranges(nvtx, pattern=pattern)
    if not keys and "rank" in its.columns:
        its = its.drop("rank")
    if its.height == 0:
        import warnings

        from tracekit.errors import EmptyResultWarning

        why = (
            "the trace has no NVTX ranges" if nvtx.height == 0
            else f"no NVTX range name matches {pattern!r} (pass pattern=… for your step ranges)"
        )
        warnings.warn(
            f"iterations: none found: {why}; tracekit.diagnose finds iterations from the kernels that run "
            "once per iteration instead (tracekit.analysis.run.structure.kernel_loop_iterations)",
            EmptyResultWarning, stacklevel=2,
        )
        return pl.DataFrame(schema={**({"rank": nvtx.schema["rank"]} if keys else {}), **_SCHEMA})
    its = its.with_columns(process_key("global_tid").alias("_proc"))
    kind = (pl.col("op_kind") == "kernel") if "op_kind" in ops_with_launch.columns else pl.lit(True)
    # lazily, so that only these columns of the (possibly many-million-row) ops are filtered
    ops = ops_with_launch.lazy().filter(pl.col("api_start_ns").is_not_null()).select(
        *keys, process_key("global_tid").alias("_proc"), "api_start_ns", "device_id", "start_ns", "end_ns",
        "duration_ns", kind.alias("_is_kernel"),
    ).collect()
    win = its.select(*keys, "_proc", pl.col("start_ns").alias("api_start_ns"), "iteration", pl.col("end_ns").alias("_iend"), "pid")
    j = ops.sort([*keys, "_proc", "api_start_ns"]).join_asof(
        win.sort([*keys, "_proc", "api_start_ns"]), on="api_start_ns", by=[*keys, "_proc"], strategy="backward", check_sortedness=False,
    ).filter(pl.col("iteration").is_not_null() & (pl.col("api_start_ns") <= pl.col("_iend")))
    ik = [*keys, "pid", "iteration"]
    per = j.group_by(ik).agg(
        pl.len().cast(pl.Int64).alias("ops"),
        pl.col("_is_kernel").sum().cast(pl.Int64).alias("kernels"),
        pl.col("duration_ns").filter(pl.col("_is_kernel")).sum().alias("kernel_ns"),
        pl.col("device_id").n_unique().cast(pl.Int64).alias("devices"),
        pl.col("start_ns").min().alias("gpu_start_ns"),
        pl.col("end_ns").max().alias("gpu_end_ns"),
    )
    merged = interval_union(j, [*ik, "device_id"])
    dev = merged.group_by([*ik, "device_id"]).agg(
        (pl.col("end_ns") - pl.col("start_ns")).sum().alias("_busy"),
        (pl.col("end_ns").max() - pl.col("start_ns").min()).alias("_span"),
    )
    busy = dev.group_by(ik).agg(pl.col("_busy").sum().alias("gpu_busy_ns"), (pl.col("_span") - pl.col("_busy")).sum().alias("gpu_idle_ns"))
    out = its.join(per, on=ik, how="left").join(busy, on=ik, how="left")
    out = out.with_columns(
        (pl.col("end_ns") - pl.col("start_ns")).alias("duration_ns"),
        (pl.col("gpu_end_ns") - pl.col("gpu_start_ns")).alias("gpu_span_ns"),
        *(pl.col(c).fill_null(0) for c in ("ops", "kernels", "kernel_ns", "devices", "gpu_busy_ns", "gpu_idle_ns")),
    )
    return out.select(*keys, *_SCHEMA).sort(ik)


def iteration_stats(
    iters: pl.DataFrame,
    *,
    columns: Sequence[str] = ("duration_ns", "gpu_busy_ns", "gpu_idle_ns", "kernels"),
    skip: int = 0,
) -> pl.DataFrame:
    """Spread of per-iteration values from :func:`iterations`, per (``rank``,) ``pid``.

    ``skip`` drops each process's first iterations (warm-up). Returns one row per group and
    column: ``metric``, ``n``, ``mean``, ``median``, ``std`` (sample), ``min``, ``max``,
    ``cv`` (std / mean) and ``spread`` ((max − min) / median).
    """
    keys = [*rank_keys(iters), "pid"]
    frame = iters.filter(pl.col("iteration") >= skip)
    parts = []
    for c in columns:
        v = pl.col(c).cast(pl.Float64)
        parts.append(
            frame.group_by(keys).agg(
                pl.lit(c).alias("metric"), pl.len().cast(pl.Int64).alias("n"), v.mean().alias("mean"),
                v.median().alias("median"), v.std().alias("std"), v.min().alias("min"), v.max().alias("max"),
            )
        )
    if not parts:
        return pl.DataFrame()
    out = pl.concat(parts).with_columns(
        (pl.col("std") / pl.col("mean")).alias("cv"),
        ((pl.col("max") - pl.col("min")) / pl.col("median")).alias("spread"),
    )
    return out.sort([*keys, "metric"])


def warmup_count(lengths: list[int], factor: float) -> int:
    """How many leading iterations are warm-up: each one longer than ``factor`` times the
    median of those after it, at most half of them."""
    n = len(lengths)
    count = 0
    while count < n // 2:
        rest = lengths[count + 1 :]
        if not rest:
            break
        if lengths[count] > factor * float(np.median(rest)):
            count += 1
        else:
            break
    return count
