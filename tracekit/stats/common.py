"""Shared machinery of the nsys-stats-compatible reports: statistics, rounding, CSV output.

nsys's reports compute, per group, the total, count, mean, median (the mean of the two
middle values for an even count), min, max and the *sample* standard deviation (0 for a
single value), round Avg/Med/StdDev to one decimal and print ``Time (%)`` as the group's
share of the summed total, rounded to one decimal.

Rounding differs between nsys versions: the 2023.x reports ran in SQLite, whose ``ROUND``
rounds the ~15-digit decimal text of the value half away from zero (4639.95 → 4640.0,
although the double is 4639.9499…) below 2**42 and the exact value above it (its printf
stops adding its 3e-16 fudge there: 436485663470487.94 → 436485663470487.9, checked against
nsys 2023.4.4); the 2025.x reports round the exact binary value half
up (4639.9499… → 4639.9, an exact 1045.25 → 1045.3). Both were checked against the CSVs
that nsys 2023.4.4 (public corpus) and 2025.3.1 (our samples) printed. nsys 2025.x also
prefixes default-domain NVTX range names with ``:`` (``:step.0``) where 2023.x printed
the bare name. ``convention`` picks one: ``"2025"`` (the default, what current nsys
prints) or ``"2023"``.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Iterator, Sequence
from decimal import ROUND_HALF_UP, Decimal
from typing import BinaryIO

import polars as pl

CONVENTIONS = ("2025", "2023")
#: Rows formatted at a time when a report is written as CSV.
CSV_CHUNK_ROWS = 200_000


#: 2**52: every double beyond it is a whole number.
_WHOLE = 4503599627370496.0


def round1(value: float | None, convention: str = "2025", digits: int = 1) -> float | None:
    """Round like nsys of the given ``convention`` (see the module docstring)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if abs(value) > _WHOLE:  # no fraction to round: SQLite's ROUND (nsys 2023.x) returns it as it is
        return float(value)
    quant = Decimal(1).scaleb(-digits)
    # SQLite's printf (under ROUND) adds a relative 3e-16 to its rounder only while
    # digits + binary exponent / 3 < 15; past 2**42 (for one decimal) it rounds the exact value
    fudged = convention == "2023" and abs(value) < 2.0 ** (3 * (15 - digits))
    exact = Decimal(format(value, ".15g")) if fudged else Decimal(value)
    return float(exact.quantize(quant, rounding=ROUND_HALF_UP))


def stat_aggs(value: str) -> list[pl.Expr]:
    """Total, count, mean, median, min, max and sample stddev of column ``value``."""
    v = pl.col(value)
    return [
        v.sum().alias("_total"),
        v.len().alias("_count"),
        v.mean().alias("_avg"),
        v.median().alias("_med"),
        v.min().alias("_min"),
        v.max().alias("_max"),
        pl.when(v.len() > 1).then(v.std(ddof=1)).otherwise(0.0).alias("_std"),
    ]


class Report:
    """A computed report: rows with nsys's column names, and how to print each column.

    ``kinds`` maps a column to ``"int"``, ``"float1"`` (one decimal, rounded by
    ``convention``), ``"mb3"`` (value in bytes printed as decimal MB with three decimals),
    ``"pct"`` (percent, one decimal) or ``"str"``.

    A report over millions of rows may be built from ``parts`` instead of a frame (see
    :meth:`chunked`): :meth:`write_csv` then formats and writes one part at a time, so the whole
    report never exists in memory; :attr:`frame` concatenates the parts on first use.
    """

    def __init__(
        self,
        name: str,
        frame: pl.DataFrame | None,
        kinds: dict[str, str],
        convention: str = "2025",
        notes: list[str] | None = None,
    ) -> None:
        self.name = name
        self.kinds = kinds
        self.convention = convention
        self.notes = list(notes or [])
        self._frame = frame
        self._parts: Callable[[], Iterator[pl.DataFrame]] | None = None

    @classmethod
    def chunked(
        cls, name: str, parts: Callable[[], Iterator[pl.DataFrame]], kinds: dict[str, str], convention: str = "2025"
    ) -> Report:
        """A report whose rows ``parts()`` yields in order, a frame at a time (at least one
        frame, empty when the report has no rows, so that the header is known)."""
        report = cls(name, None, kinds, convention)
        report._parts = parts
        return report

    @property
    def frame(self) -> pl.DataFrame:
        """All rows as one frame (built from the parts on first use for a chunked report)."""
        if self._frame is None:
            assert self._parts is not None
            self._frame = pl.concat(list(self._parts()), how="vertical")
        return self._frame

    def __repr__(self) -> str:
        rows = self._frame.height if self._frame is not None else "chunked"
        return f"Report({self.name!r}, rows={rows}, convention={self.convention!r})"

    @property
    def columns(self) -> list[str]:
        return self.frame.columns

    def text_frame(self, *, keep_ints: bool = False) -> pl.DataFrame:
        """The report as text columns, each cell exactly as nsys prints it (null = empty).

        With ``keep_ints``, ``int`` columns stay Int64 (polars writes them to CSV as the
        same digits, faster than casting a million rows to text first).

        Formatting is vectorised in polars (reports reach millions of rows); the few cells
        whose rounding is a near-tie are formatted by the exact Python rule
        (:func:`round1` or ``format(x, ".3f")``), so the text equals cell-by-cell formatting.
        """
        columns = []
        for name in self.frame.columns:
            series = self.frame.get_column(name)
            kind = self.kinds.get(name, "str")
            if kind in ("float1", "pct"):
                text = decimal_text(series, 1, lambda v: _repr_or_empty(round1(v, self.convention)))
            elif kind == "mb3":
                text = decimal_text(series, 3, lambda v: format(v / 1e6, ".3f"), divisor=1e6)
            elif kind == "int":
                as_int = series.cast(pl.Int64)
                if keep_ints:
                    columns.append(as_int.alias(name))
                    continue
                text = as_int.cast(pl.Utf8)
            else:
                text = series.cast(pl.Utf8)
            # empty text and nulls are both written as an empty, unquoted field (like csv.writer)
            columns.append(text.set(text == "", None).alias(name))
        return pl.DataFrame(columns)

    def formatted_rows(self, limit: int | None = None) -> list[list[str]]:
        """Rows as the strings nsys prints in CSV (the first ``limit`` of them, when given)."""
        text = self.text_frame()
        return [list(row) for row in (text if limit is None else text.head(limit)).fill_null("").iter_rows()]

    def to_csv(self) -> str:
        """The report as nsys's ``--format csv`` output (header line, then rows)."""
        buf = io.BytesIO()
        self.write_csv(buf)
        return buf.getvalue().decode("utf-8")

    def write_csv(self, sink: BinaryIO, *, chunk_rows: int = CSV_CHUNK_ROWS, header: bool = True) -> None:
        """Write :meth:`to_csv`'s text to a binary file, formatting ``chunk_rows`` rows at a
        time (a million-row trace report never exists as one string)."""
        if self._frame is None and self._parts is not None:
            for i, frame in enumerate(self._parts()):
                Report(self.name, frame, self.kinds, self.convention).write_csv(sink, chunk_rows=chunk_rows, header=i == 0)
            return
        self._write_frame_csv(sink, chunk_rows=chunk_rows, header=header)

    def _write_frame_csv(self, sink: BinaryIO, *, chunk_rows: int, header: bool) -> None:
        if self.frame.width == 1:  # csv.writer quotes a lone empty field; keep its output there
            rows = [self.columns, *self.formatted_rows()] if header else self.formatted_rows()
            sink.write(_csv_rows(rows).encode("utf-8"))
            return
        for offset in range(0, max(self.frame.height, 1), chunk_rows):
            part = Report(self.name, self.frame.slice(offset, chunk_rows), self.kinds, self.convention)
            part.text_frame(keep_ints=True).write_csv(
                sink, include_header=header and offset == 0, quote_style="necessary", line_terminator="\n", null_value=""
            )

    def reference_rows(self) -> list[list[str]]:
        """:meth:`formatted_rows` computed cell by cell in Python (slow; the specification
        the vectorised formatter is tested against)."""
        formatters: list[Callable[[object], str]] = [
            _formatter(self.kinds.get(c, "str"), self.convention) for c in self.frame.columns
        ]
        return [
            [fmt(value) for fmt, value in zip(formatters, row, strict=True)]
            for row in self.frame.iter_rows()
        ]


def _csv_rows(rows: Sequence[Sequence[str]]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return buf.getvalue()


def _fmt_int(value: object) -> str:
    return "" if value is None else str(int(value))  # type: ignore[call-overload]


def _formatter(kind: str, convention: str) -> Callable[[object], str]:
    if kind == "int":
        return _fmt_int
    if kind in ("float1", "pct"):

        def fmt(value: object) -> str:
            r = round1(None if value is None else float(value), convention)  # type: ignore[arg-type]
            return "" if r is None else repr(r)

        return fmt
    if kind == "mb3":

        def fmt_mb(value: object) -> str:
            if value is None:
                return ""
            return f"{float(value) / 1e6:.3f}"  # type: ignore[arg-type]

        return fmt_mb
    return lambda value: "" if value is None else str(value)


def _repr_or_empty(value: float | None) -> str:
    return "" if value is None else repr(value)


#: Magnitudes from which a float is formatted in Python (repr switches to exponents at 1e16).
_LARGE = 1e15
#: Distinct values up to which :func:`decimal_text` formats each by its exact Python rule
#: (faster than polars' expressions on a handful of values: ~1 ms a call).
EXACT_DISTINCT = 256


def decimal_text(
    values: pl.Series, digits: int, exact: Callable[[float], str], *, divisor: float = 1.0
) -> pl.Series:
    """``values / divisor`` rounded to ``digits`` decimals and printed as ``"<int>.<digits>"``.

    Cells away from a rounding tie are rounded in polars (either rule gives the same
    digits there). Cells within a relative 1e-12 of a tie, negative, non-finite or
    ≥ 1e15 are formatted by ``exact`` (the Python rule that defines the output: nsys's
    half-up rounding of one or other decimal form, or ``format``'s half-even). Nulls stay
    null; ``exact`` gets the original value (as a float) and may return ``""`` for NaN.
    The band is wide enough for polars' own arithmetic, which may differ from Python's by an
    ulp or two (it divides by multiplying with the reciprocal).

    Each text depends on its value alone, so a column of few distinct values (the shared
    memory sizes of a million kernels in ``cuda_gpu_trace``) or mostly nulls (the memcpy-only
    columns there) is formatted once per distinct value and the texts are gathered back:
    formatting every cell of those columns took ~0.3 s of a 1 M-row report.
    """
    present = values.drop_nulls()
    if present.len() < values.len() or present.len() > 64:
        if present.len() == 0:
            return pl.repeat(None, values.len(), dtype=pl.Utf8, eager=True).alias(values.name)
        # -0.0 and 0.0 are one key (polars hashes them alike) and print alike, as 0.0 (the
        # per-cell path's text); NaN would never match itself as a key
        distinct = present.cast(pl.Float64).unique()
        if distinct.len() * 4 <= values.len() and not distinct.is_nan().any():
            if distinct.len() <= EXACT_DISTINCT:  # a few values: the defining rule itself, in Python
                texts = pl.Series([exact(v + 0.0) for v in distinct.to_list()], dtype=pl.Utf8)
            else:
                texts = _decimal_text_each(distinct, digits, exact, divisor)
            keys = values.cast(pl.Float64)
            return keys.replace_strict(distinct, texts, default=None, return_dtype=pl.Utf8).alias(values.name)
    return _decimal_text_each(values, digits, exact, divisor)


def _decimal_text_each(
    values: pl.Series, digits: int, exact: Callable[[float], str], divisor: float
) -> pl.Series:
    """:func:`decimal_text` computed for every cell."""
    scale = 10**digits
    raw = values.cast(pl.Float64)
    x = raw / divisor if divisor != 1.0 else raw
    frame = pl.DataFrame({"x": x}).with_columns((pl.col("x") * scale).alias("y"))
    frame = frame.with_columns(pl.col("y").floor().alias("k"))
    frac = pl.col("y") - pl.col("k")
    band = pl.max_horizontal(pl.col("y").abs() * 1e-12, pl.lit(1e-9))
    ambiguous = (
        ((frac - 0.5).abs() <= band)
        | (pl.col("x") < 0)
        | (pl.col("x") >= _LARGE)
        | pl.col("x").is_nan()
        | pl.col("x").is_infinite()
    )
    whole = (pl.col("k") + (frac > 0.5).cast(pl.Float64)).cast(pl.Int64, strict=False)
    out = frame.select(
        pl.when(ambiguous.fill_null(False))
        .then(None)
        .otherwise(
            pl.format("{}.{}", whole // scale, (whole % scale).cast(pl.Utf8).str.zfill(digits))
        )
        .alias("text"),
        ambiguous.fill_null(False).alias("ambiguous"),
    )
    text = out.get_column("text")
    idx = out.get_column("ambiguous").arg_true()
    if len(idx):
        fixed = [exact(v) for v in raw.gather(idx).to_list()]
        text = text.scatter(idx, pl.Series(fixed, dtype=pl.Utf8))
    return text.alias(values.name)


#: The keys of the groups whose numbers are given, one row per number in that order (with
#: the number as ``_g``): what :func:`group_numbers` returns beside the numbers.
GroupDecoder = Callable[[pl.Series], pl.DataFrame]


def packed_group_numbers(keys: pl.DataFrame) -> tuple[pl.Series, GroupDecoder] | None:
    """:func:`group_numbers` when every key column is an integer whose range (max - min,
    plus one code for null) multiplies with the others' to less than 2**62: each row's number
    is its offsets from the minima in mixed radix, and the groups' keys are decoded from
    their numbers. No hashing (1 M launches: 0.01 s where coding by distinct values took
    0.05 s); None otherwise."""
    if not keys.width or not all(dtype.is_integer() and dtype != pl.UInt64 for dtype in keys.dtypes):
        return None  # (UInt64 values may not fit the Int64 arithmetic)
    bounds = keys.select(
        *(pl.col(c).min().cast(pl.Int64).alias(f"lo{i}") for i, c in enumerate(keys.columns)),
        *(pl.col(c).max().cast(pl.Int64).alias(f"hi{i}") for i, c in enumerate(keys.columns)),
        *(pl.col(c).null_count().alias(f"n{i}") for i, c in enumerate(keys.columns)),
    ).row(0)
    width = keys.width
    radix: list[tuple[str, int, int, bool]] = []  # column, minimum, codes, has nulls
    total = 1
    for i, name in enumerate(keys.columns):
        lo, hi, nulls = bounds[i], bounds[width + i], bounds[2 * width + i]
        if lo is None:  # all null: one code
            lo = hi = 0
        codes = hi - lo + 1 + (1 if nulls else 0)
        total *= codes
        if total >= 1 << 62:
            return None
        radix.append((name, lo, codes, bool(nulls)))
    number: pl.Expr | None = None
    for name, lo, codes, nulls in radix:
        code = pl.col(name).cast(pl.Int64) - lo
        if nulls:
            code = code.fill_null(codes - 1)
        number = code if number is None else number * codes + code
    assert number is not None
    gid = keys.select(number.alias("_g")).to_series()
    schema = keys.schema

    def decode(numbers: pl.Series) -> pl.DataFrame:
        rest, columns = numbers, []
        for name, lo, codes, nulls in reversed(radix):
            code = rest % codes
            value = code + lo
            if nulls:
                value = value.set(code == codes - 1, None)  # type: ignore[arg-type]
            columns.append(value.cast(schema[name]).alias(name))
            rest = rest // codes
        return pl.DataFrame([*reversed(columns), numbers.alias("_g")])

    return gid, decode


def group_numbers(keys: pl.DataFrame) -> tuple[pl.Series, GroupDecoder]:
    """One Int64 per row (``_g``), equal exactly when the rows' ``keys`` are (null equals
    null), and a function giving the keys of given numbers (:data:`GroupDecoder`: group on
    ``_g``, then decode the numbers the group-by gives). Integer keys of small ranges are
    packed arithmetically (:func:`packed_group_numbers`); otherwise each column is coded by
    its few distinct values and the codes are combined arithmetically: a hash of the whole key
    frame (8 M launches) took ~0.5 GB where this takes two small integer columns."""
    packed = packed_group_numbers(keys)
    if packed is not None:
        return packed
    codes: list[pl.Series] = []
    values: list[pl.Series] = []
    for name in keys.columns:
        column = keys[name]
        distinct = column.drop_nulls().unique(maintain_order=True)
        if distinct.len():
            code = column.replace_strict(distinct, pl.int_range(distinct.len(), dtype=pl.Int64, eager=True), return_dtype=pl.Int64)
        else:  # all null (e.g. names of an export whose StringIds is empty): one code
            code = pl.zeros(column.len(), pl.Int64, eager=True)
        codes.append(code.fill_null(distinct.len()))
        values.append(pl.concat([distinct, pl.Series([None], dtype=column.dtype)]))
    radix = [v.len() for v in values]
    if math.prod(radix) >= 1 << 62:  # too many combinations for one integer: hash the keys
        # each row's number is the row number of the first row with its keys
        first = keys.with_row_index("_g").select(pl.col("_g").first().over(keys.columns).cast(pl.Int64)).to_series()
        return first.alias("_g"), lambda numbers: keys[numbers].with_columns(numbers.alias("_g"))
    gid = codes[0]
    for code, base in zip(codes[1:], radix[1:], strict=True):
        gid = gid * base + code
    del codes

    def decode(numbers: pl.Series) -> pl.DataFrame:
        rest, columns = numbers, []
        for v, base in zip(reversed(values), reversed(radix), strict=True):
            columns.append(v.gather(rest % base).alias(v.name))
            rest = rest // base
        return pl.DataFrame([*reversed(columns), numbers.alias("_g")])

    return gid.alias("_g"), decode


def summary_frame(
    frame: pl.DataFrame,
    *,
    group: Sequence[str],
    value: str,
    convention: str = "2025",
) -> pl.DataFrame:
    """Group ``frame`` and compute nsys's statistics of ``value`` (columns ``_total`` …).

    Under the ``"2023"`` convention a group whose total passes 2**53 (only a damaged export's
    times get there) takes its mean as SQLite's ``AVG`` computes it, a float sum in row
    order divided by the count (the exact total's quotient differs in the last digits)."""
    out = frame.group_by(list(group)).agg(stat_aggs(value))
    if convention == "2023" and out.height and out.select((pl.col("_total").abs() > _WHOLE).any()).item():
        out = _sequential_means(frame, out, list(group), value)
    grand = out["_total"].sum()
    return out.with_columns(
        (pl.col("_total").cast(pl.Float64) * 100.0 / (grand if grand else 1)).alias("_pct")
    )


def _sequential_means(frame: pl.DataFrame, out: pl.DataFrame, group: list[str], value: str) -> pl.DataFrame:
    """``out`` with ``_avg`` of the groups whose total passes 2**53 recomputed as a float sum in
    the row order of ``frame`` (a cumulative sum adds one value at a time), over the count."""
    big = out.filter(pl.col("_total").abs() > _WHOLE).select(group)
    rows = frame.with_row_index("_row").join(big, on=group, how="semi").sort("_row")
    means = rows.group_by(group, maintain_order=True).agg(
        (pl.col(value).cast(pl.Float64).cum_sum().last() / pl.len()).alias("_seq_avg")
    )
    out = out.join(means, on=group, how="left", maintain_order="left", nulls_equal=True)
    return out.with_columns(pl.coalesce("_seq_avg", "_avg").alias("_avg")).drop("_seq_avg")


TIME_SUMMARY_KINDS = {
    "Time (%)": "pct",
    "Total Time (ns)": "int",
    "Avg (ns)": "float1",
    "Med (ns)": "float1",
    "Min (ns)": "int",
    "Max (ns)": "int",
    "StdDev (ns)": "float1",
}


def time_summary_columns(count_label: str) -> list[pl.Expr]:
    """The ``Time (%) … StdDev (ns)`` columns with ``count_label`` for the count."""
    return [
        pl.col("_pct").alias("Time (%)"),
        pl.col("_total").alias("Total Time (ns)"),
        pl.col("_count").alias(count_label),
        pl.col("_avg").alias("Avg (ns)"),
        pl.col("_med").alias("Med (ns)"),
        pl.col("_min").alias("Min (ns)"),
        pl.col("_max").alias("Max (ns)"),
        pl.col("_std").alias("StdDev (ns)"),
    ]
