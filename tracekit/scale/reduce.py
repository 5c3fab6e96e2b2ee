"""What one rank's report is reduced to before it leaves the worker.

Each reduction is a small polars frame computed with the existing analyses from one report
(its own clock; the set shifts times when it stacks them):

``kernel_summary``
    per ``pid``, ``device_id``, ``name``, ``short_name``: ``kernels``, ``total_ns``,
    ``min_ns``, ``max_ns`` (ns).
``nccl``
    the report's ``trace.nccl`` (one row per NCCL call: what collective matching needs).
``gpus``
    the report's ``trace.gpus``.
``iterations``
    :func:`tracekit.analysis.run.iterations.iterations` (per-step CPU and GPU time).
``busy``
    :func:`tracekit.analysis.gpu_time.busy_time` per device.
``overlap``
    :func:`tracekit.analysis.comm.overlap_breakdown` of the whole trace per device.
``findings``
    :func:`tracekit.diagnose` of the report (one row per finding).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import polars as pl

__all__ = ["REDUCTIONS", "reduce_report", "reductions_of"]

REDUCTIONS: tuple[str, ...] = ("kernel_summary", "nccl", "gpus", "iterations", "busy", "overlap", "findings")


def reductions_of(trace: object, names: tuple[str, ...] = REDUCTIONS) -> dict[str, pl.DataFrame]:
    """The reductions of one open trace (see the module doc)."""
    from tracekit.analysis._frames import gpu_ops
    from tracekit.analysis.attribution import launch_info
    from tracekit.analysis.comm import activity_segments, categorize_ops, overlap_breakdown
    from tracekit.analysis.gpu_time import busy_time
    from tracekit.analysis.graphs import graph_trace_of
    from tracekit.analysis.run.iterations import iterations

    t: object = trace
    kernels: pl.DataFrame = t.kernels  # type: ignore[attr-defined]
    out: dict[str, pl.DataFrame] = {}
    ops = None
    for name in names:
        if name == "kernel_summary":
            rk = ["rank"] if "rank" in kernels.columns else []  # a TraceSet: per rank too
            out[name] = kernels.group_by(*rk, "pid", "device_id", "name", "short_name").agg(
                pl.len().cast(pl.Int64).alias("kernels"), pl.col("duration_ns").sum().alias("total_ns"),
                pl.col("duration_ns").min().alias("min_ns"), pl.col("duration_ns").max().alias("max_ns"),
            ).sort(*rk, "pid", "device_id", "total_ns", descending=[*([False] * len(rk)), False, False, True])
        elif name in ("nccl", "gpus"):
            out[name] = getattr(t, name)
        elif name in ("iterations", "busy", "overlap"):
            if ops is None:
                ops = gpu_ops(kernels, t.memcpys, t.memsets, graph_trace_of(t))  # type: ignore[attr-defined]
            if name == "iterations":
                api = t.cuda_api  # type: ignore[attr-defined]
                out[name] = iterations(launch_info(ops, api), t.nvtx) if api.height else pl.DataFrame()  # type: ignore[attr-defined]
            elif name == "busy":
                out[name] = busy_time(ops)
            else:
                cat = categorize_ops(kernels, t.memcpys, t.memsets, graph_trace_of(t))  # type: ignore[attr-defined]
                out[name] = overlap_breakdown(activity_segments(cat))
        elif name == "findings":
            from tracekit.diagnosis import diagnose

            d = diagnose(t)
            # evidence as JSON text: its struct fields differ between ranks' findings
            evidence = pl.Series("evidence_json", [d.evidence(i).write_json() for i in range(len(d))], dtype=pl.Utf8)
            out[name] = d.findings.drop("evidence").with_columns(evidence).with_columns(
                pl.lit(d.window.start_ns, pl.Int64).alias("window_start_ns"), pl.lit(d.window.end_ns, pl.Int64).alias("window_end_ns"),
                pl.lit(d.window.steps, pl.Int64).alias("window_steps"),
            )
        else:
            msg = f"unknown reduction {name!r}; choose from {', '.join(REDUCTIONS)}"
            raise ValueError(msg)
    return out


def reduce_report(path: str | Path, names: tuple[str, ...] = REDUCTIONS, engine: str = "auto") -> object:
    """Open one report and reduce it: the picklable record that a Dask task returns
    (``tracekit.multi``'s per-report record, with the reductions as its tables, the rank
    candidates, session start and nsys version). A report that cannot be read comes back
    with its failure instead of raising, as with the process-pool engine."""
    from tracekit.multi import ReportFailure, _Loaded, rank_identity

    p = Path(path)
    out = _Loaded(path=p)
    try:
        from tracekit.nsys.trace import NsysTrace
        from tracekit.opening import open as open_trace

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trace = open_trace(p, engine=engine)
            if not isinstance(trace, NsysTrace):
                msg = "not an Nsight Systems report"
                raise TypeError(msg)
            try:
                out.tables = reductions_of(trace, names)
                out.epoch_ns = trace.meta.session_epoch_ns
                out.version = trace.meta.version
                out.candidates, out.identity = rank_identity(trace, p)
            finally:
                trace.close()
        out.notes.extend(str(w.message) for w in caught)
    except Exception as exc:  # one bad report must not stop the set
        out.tables = {}
        out.failure = ReportFailure(p, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
    return out
