"""Checking the framing of an ``.ncu-rep`` file before handing it to ``ncu_report``.

``ncu_report`` loads truncated and random files without complaint (a report cut at 100 KB
loads with 1 of its 7 results), so tracekit walks the container first. Layout, observed
on reports written by ncu 2023.3 to 2025.3:

* ``NVR\\0`` magic, then a little-endian ``uint32`` length and a file-header protobuf;
* then blocks: ``uint32`` length, a block-header protobuf whose field 2 is the number of
  results in the block and field 5 the size of the payload that follows.

A file whose last block runs past the end is truncated. The walk reads only the headers.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"NVR\x00"
_MAX_HEADER = 64 << 20  # a header this large means the framing is not what we expect


class ContainerError(ValueError):
    """The file's framing is broken; the message says where."""


@dataclass(frozen=True)
class Container:
    """What the walk found: number of blocks and of profiled results, file size."""

    blocks: int
    results: int
    size: int


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
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


def walk(path: Path) -> Container:
    """Walk the container; raise :class:`ContainerError` if it is truncated or malformed."""
    size = path.stat().st_size
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
                raise ContainerError(f"ends inside block {blocks} (header at byte {pos} of {size})")
            header = fh.read(length)
            pos += length
            if first:  # the file header carries no payload
                first = False
                continue
            fields = _varint_fields(header)
            payload = fields.get(5, 0)
            if pos + payload > size:
                raise ContainerError(
                    f"ends inside block {blocks} (payload at byte {pos} of {size})"
                )
            results += fields.get(2, 0)
            blocks += 1
            fh.seek(payload, 1)
            pos += payload
    return Container(blocks=blocks, results=results, size=size)
