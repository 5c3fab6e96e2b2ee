"""The report's data of an export too big to hold, read a column at a time (issue 14 §1).

Past :data:`MIN_KERNELS` kernels, :func:`tracekit.report.html.build_report` does not build the
kernel, API or GPU-metric tables. The whole-trace figures and tables are computed from a few
integer columns of the column cache, each read whole (8 bytes a kernel) or in windows of rows,
and merged: the kernel facts, the top kernels (grouped by a code of the short name made from
the distinct name ids; median over all instances), the duration histogram, the busy/idle
breakdown per GPU (activity segments of row windows in time order, with operations that
cross a window's edge carried into the next) and the GPU metrics (two streaming passes over
the samples). Each equals what the whole tables give (``tests/test_report_bounded.py``).

The sections that draw single operations (the timeline) or attribute each one to its NVTX
ranges (the NVTX tree and layer matrix) use one window of the trace: the rows the diagnosis
analysed (its sampled steps, else its steady window), at most :data:`MAX_DETAIL_KERNELS`
kernels, and say so in a note.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from tracekit.nsys import schema as S
from tracekit.nsys.readers import KERNEL_SOURCE, lookup_strings
from tracekit.viz import prep

__all__ = ["MAX_DETAIL_KERNELS", "MIN_KERNELS", "KernelColumns", "detail_window", "min_kernels", "use_bounded"]

#: A single export whose kernel table has at least this many rows (and is not loaded) is
#: reported from columns (:class:`KernelColumns`); ``TRACEKIT_REPORT_BOUNDED_MIN_KERNELS``
#: overrides it (0: always, for tests).
MIN_KERNELS = 2_000_000
#: Most kernels of the window the timeline and the NVTX breakdown draw on a big export.
MAX_DETAIL_KERNELS = 500_000
#: Rows per window of the busy/idle sweep and the histogram.
CHUNK_ROWS = 2_000_000

_OP_COLUMNS = ("pid", "global_pid", "device_id", "context_id", "stream_id", "correlation_id", "start_ns", "end_ns",
               "duration_ns")


def min_kernels() -> int:
    """:data:`MIN_KERNELS`, or ``TRACEKIT_REPORT_BOUNDED_MIN_KERNELS`` when set (kernels)."""
    from tracekit.env import count_from_env

    return count_from_env("TRACEKIT_REPORT_BOUNDED_MIN_KERNELS", MIN_KERNELS)


def use_bounded(trace: Any, threshold: int | None = None) -> bool:
    """Whether ``trace`` is one export (not a trace set) whose kernel table has at least
    ``threshold`` rows (default :func:`min_kernels`) and is not loaded."""
    db = getattr(trace, "db", None)
    if db is None or not hasattr(trace, "columns_on_demand") or trace.is_loaded("kernels"):
        return False
    if not db.has_table(KERNEL_SOURCE):
        return False
    limit = min_kernels() if threshold is None else threshold
    return bool(db.row_estimate(KERNEL_SOURCE) >= limit)


def _texts(ids: pl.Series, strings: pl.DataFrame) -> pl.DataFrame:
    """``id`` (the distinct values of ``ids``, null included) and its ``text``."""
    return ids.unique().to_frame("id").with_columns(lookup_strings(pl.col("id"), strings).alias("text"))


@dataclass
class KernelFacts:
    """Whole-trace kernel figures: ``launches``, ``distinct`` short names (null counted as
    one, as ``n_unique``), ``gpu_time_ns`` (sum of durations, ns), ``devices`` used and the
    kernels' ``first_start_ns`` / ``last_end_ns`` (ns; ``None`` when there are none)."""

    launches: int
    distinct: int
    gpu_time_ns: int
    devices: list[int]
    first_start_ns: int | None
    last_end_ns: int | None


class KernelColumns:
    """The kernel table of one export, a column at a time (:meth:`NsysTrace.columns_on_demand`):
    the report's whole-trace kernel figures without the table (see the module doc)."""

    def __init__(self, trace: Any) -> None:
        self._trace = trace
        self._src = trace.columns_on_demand(
            "kernels", ["device_id", "stream_id", "start_ns", "end_ns", "duration_ns", "name_id", "short_name_id",
                        *_OP_COLUMNS, "name", "short_name"])

    def column(self, name: str) -> pl.Series:
        """Kernel column ``name`` whole (not kept)."""
        values = self._src[name]
        self._src.release()
        return values  # type: ignore[no-any-return]

    # -- labels -------------------------------------------------------------------------------
    def _codes(self, id_column: str, *, family_of: str | None = None) -> tuple[pl.Series, pl.DataFrame]:
        """Each kernel's code of its text in ``id_column`` (UInt32; equal texts, equal codes;
        null text → its own code) and the table ``code``, ``text`` (``family``: of the text
        as :func:`tracekit.taxonomy.classify` names it, with ``family_of`` the column name)."""
        from tracekit.taxonomy import classify

        ids = self.column(id_column)
        texts = _texts(ids, self._trace.strings)
        labels = texts.select(pl.col("text").unique()).with_row_index("code")
        table = labels.select(pl.col("code").cast(pl.UInt32), "text")
        if family_of is not None:
            table = classify(table.rename({"text": family_of}), name_column=family_of).rename({family_of: "text"})
        by_id = texts.join(table.select("code", "text"), on="text", how="left", nulls_equal=True)
        codes = ids.replace_strict(by_id["id"], by_id["code"], default=None, return_dtype=pl.UInt32)
        if ids.null_count():  # replace_strict leaves nulls null: give them the null text's code
            null_code = by_id.filter(pl.col("id").is_null())["code"]
            codes = codes.fill_null(null_code.item() if null_code.len() else None)
        return codes, table

    # -- figures ------------------------------------------------------------------------------
    def facts(self) -> KernelFacts:
        """:class:`KernelFacts` of every kernel."""
        dev = self.column("device_id")
        launches, devices = dev.len(), sorted(dev.drop_nulls().unique().to_list())
        del dev
        short = self.column("short_name_id")
        distinct = _texts(short, self._trace.strings)["text"].n_unique()
        del short
        start = self.column("start_ns")
        first = start.min()
        del start
        end = self.column("end_ns")
        last = end.max()
        del end
        dur = self.column("duration_ns")
        total = int(dur.sum() or 0)
        return KernelFacts(launches, distinct, total, devices, None if first is None else int(first),  # type: ignore[arg-type]
                           None if last is None else int(last))  # type: ignore[arg-type]

    def top_kernels(self, n: int, *, family: str | None = None) -> pl.DataFrame:
        """:func:`tracekit.viz.prep.top_kernels` of the kernels by ``short_name`` (of those of
        ``family`` only, when given: the communication table), from the short-name ids and
        the durations: same groups, aggregations and order."""
        codes, table = self._codes("short_name_id", family_of="short_name")
        dur = self.column("duration_ns")
        frame = pl.DataFrame([codes.alias("_code"), dur])
        del codes, dur
        if family is not None:
            keep = table.filter(pl.col("family") == family)["code"]
            frame = frame.filter(pl.col("_code").is_in(keep.implode()))
        total = frame["duration_ns"].sum() or 1
        per = frame.group_by("_code").agg(
            pl.len().cast(pl.Int64).alias("instances"),
            pl.col("duration_ns").sum().alias("total_ns"),
            pl.col("duration_ns").mean().round(0).cast(pl.Int64).alias("mean_ns"),
            pl.col("duration_ns").median().round(0).cast(pl.Int64).alias("median_ns"),
            pl.col("duration_ns").max().alias("max_ns"),
        )
        del frame
        return (
            per.join(table, left_on="_code", right_on="code", how="left")
            .select(pl.col("text").alias("name"), "family", "instances", "total_ns", "mean_ns", "median_ns", "max_ns")
            .with_columns((pl.col("total_ns") / total).alias("share"))
            .sort(["total_ns", "name"], descending=[True, False])
            .head(n)
        )

    def duration_histogram(self, *, bins_per_decade: int = 5) -> pl.DataFrame:
        """:func:`tracekit.viz.prep.duration_histogram` of every kernel (families of the
        demangled names), counted in windows of :data:`CHUNK_ROWS` rows and summed."""
        codes, table = self._codes("name_id", family_of="name")
        fam = table.select("code", pl.col("family").cast(pl.Utf8).fill_null("(none)").alias("group"))
        dur = self.column("duration_ns")
        b = pl.lit(bins_per_decade, dtype=pl.Float64)
        idx = (pl.col("duration_ns").cast(pl.Float64).log10() * b).floor()
        parts = []
        for lo in range(0, dur.len(), CHUNK_ROWS):
            chunk = pl.DataFrame([codes.slice(lo, CHUNK_ROWS).alias("code"), dur.slice(lo, CHUNK_ROWS)])
            parts.append(
                chunk.filter(pl.col("duration_ns") > 0)
                .join(fam, on="code", how="left")
                .with_columns(idx.alias("_bin"))
                .group_by("group", "_bin")
                .agg(pl.len().cast(pl.Int64).alias("count"), pl.col("duration_ns").sum().alias("total_ns"))
            )
        del codes, dur
        merged = pl.concat(parts) if parts else pl.DataFrame(
            schema={"group": pl.Utf8, "_bin": pl.Float64, "count": pl.Int64, "total_ns": pl.Int64})
        return (
            merged.group_by("group", "_bin")
            .agg(pl.col("count").sum(), pl.col("total_ns").sum())
            .with_columns(
                (10 ** (pl.col("_bin") / b)).alias("bin_start_ns"),
                (10 ** ((pl.col("_bin") + 1) / b)).alias("bin_end_ns"),
            )
            .sort("group", "_bin")
            .select("group", "bin_start_ns", "bin_end_ns", "count", "total_ns")
        )

    def breakdown(self, memcpys: pl.DataFrame, memsets: pl.DataFrame, graphs: pl.DataFrame | None) -> pl.DataFrame:
        """:func:`tracekit.viz.prep.temporal_breakdown` per GPU of every kernel (all columns
        read here) and of ``memcpys``, ``memsets`` and ``graphs`` (launches traced whole).

        The states of :func:`tracekit.analysis.comm.activity_segments` are measured from the
        lengths of five interval unions per GPU (compute C, communication M, copies X):
        overlap = |C| + |M| − |C∪M|, compute only = |C∪M| − |M|, communication only =
        |C∪M| − |C|, memcpy = |C∪M∪X| − |C∪M|, idle = window − |C∪M∪X|. Each union's length is
        summed over the operations in start order, each adding what it covers past the
        latest end before it, in windows of :data:`CHUNK_ROWS` rows that carry those ends."""
        from tracekit.analysis.comm import categorize_ops, comm_kind_expr

        others = categorize_ops(S.empty("kernels", [*_OP_COLUMNS, "name"]), memcpys, memsets, graphs)
        kinds = {"compute": 0, "communication": 1, "memcpy": 2}
        other = others.select("device_id", "start_ns", "end_ns",
                              pl.col("category").replace_strict(kinds, return_dtype=pl.UInt8).alias("_k"))
        # a kernel is communication when its demangled name is (classify_communication)
        ids = self.column("name_id")
        texts = _texts(ids, self._trace.strings).filter(pl.col("text").is_not_null())
        comm_ids = texts.filter(comm_kind_expr("text").is_not_null())["id"]
        kind = ids.is_in(comm_ids.implode()).fill_null(False).cast(pl.UInt8).alias("_k")
        del ids
        kernels = pl.DataFrame([self.column("device_id"), kind])
        del kind
        kernels = kernels.with_columns(self.column("start_ns")).with_columns(self.column("end_ns"))
        kernels = kernels.select("device_id", "start_ns", "end_ns", "_k")
        lows = [v for v in (kernels["start_ns"].min(), other["start_ns"].min()) if v is not None]
        highs = [v for v in (kernels["end_ns"].max(), other["end_ns"].max()) if v is not None]
        devices = pl.concat([kernels["device_id"].unique(), other["device_id"].unique()]).unique().sort()
        if not lows or not highs:
            return pl.DataFrame(schema={"group": pl.Utf8, "device_id": pl.Int64, "category": pl.Utf8, "time_ns": pl.Int64,
                                        "fraction": pl.Float64, "window_ns": pl.Int64})
        w0 = int(min(lows))  # type: ignore[arg-type]
        w1 = max(int(max(highs)), w0 + 1)  # type: ignore[arg-type]
        rows = []
        for d in devices.to_list():
            mine = pl.concat([kernels.filter(pl.col("device_id").eq_missing(d)), other.filter(pl.col("device_id").eq_missing(d))],
                             how="vertical_relaxed").drop("device_id")
            length = _union_lengths(mine)
            del mine
            both, every = length["cm"], length["cmx"]
            for category, t in (("compute", both - length["m"]), ("communication", both - length["c"]),
                                ("overlap", length["c"] + length["m"] - both), ("memcpy", every - both),
                                ("idle", (w1 - w0) - every)):
                rows.append({"device_id": d, "category": category, "time_ns": t})
        del kernels
        per = pl.DataFrame(rows, schema={"device_id": pl.Int64, "category": pl.Utf8, "time_ns": pl.Int64})
        order = {c: i for i, c in enumerate(prep.BREAKDOWN_CATEGORIES)}
        return (
            per.with_columns(
                pl.concat_str(pl.lit("GPU "), pl.col("device_id").cast(pl.Utf8)).alias("group"),
                pl.lit(w1 - w0, dtype=pl.Int64).alias("window_ns"),
                pl.col("category").replace_strict(order, return_dtype=pl.Int64).alias("_o"),
            )
            .with_columns((pl.col("time_ns") / pl.col("window_ns")).alias("fraction"))
            .sort("device_id", "_o")
            .select("group", "device_id", "category", "time_ns", "fraction", "window_ns")
        )

    # -- one window ---------------------------------------------------------------------------
    def kernels_in(self, window: tuple[int, int], columns: Sequence[str]) -> pl.DataFrame:
        """``columns`` of the kernels that start in ``window`` (``start ≤ start_ns < end``, ns),
        in table order."""
        start = self.column("start_ns")
        rows = (start.is_between(window[0], window[1], closed="left")).arg_true()
        del start
        if rows.len() == 0:
            return S.empty("kernels", list(columns))
        return pl.DataFrame(self._src.gather_columns(list(columns), rows))

    def capped(self, window: tuple[int, int], most: int) -> tuple[int, int]:
        """``window`` (ns), its end moved earlier so that at most ``most`` kernels start in it."""
        start = self.column("start_ns")
        inside = start.filter(start.is_between(window[0], window[1], closed="left"))
        del start
        if inside.len() <= most:
            return window
        return window[0], int(inside.sort()[most])  # type: ignore[arg-type]


#: The interval unions :meth:`KernelColumns.breakdown` measures: which categories (0 compute,
#: 1 communication, 2 memcpy) each holds.
_UNIONS = {"c": (0,), "m": (1,), "cm": (0, 1), "cmx": (0, 1, 2)}
_BEFORE_ALL = -(1 << 63)


def _union_lengths(ops: pl.DataFrame) -> dict[str, int]:
    """Length (ns) of the union of the ``[start_ns, end_ns)`` intervals of each of
    :data:`_UNIONS` (``_k``: the category), as :func:`tracekit.analysis._frames.interval_union`
    merges them (rows without a time left out; an interval that ends before it starts covers
    nothing). Rows are taken in start order, :data:`CHUNK_ROWS` at a time."""
    ops = ops.drop_nulls(["start_ns", "end_ns"])
    start = ops["start_ns"]
    order = None if start.is_sorted() else start.arg_sort()
    del start
    latest = dict.fromkeys(_UNIONS, _BEFORE_ALL)  # the latest end before the window, per union
    total = dict.fromkeys(_UNIONS, 0)
    for lo in range(0, ops.height, CHUNK_ROWS):
        chunk = ops.slice(lo, CHUNK_ROWS) if order is None else ops[order.slice(lo, CHUNK_ROWS)]
        exprs = []
        for name, members in _UNIONS.items():
            member = pl.col("_k").is_in(list(members))
            end = pl.when(member).then(pl.col("end_ns")).otherwise(pl.lit(_BEFORE_ALL, pl.Int64))
            before = pl.max_horizontal(end.cum_max().shift(1).fill_null(_BEFORE_ALL), pl.lit(latest[name], pl.Int64))
            covers = (pl.col("end_ns") - pl.max_horizontal(pl.col("start_ns"), before)).clip(lower_bound=0)
            exprs += [pl.when(member).then(covers).otherwise(0).sum().alias(f"l_{name}"), end.max().alias(f"e_{name}")]
        got = chunk.select(exprs).row(0, named=True)
        for name in _UNIONS:
            total[name] += int(got[f"l_{name}"])
            latest[name] = max(latest[name], int(got[f"e_{name}"]))
    return total


def detail_window(diagnosis_window: Any, facts: KernelFacts) -> tuple[tuple[int, int], str] | None:
    """The window (ns) the timeline and NVTX sections draw, and what it is: the diagnosis's
    sampled steps, else its steady window, else ``None``."""
    w = diagnosis_window
    if w is None:
        return None
    if getattr(w, "sampled", False):
        return (int(w.sample_start_ns), int(w.sample_end_ns)), "the steps the diagnosis analysed"
    if w.end_ns > w.start_ns:
        return (int(w.start_ns), int(w.end_ns)), f"the diagnosis's window ({w.method})"
    if facts.first_start_ns is None or facts.last_end_ns is None:
        return None
    return (facts.first_start_ns, facts.last_end_ns + 1), "the whole trace"


def gpu_metric_figures(trace: Any, metrics: Sequence[str] = prep.DEFAULT_GPU_METRICS,
                       max_points: int = 600) -> tuple[int, pl.DataFrame, pl.DataFrame]:
    """Samples in ``trace.gpu_metrics`` (count), :func:`tracekit.viz.prep.gpu_metrics_series`
    of them and the report's summary (``device_id``, ``metric_label``, ``mean_pct``,
    ``max_pct``), from two streaming passes of ``trace.scan("gpu_metrics")``: one window of
    samples at a time. The means are sums over counts of each bin (equal to the whole-table
    means but for the last bits of a float)."""
    from tracekit.viz.charts import within_row_budget

    wanted = pl.col("metric").is_in(list(metrics)) & pl.col("metric_label").str.contains("%", literal=True)
    lazy = trace.scan("gpu_metrics")
    per = lazy.group_by("metric", "metric_label").agg(
        pl.len().alias("n"), pl.col("timestamp_ns").min().alias("lo"), pl.col("timestamp_ns").max().alias("hi"),
    ).collect(engine="streaming")
    total = int(per["n"].sum() or 0)
    shown = per.filter(wanted)
    empty = pl.DataFrame(schema={"device_id": pl.Int64, "metric": pl.Utf8, "label": pl.Utf8, "time_ns": pl.Int64,
                                 "value_pct": pl.Float64, "max_pct": pl.Float64})
    if shown.is_empty() or shown["lo"].min() is None:
        return total, empty, pl.DataFrame(schema={"device_id": pl.Int64, "metric_label": pl.Utf8, "mean_pct": pl.Float64,
                                                  "max_pct": pl.Float64})
    win = (int(shown["lo"].min()), int(shown["hi"].max()) + 1)  # type: ignore[arg-type]
    bins: list[pl.DataFrame] = []

    def binned(points: int) -> pl.DataFrame:
        width = max(-(-(win[1] - win[0]) // max(points, 1)), 1)
        frame = (
            lazy.filter(wanted)
            .with_columns((((pl.col("timestamp_ns") - win[0]) // width) * width + win[0]).alias("time_ns"),
                          pl.col("value").cast(pl.Float64))
            .group_by("device_id", "metric", "metric_label", "time_ns")
            .agg(pl.col("value").sum().alias("_s"), pl.len().alias("_n"), pl.col("value").max().alias("max_pct"))
            .collect(engine="streaming")
        )
        bins[:] = [frame]  # every bin size holds every sample: the summary takes the last
        return (
            frame.with_columns(pl.col("metric_label").str.replace(r"\s*\[.*\]$", "").alias("label"))
            .group_by("device_id", "metric", "label", "time_ns")
            .agg((pl.col("_s").sum() / pl.col("_n").sum()).alias("value_pct"), pl.col("max_pct").max())
            .sort("device_id", "metric", "time_ns")
            .select("device_id", "metric", "label", "time_ns", "value_pct", "max_pct")
        )

    series = within_row_budget(binned, max_points)
    summary = (
        bins[0].group_by("device_id", "metric_label")
        .agg((pl.col("_s").sum() / pl.col("_n").sum()).alias("mean_pct"), pl.col("max_pct").max().alias("max_pct"))
        .sort("device_id", "metric_label")
    )
    return total, series, summary
