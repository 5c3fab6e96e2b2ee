"""Diagnosis: findings with evidence, time at stake and the next step, from the analyses.

``tracekit.diagnose(trace)`` (the function; this package is ``tracekit.diagnosis``) finds the steady-state window (:mod:`.window`), runs every rule
(:mod:`.rules_host`, :mod:`.rules_gpu`, :mod:`.rules_comm`) on it and returns a
:class:`Diagnosis`. See docs/diagnose.md for each rule's test and time-at-stake estimate.
"""

from __future__ import annotations

import os
from typing import Any

from tracekit.diagnosis.config import DiagnoseConfig
from tracekit.diagnosis.result import CATEGORIES, SEVERITIES, Diagnosis, Finding, Window

__all__ = ["CATEGORIES", "SEVERITIES", "DiagnoseConfig", "Diagnosis", "Finding", "Window", "diagnose", "structure"]


def _open(obj: Any) -> Any:
    if isinstance(obj, str | os.PathLike):
        from tracekit.opening import open as tk_open

        return tk_open(os.fspath(obj))
    return obj


def _trace_name(trace: Any) -> str:
    path = getattr(trace, "path", None)
    if path is not None:
        return os.path.basename(str(path))
    paths = getattr(trace, "paths", None)
    if paths:
        return f"{len(paths)} reports ({os.path.basename(str(paths[0]))} …)"
    return type(trace).__name__


def _missing(ctx: Any) -> list[Finding]:
    import polars as pl

    """One ``info`` row per rule that could not look at the trace, saying what is missing."""
    out: list[Finding] = []
    if ctx.kernel_count == 0 and ctx.graphs.height == 0:
        out.append(_no_kernels(ctx))
        return out
    hidden = _hidden_graph_work(ctx)
    if hidden is not None:
        out.append(hidden)
    if ctx.api_count == 0:
        out.append(Finding("host_bound", "info",
                           "host_bound, launch_bound, sync_stall not checked: no CUDA API calls in the trace",
                           advice="Capture with nsys --trace=cuda (API calls are what tie GPU idle time to the host)."))
    mu = getattr(ctx.trace, "memory_usage", None)
    if mu is None or mu.height == 0:
        torch_profiler = getattr(ctx.trace, "profiler", None) == "torch.profiler"
        how = ("tracekit capture torch --profile-memory -- PROGRAM ARGS  (torch.profiler.profile(profile_memory=True))"
               if torch_profiler else "tracekit capture nsys --cuda-memory-usage -- PROGRAM ARGS  (nsys --cuda-memory-usage=true)")
        out.append(Finding("memory_growth", "info",
                           f"memory_growth not checked: no {'memory' if torch_profiler else 'CUDA memory-usage'} events in the trace",
                           next=[how]))
    elif ctx.full_window.steps < 3:
        out.append(Finding("memory_growth", "info", "memory_growth not checked: fewer than 3 steady iterations"))
    db = getattr(ctx.trace, "db", None)
    has_metrics = db.has_table("GPU_METRICS") if db is not None else getattr(ctx.trace, "gpu_metrics", pl.DataFrame()).height > 0
    if not has_metrics:
        out.append(Finding("no_tensor_cores", "info",
                           "no_tensor_cores checked by kernel name only: no GPU metrics (Tensor Active) in the trace",
                           next=["nsys profile --gpu-metrics-devices=all --gpu-metrics-frequency=10000 … (or pass ncu=)"]))
    return out


def _no_kernels(ctx: Any) -> Finding:
    """The one finding of a trace without kernels or graph launches: the GPU work its GPU
    metrics saw in a process it did not follow (:mod:`.rules_coverage`), else what it holds
    instead."""
    from tracekit.diagnosis.rules_coverage import untraced_work_without_kernels

    found = untraced_work_without_kernels(ctx, _cmd(ctx))
    if found is not None:
        return found
    copies, sets = ctx.memcpys.height, ctx.memsets.height
    holds = f"{copies:,} memory copies and {sets:,} memsets" if copies or sets else "no GPU work at all"
    return Finding(
        "low_gpu_utilization", "info",
        f"The trace holds no kernels ({holds}): nothing ran on the GPU's compute units, so no rule was checked",
        advice="Trace CUDA (nsys --trace=cuda) over the part of the program that runs kernels: the capture range may have "
        "closed before them (cudaProfilerStart/Stop, --capture-range), or the program ran on the CPU.",
    )


def _hidden_graph_work(ctx: Any) -> Finding | None:
    """``info``: CUDA graph replays traced whole hold GPU time whose kernels no rule saw."""
    import polars as pl

    g = ctx.graphs
    if g.height == 0:
        return None
    w = ctx.window
    inside = g.filter((pl.col("start_ns") >= w.start_ns) & (pl.col("start_ns") < w.end_ns))
    if inside.height == 0:
        return None
    ops = ctx.ops_w
    total = int(ops["duration_ns"].sum()) if ops.height else 0
    graph_ns = int(inside["duration_ns"].sum())
    share = graph_ns / total if total else 1.0
    return Finding(
        "trace_coverage", "info",
        f"{inside.height:,} CUDA graph replays ({share:.0%} of the window's GPU time) were traced whole "
        "(--cuda-graph-trace=graph): their kernels are not in the trace, so no_tensor_cores, data_movement and "
        "exposed_communication did not see them",
        advice="Capture once more with --cuda-graph-trace=node to see each replay's kernels (it lengthens every graph "
        "launch on the host; keep the graph-mode capture for GPU and step times).",
        next=[f"tracekit capture nsys --cuda-graph-trace node -- {_cmd(ctx)}"],
    )


def _cmd(ctx: Any) -> str:
    from tracekit.diagnosis.rules_host import _cmd as cmd

    return cmd(ctx)


def structure(trace: Any, *, config: DiagnoseConfig | None = None) -> Any:
    """The structure of a run (:class:`tracekit.analysis.run.structure.RunStructure`): what kind
    of run it is (training, generation, serving, microbenchmark) and why, its iterations,
    warm-up, start-up and tear-down, and the requests of a generation or server. The same
    structure ``diagnose`` takes its window from (``Diagnosis.structure``).

    ``trace``: an :class:`~tracekit.nsys.trace.NsysTrace`, a per-rank
    :class:`~tracekit.multi.TraceSet` or a path to open; ``config``: the thresholds
    (:class:`DiagnoseConfig`: ``iteration_pattern``, ``warmup_factor``, ``min_repeats`` …).

    Examples
    --------
    >>> s = tracekit.structure("run.sqlite")          # doctest: +SKIP
    >>> s.headline()                                   # doctest: +SKIP
    'training: 10 steady steps of 42.6 ms on 2 ranks, 2 warm-up, start-up 21.42 s not counted'
    >>> s.segments, s.iterations, s.requests           # doctest: +SKIP
    """
    from tracekit.diagnosis.context import Context

    tr = _open(trace)
    if hasattr(tr, "kernels_across_ranks"):
        from tracekit.errors import TracekitError

        raise TracekitError("structure: a set reduced on Dask keeps no per-operation rows; open the ranks with "
                            "tracekit.open_many(..., engine='local') for their structure")
    ctx = Context(tr, config or DiagnoseConfig())
    ctx.prepare_reads()
    s = ctx.structure
    if s.kind == "training" and not ctx.rk:  # the periodic work between steps, as diagnose sets it apart
        from tracekit.diagnosis.window import search_window

        ctx.full_window = search_window(ctx)
        ctx.window = ctx.full_window.analysed()
        ctx.training_steps  # noqa: B018
    return s


def diagnose(
    trace: Any,
    *,
    ncu: Any = None,
    model: Any = None,
    window: tuple[int, int] | None = None,
    config: DiagnoseConfig | None = None,
) -> Diagnosis:
    """Findings for a trace: where the time is lost, what it costs, what to try.

    Parameters
    ----------
    trace
        An :class:`~tracekit.nsys.trace.NsysTrace`, a :class:`~tracekit.multi.TraceSet`
        (per-rank reports) or a path to open.
    ncu
        An :class:`~tracekit.ncu.report.NcuReport` (or path) of the same program: adds the
        memory/compute-bound kernel findings.
    model
        A transformer description for :mod:`tracekit.model` (config object, YAML or HF
        ``config.json`` path): adds findings where a layer is far from its predicted bound.
    window
        ``(start_ns, end_ns)`` on the trace's timeline to analyse instead of the detected
        steady-state window.
    config
        Rule thresholds (:class:`DiagnoseConfig`).

    Returns
    -------
    Diagnosis
        ``.findings`` (one row per finding: ``category``, ``severity``, ``time_ns``,
        ``share``, ``title``, ``evidence``, ``advice``, ``next``), ``.window``,
        ``.evidence(i)``, ``.to_json()``, ``.to_markdown()``.
    """
    from tracekit.diagnosis.context import Context
    from tracekit.diagnosis.rules_comm import COMM_RULES, prepare_comm
    from tracekit.diagnosis.rules_data import DATA_RULES
    from tracekit.diagnosis.rules_gpu import GPU_RULES
    from tracekit.diagnosis.rules_host import HOST_RULES, low_gpu_utilization
    from tracekit.diagnosis.window import search_window

    cfg = config or DiagnoseConfig()
    tr = _open(trace)
    if hasattr(tr, "kernels_across_ranks"):  # reduced per rank on Dask: no raw rows here
        from tracekit.diagnosis.reduced import diagnose_reduced

        return diagnose_reduced(tr, cfg, _trace_name(tr))
    ctx = Context(tr, cfg, ncu=_open(ncu) if ncu is not None else None, model=model)
    ctx.prepare_reads()
    if ctx.kernel_count == 0 and ctx.graphs.height == 0:  # no GPU compute: say that, not host_bound
        lo, hi = ctx._capture_span()
        return Diagnosis(_trace_name(tr), Window(lo, hi, "whole_trace", "no kernels in the trace: the whole capture"), [_no_kernels(ctx)],
                         structure=ctx.structure)
    if window is not None:
        full = Window(int(window[0]), int(window[1]), "given", "window given by the caller")
    else:
        full = search_window(ctx)
    ctx.full_window = full
    ctx.window = full.analysed()
    ctx.rules_read_ops = True
    if ctx.by_column is not None:
        # a big export's generation phases and NCCL matching before the rules: their work over
        # every operation or call then runs beside the window's tables only, not beside what
        # the rules keep (h1x, pages returned at once: the phases' peak 386 → 365 MiB from
        # this order alone)
        ctx.phases  # noqa: B018
        prepare_comm(ctx)
        ctx.keep_window_nvtx()
    from tracekit.diagnosis.rules_coverage import untraced_work

    # before the rules (its finding still goes after theirs): it compares every operation
    # with the GPU metric samples, which beside the window's tables was the run's peak
    # (issue 44: 1 M kernels, 391 MiB then)
    coverage = untraced_work(ctx)
    findings: list[Finding] = []
    for rule in (*HOST_RULES, *GPU_RULES, *DATA_RULES, *COMM_RULES):
        findings.extend(rule(ctx))
    explained = sum(
        f.time_ns or 0 for f in findings if f.category in ("host_bound", "launch_bound", "graph_launch", "sync_stall", "pageable_memcpy")
    )
    findings.extend(low_gpu_utilization(ctx, explained))
    if model is not None:
        from tracekit.diagnosis.rules_model import model_findings

        findings.extend(model_findings(ctx))
    findings.extend(coverage)
    from tracekit.diagnosis.rules_comm import straggler_leads

    straggler_leads(ctx, findings)
    if ctx.structure.kind == "microbenchmark":
        _as_benchmark(findings)
    findings.extend(_missing(ctx))
    if full.sampled:  # the rules saw a sample of the steady state: scale what it costs
        for f in findings:
            if f.time_ns is not None and f.category != "warmup":
                f.time_ns = round(f.time_ns * full.scale)
    _cap_at_window(findings, full)
    return Diagnosis(_trace_name(tr), full, findings, phases=ctx.phases, gpu_time=_gpu_time(ctx), structure=ctx.structure,
                     training=ctx.training, periodic=ctx.periodic, training_steps=ctx.training_steps)


#: Findings about the host's pace, which a microbenchmark sets by design (it waits for each
#: repetition to time it).
_BENCHMARK_PACED = ("host_bound", "launch_bound", "sync_stall", "low_gpu_utilization")


#: What to do about a microbenchmark's idle time between repetitions.
BENCHMARK_ADVICE = (
    "Nothing to fix in the program being measured: a host timer around each synchronised repetition counts launch and "
    "synchronisation with the kernels. For the kernels' own time read their durations (the run line lists each timed "
    "kernel's median; `tracekit stats -r cuda_gpu_kern_sum`) or time with CUDA events over many queued repetitions "
    "(triton.testing.do_bench, torch.utils.benchmark); a benchmark of the end-to-end call is right to include it."
)


def _as_benchmark(findings: list[Finding]) -> None:
    """In a microbenchmark the GPU idles between repetitions because the loop waits for each
    one: the host-pace findings stay, as ``info``, saying so; their time is what each
    repetition's measured time holds besides the kernels."""
    for f in findings:
        if f.category in _BENCHMARK_PACED and f.severity != "info":
            f.severity = "info"
            f.title = ("A microbenchmark waits for each repetition, so the GPU idles between them by design; the time it "
                       f"measures per repetition holds this too: {f.title}")
            f.advice = BENCHMARK_ADVICE


def _gpu_time(ctx: Any) -> Any:
    """``Diagnosis.gpu_time``: the analysed window's busy time per GPU (``Context.busy_w``) and,
    when the trace communicates, its communication not overlapped by compute
    (``overlap_breakdown``, as the communication rules read it)."""
    import polars as pl

    from tracekit.diagnosis.rules_comm import _breakdown

    busy = ctx.busy_w
    if busy.height == 0:
        return busy
    keys = [*ctx.rk, "device_id"]
    out = busy.with_columns(pl.lit(ctx.window.duration_ns, pl.Int64).alias("window_ns"))
    br = _breakdown(ctx)
    if br.height and "communication_only_ns" in br.columns:
        out = out.join(br.select(*keys, "communication_only_ns"), on=keys, how="left")
    return out.select(*keys, "window_ns", *[c for c in out.columns if c not in (*keys, "window_ns")])


def _cap_at_window(findings: list[Finding], window: Window) -> None:
    """No finding claims more time than its window lasts: a rule whose estimate sums over
    GPUs or collectives that ran at once can pass it. Such a finding keeps the window's length
    as its time at stake (share 1.0) and says that its own sum was larger."""
    span = window.end_ns - window.start_ns
    if span <= 0:
        return
    for f in findings:
        if f.category == "warmup" or f.time_ns is None or f.time_ns <= span:
            continue
        f.title = f"{f.title} (summed {f.time_ns / span:.1f}× the window over GPUs or overlapping events: capped at the window)"
        f.time_ns = span
        f.share = 1.0
