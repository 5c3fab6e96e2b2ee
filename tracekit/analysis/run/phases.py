"""Generation phases: the prefill, then one decode step per output token, and what each costs.

A ``generate()`` call or a served request is a prefill (the prompt's forward, which gives the
first token) followed by decode steps (one token each). :func:`generation_steps` finds the
steps, from the first of these sources that gives at least :data:`MIN_STEPS`:

1. ``nvtx``: ranges named ``prefill`` (also ``prompt``/``context`` as words) and the
   iteration ranges (``decode.N``, ``step.N`` …, :data:`~tracekit.analysis.run.iterations.ITERATION_WORDS`);
2. ``module``: one step per forward, the ranges that run the model's layers once
   (:func:`tracekit.analysis.layers.forward_ranges`: the root module's range that
   ``tracekit.torch.annotate`` / ``--annotate-torch`` pushes, ``Qwen3ForCausalLM``), else an
   outermost NVTX range of the default domain that repeats under one name;
3. ``graph_replays``: each replay of the CUDA graph that holds the most GPU time is a decode
   step (serving engines, ``torch.compile(mode="reduce-overhead")``); the GPU work before the
   first replay, back to the previous idle gap longer than a step, is the prefill;
4. ``kernel_loop``: one step per instance of the loop of one-token forwards on the busiest GPU,
   found from the names that run once per forward (:func:`tracekit.analysis.run.loops.token_loop`:
   the embedding, the final norm, the LM head and the sampling run once per token, the
   layers' kernels once per layer), over every ``generate()`` call of the capture.

Without a ``prefill`` range, the prefills are: of several ``generate()`` calls found in the
kernel loop, each call's first forward; of an engine's steps (a kernel loop whose steps differ
in size), every step that launched a prompt's forward besides the decode
(:func:`engine_prefills`: counted from its operations, ``prefills`` per step); of forwards
(``module``) and other kernel-loop steps, every step whose GPU busy time is at least
``prefill_factor`` (:data:`~tracekit.analysis.layers.PREFILL_FACTOR`) times the median step's
(the prompt's forward does a prompt's worth of work). NVTX step ranges without a prefill range
have none: a heavy first step is no prompt (NCCL's first wait, a cold start). A loop is only a
generation with evidence that it makes tokens: a prefill, a decode name, graph replays, or
(``tokens``) the sampled ids copied to the host every step.

:func:`phase_summary` gives per phase the time to first token, the time per output token
(median and 90th percentile of the intervals between decode steps) and the GPU busy share.
Times are as seen inside the capture: queueing, tokenisation and anything before the first
traced launch are not in them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import polars as pl

from tracekit.analysis._frames import interval_union, process_key, rank_keys, span_and_busy
from tracekit.analysis.attribution import _nvtx_tree
from tracekit.analysis.layers import PREFILL_FACTOR, forward_ranges
from tracekit.analysis.run.forwards import TokenReading
from tracekit.analysis.run.iterations import DEFAULT_ITERATION_PATTERN, word_pattern
from tracekit.analysis.run.loops import (
    REGULAR,
    find_loops,
    host_copy_codes,
    idle_before,
    main_loop,
    name_codes,
    split_at_host_copies,
    token_loop,
)

__all__ = ["DECODE_PATTERN", "MIN_STEPS", "PREFILL_PATTERN", "REQUEST_COLUMNS", "STEP_COLUMNS", "engine_prefills", "forward_steps",
           "generation_steps", "name_requests", "number_requests", "phase_summary", "requests", "trace_generation_steps"]

#: At least this many steps make a generation (fewer: no phases).
MIN_STEPS = 3
#: NVTX names of a prefill range (as words).
PREFILL_PATTERN = word_pattern(("prefill", "prompt", "context"))
#: NVTX step names that say the steps generate tokens (as words): without a prefill step, a
#: loop is a generation only when its steps are named so (or are CUDA graph replays).
DECODE_PATTERN = word_pattern(("decode", "generate", "generation", "token", "sample", "sampling"))

#: Columns of :func:`generation_steps`, in order (``rank`` first for a trace set).
STEP_COLUMNS: dict[str, pl.DataType | type[pl.DataType]] = {
    "step": pl.Int64, "phase": pl.Utf8, "source": pl.Utf8, "name": pl.Utf8, "start_ns": pl.Int64, "end_ns": pl.Int64,
    "gpu_start_ns": pl.Int64, "gpu_end_ns": pl.Int64, "gpu_busy_ns": pl.Int64, "ops": pl.Int64, "interval_ns": pl.Int64,
    "prefills": pl.Int64, "rows": pl.Int64, "draft": pl.Int64,
}


#: The operation columns :func:`generation_steps` reads (with ``rank`` of a trace set).
_OP_COLUMNS = ("device_id", "start_ns", "end_ns", "duration_ns", "name", "op_kind", "global_tid", "api_start_ns")
#: Of those, what the NVTX steps read (:func:`_cpu_steps`, :func:`_busy`).
_NVTX_STEP_COLUMNS = ("device_id", "start_ns", "end_ns", "global_tid", "api_start_ns")

#: Repeated outermost ranges are forwards only when the work launched inside them holds at
#: least this share of the GPU's busy time of the work launched from the first range's start to
#: the last one's end (not of the whole trace: a model initialised on the GPU, with random
#: weights, can take most of a short generation's GPU time before the first forward).
MODULE_SHARE = 0.5


def _busy(ops: pl.DataFrame, rk: list[str]) -> int:
    if ops.height == 0:
        return 0
    return int(interval_union(ops, [*rk, "device_id"]).select((pl.col("end_ns") - pl.col("start_ns")).sum()).item())


def _empty(rk: list[str]) -> pl.DataFrame:
    return pl.DataFrame(schema={**{k: pl.Int64 for k in rk}, **STEP_COLUMNS})


def _cpu_steps(ranges: pl.DataFrame, ops: pl.DataFrame, rk: list[str]) -> pl.DataFrame:
    """GPU span and busy time of the operations launched inside each CPU range (same process,
    any thread): ``ranges`` has ``_sid``, ``start_ns``, ``end_ns``, ``_proc``.

    An operation belongs to the latest range of its process that starts at or before its
    launch call's start, when the call starts before that range ends: a binary search per
    process over the ranges' starts, then :func:`~tracekit.analysis._frames.span_and_busy`
    over the matched operations, on numpy arrays of the few columns read and a block of
    operations at a time (on a 1.09 M-kernel decode export a sort and as-of join peaked
    150 MiB above its inputs, a frame of the matched operations and its interval union
    ~95 MiB; this stays below the launch join that built ``ops``, benchmarks/README.md,
    "Issue 37")."""
    by = [*rk, "_proc"]
    out: list[pl.DataFrame] = []
    schema: dict[str, pl.DataType] = {**{c: ops.schema[c] for c in rk}, **dict.fromkeys(
        ("_sid", "gpu_start_ns", "gpu_end_ns", "gpu_busy_ns", "ops"), pl.Int64())}
    if ops.height == 0:
        return pl.DataFrame(schema=schema)
    usable = ops.select(pl.all_horizontal(pl.col("api_start_ns", "device_id", "start_ns", "end_ns").is_not_null())).to_series().to_numpy()
    calls = ops["api_start_ns"].fill_null(0).to_numpy()
    owners = ops.select(*rk, process_key("global_tid").alias("_proc"))
    procs = owners.unique()
    if procs.height == 1:  # every operation is the one process's: its column is not needed
        owners = owners.clear()
    for key, r in ranges.sort("start_ns").group_by(by, maintain_order=True):
        match = pl.all_horizontal([pl.col(c) == v if v is not None else pl.col(c).is_null() for c, v in zip(by, key, strict=True)])
        if procs.filter(match).height == 0:
            continue
        # this process's operations only (all of them when there is one)
        keep = usable & owners.select(match.fill_null(False)).to_series().to_numpy() if procs.height > 1 else usable.copy()
        starts = r["start_ns"].to_numpy()
        at = np.searchsorted(starts, calls, side="right") - 1
        keep &= at >= 0
        keep &= calls <= r["end_ns"].to_numpy()[np.maximum(at, 0)]
        at[~keep] = -1  # not launched inside one of these ranges: no group
        del keep
        span = span_and_busy(at, ops["device_id"], ops["start_ns"], ops["end_ns"], len(starts))
        del at
        have = span["ops"] > 0
        frame = pl.DataFrame({"_sid": r["_sid"].to_numpy()[have], **{c: v[have] for c, v in span.items()}})
        out.append(frame.with_columns(*[pl.lit(v, ops.schema[c]).alias(c) for c, v in zip(rk, key, strict=False)]))
    if not out:
        return pl.DataFrame(schema=schema)
    return pl.concat(out, how="vertical_relaxed").select([pl.col(c).cast(t) for c, t in schema.items()])


def _gpu_of(j: pl.DataFrame, key: str, rk: list[str]) -> pl.DataFrame:
    if j.height == 0:
        return pl.DataFrame(schema={**{k: pl.Int64 for k in rk}, key: pl.Int64, "gpu_start_ns": pl.Int64, "gpu_end_ns": pl.Int64,
                                    "gpu_busy_ns": pl.Int64, "ops": pl.Int64})
    busy = interval_union(j, [*rk, key, "device_id"]).group_by([*rk, key]).agg(
        (pl.col("end_ns") - pl.col("start_ns")).sum().alias("gpu_busy_ns"))
    span = j.group_by([*rk, key]).agg(pl.col("start_ns").min().alias("gpu_start_ns"), pl.col("end_ns").max().alias("gpu_end_ns"),
                                      pl.len().cast(pl.Int64).alias("ops"))
    return span.join(busy, on=[*rk, key])


def _nvtx_ranges(nvtx: pl.DataFrame, rk: list[str]) -> pl.DataFrame:
    tree = _nvtx_tree(nvtx, rk, paths=False, labels=True, lean=True)
    return tree.select(*rk, "pid", "global_tid", "start_ns", "end_ns", "label", "level", "range_id").filter(
        pl.col("end_ns").is_not_null())


def _from_nvtx(nvtx: pl.DataFrame, rk: list[str], pattern: str) -> tuple[pl.DataFrame, str] | None:
    """Prefill ranges and iteration ranges (outermost of each kind), else repeated outermost
    ranges of one name (per-forward module ranges)."""
    if nvtx.height == 0:
        return None
    r = _nvtx_ranges(nvtx, rk)
    if r.height == 0:
        return None
    is_pre = pl.col("label").str.contains(f"(?i){PREFILL_PATTERN}").fill_null(False)
    is_it = pl.col("label").str.contains(f"(?i){pattern}").fill_null(False)
    tagged = r.filter(is_pre | is_it).with_columns(is_pre.alias("_pre"))
    # outermost: no tagged range of the same process encloses it
    tagged = _outermost(tagged, rk)
    if tagged.filter(~pl.col("_pre")).height >= MIN_STEPS - 1 or (tagged.height >= MIN_STEPS and tagged["_pre"].any()):
        return tagged.with_columns(pl.when(pl.col("_pre")).then(pl.lit("prefill")).otherwise(None).alias("_phase")), "nvtx"
    # one forward per range that runs the model's layers once (tracekit.analysis.layers), else
    # per outermost range of the default domain that repeats under one name (not a library's
    # own ranges: NCCL's ncclAllReduce repeats too)
    fwd = forward_ranges(nvtx)
    if fwd.height >= MIN_STEPS:
        return fwd.rename({"name": "label"}).with_columns(pl.lit(False).alias("_pre"), pl.lit(None, pl.Utf8).alias("_phase")), "module"
    default = _nvtx_ranges(nvtx.filter(pl.col("domain").is_null() | (pl.col("domain") == "")), rk) if "domain" in nvtx.columns else r
    top = _outermost(default.with_columns(pl.lit(False).alias("_pre")), rk)
    # ties (two ranks' processes with as many steps) go to the lowest rank/pid, then label:
    # a group-by's order is not fixed, and the pick must not change from run to run
    counts = top.group_by([*rk, "pid", "label"]).len().filter(pl.col("len") >= MIN_STEPS)
    counts = counts.sort(["len", *rk, "pid", "label"], descending=[True, *[False] * (len(rk) + 2)], nulls_last=True)
    if counts.height == 0:
        return None
    best = counts.head(1).select(*rk, "pid", "label")
    return top.join(best, on=[*rk, "pid", "label"]).with_columns(pl.lit(None, pl.Utf8).alias("_phase")), "module"


def _outermost(r: pl.DataFrame, rk: list[str]) -> pl.DataFrame:
    """Rows of ``r`` (ranges with ``start_ns``, ``end_ns``, ``global_tid``) not inside another
    row of the same thread."""
    if r.height == 0:
        return r
    r = r.sort([*rk, "global_tid", "start_ns", pl.col("end_ns")], descending=[*([False] * len(rk)), False, False, True])
    prev_end = pl.col("end_ns").cum_max().shift(1).over([*rk, "global_tid"])
    return r.filter(prev_end.is_null() | (pl.col("start_ns") >= prev_end))


def _from_graphs(launches: pl.DataFrame, ops: pl.DataFrame, rk: list[str]) -> pl.DataFrame | None:
    """One decode step per replay of the graph holding most GPU time; the GPU work before the
    first replay back to the previous long idle gap is a prefill step."""
    if launches is None or launches.height < MIN_STEPS:
        return None
    key = [*rk, "device_id", "pid", "graph_exec_id"]
    per = launches.group_by(key).agg(pl.len().alias("n"), pl.col("gpu_time_ns").sum().alias("g")).filter(pl.col("n") >= MIN_STEPS)
    if per.height == 0:
        return None
    top = per.sort(["g", *key], descending=[True, *[False] * len(key)], nulls_last=True).head(1)  # ties: lowest key
    dev = top.select([*rk, "device_id"])
    reps = launches.join(top.select(key), on=key).sort("start_ns")
    steps = reps.select(*rk, pl.col("start_ns").alias("gpu_start_ns"), pl.col("end_ns").alias("gpu_end_ns"),
                        pl.col("gpu_time_ns").alias("gpu_busy_ns"), pl.col("kernels").fill_null(1).cast(pl.Int64).alias("ops"),
                        pl.col("api_start_ns").alias("start_ns"), pl.col("nvtx_path").alias("name"))
    steps = steps.with_columns(pl.coalesce("start_ns", "gpu_start_ns").alias("start_ns"), pl.col("gpu_end_ns").alias("end_ns"),
                               pl.lit("decode").alias("phase"))
    first = int(reps["start_ns"][0])
    median = float(np.median(np.diff(reps["start_ns"].to_numpy()))) if reps.height > 1 else 0.0
    d = ops.join(dev, on=[*rk, "device_id"]).filter((pl.col("end_ns") <= first) & (pl.col("op_kind") != "graph")).sort("start_ns")
    parts = [steps]
    if d.height:
        merged = interval_union(d, [])
        gaps = merged["start_ns"].to_numpy()[1:] - merged["end_ns"].to_numpy()[:-1]
        cut = np.nonzero(gaps > max(median, 1.0))[0]
        lo = int(merged["start_ns"][int(cut[-1]) + 1]) if cut.size else int(merged["start_ns"][0])
        pre = d.filter(pl.col("start_ns") >= lo)
        if pre.height:
            busy = interval_union(pre, []).select((pl.col("end_ns") - pl.col("start_ns")).sum()).item()
            launch = pre["api_start_ns"].min() if "api_start_ns" in pre.columns else None
            g0, g1 = int(pre["start_ns"].min()), int(pre["end_ns"].max())  # type: ignore[arg-type]
            row = {**{k: top[k][0] for k in rk}, "gpu_start_ns": g0, "gpu_end_ns": g1, "gpu_busy_ns": int(busy), "ops": pre.height,
                   "start_ns": int(launch) if launch is not None else g0, "name": None, "end_ns": g1, "phase": "prefill"}  # type: ignore[arg-type]
            parts.insert(0, pl.DataFrame([row], schema=steps.schema))
    return pl.concat(parts, how="vertical_relaxed")


def _from_loops(ops: pl.DataFrame, rk: list[str], labels: pl.Series | None = None) -> pl.DataFrame | None:
    """One step per instance of the token loop (:func:`~tracekit.analysis.run.loops.token_loop`) of
    the busiest GPU's operations: each forward of a token (the prompt's included), also over
    several ``generate()`` calls; the work before the first instance, when the loop holds no
    prompt forward, is a prefill step."""

    if ops.height < 2 * MIN_STEPS:
        return None
    dev = [*rk, "device_id"]
    busiest = ops.group_by(dev).agg(pl.col("duration_ns").sum())
    busiest = busiest.sort(["duration_ns", *dev], descending=[True, *[False] * len(dev)], nulls_last=True).head(1).select(dev)
    k = ops.join(busiest, on=dev).sort("start_ns")
    names = k["name"]  # integer codes from a big export's narrow read (equal names, equal codes)
    codes = name_codes(names)
    loops = find_loops(codes, k["start_ns"].to_numpy(), k["end_ns"].to_numpy(), min_repeats=MIN_STEPS)
    copies = host_copy_codes(names, codes, labels)
    main = main_loop(loops, host_copies=copies)
    if main is None:
        return None
    loop = token_loop(loops, main)
    starts = k["start_ns"].to_numpy()
    gap = idle_before(starts, k["end_ns"].to_numpy())
    # a step without the loop's kernel names (a compiled prompt forward specialised to its
    # length) is cut from the step before it at that step's copy of the sampled ids
    bounds = split_at_host_copies(loop.bounds, loop.stop, codes, gap, copies)
    phase: np.ndarray | None = None
    if loop is not main:
        # several generate() calls (main) of one forward per token: each call's first is its prompt's
        call = np.searchsorted(main.bounds, bounds, side="right") - 1
        phase = np.where(np.diff(np.concatenate([[-1], call])) != 0, "prefill", "decode")
    elif main.regular < REGULAR:
        # an engine's steps, some of which also run an arriving request's prompt: those are
        # heavier anywhere in the run (marked below, by GPU busy time)
        phase = np.full(bounds.size, "", dtype=object)
    first = int(bounds[0])
    ids = np.full(k.height, -1, dtype=np.int64)
    lead = 0
    if first > 0 and loop is main:
        # before the loop, back to the last idle gap longer than a step: the prompt's forward
        # when the loop holds none (what lies before that gap is start-up)
        step = float(np.median(np.diff(starts[bounds]))) if bounds.size > 1 else 0.0
        long = np.nonzero(gap[1 : first + 1] > max(step, 1.0))[0]
        lead = first - (int(long[-1]) + 1 if long.size else 0)
        ids[first - lead : first] = 0
    shift = 1 if lead else 0
    for i, (a, b) in enumerate(zip(bounds, np.append(bounds[1:], loop.stop), strict=True)):
        ids[int(a) : int(b)] = i + shift
    j = k.with_columns(pl.Series("_sid", ids)).filter(pl.col("_sid") >= 0)
    steps = _gpu_of(j, "_sid", rk).sort("_sid")
    phases: pl.Expr | pl.Series = pl.lit(None, pl.Utf8)
    if phase is not None:
        full = np.concatenate([["prefill"] if shift else [], phase]).astype(object)
        phases = pl.Series("phase", [p or "?" for p in full], dtype=pl.Utf8).gather(steps["_sid"])
    steps = steps.with_columns(pl.col("gpu_start_ns").alias("start_ns"), pl.col("gpu_end_ns").alias("end_ns"),
                               pl.lit(None, pl.Utf8).alias("name"), phases.alias("phase"))
    return steps.drop("_sid")


def engine_prefills(ops: np.ndarray, busy: np.ndarray, prefill_factor: float = PREFILL_FACTOR) -> np.ndarray:
    """How many prompts each step of an engine ran besides its decode (0 for a decode-only
    step): a prompt's forward launches about as many operations as the batched decode forward,
    so a step's operations are the usual decode step's (the most common count, ``M``) plus
    ``k`` times a prompt's (``P``), or ``k·P`` alone when no request was decoding. ``P`` is
    read off the steps above and below ``M`` (the smallest such difference and those within
    half of it again). Without such steps, a step with ``prefill_factor`` times the median
    GPU busy time ran one prompt."""
    if ops.size == 0:
        return np.zeros(0, dtype=np.int64)
    values, counts = np.unique(ops, return_counts=True)
    m = float(values[np.argmax(counts)])
    above = ops[ops > 1.2 * m] - m
    below = ops[(ops < 0.8 * m) & (ops > 0.2 * m)]
    cands = np.concatenate([above, below]).astype(float)
    if cands.size == 0:
        return (busy >= prefill_factor * float(np.median(busy))).astype(np.int64)
    p = float(np.median(cands[cands <= 1.5 * cands.min()]))
    k = np.zeros(ops.size, dtype=np.int64)
    hi = ops > 1.2 * m
    lo = (ops < 0.8 * m) & (ops > 0.2 * m)
    k[hi] = np.maximum(np.rint((ops[hi] - m) / p), 1).astype(np.int64)
    k[lo] = np.maximum(np.rint(ops[lo] / p), 1).astype(np.int64)
    return k


def _phases_from_forwards(steps: pl.DataFrame, reading: TokenReading) -> pl.DataFrame:
    """Per-forward module ranges (``steps``, source ``module``) with the phase and rows of the
    kernels' reading of the same forwards (``reading.main_forwards``): a range says where a
    forward is, its kernels whether it read a prompt (the embedding lookup's rows, its GEMMs).
    Each range takes the forward whose GPU start is nearest its own; unchanged when the two
    count different forwards or the reading makes no tokens (then the heavy-step rule of
    :func:`generation_steps` reads them)."""
    main = reading.main_forwards
    if reading.tokens is None or reading.serving or main.height != steps.height or steps["gpu_start_ns"].null_count():
        return steps
    main = main.select(pl.col("start_ns").alias("_fwd_start"), pl.col("phase").alias("_fwd_phase"), pl.col("tokens_in").alias("rows"))
    out = steps.with_row_index("_i").sort("gpu_start_ns").join_asof(
        main.sort("_fwd_start"), left_on="gpu_start_ns", right_on="_fwd_start", strategy="nearest", check_sortedness=False)
    if out["_fwd_start"].n_unique() != steps.height:  # not one forward per range
        return steps
    return out.sort("_i").with_columns(pl.coalesce("phase", "_fwd_phase").alias("phase")).drop("_i", "_fwd_start", "_fwd_phase")


def forward_steps(reading: TokenReading, rk: list[str] | None = None) -> pl.DataFrame:
    """The token steps of forward passes read from the kernels (:func:`tracekit.analysis.run.
    forwards.read_tokens`; source ``forwards``): of a generation one step per forward of the
    main model (``phase`` prefill or decode, ``rows`` the rows its embedding gathered where
    known, ``draft`` the draft model's forwards since the main model's previous one); of a
    server (continuous batching) one step per engine step (``prefills`` the prompts' forwards
    in it, ``rows`` its decode forward's rows). Times are the forwards' GPU spans. Empty when
    the forwards make no tokens."""
    rk = rk or []
    if reading.tokens is None:
        return _empty(rk)
    f = reading.forwards.sort("start_ns").with_columns(
        (pl.col("role") == "main").cast(pl.Int64).cum_sum().alias("_main"), (pl.col("role") == "draft").alias("_draft"))
    # a draft's forwards count towards the main model's next forward; a prompt's forward starts
    # with the draft's or the encoder's forward over the prompt before it
    helper = pl.col("role").is_in(["draft", "encoder"])
    drafts = f.group_by("_main").agg(pl.col("_draft").sum().alias("draft"),
                                     pl.col("start_ns").filter(helper).min().alias("_draft_start"))
    main = f.filter(pl.col("role") == "main").with_columns((pl.col("_main") - 1).alias("_prev"))
    main = main.join(drafts.select(pl.col("_main").alias("_prev"), "draft", "_draft_start"), on="_prev", how="left")
    # a request's first token needs the draft's forward over the prompt too: its prefill starts there
    main = main.with_columns(pl.when(pl.col("phase") == "prefill").then(pl.min_horizontal("start_ns", "_draft_start"))
                             .otherwise(pl.col("start_ns")).alias("start_ns"),
                             # a prompt's forward ends, for its request, when its token reaches the host
                             pl.when(pl.col("phase") == "prefill").then(pl.coalesce("token_ns", "end_ns")).otherwise(pl.col("end_ns"))
                             .alias("end_ns"))
    has_draft = bool(f["_draft"].any())
    main = main.with_columns(pl.col("draft").fill_null(0) if has_draft else pl.lit(None, pl.Int64).alias("draft"))
    if reading.serving:
        main = main.group_by("engine_step", maintain_order=True).agg(
            pl.col("start_ns").min(), pl.col("end_ns").max(), pl.col("gpu_busy_ns").sum(), pl.col("ops").sum(),
            (pl.col("phase") == "prefill").sum().cast(pl.Int64).alias("prefills"),
            pl.col("tokens_in").filter(pl.col("phase") == "decode").last().alias("tokens_in"), pl.col("draft").sum())
        main = main.with_columns(pl.when(pl.col("prefills") > 0).then(pl.lit("prefill")).otherwise(pl.lit("decode")).alias("phase"))
    else:
        main = main.with_columns((pl.col("phase") == "prefill").cast(pl.Int64).alias("prefills"))
    steps = main.sort("start_ns").select(
        *[pl.lit(None, pl.Int64).alias(k) for k in rk], "phase", pl.lit(None, pl.Utf8).alias("name"), "start_ns", "end_ns",
        pl.col("start_ns").alias("gpu_start_ns"), pl.col("end_ns").alias("gpu_end_ns"), "gpu_busy_ns", "ops", "prefills",
        pl.col("tokens_in").alias("rows"), "draft")
    return steps.with_columns(pl.lit("forwards").alias("source"), pl.int_range(pl.len(), dtype=pl.Int64).alias("step"),
                              (pl.col("start_ns").shift(-1) - pl.col("start_ns")).alias("interval_ns")).select(
        *rk, *[pl.col(c).cast(t) for c, t in STEP_COLUMNS.items()])


def _get_all(ops: pl.DataFrame, get: Callable[[list[str]], pl.DataFrame] | None) -> pl.DataFrame:
    """Every column :func:`generation_steps` reads, from ``get`` (``ops`` when it has them)."""
    return ops if get is None else get(["rank", *_OP_COLUMNS])


def _step_rank_keys(ops: pl.DataFrame, nvtx: pl.DataFrame) -> list[str]:
    """The rank key of the steps: ``rank`` when the operations or (holding rows) the NVTX
    ranges have it."""
    return rank_keys(ops, nvtx) if nvtx.height else rank_keys(ops)


def generation_steps(
    ops_with_launch: pl.DataFrame | Callable[[list[str]], pl.DataFrame],
    nvtx: pl.DataFrame,
    graph_launches: pl.DataFrame | None = None,
    *,
    pattern: str = DEFAULT_ITERATION_PATTERN,
    prefill_factor: float = PREFILL_FACTOR,
    tokens: bool = False,
    forwards: TokenReading | None = None,
    labels: pl.Series | None = None,
) -> pl.DataFrame:
    """The prefill and decode steps of a generation (see the module doc for the sources).

    Parameters
    ----------
    ops_with_launch
        :func:`~tracekit.analysis._frames.gpu_ops` with the launch columns
        (:func:`~tracekit.analysis.attribution.launch_info`): ``device_id``, ``start_ns``,
        ``end_ns``, ``duration_ns``, ``name``, ``op_kind``, ``global_tid``, ``api_start_ns``.
        Or a function giving those of its columns that a source reads (given their names;
        it may give more), called once the NVTX ranges are found, so that the range tree and
        millions of operations are not held at once, and only with the columns each source
        reads (the NVTX steps: the launch columns, device and times).
    nvtx
        The ``nvtx`` table (empty frame when none).
    graph_launches
        :func:`~tracekit.analysis.graphs.graph_launches`, for graph-replayed decode.
    pattern
        Iteration range names (regular expression, case-insensitive).
    prefill_factor
        Without a prefill range, a forward or kernel-loop step with at least this many times
        the median GPU busy time is a prefill (NVTX step ranges need a prefill range).
    forwards
        Forward passes read from the kernels (:func:`tracekit.analysis.run.forwards.read_tokens`):
        the source after the NVTX ranges (:func:`forward_steps`).
    labels
        Where the operations' ``name`` holds integer codes: the text of each code.
    tokens
        Whether the steps are known to make tokens (:func:`tracekit.analysis.run.structure.
        token_evidence`: the sampled ids copied to the host each step): needed for steps found
        in the kernel loop, and for NVTX steps without a prefill or decode name.

    Returns
    -------
    One row per step, in time order: :data:`STEP_COLUMNS` — ``step`` (0-based), ``phase``
    (``prefill``/``decode``), ``source`` (``nvtx``, ``module``, ``graph_replays``,
    ``kernel_loop``), ``name`` (the range's label, or the launch's NVTX path), ``start_ns``/
    ``end_ns`` (the CPU range for NVTX sources; the launch call to the replay's end for graph
    replays; the GPU span otherwise), ``gpu_start_ns``/``gpu_end_ns``/``gpu_busy_ns`` (its GPU
    work: span and union, ns), ``ops``, ``interval_ns`` (next step's start − this one's: the
    time per output token of a decode step; null for the last). Empty when no source gives
    :data:`MIN_STEPS` steps, or when nothing says the steps generate tokens: no prefill step
    (a range, a call's first forward or a heavy step), no step named as :data:`DECODE_PATTERN` and not graph
    replays (a training loop's ``step.N`` is not a decode); of a trace set, the rank (or
    process) with the most steps.
    """
    get: Callable[[list[str]], pl.DataFrame] | None = None
    if callable(ops_with_launch):
        get = ops_with_launch
        rk = rank_keys(nvtx) if nvtx.height else []
        found = _from_nvtx(nvtx, rk, pattern)
        if found is None and forwards is None and not tokens and (graph_launches is None or graph_launches.height == 0):
            # only the kernel loop is left, and without a sign of tokens it makes no steps
            # (below): the operations' times and names are not read, only whether they have ranks
            return _empty(_step_rank_keys(get(["rank"]), nvtx))
        # the NVTX steps read the launch columns, devices and times; the other sources more
        ops_with_launch = get([*rk, *(_NVTX_STEP_COLUMNS if found is not None else _OP_COLUMNS)])
        if found is None:
            get = None
        if rk != _step_rank_keys(ops_with_launch, nvtx):  # ranks in one only
            return generation_steps(_get_all(ops_with_launch, get), nvtx, graph_launches, pattern=pattern, prefill_factor=prefill_factor,
                                    tokens=tokens, forwards=forwards, labels=labels)
    else:
        rk = _step_rank_keys(ops_with_launch, nvtx)
        found = _from_nvtx(nvtx, rk, pattern) if "api_start_ns" in ops_with_launch.columns else None
    steps: pl.DataFrame | None = None
    source = ""
    if found is not None:
        ranges, source = found
        ranges = ranges.with_columns(process_key("global_tid").alias("_proc"))
        main = ranges.group_by([*rk, "pid"]).len()  # ties: the lowest rank/pid (as in _from_nvtx)
        main = main.sort(["len", *rk, "pid"], descending=[True, *[False] * (len(rk) + 1)], nulls_last=True).head(1).select(*rk, "pid")
        ranges = ranges.join(main, on=[*rk, "pid"]).sort("start_ns").with_row_index("_sid").with_columns(pl.col("_sid").cast(pl.Int64))
        gpu = _cpu_steps(ranges, ops_with_launch, rk)
        steps = ranges.join(gpu, on=[*rk, "_sid"], how="left").select(
            *rk, pl.col("label").alias("name"), "start_ns", "end_ns", "gpu_start_ns", "gpu_end_ns", "gpu_busy_ns",
            pl.col("ops").fill_null(0), pl.col("_phase").alias("phase"))
        if source == "module":
            # ranges around a small part of the work launched while they ran are not the
            # forwards (a sub-module's ranges); work before the first or after the last (the
            # model's initialisation on the GPU, an evaluation) does not count against them
            lo, hi = ranges["start_ns"].min(), ranges["end_ns"].max()
            during = ops_with_launch.filter(pl.col("api_start_ns").is_between(lo, hi))
            if int(steps["gpu_busy_ns"].fill_null(0).sum()) < MODULE_SHARE * _busy(during, rk):
                steps = None
            elif forwards is not None:
                steps = _phases_from_forwards(steps, forwards)
    if steps is None and get is not None:  # the NVTX steps were not it: every column
        ops_with_launch = _get_all(ops_with_launch, get)
    if steps is None and forwards is not None:
        # the forward passes read from the kernels (with the CUDA graph replays of their GPU as
        # decode forwards): their steps are final (prefill and decode from the work per forward,
        # engine steps of a server)
        out = forward_steps(forwards, rk)
        return out if out.height >= MIN_STEPS else _empty(rk)
    if steps is None and graph_launches is not None and graph_launches.height:
        steps = _from_graphs(graph_launches, ops_with_launch, rk)
        source = "graph_replays"
    if steps is None and forwards is not None:
        # the forward passes read from the kernels: their steps are final (prefill and decode
        # from the work per forward, engine steps of a server)
        out = forward_steps(forwards, rk)
        return out if out.height >= MIN_STEPS else _empty(rk)
    if steps is None:
        if not tokens:
            # a loop found in the kernels alone is no generation without a sign of tokens: a
            # simulation's time steps can have a heavy first one too (not searched for at all:
            # on 1 M kernels the search was the diagnosis' peak before its rules, issue 44)
            return _empty(rk)
        steps = _from_loops(ops_with_launch, rk, labels)
        source = "kernel_loop"
    if steps is None or steps.height < MIN_STEPS:
        return _empty(rk)
    steps = steps.sort("start_ns")
    busy = steps["gpu_busy_ns"].fill_null(0).to_numpy().astype(float)
    prefills: np.ndarray | None = None
    if (steps["phase"] == "?").any():
        # an engine's steps: how many prompts each also ran, from its operation count
        prefills = engine_prefills(steps["ops"].fill_null(0).to_numpy(), busy, prefill_factor)
        steps = steps.with_columns(pl.when(pl.Series(prefills > 0)).then(pl.lit("prefill")).otherwise(pl.lit("decode")).alias("phase"))
    elif not (steps["phase"] == "prefill").any() and source in ("module", "kernel_loop"):
        # forwards found without ranges that say which is which: every forward far heavier
        # than the median one processes a prompt (each generate() call's first)
        heavy = busy >= prefill_factor * float(np.median(busy))
        if heavy.sum() <= steps.height - MIN_STEPS:
            steps = steps.with_columns(pl.when(pl.Series(heavy)).then(pl.lit("prefill")).otherwise(pl.col("phase")).alias("phase"))
    named = steps["name"].drop_nulls().str.contains("(?i)" + DECODE_PATTERN).any() if "name" in steps.columns else False
    if not (steps["phase"] == "prefill").any() and not named and source != "graph_replays" and not tokens:
        # repeated steps alone do not make a generation: a training loop's step.N is not
        # decoding unless a prefill range, a decode name, graph replays or the sampled
        # tokens' copies say so (a heavy first step does not: NCCL's first wait, a cold start)
        return _empty(rk)
    steps = steps.with_columns(
        *[pl.lit(None, pl.Int64).alias(c) for c in ("rows", "draft") if c not in steps.columns],
        pl.col("phase").fill_null("decode"),
        (pl.Series(prefills, dtype=pl.Int64) if prefills is not None else (pl.col("phase") == "prefill").cast(pl.Int64)).alias("prefills"),
        pl.lit(source).alias("source"),
        pl.int_range(pl.len(), dtype=pl.Int64).alias("step"),
        (pl.col("start_ns").shift(-1) - pl.col("start_ns")).alias("interval_ns"),
    )
    return steps.select(*rk, *[pl.col(c).cast(t) for c, t in STEP_COLUMNS.items()])


#: Columns of :func:`requests`.
REQUEST_COLUMNS: dict[str, pl.DataType | type[pl.DataType]] = {
    "request": pl.Int64, "warmup": pl.Boolean, "cold": pl.Boolean, "start_ns": pl.Int64, "end_ns": pl.Int64, "prefill_steps": pl.Int64,
    "decode_steps": pl.Int64, "ttft_ns": pl.Int64, "tpot_median_ns": pl.Float64, "tpot_p90_ns": pl.Float64,
    "new_tokens": pl.Int64, "prompt_rows": pl.Int64, "decode_rows": pl.Int64, "draft_forwards": pl.Int64, "name": pl.Utf8,
}

#: A leading request is warm-up when it makes at most this share of the median new tokens of
#: the requests after it (a short first call that only warms the libraries up), …
WARMUP_TOKENS_SHARE = 0.5
#: … or takes more than this many times their median time per output token (a cold call; a
#: request a little slower than the rest is no warm-up).
WARMUP_TPOT_FACTOR = 2.0


def number_requests(steps: pl.DataFrame) -> pl.DataFrame:
    """``steps`` (:func:`generation_steps`) with ``request``: each prefill step starts the next
    request (0-based) and the decode steps after it belong to it; decode steps before the
    first prefill (a generation already running when the capture began) are request 0."""
    if steps.height == 0:
        return steps.with_columns(pl.lit(None, pl.Int64).alias("request"))
    pre = (pl.col("phase") == "prefill").cast(pl.Int64)
    lead = 1 if steps.sort("start_ns")["phase"][0] == "prefill" else 0
    return steps.sort("start_ns").with_columns((pre.cum_sum() - lead).alias("request"))


def requests(steps: pl.DataFrame, *, warmup_factor: float = WARMUP_TPOT_FACTOR) -> pl.DataFrame:
    """One row per request of :func:`number_requests`' steps: what a user of ``generate()``
    measures per call.

    ``start_ns``/``end_ns`` (first step's start, last step's end), ``prefill_steps``,
    ``decode_steps``, ``ttft_ns`` (from the prefill's start to the end of its GPU work: the
    first token ready on the GPU; null without a prefill in the capture), ``tpot_median_ns``
    and ``tpot_p90_ns`` (the intervals between the request's consecutive decode steps' starts:
    time per output token; of speculative decoding, per verify step), ``new_tokens`` (the
    prefill's token and one per decode step; null with a draft model, whose verify steps
    accept a number of tokens the GPU's work does not show), ``prompt_rows`` (rows the
    prefill's embedding gathered: batch × prompt tokens, where the trace shows them),
    ``decode_rows`` (rows of its decode forwards: the batch), ``draft_forwards`` (the draft
    model's forwards). ``warmup``: leading requests (at most half) that made at most
    :data:`WARMUP_TOKENS_SHARE` of the median new tokens of the requests after them (a short
    warm-up call), or took more than ``warmup_factor`` (:data:`WARMUP_TPOT_FACTOR`) times their
    median time per output token (a cold first call: cuBLAS and cuDNN heuristics, the caching allocator's first
    blocks) — never by total duration, which a request's length decides.
    """
    if steps.height == 0:
        return pl.DataFrame(schema=REQUEST_COLUMNS)
    s = steps if "request" in steps.columns else number_requests(steps)
    end = pl.max_horizontal("end_ns", "gpu_end_ns")
    rows = []
    has_rows = "rows" in s.columns
    has_draft = "draft" in s.columns and s["draft"].drop_nulls().len() > 0 and int(s["draft"].sum() or 0) > 0
    for (req,), part in s.sort("start_ns").group_by(["request"], maintain_order=True):
        pre = part.filter(pl.col("phase") == "prefill")
        dec = part.filter(pl.col("phase") == "decode")
        ttft = None
        if pre.height:
            first = pre.row(0, named=True)
            ttft = int((first["gpu_end_ns"] or first["end_ns"]) - first["start_ns"])
        tpot = dec["start_ns"].diff().drop_nulls().cast(pl.Float64)
        prompt_rows = pre["rows"][0] if has_rows and pre.height else None
        dec_rows = dec["rows"].drop_nulls() if has_rows else pl.Series([], dtype=pl.Int64)
        rows.append({
            "request": req, "warmup": False, "cold": False, "start_ns": int(part["start_ns"].min()),  # type: ignore[arg-type]
            "end_ns": int(part.select(end.max()).item()), "prefill_steps": pre.height, "decode_steps": dec.height,
            "ttft_ns": ttft, "tpot_median_ns": float(tpot.median()) if tpot.len() else None,  # type: ignore[arg-type]
            "tpot_p90_ns": float(tpot.quantile(0.9, interpolation="nearest")) if tpot.len() else None,  # type: ignore[arg-type]
            "new_tokens": None if has_draft else dec.height + (1 if pre.height else 0), "prompt_rows": prompt_rows,
            "decode_rows": int(dec_rows.median()) if dec_rows.len() else None,  # type: ignore[arg-type]
            "draft_forwards": int(part["draft"].sum() or 0) if has_draft else None, "name": None,
        })
    out = pl.DataFrame(rows, schema=REQUEST_COLUMNS)
    short, slow = _warm_requests(out, warmup_factor)
    i = pl.int_range(pl.len())
    return out.with_columns((i < short).alias("warmup"), ((i >= short) & (i < slow)).alias("cold"))


def name_requests(req: pl.DataFrame, steps: pl.DataFrame, nvtx: pl.DataFrame) -> pl.DataFrame:
    """``req`` (:func:`requests`) with ``name``: the label of the outermost NVTX range that
    holds every step of the request (by start, ns) and no other request's step — a range a
    user pushed around each call (``generate.0``, ``request 3``). Unchanged without one."""
    if req.height == 0 or nvtx.height == 0 or "request" not in steps.columns or "end_ns" not in nvtx.columns:
        return req
    r = nvtx.filter(pl.col("end_ns").is_not_null() & pl.col("start_ns").is_not_null())
    if "event_type" in r.columns:
        r = r.filter(pl.col("event_type").is_in(["PushPop", "StartEnd"]))
    if r.height == 0:
        return req
    lab = pl.coalesce("name", pl.lit("")) if "name" in r.columns else pl.lit("")
    r = r.select("start_ns", "end_ns", lab.alias("label")).sort("start_ns")
    st = steps.select("request", "start_ns").drop_nulls().sort("start_ns")
    times = st["start_ns"].to_numpy()
    owner = st["request"].to_numpy()
    lo = np.searchsorted(times, r["start_ns"].to_numpy(), side="left")
    hi = np.searchsorted(times, r["end_ns"].to_numpy(), side="right")
    count = st.group_by("request").len()
    sizes = dict(zip(count["request"].to_list(), count["len"].to_list(), strict=True))
    names: dict[int, tuple[int, str]] = {}
    for k, (a, b) in enumerate(zip(lo, hi, strict=True)):
        if b <= a or owner[a] != owner[b - 1] or b - a != sizes.get(int(owner[a]), -1):
            continue  # holds no step, steps of several requests, or only some of one
        width = int(r["end_ns"][k] - r["start_ns"][k])
        if int(owner[a]) not in names or width > names[int(owner[a])][0]:
            names[int(owner[a])] = (width, str(r["label"][k]))
    if not names:
        return req
    return req.with_columns(pl.col("request").replace_strict({q: n for q, (_, n) in names.items()}, default=None,
                                                             return_dtype=pl.Utf8).alias("name"))


def _warm_requests(req: pl.DataFrame, warmup_factor: float) -> tuple[int, int]:
    """How many leading requests are warm-up calls, and up to which one the leading requests
    are warm-up or cold (see :func:`requests`); at least one request is left."""
    n = req.height
    if n < 2:
        return 0, 0
    made = req["new_tokens"].fill_null(req["decode_steps"]).cast(pl.Float64).to_list()
    tpot = req["tpot_median_ns"].to_list()
    short_n = slow_n = 0
    for i in range(n - 1):
        rest_made = [m for m in made[i + 1 :] if m is not None]
        rest_tpot = [t for t in tpot[i + 1 :] if t is not None]
        short = bool(rest_made) and made[i] is not None and made[i] <= WARMUP_TOKENS_SHARE * float(np.median(rest_made))
        slow = bool(rest_tpot) and tpot[i] is not None and tpot[i] > warmup_factor * float(np.median(rest_tpot))
        if (short or (slow and i == 0)) and slow_n == short_n:  # a run's first call, short or cold, warms it up
            short_n = slow_n = i + 1
        elif short or slow:
            slow_n = i + 1
        else:
            break
    return short_n, slow_n


def phase_summary(steps: pl.DataFrame) -> pl.DataFrame:
    """Per phase of :func:`generation_steps`: what a user of a serving engine measures.

    Returns one row per phase (``prefill`` first): ``steps``, ``ttft_ns`` (prefill: from a
    prefill step's start to the end of its GPU work — the first token ready on the GPU; the
    median over the prefill steps when there are several; null for decode),
    ``tpot_median_ns`` and ``tpot_p90_ns`` (decode: the intervals between consecutive decode
    steps' starts of one request (``request`` column, :func:`number_requests`), i.e. time per
    output token), ``step_median_ns`` (median step span), ``gpu_busy_ns`` (summed),
    ``span_ns`` (first start to last end), ``busy_share`` (``gpu_busy_ns / span_ns``, 0–1).
    Pass the steady requests' steps (``RunStructure.steady_steps``) for the steady figures.
    """
    schema = {"phase": pl.Utf8, "steps": pl.Int64, "ttft_ns": pl.Int64, "tpot_median_ns": pl.Float64, "tpot_p90_ns": pl.Float64,
              "step_median_ns": pl.Float64, "gpu_busy_ns": pl.Int64, "span_ns": pl.Int64, "busy_share": pl.Float64}
    if steps.height == 0:
        return pl.DataFrame(schema=schema)
    rows = []
    for phase in ("prefill", "decode"):
        part = steps.filter(pl.col("phase") == phase).sort("start_ns")
        if part.height == 0:
            continue
        end = pl.max_horizontal("end_ns", "gpu_end_ns")
        span = int(part.select(end.max()).item() - part["start_ns"].min())
        busy = int(part["gpu_busy_ns"].fill_null(0).sum())
        ttft = None
        tpot = pl.Series([], dtype=pl.Float64)
        if phase == "prefill":
            ttfts = part.select(pl.coalesce("gpu_end_ns", "end_ns") - pl.col("start_ns")).to_series().drop_nulls()
            ttft = int(ttfts.sort()[(ttfts.len() - 1) // 2]) if ttfts.len() else None  # the median, a measured one
        else:
            # between consecutive decode steps of one request only (not across a prefill or
            # the gap between two generate() calls)
            by = "request" if "request" in part.columns else None
            d = part["start_ns"].diff() if by is None else part.select(pl.col("start_ns").diff().over(by)).to_series()
            tpot = d.drop_nulls().cast(pl.Float64)
        lengths = part.select(end - pl.col("start_ns")).to_series().cast(pl.Float64)
        rows.append({
            "phase": phase, "steps": part.height, "ttft_ns": ttft,
            "tpot_median_ns": float(tpot.median()) if tpot.len() else None,  # type: ignore[arg-type]
            "tpot_p90_ns": float(tpot.quantile(0.9, interpolation="nearest")) if tpot.len() else None,  # type: ignore[arg-type]
            "step_median_ns": float(lengths.median()),  # type: ignore[arg-type]
            "gpu_busy_ns": busy, "span_ns": span, "busy_share": busy / span if span > 0 else None,
        })
    return pl.DataFrame(rows, schema=schema)


def trace_generation_steps(trace: Any, **options: Any) -> pl.DataFrame:
    """:func:`generation_steps` of a trace: its GPU operations (graph replays included) with
    their launching calls, its NVTX ranges and its graph launches, read with only the columns
    they need. ``options`` go to :func:`generation_steps`: without ``tokens=True`` steps
    found in the kernel loop are not taken as tokens (:func:`tracekit.structure` decides that
    from the trace's evidence, and gives the steady requests' steps)."""
    from tracekit.analysis._frames import gpu_ops
    from tracekit.analysis.attribution import NVTX_COLUMNS, launch_info
    from tracekit.analysis.graphs import graph_launches, graph_trace_of, node_operations

    cols = ["pid", "global_pid", "device_id", "context_id", "stream_id", "correlation_id", "start_ns", "end_ns", "duration_ns"]
    kernels = trace.table("kernels", [*cols, "name"]) if hasattr(trace, "db") else trace.kernels
    memcpys = trace.table("memcpys", [*cols, "bytes", "copy_kind", "copy_kind_label"]) if hasattr(trace, "db") else trace.memcpys
    memsets = trace.table("memsets", [*cols, "bytes"]) if hasattr(trace, "db") else trace.memsets
    gt = graph_trace_of(trace)
    api = trace.columns_on_demand("cuda_api", ["correlation_id", "global_tid", "name", "start_ns", "end_ns", "api"]) if hasattr(
        trace, "columns_on_demand") else trace.cuda_api
    ops = launch_info(gpu_ops(kernels, memcpys, memsets, gt), api)
    nvtx = trace.table("nvtx", list(NVTX_COLUMNS)) if hasattr(trace, "db") else trace.nvtx
    nodes = node_operations(trace)
    launches = graph_launches(gt, api, kernels=nodes.get("kernels"), memcpys=nodes.get("memcpys"), memsets=nodes.get("memsets"))
    return generation_steps(ops, nvtx, launches, **options)
