"""A Kineto (``torch.profiler``) trace's bytes: recognised by content, gunzipped, decoded with
msgspec into typed events that hold only the fields tracekit reads.

Kineto writes Chrome-trace JSON: ``{"schemaVersion": 1, "deviceProperties": [...],
"distributedInfo": {...}, "traceEvents": [...], "baseTimeNanoseconds": ...}``. Times (``ts``,
``dur``) are microseconds with the nanoseconds as three decimals; since 2023 they are counted
from ``baseTimeNanoseconds``, before that from the Unix epoch (``1712195495519689.047``), which
a float64 cannot hold to the nanosecond. They are therefore kept as their JSON text
(``msgspec.Raw``) and turned into exact integer nanoseconds by :func:`to_ns`.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from tracekit.errors import TraceFormatError, one_line
from tracekit.kineto.sniff import GZIP_MAGIC, head, is_kineto, looks_like_kineto

__all__ = ["Document", "Event", "decode", "head", "is_kineto", "looks_like_kineto", "to_ns"]


# -- typed decoding ---------------------------------------------------------------------------
def _f(name: str) -> Any:
    return msgspec.field(name=name, default=None)


class Args(msgspec.Struct):
    """The ``args`` of an event: only the keys tracekit reads (others are skipped unread).
    Values are untyped (``Any``): Kineto writes some as text on some platforms (ROCm's
    ``"stream": "0x0"``), and one odd value must not refuse the whole trace."""

    external_id: Any = _f("External id")
    external_id_old: Any = _f("external id")
    correlation: Any = None
    device: Any = None
    stream: Any = None
    context: Any = None
    queued: Any = None
    registers_per_thread: Any = _f("registers per thread")
    shared_memory: Any = _f("shared memory")
    blocks_per_sm: Any = _f("blocks per SM")
    warps_per_sm: Any = _f("warps per SM")
    grid: Any = None
    block: Any = None
    occupancy: Any = _f("est. achieved occupancy %")
    cbid: Any = None
    bytes: Any = None
    bandwidth: Any = _f("memory bandwidth (GB/s)")
    sync_kind: Any = _f("cuda_sync_kind")
    sequence_number: Any = _f("Sequence number")
    fwd_thread_id: Any = _f("Fwd thread id")
    record_function_id: Any = _f("Record function id")
    ev_idx: Any = _f("Ev Idx")
    input_dims: msgspec.Raw = msgspec.field(name="Input Dims", default=msgspec.Raw())
    input_types: msgspec.Raw = msgspec.field(name="Input type", default=msgspec.Raw())
    input_strides: msgspec.Raw = msgspec.field(name="Input Strides", default=msgspec.Raw())
    concrete_inputs: msgspec.Raw = msgspec.field(name="Concrete Inputs", default=msgspec.Raw())
    call_stack: Any = _f("Call stack")
    module_hierarchy: Any = _f("Module Hierarchy")
    collective_name: Any = _f("Collective name")
    in_msg_nelems: Any = _f("In msg nelems")
    out_msg_nelems: Any = _f("Out msg nelems")
    group_size: Any = _f("Group size")
    dtype: Any = None
    pg_name: Any = _f("Process Group Name")
    pg_desc: Any = _f("Process Group Description")
    pg_ranks: Any = _f("Process Group Ranks")
    mem_device_type: Any = _f("Device Type")
    mem_device_id: Any = _f("Device Id")
    addr: Any = _f("Addr")
    mem_bytes: Any = _f("Bytes")
    total_allocated: Any = _f("Total Allocated")
    total_reserved: Any = _f("Total Reserved")
    name: Any = None


class Event(msgspec.Struct):
    """One entry of ``traceEvents``."""

    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: msgspec.Raw = msgspec.Raw()
    dur: msgspec.Raw = msgspec.Raw()
    args: Args | None = None


class Document(msgspec.Struct):
    """The top level of a Kineto trace."""

    traceEvents: list[Event] | None = None  # noqa: N815 - Kineto's key
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


def read_text(path: Path) -> bytes:
    """The file's JSON text, gunzipped when it is gzip. Raises :class:`TraceFormatError` (one
    line) for a damaged or cut-off gzip stream."""
    with path.open("rb") as fh:
        data = fh.read()
    if not data.startswith(GZIP_MAGIC):
        return data
    try:
        return gzip.decompress(data)
    except (EOFError, OSError, zlib.error) as exc:
        msg = (f"{path} is a damaged or cut-off gzip file ({one_line(str(exc), 100)}); copy the trace again "
               "or re-run torch.profiler (a trace still being written is incomplete)")
        raise TraceFormatError(msg) from None


def decode(path: Path) -> Document:
    """:class:`Document` of the trace at ``path``; one-line :class:`TraceFormatError` for text
    that is not complete JSON or not shaped like a Chrome trace."""
    text = read_text(path)
    if not text.strip():
        msg = f"{path} is empty; the profiler did not finish writing it: re-run torch.profiler"
        raise TraceFormatError(msg)
    try:
        return _DECODER.decode(text)
    except msgspec.ValidationError as exc:
        msg = (f"{path} is JSON but not shaped like a PyTorch profiler trace ({one_line(str(exc), 120)}); "
               "pass the file torch.profiler's export_chrome_trace or tensorboard_trace_handler wrote")
        raise TraceFormatError(msg) from None
    except msgspec.DecodeError as exc:
        msg = (f"{path} is not complete JSON ({one_line(str(exc), 100)}): the trace is truncated or damaged; "
               "copy it again or re-run torch.profiler")
        raise TraceFormatError(msg) from None


# -- values -----------------------------------------------------------------------------------
def to_ns(raw: list[bytes | None]) -> pl.Series:
    """JSON numbers of microseconds (their text) → exact integer nanoseconds (Int64), rounded
    half up past the third decimal; null where absent. Vectorised: the integer and fraction
    digits are split as text, so ``1712195495519689.047`` gives ``1712195495519689047``."""
    text = pl.Series(raw, dtype=pl.Binary).cast(pl.Utf8).str.strip_chars()
    odd = text.str.contains(r"[eE]").fill_null(False)
    neg = text.str.starts_with("-").fill_null(False)
    digits = text.str.strip_prefix("-")
    parts = digits.str.split_exact(".", 1)
    whole = parts.struct.field("field_0").cast(pl.Int64, strict=False)
    frac = parts.struct.field("field_1").fill_null("").str.pad_end(4, "0")
    ns = whole * 1000 + frac.str.slice(0, 3).cast(pl.Int64, strict=False) + (frac.str.slice(3, 1) >= "5").cast(pl.Int64)
    ns = pl.select(pl.when(neg).then(-ns).otherwise(ns)).to_series()
    if odd.any():  # exponent notation: rare, decoded one by one
        from decimal import Decimal

        fixed = [round(Decimal(t) * 1000) if o else None for t, o in zip(text.to_list(), odd.to_list(), strict=True)]
        ns = pl.select(pl.when(odd).then(pl.Series(fixed, dtype=pl.Int64)).otherwise(ns)).to_series()
    return ns.alias("ns")


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
