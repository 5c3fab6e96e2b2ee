"""The data behind ``tracekit summary``: capture info and the few tables users look at first."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from tracekit.nsys.nvtx import qualified_name
from tracekit.nsys.readers import implausible_end

if TYPE_CHECKING:
    from tracekit.nsys.trace import NsysTrace


@dataclass
class TraceSummary:
    """``info`` (field → text), named ``tables`` (polars frames) and ``notes``."""

    path: Path
    info: dict[str, str] = field(default_factory=dict)
    tables: dict[str, pl.DataFrame] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _ms(ns: int | None) -> str:
    return "?" if ns is None else f"{ns / 1e6:,.3f} ms"


def top_kernels(kernels: pl.DataFrame, top: int = 10) -> pl.DataFrame:
    """Kernel names by total GPU time.

    Input columns: ``name``, ``short_name``, ``duration_ns``. Output: ``kernel`` (short name),
    ``calls``, ``total_ms``, ``mean_us``, ``gpu_time_pct`` (share of all kernel time, %).
    """
    if kernels.is_empty():
        return pl.DataFrame(schema={"kernel": pl.Utf8, "calls": pl.Int64, "total_ms": pl.Float64,
                                    "mean_us": pl.Float64, "gpu_time_pct": pl.Float64})
    total = kernels["duration_ns"].sum()
    return (
        kernels.group_by(pl.coalesce("short_name", "name").alias("kernel"))
        .agg(pl.len().cast(pl.Int64).alias("calls"), pl.col("duration_ns").sum().alias("_t"),
             pl.col("duration_ns").mean().alias("_m"))
        .sort(["_t", "kernel"], descending=[True, False])
        .head(top)
        .select("kernel", "calls", (pl.col("_t") / 1e6).alias("total_ms"), (pl.col("_m") / 1e3).alias("mean_us"),
                (pl.col("_t") * 100.0 / total).alias("gpu_time_pct"))
    )


def memcpy_totals(memcpys: pl.DataFrame, memsets: pl.DataFrame) -> pl.DataFrame:
    """Bytes, count, time and bandwidth per copy kind (memsets as ``memset``).

    Output: ``kind``, ``count``, ``total_bytes``, ``total_ms``, ``bandwidth_gbps`` (10⁹ B/s).
    """
    ops = pl.concat([
        memcpys.select(pl.col("copy_kind").alias("kind"), "bytes", "duration_ns"),
        memsets.select(pl.lit("memset").alias("kind"), "bytes", "duration_ns"),
    ])
    return (
        ops.group_by("kind")
        .agg(pl.len().cast(pl.Int64).alias("count"), pl.col("bytes").sum().alias("_b"), pl.col("duration_ns").sum().alias("_t"))
        .sort(["_b", "kind"], descending=[True, False])  # ties in a fixed order
        .select("kind", "count", pl.col("_b").alias("total_bytes"), (pl.col("_t") / 1e6).alias("total_ms"),
                pl.when(pl.col("_t") > 0).then(pl.col("_b") / pl.col("_t")).alias("bandwidth_gbps"))
    )


def top_nvtx(nvtx: pl.DataFrame, top: int = 10) -> pl.DataFrame:
    """NVTX range names by total (CPU-side) time; open ranges are left out.

    Output: ``range`` (``domain:name``), ``count``, ``total_ms``, ``mean_us``.
    """
    ranges = nvtx.filter(pl.col("event_type_id").is_in([59, 60, 70, 71]) & pl.col("end_ns").is_not_null())
    name = qualified_name()
    return (
        ranges.group_by(name.alias("range"))
        .agg(pl.len().cast(pl.Int64).alias("count"), pl.col("duration_ns").sum().alias("_t"), pl.col("duration_ns").mean().alias("_m"))
        .sort(["_t", "range"], descending=[True, False])
        .head(top)
        .select("range", "count", (pl.col("_t") / 1e6).alias("total_ms"), (pl.col("_m") / 1e3).alias("mean_us"))
    )


def trace_summary(trace: NsysTrace, *, top: int = 10) -> TraceSummary:
    """Collect what ``tracekit summary`` shows for ``trace``."""
    meta = trace.meta
    s = TraceSummary(path=trace.path)
    s.info["nsys version"] = meta.version + ("" if meta.product_version else " (inferred)")
    if meta.schema_version:
        s.info["export schema"] = meta.schema_version
    for proc in meta.processes[:4]:
        s.info.setdefault("command", " ".join(proc.command))
    s.info["time window"] = f"{_ms(meta.duration_ns)} ({meta.start_ns} → {meta.end_ns} ns)"
    gpus = trace.gpus
    # only the columns shown are read (not kept on the trace): the whole kernel table of a
    # 30 M-kernel export is ~16 GB, these four columns a fraction of it
    k = trace.table("kernels", ["device_id", "name", "short_name", "start_ns", "duration_ns"])
    used = sorted(k["device_id"].drop_nulls().unique().to_list())
    if not gpus.is_empty():
        names = ", ".join(f"{r['device_id']}: {r['name']}" for r in gpus.iter_rows(named=True))
        s.info["GPUs"] = names
    s.info["GPUs with kernels"] = ", ".join(map(str, used)) or "none"
    launches = k.height
    if k.height:  # ends of INT64_MAX (damage) would make the GPU time 9.2e15 ms; the loader warned
        ends = k.select("start_ns", (pl.col("start_ns") + pl.col("duration_ns")).alias("end_ns"))
        k = k.filter(~ends.select(implausible_end()).to_series())
    k = k.drop("start_ns")
    s.info["kernels"] = f"{launches:,} launches, {_ms(int(k['duration_ns'].sum()) if k.height else 0)} GPU time"
    api_calls = trace.cuda_api.height if trace.is_loaded("cuda_api") else trace.table("cuda_api", ["correlation_id"]).height
    s.info["CUDA API calls"] = f"{api_calls:,}"
    s.info["NVTX events"] = f"{trace.nvtx.height:,}"
    s.tables["top kernels"] = top_kernels(k, top)
    s.tables["memory operations"] = memcpy_totals(trace.memcpys, trace.memsets)
    if trace.nvtx.height:
        s.tables["top NVTX ranges"] = top_nvtx(trace.nvtx, top)
    s.notes.extend(f"missing: {m}" for m in meta.missing)
    s.notes.extend(f"partial export: {k}={v}" for k, v in meta.partial_export.items())
    return s
