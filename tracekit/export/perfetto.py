"""Write a trace's timeline (:mod:`tracekit.export.events`) as a Perfetto protobuf trace with
the ``perfetto`` package's trace builder (TrackEvent packets), streamed to disk in chunks.

Every packet is on one sequence; names, categories, argument names and repeated argument
strings are interned (``InternedData``), emitted in the chunk that first uses them. The events
are encoded as the timeline is built, time slice by time slice, into a temporary body file; the
first packet and the track descriptors (known only once every overlap and counter track is
found) are then written to the output's temporary file, the body appended, and the file renamed.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from tracekit.errors import missing_extra
from tracekit.export.events import (
    ARGS,
    CATEGORIES,
    DEFAULT_METRICS,
    SLICE_ROWS,
    ExportModel,
    ExportSummary,
    Timeline,
    stream_model,
)

__all__ = ["SEQUENCE_ID", "perfetto", "write_perfetto"]

#: ``trusted_packet_sequence_id`` of every packet tracekit writes.
SEQUENCE_ID = 7
_CLEARED = 1  # TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
_NEEDS = 2  # TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
_BEGIN, _END, _INSTANT, _COUNTER = 1, 2, 3, 4
_UNIT_BYTES = 3  # CounterDescriptor.UNIT_SIZE_BYTES


def _builder() -> Any:
    try:
        from perfetto.trace_builder.proto_builder import TraceProtoBuilder
    except ImportError:
        raise missing_extra("perfetto", "export") from None
    return TraceProtoBuilder


def perfetto(
    trace: Any,
    path: str | os.PathLike[str],
    *,
    window: tuple[int, int] | str | None = None,
    ranks: Sequence[int] | None = None,
    metrics: Sequence[str] | str = DEFAULT_METRICS,
    chunk_rows: int = 20_000,
    slice_rows: int = SLICE_ROWS,
) -> ExportSummary:
    """Write ``trace`` (an ``NsysTrace`` from :func:`tracekit.open`, or a ``TraceSet`` from
    :func:`tracekit.open_many`) to ``path`` as a Perfetto protobuf trace (open it in
    https://ui.perfetto.dev or with ``perfetto.trace_processor``).

    One process per rank/process, one track per GPU stream (kernels, memcpys, memsets with
    name, family, grid/block, bytes; CUDA graph replays traced whole, ``[CUDA graph N]``), a
    ``GPU d · CUDA graph replays`` track for graphs traced per node (:mod:`tracekit.export.graphs`),
    CPU threads with CUDA API calls and NVTX ranges nested, a flow from each launch call to its
    GPU operation, counters for device memory in use and
    GPU metrics, NCCL calls with op, bytes and peer (docs/export.md lists every field).

    ``window`` (``(start_ns, end_ns)``, ``"START:END"`` or ``"steady"``), ``ranks`` and
    ``metrics`` restrict what is written (:func:`tracekit.export.events.build_model`). The
    file is written under a temporary name and renamed. The timeline is built and written in
    time slices of at most ``slice_rows`` rows of each large table
    (:func:`~tracekit.export.events.stream_model`), ``chunk_rows`` slices encoded at a time, so
    memory grows with neither the trace nor the output.

    Returns an :class:`~tracekit.export.events.ExportSummary` (counts written, bytes, seconds).
    """
    _builder()  # fail before the tables are read when the package is missing
    t0 = time.perf_counter()
    timeline = stream_model(trace, window=window, ranks=ranks, metrics=metrics, slice_rows=slice_rows)
    return write_perfetto(timeline, path, chunk_rows=chunk_rows, started=t0)


class _Interner:
    """Interned strings of one kind: text → iid, and the ones not yet written."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.new: list[tuple[int, str]] = []

    def add(self, values: Sequence[str | None]) -> None:
        for v in values:
            if v is not None and v not in self.ids:
                iid = len(self.ids) + 1
                self.ids[v] = iid
                self.new.append((iid, v))

    def take(self) -> list[tuple[int, str]]:
        out, self.new = self.new, []
        return out


def write_perfetto(model: ExportModel | Timeline, path: str | os.PathLike[str], *, chunk_rows: int = 20_000,
                   started: float | None = None) -> ExportSummary:
    """Write an :class:`~tracekit.export.events.ExportModel` (or a streamed
    :class:`~tracekit.export.events.Timeline`) as a Perfetto protobuf trace."""
    builder_cls = _builder()
    t0 = time.perf_counter() if started is None else started
    timeline = as_timeline(model)
    counts = _Counts()
    target = _write_atomically(path, lambda f, body: _write(timeline, f, body, builder_cls, max(chunk_rows, 1), counts))
    return counts.summary(timeline, target, "perfetto", t0)


def as_timeline(model: ExportModel | Timeline) -> Timeline:
    """A built :class:`ExportModel` as the :class:`Timeline` the writers read (one family per part)."""
    if isinstance(model, Timeline):
        return model

    def events() -> Any:
        for part in model.parts:
            yield "slices", part
            yield "family", part.head(0)
        if model.instants.height:
            yield "instants", model.instants
        if model.counters.height:
            yield "counters", model.counters

    return Timeline(model.tracks, events(), model.window, model.window_source, model.skipped, model.notes)


def _write_atomically(path: str | os.PathLike[str], write: Any) -> Path:
    """Run ``write(file, body)`` on a temporary file beside ``path`` (and a temporary body
    file, appended by ``write`` when the head is written), then rename it to ``path``."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    body_path = target.with_name(f".{target.name}.{os.getpid()}.body.tmp")
    try:
        with open(body_path, "w+b") as body, open(tmp, "wb") as f:
            write(f, body)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        body_path.unlink(missing_ok=True)
    return target


class _Counts:
    """What was written, counted as it is written."""

    def __init__(self) -> None:
        self.by_cat: dict[str, int] = {}
        self.flows = 0
        self.instants = 0
        self.counters = 0

    def slices(self, part: Any) -> None:
        for cat, n in part.group_by("cat").len().iter_rows():
            self.by_cat[str(cat)] = self.by_cat.get(str(cat), 0) + n
        self.flows += int(part["flow_out"].is_not_null().sum())

    def summary(self, timeline: Timeline, target: Path, fmt: str, t0: float) -> ExportSummary:
        return ExportSummary(
            path=str(target), format=fmt, bytes=target.stat().st_size, tracks=len(timeline.tracks),
            slices={c: int(self.by_cat.get(c, 0)) for c in CATEGORIES}, flows=int(self.flows),
            instants=self.instants, counter_samples=self.counters, window=timeline.window,
            window_source=timeline.window_source, skipped=dict(timeline.skipped), seconds=time.perf_counter() - t0,
            notes=list(timeline.notes),
        )


def _write(timeline: Timeline, f: IO[bytes], body: IO[bytes], builder_cls: Any, chunk_rows: int, counts: _Counts) -> None:
    names, cats, arg_names, arg_strings = _Interner(), _Interner(), _Interner(), _Interner()
    cats.add(list(CATEGORIES))
    arg_names.add([name for _, name, _ in ARGS])
    first = builder_cls()  # the first packet: clears the sequence's state, interns the fixed strings
    p = first.add_packet()
    p.trusted_packet_sequence_id = SEQUENCE_ID
    p.sequence_flags = _CLEARED
    p.first_packet_on_sequence = True
    p.incremental_state_cleared = True
    _interned(p, names, cats, arg_names, arg_strings)

    kinds = {c: (name, kind) for c, name, kind in ARGS}
    # -- slices: BEGIN/END pairs in nesting order, per track (a track's open slices carried
    # from one time slice to the next, closed at the end of its family)
    b = builder_cls()
    stacks: dict[int, list[int]] = {}
    units: dict[int, str | None] | None = None
    for kind, part in timeline.events:
        if kind == "family":
            for track, open_ends in stacks.items():
                while open_ends:
                    _end(b, open_ends.pop(), track)
            stacks = {}
            body.write(b.serialize())
            b = builder_cls()
            continue
        if kind == "instants":
            counts.instants += part.height
            b = _instants(part, body, b, builder_cls, chunk_rows, names, cats, arg_names, arg_strings)
            continue
        if kind == "counters":
            if units is None:
                units = {}
            counts.counters += part.height
            units.update({t.uuid: t.unit for t in timeline.tracks if t.kind == "counter"})
            b = _counter_packets(part, body, b, builder_cls, chunk_rows, units)
            continue
        counts.slices(part)
        args = [(i, c) for i, c in enumerate(part.columns) if c in kinds]
        str_args = [c for _, c in args if kinds[c][1] == "str"]
        cur = None
        stack: list[int] = []
        for chunk in part.iter_slices(chunk_rows):
            # interned in order of first use: the same bytes from one run to the next (the
            # hash order of unique() varies for categorical names, as a big export's are)
            names.add(chunk["name"].unique(maintain_order=True).to_list())
            for col in str_args:
                arg_strings.add(chunk[col].unique(maintain_order=True).to_list())
            _interned(b.add_packet(), names, cats, arg_names, arg_strings)
            present = [(i, arg_names.ids[kinds[c][0]], kinds[c][1] == "str") for i, c in args
                       if chunk[c].null_count() < chunk.height]
            name_ids, str_ids, cat_ids = names.ids, arg_strings.ids, cats.ids
            for row in chunk.iter_rows():
                track, start, end = row[0], row[1], row[2]
                if track != cur:
                    stack = stacks.setdefault(track, [])
                    cur = track
                while stack and stack[-1] <= start:
                    _end(b, stack.pop(), track)
                p = b.add_packet()
                p.timestamp = start
                p.trusted_packet_sequence_id = SEQUENCE_ID
                p.sequence_flags = _NEEDS
                te = p.track_event
                te.type = _BEGIN
                te.track_uuid = track
                te.name_iid = name_ids[row[3]]
                te.category_iids.append(cat_ids[row[4]])
                if row[5] is not None:
                    te.flow_ids.append(row[5])
                if row[6] is not None:
                    te.terminating_flow_ids.append(row[6])
                for i, niid, is_str in present:
                    v = row[i]
                    if v is None:
                        continue
                    a = te.debug_annotations.add()
                    a.name_iid = niid
                    if is_str:
                        a.string_value_iid = str_ids[v]
                    else:
                        a.int_value = v
                stack.append(end)
            body.write(b.serialize())
            b = builder_cls()
    for track, open_ends in stacks.items():
        while open_ends:
            _end(b, open_ends.pop(), track)
    body.write(b.serialize())

    # -- the head: the first packet, then every track (overlap and counter tracks included)
    f.write(first.serialize())
    b = builder_cls()
    for t in timeline.tracks:
        p = b.add_packet()
        p.trusted_packet_sequence_id = SEQUENCE_ID
        d = p.track_descriptor
        d.uuid = t.uuid
        if t.parent is not None:
            d.parent_uuid = t.parent
        if t.kind == "process":
            d.process.pid = t.pid
            d.process.process_name = t.name
        elif t.kind == "thread":
            d.thread.pid = t.pid
            d.thread.tid = t.tid
            d.thread.thread_name = t.name
            d.name = t.name
        else:
            d.name = t.name
        if t.kind == "counter":
            d.counter.SetInParent()  # a counter track even without a unit
            if t.unit == "bytes":
                d.counter.unit = _UNIT_BYTES
            elif t.unit:
                d.counter.unit_name = t.unit
    f.write(b.serialize())
    body.seek(0)
    shutil.copyfileobj(body, f, 1 << 20)


def _instants(frame: Any, out: IO[bytes], b: Any, builder_cls: Any, chunk_rows: int, names: _Interner, cats: _Interner,
              arg_names: _Interner, arg_strings: _Interner) -> Any:
    """NVTX marks as INSTANT events; returns the builder to go on with."""
    for chunk in frame.iter_slices(chunk_rows):
        names.add(chunk["name"].unique(maintain_order=True).to_list())
        arg_strings.add(chunk["a_domain"].unique(maintain_order=True).to_list())
        _interned(b.add_packet(), names, cats, arg_names, arg_strings)
        domain_iid = arg_names.ids["domain"]
        for track, ts, name, cat, domain in chunk.iter_rows():
            p = b.add_packet()
            p.timestamp = ts
            p.trusted_packet_sequence_id = SEQUENCE_ID
            p.sequence_flags = _NEEDS
            te = p.track_event
            te.type = _INSTANT
            te.track_uuid = track
            te.name_iid = names.ids[name]
            te.category_iids.append(cats.ids[cat])
            if domain is not None:
                a = te.debug_annotations.add()
                a.name_iid = domain_iid
                a.string_value_iid = arg_strings.ids[domain]
        out.write(b.serialize())
        b = builder_cls()
    return b


def _counter_packets(frame: Any, out: IO[bytes], b: Any, builder_cls: Any, chunk_rows: int,
                     units: dict[int, str | None]) -> Any:
    """Counter samples as COUNTER events (integers on a bytes track); returns the builder."""
    for chunk in frame.iter_slices(chunk_rows * 2):
        for track, ts, value in chunk.iter_rows():
            p = b.add_packet()
            p.timestamp = ts
            p.trusted_packet_sequence_id = SEQUENCE_ID
            te = p.track_event
            te.type = _COUNTER
            te.track_uuid = track
            if units.get(track) == "bytes":
                te.counter_value = int(value)
            else:
                te.double_counter_value = value
        out.write(b.serialize())
        b = builder_cls()
    return b


def _end(b: Any, ts: int, track: int | None) -> None:
    p = b.add_packet()
    p.timestamp = ts
    p.trusted_packet_sequence_id = SEQUENCE_ID
    te = p.track_event
    te.type = _END
    te.track_uuid = track


def _interned(p: Any, names: _Interner, cats: _Interner, arg_names: _Interner, arg_strings: _Interner) -> None:
    """Put the strings not yet written into packet ``p``'s ``interned_data``."""
    p.trusted_packet_sequence_id = SEQUENCE_ID
    if not p.sequence_flags:
        p.sequence_flags = _NEEDS
    d = p.interned_data
    for iid, text in names.take():
        e = d.event_names.add()
        e.iid, e.name = iid, text
    for iid, text in cats.take():
        e = d.event_categories.add()
        e.iid, e.name = iid, text
    for iid, text in arg_names.take():
        e = d.debug_annotation_names.add()
        e.iid, e.name = iid, text
    for iid, text in arg_strings.take():
        e = d.debug_annotation_string_values.add()
        e.iid, e.str = iid, text.encode()
