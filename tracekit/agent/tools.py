"""The MCP server's tools as plain functions: each takes paths (checked against the roots of a
:class:`Session`) and returns a JSON-ready dict with a one-line ``summary``; units are in the
field names (``_ns``, ``_bytes``, ``_pct`` …, or nsys's own ``(ns)`` in ``stats`` columns).

Every number comes from the function the CLI calls for it: ``summary`` from
:func:`tracekit.nsys.summary.trace_summary` and the table builders of
:mod:`tracekit.cli.summary`, ``diagnose`` from :func:`tracekit.diagnose` (what
``tracekit diagnose -f json`` prints), ``stats`` and ``top_kernels`` from
:func:`tracekit.stats.run_report` (what ``tracekit stats -f csv`` prints), ``diff`` from
:func:`tracekit.comparison.diff`. Long lists are paged: ``offset``/``limit`` (default
:attr:`Session.max_rows`, at most :data:`MAX_LIMIT`), with ``total_rows`` and ``next_offset``.

Errors are :class:`~tracekit.errors.TracekitError` with the CLI's one-line messages.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from collections import OrderedDict
from collections.abc import Callable, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

from tracekit.agent.sandbox import Roots, check_select, readable, table_names_in
from tracekit.errors import TracekitError

__all__ = ["MAX_LIMIT", "MAX_OFFSET", "TOOLS", "Session", "jsonable"]

#: The most rows one call returns (``limit`` above it is refused).
MAX_LIMIT = 5000
#: The largest ``offset`` (JSON's exact integers; no table has more rows).
MAX_OFFSET = (1 << 53) - 1
#: Times on a trace's timeline are signed 64-bit nanoseconds.
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
#: What ``list_traces`` lists: file suffix → kind.
TRACE_SUFFIXES = {".sqlite": "nsys-sqlite", ".nsys-rep": "nsys-report", ".qdrep": "nsys-report", ".ncu-rep": "ncu-report"}
#: Files and folders ``list_traces`` looks at before it stops (a root holding a whole disk).
MAX_SCANNED = 200_000
#: Evidence rows kept per finding by ``diagnose`` unless ``evidence_rows`` says otherwise.
EVIDENCE_ROWS = 20
#: Columns of the ``kernels`` table the ``kernel`` tool reads (those present).
LAUNCH_COLUMNS = ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "registers_per_thread",
                  "static_shared_memory_bytes", "dynamic_shared_memory_bytes")
#: ``cuda_gpu_kern_sum`` columns → the ``top_kernels`` fields.
KERN_SUM_FIELDS = {"Time (%)": "time_pct", "Total Time (ns)": "total_ns", "Instances": "instances", "Avg (ns)": "mean_ns",
                   "Med (ns)": "median_ns", "Min (ns)": "min_ns", "Max (ns)": "max_ns", "StdDev (ns)": "stddev_ns",
                   "Name": "name"}


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON data: NaN and infinities become null, bytes hex text, durations
    integer ns, dates ISO text, paths text, anything else unknown its ``str``."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, _dt.timedelta):
        return (value.days * 86_400 + value.seconds) * 1_000_000_000 + value.microseconds * 1000
    if isinstance(value, _dt.date | _dt.time):
        return value.isoformat()
    if isinstance(value, Decimal):
        return jsonable(float(value))
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if hasattr(value, "to_list"):  # a polars Series (a list cell)
        return jsonable(value.to_list())
    if hasattr(value, "item"):  # a numpy scalar
        return jsonable(value.item())
    return str(value)


def _page(total: int, offset: int, returned: int, limit: int) -> dict[str, Any]:
    end = offset + returned
    return {"total_rows": total, "offset": offset, "limit": limit, "returned_rows": returned,
            "next_offset": end if end < total else None}


def _rows(frame: Any, offset: int, limit: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    part = frame.slice(offset, limit)
    return jsonable(part.to_dicts()), _page(frame.height, offset, part.height, limit)


def _ms(ns: float | None) -> str:
    from tracekit.diagnosis.text import fmt_ns

    return "?" if ns is None else fmt_ns(ns)


class Session:
    """The tools over the files under ``roots``, keeping the last ``keep_open`` opened traces
    (their tables stay built: a second call on the same trace is warm).

    ``max_rows``: rows a paged list returns when the call gives no ``limit``."""

    def __init__(self, roots: Roots | Sequence[str | os.PathLike[str]], *, keep_open: int = 2, max_rows: int = 200) -> None:
        self.roots = roots if isinstance(roots, Roots) else Roots(roots)
        self.keep_open = max(int(keep_open), 0)
        self.max_rows = max(1, min(int(max_rows), MAX_LIMIT))
        #: file identity → (the opened trace, answers kept for it: its structure, its default diagnosis)
        self._open: OrderedDict[Any, tuple[Any, dict[str, Any]]] = OrderedDict()

    # -- opening -------------------------------------------------------------------------------
    def forget(self) -> None:
        """Let go of every opened trace (after running out of memory, say)."""
        self._open.clear()

    def _target(self, path: str, what: str) -> tuple[Path, Path | list[Path]]:
        resolved = self.roots.resolve(path, what=what)
        try:
            return resolved, readable(resolved, self.roots)
        except OSError as exc:  # a name too long for the file system, a link loop inside a folder …
            if isinstance(exc, TracekitError):
                raise
            from tracekit.agent.sandbox import quoted

            raise TracekitError(f"{what} {quoted(str(resolved))}: {exc.strerror or exc}; give the path of a trace under "
                                f"{self.roots.names()}") from None

    def open(self, path: str, *, what: str = "path", keep: bool = True) -> tuple[Any, Path]:
        """The trace at ``path`` (an ``NsysTrace``, a per-rank ``TraceSet`` or an
        ``NcuReport``) and the resolved path; reused while the file is unchanged."""
        resolved, target = self._target(path, what)
        key = _identity(target)
        if key in self._open:
            self._open.move_to_end(key)
            return self._open[key][0], resolved
        obj = _open_target(target)
        if keep and self.keep_open:
            self._open[key] = (obj, {})
            while len(self._open) > self.keep_open:
                self._open.popitem(last=False)
        return obj, resolved

    def _kept(self, obj: Any, name: str, make: Callable[[], Any]) -> Any:
        """``make()``, kept with the opened ``obj`` while it stays open (the run's structure and
        its default diagnosis: a second call, or summary after diagnose, reuses them)."""
        memo = next((m for o, m in self._open.values() if o is obj), None)
        if memo is None:
            return make()
        if name not in memo:
            memo[name] = make()
        return memo[name]

    def _nsys(self, path: str, tool: str, *, sets: bool = True, what: str = "path") -> tuple[Any, Path]:
        obj, resolved = self.open(path, what=what)
        if type(obj).__name__ == "NcuReport":
            msg = f"{path} is an Nsight Compute report; the {tool} tool reads Nsight Systems exports" + (
                " (give the report as ncu_path)" if tool in ("diagnose", "kernel") else "")
            raise TracekitError(msg)
        if not sets and type(obj).__name__ != "NsysTrace":
            msg = f"{path} is a folder of per-rank reports; the {tool} tool reads one Nsight Systems export: give one of its files"
            raise TracekitError(msg)
        return obj, resolved

    def _ncu(self, path: str) -> Any:
        obj, _ = self.open(path, what="ncu_path")
        if type(obj).__name__ != "NcuReport":
            msg = f"ncu_path {path} is not an Nsight Compute report (.ncu-rep or ncu's raw CSV)"
            raise TracekitError(msg)
        return obj

    def _limit(self, offset: int, limit: int | None) -> tuple[int, int]:
        if not 0 <= offset <= MAX_OFFSET:
            raise TracekitError(f"offset {offset:.3g}: give 0 to {MAX_OFFSET} (the first row to return)"
                                if abs(offset) > 1e15 else f"offset {offset}: give 0 or more")
        limit = self.max_rows if limit is None else limit
        if not 1 <= limit <= MAX_LIMIT:
            raise TracekitError(f"limit {limit}: give 1 to {MAX_LIMIT} rows (page with offset)")
        return offset, limit

    @staticmethod
    def _structure(trace: Any) -> Any:
        from tracekit.diagnosis import structure

        return structure(trace)

    def _diagnosis(self, trace: Any) -> Any:
        from tracekit.diagnosis import diagnose

        d = diagnose(trace)
        if d.structure is not None:  # the same structure describe and summary read
            memo = next((m for o, m in self._open.values() if o is trace), None)
            if memo is not None:
                memo.setdefault("structure", d.structure)
        return d

    # -- tools ---------------------------------------------------------------------------------
    def describe(self, path: str, *, side_by_side: bool = False) -> dict[str, Any]:
        """Capture info, GPUs, tables with their row counts, and the run's structure. With
        ``side_by_side``, a folder's reports are described one by one (``reports``), never
        read as the ranks of one run; ``unrelated`` says why they are not one run (null when
        they are)."""
        import polars as pl

        if side_by_side:
            return self._side_by_side(path)
        obj, resolved = self.open(path)
        out: dict[str, Any] = {"path": str(resolved), "file_bytes": _size(resolved)}
        kind = type(obj).__name__
        if kind == "NcuReport":
            k = obj.kernels
            out.update(format="ncu", kernels=k.height, devices=jsonable(obj.devices.to_dicts()),
                       tables={n: getattr(obj, n).height for n in ("kernels", "metrics", "rules", "devices")})
            names = k["short_name"].n_unique() if k.height else 0
            out["summary"] = f"Nsight Compute report: {k.height} kernel result(s) of {names} kernel(s)"
            return out
        if kind == "NsysTrace":
            meta = obj.meta
            proc = meta.processes[0] if meta.processes else None
            out.update(format="nsys", capture={
                "nsys_version": meta.version, "export_schema": meta.schema_version,
                "command": " ".join(proc.command) if proc else None, "working_dir": getattr(proc, "working_dir", None),
                "processes_captured": len(meta.processes), "start_ns": meta.start_ns, "end_ns": meta.end_ns,
                "duration_ns": meta.duration_ns, "session_epoch_ns": meta.session_epoch_ns,
            }, notes=[*(f"missing: {m}" for m in meta.missing), *(f"partial export: {a}={b}" for a, b in meta.partial_export.items())])
            from tracekit.nsys.schema import TABLES

            out["gpus"] = jsonable(obj.gpus.to_dicts())
            # GPU metric samples are counted in the export (building the long table of 4.6 M samples
            # took 1.7 s just to count it); every other table as tracekit builds it
            out["tables"] = {n: int(obj.db.row_count("GPU_METRICS")) if n == "gpu_metrics" and obj.db.has_table("GPU_METRICS")
                             else int(obj.scan(n).select(pl.len()).collect().item()) for n in TABLES}
        else:  # per-rank reports
            reports = obj.reports
            out.update(format="nsys-ranks", reports=jsonable(reports.to_dicts()), failures=[str(f) for f in obj.failures],
                       gpus=jsonable(obj.gpus.to_dicts()))
            out["tables"] = {n: obj.table(n).height for n in ("kernels", "memcpys", "memsets", "cuda_api", "nvtx")}
        st = self._kept(obj, "structure", lambda: self._structure(obj))
        out["structure"] = jsonable(st.as_dict())
        out["headline"] = st.headline()
        gpus = out["gpus"]
        names = sorted({str(g.get("name")) for g in gpus}) if gpus else []
        out["summary"] = (f"{len(gpus)} GPU(s) ({', '.join(names) or 'none listed'}), {out['tables']['kernels']:,} kernels, "
                          f"{out['tables']['cuda_api']:,} CUDA API calls; {st.headline()}")
        return out

    def list_traces(self, under: str | None = None, *, offset: int = 0, limit: int | None = None) -> dict[str, Any]:
        """The traces under the roots (or under the folder ``under``): Nsight Systems exports
        (``.sqlite``), reports (``.nsys-rep``/``.qdrep``), ``parquetdir``/``arrowdir`` folders,
        Nsight Compute reports (``.ncu-rep``), torch.profiler traces (``.json``/``.json.gz``
        that are Kineto's, told by content) and folders of several reports (per-rank runs),
        each with its ``path`` (relative to its root: what the other tools take), ``root``,
        ``kind`` and ``bytes``; paged. Links that lead out of the roots are left out."""
        from tracekit.kineto.sniff import is_kineto
        from tracekit.nsys.columnar import folder_format

        offset, limit = self._limit(offset, limit)
        tops = [self.roots.resolve(under, what="under")] if under else list(self.roots.paths)
        found: list[dict[str, Any]] = []
        scanned, skipped, stopped = 0, 0, False
        for top in tops:
            if not top.is_dir():
                raise TracekitError(f"under {under}: not a folder under {self.roots.names()}")
            root = next(r for r in self.roots.paths if top == r or top.is_relative_to(r))
            for folder, dirs, files in os.walk(top):  # links to folders are not followed
                here = Path(folder)
                scanned += len(dirs) + len(files)
                if scanned > MAX_SCANNED:
                    stopped = True
                    break
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                keep = []
                for d in dirs:
                    fmt = folder_format(here / d)
                    if fmt is not None:
                        found.append(self._entry(here / d, root, f"nsys-{fmt}dir"))
                    else:
                        keep.append(d)
                dirs[:] = keep
                reports = 0
                for name in sorted(files):
                    kind = TRACE_SUFFIXES.get(Path(name).suffix.lower())
                    if kind is None and name.lower().endswith((".json", ".json.gz")) and is_kineto(here / name):
                        kind = "kineto"  # a torch.profiler trace, told by its content
                    if kind is None:
                        continue
                    f = here / name
                    if f.is_symlink() and not self.roots.contains(f.resolve()):
                        skipped += 1
                        continue
                    found.append(self._entry(f, root, kind))
                    reports += kind != "ncu-report"
                if reports > 1:
                    found.append(self._entry(here, root, f"folder of {reports} reports"))
            if stopped:
                break
        found.sort(key=lambda e: (e["root"], e["path"]))
        page = found[offset:offset + limit]
        notes = [f"{skipped} link(s) leading out of the roots left out"] if skipped else []
        if stopped:
            notes.append(f"stopped after {MAX_SCANNED:,} files and folders: give a narrower folder with under")
        line = f"{len(found):,} trace(s) under {', '.join(str(t) for t in tops)}" + (
            f"; {offset}–{offset + len(page) - 1} here" if page else "")
        return {"traces": page, **_page(len(found), offset, len(page), limit), "notes": notes, "summary": line}

    @staticmethod
    def _entry(path: Path, root: Path, kind: str) -> dict[str, Any]:
        try:
            size = path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.iterdir() if f.is_file())
        except OSError:
            size = None
        rel = "." if path == root else str(path.relative_to(root))
        return {"path": rel, "root": str(root), "kind": kind, "bytes": size}

    def _side_by_side(self, path: str) -> dict[str, Any]:
        from tracekit.multi import rank_identity
        from tracekit.runs import unrelated_reason

        resolved, target = self._target(path, "path")
        files = target if isinstance(target, list) else [target]
        reports, identities = [], []
        for f in files:
            reports.append(self.describe(str(f)))
            obj, _ = self.open(str(f))
            if type(obj).__name__ == "NsysTrace":
                identities.append(rank_identity(obj, f)[1])
        reason = unrelated_reason(identities)
        head = "not one run: " + reason.split("not one run: ", 1)[-1] if reason else "one run's reports"
        return {"path": str(resolved), "format": "side-by-side", "reports": reports, "unrelated": reason,
                "summary": f"{len(reports)} report(s) side by side ({head})"}

    def summary(self, path: str, *, top: int = 10, findings: int = 3, nvtx_each: bool = False) -> dict[str, Any]:
        """What ``tracekit summary PATH`` shows: capture info, the run's structure, top kernels,
        CUDA graphs, memory operations, NVTX ranges, GPU metrics, generation phases or the
        training step, and the top findings."""
        from tracekit.cli.summary import build_summary

        if top < 0 or findings < 0:
            raise TracekitError("top and findings: give 0 or more")
        trace, resolved = self._nsys(path, "summary")
        s, d = build_summary(trace, top=top, nvtx_each=nvtx_each, label=resolved.name,
                             diagnosis=(lambda: self._kept(trace, "diagnosis", lambda: self._diagnosis(trace))) if findings > 0 else None,
                             structure=lambda: self._kept(trace, "structure", lambda: self._structure(trace)))
        tables = {}
        for title, frame in s.tables.items():
            rows, page = _rows(frame, 0, self.max_rows)
            tables[title] = {"columns": frame.columns, "rows": rows, **page}
        top_findings = []
        if d is not None:
            top_findings = [{k: getattr(f, k) for k in ("category", "severity", "time_ns", "share", "title", "advice", "next")}
                            for f in d.items[:findings]]
        info = dict(s.info)
        line = "; ".join(f"{k}: {info[k]}" for k in ("run", "kernels") if k in info)
        return {"path": str(resolved), "info": info, "tables": tables, "notes": list(s.notes),
                "findings": jsonable(top_findings), "summary": line or f"summary of {resolved.name}"}

    def diagnose(self, path: str, *, ncu_path: str | None = None, window_start_ns: int | None = None,
                 window_end_ns: int | None = None, settings: Sequence[str] = (), offset: int = 0,
                 limit: int | None = None, evidence_rows: int = EVIDENCE_ROWS) -> dict[str, Any]:
        """What ``tracekit diagnose -f json PATH`` prints (findings with evidence, window,
        phases, training, structure), findings paged and each finding's evidence cut to
        ``evidence_rows`` rows (``evidence_total_rows`` says how many it had)."""
        from tracekit.diagnosis import DiagnoseConfig
        from tracekit.diagnosis import diagnose as run

        offset, limit = self._limit(offset, limit)
        if evidence_rows < 0:
            raise TracekitError(f"evidence_rows {evidence_rows}: give 0 or more")
        if (window_start_ns is None) != (window_end_ns is None):
            raise TracekitError("give both window_start_ns and window_end_ns (on the trace's timeline), or neither")
        window = None if window_start_ns is None else (int(window_start_ns), int(window_end_ns))  # type: ignore[arg-type]
        if window is not None and not all(INT64_MIN <= t <= INT64_MAX for t in window):
            raise TracekitError(f"window_start_ns/window_end_ns ({window[0]:.3g}, {window[1]:.3g}): give times on the "
                                "trace's timeline, signed 64-bit ns (describe gives capture.start_ns and end_ns)")
        if window is not None and window[1] <= window[0]:
            raise TracekitError(f"window_end_ns ({window[1]}) must be after window_start_ns ({window[0]})")
        cfg = DiagnoseConfig().with_overrides(list(settings))
        trace, resolved = self._nsys(path, "diagnose")
        ncu = self._ncu(ncu_path) if ncu_path else None
        if ncu is None and window is None and not settings:  # the default diagnosis: kept with the trace
            d = self._kept(trace, "diagnosis", lambda: self._diagnosis(trace))
        else:
            d = run(trace, ncu=ncu, window=window, config=cfg)
        full = json.loads(d.to_json())
        found = full["findings"]
        page = found[offset:offset + limit]
        for f in page:
            f["evidence_total_rows"] = len(f["evidence"])
            f["evidence"] = f["evidence"][:evidence_rows]
        counts: dict[str, int] = {}
        for f in found:
            counts[f["severity"]] = counts.get(f["severity"], 0) + 1
        head = ", ".join(f"{n} {sev}" for sev, n in counts.items())
        first = found[0] if found else None
        line = f"{len(found)} finding(s)" + (f" ({head})" if head else "")
        if first is not None:
            stake = f" — {_ms(first['time_ns'])} at stake" if first["time_ns"] is not None else ""
            line += f"; first: [{first['severity']}] {first['category']}{stake}: {first['title']}"
        full.update(findings=page, **_page(len(found), offset, len(page), limit), window_text=d.window_text(),
                    path=str(resolved), summary=line)
        return jsonable(full)  # type: ignore[no-any-return]

    def stats(self, path: str, report: str = "cuda_gpu_kern_sum", *, convention: str = "2025", offset: int = 0,
              limit: int | None = None, csv: bool = False) -> dict[str, Any]:
        """Report ``report`` as ``tracekit stats -r REPORT -f csv PATH`` prints it: nsys's
        columns, each cell as nsys prints it (numbers as JSON numbers), rows paged; with
        ``csv`` also the page as CSV text (header included), byte for byte the CLI's."""
        from tracekit.errors import TraceFormatError
        from tracekit.stats import run_report

        offset, limit = self._limit(offset, limit)
        name = report.strip()
        if not name or "," in name:
            raise TracekitError(f"report {report!r}: give one report name, e.g. cuda_gpu_kern_sum (see the tool's description)")
        trace, resolved = self.open(path)
        if type(trace).__name__ != "NsysTrace":
            what = "an Nsight Compute report" if type(trace).__name__ == "NcuReport" else "a folder of per-rank reports"
            msg = f"{path} is {what}; `tracekit stats` reads Nsight Systems exports"
            raise TraceFormatError(msg)
        result = run_report(trace, name, convention=convention)
        part, total = _report_page(result, offset, limit)
        texts = part.text_frame()
        rows = [{c: _cell(v, part.kinds.get(c, "str")) for c, v in zip(texts.columns, r, strict=True)}
                for r in texts.iter_rows()]
        out: dict[str, Any] = {"path": str(resolved), "report": result.name, "convention": convention,
                               "columns": texts.columns, "rows": rows, **_page(total, offset, len(rows), limit),
                               "notes": list(result.notes)}
        if csv:
            out["csv"] = part.to_csv()
        out["summary"] = f"{result.name}: {total:,} row(s)" + (f", rows {offset}–{offset + len(rows) - 1} here" if rows else "")
        return out

    def top_kernels(self, path: str, n: int = 10, *, by: str = "name") -> dict[str, Any]:
        """The ``n`` kernels with most GPU time: ``cuda_gpu_kern_sum``'s rows (by demangled
        name; ``by="short_name"``: ``cuda_gpu_kern_sum:base``) with fields ``time_pct``,
        ``total_ns``, ``instances``, ``mean_ns``, ``median_ns``, ``min_ns``, ``max_ns``,
        ``stddev_ns``, ``name``."""
        import polars as pl

        from tracekit.stats import run_report

        if not 1 <= n <= MAX_LIMIT:
            raise TracekitError(f"n {n}: give 1 to {MAX_LIMIT}")
        if by not in ("name", "short_name"):
            raise TracekitError(f"by {by!r}: choose name (demangled) or short_name")
        trace, resolved = self._nsys(path, "top_kernels", sets=False)
        result = run_report(trace, "cuda_gpu_kern_sum" + (":base" if by == "short_name" else ""))
        frame = result.frame
        texts = result.__class__(result.name, frame.head(n), result.kinds, result.convention).text_frame()
        rows = [{KERN_SUM_FIELDS.get(c, c): _cell(v, result.kinds.get(c, "str")) for c, v in zip(texts.columns, r, strict=True)}
                for r in texts.iter_rows()]
        launches = int(frame["Instances"].sum()) if frame.height else 0
        total_ns = int(frame.select(pl.col("Total Time (ns)").sum()).item() or 0) if frame.height else 0
        line = f"{frame.height:,} distinct kernel(s), {launches:,} launches, {_ms(total_ns)} GPU time"
        if rows:
            line += f"; top: {(rows[0]['name'] or '(no name)')[:80]} {rows[0]['time_pct']}% ({_ms(rows[0]['total_ns'])}, {rows[0]['instances']:,}×)"
        return {"path": str(resolved), "by": by, "kernels": rows, "distinct_kernels": frame.height, "launches": launches,
                "kernel_time_ns": total_ns, "summary": line}

    def kernel(self, path: str, name: str, *, ncu_path: str | None = None, limit: int | None = None) -> dict[str, Any]:
        """One kernel across nsys and, with ``ncu_path``, ncu. ``name``: a demangled or short
        name as in ``top_kernels``, else a case-insensitive part of names that share one short
        name. Durations (``count``, ``total_ns``, ``mean_ns``, ``median_ns``, ``min_ns``,
        ``max_ns``, ``stddev_ns``, ``gpu_time_pct``), launch configurations (grid, block,
        registers, shared memory) with their launches, and from ncu per profiled result Tensor
        Core, DRAM and speed-of-light figures (:mod:`tracekit.analysis.ncu_views`)."""
        import polars as pl

        _, limit = self._limit(0, limit)
        key = name.strip() if isinstance(name, str) else ""
        if not key:
            raise TracekitError("name: give a kernel's name (see top_kernels), or a part of one")
        trace, resolved = self._nsys(path, "kernel", sets=False)
        report = self._ncu(ncu_path) if ncu_path else None  # every path checked before any work
        names = trace.table("kernels", ["name", "short_name"]).unique()
        picked = names.filter((pl.col("name") == key) | (pl.col("short_name") == key))
        how = "name" if picked.filter(pl.col("name") == key).height else "short_name"
        if picked.height == 0:
            low = key.lower()
            picked = names.filter(pl.col("name").str.to_lowercase().str.contains(low, literal=True)
                                  | pl.col("short_name").str.to_lowercase().str.contains(low, literal=True))
            how = "part of a name"
            shorts = picked["short_name"].drop_nulls().unique().sort().to_list()
            if not shorts:
                msg = f"no kernel of {resolved.name} is named {key!r} or has it in its name; list them with top_kernels"
                raise TracekitError(msg)
            if len(shorts) > 1:
                shown = ", ".join(shorts[:8]) + (" …" if len(shorts) > 8 else "")
                msg = f"{key!r} is part of {len(shorts)} kernels' names ({shown}); give one of them"
                raise TracekitError(msg)
        if how == "name":
            picked = picked.filter(pl.col("name") == key)
        wanted = picked["name"].drop_nulls().unique().to_list()
        cols = ["name", "short_name", "duration_ns", "device_id", "stream_id", *LAUNCH_COLUMNS]
        rows = trace.scan("kernels").filter(pl.col("name").is_in(wanted)).select(cols).collect()
        all_ns = int(trace.scan("kernels").select(pl.col("duration_ns").sum()).collect().item() or 0)
        dur = rows["duration_ns"]
        n = rows.height
        durations = {
            "count": n, "total_ns": int(dur.sum() or 0), "mean_ns": dur.mean(), "median_ns": dur.median(),
            "min_ns": dur.min(), "max_ns": dur.max(), "stddev_ns": float(dur.std(ddof=1) or 0.0) if n > 1 else 0.0,
            "gpu_time_pct": 100.0 * float(dur.sum() or 0) / all_ns if all_ns else None,
        }
        configs = (rows.group_by(list(LAUNCH_COLUMNS)).agg(pl.len().alias("launches"), pl.col("duration_ns").sum().alias("total_ns"),
                                                         pl.col("duration_ns").median().alias("median_ns"))
                   .sort(["launches", "total_ns"], descending=True))
        config_rows, config_page = _rows(configs, 0, limit)
        shorts = sorted({s for s in rows["short_name"].to_list() if s is not None})
        out: dict[str, Any] = {
            "path": str(resolved), "query": key, "matched_by": how, "short_names": shorts, "names": wanted[:limit],
            "name_count": len(wanted), "durations": jsonable(durations),
            "devices": sorted(d for d in rows["device_id"].unique().to_list() if d is not None),
            "streams": int(rows["stream_id"].n_unique()), "launch_configs": config_rows,
            "launch_config_count": config_page["total_rows"], "ncu": None,
        }
        label = shorts[0] if len(shorts) == 1 else key
        line = (f"{label}: {n:,} launches, {_ms(durations['total_ns'])} total"
                + (f" ({durations['gpu_time_pct']:.1f}% of kernel time)" if durations["gpu_time_pct"] is not None else "")
                + f", median {_ms(durations['median_ns'])}, {configs.height} launch configuration(s)")
        if report is not None:
            out["ncu"] = self._ncu_figures(report, wanted, shorts, limit)
            got = out["ncu"]
            if got["results"]:
                line += f"; ncu: {got['profiled']} result(s)" + "".join(
                    f", {label2} {got['medians'][field]:.1f}%" for field, label2 in (
                        ("tensor_pipe_pct", "tensor pipe"), ("bandwidth_pct_of_peak", "DRAM bandwidth"))
                    if got["medians"].get(field) is not None)
            else:
                line += "; ncu: not profiled"
        out["summary"] = line
        return out

    @staticmethod
    def _ncu_figures(report: Any, names: list[str], shorts: list[str], limit: int) -> dict[str, Any]:
        """The ncu results of the kernels ``names`` (or, failing that, ``shorts``): per result
        its launch, Tensor Core, DRAM and speed-of-light columns; their medians."""
        import polars as pl

        from tracekit.analysis import ncu_views

        k = report.kernels
        ids = k.filter(pl.col("name").is_in(names))
        if ids.height == 0:
            ids = k.filter(pl.col("short_name").is_in(shorts))
        keep = ids["id"].to_list()
        if ids.height == 0:
            return {"profiled": 0, "results": [], "medians": {},
                    "note": "no result of this kernel in the ncu report (profile it: tracekit's ncu_command_for_top_kernels, docs/ncu.md)"}
        base = ids.select("id", "nvtx_path", pl.col("duration_ns").alias("ncu_duration_ns"),
                          *[c for c in LAUNCH_COLUMNS if c in ids.columns])
        tc = ncu_views.tensor_core_utilization(report).filter(pl.col("id").is_in(keep)).select(
            "id", "tensor_pipe_pct", "hmma_pipe_pct", "imma_pipe_pct", "tensor_flop", "tensor_int_ops", "tensor_precision",
            "tensor_flops_per_s", "peak_tensor_flops_per_s", "tensor_pct_of_peak", pl.col("peak_source").alias("tensor_peak_source"))
        dr = ncu_views.dram_bandwidth(report).filter(pl.col("id").is_in(keep)).select(
            "id", "dram_bytes", "dram_bytes_source", "bandwidth_gbps", "peak_bandwidth_gbps", "bandwidth_pct_of_peak",
            "dram_throughput_pct", "l1_hit_rate_pct", "l2_hit_rate_pct")
        sol = ncu_views.speed_of_light(report).filter(pl.col("id").is_in(keep)).select(
            "id", "compute_throughput_pct", "memory_throughput_pct", "achieved_occupancy_pct", "theoretical_occupancy_pct", "bound")
        joined = base.join(tc, on="id", how="left").join(dr, on="id", how="left").join(sol, on="id", how="left").sort("id")
        numeric = [c for c in ("ncu_duration_ns", "tensor_pipe_pct", "tensor_pct_of_peak", "tensor_flops_per_s", "dram_bytes",
                               "bandwidth_gbps", "bandwidth_pct_of_peak", "compute_throughput_pct", "memory_throughput_pct",
                               "achieved_occupancy_pct")]
        medians = joined.select([pl.col(c).cast(pl.Float64).median() for c in numeric]).row(0, named=True)
        results, page = _rows(joined, 0, limit)
        bounds = joined["bound"].drop_nulls().value_counts(sort=True)
        return {"profiled": joined.height, "results": results, "results_page": page, "medians": jsonable(medians),
                "bound": jsonable(dict(bounds.iter_rows())) if bounds.height else {}}

    def query(self, sql: str, path: str, *, offset: int = 0, limit: int | None = None) -> dict[str, Any]:
        """Rows of one read-only SQL query (``polars.SQLContext``) over tracekit's tables of
        ``path``: ``kernels``, ``memcpys``, ``memsets``, ``syncs``, ``graph_trace``,
        ``cuda_api``, ``nvtx``, ``gpus``, ``processes``, ``threads``, ``memory_usage``,
        ``gpu_metrics``, ``graphs``, ``nccl`` (docs/tables.md); an Nsight Compute report gives
        ``kernels``, ``metrics``, ``instances``, ``rules``, ``devices``."""
        import polars as pl

        offset, limit = self._limit(offset, limit)
        text = check_select(sql)
        obj, resolved = self.open(path)
        kind = type(obj).__name__
        if kind == "NcuReport":
            known = ["kernels", "metrics", "instances", "rules", "devices"]

            def frame(n: str) -> Any:
                return getattr(obj, n).lazy()
        else:
            from tracekit.nsys.schema import TABLES

            known = [*TABLES, "graphs", "nccl"]

            def frame(n: str) -> Any:
                if kind == "NsysTrace" and n in TABLES:
                    return obj.scan(n)
                return obj.table(n).lazy()
        names = table_names_in(text, known)
        if not names:
            msg = f"query: name one of the tables {', '.join(known)} (docs/tables.md), e.g. SELECT count(*) FROM kernels"
            raise TracekitError(msg)
        ctx = pl.SQLContext({n: frame(n) for n in names}, register_globals=False)
        try:
            lazy = ctx.execute(text, eager=False)
            # only the page is built (a SELECT * of a million rows never is); the rows are
            # counted in a second pass over the same plan when the page does not say how many
            part = lazy.slice(offset, limit).collect()
            if part.height < limit and (part.height or not offset):
                total = offset + part.height
            else:
                total = int(lazy.select(pl.len()).collect().item())
        except (pl.exceptions.PolarsError, ValueError, KeyError) as exc:
            from tracekit.errors import one_line

            raise TracekitError(f"query: {one_line(str(exc), 300)} (tables: {', '.join(known)})") from None
        rows = jsonable(part.to_dicts())
        line = f"{total:,} row(s) × {part.width} column(s)" + (
            f"; rows {offset}–{offset + len(rows) - 1} here" if rows else "")
        return {"path": str(resolved), "tables": names, "columns": part.columns, "dtypes": [str(t) for t in part.dtypes],
                "rows": rows, **_page(total, offset, len(rows), limit), "summary": line}

    def diff(self, before: str, after: str, *, threshold_pct: float = 5.0, levels: str = "kernel,family,range,step",
             findings: bool = True, offset: int = 0, limit: int | None = None) -> dict[str, Any]:
        """What ``tracekit diff -f json BEFORE AFTER`` prints (``Diff.to_dict()``): the verdict,
        the findings that changed, per level the rows (paged, ``level_rows`` giving each level's
        count), the regressions."""
        from tracekit.comparison import diff as run

        offset, limit = self._limit(offset, limit)
        if not threshold_pct >= 0:
            raise TracekitError(f"threshold_pct {threshold_pct}: give a percentage of 0 or more (5 = fail when 5 % slower per step)")
        sides = []
        for given, what in ((before, "before"), (after, "after")):
            resolved, target = self._target(given, what)
            if isinstance(target, list):  # per-rank reports: opened here, each file checked
                sides.append((resolved, _open_target(target)))
                continue
            if _kind_of(target) == "ncu":
                msg = f"{given} is an Nsight Compute report; the diff tool compares Nsight Systems exports"
                raise TracekitError(msg)
            sides.append((resolved, str(target)))  # opened by diff, its tables let go after its half
        lv = tuple(x.strip() for x in levels.split(",") if x.strip())
        d = run(sides[0][1], sides[1][1], levels=lv, threshold=threshold_pct / 100, findings=findings)
        # as the CLI names them: the paths given (a link's own name, not its target's)
        d.before, d.after = Path(before).name or before, Path(after).name or after
        full = json.loads(d.to_json())
        counts = {k: len(v) for k, v in full["levels"].items()}
        full["levels"] = {k: v[offset:offset + limit] for k, v in full["levels"].items()}
        line = d.verdict_line().replace("add step to --by", "add step to levels")  # this tool's term for the CLI's --by
        full.update(level_rows=counts, offset=offset, limit=limit, regression_count=len(full["regressions"]),
                    summary=line)
        if "verdict_line" in full:
            full["verdict_line"] = line
        return jsonable(full)  # type: ignore[no-any-return]


def _kind_of(target: Path) -> str:
    from tracekit.opening import sniff

    if target.is_dir():
        return "folder"
    kind = sniff(target)
    return "ncu" if kind.startswith("ncu") else kind


def _identity(target: Path | list[Path]) -> Any:
    if isinstance(target, list):
        return tuple(_identity(t) for t in target)
    st = target.stat()
    return (str(target), st.st_size, st.st_mtime_ns, st.st_ino)


def _open_target(target: Path | list[Path]) -> Any:
    import tracekit
    from tracekit.errors import UnrelatedReportsError

    if isinstance(target, list):
        try:
            return tracekit.open_many([str(t) for t in target], max_workers=1)
        except UnrelatedReportsError as exc:  # the hint in this server's terms
            msg = (f"{exc.reason}; give one report's path, or describe them side by side "
                   "(describe with side_by_side=true)")
            raise UnrelatedReportsError(msg, exc.reason) from None
    return tracekit.open(target)


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _cell(text: str | None, kind: str) -> Any:
    """A report cell as nsys prints it, as JSON: numbers for numeric columns."""
    if text is None:
        return None
    if kind == "int":
        try:
            return int(text)
        except ValueError:
            return text
    if kind in ("float1", "pct", "mb3"):
        try:
            return float(text)
        except ValueError:
            return text
    return text


def _report_page(result: Any, offset: int, limit: int) -> tuple[Any, int]:
    """Rows ``offset``…``offset+limit`` of a stats report (a ``Report`` of those rows) and
    its row count; a chunked report's parts are walked one at a time, never joined whole."""
    from tracekit.stats.common import Report

    parts: Callable[[], Any] | None = getattr(result, "_parts", None)
    if getattr(result, "_frame", None) is not None or parts is None:
        frame = result.frame
        return Report(result.name, frame.slice(offset, limit), result.kinds, result.convention), frame.height
    import polars as pl

    kept, total, schema = [], 0, None
    for part in parts():
        schema = schema if schema is not None else part.clear()
        lo, hi = max(offset - total, 0), min(offset + limit - total, part.height)
        if hi > lo:
            kept.append(part.slice(lo, hi - lo))
        total += part.height
    frame = pl.concat(kept, how="vertical") if kept else schema
    return Report(result.name, frame, result.kinds, result.convention), total


#: Tool name → the :class:`Session` method the server calls.
TOOLS: dict[str, str] = {name: name for name in ("list_traces", "describe", "summary", "diagnose", "stats", "top_kernels", "kernel",
                                                 "query", "diff")}
