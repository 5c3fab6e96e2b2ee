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
    ".tk-table tr.sel td{background:#fff3c4}.tk-table td,.tk-table th{white-space:nowrap}"
    ".tk-table td.clip{max-width:460px;overflow:hidden;text-overflow:ellipsis}</style>"
)


def html_table(
    frame: pl.DataFrame,
    *,
    formats: Mapping[str, Callable[[Any], str]] | None = None,
    left: Sequence[str] = (),
    highlight: Callable[[dict[str, Any]], bool] | None = None,
    headers: Mapping[str, str] | None = None,
    max_rows: int = 200,
    clip: Mapping[str, str] | None = None,
    hidden: Sequence[str] = (),
) -> str:
    """A small HTML table of ``frame`` (escaped), first ``max_rows`` rows.

    Cells never wrap. ``clip`` maps text columns to cut at 460 px (with ``…``) to the column
    whose value is shown on hover (the full kernel name behind a short label); ``hidden``
    columns are not shown (hover texts)."""
    formats = formats or {}
    headers = headers or {}
    clip = clip or {}
    shown = [c for c in frame.columns if c not in hidden]
    head = "".join(
        f'<th class="{"l" if c in left else ""}">{html.escape(headers.get(c, c))}</th>'
        for c in shown
    )
    rows = []
    for row in frame.head(max_rows).iter_rows(named=True):
        cells = []
        for c in shown:
            v = row[c]
            text = (
                ("–" if v is None else formats[c](v))
                if c in formats
                else ("–" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v))
            )
            cls = " ".join(k for k, on in (("l", c in left), ("clip", c in clip)) if on)
            hover = f' title="{html.escape(str(row.get(clip[c]) or ""))}"' if c in clip else ""
            cells.append(f'<td class="{cls}"{hover}>{html.escape(text)}</td>')
        cls = ' class="sel"' if highlight is not None and highlight(row) else ""
        rows.append(f"<tr{cls}>{''.join(cells)}</tr>")
    more = f"<p><i>{frame.height - max_rows} more rows</i></p>" if frame.height > max_rows else ""
    return f'{_TABLE_CSS}<table class="tk-table"><tr>{head}</tr>{"".join(rows)}</table>{more}'
