"""The scans of an export that the kernel-launch join makes on a cold run: which columns of the
kernels and of the CUDA API calls, and which calls. Standard library only, so that the CLI can
start them before polars is imported (:mod:`tracekit.nsys.readahead`); the join itself
(:mod:`tracekit.analysis.op_launches`, :func:`tracekit.stats.launch.cuda_kern_exec_sum`)
reads by the same names."""

from __future__ import annotations

from collections.abc import Callable

from tracekit.nsys.readahead import Scan

KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
API_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"

#: The kernel columns ``cuda_kern_exec_sum`` reads in one scan of a cold export.
EXEC_SUM_KERNEL_COLUMNS = ("globalPid", "correlationId", "deviceId", "demangledName", "start", "end")
#: The CUDA API columns the launch join reads (names are string ids).
LAUNCH_API_COLUMNS = ("globalTid", "correlationId", "start", "end", "nameId")

#: The calls whose correlation id some kernel of the export has (SQL filter on
#: :data:`API_TABLE`). The unary ``+`` keeps SQLite from answering through an index on
#: ``correlationId`` (which would give the calls in its order): the table is scanned in rowid
#: order, as a full read does.
LAUNCHING_CALLS = f"+correlationId IN (SELECT correlationId FROM {KERNEL_TABLE})"

#: CUDA API rows per kernel from which a kernel launch join reads only the calls that some
#: kernel names (:data:`LAUNCHING_CALLS`) rather than every call: the filter costs a
#: probe per call in SQLite and the calls then do not fill the column cache, which pays off
#: only where most calls launch no kernel (read alone, 200 k kernels: 1.2 M calls 0.40 s,
#: their 200 k launches 0.17 s).
NARROW_FROM_CALLS_PER_KERNEL = 2


def narrows_by_rows(kernel_rows: int, api_rows: int) -> bool:
    """Whether a launch join reads only :data:`LAUNCHING_CALLS`, by the two tables' row
    estimates (the other conditions are :func:`tracekit.analysis.op_launches.narrows_launch_calls`'s)."""
    return api_rows >= NARROW_FROM_CALLS_PER_KERNEL * max(kernel_rows, 1)


def exec_sum_scans(row_estimate: Callable[[str], int]) -> list[Scan]:
    """The scans of a cold ``cuda_kern_exec_sum``: the kernels' columns, then the calls' (only
    those that launched a kernel where :func:`narrows_by_rows`); ``row_estimate(table)`` is
    a table's rows without counting them."""
    kernels, calls = row_estimate(KERNEL_TABLE), row_estimate(API_TABLE)
    where = LAUNCHING_CALLS if narrows_by_rows(kernels, calls) else ""
    return [Scan(KERNEL_TABLE, EXEC_SUM_KERNEL_COLUMNS), Scan(API_TABLE, LAUNCH_API_COLUMNS, where)]
