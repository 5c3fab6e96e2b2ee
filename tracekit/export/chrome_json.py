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
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import polars as pl

from tracekit.export.events import ARGS, DEFAULT_METRICS, ExportModel, ExportSummary, build_model

__all__ = ["GPU_PID_BASE", "TRACK_TID_BASE", "chrome_json", "track_ids", "write_chrome_json"]

TRACK_TID_BASE = 1_000_000_000
GPU_PID_BASE = 2_000_000_000

#: argument columns of each slice category
_CAT_ARGS: dict[str, tuple[str, ...]] = {
    "kernel": ("a_family", "a_grid", "a_block", "a_registers", "a_static_smem", "a_dynamic_smem", "a_device", "a_stream",
               "a_correlation"),
    "memcpy": ("a_bytes", "a_copy_kind", "a_src_kind", "a_dst_kind", "a_device", "a_stream", "a_correlation"),
    "memset": ("a_bytes", "a_value", "a_mem_kind", "a_device", "a_stream", "a_correlation"),
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
) -> ExportSummary:
    """Write ``trace`` to ``path`` as Chrome trace-event JSON: the same timeline as
    :func:`tracekit.export.perfetto` (same options), in the older JSON format."""
    t0 = time.perf_counter()
    model = build_model(trace, window=window, ranks=ranks, metrics=metrics)
    return write_chrome_json(model, path, chunk_rows=chunk_rows, started=t0)


def track_ids(model: ExportModel) -> dict[int, tuple[int, int]]:
    """``track uuid → (pid, tid)`` as written to the JSON file."""
    by = {t.uuid: t for t in model.tracks}
    out: dict[int, tuple[int, int]] = {}
    for t in model.tracks:
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


def write_chrome_json(model: ExportModel, path: str | os.PathLike[str], *, chunk_rows: int = 50_000,
                      started: float | None = None) -> ExportSummary:
    """Write an :class:`~tracekit.export.events.ExportModel` as Chrome trace-event JSON."""
    from tracekit.export.perfetto import _summary

    t0 = time.perf_counter() if started is None else started
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            _write(model, f, max(chunk_rows, 1))
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return _summary(model, target, "chrome-json", t0)


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


def _write(model: ExportModel, f: IO[bytes], chunk_rows: int) -> None:
    ids = track_ids(model)
    by = {t.uuid: t for t in model.tracks}
    f.write(b'{"displayTimeUnit": "ns", "otherData": {"producer": "tracekit"}, "traceEvents": [\n')
    out = _Events(f)
    meta = []
    for t in model.tracks:
        pid, tid = ids[t.uuid]
        if t.parent is None:
            meta.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": t.name}})
        elif t.kind != "counter":
            meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": t.name}})
    out.lines("\n".join(json.dumps(m) for m in meta).encode())
    tmap = pl.DataFrame({"track": list(ids), "pid": [v[0] for v in ids.values()], "tid": [v[1] for v in ids.values()]},
                        schema={"track": pl.Int64, "pid": pl.Int64, "tid": pl.Int64})
    us = 1000.0
    for chunk in (c for part in model.parts for c in part.iter_slices(chunk_rows)):
        chunk = chunk.join(tmap, on="track", how="left", maintain_order="left").with_columns(pl.col(pl.Categorical).cast(pl.Utf8))
        # events in the slices' order (parents before children at one timestamp: readers keep
        # the file's order for equal times), each category with its own argument fields
        chunk = chunk.with_row_index("_i")
        pieces = []
        for cat, part in chunk.group_by("cat", maintain_order=True):
            cols = [c for c in _CAT_ARGS.get(str(cat[0]), ()) if c in part.columns]
            args = [pl.struct([pl.col(c).alias(_ARG_NAME[c]) for c in cols]).alias("args")] if cols else []
            ts = (pl.col("start_ns") / us).alias("ts")
            pieces.append(part.select("_i", pl.lit(0).alias("_k"), pl.struct(
                pl.lit("X").alias("ph"), "name", "cat", "pid", "tid", ts,
                ((pl.col("end_ns") - pl.col("start_ns")) / us).alias("dur"), *args).struct.json_encode().alias("j")))
            fo = part.filter(pl.col("flow_out").is_not_null())
            pieces.append(fo.select("_i", pl.lit(1).alias("_k"), pl.struct(
                pl.lit("s").alias("ph"), pl.lit("launch").alias("name"), pl.lit("flow").alias("cat"),
                pl.col("flow_out").cast(pl.Utf8).alias("id"), "pid", "tid", ts).struct.json_encode().alias("j")))
            fi = part.filter(pl.col("flow_in").is_not_null())
            pieces.append(fi.select("_i", pl.lit(1).alias("_k"), pl.struct(
                pl.lit("f").alias("ph"), pl.lit("e").alias("bp"), pl.lit("launch").alias("name"), pl.lit("flow").alias("cat"),
                pl.col("flow_in").cast(pl.Utf8).alias("id"), "pid", "tid", ts).struct.json_encode().alias("j")))
        lines = pl.concat(pieces).sort("_i", "_k")["j"]
        if lines.len():
            out.lines("\n".join(lines.to_list()).encode())
    for chunk in model.instants.iter_slices(chunk_rows):
        chunk = chunk.join(tmap, on="track", how="left", maintain_order="left")
        out.frame(chunk.select(pl.lit("i").alias("ph"), pl.lit("t").alias("s"), "name", "cat", "pid", "tid",
                               (pl.col("ts_ns") / us).alias("ts"), pl.struct(pl.col("a_domain").alias("domain")).alias("args")))
    names = pl.DataFrame({"track": [t.uuid for t in model.tracks],
                          "cname": [t.name + (f" [{t.unit}]" if t.unit and t.unit not in t.name else "") for t in model.tracks]},
                         schema={"track": pl.Int64, "cname": pl.Utf8})
    for chunk in model.counters.iter_slices(chunk_rows * 2):
        chunk = chunk.join(tmap, on="track", how="left", maintain_order="left").join(names, on="track", how="left",
                                                                                    maintain_order="left")
        out.frame(chunk.select(pl.lit("C").alias("ph"), pl.col("cname").alias("name"), "pid",
                               (pl.col("ts_ns") / us).alias("ts"), pl.struct(pl.col("value")).alias("args")))
    del by
    f.write(b"\n]}\n")
