"""Read a written Perfetto trace back (with the ``perfetto`` package's protobuf classes): what
each track holds, to check an export against the trace it came from."""

from __future__ import annotations

import os
from typing import Any

import polars as pl

__all__ = ["kernel_tracks", "perfetto_slices", "slice_arguments"]

#: An overlap track's suffix: slices that overlap on one stream go to sibling tracks.
OVERLAP_SUFFIX = r" \(overlap \d+\)$"


def perfetto_slices(path: str | os.PathLike[str]) -> pl.DataFrame:
    """One row per slice written to a Perfetto trace: ``track`` (the track's name),
    ``category`` (``kernel``, ``memcpy``, ``cuda_api``, ``nvtx``, ``nccl`` …) and ``ts_ns``."""
    from tracekit.export.perfetto import _builder

    _builder()  # the one-line error naming the extra when perfetto is missing
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent

    pb = Trace()
    with open(path, "rb") as f:
        pb.ParseFromString(f.read())
    tracks: dict[int, str] = {}
    cats: dict[int, str] = {}
    rows: list[tuple[str, str, int]] = []
    for p in pb.packet:
        if p.HasField("track_descriptor"):
            tracks[p.track_descriptor.uuid] = p.track_descriptor.name
        for c in p.interned_data.event_categories:
            cats[c.iid] = c.name
    for p in pb.packet:
        if p.HasField("track_event") and p.track_event.type == TrackEvent.TYPE_SLICE_BEGIN:
            e = p.track_event
            cat = cats.get(e.category_iids[0], "") if e.category_iids else ""
            rows.append((tracks.get(e.track_uuid, ""), cat, int(p.timestamp)))
    return pl.DataFrame(rows, schema={"track": pl.Utf8, "category": pl.Utf8, "ts_ns": pl.Int64}, orient="row")


def kernel_tracks(trace: Any, path: str | os.PathLike[str], window: tuple[int, int] | None = None) -> pl.DataFrame:
    """The kernels written on each GPU stream's tracks of the Perfetto trace ``path`` beside the
    kernels of that stream in ``trace`` overlapping ``window`` (the export keeps slices that
    overlap it whole): ``track`` (``GPU d · stream s``, its ``(overlap k)`` tracks counted
    with it), ``kernels_written``, ``kernels_in_window``, ``equal``. Empty (same columns) when
    neither has kernels."""
    slices = perfetto_slices(path).filter(pl.col("category") == "kernel")
    written = slices.group_by(pl.col("track").str.replace(OVERLAP_SUFFIX, "").alias("track")).agg(
        pl.len().cast(pl.Int64).alias("kernels_written"))
    k = trace.kernels
    if window is not None:
        lo, hi = window
        k = k.filter((pl.col("start_ns") < hi) & (pl.col("end_ns") > lo))
    # tracks of the same stream name in several processes (ranks) are counted together
    expected = k.group_by("device_id", "stream_id").len().select(
        pl.concat_str([pl.lit("GPU "), pl.col("device_id").cast(pl.Utf8), pl.lit(" · stream "),
                       pl.col("stream_id").cast(pl.Utf8)]).alias("track"),
        pl.col("len").cast(pl.Int64).alias("kernels_in_window"))
    out = written.join(expected, on="track", how="full", coalesce=True).with_columns(
        pl.col("kernels_written").fill_null(0), pl.col("kernels_in_window").fill_null(0))
    return out.with_columns((pl.col("kernels_written") == pl.col("kernels_in_window")).alias("equal")).sort("track")



def slice_arguments(path: str | os.PathLike[str], category: str = "nccl", *, n: int = 5) -> pl.DataFrame:
    """The arguments (debug annotations) of the first ``n`` slices of ``category`` in a
    Perfetto trace, one row per slice, one column per argument name (strings and integers as
    written); empty when the trace has no such slice."""
    from tracekit.export.perfetto import _builder

    _builder()
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent

    pb = Trace()
    with open(path, "rb") as f:
        pb.ParseFromString(f.read())
    cats: dict[int, str] = {}
    names: dict[int, str] = {}
    strings: dict[int, str] = {}
    for p in pb.packet:
        for c in p.interned_data.event_categories:
            cats[c.iid] = c.name
        for a in p.interned_data.debug_annotation_names:
            names[a.iid] = a.name
        for v in p.interned_data.debug_annotation_string_values:
            strings[v.iid] = v.str.decode()
    rows: list[dict[str, Any]] = []
    for p in pb.packet:
        if len(rows) >= n:
            break
        e = p.track_event
        if not p.HasField("track_event") or e.type != TrackEvent.TYPE_SLICE_BEGIN or not e.category_iids:
            continue
        if cats.get(e.category_iids[0]) != category:
            continue
        rows.append({names.get(a.name_iid, str(a.name_iid)): strings.get(a.string_value_iid)
                     if a.HasField("string_value_iid") else a.int_value for a in e.debug_annotations})
    if not rows:
        return pl.DataFrame()
    return pl.DataFrame(rows, infer_schema_length=None)
