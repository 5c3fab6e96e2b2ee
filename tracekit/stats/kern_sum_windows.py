"""``nvtx_kern_sum``'s per-group statistics merged over windows of kernels.

On 30 M kernels the (kernel, enclosing range) pairs are 86 M rows; the report's windowed path
(:func:`tracekit.stats.nvtx_projection.nvtx_kern_sum`) builds them a window of kernels at a
time and hands each window's rows to a :class:`KernSumWindows`, which keeps only what the
statistics need, merged across windows:

* (group, duration) value counts: sum, count, mean, median, min, max and standard deviation
  are then computed by :func:`~tracekit.stats.common.stat_aggs` on the durations they stand
  for, so the numbers are those of the whole-table group-by;
* per group, the kernels counted in each window (``Kern Inst``: windows never split a kernel's
  rows, so the counts add up);
* the distinct (range, kernel name) pairs, one Int64 key each (``NVTX Inst``: a range spans
  windows; the range and the kernel name give the group).
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

from tracekit.stats.common import stat_aggs

#: Merged rows (value counts, range pairs) past which a window's additions are folded into
#: the merged frames (a concat and a group-by; bounds the memory of repeated rows).
COMPACT_ROWS = 4_000_000
#: Durations expanded from the value counts at a time for the final statistics.
EXPAND_ROWS = 8_000_000

_STATS_SCHEMA: dict[str, pl.DataType] = {
    "_g": pl.Int64(), "_ninst": pl.UInt32(), "_kinst": pl.UInt32(), "_total": pl.Int64(), "_count": pl.UInt32(),
    "_avg": pl.Float64(), "_med": pl.Float64(), "_min": pl.Int64(), "_max": pl.Int64(), "_std": pl.Float64(),
}


class KernSumWindows:
    """Statistics of ``nvtx_kern_sum`` groups, fed one window of rows at a time.

    Each window (:meth:`add`) has one row per (kernel launch, enclosing range) and per
    kernel launch outside every range: ``_g`` (Int64 group number), ``duration_ns`` (Int64,
    ns), ``_gpu`` (the kernel's row: all rows of one kernel come in one window) and ``_r``
    (Int64 key of the (range, kernel name) pair, from which :meth:`finish`'s ``group_of``
    gives ``_g``; null outside every range).

    Examples
    --------
    >>> acc = KernSumWindows()
    >>> acc.add(pl.DataFrame({"_g": [0, 0], "duration_ns": [5, 7], "_gpu": [0, 1], "_r": [3, None]}))
    >>> acc.finish(lambda keys: keys * 0)["_med"].to_list()
    [6.0]
    """

    def __init__(self) -> None:
        self._values: list[pl.DataFrame] = []
        self._value_rows = 0
        self._kinst: list[pl.DataFrame] = []
        self._ranges: list[pl.Series] = []
        self._range_rows = 0

    def add(self, rows: pl.DataFrame) -> None:
        """Fold one window's rows (``_g``, ``duration_ns``, ``_gpu``, ``_r``) in."""
        values = rows.group_by("_g", "duration_ns").agg(pl.len().cast(pl.UInt32).alias("_n"))
        self._values.append(values)
        self._value_rows += values.height
        self._kinst.append(rows.group_by("_g").agg(pl.col("_gpu").n_unique().cast(pl.UInt32).alias("_kinst")))
        pairs = rows["_r"].drop_nulls().unique()
        self._ranges.append(pairs)
        self._range_rows += pairs.len()
        # folded when the rows added since the last fold are as many as the folded ones (and
        # at least COMPACT_ROWS): each row is folded O(log windows) times
        if self._value_rows >= max(COMPACT_ROWS, 2 * self._values[0].height) and len(self._values) > 1:
            self._values = [_merged_values(self._values)]
            self._value_rows = self._values[0].height
        if self._range_rows >= max(COMPACT_ROWS, 2 * self._ranges[0].len()) and len(self._ranges) > 1:
            self._ranges = [pl.concat(self._ranges).unique()]
            self._range_rows = self._ranges[0].len()
        if len(self._kinst) >= 64:
            self._kinst = [_summed_kinst(self._kinst)]

    def finish(self, group_of: Callable[[pl.Series], pl.Series]) -> pl.DataFrame:
        """Per group: ``_g``, ``_ninst`` (distinct ranges), ``_kinst`` (kernels) and
        :func:`~tracekit.stats.common.stat_aggs` of the durations (``_total``, ``_count``,
        ``_avg``, ``_med``, ``_min``, ``_max``, ``_std``; ns). ``group_of`` gives the group
        number of (range, kernel) keys ``_r``. The merged windows are freed."""
        if not self._values:
            return pl.DataFrame(schema=_STATS_SCHEMA)
        values = _merged_values(self._values).sort("_g", "duration_ns")
        kinst = _summed_kinst(self._kinst)
        pairs = pl.concat(self._ranges).unique()
        ninst = group_of(pairs).alias("_g").to_frame().group_by("_g").agg(pl.len().cast(pl.UInt32).alias("_ninst"))
        del pairs
        self._values, self._kinst, self._ranges = [], [], []
        stats = pl.concat(_expanded_stats(values), how="vertical_relaxed")
        del values
        stats = stats.join(kinst, on="_g", how="left").join(ninst, on="_g", how="left")
        return stats.with_columns(pl.col("_ninst").fill_null(0)).select(*_STATS_SCHEMA)


def _merged_values(parts: list[pl.DataFrame]) -> pl.DataFrame:
    """Value counts (``_g``, ``duration_ns``, ``_n``) of several windows as one."""
    if len(parts) == 1:
        return parts[0]
    return pl.concat(parts).group_by("_g", "duration_ns").agg(pl.col("_n").sum().cast(pl.UInt32))


def _summed_kinst(parts: list[pl.DataFrame]) -> pl.DataFrame:
    """Kernels per group (``_g``, ``_kinst``) of several windows as one."""
    return pl.concat(parts).group_by("_g").agg(pl.col("_kinst").sum().cast(pl.UInt32))


def _expanded_stats(values: pl.DataFrame) -> list[pl.DataFrame]:
    """:func:`~tracekit.stats.common.stat_aggs` per group of value counts sorted by ``_g``:
    each group's durations are expanded back (``_n`` copies of each), groups of at most
    :data:`EXPAND_ROWS` durations together (a larger group alone)."""
    per_group = values.group_by("_g", maintain_order=True).agg(pl.col("_n").sum().cast(pl.Int64).alias("_n"), pl.len().alias("_rows"))
    out: list[pl.DataFrame] = []
    at = taken = rows = 0
    counts, widths = per_group["_n"].to_list(), per_group["_rows"].to_list()
    for count, width in zip(counts, widths, strict=True):
        if taken and taken + count > EXPAND_ROWS:
            out.append(_stats_of(values.slice(at, rows)))
            at, taken, rows = at + rows, 0, 0
        taken += count
        rows += width
    if rows:
        out.append(_stats_of(values.slice(at, rows)))
    return out


def _stats_of(values: pl.DataFrame) -> pl.DataFrame:
    """:func:`~tracekit.stats.common.stat_aggs` of the durations the value counts stand for."""
    expanded = values.select(
        pl.col("_g").repeat_by("_n").explode(),
        pl.col("duration_ns").repeat_by("_n").explode(),
    )
    return expanded.group_by("_g").agg(*stat_aggs("duration_ns"))
