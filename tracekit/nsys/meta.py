"""Export and capture metadata: versions, time window, capture command, what is missing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from tracekit.errors import TracekitError
from tracekit.nsys.database import ExportSource

#: Tables whose absence means the export holds no CUDA trace at all.
CUDA_TABLES = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
)


@dataclass
class CapturedProcess:
    """One process nsys launched: its command line, working directory and environment."""

    command: list[str]
    working_dir: str | None = None
    environment: dict[str, str] = field(default_factory=dict)


@dataclass
class TraceMeta:
    """What the export says about itself.

    Attributes
    ----------
    product_version
        The nsys version that wrote the export (``"2025.3.2.474"``), or ``None`` when the
        file has no metadata table (nsys ≤ 2021.x); then ``version_inferred`` holds a range.
    schema_version
        ``EXPORT_SCHEMA_VERSION`` (``"3.20.3"``) when recorded.
    start_ns, end_ns, duration_ns
        The capture window on the events' timeline, in ns: ``ANALYSIS_DETAILS``' start and
        stop, or ``[0, duration]`` for a capture opened by a capture range, whose events are
        timed from the capture's start while ``ANALYSIS_DETAILS`` keeps another clock.
    session_epoch_ns
        UTC epoch of timeline 0, in ns (``TARGET_INFO_SESSION_START_TIME.utcEpochNs``): add it
        to a timestamp for wall-clock time; it aligns traces of several ranks.
    """

    path: Path
    product_version: str | None = None
    schema_version: str | None = None
    version_inferred: str | None = None
    start_ns: int | None = None
    end_ns: int | None = None
    duration_ns: int | None = None
    session_epoch_ns: int | None = None
    export: dict[str, str] = field(default_factory=dict)
    capture: list[tuple[str, str]] = field(default_factory=list)
    processes: list[CapturedProcess] = field(default_factory=list)
    system: dict[str, str] = field(default_factory=dict)
    diagnostics: list[str] = field(default_factory=list)
    partial_export: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    tables: frozenset[str] = frozenset()

    @property
    def version(self) -> str:
        """The nsys version, recorded or inferred (``"unknown"`` if neither)."""
        return self.product_version or self.version_inferred or "unknown"

    #: Looks for a non-null ``NVTX_EVENTS.binaryData`` (a table scan, so only when asked).
    blob_probe: Callable[[], bool] | None = field(default=None, repr=False, compare=False)

    @cached_property
    def has_blobs(self) -> bool:
        """Whether NVTX payload bytes were exported (``--include-blobs=true``).

        nsys 2026.x records the option (``EXPORT_PARAM_INCLUDE_BLOBS``); for older exports
        tracekit looks for a non-null ``NVTX_EVENTS.binaryData`` (on first use: it scans the
        table, 0.03 s for 200 k ranges).
        """
        recorded = self.export.get("EXPORT_PARAM_INCLUDE_BLOBS")
        if recorded is not None:
            return recorded.lower() == "true"
        return self.blob_probe() if self.blob_probe is not None else False

    @property
    def cuda_graph_trace(self) -> str | None:
        """How nsys traced CUDA graphs: ``"graph"`` (one ``graph_trace`` row per launch, the
        graph's kernels not traced), ``"node"`` (every kernel, with ``graph_node_id``), or
        ``None`` when the capture settings do not say (``META_DATA_CAPTURE``
        ``PROCESS_n:CUDA_GRAPH_TRACE_OPTIONS:MODE``, nsys ≥ 2023.4)."""
        mode = next((v for k, v in self.capture if k.endswith("CUDA_GRAPH_TRACE_OPTIONS:MODE")), None)
        return mode.strip().lower() if mode else None

    def capture_option(self, name: str) -> str | None:
        """First value of capture setting ``name`` (``META_DATA_CAPTURE``), e.g. ``"GPU_METRICS_OPTIONS:SAMPLING_FREQUENCY"``."""
        return next((v for k, v in self.capture if k == name), None)


def _first_start(db: ExportSource, table: str) -> int | None:
    """The first non-null ``start`` of ``table`` (one row), or None: also when the table cannot
    be read, which is said, in one line, when the table itself is asked for."""
    try:
        if not db.has_column(table, "start"):
            return None
        value = db.scalar(f'SELECT start FROM "{table}" WHERE start IS NOT NULL LIMIT 1')
    except TracekitError:
        return None
    return value if isinstance(value, int) else None  # a damaged cell (text in INTEGER) tells nothing


def _rebased(db: ExportSource, start_ns: int, end_ns: int) -> bool:
    """Whether the events lie on a timeline that starts at the capture rather than on
    ``ANALYSIS_DETAILS``' own clock: the first CUDA API call and kernel (one row each; NVTX
    only without them, since a range pushed before a capture range opened starts before its
    0) fall before ``startTime`` yet within the capture's duration."""
    seen = [t for t in (_first_start(db, "CUPTI_ACTIVITY_KIND_RUNTIME"), _first_start(db, "CUPTI_ACTIVITY_KIND_KERNEL")) if t is not None]
    if not seen:
        first = _first_start(db, "NVTX_EVENTS")
        seen = [first] if first is not None and first >= 0 else []
    return bool(seen) and all(t < start_ns and t <= end_ns - start_ns for t in seen)


def _infer_version(db: ExportSource) -> str | None:
    if db.has_table("TARGET_INFO_GPU"):
        if db.has_column("TARGET_INFO_GPU", "deviceId"):
            return "2020.5"
        if not db.has_column("CUPTI_ACTIVITY_KIND_KERNEL", "mangledName"):
            return "2021.x"
        return "2022.x"
    if db.has_table("TARGET_INFO_CUDA_GPU"):
        return "2020.3-2020.4"
    return None


def _processes(capture: list[tuple[str, str]]) -> list[CapturedProcess]:
    by_index: dict[str, CapturedProcess] = {}
    args: dict[str, list[tuple[int, str]]] = {}
    for key, value in capture:
        if not key.startswith("PROCESS_") or ":" not in key:
            continue
        proc, item = key.split(":", 1)
        entry = by_index.setdefault(proc, CapturedProcess(command=[]))
        if item == "COMMAND":
            entry.command.insert(0, value)
        elif item.startswith("ARGUMENT_"):
            args.setdefault(proc, []).append((int(item.split("_")[1]), value))
        elif item == "WORKING_DIR":
            entry.working_dir = value
        elif item == "ENVIRONMENT_VARIABLE" and "=" in value:
            name, _, raw = value.partition("=")
            entry.environment[name] = raw[1:-1] if raw.startswith('"') and raw.endswith('"') else raw
    for proc, pairs in args.items():
        by_index[proc].command.extend(v for _, v in sorted(pairs))
    return list(by_index.values())


def read_meta(db: ExportSource) -> TraceMeta:
    """Collect :class:`TraceMeta` from the export's metadata tables."""
    export = db.key_values("META_DATA_EXPORT") or db.key_values("EXPORT_META_DATA")
    capture: list[tuple[str, str]] = []
    if db.has_table("META_DATA_CAPTURE"):
        capture = [
            (str(k), "" if v is None else str(v))
            for k, v in db.rows("SELECT name, value FROM META_DATA_CAPTURE")
        ]
    meta = TraceMeta(path=db.path, export=export, capture=capture, tables=db.tables)
    meta.product_version = export.get("EXPORT_PRODUCT_VERSION")
    meta.schema_version = export.get("EXPORT_SCHEMA_VERSION")
    if meta.product_version is None:
        meta.version_inferred = _infer_version(db)
    if db.has_table("ANALYSIS_DETAILS"):
        row = next(iter(db.rows("SELECT startTime, stopTime, duration FROM ANALYSIS_DETAILS")), None)
        if row:
            meta.start_ns, meta.end_ns, meta.duration_ns = (None if v is None else int(v) for v in row)
            if meta.start_ns is not None and meta.end_ns is not None and _rebased(db, meta.start_ns, meta.end_ns):
                # a capture opened by a capture range (cudaProfilerStart, an NVTX range): its
                # events are timed from the capture's start (timeline 0 is
                # TARGET_INFO_SESSION_START_TIME), while ANALYSIS_DETAILS keeps start and stop
                # on another clock; the window on the events' timeline is [0, duration]
                meta.start_ns, meta.end_ns = 0, meta.end_ns - meta.start_ns
    epoch = db.scalar("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME") if db.has_table(
        "TARGET_INFO_SESSION_START_TIME"
    ) else None
    meta.session_epoch_ns = None if epoch is None else int(epoch)
    meta.processes = _processes(capture)
    if db.has_column("NVTX_EVENTS", "binaryData"):
        meta.blob_probe = lambda: bool(db.scalar("SELECT EXISTS (SELECT 1 FROM NVTX_EVENTS WHERE binaryData IS NOT NULL)"))
    if {"name", "value"} <= set(db.columns("TARGET_INFO_SYSTEM_ENV")):
        meta.system = {
            str(k): str(v) for k, v in db.rows("SELECT name, value FROM TARGET_INFO_SYSTEM_ENV")
        }
    if db.has_column("DIAGNOSTIC_EVENT", "text"):
        meta.diagnostics = [
            str(t) for (t,) in db.rows("SELECT text FROM DIAGNOSTIC_EVENT ORDER BY timestamp")
        ]
    meta.partial_export = {
        k: v
        for k, v in export.items()
        if k in ("EXPORT_PARAM_TABLES_TO_EXPORT", "EXPORT_PARAM_TIMES_TO_EXPORT") and v
    }
    if not any(db.has_table(t) for t in CUDA_TABLES):
        meta.missing.append("CUDA trace (no kernel, memcpy, memset or CUDA API table)")
    if not db.has_table("NVTX_EVENTS"):
        meta.missing.append("NVTX ranges (no NVTX_EVENTS table)")
    if not (db.has_table("TARGET_INFO_GPU") or db.has_table("TARGET_INFO_CUDA_GPU")):
        meta.missing.append("GPU descriptions (no TARGET_INFO_GPU table)")
    return meta
