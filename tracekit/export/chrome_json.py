"""Write a trace's timeline (:mod:`tracekit.export.events`) as Chrome trace-event JSON
(``{"traceEvents": [...]}``, read by chrome://tracing, ui.perfetto.dev and speedscope).

Complete events (``ph: "X"``) for slices, ``s``/``f`` pairs for launch flows, ``i`` for NVTX
marks, ``C`` for counters and ``M`` for process and thread names. Times are microseconds with
nanosecond decimals. Tracks that are not CPU threads (GPU streams, NCCL calls, …) get
synthetic thread ids (``TRACK_TID_BASE + track``) under their process; GPU-metric counters a
synthetic process per GPU (``GPU_PID_BASE + track``).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import time
from collections.abc import Sequence
from typing import IO, Any

import numpy as np
import polars as pl

from tracekit.export.events import (
    ARGS,
    DEFAULT_METRICS,
    SLICE_ROWS,
    ExportModel,
    ExportSummary,
    Timeline,
    Track,
    stream_model,
)

__all__ = ["GPU_PID_BASE", "TRACK_TID_BASE", "chrome_json", "track_ids", "write_chrome_json"]

TRACK_TID_BASE = 1_000_000_000
GPU_PID_BASE = 2_000_000_000

#: argument columns of each slice category
_CAT_ARGS: dict[str, tuple[str, ...]] = {
    "kernel": ("a_family", "a_grid", "a_block", "a_registers", "a_static_smem", "a_dynamic_smem", "a_device", "a_stream",
               "a_correlation"),
    "memcpy": ("a_bytes", "a_copy_kind", "a_src_kind", "a_dst_kind", "a_device", "a_stream", "a_correlation"),
    "memset": ("a_bytes", "a_value", "a_mem_kind", "a_device", "a_stream", "a_correlation"),
    "graph": ("a_graph_id", "a_graph_exec", "a_kernel_count", "a_gpu_time", "a_device", "a_stream", "a_correlation"),
    "cuda_api": ("a_correlation", "a_return"),
    "nvtx": ("a_domain",),
    "nccl": ("a_op", "a_bytes", "a_peer", "a_root", "a_comm", "a_comm_rank", "a_comm_nranks", "a_dtype", "a_reduction",
             "a_algorithm", "a_protocol", "a_kernel_count", "a_gpu_duration"),
}
_ARG_NAME = {c: n for c, n, _ in ARGS}


def chrome_json(
    trace: Any,
    path: str | os.PathLike[str],
    *,
    window: tuple[int, int] | str | None = None,
    ranks: Sequence[int] | None = None,
    metrics: Sequence[str] | str = DEFAULT_METRICS,
    chunk_rows: int = 50_000,
    slice_rows: int = SLICE_ROWS,
) -> ExportSummary:
    """Write ``trace`` to ``path`` as Chrome trace-event JSON: the same timeline as
    :func:`tracekit.export.perfetto` (same options), in the older JSON format, streamed the
    same way (the process and thread names, known at the end, are written first)."""
    t0 = time.perf_counter()
    timeline = stream_model(trace, window=window, ranks=ranks, metrics=metrics, slice_rows=slice_rows)
    return write_chrome_json(timeline, path, chunk_rows=chunk_rows, started=t0)


def track_ids(model: ExportModel | Timeline | list[Track]) -> dict[int, tuple[int, int]]:
    """``track uuid → (pid, tid)`` as written to the JSON file."""
    tracks = model if isinstance(model, list) else model.tracks
    by = {t.uuid: t for t in tracks}
    out: dict[int, tuple[int, int]] = {}
    for t in tracks:
        root = t
        while root.parent is not None:
            root = by[root.parent]
        if t.kind == "thread":
            out[t.uuid] = (int(t.pid or 0), int(t.tid or 0))
        elif root.kind == "process":
            out[t.uuid] = (int(root.pid or 0), 0 if t is root else TRACK_TID_BASE + t.uuid)
        else:
            out[t.uuid] = (GPU_PID_BASE + root.uuid, 0 if t is root else TRACK_TID_BASE + t.uuid)
    return out


def write_chrome_json(model: ExportModel | Timeline, path: str | os.PathLike[str], *, chunk_rows: int = 50_000,
                      started: float | None = None) -> ExportSummary:
    """Write an :class:`~tracekit.export.events.ExportModel` (or a streamed
    :class:`~tracekit.export.events.Timeline`) as Chrome trace-event JSON."""
    from tracekit.export.perfetto import _Counts, _write_atomically, as_timeline

    t0 = time.perf_counter() if started is None else started
    timeline = as_timeline(model)
    counts = _Counts()
    target = _write_atomically(path, lambda f, body: _write(timeline, f, body, max(chunk_rows, 1), counts))
    return counts.summary(timeline, target, "chrome-json", t0)


class _Events:
    def __init__(self, f: IO[bytes]) -> None:
        self.f = f
        self.first = True

    def lines(self, data: bytes) -> None:
        data = data.strip()
        if not data:
            return
        self.f.write(b"" if self.first else b",\n")
        self.f.write(data.replace(b"\n", b",\n"))
        self.first = False

    def frame(self, frame: pl.DataFrame) -> None:
        if frame.height:
            buf = io.BytesIO()
            frame.write_ndjson(buf)
            self.lines(buf.getvalue())


def _write(timeline: Timeline, f: IO[bytes], body: IO[bytes], chunk_rows: int, counts: Any) -> None:
    out = _Events(body)
    known = -1
    tmap = names = pl.DataFrame()
    for kind, frame in timeline.events:
        if len(timeline.tracks) != known:  # tracks added: overlap or counter tracks
            known = len(timeline.tracks)
            ids = track_ids(timeline.tracks)
            tmap = pl.DataFrame({"track": list(ids), "pid": [v[0] for v in ids.values()], "tid": [v[1] for v in ids.values()]},
                                schema={"track": pl.Int64, "pid": pl.Int64, "tid": pl.Int64})
            names = pl.DataFrame({"track": [t.uuid for t in timeline.tracks],
                                  "cname": [t.name + (f" [{t.unit}]" if t.unit and t.unit not in t.name else "")
                                            for t in timeline.tracks]}, schema={"track": pl.Int64, "cname": pl.Utf8})
        if kind == "slices":
            counts.slices(frame)
            _slices(frame, out, tmap, chunk_rows)
        elif kind == "instants":
            counts.instants += frame.height
            for chunk in frame.iter_slices(chunk_rows):
                chunk = chunk.join(tmap, on="track", how="left", maintain_order="left").with_columns(_us(chunk["ts_ns"], "_ts"))
                out.frame(chunk.select(pl.lit("i").alias("ph"), pl.lit("t").alias("s"), "name", "cat", "pid", "tid",
                                       pl.col("_ts").alias("ts"),
                                       pl.struct(pl.col("a_domain").alias("domain")).alias("args")))
        elif kind == "counters":
            counts.counters += frame.height
            for chunk in frame.iter_slices(chunk_rows * 2):
                chunk = chunk.join(tmap, on="track", how="left", maintain_order="left").join(
                    names, on="track", how="left", maintain_order="left").with_columns(_us(chunk["ts_ns"], "_ts"))
                out.frame(chunk.select(pl.lit("C").alias("ph"), pl.col("cname").alias("name"), "pid",
                                       pl.col("_ts").alias("ts"), pl.struct(pl.col("value")).alias("args")))
    # the head: process and thread names of every track, then the events
    ids = track_ids(timeline.tracks)
    f.write(b'{"displayTimeUnit": "ns", "otherData": {"producer": "tracekit"}, "traceEvents": [\n')
    head = _Events(f)
    meta = []
    for t in timeline.tracks:
        pid, tid = ids[t.uuid]
        if t.parent is None:
            meta.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": t.name}})
        elif t.kind != "counter":
            meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": t.name}})
    head.lines("\n".join(json.dumps(m) for m in meta).encode())
    if not out.first:
        if not head.first:
            f.write(b",\n")
        body.seek(0)
        shutil.copyfileobj(body, f, 1 << 20)
    f.write(b"\n]}\n")


def _slices(part: pl.DataFrame, out: _Events, tmap: pl.DataFrame, chunk_rows: int) -> None:
    for chunk in part.iter_slices(chunk_rows):
        chunk = chunk.join(tmap, on="track", how="left", maintain_order="left").with_columns(pl.col(pl.Categorical).cast(pl.Utf8))
        # events in the slices' order (parents before children at one timestamp: readers keep
        # the file's order for equal times), each category with its own argument fields
        chunk = chunk.with_row_index("_i").with_columns(
            _us(chunk["start_ns"], "_ts"), _us(chunk["end_ns"] - chunk["start_ns"], "_dur"))
        pieces = []
        for cat, rows in chunk.group_by("cat", maintain_order=True):
            cols = [c for c in _CAT_ARGS.get(str(cat[0]), ()) if c in rows.columns]
            args = [pl.struct([pl.col(c).alias(_ARG_NAME[c]) for c in cols]).alias("args")] if cols else []
            ts = pl.col("_ts").alias("ts")
            pieces.append(rows.select("_i", pl.lit(0).alias("_k"), pl.struct(
                pl.lit("X").alias("ph"), "name", "cat", "pid", "tid", ts,
                pl.col("_dur").alias("dur"), *args).struct.json_encode().alias("j")))
            fo = rows.filter(pl.col("flow_out").is_not_null())
            pieces.append(fo.select("_i", pl.lit(1).alias("_k"), pl.struct(
                pl.lit("s").alias("ph"), pl.lit("launch").alias("name"), pl.lit("flow").alias("cat"),
                pl.col("flow_out").cast(pl.Utf8).alias("id"), "pid", "tid", ts).struct.json_encode().alias("j")))
            fi = rows.filter(pl.col("flow_in").is_not_null())
            pieces.append(fi.select("_i", pl.lit(1).alias("_k"), pl.struct(
                pl.lit("f").alias("ph"), pl.lit("e").alias("bp"), pl.lit("launch").alias("name"), pl.lit("flow").alias("cat"),
                pl.col("flow_in").cast(pl.Utf8).alias("id"), "pid", "tid", ts).struct.json_encode().alias("j")))
        lines = pl.concat(pieces).sort("_i", "_k")["j"]
        if lines.len():
            out.lines("\n".join(lines.to_list()).encode())


def _us(ns: pl.Series, name: str) -> pl.Series:
    """Nanoseconds as microseconds, each the float nearest to ``ns / 1000`` (numpy's division;
    polars multiplies by 0.001, which is one ulp off for some values: 91827.15000000001)."""
    values = ns.to_numpy().astype(np.float64) / 1000.0
    return pl.Series(name, values, dtype=pl.Float64).set(ns.is_null(), None) if ns.null_count() else pl.Series(
        name, values, dtype=pl.Float64)
