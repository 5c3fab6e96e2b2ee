"""Recognising a Kineto trace by its first bytes (standard library only: ``tracekit.open``'s
sniffing imports neither polars nor msgspec)."""

from __future__ import annotations

import zlib
from pathlib import Path

GZIP_MAGIC = b"\x1f\x8b"
#: Bytes of (decompressed) text looked at first to recognise a trace.
SNIFF_BYTES = 8192
#: Bytes looked at when a JSON object has none of :data:`KINETO_KEYS` in its first
#: :data:`SNIFF_BYTES`: a trace that opens with a big ``metadata`` object (TraceLens' traces of
#: Hugging Face models: ``traceEvents`` first at 23–26 KB).
SNIFF_MAX_BYTES = 4 << 20
#: Top-level keys of a Kineto trace; one of them near the start of a JSON object marks one.
KINETO_KEYS = (b'"traceEvents"', b'"schemaVersion"', b'"deviceProperties"', b'"distributedInfo"')


def head(path: Path, size: int = SNIFF_BYTES) -> bytes:
    """The first ``size`` bytes of the file's text (gunzipped when it is gzip; what a damaged
    gzip stream gives before the damage, possibly nothing)."""
    with path.open("rb") as fh:
        raw = fh.read(size if size > 4096 else 4096)
        if not raw.startswith(GZIP_MAGIC):
            return raw[:size]
        out = bytearray()
        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            while raw and len(out) < size:
                out += inflate.decompress(raw, size - len(out))
                raw = inflate.unconsumed_tail or fh.read(65536)
        except zlib.error:
            pass
        return bytes(out)


def looks_like_kineto(text: bytes) -> bool:
    """Whether ``text`` (a file's first bytes) opens a JSON object with a Kineto key."""
    body = text.removeprefix(b"\xef\xbb\xbf").lstrip()
    return body.startswith(b"{") and any(k in body for k in KINETO_KEYS)


def kineto_head(path: Path) -> bool:
    """Whether the file's (gunzipped) text opens a JSON object with a Kineto key in its first
    :data:`SNIFF_BYTES`, or, for a JSON object without one there, in its first
    :data:`SNIFF_MAX_BYTES`."""
    text = head(path)
    if looks_like_kineto(text):
        return True
    opens_object = text.removeprefix(b"\xef\xbb\xbf").lstrip().startswith(b"{")
    return opens_object and len(text) >= SNIFF_BYTES and looks_like_kineto(head(path, SNIFF_MAX_BYTES))


def is_kineto(path: str | Path) -> bool:
    """Whether ``path`` is a regular file whose (gunzipped) first bytes open a Chrome-trace JSON
    object with Kineto's keys (``traceEvents``, ``schemaVersion``, ``deviceProperties``,
    ``distributedInfo``). A Chrome trace of another tool passes this test too; reading it then
    says that it holds no PyTorch profiler events."""
    p = Path(path)
    try:
        return p.is_file() and kineto_head(p)
    except OSError:
        return False
