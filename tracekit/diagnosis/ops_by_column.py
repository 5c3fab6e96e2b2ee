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

from tracekit.analysis._frames import PID_UNIT, gpu_ops, within_any
from tracekit.nsys import schema as S
from tracekit.nsys.database import ensure_memory
from tracekit.nsys.readers import (
    END_SLACK_NS,
    KERNEL_SOURCE,
    gathered,
    lookup_strings,
    one_value_columns,
)

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
#: The operation's row in :func:`~tracekit.analysis.op_launches.op_launches`' numbering.
_SRC_ROW = "_src_row"
#: The launch columns :meth:`OpsByColumn.narrow_launched` adds.
_LAUNCHED = ("global_tid", "api_start_ns")


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
        self._src = trace.columns_on_demand("kernels", [*KERNEL_COLUMNS, "name_id", "short_name_id", "grid_x"])
        #: The text of each name code of the last :meth:`narrow` that read names.
        self.name_labels: pl.Series | None = None
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
            return one_value_columns(pl.DataFrame([self._src[c] for c in columns]))
        if rows.len() == 0:
            return S.empty("kernels", list(columns))
        return one_value_columns(gathered(self._src, list(columns), rows))

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
        search (:func:`~tracekit.analysis.run.structure.kernel_loop_iterations`) and of the
        generation phases."""
        rows = self._kernel_rows_where(pl.lit(True), plausible=True)
        plain = [c for c in columns if c != "name"]
        # op_kind is no kernel column: "kernel" on every kernel row, as gpu_ops sets it;
        # _src_row numbers the rows as op_launches does (kernels, memcpys, memsets)
        made = ("op_kind", _SRC_ROW)
        read = [c for c in plain if c not in made] or (["start_ns"] if plain else [])
        kernels = self._gather(rows, read)
        if any(c in plain for c in made):
            n = self.kernel_rows
            src = pl.int_range(n, dtype=pl.Int64, eager=True) if rows is None else rows.cast(pl.Int64)
            kernels = kernels.with_columns(pl.lit("kernel").alias("op_kind"), src.alias(_SRC_ROW)).select(plain)
        # the memcpys, memsets and graph launches as gpu_ops stacks them (no kernel rows)
        if _SRC_ROW in plain:
            numbered = [frame.with_columns(pl.int_range(first, first + frame.height, dtype=pl.Int64).alias(_SRC_ROW))
                        for frame, first in self._numbered_tables()]
            none = self._gather(_NONE, KERNEL_COLUMNS).with_columns(pl.lit(None, pl.Int64).alias(_SRC_ROW))
            ops = gpu_ops(none, numbered[0], numbered[1], self.graphs, columns=[_SRC_ROW], end_bound=self.end_bound)
        else:
            ops = gpu_ops(self._gather(_NONE, KERNEL_COLUMNS), self.memcpys, self.memsets, self.graphs, end_bound=self.end_bound)
        if "name" not in columns:
            return pl.concat([kernels, ops.select(plain)], how="vertical_relaxed")
        ids = self._src["name_id"] if rows is None else self._src["name_id"].gather(rows)
        texts = ids.drop_nulls().unique().to_frame("id").with_columns(lookup_strings(pl.col("id"), self._trace.strings).alias("text"))
        labels = pl.concat([texts["text"], ops["name"]]).drop_nulls().unique().sort()
        self.name_labels = labels
        codes = pl.int_range(labels.len(), dtype=pl.Int64, eager=True)
        by_text = texts["text"].replace_strict(labels, codes, default=None, return_dtype=pl.Int64)
        k_codes = ids.replace_strict(texts["id"], by_text, default=None, return_dtype=pl.Int64).alias("name")
        del ids
        k = kernels.with_columns(k_codes) if plain else k_codes.to_frame()
        o_codes = ops["name"].replace_strict(labels, codes, default=None, return_dtype=pl.Int64).alias("name")
        return pl.concat([k.select(columns), ops.with_columns(o_codes).select(columns)], how="vertical_relaxed")

    def narrow_launched(self, columns: list[str], api: Any) -> pl.DataFrame | None:
        """:meth:`narrow` of ``columns`` plus each operation's ``global_tid`` and
        ``api_start_ns``: what :func:`~tracekit.analysis.attribution.launch_info` adds with
        ``columns=("global_tid", "api_start_ns")``, same rows and values. The kernels',
        memcpys' and memsets' come from the launch join kept in the column cache
        (:func:`~tracekit.analysis.op_launches.launches_at`: a warm run reads the kept columns,
        one value per operation, and no API column); graph launches (few) are joined to
        ``api``. ``None`` when some operation matches two calls (the caller joins instead)."""
        from tracekit.analysis.attribution import launch_info
        from tracekit.analysis.op_launches import launches_at

        ops = self.narrow([*columns, _SRC_ROW])
        launched = launches_at(self._trace, self._launch_keys, ops[_SRC_ROW], _LAUNCHED)
        if launched is None:
            return None
        ops = ops.drop(_SRC_ROW).with_columns(launched[c] for c in _LAUNCHED)
        del launched
        g = self._graph_ops()  # gpu_ops stacks them last, in this order
        if g.height:
            joined = launch_info(g.select("global_pid", "correlation_id"), api, columns=_LAUNCHED)
            tail = ops.slice(ops.height - g.height).with_columns(joined[c] for c in _LAUNCHED)
            ops = pl.concat([ops.slice(0, ops.height - g.height), tail])
        return ops

    def launched_within(self, starts: pl.Series, ends: pl.Series, api: Any) -> pl.DataFrame | None:
        """``ops.filter(expr)`` for the operations whose launching call starts in some
        ``[starts[i], ends[i]]`` (CPU ranges, ns), with the launch columns ``tid``,
        ``global_tid``, ``api_start_ns`` and ``api_end_ns`` as
        :func:`~tracekit.analysis.attribution.launch_info` adds them (not ``api_name``): from
        the launch join kept in the column cache, whose call starts (one per operation) are
        searched instead of every call's (1 M operations, 5 M calls: a column of 8 MB, not
        40 MB, and no API column read when the join is kept); only the operations found are
        gathered. Graph launches are joined to ``api``. ``None`` when some operation matches
        two calls (the caller joins instead)."""
        from tracekit.analysis.attribution import launch_info
        from tracekit.analysis.op_launches import matches_twice, op_launches

        pairs = op_launches(self._trace, self._launch_keys)
        if matches_twice(pairs):
            return None
        launch = pairs.filter(within_any(pairs["api_start_ns"], starts, ends)).rename({"_lrow": _SRC_ROW})
        del pairs
        launch = launch.select(pl.col(_SRC_ROW).cast(pl.Int64), (pl.col("global_tid") % PID_UNIT).alias("tid"), "global_tid",
                               "api_start_ns", "api_end_ns")
        src = launch[_SRC_ROW]
        k_rows = src.filter(src < self.kernel_rows)
        kernels = self._gather(k_rows.cast(pl.UInt32), KERNEL_COLUMNS).with_columns(k_rows.alias(_SRC_ROW))
        parts = []
        for frame, first in self._numbered_tables():
            rows = src.filter((src >= first) & (src < first + frame.height))
            parts.append(frame[(rows - first).cast(pl.UInt32)].with_columns(rows.alias(_SRC_ROW)))
        ops = gpu_ops(kernels, parts[0], parts[1], None, columns=[_SRC_ROW], end_bound=self.end_bound)
        ops = ops.join(launch, on=_SRC_ROW, how="left", maintain_order="left").drop(_SRC_ROW)
        g = self._graph_ops()
        if g.height:  # graph launches: no kept row, few
            g = launch_info(g, api, columns=("tid", "global_tid", "api_start_ns", "api_end_ns"))
            g = g.filter(within_any(g["api_start_ns"], starts, ends))
            ops = pl.concat([ops, g], how="vertical_relaxed")
        return ops

    def _launch_keys(self) -> pl.DataFrame:
        """:func:`~tracekit.analysis.op_launches.op_keys` of this export (for its join)."""
        from tracekit.analysis.op_launches import op_keys

        return op_keys(self._trace, self._src)

    def _numbered_tables(self) -> list[tuple[pl.DataFrame, int]]:
        """The memcpys and the memsets, each with the number of its first row in
        :func:`~tracekit.analysis.op_launches.op_launches`' numbering (kernels first)."""
        copies = self.kernel_rows
        return [(self.memcpys, copies), (self.memsets, copies + self.memcpys.height)]

    def _graph_ops(self) -> pl.DataFrame:
        """The graph launches as ``gpu_ops`` stacks them (no kept launch row: few)."""
        return gpu_ops(self._gather(_NONE, KERNEL_COLUMNS), None, None, self.graphs, end_bound=self.end_bound)

    def distinct(self, column: str) -> pl.Series:
        """The distinct values of kernel column ``name`` or ``short_name`` (texts looked up
        for the distinct ids only; a few hundred where the table has millions of rows)."""
        ids = self._src[f"{column}_id"].unique()
        return ids.to_frame("id").select(lookup_strings(pl.col("id"), self._trace.strings).alias(column)).to_series().unique()
