"""``tracekit.open``: look at a file's first bytes and return the right trace object."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracekit.errors import TraceFormatError, TraceNotFoundError, TracePermissionError

if TYPE_CHECKING:
    from tracekit.ncu.report import NcuReport
    from tracekit.nsys.trace import NsysTrace

SQLITE_MAGIC = b"SQLite format 3\x00"
#: Options of :meth:`NcuReport.from_path`; the others go to :class:`NsysTrace` only.
NCU_OPTIONS = ("validate", "isolate", "details_csv")
NSYS_REPORT_MAGIC = b"NVIDIA Tegra Profiler Report"


def _check_path(path: Path) -> None:
    if not path.exists():
        msg = f"{path} does not exist; check the path (Nsight Systems exports end in .sqlite or .nsys-rep)"
        raise TraceNotFoundError(msg)
    if path.is_dir():
        from tracekit.nsys.columnar import folder_format

        if folder_format(path) is not None:
            return
        msg = (
            f"{path} is a directory but not an nsys parquetdir/arrowdir export; pass one trace file, "
            "or use tracekit.open_many() for a folder of ranks"
        )
        raise TraceFormatError(msg)
    if not os.access(path, os.R_OK):
        msg = f"{path} is not readable by this user; fix its permissions (chmod a+r) or copy it"
        raise TracePermissionError(msg)


def _head(path: Path, size: int = 64) -> bytes:
    try:
        with path.open("rb") as fh:
            return fh.read(size)
    except PermissionError:
        msg = f"{path} is not readable by this user; fix its permissions (chmod a+r) or copy it"
        raise TracePermissionError(msg) from None


def _is_ncu_report(head: bytes) -> bool:
    try:
        from tracekit.ncu.report import is_ncu_report
    except ImportError:  # the ncu package is optional at import time
        return head.startswith(b"NVR\x00")
    return is_ncu_report(head)


def sniff(path: str | Path) -> str:
    """The kind of trace file by its bytes: ``"nsys-sqlite"``, ``"nsys-report"``, ``"ncu"``,
    ``"ncu-csv"``, ``"kineto"`` (a Chrome-trace JSON object with Kineto's keys, gzipped or not), or ``"nsys-parquetdir"``/``"nsys-arrowdir"`` for a folder that ``nsys export
    --type parquetdir``/``arrowdir`` wrote."""
    path = Path(path)
    _check_path(path)
    if path.is_dir():
        from tracekit.nsys.columnar import folder_format

        return f"nsys-{folder_format(path)}dir"
    head = _head(path)
    if not head:
        msg = f"{path} is empty (0 bytes); the capture or export was probably interrupted: capture again"
        raise TraceFormatError(msg)
    if head.startswith(SQLITE_MAGIC):
        return "nsys-sqlite"
    if head.startswith(NSYS_REPORT_MAGIC):
        return "nsys-report"
    if _is_ncu_report(head):
        return "ncu"
    if head.lstrip().startswith(b'"ID"'):
        return "ncu-csv"
    from tracekit.kineto.sniff import kineto_head

    if kineto_head(path):
        return "kineto"
    msg = (
        f"{path} is not an Nsight Systems (.sqlite, .nsys-rep), Nsight Compute (.ncu-rep, raw CSV) or PyTorch profiler "
        "(*.pt.trace.json[.gz]) file; export Nsight Systems reports with `nsys export --type sqlite`"
    )
    raise TraceFormatError(msg)


def open(path: str | Path, **options: Any) -> NsysTrace | NcuReport:  # noqa: A001 - public name
    """Open a trace by content: an nsys SQLite export or report, a folder that ``nsys export
    --type parquetdir`` (or ``arrowdir``) wrote, a PyTorch profiler (Kineto) trace
    (``*.pt.trace.json``, gzipped or not: a :class:`~tracekit.kineto.KinetoTrace`, converted
    once into tracekit's cache), or an ncu report or CSV.

    ``.nsys-rep``/``.qdrep`` files are exported to SQLite with an nsys found on this machine
    (see :func:`tracekit.nsys.export.export_report`). Options go to the trace class
    (``engine="sqlite3"`` forces the standard-library reader; ``column_cache=False`` keeps
    large tables out of the on-disk column cache); ``validate``, ``isolate`` and
    ``details_csv`` go to :meth:`NcuReport.from_path <tracekit.ncu.NcuReport.from_path>`
    (``isolate=True`` reads an ``.ncu-rep`` in a child process, so a crash of ``ncu_report``
    is a TraceFormatError), the others only to Nsight Systems traces, so one call opens
    either kind.
    """
    path = Path(path)
    kind = sniff(path)
    ncu_options = {k: options.pop(k) for k in NCU_OPTIONS if k in options}
    if kind in ("nsys-sqlite", "nsys-parquetdir", "nsys-arrowdir"):
        from tracekit.nsys.trace import NsysTrace

        return _open_sqlite(path, NsysTrace, options)
    if kind == "kineto":
        from tracekit.kineto.trace import KinetoTrace

        return KinetoTrace(path, **options)
    if kind == "nsys-report":
        from tracekit.nsys.export import export_report
        from tracekit.nsys.trace import NsysTrace

        exported = export_report(path)
        return _open_sqlite(exported, NsysTrace, {**options, "source": path})
    from tracekit.ncu.report import NcuReport

    return NcuReport.from_path(path, **ncu_options)


def _open_sqlite(path: Path, cls: Any, options: dict[str, Any]) -> Any:
    return cls(path, **options)
