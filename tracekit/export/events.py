"""The timeline both exporters write: tracks, slices, instants, flows and counter samples built
from a trace's tables (polars frames in, frames out; no file is written here).

Track tree (see docs/export.md):

* one **process** track per process (per rank and process for a trace set), named
  ``rank R · NAME (pid P)``; under it one **thread** track per CPU thread with CUDA API calls and
  NVTX push/pop ranges (nested slices) and NVTX marks (instants), one **stream** track per GPU
  stream (kernels, memcpys, memsets, CUDA graph launches traced whole), one ``GPU d · CUDA graph
  replays`` track per device for graphs traced per node (:mod:`tracekit.export.graphs`),
  ``NCCL calls`` per calling thread, ``NVTX start/end ranges`` and one ``GPU d memory in use``
  counter per device the process allocated on;
* one **GPU** track per GPU with GPU-metric counters under it.

A slice that partly overlaps a slice of its own track (it starts inside it and ends after it)
cannot nest; it goes to a sibling track named ``… (overlap k)`` rather than being cut.

:func:`stream_model` builds the timeline in time slices, in memory that grows with the window
rather than the trace (the exporters use it); :func:`build_model` gathers it in memory.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from tracekit.errors import TracekitError
from tracekit.export.graphs import (
    GRAPH_COLS,
    REPLAY_TRACK,
    graph_op_slices,
    graph_ops,
    node_replays,
    replay_slices,
)

__all__ = ["CATEGORIES", "DEFAULT_METRICS", "ExportModel", "ExportSummary", "Timeline", "Track", "build_model",
           "parse_window", "steady_bounds", "stream_model"]

#: GPU metrics exported by default (``gpu_metrics.metric`` names); ``metrics="all"`` takes every one.
DEFAULT_METRICS: tuple[str, ...] = ("sms_active", "tensor_active", "dram_read_bandwidth", "dram_write_bandwidth")
#: Slice categories, in the order they are written.
CATEGORIES: tuple[str, ...] = ("kernel", "memcpy", "memset", "graph", "cuda_api", "nvtx", "nccl")

#: Synthetic ids when one pid appears in several reports: ``(report + 1) * PID_STRIDE + pid``.
PID_STRIDE = 10_000_000

#: (model column, argument name, kind) of every slice argument; kind is ``int`` or ``str``.
ARGS: tuple[tuple[str, str, str], ...] = (
    ("a_family", "family", "str"),
    ("a_grid", "grid", "str"),
    ("a_block", "block", "str"),
    ("a_registers", "registers_per_thread", "int"),
    ("a_static_smem", "static_shared_memory_bytes", "int"),
    ("a_dynamic_smem", "dynamic_shared_memory_bytes", "int"),
    ("a_device", "device_id", "int"),
    ("a_stream", "stream_id", "int"),
    ("a_correlation", "correlation_id", "int"),
    ("a_bytes", "bytes", "int"),
    ("a_copy_kind", "copy_kind", "str"),
    ("a_src_kind", "src_kind", "str"),
    ("a_dst_kind", "dst_kind", "str"),
    ("a_value", "value", "int"),
    ("a_mem_kind", "mem_kind", "str"),
    ("a_return", "return_value", "int"),
    ("a_domain", "domain", "str"),
    ("a_op", "op", "str"),
    ("a_peer", "peer", "int"),
    ("a_root", "root", "int"),
    ("a_comm", "comm_id", "str"),
    ("a_comm_rank", "comm_rank", "int"),
    ("a_comm_nranks", "comm_nranks", "int"),
    ("a_dtype", "dtype", "str"),
    ("a_reduction", "reduction", "str"),
    ("a_algorithm", "algorithm", "str"),
    ("a_protocol", "protocol", "str"),
    ("a_kernel_count", "kernel_count", "int"),
    ("a_gpu_duration", "gpu_duration_ns", "int"),
    ("a_graph_id", "graph_id", "int"),
    ("a_graph_exec", "graph_exec_id", "int"),
    ("a_gpu_time", "gpu_time_ns", "int"),
)
_ARG_DTYPES = {col: (pl.Int64 if kind == "int" else pl.Utf8) for col, _, kind in ARGS}

SLICE_SCHEMA: dict[str, Any] = {
    "track": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64, "name": pl.Utf8, "cat": pl.Utf8,
    "flow_out": pl.Int64, "flow_in": pl.Int64, **_ARG_DTYPES,
}
INSTANT_SCHEMA: dict[str, Any] = {"track": pl.Int64, "ts_ns": pl.Int64, "name": pl.Utf8, "cat": pl.Utf8, "a_domain": pl.Utf8}
COUNTER_SCHEMA: dict[str, Any] = {"track": pl.Int64, "ts_ns": pl.Int64, "value": pl.Float64}


@dataclass
class Track:
    """One timeline row. ``kind``: ``process``, ``thread``, ``stream``, ``graph`` (CUDA graph
    replays), ``nccl``, ``nvtx``, ``gpu``, ``counter`` or ``overlap``. ``pid``/``tid`` are the ids written to the file
    (synthetic when pids repeat across reports); ``unit`` is a counter's unit (``bytes``, ``%``)."""

    uuid: int
    name: str
    kind: str
    parent: int | None = None
    pid: int | None = None
    tid: int | None = None
    unit: str | None = None


@dataclass
class ExportModel:
    """Everything an exporter writes. ``parts`` hold the slices of one family of tracks each
    (GPU streams, CPU threads, NVTX start/end, NCCL): the common columns of ``SLICE_SCHEMA``
    plus the argument columns that family uses, sorted by ``track``, ``start_ns`` and longest
    first, nesting properly within each track. ``flow_out`` on a launch call and ``flow_in`` on
    the first GPU operation of its correlation id carry the same flow id. ``instants`` (NVTX
    marks) and ``counters`` (ns, value) name their track."""

    tracks: list[Track]
    parts: list[pl.DataFrame]
    instants: pl.DataFrame
    counters: pl.DataFrame
    window: tuple[int, int] | None = None
    window_source: str | None = None
    skipped: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def slices(self) -> pl.DataFrame:
        """Every slice in one frame of ``SLICE_SCHEMA`` (text as strings)."""
        return _conform([p.with_columns(pl.col(pl.Categorical).cast(pl.Utf8)) for p in self.parts], SLICE_SCHEMA)


@dataclass
class ExportSummary:
    """What an export wrote: the file, its size, and the counts of each kind of event."""

    path: str
    format: str
    bytes: int
    tracks: int
    slices: dict[str, int]
    flows: int
    instants: int
    counter_samples: int
    window: tuple[int, int] | None
    window_source: str | None
    skipped: dict[str, int]
    seconds: float
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        total = sum(self.slices.values())
        parts = ", ".join(f"{v} {k}" for k, v in self.slices.items() if v)
        win = "" if self.window is None else f"; window {self.window[0]}:{self.window[1]} ns ({self.window_source})"
        return (f"{self.path}: {self.format}, {self.bytes / 1e6:.2f} MB, {self.tracks} tracks, {total} slices "
                f"({parts or 'none'}), {self.flows} flows, {self.instants} instants, {self.counter_samples} "
                f"counter samples{win}; {self.seconds:.1f} s")


# -- window -------------------------------------------------------------------------------------------
_UNITS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
_TIME = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(ns|us|ms|s)?\s*$")


def parse_window(text: str) -> tuple[int, int] | str:
    """``"START:END"`` → ``(start_ns, end_ns)``; ``"steady"`` stays ``"steady"``.

    Times are on the capture's timeline (nanoseconds since the trace's session start: the same
    numbers as the tables' ``start_ns``); each may carry a unit, ``ns`` (default), ``us``, ``ms``
    or ``s``: ``"1.5s:2s"``, ``"120000000:180000000"``. An empty END means the trace's end."""
    if text.strip().lower() == "steady":
        return "steady"
    msg = (f"window {text!r}: give START:END on the trace's timeline (ns since the session start, or with a "
           "unit: 1.5s:2s), or 'steady' for the diagnosis's steady-state window")
    if ":" not in text:
        raise TracekitError(msg)
    a, b = text.split(":", 1)
    values = []
    for part, default in ((a, 0), (b, 2**62)):
        if not part.strip():
            values.append(default)
            continue
        m = _TIME.match(part)
        if not m:
            raise TracekitError(msg)
        values.append(int(round(float(m.group(1)) * _UNITS[m.group(2) or "ns"])))
    if values[1] <= values[0]:
        msg = f"window {text!r}: END must be after START"
        raise TracekitError(msg)
    return values[0], values[1]


def steady_bounds(trace: Any) -> tuple[int, int, str]:
    """``(start_ns, end_ns, why)`` of the steady-state window that ``tracekit diagnose``
    analyses (:func:`tracekit.diagnosis.window.steady_window`: NVTX step ranges or the repeating
    kernel sequence, warm-up left out). On a big trace, where diagnose's rules run on a sample
    of consecutive steady steps from the window's middle (``Window.analysed``), that sample:
    the stretch the findings describe, at a size a timeline viewer opens (the whole window of
    16,672 steps of a 1 M-kernel trace is ~1 GB of Perfetto trace); ``why`` then says so and
    gives the whole window's bounds for ``--window START:END``."""
    from tracekit.diagnosis.config import DiagnoseConfig
    from tracekit.diagnosis.context import Context
    from tracekit.diagnosis.window import search_window

    ctx = Context(trace, DiagnoseConfig())
    ctx.prepare_reads()
    w = search_window(ctx)
    why = f"steady state ({w.method}): {w.reason}"
    if not w.sampled:
        return int(w.start_ns), int(w.end_ns), why
    a = w.analysed()
    whole = f"{int(w.start_ns)}:{int(w.end_ns)}"  # ns, exact
    why += (f"; the {a.steps:,} steps of its middle that tracekit diagnose analyses, of {w.steps:,} steady steps "
            f"(the whole window: --window {whole})")  # fmt: skip
    return int(a.start_ns), int(a.end_ns), why


# -- tables ------------------------------------------------------------------------------------------
_NARROW = ("kernels", "memcpys", "memsets", "cuda_api", "nvtx")


def _table(trace: Any, name: str, columns: Sequence[str]) -> pl.DataFrame:
    """``columns`` of table ``name`` (those it has) with a ``report`` column (0 for one trace).
    One report's large tables are read with only these columns (``NsysTrace.table``), and the
    kernel and API names as ``StringIds`` ids made categorical (a million names are ~170 MB of
    text, 4 MB of codes)."""
    ranks = getattr(trace, "ranks", None)
    if name in _NARROW and not isinstance(ranks, pl.DataFrame) and hasattr(trace, "table"):
        from tracekit.nsys.schema import ON_REQUEST, TABLES

        by_id = "name" in columns and "name_id" in ON_REQUEST.get(name, {}) and not trace.is_loaded(name)
        want = [c for c in columns if c in TABLES[name] and not (by_id and c == "name")]
        frame = trace.table(name, [*want, "name_id"] if by_id else want)
        if by_id:
            from tracekit.nsys.readers import lookup_strings

            ids = frame.select(pl.col("name_id").unique())
            ids = ids.with_columns(lookup_strings(pl.col("name_id"), trace.strings).cast(pl.Categorical).alias("name"))
            frame = frame.join(ids, on="name_id", how="left", maintain_order="left").drop("name_id")
    else:
        frame = getattr(trace, name)
    frame = frame.select([c for c in columns if c in frame.columns])
    if "report" not in frame.columns:
        frame = frame.with_columns(pl.lit(0, pl.Int64).alias("report"))
    return frame


def _lookup(frame: pl.DataFrame, table: pl.DataFrame, on: list[str]) -> pl.DataFrame:
    """``frame`` with ``table``'s other columns, matched on ``on`` (unique in ``table``; nulls
    match nulls): a left join of the key columns alone, so the frame's columns are not copied."""
    extra = frame.select(on).join(table, on=on, how="left", maintain_order="left", nulls_equal=True).drop(on)
    return frame.with_columns(extra.get_columns())


def _by_unique_name(frame: pl.DataFrame, fn: Any) -> pl.DataFrame:
    """``frame`` with the columns ``fn`` computes from a frame of its distinct ``name`` values
    (as text) joined back: per-name work done once per name."""
    if frame.height == 0:
        return fn(frame.select(pl.col("name").cast(pl.Utf8)).head(0)).drop("name").pipe(
            lambda extra: frame.with_columns(pl.lit(None, t).alias(c) for c, t in extra.schema.items()))
    u = frame.select(pl.col("name").unique()).with_columns(pl.col("name").cast(pl.Utf8).alias("_text"))
    extra = fn(u.select(pl.col("_text").alias("name"))).drop("name")
    u = pl.concat([u.select("name"), extra], how="horizontal")
    return _lookup(frame, u, ["name"])


def _may_use_nccl(trace: Any, kernel_names: pl.Series, nvtx: pl.DataFrame) -> bool:
    """Whether ``trace.nccl`` can have rows: it is built from the full kernel and NVTX tables,
    worth it only when an NCCL kernel (``kernel_names``: the distinct names) or NVTX range is there."""
    if isinstance(getattr(trace, "ranks", None), pl.DataFrame) or getattr(trace, "is_loaded", lambda n: True)("nccl"):
        return True
    names = kernel_names
    if names.str.contains("(?i)nccl").any():
        return True
    return bool(nvtx.select((pl.col("domain") == "NCCL").any() | pl.col("name").str.starts_with("nccl").any()).item())


class _NoNccl:
    """Stands in for a trace without NCCL work: an empty ``nccl`` table."""

    @property
    def nccl(self) -> pl.DataFrame:
        i, u = pl.Int64, pl.Utf8
        return pl.DataFrame(schema={
            "rank": i, "pid": i, "tid": i, "host_start_ns": i, "host_end_ns": i, "op": u, "api": u, "bytes": i, "peer": i,
            "root": i, "comm_id": pl.UInt64, "comm_rank": i, "comm_nranks": i, "dtype": u, "reduction": u, "algorithm": u,
            "protocol": u, "kernel_count": i, "gpu_duration_ns": i})


def _keep_window(frame: pl.DataFrame, window: tuple[int, int] | None, start: str = "start_ns",
                 end: str | None = "end_ns") -> pl.DataFrame:
    if window is None or frame.height == 0:
        return frame
    lo, hi = window
    if end is None:
        return frame.filter((pl.col(start) >= lo) & (pl.col(start) < hi))
    # a slice is kept when it overlaps the window (an instant one when it lies in it)
    return frame.filter((pl.col(start) < hi) & ((pl.col(end) > lo) | (pl.col(start) >= lo)))


# -- building ------------------------------------------------------------------------------------------
class _Tracks:
    def __init__(self) -> None:
        self.items: list[Track] = []

    def add(self, name: str, kind: str, parent: int | None = None, **kw: Any) -> int:
        uuid = len(self.items) + 1
        self.items.append(Track(uuid, name, kind, parent, **kw))
        return uuid


def _dims(prefix: str) -> pl.Expr:
    return pl.format("({},{},{})", pl.col(f"{prefix}_x"), pl.col(f"{prefix}_y"), pl.col(f"{prefix}_z"))


def _as_trace(trace: Any) -> Any:
    """An open trace or trace set as is; a path opened (a folder: one report per rank)."""
    import os
    from pathlib import Path

    if isinstance(trace, str | os.PathLike):
        import tracekit

        path = Path(trace)
        trace = tracekit.open_many(path) if path.is_dir() else tracekit.open(path)
    if type(trace).__name__ == "NcuReport" or not hasattr(type(trace), "kernels"):
        msg = f"{type(trace).__name__} has no timeline to export; pass an Nsight Systems trace (tracekit.open) or a trace set (tracekit.open_many)"
        raise TracekitError(msg)
    from tracekit.runs import require_one_run

    require_one_run(trace, "the timeline export")
    return trace


#: Slices read and built at a time (per table): the trace is cut into time slices holding at most
#: this many rows of each large table, each written before the next is read.
SLICE_ROWS = 500_000

_KERNEL_COLS = ["report", "pid", "device_id", "stream_id", "correlation_id", "start_ns", "end_ns", "name", "grid_x", "grid_y",
                "grid_z", "block_x", "block_y", "block_z", "registers_per_thread", "static_shared_memory_bytes",
                "dynamic_shared_memory_bytes"]
_MEMCPY_COLS = ["report", "pid", "device_id", "stream_id", "correlation_id", "start_ns", "end_ns", "bytes", "copy_kind",
                "src_kind", "dst_kind"]
_MEMSET_COLS = ["report", "pid", "device_id", "stream_id", "correlation_id", "start_ns", "end_ns", "bytes", "value", "mem_kind"]
_API_COLS = ["report", "pid", "tid", "start_ns", "end_ns", "name", "correlation_id", "return_value"]


class _Columns:
    """Some columns of one event table, read a column at a time and gathered at the rows
    asked for: from one export (an ``NsysTrace`` table not yet built), each column is read
    whole (from the column cache on a large export), gathered, and let go, so what is held is
    the rows kept, not the table; otherwise (a trace set, a table already in memory) a frame
    of the columns (:func:`_table`)."""

    def __init__(self, trace: Any, name: str, columns: Sequence[str]) -> None:
        ranks = getattr(trace, "ranks", None)
        self.name = name
        self.frame: pl.DataFrame | None = None
        lazy = (name in _NARROW and not isinstance(ranks, pl.DataFrame) and hasattr(trace, "table")
                and hasattr(trace, "is_loaded") and not trace.is_loaded(name))
        if not lazy:
            self.frame = _table(trace, name, columns)
            self.columns = list(self.frame.columns)
            self.height = self.frame.height
            return
        from tracekit.nsys.schema import ON_REQUEST, TABLES

        self.trace = trace
        self.by_id = "name_id" in ON_REQUEST.get(name, {})
        self.columns = [c for c in columns if c in TABLES[name] or c == "report"]
        self.height = -1

    @classmethod
    def of(cls, name: str, frame: pl.DataFrame) -> _Columns:
        """A table already read whole (a small one: the CUDA graph launches)."""
        self = cls.__new__(cls)
        self.name, self.frame, self.columns, self.height = name, frame, list(frame.columns), frame.height
        return self

    def times(self) -> pl.DataFrame:
        """``start_ns`` and ``end_ns`` of every row (one read: a damaged row warns as the eager table does)."""
        if self.frame is not None:
            return self.frame.select("start_ns", "end_ns")
        frame = self.trace.table(self.name, ["start_ns", "end_ns"])
        self.height = frame.height
        return frame

    def take(self, columns: Sequence[str], rows: pl.Series | None = None) -> pl.DataFrame:
        """``columns`` (those the table has) at ``rows`` (row numbers; every row when ``None``)."""
        cols = [c for c in columns if c in self.columns]
        if self.frame is not None:
            frame = self.frame.select(cols)
            return frame if rows is None else frame[rows]
        if rows is None and self.height < 0:
            self.height = self.trace.table(self.name, ["start_ns"]).height
        n = self.height if rows is None else rows.len()
        out: list[pl.Series] = []
        for c in cols:
            if c == "report":
                out.append(pl.repeat(0, n, dtype=pl.Int64, eager=True).alias("report"))
                continue
            if c == "name" and self.by_id:
                ids = self.trace.table(self.name, ["name_id"])["name_id"]
                ids = ids if rows is None else ids.gather(rows)
                out.append(_names_of(self.trace, ids))
                continue
            s = self.trace.table(self.name, [c])[c]
            out.append(s if rows is None else s.gather(rows))
            del s
        return pl.DataFrame(out) if out else pl.DataFrame(schema={})

    def distinct(self, columns: Sequence[str], rows: pl.Series | None = None) -> pl.DataFrame:
        """The distinct values of ``columns`` (those the table has) at ``rows``: a column at a
        time for ``report`` (0 in one export) and in blocks of rows, so that no hash table
        of the whole table is built."""
        report = "report" in columns and self.frame is None
        cols = [c for c in columns if c in self.columns and not (report and c == "report")]
        frame = self.take(cols, rows)
        step = 1 << 19
        out = pl.concat([frame.slice(i, step).unique() for i in range(0, frame.height, step)] or [frame.head(0)]).unique()
        if report:
            out = out.select(pl.lit(0, pl.Int64).alias("report"), *cols)
        return out.select([c for c in columns if c in out.columns])

    def unique_names(self) -> pl.Series:
        """The distinct ``name`` values, as text."""
        if self.frame is not None or not self.by_id:
            return self.take(["name"]).select(pl.col("name").unique().cast(pl.Utf8))["name"]
        ids = self.trace.table(self.name, ["name_id"])["name_id"].unique()
        return _names_of(self.trace, ids).cast(pl.Utf8)


def _names_of(trace: Any, ids: pl.Series) -> pl.Series:
    """``StringIds`` ids → their text, as a categorical ``name`` column (looked up once per id)."""
    from tracekit.nsys.readers import lookup_strings

    frame = ids.alias("name_id").to_frame()
    u = frame.select(pl.col("name_id").unique())
    u = u.with_columns(lookup_strings(pl.col("name_id"), trace.strings).cast(pl.Categorical).alias("name"))
    return frame.join(u, on="name_id", how="left", maintain_order="left")["name"]


def _window_mask(win: tuple[int, int] | None, start: str = "start_ns", end: str | None = "end_ns") -> pl.Expr | None:
    """The rows :func:`_keep_window` keeps, as an expression (``None``: every row)."""
    if win is None:
        return None
    lo, hi = win
    if end is None:
        return (pl.col(start) >= lo) & (pl.col(start) < hi)
    return (pl.col(start) < hi) & ((pl.col(end) > lo) | (pl.col(start) >= lo))


@dataclass
class _Kept:
    """The rows of one streamed table that are written: their row numbers in the table and
    start times (for cutting the timeline into time slices)."""

    table: _Columns
    rows: pl.Series
    start: pl.Series

    def take(self, columns: Sequence[str], positions: np.ndarray | None = None) -> pl.DataFrame:
        rows = self.rows if positions is None else self.rows.gather(positions)
        return self.table.take(columns, rows)

    def distinct(self, columns: Sequence[str]) -> pl.DataFrame:
        return self.table.distinct(columns, self.rows)


def _keep_rows(table: _Columns, win: tuple[int, int] | None, keep_pids: pl.DataFrame | None,
               timed_only: bool = False) -> tuple[_Kept, int]:
    """The rows of ``table`` in the window (and of the kept processes); with ``timed_only``
    rows without a start or end are dropped first and counted (the second value)."""
    times = table.times()
    conds: list[pl.Expr] = []
    untimed = 0
    if timed_only:
        timed = pl.col("start_ns").is_not_null() & pl.col("end_ns").is_not_null()
        untimed = times.height - times.select(timed.sum()).item()
        if untimed:
            conds.append(timed)
    mask = _window_mask(win)
    if mask is not None:
        conds.append(mask)
    if keep_pids is not None:
        keys = table.take(["report", "pid"])
        keep = keys.join(keep_pids.with_columns(pl.lit(True).alias("_k")), on=["report", "pid"], how="left",
                         maintain_order="left")["_k"].fill_null(False)
        del keys
        times = times.with_columns(keep.alias("_keep"))
        conds.append(pl.col("_keep"))
    if conds:
        cond = conds[0]
        for c in conds[1:]:
            cond = cond & c
        idx = times.select(pl.arg_where(cond.fill_null(False)).alias("rows"))["rows"]
        start = times["start_ns"].gather(idx)
    else:
        idx = pl.int_range(0, times.height, dtype=pl.UInt32, eager=True).alias("rows")
        start = times["start_ns"]
    return _Kept(table, idx, start), untimed


def _bounds(starts: Sequence[pl.Series], rows: int) -> np.ndarray:
    """Time-slice boundaries: every ``rows``-th start of each table, merged, so that a slice
    holds at most ``rows`` rows of any one table."""
    cuts: list[np.ndarray] = []
    for s in starts:
        s = s.drop_nulls()
        if s.len() > rows:
            cuts.append(s.sort()[rows::rows].to_numpy())
    return np.unique(np.concatenate(cuts)) if cuts else np.zeros(0, dtype=np.int64)


def _slice_positions(start: pl.Series, bounds: np.ndarray) -> list[np.ndarray]:
    """For each time slice, the positions of the rows starting in it (a row without a start
    goes to the first: it is dropped as damaged when the slices are built)."""
    n = len(bounds) + 1
    if n == 1 or start.len() == 0:
        return [np.arange(start.len())] + [np.zeros(0, dtype=np.int64)] * (n - 1)
    lo = start.min()
    which = np.searchsorted(bounds, start.fill_null(lo).to_numpy(), side="right")
    order = np.argsort(which, kind="stable")
    counts = np.bincount(which, minlength=n)
    return np.split(order, np.cumsum(counts)[:-1])


def _frame_slices(frame: pl.DataFrame, start: str, bounds: np.ndarray) -> list[pl.DataFrame]:
    """``frame``'s rows by the time slice they start in."""
    return [frame[p] for p in _slice_positions(frame[start], bounds)]


def _flow_column(n: int, rows: np.ndarray, flows: np.ndarray) -> pl.Series:
    """``n`` nulls with ``flows`` at ``rows``."""
    out = pl.repeat(None, n, dtype=pl.Int64, eager=True)
    return out.scatter(pl.Series(rows, dtype=pl.Int64), pl.Series(flows, dtype=pl.Int64)) if len(rows) else out


def _pack(frame: pl.DataFrame) -> np.ndarray | None:
    """``(report, pid, correlation_id)`` of each row as one int64 key, in the same order
    (-1 where one is null); ``None`` when a value does not fit (report < 128, pid < 2²⁴,
    correlation id < 2³²)."""
    r, p, c = pl.col("report"), pl.col("pid"), pl.col("correlation_id")
    bad = frame.select(((r < 0) | (r >= 1 << 7) | (p < 0) | (p >= 1 << 24) | (c < 0) | (c >= 1 << 32)).any()).item()
    if bad:
        return None
    return frame.select((r * (1 << 56) + p * (1 << 32) + c).fill_null(-1).alias("k"))["k"].to_numpy()


def _flows(ops: list[_Kept], api: _Kept) -> tuple[list[pl.Series], pl.Series]:
    """Flow ids per kept row of each GPU-operation table and of the API calls: a launch call
    (the outermost call of its correlation id: earliest, longest) → the first GPU operation of
    that id (earliest; kernels before memcpys before memsets before graph launches, then table
    order), both written;
    ids 1…n in the order of (report, pid, correlation id). Sorts of packed int64 keys (one
    array per table) rather than joins of key columns; joins when the keys do not pack."""
    keys, starts, srcs, rows = [], [], [], []
    for i, k in enumerate(ops):
        key = _pack(k.take(["report", "pid", "correlation_id"]))
        if key is None:
            return _flows_joined(ops, api)
        start = k.start.fill_null(-1).to_numpy()
        pos = np.nonzero((key >= 0) & k.start.is_not_null().to_numpy())[0]
        keys.append(key[pos])
        starts.append(start[pos])
        srcs.append(np.full(len(pos), i, dtype=np.int8))
        rows.append(pos)
        del key, start
    key, start, src, row = (np.concatenate(x) for x in (keys, starts, srcs, rows))
    del keys, starts, srcs, rows
    order = np.lexsort((row, src, start, key))
    del start
    ks = key[order]
    first = order[np.r_[True, ks[1:] != ks[:-1]]] if len(ks) else order
    del ks, order
    op_key, op_src, op_row = key[first], src[first], row[first]
    del key, src, row, first

    akey = _pack(api.take(["report", "pid", "correlation_id"]))
    if akey is None:
        return _flows_joined(ops, api)
    at = np.searchsorted(op_key, akey).clip(0, max(len(op_key) - 1, 0))
    cand = np.nonzero((akey >= 0) & (op_key[at] == akey))[0] if len(op_key) else np.zeros(0, dtype=np.int64)
    del at
    kc = akey[cand]
    del akey
    se = api.take(["start_ns", "end_ns"], cand)
    order = np.lexsort((cand, -se["end_ns"].to_numpy(), se["start_ns"].to_numpy(), kc))
    del se
    ks = kc[order]
    first = order[np.r_[True, ks[1:] != ks[:-1]]] if len(ks) else order
    api_key, api_row = kc[first], cand[first]
    del kc, cand, order, ks, first

    _, io, ia = np.intersect1d(op_key, api_key, assume_unique=True, return_indices=True)
    flow = np.arange(1, len(io) + 1, dtype=np.int64)
    op_flows = [_flow_column(k.rows.len(), op_row[io][op_src[io] == i], flow[op_src[io] == i]) for i, k in enumerate(ops)]
    return op_flows, _flow_column(api.rows.len(), api_row[ia], flow)


def _flows_joined(ops: list[_Kept], api: _Kept) -> tuple[list[pl.Series], pl.Series]:
    """:func:`_flows` with joins of the key columns (keys that do not pack into an int64)."""
    keys = ["report", "pid", "correlation_id"]
    ops_keys = pl.concat([k.take(keys).with_columns(k.start.alias("start_ns")).with_row_index("_row").select(
        pl.lit(i).alias("_src"), "_row", *keys, "start_ns") for i, k in enumerate(ops)], how="vertical_relaxed").drop_nulls()
    first_op = ops_keys.sort("start_ns", "_src", "_row").unique(keys, keep="first")
    del ops_keys
    first_api = api.take([*keys, "start_ns", "end_ns"]).with_row_index("_row").drop_nulls("correlation_id")
    first_api = first_api.join(first_op.select(keys), on=keys, how="semi")  # only launches of a written operation
    first_api = first_api.sort(["start_ns", "end_ns", "_row"], descending=[False, True, False]).unique(keys, keep="first")
    linked = first_op.join(first_api.select(*keys, pl.col("_row").alias("_api_row")), on=keys, how="inner")
    del first_op, first_api
    linked = linked.sort(keys).with_row_index("_flow", offset=1)
    op_flows = []
    for i, k in enumerate(ops):
        li = linked.filter(pl.col("_src") == i)
        op_flows.append(_flow_column(k.rows.len(), li["_row"].to_numpy(), li["_flow"].to_numpy()))
    return op_flows, _flow_column(api.rows.len(), linked["_api_row"].to_numpy(), linked["_flow"].to_numpy())


@dataclass
class Timeline:
    """The timeline streamed (read once): :attr:`events` yields ``("slices", frame)`` chunks
    (frames of ``SLICE_SCHEMA``'s common columns and the argument columns they use; one track
    family after the other, each cut into time slices: within a track, slices in start order,
    longest first, a slice that is still open going on into the next chunks), then
    ``("family", empty frame)`` when a family ends (its tracks have no more slices: a writer
    closes their open slices), then ``("instants", frame)`` and ``("counters", frame)`` (one
    frame per memory timeline or GPU metric). ``tracks`` grows while the events are read
    (overlap tracks, counter tracks); ``skipped`` and ``notes`` are final once they are all read."""

    tracks: list[Track]
    events: Iterator[tuple[str, pl.DataFrame]]
    window: tuple[int, int] | None = None
    window_source: str | None = None
    skipped: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def build_model(
    trace: Any,
    *,
    window: tuple[int, int] | str | None = None,
    ranks: Sequence[int] | None = None,
    metrics: Sequence[str] | str = DEFAULT_METRICS,
) -> ExportModel:
    """The timeline of ``trace`` (an ``NsysTrace``, a ``TraceSet``, or a path: an export, or a
    folder of per-rank exports) that the exporters write, in memory (the exporters stream it:
    :func:`stream_model`).

    Parameters
    ----------
    window
        ``(start_ns, end_ns)`` on the trace's timeline, ``"steady"`` (the diagnosis's
        steady-state window, :func:`steady_bounds`) or ``None`` (everything). Slices that
        overlap it are kept whole, instants and counter samples inside it; each memory counter
        starts with its value at the window's start.
    ranks
        Keep only these ranks' processes (and the GPUs they ran on). A single report knows its
        ranks from its NCCL calls; a trace set from ``open_many``.
    metrics
        ``gpu_metrics.metric`` names written as counters, or ``"all"``.
    """
    tl = stream_model(trace, window=window, ranks=ranks, metrics=metrics)
    families: dict[int, list[pl.DataFrame]] = {}
    instants: list[pl.DataFrame] = []
    counters: list[pl.DataFrame] = []
    family = 0
    for kind, frame in tl.events:
        if kind == "family":
            family += 1
        elif kind == "slices":
            families.setdefault(family, []).append(frame)
        elif kind == "instants":
            instants.append(frame)
        else:
            counters.append(frame)
    parts = [pl.concat(f, how="vertical_relaxed").sort(["track", "start_ns", "end_ns"], descending=[False, False, True],
                                                       maintain_order=True) for f in families.values()]
    return ExportModel(tl.tracks, parts, _conform(instants, INSTANT_SCHEMA), _conform(counters, COUNTER_SCHEMA),
                       tl.window, tl.window_source, tl.skipped, tl.notes)


def stream_model(
    trace: Any,
    *,
    window: tuple[int, int] | str | None = None,
    ranks: Sequence[int] | None = None,
    metrics: Sequence[str] | str = DEFAULT_METRICS,
    slice_rows: int = SLICE_ROWS,
) -> Timeline:
    """:func:`build_model`'s timeline as a :class:`Timeline` whose events are built as they are
    read, in bounded memory: the large tables (kernels, memcpys, memsets, CUDA API calls) of
    one export are read a column at a time and only the rows in the window are kept (their row
    numbers and start times), then the timeline is built and handed on in time slices of at
    most ``slice_rows`` rows of each table. Launch flows are numbered over the whole window
    first; a slice open at a time slice's end stays open (the nesting check carries each
    track's open slices over). ``tracks`` up to the stream and NCCL tracks are known when this
    returns; the events are the same as :func:`build_model`'s."""
    trace = _as_trace(trace)
    source = None
    if isinstance(window, str):
        if window != "steady":
            parsed = parse_window(window)
            window = parsed if isinstance(parsed, tuple) else None
            source = "given"
        if window == "steady":
            lo, hi, source = steady_bounds(trace)
            window = (lo, hi)
    elif window is not None:
        window = (int(window[0]), int(window[1]))
        source = "given"
    win = window if isinstance(window, tuple) else None
    skipped: dict[str, int] = {}
    slice_rows = max(int(slice_rows), 1)

    kt = _Columns(trace, "kernels", _KERNEL_COLS)
    ct = _Columns(trace, "memcpys", _MEMCPY_COLS)
    st = _Columns(trace, "memsets", _MEMSET_COLS)
    gt = _Columns.of("graph_trace", graph_ops(trace))  # one row per graph replay: read whole
    at = _Columns(trace, "cuda_api", _API_COLS)
    nvtx = _table(trace, "nvtx", ["report", "pid", "tid", "event_type", "start_ns", "end_ns", "name", "domain"])
    nccl_source = trace if _may_use_nccl(trace, kt.unique_names(), nvtx) else _NoNccl()
    nccl = _table(nccl_source, "nccl", ["report", "rank", "pid", "tid", "host_start_ns", "host_end_ns", "op", "api", "bytes",
                                        "peer", "root", "comm_id", "comm_rank", "comm_nranks", "dtype", "reduction",
                                        "algorithm", "protocol", "kernel_count", "gpu_duration_ns"])
    memory = _table(trace, "memory_usage", ["report", "pid", "global_pid", "device_id", "context_id", "stream_id",
                                            "correlation_id", "start_ns", "address", "bytes", "mem_kind", "operation", "name"])

    # -- processes and ranks (every process of the trace, whatever the window)
    procs = pl.concat([*(t.distinct(["report", "pid"]) for t in (kt, ct, st, gt, at)),
                       *(f.select("report", "pid") for f in (nvtx, nccl, memory))],
                      how="vertical_relaxed").drop_nulls().unique().sort("report", "pid")
    if hasattr(trace, "ranks") and isinstance(trace.ranks, pl.DataFrame) and "report" in trace.ranks.columns:
        rank_of = trace.ranks.select("report", "pid", "rank").drop_nulls("pid").unique(["report", "pid"])
        per_report = trace.ranks.group_by("report").agg(pl.col("rank").drop_nulls().unique())
        single_rank = per_report.filter(pl.col("rank").list.len() == 1).select("report", pl.col("rank").list.first().alias("_r1"))
        procs = procs.join(rank_of, on=["report", "pid"], how="left").join(single_rank, on="report", how="left").with_columns(
            pl.col("rank").fill_null(pl.col("_r1"))).drop("_r1")
    else:
        nccl_ranks = (nccl.select("report", "pid", "rank").drop_nulls().unique(["report", "pid"]) if "rank" in nccl.columns
                      else pl.DataFrame())
        procs = procs.join(nccl_ranks, on=["report", "pid"], how="left") if nccl_ranks.height else (
            procs.with_columns(pl.lit(None, pl.Int64).alias("rank")))
    keep_pids = None
    if ranks is not None:
        wanted = sorted({int(r) for r in ranks})
        known = sorted(procs["rank"].drop_nulls().unique().to_list())
        if not known:
            msg = "ranks were asked for, but this trace has no rank information (no NCCL calls; open one report per rank with open_many)"
            raise TracekitError(msg)
        missing = [r for r in wanted if r not in known]
        if missing:
            msg = f"rank(s) {', '.join(map(str, missing))} not in this trace; it has rank(s) {', '.join(map(str, known))}"
            raise TracekitError(msg)
        procs = procs.filter(pl.col("rank").is_in(wanted))
        keep_pids = procs.select("report", "pid")

    def only(frame: pl.DataFrame) -> pl.DataFrame:
        return frame.join(keep_pids, on=["report", "pid"], how="semi") if keep_pids is not None else frame

    nvtx, nccl, memory = only(nvtx), only(nccl), only(memory)
    # kernels' and graph replays' devices (for the counters of the GPUs the ranks ran on) and
    # the kernels' span (for a note) over the whole (rank-filtered) table
    kernel_devices = (pl.concat([_keep_rows(t, None, keep_pids)[0].distinct(["report", "device_id"]) for t in (kt, gt)],
                                how="vertical_relaxed").unique() if keep_pids is not None
                      else pl.DataFrame(schema={"report": pl.Int64, "device_id": pl.Int64}))  # only used with ranks

    def kernel_span() -> tuple[Any, Any]:
        span = _keep_rows(kt, None, keep_pids)[0].take(["start_ns", "end_ns"])
        return span.select(pl.col("start_ns").min(), pl.col("end_ns").max()).row(0) if span.height else (None, None)

    repeated = procs.group_by("pid").len().filter(pl.col("len") > 1).height > 0
    pname = trace.processes
    if "report" not in pname.columns:
        pname = pname.with_columns(pl.lit(0, pl.Int64).alias("report"))
    pname = pname.select("report", "pid", pl.col("name").alias("pname")).drop_nulls("pid").unique(["report", "pid"])
    procs = procs.join(pname, on=["report", "pid"], how="left").sort("report", "pid")
    tnames = trace.threads
    if "report" not in tnames.columns:
        tnames = tnames.with_columns(pl.lit(0, pl.Int64).alias("report"))
    tnames = tnames.select("report", "pid", "tid", pl.col("name").alias("tname")).unique(["report", "pid", "tid"])

    def ext(report: int, ident: int) -> int:
        return (report + 1) * PID_STRIDE + ident if repeated else ident

    tracks = _Tracks()
    proc_uuid: dict[tuple[int, int], int] = {}
    for report, pid, rank, name in procs.select("report", "pid", "rank", "pname").iter_rows():
        label = f"{name or 'process'} (pid {pid})"
        if rank is not None:
            label = f"rank {rank} · {label}"
        proc_uuid[(report, pid)] = tracks.add(label, "process", pid=ext(report, pid))

    # -- the rows written: row numbers of the streamed tables, frames of the others
    api_k, untimed = _keep_rows(at, win, keep_pids, timed_only=True)
    if untimed:
        skipped["CUDA API calls without a start or end time (damaged rows)"] = untimed
    ops = [_keep_rows(t, win, keep_pids)[0] for t in (kt, ct, st, gt)]
    # graphs traced per node: each replay's span on a track of its own, above the streams
    replays = _keep_window(only(node_replays(trace)).filter(
        pl.col("start_ns").is_not_null() & pl.col("end_ns").is_not_null()), win)
    nv_ranges = nvtx.filter(pl.col("event_type") == "PushPop")
    open_ranges = nv_ranges.filter(pl.col("end_ns").is_null()).height
    if open_ranges:
        skipped["nvtx ranges never closed"] = open_ranges
    nv_ranges = nv_ranges.filter(pl.col("end_ns").is_not_null())
    nv_startend = nvtx.filter((pl.col("event_type") == "StartEnd") & pl.col("end_ns").is_not_null())
    skipped_se = nvtx.filter((pl.col("event_type") == "StartEnd") & pl.col("end_ns").is_null()).height
    if skipped_se:
        skipped["nvtx ranges never closed"] = skipped.get("nvtx ranges never closed", 0) + skipped_se
    marks = nvtx.filter(pl.col("event_type") == "Mark")
    del nvtx
    nv_ranges, nv_startend = _keep_window(nv_ranges, win), _keep_window(nv_startend, win)
    nccl_w = _keep_window(nccl.filter(pl.col("host_start_ns").is_not_null() & pl.col("host_end_ns").is_not_null()
                                      & pl.col("pid").is_not_null()), win, "host_start_ns", "host_end_ns")
    del nccl
    marks = _keep_window(marks, win, end=None)

    threads = pl.concat([api_k.distinct(["report", "pid", "tid"]), nv_ranges.select("report", "pid", "tid"),
                         marks.select("report", "pid", "tid")], how="vertical_relaxed").drop_nulls().unique()
    threads = threads.join(tnames, on=["report", "pid", "tid"], how="left").sort("report", "pid", "tid")
    thread_rows = []
    for report, pid, tid, tname in threads.iter_rows():
        uuid = tracks.add(f"{tname or 'thread'} {tid}", "thread", proc_uuid[(report, pid)], pid=ext(report, pid),
                          tid=ext(report, tid))
        thread_rows.append((report, pid, tid, uuid))
    thread_map = pl.DataFrame(thread_rows, schema={"report": pl.Int64, "pid": pl.Int64, "tid": pl.Int64, "track": pl.Int64},
                              orient="row")
    replay_rows = []
    for report, pid, dev in replays.select("report", "pid", "device_id").unique().sort(
            "report", "pid", "device_id", nulls_last=True).iter_rows():
        replay_rows.append((report, pid, dev, tracks.add(REPLAY_TRACK.format(dev), "graph", proc_uuid[(report, pid)])))
    replay_map = pl.DataFrame(replay_rows, schema={"report": pl.Int64, "pid": pl.Int64, "device_id": pl.Int64,
                                                   "track": pl.Int64}, orient="row")
    streams = pl.concat([k.distinct(["report", "pid", "device_id", "stream_id"]) for k in ops],
                        how="vertical_relaxed").unique().sort("report", "pid", "device_id", "stream_id", nulls_last=True)
    stream_rows = []
    for report, pid, dev, stream in streams.iter_rows():
        uuid = tracks.add(f"GPU {dev} · stream {stream}", "stream", proc_uuid[(report, pid)])
        stream_rows.append((report, pid, dev, stream, uuid))
    stream_map = pl.DataFrame(stream_rows, schema={"report": pl.Int64, "pid": pl.Int64, "device_id": pl.Int64,
                                                   "stream_id": pl.Int64, "track": pl.Int64}, orient="row")
    se_map = nc_map = None
    if nv_startend.height:
        se_rows = []
        for report, pid in nv_startend.select("report", "pid").unique().sort("report", "pid").iter_rows():
            se_rows.append((report, pid, tracks.add("NVTX start/end ranges", "nvtx", proc_uuid[(report, pid)])))
        se_map = pl.DataFrame(se_rows, schema={"report": pl.Int64, "pid": pl.Int64, "track": pl.Int64}, orient="row")
    if nccl_w.height:
        nc_rows = []
        for report, pid, tid in nccl_w.select("report", "pid", "tid").unique().sort("report", "pid", "tid").iter_rows():
            nc_rows.append((report, pid, tid, tracks.add(f"NCCL calls (thread {tid})", "nccl", proc_uuid[(report, pid)])))
        nc_map = pl.DataFrame(nc_rows, schema={"report": pl.Int64, "pid": pl.Int64, "tid": pl.Int64, "track": pl.Int64},
                              orient="row")

    # flows: a launch call → the first GPU operation of its correlation id (both written);
    # ids 1…n in the order of the launches' processes and correlation ids, kept per row
    op_flows, api_flows = _flows(ops, api_k)

    bounds = _bounds([api_k.start, *(k.start for k in ops), nv_ranges["start_ns"], nv_startend["start_ns"],
                      nccl_w["host_start_ns"], replays["start_ns"]], slice_rows)
    op_pos = [_slice_positions(k.start, bounds) for k in ops]
    api_pos = _slice_positions(api_k.start, bounds)
    for k in (*ops, api_k):
        k.start = k.start.clear()

    def stream_slices(j: int) -> list[pl.DataFrame]:
        from tracekit.analysis.families import with_family

        out = []
        for i, (k, pos) in enumerate(zip(ops, op_pos, strict=True)):
            p = pos[j]
            if not len(p):
                continue
            f = k.take((_KERNEL_COLS, _MEMCPY_COLS, _MEMSET_COLS, GRAPH_COLS)[i], p).with_columns(
                op_flows[i].gather(p).alias("flow_in"))
            f = _lookup(f, stream_map, ["report", "pid", "device_id", "stream_id"])
            if i == 3:
                out.append(graph_op_slices(f))
            elif i == 0:
                f = _by_unique_name(f, with_family)
                out.append(f.select(
                    "track", "start_ns", "end_ns", "name", pl.lit("kernel").alias("cat"), "flow_in",
                    pl.col("family").alias("a_family"), _dims("grid").alias("a_grid"), _dims("block").alias("a_block"),
                    pl.col("registers_per_thread").alias("a_registers"),
                    pl.col("static_shared_memory_bytes").alias("a_static_smem"),
                    pl.col("dynamic_shared_memory_bytes").alias("a_dynamic_smem"), pl.col("device_id").alias("a_device"),
                    pl.col("stream_id").alias("a_stream"), pl.col("correlation_id").alias("a_correlation"),
                ))
            elif i == 1:
                out.append(f.select(
                    "track", "start_ns", "end_ns", pl.format("Memcpy {}", pl.col("copy_kind")).alias("name"),
                    pl.lit("memcpy").alias("cat"), "flow_in", pl.col("bytes").alias("a_bytes"),
                    pl.col("copy_kind").alias("a_copy_kind"), pl.col("src_kind").alias("a_src_kind"),
                    pl.col("dst_kind").alias("a_dst_kind"), pl.col("device_id").alias("a_device"),
                    pl.col("stream_id").alias("a_stream"), pl.col("correlation_id").alias("a_correlation"),
                ))
            else:
                out.append(f.select(
                    "track", "start_ns", "end_ns", pl.lit("Memset").alias("name"), pl.lit("memset").alias("cat"), "flow_in",
                    pl.col("bytes").alias("a_bytes"), pl.col("value").alias("a_value"), pl.col("mem_kind").alias("a_mem_kind"),
                    pl.col("device_id").alias("a_device"), pl.col("stream_id").alias("a_stream"),
                    pl.col("correlation_id").alias("a_correlation"),
                ))
            del f
        return out

    nv_ranges_by = _frame_slices(nv_ranges, "start_ns", bounds)
    replays_by = _frame_slices(_lookup(replays, replay_map, ["report", "pid", "device_id"]), "start_ns", bounds)
    nv_se_by = _frame_slices(nv_startend, "start_ns", bounds)
    nccl_by = _frame_slices(nccl_w, "host_start_ns", bounds)
    del nv_ranges, nv_startend, nccl_w

    def thread_slices(j: int) -> list[pl.DataFrame]:
        out = []
        p = api_pos[j]
        if len(p):
            def clean(u: pl.DataFrame) -> pl.DataFrame:  # cudaLaunchKernel_v7000 → cudaLaunchKernel
                return u.with_columns(pl.col("name").str.replace(r"_v\d+$", "").cast(pl.Categorical).alias("_clean"))

            a = api_k.take(_API_COLS, p).with_columns(api_flows.gather(p).alias("flow_out"))
            a = _lookup(_by_unique_name(a, clean), thread_map, ["report", "pid", "tid"])
            out.append(a.select(
                "track", "start_ns", "end_ns", pl.col("_clean").alias("name"),
                pl.lit("cuda_api").alias("cat"), "flow_out", pl.col("correlation_id").alias("a_correlation"),
                pl.col("return_value").alias("a_return"),
            ))
            del a
        n = nv_ranges_by[j]
        if n.height:
            n = n.join(thread_map, on=["report", "pid", "tid"], how="left")
            out.append(n.select("track", "start_ns", "end_ns", pl.col("name").fill_null("(unnamed)"), pl.lit("nvtx").alias("cat"),
                                pl.col("domain").alias("a_domain")))
        return out

    def graph_replay_slices(j: int) -> list[pl.DataFrame]:
        r = replays_by[j]
        return [replay_slices(r)] if r.height else []

    def nvtx_slices(j: int) -> list[pl.DataFrame]:
        n = nv_se_by[j]
        if not n.height:
            return []
        n = n.join(se_map, on=["report", "pid"], how="left")  # type: ignore[arg-type]
        return [n.select("track", "start_ns", "end_ns", pl.col("name").fill_null("(unnamed)"), pl.lit("nvtx").alias("cat"),
                         pl.col("domain").alias("a_domain"))]

    def nccl_slices(j: int) -> list[pl.DataFrame]:
        n = nccl_by[j]
        if not n.height:
            return []
        n = n.join(nc_map, on=["report", "pid", "tid"], how="left", nulls_equal=True)  # type: ignore[arg-type]
        return [n.select(
            "track", pl.col("host_start_ns").alias("start_ns"), pl.col("host_end_ns").alias("end_ns"),
            pl.coalesce("api", pl.format("nccl{}", pl.col("op"))).alias("name"), pl.lit("nccl").alias("cat"),
            pl.col("op").alias("a_op"), pl.col("bytes").alias("a_bytes"), pl.col("peer").alias("a_peer"),
            pl.col("root").alias("a_root"),
            (pl.lit("0x") + pl.col("comm_id").map_elements(lambda v: format(v, "x"), return_dtype=pl.Utf8)).alias("a_comm")
            if "comm_id" in n.columns else pl.lit(None, pl.Utf8).alias("a_comm"),
            pl.col("comm_rank").alias("a_comm_rank"), pl.col("comm_nranks").alias("a_comm_nranks"),
            pl.col("dtype").alias("a_dtype"), pl.col("reduction").alias("a_reduction"), pl.col("algorithm").alias("a_algorithm"),
            pl.col("protocol").alias("a_protocol"), pl.col("kernel_count").alias("a_kernel_count"),
            pl.col("gpu_duration_ns").alias("a_gpu_duration"),
        )]

    instants = _conform([marks.join(thread_map, on=["report", "pid", "tid"], how="left").select(
        "track", pl.col("start_ns").alias("ts_ns"), pl.col("name").fill_null("(unnamed)"), pl.lit("nvtx").alias("cat"),
        pl.col("domain").alias("a_domain"))] if marks.height else [], INSTANT_SCHEMA).sort("track", "ts_ns")
    del marks
    tl = Timeline(tracks.items, iter(()), win, source, skipped, [])
    n_slices = len(bounds) + 1
    bad_what = "slices with a negative time, or ending before they start"

    def events() -> Iterator[tuple[str, pl.DataFrame]]:
        seen = False
        for builder in (stream_slices, graph_replay_slices, thread_slices, nvtx_slices, nccl_slices):
            nester = _Nester(tracks)
            for j in range(n_slices):
                frames = builder(j)
                if not frames:
                    continue
                part = _conform_part(frames)
                del frames
                # a timestamp before the session start has no place on the timeline (uint64), and a
                # slice that ends before it starts (a damaged export) cannot be drawn
                bad = (pl.col("start_ns") < 0) | (pl.col("end_ns") < pl.col("start_ns")) | pl.col("track").is_null()
                n_bad = part.select(bad.fill_null(True).sum()).item()
                if n_bad:
                    skipped[bad_what] = skipped.get(bad_what, 0) + n_bad
                    part = part.filter(~bad.fill_null(True))
                part = nester.step(part)
                if part.height:
                    seen = True
                    yield "slices", part
                del part
            moved = nester.finish()
            if moved is not None and moved.height:
                yield "slices", moved
            yield "family", pl.DataFrame()
        if instants.height:
            yield "instants", instants
        for part in _counters(trace, memory, kernel_devices, procs, proc_uuid, tracks, win, metrics, ranks is not None):
            yield "counters", part
        if not seen:
            if win is not None:
                k0, k1 = kernel_span()
                where = f"; its kernels run from {k0} to {k1} ns" if k0 is not None else ""
                tl.notes.append(f"no slice overlaps the window {win[0]}:{win[1]} ns (times since the session start){where}")
            else:
                tl.notes.append("the trace has no CUDA, NVTX or NCCL events to draw (was it captured with --trace=cuda,nvtx?)")

    tl.events = events()
    return tl


_COMMON = ("track", "start_ns", "end_ns", "name", "cat", "flow_out", "flow_in")


def _conform_part(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """Stack the slices of one track family with the common columns and only the argument
    columns they use (a column of nulls still costs 8 bytes a row); text as categoricals."""
    out = pl.concat(frames, how="diagonal_relaxed")
    cols = [*_COMMON, *(c for c, _, _ in ARGS if c in out.columns)]  # the same order whatever the frames
    text = pl.Categorical
    return out.select(
        (pl.col(c).cast(text if SLICE_SCHEMA[c] == pl.Utf8 else SLICE_SCHEMA[c]) if c in out.columns
         else pl.lit(None, SLICE_SCHEMA[c]).alias(c)) for c in cols
    )


def _conform(parts: list[pl.DataFrame], schema: dict[str, Any]) -> pl.DataFrame:
    if not parts:
        return pl.DataFrame(schema=schema)
    out = pl.concat(parts, how="diagonal_relaxed")
    return out.select(pl.col(c).cast(t) if c in out.columns else pl.lit(None, t).alias(c) for c, t in schema.items())


_ORDER, _DESC = ["track", "start_ns", "end_ns"], [False, False, True]


class _Nester:
    """:func:`_nest` over a track family handed on in time slices: each slice's rows that
    cross the end of an open slice of their track (open slices carried over from the earlier
    time slices) are held back; :meth:`finish` moves them to ``(overlap k)`` tracks."""

    def __init__(self, tracks: _Tracks) -> None:
        self.tracks = tracks
        self.stacks: dict[int, list[int]] = {}
        self.max_end: dict[int, int] = {}
        self.held: list[pl.DataFrame] = []

    def step(self, slices: pl.DataFrame) -> pl.DataFrame:
        """``slices`` (the next time slice) sorted by track, start, longest first, less the
        rows that cross (held back)."""
        slices = slices.filter(pl.col("track").is_not_null()).sort(_ORDER, descending=_DESC)
        if slices.height == 0:
            return slices
        carried = pl.DataFrame({"track": list(self.max_end), "_carry": list(self.max_end.values())},
                               schema={"track": pl.Int64, "_carry": pl.Int64})
        carry = slices.select("track").join(carried, on="track", how="left", maintain_order="left")["_carry"]
        # fast path: a track whose slices start after every earlier end (of this time slice
        # and the ones before) has nothing open but its last slice
        prev_end = pl.max_horizontal(pl.col("end_ns").cum_max().shift(1).over("track"), carry)
        stats = slices.with_columns(((pl.col("start_ns") < prev_end).fill_null(False)).alias("_ov")).group_by(
            "track", maintain_order=True).agg(pl.col("_ov").any(), pl.col("end_ns").max(), pl.col("end_ns").last().alias("_last"))
        walk = set()
        for track, ov, mx, last in stats.iter_rows():
            self.max_end[track] = max(mx, self.max_end.get(track, mx))
            if ov:
                walk.add(track)
            else:
                self.stacks[track] = [last]
        if not walk:
            return slices
        mask = slices["track"].is_in(list(walk)).to_numpy()
        idx = np.nonzero(mask)[0]
        sub = slices[idx]
        crossing = _crossing(sub["track"].to_numpy(), sub["start_ns"].to_numpy(), sub["end_ns"].to_numpy(), self.stacks)
        if not crossing.any():
            return slices
        drop = np.zeros(slices.height, dtype=bool)
        drop[idx[crossing]] = True
        keep = pl.Series(drop)
        self.held.append(slices.filter(keep))
        return slices.filter(~keep)

    def finish(self) -> pl.DataFrame | None:
        """The held-back rows on ``(overlap 1)`` tracks (one per track they came from), and
        further lanes where those cross each other, sorted; ``None`` when none."""
        if not self.held:
            return None
        held = pl.concat(self.held, how="diagonal_relaxed").sort(_ORDER, descending=_DESC, maintain_order=True)
        self.held = []
        lane1: dict[int, int] = {}
        for base in held["track"].unique(maintain_order=True).to_list():
            t = next(x for x in self.tracks.items if x.uuid == base)
            lane1[base] = self.tracks.add(f"{t.name} (overlap 1)", "overlap", t.parent)
        moved = held.with_columns(pl.col("track").replace_strict(lane1, return_dtype=pl.Int64))
        return _nest(moved, self.tracks, lane=1)


def _nest(slices: pl.DataFrame, tracks: _Tracks, lane: int = 0) -> pl.DataFrame:
    """Sort by track, start, longest first; move slices that cross the end of an enclosing
    slice of their track to ``(overlap k)`` sibling tracks (from ``lane + 1`` on) until every
    track nests."""
    order = _ORDER
    desc = _DESC
    slices = slices.filter(pl.col("track").is_not_null()).sort(order, descending=desc)
    by_uuid = {t.uuid: t for t in tracks.items}
    overlap_of: dict[tuple[int, int], int] = {}
    while slices.height:
        # fast path: tracks whose slices never overlap at all need no walk
        prev_end = pl.col("end_ns").cum_max().shift(1).over("track")
        overlapping = slices.select(((pl.col("start_ns") < prev_end).fill_null(False)).any().over("track"))
        mask = overlapping.to_series()
        if not mask.any():
            break
        idx = np.nonzero(mask.to_numpy())[0]
        sub = slices[idx]
        crossing = _crossing(sub["track"].to_numpy(), sub["start_ns"].to_numpy(), sub["end_ns"].to_numpy())
        if not crossing.any():
            break
        lane += 1
        rows = idx[crossing]
        old = slices["track"].to_numpy().copy()
        for i in rows:
            base = int(old[i])
            root = by_uuid[base]
            key = (base, lane)
            if key not in overlap_of:
                orig = root
                overlap_of[key] = tracks.add(f"{orig.name} (overlap {lane})", "overlap", orig.parent)
                by_uuid[overlap_of[key]] = tracks.items[-1]
            old[i] = overlap_of[key]
        slices = slices.with_columns(pl.Series("track", old, dtype=pl.Int64)).sort(order, descending=desc)
        if lane > 64:  # pathological input: stop moving, the viewer shows what it can
            break
    return slices


def _crossing(track: np.ndarray, start: np.ndarray, end: np.ndarray,
              stacks: dict[int, list[int]] | None = None) -> np.ndarray:
    """Rows (sorted by track, start, longest first) that start inside an open slice of their
    track and end after it. ``stacks``: each track's open slices (their ends) before these
    rows, updated in place."""
    out = np.zeros(track.size, dtype=bool)
    stacks = {} if stacks is None else stacks
    stack: list[int] = []
    cur = None
    for i, (t, s, e) in enumerate(zip(track.tolist(), start.tolist(), end.tolist(), strict=True)):
        if t != cur:
            stack = stacks.setdefault(t, [])
            cur = t
        while stack and stack[-1] <= s:
            stack.pop()
        if stack and e > stack[-1]:
            out[i] = True
            continue
        stack.append(e)
    return out


def _metric_names(trace: Any, metrics: Sequence[str] | str) -> list[str]:
    """The metrics to write: ``metrics``, or every metric the trace has for ``"all"``."""
    if metrics != "all":
        return list(metrics)
    db = getattr(trace, "db", None)
    if db is not None and hasattr(db, "has_table") and not getattr(trace, "is_loaded", lambda n: True)("gpu_metrics"):
        if not db.has_table("GPU_METRICS"):
            return []
        from tracekit.nsys.gpu_metrics import metric_descriptions

        return sorted(metric_descriptions(db)["metric"].unique().to_list())
    return sorted(trace.gpu_metrics["metric"].unique().to_list())


def _metric_samples(trace: Any, metrics: Sequence[str] | str, win: tuple[int, int] | None) -> pl.DataFrame:
    """GPU-metric samples of ``metrics``; from one export, only those rows are read (a long
    capture holds tens of millions of samples of a dozen metrics)."""
    if metrics != "all" and not metrics:
        return pl.DataFrame(schema={"device_id": pl.Int64, "timestamp_ns": pl.Int64, "metric": pl.Utf8,
                                    "metric_label": pl.Utf8, "value": pl.Int64})
    db = getattr(trace, "db", None)
    loaded = getattr(trace, "is_loaded", lambda name: True)("gpu_metrics")
    if db is None or loaded or not hasattr(db, "has_table"):
        return trace.gpu_metrics  # type: ignore[no-any-return]
    from tracekit.nsys.gpu_metrics import gpu_metric_samples

    if not db.has_table("GPU_METRICS"):
        return trace.gpu_metrics  # type: ignore[no-any-return]
    names = _metric_names(trace, metrics)
    lo, hi = win if win is not None else (None, None)
    return gpu_metric_samples(db, names, start_ns=lo, end_ns=hi)


def _counters(trace: Any, memory: pl.DataFrame, kernel_devices: pl.DataFrame, procs: pl.DataFrame,
              proc_uuid: dict[tuple[int, int], int], tracks: _Tracks, win: tuple[int, int] | None,
              metrics: Sequence[str] | str, by_rank: bool) -> Iterator[pl.DataFrame]:
    """Counter samples (``COUNTER_SCHEMA``): the memory counters, then one GPU metric at a
    time (its tracks are added when it is reached), each frame sorted by track and time."""
    from tracekit.analysis.memory import memory_timeline

    if memory.height:
        # one timeline per process and device: the process index stands in for a rank key
        index = procs.select("report", "pid").with_row_index("rank").with_columns(pl.col("rank").cast(pl.Int64))
        m = memory.join(index, on=["report", "pid"], how="inner")
        tl = memory_timeline(m)
        if tl.height:
            tl = tl.join(index, on="rank", how="left")
            rows = []
            for report, pid, dev in tl.select("report", "pid", "device_id").unique().sort("report", "pid", "device_id").iter_rows():
                rows.append((report, pid, dev, tracks.add(f"GPU {dev} memory in use", "counter", proc_uuid[(report, pid)],
                                                          unit="bytes")))
            cmap = pl.DataFrame(rows, schema={"report": pl.Int64, "pid": pl.Int64, "device_id": pl.Int64, "track": pl.Int64},
                                orient="row")
            tl = tl.join(cmap, on=["report", "pid", "device_id"], how="left", nulls_equal=True)
            # one sample per timestamp: the value after the last event at that nanosecond
            tl = tl.group_by("track", "start_ns", maintain_order=True).agg(pl.col("in_use_bytes").last())
            if win is not None:
                lo, hi = win
                before = tl.filter(pl.col("start_ns") < lo).group_by("track").agg(pl.col("in_use_bytes").last()).with_columns(
                    pl.lit(lo, pl.Int64).alias("start_ns"))
                inside = tl.filter((pl.col("start_ns") >= lo) & (pl.col("start_ns") < hi))
                tl = pl.concat([before.select(inside.columns), inside]).unique(["track", "start_ns"], keep="last",
                                                                               maintain_order=True)
            yield _conform([tl.select("track", pl.col("start_ns").alias("ts_ns"),
                                      pl.col("in_use_bytes").cast(pl.Float64).alias("value")).sort(
                "track", "ts_ns", maintain_order=True)], COUNTER_SCHEMA)
    # one metric at a time: a long capture's samples carry two text columns per row
    multi = procs["report"].n_unique() > 1
    gpu_uuid: dict[tuple[int, int], int] = {}
    for metric in _metric_names(trace, metrics):
        gm = _metric_samples(trace, [metric], win)
        if gm.height == 0:
            continue
        if "report" not in gm.columns:
            gm = gm.with_columns(pl.lit(0, pl.Int64).alias("report"))
        gm = gm.filter(pl.col("metric") == metric)
        if by_rank:
            gm = gm.join(kernel_devices, on=["report", "device_id"], how="semi")
        gm = gm.filter(pl.col("timestamp_ns") >= 0)  # before the session start: no place on the timeline
        gm = _keep_window(gm, win, "timestamp_ns", None)
        if gm.height == 0:
            continue
        metric_rows: list[tuple[int, int, int]] = []
        for report, dev, label in gm.select("report", "device_id", "metric_label").unique(
                ["report", "device_id"]).sort("report", "device_id").iter_rows():
            if (report, dev) not in gpu_uuid:
                gpu_uuid[(report, dev)] = tracks.add(f"report {report} · GPU {dev}" if multi else f"GPU {dev}", "gpu")
            unit = "%" if label and "%" in label else None
            metric_rows.append((report, dev, tracks.add(label or metric, "counter", gpu_uuid[(report, dev)], unit=unit)))
        gmap = pl.DataFrame(metric_rows, schema={"report": pl.Int64, "device_id": pl.Int64, "track": pl.Int64}, orient="row")
        g = gm.select("report", "device_id", "timestamp_ns", "value").join(gmap, on=["report", "device_id"], how="left")
        del gm
        counts = g.select("track", pl.col("timestamp_ns").alias("ts_ns"), pl.col("value").cast(pl.Float64)).sort(
            "track", "ts_ns", maintain_order=True)
        del g
        # each frame is sorted and holds tracks made after the previous frame's: no global sort
        yield _conform([counts], COUNTER_SCHEMA)
