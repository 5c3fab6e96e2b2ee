"""The inputs every rule shares, computed once per diagnosis from the existing analyses."""

from __future__ import annotations

import logging
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from tracekit.analysis._frames import gpu_ops, interval_union, rows_between, rows_where, within_any
from tracekit.analysis.attribution import launch_info, nvtx_overlapping
from tracekit.analysis.gpu_time import idle_gaps
from tracekit.diagnosis.config import DiagnoseConfig
from tracekit.diagnosis.ops_by_column import KERNEL_COLUMNS, OpsByColumn, by_column
from tracekit.diagnosis.result import Window
from tracekit.nsys.readers import gathered, one_value_columns

if TYPE_CHECKING:
    from tracekit.analysis.run.structure import RunStructure

__all__ = ["Context"]


log = logging.getLogger(__name__)

#: Generation phases are looked for on at most this many GPU operations (their launch join is
#: of every operation; the rules join only the window's).
PHASES_MAX_OPS = 2_000_000
#: Without a prefill/decode/layer NVTX range or graph replays, phases are looked for (in the
#: kernel sequence) only on traces of at most this many operations.
PHASES_ANY_OPS = 200_000
#: Memory the phases take per GPU operation and CUDA call, and per NVTX range (measured on a
#: 310 k-operation, 766 k-call, 65 k-range export: +61 MB for the launch join, +126 MB for the
#: steps with the range tree's paths; rounded up).
PHASES_BYTES_PER_ROW = 256
PHASES_BYTES_PER_RANGE = 2048
#: Memory the run's structure takes per GPU operation (the busiest GPU's operations sorted, its
#: name codes and loop arrays, the forward passes' masks), and the columns it reads.
STRUCTURE_BYTES_PER_OP = 200
_STRUCTURE_COLUMNS = ("device_id", "start_ns", "end_ns", "duration_ns", "name", "correlation_id")

#: The columns of the big event tables that the rules and the analyses they call read. Of a
#: single export only these are read (``NsysTrace.table(name, columns)``, not kept on the trace):
#: mangled kernel names, launch configurations, graph ids, return values and call chains are
#: most of these tables' bytes and no rule looks at them. A table the trace already holds is
#: used as it is; with ``ncu=`` the kernels are read whole (the ncu match uses launch configs).
_COLUMNS: dict[str, tuple[str, ...]] = {
    "kernels": KERNEL_COLUMNS,
    "cuda_api": ("pid", "tid", "global_tid", "start_ns", "end_ns", "duration_ns", "name", "api",
                 "correlation_id"),
    # what the iteration search, the range tree, NCCL ranges and layer memory read: not the
    # payloads, colours, categories and JSON (over half of the table's bytes)
    "nvtx": ("pid", "tid", "global_tid", "event_type_id", "start_ns", "end_ns", "duration_ns", "name",
             "domain", "domain_id", "end_global_tid", "range_id"),
}


#: The operation columns the generation phases read (with the launch's ``global_tid`` and
#: ``api_start_ns``, and ``rank`` of a trace set).
_PHASE_OP_COLUMNS = ("pid", "global_pid", "device_id", "correlation_id", "start_ns", "end_ns", "duration_ns", "name",
                     "op_kind")
#: Of those, the launch join's keys (not needed once the launch columns are there).
_JOIN_KEYS = ("pid", "global_pid", "correlation_id")


#: GPU metrics are read for their activity (:func:`activity_samples`) only from an export with
#: at most this many rows of them.
MAX_METRIC_ROWS = 5_000_000


def activity_samples(trace: Any) -> pl.DataFrame:
    """The samples :func:`~tracekit.analysis.metrics.metric_activity` reads (its
    ``DEFAULT_METRICS``), read with a ``WHERE`` on their metric ids from an export: a capture at
    10 kHz holds 20–30 metrics per sample, so the whole ``gpu_metrics`` table would be several
    times larger (4.66 M rows and ~450 MiB on the 1 M-kernel benchmark export). A trace set, or
    a trace whose table is loaded already, gives its ``gpu_metrics``. Empty for an export
    without GPU metrics or with more than :data:`MAX_METRIC_ROWS` rows of them."""
    from tracekit.analysis.metrics import DEFAULT_METRICS

    db = getattr(trace, "db", None)
    if db is not None and (not db.has_table("GPU_METRICS") or db.row_count("GPU_METRICS") > MAX_METRIC_ROWS):
        return pl.DataFrame()
    loaded = getattr(trace, "is_loaded", None)
    if db is None or (loaded is not None and loaded("gpu_metrics")):
        metrics = getattr(trace, "gpu_metrics", None)
        return metrics if isinstance(metrics, pl.DataFrame) else pl.DataFrame()
    from tracekit.nsys.gpu_metrics import gpu_metric_samples

    return gpu_metric_samples(db, list(DEFAULT_METRICS))


def activity_ops(trace: Any) -> pl.DataFrame:
    """The traced GPU work :func:`~tracekit.analysis.metrics.metric_activity` compares the
    metric samples with: each kernel's, copy's and memset's and each CUDA graph launch traced
    whole's GPU (``rank`` of a trace set), start and end (ns); a damaged export's implausible
    ends (``INT64_MAX``) left out. Only those columns are read of an export."""
    from tracekit.analysis.graphs import graph_trace_of, whole_graphs
    from tracekit.nsys.readers import implausible_end

    cols = ["device_id", "start_ns", "end_ns"]
    parts = [trace.table(t, cols) if hasattr(trace, "db") else getattr(trace, t) for t in ("kernels", "memcpys", "memsets")]
    graphs = whole_graphs(graph_trace_of(trace))
    if graphs is not None:
        parts.append(graphs)
    keep = [c for c in ("rank", *cols) if all(c in p.columns for p in parts)]
    ops = pl.concat([p.select(keep) for p in parts], how="vertical_relaxed")
    return ops.filter(~implausible_end()) if ops.height else ops


def _table(trace: Any, name: str, *, whole: bool = False) -> pl.DataFrame:
    try:
        if not whole and name in _COLUMNS and hasattr(trace, "is_loaded") and not trace.is_loaded(name):
            return trace.table(name, _COLUMNS[name])  # type: ignore[no-any-return]
        return getattr(trace, name)  # type: ignore[no-any-return]
    except AttributeError:
        return pl.DataFrame()




def _release(source: Any) -> None:
    """Let a column source drop the column it keeps from its last read (600 MB on 76 M calls)
    before the next big step."""
    release = getattr(source, "release", None)
    if release is not None:
        release()


class Context:
    """One trace (or trace set), its steady-state window and the frames rules read.

    Frames named ``*_w`` hold the rows inside the window: GPU operations and API calls that
    start in ``[window.start_ns, window.end_ns)``, idle gaps clipped to it.

    Of a single export with a big kernel table (:func:`~tracekit.diagnosis.ops_by_column.by_column`)
    the kernel and operation tables are never built whole: :attr:`by_column` answers the
    filters the rules need with the same rows, a column at a time.
    """

    def __init__(self, trace: Any, config: DiagnoseConfig, *, ncu: Any = None, model: Any = None) -> None:
        from tracekit.runs import require_one_run

        require_one_run(trace, "the diagnosis")  # reports opened side by side are not one job
        self.trace = trace
        self.config = config
        self.ncu = ncu
        self.model = model
        self.window: Window = Window(0, 0, "whole_trace", "")
        #: The whole steady-state window; ``window`` is the part the rules analyse (a sample of
        #: it on big traces, else the same).
        self.full_window: Window = self.window
        self._near_kernels: pl.DataFrame = pl.DataFrame()
        #: Every kernel, of the read that built :attr:`ops` from a big export (its kernel rows
        #: share these columns); ``None`` until then.
        self._all_kernels: pl.DataFrame | None = None
        #: Set by :func:`~tracekit.diagnosis.diagnose` before its rules, which read every
        #: operation on a window that is not sampled: :attr:`kernels_w` then comes from the
        #: read that builds :attr:`ops`. Elsewhere (the run's structure alone) it reads the
        #: window's kernels only.
        self.rules_read_ops = False

    def prepare_reads(self) -> None:
        """Count the API calls first (every diagnosis needs it): on a cold column cache this
        puts the API table's columns into it (~1 GB of transient reads on 20 M calls) while no
        kernel table is held yet, instead of on top of it; on a big export the same for the
        kernel table's columns, before NVTX is read."""
        self.api_count  # noqa: B018
        if self.by_column is not None:
            self.by_column.fill()

    # -- whole-trace tables -------------------------------------------------------------
    @cached_property
    def by_column(self) -> OpsByColumn | None:
        """The operations of a big single export read a column at a time, or ``None``
        (small traces, trace sets, a kernel table already loaded, ``ncu=`` given)."""
        return None if self.ncu is not None else by_column(self.trace)

    @cached_property
    def kernels(self) -> pl.DataFrame:
        """The kernel table (:data:`_COLUMNS`' columns). Of a big export the rules never ask
        for it (:attr:`kernel_count`, :attr:`kernel_columns`, :meth:`kernel_names` instead);
        asking reads it whole."""
        return _table(self.trace, "kernels", whole=self.ncu is not None)

    @cached_property
    def kernel_count(self) -> int:
        """Number of kernels."""
        big = self._big_kernels
        return big.kernel_rows if big is not None else self.kernels.height

    @cached_property
    def kernel_columns(self) -> list[str]:
        big = self._big_kernels
        return list(KERNEL_COLUMNS) if big is not None else self.kernels.columns

    def kernel_names(self, column: str) -> pl.Series:
        """The distinct values of kernel column ``column`` (``name`` or ``short_name``)."""
        big = self._big_kernels
        return big.distinct(column) if big is not None else self.kernels[column].unique()

    @cached_property
    def memcpys(self) -> pl.DataFrame:
        return _table(self.trace, "memcpys")

    @cached_property
    def memsets(self) -> pl.DataFrame:
        return _table(self.trace, "memsets")

    @cached_property
    def graphs(self) -> pl.DataFrame:
        """CUDA graph launches traced whole (``graph_trace``): GPU work like kernels."""
        return _table(self.trace, "graph_trace")

    @cached_property
    def graph_launches(self) -> pl.DataFrame:
        """One row per CUDA graph launch (:func:`~tracekit.analysis.graphs.graph_launches`):
        from :attr:`graphs` (traced whole), or from the graph-node kernels, memcpys and
        memsets of a per-node capture (read only when the export records graph nodes)."""
        from tracekit.analysis.graphs import graph_launches, node_operations

        nodes = node_operations(self.trace)
        return graph_launches(self.graphs, self.api_source, kernels=nodes.get("kernels"), memcpys=nodes.get("memcpys"),
                              memsets=nodes.get("memsets"))

    @cached_property
    def structure(self) -> RunStructure:
        """The run's structure (:mod:`tracekit.analysis.run.structure`): iterations (launch columns
        only for the operations of the measured steps, the operations a column at a time on a
        big export), warm-up, segments, the kind of run, and, for a generation or a server, its
        token steps and requests (:func:`~tracekit.analysis.run.phases.generation_steps`; of a
        trace set and where :meth:`_phases_fit` says they do not fit, the busiest GPU's forward
        passes when it has them)."""
        from tracekit.analysis.run.phases import forward_steps, generation_steps
        from tracekit.analysis.run.structure import Iterations, build_structure, find_iterations

        if self.kernel_count == 0 and self.graphs.height == 0:
            return self._structure_without_kernels(Iterations, build_structure)
        found, s = self._read_structure(find_iterations, build_structure, None)
        if s.kind == "microbenchmark" and s.total and not self.rk:
            # a loop timing a few kernels inside a larger program is its autotuning (Inductor's
            # max-autotune, Triton's do_bench) or a warm-up benchmark: when a training, an
            # inference or a generation runs after it (after the loop, or after the program's
            # last module load: autotuning goes on while the compiler loads what it built),
            # that is the run, and the loop its start-up
            for cut in (s.end_ns, self._last_module_load()):
                if cut is None or cut < s.end_ns:
                    continue
                later_found, later = self._read_structure(find_iterations, build_structure, cut)
                if later.total and later.kind != "microbenchmark" and (
                        later.kind != "unknown" or later.token_evidence is not None or later_found.reading is not None):
                    later.evidence = (*later.evidence, f"before it, {s.total:,} repetitions of a loop of a few kernels "
                                      f"({s.evidence[0][:120]}) while the program started: autotuning or a benchmark of its own, "
                                      "counted in start-up")
                    found, s = later_found, later
                    break
        if s.kind in ("training", "microbenchmark", "inference"):
            return s
        reading = found.reading if found.reading is not None and found.reading.tokens is not None else None
        if self.rk:
            # ranks: the busiest rank's forwards are the run's token steps (tensor-parallel ranks
            # run the same forwards); without them no generation is read across ranks
            if reading is None:
                return s
            s = s.with_generation(forward_steps(reading), warmup_factor=self.config.warmup_factor)
            s.evidence = (*s.evidence, "requests read from the busiest rank's forward passes (tensor-parallel ranks run the "
                          "same ones; data-parallel ranks serve their own)")
            return s
        if not self._phases_fit():
            if reading is None:
                return s
            # the forwards' steps need no launch join: the same steps as generation_steps gives
            # a trace without NVTX step ranges or graph replays, at any size
            steps = forward_steps(reading)
        else:
            steps = generation_steps(self._phase_ops, self.nvtx, self.graph_launches, tokens=s.token_evidence is not None,
                                     forwards=reading, labels=self.name_labels())
        return s.with_generation(steps, warmup_factor=self.config.warmup_factor, nvtx=self.nvtx)

    @cached_property
    def module_loads(self) -> pl.DataFrame:
        """The capture's module-load calls (``cuModuleLoad*``, ``cuLibraryLoad*``: a JIT compiler
        loading what it built; :data:`tracekit.analysis.run.compile.LOAD_CALLS`): ``start_ns``,
        ``end_ns``; read once from the lazy API table (empty for a trace set)."""
        from tracekit.analysis.run.compile import LOAD_CALLS

        if not hasattr(self.trace, "scan") or self.rk:
            return pl.DataFrame(schema={"start_ns": pl.Int64, "end_ns": pl.Int64})
        if self.trace.is_loaded("cuda_api"):
            return self.cuda_api.filter(pl.col("name").str.contains(LOAD_CALLS)).select("start_ns", "end_ns")
        from tracekit.nsys.readers import cuda_api_named

        return cuda_api_named(self.trace.db, self.trace.strings, LOAD_CALLS)

    def _last_module_load(self) -> int | None:
        """The start (ns) of the capture's last module-load call, or ``None``."""
        value = self.module_loads["start_ns"].max()
        return int(value) if value is not None else None  # type: ignore[arg-type]

    def _refuse_structure_without_room(self) -> None:
        """One error naming the export when reading the run's structure (the busiest GPU's
        operations sorted, its loops and forward passes: :data:`STRUCTURE_BYTES_PER_OP` each)
        would not fit in the memory left: polars aborts the process when an allocation fails
        (a cold ``summary`` of a 300 k-kernel export with 400 MB of address space left)."""
        path = getattr(self.trace, "path", None)
        if path is None:
            return
        from tracekit.nsys.database import ensure_memory

        n_ops = self.kernel_count
        ensure_memory(Path(path), "CUPTI_ACTIVITY_KIND_KERNEL", n_ops, len(_STRUCTURE_COLUMNS), STRUCTURE_BYTES_PER_OP * n_ops,
                      "reading the run's structure from")

    def _read_structure(self, find: Any, build: Any, after_ns: int | None) -> tuple[Any, RunStructure]:
        """:func:`~tracekit.analysis.run.structure.find_iterations` and
        :func:`~tracekit.analysis.run.structure.build_structure` of the operations (of those
        starting at or after ``after_ns``, when given; the capture's span is kept, so what
        comes before is start-up)."""
        get = self.ops_for_window
        graphs = self.graph_launches
        if after_ns is not None:
            cut = int(after_ns)

            def get(columns: list[str]) -> pl.DataFrame:
                frame = self.ops_for_window(list(dict.fromkeys([*columns, "start_ns"])))
                return frame.filter(pl.col("start_ns") >= cut).select([c for c in columns if c in frame.columns])

            if graphs is not None and graphs.height and "start_ns" in graphs.columns:
                graphs = graphs.filter(pl.col("start_ns") >= cut)
        self._refuse_structure_without_room()
        found = find(get, self.launched_ops, self.nvtx, self.config, graph_launches=graphs, labels=self.name_labels, grid=self.kernel_grid)
        lo, hi = self._capture_span()
        total = int(get(["duration_ns"])["duration_ns"].sum() or 0)
        return found, build(found, self.config, trace_start_ns=lo, trace_end_ns=hi, window_ops=self._classify_ops, total_gpu_ns=total,
                            nvtx=self.nvtx)

    def name_labels(self) -> pl.Series | None:
        """The text of the integer name codes :meth:`ops_for_window` gives on a big export
        (``None`` when it gives text)."""
        big = self._big
        return big.name_labels if big is not None else None

    def kernel_grid(self, rows: pl.DataFrame) -> pl.Series:
        """``grid_x`` of the kernels in ``rows`` (``device_id``, ``correlation_id``,
        ``start_ns``), null where not found."""
        keys = [c for c in ("device_id", "correlation_id", "start_ns") if c in rows.columns]
        if rows.height == 0 or "correlation_id" not in keys:
            return pl.Series("grid_x", [None] * rows.height, dtype=pl.Int64)
        ids = rows["correlation_id"].drop_nulls().unique()
        big = self._big_kernels
        want = (*keys, "grid_x")
        if big is not None:
            found = big.kernels_where(pl.col("correlation_id").is_in(ids.implode()), want)
        elif "grid_x" in self.kernels.columns:
            found = self.kernels.filter(pl.col("correlation_id").is_in(ids.implode())).select(want)
        else:
            found = self.trace.table("kernels", list(want)).filter(pl.col("correlation_id").is_in(ids.implode())) if hasattr(
                self.trace, "table") else pl.DataFrame()
        if found.height == 0 or "grid_x" not in found.columns:
            return pl.Series("grid_x", [None] * rows.height, dtype=pl.Int64)
        found = found.unique(subset=keys, keep="first")
        return rows.with_row_index("_r").join(found.select(*keys, "grid_x"), on=keys, how="left").sort("_r")["grid_x"]

    def _structure_without_kernels(self, iterations: Any, build: Any) -> RunStructure:
        """The structure of a capture without kernels: no iterations, and what the GPU metrics
        saw instead (the SMs active in a process the capture did not follow)."""
        from tracekit.diagnosis.result import fmt_ns

        lo, hi = self._capture_span()
        s = build(iterations(pl.DataFrame(), 0, "none", "the capture holds no kernels"), self.config, trace_start_ns=lo, trace_end_ns=hi)
        act = self.metric_activity(None)
        if act.height and int(act["active_ns"].sum()) > 0:
            top = act.sort("active_ns", descending=True).row(0, named=True)
            s.evidence = (f"yet GPU {top['device_id']}'s metrics show its SMs active {fmt_ns(top['active_ns'])} "
                          f"({top['active_share']:.0%} of {fmt_ns(top['span_ns'])}): the work ran in a process the capture did not "
                          "follow (tracekit diagnose says how to capture it)",)
        return s

    @cached_property
    def activity_samples(self) -> pl.DataFrame:
        """:func:`activity_samples` of the trace, read once."""
        return activity_samples(self.trace)

    def metric_activity(self, ops: pl.DataFrame | None) -> pl.DataFrame:
        """:func:`~tracekit.analysis.metrics.metric_activity` of the trace's GPU metrics against
        ``ops``; empty without metrics or with more than :data:`MAX_METRIC_ROWS` of them."""
        from tracekit.analysis.metrics import metric_activity

        metrics = self.activity_samples
        if metrics.height == 0:
            return pl.DataFrame()
        return metric_activity(metrics, ops)

    def _capture_span(self) -> tuple[int, int]:
        """The capture's start and end (ns): the export's time window, else the span of the
        GPU operations (a trace set)."""
        meta = getattr(self.trace, "meta", None)
        lo, hi = getattr(meta, "start_ns", None), getattr(meta, "end_ns", None)
        if lo is not None and hi is not None:
            return int(lo), int(hi)
        times = self.ops_for_window(["start_ns", "end_ns"])
        if times.height == 0:
            return 0, 0
        return int(times["start_ns"].min()), int(times["end_ns"].max())  # type: ignore[arg-type]

    #: Without iterations, the kind of run is read from the whole trace only up to this many
    #: kernels (training is told by its backward kernels in a slice of a run, too).
    CLASSIFY_WHOLE_MAX = 2_000_000

    def _classify_ops(self, start_ns: int, end_ns: int) -> pl.DataFrame:
        """The GPU operations (text names) starting in ``[start_ns, end_ns)`` (the structure
        asks for a few steady iterations, or for the whole trace when it has none: then only
        up to :data:`CLASSIFY_WHOLE_MAX` kernels), for :func:`~tracekit.analysis.run.structure.classify`."""
        if self.kernel_count > self.CLASSIFY_WHOLE_MAX and (start_ns, end_ns - 1) == self._capture_span():
            return pl.DataFrame()
        return self.ops_where((pl.col("start_ns") >= start_ns) & (pl.col("start_ns") < end_ns)).select(
            [c for c in ("name", "op_kind", "start_ns", "duration_ns", "device_id", "rank", "bytes") if c in self.op_columns])

    @cached_property
    def training_steps(self) -> pl.DataFrame:
        """The steady training steps taken apart (:func:`tracekit.analysis.run.training.
        training_phases` over the analysed window, per GPU): forward, backward and optimizer per
        step with their compute and exposed communication, read from the thread that launched
        each operation when autograd's thread is known, and the periodic work set apart; empty
        when the run is not training."""
        from tracekit.analysis.attribution import launch_info
        from tracekit.analysis.comm import categorize_ops
        from tracekit.analysis.run.training import PERIODIC, autograd_threads, training_phases

        s = self.structure
        if s.kind != "training" or self.kernels_w.height == 0:
            return pl.DataFrame()
        w = self.window
        inside = (pl.col("start_ns") >= w.start_ns) & (pl.col("start_ns") < w.end_ns)
        steps = []
        for dl in s.loops:  # every GPU's own steps
            it = dl.iterations.slice(dl.warmup).filter(inside)
            steps.append(it.select(*[pl.lit(v).alias(k) for k, v in dl.keys.items()], pl.col("iteration").alias("step"),
                                   "start_ns", "end_ns"))
        if not steps and "warmup" not in s.iterations.columns:  # training told by its kernels, no iterations
            return pl.DataFrame()
        if not steps:  # NVTX steps: each step's span on every GPU of the window
            its = s.iterations.filter(~pl.col("warmup")).select(pl.col("iteration").alias("step"), pl.col("w_start").alias("start_ns"),
                                                                   pl.col("w_end").alias("end_ns")).filter(inside)
            devices = self.kernels_w.select([*self.rk, "device_id"]).unique()
            steps.append(devices.join(its, how="cross"))
        frame = pl.concat(steps, how="vertical_relaxed")
        if frame.height == 0:
            return pl.DataFrame()
        ops = categorize_ops(self.kernels_w, self.memcpys_w if self.memcpys_w.height else None, None, None)
        threads = getattr(self.trace, "threads", None)
        cpu_ops = getattr(self.trace, "cpu_ops", None) if "cpu_ops" in dir(type(self.trace)) else None
        tids = autograd_threads(threads, cpu_ops if isinstance(cpu_ops, pl.DataFrame) else None) if isinstance(threads, pl.DataFrame) else []
        if tids and self.api_count and "correlation_id" in ops.columns:
            ops = launch_info(ops, self.api_source, columns=("global_tid", "api_start_ns"))
        steps = training_phases(ops, frame, autograd_tids=tids)
        if steps.height and self.rk == []:
            per = steps.filter(pl.col("phase").is_in(PERIODIC))
            s.periodic = per.select(pl.col("phase").alias("what"), "start_ns", "end_ns", pl.col("window_ns").alias("duration_ns"),
                                    "step").sort("start_ns") if per.height else pl.DataFrame()
        return steps

    @cached_property
    def training(self) -> pl.DataFrame:
        """Per phase, the median steady step (:func:`tracekit.analysis.run.training.
        training_summary` of :attr:`training_steps`); empty when the run is not training."""
        from tracekit.analysis.run.training import training_summary

        steps = self.training_steps
        return training_summary(steps) if steps.height else pl.DataFrame()

    @cached_property
    def periodic(self) -> pl.DataFrame:
        """The periodic work between a training run's steps (evaluations, checkpoint saves:
        :func:`tracekit.analysis.run.training.periodic_summary`); empty when none was found."""
        from tracekit.analysis.run.training import periodic_summary

        steps = self.training_steps
        return periodic_summary(steps) if steps.height else pl.DataFrame()

    @cached_property
    def phases(self) -> pl.DataFrame:
        """The generation phases of the steady requests (:func:`tracekit.analysis.run.phases.
        phase_summary` of ``structure.steady_steps``), with the model's MFU/MBU/efficiency
        when ``model`` is given; empty when the run is no generation or server, and for a
        trace set."""
        from tracekit.analysis.run.phases import phase_summary

        steps = self.structure.steady_steps
        if steps.height == 0:
            return pl.DataFrame()
        summary = phase_summary(steps)
        if self.model is None or summary.height == 0:
            return summary
        from tracekit.model.gpu import gpu_of
        from tracekit.model.phases import phase_efficiency

        return phase_efficiency(summary, self.model, gpu=gpu_of(self.trace, None))

    def _phase_ops(self, columns: list[str] | None = None) -> pl.DataFrame:
        """The operations :func:`~tracekit.analysis.run.phases.generation_steps` reads, with their
        launching thread and call start: :attr:`ops_with_launch` when a rule built it, else a
        join of only those columns (1 M kernels: the whole join's other columns and call names
        were ~0.2 GB that only this step held)."""
        if "ops_with_launch" in self.__dict__:
            return self.ops_with_launch
        from tracekit.analysis.attribution import launch_info

        wanted = _PHASE_OP_COLUMNS if columns is None else [*_JOIN_KEYS, *columns]
        keep = [c for c in dict.fromkeys((*self.rk, *wanted)) if c in self.op_columns]
        # of a big export read a column at a time: names as integer codes (the period search
        # compares names only for equality), and the launch columns from the column cache
        # when kept there (the keys they were joined on are then not read)
        big = self._big
        if big is not None and not self.rk and self.api_count:
            launched = big.narrow_launched([c for c in keep if c not in _JOIN_KEYS], self.api_source)
            if launched is not None:
                return launched
        ops = big.narrow(keep) if big is not None else self.ops.select(keep)
        if self.api_count == 0 or "correlation_id" not in ops.columns:  # no launch to join
            return ops.with_columns(pl.lit(None, pl.Int64).alias("global_tid"), pl.lit(None, pl.Int64).alias("api_start_ns"))
        return launch_info(ops, self.api_source, columns=("global_tid", "api_start_ns"))

    def _phases_fit(self) -> bool:
        """Whether the phases' launch join of every operation (the rules use only the
        window's) is affordable: at most :data:`PHASES_MAX_OPS` operations and room for about
        :data:`PHASES_BYTES_PER_ROW` per operation and call (measured: polars aborted building
        it on a 300 k-kernel export with 400 MB of address space left); else the phases are
        left out, with a note in the log. Free when the join was already built."""
        if "ops_with_launch" in self.__dict__:
            return True
        from tracekit.analysis.layers import DEFAULT_LAYER_PATTERN
        from tracekit.analysis.run.phases import DECODE_PATTERN, PREFILL_PATTERN
        from tracekit.nsys.database import free_memory

        n_ops = self.ops.height if self._big is None else self.kernel_count
        names = self.nvtx["name"].drop_nulls() if self.nvtx.height and "name" in self.nvtx.columns else pl.Series([], dtype=pl.Utf8)
        hint = "(?i)" + "|".join((PREFILL_PATTERN, DECODE_PATTERN, DEFAULT_LAYER_PATTERN))
        if not (self.graphs.height or (names.len() and bool(names.str.contains(hint).any())) or n_ops <= PHASES_ANY_OPS):
            return False  # nothing suggests a generation: no prefill/decode/layer range, no graph replays
        if n_ops > PHASES_MAX_OPS:
            log.info("generation phases left out: %d GPU operations (more than %d)", n_ops, PHASES_MAX_OPS)
            return False
        free = free_memory()
        need = PHASES_BYTES_PER_ROW * (n_ops + self.api_count) + PHASES_BYTES_PER_RANGE * self.nvtx.height
        if free is not None and need > free:
            log.info("generation phases left out: they need about %d MB and %d MB is left", need >> 20, free >> 20)
            return False
        return True

    @cached_property
    def cuda_api(self) -> pl.DataFrame:
        return _table(self.trace, "cuda_api")

    @cached_property
    def api_source(self) -> Any:
        """The CUDA API calls as a column source (``source[name]``, ``columns``,
        ``gather_columns``): of a single export not yet loaded, :data:`_COLUMNS`'s columns read
        one at a time and not kept (``NsysTrace.columns_on_demand``), so that the launch join
        and the window's calls never hold the whole API table; else :attr:`cuda_api`."""
        if "cuda_api" in self.__dict__ or not hasattr(self.trace, "columns_on_demand") or self.trace.is_loaded("cuda_api"):
            return self.cuda_api
        return self.trace.columns_on_demand("cuda_api", list(_COLUMNS["cuda_api"]))

    @cached_property
    def api_count(self) -> int:
        """Number of CUDA API calls in the trace."""
        src = self.api_source
        if isinstance(src, pl.DataFrame):
            return src.height
        n = len(src["correlation_id"])
        _release(src)
        return n

    @cached_property
    def nvtx(self) -> pl.DataFrame:
        return _table(self.trace, "nvtx")

    def keep_window_nvtx(self) -> None:
        """On a sampled window, keep of :attr:`nvtx` only the ranges that overlap the window
        (and those without an end), once the run's structure, its phases and the NCCL
        matching have read them all: the rules read no other (a range per kernel, 2 M
        kernels: 163 MB held to the end, a quarter of it now). Each row keeps its number in
        the whole table (:func:`~tracekit.analysis.attribution.nvtx_overlapping`): the
        memory-growth rule tells the step ranges, numbered over the whole table, from the
        ranges inside them by it."""
        nv = self.__dict__.get("nvtx")
        if nv is None or nv.height == 0 or not self.full_window.sampled or "end_ns" not in nv.columns:
            return
        w = self.window
        self.__dict__["nvtx"] = nvtx_overlapping(nv, w.start_ns, w.end_ns)

    @cached_property
    def rk(self) -> list[str]:
        return ["rank"] if "rank" in self.kernel_columns else []

    @cached_property
    def ops(self) -> pl.DataFrame:
        """Kernels, memcpys and memsets stacked (``gpu_ops``). Of a big export the rules
        filter it with :meth:`ops_where` instead; asking builds it whole."""
        if self._big is not None:
            ops, self._all_kernels = self._big.where_with_kernels(pl.lit(True))
            return ops
        return gpu_ops(self.kernels, self.memcpys, self.memsets, self.graphs)

    @property
    def _big_kernels(self) -> OpsByColumn | None:
        """:attr:`by_column` while :attr:`kernels` is not built."""
        return None if "kernels" in self.__dict__ else self.by_column

    @property
    def _big(self) -> OpsByColumn | None:
        """:attr:`by_column` while :attr:`ops` and :attr:`kernels` are not built."""
        return None if "ops" in self.__dict__ else self._big_kernels

    @cached_property
    def op_columns(self) -> list[str]:
        """Columns of :attr:`ops`."""
        return self._big.columns if self._big is not None else self.ops.columns

    def ops_where(self, expr: pl.Expr) -> pl.DataFrame:
        """``ops.filter(expr)``; of a big export without building :attr:`ops`."""
        big = self._big
        if big is None:
            return self.ops.filter(expr)
        return big.where(expr)

    def ops_for_window(self, columns: list[str]) -> pl.DataFrame:
        """``ops.select(columns)`` for :func:`~tracekit.diagnosis.window.steady_window`; of a
        big export with ``name`` as integer codes and read a column at a time."""
        present = [c for c in columns if c in self.op_columns]
        big = self._big
        return big.narrow(present) if big is not None else self.ops.select(present)

    @cached_property
    def ops_near(self) -> pl.DataFrame:
        """The operations that touch :attr:`_gap_span` or start in the sampled window: every
        row the window's filters and its gaps keep, in :attr:`ops`' order (all of :attr:`ops`
        when the window is not sampled)."""
        if not self.full_window.sampled:
            return self.ops
        lo, hi = self._gap_span
        w = self.window
        near = ((pl.col("end_ns") >= lo) & (pl.col("start_ns") <= hi)) | ((pl.col("start_ns") >= w.start_ns) & (pl.col("start_ns") < w.end_ns))
        big = self._big
        if big is None:
            return self.ops.filter(near)
        ops, self._near_kernels = big.where_with_kernels(near)  # the kernels of these rows: kernels_w's too
        return ops

    @cached_property
    def ops_with_launch(self) -> pl.DataFrame:
        if self.api_count == 0 or "correlation_id" not in self.ops.columns:
            return self.ops.with_columns(
                pl.lit(None, pl.Int64).alias("global_tid"), pl.lit(None, pl.Utf8).alias("api_name"),
                pl.lit(None, pl.Int64).alias("api_start_ns"),
            )
        return launch_info(self.ops, self.api_source)

    def launched_ops(self, ranges: pl.DataFrame | None = None) -> pl.DataFrame:
        """:attr:`ops_with_launch`, or with ``ranges`` (``start_ns``, ``end_ns``: CPU ranges,
        e.g. the sampled steps) only a part of it that holds at least every operation whose
        launching call starts inside one of them (``start <= call start <= end``), rows in
        :attr:`ops_with_launch`'s order and with its values (of a big export read a column at
        a time, without ``api_name``: :meth:`~tracekit.diagnosis.ops_by_column.OpsByColumn.launched_within`).

        The part is joined from the calls that start in a range and every call that shares
        a correlation id with one of them (so the join picks the same call as on the whole
        table): the launch columns of the other operations (millions on a big trace) are
        never built."""
        if ranges is None or "ops_with_launch" in self.__dict__ or self.api_count == 0 or "correlation_id" not in self.op_columns:
            return self.ops_with_launch
        big = self._big
        if big is not None and not self.rk:  # from the launch join kept in the column cache
            found = big.launched_within(ranges["start_ns"], ranges["end_ns"], self.api_source)
            if found is not None:
                return found
        api = self.api_source
        inside = within_any(api["start_ns"], ranges["start_ns"], ranges["end_ns"])
        ids = api["correlation_id"].filter(inside).unique()
        del inside
        _release(api)
        ops = self.ops_where(pl.col("correlation_id").is_in(ids.implode()))
        return launch_info(ops, self._calls_with_ids(ids))

    def _calls_with_ids(self, ids: pl.Series) -> pl.DataFrame:
        """The CUDA API calls (all of :attr:`api_source`'s columns, in table order) whose
        ``correlation_id`` is one of ``ids``."""
        api = self.api_source
        mask = api["correlation_id"].is_in(ids.implode()).fill_null(False)
        if isinstance(api, pl.DataFrame):
            return api.filter(mask)
        _release(api)
        return pl.DataFrame(api.gather_columns(list(api.columns), mask.arg_true()))

    @cached_property
    def ops_with_launch_w(self) -> pl.DataFrame:
        """:attr:`ops_with_launch` of the operations that start in the window; unless that
        table was built already, joined for these operations only (same rows, same values)."""
        if "ops_with_launch" in self.__dict__ or self.api_count == 0 or "correlation_id" not in self.op_columns:
            return self._in_window(self.ops_with_launch)
        ops = self.ops_w
        ids = ops["correlation_id"].drop_nulls().unique()
        if self.full_window.sampled:
            lo, hi = self._gap_span
            near_ops = ((pl.col("end_ns") >= lo) & (pl.col("start_ns") <= hi)).fill_null(False)  # api_near's test
            if ops.filter(~near_ops).height == 0:
                # every one of these operations is among those api_near took the calls of:
                # its calls with these ids are all there, in table order (no second read)
                near = self.api_near
                return launch_info(ops, near.filter(pl.col("correlation_id").is_in(ids.implode())))
        return launch_info(ops, self._calls_with_ids(ids))

    @cached_property
    def api_near(self) -> pl.DataFrame:
        """The CUDA API calls rules join with: all of them, or on a sampled window those that
        overlap :attr:`_gap_span` (the gaps that reach into the window) or launched an
        operation that runs in it. Without ``duration_ns`` (``end_ns - start_ns``, where a rule
        needs it): on k2m_a6's 3 M calls it was 24 MB held through every rule (issue 44)."""
        if not self.full_window.sampled or self.api_count == 0:
            return self.cuda_api.drop("duration_ns", strict=False)
        lo, hi = self._gap_span
        ops = self._ops_in_gap_span
        if "correlation_id" in ops.columns and self.memcpys_w.height and "correlation_id" in self.memcpys_w.columns:
            # the window's copies whatever their end (a damaged one is no GPU operation above):
            # pageable_memcpy reads their calls
            ops = pl.concat([ops.select("correlation_id"), self.memcpys_w.select("correlation_id")], how="vertical_relaxed")
        api = self.api_source
        if isinstance(api, pl.DataFrame):
            keep = (pl.col("end_ns") > lo) & (pl.col("start_ns") < hi)
            if "correlation_id" in api.columns and "correlation_id" in ops.columns:
                keep = keep | pl.col("correlation_id").is_in(ops["correlation_id"].unique().implode())
            return api.drop("duration_ns", strict=False).filter(keep)
        # one column at a time: the mask, then the kept rows of each column
        mask = api["end_ns"] > lo
        mask = mask & (api["start_ns"] < hi)
        if "correlation_id" in ops.columns:
            mask = mask | api["correlation_id"].is_in(ops["correlation_id"].unique().implode())
        rows = mask.fill_null(False).arg_true()
        del mask
        _release(api)
        return one_value_columns(gathered(api, [c for c in api.columns if c != "duration_ns"], rows))

    def _margin(self) -> tuple[int, int]:
        step = self.full_window.step_ns or 0
        return self.window.start_ns - max(step, 1_000_000), self.window.end_ns + max(step, 1_000_000)

    @cached_property
    def _gap_span(self) -> tuple[int, int]:
        """``(lo, hi)`` in ns: where the idle gaps that overlap the sampled window can begin
        and end. Per (``rank``,) device a gap into the window begins no earlier than the end
        of the device's last operation ending before the window, and a gap out of it ends at
        the start of its first operation starting after it; the span runs from the earliest
        of the first to the latest of the second (the margin's bound for a device with no
        operation there). The gaps' causes need only the calls in this span, not the
        margin's: a sample of one step of 500 k kernels held 9 M calls for its margin of a
        step on either side, 3 M for this span (issue 44)."""
        lo, hi = self._margin()
        keys = [*self.rk, "device_id"]
        ops = self.ops_for_window([*keys, "start_ns", "end_ns"]).filter((pl.col("end_ns") > lo) & (pl.col("start_ns") < hi))
        if ops.height == 0:
            return lo, hi
        w = self.window
        devices = ops.select(keys).unique().height
        before = ops.filter(pl.col("end_ns") <= w.start_ns).group_by(keys).agg(pl.col("end_ns").max())
        after = ops.filter(pl.col("start_ns") >= w.end_ns).group_by(keys).agg(pl.col("start_ns").min())
        if before.height == devices:
            lo = int(before["end_ns"].min())  # type: ignore[arg-type]
        if after.height == devices:
            hi = int(after["start_ns"].max())  # type: ignore[arg-type]
        return lo, hi

    @property
    def _ops_in_gap_span(self) -> pl.DataFrame:
        """The operations that touch :attr:`_gap_span` (the ones that bound its gaps included)."""
        lo, hi = self._gap_span
        return rows_where(self.ops_near, (pl.col("end_ns") >= lo) & (pl.col("start_ns") <= hi))

    @cached_property
    def gaps(self) -> pl.DataFrame:
        """``idle_gaps`` of the trace (each gap with its cause); on a sampled window, of the
        operations in :attr:`_gap_span` only (every gap that overlaps the window, with the
        same bounds and cause as over the whole trace)."""
        ops = self._ops_in_gap_span if self.full_window.sampled else self.ops_near
        if ops.height == 0:
            return pl.DataFrame()
        return idle_gaps(ops, self.api_near, min_gap_ns=self.config.min_gap_ns)

    # -- inside the window ---------------------------------------------------------------
    def _in_window(self, frame: pl.DataFrame, column: str = "start_ns") -> pl.DataFrame:
        if frame.height == 0 or column not in frame.columns:
            return frame
        return rows_between(frame, column, self.window.start_ns, self.window.end_ns)

    @cached_property
    def kernels_w(self) -> pl.DataFrame:
        big = self._big_kernels
        if big is None:
            return self._in_window(self.kernels)
        w = self.window
        inside = (pl.col("start_ns") >= w.start_ns) & (pl.col("start_ns") < w.end_ns)
        if self.full_window.sampled and "ops" not in self.__dict__:
            self.ops_near  # noqa: B018  (reads the kernels around the window once)
            return rows_between(self._near_kernels, "start_ns", w.start_ns, w.end_ns)
        if self.rules_read_ops and not self.full_window.sampled:
            self.ops  # noqa: B018  (the rules read every operation: one read of the kernels for both)
        if self._all_kernels is not None:
            return rows_between(self._all_kernels, "start_ns", w.start_ns, w.end_ns)
        return big.kernels_where(inside)

    @cached_property
    def memcpys_w(self) -> pl.DataFrame:
        return self._in_window(self.memcpys)

    @cached_property
    def ops_w(self) -> pl.DataFrame:
        return self._in_window(self.ops_near)

    @cached_property
    def api_w(self) -> pl.DataFrame:
        return self._in_window(self.api_near)

    @cached_property
    def gaps_w(self) -> pl.DataFrame:
        """Idle gaps overlapping the window, clipped to it (``duration_ns`` recomputed)."""
        g = self.gaps
        if g.height == 0:
            return g
        w = self.window
        g = rows_where(g, (pl.col("end_ns") > w.start_ns) & (pl.col("start_ns") < w.end_ns))
        return g.with_columns(
            pl.max_horizontal("start_ns", pl.lit(w.start_ns)).alias("start_ns"),
            pl.min_horizontal("end_ns", pl.lit(w.end_ns)).alias("end_ns"),
        ).with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("duration_ns"))

    @cached_property
    def busy_w(self) -> pl.DataFrame:
        """Per (``rank``,) ``device_id``: ``busy_ns`` (union of GPU work clipped to the window),
        ``idle_ns`` (window − busy) and ``utilization``; devices with no work in it are left out."""
        keys = [*self.rk, "device_id"]
        w = self.window
        ops = self.ops_near.select(*keys, "start_ns", "end_ns").filter(
            (pl.col("end_ns") > w.start_ns) & (pl.col("start_ns") < w.end_ns)).with_columns(
            pl.max_horizontal("start_ns", pl.lit(w.start_ns)).alias("start_ns"),
            pl.min_horizontal("end_ns", pl.lit(w.end_ns)).alias("end_ns"),
        )
        if ops.height == 0:
            return pl.DataFrame(schema={**{k: pl.Int64 for k in keys}, "busy_ns": pl.Int64, "idle_ns": pl.Int64, "utilization": pl.Float64})
        merged = interval_union(ops, keys)
        busy = merged.group_by(keys).agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("busy_ns"))
        return busy.with_columns(
            (pl.lit(w.duration_ns) - pl.col("busy_ns")).alias("idle_ns"),
            (pl.col("busy_ns") / max(w.duration_ns, 1)).alias("utilization"),
        ).sort(keys)

    @cached_property
    def step_unit(self) -> tuple[int, str]:
        """``(count, noun)`` of the steps the findings' per-step figures are of: the analysed
        window's token steps for a generation (``token step``) or a server (``engine step``),
        whose iterations may be whole ``generate()`` calls; a microbenchmark's iterations
        (``repetition``); a model run over and over without tokens (``forward pass``); else its
        iterations (``step``)."""
        s = self.__dict__.get("structure")
        st = s.steady_steps if s is not None and s.kind in ("generation", "serving") else None
        if st is not None and st.height:
            w = self.window
            n = st.filter((pl.col("start_ns") >= w.start_ns) & (pl.col("start_ns") < w.end_ns)).height
            if n and s is not None:
                return n, "token step" if s.kind == "generation" else "engine step"
        if s is not None and s.kind == "microbenchmark":
            return self.window.steps, "repetition"
        if s is not None and s.kind == "inference":
            return self.window.steps, "forward pass"
        return self.window.steps, "step"

    def per_step(self, ns: float) -> str:
        """``"X per step"`` (per token or engine step of a generation or a server: see
        :attr:`step_unit`) when the window has steps, else ``"X in the window"``."""
        from tracekit.diagnosis.result import fmt_ns

        n, noun = self.step_unit
        if n:
            return f"{fmt_ns(ns / n)} per {noun}"
        return f"{fmt_ns(ns)} in the window"

    def share(self, ns: float | None) -> float | None:
        if ns is None or self.window.duration_ns <= 0:
            return None
        return float(ns) / self.window.duration_ns

    @property
    def trace_path(self) -> str:
        path = getattr(self.trace, "path", None)
        if path is None:
            paths = getattr(self.trace, "paths", None)
            return str(paths[0]) if paths else "TRACE"
        return str(path)
