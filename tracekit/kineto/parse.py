"""A Kineto (``torch.profiler``) trace's bytes: recognised by content, gunzipped, decoded with
msgspec a batch of events at a time into typed events that hold only the fields tracekit reads.

Kineto writes Chrome-trace JSON: ``{"schemaVersion": 1, "deviceProperties": [...],
"distributedInfo": {...}, "traceEvents": [...], "baseTimeNanoseconds": ...}``. Times (``ts``,
``dur``) are microseconds with the nanoseconds as three decimals; since 2023 they are counted
from ``baseTimeNanoseconds``, before that from the Unix epoch (``1712195495519689.047``), which
a float64 cannot hold to the nanosecond. They are therefore kept as their JSON text
(``msgspec.Raw``) and turned into exact integer nanoseconds by :func:`to_ns`.

Memory stays near the size of the JSON text: :func:`decode` keeps the text once and the events
as :class:`msgspec.Raw` spans of it (no copy), and :func:`event_batches` turns a batch of spans
at a time into :class:`Event` structs, which the caller turns into columns and drops.
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from tracekit.errors import TraceFormatError, one_line
from tracekit.kineto.sniff import GZIP_MAGIC, head, is_kineto, looks_like_kineto

__all__ = ["ARG_KEYS", "Document", "Event", "args_struct", "decode", "decode_args", "event_batches", "head", "is_kineto",
           "looks_like_kineto", "to_ns"]


# -- typed decoding ---------------------------------------------------------------------------
class Event(msgspec.Struct):
    """One entry of ``traceEvents``, its ``args`` left as JSON text: only the events of a kind
    tracekit converts have them decoded, into that kind's struct (:func:`args_struct`)."""

    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: msgspec.Raw = msgspec.Raw()
    dur: msgspec.Raw = msgspec.Raw()
    args: msgspec.Raw = msgspec.Raw(b"null")


#: The ``args`` keys tracekit reads, by the attribute they are read into. Values are untyped
#: (``Any``): Kineto writes some as text on some platforms (ROCm's ``"stream": "0x0"``), and one
#: odd value must not refuse the whole trace.
ARG_KEYS = {
    "external_id": "External id", "external_id_old": "external id", "correlation": "correlation", "device": "device",
    "stream": "stream", "context": "context", "queued": "queued", "registers_per_thread": "registers per thread",
    "shared_memory": "shared memory", "blocks_per_sm": "blocks per SM", "warps_per_sm": "warps per SM", "grid": "grid",
    "block": "block", "occupancy": "est. achieved occupancy %", "cbid": "cbid", "bytes": "bytes",
    "bandwidth": "memory bandwidth (GB/s)", "sync_kind": "cuda_sync_kind", "sequence_number": "Sequence number",
    "fwd_thread_id": "Fwd thread id", "record_function_id": "Record function id", "ev_idx": "Ev Idx",
    "call_stack": "Call stack", "module_hierarchy": "Module Hierarchy", "collective_name": "Collective name",
    "in_msg_nelems": "In msg nelems", "out_msg_nelems": "Out msg nelems", "group_size": "Group size", "dtype": "dtype",
    "pg_name": "Process Group Name", "pg_desc": "Process Group Description", "pg_ranks": "Process Group Ranks",
    "mem_device_type": "Device Type", "mem_device_id": "Device Id", "addr": "Addr", "mem_bytes": "Bytes",
    "total_allocated": "Total Allocated", "total_reserved": "Total Reserved", "name": "name",
}
#: ``args`` keys kept as their JSON text (``msgspec.Raw``, read by :func:`raw_text`).
RAW_ARG_KEYS = {"input_dims": "Input Dims", "input_types": "Input type", "input_strides": "Input Strides",
                "concrete_inputs": "Concrete Inputs"}


def args_struct(name: str, fields: Sequence[str]) -> type[msgspec.Struct]:
    """A struct of the ``args`` keys of ``fields`` (attributes of :data:`ARG_KEYS` or
    :data:`RAW_ARG_KEYS`); every other key is skipped unread."""
    spec: list[tuple[str, Any, Any]] = [
        (f, msgspec.Raw, msgspec.field(name=RAW_ARG_KEYS[f], default=msgspec.Raw())) if f in RAW_ARG_KEYS
        else (f, Any, msgspec.field(name=ARG_KEYS[f], default=None))
        for f in fields
    ]
    return msgspec.defstruct(name, spec)


class Document(msgspec.Struct):
    """The top level of a Kineto trace; the events stay undecoded spans of the text
    (:func:`event_batches` decodes them)."""

    traceEvents: list[msgspec.Raw] | None = None  # noqa: N815 - Kineto's key
    schemaVersion: Any = None  # noqa: N815
    deviceProperties: Any = None  # noqa: N815
    distributedInfo: Any = None  # noqa: N815
    baseTimeNanoseconds: Any = None  # noqa: N815
    cupti_version: Any = None
    cuda_runtime_version: Any = None
    cuda_driver_version: Any = None
    hip_runtime_version: Any = None
    record_shapes: Any = None
    with_stack: Any = None
    traceName: Any = None  # noqa: N815


_DECODER = msgspec.json.Decoder(Document)
_EVENTS = msgspec.json.Decoder(list[Event])
#: Events decoded at once (a few MB of structs).
BATCH = 16_384
#: Bytes of text read per step of :class:`EventStream` (about 12,000 events of Kineto's).
STREAM_CHUNK = 2 << 20
#: Compressed bytes read, and text made, per step of gunzipping.
_CHUNK = 1 << 20
_OUT_CHUNK = 1 << 21


def read_text(path: Path) -> bytes | bytearray:
    """The file's JSON text, gunzipped when it is gzip (streamed into one growing buffer, so
    the text is held once). Raises :class:`TraceFormatError` (one line) for a damaged or
    cut-off gzip stream."""
    with path.open("rb") as fh:
        if fh.read(2) != GZIP_MAGIC:
            # read into a buffer of the file's size (``read()`` would grow one and copy it)
            buf = bytearray(os.fstat(fh.fileno()).st_size)
            fh.seek(0)
            got = fh.readinto(buf)
            del buf[got:]
            return buf
        fh.seek(0)
        try:
            return _gunzip(fh)
        except (EOFError, OSError, zlib.error) as exc:
            raise _damaged_gzip(path, exc) from None


def _damaged_gzip(path: Path, exc: Exception) -> TraceFormatError:
    msg = (f"{path} is a damaged or cut-off gzip file ({one_line(str(exc), 100)}); copy the trace again "
           "or re-run torch.profiler (a trace still being written is incomplete)")
    return TraceFormatError(msg)


def _gunzip(fh: Any) -> bytearray:
    """Every gzip member of ``fh`` inflated into one bytearray (``gzip.decompress`` would hold
    its output twice while joining it)."""
    out = bytearray()
    for piece in _inflate(fh):
        out += piece
    return out


def _inflate(fh: Any) -> Iterator[bytes]:
    """The text of every gzip member of ``fh``, in pieces of at most :data:`_OUT_CHUNK` bytes
    (zero padding after a member skipped, as ``gzip`` does); ``EOFError`` for a cut stream,
    ``zlib.error`` for a damaged one."""
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    pending = fh.read(_CHUNK)
    while True:
        if not pending:
            pending = fh.read(_CHUNK)
            if not pending:
                yield inflate.flush()
                if not inflate.eof:
                    raise EOFError("compressed file ended before the end-of-stream marker was reached")
                return
        yield inflate.decompress(pending, _OUT_CHUNK)
        pending = inflate.unconsumed_tail
        if inflate.eof:  # a member ended: zero padding or another member may follow
            pending = inflate.unused_data.lstrip(b"\0")
            while not pending:
                more = fh.read(_CHUNK)
                if not more:
                    return
                pending = more.lstrip(b"\0")
            inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)


def _not_shaped(path: Path, exc: msgspec.ValidationError, offset: int | None = 0) -> TraceFormatError:
    """The error for a trace msgspec would not validate; ``offset``: the index of the batch's
    first event (None: the batch is some events' ``args``)."""
    text = str(exc)
    if offset is None:
        text = re.sub(r"\$\[\d+\]", "$.traceEvents[…].args", text)
    elif "$[" in text:  # a batch's index → the event's index in the file
        text = re.sub(r"\$\[(\d+)\]", lambda m: f"$.traceEvents[{offset + int(m.group(1))}]", text)
    msg = (f"{path} is JSON but not shaped like a PyTorch profiler trace ({one_line(text, 120)}); "
           "pass the file torch.profiler's export_chrome_trace or tensorboard_trace_handler wrote")
    return TraceFormatError(msg)


def decode(path: Path) -> Document:
    """:class:`Document` of the trace at ``path``, its events as spans of the text (which they
    keep alive); one-line :class:`TraceFormatError` for text that is not complete JSON or not
    shaped like a Chrome trace."""
    text = read_text(path)
    if not text.strip():
        msg = f"{path} is empty; the profiler did not finish writing it: re-run torch.profiler"
        raise TraceFormatError(msg)
    try:
        return _DECODER.decode(text)
    except msgspec.ValidationError as exc:
        raise _not_shaped(path, exc) from None
    except msgspec.DecodeError as exc:
        msg = (f"{path} is not complete JSON ({one_line(str(exc), 100)}): the trace is truncated or damaged; "
               "copy it again or re-run torch.profiler")
        raise TraceFormatError(msg) from None


def event_batches(events: list[msgspec.Raw], path: Path, size: int = BATCH) -> Iterator[list[Event]]:
    """``events`` decoded ``size`` at a time, in order; one-line :class:`TraceFormatError` for
    an event that is not shaped like one."""
    for offset in range(0, len(events), size):
        try:
            yield _EVENTS.decode(b"[" + b",".join(events[offset:offset + size]) + b"]")
        except msgspec.ValidationError as exc:
            raise _not_shaped(path, exc, offset) from None


class Unstreamable(Exception):
    """The text is not a well-formed trace that :class:`EventStream` can follow; reading the
    whole text (:func:`decode`) says what is wrong with it."""


class EventStream:
    """The events of the trace at ``path`` in batches (``list[Event]``), read as a stream:
    the file is read (and gunzipped) :data:`STREAM_CHUNK` bytes at a time, so no more than a
    few pieces of its text are held at once.

    The top-level object is followed member by member: the text before ``"traceEvents"``, then
    the array a batch at a time, each batch ending at an event's closing ``}`` that msgspec
    confirms (the text from the batch's first event to there decodes as a JSON array, which it
    does only if that ``}`` closes an event, not a nested object or text inside a string),
    then the rest. After the last batch, :attr:`doc` holds the top-level fields. Raises
    :class:`Unstreamable` for text that is not such a trace (truncated, damaged, not shaped
    like one); a damaged gzip stream gives the one-line :class:`TraceFormatError` of
    :func:`read_text`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.doc: Document | None = None
        self.events = 0

    def __iter__(self) -> Iterator[list[Event]]:
        with self.path.open("rb") as fh:
            gz = fh.read(2) == GZIP_MAGIC
            fh.seek(0)
            chunks = _inflate(fh) if gz else iter(lambda: fh.read(STREAM_CHUNK), b"")
            try:
                yield from self._events(self._pieces(chunks))
            except (EOFError, OSError, zlib.error) as exc:
                raise _damaged_gzip(self.path, exc) from None

    @staticmethod
    def _pieces(chunks: Iterator[bytes]) -> Iterator[bytes]:
        """``chunks`` regrouped into pieces of about :data:`STREAM_CHUNK` bytes."""
        held: list[bytes] = []
        size = 0
        for chunk in chunks:
            held.append(chunk)
            size += len(chunk)
            if size >= STREAM_CHUNK:
                yield b"".join(held)
                held, size = [], 0
        if held:
            yield b"".join(held)

    def _events(self, pieces: Iterator[bytes]) -> Iterator[list[Event]]:
        buf = b""
        at = -1
        # 1. the top level's members before "traceEvents": the first occurrence of the key
        #    where the text before it is an object's start and members
        while True:
            at = buf.find(b'"traceEvents"', at + 1)
            if at < 0:
                more = next(pieces, b"")
                if not more or len(buf) > 64 * STREAM_CHUNK:
                    raise Unstreamable
                at = max(-1, len(buf) - 14)
                buf += more
                continue
            try:
                msgspec.json.decode(buf[:at] + b'"traceEvents": null}')
            except msgspec.DecodeError:
                continue
            break
        head = buf[:at]
        pos = at + len(b'"traceEvents"')
        for expected in (b":", b"["):
            while True:
                rest = buf[pos:].lstrip()
                if rest:
                    break
                more = next(pieces, b"")
                if not more:
                    raise Unstreamable
                buf, pos = rest + more, 0
            if not rest.startswith(expected):
                raise Unstreamable
            buf, pos = rest, 1
        # 2. the events, a piece at a time
        while True:
            buf = buf[pos:].lstrip()
            pos = 0
            if buf.startswith(b"]"):
                break
            if buf.startswith(b","):  # between batches
                buf = buf[1:].lstrip()
            batch = self._batch(buf)
            if batch is None:
                more = next(pieces, b"")
                if not more or len(buf) > 16 * STREAM_CHUNK:
                    raise Unstreamable
                buf += more
                continue
            events, pos = batch
            self.events += len(events)
            yield events
        # 3. the members after it
        tail = buf[1:] + b"".join(pieces)
        try:
            doc = _DECODER.decode(head + b'"traceEvents": []' + tail)
        except msgspec.MsgspecError:
            raise Unstreamable from None
        if doc.traceEvents:  # a second "traceEvents" key
            raise Unstreamable
        self.doc = doc

    def _batch(self, buf: bytes) -> tuple[list[Event], int] | None:
        """The complete events at the start of ``buf`` and where they end, or None when it
        holds none yet."""
        end = len(buf)
        for _ in range(16):
            close = buf.rfind(b"}", 0, end)
            if close < 0:
                return None
            after = buf[close + 1:close + 65].lstrip()
            if not after or after[:1] not in (b",", b"]"):
                end = close
                continue
            try:
                return _EVENTS.decode(b"[" + buf[:close + 1] + b"]"), close + 1
            except msgspec.DecodeError:
                end = close
            except msgspec.ValidationError:
                raise Unstreamable from None
        return None  # perhaps one event longer than the piece: read on


def decode_args(decoder: msgspec.json.Decoder[Any], events: list[Event], path: Path) -> list[Any]:
    """The ``args`` of ``events`` decoded by ``decoder`` (of ``list[<args struct> | None]``);
    None where an event has none."""
    try:
        return decoder.decode(b"[" + b",".join([e.args for e in events]) + b"]")  # type: ignore[no-any-return]
    except msgspec.ValidationError as exc:
        raise _not_shaped(path, exc, None) from None


# -- values -----------------------------------------------------------------------------------
def to_ns(raw: Sequence[bytes | None] | pl.Series) -> pl.Series:
    """JSON numbers of microseconds (their text: bytes, or a Utf8 series) → exact integer
    nanoseconds (Int64), rounded half up past the third decimal; null where absent. Vectorised:
    the integer and fraction digits are split as text, so ``1712195495519689.047`` gives
    ``1712195495519689047``."""
    text = raw if isinstance(raw, pl.Series) else pl.Series(raw, dtype=pl.Binary).cast(pl.Utf8)
    frame = pl.DataFrame({"t": text})
    t = pl.col("t")
    # Kineto's own shapes (``123.456``, ``123``): the digits less the point are the ns
    quick = frame.select(t.str.contains(_PLAIN).alias("plain"), (
        t.str.replace(".", "", literal=True).cast(pl.Int64, strict=False)
        * pl.when(t.str.contains(".", literal=True)).then(1).otherwise(1000)).alias("ns"))
    if quick["plain"].fill_null(True).all() and quick["ns"].null_count() == text.null_count():
        return quick["ns"]
    got = frame.select(_ns(t).alias("ns"), t.str.strip_chars().str.contains(r"[eE]").fill_null(False).alias("odd"))
    ns, odd = got["ns"], got["odd"]
    if odd.any():  # exponent notation: rare, decoded one by one
        from decimal import Decimal

        fixed = [round(Decimal(t) * 1000) if o else None
                 for t, o in zip(text.str.strip_chars().to_list(), odd.to_list(), strict=True)]
        ns = pl.select(pl.when(odd).then(pl.Series(fixed, dtype=pl.Int64)).otherwise(ns)).to_series()
    return ns.alias("ns")


#: ``ts``/``dur`` text whose digits less the point are the ns: three decimals, or none (then
#: short enough for ×1000 to stay in an Int64).
_PLAIN = r"^-?(?:\d{1,16}\.\d{3}|\d{1,15})$"


def _ns(column: pl.Expr) -> pl.Expr:
    """:func:`to_ns` of a Utf8 column (wrong for exponent notation, which it corrects)."""
    text = column.str.strip_chars()
    parts = text.str.strip_prefix("-").str.split_exact(".", 1)
    whole = parts.struct.field("field_0").cast(pl.Int64, strict=False)
    frac = parts.struct.field("field_1").fill_null("").str.pad_end(4, "0")
    ns = whole * 1000 + frac.str.slice(0, 3).cast(pl.Int64, strict=False) + (frac.str.slice(3, 1) >= "5").cast(pl.Int64)
    return pl.when(text.str.starts_with("-").fill_null(False)).then(-ns).otherwise(ns)


def as_int(value: Any) -> int | None:
    """An integer from an int, an integral float or a decimal/hex string; else None."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text, 16) if text.lower().startswith("0x") else int(text)
        except ValueError:
            return None
    return None


def as_float(value: Any) -> float | None:
    """A float from a number or numeric string; else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def as_text(value: Any) -> str | None:
    """Text as it is; a list or number as JSON; None stays None."""
    if value is None or isinstance(value, str):
        return value
    return msgspec.json.encode(value).decode()


def raw_text(raw: msgspec.Raw) -> str | None:
    """The JSON text of an undecoded value (``Input Dims`` …), or None when absent."""
    return bytes(raw).decode("utf-8", "replace") if len(raw) else None


# -- columns ----------------------------------------------------------------------------------
# The functions above, over a column of values at once: a column whose values all have the
# type the result needs (the usual case) goes to polars as it is; any other is converted value
# by value, so the result is the same either way.
_NONE = type(None)


def ints(values: Sequence[Any]) -> pl.Series:
    """:func:`as_int` of each value, as Int64."""
    if set(map(type, values)) <= {int, _NONE}:
        return pl.Series(values, dtype=pl.Int64)
    return pl.Series([as_int(v) for v in values], dtype=pl.Int64)


def floats(values: Sequence[Any]) -> pl.Series:
    """:func:`as_float` of each value, as Float64."""
    if set(map(type, values)) <= {float, _NONE}:
        return pl.Series(values, dtype=pl.Float64)
    return pl.Series([as_float(v) for v in values], dtype=pl.Float64)


def texts(values: Sequence[Any]) -> pl.Series:
    """:func:`as_text` of each value, as Utf8."""
    if set(map(type, values)) <= {str, _NONE}:
        return pl.Series(values, dtype=pl.Utf8)
    return pl.Series([as_text(v) for v in values], dtype=pl.Utf8)


def strs(values: Sequence[Any], *, keep_none: bool = False) -> pl.Series:
    """``str()`` of each value, as Utf8; None becomes ``"None"`` (as ``str`` makes it), or
    stays null with ``keep_none``."""
    kinds = set(map(type, values))
    if kinds <= {str} or (keep_none and kinds <= {str, _NONE}):
        return pl.Series(values, dtype=pl.Utf8)
    return pl.Series([None if v is None and keep_none else str(v) for v in values], dtype=pl.Utf8)


def raw_texts(raws: Sequence[msgspec.Raw]) -> pl.Series:
    """:func:`raw_text` of each span, as Utf8. The spans are joined with NUL, which JSON text
    cannot hold (msgspec refuses it), decoded once and split."""
    parts = b"\0".join(raws).decode("utf-8", "replace").split("\0") if raws else []
    if len(parts) != len(raws):
        return pl.Series([raw_text(r) for r in raws], dtype=pl.Utf8)
    return pl.Series([t or None for t in parts], dtype=pl.Utf8)
