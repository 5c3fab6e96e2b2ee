"""Diagnosis of a set reduced per rank on Dask (``open_many(…, engine="dask")``): each rank's
own findings (computed on its worker) combined, plus the cross-rank rules run on the
reductions (NCCL calls for the straggler, the overlap breakdown for exposed communication and
load imbalance)."""

from __future__ import annotations

from typing import Any

import polars as pl

from tracekit.diagnosis.config import DiagnoseConfig
from tracekit.diagnosis.result import SEVERITIES, Diagnosis, Finding, Window

__all__ = ["diagnose_reduced"]

#: Categories computed across ranks here, not taken from the ranks' own findings.
CROSS_RANK = ("exposed_communication", "straggler", "load_imbalance")


def diagnose_reduced(rs: Any, config: DiagnoseConfig, name: str) -> Diagnosis:
    """Findings of a reduced set. Per category of the ranks' own findings: the worst rank's
    time at stake (ranks wait for each other, so the slowest sets the pace), the highest
    severity, and one evidence row per rank that has it."""
    from tracekit.diagnosis.context import Context
    from tracekit.diagnosis.rules_comm import exposed_communication, load_imbalance, straggler

    f = rs.findings
    start = int(f["window_start_ns"].min()) if f.height else 0
    end = int(f["window_end_ns"].max()) if f.height else 0
    steps = int(f["window_steps"].max() or 0) if f.height else 0
    window = Window(start, end, "per_rank",
                    f"each rank's own steady-state window ({rs.ranks.height} ranks); cross-rank rules on the reductions",
                    steps=steps)
    rank_rank = {s: i for i, s in enumerate(SEVERITIES)}
    out: list[Finding] = []
    own = f.filter(~pl.col("category").is_in(list(CROSS_RANK)) & (pl.col("severity") != "info"))
    for (cat,), part in own.group_by(["category"], maintain_order=True):
        part = part.with_columns(pl.col("severity").replace_strict(rank_rank, return_dtype=pl.Int64).alias("_sev"))
        worst = part.sort("time_ns", descending=True, nulls_last=True).row(0, named=True)
        sev = SEVERITIES[int(part["_sev"].min())]  # type: ignore[arg-type]
        out.append(Finding(
            str(cat), sev,
            f"{part.height} of {rs.ranks.height} ranks; worst rank {worst['rank']}: {worst['title']}",
            time_ns=worst["time_ns"], share=worst["share"],
            evidence=part.select("rank", "severity", "time_ns", "share", "title").sort("time_ns", descending=True, nulls_last=True),
            advice=str(worst["advice"]), next=list(worst["next"] or []),
        ))
    ctx = Context(rs, config)
    ctx.window = ctx.full_window = window
    ov = rs.overlap
    if ov.height:
        ctx.__dict__["_comm_breakdown"] = ov
    # no raw rows here: the straggler's cost is its start skew, not the waiting GPUs' idle time
    ctx.__dict__["_comm_segments"] = None
    for rule in (exposed_communication, straggler, load_imbalance):
        out.extend(rule(ctx))
    return Diagnosis(name, window, out)
