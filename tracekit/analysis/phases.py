"""Generation phases: the prefill, then one decode step per output token, and what each costs.

A ``generate()`` call or a served request is a prefill (the prompt's forward, which gives the
first token) followed by decode steps (one token each). :func:`generation_steps` finds the
steps, from the first of these sources that gives at least :data:`MIN_STEPS`:

1. ``nvtx``: ranges named ``prefill`` (also ``prompt``/``context`` as words) and the
   iteration ranges (``decode.N``, ``step.N`` …, :data:`~tracekit.analysis.iterations.ITERATION_WORDS`);
2. ``module``: one step per forward, the ranges that run the model's layers once
   (:func:`tracekit.analysis.layers.forward_ranges`: the root module's range that
   ``tracekit.torch.annotate`` / ``--annotate-torch`` pushes, ``Qwen3ForCausalLM``), else an
   outermost NVTX range of the default domain that repeats under one name;
3. ``graph_replays``: each replay of the CUDA graph that holds the most GPU time is a decode
   step (serving engines, ``torch.compile(mode="reduce-overhead")``); the GPU work before the
   first replay, back to the previous idle gap longer than a step, is the prefill;
4. ``kernel_period``: the repeating per-token sequence of kernel names on the busiest GPU
   (:func:`~tracekit.analysis.period.find_period`); the work before it is the prefill.

Without a ``prefill`` range, a leading step whose GPU busy time is at least
``prefill_factor`` (:data:`~tracekit.analysis.layers.PREFILL_FACTOR`) times the median of the
others is the prefill (the prompt's forward does a prompt's worth of work; warm-up is excluded
by capturing after it).

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

from tracekit.analysis._frames import interval_union, process_key, rank_keys
from tracekit.analysis.attribution import _nvtx_tree
from tracekit.analysis.iterations import DEFAULT_ITERATION_PATTERN, word_pattern
from tracekit.analysis.layers import PREFILL_FACTOR, forward_ranges
from tracekit.analysis.period import find_period

__all__ = ["DECODE_PATTERN", "MIN_STEPS", "PREFILL_PATTERN", "STEP_COLUMNS", "generation_steps", "phase_summary", "trace_generation_steps"]

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
}


#: The operation columns :func:`generation_steps` reads (with ``rank`` of a trace set).
_OP_COLUMNS = ("device_id", "start_ns", "end_ns", "duration_ns", "name", "op_kind", "global_tid", "api_start_ns")
#: Of those, what the NVTX steps read (:func:`_cpu_steps`, :func:`_busy`).
_NVTX_STEP_COLUMNS = ("device_id", "start_ns", "end_ns", "global_tid", "api_start_ns")

#: Repeated outermost ranges are forwards only when the work launched inside them holds at
#: least this share of the GPU's busy time.
MODULE_SHARE = 0.5


def _busy(ops: pl.DataFrame, rk: list[str]) -> int:
    if ops.height == 0:
        return 0
    return int(interval_union(ops, [*rk, "device_id"]).select((pl.col("end_ns") - pl.col("start_ns")).sum()).item())


def _empty(rk: list[str]) -> pl.DataFrame:
    return pl.DataFrame(schema={**{k: pl.Int64 for k in rk}, **STEP_COLUMNS})


def _cpu_steps(ranges: pl.DataFrame, ops: pl.DataFrame, rk: list[str]) -> pl.DataFrame:
    """GPU span and busy time of the operations launched inside each CPU range (same process,
    any thread): ``ranges`` has ``_sid``, ``start_ns``, ``end_ns``, ``_proc``."""
    by = [*rk, "_proc"]
    # only the processes the ranges are in can match (the join is by process): on a
    # two-process trace that halves what is sorted and joined
    procs = ranges.select(by).unique()
    o = ops.lazy().filter(pl.col("api_start_ns").is_not_null()).select(
        *rk, process_key("global_tid").alias("_proc"), "api_start_ns", "device_id", "start_ns", "end_ns",
    ).join(procs.lazy(), on=by, how="semi")
    win = ranges.lazy().select(*by, pl.col("start_ns").alias("api_start_ns"), pl.col("end_ns").alias("_rend"), "_sid")
    j = (
        o.sort([*by, "api_start_ns"])
        .join_asof(win.sort([*by, "api_start_ns"]), on="api_start_ns", by=by, strategy="backward", check_sortedness=False)
        .filter(pl.col("_sid").is_not_null() & (pl.col("api_start_ns") <= pl.col("_rend")))
        .select(*rk, "_sid", "device_id", "start_ns", "end_ns")
        .collect()
    )
    return _gpu_of(j, "_sid", rk)


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


def _from_period(ops: pl.DataFrame, rk: list[str]) -> pl.DataFrame | None:
    """Steps of the repeating kernel sequence on the busiest GPU; the work before the first
    period is the prefill."""
    k = ops.filter(pl.col("op_kind") == "kernel") if "op_kind" in ops.columns else ops
    if k.height < 2 * MIN_STEPS:
        return None
    dev = [*rk, "device_id"]
    busiest = k.group_by(dev).agg(pl.col("duration_ns").sum())
    busiest = busiest.sort(["duration_ns", *dev], descending=[True, *[False] * len(dev)], nulls_last=True).head(1).select(dev)
    k = k.join(busiest, on=dev).sort("start_ns")
    names = k["name"]  # integer codes from a big export's narrow read (equal names, equal codes)
    codes = (names if names.dtype.is_integer() else names.cast(pl.Categorical).to_physical()).to_numpy().astype(np.int64)
    found = find_period(codes, min_repeats=MIN_STEPS)
    if found is None:
        return None
    p, first, stop = found
    bounds = list(range(first, stop, p))
    ids = np.full(k.height, -1, dtype=np.int64)
    if first > 0:
        ids[:first] = 0  # the prefill: everything before the loop
    for i, b in enumerate(bounds):
        ids[b : min(b + p, k.height)] = i + (1 if first > 0 else 0)
    j = k.with_columns(pl.Series("_sid", ids)).filter(pl.col("_sid") >= 0)
    steps = _gpu_of(j, "_sid", rk).sort("_sid")
    steps = steps.with_columns(pl.col("gpu_start_ns").alias("start_ns"), pl.col("gpu_end_ns").alias("end_ns"),
                               pl.lit(None, pl.Utf8).alias("name"),
                               pl.when((pl.col("_sid") == 0) & pl.lit(first > 0)).then(pl.lit("prefill")).otherwise(None).alias("phase"))
    return steps.drop("_sid")


def _get_all(ops: pl.DataFrame, get: Callable[[list[str]], pl.DataFrame] | None) -> pl.DataFrame:
    """Every column :func:`generation_steps` reads, from ``get`` (``ops`` when it has them)."""
    return ops if get is None else get(["rank", *_OP_COLUMNS])


def generation_steps(
    ops_with_launch: pl.DataFrame | Callable[[list[str]], pl.DataFrame],
    nvtx: pl.DataFrame,
    graph_launches: pl.DataFrame | None = None,
    *,
    pattern: str = DEFAULT_ITERATION_PATTERN,
    prefill_factor: float = PREFILL_FACTOR,
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
        Without a prefill range, a leading step with at least this many times the median GPU
        busy time of the others is the prefill.

    Returns
    -------
    One row per step, in time order: :data:`STEP_COLUMNS` — ``step`` (0-based), ``phase``
    (``prefill``/``decode``), ``source`` (``nvtx``, ``module``, ``graph_replays``,
    ``kernel_period``), ``name`` (the range's label, or the launch's NVTX path), ``start_ns``/
    ``end_ns`` (the CPU range for NVTX sources; the launch call to the replay's end for graph
    replays; the GPU span otherwise), ``gpu_start_ns``/``gpu_end_ns``/``gpu_busy_ns`` (its GPU
    work: span and union, ns), ``ops``, ``interval_ns`` (next step's start − this one's: the
    time per output token of a decode step; null for the last). Empty when no source gives
    :data:`MIN_STEPS` steps, or when nothing says the steps generate tokens: no prefill step
    (a range or a leading heavy step), no step named as :data:`DECODE_PATTERN` and not graph
    replays (a training loop's ``step.N`` is not a decode); of a trace set, the rank (or
    process) with the most steps.
    """
    get: Callable[[list[str]], pl.DataFrame] | None = None
    if callable(ops_with_launch):
        get = ops_with_launch
        rk = rank_keys(nvtx) if nvtx.height else []
        found = _from_nvtx(nvtx, rk, pattern)
        # the NVTX steps read the launch columns, devices and times; the other sources more
        ops_with_launch = get([*rk, *(_NVTX_STEP_COLUMNS if found is not None else _OP_COLUMNS)])
        if found is None:
            get = None
        if rk != (rank_keys(ops_with_launch, nvtx) if nvtx.height else rank_keys(ops_with_launch)):  # ranks in one only
            return generation_steps(_get_all(ops_with_launch, get), nvtx, graph_launches, pattern=pattern, prefill_factor=prefill_factor)
    else:
        rk = rank_keys(ops_with_launch, nvtx) if nvtx.height else rank_keys(ops_with_launch)
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
        if source == "module" and int(steps["gpu_busy_ns"].fill_null(0).sum()) < MODULE_SHARE * _busy(ops_with_launch, rk):
            steps = None  # ranges around a small part of the work are not the forwards
    if steps is None and get is not None:  # the NVTX steps were not it: every column
        ops_with_launch = _get_all(ops_with_launch, get)
    if steps is None and graph_launches is not None and graph_launches.height:
        steps = _from_graphs(graph_launches, ops_with_launch, rk)
        source = "graph_replays"
    if steps is None:
        steps = _from_period(ops_with_launch, rk)
        source = "kernel_period"
    if steps is None or steps.height < MIN_STEPS:
        return _empty(rk)
    steps = steps.sort("start_ns")
    if not (steps["phase"] == "prefill").any():  # a leading step far heavier than the rest
        busy = steps["gpu_busy_ns"].fill_null(0).to_numpy().astype(float)
        lead = 0
        while lead < min(2, steps.height - MIN_STEPS) and busy[lead] >= prefill_factor * float(np.median(busy[lead + 1:])):
            lead += 1
        steps = steps.with_columns(pl.when(pl.int_range(pl.len()) < lead).then(pl.lit("prefill")).otherwise(pl.col("phase")).alias("phase"))
    named = steps["name"].drop_nulls().str.contains("(?i)" + DECODE_PATTERN).any() if "name" in steps.columns else False
    if not (steps["phase"] == "prefill").any() and not named and source != "graph_replays":
        # repeated steps alone do not make a generation: a training loop's step.N or a
        # kernel period is not decoding unless a prefill, a decode name or graph replays say so
        return _empty(rk)
    steps = steps.with_columns(
        pl.col("phase").fill_null("decode"),
        pl.lit(source).alias("source"),
        pl.int_range(pl.len(), dtype=pl.Int64).alias("step"),
        (pl.col("start_ns").shift(-1) - pl.col("start_ns")).alias("interval_ns"),
    )
    return steps.select(*rk, *[pl.col(c).cast(t) for c, t in STEP_COLUMNS.items()])


def phase_summary(steps: pl.DataFrame) -> pl.DataFrame:
    """Per phase of :func:`generation_steps`: what a user of a serving engine measures.

    Returns one row per phase (``prefill`` first): ``steps``, ``ttft_ns`` (prefill: from the
    first prefill step's start to the end of its GPU work — the first token ready on the GPU;
    null for decode), ``tpot_median_ns`` and ``tpot_p90_ns`` (decode: the intervals between
    consecutive decode steps' starts, i.e. time per output token; the last step's own span
    when it is the only one), ``step_median_ns`` (median step span), ``gpu_busy_ns`` (summed),
    ``span_ns`` (first start to last end), ``busy_share`` (``gpu_busy_ns / span_ns``, 0–1).
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
            first = part.row(0, named=True)
            ttft = int((first["gpu_end_ns"] or first["end_ns"]) - first["start_ns"])
        else:
            # between consecutive decode steps only (not across a prefill of another request)
            tpot = part["start_ns"].diff().drop_nulls().cast(pl.Float64)
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
    they need. ``options`` go to :func:`generation_steps`."""
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
