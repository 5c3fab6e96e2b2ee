"""What the capture missed: GPU work that the GPU metrics saw and no traced operation explains.

A server whose engine runs in a forked child, a worker started by ``multiprocessing``, a
process nsys was told not to follow: their kernels are not in the export, but the GPU metrics
(sampled for the whole device, whoever runs on it) still show the SMs busy. Both findings are
``trace_coverage``; their numbers come from :func:`tracekit.analysis.metrics.metric_activity`.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from tracekit.analysis._frames import process_key
from tracekit.diagnosis.result import Finding, fmt_ns

__all__ = ["FOLLOW_CHILDREN", "untraced_work", "untraced_work_without_kernels"]

#: With kernels traced, activity outside them is reported when it is at least this share of
#: the GPU's active time …
UNTRACED_SHARE = 0.25
#: … and at least this long (ns).
UNTRACED_MIN_NS = 50_000_000
#: Without kernels, any activity at least this long (ns) is reported.
ACTIVE_MIN_NS = 10_000_000
#: Memory comparing the operations with the metric samples takes per GPU operation (bytes):
#: four Int64 columns selected, filtered, sorted and extended by their running end, then
#: matched as-of (five copies). polars aborts the process when an allocation fails (a warm
#: ``tracekit diagnose`` of 310 k operations with ~150 MB of address space left did, here), so
#: the check is left out, saying so, when this much is not left.
COVERAGE_BYTES_PER_OP = 160

#: How to capture the work of child processes (what ``--trace-fork-before-exec`` does was
#: checked on the bundled serving captures, sample_traces/run_structure/serve_child_*).
FOLLOW_CHILDREN = (
    "nsys follows children that exec a new program (multiprocessing's 'spawn', a shell) by itself; a child forked without "
    "exec (multiprocessing's 'fork', as vLLM starts its engine) is traced only with --trace-fork-before-exec=true, and "
    "its last GPU records are written only when it leaves through the C library's exit(): multiprocessing ends forked "
    "children with os._exit, which skips that (call torch.cuda.profiler.stop() or leave through ctypes.CDLL(None).exit(0))"
)


def _processes_without_cuda(ctx: Any) -> pl.DataFrame:
    """Processes named like one that made CUDA calls but that made none themselves (the
    untraced children of a server): ``pid``, ``name``."""
    procs = getattr(ctx.trace, "processes", None)
    api = ctx.api_source
    if not isinstance(procs, pl.DataFrame) or procs.height == 0 or ctx.api_count == 0:
        return pl.DataFrame(schema={"pid": pl.Int64, "name": pl.Utf8})
    calling = set(pl.select(process_key(pl.lit(api["global_tid"]))).to_series().drop_nulls().unique().to_list())
    named = procs.filter(pl.col("global_pid").is_in(list(calling)))["name"].unique().to_list()
    return procs.filter(pl.col("name").is_in(named) & ~pl.col("global_pid").is_in(list(calling))).select("pid", "name").sort("pid")


def untraced_work_without_kernels(ctx: Any, cmd: str) -> Finding | None:
    """``trace_coverage`` (high) for a capture without kernels whose GPU metrics show the SMs
    active: the work ran in a process the capture did not follow. ``time_ns`` is the active
    time; evidence: the metrics per GPU and the processes named like the traced one that made
    no CUDA call. ``None`` without metrics or activity."""
    act = ctx.metric_activity(None)
    if act.height == 0 or int(act["active_ns"].sum()) < ACTIVE_MIN_NS:
        return None
    top = act.sort("active_ns", descending=True).row(0, named=True)
    span = int(top["span_ns"]) or 1
    others = _processes_without_cuda(ctx)
    listed = ", ".join(f"{name} {pid}" for pid, name in others.head(5).iter_rows())
    where = f"; processes named like the traced one that made no traced CUDA call: {listed}" if others.height else ""
    means = ", ".join(f"{label} {top[col]:.1f}%" for col, label in (
        ("sms_active_mean", "SM active"), ("tensor_active_mean", "Tensor active"), ("dram_read_bandwidth_mean", "DRAM read"))
        if top.get(col) is not None)
    evidence = act.select([c for c in ("rank", "device_id", "samples", "span_ns", "active_ns", "active_share", "sm_active_during_active",
                                       "sms_active_mean", "tensor_active_mean", "dram_read_bandwidth_mean", "dram_write_bandwidth_mean")
                           if c in act.columns])
    return Finding(
        "trace_coverage", "high",
        f"The GPU was busy but the capture holds no kernels: GPU {top['device_id']}'s SMs were active {fmt_ns(top['active_ns'])} "
        f"({top['active_share']:.0%} of its {fmt_ns(span)} of samples; {means} on average) while the traced processes made "
        f"{ctx.api_count:,} CUDA calls and launched nothing: the work ran in a process nsys did not follow{where}",
        time_ns=int(top["active_ns"]), share=float(top["active_share"]), evidence=evidence,
        advice="Capture the process that runs the GPU work: " + FOLLOW_CHILDREN + ".",
        next=[f"nsys profile --trace-fork-before-exec=true --gpu-metrics-devices=all {cmd}",
              f"tracekit capture nsys --preset llm-serving -- {cmd}"],
    )


def _would_not_fit(n_ops: int) -> Finding | None:
    """The ``info`` finding saying that the coverage check was left out, when comparing
    ``n_ops`` operations with the metrics needs more than is left (:data:`COVERAGE_BYTES_PER_OP`)."""
    from tracekit.nsys.database import free_memory

    need, free = COVERAGE_BYTES_PER_OP * n_ops, free_memory()
    if free is None or need <= free:
        return None
    return Finding("trace_coverage", "info",
                   f"trace_coverage not checked: comparing {n_ops:,} GPU operations with the GPU metrics needs about "
                   f"{need / 1e6:.0f} MB and {free / 1e6:.0f} MB is left",
                   advice="Diagnose a shorter window (tracekit diagnose --window START_NS:END_NS) or on a machine with more memory.")


def untraced_work(ctx: Any) -> list[Finding]:
    """``trace_coverage`` (by share of the window) when the GPU metrics show the SMs active for
    at least :data:`UNTRACED_SHARE` of their active time (and :data:`UNTRACED_MIN_NS`) in
    sample intervals that no traced operation of that GPU overlaps: another process shared the
    GPU, or a child of the program was not followed."""
    if ctx.kernel_count == 0 or ctx.activity_samples.height == 0:
        return []
    ops = ctx.ops_for_window(["rank", "device_id", "start_ns", "end_ns"])
    left_out = _would_not_fit(ops.height)
    if left_out is not None:
        return [left_out]
    act = ctx.metric_activity(ops)
    if act.height == 0:
        return []
    bad = act.filter((pl.col("untraced_active_ns") >= UNTRACED_MIN_NS)
                     & (pl.col("untraced_active_ns") >= UNTRACED_SHARE * pl.col("active_ns")))
    if bad.height == 0:
        return []
    top = bad.sort("untraced_active_ns", descending=True).row(0, named=True)
    from tracekit.diagnosis.rules_host import _cmd

    cmd = _cmd(ctx)
    return [Finding(
        "trace_coverage", "medium",
        f"GPU {top['device_id']}'s SMs were active {fmt_ns(top['untraced_active_ns'])} outside every traced operation "
        f"({top['untraced_active_ns'] / max(top['active_ns'], 1):.0%} of its active time, by its GPU metrics): work of a "
        "process the capture did not trace shared the GPU",
        time_ns=int(top["untraced_active_ns"]), share=None,
        evidence=bad.select([c for c in ("rank", "device_id", "active_ns", "untraced_active_ns", "sms_active_mean") if c in bad.columns]),
        advice="Find the process (another job on the GPU, a child of the program): " + FOLLOW_CHILDREN + ".",
        next=[f"nsys profile --trace-fork-before-exec=true --gpu-metrics-devices=all {cmd}"],
    )]
