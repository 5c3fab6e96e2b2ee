"""The vectorised report formatter gives the text of the cell-by-cell rounding rules.

The rules themselves (nsys 2023.x rounds the 15-digit decimal text half-up, 2025.x the exact
double; MB columns use ``format(x, ".3f")``) are checked against nsys's own CSVs in
test_stats_reference.py. Real reports rarely hit exact ties, so this test feeds the
formatter the values where a fast rounding could differ: exact and near ties, values that
are ties only in one convention, negatives, huge values, NaN and nulls.
"""

from __future__ import annotations

import random

import polars as pl
import pytest

from tracekit.stats.common import Report, _decimal_text_each, decimal_text, round1


def _values() -> list[float | None]:
    rng = random.Random(20261121)
    values: list[float | None] = [
        4639.95, 1045.25, 0.05, 0.15, 0.25, 0.35, 2.675, 1.0, 0.0, 12.5, 99.95, 100.0,
        -0.04, -1.25, -4639.95, 1e15, 1e16 + 2.0, 123456789012.35, float("nan"), None,
        float.fromhex("0x1.0p-30"), 5e-324,
    ]
    values += [k / 20 for k in range(-50, 4000)]  # every x.x5 candidate tie
    values += [j / 16 for j in range(0, 5000)]  # exact binary ties at three decimals
    values += [rng.randint(0, 10**12) / rng.choice([1, 2, 3, 7, 10, 1000]) for _ in range(20000)]
    values += [rng.random() * 10 ** rng.randint(-3, 14) for _ in range(20000)]
    return values


@pytest.mark.parametrize("convention", ["2023", "2025"])
def test_vectorised_text_equals_cell_by_cell_text(convention: str) -> None:
    values = _values()
    frame = pl.DataFrame(
        {
            "avg": pl.Series(values, dtype=pl.Float64),
            "pct": pl.Series(values, dtype=pl.Float64),
            "mb": pl.Series(values, dtype=pl.Float64),
            "mb_int": pl.Series([None if v is None or v != v else int(abs(v)) for v in values], dtype=pl.Int64),
            "n": pl.Series(range(len(values)), dtype=pl.Int64),
            "name": pl.Series([None, "", "a,b", 'q"uote', "plain"] * (len(values) // 5) + ["x"] * (len(values) % 5)),
        }
    )
    kinds = {"avg": "float1", "pct": "pct", "mb": "mb3", "mb_int": "mb3", "n": "int", "name": "str"}
    report = Report("t", frame, kinds, convention)
    fast = report.formatted_rows()
    slow = report.reference_rows()
    assert len(fast) == len(slow) == len(values)
    mismatches = [(v, f, s) for v, f, s in zip(values, fast, slow, strict=True) if f != s]
    assert mismatches == []


def test_the_two_conventions_do_differ_on_the_tie_cases() -> None:
    """Guard for the test above: its values include cells where the rules disagree."""
    frame = pl.DataFrame({"v": [4639.95, 1045.25]})
    a = Report("t", frame, {"v": "float1"}, "2023").formatted_rows()
    b = Report("t", frame, {"v": "float1"}, "2025").formatted_rows()
    assert a == [["4640.0"], ["1045.3"]]
    assert b == [["4639.9"], ["1045.3"]]
    assert round1(4639.95, "2023") == 4640.0


def test_csv_quotes_like_csv_writer() -> None:
    import csv
    import io

    frame = pl.DataFrame({"Name": ["a,b", 'say "hi"', "", None, "line\nbreak"], "n": [1, 2, 3, None, 5]})
    report = Report("t", frame, {"n": "int"})
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows([report.columns, *report.reference_rows()])
    assert report.to_csv() == buf.getvalue()


@pytest.mark.parametrize("convention", ["2023", "2025"])
def test_columns_of_few_values_or_mostly_nulls_format_like_each_cell(convention: str) -> None:
    """Repeated values and nulls take the path that formats each distinct value once
    (``cuda_gpu_trace``'s shared-memory and memcpy-only columns); the text must be the
    cell-by-cell text, ties, negatives and huge values included."""
    rng = random.Random(7)
    pool = [v for v in _values() if v is not None and v == v][:3000] + [0.0]
    many = [rng.choice(pool) if rng.random() < 0.7 else None for _ in range(40000)]
    sparse = [rng.choice(pool) if rng.random() < 0.02 else None for _ in range(40000)]
    few = [rng.choice([0.0, 1024.0, 49152.0, 4639.95]) for _ in range(40000)]
    frame = pl.DataFrame(
        {
            "many": pl.Series(many, dtype=pl.Float64),
            "sparse": pl.Series(sparse, dtype=pl.Float64),
            "few_mb": pl.Series(few, dtype=pl.Float64),
            "few_avg": pl.Series(few, dtype=pl.Float64),
            "none": pl.Series([None] * 40000, dtype=pl.Float64),
            "ints": pl.Series([None if v is None else int(abs(v)) for v in sparse], dtype=pl.Int64),
        }
    )
    kinds = {"many": "float1", "sparse": "mb3", "few_mb": "mb3", "few_avg": "float1", "none": "mb3", "ints": "mb3"}
    report = Report("t", frame, kinds, convention)
    fast = report.formatted_rows()
    slow = report.reference_rows()
    assert fast == slow
    assert {row[4] for row in fast} == {""}
    assert {row[2] for row in fast} == {"0.000", "0.001", "0.049", "0.005"}


def test_distinct_value_path_equals_the_per_cell_path_on_signed_zeros() -> None:
    """-0.0 and 0.0 are one key of the distinct-value path; both print as the per-cell path
    prints them (nsys's reports hold sums and means of durations, never -0.0)."""
    values = pl.Series("v", [-0.0, 0.0, None, 2.5, -0.0] * 1000, dtype=pl.Float64)
    rules = ((1, 1.0, lambda v: repr(round1(v))), (3, 1e6, lambda v: format(v / 1e6, ".3f")))
    for digits, divisor, exact in rules:
        fast = decimal_text(values, digits, exact, divisor=divisor)
        each = _decimal_text_each(values, digits, exact, divisor)
        assert fast.to_list() == each.to_list()
        assert set(fast.drop_nulls().to_list()) == {exact(0.0), exact(2.5)}
