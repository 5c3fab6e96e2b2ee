"""The data behind ``tracekit summary``: capture info and the few tables users look at first."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from tracekit.nsys.nvtx import qualified_name
from tracekit.nsys.readers import implausible_end, lookup_strings

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


#: A number that is a whole component of an NVTX name (``step.3``, ``decode_12``,
#: ``model.layers.7.mlp``, ``Iteration 4``): numbered siblings share the name with it as ``*``.
NUMBERED_PART = r"(^|[._:/\- ])\d+([._:/\- ]|$)"


def top_nvtx(nvtx: pl.DataFrame, top: int = 10, *, group_numbered: bool = True) -> pl.DataFrame:
    """NVTX range names by total (CPU-side) time; open ranges are left out.

    With ``group_numbered`` (the default), numbered siblings are one row: ``step.0`` …
    ``step.7`` become ``step.*`` with count 8, ``model.layers.0.mlp`` … become
    ``model.layers.*.mlp`` (a number is a component between ``.``, ``_``, ``:``, ``/``, ``-``
    or spaces: :data:`NUMBERED_PART`); a name whose pattern matches no other name is kept as is.

    Output: ``range`` (``domain:name``, or the pattern), ``names`` (distinct names in the row),
    ``count``, ``total_ms``, ``mean_us``.
    """
    ranges = nvtx.filter(pl.col("event_type_id").is_in([59, 60, 70, 71]) & pl.col("end_ns").is_not_null())
    name = qualified_name()
    per = ranges.group_by(name.alias("range")).agg(
        pl.len().cast(pl.Int64).alias("count"), pl.col("duration_ns").sum().alias("_t"))
    if group_numbered and per.height:
        # twice: a number next to another (``1.2``) shares its separator with it
        pattern = pl.col("range").str.replace_all(NUMBERED_PART, "${1}*${2}").str.replace_all(NUMBERED_PART, "${1}*${2}")
        per = per.with_columns(pattern.alias("_p")).with_columns(
            pl.when(pl.col("range").n_unique().over("_p") > 1).then(pl.col("_p")).otherwise(pl.col("range")).alias("range"))
    return (
        per.group_by("range")
        .agg(pl.len().cast(pl.Int64).alias("names"), pl.col("count").sum(), pl.col("_t").sum())
        .with_columns((pl.col("_t") / pl.col("count")).alias("_m"))
        .sort(["_t", "range"], descending=[True, False])
        .head(top)
        .select("range", "names", "count", (pl.col("_t") / 1e6).alias("total_ms"), (pl.col("_m") / 1e3).alias("mean_us"))
    )


def _kernel_figures(trace: NsysTrace, top: int) -> tuple[int, list[int], int, pl.DataFrame]:
    """Kernel launches, devices with kernels, GPU time (ns) and :func:`top_kernels`, from a
    frame of the five columns they need."""
    k = trace.table("kernels", ["device_id", "name", "short_name", "start_ns", "duration_ns"])
    used = sorted(k["device_id"].drop_nulls().unique().to_list())
    launches = k.height
    if k.height:  # ends of INT64_MAX (damage) would make the GPU time 9.2e15 ms; the loader warned
        ends = k.select("start_ns", (pl.col("start_ns") + pl.col("duration_ns")).alias("end_ns"))
        k = k.filter(~ends.select(implausible_end()).to_series())
    k = k.drop("start_ns")
    return launches, used, int(k["duration_ns"].sum()) if k.height else 0, top_kernels(k, top)


def _kernel_figures_by_id(trace: NsysTrace, top: int) -> tuple[int, list[int], int, pl.DataFrame]:
    """:func:`_kernel_figures` of a trace whose kernel table is not built, from the same
    export columns read as integers: the name ids, not a name per row.

    Kernels are grouped by a code of ``coalesce(short_name, name)`` made from the distinct
    name ids (a few hundred), so that what is held per kernel is five integers, not three
    integers and two names (s8x: 0.9 GB where it was 1.2 GB). Same rows, groups and
    aggregations as :func:`top_kernels`, so the same table."""
    # one column at a time from the column cache (when it takes the table), not five at once
    src = trace.columns_on_demand("kernels", ["device_id", "start_ns", "end_ns", "name_id", "short_name_id"])
    dev = src["device_id"]
    launches = dev.len()
    if launches == 0:
        return _kernel_figures(trace, top)
    used = sorted(dev.drop_nulls().unique().to_list())
    del dev
    # duration from the two cached time columns (alone it would be read as SQL, another scan)
    start, end = src["start_ns"], src["end_ns"]
    dur = (end - start).alias("duration_ns")
    # ends of INT64_MAX (damage) would make the GPU time 9.2e15 ms; the loader warned
    bad = pl.DataFrame([start, end]).select(implausible_end()).to_series()
    del start, end
    src.release()
    keep = ~bad if bad.any() else None
    if keep is not None:
        dur = dur.filter(keep)
    strings = trace.strings

    def column(name: str) -> pl.Series:
        values = src[name]
        return values.filter(keep) if keep is not None else values

    def texts(ids: pl.Series) -> pl.DataFrame:  # each distinct id (nulls left out) and its text
        return ids.drop_nulls().unique().to_frame("id").with_columns(lookup_strings(pl.col("id"), strings).alias("text"))

    sid, nid = column("short_name_id"), column("name_id")
    short, name = texts(sid), texts(nid)
    labels = pl.concat([short["text"], name["text"]]).drop_nulls().unique().sort()
    codes = pl.int_range(labels.len(), dtype=pl.Int64, eager=True)

    def coded(ids: pl.Series, table: pl.DataFrame) -> pl.Series:  # each row's label code (null: no text)
        code = table["text"].replace_strict(labels, codes, default=None, return_dtype=pl.Int64)
        return ids.replace_strict(table["id"], code, default=None, return_dtype=pl.Int64)

    kernel = coded(sid, short).fill_null(coded(nid, name))  # coalesce(short_name, name)
    del sid, nid
    total = dur.sum()
    per = (
        pl.DataFrame([kernel.alias("_code"), dur.alias("duration_ns")])
        .group_by("_code")
        .agg(pl.len().cast(pl.Int64).alias("calls"), pl.col("duration_ns").sum().alias("_t"),
             pl.col("duration_ns").mean().alias("_m"))
    )
    per = per.with_columns(pl.col("_code").replace_strict(codes, labels, default=None, return_dtype=pl.Utf8).alias("kernel"))
    table = (
        per.sort(["_t", "kernel"], descending=[True, False])
        .head(top)
        .select("kernel", "calls", (pl.col("_t") / 1e6).alias("total_ms"), (pl.col("_m") / 1e3).alias("mean_us"),
                (pl.col("_t") * 100.0 / total).alias("gpu_time_pct"))
    )
    return launches, used, int(total) if dur.len() else 0, table


def trace_summary(trace: NsysTrace, *, top: int = 10, nvtx_each: bool = False) -> TraceSummary:
    """Collect what ``tracekit summary`` shows for ``trace`` (``nvtx_each``: every NVTX range
    name on its own row, not numbered siblings grouped: :func:`top_nvtx`)."""
    meta = trace.meta
    s = TraceSummary(path=trace.path)
    s.info["nsys version"] = meta.version + ("" if meta.product_version else " (inferred)")
    if meta.schema_version:
        s.info["export schema"] = meta.schema_version
    for proc in meta.processes[:4]:
        s.info.setdefault("command", " ".join(proc.command))
    s.info["time window"] = f"{_ms(meta.duration_ns)} ({meta.start_ns} → {meta.end_ns} ns)"
    gpus = trace.gpus
    if trace.is_loaded("kernels"):
        launches, used, gpu_ns, top_k = _kernel_figures(trace, top)
    else:
        launches, used, gpu_ns, top_k = _kernel_figures_by_id(trace, top)
    if not gpus.is_empty():
        names = ", ".join(f"{r['device_id']}: {r['name']}" for r in gpus.iter_rows(named=True))
        s.info["GPUs"] = names
    s.info["GPUs with kernels"] = ", ".join(map(str, used)) or "none"
    s.info["kernels"] = f"{launches:,} launches, {_ms(gpu_ns)} GPU time"
    # the table is the export's rows one for one: count them, not read a column of millions
    api_calls = trace.cuda_api.height if trace.is_loaded("cuda_api") else trace.db.row_count("CUPTI_ACTIVITY_KIND_RUNTIME")
    s.info["CUDA API calls"] = f"{api_calls:,}"
    # the columns top_nvtx reads, not kept on the trace (the whole table is ~1 GB on 6.5 M events)
    nvtx = trace.table("nvtx", ["event_type_id", "end_ns", "duration_ns", "name", "domain"])
    s.info["NVTX events"] = f"{nvtx.height:,}"
    s.tables["top kernels"] = top_k
    s.tables["memory operations"] = memcpy_totals(trace.memcpys, trace.memsets)
    if nvtx.height:
        s.tables["top NVTX ranges"] = top_nvtx(nvtx, top, group_numbered=not nvtx_each)
    del nvtx
    s.notes.extend(f"missing: {m}" for m in meta.missing)
    s.notes.extend(f"partial export: {k}={v}" for k, v in meta.partial_export.items())
    return s
