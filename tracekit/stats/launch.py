"""Kernel launch and execution timing: ``cuda_kern_exec_trace`` and ``cuda_kern_exec_sum``.

Each kernel is joined to its launching API call (same correlation id and process). The
*queue* time is the wait from the end of the API call to the start of the kernel; nsys leaves
it empty when the kernel started before the call returned (a start exactly at the return
queues for 0 ns). The *total* runs from the start
of the call to whichever ends last, the call or the kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import polars as pl

from tracekit.analysis._frames import PID_UNIT, is_identity, max_int
from tracekit.analysis.attribution import launch_pairs
from tracekit.analysis.op_launches import (
    KERNEL_TABLE,
    derived_source,
    kernel_launch_calls,
    lean_api_rows,
    narrows_launch_calls,
)
from tracekit.errors import UnsupportedReportError
from tracekit.nsys.database import prefetch_columns
from tracekit.nsys.launch_scans import API_TABLE, EXEC_SUM_KERNEL_COLUMNS, LAUNCH_API_COLUMNS
from tracekit.nsys.readers import lookup_strings
from tracekit.stats.common import Report, group_numbers
from tracekit.stats.nvtx_projection import names_are_ids, op_rows, resolve_names
from tracekit.stats.summaries import api_display_name

if TYPE_CHECKING:
    from tracekit.analysis.op_launches import _Unpinned
    from tracekit.nsys.readers import TableColumns
    from tracekit.nsys.trace import NsysTrace


def _require(trace: NsysTrace, report: str) -> None:
    missing = [t for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME") if not trace.db.has_table(t)]
    if missing:
        msg = f"{trace.path.name} has no {', '.join(missing)} table, so it cannot give {report}: capture with --trace=cuda"
        raise UnsupportedReportError(msg)


GRID = ["grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"]
# over the columns of _launched (all ns): queue wait, API and total durations, process id
_QUEUE = pl.col("start_ns") - pl.col("api_end_ns")
_QUEUE_DURATION = pl.when(_QUEUE >= 0).then(_QUEUE)
_API_DURATION = pl.col("api_end_ns") - pl.col("api_start_ns")
_TOTAL_DURATION = pl.max_horizontal("end_ns", "api_end_ns") - pl.col("api_start_ns")
_PID = pl.col("global_tid") // (1 << 24) % (1 << 24)


def _launched(trace: NsysTrace, extra: list[str], *, every_call: bool = False) -> pl.DataFrame:
    """Kernels (times, device, name id, correlation id and ``extra`` columns) joined to every
    matching API row, as nsys's join does: a kernel whose launch another tracer also recorded
    (eventClass 67 wrappers in some 2022 exports) appears once per row; kernels without a
    traced launch are left out."""
    # the join as cuda_kern_exec_sum keeps it (in the column cache when there is one): a warm
    # run reads no API column but the four launch columns and makes no join
    launches = _Launches(trace, every_call=every_call)
    kernels = launches.kernel_rows(
        op_rows(trace, KERNEL_TABLE, ["global_pid", "correlation_id", "start_ns", "end_ns", "device_id", *extra], names=True)
    )
    api = {c: launches.api_column(s) for c, s in (("global_tid", "global_tid"), ("api_name", "name"), ("api_start_ns", "start_ns"), ("api_end_ns", "end_ns"))}
    return kernels.with_columns(
        (api["global_tid"] % PID_UNIT).alias("tid"), *(v.alias(c) for c, v in api.items())
    )


def _display_name_ids(names: pl.Series, strings: pl.DataFrame) -> pl.Series:
    """API name column (string ids, or text when reused from ``trace.cuda_api``) with every
    id replaced by the smallest id of ``strings`` (``StringIds`` rows holding at least those
    of ``names``) with the same display text (:func:`api_display_name`), so that grouping on
    it groups by the text without resolving a million strings."""
    if names.dtype == pl.Utf8:
        return names.to_frame("n").select(api_display_name(pl.col("n"))).to_series()
    # over the names' StringIds rows (a few), not the million-row column
    texts = strings.filter(pl.col("id").is_in(names.unique().implode())).select(
        "id", api_display_name(pl.col("value")).alias("text")
    )
    canon = texts.with_columns(pl.col("id").min().over("text").alias("canon")).filter(pl.col("canon") != pl.col("id"))
    if canon.height == 0:  # one id per display text (the usual case): nothing to replace
        return names
    return names.replace(canon["id"], canon["canon"])


def _xyz_text(x: pl.Expr, y: pl.Expr, z: pl.Expr) -> pl.Expr:
    """``"   x    y    z"``: three right-aligned 4-wide fields, as nsys prints grid and block sizes."""
    return pl.format("{} {} {}", *(c.cast(pl.Utf8).str.pad_start(4) for c in (x, y, z)))


def _xyz(frame: pl.DataFrame, x: str, y: str, z: str) -> pl.Series:
    """:func:`_xyz_text` of each row, formatted once per distinct (x, y, z): a million
    kernels have a handful of launch shapes, and building a million strings costs ~0.1 s."""
    dims = frame.select(x, y, z)
    packable = (
        not dims.null_count().sum_horizontal().item()
        and dims.height > 0
        and dims.select(pl.min_horizontal(pl.all().min())).item() >= 0
        and max_int(dims[x]) < 1 << 31
        and max(max_int(dims[y]), max_int(dims[z])) < 1 << 16
    )
    if not packable:
        return dims.select(_xyz_text(pl.col(x), pl.col(y), pl.col(z))).to_series()
    key = dims.select((pl.col(x) * (1 << 32) + pl.col(y) * (1 << 16) + pl.col(z)).alias("k")).to_series()
    shapes = dims.with_columns(key.alias("k")).unique("k")
    text = shapes.select(_xyz_text(pl.col(x), pl.col(y), pl.col(z))).to_series()
    return key.replace_strict(shapes["k"], text, return_dtype=pl.Utf8)


def cuda_kern_exec_trace(trace: NsysTrace, *, convention: str = "2025", every_call: bool = False) -> Report:
    """One row per kernel: API call, queue wait and execution (``cuda_kern_exec_trace``).

    ``GridXYZ``/``BlockXYZ`` are three right-aligned 4-wide fields as nsys prints them.
    Ordered by API start. ``every_call``: as in :func:`cuda_kern_exec_sum`.
    """
    _require(trace, "cuda_kern_exec_trace")
    k = _launched(trace, GRID, every_call=every_call)
    # the launch shapes as text, then the six integer columns go (a million rows each)
    k = k.with_columns(_xyz(k, "grid_x", "grid_y", "grid_z").alias("_grid"), _xyz(k, "block_x", "block_y", "block_z").alias("_block"))
    k = k.drop(GRID)
    order = k.select(pl.arg_sort_by(["api_start_ns", "start_ns", "correlation_id"], maintain_order=True)).to_series()
    if is_identity(order, k.height):  # usually already in order: no gather of a million rows
        order = None
    kinds = dict.fromkeys(_EXEC_TRACE_COLUMNS[:10], "int")

    # API names as nsys prints them, made once per StringIds id (not per call: a million
    # string clean-ups took ~0.04 s)
    api_text = trace.strings.select("id", api_display_name(pl.col("value")).alias("value"))

    def parts() -> Iterator[pl.DataFrame]:
        # names stay string ids until a chunk is written: a million kernel names as text
        # took ~0.2 GB
        for offset in range(0, max(k.height, 1), _CHUNK_ROWS):
            rows = k.slice(offset, _CHUNK_ROWS) if order is None else k[order.slice(offset, _CHUNK_ROWS)]
            rows = resolve_names(rows, trace.strings, "name")
            if rows.schema["api_name"] == pl.Utf8:  # text, from a loaded cuda_api table
                api = api_display_name(pl.col("api_name"))
            else:
                api = lookup_strings(pl.col("api_name"), api_text)
            yield _exec_trace_rows(rows.with_columns(api.alias("api_name")))

    return Report.chunked("cuda_kern_exec_trace", parts, kinds, convention)


#: Rows of ``cuda_kern_exec_trace`` built and formatted at a time.
_CHUNK_ROWS = 100_000
_EXEC_TRACE_COLUMNS = (
    "API Start (ns)", "API Dur (ns)", "Queue Start (ns)", "Queue Dur (ns)", "Kernel Start (ns)",
    "Kernel Dur (ns)", "Total Dur (ns)", "PID", "TID", "DevId", "API Function", "GridXYZ",
    "BlockXYZ", "Kernel Name",
)


def _exec_trace_rows(k: pl.DataFrame) -> pl.DataFrame:
    frame = k.select(
        pl.col("api_start_ns").alias("API Start (ns)"),
        _API_DURATION.alias("API Dur (ns)"),
        pl.when(_QUEUE >= 0).then(pl.col("api_end_ns")).alias("Queue Start (ns)"),
        _QUEUE_DURATION.alias("Queue Dur (ns)"),
        pl.col("start_ns").alias("Kernel Start (ns)"),
        pl.col("duration_ns").alias("Kernel Dur (ns)"),
        _TOTAL_DURATION.alias("Total Dur (ns)"),
        _PID.alias("PID"),
        pl.col("tid").alias("TID"),
        pl.col("device_id").alias("DevId"),
        pl.col("api_name").alias("API Function"),  # display text already
        pl.col("_grid").alias("GridXYZ"),
        pl.col("_block").alias("BlockXYZ"),
        pl.col("name").alias("Kernel Name"),
    )
    return frame


def _stats(value: str, prefix: str, *, sequential: bool = False) -> list[pl.Expr]:
    v = pl.col(value).drop_nulls()
    # sequential: SQLite's AVG (nsys 2023.x), a float sum in row order over the count; it differs
    # from the exact mean only for totals past 2**53 (a damaged export's times)
    mean = (v.cast(pl.Float64).cum_sum().last() / v.len()) if sequential else v.mean()
    return [
        mean.alias(f"{prefix}Avg (ns)"),
        v.median().alias(f"{prefix}Med (ns)"),
        v.min().alias(f"{prefix}Min (ns)"),
        v.max().alias(f"{prefix}Max (ns)"),
        # nsys's stdev is 0 below two values, even for none (an empty queue column)
        pl.when(v.len() > 1).then(v.std(ddof=1)).otherwise(0.0).alias(f"{prefix}StdDev (ns)"),
    ]


def _kernel_column(trace: NsysTrace, column: str) -> pl.Series:
    """One whole kernel column (``name`` as string ids, or text when the trace holds
    ``kernels``), read alone."""
    if column == "name":
        return op_rows(trace, KERNEL_TABLE, [], names=True, duration=False).to_series()
    return op_rows(trace, KERNEL_TABLE, [column], duration=False).to_series()


#: Names the launch join's computation in the column cache's keys (:class:`_Launches`):
#: bump it when what the join keeps or how it matches changes.
LAUNCH_JOIN_KEY = "derived:kernel-launch-join.v1"


class _Launches:
    """The inner launch join of the kernels to their API calls, as per-launch columns: the
    kernel row of each launch and the API call's ``global_tid``, ``name`` (string id),
    ``start_ns`` and ``end_ns``. ``cuda_kern_exec_sum`` and ``cuda_kern_exec_trace`` read it.

    Computed once per export and kept in the column cache (``derived_column`` of the export,
    keys under :data:`LAUNCH_JOIN_KEY`): a warm ``cuda_kern_exec_sum`` on 1 M kernels then
    reads four 8 MB launch columns and the kernel row of each launch instead of five 20 MB API
    columns and the kernels' process and correlation ids, and makes no join (whole process
    0.39-0.45 -> 0.30-0.31 s, peak RSS 278-290 -> 196-220 MB). Without a cache (a loaded
    table, a small export, an nsys folder) it is the join every time: correlation ids read,
    matched (:func:`~tracekit.analysis.attribution.launch_pairs`), and each API column
    gathered at the matched rows when asked for, one column at a time."""

    def __init__(self, trace: NsysTrace, *, every_call: bool = False) -> None:
        self._trace = trace
        self._every_call = every_call
        self._db = derived_source(trace)
        self._arow: pl.Series | None = None
        self._api: pl.DataFrame | TableColumns | _Unpinned | None = None
        self._lrow = self._derived("lrow", self._join)
        #: launches (rows of the join)
        self.count = self._lrow.len()
        self._identity: bool | None = None  # whether lrow is every kernel in order

    @staticmethod
    def kept(trace: NsysTrace) -> bool:
        """Whether the join of ``trace`` is in the column cache (then no API column is read)."""
        db = derived_source(trace)
        return db is not None and db.all_cached(KERNEL_TABLE, [f"{LAUNCH_JOIN_KEY}:{n}" for n in _KEPT])

    def _derived(self, name: str, make: Callable[[], pl.Series]) -> pl.Series:
        if self._db is None:
            return make()
        return self._db.derived_column(KERNEL_TABLE, f"{LAUNCH_JOIN_KEY}:{name}", make)

    def _join(self) -> pl.Series:
        """The kernel row of each launch; keeps the API row of each for :meth:`api_column`."""
        keys_in = op_rows(self._trace, KERNEL_TABLE, ["global_pid", "correlation_id"], duration=False)
        # where most calls launch no kernel, only those that do are read (filtered in SQLite);
        # else every call, on a big trace each column read dropped after use
        self._api = None if self._every_call else kernel_launch_calls(self._trace)
        if self._api is None:
            self._api = lean_api_rows(self._trace, keys_in.height)
        pairs = launch_pairs(keys_in, self._api, how="inner")
        self._arow = pairs["_arow"]
        return pairs["_lrow"]

    def _rows(self, kernels: int) -> pl.Series | None:
        """The kernel row of each launch, or None when that is every one of the ``kernels``
        in order (usual: then nothing is gathered; decided once)."""
        if self._identity is None:
            self._identity = is_identity(self._lrow, kernels)
        return None if self._identity else self._lrow

    def kernel_rows(self, kernels: pl.DataFrame) -> pl.DataFrame:
        """The rows of a frame of all kernels (in table order) that each launch joins."""
        rows = self._rows(kernels.height)
        return kernels if rows is None else kernels.select(pl.all().gather(rows))

    def kernel_column(self, column: str) -> pl.Series:
        """Kernel column ``column`` (``name`` as string ids, or text when the trace holds
        ``kernels``) of each launch's kernel: read alone, so one whole column is in memory."""
        values = _kernel_column(self._trace, column)
        rows = self._rows(values.len())
        return values if rows is None else values.gather(rows)

    def api_column(self, column: str) -> pl.Series:
        """API column ``column`` (one of ``global_tid``, ``name``, ``start_ns``, ``end_ns``)
        of each launch's call."""

        def gather() -> pl.Series:
            if self._arow is None:
                self._join()
            assert self._api is not None and self._arow is not None
            return self._api[column].gather(self._arow)

        values = self._derived(f"api.{column}", gather)
        if values.len() != self.count:  # cannot happen for one unchanged export
            values = gather()
        return values


#: The columns :class:`_Launches` keeps in the column cache (under :data:`LAUNCH_JOIN_KEY`).
_KEPT = ("lrow", "api.global_tid", "api.name", "api.start_ns", "api.end_ns")

#: Launches up to which ``cuda_kern_exec_sum`` summarises all durations in one group-by.
ONE_PASS_ROWS = 2_000_000


def _abs_sum_passes_2_53(value: pl.Series) -> bool:
    """Whether the absolute values of ``value`` sum past 2**53; first bounded by length ×
    largest magnitude (two reductions, no million-row ``abs`` column), which settles it for
    any real trace's durations."""
    lo, hi = value.min(), value.max()
    if lo is None or hi is None:
        return False
    if max(abs(int(lo)), abs(int(hi))) * value.len() <= 1 << 53:  # type: ignore[arg-type]
        return False
    return (value.abs().sum() or 0) > 1 << 53


def _either_strings(a: pl.DataFrame, b: pl.DataFrame) -> pl.DataFrame:
    """The ``StringIds`` rows of two lookups (:meth:`~tracekit.nsys.trace.NsysTrace.strings_of`),
    each id once."""
    if a is b:  # both the whole table
        return a
    return pl.concat([a, b], how="vertical_relaxed").unique(subset="id", keep="first", maintain_order=True)


def cuda_kern_exec_sum(trace: NsysTrace, *, convention: str = "2025", every_call: bool = False) -> Report:
    """``cuda_kern_exec_trace`` summarised per thread, device, API function and kernel name
    (``cuda_kern_exec_sum``).

    ``Count`` kernels, ``QCount`` of them with a queue wait; ``T`` = total, ``A`` = API,
    ``Q`` = queue (over kernels that waited), ``K`` = kernel duration statistics. Ordered by
    average total time, descending.

    Memory: the launch join keeps only row pairs; the group keys become one group number per
    kernel, and each measured duration is computed, summarised and dropped in turn, reading
    one kernel or API column at a time (on 8 M kernels / 20 M calls the peak fell from 1.6 GB
    to ~0.6 GB). The statistics are those of one group-by over all rows.

    On a cold export with several calls per kernel only the calls that launched a kernel are
    read (:func:`~tracekit.analysis.op_launches.kernel_launch_calls`); ``every_call=True``
    reads every call instead, into the column cache, for a caller that runs a report reading
    them all next (:func:`tracekit.stats.report_options`). The report is the same either way.
    """
    _require(trace, "cuda_kern_exec_sum")
    # a cold run reads the columns below in one scan per table, not one scan per column (1 M
    # kernels, 2.5 M calls: CPU 1.75-2.04 -> 1.33-1.61 s). Kernels first: the larger scan then
    # reuses the smaller one's memory (peak 350 MB; API first 440 MB; per-column scans 275 MB)
    if not trace.is_loaded("kernels"):
        prefetch_columns(trace.db, KERNEL_TABLE, EXEC_SUM_KERNEL_COLUMNS)
    # the calls, unless the join is kept or reads only the calls that launch a kernel
    if not trace.is_loaded("cuda_api") and not _Launches.kept(trace) and (every_call or not narrows_launch_calls(trace)):
        prefetch_columns(trace.db, API_TABLE, LAUNCH_API_COLUMNS)
    # the kernels' names, their StringIds rows (on a cold export only those: a few thousand of
    # 300 k) and whether ids can stand for them, before the join: a cold run's calls may still
    # be being read then (the CLI starts that scan before polars is imported,
    # tracekit.nsys.readahead), and this runs meanwhile (200 k kernels, 1.2 M calls: 0.06 s off
    # the run). The launched kernels' names are some of these: where ids stand for all the
    # names they stand for these; where not, grouping by text gives the same groups
    names = _kernel_column(trace, "name").unique()
    strings = trace.strings_of(*([names] if names.dtype != pl.Utf8 else []))
    by_id = names_are_ids(pl.DataFrame({"name": names}), "name", strings)
    del names  # the distinct names only: each kernel's, held through the join, were 16 MB more at its peak on 2 M kernels
    launches = _Launches(trace, every_call=every_call)
    api_column, kernel_column = launches.api_column, launches.kernel_column
    # the group of each launch: (pid, tid) is the low 48 bits of global_tid; API names group by
    # their display text (cudaLaunchKernel and cudaLaunchKernel_v7000 are one row), kernel
    # names by id while each text has one id
    group_keys = pl.DataFrame({"_pid_tid": api_column("global_tid") % (1 << 48)})
    api_names, kernel_names = api_column("name"), kernel_column("name")
    if api_names.dtype != pl.Utf8:
        strings = _either_strings(strings, trace.strings_of(api_names.unique()))
    group_keys = group_keys.with_columns(
        kernel_column("device_id").alias("device_id"),
        _display_name_ids(api_names, strings).alias("api_name"),
        kernel_names.alias("name"),
    )
    del api_names, kernel_names
    if not by_id:
        group_keys = resolve_names(group_keys, strings, "name")
    # up to ONE_PASS_ROWS launches, one group-by over all four durations (faster); beyond, each
    # duration is summarised over group numbers and dropped before the next is computed
    one_pass = launches.count <= ONE_PASS_ROWS
    pending: dict[str, pl.Series] = {}
    sequential: dict[str, bool] = {}
    # one group number per launch: grouping on it is faster than on the four key columns
    # (1 M launches: 0.06 s with the numbering where the four-column group-by took 0.09 s)
    gid, decode = group_numbers(group_keys)
    del group_keys
    groups: pl.DataFrame | None = None  # the groups' keys and statistics so far

    def counts(v: str) -> list[pl.Expr]:
        return [pl.len().alias("Count"), pl.col(v).count().alias("QCount")]

    def summarise(value: pl.Series, prefix: str) -> None:
        nonlocal groups
        # sequential: SQLite's AVG (nsys 2023.x); it differs from the exact mean only when the
        # column's total passes 2**53 (a damaged export's times), so it is decided per column
        seq = convention == "2023" and _abs_sum_passes_2_53(value)
        if one_pass:
            pending[prefix], sequential[prefix] = value, seq
            return
        frame = pl.DataFrame({"_g": gid, "v": value})
        more = counts("v") if prefix == "Q" else []
        s = frame.group_by("_g", maintain_order=seq).agg(*more, *_stats("v", prefix, sequential=seq))
        groups = (decode(s["_g"]) if groups is None else groups).join(s, on="_g", how="left")

    k_start = kernel_column("start_ns")
    a_end = api_column("end_ns")
    queue = k_start - a_end
    summarise(queue.set(queue < 0, None), "Q")
    del queue
    k_end = kernel_column("end_ns")
    if trace.is_loaded("kernels"):
        summarise(kernel_column("duration_ns"), "K")
    else:
        summarise(k_end - k_start, "K")
    del k_start
    last_end = pl.DataFrame({"a": k_end, "b": a_end}).select(pl.max_horizontal("a", "b")).to_series()
    del k_end
    a_start = api_column("start_ns")
    summarise(a_end - a_start, "A")
    del a_end
    summarise(last_end - a_start, "T")
    if one_pass:
        frame = pl.DataFrame([gid, *(v.alias(f"_v{p}") for p, v in pending.items())])
        del pending
        stats = frame.group_by("_g", maintain_order=any(sequential.values())).agg(
            *counts("_vQ"), *(e for p in "TAQK" for e in _stats(f"_v{p}", p, sequential=sequential[p]))
        )
        groups = pl.concat([decode(stats["_g"]), stats.drop("_g")], how="horizontal")
    assert groups is not None
    s = groups
    s = resolve_names(s, strings, "name", "api_name").with_columns(api_display_name(pl.col("api_name")).alias("api_name"))
    s = s.sort(["TAvg (ns)", "Count", "name"], descending=[True, False, False])
    frame = s.select(
        (pl.col("_pid_tid") // (1 << 24)).alias("PID"),
        (pl.col("_pid_tid") % (1 << 24)).alias("TID"),
        pl.col("device_id").alias("DevId"),
        pl.col("Count").cast(pl.Int64),
        pl.col("QCount").cast(pl.Int64),
        *[pl.col(f"{p}{stat} (ns)") for p in "TAQK" for stat in ("Avg", "Med", "Min", "Max", "StdDev")],
        pl.col("api_name").alias("API Name"),
        pl.col("name").alias("Kernel Name"),
    )
    kinds = {"PID": "int", "TID": "int", "DevId": "int", "Count": "int", "QCount": "int"}
    for p in "TAQK":
        kinds.update({f"{p}Avg (ns)": "float1", f"{p}Med (ns)": "float1", f"{p}Min (ns)": "int",
                      f"{p}Max (ns)": "int", f"{p}StdDev (ns)": "float1"})
    return Report("cuda_kern_exec_sum", frame, kinds, convention)
