"""The GPU operations of an export too big to hold, read a column at a time (issue 14 §1).

``diagnose`` needs few of a big trace's operations: those launched in the sampled steps, those
around the sampled window, and a count. :class:`OpsByColumn` answers ``ops.filter(expr)``
(``ops`` being :func:`~tracekit.analysis._frames.gpu_ops` of the whole kernel, memcpy,
memset and graph-launch tables) without building ``ops``: the kernel columns the predicate reads are read from
the column cache, the matching rows found, and only those rows of the other columns gathered
(names looked up for them only). The rows, their order and their values are those of
``ops.filter(expr)``; ``tests/test_diagnose_by_column.py`` checks it on real exports.

Held at once: the predicate's columns of the kernel table (8 bytes per kernel each) and the
memcpy and memset tables (small). On 30 M kernels that is 0.5 GB where the 11-column kernel
table was 4 GB.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

import polars as pl

from tracekit.analysis._frames import gpu_ops
from tracekit.nsys import schema as S
from tracekit.nsys.database import ensure_memory
from tracekit.nsys.readers import END_SLACK_NS, KERNEL_SOURCE, lookup_strings

__all__ = ["KERNEL_COLUMNS", "MIN_KERNELS", "OpsByColumn", "by_column"]

#: A single export whose kernel table has at least this many rows (and is not loaded, and is
#: served by the column cache: from :data:`~tracekit.nsys.database.CACHE_MIN_ROWS` rows) is
#: diagnosed from :class:`OpsByColumn` instead of whole tables. Measured (warm ``summary``,
#: benchmarks/README.md "Issue 28, eleventh session"): lighter and no slower from the cache's
#: threshold on — 300 k kernels 334–336 MiB instead of 361–370, 1 M kernels 514 MiB instead
#: of 862 (one GPU) and 681 instead of 951 (two, NCCL) — so it starts where the cache does
#: (it was 4 M until the generation phases could be found by column too).
MIN_KERNELS = 200_000

#: Memory a diagnosis read a column at a time needs at least, besides :data:`BYTES_PER_KERNEL`
#: per kernel (the NVTX range tree, the window's tables, polars' buffers): checked before it
#: starts, since polars aborts the process when an allocation fails (a 300 k-kernel export
#: with 50 MB of address space left aborted building the NVTX tree). Measured peaks above the
#: interpreter: ~110 MB at 300 k kernels, ~2.6 GB at 30 M.
BASE_BYTES = 64 << 20
BYTES_PER_KERNEL = 64

#: The kernel columns the rules read (``Context.kernels``).
KERNEL_COLUMNS = ("pid", "global_pid", "device_id", "context_id", "stream_id", "correlation_id",
                  "start_ns", "end_ns", "duration_ns", "name", "short_name")


_NONE = pl.Series([], dtype=pl.UInt32)  # no rows


def by_column(trace: Any) -> OpsByColumn | None:
    """An :class:`OpsByColumn` of ``trace`` when its kernel table is big (≥ :data:`MIN_KERNELS`
    rows), not loaded, and read from a source that gives one column at a time; else ``None``."""
    db = getattr(trace, "db", None)
    if db is None or not hasattr(trace, "columns_on_demand") or trace.is_loaded("kernels"):
        return None
    if not db.has_table(KERNEL_SOURCE) or db.row_estimate(KERNEL_SOURCE) < MIN_KERNELS or not db.caches(KERNEL_SOURCE):
        return None
    ops = OpsByColumn(trace)
    # a cache that could not be filled (a full disk) would read all 13 columns, names included,
    # as one frame: more than the 11 the whole-table path reads
    return ops if ops._src.one_at_a_time else None


class OpsByColumn:
    """``gpu_ops(kernels, memcpys, memsets)`` of a big export, answered a column at a time
    (see the module doc). ``columns``: the columns of the frames it returns."""

    def __init__(self, trace: Any) -> None:
        self._trace = trace
        self._src = trace.columns_on_demand("kernels", [*KERNEL_COLUMNS, "name_id", "short_name_id"])
        self.memcpys: pl.DataFrame = trace.memcpys
        self.memsets: pl.DataFrame = trace.memsets
        graphs = getattr(trace, "graph_trace", None)
        self.graphs: pl.DataFrame = graphs if isinstance(graphs, pl.DataFrame) else S.empty("graph_trace")

    @cached_property
    def columns(self) -> list[str]:
        return gpu_ops(self._gather(_NONE, KERNEL_COLUMNS), self.memcpys.head(0), self.memsets.head(0), self.graphs.head(0)).columns

    @cached_property
    def kernel_rows(self) -> int:
        """Rows of the kernel table."""
        n = len(self._src["start_ns"])
        self._src.release()
        return n

    def fill(self) -> None:
        """Read what every filter needs first: the kernel table's columns into the column
        cache (a cold cache is filled by scans of up to 1 GiB of columns, ~2 GB at the peak:
        best done while nothing else is held) and :attr:`end_bound`; then refuse, in one
        error line, a diagnosis that cannot fit (:data:`BASE_BYTES`, :data:`BYTES_PER_KERNEL`)."""
        rows = self.kernel_rows
        db = self._trace.db
        ensure_memory(db.path, KERNEL_SOURCE, rows, len(KERNEL_COLUMNS), BASE_BYTES + BYTES_PER_KERNEL * rows, "diagnosing")
        self.end_bound  # noqa: B018
        self._src.release()

    @cached_property
    def end_bound(self) -> int | None:
        """The bound of :func:`~tracekit.nsys.readers.implausible_end` over all operations
        (ns): operations ending after it are left out of ``ops``; ``None`` when no start is known."""
        lows, highs = [], []
        for s in (self._src["start_ns"], self.memcpys["start_ns"], self.memsets["start_ns"], self.graphs["start_ns"]):
            if s.len() and s.null_count() < s.len():
                lows.append(s.min())
                highs.append(s.max())
        self._src.release()
        if not lows:
            return None
        # polars' Int64 arithmetic, as implausible_end computes it on the stacked frame
        s = pl.col("start_ns")
        bound = s.max() + pl.max_horizontal(s.max() - s.min(), pl.lit(END_SLACK_NS))
        return pl.DataFrame({"start_ns": [min(lows), max(highs)]}, schema={"start_ns": pl.Int64}).select(bound).item()  # type: ignore[no-any-return]

    def _plausible(self) -> pl.Expr:
        return (pl.col("end_ns") <= self.end_bound).fill_null(True) if self.end_bound is not None else pl.lit(True)

    def _kernel_rows_where(self, expr: pl.Expr, *, plausible: bool) -> pl.Series | None:
        """Row numbers of the kernels where ``expr`` is true (and, with ``plausible``, whose end
        is not past :attr:`end_bound`), reading only the columns it names; ``None`` for all rows."""
        cond = expr & self._plausible() if plausible else expr
        names = list(dict.fromkeys(cond.meta.root_names()))
        if not names:  # a constant: every row or none
            return None if pl.select(cond.fill_null(False)).item() else _NONE
        frame = pl.DataFrame([self._src[c] for c in names])
        rows = frame.select(cond.fill_null(False).arg_true()).to_series()
        height = frame.height
        del frame
        self._src.release()
        return None if rows.len() == height else rows

    def _gather(self, rows: pl.Series | None, columns: tuple[str, ...] | list[str]) -> pl.DataFrame:
        """``columns`` of the kernels at ``rows`` (``None``: every row, each column as read)."""
        if rows is None:
            return pl.DataFrame([self._src[c] for c in columns])
        if rows.len() == 0:
            return S.empty("kernels", list(columns))
        return pl.DataFrame(self._src.gather_columns(list(columns), rows))

    def kernels_where(self, expr: pl.Expr, columns: tuple[str, ...] = KERNEL_COLUMNS) -> pl.DataFrame:
        """``kernels.select(columns).filter(expr)`` (every kernel, plausible end or not)."""
        return self._gather(self._kernel_rows_where(expr, plausible=False), columns)

    def where_with_kernels(self, expr: pl.Expr) -> tuple[pl.DataFrame, pl.DataFrame]:
        """``ops.filter(expr)`` (same rows, order and values; ``expr`` may name ``start_ns``,
        ``end_ns``, ``correlation_id`` … of the kernel, memcpy and memset tables) and
        :meth:`kernels_where` of ``expr``, from one read of the kernel rows."""
        kernels = self.kernels_where(expr)
        ops = gpu_ops(kernels, self.memcpys.filter(expr), self.memsets.filter(expr), self.graphs.filter(expr), end_bound=self.end_bound)
        return ops, kernels

    def where(self, expr: pl.Expr) -> pl.DataFrame:
        """``ops.filter(expr)`` (see :meth:`where_with_kernels`)."""
        return self.where_with_kernels(expr)[0]

    def narrow(self, columns: list[str]) -> pl.DataFrame:
        """``ops.select(columns)`` of every operation, with ``name`` as an integer code (equal
        codes for equal names, null for none) instead of the text: the input of the period
        search (:func:`~tracekit.diagnosis.window.kernel_period_iterations`) and of the
        generation phases."""
        rows = self._kernel_rows_where(pl.lit(True), plausible=True)
        plain = [c for c in columns if c != "name"]
        # op_kind is no kernel column: "kernel" on every kernel row, as gpu_ops sets it
        read = [c for c in plain if c != "op_kind"] or (["start_ns"] if plain else [])
        kernels = self._gather(rows, read)
        if "op_kind" in plain:
            kernels = kernels.with_columns(pl.lit("kernel").alias("op_kind")).select(plain)
        # the memcpys, memsets and graph launches as gpu_ops stacks them (no kernel rows)
        ops = gpu_ops(self._gather(_NONE, KERNEL_COLUMNS), self.memcpys, self.memsets, self.graphs, end_bound=self.end_bound)
        if "name" not in columns:
            return pl.concat([kernels, ops.select(plain)], how="vertical_relaxed")
        ids = self._src["name_id"] if rows is None else self._src["name_id"].gather(rows)
        texts = ids.drop_nulls().unique().to_frame("id").with_columns(lookup_strings(pl.col("id"), self._trace.strings).alias("text"))
        labels = pl.concat([texts["text"], ops["name"]]).drop_nulls().unique().sort()
        codes = pl.int_range(labels.len(), dtype=pl.Int64, eager=True)
        by_text = texts["text"].replace_strict(labels, codes, default=None, return_dtype=pl.Int64)
        k_codes = ids.replace_strict(texts["id"], by_text, default=None, return_dtype=pl.Int64).alias("name")
        del ids
        k = kernels.with_columns(k_codes) if plain else k_codes.to_frame()
        o_codes = ops["name"].replace_strict(labels, codes, default=None, return_dtype=pl.Int64).alias("name")
        return pl.concat([k.select(columns), ops.with_columns(o_codes).select(columns)], how="vertical_relaxed")

    def distinct(self, column: str) -> pl.Series:
        """The distinct values of kernel column ``name`` or ``short_name`` (texts looked up
        for the distinct ids only; a few hundred where the table has millions of rows)."""
        ids = self._src[f"{column}_id"].unique()
        return ids.to_frame("id").select(lookup_strings(pl.col("id"), self._trace.strings).alias(column)).to_series().unique()
