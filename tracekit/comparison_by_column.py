"""One run of ``tracekit.diff`` on an export too big to hold: per-step values a column at a time.

:func:`tracekit.comparison.diff` compares two runs from long frames ``step, key, value`` per
level. On a single export with at least :func:`bounded_min_ops` GPU operations the whole
tables are never built: the operations' launch calls come from one merge join of two columns
(:func:`~tracekit.analysis.attribution.launch_pairs`), each operation's step is found in
windows of :data:`CHUNK_ROWS` rows, and every level is a group-by over windows of a few
columns (step, name ids, duration), merged. What is held at once is a handful of columns of
one run (8 bytes per operation each) and the NVTX columns the attribution reads; the two runs
are never held together. The results are those of the whole-table path
(``tests/test_diff_bounded.py`` forces this path on real exports and compares).

Steps are found as the whole-table path finds them (NVTX step ranges, every step measured);
steps from ``forward`` ranges (no step ranges) are measured as :func:`tracekit.diagnose`
measures them on big traces (the first 50, a middle stretch and the last two, when there are
more than ``exact_steps``), and the diff then says so in a note.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from tracekit.analysis._frames import gpu_ops, process_key
from tracekit.analysis.attribution import RANGE_TYPES, attribute_nvtx, launch_pairs
from tracekit.analysis.compare import per_step_stats
from tracekit.analysis.families import with_family
from tracekit.analysis.run.iterations import iteration_ranges

__all__ = ["BOUNDED_MIN_OPS", "CHUNK_ROWS", "RunStats", "bounded_min_ops", "bounded_run_stats", "takes_bounded_path"]

#: A run with at least this many GPU operations (row estimate) is compared a column at a time
#: (``TRACEKIT_DIFF_BOUNDED_MIN_OPS`` overrides it). The whole-table path takes ~750 B per
#: operation (2 × 8 M kernels: 11.9 GB), so from here on it would not fit a 4 GB budget.
BOUNDED_MIN_OPS = 2_000_000
#: Rows of one window of the per-operation columns (group-bys, step search, attribution).
CHUNK_ROWS = 2_000_000
#: Peak memory of the bounded path (measured on 30 M kernels and 76.6 M calls: see
#: benchmarks/README.md "diff in bounded memory"): a base plus, per operation and per CUDA
#: API call of the bigger run.
BOUNDED_BASE_BYTES = 700 << 20
BOUNDED_BYTES_PER_OP = 60
BOUNDED_BYTES_PER_CALL = 20

#: NVTX columns the step search and the attribution read (not payloads, colours, JSON).
NVTX_COLUMNS = ("pid", "tid", "global_tid", "event_type_id", "start_ns", "end_ns", "duration_ns", "name",
                "domain", "domain_id", "end_global_tid", "range_id")
_KERNEL_COLUMNS = ("correlation_id", "global_pid", "pid", "start_ns", "end_ns", "duration_ns", "name_id",
                   "short_name_id")
_API_COLUMNS = ("correlation_id", "global_tid", "start_ns", "end_ns", "api")


def bounded_min_ops() -> int:
    """:data:`BOUNDED_MIN_OPS`, or ``TRACEKIT_DIFF_BOUNDED_MIN_OPS`` when set (operations)."""
    from tracekit.env import count_from_env

    return count_from_env("TRACEKIT_DIFF_BOUNDED_MIN_OPS", BOUNDED_MIN_OPS)


def takes_bounded_path(trace: Any, min_ops: int) -> bool:
    """Whether ``trace`` (a single export whose kernel table is not loaded) has at least
    ``min_ops`` GPU operations (row estimate): then it is compared a column at a time."""
    from tracekit.nsys.database import gpu_op_estimate

    db = getattr(trace, "db", None)
    if db is None or not hasattr(trace, "columns_on_demand") or trace.is_loaded("kernels"):
        return False
    return gpu_op_estimate(db) >= min_ops


def ensure_bounded_fits(trace: Any) -> None:
    """Refuse, in one :class:`~tracekit.errors.TraceMemoryError` line, a run the bounded path
    cannot hold either (:data:`BOUNDED_BASE_BYTES` + per operation and call)."""
    from tracekit.nsys.database import gpu_op_estimate, refuse_unless_fits

    db = trace.db
    ops = gpu_op_estimate(db)
    calls = db.row_estimate("CUPTI_ACTIVITY_KIND_RUNTIME") if db.has_table("CUPTI_ACTIVITY_KIND_RUNTIME") else 0
    refuse_unless_fits(
        BOUNDED_BASE_BYTES + BOUNDED_BYTES_PER_OP * ops + BOUNDED_BYTES_PER_CALL * calls,
        f"{os.path.basename(str(trace.path))}: comparing {ops:,} GPU operations a column at a time",
        "compare shorter captures (nsys --capture-range, or a few steps of each run), or run the diff on a machine with more memory",
    )


@dataclass
class RunStats:
    """What one run contributes to a diff: per level, :func:`~tracekit.analysis.compare.
    per_step_stats` (``key``, ``mean_<s>``, ``sd_<s>``, ``total_<s>``; ns, launches for the
    step level's ``kernels``), the number of steady steps, how they were found, and notes."""

    stats: dict[str, pl.DataFrame]
    steps: int
    method: str
    notes: list[str] = field(default_factory=list)


@dataclass
class _Ops:
    """The operations of one run as columns (kernels with a plausible end first, then the
    memcpys, memsets and graph launches of ``small``) and each one's ``step`` (Int32, null
    outside the steady steps)."""

    kernel_rows: pl.Series | None  # rows of the kernel table kept (None: all)
    n_kernels: int
    small: pl.DataFrame
    step: pl.Series = field(default_factory=lambda: pl.Series("step", [], pl.Int32))
    launch: pl.DataFrame = field(default_factory=pl.DataFrame)  # global_tid, api_start_ns, api_end_ns


class _Run:
    """Column reads of one export (each column read when asked, none kept by the source)."""

    def __init__(self, trace: Any) -> None:
        from tracekit.diagnosis.ops_by_column import OpsByColumn

        self.trace = trace
        self.src = trace.columns_on_demand("kernels", list(_KERNEL_COLUMNS))
        by = OpsByColumn(trace)  # the implausible-end bound of every operation, as gpu_ops applies it
        self.end_bound = by.end_bound
        from tracekit.nsys import schema as S

        none = S.empty("kernels", ["pid", "global_pid", "device_id", "context_id", "stream_id", "correlation_id", "start_ns",
                                   "end_ns", "duration_ns", "name"])
        small = gpu_ops(none, by.memcpys, by.memsets, by.graphs, end_bound=self.end_bound)
        del by
        ends = self.kcol_all("end_ns")
        keep = None if self.end_bound is None else (ends <= self.end_bound).fill_null(True)
        n = ends.len()
        del ends
        rows = None if keep is None or bool(keep.all()) else keep.arg_true()
        self.ops = _Ops(rows, n if rows is None else rows.len(), small)

    def kcol_all(self, name: str) -> pl.Series:
        s = self.src[name]
        self.src.release()
        return s  # type: ignore[no-any-return]

    def kcol(self, name: str) -> pl.Series:
        """Kernel column ``name`` of the kept kernels (plausible ends)."""
        s = self.kcol_all(name)
        rows = self.ops.kernel_rows
        return s if rows is None else s.gather(rows)

    def column(self, name: str, small: str | None = None) -> pl.Series:
        """Per-operation column: the kept kernels' ``name``, then ``small``'s (default the same name)."""
        k = self.kcol(name)
        s = self.ops.small[small or name]
        return pl.concat([k, s.cast(k.dtype)]) if s.len() else k


def bounded_run_stats(trace: Any, levels: tuple[str, ...], suffix: str, side: str) -> RunStats:
    """Per-step statistics of every level of one run (see the module doc); ``suffix`` names
    the columns (``a``: before, ``b``: after), ``side`` the run in notes (``before``)."""
    from tracekit.diagnosis.config import DiagnoseConfig

    cfg = DiagnoseConfig()
    run = _Run(trace)
    nvtx = trace.table("nvtx", list(NVTX_COLUMNS))
    ranges = iteration_ranges(nvtx, pattern=cfg.iteration_pattern) if nvtx.height else pl.DataFrame()
    if "range" in levels or _main_ranges(ranges).height >= 2:
        run.ops.launch = _launch_columns(run)
    notes: list[str] = []
    steps, method, lengths, labels = _assign_steps(run, ranges, cfg, notes)
    values: dict[str, tuple[pl.DataFrame, list[str] | None]] = {}
    if "range" in levels:  # first: then the launch columns and NVTX go
        values["range"] = (_range_values(run, nvtx, labels if method == "nvtx" else []), None)
    run.ops.launch = pl.DataFrame()
    del nvtx, ranges
    kern = _kernel_sums(run) if {"kernel", "family"} & set(levels) else None
    for level in levels:
        if level in ("kernel", "family") and kern is not None:
            values[level] = _name_values(run, kern, level)
        elif level == "step":
            values[level] = (_step_values(run, lengths), None)
    stats = {}
    for level in levels:
        frame, names = values.pop(level)
        st = per_step_stats(frame, steps, suffix)
        if names is not None:  # key codes → their texts
            st = st.with_columns(pl.Series("key", names, dtype=pl.Utf8).gather(st["key"]))
        stats[level] = st
    note = _graph_note(run, side)
    return RunStats(stats, len(steps), method, [*notes, *([note] if note else [])])


# -- launch calls ----------------------------------------------------------------------------
def _launch_columns(run: _Run) -> pl.DataFrame:
    """Per operation: ``global_tid``, ``api_start_ns``, ``api_end_ns`` of its launching call
    (:func:`~tracekit.analysis.attribution.launch_info`'s, null when none matches), from one
    merge join of the correlation ids and processes."""
    trace = run.trace
    n = run.ops.n_kernels + run.ops.small.height
    api = trace.columns_on_demand("cuda_api", list(_API_COLUMNS)) if trace.db.has_table("CUPTI_ACTIVITY_KIND_RUNTIME") else None
    if api is None or "correlation_id" not in api.columns or "global_tid" not in api.columns:
        return pl.DataFrame({"global_tid": pl.repeat(None, n, dtype=pl.Int64, eager=True),
                             "api_start_ns": pl.repeat(None, n, dtype=pl.Int64, eager=True),
                             "api_end_ns": pl.repeat(None, n, dtype=pl.Int64, eager=True)})
    keys = pl.DataFrame([run.column("correlation_id"), run.column("global_pid")])
    pairs = launch_pairs(keys, api)
    del keys
    if pairs.height > n:
        # a (correlation id, process) repeats among the calls (rare): launch_info keeps the
        # CUDA runtime/driver row, else the earliest
        arow = pairs["_arow"]
        if "api" in api.columns:
            kind, start = api.gather_columns(["api", "start_ns"], arow)
            pref = (~kind.is_in(["runtime", "driver"])).fill_null(True)
        else:
            start = api.gather_columns(["start_ns"], arow)[0]
            pref = pl.repeat(False, pairs.height, eager=True)
        pairs = (pairs.with_columns(pref.alias("_pref"), start.alias("_s"))
                 .sort(["_lrow", "_pref", "_s"], nulls_last=True, maintain_order=True)
                 .unique(subset="_lrow", keep="first", maintain_order=True).select("_lrow", "_arow"))
    got = api.gather_columns(["global_tid", "start_ns", "end_ns"], pairs["_arow"])
    release = getattr(api, "release", None)
    if release is not None:
        release()
    return pl.DataFrame([got[0].alias("global_tid"), got[1].alias("api_start_ns"), got[2].alias("api_end_ns")])


# -- steps -----------------------------------------------------------------------------------
def _main_ranges(ranges: pl.DataFrame) -> pl.DataFrame:
    """The iteration ranges of the process with the most of them (``_nvtx_iterations``' choice)."""
    if ranges.height == 0:
        return ranges
    proc = [c for c in ("rank", "pid") if c in ranges.columns]
    main = ranges.group_by(proc).len().sort(["len", *proc], descending=[True, *([False] * len(proc))], nulls_last=True).head(1)
    return ranges.join(main.select(proc), on=proc).sort("iteration")


def _chunks(n: int, rows: int | None = None) -> list[tuple[int, int]]:
    """``(offset, length)`` windows of ``rows`` (default :data:`CHUNK_ROWS`) over ``n`` rows."""
    size = max(CHUNK_ROWS if rows is None else rows, 1)
    return [(off, min(size, n - off)) for off in range(0, n, size)]


def _assign_steps(
    run: _Run, ranges: pl.DataFrame, cfg: Any, notes: list[str],
) -> tuple[list[int], str, pl.DataFrame | None, list[str]]:
    """Each operation's steady step (``run.ops.step``) and ``(steps, method, step lengths,
    step range labels)`` as the whole-table path (``comparison._steady_steps``) finds them."""
    main = _main_ranges(ranges)
    if main.height >= 2:
        got = _nvtx_steps(run, ranges, main, cfg)
        if got is not None:
            return got
    return _window_steps(run, cfg, notes)


def _nvtx_steps(run: _Run, ranges: pl.DataFrame, main: pl.DataFrame, cfg: Any) -> tuple[list[int], str, pl.DataFrame | None, list[str]] | None:
    """NVTX step ranges, every step measured: each step's GPU span from the operations
    launched in it (``iterations``), warm-up steps left out as ``steady_window`` leaves them,
    and each operation in the steady step of its own process whose CPU range holds its launch."""
    from tracekit.analysis.run.iterations import warmup_count as _warmup_count

    launch = run.ops.launch
    start, end = run.column("start_ns"), run.column("end_ns")
    # the GPU span of every iteration of every process (iterations(): by the launching
    # thread's process, every range of it)
    its = ranges.with_columns(process_key("global_tid").alias("_proc"))
    win = its.select("_proc", pl.col("start_ns").alias("api_start_ns"), "iteration", pl.col("end_ns").alias("_iend"), "pid").sort(
        "_proc", "api_start_ns")
    parts = []
    for off, length in _chunks(start.len()):
        ops = pl.DataFrame([launch["global_tid"].slice(off, length), launch["api_start_ns"].slice(off, length),
                            start.slice(off, length), end.slice(off, length)]).filter(pl.col("api_start_ns").is_not_null())
        j = ops.select(process_key("global_tid").alias("_proc"), "api_start_ns", "start_ns", "end_ns").sort("_proc", "api_start_ns").join_asof(
            win, on="api_start_ns", by="_proc", strategy="backward", check_sortedness=False,
        ).filter(pl.col("iteration").is_not_null() & (pl.col("api_start_ns") <= pl.col("_iend")))
        parts.append(j.group_by("pid", "iteration").agg(pl.col("start_ns").min().alias("gpu_start_ns"),
                                                        pl.col("end_ns").max().alias("gpu_end_ns")))
    del start, end
    span = (pl.concat(parts).group_by("pid", "iteration").agg(pl.col("gpu_start_ns").min(), pl.col("gpu_end_ns").max())
            if parts else pl.DataFrame(schema={"pid": pl.Int64, "iteration": pl.Int64, "gpu_start_ns": pl.Int64, "gpu_end_ns": pl.Int64}))
    per_proc = its.join(span, on=["pid", "iteration"], how="left").with_columns(
        (pl.col("end_ns") - pl.col("start_ns")).alias("duration_ns"), (pl.col("gpu_end_ns") - pl.col("gpu_start_ns")).alias("gpu_span_ns"))
    proc = [c for c in ("rank", "pid") if c in main.columns]
    it = per_proc.join(main.select(proc).unique(), on=proc).sort("iteration").with_columns(
        pl.min_horizontal("start_ns", "gpu_start_ns").alias("w_start"),
        pl.max_horizontal("end_ns", "gpu_end_ns").alias("w_end"),
        pl.max_horizontal("duration_ns", pl.col("gpu_span_ns").fill_null(0)).alias("length_ns"),
    ).filter(pl.col("w_start").is_not_null() & pl.col("w_end").is_not_null() & pl.col("length_ns").is_not_null())
    if it.height == 0:
        return None
    warm = _warmup_count(it["length_ns"].to_list(), cfg.warmup_factor)
    steady = it.slice(warm).select(pl.col("iteration").cast(pl.Int64).alias("step"), "start_ns", "end_ns")
    numbers = steady["step"].to_list()
    lengths = (per_proc.filter(pl.col("iteration").is_in(numbers))
               .group_by(pl.col("iteration").cast(pl.Int64).alias("step"))
               .agg(pl.max_horizontal("duration_ns", pl.col("gpu_span_ns").fill_null(0)).max().alias("length_ns")))
    # each operation in the steady step of its own process (rank, pid) whose CPU range holds
    # its launch; of a process without step ranges, in the main process's step by time
    sproc = [c for c in ("rank", "pid") if c in ranges.columns]
    own_win = ranges.filter(pl.col("iteration").is_in(numbers)).select(
        *sproc, pl.col("iteration").cast(pl.Int64).alias("step"), pl.col("start_ns").alias("api_start_ns"), pl.col("end_ns").alias("_e"))
    with_ranges = own_win.select(sproc).unique()
    own_win = own_win.sort([*sproc, "api_start_ns"])
    main_win = steady.select("step", pl.col("start_ns").alias("api_start_ns"), pl.col("end_ns").alias("_e")).sort("api_start_ns")
    pid = run.column("pid")
    steps = []
    for off, length in _chunks(pid.len()):
        calls = pl.DataFrame([pid.slice(off, length), launch["api_start_ns"].slice(off, length)]).with_row_index("_r")
        calls = calls.filter(pl.col("api_start_ns").is_not_null())
        own = calls.join(with_ranges, on=sproc, how="semi").sort([*sproc, "api_start_ns"]).join_asof(
            own_win, on="api_start_ns", by=sproc, strategy="backward", check_sortedness=False)
        other = calls.join(with_ranges, on=sproc, how="anti").sort("api_start_ns").join_asof(main_win, on="api_start_ns", strategy="backward")
        hit = pl.concat([own.select("_r", "step", "api_start_ns", "_e"), other.select("_r", "step", "api_start_ns", "_e")]).filter(
            pl.col("step").is_not_null() & (pl.col("api_start_ns") <= pl.col("_e")))
        steps.append(pl.repeat(None, length, dtype=pl.Int32, eager=True).scatter(hit["_r"], hit["step"].cast(pl.Int32)))
    run.ops.step = pl.concat(steps).alias("step") if steps else pl.Series("step", [], pl.Int32)
    labels = ranges["name"].drop_nulls().unique().to_list()
    return numbers, "nvtx", lengths, labels


def _window_steps(run: _Run, cfg: Any, notes: list[str]) -> tuple[list[int], str, pl.DataFrame | None, list[str]]:
    """Steps without NVTX step ranges (forward ranges, graph replays, the repeating kernel
    sequence), found as ``diagnose`` finds them on a big trace: each operation in the steady
    step whose GPU span holds its start."""
    from dataclasses import replace

    from tracekit.diagnosis.context import Context
    from tracekit.diagnosis.window import search_window

    ctx = Context(run.trace, replace(cfg, max_window_ops=10**12))
    w = search_window(ctx)
    del ctx
    it = w.iterations
    start = run.column("start_ns")
    if it.height == 0:
        run.ops.step = pl.repeat(0, start.len(), dtype=pl.Int32, eager=True).alias("step")
        return [0], w.method, None, []
    steady = it.slice(w.warmup_steps).select(pl.col("iteration").cast(pl.Int64).alias("step"), "w_start", "w_end", "length_ns")
    if w.method == "forwards" and w.steps > cfg.exact_steps:
        shown = steady["step"].to_list()
        notes.append(
            f"{os.path.basename(str(run.trace.path))}: {w.steps:,} steady forward steps; per-step values, noise and ranges "
            f"come from the {len(shown)} steps diagnose measures on a big trace (from {shown[0]}: the first 50, a middle "
            "stretch and the last two), because measuring every forward step needs the launch join of every operation at once")
    win = steady.select("step", pl.col("w_start").alias("start_ns"), pl.col("w_end").alias("_e")).sort("start_ns")
    steps = []
    for off, length in _chunks(start.len()):
        s = start.slice(off, length).to_frame("start_ns").with_row_index("_r").sort("start_ns").join_asof(
            win, on="start_ns", strategy="backward").filter(pl.col("step").is_not_null() & (pl.col("start_ns") < pl.col("_e")))
        steps.append(pl.repeat(None, length, dtype=pl.Int32, eager=True).scatter(s["_r"], s["step"].cast(pl.Int32)))
    run.ops.step = pl.concat(steps).alias("step") if steps else pl.Series("step", [], pl.Int32)
    return steady["step"].to_list(), w.method, steady.select("step", "length_ns"), []


# -- levels ----------------------------------------------------------------------------------
def _name_values(run: _Run, kern: pl.DataFrame, level: str) -> tuple[pl.DataFrame, list[str]]:
    """``step, key, value`` of the kernel or family level (``key``: an index into the
    returned texts, in their sorted order), summed per step and key: kernels by
    ``coalesce(short_name, name)`` or family, graph replays traced whole as their own key."""
    from tracekit.nsys.readers import lookup_strings

    ops = run.ops
    small = ops.small.with_columns(ops.step.slice(ops.n_kernels).alias("step")).filter(pl.col("step").is_not_null())
    strings = run.trace.strings
    names = kern.select("name_id", "short_name_id").unique().with_columns(
        lookup_strings(pl.col("name_id"), strings).alias("name"), lookup_strings(pl.col("short_name_id"), strings).alias("short_name"))
    if level == "kernel":
        names = names.with_columns(pl.coalesce("short_name", "name").alias("_k"))
    else:
        names = with_family(names.with_columns(pl.lit("kernel").alias("op_kind"))).rename({"family": "_k"})
    graphs = small.filter(pl.col("op_kind") == "graph").select(
        pl.col("step").cast(pl.Int64), (pl.col("name") if level == "kernel" else pl.lit("graph")).alias("_k"),
        pl.col("duration_ns").alias("value"))
    texts = pl.concat([names["_k"], graphs["_k"]]).unique().sort(nulls_last=True)
    code = pl.DataFrame({"_k": texts, "key": pl.int_range(texts.len(), dtype=pl.Int64, eager=True)})
    k = kern.join(names.select("name_id", "short_name_id", "_k"), on=["name_id", "short_name_id"], how="left", nulls_equal=True)
    long = pl.concat([k.select(pl.col("step").cast(pl.Int64), "_k", pl.col("value")), graphs])
    long = long.join(code, on="_k", how="left", nulls_equal=True).group_by("step", "key").agg(pl.col("value").sum())
    return long.select("step", "key", pl.col("value").cast(pl.Int64)), texts.to_list()


def _step_values(run: _Run, lengths: pl.DataFrame | None) -> pl.DataFrame:
    """``step, key, value`` of the step level: ``gpu_time`` (every operation, ns),
    ``kernels`` (launches) and ``step_time`` (the step's length, ns)."""
    ops = run.ops
    step, nk = ops.step, ops.n_kernels
    dur = run.column("duration_ns")
    frame = pl.DataFrame([step, dur, pl.concat([pl.repeat(True, nk, eager=True), (ops.small["op_kind"] == "kernel")]).alias("_kernel")])
    del dur
    parts = []
    for off, length in _chunks(frame.height):
        parts.append(frame.slice(off, length).filter(pl.col("step").is_not_null()).group_by("step").agg(
            pl.col("duration_ns").sum().alias("gpu_time"), pl.col("_kernel").sum().cast(pl.Int64).alias("kernels")))
    per = pl.concat(parts).group_by("step").agg(pl.col("gpu_time").sum(), pl.col("kernels").sum()) if parts else pl.DataFrame(
        schema={"step": pl.Int32, "gpu_time": pl.Int64, "kernels": pl.Int64})
    out = [per.select(pl.col("step").cast(pl.Int64), pl.lit("gpu_time").alias("key"), pl.col("gpu_time").alias("value")),
           per.filter(pl.col("kernels") > 0).select(pl.col("step").cast(pl.Int64), pl.lit("kernels").alias("key"), pl.col("kernels").alias("value"))]
    if lengths is not None and lengths.height:
        out.append(lengths.select("step", pl.lit("step_time").alias("key"), pl.col("length_ns").alias("value")))
    return pl.concat([p.select("step", "key", pl.col("value").cast(pl.Int64)) for p in out])


def _kernel_sums(run: _Run) -> pl.DataFrame:
    """Per step and (``name_id``, ``short_name_id``): summed kernel ``value`` (duration, ns),
    a group-by per window of rows, merged."""
    nk = run.ops.n_kernels
    frame = pl.DataFrame([run.ops.step.slice(0, nk), run.kcol("name_id"), run.kcol("short_name_id"), run.kcol("duration_ns")])
    parts = [frame.slice(off, length).filter(pl.col("step").is_not_null()).group_by("step", "name_id", "short_name_id").agg(
        pl.col("duration_ns").sum().alias("value")) for off, length in _chunks(nk)]
    del frame
    if not parts:
        return pl.DataFrame(schema={"step": pl.Int32, "name_id": pl.Int64, "short_name_id": pl.Int64, "value": pl.Int64})
    return pl.concat(parts).group_by("step", "name_id", "short_name_id").agg(pl.col("value").sum())


def _range_values(run: _Run, nvtx: pl.DataFrame, labels: list[str]) -> pl.DataFrame:
    """``step, key, value``: the GPU time per innermost NVTX range of the launching call
    (:func:`~tracekit.analysis.attribution.attribute_nvtx`), window by window of operations,
    each against the NVTX ranges that overlap its calls."""
    if nvtx.height == 0:
        return pl.DataFrame(schema={"step": pl.Int64, "key": pl.Utf8, "value": pl.Int64})
    # open ranges end where the whole table's ranges end (as the attribution closes them), not
    # where a window's do
    is_range = pl.col("event_type_id").is_in(list(RANGE_TYPES)) & pl.col("end_global_tid").is_null()
    possible = is_range & pl.col("start_ns").is_not_null() & ~(pl.col("end_ns") < pl.col("start_ns")).fill_null(False)
    last = nvtx.filter(possible).select(pl.max_horizontal(pl.col("start_ns").max(), pl.col("end_ns").max())).item()
    nv = nvtx.filter(is_range)  # the ranges only, then their open ends closed (no copy of the rest)
    nv = nv.with_columns(pl.when(pl.col("end_ns").is_null()).then(pl.lit(last, pl.Int64)).otherwise(pl.col("end_ns")).alias("end_ns"))
    step = run.ops.step
    launch = run.ops.launch
    dur = run.column("duration_ns")
    frame = pl.DataFrame([launch["global_tid"], launch["api_start_ns"], launch["api_end_ns"], step, dur])
    del dur
    parts = []
    # half-size windows: the attribution's range tree and joins per window were the diff's
    # peak on 30 M kernels (two runs of 11 GB: 4,118 MiB cold with 2 M-row windows)
    for off, length in _chunks(frame.height, CHUNK_ROWS // 2):
        ops = frame.slice(off, length).filter(pl.col("step").is_not_null())
        calls = ops["api_start_ns"].drop_nulls()
        if calls.len():
            lo, hi = calls.min(), calls.max()
            sub = nv.filter((pl.col("start_ns") <= hi) & (pl.col("end_ns") >= lo))
        else:
            sub = nv.clear()
        att = attribute_nvtx(ops, sub)
        key = pl.col("nvtx_range").fill_null("(none)")
        # work launched directly inside a step range: one key (step.N) whatever the step's number
        key = pl.when(key.is_in(labels)).then(key.str.replace_all(r"\d+", "N")).otherwise(key)
        parts.append(att.group_by(pl.col("step").cast(pl.Int64), key.alias("key")).agg(pl.col("duration_ns").sum().alias("value")))
    if not parts:
        return pl.DataFrame(schema={"step": pl.Int64, "key": pl.Utf8, "value": pl.Int64})
    return pl.concat(parts).group_by("step", "key").agg(pl.col("value").sum())


def _graph_note(run: _Run, side: str) -> str | None:
    """``comparison._graph_note`` of the operations in the steps."""
    ops = run.ops
    small = ops.small.with_columns(ops.step.slice(ops.n_kernels).alias("step")).filter(pl.col("step").is_not_null())
    replays = small.filter(pl.col("op_kind") == "graph")
    if replays.height == 0:
        return None
    kernel_ns = run.kcol("duration_ns").filter(ops.step.slice(0, ops.n_kernels).is_not_null()).sum()
    total = int(kernel_ns or 0) + int(small["duration_ns"].sum() or 0)
    share = f" ({int(replays['duration_ns'].sum() or 0) / total:.0%} of its GPU time in the steps)" if total else ""
    return (f"{side}: {replays.height:,} CUDA graph replays traced whole{share}: their kernels are compared as one "
            "[CUDA graph N] key (family graph); capture both runs with --cuda-graph-trace=node to compare the kernels inside")

