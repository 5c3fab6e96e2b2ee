"""``NsysTrace``: one Nsight Systems export as lazily built, cached polars tables."""

from __future__ import annotations

import importlib
import logging
import warnings
from collections.abc import Callable, Collection
from functools import cached_property
from pathlib import Path
from typing import Any

import polars as pl

from tracekit.errors import DamagedRowsWarning, TraceFormatError
from tracekit.nsys import readers
from tracekit.nsys.columnar import ExportFolder
from tracekit.nsys.database import ExportDatabase, ExportSource
from tracekit.nsys.gpu_metrics import gpu_metrics
from tracekit.nsys.meta import TraceMeta, read_meta
from tracekit.nsys.nvtx import nvtx

log = logging.getLogger(__name__)


#: Tables an upper layer builds from a trace's tables: the layer that owns the analysis
#: registers its builder here (``tracekit.analysis.nccl`` registers ``"nccl"``), so this loader
#: never imports an analysis; :data:`DERIVED_PROVIDERS` names the module to load on first use.
DERIVED_TABLES: dict[str, Callable[[Any], pl.DataFrame]] = {}
DERIVED_PROVIDERS: dict[str, str] = {"nccl": "tracekit.analysis.nccl", "graphs": "tracekit.analysis.graphs",
                                     "operators": "tracekit.analysis.op_costs"}


def derived_table(trace: Any, name: str) -> pl.DataFrame:
    """Build derived table ``name`` of ``trace`` with its registered builder (loading the
    providing module, by name, the first time)."""
    builder = DERIVED_TABLES.get(name)
    if builder is None:
        importlib.import_module(DERIVED_PROVIDERS[name])  # the provider registers itself
        builder = DERIVED_TABLES[name]
    return builder(trace)


class IncompleteTraceWarning(UserWarning):
    """The export lacks whole kinds of data (no CUDA tables, no NVTX, no GPU list)."""


#: Rows of a full ``StringIds`` read that one lookup by key costs (measured, ~4):
#: :meth:`NsysTrace.strings_of` reads by key below a quarter of the table.
_LOOKUP_ROWS = 4


class NsysTrace:
    """An Nsight Systems SQLite export.

    Tables are polars ``DataFrame``s built on first access and cached; see
    ``docs/tables.md`` for every column. Use as a context manager, or call :meth:`close`,
    to release the file handle.

    Parameters
    ----------
    path
        The ``.sqlite`` export, or a folder that ``nsys export --type parquetdir`` (or
        ``arrowdir``) wrote (:mod:`tracekit.nsys.columnar`; ``engine`` and ``column_cache``
        do not apply to it). Open ``.nsys-rep`` files with :func:`tracekit.open`.
    engine
        ``"auto"`` (ADBC when installed), ``"adbc"`` or ``"sqlite3"``.
    source
        The report the export was made from, when tracekit exported it.
    column_cache
        Keep the columns of large tables as Arrow files so that later opens of the same,
        unchanged export skip SQLite (default on unless ``TRACEKIT_COLUMN_CACHE=0``; see
        :mod:`tracekit.nsys.column_cache`).

    Examples
    --------
    >>> import tracekit
    >>> trace = tracekit.open("sample_traces/llm_decode_1gpu/llm_decode_1gpu.sqlite")  # doctest: +SKIP
    >>> trace.kernels.select("name", "duration_ns").head()  # doctest: +SKIP
    """

    #: The profiler that recorded the trace (``"nsys"``; ``"torch.profiler"`` for a
    #: :class:`~tracekit.kineto.trace.KinetoTrace`): what a missing table's hint tells to capture with.
    profiler: str = "nsys"

    def __init__(
        self,
        path: str | Path,
        *,
        engine: str = "auto",
        source: Path | None = None,
        column_cache: bool | None = None,
    ) -> None:
        self.path = Path(path)
        self.source = source
        self.db: ExportSource
        if self.path.is_dir():  # nsys export --type parquetdir / arrowdir
            self.db = ExportFolder(self.path)
        else:
            self.db = ExportDatabase(self.path, engine=engine, column_cache=column_cache)
        if not self.db.tables & {"StringIds", "ThreadNames", "TARGET_INFO_SESSION_START_TIME"}:
            self.db.close()
            msg = (
                f"{self.path} is a SQLite database but not an Nsight Systems export (no StringIds "
                "table); open the file that `nsys export --type sqlite` wrote"
            )
            raise TraceFormatError(msg)
        if any(m.startswith("CUDA trace") for m in self.meta.missing):
            msg = f"{self.path.name}: incomplete export, missing " + "; ".join(self.meta.missing)
            warnings.warn(msg, IncompleteTraceWarning, stacklevel=2)

    def __repr__(self) -> str:
        return f"NsysTrace({str(self.path)!r}, nsys {self.meta.version})"

    def __enter__(self) -> NsysTrace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the file (tables already built stay usable)."""
        self.db.close()

    # -- metadata ---------------------------------------------------------------------
    @cached_property
    def meta(self) -> TraceMeta:
        """Versions, capture window, capture command and environment, missing data."""
        return read_meta(self.db)

    @cached_property
    def strings(self) -> pl.DataFrame:
        """The export's ``StringIds(id, value)`` table."""
        return readers.string_ids(self.db)

    def strings_of(self, *ids: pl.Series) -> pl.DataFrame:
        """The :attr:`strings` rows (``id``, ``value``) of the integer ids in ``ids`` (other
        values and nulls ignored); may hold more rows.

        :attr:`strings` itself when it is read already, kept in the column cache, when the
        table has no integer key (:func:`~tracekit.nsys.readers.strings_keyed`) or when the ids
        are a quarter of its rows or more; else only those rows are read, by the table's key
        (a lookup costs about four rows of a full read: 40 k kernel names of a 300 k-row table
        in 0.03 s against 0.07 s, and no column written to the cache). For a report that
        names a few thousand kernels of a cold export. Values are decoded as :attr:`strings`
        decodes them; values not read are not checked (no warning about them)."""
        db = self.db
        if "strings" in self.__dict__ or not isinstance(db, ExportDatabase) or not readers.strings_keyed(db):
            return self.strings
        if db.all_cached("StringIds", readers.STRING_EXPRS):
            return self.strings
        wanted = pl.concat([i.cast(pl.Int64, strict=False).drop_nulls() for i in ids]).unique() if ids else pl.Series("id", [], pl.Int64)
        if wanted.len() * _LOOKUP_ROWS >= db.row_count("StringIds"):
            return self.strings
        return readers.string_ids_of(db, wanted)

    # -- tables -----------------------------------------------------------------------
    @cached_property
    def kernels(self) -> pl.DataFrame:
        """One row per CUDA kernel execution."""
        return self._checked("kernels", readers.kernels(self.db, self.strings))

    @cached_property
    def memcpys(self) -> pl.DataFrame:
        """One row per memory copy (``copy_kind`` HtoD, DtoH, DtoD, PtoP …)."""
        return self._checked("memcpys", readers.memcpys(self.db))

    @cached_property
    def memsets(self) -> pl.DataFrame:
        """One row per memset."""
        return self._checked("memsets", readers.memsets(self.db))

    @cached_property
    def graph_trace(self) -> pl.DataFrame:
        """One row per CUDA graph launch as the GPU ran it (``--cuda-graph-trace=graph``,
        nsys's default: the graph's kernels are then not in :attr:`kernels`). Empty when graphs
        were traced per node or not used; :attr:`graphs` adds the launching call and NVTX path."""
        return self._checked("graph_trace", readers.graph_trace(self.db))

    @cached_property
    def graphs(self) -> pl.DataFrame:
        """:attr:`graph_trace` with the call that launched each graph (``cudaGraphLaunch``), its
        thread and the NVTX path it was launched under (``tracekit.analysis.graphs`` builds it)."""
        return derived_table(self, "graphs")

    @cached_property
    def syncs(self) -> pl.DataFrame:
        """CUDA synchronization events (stream, event, context syncs) as the GPU saw them."""
        return readers.syncs(self.db)

    @cached_property
    def cuda_api(self) -> pl.DataFrame:
        """CUDA runtime and driver API calls (``api`` says which)."""
        return self._checked("cuda_api", readers.cuda_api(self.db, self.strings))

    @cached_property
    def nvtx(self) -> pl.DataFrame:
        """Every NVTX event: ranges (null ``end_ns`` when left open), marks, domain rows."""
        return self._checked("nvtx", nvtx(self.db, self.strings))

    @cached_property
    def gpus(self) -> pl.DataFrame:
        """GPUs of the captured machine (all of them, used or not)."""
        return readers.gpus(self.db)

    @cached_property
    def processes(self) -> pl.DataFrame:
        """Processes (pid, name)."""
        return readers.processes(self.db)

    @cached_property
    def threads(self) -> pl.DataFrame:
        """Named threads (pid, tid, name)."""
        return readers.threads(self.db, self.strings)

    @cached_property
    def memory_usage(self) -> pl.DataFrame:
        """Device memory allocations and frees (``--cuda-memory-usage=true``)."""
        return readers.memory_usage(self.db, self.strings)

    @cached_property
    def gpu_metrics(self) -> pl.DataFrame:
        """GPU metric samples (``--gpu-metrics-devices``), long format with stable names."""
        return gpu_metrics(self.db)

    @cached_property
    def nccl(self) -> pl.DataFrame:
        """One row per NCCL call per rank (see ``tracekit.analysis.nccl``, which builds it)."""
        return derived_table(self, "nccl")

    def table(self, name: str, columns: Collection[str] | None = None) -> pl.DataFrame:
        """A table by name (``"kernels"``, ``"nvtx"`` …), or only its ``columns``.

        With ``columns``, a table already built is reused; otherwise only the raw columns
        they need are read, and the narrow frame is returned without being cached (reports
        use this: ``cuda_gpu_kern_sum`` reads two of the kernel table's 25 columns).
        """
        from tracekit.nsys.schema import ON_REQUEST, TABLES

        if name not in TABLES and name not in DERIVED_PROVIDERS:
            msg = f"unknown table {name!r}; choose one of {', '.join(sorted(TABLES))}"
            raise KeyError(msg)
        on_request = name in _PROJECTED_READERS and columns is not None and any(c in ON_REQUEST.get(name, ()) for c in columns)
        if columns is None or (self.is_loaded(name) and not on_request) or name not in _PROJECTED_READERS:
            frame: pl.DataFrame = getattr(self, name)
            return frame if columns is None else frame.select(readers.wanted_columns(name, columns))
        return self._checked(name, _PROJECTED_READERS[name](self, columns))

    def scan(self, name: str) -> pl.LazyFrame:
        """Table ``name`` (``"kernels"``, ``"nvtx"`` …) as a polars ``LazyFrame``: collecting
        a query reads only the export columns it needs, and filters rows as they are read.

        ``trace.scan(name).collect()`` equals ``trace.table(name)``. On an nsys
        ``parquetdir``/``arrowdir`` folder the event tables are read in windows of rows, so a
        selective query never holds a whole table; see :mod:`tracekit.nsys.lazy` and
        ``docs/tables.md`` ("Lazy tables").

        Examples
        --------
        >>> import polars as pl
        >>> long = (trace.scan("kernels")  # doctest: +SKIP
        ...         .filter(pl.col("duration_ns") > 1_000_000)
        ...         .group_by("name").agg(pl.len(), pl.col("duration_ns").sum())
        ...         .collect())

        Derived tables (``"nccl"``, built from the kernel, API and NVTX tables) are computed as
        ``trace.table(name)`` computes them and handed back lazy.
        """
        if name in DERIVED_PROVIDERS:  # no export table behind it to push a query into
            return self.table(name).lazy()
        from tracekit.nsys.lazy import scan

        return scan(self, name)

    def _checked(self, name: str, frame: pl.DataFrame) -> pl.DataFrame:
        """``frame``, after one warning if some of its rows end before they start (a damaged
        export): they are kept, as nsys keeps them (nsys-compatible reports print their
        negative durations), and the count says how many."""
        cols = set(frame.columns)
        # a GPU activity or API row always has both times and an NVTX event a start: a null there
        # is a cell of another type (text in an INTEGER column) that could not be read exactly
        must = ["start_ns"] if name == "nvtx" else ["start_ns", "end_ns"]
        present = [c for c in must if c in cols]
        if frame.height and present:
            missing = frame.select(pl.any_horizontal(pl.col(c).is_null() for c in present).sum()).item()
            if missing:
                warnings.warn(
                    f"{self.path.name}: {missing} {name} row(s) have no start or end time (a missing column, or "
                    "text in an INTEGER column); they are read with null times, never reinterpreted",
                    DamagedRowsWarning, stacklevel=3,
                )
        # NVTX ranges that end before they start are kept in ``nvtx`` (row numbers are range ids);
        # each use says what it does with them: nvtx_sum keeps them as nsys does, the range tree
        # of the attribution and projections leaves them out (nsys 2023.4 fails on them there)
        if name != "nvtx" and frame.height and ({"start_ns", "end_ns"} <= cols or "duration_ns" in cols):
            inverted = (pl.col("end_ns") < pl.col("start_ns")) if {"start_ns", "end_ns"} <= cols else (pl.col("duration_ns") < 0)
            bad = frame.select(inverted.sum()).item()
            if bad:
                warnings.warn(
                    f"{self.path.name}: {bad} {name} row(s) end before they start (a damaged export?); "
                    "they are kept as nsys keeps them, with negative durations",
                    DamagedRowsWarning, stacklevel=3,
                )
        if name != "nvtx" and frame.height and {"start_ns", "end_ns"} <= cols:
            late = frame.select(readers.implausible_end().sum()).item()
            if late:
                warnings.warn(
                    f"{self.path.name}: {late} {name} row(s) end more than an hour past the last start (a damaged "
                    "export?, e.g. an end of INT64_MAX); tables and nsys-compatible reports keep them as nsys does, "
                    "summaries and GPU-time analyses leave them out",
                    DamagedRowsWarning, stacklevel=3,
                )
        return frame

    def is_loaded(self, name: str) -> bool:
        """Whether table ``name`` was already built (and is held in memory)."""
        return isinstance(self.__dict__.get(name), pl.DataFrame)

    def unload(self, *names: str) -> None:
        """Let go of tables ``names`` built so far (those not built are skipped): a step of a
        long pipeline frees what an earlier step held; asking for one again reads it again."""
        for name in names:
            if self.is_loaded(name):
                del self.__dict__[name]

    def columns_on_demand(self, name: str, columns: Collection[str]) -> ColumnsOnDemand:
        """``columns`` of table ``name`` (one of ``kernels``, ``memcpys``, ``memsets``,
        ``syncs``, ``cuda_api``, ``nvtx``), each read when asked for and not kept: for a
        pipeline that needs a few rows of several columns of a huge table, such as the API
        call of each of a million kernels among 2.5 M calls (see :class:`ColumnsOnDemand`)."""
        if name not in _SOURCE_TABLES:
            msg = f"columns_on_demand reads {', '.join(_SOURCE_TABLES)}, not {name!r}"
            raise KeyError(msg)
        return ColumnsOnDemand(self, name, readers.wanted_columns(name, columns))


class ColumnsOnDemand:
    """Some columns of a trace table, read one at a time (``source[name]``, ``columns``),
    as :meth:`NsysTrace.columns_on_demand` gives them.

    A table the trace already built is served from memory. Otherwise the export's integer
    columns are first put in the column cache (one scan, only for those it lacks), and each
    column is then built from the cache when asked; only the last one read is kept. With
    the cache off (or a table too small for it) the columns are read together once and kept.
    """

    def __init__(self, trace: NsysTrace, name: str, columns: list[str]) -> None:
        self._trace, self._name, self.columns = trace, name, columns
        self._frame: pl.DataFrame | None = None
        self._cached: bool | None = None
        self._last: tuple[str, pl.Series] | None = None

    def __getitem__(self, column: str) -> pl.Series:
        if column not in self.columns:
            raise KeyError(column)
        if self._trace.is_loaded(self._name):
            return self._trace.table(self._name)[column]
        if not self._from_cache():
            if self._frame is None:
                self._frame = self._trace.table(self._name, self.columns)
            return self._frame[column]
        if self._last is None or self._last[0] != column:
            self._last = None  # let go of the column kept from the last read before this one is read
            self._last = (column, self._trace.table(self._name, [column])[column])
        return self._last[1]

    @property
    def one_at_a_time(self) -> bool:
        """Whether columns really come one at a time (from the column cache or an nsys folder,
        the cache filled on first use), rather than from one frame of all of them read once
        (cache off, or it could not be filled: a full disk, no room to write)."""
        return self._trace.is_loaded(self._name) or self._from_cache()

    def release(self) -> None:
        """Drop the column kept from the last read (it is read again when asked for)."""
        self._last = None

    def _from_cache(self) -> bool:
        """Whether columns come one at a time from the column cache (decided, and the cache
        filled, on first use) rather than from one frame read once."""
        if self._cached is None:
            self._cached = self._trace.db.cache_integer_columns(_SOURCE_TABLES[self._name], self._raw_sources())
        return self._cached

    def _raw_sources(self) -> list[str] | None:
        """The export columns :attr:`columns` are read or derived from, for the kernel table (25
        integer columns, of which diagnose reads 9: the rest would cost 16 more column reads of
        a cold cache) and the API table (diagnose reads 6 of 8: return values and call chains
        were a quarter of filling it, ~0.5 s of a cold diagnose on 5 M calls; a report that
        reads them later fills them then); ``None`` (every integer column) for the other tables."""
        if self._name == "kernels":
            raw, derived = readers.kernels_spec(self._trace.db, self._trace.strings)
        elif self._name == "cuda_api":
            raw, derived = readers.cuda_api_spec(self._trace.strings)
        else:
            return None
        roots = {r for c in self.columns for r in derived.get(c, pl.col(c)).meta.root_names()}
        if "duration_ns" in self.columns:  # read directly as "end" - "start" when neither is cached
            roots |= {"start_ns", "end_ns"}
        return [c.source for c in raw if c.target in roots]

    def gather_columns(self, columns: list[str], rows: pl.Series) -> list[pl.Series]:
        """``self[c].gather(rows)`` for each column. From the cache, ``cuda_api`` and
        ``kernels`` columns are derived after the gather (names looked up for the rows asked
        only)."""
        frame = self.gather_frame(list(dict.fromkeys(columns)), rows)
        return [frame[c] for c in columns]

    def gather_frame(self, columns: list[str], rows: pl.Series) -> pl.DataFrame:
        """:meth:`gather_columns` as a frame (``columns`` in their order), a column of one
        value held as that value once where derived from the cache
        (:func:`~tracekit.nsys.readers.gather_derived_frame`)."""
        if self._name not in ("cuda_api", "kernels") or self._trace.is_loaded(self._name) or not self._from_cache():
            return pl.DataFrame([self[c].gather(rows) for c in columns])
        db = self._trace.db
        if self._name == "kernels":
            source, (raw, derived) = readers.KERNEL_SOURCE, readers.kernels_spec(db, self._trace.strings)
        else:
            source, (raw, derived) = readers.CUDA_API_SOURCE, readers.cuda_api_spec(self._trace.strings)
        return readers.gather_derived_frame(db, source, self._name, raw, derived, columns, rows).select(columns)


_SOURCE_TABLES = {
    "kernels": "CUPTI_ACTIVITY_KIND_KERNEL",
    "memcpys": "CUPTI_ACTIVITY_KIND_MEMCPY",
    "memsets": "CUPTI_ACTIVITY_KIND_MEMSET",
    "syncs": "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
    "graph_trace": "CUPTI_ACTIVITY_KIND_GRAPH_TRACE",
    "cuda_api": "CUPTI_ACTIVITY_KIND_RUNTIME",
    "nvtx": "NVTX_EVENTS",
}


_PROJECTED_READERS: dict[str, Callable[[NsysTrace, Collection[str]], pl.DataFrame]] = {
    "kernels": lambda t, cols: readers.kernels(t.db, t.strings, cols),
    "memcpys": lambda t, cols: readers.memcpys(t.db, cols),
    "memsets": lambda t, cols: readers.memsets(t.db, cols),
    "syncs": lambda t, cols: readers.syncs(t.db, cols),
    "graph_trace": lambda t, cols: readers.graph_trace(t.db, cols),
    "cuda_api": lambda t, cols: readers.cuda_api(t.db, t.strings, cols),
    "nvtx": lambda t, cols: nvtx(t.db, t.strings, cols),
}
