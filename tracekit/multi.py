"""``tracekit.open_many``: one Nsight Systems report per rank (or node) as one set of tables.

Every table of a :class:`TraceSet` is the reports' tables stacked, with two leading columns:

``report``
    index of the report in :attr:`TraceSet.reports` (0-based, in path order);
``rank``
    the process's rank (:mod:`tracekit.analysis.ranks`: NCCL payload, capture environment,
    file name, device order, in that order; ``rank_source`` in ``TraceSet.ranks`` says which).
    In a report holding one rank process every row gets that rank; in a report holding several
    (``nsys profile torchrun …``) rows get the rank of their ``pid`` (or, for tables without a
    pid such as ``gpus`` and ``gpu_metrics``, of their ``device_id``), and rows of other
    processes get a null rank.

**One clock.** Each report's timeline starts at its own session start
(``TARGET_INFO_SESSION_START_TIME.utcEpochNs``). Every time column (``start_ns``, ``end_ns``,
``timestamp_ns``, ``launch_ns`` and every ``*_start_ns`` / ``*_end_ns``; durations are left
alone) is shifted by ``session_epoch_ns − min(session_epoch_ns)`` of its report, so all
reports share the timeline of the earliest one (``TraceSet.epoch_ns`` is its UTC zero). The
alignment is as good as the hosts' wall clocks (same host: exact; several nodes: NTP/PTP).

**One run.** The reports must be the ranks of one run (:mod:`tracekit.runs`: the same job or
command line, overlapping capture times, distinct ranks, processes and GPUs). Reports of
unrelated captures raise :class:`UnrelatedReportsError`, one line naming the report that does
not belong; with ``allow_unrelated=True`` they are opened side by side instead: each report
keeps its own clock, ``rank`` is null, :attr:`TraceSet.unrelated` says why, and analyses that
read a set as one job (``diagnose``, ``structure``, the summary of ranks, the HTML report, the
timeline export) refuse it with one line — open each report (``TraceSet.open(i)``) to look at
it.

**Failures.** A report that cannot be read is recorded in :attr:`TraceSet.failures`;
``policy="raise"`` raises :class:`ReportLoadError` instead, ``"warn"`` (default) also emits a
:class:`ReportSkippedWarning`, ``"skip"`` is silent.

**Parallel loading.** Reports are read in worker processes
(``concurrent.futures.ProcessPoolExecutor``; start method ``forkserver`` where available,
else ``spawn``; never ``fork``: polars' threads do not survive it, so the fork server imports
nothing and each worker imports tracekit itself); each worker returns picklable polars frames. ``max_workers=1`` reads in
this process. Tables not loaded up front (``tables=``) are read on first access, in parallel
again. As with any ``spawn``/``forkserver`` pool, a *script* must call :func:`open_many` under
``if __name__ == "__main__":`` (workers re-import the main script); when the workers cannot
start, the reports are read in this process with a :class:`ParallelLoadWarning`. Starting the
workers costs about a second (each worker's imports), so parallel loading pays off from a few
dozen reports or large ones.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
import warnings
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from tracekit.errors import TracekitError, TraceNotFoundError, UnrelatedReportsError
from tracekit.kineto.sniff import is_kineto
from tracekit.nsys.columnar import folder_format
from tracekit.runs import require_one_run

log = logging.getLogger(__name__)

__all__ = [
    "ALL_TABLES",
    "DEFAULT_TABLES",
    "POLICIES",
    "ParallelLoadWarning",
    "ReportFailure",
    "ReportLoadError",
    "ReportSkippedWarning",
    "TraceSet",
    "UnrelatedReportsError",
    "is_time_column",
    "open_many",
    "require_one_run",
]

#: Tables a :class:`TraceSet` can serve.
ALL_TABLES: tuple[str, ...] = (
    "kernels", "memcpys", "memsets", "syncs", "graph_trace", "cuda_api", "nvtx", "nccl", "gpus", "processes", "threads",
    "memory_usage", "gpu_metrics",
)
#: Tables read when the set is opened (the others on first access).
DEFAULT_TABLES: tuple[str, ...] = ("kernels", "memcpys", "memsets", "graph_trace", "cuda_api", "nvtx", "nccl", "gpus")
POLICIES: tuple[str, ...] = ("raise", "skip", "warn")
_REPORT_SUFFIXES = (".sqlite", ".nsys-rep", ".qdrep")


class ReportLoadError(TracekitError):
    """A report of a set could not be read (``policy="raise"``), or none could."""


class ReportSkippedWarning(UserWarning):
    """A report of a set could not be read and was left out (``policy="warn"``)."""


class ParallelLoadWarning(RuntimeWarning):
    """The worker processes could not start; the reports were read in this process."""


@dataclass(frozen=True)
class ReportFailure:
    """A report that could not be read: its path, the exception's class name and message."""

    path: Path
    error: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.error}: {self.message}"


def is_time_column(name: str) -> bool:
    """Whether a column holds a timestamp on the capture timeline (shifted by open_many)."""
    return name in ("start_ns", "end_ns", "timestamp_ns", "launch_ns") or name.endswith(("_start_ns", "_end_ns"))


# -- the worker --------------------------------------------------------------------------------
@dataclass
class _Loaded:
    path: Path
    tables: dict[str, pl.DataFrame] = field(default_factory=dict)
    candidates: pl.DataFrame | None = None
    epoch_ns: int | None = None
    version: str | None = None
    notes: list[str] = field(default_factory=list)
    failure: ReportFailure | None = None
    identity: Any = None  # tracekit.runs.RunIdentity


def _rank_processes(trace: Any) -> pl.DataFrame:
    """``pid``, ``device_id`` of the processes that issued NCCL calls, else ran kernels; one
    row with a null pid when the report has neither (its rank can still come from the
    environment or the file name)."""
    kernels = trace.kernels
    devices = kernels.group_by("pid").agg(pl.col("device_id").min())
    nccl = trace.nccl
    pids = nccl.select("pid").drop_nulls().unique() if nccl.height else kernels.select("pid").unique()
    out: pl.DataFrame = pids.join(devices, on="pid", how="left").sort("pid")
    if out.height == 0:
        return pl.DataFrame({"pid": [None], "device_id": [None]}, schema={"pid": pl.Int64, "device_id": pl.Int64})
    return out


def rank_identity(trace: Any, path: Path) -> tuple[pl.DataFrame, Any]:
    """The rank candidates (:func:`tracekit.analysis.ranks.rank_candidates`) and the
    :class:`tracekit.runs.RunIdentity` of one opened report."""
    from tracekit.analysis.nccl import comm_init_payloads
    from tracekit.analysis.ranks import rank_candidates
    from tracekit.runs import run_identity

    candidates = rank_candidates(_rank_processes(trace), comm_init_payloads(trace),
                                 environments=[p.environment for p in trace.meta.processes], file_name=path.name)
    return candidates, run_identity(trace, candidates, path=path)


def _load_report(path: Path, tables: Sequence[str], engine: str, with_ranks: bool) -> _Loaded:
    """Read ``tables`` (and, with ``with_ranks``, the rank candidates) of one report."""
    from tracekit.nsys.trace import NsysTrace
    from tracekit.opening import open as open_trace

    out = _Loaded(path=path)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            opened = open_trace(path, engine=engine)
            if not isinstance(opened, NsysTrace):
                msg = "not an Nsight Systems report"
                raise ReportLoadError(msg)
            trace = opened
            try:
                for name in tables:
                    out.tables[name] = getattr(trace, name)
                out.epoch_ns = trace.meta.session_epoch_ns
                out.version = trace.meta.version
                if with_ranks:
                    out.candidates, out.identity = rank_identity(trace, path)
            finally:
                trace.close()
        out.notes.extend(str(w.message) for w in caught)
    except Exception as exc:  # one bad report must not stop the set
        out.tables = {}
        out.failure = ReportFailure(path, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
    return out


#: Modules the fork server imports before it forks workers: none. Importing polars starts
#: threads (two jemalloc background threads and polars' out-of-core cleaner), and a worker
#: forked from a process with threads has only the forking one; one such worker hung
#: ``open_many`` for 240 s in a notebook on a loaded machine. Each worker imports tracekit
#: itself (~0.3 s, once per worker), and the server does not import ``__main__`` either.
_PRELOAD: tuple[str, ...] = ()


def _default_context() -> str:
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def _context(name: str) -> Any:
    ctx = multiprocessing.get_context(name)
    if name == "forkserver":
        # no effect once the server runs
        ctx.set_forkserver_preload(list(_PRELOAD))
    return ctx


def _run(
    paths: Sequence[Path],
    tables: Sequence[str],
    *,
    engine: str,
    with_ranks: bool,
    max_workers: int,
    mp_context: str,
) -> list[_Loaded]:
    if max_workers <= 1 or len(paths) <= 1:
        return [_load_report(p, tables, engine, with_ranks) for p in paths]
    ctx = _context(mp_context)
    results: dict[int, _Loaded] = {}
    broken = False
    with ProcessPoolExecutor(max_workers=min(max_workers, len(paths)), mp_context=ctx) as pool:
        futures: dict[int, Future[_Loaded]] = {
            i: pool.submit(_load_report, p, tuple(tables), engine, with_ranks) for i, p in enumerate(paths)
        }
        for i, fut in futures.items():
            try:
                results[i] = fut.result()
            except BrokenProcessPool as exc:  # a worker died (out of memory, a crash)
                broken = True
                results[i] = _Loaded(path=paths[i], failure=ReportFailure(paths[i], type(exc).__name__, str(exc)))
    if broken and all(r.failure is not None for r in results.values()):
        # no worker ever ran: typically a script without ``if __name__ == "__main__":``, which
        # spawned workers re-execute; read here instead
        msg = (
            "open_many: the worker processes could not start (in a script, put the call under "
            '`if __name__ == "__main__":`); reading the reports in this process'
        )
        warnings.warn(msg, ParallelLoadWarning, stacklevel=3)
        return [_load_report(p, tables, engine, with_ranks) for p in paths]
    return [results[i] for i in range(len(paths))]


# -- paths ---------------------------------------------------------------------------------------
def _natural_key(path: Path) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


def _resolve(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[Path]:
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    out: list[Path] = []
    for item in items:
        p = Path(item)
        if p.is_dir() and folder_format(p) is not None:  # one nsys parquetdir/arrowdir export
            out.append(p)
        elif p.is_dir():
            found = [f for f in p.iterdir() if f.is_file() and f.suffix in _REPORT_SUFFIXES]
            folders = [f for f in p.iterdir() if f.is_dir() and folder_format(f) is not None]
            sqlite_stems = {f.stem for f in found if f.suffix == ".sqlite"}
            # a report and its exports: read one export, the SQLite file before a folder, a
            # parquetdir before an arrowdir of the same report (both were read, as two ranks)
            out.extend(f for f in found if f.suffix == ".sqlite")
            by_stem: dict[str, Path] = {}
            for f in sorted(folders, key=lambda f: (f.stem, folder_format(f) != "parquet", f.name)):
                by_stem.setdefault(f.stem, f)
            out.extend(f for stem, f in by_stem.items() if stem not in sqlite_stems)
            exported = sqlite_stems | {f.stem for f in folders}
            out.extend(f for f in found if f.suffix != ".sqlite" and f.stem not in exported)
            # PyTorch profiler traces, told by content (rank-0.json.gz, *.pt.trace.json …)
            out.extend(f for f in p.iterdir() if f.is_file() and f.suffix not in _REPORT_SUFFIXES and is_kineto(f))
        else:
            out.append(p)
    if not out:
        msg = (f"no Nsight Systems reports (.sqlite, .nsys-rep) or PyTorch profiler traces (*.pt.trace.json[.gz]) in {paths}; "
               "pass report files or their folder")
        raise TraceNotFoundError(msg)
    return sorted(dict.fromkeys(out), key=_natural_key)


# -- the set ---------------------------------------------------------------------------------------
class TraceSet:
    """Tables of several Nsight Systems reports (one per rank or node) on one clock.

    Build it with :func:`open_many`. Tables are polars frames with ``report`` and ``rank``
    columns first (see the module docs for how both are set and how times are aligned).

    Attributes
    ----------
    reports
        One row per report read: ``report``, ``path``, ``ranks`` (list), ``session_epoch_ns``,
        ``offset_ns`` (added to its time columns), ``nsys_version``, ``notes``.
    ranks
        One row per rank process: ``report``, ``pid``, ``device_id``, ``rank``,
        ``rank_source`` and the candidate columns of
        :func:`tracekit.analysis.ranks.rank_candidates`.
    failures
        :class:`ReportFailure` per report that could not be read.
    notes
        How ranks were chosen when the first choice was ambiguous.
    epoch_ns
        UTC epoch (ns) of the common timeline's 0.
    """

    def __init__(
        self,
        loaded: Sequence[_Loaded],
        failures: Sequence[ReportFailure],
        *,
        engine: str,
        max_workers: int,
        mp_context: str,
        unrelated: str | None = None,
    ) -> None:
        self.failures: list[ReportFailure] = list(failures)
        #: Why the reports are not one run, when they were opened side by side
        #: (``allow_unrelated=True``); None for the ranks of one run.
        self.unrelated: str | None = unrelated
        self._paths = [item.path for item in loaded]
        #: What recorded the reports: ``"torch.profiler"`` when every one is a torch.profiler
        #: trace, else ``"nsys"`` (as :attr:`tracekit.nsys.trace.NsysTrace.profiler`: which
        #: capture the hints name).
        self.profiler = "torch.profiler" if loaded and all(is_kineto(item.path) for item in loaded) else "nsys"
        self._engine, self._max_workers, self._mp_context = engine, max_workers, mp_context
        self.notes: list[str] = []
        epochs = [item.epoch_ns for item in loaded]
        known = [e for e in epochs if e is not None]
        self.epoch_ns: int | None = min(known) if known else None
        offsets = [0 if (e is None or self.epoch_ns is None) else e - self.epoch_ns for e in epochs]
        if len(known) < len(epochs):
            self.notes.append("some reports have no session start time; their times are not shifted")
        if unrelated is not None:  # side by side: each report on its own clock, no ranks
            offsets = [0] * len(epochs)
            self.notes.append(f"opened side by side, not as ranks: {unrelated}")
        self._offsets = offsets
        kept = len(self.notes)
        self.ranks = self._assign_ranks(loaded)
        if unrelated is not None:
            del self.notes[kept:]  # how ranks were chosen: there are none
            self.ranks = self.ranks.with_columns(pl.lit(None, pl.Int64).alias("rank"),
                                                 pl.lit("side by side", pl.Utf8).alias("rank_source"))
        self.reports = pl.DataFrame(
            {
                "report": pl.Series(range(len(loaded)), dtype=pl.Int64),
                "path": [str(p) for p in self._paths],
                "session_epoch_ns": pl.Series(epochs, dtype=pl.Int64),
                "offset_ns": pl.Series(offsets, dtype=pl.Int64),
                "nsys_version": pl.Series([item.version for item in loaded], dtype=pl.Utf8),
                "notes": pl.Series([item.notes for item in loaded], dtype=pl.List(pl.Utf8)),
            }
        )
        per_report = self.ranks.group_by("report").agg(pl.col("rank").sort().alias("ranks"))
        self.reports = self.reports.join(per_report, on="report", how="left", maintain_order="left").select(
            "report", "path", "ranks", "session_epoch_ns", "offset_ns", "nsys_version", "notes"
        )
        self._tables: dict[str, pl.DataFrame] = {}
        for name in {n for item in loaded for n in item.tables}:
            self._tables[name] = self._combine(name, [item.tables.get(name) for item in loaded])

    # -- ranks ------------------------------------------------------------------------------------
    def _assign_ranks(self, loaded: Sequence[_Loaded]) -> pl.DataFrame:
        from tracekit.analysis.ranks import choose_ranks, rank_candidates

        parts = []
        for i, item in enumerate(loaded):
            cand = item.candidates
            if cand is None or cand.height == 0:
                cand = rank_candidates(
                    pl.DataFrame({"pid": [None], "device_id": [None]}, schema={"pid": pl.Int64, "device_id": pl.Int64}),
                    None, file_name=item.path.name,
                )
            parts.append(cand.with_columns(pl.lit(i, pl.Int64).alias("report")))
        if not parts:
            return pl.DataFrame(schema={"report": pl.Int64, "pid": pl.Int64, "device_id": pl.Int64, "rank": pl.Int64,
                                        "rank_source": pl.Utf8})
        cands = pl.concat(parts, how="vertical_relaxed")
        chosen, notes = choose_ranks(cands, keys=["report"])
        self.notes.extend(notes)
        for note in notes:
            log.info("open_many: %s", note)
        cols = ["report", "pid", "device_id", "rank", "rank_source", "rank_nccl", "rank_env", "env_var", "rank_file",
                "rank_device"]
        return chosen.select(cols).sort("rank")

    def _rank_columns(self, frame: pl.DataFrame, report: int) -> pl.DataFrame:
        mine = self.ranks.filter(pl.col("report") == report)
        lead = [pl.lit(report, pl.Int64).alias("report")]
        if mine.height == 1:
            return frame.select(*lead, pl.lit(mine["rank"][0], pl.Int64).alias("rank"),
                                pl.exclude("report", "rank"))
        base = frame.drop([c for c in ("report", "rank") if c in frame.columns])
        if "pid" in base.columns:
            m = mine.select("pid", pl.col("rank").alias("_rank"))
            base = base.join(m, on="pid", how="left", maintain_order="left")
        elif "device_id" in base.columns:
            by_dev = mine.drop_nulls("device_id").filter(pl.col("device_id").is_unique())
            base = base.join(by_dev.select("device_id", pl.col("rank").alias("_rank")), on="device_id", how="left",
                             maintain_order="left")
        else:
            base = base.with_columns(pl.lit(None, pl.Int64).alias("_rank"))
        return base.select(*lead, pl.col("_rank").alias("rank"), pl.exclude("_rank"))

    def _combine(self, name: str, frames: Sequence[pl.DataFrame | None]) -> pl.DataFrame:
        parts = []
        for report, frame in enumerate(frames):
            if frame is None:
                continue
            offset = self._offsets[report]
            shifted = frame.with_columns(
                (pl.col(c) + offset).alias(c) for c in frame.columns if is_time_column(c) and offset
            )
            shifted = self._rank_columns(shifted, report)
            if name == "nccl":
                src = self.ranks.filter(pl.col("report") == report).select("pid", pl.col("rank_source").alias("_src"))
                shifted = shifted.join(src, on="pid", how="left", maintain_order="left").with_columns(
                    pl.col("_src").alias("rank_source")
                ).drop("_src")
            parts.append(shifted)
        if not parts:
            from tracekit.nsys.schema import TABLES, empty

            if name in TABLES:
                return empty(name).select(pl.lit(None, pl.Int64).alias("report"), pl.lit(None, pl.Int64).alias("rank"), pl.all())
            return pl.DataFrame(schema={"report": pl.Int64, "rank": pl.Int64})
        out = pl.concat(parts, how="diagonal_relaxed")
        if name == "nccl":
            out = _infer_set_nranks(out)
        return out

    # -- tables -------------------------------------------------------------------------------------
    def table(self, name: str) -> pl.DataFrame:
        """A table by name (``"kernels"``, ``"nccl"`` …); read from every report on first use."""
        if name not in ALL_TABLES:
            msg = f"unknown table {name!r}; choose one of {', '.join(ALL_TABLES)}"
            raise KeyError(msg)
        if name not in self._tables:
            loaded = _run(self._paths, (name,), engine=self._engine, with_ranks=False,
                          max_workers=self._max_workers, mp_context=self._mp_context)
            frames = []
            for item in loaded:
                if item.failure is not None:
                    msg = f"{item.failure}; the report was readable when the set was opened"
                    raise ReportLoadError(msg)
                frames.append(item.tables[name])
            self._tables[name] = self._combine(name, frames)
        return self._tables[name]

    @property
    def kernels(self) -> pl.DataFrame:
        """Kernels of every report."""
        return self.table("kernels")

    @property
    def memcpys(self) -> pl.DataFrame:
        """Memory copies of every report."""
        return self.table("memcpys")

    @property
    def memsets(self) -> pl.DataFrame:
        """Memsets of every report."""
        return self.table("memsets")

    @property
    def syncs(self) -> pl.DataFrame:
        """Synchronisation events of every report."""
        return self.table("syncs")

    @property
    def graph_trace(self) -> pl.DataFrame:
        """CUDA graph launches traced whole, of every report."""
        return self.table("graph_trace")

    @property
    def graphs(self) -> pl.DataFrame:
        """:func:`tracekit.analysis.graphs.graph_launches` of the set (each launch's call and NVTX path)."""
        from tracekit.analysis.graphs import graph_launches

        cols = ["rank", "pid", "global_pid", "device_id", "stream_id", "correlation_id", "start_ns", "end_ns", "graph_node_id"]
        return graph_launches(self.graph_trace, self.cuda_api, kernels=self.kernels.select([c for c in cols if c in self.kernels.columns]),
                              memcpys=self.memcpys.select([c for c in cols if c in self.memcpys.columns]),
                              memsets=self.memsets.select([c for c in cols if c in self.memsets.columns]), nvtx=self.nvtx)

    @property
    def cuda_api(self) -> pl.DataFrame:
        """CUDA API calls of every report."""
        return self.table("cuda_api")

    @property
    def nvtx(self) -> pl.DataFrame:
        """NVTX events of every report (each report's rows in its file order)."""
        return self.table("nvtx")

    @property
    def nccl(self) -> pl.DataFrame:
        """NCCL calls of every report (``comm_nranks`` inferred across the set when unknown)."""
        return self.table("nccl")

    @property
    def gpus(self) -> pl.DataFrame:
        """GPUs of every report."""
        return self.table("gpus")

    @property
    def processes(self) -> pl.DataFrame:
        """Processes of every report."""
        return self.table("processes")

    @property
    def threads(self) -> pl.DataFrame:
        """Named threads of every report."""
        return self.table("threads")

    @property
    def memory_usage(self) -> pl.DataFrame:
        """Device memory events of every report."""
        return self.table("memory_usage")

    @property
    def gpu_metrics(self) -> pl.DataFrame:
        """GPU metric samples of every report."""
        return self.table("gpu_metrics")

    # -- misc ---------------------------------------------------------------------------------------
    @property
    def paths(self) -> list[Path]:
        """Paths of the reports read, in ``report`` order."""
        return list(self._paths)

    def __len__(self) -> int:
        return len(self._paths)

    def __iter__(self) -> Iterator[Path]:
        return iter(self._paths)

    def __repr__(self) -> str:
        if self.unrelated is not None:
            return f"TraceSet({len(self)} reports side by side, not one run, {len(self.failures)} failed)"
        ranks = self.ranks["rank"].drop_nulls()
        span = f"ranks {ranks.min()!s}–{ranks.max()!s}" if ranks.len() else "no ranks"
        return f"TraceSet({len(self)} reports, {span}, {len(self.failures)} failed)"

    def open(self, report: int) -> Any:
        """Open report number ``report`` as an :class:`~tracekit.nsys.trace.NsysTrace` (its own clock)."""
        from tracekit.opening import open as open_trace

        return open_trace(self._paths[report], engine=self._engine)


def check_one_run(loaded: Sequence[_Loaded], paths: Any, *, allow_unrelated: bool) -> str | None:
    """Why the ``loaded`` reports are not one run (None when they are). Raises
    :class:`UnrelatedReportsError` unless ``allow_unrelated``."""
    from tracekit.runs import unrelated_reason

    where = str(paths) if isinstance(paths, (str, os.PathLike)) else ""
    reason = unrelated_reason([item.identity for item in loaded if item.identity is not None], where=where)
    if reason is not None and not allow_unrelated:
        msg = (f"{reason}; give the reports of one run, or compare them side by side (tracekit summary/diagnose "
               "--side-by-side; open_many(..., allow_unrelated=True))")
        raise UnrelatedReportsError(msg, reason)
    return reason


def _infer_set_nranks(nccl: pl.DataFrame) -> pl.DataFrame:
    """``comm_nranks`` = ranks of the set that use the communicator, where no payload said."""
    if nccl.height == 0 or "comm_id" not in nccl.columns:
        return nccl
    seen = pl.col("rank").n_unique().over("comm_id")
    fill = (pl.col("nranks_source") != "payload") & pl.col("comm_id").is_not_null() & (seen > 1)
    return nccl.with_columns(
        pl.when(fill).then(seen.cast(pl.Int64)).otherwise(pl.col("comm_nranks")).alias("comm_nranks"),
        pl.when(fill).then(pl.lit("inferred")).otherwise(pl.col("nranks_source")).alias("nranks_source"),
    )


def open_many(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    *,
    policy: str = "warn",
    tables: Sequence[str] = DEFAULT_TABLES,
    max_workers: int | None = None,
    engine: str = "auto",
    mp_context: str | None = None,
    allow_unrelated: bool = False,
) -> TraceSet:
    """Open one Nsight Systems report per rank (or node) as a :class:`TraceSet`.

    Parameters
    ----------
    paths
        Report files (``.sqlite``; ``.nsys-rep`` are exported as by :func:`tracekit.open`), or
        a folder holding them (a ``.nsys-rep`` next to its ``.sqlite`` is read once, from the
        export). Read in natural path order (``rank2`` before ``rank10``).
    policy
        What a report that cannot be read does: ``"warn"`` (leave it out, warn, record it in
        ``failures``), ``"skip"`` (leave it out, record it) or ``"raise"``
        (:class:`ReportLoadError`). When no report can be read, :class:`ReportLoadError` is
        raised whatever the policy.
    tables
        Tables read now (the others are read on first access).
    max_workers
        Worker processes (default: one per CPU, at most one per report); 1 reads in this
        process.
    engine
        SQLite reader of each report (``"auto"``, ``"adbc"``, ``"sqlite3"``). ``tracekit.open_many``
        also takes ``"dask"`` (with ``client=``): each report reduced per rank on a
        ``dask.distributed`` cluster, a :class:`tracekit.scale.reduced.ReducedSet` back — never
        the ranks' raw rows (docs/scale.md).
    mp_context
        ``multiprocessing`` start method of the workers: ``"forkserver"`` where available (the
        server imports tracekit once and forks each worker from it), else ``"spawn"``.
        ``"fork"`` can hang polars (its thread pool does not survive a fork).
    allow_unrelated
        Reports that are not one run (:mod:`tracekit.runs`) raise :class:`UnrelatedReportsError`
        naming the one that does not belong; with ``True`` they are opened side by side instead
        (own clocks, null ``rank``, :attr:`TraceSet.unrelated` saying why; see the module doc).

    Examples
    --------
    >>> ts = tracekit.open_many("sample_traces/llm_tp2_nccl_per_rank/")  # doctest: +SKIP
    >>> ts.nccl.group_by("rank", "op").len()  # doctest: +SKIP
    """
    if engine == "dask":
        msg = "engine='dask' is served by tracekit.open_many (tracekit.scale), which this process-pool loader sits under"
        raise ValueError(msg)
    if policy not in POLICIES:
        msg = f"unknown policy {policy!r}; use one of {', '.join(POLICIES)}"
        raise ValueError(msg)
    unknown = [t for t in tables if t not in ALL_TABLES]
    if unknown:
        msg = f"unknown table(s) {', '.join(unknown)}; choose from {', '.join(ALL_TABLES)}"
        raise ValueError(msg)
    files = _resolve(paths)
    mp_context = mp_context or _default_context()
    workers = max_workers if max_workers is not None else min(len(files), os.cpu_count() or 1)
    loaded = _run(files, tuple(dict.fromkeys(tables)), engine=engine, with_ranks=True, max_workers=workers,
                  mp_context=mp_context)
    good = [item for item in loaded if item.failure is None]
    failures = [item.failure for item in loaded if item.failure is not None]
    if failures and policy == "raise":
        msg = f"{len(failures)} of {len(files)} reports could not be read; first: {failures[0]}"
        raise ReportLoadError(msg)
    if not good:
        msg = f"none of the {len(files)} reports could be read; first: {failures[0]}"
        raise ReportLoadError(msg)
    unrelated = check_one_run(good, paths, allow_unrelated=allow_unrelated)
    if policy == "warn":
        for failure in failures:
            warnings.warn(f"left out {failure}", ReportSkippedWarning, stacklevel=2)
    return TraceSet(good, failures, engine=engine, max_workers=workers, mp_context=mp_context, unrelated=unrelated)
