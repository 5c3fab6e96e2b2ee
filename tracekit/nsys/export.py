"""``.nsys-rep`` / ``.qdrep`` → ``.sqlite`` with an nsys found on this machine, cached.

The export lands beside the report (``report.nsys-rep`` → ``report.sqlite``) or, when that
folder is not writable, in :func:`tracekit.cache.cache_dir` (``$TRACEKIT_CACHE``, default ``~/.cache/tracekit``). A cached
export is reused while it is newer than the report and its recorded input path, size and
modification time still match (``report.sqlite.tracekit.json``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import subprocess
from pathlib import Path

from tracekit.cache import cache_dir
from tracekit.errors import ExportError, ToolNotFoundError
from tracekit.tools import Tool, find_tool

log = logging.getLogger(__name__)


def _stamp(report: Path) -> dict[str, object]:
    st = report.stat()
    return {"report": str(report.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _ours(sqlite: Path) -> bool:
    """Whether tracekit wrote this export (its stamp file is beside it)."""
    return sqlite.with_name(sqlite.name + ".tracekit.json").is_file()


def export_path_for(report: Path) -> Path:
    """Where the export of ``report`` goes: beside it if writable and no file of someone else's
    is there (an ``r.sqlite`` tracekit did not write is never replaced), else in the cache folder."""
    beside = report.with_suffix(".sqlite")
    if os.access(report.parent, os.W_OK) and (not beside.exists() or _ours(beside)):
        return beside
    return cached_export_path(report)


def cached_export_path(report: Path) -> Path:
    """Where the export of ``report`` goes in the cache folder (:func:`tracekit.cache.cache_dir`):
    its name and a digest of its resolved path."""
    digest = hashlib.sha1(str(report.resolve()).encode()).hexdigest()[:12]
    return cache_dir() / f"{report.stem}-{digest}.sqlite"


def _is_fresh(sqlite: Path, report: Path) -> bool:
    stamp_file = sqlite.with_name(sqlite.name + ".tracekit.json")
    if not sqlite.is_file():
        return False
    if stamp_file.is_file():
        try:
            return json.loads(stamp_file.read_text()) == _stamp(report)
        except (OSError, ValueError):
            return False
    # an export someone made by hand beside the report: trust it if newer
    return sqlite.stat().st_mtime_ns >= report.stat().st_mtime_ns


def export_report(report: str | Path, *, include_blobs: bool = True, force: bool = False) -> Path:
    """Export an ``.nsys-rep``/``.qdrep`` to SQLite (or reuse the cached export); return its path.

    Raises
    ------
    ToolNotFoundError
        No nsys on this machine; the message says how to export by hand.
    ExportError
        nsys ran but produced no export.
    """
    report = Path(report)
    beside = report.with_suffix(".sqlite")
    if not force and beside.is_file() and not _ours(beside) and _is_fresh(beside, report):
        log.debug("using the export beside the report %s", beside)
        return beside  # made by hand, newer than the report: read it (never replaced)
    target = export_path_for(report)
    if not force and _is_fresh(target, report):
        log.debug("reusing export %s", target)
        return target
    try:
        tool = find_tool("nsys")
    except ToolNotFoundError:
        raise no_nsys(report) from None
    assert tool is not None
    target.parent.mkdir(parents=True, exist_ok=True)
    log.info("exporting %s with %s", report, tool.path)
    return export_with(tool, report, target, include_blobs=include_blobs)


def no_nsys(report: Path) -> ToolNotFoundError:
    """The error for a report that needs exporting where no nsys was found: how to export it by hand."""
    return ToolNotFoundError(
        f"{report.name} is an Nsight Systems report and no nsys was found to export it; "
        f"run `nsys export --type sqlite -o {report.with_suffix('.sqlite').name} {report.name}` "
        "on a machine with Nsight Systems and open the .sqlite, or set NSYS=/path/to/nsys"
    )


def export_with(tool: Tool, report: Path, target: Path, *, include_blobs: bool = True) -> Path:
    """Export ``report`` to ``target`` (its folder exists) with ``tool`` (nsys) and stamp it
    (``target.tracekit.json``: the report's path, size and modification time, what
    :func:`_is_fresh` compares); return ``target``. :class:`ExportError` when nsys fails."""
    # export under a temporary name, renamed only when nsys succeeded: a failed export (a
    # report newer than this nsys) leaves a partial file that a later open must never read
    tmp = target.with_name(f".{target.stem}.{os.getpid()}.tracekit-export.sqlite")
    cmd = [str(tool.path), "export", "--type=sqlite", "--force-overwrite=true", "-o", str(tmp)]
    if include_blobs and _supports_blobs(tool.path):
        cmd.append("--include-blobs=true")
    cmd.append(str(report))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0 or not tmp.is_file():
            raise ExportError(_failure_message(report, tool, proc))
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    stamp = target.with_name(target.name + ".tracekit.json")
    stamp_tmp = stamp.with_name(f".{stamp.name}.{os.getpid()}.tmp")
    stamp_tmp.write_text(json.dumps(_stamp(report)))
    os.replace(stamp_tmp, stamp)
    return target


def _report_version(report: Path) -> str | None:
    """The Nsight Systems version a report names, when it names one (the install path of the
    nsys that wrote it); None otherwise."""
    try:
        with report.open("rb") as fh:
            head = fh.read(1 << 20)
    except OSError:
        return None
    m = re.search(rb"nsight-(?:systems|compute)[/-](20\d\d\.\d+(?:\.\d+)?)", head)
    return m.group(1).decode() if m else None


def _failure_message(report: Path, tool: object, proc: subprocess.CompletedProcess[str]) -> str:
    text = (proc.stderr or "") + (proc.stdout or "")
    version = getattr(tool, "version", None) or "unknown"
    if "ProtobufParseException" in text or "Can't parse message" in text:
        wrote = _report_version(report)
        by = f"by nsys {wrote}" if wrote else "by an nsys"
        return (f"{report.name} was written {by}, newer than the nsys found ({version}, {getattr(tool, 'path', '?')}), "
                f"which cannot read it: install Nsight Systems {wrote + ' or later' if wrote else 'of that version or later'} "
                "(or set NSYS=), or export the report where it was captured")
    last = [ln for ln in text.strip().splitlines() if ln.strip()][-1:] or ["no output"]
    return f"nsys export of {report.name} failed (exit {proc.returncode}): {last[0]}"


def _supports_blobs(nsys: Path) -> bool:
    try:
        proc = subprocess.run([str(nsys), "export", "--help"], capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--include-blobs" in proc.stdout + proc.stderr
