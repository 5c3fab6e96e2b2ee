"""What the data preparation modules share: kernel families, the name column, the span of
frames, the name of a CUDA graph replay."""

from __future__ import annotations

import polars as pl

from tracekit.viz.prep_series import Window


def _with_family(frame: pl.DataFrame, name_column: str = "name") -> pl.DataFrame:
    if "family" in frame.columns:
        return frame
    from tracekit.taxonomy import classify

    return classify(frame, name_column=name_column)


def _name_column(frame: pl.DataFrame, preferred: str) -> str:
    if preferred in frame.columns:
        return preferred
    for candidate in ("short_name", "name", "kernel"):
        if candidate in frame.columns:
            return candidate
    msg = f"the frame has no kernel name column ({preferred!r}, 'short_name' or 'name')"
    raise ValueError(msg)


def _i64(value: int) -> pl.Expr:
    return pl.lit(value, dtype=pl.Int64)


def graph_names(graphs: pl.DataFrame) -> pl.Expr:
    """``[CUDA graph <graph_id>]``: the name a graph launch traced whole has in every view
    (:data:`tracekit.analysis._frames.GRAPH_OP_NAME`)."""
    from tracekit.analysis._frames import GRAPH_OP_NAME

    if "graph_id" not in graphs.columns:
        return pl.lit("[CUDA graph]")
    return pl.when(pl.col("graph_id").is_not_null()).then(pl.format(GRAPH_OP_NAME, pl.col("graph_id"))).otherwise(
        pl.lit("[CUDA graph]"))


def data_window(*frames: pl.DataFrame | None) -> Window | None:
    """``(first start_ns, last end_ns)`` over the frames that have rows (``None`` if none has)."""
    lo: int | None = None
    hi: int | None = None
    for frame in frames:
        if frame is None or frame.is_empty() or "start_ns" not in frame.columns:
            continue
        s = frame["start_ns"].min()
        e = frame["end_ns"].max() if "end_ns" in frame.columns else frame["start_ns"].max()
        if s is not None:
            lo = int(s) if lo is None else min(lo, int(s))  # type: ignore[arg-type]
        if e is not None:
            hi = int(e) if hi is None else max(hi, int(e))  # type: ignore[arg-type]
    if lo is None or hi is None:
        return None
    return (lo, max(hi, lo + 1))


