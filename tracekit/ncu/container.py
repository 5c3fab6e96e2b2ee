"""Checking the framing of an ``.ncu-rep`` file before handing it to ``ncu_report``.

``ncu_report`` loads truncated, random and bit-flipped files without complaint (a report cut
at 100 KB loads with 1 of its 7 results; one flipped bit can drop a whole result, or one
metric, with no error), so tracekit walks the container first and counts what it holds.
Layout, observed on reports written by ncu 2023.3 to 2025.3:

* ``NVR\\0`` magic, then a little-endian ``uint32`` length and a file-header protobuf;
* then blocks: ``uint32`` length, a block-header protobuf whose field 1 is the kind of
  payload (0: profiled results; 1: other data, e.g. an embedded ELF), field 2 the number of
  results in the block and field 5 the size of the payload that follows;
* a payload holds that many results, each a ``uint32`` length and a ``ProfileResult``
  protobuf whose repeated field 13 are its metrics (``MetricResults``; ncu's own parse errors
  name them); a metric's repeated field 3 are its instance values.

The walk checks every length prefix down to the metrics (each one must end exactly where the
next thing starts) and counts results, metrics and instance values per result; metric values
themselves are not checked (a flipped bit inside a number is undetectable here).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"NVR\x00"
_MAX_HEADER = 64 << 20  # a header this large means the framing is not what we expect
_METRIC_RESULTS = 13  # ProfileResult.MetricResults
_METRIC_NAME = 1  # MetricResult.NameId
_INSTANCE_VALUES = 3  # MetricResult.MetricValueList
# Wire types of MetricResult's fields in every report seen (name id, value, instances, flags).
_METRIC_WIRE_TYPES = {1: 0, 2: 2, 3: 2, 4: 0}
# ProfileResult fields that appear at most once in every report seen (13, 17, 19 repeat).
_RESULT_SINGULAR = frozenset(
    {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 14, 15, 16, 21, 22, 23, 25, 31, 35}
)


class ContainerError(ValueError):
    """The file's framing is broken; the message says where (byte offset)."""


@dataclass(frozen=True)
class ResultShape:
    """One profiled result as the container holds it."""

    offset: int  #: byte offset of the result's protobuf in the file
    metrics: int  #: metric entries (``MetricResults``)
    instances: int  #: instance values summed over its metrics


@dataclass(frozen=True)
class Container:
    """What the walk found: number of blocks and of profiled results, file size, and the
    shape of each result in file order (empty when the walk skipped the payloads)."""

    blocks: int
    results: int
    size: int
    shapes: tuple[ResultShape, ...] = ()


def _varint(data: bytes, pos: int, end: int | None = None) -> tuple[int, int]:
    end = len(data) if end is None else end
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise ContainerError("bad varint in a block header")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return result, pos


def _varint_fields(message: bytes) -> dict[int, int]:
    """The varint fields of a protobuf message (others are skipped)."""
    fields: dict[int, int] = {}
    pos = 0
    while pos < len(message):
        key, pos = _varint(message, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(message, pos)
            fields.setdefault(number, value)
        elif wire == 1:
            pos += 8
        elif wire == 2:
            length, pos = _varint(message, pos)
            pos += length
        elif wire == 5:
            pos += 4
        else:
            raise ContainerError(f"unknown protobuf wire type {wire} in a block header")
        if pos > len(message):
            raise ContainerError("a block header overruns its length")
    return fields


class _Bad(Exception):
    """Internal: a protobuf field that does not fit, at ``pos`` (relative to the buffer)."""

    def __init__(self, pos: int, what: str, first: int | None = None) -> None:
        super().__init__(what)
        self.pos = pos
        self.what = what
        self.first = first  # where the field seen twice was first seen

    def where(self, base: int) -> str:
        """The message with file offsets (``base``: the buffer's offset in the file)."""
        if self.first is not None:
            return f"{self.what} (bytes {base + self.first} and {base + self.pos})"
        return f"{self.what} at byte {base + self.pos}"


def _fields(data: bytes, pos: int, end: int) -> list[tuple[int, int, int, int, int]]:
    """``(number, wire, key_pos, start, length)`` of the fields of the message
    ``data[pos:end]``; for a varint field ``length`` is its value. Every field must fit and
    the last must end exactly at ``end``."""
    out: list[tuple[int, int, int, int, int]] = []
    while pos < end:
        start = pos
        try:
            # one-byte keys and lengths are the rule: skip the general varint reader for them
            key = data[pos]
            if key < 0x80:
                pos += 1
            else:
                key, pos = _varint(data, pos, end)
            number, wire = key >> 3, key & 7
            if number == 0:
                raise _Bad(start, "protobuf field number 0")
            if wire == 2:
                length = data[pos] if pos < end else 0x80
                if length < 0x80:
                    pos += 1
                else:
                    length, pos = _varint(data, pos, end)
                out.append((number, 2, start, pos, length))
                pos += length
            elif wire == 0:
                value = data[pos] if pos < end else 0x80
                if value < 0x80:
                    pos += 1
                else:
                    value, pos = _varint(data, pos, end)
                out.append((number, 0, start, pos, value))
            elif wire in (1, 5):
                out.append((number, wire, start, pos, 0))
                pos += 8 if wire == 1 else 4
            else:
                raise _Bad(start, f"unknown protobuf wire type {wire}")
        except ContainerError:
            raise _Bad(start, "a protobuf key or varint runs past its message") from None
        if pos > end:
            raise _Bad(start, f"protobuf field {number} runs {pos - end} bytes past its message")
    return out


def _result_shape(data: bytes, start: int, end: int) -> tuple[int, int]:
    """``(metrics, instances)`` of the ``ProfileResult`` in ``data[start:end]``.

    Checks what every report written by ncu 2023.3 to 2025.3 obeys, so that a bit flip in a
    field key (which protobuf would skip as an unknown field, and with it a metric or an
    instance value) is caught: a known field has its declared wire type, and a singular
    field appears at most once. A metric name id can appear twice in one result (3 of 2,231
    in ncu_probe_full), always as byte-identical entries; ncu_report keeps the first, so only
    the first is counted, and a repeat with other content (a flipped name id) is damage.
    """
    seen: dict[int, tuple[int, int, int]] = {}
    instances = 0
    top: dict[int, int] = {}
    for number, wire, key_pos, pos, length in _fields(data, start, end):
        if number != _METRIC_RESULTS:
            if number in _RESULT_SINGULAR:
                if number in top:
                    raise _Bad(key_pos, f"result field {number} appears twice", first=top[number])
                top[number] = key_pos
            continue
        if wire != 2:
            raise _Bad(key_pos, f"a metric entry with protobuf wire type {wire}")
        name, count = _metric_entry(data, pos, pos + length)
        if name < 0:
            raise _Bad(pos, "a metric entry without a name id")
        if name in seen:
            first_key, first, first_length = seen[name]
            if data[first : first + first_length] != data[pos : pos + length]:
                what = f"metric name id {name} appears twice with different content"
                raise _Bad(key_pos, what, first=first_key)
            continue
        seen[name] = (key_pos, pos, length)
        instances += count
    return len(seen), instances


def _metric_entry(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """``(name id, instance values)`` of one ``MetricResult``; -1 without a name id.

    Fast path for the usual entry, ``08 <name> 12 <len> <value> (1a <len> <instance>)*
    20 <flags>`` with a one- or two-byte name id and one-byte lengths and flags (what every
    entry of the sample reports looks like); anything else takes the general walk, which
    applies the same rules to any layout.
    """
    start = pos
    if end - pos < 3 or data[pos] != 0x08:
        return _metric_entry_general(data, start, end)
    name = data[pos + 1]
    pos += 2
    if name >= 0x80:
        if data[pos] >= 0x80:
            return _metric_entry_general(data, start, end)
        name = (name & 0x7F) | data[pos] << 7
        pos += 1
    count = 0
    if pos + 1 < end and data[pos] == 0x12:
        if data[pos + 1] >= 0x80:
            return _metric_entry_general(data, start, end)
        pos += 2 + data[pos + 1]
    while pos + 1 < end and data[pos] == 0x1A:
        if data[pos + 1] >= 0x80:
            return _metric_entry_general(data, start, end)
        pos += 2 + data[pos + 1]
        count += 1
    if pos == end or (pos + 2 == end and data[pos] == 0x20 and data[pos + 1] < 0x80):
        return name, count
    return _metric_entry_general(data, start, end)


def _metric_entry_general(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """:func:`_metric_entry` for any layout: known fields keep their wire type, singular
    fields appear once, unknown fields are skipped."""
    name = -1
    count = 0
    singular = 0  # bit n set: field n seen
    for sub, sub_wire, sub_key, _, value in _fields(data, pos, end):
        expected = _METRIC_WIRE_TYPES.get(sub)
        if expected is None:
            continue
        if sub_wire != expected:
            raise _Bad(sub_key, f"metric field {sub} with protobuf wire type {sub_wire}")
        if sub == _INSTANCE_VALUES:
            count += 1
            continue
        if singular >> sub & 1:
            raise _Bad(sub_key, f"metric field {sub} appears twice")
        singular |= 1 << sub
        if sub == _METRIC_NAME:
            name = value
    return name, count


def _payload_shapes(data: bytes, base: int, count: int, block: int) -> list[ResultShape]:
    """The results of one block payload (``data`` starts at file offset ``base``)."""
    shapes: list[ResultShape] = []
    pos = 0
    while pos < len(data):
        if pos + 4 > len(data):
            msg = (
                f"block {block}: a result's length prefix at byte {base + pos} runs past its block"
            )
            raise ContainerError(msg)
        (length,) = struct.unpack_from("<I", data, pos)
        pos += 4
        last = len(shapes) + 1 == count
        if pos + length > len(data) or (last and pos + length != len(data)):
            msg = (
                f"block {block}: the result at byte {base + pos} says {length} bytes but its block "
                f"holds {len(data) - pos}"
            )
            raise ContainerError(msg)
        try:
            metrics, instances = _result_shape(data, pos, pos + length)
        except _Bad as exc:
            msg = f"block {block}: {exc.where(base)}"
            raise ContainerError(msg) from None
        shapes.append(ResultShape(offset=base + pos, metrics=metrics, instances=instances))
        pos += length
    if len(shapes) != count:
        msg = f"block {block} at byte {base} announces {count} results but holds {len(shapes)}"
        raise ContainerError(msg)
    return shapes


def walk(path: Path, *, payloads: bool = True) -> Container:
    """Walk the container; raise :class:`ContainerError` if it is truncated or malformed.

    With ``payloads=True`` (default) every result is walked down to its metrics and counted
    (:attr:`Container.shapes`); ``payloads=False`` reads only the block headers.
    """
    size = path.stat().st_size
    shapes: list[ResultShape] = []
    with path.open("rb") as fh:
        if fh.read(4) != MAGIC:
            raise ContainerError("no NVR magic")
        pos = 4
        blocks = results = 0
        first = True
        while pos < size:
            raw = fh.read(4)
            if len(raw) < 4:
                raise ContainerError(f"ends inside a length field at byte {pos} of {size}")
            (length,) = struct.unpack("<I", raw)
            pos += 4
            if length > _MAX_HEADER or pos + length > size:
                raise ContainerError(
                    f"ends inside block {blocks} (header of {length} bytes at byte {pos} of {size})"
                )
            header = fh.read(length)
            pos += length
            if first:  # the file header carries no payload
                first = False
                continue
            try:
                fields = _varint_fields(header)
            except ContainerError as exc:
                raise ContainerError(
                    f"block {blocks} header at byte {pos - length}: {exc}"
                ) from None
            payload = fields.get(5, 0)
            count = fields.get(2, 0)
            if pos + payload > size:
                raise ContainerError(
                    f"ends inside block {blocks} (payload of {payload} bytes at byte {pos} of {size})"
                )
            if payloads and fields.get(1, 0) == 0 and (payload or count):
                shapes.extend(_payload_shapes(fh.read(payload), pos, count, blocks))
            else:
                fh.seek(payload, 1)
            results += count
            blocks += 1
            pos += payload
    return Container(blocks=blocks, results=results, size=size, shapes=tuple(shapes))
