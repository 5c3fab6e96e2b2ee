"""Kernel launch and execution timing: ``cuda_kern_exec_trace`` and ``cuda_kern_exec_sum``.

Each kernel is joined to its launching API call (same correlation id and process). The
*queue* time is the wait from the end of the API call to the start of the kernel; nsys leaves
it empty when the kernel started before the call returned (a start exactly at the return
queues for 0 ns). The *total* runs from the start
of the call to whichever ends last, the call or the kernel.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import polars as pl

from tracekit.analysis._frames import is_identity, max_int
from tracekit.analysis.attribution import _launch_join
from tracekit.errors import UnsupportedReportError
from tracekit.stats.common import Report
from tracekit.stats.nvtx_projection import (
    KERNEL_TABLE,
    api_rows,
    names_are_ids,
    op_rows,
    resolve_names,
)
from tracekit.stats.summaries import api_display_name

if TYPE_CHECKING:
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


def _launched(trace: NsysTrace, extra: list[str]) -> pl.DataFrame:
    """Kernels (times, device, name id, correlation id and ``extra`` columns) joined to every
    matching API row, as nsys's join does: a kernel whose launch another tracer also recorded
    (eventClass 67 wrappers in some 2022 exports) appears once per row; kernels without a
    traced launch are left out."""
    kernels = op_rows(trace, KERNEL_TABLE, ["global_pid", "correlation_id", "start_ns", "end_ns", "device_id", *extra], names=True)
    return _launch_join(kernels, api_rows(trace), dedupe=False, how="inner")


def _display_name_ids(names: pl.Series, trace: NsysTrace) -> pl.Series:
    """API name column (string ids, or text when reused from ``trace.cuda_api``) with every
    id replaced by the smallest id of the same display text (:func:`api_display_name`), so
    that grouping on it groups by the text without resolving a million strings."""
    if names.dtype == pl.Utf8:
        return names.to_frame("n").select(api_display_name(pl.col("n"))).to_series()
    # over the whole StringIds table (thousands of rows), not the million-row column
    texts = trace.strings.select("id", api_display_name(pl.col("value")).alias("text"))
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


def cuda_kern_exec_trace(trace: NsysTrace, *, convention: str = "2025") -> Report:
    """One row per kernel: API call, queue wait and execution (``cuda_kern_exec_trace``).

    ``GridXYZ``/``BlockXYZ`` are three right-aligned 4-wide fields as nsys prints them.
    Ordered by API start.
    """
    _require(trace, "cuda_kern_exec_trace")
    k = _launched(trace, GRID)
    # the launch shapes as text, then the six integer columns go (a million rows each)
    k = k.with_columns(_xyz(k, "grid_x", "grid_y", "grid_z").alias("_grid"), _xyz(k, "block_x", "block_y", "block_z").alias("_block"))
    k = k.drop(GRID)
    order = k.select(pl.arg_sort_by(["api_start_ns", "start_ns", "correlation_id"], maintain_order=True)).to_series()
    if is_identity(order, k.height):  # usually already in order: no gather of a million rows
        order = None
    kinds = dict.fromkeys(_EXEC_TRACE_COLUMNS[:10], "int")

    def parts() -> Iterator[pl.DataFrame]:
        # names stay string ids until a chunk is written: a million kernel names as text
        # took ~0.2 GB
        for offset in range(0, max(k.height, 1), _CHUNK_ROWS):
            rows = k.slice(offset, _CHUNK_ROWS) if order is None else k[order.slice(offset, _CHUNK_ROWS)]
            yield _exec_trace_rows(resolve_names(rows, trace, "name", "api_name"))

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
        api_display_name(pl.col("api_name")).alias("API Function"),
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


def cuda_kern_exec_sum(trace: NsysTrace, *, convention: str = "2025") -> Report:
    """``cuda_kern_exec_trace`` summarised per thread, device, API function and kernel name
    (``cuda_kern_exec_sum``).

    ``Count`` kernels, ``QCount`` of them with a queue wait; ``T`` = total, ``A`` = API,
    ``Q`` = queue (over kernels that waited), ``K`` = kernel duration statistics. Ordered by
    average total time, descending.
    """
    _require(trace, "cuda_kern_exec_sum")
    k = _launched(trace, [])
    # API names group by their display text (cudaLaunchKernel and cudaLaunchKernel_v7000 are
    # one row), kernel names by id while each text has one id
    k = k.with_columns(_display_name_ids(k["api_name"], trace).alias("api_name"))
    if not names_are_ids(k, "name", trace):
        k = resolve_names(k, trace, "name")
    # (pid, tid) is the low 48 bits of global_tid: one key column instead of two
    keys = ["_pid_tid", "device_id", "api_name", "name"]
    values = k.select(
        (pl.col("global_tid") % (1 << 48)).alias("_pid_tid"), "device_id", "api_name", "name",
        _TOTAL_DURATION.alias("total_duration_ns"), _API_DURATION.alias("api_duration_ns"),
        _QUEUE_DURATION.alias("queue_duration_ns"), "duration_ns",
    )
    del k  # eager, not lazy: the lazy plan held both frames through the group-by (+0.1 GB)
    measured = ["total_duration_ns", "api_duration_ns", "queue_duration_ns", "duration_ns"]
    seq = convention == "2023" and values.select(pl.max_horizontal(pl.col(c).abs().sum() for c in measured)).item() > 1 << 53
    s = values.group_by(keys, maintain_order=seq).agg(
        pl.len().alias("Count"),
        pl.col("queue_duration_ns").count().alias("QCount"),
        *_stats("total_duration_ns", "T", sequential=seq),
        *_stats("api_duration_ns", "A", sequential=seq),
        *_stats("queue_duration_ns", "Q", sequential=seq),
        *_stats("duration_ns", "K", sequential=seq),
    )
    s = resolve_names(s, trace, "name", "api_name").with_columns(api_display_name(pl.col("api_name")).alias("api_name"))
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
