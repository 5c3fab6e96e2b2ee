"""The structure of a run: start-up, warm-up, steady iterations and tear-down, and what kind of
run it is. Found once per trace and read by everything that needs a window or a step
(diagnosis, generation phases, diff, the model comparison, the reports, TraceExplorer).

Iterations come from the first of these sources that gives at least ``min_repeats``:

1. ``nvtx``: NVTX ranges named step, iter, iteration, batch, epoch, decode or forward (as
   words; :func:`tracekit.analysis.run.iterations.iteration_ranges`), of the process with most;
2. ``forwards``: NVTX ranges that each run the model's layers once
   (:func:`tracekit.analysis.layers.forward_ranges`: ``--annotate-torch``'s root-module range
   per forward of ``generate()``);
3. ``graph_replays``: replays of the CUDA graph that holds the most GPU time, when it holds at
   least :data:`GRAPH_STEP_SHARE` of its device's (serving engines, ``torch.compile``);
4. ``forward_passes``: the forward passes of a model read from the busiest GPU's kernels
   (:mod:`tracekit.analysis.run.forwards`: the layer stack's attention sites repeat ``L``
   times per forward; CUDA graph replays on that GPU are decode forwards of a generation),
   unless backward kernels make it a training step;
5. one ``ProfilerStep#N`` range holding the work (``nvtx``): a program that stepped
   torch.profiler once; what repeats inside it is the model's layers, unless the kernel loop
   below finds training steps each with its optimizer update (``prof.step()`` once per epoch);
6. ``kernel_loop``: the loop of each GPU's operations found from the names that run once per
   iteration (:func:`tracekit.analysis.run.loops.find_loops`, :func:`~tracekit.analysis.run.loops.main_loop`):
   a training step's loss and embedding backward, a ``generate()`` call's prompt kernels, an
   engine step's copy of the sampled tokens to the host. Every GPU (rank) is searched; the
   busiest one's iterations bound the window. A training loop's leading instances without
   backward kernels are its set-up (DDP's parameter broadcast), not steps. Where a GPU's main
   loop opens right after its only one or two token embedding lookups and holds no backward
   work (:func:`~tracekit.analysis.run.forwards.inside_few_forwards`), it is those forwards'
   layers (an engine step's one prefill), and no iterations are found.

A leading iteration that takes more than ``warmup_factor`` times the median of the iterations
after it (CPU range or GPU span, whichever is longer) is warm-up; at most half are. Before the
first iteration is start-up (imports, model construction, NCCL set-up, compilation), after the
last one tear-down: neither is ever part of the window, so no finding counts them as time at
stake.

The kind of run (:func:`classify`) is read from the steady iterations' GPU operations:
``training`` (backward kernels, optimizer kernels, gradient collectives), ``generation`` (a
prompt's forward, then one-token forwards: :mod:`tracekit.analysis.run.phases`), ``serving``
(prefills of arriving requests in the same engine steps as other requests' decode),
``inference`` (forward passes that make no tokens: a diffusion sampler, a classifier),
``microbenchmark`` (a loop of a few kernels timed over and over) or ``unknown``, each with the
evidence that decided it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np
import polars as pl

from tracekit.analysis._frames import within_any
from tracekit.analysis.layers import forward_ranges
from tracekit.analysis.nccl import NCCL_KERNEL_PATTERN
from tracekit.analysis.run.forwards import (
    SAMPLING_NAMES,
    GridLookup,
    TokenReading,
    add_graph_replays,
    forward_passes,
    inside_few_forwards,
    read_tokens,
    token_lookup_names,
)
from tracekit.analysis.run.iterations import (
    DEFAULT_ITERATION_PATTERN,
    ITERATION_WORDS,
    PROFILER_STEP,
    iteration_ranges,
    iterations,
    warmup_count,
)
from tracekit.analysis.run.loops import (
    HOST_COPY_NAME,
    Loop,
    find_loops,
    host_copy_codes,
    main_loop,
    name_codes,
)
from tracekit.analysis.run.training import (
    BACKWARD_NAMES,
    GRADIENT_COLLECTIVES,
    OPTIMIZER_NAMES,
    micro_batch_steps,
)

__all__ = [
    "GRAPH_STEP_SHARE",
    "KINDS",
    "Ops",
    "OpsWithLaunch",
    "RunStructure",
    "StructureSettings",
    "find_iterations",
    "graph_replay_iterations",
    "kernel_loop_iterations",
    "warmup_count",
]

#: The kinds of run :func:`classify` tells apart.
KINDS = ("training", "generation", "serving", "inference", "microbenchmark", "unknown")

#: The operations with their launch columns, or a function of CPU ranges (``start_ns``,
#: ``end_ns``; ``None`` for all) that gives at least those launched inside them.
OpsWithLaunch = pl.DataFrame | Callable[[pl.DataFrame | None], pl.DataFrame]

#: The operations, or a function that gives some of their columns (those of ``columns`` they
#: have, ``ops.select(...)``; ``name`` may come as integer codes, equal for equal names).
Ops = pl.DataFrame | Callable[[list[str]], pl.DataFrame]


class Settings(Protocol):
    """What the structure reads of a configuration (:class:`StructureSettings`, or
    :class:`tracekit.diagnosis.DiagnoseConfig`, which has the same fields; read-only: both
    are frozen)."""

    @property
    def iteration_pattern(self) -> str: ...
    @property
    def warmup_factor(self) -> float: ...
    @property
    def min_repeats(self) -> int: ...
    @property
    def exact_steps(self) -> int: ...
    @property
    def sample_steps(self) -> int: ...


@dataclass(frozen=True)
class StructureSettings:
    """How iterations are found. ``iteration_pattern``: NVTX step range names (regex,
    case-insensitive); ``warmup_factor``: a leading iteration longer than this times the
    median of the rest is warm-up; ``min_repeats``: fewest iterations of a loop;
    ``exact_steps``/``sample_steps``: of a trace with more NVTX steps than ``exact_steps``,
    only the first 50, ``sample_steps`` + 10 in the middle and the last two are measured."""

    iteration_pattern: str = DEFAULT_ITERATION_PATTERN
    warmup_factor: float = 1.5
    min_repeats: int = 3
    exact_steps: int = 400
    sample_steps: int = 100


#: Columns of the iteration frames of the GPU-side sources (graph replays, kernel loops).
_ITER_SCHEMA = {"iteration": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64, "duration_ns": pl.Int64,
                "gpu_span_ns": pl.Int64, "kernels": pl.Int64}


def _empty_iterations(keys: list[str] | None = None) -> pl.DataFrame:
    return pl.DataFrame(schema={**{k: pl.Int64 for k in keys or []}, **_ITER_SCHEMA})


# -- kernel loops ------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceLoop:
    """The main loop of one GPU's operations (:func:`kernel_loop_iterations`): its device keys,
    the loop, and the iterations it gives (``_ITER_SCHEMA`` columns). ``names`` maps the
    anchors' codes to names when the operations had text names."""

    keys: dict[str, Any]
    loop: Loop
    iterations: pl.DataFrame
    names: dict[int, str] = field(default_factory=dict)
    #: Its leading warm-up iterations (set by :func:`build_structure`).
    warmup: int = 0

    def anchor_names(self, limit: int = 3) -> list[str]:
        """The first anchor names (shortened), for evidence."""
        out = [self.names.get(a, "") for a in self.loop.anchors]
        return [_short(n) for n in out if n][:limit]


def _short(name: str | None, width: int = 48) -> str:
    """A kernel name cut for a sentence: the function's own name, without namespaces, template
    arguments and parameters (``void at::native::<unnamed>::cunn_SoftMaxBackward<4, …>(…)`` →
    ``cunn_SoftMaxBackward``); ``?`` for a missing name (a damaged export)."""
    if not name:
        return "?"
    s = re.sub(r"^(?:void |std::enable_if<[^>]*>::type )", "", name)
    s = s.replace("<unnamed>::", "").replace("(anonymous namespace)::", "")
    s = re.split(r"[<(]", s, maxsplit=1)[0] or s
    s = s.split("::")[-1] if "::" in s else s
    s = s.strip() or name
    return s if len(s) <= width else s[: width - 1] + "…"


def kernel_loop_iterations(ops: pl.DataFrame, *, min_repeats: int = 3, labels: pl.Series | None = None,
                           notes: list[str] | None = None) -> list[DeviceLoop]:
    """The main loop of every GPU's operations, busiest GPU first.

    Parameters
    ----------
    ops
        GPU operations: ``device_id``, ``start_ns``, ``end_ns``, ``duration_ns``, ``name``
        (text, or integer codes equal for equal names); ``rank`` for a trace set.
    min_repeats
        Fewest iterations of a loop.
    labels
        Where ``name`` holds integer codes: the text of each code (to tell device-to-host
        copies, which end an engine's steps, as with text names).
    notes
        Where given, a sentence is appended for each GPU whose main loop was a few forwards' layers.

    A GPU whose main loop opens right after its only one or two token embedding lookups and
    holds no backward kernel (:func:`~tracekit.analysis.run.forwards.inside_few_forwards`: the
    layer stack of those forwards, as tokens enter a model once per forward) gives no loop of
    steps. A training loop's leading instances without backward kernels are left out (set-up).

    Returns
    -------
    One :class:`DeviceLoop` per GPU whose operations hold a main loop
    (:func:`~tracekit.analysis.run.loops.main_loop`), the busiest GPU (most GPU time; ties: lowest
    keys) first. Iteration ``i`` runs from its first operation's start to the next
    iteration's first start (the last one to its last operation's end); ``kernels`` counts its
    operations.
    """
    if ops.height == 0:
        return []
    keys = [c for c in ("rank", "device_id") if c in ops.columns]
    totals = ops.group_by(keys).agg(pl.col("duration_ns").sum()).sort(
        ["duration_ns", *keys], descending=[True, *([False] * len(keys))], nulls_last=True)
    out = []
    for row in totals.iter_rows(named=True):
        g = _ops_of_gpu(ops.select(*keys, "start_ns", "end_ns", "name"), row, several=totals.height > 1).select("start_ns", "end_ns", "name")
        if g.height < 2 * min_repeats:
            continue
        codes = name_codes(g["name"])
        loops = find_loops(codes, g["start_ns"].to_numpy(), g["end_ns"].to_numpy(), min_repeats=min_repeats)
        loop = main_loop(loops, host_copies=host_copy_codes(g["name"], codes, labels))
        backward = _label_hits(g["name"], labels, _backward_names).to_numpy()
        lookups = np.flatnonzero(_label_hits(g["name"], labels, token_lookup_names).to_numpy())
        if loop is not None and _layers_of_few_forwards(loop, lookups, backward):
            # the GPU's main loop is the layer stack of its few forwards: no loop of steps here
            if notes is not None:
                fw = "a forward" if lookups.size == 1 else f"at most {lookups.size} forwards"
                notes.append(f"the kernels repeat {loop.count} times around {lookups.size} token embedding "
                             f"lookup{'s' if lookups.size > 1 else ''}: the layers of {fw}, not steps")
            continue
        if loop is None or loop.count < min_repeats:
            continue
        starts = g["start_ns"].to_numpy()
        prev_end = np.maximum.accumulate(g["end_ns"].to_numpy())
        b = loop.bounds
        first = starts[b]
        last_end = int(prev_end[loop.stop - 1])
        ends = np.append(first[1:], last_end)
        sizes = loop.sizes()
        frame = pl.DataFrame({"iteration": np.arange(loop.count, dtype=np.int64), "start_ns": first.astype(np.int64),
                              "end_ns": ends.astype(np.int64)}).with_columns(
            (pl.col("end_ns") - pl.col("start_ns")).alias("duration_ns"),
            (pl.col("end_ns") - pl.col("start_ns")).alias("gpu_span_ns"),
            pl.Series("kernels", sizes.astype(np.int64)),
        )
        # a training loop's leading instances without backward work are its set-up (DDP's
        # parameter broadcast ahead of step 0), not steps
        hits = np.concatenate([[0], np.cumsum(backward.astype(np.int64))])
        per = hits[np.append(b[1:], loop.stop)] - hits[b]
        lead = int(np.argmax(per > 0)) if (per > 0).any() else 0
        if lead and (per > 0).mean() >= 0.5:
            frame = frame.slice(lead).with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias("iteration"))
        names: dict[int, str] = {}
        if not g["name"].dtype.is_integer():  # text names: the anchors' names
            order = np.argsort(codes, kind="stable")
            at = np.searchsorted(codes[order], np.array(loop.anchors))  # any position of each anchor
            for a, pos in zip(loop.anchors, at, strict=True):
                names[int(a)] = str(g["name"][int(order[pos])])
        out.append(DeviceLoop({k: row[k] for k in keys}, loop, frame.select(list(_ITER_SCHEMA)), names))
    return out


def _layers_of_few_forwards(loop: Loop, lookups: np.ndarray, backward: np.ndarray) -> bool:
    """Whether ``loop`` is the layer stack of the few forwards whose token embedding lookups lie
    at ``lookups`` (:func:`~tracekit.analysis.run.forwards.inside_few_forwards`) and holds no
    backward kernel (``backward``: a bool per operation; a loop with backward work is
    training, whatever its gathers)."""
    bounds = np.append(loop.bounds, loop.stop)
    return not backward[bounds[0]:bounds[-1]].any() and inside_few_forwards(lookups, bounds)


def _optimizer_in_each(ops: pl.DataFrame, labels: pl.Series | None, dl: DeviceLoop) -> bool:
    """Whether at least half the iterations of ``dl`` hold an optimizer kernel
    (:data:`OPTIMIZER_NAMES`) of its GPU's operations ``ops`` (``name``: text, or codes whose
    text ``labels`` gives)."""
    keys = [k for k in dl.keys if k in ops.columns]
    g = ops.filter(pl.all_horizontal([pl.col(k) == dl.keys[k] for k in keys])) if keys else ops
    hit = _label_hits(g["name"], labels, lambda t: t.cast(pl.Utf8).fill_null("").str.contains(OPTIMIZER_NAMES))
    starts = np.sort(g["start_ns"].filter(hit).to_numpy())
    it = dl.iterations
    if it.height == 0:
        return False
    n = np.searchsorted(starts, it["end_ns"].to_numpy()) - np.searchsorted(starts, it["start_ns"].to_numpy())
    return bool((n > 0).mean() >= 0.5)


def _compute_ns(ops: pl.DataFrame, labels: pl.Series | None = None) -> int:
    """Summed ``duration_ns`` of the operations that are no communication kernels
    (:data:`~tracekit.analysis.nccl.NCCL_KERNEL_PATTERN`): what backward kernels' share is of.
    ``name``: text, or integer codes whose text ``labels`` gives."""
    comm = _label_hits(ops["name"], labels, lambda t: t.cast(pl.Utf8).fill_null("").str.contains(NCCL_KERNEL_PATTERN))
    return int(ops["duration_ns"].filter(~comm).sum() or 0)


def _backward_names(names: pl.Series) -> pl.Series:
    """Which kernel ``names`` (text) are backward kernels (:data:`BACKWARD_NAMES`)."""
    return names.cast(pl.Utf8).fill_null("").str.contains(BACKWARD_NAMES)


def _label_hits(names: pl.Series, labels: pl.Series | None, test: Callable[[pl.Series], pl.Series]) -> pl.Series:
    """``test`` (text → bool per name) of operations named ``names``: text, or integer codes
    whose text ``labels`` gives (a code without a label, or no ``labels``: no hit)."""
    if not names.dtype.is_integer():
        return test(names).fill_null(False)
    text = pl.Series(labels if labels is not None else [], dtype=pl.Utf8)
    if text.len() == 0:
        return pl.Series([False] * names.len(), dtype=pl.Boolean)
    hit = test(text).fill_null(False)
    code = names.cast(pl.Int64)
    known = code.is_not_null() & (code >= 0) & (code < text.len())
    return (hit.gather(code.fill_null(0).clip(0, text.len() - 1)) & known).fill_null(False)


# -- CUDA graph replays ------------------------------------------------------------------------

#: Graph replays define the steps only when the replayed graph holds at least this share of
#: its device's GPU time (a graph captured for one small part of a step does not).
GRAPH_STEP_SHARE = 0.25


def graph_replay_iterations(launches: pl.DataFrame, ops: pl.DataFrame, *, min_repeats: int = 3) -> pl.DataFrame:
    """Iterations from CUDA graph replays: serving engines and ``torch.compile`` replay each
    decode step as one graph, so without NVTX step ranges the replays of the graph that holds
    the most GPU time are the steps.

    Parameters
    ----------
    launches
        :func:`~tracekit.analysis.graphs.graph_launches` (either trace mode).
    ops
        The GPU operations (``device_id``, ``duration_ns``; ``rank``), to weigh the graph
        against its device's work (:data:`GRAPH_STEP_SHARE`).

    Returns the columns of :func:`kernel_loop_iterations`' iterations: step ``i`` runs from the
    start of replay ``i`` to the start of replay ``i + 1`` (the last one to its end);
    ``kernels`` is the replay's kernels in per-node traces, else 1. Empty when no graph was
    launched at least ``min_repeats`` times or none holds enough of its device's time.
    """
    empty = _empty_iterations()
    if launches.height < min_repeats:
        return empty
    dev = [c for c in ("rank", "device_id") if c in launches.columns]
    graph = [*dev, "pid", "graph_exec_id"]
    per = launches.group_by(graph).agg(pl.len().alias("n"), pl.col("gpu_time_ns").sum().alias("g")).filter(pl.col("n") >= min_repeats)
    if per.height == 0:
        return empty
    busy = ops.group_by([c for c in dev if c in ops.columns]).agg(pl.col("duration_ns").sum().alias("_all")) if ops.height else None
    if busy is not None and busy.height:
        per = per.join(busy, on=[c for c in dev if c in ops.columns], how="left").filter(
            pl.col("_all").is_null() | (pl.col("g") >= GRAPH_STEP_SHARE * pl.col("_all")))
    if per.height == 0:
        return empty
    top = per.sort(["g", *graph], descending=[True, *([False] * len(graph))], nulls_last=True).head(1).select(graph)
    reps = launches.join(top, on=graph).sort("start_ns")
    starts = reps["start_ns"].to_list()
    ends = reps["end_ns"].to_list()
    kernels = reps["kernels"].fill_null(1).to_list()
    rows = []
    for i, (s0, e0, k) in enumerate(zip(starts, ends, kernels, strict=True)):
        e = starts[i + 1] if i + 1 < len(starts) else e0
        rows.append((i, s0, e, e - s0, e - s0, int(k)))
    return pl.DataFrame(rows, schema=empty.schema, orient="row")


def _ops_of_gpu(ops: pl.DataFrame, key: dict[str, Any], *, several: bool) -> pl.DataFrame:
    """The operations of the GPU ``key`` names (its ``rank``/``device_id`` values), by start
    time (ties in ``ops``' order). The frame itself when it holds one GPU's operations
    (``several`` false) already in that order: on 2 M kernels a filtered and sorted copy of
    every column was the structure's largest allocation (issue 44)."""
    g = ops
    if several:
        g = g.filter(pl.all_horizontal([pl.col(k) == v if v is not None else pl.col(k).is_null() for k, v in key.items()
                                        if k in ("rank", "device_id")]))
    return g if g["start_ns"].is_sorted() else g.sort("start_ns", maintain_order=True)


def _read_by_start(get: Callable[[list[str]], pl.DataFrame], columns: list[str]) -> pl.DataFrame:
    """``get(columns)`` in start order (ties in the order read), sorted a column at a time: the
    read frame gives up each column as its sorted copy is made, so no second copy of the
    whole frame is ever held."""
    frame = get(columns)
    if frame.height < 2 or frame["start_ns"].is_sorted():
        return frame
    order = frame.select(pl.arg_sort_by("start_ns", maintain_order=True)).to_series()
    out: list[pl.Series] = []
    for name in frame.columns:
        column = frame[name]
        frame = frame.drop(name)
        out.append(column.gather(order))
        del column
    return pl.DataFrame(out)


# -- forward passes ----------------------------------------------------------------------------


def forward_iterations(ops: pl.DataFrame, labels: pl.Series | None, grid: GridLookup | None, *,
                       min_repeats: int = 3, graph_launches: pl.DataFrame | None = None) -> tuple[pl.DataFrame, TokenReading, int] | None:
    """Iterations from the forward passes of the busiest GPU's operations
    (:func:`tracekit.analysis.run.forwards.forward_passes`): one per forward of the main model
    (:func:`~tracekit.analysis.run.forwards.read_tokens`), running from its first operation's
    start to the next one's (the last one to its end); ``kernels`` counts its operations.
    ``None`` without forwards, or when backward kernels hold :data:`BACKWARD_SHARE` of the
    GPU's operation time other than communication kernels' (a training step holds forwards and
    backwards: the kernel loop reads it).
    The replays of CUDA graphs on that GPU count as decode forwards when the forwards make
    tokens (:func:`~tracekit.analysis.run.forwards.add_graph_replays`). Also the reading and
    how many GPUs (ranks) run as many operations as half the busiest's."""
    if ops.height == 0 or "name" not in ops.columns:
        return None
    keys = [c for c in ("rank", "device_id") if c in ops.columns]
    per = ops.group_by(keys).agg(pl.col("duration_ns").sum(), pl.len().alias("n")).sort(
        ["duration_ns", *keys], descending=[True, *([False] * len(keys))], nulls_last=True)
    top = per.row(0, named=True)
    g = _ops_of_gpu(ops, top, several=per.height > 1)
    names = g["name"]
    if names.dtype.is_integer() and labels is None:
        return None
    hit = _label_hits(names, labels, _backward_names)
    bwd = g["duration_ns"].filter(hit).sum()
    if bwd and bwd >= BACKWARD_SHARE * _compute_ns(g, labels):
        return None
    fp = forward_passes(g, labels, grid=grid, min_forwards=min_repeats)
    if fp is None:
        return None
    reading = add_graph_replays(read_tokens(fp), graph_launches, {k: top[k] for k in keys}, min_replays=min_repeats)
    main = reading.main_forwards.sort("start_ns")
    if main.height < min_repeats:
        return None
    starts = main["start_ns"]
    ends = pl.concat([starts.slice(1), main["end_ns"].tail(1)])
    frame = pl.DataFrame({"iteration": np.arange(main.height, dtype=np.int64), "start_ns": starts, "end_ns": ends}).with_columns(
        (pl.col("end_ns") - pl.col("start_ns")).alias("duration_ns"), (pl.col("end_ns") - pl.col("start_ns")).alias("gpu_span_ns"),
        main["ops"].alias("kernels"), *[pl.lit(top[k]).alias(k) for k in keys])
    ranks = int(per.filter(pl.col("n") >= 0.5 * top["n"]).height)
    return frame.select([*keys, *_ITER_SCHEMA]), reading, ranks


# -- NVTX iterations ---------------------------------------------------------------------------


def nvtx_iterations(ops_with_launch: OpsWithLaunch, nvtx: pl.DataFrame, settings: Settings, *, one: bool = False) -> pl.DataFrame:
    """:func:`~tracekit.analysis.run.iterations.iterations` of the process with the most iteration
    ranges; with more than ``exact_steps`` of them, measured only for the first 50, a middle
    stretch of ``sample_steps`` + some and the last two (the others keep their CPU range, null
    GPU times). ``ops_with_launch`` may be a function of the measured ranges (``None``: all of
    them) giving the operations with their launch columns, at least those launched in the
    ranges. Empty when fewer than two ranges match (one matching range is not a loop), unless
    ``one``."""
    ranges = iteration_ranges(nvtx, pattern=settings.iteration_pattern)
    if ranges.height == 0:
        return pl.DataFrame()
    proc = [c for c in ("rank", "pid") if c in ranges.columns]
    main = ranges.group_by(proc).len().sort(["len", *proc], descending=[True, *([False] * len(proc))],
                                              nulls_last=True).head(1).select(proc)
    ranges = ranges.join(main, on=proc).sort("iteration")
    n = ranges.height
    if n < 2 and not one:  # one matching range is not a loop (a compiler's one-off "…iter…" range)
        return pl.DataFrame()
    if n > settings.exact_steps:
        mid = n // 2
        half = settings.sample_steps // 2 + 5
        keep = sorted({*range(min(50, n // 2)), *range(max(mid - half, 0), min(mid + half, n)), n - 2, n - 1})
        chosen = ranges.filter(pl.col("iteration").is_in(keep))
        ops = ops_with_launch(chosen) if callable(ops_with_launch) else ops_with_launch
        # first the operations launched inside some chosen range (of any rank: a superset of
        # those the join below keeps), so that only these few are sorted and joined
        if "api_start_ns" in ops.columns:
            ops = ops.filter(within_any(ops["api_start_ns"], chosen["start_ns"], chosen["end_ns"]))
        keys = [c for c in ("rank",) if c in ops.columns and c in chosen.columns]
        win = chosen.select(*keys, pl.col("start_ns").alias("api_start_ns"), pl.col("end_ns").alias("_iend")).sort([*keys, "api_start_ns"])
        # only the columns ``iterations`` reads are filtered and sorted (not every op column)
        needed = [c for c in ("rank", "global_tid", "api_start_ns", "device_id", "start_ns", "end_ns", "duration_ns", "op_kind")
                  if c in ops.columns]
        ops = (
            ops.lazy().select(needed).filter(pl.col("api_start_ns").is_not_null()).collect().sort([*keys, "api_start_ns"])
            .join_asof(win, on="api_start_ns", by=keys or None, strategy="backward", check_sortedness=False)
            .filter(pl.col("_iend").is_not_null() & (pl.col("api_start_ns") <= pl.col("_iend"))).drop("_iend")
        )
    else:
        ops = ops_with_launch(None) if callable(ops_with_launch) else ops_with_launch
    its = iterations(ops, nvtx, pattern=settings.iteration_pattern)
    its = its.join(main, on=proc).sort("iteration")
    if n > settings.exact_steps:
        its = its.filter(pl.col("ops") > 0)
    return its


# -- the iterations, from the first source that has them -------------------------------------


@dataclass
class Iterations:
    """What :func:`find_iterations` found: the iterations that bound the window (``frame``,
    with ``w_start``/``w_end``/``length_ns``: the iteration's extent over CPU range and GPU
    span, and its length), how many there were in all (``total``; a big NVTX trace measures
    only some), the source (``method``) and a sentence saying so (``reason``), and, for
    ``kernel_loop``, every GPU's loop (``loops``, busiest first)."""

    frame: pl.DataFrame
    total: int
    method: str
    reason: str
    loops: list[DeviceLoop] = field(default_factory=list)
    #: ``forward_passes``: the forwards read (:func:`tracekit.analysis.run.forwards.read_tokens`).
    reading: TokenReading | None = None
    #: ``forward_passes``: the GPUs (or ranks) that run them.
    ranks: int = 1


def _getter(kernels: Ops) -> Callable[[list[str]], pl.DataFrame]:
    if callable(kernels):
        return kernels
    frame = kernels

    def get(columns: list[str]) -> pl.DataFrame:
        return frame.select([c for c in columns if c in frame.columns])

    return get


def find_iterations(
    kernels: Ops,
    ops_with_launch: OpsWithLaunch,
    nvtx: pl.DataFrame,
    settings: Settings,
    *,
    graph_launches: pl.DataFrame | None = None,
    labels: Callable[[], pl.Series | None] | None = None,
    grid: GridLookup | None = None,
) -> Iterations:
    """The iterations of a trace, from the first source that has them (see the module doc).

    ``kernels`` is the sequence searched for loops: the GPU operations (``gpu_ops``), or a
    function giving some of their columns (:data:`Ops`). ``ops_with_launch``: the operations
    with their launch columns, or a function that gives them for some CPU ranges. Where
    ``kernels`` gives names as integer codes, ``labels()`` gives the text of each code;
    ``grid`` looks up kernels' grids (:func:`tracekit.analysis.run.forwards.forward_passes`)."""
    get = _getter(kernels)
    its = nvtx_iterations(ops_with_launch, nvtx, settings) if nvtx.height else pl.DataFrame()
    its, few = _holding_work(its, get)
    forwards_why = None
    if its.height == 0 and nvtx.height:
        # no step ranges: the ranges that each run the model's layers once (a forward per token
        # of generate(), as --annotate-torch's root-module ranges give them) are the steps
        fwd = forward_ranges(nvtx)
        if fwd.height >= 2:
            names = fwd["name"].drop_nulls().unique().sort().to_list()
            exact = "^(?:" + "|".join(re.escape(n) for n in names) + ")$"
            its = nvtx_iterations(ops_with_launch, nvtx, replace(settings, iteration_pattern=exact))  # type: ignore[type-var]
            shown = ", ".join(names[:3]) + (" …" if len(names) > 3 else "")
            layers = int(fwd["layers"].max() or 0)  # type: ignore[arg-type]
            forwards_why = f"NVTX forward ranges ({shown}: each runs the model's {layers} layers once)"
    named = ("named " + ", ".join(ITERATION_WORDS[:-1]) + f" or {ITERATION_WORDS[-1]}" if settings.iteration_pattern == DEFAULT_ITERATION_PATTERN
             else f"matching {settings.iteration_pattern!r}")
    if its.height:
        if "name" in its.columns and its["name"].drop_nulls().str.contains(PROFILER_STEP).all():
            named = "torch.profiler's step ranges, ProfilerStep#N"
        method, why = ("forwards", forwards_why) if forwards_why else ("nvtx", f"NVTX iteration ranges ({named})")
        total = int(its["iteration"].max()) + 1  # type: ignore[arg-type]
        frame = _range_extents(its)
        reading = None
        if forwards_why:
            # the ranges say where each forward is, not which ones read a prompt: the kernels'
            # reading of the same forwards does (its embedding lookup's rows, its GEMMs)
            fwd = forward_iterations(get(["rank", "device_id", "start_ns", "end_ns", "duration_ns", "name", "correlation_id"]),
                                     labels() if labels is not None else None, grid, min_repeats=settings.min_repeats,
                                     graph_launches=graph_launches)
            reading = fwd[1] if fwd is not None and fwd[1].tokens is not None else None
        return Iterations(_timed(frame), total, method, why, reading=reading)
    frame = pl.DataFrame()
    loops: list[DeviceLoop] = []
    method, why = "", ""
    if few:
        why = few
    if graph_launches is not None and graph_launches.height:
        frame = graph_replay_iterations(graph_launches, get(["rank", "device_id", "duration_ns"]), min_repeats=settings.min_repeats)
        method, why = "graph_replays", "no NVTX iteration ranges: one step per replay of the CUDA graph that holds the most GPU time"
    if frame.height == 0:
        # in start order once, here, where nothing else is held: each GPU's operations below are
        # then the frame itself or a filter of it, not one more sorted copy
        ops = _read_by_start(get, ["rank", "device_id", "start_ns", "end_ns", "duration_ns", "name", "correlation_id"])
        text = labels() if labels is not None else None
        fwd = forward_iterations(ops, text, grid, min_repeats=settings.min_repeats, graph_launches=graph_launches)
        if fwd is not None:
            passes, reading, n_ranks = fwd
            no = few or ("no NVTX ranges" if nvtx.height == 0 else "no NVTX iteration ranges")
            why = f"{no}: one iteration per forward pass of the model ({reading.passes.evidence()})"
            passes = passes.with_columns(pl.col("start_ns").alias("w_start"), pl.col("end_ns").alias("w_end"),
                                         pl.col("duration_ns").alias("length_ns"))
            return Iterations(_timed(passes), passes.height, "forward_passes", why, reading=reading, ranks=n_ranks)
        layer_notes: list[str] = []
        # only the forward passes match launches: the ids go before the loop search (1 M kernels: 8 MB)
        ops = ops.drop("correlation_id", strict=False)
        loops = kernel_loop_iterations(ops, min_repeats=settings.min_repeats, labels=text, notes=layer_notes)
        one = _one_profiler_step(ops_with_launch, nvtx, settings, get)
        # a program that stepped the profiler once ran one step, unless the loop inside it is of
        # training steps, each with its optimizer update (prof.step() once per epoch)
        if one is not None and not (loops and _optimizer_in_each(ops, text, loops[0])):
            return one
        frame = loops[0].iterations if loops else _empty_iterations()
        method = "kernel_loop"
        no = "no NVTX ranges" if nvtx.height == 0 else "no NVTX iteration ranges"
        if few:
            no = few
        if loops:
            top = loops[0]
            said = ", ".join(top.anchor_names())
            why = (f"{no}: iterations from the kernels that run once per iteration ({len(top.loop.anchors)} of them"
                   + (f": {said}" if said else "") + ")")
        else:
            why = f"{no}: iterations from the kernel sequence" + (f"; {layer_notes[0]}" if layer_notes else "")
    frame = frame.with_columns(pl.col("start_ns").alias("w_start"), pl.col("end_ns").alias("w_end"),
                               pl.col("duration_ns").alias("length_ns")) if frame.height else frame
    return Iterations(_timed(frame), frame.height, method, why, loops)


def _range_extents(its: pl.DataFrame) -> pl.DataFrame:
    """NVTX iterations with their extent over CPU range and GPU span (``w_start``, ``w_end``)
    and length (``length_ns``)."""
    return its.with_columns(
        pl.min_horizontal("start_ns", "gpu_start_ns").alias("w_start"),
        pl.max_horizontal("end_ns", "gpu_end_ns").alias("w_end"),
        pl.max_horizontal("duration_ns", pl.col("gpu_span_ns").fill_null(0)).alias("length_ns"),
    )


def _one_profiler_step(ops_with_launch: OpsWithLaunch, nvtx: pl.DataFrame, settings: Settings,
                       get: Callable[[list[str]], pl.DataFrame]) -> Iterations | None:
    """The one step of a trace whose program called ``prof.step()`` once in the capture
    (a single ``ProfilerStep#N`` holding the work: DeepSeek's published training trace,
    TraceLens' Hugging Face ones), read after the forward passes and before the kernel loop:
    the kernels that repeat inside it are the model's layers, not steps. ``None`` otherwise."""
    if nvtx.height == 0:
        return None
    its = nvtx_iterations(ops_with_launch, nvtx, replace(settings, iteration_pattern=PROFILER_STEP), one=True)  # type: ignore[type-var]
    its, _ = _holding_work(its, get)
    if its.height != 1:
        return None
    name = str(its["name"][0]) if "name" in its.columns else "ProfilerStep"
    why = f"one torch.profiler step range ({name}): the program stepped the profiler once; the kernels that repeat in it are its layers"
    return Iterations(_timed(_range_extents(its)), 1, "nvtx", why)


#: NVTX iteration ranges are the iterations only when the operations launched inside them are
#: at least this share of all (ranges named like ``FSDP::pre_forward`` around a hook are not) …
NVTX_WORK_SHARE = 0.1
#: … and at least this share of them have one name, digits aside (``step.3``, ``step.4``; not
#: ``FSDP::pre_forward (blocks.3)`` beside ``flash_attn::_flash_attn_forward``).
NVTX_ONE_NAME = 0.8


def _holding_work(its: pl.DataFrame, get: Callable[[list[str]], pl.DataFrame]) -> tuple[pl.DataFrame, str]:
    """``its`` (NVTX iterations) when they are one loop's ranges (:data:`NVTX_ONE_NAME`) and,
    when every one was measured, hold :data:`NVTX_WORK_SHARE` of the GPU operations; else an
    empty frame and why."""
    if its.height == 0:
        return its, ""
    if "name" in its.columns:
        shape = its["name"].fill_null("").str.replace_all(r"\d+", "#")
        top = shape.value_counts(sort=True)
        if top.height and int(top["count"][0]) < NVTX_ONE_NAME * its.height:
            return pl.DataFrame(), (f"NVTX ranges named like iterations ({top.height} names: "
                                    f"{', '.join(repr(n[:40]) for n in top[shape.name].head(2).to_list())} …) are not one loop")
    if "ops" not in its.columns or its["ops"].null_count():
        return its, ""
    total = get(["start_ns"]).height
    inside = int(its["ops"].sum())
    if total and inside < NVTX_WORK_SHARE * total:
        name = str(its["name"][0]) if "name" in its.columns and its["name"][0] is not None else "?"
        return pl.DataFrame(), (f"NVTX ranges named like iterations ({name!r} …) launch only {inside / total:.0%} of the "
                                "GPU operations, so they are not the iterations")
    return its, ""


def _timed(frame: pl.DataFrame) -> pl.DataFrame:
    """Iterations without a time (a damaged NVTX table) cannot bound a window."""
    if frame.height == 0 or "w_start" not in frame.columns:
        return frame
    return frame.filter(pl.col("w_start").is_not_null() & pl.col("w_end").is_not_null() & pl.col("length_ns").is_not_null())


# -- the structure -----------------------------------------------------------------------------

#: Training: backward kernels must be at least this share of the steady iterations' kernel time
#: other than communication kernels' (:func:`_compute_ns`).
BACKWARD_SHARE = 0.01
#: A microbenchmark's iterations hold at most this many operations (median), …
MICRO_MAX_OPS = 8
#: … of at most this many kernel names in all, …
MICRO_MAX_NAMES = 8
#: … it repeats at least this many times, …
MICRO_MIN_REPEATS = 3
#: … its steady iterations hold at least this share of the capture's GPU time, …
MICRO_GPU_SHARE = 0.1
#: … and the GPU is busy at least this share of each iteration (a benchmark times GPU work;
#: a solver whose host works between a few kernels is no benchmark).
MICRO_BUSY = 0.2
#: A decode step copies its sampled token ids to the host: at most this many bytes.
TOKEN_COPY_MAX_BYTES = 1 << 16
#: Kernels that only a model's forward runs (matrix products, attention); those that pick the
#: next token are :data:`tracekit.analysis.run.forwards.SAMPLING_NAMES`.
MODEL_NAMES = r"(?i)gemm|gemv|nvjet|cutlass|xmma|cublas|matmul|flash|sdpa|attention|fmha"


@dataclass
class RunStructure:
    """The structure of a run (see the module doc).

    ``kind`` (one of :data:`KINDS`) with ``evidence`` (sentences); ``method`` (``nvtx``,
    ``forwards``, ``graph_replays``, ``kernel_loop`` or ``none``) and ``reason``: how the
    iterations were found. ``iterations``: one row per iteration of the GPU (or process) that
    bounds the window, with ``warmup`` (bool) and ``w_start``/``w_end`` (its extent, ns) and
    ``length_ns``; ``total`` iterations in all, the first ``warmup_steps`` of them warm-up,
    ``steps`` steady ones of median ``step_ns``. ``start_ns``…``end_ns`` is the steady window
    (the whole capture when there are no iterations). ``segments``: per GPU or process with
    iterations, the ``startup``, ``warmup``, ``steady`` and ``teardown`` stretches
    (``start_ns``, ``end_ns``, ``duration_ns``, ``iterations``, ``evidence``). ``ranks``: how
    many GPUs or processes run the loop. ``steps_table`` and ``requests`` (generation and
    serving) are the token steps and requests of :mod:`tracekit.analysis.run.phases`, set by
    :meth:`with_generation`.
    """

    kind: str
    evidence: tuple[str, ...]
    method: str
    reason: str
    iterations: pl.DataFrame
    total: int
    warmup_steps: int
    steps: int
    step_ns: int | None
    start_ns: int
    end_ns: int
    trace_start_ns: int
    trace_end_ns: int
    segments: pl.DataFrame
    ranks: int = 1
    #: Why the steps look like one-token forwards (a small device-to-host copy of the sampled
    #: ids each step, sampling and model kernels), or ``None``: what lets a loop without a
    #: prefill or decode range count as a generation.
    token_evidence: str | None = None
    #: A server's spans with no request to run (``start_ns``, ``end_ns``: gaps between engine
    #: steps longer than :data:`NO_LOAD_FACTOR` times the median step interval): idle by load,
    #: not the engine's time.
    idle_spans: pl.DataFrame = field(default_factory=pl.DataFrame, repr=False)
    loops: list[DeviceLoop] = field(default_factory=list, repr=False)
    #: The forward passes read from the kernels (method ``forward_passes``), else ``None``.
    reading: TokenReading | None = field(default=None, repr=False)
    steps_table: pl.DataFrame = field(default_factory=pl.DataFrame, repr=False)
    requests: pl.DataFrame = field(default_factory=pl.DataFrame, repr=False)
    #: A training run's periodic work between steps (evaluations, checkpoint saves: ``what``,
    #: ``start_ns``, ``end_ns``, ``duration_ns``, ``step``), set apart from the steady steps'
    #: figures; set by the diagnosis (:func:`tracekit.analysis.run.training.training_phases`).
    periodic: pl.DataFrame = field(default_factory=pl.DataFrame, repr=False)

    @property
    def startup_ns(self) -> int | None:
        """From the capture's start to the first iteration (ns), on the GPU or process that
        bounds the window; ``None`` without iterations."""
        if self.iterations.height == 0:
            return None
        return max(int(self.iterations["w_start"].min()) - self.trace_start_ns, 0)  # type: ignore[arg-type]

    @property
    def teardown_ns(self) -> int | None:
        """From the last iteration's end to the capture's end (ns)."""
        if self.iterations.height == 0:
            return None
        return max(self.trace_end_ns - int(self.iterations["w_end"].max()), 0)  # type: ignore[arg-type]

    @property
    def steady_steps(self) -> pl.DataFrame:
        """The token steps of the steady requests (not warm-up), with ``request``: what the
        steady phase figures are computed from (:func:`tracekit.analysis.run.phases.phase_summary`)."""
        st = self.steps_table
        if st.height == 0 or "warmup" not in st.columns:
            return st
        return st.filter(~pl.col("warmup"))

    def with_generation(self, steps: pl.DataFrame, *, warmup_factor: float = 1.5, nvtx: pl.DataFrame | None = None) -> RunStructure:
        """This structure with the token steps of :func:`tracekit.analysis.run.phases.
        generation_steps` (``steps``): their requests, which requests are warm-up, and the kind
        (``generation`` or ``serving``) when no other kind was found first (a training loop's
        steps are never a generation), and, given ``nvtx``, each request's name from the NVTX
        range around it (:func:`tracekit.analysis.run.phases.name_requests`). Unchanged when
        ``steps`` is empty or the kind is already known."""
        if steps.height == 0 or self.kind in ("training", "microbenchmark", "inference"):
            return self
        out = _with_generation(self, steps, warmup_factor)
        if nvtx is not None and nvtx.height and out.requests.height and out.kind == "generation":
            from tracekit.analysis.run.phases import name_requests

            out = replace(out, requests=name_requests(out.requests, out.steps_table, nvtx))
        return out

    def headline(self) -> str:
        """One line: the kind, the steady iterations, warm-up and start-up (what ``tracekit
        summary`` prints first)."""
        return _headline(self)

    def as_dict(self) -> dict[str, Any]:
        """Plain data (JSON): kind, evidence, how iterations were found, the steady window and
        the segments."""
        return {
            "kind": self.kind, "evidence": list(self.evidence), "method": self.method, "reason": self.reason,
            "iterations": self.total, "warmup_iterations": self.warmup_steps, "steady_iterations": self.steps,
            "step_ns": self.step_ns, "window_start_ns": self.start_ns, "window_end_ns": self.end_ns,
            "startup_ns": self.startup_ns, "teardown_ns": self.teardown_ns, "ranks": self.ranks,
            "headline": self.headline(), "segments": self.segments.to_dicts(),
            "requests": self.requests.to_dicts() if self.requests.height else [],
            "periodic": self.periodic.to_dicts() if self.periodic.height else [],
        }


def _fmt_ns(ns: float | None) -> str:
    if ns is None:
        return "?"
    if ns >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.1f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.0f} µs"
    return f"{ns:.0f} ns"


def _headline(s: RunStructure) -> str:
    kind = "run of unknown kind" if s.kind == "unknown" else s.kind
    if s.total == 0:
        return f"{kind}: no iterations found ({s.reason})"
    on = f" on {s.ranks} ranks" if s.ranks > 1 else ""
    warm = f", {s.warmup_steps} warm-up" if s.warmup_steps else ""
    start = s.startup_ns
    tail = f", start-up {_fmt_ns(start)} not counted" if start else ""
    if s.kind in ("generation", "serving") and s.requests.height:
        return _generation_headline(s, tail)
    one, many = {"training": ("step", "steps"), "microbenchmark": ("repetition", "repetitions"),
                 "inference": ("forward pass", "forward passes")}.get(s.kind, ("iteration", "iterations"))
    count = f"1 {one}" if s.steps == 1 else f"{s.steps} steady {many}"
    return f"{kind}: {count} of {_fmt_ns(s.step_ns)}{on}{warm}{_periodic_clause(s.periodic)}{tail}"


def _periodic_clause(periodic: pl.DataFrame) -> str:
    """``, 2 evaluations and 1 checkpoint save set apart`` (``""`` without periodic work)."""
    if periodic.height == 0 or "what" not in periodic.columns:
        return ""
    names = {"evaluation": ("evaluation", "evaluations"), "checkpoint": ("checkpoint save", "checkpoint saves")}
    counts = periodic.group_by("what").len().sort("what", descending=True)
    parts = [f"{n} {names.get(w, (w, w + 's'))[n != 1]}" for w, n in counts.iter_rows()]
    return ", " + " and ".join(parts) + " set apart"


def _generation_headline(s: RunStructure, tail: str) -> str:
    req = s.requests
    set_apart = pl.col("warmup") | pl.col("cold").fill_null(False) if "cold" in req.columns else pl.col("warmup")
    steady = req.filter(~set_apart) if "warmup" in req.columns else req
    warm = int(req["warmup"].sum()) if "warmup" in req.columns else 0
    cold = req.height - steady.height - warm
    base = steady if steady.height else req
    ttft = base["ttft_ns"].drop_nulls()
    tpot = base["tpot_median_ns"].drop_nulls()
    parts = []
    if ttft.len():
        parts.append(f"time to first token {_fmt_ns(float(ttft.median()))}")  # type: ignore[arg-type]
    if tpot.len():
        parts.append(f"time per output token {_fmt_ns(float(tpot.median()))}")  # type: ignore[arg-type]
    if s.kind == "serving":
        steps = s.steps_table
        n_steps = steps.height
        prefills = int(steps["prefills"].sum()) if n_steps and "prefills" in steps.columns else 0
        what = f"{n_steps} engine steps, {prefills} prefills"
        warm = int(steps.filter(pl.col("warmup"))["prefills"].sum()) if n_steps and "warmup" in steps.columns else 0
    else:
        what = f"{req.height} request{'s' if req.height != 1 else ''}"
    apart = [f"{warm} warm-up"] if warm else []
    if s.kind != "serving" and cold > 0:
        apart.append(f"{cold} cold")
    warm_s = f" ({', '.join(apart)} set apart)" if apart else ""
    return f"{s.kind}: {what}{warm_s}; steady: " + (", ".join(parts) or "no token times") + tail


def _iteration_lengths(it: pl.DataFrame) -> list[int]:
    return it["length_ns"].to_list() if it.height else []


def _segments(keys: dict[str, Any], it: pl.DataFrame, warm: int, lo: int, hi: int, evidence: str) -> list[dict[str, Any]]:
    """Start-up, warm-up, steady and tear-down of one GPU's (process's) iterations."""
    if it.height == 0:
        return []
    first = int(it["w_start"].min())  # type: ignore[arg-type]
    last = int(it["w_end"].max())  # type: ignore[arg-type]
    steady_start = int(it.slice(warm)["w_start"].min()) if warm < it.height else last  # type: ignore[arg-type]
    rows = [
        ("startup", lo, first, 0, "before the first iteration"),
        ("warmup", first, steady_start, warm, "leading iterations over the warm-up factor × the median of the rest"),
        ("steady", steady_start, last, it.height - warm, evidence),
        ("teardown", last, hi, 0, "after the last iteration"),
    ]
    return [{**keys, "segment": seg, "start_ns": a, "end_ns": max(b, a), "duration_ns": max(b - a, 0), "iterations": n, "evidence": e}
            for seg, a, b, n, e in rows]


_SEGMENT_SCHEMA = {"segment": pl.Utf8, "start_ns": pl.Int64, "end_ns": pl.Int64, "duration_ns": pl.Int64, "iterations": pl.Int64,
                   "evidence": pl.Utf8}


def build_structure(
    found: Iterations,
    settings: Settings,
    *,
    trace_start_ns: int,
    trace_end_ns: int,
    window_ops: Callable[[int, int], pl.DataFrame] | None = None,
    total_gpu_ns: int | None = None,
    nvtx: pl.DataFrame | None = None,
) -> RunStructure:
    """The :class:`RunStructure` of the iterations ``found`` (:func:`find_iterations`):
    warm-up, the steady window, the segments of every GPU with a loop, and the kind of run
    read from the steady window's operations (``window_ops(start_ns, end_ns)``: the GPU
    operations starting in it, text names, ``op_kind``, ``duration_ns``, ``bytes``; ``None``
    leaves the kind ``unknown``) and ``total_gpu_ns`` (the capture's summed GPU operation
    time). Generation and serving need the token steps: :meth:`RunStructure.with_generation`
    adds them."""
    it = found.frame
    if it.height == 0:
        seg = pl.DataFrame(schema=_SEGMENT_SCHEMA)
        s = RunStructure("unknown", ("no iterations: " + found.reason,) if found.reason else (), found.method or "none",
                         found.reason or "no iterations", it, 0, 0, 0, None, trace_start_ns, trace_end_ns,
                         trace_start_ns, trace_end_ns, seg)
        if window_ops is not None:  # training is told by its kernels without iterations (a slice of a run)
            kind, ev = classify(window_ops(trace_start_ns, trace_end_ns + 1), s, total_gpu_ns=total_gpu_ns)
            if kind == "training":
                s.kind, s.evidence = kind, (*ev, "no iterations found: " + found.reason)
        return s
    warm = warmup_count(_iteration_lengths(it), settings.warmup_factor)
    steady = it.slice(warm)
    start = int(steady["w_start"].min())  # type: ignore[arg-type]
    if warm:
        # the window opens when the warm-up's own GPU work is over (the host may run ahead)
        gpu_end = "gpu_end_ns" if "gpu_end_ns" in it.columns else "end_ns"
        prev = it.slice(0, warm)[gpu_end].max()
        if prev is not None:
            start = max(start, int(prev))  # type: ignore[arg-type]
    end = int(steady["w_end"].max())  # type: ignore[arg-type]
    step_ns = int(float(np.median(steady["length_ns"].to_numpy())))
    reason = found.reason
    if warm:
        reason += f"; the first {warm} iteration(s) took over {settings.warmup_factor}× the median of the rest (warm-up)"
    it = it.with_columns((pl.int_range(pl.len()) < warm).alias("warmup"))
    rows: list[dict[str, Any]] = []
    ranks = 1
    loops = []
    if found.loops:
        ranks = len(found.loops)
        for dl in found.loops:
            d_it = dl.iterations.with_columns(pl.col("start_ns").alias("w_start"), pl.col("end_ns").alias("w_end"),
                                              pl.col("duration_ns").alias("length_ns"))
            d_warm = warmup_count(_iteration_lengths(d_it), settings.warmup_factor)
            loops.append(replace(dl, warmup=d_warm))
            rows.extend(_segments(dl.keys, d_it, d_warm, trace_start_ns, trace_end_ns, found.reason))
    else:
        keys: dict[str, Any] = {k: it[k][0] for k in ("rank", "pid", "device_id") if k in it.columns}
        rows.extend(_segments(keys, it, warm, trace_start_ns, trace_end_ns, found.reason))
        ranks = found.ranks
    segments = pl.DataFrame(rows) if rows else pl.DataFrame(schema=_SEGMENT_SCHEMA)
    s = RunStructure("unknown", (), found.method, reason, it, found.total, warm, found.total - warm, step_ns, start, end,
                     trace_start_ns, trace_end_ns, segments, ranks, loops=loops, reading=found.reading)
    if window_ops is not None:
        lo, hi = _classify_span(it, warm, start, end)
        ops = window_ops(lo, hi)
        n_span = it.slice(warm).filter((pl.col("w_start") >= lo) & (pl.col("w_start") < hi)).height
        s.kind, s.evidence = classify(ops, s, total_gpu_ns=total_gpu_ns, iterations=n_span, span_ns=hi - lo)
        if s.kind == "microbenchmark" and (lo, hi) != (start, end) and n_span and ops.height / n_span * s.steps <= MICRO_EVIDENCE_OPS:
            # a benchmark's loops (one kernel timed, then another) each get their line: every
            # steady repetition's kernels, not the middle ones only
            s.evidence = (_timed_kernels(window_ops(start, end), s),)
        s.token_evidence = token_evidence(ops, n_span) if s.kind == "unknown" else None
        if s.kind == "training" and found.method == "kernel_loop":
            merged = _optimizer_steps(found, window_ops)
            if merged is not None:
                return build_structure(merged, settings, trace_start_ns=trace_start_ns, trace_end_ns=trace_end_ns,
                                       window_ops=window_ops, total_gpu_ns=total_gpu_ns, nvtx=nvtx)
    if s.kind == "unknown" and nvtx is not None:
        why = xla_backward_evidence(nvtx)
        if why is not None:
            s.kind, s.evidence, s.token_evidence = "training", (why,), None
            return s
    reading = found.reading
    if reading is not None and s.kind in ("unknown", "microbenchmark"):
        if reading.tokens is not None:
            s.kind, s.evidence, s.token_evidence = "unknown", (), reading.tokens
        else:
            s.kind, s.token_evidence = "inference", None
            s.evidence = (reading.passes.evidence() + ", with no sign of tokens (no embedding lookup opening them, or no "
                          "prompt's forward followed by one-token forwards): a model run over and over, not a generation",)
    return s


#: Micro-batches are told from the optimizer kernels of at most this many iterations in the middle.
MICRO_BATCH_ITERATIONS = 64


def _optimizer_steps(found: Iterations, window_ops: Callable[[int, int], pl.DataFrame]) -> Iterations | None:
    """``found``'s kernel-loop iterations merged into optimizer steps when they are micro-batches
    (:func:`tracekit.analysis.run.training.micro_batch_steps`, read from the operations of the
    middle :data:`MICRO_BATCH_ITERATIONS` iterations), or ``None``."""
    top = found.frame
    if top.height < 4 or not found.loops:
        return None
    n = min(top.height, MICRO_BATCH_ITERATIONS)
    first = (top.height - n) // 2
    part = top.slice(first, n)
    ops = window_ops(int(part["w_start"].min()), int(part["w_end"].max()))  # type: ignore[arg-type]
    if ops.height == 0 or "start_ns" not in ops.columns:
        return None

    def own(keys: dict[str, Any]) -> pl.DataFrame:
        sel = [pl.col(k) == v for k, v in keys.items() if k in ops.columns and v is not None]
        return ops.filter(pl.all_horizontal(sel)) if sel else ops

    head = micro_batch_steps(top, own(found.loops[0].keys))
    if head is None:
        return None
    frame, period = head
    loops = []
    for dl in found.loops:
        merged = micro_batch_steps(dl.iterations, own(dl.keys))
        loops.append(replace(dl, iterations=merged[0]) if merged is not None else dl)
    reason = (f"{found.reason}; {period} micro-batches per optimizer step (the optimizer's kernels run in one "
              f"iteration of the loop in {period}: gradient accumulation)")
    return Iterations(_timed(frame), frame.height, found.method, reason, loops)


#: XLA's op names of a JAX program's reverse-mode autodiff: ``jax.grad`` transposes the
#: forward's linearisation, and JAX names those ops ``transpose(jvp(…))``.
XLA_BACKWARD = "transpose(jvp("
#: XLA's NVTX ranges (``Thunk:#name=jit(train_step)/…``, ``XlaModule:#hlo_module=…``).
_XLA_MODULE = r"XlaModule:#(?:[^#]*,)?hlo_module=([^,#]+)"


def xla_backward_evidence(nvtx: pl.DataFrame) -> str | None:
    """Why a JAX/XLA run is training, or ``None``: XLA's NVTX ranges name the ops JAX's autodiff
    made for the backward (:data:`XLA_BACKWARD`), with the jitted function that ran them. XLA's
    fused kernels carry no backward in their names; its ranges do."""
    if nvtx.height == 0 or "name" not in nvtx.columns:
        return None
    names = nvtx["name"].drop_nulls()
    bwd = names.filter(names.str.contains(XLA_BACKWARD, literal=True))
    if bwd.len() == 0:
        return None
    fn = bwd.str.extract(r"#name=(jit\([^)/]*\))", 1).drop_nulls()
    where = f" in {fn.mode().sort()[0]}" if fn.len() else ""
    return (f"JAX autodiff: {bwd.len():,} XLA op ranges{where} named {XLA_BACKWARD}…)), the backward jax.grad builds "
            "(XLA's fused kernels carry no backward names, its NVTX ranges do)")


#: The kind of run is read from at most this many steady iterations in the middle.
CLASSIFY_ITERATIONS = 20


def _classify_span(it: pl.DataFrame, warm: int, start: int, end: int) -> tuple[int, int]:
    """The middle :data:`CLASSIFY_ITERATIONS` steady iterations' extent (the whole steady
    window when it has no more)."""
    steady = it.slice(warm)
    if steady.height <= CLASSIFY_ITERATIONS:
        return start, end
    part = steady.slice((steady.height - CLASSIFY_ITERATIONS) // 2, CLASSIFY_ITERATIONS)
    return int(part["w_start"].min()), int(part["w_end"].max())  # type: ignore[arg-type]


def _names_like(ops: pl.DataFrame, pattern: str) -> pl.DataFrame:
    k = ops.filter((pl.col("op_kind") == "kernel") if "op_kind" in ops.columns else pl.lit(True))
    return k.filter(pl.col("name").str.contains(pattern))


def classify(window_ops: pl.DataFrame, s: RunStructure, *, total_gpu_ns: int | None = None, iterations: int | None = None,
             span_ns: int | None = None) -> tuple[str, tuple[str, ...]]:
    """``(kind, evidence)`` of a run from its steady window's GPU operations (text names):
    ``training`` when backward kernels hold at least :data:`BACKWARD_SHARE` of the kernel time
    other than communication's (an NCCL kernel's time is mostly its wait for the other ranks:
    FSDP2 on two GPUs: NCCL kernels 86–91 % of the kernel time, backward kernels 0.5–0.8 % of
    all of it and 6 % of the rest)
    (optimizer kernels and gradient collectives add to the evidence); ``microbenchmark`` when
    at least :data:`MICRO_MIN_REPEATS` iterations of at most :data:`MICRO_MAX_OPS` operations
    each, of at most :data:`MICRO_MAX_NAMES` kernel names, hold :data:`MICRO_GPU_SHARE` of the
    capture's GPU time (``total_gpu_ns``; ``window_ops`` covers ``iterations`` of the steady
    ones, over ``span_ns``) with the GPU busy :data:`MICRO_BUSY` of the time; otherwise
    ``unknown`` until the token steps are known (:meth:`RunStructure.with_generation`)."""
    ops = window_ops
    if ops.height == 0 or "name" not in ops.columns or ops["name"].dtype != pl.Utf8:
        return "unknown", ("no GPU operations with names in the steady window",)
    kern = ops.filter(pl.col("op_kind") == "kernel") if "op_kind" in ops.columns else ops
    total = _compute_ns(kern)
    bwd = _names_like(ops, BACKWARD_NAMES)
    share = int(bwd["duration_ns"].sum() or 0) / total if total else 0.0
    if bwd.height and share >= BACKWARD_SHARE:
        names = bwd.group_by("name").agg(pl.col("duration_ns").sum()).sort("duration_ns", descending=True)["name"]
        shown = list(dict.fromkeys(_short(n) for n in names.to_list()))
        ev = [f"backward kernels: {len(shown)} kinds, {share:.0%} of the steady steps' kernel time "
              f"({', '.join(shown[:3])})"]
        opt = _names_like(ops, OPTIMIZER_NAMES)
        if opt.height:
            top = opt.group_by("name").len().sort("len", descending=True)["name"][0]
            ev.append(f"optimizer kernels: {opt.height:,} launches ({_short(top)} …)")
        coll = _names_like(ops, GRADIENT_COLLECTIVES)
        if coll.height:
            top = coll.group_by("name").len().sort("len", descending=True)["name"][0]
            ev.append(f"gradient collectives: {coll.height:,} ({_short(top, 60)} …)")
        return "training", tuple(ev)
    size_col = "ops" if "ops" in s.iterations.columns else "kernels"
    sizes = s.iterations.slice(s.warmup_steps)[size_col].drop_nulls() if size_col in s.iterations.columns else pl.Series([], dtype=pl.Int64)
    median = float(sizes.median()) if sizes.len() else 0.0  # type: ignore[arg-type]
    per_name = kern.group_by("name").agg(pl.len().alias("n"), pl.col("duration_ns").sum().alias("t"),
                                         pl.col("duration_ns").median().alias("m")).sort("t", descending=True)
    gpu = int(ops["duration_ns"].sum() or 0)
    scale = s.steps / iterations if iterations else 1.0  # the span's GPU time → the steady window's
    enough = total_gpu_ns is None or total_gpu_ns <= 0 or gpu * scale >= MICRO_GPU_SHARE * total_gpu_ns
    busy = span_ns is None or span_ns <= 0 or gpu >= MICRO_BUSY * span_ns
    if (s.method != "graph_replays" and s.total >= MICRO_MIN_REPEATS and 0 < median <= MICRO_MAX_OPS
            and 0 < per_name.height <= MICRO_MAX_NAMES and enough and busy):
        return "microbenchmark", (_timed_kernels(ops, s, median),)
    return "unknown", ("no backward kernels, and not a loop timing a few kernels",)


#: A microbenchmark's kernels are listed from every steady repetition up to this many operations.
MICRO_EVIDENCE_OPS = 500_000


def _timed_kernels(ops: pl.DataFrame, s: RunStructure, median: float | None = None) -> str:
    """The microbenchmark sentence: the loop, and each kernel it times with its launches and
    median duration (what a benchmark reports)."""
    kern = ops.filter(pl.col("op_kind") == "kernel") if "op_kind" in ops.columns else ops
    per_name = kern.group_by("name").agg(pl.len().alias("n"), pl.col("duration_ns").sum().alias("t"),
                                         pl.col("duration_ns").median().alias("m")).sort("t", descending=True)
    if median is None:
        col = "ops" if "ops" in s.iterations.columns else "kernels"
        median = float(s.iterations.slice(s.warmup_steps)[col].median() or 0)  # type: ignore[arg-type]
    timed = "; ".join(f"{_short(r['name'])} ×{r['n']:,}, median {_fmt_ns(r['m'])}" for r in per_name.head(4).iter_rows(named=True))
    return (f"{s.total:,} iterations of {median:.0f} operation(s) each, {per_name.height} kernel name(s) in all: "
            f"a loop timing a few kernels ({timed})")


def token_evidence(window_ops: pl.DataFrame, iterations: int) -> str | None:
    """Why the steady iterations look like one-token forwards, or ``None``: at least one small
    device-to-host copy (≤ :data:`TOKEN_COPY_MAX_BYTES`: the sampled ids) per iteration of the
    ``iterations`` that ``window_ops`` covers, an embedding lookup per iteration
    (:data:`~tracekit.analysis.run.forwards.EMBEDDING_NAMES`), and sampling
    (:data:`~tracekit.analysis.run.forwards.SAMPLING_NAMES`) and model kernels
    (:data:`MODEL_NAMES`) in them. A loop
    without (a simulation's time steps, a NaN check's ``.item()`` after each layer) is not a
    generation, however its first step compares with the rest."""
    ops = window_ops
    if ops.height == 0 or iterations == 0 or "name" not in ops.columns or ops["name"].dtype != pl.Utf8:
        return None
    copies = ops.filter((pl.col("name") == HOST_COPY_NAME) & (pl.col("bytes") <= TOKEN_COPY_MAX_BYTES)) if "bytes" in ops.columns else ops.clear()
    if copies.height < iterations:
        return None
    sampling = _names_like(ops, SAMPLING_NAMES)
    model = _names_like(ops, MODEL_NAMES)
    k = ops.filter((pl.col("op_kind") == "kernel") if "op_kind" in ops.columns else pl.lit(True))
    lookups = k.filter(token_lookup_names(k["name"]))
    if sampling.height == 0 or model.height == 0 or lookups.height < iterations:
        return None  # tokens enter a language model through its embedding: an image classifier's argmax is no token
    size = int(copies["bytes"].median() or 0)  # type: ignore[arg-type]
    return (f"each step copies {size:,} B to the host ({copies.height:,} copies over {iterations} steady steps) after "
            f"{_short(sampling['name'][0])}: the sampled tokens of a decode loop")


#: Serving: a gap between engine steps longer than this many times the median step interval
#: is time with no request to run.
NO_LOAD_FACTOR = 3.0
#: Serving: an idle gap longer than this many times the median step interval (and at least
#: :data:`BURST_GAP_MIN_NS`) separates bursts of engine steps; leading bursts with less than
#: :data:`WARMUP_BURST_SHARE` of the steps are warm-up (a benchmark client's test request).
BURST_GAP_FACTOR = 20.0
BURST_GAP_MIN_NS = 50_000_000
WARMUP_BURST_SHARE = 0.2


def _decode_runs(steps: pl.DataFrame) -> list[int]:
    """Decode steps after each prefill step, up to the next prefill."""
    runs: list[int] = []
    for phase in steps.sort("start_ns")["phase"].to_list():
        if phase == "prefill":
            runs.append(0)
        elif runs:
            runs[-1] += 1
    return runs


def _with_generation(s: RunStructure, steps: pl.DataFrame, warmup_factor: float) -> RunStructure:
    from tracekit.analysis.run.phases import number_requests, requests

    steps = number_requests(steps)
    runs = _decode_runs(steps)
    prefills = int(steps["prefills"].sum()) if "prefills" in steps.columns else len(runs)
    src = steps["source"][0] if "source" in steps.columns and steps.height else ""
    if src == "forwards" and s.reading is not None:
        # continuous batching is seen in the forwards themselves: prompts' forwards in the
        # same engine steps as other requests' decode (forwards.read_tokens)
        serving = s.reading.serving
    else:
        serving = prefills >= 3 and bool(runs) and (min(runs) == 0 or max(runs) >= 1.5 * min(runs) + 1 or prefills > len(runs))
    heavy = ""
    if prefills:
        busy = steps.filter(pl.col("phase") == "decode")["gpu_busy_ns"].drop_nulls()
        pre = steps.filter(pl.col("phase") == "prefill")["gpu_busy_ns"].drop_nulls()
        if busy.len() and pre.len() and float(busy.median() or 0) > 0:  # type: ignore[arg-type]
            heavy = f", {float(pre.median()) / float(busy.median()):.0f}× a decode step's GPU time"  # type: ignore[arg-type]
    if serving:
        # requests arrive while others decode: no decode step belongs to one request, so each
        # prefill is a request (its time to first token) and each step serves all of them
        gaps = steps.sort("start_ns").select(
            (pl.col("start_ns") - pl.max_horizontal("end_ns", "gpu_end_ns").shift(1)).alias("g"))["g"]
        interval = float(steps.sort("start_ns")["start_ns"].diff().drop_nulls().median() or 0)  # type: ignore[arg-type]
        cut = max(BURST_GAP_FACTOR * interval, BURST_GAP_MIN_NS)
        burst = (gaps.fill_null(0) > cut).cast(pl.Int64).cum_sum()
        steps = steps.sort("start_ns").with_columns(burst.alias("_burst"))
        sizes = steps.group_by("_burst").len().sort("_burst")
        warm_bursts: set[int] = set()
        seen = 0
        for b, n in sizes.iter_rows():
            if b == sizes["_burst"].max() or seen + n >= WARMUP_BURST_SHARE * steps.height:
                break
            warm_bursts.add(b)
            seen += n
        steps = steps.with_columns(pl.col("_burst").is_in(list(warm_bursts)).alias("warmup")).drop("_burst")
        req = requests(steps.with_columns(pl.when(pl.col("phase") == "prefill").then(pl.col("request")).otherwise(None).alias("request")
                                          ).filter(pl.col("request").is_not_null()), warmup_factor=warmup_factor)
        warm_req = steps.filter(pl.col("phase") == "prefill").select("request", "warmup")
        req = req.drop("warmup").join(warm_req, on="request", how="left").select(list(req.columns))
        per_step = steps.filter(pl.col("phase") == "prefill").select("request", pl.col("prefills").alias("_k"))
        req = req.join(per_step, on="request", how="left").with_columns(pl.col("_k").fill_null(1).alias("prefill_steps")).drop("_k")
        steady = steps.filter(~pl.col("warmup")).sort("start_ns")
        tpot = float(steady["start_ns"].diff().drop_nulls().median() or 0) if steady.height > 1 else None  # type: ignore[arg-type]
        req = req.with_columns(pl.lit(tpot, pl.Float64).alias("tpot_median_ns"), pl.lit(None, pl.Float64).alias("tpot_p90_ns"))
        n_warm = int(steps.filter(pl.col("warmup"))["prefills"].sum()) if "prefills" in steps.columns else 0
        ev = (f"{prefills} prefills (a prompt's forward each) in {len(runs)} of {steps.height} engine steps, while other requests "
              f"decoded: decode runs of {min(runs)} to {max(runs)} steps between them (continuous batching); the time per output "
              "token is the engine's step interval, shared by every running request"
              + (f"; {n_warm} request(s) before a pause of over {_fmt_ns(cut)} set apart as warm-up (a client's test request)"
                 if n_warm else ""),)
        kind = "serving"
    else:
        req = requests(steps)
        warm_ids = req.filter(pl.col("warmup") | pl.col("cold"))["request"].to_list()
        steps = steps.with_columns(pl.col("request").is_in(warm_ids).alias("warmup"))
        if prefills:
            each = (f"{runs[0]}" if len(set(runs)) == 1 else f"{min(runs)} to {max(runs)}") if runs else "0"
            what = (f"a prompt's forward (prefill{heavy}) then one-token steps: {prefills} request"
                    + ("s" if prefills > 1 else "") + f" of {each} decode steps"
                    + (" each" if prefills > 1 and len(set(runs)) == 1 else ""))
        else:
            what = f"{steps.height} decode steps ({src}); the prompt's forward is not in the capture"
        n_short = int(req["warmup"].sum())
        n_cold = len(warm_ids) - n_short
        apart = []
        if n_short:
            apart.append(f"{n_short} warm-up request(s) set apart: each made at most half the new tokens of the requests after it")
        if n_cold:
            apart.append(f"{n_cold} cold request(s) set apart: each took over twice the time per output token of the requests after it")
        ev: tuple[str, ...] = (what + (f" ({'; '.join(apart)})" if apart else ""),)
        if src == "forwards" and s.reading is not None:
            r = s.reading
            drafts = r.forwards.filter(pl.col("role") == "draft")
            ev = ((r.tokens,) if r.tokens else ()) + ev
            if drafts.height:
                depth = int(drafts["attention"].mode().sort()[0])
                ev += (f"speculative decoding: {drafts.height} forwards of a draft model ({depth} attention sites each) between "
                       f"the {r.passes.depths[r.main]}-site model's verify steps; the time per output token is per verify step "
                       "(the tokens each accepts are not in the GPU's work)",)
            ev += r.notes
            made = req["new_tokens"].fill_null(req["decode_steps"])
            steady = [int(m) for m, w in zip(made.to_list()[:-1], req["warmup"].to_list()[:-1], strict=True) if not w and m is not None]
            last = made[-1]
            if steady and last is not None and req.height > 1 and last < 0.5 * float(np.median(steady)):
                ev += (f"the last request made {last} tokens where the others made {int(np.median(steady))} (median): the capture "
                       "may have ended inside it, so its figures cover only what was captured",)
        kind = "generation"
    out = replace(s, steps_table=steps, requests=req)
    if s.kind == "unknown":
        out = replace(out, kind=kind, evidence=ev)
    out = _after_warm_requests(out, steps)
    if kind == "serving":
        out = replace(out, idle_spans=_no_load(steps))
        lost = int((out.idle_spans["end_ns"] - out.idle_spans["start_ns"]).sum()) if out.idle_spans.height else 0
        if lost and s.kind == "unknown":
            out = replace(out, evidence=(*out.evidence, f"the engine had no request to run for {_fmt_ns(lost)} between steps "
                                                        "(gaps over 3× the median step interval): idle by load"))
    return out


def _no_load(steps: pl.DataFrame) -> pl.DataFrame:
    """The steady engine steps' gaps of more than :data:`NO_LOAD_FACTOR` median intervals."""
    st = steps.filter(~pl.col("warmup")).sort("start_ns") if "warmup" in steps.columns else steps.sort("start_ns")
    schema = {"start_ns": pl.Int64, "end_ns": pl.Int64}
    if st.height < 3:
        return pl.DataFrame(schema=schema)
    median = float(st["start_ns"].diff().drop_nulls().median() or 0)  # type: ignore[arg-type]
    end = pl.max_horizontal("end_ns", "gpu_end_ns").shift(1)
    g = st.select(end.alias("start_ns"), pl.col("start_ns").alias("end_ns"), pl.col("start_ns").diff().alias("_iv"))
    return g.filter(pl.col("_iv") > NO_LOAD_FACTOR * median).filter(pl.col("end_ns") > pl.col("start_ns")).select(list(schema))


def _after_warm_requests(s: RunStructure, steps: pl.DataFrame) -> RunStructure:
    """The steady window opens after the warm-up requests' steps (a cold first generate()
    call, a client's test request): the iterations before the first steady token step become
    warm-up."""
    if "warmup" not in steps.columns or not steps["warmup"].any() or s.iterations.height == 0:
        return s
    steady = steps.filter(~pl.col("warmup"))
    if steady.height == 0:
        return s
    first = int(steady["start_ns"].min())  # type: ignore[arg-type]
    it = s.iterations
    before = it.filter(pl.col("w_end") <= first).height  # iterations wholly before the first steady token step
    before = min(before, it.height - 1)
    if before <= s.warmup_steps:
        return s
    rest = it.slice(before)
    step_ns = int(float(np.median(rest["length_ns"].to_numpy())))
    start = max(s.start_ns, int(it.slice(0, before)["gpu_end_ns" if "gpu_end_ns" in it.columns else "end_ns"].max() or s.start_ns))  # type: ignore[arg-type]
    start = min(start, int(rest["w_start"].min()))  # type: ignore[arg-type]
    reason = s.reason + f"; the first {before} iteration(s) ran the warm-up requests"
    return replace(s, iterations=it.with_columns((pl.int_range(pl.len()) < before).alias("warmup")), warmup_steps=before,
                   steps=s.total - before, step_ns=step_ns, start_ns=start, reason=reason)
