"""A training step taken apart: forward, backward and optimizer, each with its compute and its
communication (overlapped with compute, or exposed), and the step's throughput against the
model.

**Phases.** In each step on each GPU, ``backward`` starts at the first kernel named like a
backward pass (:data:`tracekit.analysis.run.structure.BACKWARD_NAMES`: the loss's
``*Backward*`` kernel is the first of autograd's) and runs to the first optimizer kernel
(:data:`~tracekit.analysis.run.structure.OPTIMIZER_NAMES`: multi-tensor or fused optimizer
kernels, gradient clipping's multi-tensor norms included) that starts after the last
backward-named kernel ends (the embedding's weight gradient is autograd's last);
``forward`` is the step before, ``optimizer`` the step after. A step without backward kernels is
all ``forward``; one without optimizer kernels has an empty ``optimizer``. Gradient collectives
issued during the backward (DDP's buckets, FSDP's reduce-scatters) count in the phase where
they run.

**Communication** per phase is :func:`tracekit.analysis.comm.comm_by_range` of the phase's
span on its GPU: ``overlap_ns`` ran beside compute, ``communication_only_ns`` (exposed) did
not; ``compute_only_ns``, ``memcpy_ns`` and ``idle_ns`` complete the span.

**Throughput.** :func:`training_throughput`: tokens per second = tokens per step ÷ step time;
model FLOPs per step = 6 × parameters × tokens (forward 2, backward 4 per parameter and token;
attention's own FLOPs are left out, as in the usual MFU), MFU = model FLOPs per second ÷ (GPUs
× the GPU's dense peak).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from tracekit.analysis._frames import rank_keys
from tracekit.analysis.comm import activity_segments, comm_by_range

__all__ = ["PHASES", "training_phases", "training_summary", "training_throughput"]

#: The phases of a training step, in order.
PHASES = ("forward", "backward", "optimizer")

_PHASE_COLUMNS = ("window_ns", "compute_only_ns", "overlap_ns", "communication_only_ns", "memcpy_ns", "idle_ns",
                  "communication_ns", "exposed_comm_ns")


def training_phases(ops: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Each step's phases on each GPU (see the module doc).

    Parameters
    ----------
    ops
        :func:`tracekit.analysis.comm.categorize_ops` of the steps' operations (``name``,
        ``device_id``, ``start_ns``, ``end_ns``, ``category``; ``rank`` of a trace set).
    steps
        (``rank``,) ``device_id``, ``step``, ``start_ns``, ``end_ns``: the steps, per GPU.

    Returns
    -------
    One row per (``rank``,) ``device_id``, ``step`` and phase (:data:`PHASES`): ``start_ns``,
    ``end_ns``, ``window_ns`` (the phase's span), ``compute_only_ns``, ``overlap_ns``,
    ``communication_only_ns``, ``memcpy_ns``, ``idle_ns`` (they add up to ``window_ns``),
    ``communication_ns``, ``exposed_comm_ns`` (= ``communication_only_ns``), all ns.
    """
    from tracekit.analysis.run.structure import BACKWARD_NAMES, OPTIMIZER_NAMES

    keys = [*rank_keys(ops, steps), "device_id"]
    steps = steps.with_columns(pl.col(c).cast(ops.schema[c]) for c in keys)
    win = steps.select(*keys, "step", pl.col("start_ns").alias("_s"), pl.col("end_ns").alias("_e")).sort([*keys, "_s"])
    k = ops.filter((pl.col("category") == "compute") & pl.col("name").is_not_null()).select(
        *keys, "start_ns", "end_ns", pl.col("name").str.contains(BACKWARD_NAMES).alias("_b"),
        pl.col("name").str.contains(OPTIMIZER_NAMES).alias("_o"))
    k = k.sort([*keys, "start_ns"]).join_asof(win, left_on="start_ns", right_on="_s", by=keys, strategy="backward",
                                              check_sortedness=False).filter(pl.col("step").is_not_null() & (pl.col("start_ns") < pl.col("_e")))
    sk = [*keys, "step"]
    bwd = k.filter(pl.col("_b")).group_by(sk).agg(pl.col("start_ns").min().alias("_b0"), pl.col("end_ns").max().alias("_b1"))
    cand = k.filter(pl.col("_o")).join(bwd, on=sk, how="left").filter(pl.col("_b1").is_null() | (pl.col("start_ns") >= pl.col("_b1")))
    opt = cand.group_by(sk).agg(pl.col("start_ns").min().alias("_o0"))
    b = win.join(bwd, on=sk, how="left").join(opt, on=sk, how="left").with_columns(
        pl.col("_b0").fill_null(pl.col("_e")).clip(pl.col("_s"), pl.col("_e")).alias("_b0"),
        pl.col("_o0").fill_null(pl.col("_e")).alias("_o0"))
    b = b.with_columns(pl.max_horizontal("_o0", "_b0").clip(upper_bound=pl.col("_e")).alias("_o0"))
    windows = pl.concat([
        b.select(*sk, pl.lit("forward").alias("phase"), pl.col("_s").alias("start_ns"), pl.col("_b0").alias("end_ns")),
        b.select(*sk, pl.lit("backward").alias("phase"), pl.col("_b0").alias("start_ns"), pl.col("_o0").alias("end_ns")),
        b.select(*sk, pl.lit("optimizer").alias("phase"), pl.col("_o0").alias("start_ns"), pl.col("_e").alias("end_ns")),
    ])
    seg = activity_segments(ops)
    out = comm_by_range(seg, windows)
    order = pl.col("phase").replace_strict(list(PHASES), list(range(len(PHASES))), return_dtype=pl.Int64)
    return out.sort([*sk, order]).select(*sk, "phase", "start_ns", "end_ns", *_PHASE_COLUMNS)


def training_summary(phases: pl.DataFrame) -> pl.DataFrame:
    """Per phase, the median over steps and GPUs of :func:`training_phases` (ns):
    ``time_ns`` (the phase's span), ``compute_ns`` (compute, alone or beside communication),
    ``communication_ns``, ``exposed_comm_ns`` and ``idle_ns``; ``share`` of the median step
    (the phases' medians, summed); ``steps`` measured (step × GPU pairs)."""
    if phases.height == 0:
        return pl.DataFrame(schema={"phase": pl.Utf8, "steps": pl.Int64, "time_ns": pl.Float64, "compute_ns": pl.Float64,
                                    "communication_ns": pl.Float64, "exposed_comm_ns": pl.Float64, "idle_ns": pl.Float64,
                                    "share": pl.Float64})
    per = phases.group_by("phase").agg(
        pl.len().cast(pl.Int64).alias("steps"), pl.col("window_ns").median().alias("time_ns"),
        (pl.col("compute_only_ns") + pl.col("overlap_ns")).median().alias("compute_ns"),
        pl.col("communication_ns").median().alias("communication_ns"), pl.col("exposed_comm_ns").median().alias("exposed_comm_ns"),
        pl.col("idle_ns").median().alias("idle_ns"))
    order = pl.col("phase").replace_strict(list(PHASES), list(range(len(PHASES))), return_dtype=pl.Int64)
    per = per.sort(order)
    total = float(per["time_ns"].sum() or 0)
    return per.with_columns((pl.col("time_ns") / total if total else pl.lit(None, pl.Float64)).alias("share"))


def training_throughput(step_ns: float, tokens_per_step: int, *, params: float | None = None, gpus: int = 1,
                        peak_flops: float | None = None) -> dict[str, Any]:
    """Tokens per second of steps of ``step_ns`` (median steady step) processing
    ``tokens_per_step`` tokens (all GPUs together), and, with ``params`` (the model's
    parameters) and ``peak_flops`` (one GPU's dense peak, FLOP/s), the model FLOPs per step (6 ×
    parameters × tokens) and MFU over ``gpus`` GPUs (0–1). Keys: ``tokens_per_step``,
    ``step_ns``, ``tokens_per_s``, ``model_flops_per_step``, ``mfu``."""
    if step_ns <= 0 or tokens_per_step <= 0:
        msg = f"training_throughput: step_ns ({step_ns}) and tokens_per_step ({tokens_per_step}) must be positive"
        raise ValueError(msg)
    out: dict[str, Any] = {"tokens_per_step": int(tokens_per_step), "step_ns": float(step_ns),
                           "tokens_per_s": tokens_per_step / (step_ns * 1e-9), "model_flops_per_step": None, "mfu": None}
    if params:
        flops = 6.0 * float(params) * tokens_per_step
        out["model_flops_per_step"] = flops
        if peak_flops:
            out["mfu"] = flops / (step_ns * 1e-9) / (max(gpus, 1) * peak_flops)
    return out
