"""Text of a diagnosis: durations (``fmt_ns``) and one-line evidence summaries, shared by the
findings' plain text, Markdown and HTML (:mod:`tracekit.diagnosis.result`,
:mod:`tracekit.diagnosis.html`)."""

from __future__ import annotations

import polars as pl

__all__ = ["TIMESTAMP_SUFFIXES", "cell_text", "fmt_ns"]


def fmt_ns(ns: float | int | None) -> str:
    """``1.23 ms`` style text for a duration in ns."""
    if ns is None:
        return "–"
    v = float(ns)
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:.3g} {unit}"
    return f"{v:.0f} ns"


#: Evidence columns that are times on the capture's clock, not durations.
TIMESTAMP_SUFFIXES = ("start_ns", "end_ns", "launched_ns")


def cell_text(column: str, value: object, digits: int = 3) -> str:
    """An evidence cell as text: durations (``*_ns`` columns that are no timestamps) as
    ``fmt_ns``, floats to ``digits`` significant digits, nothing for null."""
    if value is None:
        return ""
    if column.endswith("_ns") and not column.endswith(TIMESTAMP_SUFFIXES) and isinstance(value, (int, float)):
        return fmt_ns(value)
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _evidence_line(ev: pl.DataFrame, index: int, rows: int = 2, fields: int = 5) -> str:
    """The first ``rows`` evidence rows as ``key=value`` pairs (times in ``*_ns`` columns
    formatted, text cut at 60 characters), then how many rows there are and where to see them."""
    parts = []
    for row in ev.head(rows).iter_rows(named=True):
        kv = []
        for k, v in row.items():
            if v is None or isinstance(v, (list, dict)) or k.endswith(TIMESTAMP_SUFFIXES):
                continue  # timestamps on the capture's clock say little in a line of text
            text = cell_text(k, v)
            kv.append(f"{k}={text[:60] + '…' if len(text) > 60 else text}")
            if len(kv) == fields:
                break
        parts.append(", ".join(kv))
    more = f"{ev.height} rows: Diagnosis.evidence({index}) or -f json"
    return "; ".join(parts) + f" ({more})"
