"""A training step taken apart: its optimizer step, micro-batches and phases (forward,
backward, optimizer), each with its compute and its communication (overlapped with compute, or
exposed), the periodic work between steps (evaluation, checkpoint saves), and the step's
throughput against the model.

**Optimizer steps.** A step ends with the optimizer. With gradient accumulation the kernel
sequence repeats once per micro-batch (forward, backward) and the optimizer's kernels
(:data:`OPTIMIZER_NAMES`) run in every ``k``-th repetition only: :func:`micro_batch_steps`
merges the repetitions up to each one that steps the optimizer.

**Phases from the launching thread.** PyTorch runs every backward on autograd's own thread per
device (``pt_autograd_<device>``: eager, ``torch.compile``'s compiled backward, DDP, FSDP,
Lightning, Trainer, accelerate alike), while the forward and the optimizer launch from the
training thread. In launch order, the GPU operations of a step are runs of one thread or the
other: each autograd run is one micro-batch's backward; the training thread's run before it is
that micro-batch's forward; the training thread's run after the last backward of a step holds
the optimizer (up to its last :data:`OPTIMIZER_NAMES` kernel) and then the next step's first
forward. Kernel names are not needed, so Inductor's fused kernels (no ``Backward`` in their
names) are placed right. A step's first forward that runs more than twice the operations of the
median forward holds periodic work before it (an evaluation's forward-only passes, a checkpoint
save's device-to-host copies): its last median-forward's worth of operations is the forward,
the rest is set apart as ``evaluation`` (mostly kernels) or ``checkpoint`` (mostly copies).

**Phases from names** (no launching thread known, or no autograd thread in the window): in each
step on each GPU, ``backward`` starts at the first kernel named like a backward pass
(:data:`BACKWARD_NAMES`: the loss's ``*Backward*`` kernel is the first of autograd's) and runs
to the first optimizer kernel that starts after the last backward-named kernel ends (the
embedding's weight gradient is autograd's last); ``forward`` is the step before, ``optimizer``
the step after. A step without backward kernels is all ``forward``; one without optimizer
kernels has an empty ``optimizer``. Gradient collectives issued during the backward (DDP's
buckets, FSDP's reduce-scatters) count in the phase where they run.

**Communication** per phase is :func:`tracekit.analysis.comm.comm_by_range` of the phase's
spans on its GPU: ``overlap_ns`` ran beside compute, ``communication_only_ns`` (exposed) did
not; ``compute_only_ns``, ``memcpy_ns`` and ``idle_ns`` complete the spans. ``kernel_ns`` sums
the durations of the phase's own compute kernels (its GPU time, by launching thread when read
so).

**Throughput.** :func:`training_throughput`: tokens per second = tokens per step ÷ step time;
model FLOPs per step = 6 × parameters × tokens (forward 2, backward 4 per parameter and token;
attention's own FLOPs are left out, as in the usual MFU), MFU = model FLOPs per second ÷ (GPUs
× the GPU's dense peak).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import numpy as np
import polars as pl

from tracekit.analysis._frames import rank_keys
from tracekit.analysis.comm import activity_segments, comm_by_range

__all__ = [
    "BACKWARD_NAMES",
    "GRADIENT_COLLECTIVES",
    "OPTIMIZER_NAMES",
    "PERIODIC",
    "PHASES",
    "autograd_threads",
    "micro_batch_steps",
    "periodic_summary",
    "training_phases",
    "training_summary",
    "training_throughput",
]

#: The phases of a training step, in order.
PHASES = ("forward", "backward", "optimizer")
#: Periodic work set apart from the steps (rows of :func:`training_phases` beside the phases).
PERIODIC = ("evaluation", "checkpoint")

#: Kernel names of a backward pass (autograd's ``*Backward*`` kernels, cuDNN/flash attention's
#: ``bprop``/``bwd``, cuBLAS-style ``dgrad``/``wgrad``, embedding's ``compute_grad_weight``).
BACKWARD_NAMES = r"(?i)backward|_bwd|bwd_|bprop|dgrad|wgrad|grad_input|grad_weight"
#: Kernel names of an optimizer step (PyTorch's multi-tensor and fused optimizers, apex, …).
OPTIMIZER_NAMES = r"(?i)adam|\bsgd|\blamb\b|adagrad|rmsprop|multi_tensor_apply|fused_optim"
#: NCCL kernels that reduce gradients in data-parallel training.
GRADIENT_COLLECTIVES = r"(?i)nccl\w*(?:allreduce|reducescatter|reduce_scatter)"
#: Thread names of PyTorch's autograd device threads (``c10::setThreadName`` in the engine).
AUTOGRAD_THREAD = r"^pt_autograd_\d+$"

#: A checkpoint save copies a model's tensors to the host: at least this many bytes (a loss's
#: ``.item()`` copies 4).
CHECKPOINT_MIN_BYTES = 1 << 20

_PHASE_COLUMNS = ("window_ns", "compute_only_ns", "overlap_ns", "communication_only_ns", "memcpy_ns", "idle_ns",
                  "communication_ns", "exposed_comm_ns")


#: CPU operators that autograd's engine runs for each backward function (a torch.profiler trace's
#: ``cpu_ops``: ``autograd::engine::evaluate_function: MmBackward0``), on its own thread.
AUTOGRAD_OPS = r"^autograd::engine::evaluate_function"


def autograd_threads(threads: pl.DataFrame, cpu_ops: pl.DataFrame | None = None) -> list[int]:
    """The ``global_tid`` of autograd's device threads: those PyTorch named so
    (:data:`AUTOGRAD_THREAD`) in a trace's ``threads`` table (``pid``, ``tid``, ``global_tid``,
    ``name``), else, given a torch.profiler trace's ``cpu_ops`` (``pid``, ``tid``, ``name``; it
    records no thread names), the threads that ran autograd's engine (:data:`AUTOGRAD_OPS`)."""
    if threads.height == 0 or "global_tid" not in threads.columns:
        return []
    if "name" in threads.columns:
        named = threads.filter(pl.col("name").fill_null("").str.contains(AUTOGRAD_THREAD))["global_tid"].drop_nulls()
        if named.len():
            return named.unique().sort().to_list()
    if cpu_ops is None or cpu_ops.height == 0 or not {"pid", "tid", "name"} <= set(cpu_ops.columns) or "tid" not in threads.columns:
        return []
    engine = cpu_ops.filter(pl.col("name").str.contains(AUTOGRAD_OPS)).select("pid", "tid").unique()
    return threads.join(engine, on=["pid", "tid"])["global_tid"].drop_nulls().unique().sort().to_list()


def micro_batch_steps(frame: pl.DataFrame, ops: pl.DataFrame) -> tuple[pl.DataFrame, int] | None:
    """``frame``'s iterations merged into optimizer steps, and the micro-batches per step; or
    ``None`` when every iteration (or none) runs the optimizer.

    ``frame``: one GPU's iterations in order (``start_ns``, ``end_ns``; also ``duration_ns``,
    ``gpu_span_ns``, ``kernels``, ``w_start``, ``w_end``, ``length_ns`` when present). ``ops``:
    that GPU's operations over some of them (``start_ns``, ``name`` as text). An iteration holds
    the optimizer when an :data:`OPTIMIZER_NAMES` kernel starts in it; among the iterations
    ``ops`` covers whole, those must come every ``k`` ≥ 2 iterations exactly (gradient
    accumulation runs ``k`` micro-batches per step), seen at least twice (a first iteration
    cut by the capture may miss its optimizer). The pattern is then
    carried over the whole frame; each step runs to the end of an optimizer iteration, so the
    trailing iterations after the last one (a step the capture cut) are left out. Steps get
    ``micro_batches`` (iterations merged); times in ns."""
    if frame.height < 4 or ops.height == 0 or "name" not in ops.columns or ops["name"].dtype != pl.Utf8:
        return None
    starts = frame["start_ns"].to_numpy()
    ends = frame["end_ns"].to_numpy()
    lo, hi = int(ops["start_ns"].min()), int(ops["start_ns"].max())  # type: ignore[arg-type]
    covered = np.flatnonzero((starts >= lo) & (ends <= hi + 1))
    if covered.size < 4:
        return None
    opt = ops.filter(pl.col("name").str.contains(OPTIMIZER_NAMES))["start_ns"].to_numpy()
    at = np.searchsorted(starts, opt, side="right") - 1
    flags = np.zeros(frame.height, dtype=bool)
    flags[at[(at >= 0) & (opt < ends[np.clip(at, 0, None)])]] = True
    seen = covered[flags[covered]]
    if seen.size < 2 or seen.size == covered.size:
        return None
    gaps = np.diff(seen)
    period = int(gaps[0])
    if period < 2 or not (gaps == period).all():
        return None
    flags = (np.arange(frame.height) % period) == (int(seen[0]) % period)
    last = int(np.flatnonzero(flags)[-1])
    group = np.cumsum(flags) - flags
    merged = frame.slice(0, last + 1).with_columns(pl.Series("_g", group[: last + 1], dtype=pl.Int64))
    cols = set(frame.columns)
    agg = [pl.col("start_ns").min(), pl.col("end_ns").max(), pl.len().cast(pl.Int64).alias("micro_batches")]
    agg += [pl.col(c).sum() for c in ("gpu_span_ns", "kernels", "length_ns") if c in cols]
    agg += [pl.col("w_start").min()] if "w_start" in cols else []
    agg += [pl.col("w_end").max()] if "w_end" in cols else []
    agg += [pl.col(c).first() for c in frame.columns if c in ("rank", "pid", "device_id")]
    out = merged.group_by("_g", maintain_order=True).agg(agg).with_columns(
        pl.col("_g").alias("iteration"), (pl.col("end_ns") - pl.col("start_ns")).alias("duration_ns"))
    order = [c for c in frame.columns if c in out.columns] + ["micro_batches"]
    return out.select(order), period


def training_phases(ops: pl.DataFrame, steps: pl.DataFrame, *, autograd_tids: Collection[int] | None = None) -> pl.DataFrame:
    """Each step's phases on each GPU, and the periodic work between steps (see the module doc).

    Parameters
    ----------
    ops
        :func:`tracekit.analysis.comm.categorize_ops` of the steps' operations (``name``,
        ``device_id``, ``start_ns``, ``end_ns``, ``category``; ``rank`` of a trace set), with
        ``global_tid`` (the launching thread) and ``api_start_ns`` (the launch) when known.
    steps
        (``rank``,) ``device_id``, ``step``, ``start_ns``, ``end_ns``: the steps, per GPU.
    autograd_tids
        The ``global_tid`` of autograd's threads (:func:`autograd_threads`). With them, and
        ``global_tid`` in ``ops``, the phases are read from the launching thread; else from
        kernel names.

    Returns
    -------
    One row per (``rank``,) ``device_id``, ``step`` and phase (:data:`PHASES`, then any
    :data:`PERIODIC` work found before the step): ``start_ns``, ``end_ns`` (the first and last
    of the phase's spans), ``window_ns`` (its spans summed), ``compute_only_ns``,
    ``overlap_ns``, ``communication_only_ns``, ``memcpy_ns``, ``idle_ns`` (they add up to
    ``window_ns``), ``communication_ns``, ``exposed_comm_ns`` (= ``communication_only_ns``),
    ``kernel_ns`` (its compute kernels' durations summed), ``micro_batches`` (the step's),
    ``recompute`` (its forward runs again inside its backward: activation checkpointing) and
    ``by`` (``"thread"`` or ``"names"``), all ns. Reading by thread, steps are renumbered from
    0 in the order they ran, and a step cut by the window's edges is left out.
    """
    keys = [*rank_keys(ops, steps), "device_id"]
    if autograd_tids and "global_tid" in ops.columns and ops.height:
        tids = pl.Series(list(autograd_tids), dtype=pl.Int64)
        if ops.select(pl.col("global_tid").cast(pl.Int64).is_in(tids.implode()).any()).item():
            out = _phases_by_thread(ops, keys, tids)
            if out is not None:
                return out
    return _phases_by_name(ops, steps, keys)


def _phase_rows(ops: pl.DataFrame, portions: pl.DataFrame, keys: list[str], by: str) -> pl.DataFrame:
    """The phase rows of ``portions`` (``keys``, ``step``, ``phase``, ``start_ns``, ``end_ns``,
    ``kernel_ns``, ``micro_batches``): each portion's time states, summed per step and phase."""
    sk = [*keys, "step"]
    seg = activity_segments(ops)
    out = comm_by_range(seg, portions)
    order = pl.col("phase").replace_strict([*PHASES, *PERIODIC], list(range(len(PHASES) + len(PERIODIC))), return_dtype=pl.Int64)
    if "recompute" not in out.columns:
        out = out.with_columns(pl.lit(None, pl.Boolean).alias("recompute"))
    per = out.group_by([*sk, "phase"]).agg(
        pl.col("start_ns").min(), pl.col("end_ns").max(), *[pl.col(c).sum() for c in _PHASE_COLUMNS],
        pl.col("kernel_ns").sum(), pl.col("micro_batches").first(), pl.col("recompute").first())
    return per.sort([*sk, order]).select(*sk, "phase", "start_ns", "end_ns", *_PHASE_COLUMNS, "kernel_ns", "micro_batches",
                                         "recompute", pl.lit(by).alias("by"))


def _phases_by_name(ops: pl.DataFrame, steps: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Phases placed from kernel names inside the given steps (the module doc)."""
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
    kern = ops.filter(pl.col("category") == "compute").select(*keys, "start_ns", "duration_ns").sort([*keys, "start_ns"])
    placed = kern.join_asof(windows.sort([*keys, "start_ns"]).select(*keys, pl.col("start_ns").alias("_p0"), "end_ns", "step", "phase"),
                            left_on="start_ns", right_on="_p0", by=keys, strategy="backward", check_sortedness=False).filter(
        pl.col("step").is_not_null() & (pl.col("start_ns") < pl.col("end_ns")))
    kns = placed.group_by([*sk, "phase"]).agg(pl.col("duration_ns").sum().alias("kernel_ns"))
    windows = windows.join(kns, on=[*sk, "phase"], how="left").with_columns(
        pl.col("kernel_ns").fill_null(0), pl.lit(None, pl.Int64).alias("micro_batches"))
    return _phase_rows(ops, windows, keys, "names")


def _phases_by_thread(ops: pl.DataFrame, keys: list[str], tids: pl.Series) -> pl.DataFrame | None:
    """Phases from the launching thread (the module doc), or ``None`` when no GPU of ``ops``
    shows a whole step (a backward, then an optimizer)."""
    order = "api_start_ns" if "api_start_ns" in ops.columns else "start_ns"
    frame = ops.with_columns(
        pl.when(pl.col("global_tid").is_null()).then(None).otherwise(pl.col("global_tid").cast(pl.Int64).is_in(tids.implode()))
        .forward_fill().over(keys).fill_null(False).alias("_ag"),
        ((pl.col("category") == "compute") & pl.col("name").fill_null("").str.contains(OPTIMIZER_NAMES)).alias("_opt"),
        pl.coalesce(pl.col(order), pl.col("start_ns")).alias("_t"),
    ).sort([*keys, "_t", "start_ns"])
    parts = []
    for key, g in frame.group_by(keys, maintain_order=True):
        is_kernel = (g["op_kind"] == "kernel").to_numpy() if "op_kind" in g.columns else np.ones(g.height, dtype=bool)
        d2h = g["name"].fill_null("").str.contains("DtoH|Device-to-Host|Device to Host", literal=False).to_numpy()
        d2h_bytes = np.where(d2h, g["bytes"].fill_null(0).to_numpy(), 0) if "bytes" in g.columns else np.zeros(g.height, dtype=np.int64)
        comm = (g["category"] == "communication").to_numpy()
        rows = _portions(g["_ag"].to_numpy(), g["_opt"].to_numpy(), is_kernel, d2h_bytes, comm)
        if not rows:
            continue
        starts, ends = g["start_ns"].to_numpy(), g["end_ns"].to_numpy()
        kern = np.where((g["category"] == "compute").to_numpy(), g["duration_ns"].to_numpy(), 0)
        csum = np.concatenate([[0], np.cumsum(kern)])
        p = pl.DataFrame(rows, schema={"step": pl.Int64, "phase": pl.Utf8, "lo": pl.Int64, "hi": pl.Int64, "micro_batches": pl.Int64},
                         orient="row")
        lo, hi = p["lo"].to_numpy(), p["hi"].to_numpy()
        span_lo = np.array([starts[a:b + 1].min() for a, b in zip(lo, hi, strict=True)], dtype=np.int64)
        span_hi = np.array([ends[a:b + 1].max() for a, b in zip(lo, hi, strict=True)], dtype=np.int64)
        codes = g["name"].fill_null("").cast(pl.Categorical).to_physical().to_numpy().astype(np.int32)
        p = p.with_columns(pl.Series("start_ns", span_lo), pl.Series("end_ns", span_hi),
                           pl.Series("kernel_ns", (csum[hi + 1] - csum[lo]).astype(np.int64)),
                           pl.Series("recompute", _recomputed(rows, codes), dtype=pl.Boolean),
                           *[pl.lit(v, dtype=ops.schema[k]).alias(k) for k, v in zip(keys, key, strict=True)])
        parts.append(p.drop("lo", "hi"))
    if not parts:
        return None
    return _phase_rows(ops, pl.concat(parts), keys, "thread")


#: Activation checkpointing is told from the windows of this many consecutive operations that
#: tile a micro-batch's forward, …
RECOMPUTE_WINDOW = 16
#: … at least this share of which run again, in the same order, inside the backward that
#: follows (the layers' windows do; the embedding's, the head's and those across a layer's edge
#: need not; a backward of its own runs none: 0 of 22 on the zoo's accelerate loop, 12 of 22
#: with HF gradient checkpointing).
RECOMPUTE_SHARE = 0.25


def _recomputed(rows: list[tuple[int, str, int, int, int]], codes: np.ndarray) -> list[bool]:
    """Per row of :func:`_portions`, whether its step recomputes its forward inside the
    backward (activation checkpointing): :data:`RECOMPUTE_SHARE` of the windows of
    :data:`RECOMPUTE_WINDOW` consecutive operations tiling the step's first forward (name codes
    in launch order) found, as they are, inside the backward that follows it. A backward of its own never runs the forward's kernels
    in the forward's order; a recomputation does."""
    found: dict[int, bool] = {}
    by_step: dict[int, list[tuple[str, int, int]]] = {}
    for step, phase, a, b, _ in rows:
        by_step.setdefault(step, []).append((phase, a, b))
    for step, parts in by_step.items():
        fwd = next(((a, b) for ph, a, b in parts if ph == "forward"), None)
        bwd = next(((a, b) for ph, a, b in parts if ph == "backward"), None)
        hits, picks = 0, []
        if fwd is not None and bwd is not None and fwd[1] - fwd[0] + 1 >= RECOMPUTE_WINDOW:
            haystack = codes[bwd[0]: bwd[1] + 1].tobytes()
            picks = list(range(fwd[0], fwd[1] + 2 - RECOMPUTE_WINDOW, RECOMPUTE_WINDOW))
            for at in picks:
                needle = codes[at: at + RECOMPUTE_WINDOW].tobytes()
                pos = haystack.find(needle)
                while pos >= 0 and pos % 4:  # whole codes only
                    pos = haystack.find(needle, pos + 1)
                hits += pos >= 0
        found[step] = bool(picks) and hits >= RECOMPUTE_SHARE * len(picks)
    return [found[r[0]] for r in rows]


def _portions(autograd: np.ndarray, optimizer: np.ndarray, is_kernel: np.ndarray, d2h_bytes: np.ndarray,
              comm: np.ndarray) -> list[tuple[int, str, int, int, int]]:
    """``(step, phase, first, last, micro_batches)`` of one GPU's operations in launch order
    (``autograd``: launched by autograd's thread; ``optimizer``: an optimizer kernel;
    ``d2h_bytes``: bytes of device-to-host copies, else 0), positions inclusive; only whole
    steps (after the first optimizer, up to the last). A step's first forward holds periodic
    work when it runs more than twice the median forward's operations, or copies more than
    twice the median forward's bytes, and at least :data:`CHECKPOINT_MIN_BYTES`, to the host
    (a checkpoint's tensors). Collectives the
    training thread launches right after the backward, before the optimizer (``comm``: a
    gradient all-reduce written by hand), count in the backward, where DDP's hooks put them."""
    n = autograd.size
    if n == 0:
        return []
    change = np.flatnonzero(np.diff(autograd.astype(np.int8))) + 1
    bounds = np.concatenate([[0], change, [n]])
    raw: list[tuple[str, int, int]] = []  # (phase, first, last) in order; "|" marks a step's end
    seen_backward = False
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        if autograd[a]:
            raw.append(("backward", a, b - 1))
            seen_backward = True
            continue
        opt = np.flatnonzero(optimizer[a:b])
        if seen_backward and opt.size:
            cut = a + int(opt[-1])
            lead = a
            while lead < cut and comm[lead]:
                lead += 1
            if lead > a:
                raw.append(("backward", a, lead - 1))
            raw.append(("optimizer", lead, cut))
            raw.append(("|", cut, cut))
            if cut + 1 < b:
                raw.append(("forward", cut + 1, b - 1))
            seen_backward = False
        else:
            raw.append(("forward", a, b - 1))
    ends = [i for i, r in enumerate(raw) if r[0] == "|"]
    if len(ends) < 2:
        return []
    # the median forward's size: a step's first forward with more than twice it holds periodic work
    fwd = [r for r in raw[ends[0] + 1: ends[-1]] if r[0] == "forward"]
    median = float(np.median([r[2] - r[1] + 1 for r in fwd])) if fwd else 0.0
    csum = np.concatenate([[0], np.cumsum(d2h_bytes)])
    median_bytes = float(np.median([csum[r[2] + 1] - csum[r[1]] for r in fwd])) if fwd else 0.0
    out: list[tuple[int, str, int, int, int]] = []
    for step, (e0, e1) in enumerate(zip(ends[:-1], ends[1:], strict=True)):
        body = raw[e0 + 1: e1]
        micro = sum(1 for j, r in enumerate(body) if r[0] == "backward" and (j == 0 or body[j - 1][0] != "backward"))
        for i, (phase, a, b) in enumerate(body):
            size = b - a + 1
            copied = csum[b + 1] - csum[a]
            if i == 0 and phase == "forward" and median and size > median + 1 and (
                    size > 2 * median or copied > max(2 * median_bytes, CHECKPOINT_MIN_BYTES)):
                keep = int(round(median))
                extra_lo, extra_hi = a, b - keep
                kernels = int(is_kernel[extra_lo: extra_hi + 1].sum())
                what = "evaluation" if kernels >= 0.5 * (extra_hi - extra_lo + 1) else "checkpoint"
                out.append((step, what, extra_lo, extra_hi, micro))
                a = extra_hi + 1
            out.append((step, phase, a, b, micro))
    return out


def training_summary(phases: pl.DataFrame) -> pl.DataFrame:
    """Per phase (:data:`PHASES`), the median over steps and GPUs of :func:`training_phases`
    (ns): ``time_ns`` (the phase's spans), ``compute_ns`` (compute, alone or beside
    communication), ``kernel_ns`` (its kernels' GPU time), ``communication_ns``,
    ``exposed_comm_ns`` and ``idle_ns``; ``share`` of the median step (the phases' medians,
    summed); ``steps`` measured (step × GPU pairs); ``micro_batches`` per step (median; null
    when read from names), ``recompute`` (most steps run their forward again inside the backward:
    activation checkpointing; null when read from names) and ``by`` (``thread`` or ``names``)."""
    schema = {"phase": pl.Utf8, "steps": pl.Int64, "time_ns": pl.Float64, "compute_ns": pl.Float64, "kernel_ns": pl.Float64,
              "communication_ns": pl.Float64, "exposed_comm_ns": pl.Float64, "idle_ns": pl.Float64, "share": pl.Float64,
              "micro_batches": pl.Float64, "recompute": pl.Boolean, "by": pl.Utf8}
    phases = phases.filter(pl.col("phase").is_in(PHASES)) if phases.height else phases
    if phases.height == 0:
        return pl.DataFrame(schema=schema)
    # a step without a phase's work (no optimizer kernel seen) counts as zero for that phase
    grid = phases.select([c for c in phases.columns if c in ("rank", "device_id", "step", "micro_batches", "recompute", "by")]).unique(
        subset=[c for c in ("rank", "device_id", "step") if c in phases.columns])
    full = grid.join(pl.DataFrame({"phase": list(PHASES)}), how="cross").join(
        phases.drop("micro_batches", "recompute", "by", strict=False), on=[*[c for c in ("rank", "device_id", "step") if c in phases.columns], "phase"],
        how="left").with_columns(pl.col(c).fill_null(0) for c in (*_PHASE_COLUMNS, "kernel_ns"))
    per = full.group_by("phase").agg(
        pl.len().cast(pl.Int64).alias("steps"), pl.col("window_ns").median().alias("time_ns"),
        (pl.col("compute_only_ns") + pl.col("overlap_ns")).median().alias("compute_ns"),
        pl.col("kernel_ns").median().cast(pl.Float64).alias("kernel_ns"),
        pl.col("communication_ns").median().alias("communication_ns"), pl.col("exposed_comm_ns").median().alias("exposed_comm_ns"),
        pl.col("idle_ns").median().alias("idle_ns"), pl.col("micro_batches").median().cast(pl.Float64).alias("micro_batches"),
        (pl.col("recompute").cast(pl.Float64).mean() > 0.5).alias("recompute"), pl.col("by").first())
    order = pl.col("phase").replace_strict(list(PHASES), list(range(len(PHASES))), return_dtype=pl.Int64)
    per = per.sort(order)
    total = float(per["time_ns"].sum() or 0)
    return per.with_columns((pl.col("time_ns") / total if total else pl.lit(None, pl.Float64)).alias("share")).select(list(schema))


def periodic_summary(phases: pl.DataFrame) -> pl.DataFrame:
    """The periodic work :func:`training_phases` set apart (:data:`PERIODIC`), per kind:
    ``count`` (per GPU), ``total_ns``, ``median_ns`` and ``max_ns`` of its spans, ``kernel_ns``
    (its kernels' GPU time, summed), ``first_ns`` (the first one's start). Empty when none."""
    rows = phases.filter(pl.col("phase").is_in(PERIODIC)) if phases.height else phases
    if rows.height == 0:
        return pl.DataFrame(schema={"what": pl.Utf8, "count": pl.Int64, "total_ns": pl.Int64, "median_ns": pl.Float64,
                                    "max_ns": pl.Int64, "kernel_ns": pl.Int64, "first_ns": pl.Int64})
    return rows.group_by(pl.col("phase").alias("what")).agg(
        pl.len().cast(pl.Int64).alias("count"), pl.col("window_ns").sum().cast(pl.Int64).alias("total_ns"),
        pl.col("window_ns").median().cast(pl.Float64).alias("median_ns"), pl.col("window_ns").max().cast(pl.Int64).alias("max_ns"),
        pl.col("kernel_ns").sum().cast(pl.Int64).alias("kernel_ns"), pl.col("start_ns").min().alias("first_ns")).sort("first_ns")


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
