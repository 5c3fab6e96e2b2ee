"""What every chart module shares: the selection names, the family colour scale, titles with
the window as subtitle, the one-line message of a view without data, the row budget."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import polars as pl

from tracekit.viz._deps import import_altair
from tracekit.viz.notes import hint, message_chart
from tracekit.viz.theme import family_scale, register_themes
from tracekit.viz.window import window_label

KERNEL_PARAM = "kernel"
WINDOW_PARAM = "window"


def _alt() -> Any:
    alt = import_altair()
    register_themes()
    return alt


def _short(column: str, limit: int = 48) -> pl.Expr:
    c = pl.col(column).cast(pl.Utf8).fill_null("?")
    return pl.when(c.str.len_chars() > limit).then(c.str.slice(0, limit - 1) + "…").otherwise(c)


def _ms(column: str, origin: int) -> pl.Expr:
    return ((pl.col(column) - origin).cast(pl.Float64) / 1e6).round(6)


def _family_color(alt: Any, frame: pl.DataFrame, field: str = "family", *, legend: bool = True, **options: Any) -> Any:
    """Colour by kernel family on the fixed scale of :func:`~tracekit.viz.theme.family_scale`
    (the same colour for a family in every chart); the legend lists the families present."""
    present = sorted(set(frame[field].drop_nulls().to_list())) if field in frame.columns else []
    scale = family_scale(present)
    shown = [n for n in scale["domain"] if n in present]
    return alt.Color(
        f"{field}:N",
        scale=alt.Scale(domain=scale["domain"], range=scale["range"]),
        title="family",
        legend=alt.Legend(values=shown, **options) if legend and shown else None,
    )


def _lines(text: str, width: int = 48) -> list[str]:
    """``text`` cut into lines of about ``width`` characters at spaces (a subtitle fits a
    one-column figure)."""
    words, lines, line = text.split(" "), [], ""
    for word in words:
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return [*lines, line] if line else lines


def _titled(chart: Any, title: str | None, subtitle: str | None = None) -> Any:
    """``chart`` with ``title`` and, below it, ``subtitle`` (the window the chart shows)."""
    if subtitle:
        alt = _alt()
        return chart.properties(title=alt.TitleParams(title or "", subtitle=_lines(subtitle)))
    return chart.properties(title=title) if title else chart


def _bounds(window: Any) -> tuple[int, int] | None:
    return None if window is None else (int(window[0]), int(window[1]))


def _in_window(frame: pl.DataFrame | None, window: Any) -> pl.DataFrame | None:
    """The rows of ``frame`` overlapping ``window`` (kept whole)."""
    w = _bounds(window)
    if frame is None or w is None or frame.is_empty() or "start_ns" not in frame.columns:
        return frame
    end = pl.col("end_ns").fill_null(pl.col("start_ns")) if "end_ns" in frame.columns else pl.col("start_ns")
    return frame.filter((end >= w[0]) & (pl.col("start_ns") < w[1]))


def _nothing(what: str, window: Any, title: str | None) -> Any:
    """The message chart of a view with no data: ``what`` (a hint key or a sentence), in the
    window when one is given."""
    label = window_label(window)
    text = hint(what)
    return message_chart(f"{text} — {label}" if label and what not in ("kernels", "gpu_metrics") else text, title=title)


#: Most rows a binned series chart embeds: altair refuses a dataset of more than 5,000 rows
#: (MaxRowsError) when the chart is drawn or saved.
ROW_BUDGET = 4500


def within_row_budget(make: Callable[[int], pl.DataFrame], max_points: int) -> pl.DataFrame:
    """``make(max_points)`` (a binned series, ``max_points`` per series), with fewer points per
    series when all series together pass
    :data:`ROW_BUDGET` (``max_points`` is per series: 3 metrics on each of 4 GPUs at 600 points
    each were 7,200 rows, and the chart raised MaxRowsError)."""
    series = make(max_points)
    while series.height > ROW_BUDGET and max_points > 10:
        max_points = max(int(max_points * ROW_BUDGET / series.height * 0.95), 10)
        series = make(max_points)
    return series


# -- kernels -------------------------------------------------------------------------------------
def _kernel_pick(alt: Any, highlight: str | None, field: str = "name") -> Any:
    value = [{field: highlight}] if highlight else alt.Undefined
    return alt.selection_point(
        name=KERNEL_PARAM, fields=[field], on="click", clear="dblclick", value=value
    )


