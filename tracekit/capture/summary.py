"""``summary.json``: totals and top kernels of a finished capture, read back through the loader.

:func:`kernel_summary` is a pure function over a kernels table; :func:`summarize_nsys` opens a
report with :func:`tracekit.open` (imported lazily: the loader may be absent or fail) and, when
that fails, records the error and reads the kernel table straight from the SQLite export so that
a sweep still gets its numbers. :func:`summarize_ncu_csv` reads ncu's ``--page raw`` CSV;
:func:`summarize_torch` opens the ``torch.profiler`` traces of mode ``torch``.
"""

from __future__ import annotations

import csv
import gzip
import json
import logging
import re
import sqlite3
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import polars as pl

log = logging.getLogger(__name__)

_TIME_UNITS = {"ns": 1, "nsecond": 1, "us": 1_000, "usecond": 1_000, "ms": 1_000_000,
               "msecond": 1_000_000, "s": 1_000_000_000, "second": 1_000_000_000}  # fmt: skip


def kernel_summary(kernels: pl.DataFrame, *, top_n: int = 10) -> dict[str, Any]:
    """Totals and top kernels of a kernels table.

    Parameters
    ----------
    kernels
        Columns ``name`` (str), ``start_ns``, ``end_ns`` (Int64 ns), optional ``duration_ns``,
        ``device_id`` and ``short_name``.
    top_n
        How many kernels to list, by total time.

    Returns
    -------
    dict
        ``kernel_count``, ``gpu_time_ns`` (sum of kernel durations), ``span_ns`` (first start
        to last end, summed over devices), ``busy_ns`` (union of kernel intervals),
        ``idle_pct`` (100 × gaps / span), ``comm_pct`` (share of kernel time in kernels whose
        name holds ``nccl``), ``devices`` and ``top_kernels`` (``name``, ``short_name``,
        ``count``, ``total_ns``, ``mean_ns``, ``pct``).
    """
    import polars as pl

    if kernels.height == 0:
        return {
            "kernel_count": 0,
            "gpu_time_ns": 0,
            "span_ns": 0,
            "busy_ns": 0,
            "idle_pct": None,
            "comm_pct": None,
            "devices": [],
            "top_kernels": [],
        }
    frame = kernels
    if "duration_ns" not in frame.columns:
        frame = frame.with_columns(duration_ns=pl.col("end_ns") - pl.col("start_ns"))
    if "device_id" not in frame.columns:
        frame = frame.with_columns(device_id=pl.lit(0))
    if "short_name" not in frame.columns:
        frame = frame.with_columns(short_name=pl.col("name"))
    frame = frame.filter(pl.col("start_ns").is_not_null() & pl.col("end_ns").is_not_null())
    total = int(frame["duration_ns"].sum())
    gaps = (
        frame.sort(["device_id", "start_ns"])
        .with_columns(prev_end=pl.col("end_ns").cum_max().shift(1).over("device_id"))
        .with_columns(
            gap=(pl.col("start_ns") - pl.col("prev_end")).clip(lower_bound=0).fill_null(0)
        )
        .group_by("device_id")
        .agg(span=pl.col("end_ns").max() - pl.col("start_ns").min(), gaps=pl.col("gap").sum())
    )
    span = int(gaps["span"].sum())
    idle = int(gaps["gaps"].sum())
    comm = int(
        frame.filter(pl.col("name").str.to_lowercase().str.contains("nccl"))["duration_ns"].sum()
    )
    top = (
        frame.group_by("name")
        .agg(
            short_name=pl.col("short_name").first(),
            count=pl.len(),
            total_ns=pl.col("duration_ns").sum(),
        )
        .with_columns(mean_ns=pl.col("total_ns") // pl.col("count"))
        .sort(["total_ns", "name"], descending=[True, False])
        .head(top_n)
    )
    return {
        "kernel_count": frame.height,
        "gpu_time_ns": total,
        "span_ns": span,
        "busy_ns": span - idle,
        "idle_pct": round(100.0 * idle / span, 3) if span else None,
        "comm_pct": round(100.0 * comm / total, 3) if total else None,
        "devices": sorted(int(d) for d in frame["device_id"].unique().drop_nulls()),
        "top_kernels": [
            {
                **row,
                "count": int(row["count"]),
                "total_ns": int(row["total_ns"]),
                "mean_ns": int(row["mean_ns"]),
                "pct": round(100.0 * row["total_ns"] / total, 3) if total else None,
            }
            for row in top.iter_rows(named=True)
        ],
    }


def _kernels_from_sqlite(path: Path) -> pl.DataFrame:
    """The kernel table of an nsys SQLite export, read directly (the loader's stand-in)."""
    import polars as pl

    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "CUPTI_ACTIVITY_KIND_KERNEL" not in tables:
            return pl.DataFrame(
                schema={
                    "name": pl.String,
                    "start_ns": pl.Int64,
                    "end_ns": pl.Int64,
                    "device_id": pl.Int64,
                    "short_name": pl.String,
                }
            )
        columns = {r[1] for r in con.execute("PRAGMA table_info(CUPTI_ACTIVITY_KIND_KERNEL)")}
        name_col = "demangledName" if "demangledName" in columns else "shortName"
        rows = con.execute(
            f"SELECT COALESCE(d.value, s.value), s.value, k.start, k.end, k.deviceId "  # noqa: S608
            f"FROM CUPTI_ACTIVITY_KIND_KERNEL k "
            f"LEFT JOIN StringIds d ON d.id = k.{name_col} LEFT JOIN StringIds s ON s.id = k.shortName"
        ).fetchall()
    return pl.DataFrame(
        rows,
        schema={
            "name": pl.String,
            "short_name": pl.String,
            "start_ns": pl.Int64,
            "end_ns": pl.Int64,
            "device_id": pl.Int64,
        },
        orient="row",
    )


def load_kernels(
    path: Path, notes: list[str] | None = None
) -> tuple[pl.DataFrame | None, str | None, str]:
    """The kernels of a report: ``(frame, loader_error, source)``; frame is ``None`` if unreadable.

    Warnings the loader raises (an incomplete export, say) are appended to ``notes``.
    """
    loader_error: str | None = None
    try:
        import tracekit

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            kernels = tracekit.open(path).kernels
        if notes is not None:
            notes.extend(f"{w.category.__name__}: {w.message}" for w in caught)
        return kernels, None, "tracekit.open"
    except Exception as exc:  # the loader is optional here: record why, then try the fallback
        loader_error = f"tracekit.open failed: {type(exc).__name__}: {exc}"
        log.info(loader_error)
    if path.suffix == ".sqlite" and path.exists():
        try:
            return _kernels_from_sqlite(path), loader_error, "sqlite"
        except (sqlite3.Error, OSError, ImportError) as exc:  # ImportError: no polars where the program runs
            return None, f"{loader_error}; reading the SQLite directly failed too: {exc}", "none"
    return None, loader_error, "none"


def summarize_nsys(
    path: Path, *, top_n: int = 10, frames: list[pl.DataFrame] | None = None
) -> dict[str, Any]:
    """Summary of one nsys report (``.sqlite`` preferred); ``error`` holds why the loader failed.

    The kernels table read on the way is appended to ``frames`` when given.
    """
    notes: list[str] = []
    kernels, error, source = load_kernels(path, notes)
    if kernels is not None and frames is not None:
        frames.append(kernels)
    summary: dict[str, Any] = {"report": path.name, "source": source}
    if error:
        summary["error"] = error
    if notes:
        summary["loader_warnings"] = notes
    if kernels is not None:
        try:
            summary.update(kernel_summary(kernels, top_n=top_n))
        except Exception as exc:  # an unexpected table shape must not lose the capture
            summary["error"] = (
                f"{error + '; ' if error else ''}summarizing kernels failed: {type(exc).__name__}: {exc}"
            )
    return summary


def combine(summaries: Sequence[dict[str, Any]], *, top_n: int = 10) -> dict[str, Any]:
    """One summary over several reports (one per rank): sums, weighted percentages, merged top list."""
    if len(summaries) == 1:
        return dict(summaries[0])
    ok = [s for s in summaries if "kernel_count" in s]
    out: dict[str, Any] = {"reports": {s.get("report", str(i)): s for i, s in enumerate(summaries)}}
    errors = [s["error"] for s in summaries if s.get("error")]
    if errors:
        out["error"] = errors[0]
    if not ok:
        return out
    total = sum(s["gpu_time_ns"] for s in ok)
    span = sum(s["span_ns"] for s in ok)
    busy = sum(s["busy_ns"] for s in ok)
    comm = sum((s["comm_pct"] or 0) * s["gpu_time_ns"] / 100 for s in ok)
    merged: dict[str, dict[str, Any]] = {}
    for s in ok:
        for k in s["top_kernels"]:
            entry = merged.setdefault(
                k["name"],
                {"name": k["name"], "short_name": k.get("short_name"), "count": 0, "total_ns": 0},
            )
            entry["count"] += k["count"]
            entry["total_ns"] += k["total_ns"]
    top = sorted(merged.values(), key=lambda k: (-k["total_ns"], k["name"]))[:top_n]
    for k in top:
        k["mean_ns"] = k["total_ns"] // max(k["count"], 1)
        k["pct"] = round(100.0 * k["total_ns"] / total, 3) if total else None
    out.update(
        kernel_count=sum(s["kernel_count"] for s in ok),
        gpu_time_ns=total,
        span_ns=span,
        busy_ns=busy,
        idle_pct=round(100.0 * (span - busy) / span, 3) if span else None,
        comm_pct=round(100.0 * comm / total, 3) if total else None,
        devices=sorted({d for s in ok for d in s["devices"]}),
        top_kernels=top,
    )
    return out


_GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset"})
_PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")


def kineto_activity(path: Path) -> dict[str, Any]:
    """What a ``torch.profiler`` trace holds, read with the standard library: ``events``,
    ``gpu_events`` (kernels, copies, memsets) and ``profiler_steps`` (the ``N`` of each
    ``ProfilerStep#N`` range, sorted). Reads the whole JSON: for the small traces whose
    opening failed, not for every trace."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        doc = json.load(fh)
    events = (doc.get("traceEvents") or []) if isinstance(doc, dict) else []
    gpu = 0
    steps: set[int] = set()
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        if str(e.get("cat", "")).lower() in _GPU_CATEGORIES:
            gpu += 1
        m = _PROFILER_STEP.match(str(e.get("name", "")))
        if m:
            steps.add(int(m.group(1)))
    return {"events": len(events), "gpu_events": gpu, "profiler_steps": sorted(steps)}


def no_gpu_activity(what: str, events: int) -> str:
    """The one line for traces without GPU work (``what``: "the trace x.json.gz has", "the 2
    traces have"): why (the program ran without CUDA) and what to do."""
    return (f"{what} no GPU activity ({events:,} events, no kernels or copies): torch saw no CUDA device in the "
            "program (a CPU-only torch, or no GPU visible: CUDA_VISIBLE_DEVICES), and tracekit's tables need GPU "
            "work; capture on a GPU machine (the trace itself opens in Perfetto)")


def _profiler_steps(trace: Any) -> list[int]:
    """The ``N`` of the ``ProfilerStep#N`` ranges of an opened Kineto trace (its ``nvtx`` table)."""
    nvtx = trace.nvtx
    column = "text" if "text" in nvtx.columns else "name"
    names = nvtx[column].drop_nulls().unique().to_list()
    return sorted(int(m.group(1)) for m in map(_PROFILER_STEP.match, names) if m)


def summarize_torch(paths: Sequence[Path], *, top_n: int = 10) -> dict[str, Any]:
    """Summary of the ``torch.profiler`` traces of one capture (one per process or rank).

    Each trace is opened with :func:`tracekit.open`: kernel totals and top kernels as
    :func:`kernel_summary`, plus ``profiler_steps``. A trace that does not open gets ``error``
    (for one without GPU work, :func:`no_gpu_activity`'s line, and ``no_gpu_activity: True``);
    several traces are combined as :func:`combine` does.
    """
    per_trace: list[dict[str, Any]] = []
    for path in paths:
        entry: dict[str, Any] = {"report": path.name, "source": "tracekit.open"}
        try:
            import tracekit

            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                trace = tracekit.open(path)
                entry.update(kernel_summary(trace.kernels, top_n=top_n))
                try:
                    entry["profiler_steps"] = _profiler_steps(trace)
                except Exception as exc:  # the steps are a nicety: the kernels are the summary
                    log.info("no ProfilerStep ranges from %s: %s", path, exc)
            if caught:
                entry["loader_warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
        except Exception as exc:  # recorded, never lost: the trace file stays for other tools
            entry["source"] = "none"
            try:
                activity = kineto_activity(path)
            except (OSError, ValueError, EOFError):
                activity = None
            if activity is not None and activity["events"] and not activity["gpu_events"]:
                entry.update(error=no_gpu_activity(f"the trace {path.name} has", activity["events"]),
                             no_gpu_activity=True, events=activity["events"], profiler_steps=activity["profiler_steps"])
            else:
                entry["error"] = f"tracekit.open failed: {type(exc).__name__}: {exc}"
        per_trace.append(entry)
    if not per_trace:
        return {"error": "no trace"}
    out = combine(per_trace, top_n=top_n)
    if len(per_trace) > 1 and all(s.get("no_gpu_activity") for s in per_trace):
        events = sum(s["events"] for s in per_trace)
        out.update(no_gpu_activity=True, error=no_gpu_activity(f"the {len(per_trace)} traces have", events))
    return out


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def summarize_ncu_csv(path: Path, *, top_n: int = 10) -> dict[str, Any]:
    """Summary of ncu's ``--csv --page raw --print-units base`` output: kernels profiled, top by time."""
    with path.open(newline="", encoding="utf-8", errors="replace") as fh:
        lines = [line for line in fh if not line.startswith("==")]
    rows = list(csv.reader(lines))
    if not rows or "Kernel Name" not in rows[0]:
        return {
            "report": path.name,
            "source": "ncu csv",
            "profiled_kernels": 0,
            "top_kernels": [],
            "error": f"{path.name} holds no ncu results table",
        }
    header, units, data = rows[0], rows[1] if len(rows) > 1 else [], rows[2:]
    name_i = header.index("Kernel Name")
    time_i = header.index("gpu__time_duration.sum") if "gpu__time_duration.sum" in header else None
    scale = _TIME_UNITS.get(units[time_i], 1) if time_i is not None and time_i < len(units) else 1
    kernels: dict[str, dict[str, Any]] = {}
    for row in data:
        if len(row) <= name_i:
            continue
        entry = kernels.setdefault(row[name_i], {"name": row[name_i], "count": 0, "total_ns": 0})
        entry["count"] += 1
        value = _number(row[time_i]) if time_i is not None and time_i < len(row) else None
        if value is not None:
            entry["total_ns"] += int(value * scale)
    top = sorted(kernels.values(), key=lambda k: (-k["total_ns"], -k["count"], k["name"]))[:top_n]
    return {
        "report": path.name,
        "source": "ncu csv",
        "profiled_kernels": sum(k["count"] for k in kernels.values()),
        "metrics": len(header),
        "top_kernels": top,
    }


def top_kernel_names(kernels: pl.DataFrame, top_n: int) -> list[str]:
    """Names of the ``top_n`` kernels by total time (``short_name`` when the table has it)."""
    import polars as pl

    column = "short_name" if "short_name" in kernels.columns else "name"
    if "duration_ns" not in kernels.columns:
        kernels = kernels.with_columns(duration_ns=pl.col("end_ns") - pl.col("start_ns"))
    ranked = (
        kernels.group_by(column)
        .agg(total=pl.col("duration_ns").sum())
        .sort(["total", column], descending=[True, False])
        .head(top_n)
    )
    return [str(n) for n in ranked[column].to_list() if n]
