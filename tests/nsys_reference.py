"""Helpers to compare tracekit's reports with the CSVs that `nsys stats` printed."""

from __future__ import annotations

import csv
from pathlib import Path

from tracekit.stats import Report


def read_reference(path: Path) -> list[list[str]]:
    """Rows of an `nsys stats --format csv` file (header first); empty when nsys skipped it."""
    with path.open(newline="") as fh:
        return [row for row in csv.reader(fh) if row]


def assert_same_as_nsys(report: Report, reference: list[list[str]], *, ordered: bool = True) -> None:
    """Header equal; every cell equal. With ``ordered``, rows in nsys's order except where
    nsys leaves ties unordered (equal sort keys), which are compared as multisets."""
    ours = [report.columns, *report.formatted_rows()]
    assert ours[0] == reference[0], "header differs"
    assert len(ours) == len(reference), f"{len(ours) - 1} rows, nsys printed {len(reference) - 1}"
    assert sorted(map(tuple, ours[1:])) == sorted(map(tuple, reference[1:])), _first_difference(ours, reference)
    if ordered:
        key_cols = [i for i, c in enumerate(reference[0]) if c in ("Total Time (ns)", "Total (MB)", "Start (ns)")]
        if key_cols:
            i = key_cols[0]
            assert [r[i] for r in ours[1:]] == [r[i] for r in reference[1:]], "row order differs"


def _first_difference(ours: list[list[str]], ref: list[list[str]]) -> str:
    a, b = sorted(map(tuple, ours[1:])), sorted(map(tuple, ref[1:]))
    for x, y in zip(a, b, strict=False):
        if x != y:
            cells = [f"{h}: ours={p!r} nsys={q!r}" for h, p, q in zip(ref[0], x, y, strict=False) if p != q]
            return "; ".join(cells)[:500]
    return "row sets differ"
