"""nsys-compatible summary reports over kernels, API calls, memory operations and NVTX.

Each function takes an :class:`~tracekit.nsys.trace.NsysTrace` and returns a
:class:`~tracekit.stats.common.Report` whose columns, numbers, rounding, ordering and
name clean-ups are those of ``nsys stats --format csv -r <report>``.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import polars as pl

from tracekit.errors import DamagedRowsWarning, UnsupportedReportError
from tracekit.nsys.enums import NVTX_RANGE_TYPES
from tracekit.nsys.nvtx import qualified_name
from tracekit.nsys.readers import canonical_string_ids, lookup_strings
from tracekit.stats.common import (
    TIME_SUMMARY_KINDS,
    Report,
    summary_frame,
    time_summary_columns,
)

if TYPE_CHECKING:
    from tracekit.nsys.trace import NsysTrace


def _require(trace: NsysTrace, report: str, *tables: str) -> None:
    missing = [t for t in tables if not trace.db.has_table(t)]
    if missing:
        msg = f"{trace.path.name} has no {', '.join(missing)} table, so it cannot give {report}: capture with the matching --trace option"
        raise UnsupportedReportError(msg)


def kernel_name_expr(mode: str = "demangled") -> pl.Expr:
    """The kernel-name column nsys groups by: ``demangled`` (default), ``base`` or ``mangled``.

    nsys falls back to the demangled name wherever the chosen column is null.
    """
    if mode == "base":
        return pl.coalesce(pl.col("short_name"), pl.col("name"))
    if mode == "mangled":
        return pl.coalesce(pl.col("mangled_name"), pl.col("name"))
    if mode == "demangled":
        return pl.col("name")
    msg = f"unknown kernel name mode {mode!r}; use demangled, base or mangled"
    raise ValueError(msg)


def _by_name_id(frame: pl.DataFrame, ids: list[str], strings: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with one ``_key`` column: the first of the ``ids`` columns that is not null,
    as the smallest ``StringIds`` id of its text (grouping by it groups by the name)."""
    if strings["value"].is_duplicated().any():  # rare: two ids with one text
        key = pl.coalesce([canonical_string_ids(pl.col(c), strings) for c in ids])
    else:  # each text has one id already: no million-row mapping (it took ~60 MB)
        key = pl.coalesce(ids) if len(ids) > 1 else pl.col(ids[0])
    return frame.select(key.alias("_key"), pl.exclude(ids))


def _name_summary(frame: pl.DataFrame, strings: pl.DataFrame, convention: str) -> pl.DataFrame:
    """nsys's statistics of ``duration_ns`` per ``_key``, with the key's text as ``_name``."""
    s = summary_frame(frame, group=["_key"], value="duration_ns", convention=convention)
    return s.with_columns(lookup_strings(pl.col("_key"), strings).alias("_name")).drop("_key")


_NAME_IDS = {"demangled": ["name_id"], "base": ["short_name_id", "name_id"], "mangled": ["mangled_name_id", "name_id"]}


def cuda_gpu_kern_sum(trace: NsysTrace, *, name: str = "demangled", convention: str = "2025") -> Report:
    """Kernel time per kernel name (``cuda_gpu_kern_sum``).

    Ordered by total time descending, then instance count ascending, then name. Kernels are
    grouped by their names' ``StringIds`` ids (one id per text, :func:`canonical_string_ids`),
    and each group's name is looked up once.
    """
    _require(trace, "cuda_gpu_kern_sum", "CUPTI_ACTIVITY_KIND_KERNEL")
    kernel_name_expr(name)  # raises the error naming the valid modes
    ids = _NAME_IDS[name]
    k = _by_name_id(trace.table("kernels", [*ids, "duration_ns"]), ids, trace.strings)
    s = _name_summary(k, trace.strings, convention).rename({"_name": "Name"})
    s = s.sort(["_total", "_count", "Name"], descending=[True, False, False])
    frame = s.select(*time_summary_columns("Instances"), pl.col("Name"))
    return Report("cuda_gpu_kern_sum", frame, {**TIME_SUMMARY_KINDS, "Instances": "int"}, convention)


def api_display_name(name: pl.Expr) -> pl.Expr:
    """nsys's clean-up of API names: when the 6th- and 5th-last characters are ``_v``, drop
    the last 6 (``cudaLaunchKernel_v7000`` → ``cudaLaunchKernel``; ``cuGetProcAddress_v2``
    and ``cudaStreamIsCapturing_v10000`` stay)."""
    return (
        pl.when(name.str.slice(-6, 2) == "_v")
        .then(name.str.slice(0, name.str.len_chars() - 6))
        .otherwise(name)
    )


def cuda_api_sum(trace: NsysTrace, *, convention: str = "2025") -> Report:
    """Time per CUDA runtime/driver API function (``cuda_api_sum``), all calls counted."""
    _require(trace, "cuda_api_sum", "CUPTI_ACTIVITY_KIND_RUNTIME")
    api = _by_name_id(trace.table("cuda_api", ["name_id", "duration_ns"]), ["name_id"], trace.strings)
    s = _name_summary(api, trace.strings, convention).rename({"_name": "name"})
    s = s.sort(["_total", "_count", "name"], descending=[True, False, False])
    frame = s.select(*time_summary_columns("Num Calls"), api_display_name(pl.col("name")).alias("Name"))
    return Report("cuda_api_sum", frame, {**TIME_SUMMARY_KINDS, "Num Calls": "int"}, convention)


def memory_operations(trace: NsysTrace) -> pl.DataFrame:
    """Memcpys and memsets with nsys's operation names: ``[CUDA memcpy <kind>]``, ``[CUDA memset]``.

    Columns: ``Operation``, ``start_ns``, ``duration_ns``, ``bytes``.
    """
    copies = trace.table("memcpys", ["copy_kind_label", "start_ns", "duration_ns", "bytes"]).select(
        pl.format("[CUDA memcpy {}]", pl.col("copy_kind_label")).alias("Operation"),
        "start_ns",
        "duration_ns",
        "bytes",
    )
    sets = trace.table("memsets", ["start_ns", "duration_ns", "bytes"]).select(pl.lit("[CUDA memset]").alias("Operation"), "start_ns", "duration_ns", "bytes")
    return pl.concat([copies, sets])


def _require_memory(trace: NsysTrace, report: str) -> None:
    if not (trace.db.has_table("CUPTI_ACTIVITY_KIND_MEMCPY") or trace.db.has_table("CUPTI_ACTIVITY_KIND_MEMSET")):
        msg = f"{trace.path.name} has no memcpy or memset table, so it cannot give {report}: the program made no traced memory operations"
        raise UnsupportedReportError(msg)


def cuda_gpu_mem_time_sum(trace: NsysTrace, *, convention: str = "2025") -> Report:
    """GPU time per memory operation kind (``cuda_gpu_mem_time_sum``).

    Exports older than nsys 2022.4 lack ``ENUM_CUDA_MEMCPY_OPER`` (nsys 2023.4 then skips
    the report); tracekit uses the same labels from its built-in table instead.
    """
    _require_memory(trace, "cuda_gpu_mem_time_sum")
    s = summary_frame(memory_operations(trace), group=["Operation"], value="duration_ns", convention=convention)
    s = s.sort(["_total", "_count", "Operation"], descending=[True, False, False])
    frame = s.select(*time_summary_columns("Count"), pl.col("Operation"))
    return Report("cuda_gpu_mem_time_sum", frame, {**TIME_SUMMARY_KINDS, "Count": "int"}, convention)


def cuda_gpu_mem_size_sum(trace: NsysTrace, *, convention: str = "2025") -> Report:
    """Bytes per memory operation kind (``cuda_gpu_mem_size_sum``), printed in decimal MB."""
    _require_memory(trace, "cuda_gpu_mem_size_sum")
    s = summary_frame(memory_operations(trace), group=["Operation"], value="bytes", convention=convention)
    s = s.sort(["_total", "_count", "Operation"], descending=[True, False, False])
    frame = s.select(
        pl.col("_total").alias("Total (MB)"),
        pl.col("_count").alias("Count"),
        pl.col("_avg").alias("Avg (MB)"),
        pl.col("_med").alias("Med (MB)"),
        pl.col("_min").alias("Min (MB)"),
        pl.col("_max").alias("Max (MB)"),
        pl.col("_std").alias("StdDev (MB)"),
        pl.col("Operation"),
    )
    kinds = {c: "mb3" for c in frame.columns if c.endswith("(MB)")}
    return Report("cuda_gpu_mem_size_sum", frame, {**kinds, "Count": "int"}, convention)


def nvtx_range_name(convention: str = "2025") -> pl.Expr:
    """nsys's display name of a range: ``domain:name`` in a named domain; in the default
    domain (or one whose name the export lost) ``:name`` for nsys 2025.x, ``name`` for 2023.x."""
    return qualified_name(colon_default=convention == "2025")


def nvtx_style(expr: pl.Expr | None = None) -> pl.Expr:
    """``PushPop`` or ``StartEnd`` from ``event_type_id``."""
    e = pl.col("event_type_id") if expr is None else expr
    return pl.when(e.is_in([59, 70])).then(pl.lit("PushPop")).otherwise(pl.lit("StartEnd"))


#: Timestamps past 2**62 ns (146 years) are damage (``INT64_MAX``, a flipped high bit), not time.
MAX_TIMESTAMP_NS = 1 << 62


def _plausible_nvtx(trace: NsysTrace, events: pl.DataFrame) -> pl.DataFrame:
    """``events`` without the ranges whose end is past :data:`MAX_TIMESTAMP_NS` (their sum
    overflows: nsys 2023.4 stops with "integer overflow"), with one warning for those and
    one for ranges that end before they start (kept: nsys prints their negative durations)."""
    inverted, damaged = events.select(
        (pl.col("end_ns") < pl.col("start_ns")).sum().alias("inverted"),
        (pl.col("end_ns") > MAX_TIMESTAMP_NS).sum().alias("damaged"),
    ).row(0)
    if inverted:
        msg = (f"{trace.path.name}: {inverted} NVTX range(s) end before they start (a damaged export?); "
               "nvtx_sum keeps them with negative durations, as nsys does")
        warnings.warn(msg, DamagedRowsWarning, stacklevel=3)
    if damaged:
        msg = (f"{trace.path.name}: {damaged} NVTX range(s) end after {MAX_TIMESTAMP_NS:,} ns (a damaged export); "
               "nvtx_sum leaves them out (nsys stops with an integer overflow)")
        warnings.warn(msg, DamagedRowsWarning, stacklevel=3)
        events = events.filter(~(pl.col("end_ns") > MAX_TIMESTAMP_NS).fill_null(False))
    return events


def nvtx_sum(trace: NsysTrace, *, convention: str = "2025") -> Report:
    """Time per NVTX range name and style (``nvtx_sum``).

    Open ranges end at the largest timestamp of the NVTX table, as in nsys. Ranges that end
    before they start are counted with their negative durations (as nsys does); ranges that
    end past :data:`MAX_TIMESTAMP_NS` are left out, with a warning (nsys fails on them).
    """
    _require(trace, "nvtx_sum", "NVTX_EVENTS")
    events = trace.table("nvtx", ["start_ns", "end_ns", "event_type_id", "name", "domain"])
    events = _plausible_nvtx(trace, events)
    last = events.select(pl.max_horizontal(pl.col("start_ns").max(), pl.col("end_ns").max())).item()
    ranges = events.filter(pl.col("event_type_id").is_in(list(NVTX_RANGE_TYPES))).select(
        nvtx_range_name(convention).alias("Range"),
        nvtx_style().alias("Style"),
        ((pl.col("end_ns").fill_null(last) if last is not None else pl.col("end_ns")) - pl.col("start_ns")).alias("duration_ns"),
    )  # an empty NVTX_EVENTS table (no last timestamp) gives an empty report, as nsys prints nothing
    s = summary_frame(ranges, group=["Range", "Style"], value="duration_ns", convention=convention)
    s = s.sort(["_total", "_count", "Range"], descending=[True, False, False])
    frame = s.select(*time_summary_columns("Instances"), pl.col("Style"), pl.col("Range"))
    return Report("nvtx_sum", frame, {**TIME_SUMMARY_KINDS, "Instances": "int"}, convention)
