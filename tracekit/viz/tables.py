"""Plain-HTML tables and number formatting shared by the widgets and the HTML report."""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import polars as pl


def fmt_ns(ns: Any) -> str:
    """A duration in the unit that reads best (``812 ns``, ``3.41 µs``, ``12.3 ms``, ``1.20 s``)."""
    if ns is None:
        return "–"
    ns = float(ns)
    if abs(ns) < 1e3:
        return f"{ns:.0f} ns"
    if abs(ns) < 1e6:
        return f"{ns / 1e3:.2f} µs"
    if abs(ns) < 1e9:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e9:.2f} s"


def fmt_bytes(n: Any) -> str:
    """Bytes with a binary prefix."""
    if n is None:
        return "–"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


_TABLE_CSS = (
    "<style>.tk-table{border-collapse:collapse;font-size:12px;font-family:sans-serif}"
    ".tk-table th,.tk-table td{padding:2px 8px;border-bottom:1px solid #e5e5e5;text-align:right}"
    ".tk-table th{background:#f5f5f5}.tk-table td.l,.tk-table th.l{text-align:left}"
    ".tk-table tr.sel td{background:#fff3c4}</style>"
)


def html_table(
    frame: pl.DataFrame,
    *,
    formats: Mapping[str, Callable[[Any], str]] | None = None,
    left: Sequence[str] = (),
    highlight: Callable[[dict[str, Any]], bool] | None = None,
    headers: Mapping[str, str] | None = None,
    max_rows: int = 200,
) -> str:
    """A small HTML table of ``frame`` (escaped), first ``max_rows`` rows."""
    formats = formats or {}
    headers = headers or {}
    head = "".join(
        f'<th class="{"l" if c in left else ""}">{html.escape(headers.get(c, c))}</th>'
        for c in frame.columns
    )
    rows = []
    for row in frame.head(max_rows).iter_rows(named=True):
        cells = []
        for c in frame.columns:
            v = row[c]
            text = (
                formats[c](v)
                if c in formats
                else ("–" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v))
            )
            cells.append(f'<td class="{"l" if c in left else ""}">{html.escape(text)}</td>')
        cls = ' class="sel"' if highlight is not None and highlight(row) else ""
        rows.append(f"<tr{cls}>{''.join(cells)}</tr>")
    more = f"<p><i>{frame.height - max_rows} more rows</i></p>" if frame.height > max_rows else ""
    return f'{_TABLE_CSS}<table class="tk-table"><tr>{head}</tr>{"".join(rows)}</table>{more}'
