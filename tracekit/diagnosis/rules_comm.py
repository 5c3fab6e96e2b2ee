"""Rules about communication between GPUs: exposed_communication, straggler, load_imbalance.

They work on one trace with several GPUs (``nsys profile torchrun …``) and on a set of
per-rank reports (``tracekit.open_many``). Time at stake per rule is in each docstring.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from tracekit.analysis.comm import (
    activity_segments,
    categorize_ops,
    comm_by_range,
    comm_kind_expr,
    overlap_breakdown,
    peer_copy_expr,
)
from tracekit.analysis.nccl import is_nccl_kernel, nccl_ranges
from tracekit.analysis.ranks import MATCH_COLUMNS, collective_skew, match_collectives
from tracekit.diagnosis.context import Context
from tracekit.diagnosis.result import Finding, fmt_ns
from tracekit.diagnosis.rules_host import _cmd

__all__ = ["COMM_RULES"]


def _breakdown(ctx: Context) -> pl.DataFrame:
    """``overlap_breakdown`` of the window's GPUs (empty without communication), computed once
    per diagnosis: the communication rules and ``Diagnosis.gpu_time`` read it."""
    cached = ctx.__dict__.get("_comm_breakdown")
    if cached is None:
        cached = ctx.__dict__["_comm_breakdown"] = _compute_breakdown(ctx)
    return cached  # type: ignore[no-any-return]


def _compute_breakdown(ctx: Context) -> pl.DataFrame:
    seg = _segments(ctx)
    return pl.DataFrame() if seg is None else overlap_breakdown(seg)


def _segments(ctx: Context) -> pl.DataFrame | None:
    """``activity_segments`` of the window's GPUs, computed once per diagnosis (the overlap
    breakdown and the straggler rule's idle waits read them); ``None`` without communication."""
    if "_comm_segments" not in ctx.__dict__:
        ctx.__dict__["_comm_segments"] = _compute_segments(ctx)
    return ctx.__dict__["_comm_segments"]  # type: ignore[no-any-return]


def _compute_segments(ctx: Context) -> pl.DataFrame | None:
    k = ctx.kernels_w
    if k.height == 0:
        return None
    names = k.select(pl.col("name").unique())
    has_comm = names.select(comm_kind_expr("name").is_not_null().any()).item()
    peer = ctx.memcpys_w.height > 0 and "copy_kind" in ctx.memcpys_w.columns and bool(
        ctx.memcpys_w.select(peer_copy_expr().fill_null(False).any()).item()
    )
    if not has_comm and not peer:  # no communication at all: skip the segment table
        return None
    w = ctx.window
    graphs = ctx.graphs.filter((pl.col("start_ns") >= w.start_ns) & (pl.col("start_ns") < w.end_ns)) if ctx.graphs.height else None
    ops = categorize_ops(k, ctx.memcpys_w if ctx.memcpys_w.height else None, None, graphs)
    return activity_segments(ops, start_ns=ctx.window.start_ns, end_ns=ctx.window.end_ns)


def exposed_communication(ctx: Context) -> list[Finding]:
    """``exposed_communication``: communication kernels and peer copies not overlapped by
    compute on the same GPU (``overlap_breakdown``'s ``communication_only_ns``), in the
    window. ``time_ns`` = the largest of the GPUs' exposed time (the GPUs of a synchronous
    job wait for each other, so the worst one sets the pace)."""
    br = _breakdown(ctx)
    if br.height == 0 or "communication_only_ns" not in br.columns or int(br["communication_ns"].sum()) == 0:
        return []
    top = br.sort("communication_only_ns", descending=True).row(0, named=True)
    total = int(top["communication_only_ns"])
    sev = ctx.config.severity(ctx.share(total))
    if sev is None:
        return []
    keys = [c for c in ("rank", "device_id") if c in br.columns]
    where = ", ".join(f"{k} {top[k]}" for k in keys)
    ev = br.select(*keys, "span_ns", "compute_only_ns", "communication_only_ns", "overlap_ns", "communication_ns",
                   "exposed_fraction").sort("communication_only_ns", descending=True)
    return [Finding(
        "exposed_communication", sev,
        f"{fmt_ns(total)} of communication not overlapped with compute ({where}: "
        f"{top['exposed_fraction']:.0%} of its communication is exposed, {ctx.per_step(total)})",
        time_ns=total, share=ctx.share(total), evidence=ev,
        advice="Overlap collectives with independent compute: async tensor parallelism / sequence parallelism "
        "(torch.distributed._symmetric_memory, TransformerEngine's comm-GEMM overlap), DDP/FSDP bucketing and "
        "prefetch, vLLM's custom all-reduce for small messages; or cut the bytes (fp8/bf16 communication, fewer TP ranks "
        "for decode). When the NCCL kernels are mostly waiting, see the straggler/load-imbalance findings.",
        next=[f"tracekit capture nsys --preset torchrun -- {_cmd(ctx)}"],
    )]


def prepare_comm(ctx: Context) -> None:
    """Build the NCCL calls and the matched collectives the straggler rule reads now, on a big
    export read a column at a time (:func:`_skew`, which does nothing without NCCL kernels or
    ranges): they are the diagnosis' biggest step, and before the rules they run beside the
    window's tables only, not beside what the rules keep (h1x, 150 k NCCL calls, pages
    returned at once: that step 430–445 → 315 MiB, with the changes to the NCCL build)."""
    if ctx.by_column is not None:
        _skew(ctx)


def _surely_no_nccl(ctx: Context) -> bool:
    """Whether a single export that has not built ``trace.nccl`` yet has neither an NCCL
    kernel nor an NCCL NVTX range, so its NCCL table would be empty: checked on the frames the
    rules already hold instead of reading the kernel and API tables again to build it."""
    tr = ctx.trace
    if not hasattr(tr, "scan") or "nccl" in getattr(tr, "__dict__", {}):
        return False
    if ctx.kernel_count and {"name", "short_name"} <= set(ctx.kernel_columns):
        # nccl_kernels tests coalesce(short_name, name) and name: any NCCL short name or name
        # (distinct values only: a few hundred, where the table has millions of rows)
        for col in ("short_name", "name"):
            if ctx.kernel_names(col).to_frame().select(is_nccl_kernel(pl.col(col)).any()).item():
                return False
    elif ctx.kernel_count:
        return False
    nv = ctx.nvtx
    return nv.height == 0 or ("domain" in nv.columns and nccl_ranges(nv).height == 0)


def _skew(ctx: Context) -> pl.DataFrame:
    """The window's matched collectives (:func:`_compute_skew`), computed once per diagnosis."""
    cached = ctx.__dict__.get("_comm_skew")
    if cached is None:
        cached = ctx.__dict__["_comm_skew"] = _compute_skew(ctx)
    return cached  # type: ignore[no-any-return]


def _nccl_table(ctx: Context) -> pl.DataFrame | None:
    """The trace's NCCL calls table. Of a big export read a column at a time that has not
    built it, built here and not kept on the trace: the diagnosis reads it once, for the
    matched collectives, and keeping it held 45 MB (h1x, 150 k calls) through every later step
    (``trace.nccl`` builds it again when asked)."""
    tr = ctx.trace
    if ctx.by_column is not None and hasattr(tr, "scan") and "nccl" not in getattr(tr, "__dict__", {}):
        from tracekit.nsys.trace import derived_table

        return derived_table(tr, "nccl")
    return getattr(tr, "nccl", None)


def _compute_skew(ctx: Context) -> pl.DataFrame:
    if _surely_no_nccl(ctx):
        return pl.DataFrame()
    nccl = _nccl_table(ctx)
    if nccl is None or nccl.height == 0 or "rank" not in nccl.columns or nccl["rank"].n_unique() < 2:
        return pl.DataFrame()
    # only the columns the matching reads (collective_skew reads no other); the table's other
    # columns go now
    nccl = nccl.select(c for c in (*MATCH_COLUMNS, "device_id") if c in nccl.columns)
    matched = match_collectives(nccl)
    del nccl
    if matched.height == 0:
        return pl.DataFrame()
    sk = collective_skew(matched)
    w = ctx.window
    sk = sk.filter((pl.col("last_start_ns") >= w.start_ns) & (pl.col("first_start_ns") < w.end_ns) & (pl.col("match_ranks") > 1))
    # each rank's wait for the last one, on its own GPU (GPU times only)
    if "device_id" not in matched.columns:
        return sk
    waits = matched.filter(pl.col("match_id").is_in(sk["match_id"].implode()) & (pl.col("wait_ns") > 0)
                           & (pl.col("time_base") == "gpu") & pl.col("device_id").is_not_null())
    ctx.__dict__["_comm_waits"] = waits.select(
        *[c for c in ("rank",) if c in waits.columns], "device_id", "match_id", "straggler_rank", "start_ns",
        pl.col("last_start_ns").alias("end_ns"))
    return sk


def _idle_waits(ctx: Context, rank: Any) -> int | None:
    """Of the other ranks' waits for ``rank`` (start of their collective kernel to the last
    rank's start, on their own GPU), the time their GPU computed nothing (ns): what the waiting
    cost them. ``None`` when the waits are not known on the GPUs' timeline."""
    waits = ctx.__dict__.get("_comm_waits")
    if waits is None or waits.height == 0:
        return None
    seg = _segments(ctx)  # what the waiting GPUs did
    if seg is None or seg.height == 0:
        return None
    mine = waits.filter(pl.col("straggler_rank") == rank)
    w = ctx.window
    mine = mine.with_columns(pl.col("start_ns").clip(w.start_ns, w.end_ns), pl.col("end_ns").clip(w.start_ns, w.end_ns)).filter(
        pl.col("end_ns") > pl.col("start_ns"))
    if mine.height == 0:
        return 0
    keys = [k for k in ("rank", "device_id") if k in seg.columns and k in mine.columns]
    mine = mine.select(*keys, "start_ns", "end_ns")
    mine = mine.with_columns(pl.col(k).cast(seg.schema[k]) for k in keys)
    got = comm_by_range(seg, mine)
    return int((got["window_ns"] - got["compute_only_ns"] - got["overlap_ns"]).clip(lower_bound=0).sum())


def straggler(ctx: Context) -> list[Finding]:
    """``straggler``: one rank starts last in at least ``straggler_share`` of the matched
    collectives (``collective_skew``) in the window, so the others wait for it. ``time_ns`` =
    the part of the others' waits (their collective kernel's start to the straggler's, on
    their own GPU) in which their GPU computed nothing: a wait hidden under compute on another
    stream (DDP's bucketed all-reduces during the backward) costs nothing. Without GPU times
    for the calls, the summed start skew of the collectives where it was last."""
    sk = _skew(ctx)
    if sk.height < 3:
        return []
    per = sk.group_by("straggler_rank").agg(pl.len().alias("collectives"), pl.col("skew_ns").sum().alias("skew_ns"),
                                            pl.col("max_wait_ns").median().alias("median_wait_ns")).sort("skew_ns", descending=True)
    per = per.with_columns((pl.col("collectives") / sk.height).alias("share_last")).sort(
        ["share_last", "skew_ns"], descending=True
    )
    top = per.row(0, named=True)
    if top["share_last"] < ctx.config.straggler_share:
        return []
    skew = int(top["skew_ns"])
    idle = _idle_waits(ctx, top["straggler_rank"])
    total = skew if idle is None else idle
    sev = ctx.config.severity(ctx.share(total))
    if sev is None:
        return []
    cost = (f"{fmt_ns(skew)} in the window" if idle is None else
            f"{fmt_ns(skew)} of waiting in the window, {fmt_ns(idle)} of it with nothing else running on the waiting GPU")
    return [Finding(
        "straggler", sev,
        f"Rank {top['straggler_rank']} starts last in {top['share_last']:.0%} of {sk.height} collectives; the others wait "
        f"{fmt_ns(top['median_wait_ns'])} per collective (median), {cost}",
        time_ns=total, share=ctx.share(total), evidence=per,
        advice="Find what that rank does before the collective (host work, data loading, a slower GPU or a "
        "throttled clock, extra logging/checkpointing on rank 0) and move it off the step or spread it across ranks.",
        next=[f"tracekit diagnose {ctx.trace_path} --format markdown  # per rank: open_many on the per-rank reports"],
    )]


#: Findings that the ranks a straggler keeps waiting show: their GPUs idle, their collectives exposed.
STRAGGLER_EFFECTS = ("exposed_communication", "host_bound")


def straggler_leads(ctx: Context, findings: list[Finding]) -> None:
    """Mark the straggler as the cause of the findings whose worst GPU (their evidence's first
    row) is one that waited for it (:func:`straggler`'s waits) and is not the straggler's own:
    the straggler is then listed before them, and their titles say whom they wait for. A
    finding on the straggler's own GPU (its host-bound step) is its cause, not its effect."""
    s = next((f for f in findings if f.category == "straggler"), None)
    waits = ctx.__dict__.get("_comm_waits")
    if s is None or s.evidence.height == 0 or waits is None or waits.height == 0:
        return
    late = s.evidence["straggler_rank"][0]
    mine = waits.filter(pl.col("straggler_rank") == late)
    own = waits.filter(pl.col("rank") == late) if "rank" in waits.columns else waits.head(0)
    causes = []
    for f in findings:
        keys = [c for c in ("rank", "device_id") if c in mine.columns and c in f.evidence.columns]
        if f.category not in STRAGGLER_EFFECTS or f.evidence.height == 0 or not keys:
            continue
        where = tuple(f.evidence.select(keys).row(0))
        waiting = {tuple(r) for r in mine.select(keys).unique().iter_rows()}
        if where in waiting and where not in {tuple(r) for r in own.select(keys).unique().iter_rows()}:
            causes.append(f.category)
            f.title += f" — waiting for rank {late}, the straggler"
    s.causes = tuple(causes)
    if causes:
        s.title += f"; the waiting shows as {' and '.join(c.replace('_', ' ') for c in causes)} on the other rank(s)"


def load_imbalance(ctx: Context) -> list[Finding]:
    """``load_imbalance``: GPUs of one job do different amounts of compute in the window
    (``overlap_breakdown``: compute_only + overlap), (max − min)/max ≥ ``imbalance_min``.
    ``time_ns`` = max − mean: what an even split would save on the critical path."""
    br = _breakdown(ctx)
    if br.height < 2 or int(br["communication_ns"].sum()) == 0:
        return []
    br = br.with_columns((pl.col("compute_only_ns") + pl.col("overlap_ns")).alias("compute_ns"))
    mx, mn, mean = int(br["compute_ns"].max()), int(br["compute_ns"].min()), float(br["compute_ns"].mean())  # type: ignore[arg-type]
    if mx <= 0 or (mx - mn) / mx < ctx.config.imbalance_min:
        return []
    total = int(mx - mean)
    sev = ctx.config.severity(ctx.share(total))
    if sev is None:
        return []
    keys = [c for c in ("rank", "device_id") if c in br.columns]
    heavy = br.sort("compute_ns", descending=True).row(0, named=True)
    where = ", ".join(f"{k} {heavy[k]}" for k in keys)
    return [Finding(
        "load_imbalance", sev,
        f"Compute per GPU differs by {(mx - mn) / mx:.0%}: {where} computes {fmt_ns(mx)}, the lightest {fmt_ns(mn)}; "
        f"the others wait in collectives",
        time_ns=total, share=ctx.share(total), evidence=br.select(*keys, "compute_ns", "communication_ns", "idle_ns").sort("compute_ns", descending=True),
        advice="Balance the work: equal tokens per rank (pad or bucket sequences by length, balance the batch in "
        "data-parallel serving), even layer splits across pipeline stages (the embedding/LM head stages are heavier), "
        "expert load balancing for MoE.",
        next=[f"tracekit capture nsys --preset torchrun -- {_cmd(ctx)}"],
    )]


COMM_RULES = (exposed_communication, straggler, load_imbalance)
