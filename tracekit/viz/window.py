"""The time window a view shows, and the words that say which one it is.

Every chart, number and export of the notebooks and widgets reads one window: by default the
run's steady iterations (:func:`tracekit.structure`: no start-up, warm-up or tear-down), the
whole trace one click away. :class:`ViewWindow` carries the bounds and its label
(``steady window: 10 steps of 42.6 ms (426 ms)``), which the charts put in their subtitle.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import polars as pl

#: What a steady iteration is called, per kind of run (:attr:`RunStructure.kind`).
ITERATION_NOUNS = {"training": "steps", "microbenchmark": "repetitions", "generation": "steps",
                   "serving": "engine steps"}  # fmt: skip
WINDOW_KINDS = ("steady", "whole", "selected")


def fmt_span(ns: float | None) -> str:
    """A duration in the unit that reads best (``812 ns``, ``3.4 µs``, ``42.6 ms``, ``21.42 s``)."""
    if ns is None:
        return "?"
    ns = float(ns)
    if abs(ns) >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if abs(ns) >= 1e6:
        return f"{ns / 1e6:.1f} ms"
    if abs(ns) >= 1e3:
        return f"{ns / 1e3:.1f} µs"
    return f"{ns:.0f} ns"


@dataclass(frozen=True)
class ViewWindow:
    """A time window of the capture (``start_ns``…``end_ns``, ns on the capture's clock).

    ``kind`` is ``steady`` (the run's steady iterations), ``whole`` (the whole trace) or
    ``selected`` (a window picked by hand); ``detail`` says what is in it (``10 steps of
    42.6 ms``) or, for a whole-trace window that stands in for a steady one, why there is no
    steady window. It unpacks like a tuple: ``lo, hi = window``.
    """

    start_ns: int
    end_ns: int
    kind: str = "selected"
    detail: str = ""

    def __post_init__(self) -> None:
        if self.kind not in WINDOW_KINDS:
            msg = f"window kind must be one of {', '.join(WINDOW_KINDS)}, not {self.kind!r}"
            raise ValueError(msg)
        if self.end_ns <= self.start_ns:
            object.__setattr__(self, "end_ns", self.start_ns + 1)

    def __iter__(self) -> Iterator[int]:
        return iter((self.start_ns, self.end_ns))

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> int:
        return (self.start_ns, self.end_ns)[i]

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def bounds(self) -> tuple[int, int]:
        return (self.start_ns, self.end_ns)

    def label(self) -> str:
        """``steady window: 10 steps of 42.6 ms (426.0 ms)``, ``whole trace (42.35 s)``,
        ``selected window (12.3 ms)``; a whole trace standing in for a missing steady window
        says why (``whole trace (8.58 s; no steady iterations: the capture holds no kernels)``)."""
        span = fmt_span(self.duration_ns)
        if self.kind == "steady":
            return f"steady window: {self.detail} ({span})" if self.detail else f"steady window ({span})"
        if self.kind == "whole":
            return f"whole trace ({span}; {self.detail})" if self.detail else f"whole trace ({span})"
        return f"selected window ({span})"

    def filter(self, frame: pl.DataFrame, start: str = "start_ns", end: str = "end_ns") -> pl.DataFrame:
        """The rows of ``frame`` that overlap the window (kept whole); rows without an end
        count as instants at their start."""
        if frame.is_empty() or start not in frame.columns:
            return frame
        stop = pl.col(end).fill_null(pl.col(start)) if end in frame.columns else pl.col(start)
        return frame.filter((stop >= self.start_ns) & (pl.col(start) < self.end_ns))

    def selected(self, lo: int, hi: int) -> ViewWindow:
        """A hand-picked window ``lo``…``hi``."""
        return ViewWindow(int(lo), int(hi), "selected")


def _structure(trace: Any, structure: Any) -> Any:
    if structure is not None:
        return structure
    from tracekit.diagnosis import structure as find

    return find(trace)


def trace_extent(trace: Any) -> tuple[int, int] | None:
    """First start to last end of the GPU work (kernels, copies, memsets, CUDA graph replays
    traced whole), or ``None`` when the trace has none."""
    from tracekit.analysis.graphs import graph_trace_of, whole_graphs
    from tracekit.viz.prep import data_window

    frames = [getattr(trace, name, None) for name in ("kernels", "memcpys", "memsets")]
    frames.append(whole_graphs(graph_trace_of(trace)))
    return data_window(*[f for f in frames if isinstance(f, pl.DataFrame)])


def whole_window(trace: Any, *, structure: Any = None, detail: str = "") -> ViewWindow:
    """The whole trace: its GPU work's extent, else the capture's (from the run structure)."""
    extent = trace_extent(trace)
    if extent is None:
        try:
            s = _structure(trace, structure)
            extent = (int(s.trace_start_ns), int(s.trace_end_ns))
        except Exception:  # a trace object without a structure: an empty window at 0
            extent = (0, 1)
    return ViewWindow(extent[0], extent[1], "whole", detail)


def steady_window(trace: Any, *, structure: Any = None) -> ViewWindow:
    """The run's steady iterations (:func:`tracekit.structure`), or the whole trace with the
    reason when the run has none (no kernels, one iteration, no repeating sequence)."""
    try:
        s = _structure(trace, structure)
    except Exception as exc:  # the structure could not be read: show everything, say why
        from tracekit.errors import one_line

        return whole_window(trace, detail=f"no run structure: {one_line(str(exc), 120)}")
    if not s.total or not s.steps or s.end_ns <= s.start_ns:
        return whole_window(trace, structure=s, detail=f"no steady iterations: {s.reason}")
    noun = ITERATION_NOUNS.get(s.kind, "iterations")
    detail = f"{s.steps} {noun} of {fmt_span(s.step_ns)}" if s.step_ns else f"{s.steps} {noun}"
    if s.ranks > 1:
        detail += f" on {s.ranks} ranks"
    return ViewWindow(int(s.start_ns), int(s.end_ns), "steady", detail)


def view_window(trace: Any, which: Any = "steady", *, structure: Any = None) -> ViewWindow:
    """``which``: ``"steady"`` (default), ``"whole"``, a ``(start_ns, end_ns)`` pair or a
    :class:`ViewWindow` (returned as it is)."""
    if isinstance(which, ViewWindow):
        return which
    if which is None or which == "whole":
        return whole_window(trace, structure=structure)
    if which == "steady":
        return steady_window(trace, structure=structure)
    if isinstance(which, tuple | list) and len(which) == 2:
        return ViewWindow(int(which[0]), int(which[1]), "selected")
    msg = f"window must be 'steady', 'whole' or (start_ns, end_ns), not {which!r}"
    raise ValueError(msg)


def window_label(window: Any) -> str | None:
    """The label of a :class:`ViewWindow`; ``selected window (…)`` for a plain pair; ``None``
    for no window."""
    if window is None:
        return None
    if isinstance(window, ViewWindow):
        return window.label()
    lo, hi = window
    return ViewWindow(int(lo), int(hi), "selected").label()
