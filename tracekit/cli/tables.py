"""Tables for the terminal that fit its width: numbers never wrap, long names are shortened.

A table wider than the console (80 columns in a pipe) keeps every number whole on one line
and gives the text columns the width left, shortening each long name in the middle with an
ellipsis: the head says what the kernel is (``cudnn_generated_fort_native_sdpa``), the tail
what tells it from its siblings (tile shapes, template arguments, ``_kernel0_0``). C++
return types (``void``) and argument lists go first, since they never tell kernels apart.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

__all__ = ["fit_table", "print_table", "shorten_middle", "text_columns"]

#: A text column is never given fewer characters than this (the table then runs wider than
#: the console: a name cut to nothing helps nobody).
MIN_TEXT_WIDTH = 16

_RETURN_TYPE = re.compile(r"^(?:void|int|float|auto)\s+")
_ARGUMENTS = re.compile(r"\((?:[^()]|\([^()]*\))*\)\s*$")
_NAMESPACE = re.compile(r"(?:\(anonymous namespace\)|\b[A-Za-z_]\w*)::")


def _visible_len(cell: str) -> int:
    """Characters a cell shows (rich markup such as ``[red]slower[/]`` left out)."""
    if "[" not in cell:
        return len(cell)
    from rich.text import Text

    return Text.from_markup(cell).cell_len


def shorten_middle(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters: unchanged when it fits; else without a C++
    return type and argument list, then without namespaces, then with its middle replaced by
    ``…`` (about 40 % head, 60 % tail: the tail tells kernels apart)."""
    if len(text) <= width:
        return text
    t = _ARGUMENTS.sub("", _RETURN_TYPE.sub("", text)).strip() or text
    if len(t) > width:  # namespaces next (at::native::, cutlass::, (anonymous namespace)::)
        t = _NAMESPACE.sub("", t) or t
    if len(t) <= width:
        return t
    if width <= 1:
        return "…"[:width]
    keep = width - 1
    head = max(keep * 2 // 5, 1)
    return t[:head] + "…" + t[len(t) - (keep - head):]


_NUMBER = re.compile(r"^[-+]?[\d,]*\.?\d*(?:[eE][-+]?\d+)?%?$")


def text_columns(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> set[str]:
    """The columns holding a cell that is not a number (``1,234``, ``-0.5``, ``12.3%``, empty)."""
    return {h for i, h in enumerate(headers) if any(not _NUMBER.match(str(r[i]).strip()) for r in rows)}


_HEADER_BREAK = re.compile(r"(?<=[_ ])")


def _wrap_header(header: str, width: int) -> str:
    """``header`` on lines of at most ``width`` characters, broken after ``_`` or a space."""
    lines: list[str] = []
    for part in _HEADER_BREAK.split(header):
        if lines and len(lines[-1]) + len(part) <= width:
            lines[-1] += part
        else:
            lines.append(part)
    return "\n".join(line.rstrip() for line in lines)


def fit_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    text_columns: set[str] | frozenset[str],
    width: int,
    title: str | None = None,
    caption: str | None = None,
    show_lines: bool = False,
    markup_columns: set[str] | frozenset[str] = frozenset(),
) -> Any:
    """A :class:`rich.table.Table` of ``rows`` (cells already formatted as text) that fits
    ``width`` characters when it can.

    Every column not in ``text_columns`` is right-aligned and never wraps (its width is its
    longest cell or header). When the table is wider than ``width``, their headers first wrap
    at ``_`` and spaces down to their longest cell, then the text columns share
    the width left in proportion to their longest cell (at least :data:`MIN_TEXT_WIDTH`
    each) and their cells are shortened with :func:`shorten_middle`. Cells are plain text
    (a kernel name's ``[lambda() (instance 3)]`` is no style) except in ``markup_columns``,
    short labels with rich markup such as a coloured verdict, which are left whole."""
    from rich.table import Table
    from rich.text import Text

    n = len(headers)
    labels = [str(h) for h in headers]
    marked = [h in markup_columns for h in headers]
    natural = [max([len(h)] + [_visible_len(str(r[i])) if marked[i] else len(str(r[i])) for r in rows])
               for i, h in enumerate(labels)]
    is_text = [h in text_columns for h in headers]
    overhead = 3 * n + 1  # one space of padding each side and one border per column, plus the last border
    if overhead + sum(natural) > width:
        # first, a number column's header wraps at its underscores and spaces
        # (``exposed_`` / ``comm_ms``) down to its longest cell
        for i, (h, t) in enumerate(zip(labels, is_text, strict=True)):
            if not t:
                cells = max([_visible_len(str(r[i])) if marked[i] else len(str(r[i])) for r in rows], default=0)
                labels[i] = _wrap_header(h, max(cells, max(len(p) for p in _HEADER_BREAK.split(h))))
                natural[i] = max(len(line) for line in labels[i].split("\n"))
                natural[i] = max(natural[i], cells)
    fixed = sum(w for w, t in zip(natural, is_text, strict=True) if not t)
    text_natural = [w for w, t in zip(natural, is_text, strict=True) if t]
    widths = list(natural)
    if overhead + sum(natural) > width and text_natural:
        # water-filling: a text column narrower than its fair share keeps its width, the
        # long ones share what is left (each at least MIN_TEXT_WIDTH)
        room = width - overhead - fixed
        order = sorted(range(len(text_natural)), key=lambda i: text_natural[i])
        shares = list(text_natural)
        left = len(order)
        for i in order:
            fair = max(room // left, MIN_TEXT_WIDTH) if left else MIN_TEXT_WIDTH
            shares[i] = min(text_natural[i], fair)
            room -= shares[i]
            left -= 1
        it = iter(shares)
        widths = [next(it) if t else w for w, t in zip(natural, is_text, strict=True)]
    table = Table(title=title, caption=caption, show_lines=show_lines)
    table.needed_width = overhead + sum(widths)  # type: ignore[attr-defined]
    for h, w, t in zip(labels, widths, is_text, strict=True):
        # cells are shortened here, so the text columns need no limit of rich's (whose
        # max_width counts the padding and cut them shorter still)
        table.add_column(h, justify="left" if t else "right", no_wrap=True, min_width=None if t else w, overflow="ellipsis")
    for r in rows:
        table.add_row(*(str(c) if m else Text(shorten_middle(str(c), w) if t else str(c))
                        for c, w, t, m in zip(r, widths, is_text, marked, strict=True)))
    return table


def print_table(console: Any, headers: Sequence[str], rows: Sequence[Sequence[str]], *,
                text_columns: set[str] | frozenset[str] | None = None, **options: Any) -> None:
    """:func:`fit_table` printed on ``console`` at its width, or wider when the numbers alone
    need more (lines are never cropped: a cut number is a wrong number). ``text_columns``
    defaults to :func:`text_columns` of the cells."""
    text = globals()["text_columns"](headers, rows) if text_columns is None else text_columns
    table = fit_table(headers, rows, text_columns=text, width=console.width, **options)
    width = console.width
    if table.needed_width > width:  # Console.print caps its width argument at the console's
        console.width = table.needed_width
    try:
        console.print(table, crop=False)
    finally:
        console.width = width
