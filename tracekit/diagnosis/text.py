"""Text of a diagnosis: durations (``fmt_ns``) and one-line evidence summaries, shared by the
findings' plain text, Markdown and HTML (:mod:`tracekit.diagnosis.result`,
:mod:`tracekit.diagnosis.html`)."""

from __future__ import annotations

import polars as pl

__all__ = ["fmt_ns"]


def fmt_ns(ns: float | int | None) -> str:
    """``1.23 ms`` style text for a duration in ns."""
    if ns is None:
        return "–"
    v = float(ns)
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:.3g} {unit}"
    return f"{v:.0f} ns"


def _evidence_line(ev: pl.DataFrame, index: int, rows: int = 2, fields: int = 5) -> str:
    """The first ``rows`` evidence rows as ``key=value`` pairs (times in ``*_ns`` columns
    formatted, text cut at 60 characters), then how many rows there are and where to see them."""
    parts = []
    for row in ev.head(rows).iter_rows(named=True):
        kv = []
        for k, v in row.items():
            if v is None or isinstance(v, (list, dict)) or k.endswith(("start_ns", "end_ns", "launched_ns")):
                continue  # timestamps on the capture's clock say little in a line of text
            if k.endswith("_ns") and isinstance(v, (int, float)):
                text = fmt_ns(v)
            elif isinstance(v, float):
                text = f"{v:.3g}"
            else:
                text = str(v)
            kv.append(f"{k}={text[:60] + '…' if len(text) > 60 else text}")
            if len(kv) == fields:
                break
        parts.append(", ".join(kv))
    more = f"{ev.height} rows: Diagnosis.evidence({index}) or -f json"
    return "; ".join(parts) + f" ({more})"
