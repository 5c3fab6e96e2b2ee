"""Rules about the host feeding the GPU: warm-up, host_bound, launch_bound, sync_stall,
pageable_memcpy and the catch-all low_gpu_utilization.

How each rule estimates ``time_ns`` (the steady-state time at stake) is in its docstring and
in docs/diagnose.md; every number comes from an existing analysis (``idle_gaps``,
``launch_bound_stretches``, ``copies``, ``activity_segments``), restricted to the window.
"""

from __future__ import annotations

import shlex
from typing import Any

import numpy as np
import polars as pl

from tracekit.analysis._frames import within_any
from tracekit.analysis.gpu_time import GRAPH_LAUNCH_API
from tracekit.analysis.launch import launch_bound_stretches
from tracekit.analysis.memory import copies
from tracekit.diagnosis.context import Context
from tracekit.diagnosis.result import Finding, fmt_ns

__all__ = ["HOST_RULES"]

#: Calls after which the host has waited for the GPU.
SYNC_PATTERN = r"(?i)synchronize"
#: ``idle_gaps`` causes that mean "the host was busy elsewhere": outside CUDA calls
#: (``untraced``) or inside CUDA calls that neither launch, copy nor synchronise (``cuda_api``:
#: cudaMalloc, cudaStreamCreate, cudaEventCreate …).
HOST_CAUSES = ("untraced", "cuda_api")
#: The ``_v3020``-style suffix of CUDA runtime API names in exports (dropped in titles, as nsys does).
API_VERSION_SUFFIX = r"_v\d+$"


def _sync_costs(ctx: Context) -> pl.DataFrame:
    """Per (``rank``,) ``device_id`` and synchronising call that left the GPU dry:
    ``sync_call``, ``blocked_ns`` (the call's duration: host time spent waiting),
    ``idle_after_ns`` (GPU idle from then until the host queued work ahead again),
    ``stake_ns`` = min(blocked, idle after): had the host not waited, it could have used the
    blocked time to queue the next work; the rest of the idle time (``leftover_ns``) is the
    host's own slowness and goes to ``host_bound``."""
    gaps = _main_gaps(ctx)
    dk = [*ctx.rk, "device_id"]
    if gaps.height == 0 or "after_sync" not in gaps.columns:
        return pl.DataFrame()
    hit = gaps.filter(pl.col("after_sync").is_not_null())
    per = hit.group_by(*dk, "sync_start_ns", "sync_end_ns", "after_sync").agg(
        pl.col("duration_ns").sum().alias("idle_after_ns"), pl.len().alias("gaps")
    )
    return per.with_columns(
        (pl.col("sync_end_ns") - pl.col("sync_start_ns")).alias("blocked_ns"),
        pl.col("after_sync").str.replace(API_VERSION_SUFFIX, "").alias("sync_call"),
    ).with_columns(
        pl.min_horizontal("blocked_ns", "idle_after_ns").alias("stake_ns"),
    ).with_columns((pl.col("idle_after_ns") - pl.col("stake_ns")).alias("leftover_ns")).drop("after_sync")


def _cmd(ctx: Context) -> str:
    """The captured program's command line, for the ``next`` commands (``PROGRAM`` if unknown)."""
    meta = getattr(ctx.trace, "meta", None)
    procs = getattr(meta, "processes", None) or []
    for p in procs:
        if p.command:
            return shlex.join(p.command)
    return "PROGRAM ARGS"


def _main_gaps(ctx: Context) -> pl.DataFrame:
    """The window's idle gaps, each given to at most one rule: ``after_sync`` (the sync
    call the host sat in when the GPU ran dry: ``sync_stall``), ``in_stretch`` (inside a
    launch-bound stretch: ``launch_bound``); the rest by ``idle_gaps``' cause."""
    cached = ctx.__dict__.get("_classified_gaps")
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    # the stretches first: their launch join then runs beside the window's tables without the
    # gaps (issue 44: on 1 M kernels it was the diagnosis' peak)
    stretches = _stretches(ctx)
    gaps = ctx.gaps_w
    if gaps.height:
        gaps = _mark_stretch_gaps(gaps, stretches, [*ctx.rk, "device_id"])
        gaps = _mark_sync_gaps(ctx, gaps)
        # the GPU waited for the host's cudaGraphLaunch: graph_launch's, not a sync's or the host's
        gl = (pl.col("cause") == "launch_bound") & pl.col("next_api").str.contains(GRAPH_LAUNCH_API).fill_null(False)
        # a gap inside a launch-bound stretch is launch_bound's (its time is in the stretch's
        # idle), never also a sync's: after a per-token .item() a launch-bound host never
        # queues ahead again, so every gap of the step would otherwise count twice
        gaps = gaps.with_columns(gl.alias("graph_launch")).with_columns(
            pl.when(pl.col("graph_launch") | pl.col("in_stretch")).then(None).otherwise(pl.col(c)).alias(c)
            for c in ("after_sync", "sync_start_ns", "sync_end_ns")
        )
    if gaps.height:
        gaps = _mark_no_load(ctx, gaps)
    ctx.__dict__["_classified_gaps"] = gaps
    return gaps


def _mark_no_load(ctx: Context, gaps: pl.DataFrame) -> pl.DataFrame:
    """A server's gaps inside its spans with no request to run (``RunStructure.idle_spans``)
    get cause ``no_load``: idle by load, no rule's time."""
    spans = ctx.structure.idle_spans
    if spans.height == 0:
        return gaps
    mid = ((pl.col("start_ns") + pl.col("end_ns")) // 2)
    inside = within_any(gaps.select(mid.alias("m"))["m"], spans["start_ns"], spans["end_ns"])
    return gaps.with_columns(pl.when(inside).then(pl.lit("no_load")).otherwise(pl.col("cause")).alias("cause"))


def _mark_sync_gaps(ctx: Context, gaps: pl.DataFrame) -> pl.DataFrame:
    """``after_sync``: the synchronising call whose drain left the GPU without queued work
    when the gap began. After a sync the host has lost its lead; until it launches an
    operation while the GPU is still busy with an earlier one (a *queued* launch), every idle
    gap is the sync's cost. A gap starting in ``[sync start, first queued op after the sync)``
    belongs to that sync."""
    api = ctx.api_w
    syncs = api.filter(pl.col("name").str.contains(SYNC_PATTERN)) if api.height else api
    if syncs.height == 0:
        return gaps.with_columns(
            pl.lit(None, pl.Utf8).alias("after_sync"), pl.lit(None, pl.Int64).alias("sync_start_ns"),
            pl.lit(None, pl.Int64).alias("sync_end_ns"),
        )
    keys = ctx.rk
    ops = ctx.ops_with_launch_w.sort([*keys, "start_ns"])
    prev_end = pl.col("end_ns").cum_max().shift(1)
    if keys:
        prev_end = prev_end.over(keys)
    queued = ops.with_columns(prev_end.alias("_prev")).filter(
        pl.col("api_end_ns").is_not_null() & (pl.col("api_end_ns") < pl.col("_prev"))
    ).select(*keys, pl.col("start_ns").alias("_recovered"))
    s = syncs.select(*keys, pl.col("start_ns").alias("_s0"), pl.col("end_ns").alias("_s1"), pl.col("name").alias("_call")).sort([*keys, "_s1"])
    s = s.join_asof(queued.sort([*keys, "_recovered"]), left_on="_s1", right_on="_recovered", by=keys or None,
                    strategy="forward", check_sortedness=False)
    s = s.with_columns(pl.col("_recovered").fill_null(ctx.window.end_ns)).sort([*keys, "_s0"])
    g = _gap_bounds(gaps, keys)
    j = g.join_asof(s, left_on="start_ns", right_on="_s0", by=keys or None, strategy="backward", check_sortedness=False)
    j = j.with_columns(
        pl.when(pl.col("_s0").is_not_null() & (pl.col("start_ns") < pl.max_horizontal("_recovered", "_s1")))
        .then(pl.col("_call")).alias("after_sync")
    ).select(
        "_gi", "after_sync",
        pl.when(pl.col("after_sync").is_not_null()).then(pl.col("_s0")).alias("sync_start_ns"),
        pl.when(pl.col("after_sync").is_not_null()).then(pl.col("_s1")).alias("sync_end_ns"),
    )
    return gaps.with_columns(j.sort("_gi").drop("_gi").get_columns())


def _after_warmup_cmd(ctx: Context) -> str:
    w = ctx.full_window
    if w.method in ("nvtx", "forwards") and "name" in w.iterations.columns and w.iterations.height > w.warmup_steps:
        first = w.iterations["name"][w.warmup_steps]
        return f"tracekit capture nsys --capture-range nvtx --nvtx-capture '{first}' -- {_cmd(ctx)}"
    return f"tracekit capture nsys --capture-range cudaProfilerApi -- {_cmd(ctx)}  # call torch.cuda.profiler.start() after warm-up"


def _compiled(ctx: Context, window_start_ns: int) -> Any:
    """:func:`tracekit.analysis.run.compile.compile_warmup` of the trace before the window (module
    loads from the CUDA API table, kernel launches per name before and after), from the trace's
    lazy tables; nothing found on a trace set."""
    from tracekit.analysis.run.compile import TRITON_KERNELS, compile_warmup

    tr = ctx.trace
    if not hasattr(tr, "scan") or ctx.rk:
        return compile_warmup(pl.DataFrame(), pl.DataFrame(), window_start_ns=window_start_ns)
    early = pl.col("start_ns") < window_start_ns
    # only Triton kernels count (built, or autotuning's candidates): the others are not grouped
    kernels = tr.scan("kernels").filter(pl.col("name").str.contains(TRITON_KERNELS)).group_by("name").agg(
        pl.col("start_ns").min().alias("first_ns"), early.sum().alias("before"), (~early).sum().alias("after")).collect()
    return compile_warmup(ctx.module_loads, kernels, window_start_ns=window_start_ns)


def warmup(ctx: Context) -> list[Finding]:
    """``warmup`` (info): the leading iterations excluded from the window. ``time_ns`` is what
    they took beyond as many median steady iterations."""
    w = ctx.full_window
    if w.iterations.height == 0:
        return []
    if not w.warmup_steps:
        # no warm-up step, yet a compiler may have worked before the first one (start-up)
        built = _compiled(ctx, w.start_ns).sentence()
        start = ctx.structure.startup_ns
        if not built or not start:
            return []
        return [Finding(
            "warmup", "info", f"start-up {fmt_ns(start)} before the first steady step, not counted: {built}",
            time_ns=None, share=None,
            advice="Compilation and autotuning are paid once per process: cache them across runs (TORCHINDUCTOR_FX_GRAPH_CACHE "
            "and TORCHINDUCTOR_AUTOGRAD_CACHE, on by default in recent PyTorch; a shared TORCHINDUCTOR_CACHE_DIR), and start "
            "the capture after them (cudaProfilerStart or --capture-range=nvtx).",
            next=[_after_warmup_cmd(ctx)],
        )]
    lead = w.iterations.head(w.warmup_steps)
    took = int(lead["length_ns"].sum())
    extra = took - w.warmup_steps * (w.step_ns or 0)
    ev = lead.select("iteration", *[c for c in ("name",) if c in lead.columns], "w_start", "w_end", "length_ns").rename(
        {"w_start": "start_ns", "w_end": "end_ns"}
    )
    built = _compiled(ctx, w.start_ns).sentence()
    return [Finding(
        "warmup", "info",
        f"{w.warmup_steps} warm-up iteration(s) took {fmt_ns(took)} against a steady {fmt_ns(w.step_ns)}: excluded from the window"
        + (f"; {built}" if built else ""),
        time_ns=max(extra, 0), share=None, evidence=ev,
        advice="Warm-up (cuBLAS/cuDNN handles, autotuning, lazy module loading, allocator growth) is paid once; "
        "profile more steady steps, or start the capture after it (cudaProfilerStart or --capture-range=nvtx).",
        next=[_after_warmup_cmd(ctx)],
    )]


def _stretches(ctx: Context) -> pl.DataFrame:
    """``launch_bound_stretches`` of the window's kernels (computed once per diagnosis)."""
    cached = ctx.__dict__.get("_stretches")
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    k = ctx.kernels_w
    if k.height == 0 or ctx.api_count == 0:
        out = pl.DataFrame()
    else:
        out = launch_bound_stretches(
            k, ctx.api_near, short_kernel_ns=ctx.config.short_kernel_ns, min_kernels=ctx.config.min_stretch_kernels
        )
    ctx.__dict__["_stretches"] = out
    return out


def _mark_stretch_gaps(gaps: pl.DataFrame, stretches: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    if gaps.height == 0:
        return gaps.with_columns(pl.lit(False).alias("in_stretch"))
    if stretches.height == 0:
        return gaps.with_columns(pl.lit(False).alias("in_stretch"))
    s = stretches.select(*keys, pl.col("start_ns").alias("_s0"), pl.col("end_ns").alias("_s1")).sort([*keys, "_s0"])
    g = _gap_bounds(gaps, keys)
    j = g.join_asof(s, left_on="start_ns", right_on="_s0", by=keys, strategy="backward", check_sortedness=False)
    j = j.select("_gi", (pl.col("_s1").is_not_null() & (pl.col("end_ns") <= pl.col("_s1"))).alias("in_stretch"))
    return gaps.with_columns(j.sort("_gi").get_column("in_stretch"))


def _gap_bounds(gaps: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """The gaps' ``keys``, ``start_ns`` and ``end_ns`` with their row number ``_gi``, sorted by
    keys and start for an as-of join: the join's columns come back by ``_gi`` and are added to
    ``gaps``, which is not copied (a sorted copy of every column of 490 k gaps, and another
    sorted back, were the diagnosis' peak on a 2 M-kernel export; issue 44)."""
    return gaps.select(*keys, "start_ns", "end_ns").with_row_index("_gi").sort([*keys, "start_ns"])


#: Gaps looked at (largest first) to name the NVTX range and CUDA calls the host was in.
NAMED_GAPS = 500


def _range_during(ctx: Context, gaps: pl.DataFrame) -> pl.DataFrame:
    """For each gap, the NVTX range (not an iteration range) that covers most of it:
    ``host_range`` (null when none). Ranges are searched by start time (sorted arrays), so
    the cost is O(gaps × ranges overlapping each gap), not a cross join."""
    nv = ctx.nvtx
    if nv.height == 0 or gaps.height == 0 or "end_ns" not in nv.columns:
        return gaps.with_columns(pl.lit(None, pl.Utf8).alias("host_range"))
    cols = [c for c in ("text", "name") if c in nv.columns]
    label = pl.coalesce(cols) if cols else pl.lit(None, pl.Utf8)
    w = ctx.window
    full = ctx.full_window
    # the iteration ranges themselves cover every gap: they name no place
    steps = (full.iterations["name"].drop_nulls().unique() if full.method in ("nvtx", "forwards") and "name" in full.iterations.columns
             else pl.Series([], dtype=pl.Utf8))
    r = nv.filter(
        pl.col("end_ns").is_not_null() & (pl.col("end_ns") > w.start_ns) & (pl.col("start_ns") < w.end_ns)
    ).select(pl.col("start_ns"), pl.col("end_ns"), label.alias("_label"))
    r = r.filter(pl.col("_label").is_not_null() & ~pl.col("_label").is_in(steps.implode())).sort("start_ns")
    if r.height == 0:
        return gaps.with_columns(pl.lit(None, pl.Utf8).alias("host_range"))
    st, en, labels = r["start_ns"].to_numpy(), r["end_ns"].to_numpy(), r["_label"].to_list()
    longest = int((en - st).max())
    out: list[str | None] = []
    for g0, g1 in gaps.select("start_ns", "end_ns").iter_rows():
        lo = int(np.searchsorted(st, g0 - longest, side="left"))
        hi = int(np.searchsorted(st, g1, side="left"))
        best = None
        if hi > lo:
            s_, e_ = st[lo:hi], en[lo:hi]
            ov = np.minimum(e_, g1) - np.maximum(s_, g0)
            ln = e_ - s_
            ok = np.nonzero(ov > 0)[0]
            if ok.size:
                # most overlap, then the shortest (innermost) range
                order = np.lexsort((ln[ok], -ov[ok]))
                k = int(ok[order[0]])
                best = labels[lo + k]
        out.append(best)
    return gaps.with_columns(pl.Series("host_range", out, dtype=pl.Utf8))


#: Calls :func:`_calls_during` measures at a time.
CALL_CHUNK = 1 << 16


def _calls_during(ctx: Context, gaps: pl.DataFrame) -> pl.DataFrame:
    """CUDA API calls (any thread of the trace) overlapping ``gaps`` (one device's: they do
    not overlap): ``name``, ``calls`` (call and gap pairs that overlap), ``overlap_ns`` (time
    inside the gaps), largest first, then by name."""
    api = ctx.api_w
    if api.height == 0 or gaps.height == 0:
        return pl.DataFrame()
    g = gaps.select("start_ns", "end_ns").drop_nulls().sort("start_ns")
    if g.height == 0:
        return pl.DataFrame()
    g0 = g.get_column("start_ns").cast(pl.Int64).to_numpy()
    g1 = g.get_column("end_ns").cast(pl.Int64).to_numpy()
    # time inside the gaps before t: the gaps wholly before it plus the part of the one it is in
    before = np.concatenate(([0], np.cumsum(g1 - g0)))

    def inside_before(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(g0, t, side="right")  # gaps that start at or before t
        last = np.maximum(i - 1, 0)
        return np.where(i > 0, before[last] + np.clip(t - g0[last], 0, g1[last] - g0[last]), 0)

    times = api.select("start_ns", "end_ns")
    if times.null_count().sum_horizontal().item():
        times = times.with_row_index("_row").drop_nulls()
    st = times.get_column("start_ns").cast(pl.Int64).to_numpy()
    en = times.get_column("end_ns").cast(pl.Int64).to_numpy()
    # the calls in chunks: a few temporaries of a chunk's length, not of the window's calls
    hits, overlaps = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for lo in range(0, st.size, CALL_CHUNK):
        part = inside_before(en[lo:lo + CALL_CHUNK]) - inside_before(st[lo:lo + CALL_CHUNK])
        at = np.nonzero(part > 0)[0]
        hits.append(lo + at)
        overlaps.append(part[at])
    hit, ov = np.concatenate(hits), np.concatenate(overlaps)
    if hit.size == 0:
        return pl.DataFrame()
    # gaps each call overlaps: those that start before its end, less those that end by its start
    pairs = np.searchsorted(g0, en[hit], side="left") - np.searchsorted(g1, st[hit], side="right")
    rows = times.get_column("_row").gather(hit) if "_row" in times.columns else pl.Series(hit)
    names = api.get_column("name").gather(rows).str.replace(API_VERSION_SUFFIX, "")
    return (
        pl.DataFrame([names.alias("name"), pl.Series("calls", pairs, pl.Int64), pl.Series("overlap_ns", ov, pl.Int64)])
        .group_by("name").agg(pl.col("calls").sum(), pl.col("overlap_ns").sum())
        .sort(["overlap_ns", "name"], descending=[True, False])
    )


def host_bound(ctx: Context) -> list[Finding]:
    """``host_bound``: GPU idle while the host thread that launches the next operation is
    outside CUDA calls or in CUDA calls that neither launch, copy nor synchronise
    (``idle_gaps`` causes ``untraced``/``cuda_api``), not inside a launch-bound stretch nor
    left dry by a synchronisation. ``time_ns`` = the sum of those gaps in the window on the GPU
    where it is largest, plus the idle time after synchronisations beyond their own cost
    (``leftover_ns`` of :func:`_sync_costs`); the NVTX range that covers most of each gap
    names where the host was."""
    gaps = _main_gaps(ctx)
    if gaps.height == 0:
        return []
    keys = [*ctx.rk, "device_id"]
    g = gaps.filter(pl.col("cause").is_in(list(HOST_CAUSES)) & ~pl.col("in_stretch") & pl.col("after_sync").is_null())
    if g.height == 0:
        return []
    per_dev = g.group_by(keys).agg(pl.col("duration_ns").sum().alias("idle_ns"), pl.len().alias("gaps"))
    costs = _sync_costs(ctx)
    if costs.height:  # idle after a sync beyond what the sync itself cost: the host was slow too
        left = costs.group_by(keys).agg(pl.col("leftover_ns").sum().alias("_left"), (pl.col("leftover_ns") > 0).sum().alias("_lg"))
        per_dev = per_dev.join(left, on=keys, how="full", coalesce=True).with_columns(
            (pl.col("idle_ns").fill_null(0) + pl.col("_left").fill_null(0)).alias("idle_ns"),
            (pl.col("gaps").fill_null(0) + pl.col("_lg").fill_null(0)).alias("gaps"),
        ).drop("_left", "_lg")
    per_dev = per_dev.sort("idle_ns", descending=True)
    top = per_dev.row(0, named=True)
    total = int(top["idle_ns"])
    sev = ctx.config.severity(ctx.share(total))
    if sev is None:
        return []
    dev = g.join(per_dev.head(1).select(keys), on=keys).sort("duration_ns", descending=True).head(NAMED_GAPS)
    dev = _range_during(ctx, dev)
    by_range = (
        dev.group_by("host_range").agg(pl.col("duration_ns").sum().alias("idle_ns"), pl.len().alias("gaps"))
        .sort("idle_ns", descending=True)
    )
    where = by_range.filter(pl.col("host_range").is_not_null()).head(1)
    in_range = f" in NVTX range '{where['host_range'][0]}'" if where.height else ""
    calls = _calls_during(ctx, dev)
    doing = "outside CUDA calls"
    if calls.height and int(calls["overlap_ns"][0]) >= 0.3 * total:
        doing = f"inside {calls['name'][0]} ({fmt_ns(int(calls['overlap_ns'][0]))} of it) and outside CUDA calls"
    ev = dev.sort("duration_ns", descending=True).head(20).select(
        *keys, "start_ns", "end_ns", "duration_ns", "host_range", "next_op", "next_api", "other_api_ns"
    )
    return [Finding(
        "host_bound", sev,
        f"GPU idle {ctx.per_step(total)} ({ctx.share(total):.0%} of the window, {top['gaps']} gaps) while the host is "
        f"{doing}{in_range}",
        time_ns=total, share=ctx.share(total), evidence=ev,
        advice=_accumulation_advice(ctx) + "The GPU waits for Python: move data preparation/tokenisation off the critical path (DataLoader workers, "
        "pin_memory, prefetch the next batch on another thread), queue more GPU work per host step (larger batch), "
        "or remove host-side work between steps (logging, .tolist(), Python loops over tensors). In vLLM, check the "
        "scheduler/sampler time between model steps.",
        next=[f"nsys profile --trace=cuda,nvtx,osrt --sample=process-tree --python-sampling=true --cudabacktrace=all -- {_cmd(ctx)}"],
    )]


def _accumulation_advice(ctx: Context) -> str:
    """For a training run with gradient accumulation (``k`` micro-batches per optimizer step),
    the advice to raise the per-device batch and lower the accumulation, with the launches per
    step it saves (each micro-batch launches the same kernels again); ``""`` otherwise."""
    s = ctx.__dict__.get("structure")
    if s is None or s.kind != "training":
        return ""
    t = ctx.training
    if t.height == 0 or "micro_batches" not in t.columns or t["micro_batches"].drop_nulls().len() == 0:
        return ""
    k = round(float(t["micro_batches"].drop_nulls()[0]))
    n_steps, _ = ctx.step_unit
    if k < 2 or not n_steps:
        return ""
    per_micro = ctx.kernels_w.height / n_steps / k
    return (f"Each optimizer step runs {k} micro-batches that launch the same ~{per_micro:,.0f} kernels each: raise the "
            f"per-device batch and lower the gradient accumulation (batch × {k}, accumulation 1 if memory allows: the same "
            f"samples per step with ~{per_micro * (k - 1):,.0f} fewer launches per step, each kernel doing {k}× the work). ")


#: Kernels of a fused optimizer step (``torch.optim.AdamW(fused=True)``, apex's FusedAdam).
FUSED_OPTIMIZER = r"(?i)FusedAdam|fused_adam|FusedSGD|fused_sgd|fused_optim"


def _graph_advice(ctx: Context) -> str:
    """CUDA graphs and fusion for a launch-bound run, in its kind's terms (vLLM's switches only
    where the run serves or generates)."""
    s = ctx.__dict__.get("structure")
    if s is not None and s.kind == "training":
        return ("Capture the step in a CUDA graph (torch.compile(mode='reduce-overhead'), or torch.cuda.graphs around "
                "forward, backward and a capturable optimizer), fuse the elementwise chains (torch.compile, fused kernels), "
                "or give each kernel more work (larger batch).")
    return ("Capture the step in a CUDA graph (torch.compile(mode='reduce-overhead') or torch.cuda.graphs; in vLLM "
            "keep CUDA graphs on — no --enforce-eager — and cover your batch sizes with cudagraph capture sizes), fuse the "
            "elementwise chains (torch.compile, fused kernels), or give each kernel more work (larger batch).")


def _optimizer_advice(ctx: Context) -> str:
    """For a training run whose optimizer runs as PyTorch's foreach (multi-tensor) kernels, one
    per elementwise op of the update, the advice to fuse it, with the launches per step it
    saves; ``""`` otherwise (no optimizer kernels, or fused already)."""
    s = ctx.__dict__.get("structure")
    if s is None or s.kind != "training" or ctx.kernels_w.height == 0 or "name" not in ctx.kernels_w.columns:
        return ""
    names = ctx.kernels_w["name"].fill_null("")
    multi = names.str.contains("multi_tensor_apply")
    fused = names.str.contains(FUSED_OPTIMIZER)
    n_steps, _ = ctx.step_unit
    if not n_steps or int(fused.sum()) or int(multi.sum()) < 2 * n_steps:
        return ""
    per = int(multi.sum()) / n_steps
    return (f"The optimizer runs as {per:,.0f} multi-tensor (foreach) kernels per step, one per elementwise op of the "
            "update: torch.optim.AdamW(..., fused=True) (or Adam/SGD) does the whole update in one kernel per chunk of "
            "parameters (in the training zoo: 2–3 launches per step fused, 16 foreach). ")


def launch_bound(ctx: Context) -> list[Finding]:
    """``launch_bound``: runs of short kernels launched one at a time by a host that cannot
    keep up (``launch_bound_stretches``). ``time_ns`` = the GPU idle time inside those stretches
    in the window, what CUDA graphs or fusion would remove."""
    st = _stretches(ctx)
    if st.height == 0:
        return []
    keys = [*ctx.rk, "device_id"]
    per_dev = st.group_by(keys).agg(
        pl.col("idle_ns").sum(), pl.col("kernels").sum(), pl.col("busy_ns").sum(),
        pl.col("median_kernel_ns").median(), pl.col("median_api_ns").median(), pl.col("median_gap_ns").median(),
    ).sort("idle_ns", descending=True)
    top = per_dev.row(0, named=True)
    total = int(top["idle_ns"])
    sev = ctx.config.severity(ctx.share(total))
    if sev is None:
        return []
    n_steps, noun = ctx.step_unit
    per_step_k = ctx.kernels_w.height / max(n_steps, 1)
    title = (
        f"Launch-bound: {per_step_k:.0f} kernels per {noun}, median {fmt_ns(top['median_kernel_ns'])} each but "
        f"{fmt_ns(top['median_api_ns'])} per launch call; GPU idle {ctx.per_step(total)} between them"
        if n_steps else
        f"Launch-bound: {top['kernels']} short kernels (median {fmt_ns(top['median_kernel_ns'])}) launched one at a time, "
        f"{fmt_ns(top['median_api_ns'])} per launch call; GPU idle {fmt_ns(total)} between them"
    )
    return [Finding(
        "launch_bound", sev, title, time_ns=total, share=ctx.share(total),
        evidence=st.sort("idle_ns", descending=True).head(20).select(
            *keys, "start_ns", "end_ns", "kernels", "busy_ns", "idle_ns", "median_kernel_ns", "median_api_ns", "median_gap_ns"
        ),
        advice=_accumulation_advice(ctx) + _optimizer_advice(ctx) + _graph_advice(ctx),
        next=[
            f"tracekit capture nsys --cuda-graph-trace node -- {_cmd(ctx)}",
            f"tracekit stats -r cuda_kern_exec_sum {ctx.trace_path}",
        ],
    )]


def graph_launch(ctx: Context) -> list[Finding]:
    """``graph_launch``: the GPU idles before a CUDA graph replay while the host is still in
    the call that launches it (``idle_gaps`` cause ``launch_bound`` with a ``cudaGraphLaunch``
    as the next operation's call). Graph-replayed work is never ``launch_bound`` or
    ``host_bound``: what is left is the launch of the graph itself, whose host cost grows with
    its node count, paid after the previous step's results came back. ``time_ns`` = those
    gaps in the window on the GPU where they add up most."""
    gaps = _main_gaps(ctx)
    if gaps.height == 0 or "graph_launch" not in gaps.columns:
        return []
    g = gaps.filter(pl.col("graph_launch"))
    if g.height == 0:
        return []
    keys = [*ctx.rk, "device_id"]
    per_dev = g.group_by(keys).agg(pl.col("duration_ns").sum().alias("idle_ns"), pl.len().alias("gaps")).sort("idle_ns", descending=True)
    top = per_dev.row(0, named=True)
    total = int(top["idle_ns"])
    sev = ctx.config.severity(ctx.share(total))
    if sev is None:
        return []
    w = ctx.window
    launches = ctx.graph_launches
    if launches.height:
        launches = launches.filter((pl.col("start_ns") >= w.start_ns) & (pl.col("start_ns") < w.end_ns))
    call: float | None = launches["launch_api_ns"].median() if launches.height else None  # type: ignore[assignment]
    nodes: float | None = launches["kernels"].median() if launches.height else None  # type: ignore[assignment]
    node_mode = launches.height > 0 and (launches["mode"] == "node").all()
    what = f"cudaGraphLaunch takes {fmt_ns(call)} per launch" if call is not None else "the graph launch call fills the gap"
    if nodes is not None:
        what += f" for {nodes:.0f} kernels"
    note = (" (per-node tracing lengthens every graph launch several times over: measure the launch cost with "
            "--cuda-graph-trace=graph)") if node_mode else ""
    ev = g.join(per_dev.head(1).select(keys), on=keys).sort("duration_ns", descending=True).head(20).select(
        *keys, "start_ns", "end_ns", "duration_ns", "next_op", "next_api", "next_launched_ns", "launch_ns")
    return [Finding(
        "graph_launch", sev,
        f"GPU idle {ctx.per_step(total)} ({ctx.share(total):.0%} of the window) before each CUDA graph replay while the host "
        f"launches it: {what}{note}",
        time_ns=total, share=ctx.share(total), evidence=ev,
        advice="The graph replays back to back only if the next launch is issued before the GPU runs dry: launch step N+1 "
        "before waiting on step N's output (copy the sampled ids to pinned memory with non_blocking=True and wait on a CUDA "
        "event when they are needed — vLLM's async scheduling), keep input preparation off that path, and shrink the "
        "graph's node count (fused kernels: torch.compile) — a launch costs host time per node.",
        next=[f"tracekit capture nsys --cuda-graph-trace graph -- {_cmd(ctx)}",
              f"tracekit stats -r cuda_api_sum {ctx.trace_path}"],
    )]


def sync_stall(ctx: Context) -> list[Finding]:
    """``sync_stall``: the host synchronises inside the loop (``*Synchronize`` calls, which
    ``.item()``/``.cpu()``/``print(tensor)`` and synchronous copies make) and the GPU drains.
    After such a call the GPU idles until the host has queued work ahead again
    (:func:`_mark_sync_gaps`). ``time_ns`` = Σ over the calls of min(time the host sat in the
    call, GPU idle after it) (:func:`_sync_costs`): without the sync the host would have used
    the blocked time to queue the next work."""
    api = ctx.api_w
    gaps = _main_gaps(ctx)
    if api.height == 0 or gaps.height == 0:
        return []
    syncs = api.filter(pl.col("name").str.contains(SYNC_PATTERN))
    if syncs.height == 0:
        return []
    keys = ctx.rk
    costs = _sync_costs(ctx)
    if costs.height == 0:
        return []
    dk = [*keys, "device_id"]
    per_dev = costs.group_by(dk).agg(pl.col("stake_ns").sum()).sort("stake_ns", descending=True)
    total = int(per_dev["stake_ns"][0])
    sev = ctx.config.severity(ctx.share(total))
    if sev is None:
        return []
    dev_costs = costs.join(per_dev.head(1).select(dk), on=dk)
    n_steps, noun = ctx.step_unit
    steps = max(n_steps, 1)
    syncs = syncs.with_columns(pl.col("name").str.replace(API_VERSION_SUFFIX, ""))
    by_call = syncs.group_by("name").agg(pl.len().alias("calls"), (pl.col("end_ns") - pl.col("start_ns")).sum().alias("host_blocked_ns"))
    idle_by = dev_costs.group_by(pl.col("sync_call").alias("name")).agg(
        pl.len().alias("stalls"), pl.col("idle_after_ns").sum().alias("gpu_idle_after_ns"),
        pl.col("stake_ns").sum().alias("time_at_stake_ns"),
    )
    ev = by_call.join(idle_by, on="name", how="left").with_columns(
        (pl.col("calls") / steps).alias("calls_per_step"),
    ).sort("time_at_stake_ns", descending=True, nulls_last=True)
    n = int(syncs.height)
    mean_after = int(dev_costs["idle_after_ns"].sum()) / max(dev_costs.height, 1)
    calls = ", ".join(f"{r['name']} ×{r['calls']}" for r in ev.head(3).iter_rows(named=True))
    if not n_steps:
        per = f"{n} in the window"
    elif n >= steps:
        per = f"{n / steps:.0f} per {noun}"
    else:  # fewer than one per step: say how often
        per = f"{n} in {steps} {noun}s"
    return [Finding(
        "sync_stall", sev,
        f"Host synchronisations inside the loop ({per}: {calls}); the GPU idles {fmt_ns(mean_after)} after each; "
        f"{ctx.per_step(total)} at stake",
        time_ns=total, share=ctx.share(total), evidence=ev,
        advice="Remove .item(), .cpu(), .tolist(), print(tensor) and torch.cuda.synchronize() from the step; keep checks "
        "on the GPU (torch.isfinite(x).all() kept as a tensor, checked every N steps), copy results with "
        "non_blocking=True into pinned memory and wait on a CUDA event only when the value is needed.",
        next=[f"nsys profile --trace=cuda,nvtx --cudabacktrace=sync:1 --python-backtrace=cuda -- {_cmd(ctx)}"],
    )]


def _uncovered_ns(copies_: pl.DataFrame, kernels: pl.DataFrame, lo: int, hi: int) -> int:
    """Time of the union of ``copies_`` (clipped to ``[lo, hi)``) not covered by any kernel:
    the ``memcpy`` state of ``activity_segments`` for these copies, computed from sorted
    interval unions and prefix sums (O(n log n), no segment table)."""

    def union(frame: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        if frame.height == 0:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        f = frame.select(
            pl.col("start_ns").clip(lo, hi).alias("s"), pl.col("end_ns").clip(lo, hi).alias("e")
        ).filter(pl.col("e") > pl.col("s")).sort("s")
        s_, e_ = f["s"].to_numpy(), f["e"].to_numpy()
        if s_.size == 0:
            return s_, e_
        run_end = np.maximum.accumulate(e_)
        new = np.ones(s_.size, bool)
        new[1:] = s_[1:] > run_end[:-1]
        idx = np.nonzero(new)[0]
        ends = np.append(run_end[idx[1:] - 1], run_end[-1])
        return s_[idx], ends

    cs, ce = union(copies_)
    ks, ke = union(kernels)
    if cs.size == 0:
        return 0
    total = int((ce - cs).sum())
    if ks.size == 0:
        return total
    # covered length of [0, x) by the kernel union, for any x
    cum = np.concatenate(([0], np.cumsum(ke - ks)))

    def covered_before(x: np.ndarray) -> np.ndarray:
        i = np.searchsorted(ks, x, side="right")  # intervals starting before x
        full = cum[np.maximum(i - 1, 0)]
        last_s, last_e = ks[np.maximum(i - 1, 0)], ke[np.maximum(i - 1, 0)]
        part = np.where(i > 0, np.minimum(x, last_e) - last_s, 0)
        return np.where(i > 0, full + part, 0)

    covered = covered_before(ce) - covered_before(cs)
    return total - int(covered.sum())


def pageable_memcpy(ctx: Context) -> list[Finding]:
    """``pageable_memcpy``: copies from or to pageable host memory, or blocking copy calls,
    in the window (``copies``: ``pageable``/``synchronous``). ``time_ns`` = their time on the
    GPU not overlapped by any kernel (``activity_segments`` ``memcpy`` state): a pinned,
    asynchronous copy could have run under compute."""
    m = ctx.memcpys_w
    if m.height == 0:
        return []
    cp = copies(m, ctx.api_near if ctx.api_near.height else None)
    flag = pl.col("pageable").fill_null(False)
    if "synchronous" in cp.columns:
        flag = flag | pl.col("synchronous").fill_null(False)
    bad = cp.filter(flag & pl.col("copy_kind").is_in(["HtoD", "DtoH"]))
    if bad.height == 0:
        return []
    keys = [*ctx.rk, "device_id"]
    per_dev = []
    for dev_key, part in bad.group_by(keys):
        kern = ctx.kernels_w
        for k, v in zip(keys, dev_key if isinstance(dev_key, tuple) else (dev_key,), strict=False):
            kern = kern.filter(pl.col(k) == v)
        per_dev.append(_uncovered_ns(part, kern, ctx.window.start_ns, ctx.window.end_ns))
    total = max(per_dev) if per_dev else 0
    sev = ctx.config.severity(ctx.share(total))
    if sev is None:
        return []
    ev = bad.group_by("copy_kind", "pageable", *[c for c in ("synchronous", "api_name") if c in bad.columns]).agg(
        pl.len().alias("copies"), pl.col("bytes").sum(), pl.col("duration_ns").sum().alias("time_ns"),
    ).with_columns((pl.col("bytes") / pl.col("time_ns")).alias("bandwidth_gbps")).sort("time_ns", descending=True)
    b = int(ev["bytes"].sum())
    bw = b / max(int(ev["time_ns"].sum()), 1)
    n_steps, noun = ctx.step_unit
    steps = max(n_steps, 1)
    return [Finding(
        "pageable_memcpy", sev,
        f"{bad.height / steps:.0f} pageable/synchronous host copies per {noun} ({b / steps / 2**20:.1f} MiB at "
        f"{bw:.1f} GB/s), {ctx.per_step(total)} of copy time not overlapped with compute"
        if n_steps else
        f"{bad.height} pageable/synchronous host copies ({b / 2**20:.1f} MiB at {bw:.1f} GB/s), "
        f"{fmt_ns(total)} not overlapped with compute",
        time_ns=total, share=ctx.share(total), evidence=ev,
        advice="Allocate the host side in pinned memory (tensor.pin_memory(), DataLoader(pin_memory=True)) and copy with "
        "non_blocking=True, ideally on a side stream one step ahead so the copy overlaps compute; avoid torch.from_numpy(...).cuda() "
        "on fresh numpy arrays inside the loop.",
        next=[f"tracekit stats -r cuda_gpu_mem_time_sum,cuda_gpu_mem_size_sum {ctx.trace_path}"],
    )]


def low_gpu_utilization(ctx: Context, explained_ns: int) -> list[Finding]:
    """``low_gpu_utilization``: the GPU is idle for at least ``idle_share`` of the window and
    the host/launch/sync findings explain less than half of it. ``time_ns`` = idle time
    (busiest GPU, window) − the explained part."""
    b = ctx.busy_w
    if b.height == 0 or ctx.window.duration_ns <= 0:
        return []
    top = b.sort("busy_ns", descending=True).row(0, named=True)
    idle = int(top["idle_ns"])
    share = ctx.share(idle) or 0.0
    if share < ctx.config.idle_share or explained_ns >= idle / 2:
        return []
    rest = idle - explained_ns
    causes = ctx.gaps_w.group_by("cause").agg(pl.col("duration_ns").sum().alias("idle_ns"), pl.len().alias("gaps")).sort(
        "idle_ns", descending=True
    ) if ctx.gaps_w.height else pl.DataFrame()
    sev = ctx.config.severity(ctx.share(rest)) or "low"
    return [Finding(
        "low_gpu_utilization", sev,
        f"GPU busy only {top['utilization']:.0%} of the window; {fmt_ns(rest)} of idle time is not explained by the "
        "host, launch or synchronisation findings",
        time_ns=rest, share=ctx.share(rest), evidence=causes,
        advice="Look at what the GPU waits for in the idle gaps (cause 'dependency': other streams, events or devices; "
        "gaps shorter than the threshold add up too). Trace the OS runtime and CPU sampling to see the host side.",
        next=[f"nsys profile --trace=cuda,nvtx,osrt --sample=process-tree --cpuctxsw=process-tree -- {_cmd(ctx)}"],
    )]


HOST_RULES = (warmup, host_bound, launch_bound, graph_launch, sync_stall, pageable_memcpy)
