"""``GPU_METRICS`` (``--gpu-metrics-devices``) → a long table with stable metric names.

nsys renames its metrics between versions ("SM Active" became "SMs Active [Throughput %]");
:func:`stable_metric_name` maps every label seen to one snake_case name, keeping the
original in ``metric_label``. The GPU of a sample is the low byte of ``typeId``
(observed: ``0x1000100000000`` = GPU 0, ``0x1000100000001`` = GPU 1), cross-checked with the
``GPU n`` text of ``TARGET_INFO_GPU_METRICS.typeName`` when it has one.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

import polars as pl

from tracekit.nsys import schema as S
from tracekit.nsys.database import ExportSource
from tracekit.nsys.readers import Col, select

#: Labels of older nsys versions → the base name newer versions use.
_ALIASES = {
    "sm active": "sms active",
    "sm issue": "sm issue",
    "dram read throughput": "dram read bandwidth",
    "dram write throughput": "dram write bandwidth",
    "tensor active": "tensor active",
    "gr active": "gr active",
    "pcie rx throughput": "pcie rx throughput",
    "pcie tx throughput": "pcie tx throughput",
}


#: Units that are a metric's primary unit: dropped from the stable name, so that the
#: unit-less 2023.x label and the bracketed 2025.x one map to the same name.
_PRIMARY_UNITS = {"throughput %", "%", "mhz", "hz", ""}


def stable_metric_name(label: str) -> str:
    """Stable snake_case name of an nsys GPU-metric label.

    The primary unit in brackets is dropped (``"Tensor Active [Throughput %]"`` →
    ``tensor_active``, ``"GPC Clock Frequency [MHz]"`` → ``gpc_clock_frequency``), old
    spellings are mapped to new ones (``"SM Active"`` → ``sms_active``,
    ``"DRAM Read Throughput"`` → ``dram_read_bandwidth``). Other units stay as a suffix,
    because nsys 2025.x reports some metrics in several units at once:
    ``"Compute Warps in Flight [Throughput %]"`` → ``compute_warps_in_flight``,
    ``"… [Avg]"`` → ``compute_warps_in_flight_avg``, ``"… [Avg Warps per Cycle]"`` →
    ``compute_warps_in_flight_avg_warps_per_cycle``.
    """
    units = re.findall(r"\[([^\]]*)\]", label)
    base = re.sub(r"\s*\[[^\]]*\]\s*", " ", label).strip().lower()
    base = _ALIASES.get(base, base)
    extra = [u for u in (u.strip().lower() for u in units) if u not in _PRIMARY_UNITS]
    name = " ".join([base, *extra])
    return re.sub(r"[^0-9a-z]+", "_", name).strip("_")


def metric_descriptions(db: ExportSource) -> pl.DataFrame:
    """``TARGET_INFO_GPU_METRICS`` with the device id and stable name of each metric."""
    info = select(
        db,
        "TARGET_INFO_GPU_METRICS",
        [
            Col("type_id", "typeId"),
            Col("type_name", "typeName", pl.Utf8),
            Col("metric_id", "metricId"),
            Col("metric_label", "metricName", pl.Utf8),
        ],
    ).unique(subset=["type_id", "metric_id"], keep="first", maintain_order=True)
    from_name = pl.col("type_name").str.extract(r"GPU\s*(\d+)", 1).cast(pl.Int64, strict=False)
    return info.with_columns(
        pl.coalesce(from_name, pl.col("type_id") % 256).alias("device_id"),
        pl.col("metric_label").map_elements(stable_metric_name, return_dtype=pl.Utf8).alias("metric"),
    )


#: Raw samples per window when ``gpu_metrics`` is built or scanned in pieces.
WINDOW_ROWS = 1_000_000

_SAMPLE_COLS = [Col("timestamp_ns", "timestamp"), Col("type_id", "typeId"), Col("metric_id", "metricId"), Col("value", "value")]
_SAMPLE_SCHEMA = {c.target: c.dtype for c in _SAMPLE_COLS}


def _labelled(samples: pl.DataFrame, info: pl.DataFrame) -> pl.DataFrame:
    """Raw samples (``timestamp_ns, type_id, metric_id, value``) → ``gpu_metrics`` rows."""
    frame = samples.join(info, on=["type_id", "metric_id"], how="left", maintain_order="left")
    frame = frame.with_columns(
        pl.coalesce(pl.col("device_id"), pl.col("type_id") % 256).alias("device_id"),
        pl.coalesce(pl.col("metric"), pl.format("metric_{}", pl.col("metric_id"))).alias("metric"),
    )
    return S.conform(frame, "gpu_metrics")


def gpu_metrics(db: ExportSource) -> pl.DataFrame:
    """Samples of every GPU metric: ``device_id, timestamp_ns, metric, metric_label, value``.

    Values are nsys's raw integers (percent for throughput metrics). Timestamps can be
    negative (samples taken before the analysis start).

    The raw columns are read once (through the column cache for a large table); the rows are
    then labelled :data:`WINDOW_ROWS` at a time and the pieces kept as chunks of one frame, so
    the join's intermediate columns exist for one window at a time, not for the whole table.
    """
    if not db.has_table("GPU_METRICS"):
        return S.empty("gpu_metrics")
    samples = select(db, "GPU_METRICS", _SAMPLE_COLS)
    info = metric_descriptions(db).select("type_id", "metric_id", "device_id", "metric", "metric_label")
    if samples.height <= WINDOW_ROWS:
        return _labelled(samples, info)
    pieces = [_labelled(samples.slice(o, WINDOW_ROWS), info) for o in range(0, samples.height, WINDOW_ROWS)]
    del samples
    return pl.concat(pieces, rechunk=False)


def gpu_metric_windows(
    db: ExportSource, keep: pl.Expr | None = None, *, window_rows: int | None = None
) -> Iterator[pl.DataFrame]:
    """``gpu_metrics`` in windows of at most ``window_rows`` (default :data:`WINDOW_ROWS`) raw
    samples, in the export's row order: each window is read (rowid ranges of a SQLite export,
    row slices of a parquetdir/arrowdir folder), labelled and handed on before the next is read.

    ``keep`` is a filter over ``device_id``, ``metric`` and ``metric_label`` (for example
    ``pl.col("metric") == "sms_active"``): the (typeId, metricId) pairs it rejects are left out
    by the read itself. The caller still applies its full filter to what comes back.
    """
    if not db.has_table("GPU_METRICS"):
        return
    window = window_rows or WINDOW_ROWS
    info = metric_descriptions(db).select("type_id", "metric_id", "device_id", "metric", "metric_label")
    pairs = ""
    if keep is not None and set(keep.meta.root_names()) <= {"device_id", "metric", "metric_label"}:
        # each known pair's labels exactly as its samples get them (_labelled), so the filter
        # gives the same answer on the pair as on each of its samples
        labels = info.with_columns(pl.coalesce(pl.col("metric"), pl.format("metric_{}", pl.col("metric_id"))).alias("metric"))
        rejected = labels.filter(~keep.fill_null(False)).select("type_id", "metric_id")
        by_type = rejected.group_by("type_id", maintain_order=True).agg("metric_id")
        pairs = " AND ".join(  # one IN list per GPU: SQLite tests it with a lookup, not 30 comparisons
            f"NOT (typeId = {int(t)} AND metricId IN ({', '.join(str(int(m)) for m in ms)}))"
            for t, ms in by_type.iter_rows()
        )
    exprs = ", ".join(f'"{c.source}" AS "{c.target}"' for c in _SAMPLE_COLS)
    if db.is_rowid_table("GPU_METRICS"):
        lo = int(db.scalar("SELECT min(rowid) FROM GPU_METRICS") or 0)
        hi = int(db.scalar("SELECT max(rowid) FROM GPU_METRICS") or -1)
        for a in range(lo - 1, hi, window):
            cond = f"rowid > {a} AND rowid <= {a + window}" + (f" AND {pairs}" if pairs else "")
            yield _labelled(db.query(f"SELECT {exprs} FROM GPU_METRICS WHERE {cond}", _SAMPLE_SCHEMA), info)
        return
    rows = db.row_count("GPU_METRICS")
    for offset in range(0, rows, window):
        # the slice first, then the pair filter: windows of raw rows, as for a SQLite export
        sql = f"SELECT {exprs} FROM (SELECT * FROM GPU_METRICS LIMIT {window} OFFSET {offset})"
        sql += f" WHERE {pairs}" if pairs else ""
        yield _labelled(db.query(sql, _SAMPLE_SCHEMA), info)


def gpu_metric_samples(
    db: ExportSource,
    metrics: Sequence[str],
    *,
    start_ns: int | None = None,
    end_ns: int | None = None,
) -> pl.DataFrame:
    """Samples of some metrics (stable names) between two times, read with a ``WHERE`` so that
    a long capture's other samples are never loaded: the columns of :func:`gpu_metrics`.

    ``start_ns``/``end_ns`` bound ``timestamp`` (ns, inclusive; one sample period after
    ``end_ns`` is included by the caller when it needs the interval that covers the end).
    With both bounds the rows are first narrowed to a rowid range found by bisection on
    ``timestamp`` (nsys writes samples in time order; the range is widened by
    ``_ROWID_MARGIN`` rows on each side for local disorder), so a short window of a long
    capture reads a few thousand rows through the rowid index, not a scan of the table.
    """
    if not db.has_table("GPU_METRICS"):
        return S.empty("gpu_metrics")
    info = metric_descriptions(db).filter(pl.col("metric").is_in(list(metrics)))
    if info.height == 0:
        return S.empty("gpu_metrics")
    pairs = " OR ".join(
        f"(typeId = {int(t)} AND metricId = {int(m)})" for t, m in info.select("type_id", "metric_id").iter_rows()
    )
    where = f"({pairs})"
    if start_ns is not None and end_ns is not None and db.is_rowid_table("GPU_METRICS"):
        lo, hi = _rowid_range(db, int(start_ns), int(end_ns))
        where += f" AND rowid BETWEEN {lo} AND {hi}"
    if start_ns is not None:
        where += f" AND timestamp >= {int(start_ns)}"
    if end_ns is not None:
        where += f" AND timestamp <= {int(end_ns)}"
    samples = select(
        db,
        "GPU_METRICS",
        [Col("timestamp_ns", "timestamp"), Col("type_id", "typeId"), Col("metric_id", "metricId"), Col("value", "value")],
        where,
    )
    frame = samples.join(info.select("type_id", "metric_id", "device_id", "metric", "metric_label"),
                         on=["type_id", "metric_id"], how="left", maintain_order="left")
    return S.conform(frame, "gpu_metrics")


#: Rows added on each side of the bisected rowid range (several GPUs' samples interleave).
_ROWID_MARGIN = 100_000


def _rowid_range(db: ExportSource, start_ns: int, end_ns: int) -> tuple[int, int]:
    lo_row = int(db.scalar("SELECT min(rowid) FROM GPU_METRICS") or 0)
    hi_row = int(db.scalar("SELECT max(rowid) FROM GPU_METRICS") or 0)

    def first_at_or_after(t: int) -> int:
        a, b = lo_row, hi_row + 1
        while a < b:
            mid = (a + b) // 2
            ts = db.scalar(f"SELECT timestamp FROM GPU_METRICS WHERE rowid >= {mid} ORDER BY rowid LIMIT 1")
            if ts is None or int(ts) >= t:
                b = mid
            else:
                a = mid + 1
        return a

    return max(first_at_or_after(start_ns) - _ROWID_MARGIN, lo_row), min(first_at_or_after(end_ns + 1) + _ROWID_MARGIN, hi_row)
