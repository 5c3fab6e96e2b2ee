"""NVTX extended payloads of NCCL ranges: schemas, the ``binaryData`` blob layout, decoding.

NCCL (≥ 2.19 or so) attaches an extended payload to each API range, e.g. ``ncclAllReduce``
carries ``{communicator id, message size, reduction op}``. An export keeps the *schemas* in
``NVTX_PAYLOAD_SCHEMAS`` / ``NVTX_PAYLOAD_SCHEMA_ENTRIES`` / ``NVTX_PAYLOAD_ENUM*``; the
per-event bytes land in ``NVTX_EVENTS.binaryData`` only with
``nsys export --include-blobs=true``.

Blob layout (verified on nsys 2025.3.2 exports of NCCL 2.28.9, ``sample_traces/llm_tp2*``)::

    offset  0  u64  1 in every blob seen (the domain id, or a count of payload headers:
                    indistinguishable there, both are 1)
    offset  8  u64  schema id          (= NVTX_PAYLOAD_SCHEMAS.schemaId, e.g. 0x01000005)
    offset 16  u64  payload size       (= NVTX_PAYLOAD_SCHEMAS.payloadSize, e.g. 24)
    offset 24  u64  payload offset     (32: the payload follows the header)
    offset 32  ...  payload: each entry at NVTX_PAYLOAD_SCHEMA_ENTRIES.offset (NULL = 0)

so ``len(blob) == 32 + payload size`` (56 bytes for ``ncclAllReduce``, 48 for
``ncclAllGather``, 40 for ``ncclCommFinalize``). The check against the workload: every
``ncclAllReduce`` of the TP=2 decode sample decodes to 8192 bytes = batch 4 × 1 token ×
hidden 1024 × 2 bytes (bf16), every ``ncclAllGather`` to 32768 = 4 × 4096 logits × 2, every
``ncclSend``/``ncclRecv`` to 32 = 4 int64 token ids. Padding after a 4-byte last entry is
uninitialised memory (``FF7F0000``), so only the declared entries are read.

When the first word is ≥ 2 and the bytes also parse as that many 24-byte headers, each
header is decoded (an NVTX range can carry several payloads); otherwise one header is read.

Without schema tables (older exports) the layouts NCCL has used since its payloads appeared
are applied by range name (:data:`NCCL_BUILTIN_LAYOUTS`), flagged ``payload_schema ==
"builtin"``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import polars as pl

__all__ = [
    "FIELD_COLUMNS",
    "NCCL_BUILTIN_LAYOUTS",
    "REDUCTION_OPS",
    "PayloadSchemas",
    "decode_blob",
    "decode_payloads",
    "read_payload_schemas",
]

#: ``nvToolsExtPayload.h`` entry types → (struct format, size). Types ≥ 2**24 are schema ids
#: (enums: their size comes from ``NVTX_PAYLOAD_ENUMS.size``).
ENTRY_TYPES: dict[int, tuple[str, int]] = {
    1: ("b", 1), 2: ("B", 1), 3: ("h", 2), 4: ("H", 2), 5: ("i", 4), 6: ("I", 4),
    7: ("q", 8), 8: ("Q", 8), 9: ("q", 8), 10: ("Q", 8),
    11: ("b", 1), 12: ("B", 1), 13: ("h", 2), 14: ("H", 2), 15: ("i", 4), 16: ("I", 4),
    17: ("q", 8), 18: ("Q", 8), 19: ("f", 4), 20: ("d", 8), 22: ("Q", 8), 23: ("Q", 8),
}
SCHEMA_ID_BASE = 1 << 24

#: ``ncclRedOp_t`` values (``ncclRedOpCreatePreMulSum`` makes dynamic ops above these).
REDUCTION_OPS: dict[int, str] = {0: "Sum", 1: "Prod", 2: "Max", 3: "Min", 4: "Avg"}

#: Output column of each payload entry, chosen by the entry's name (lower-cased substring
#: tests, in order). ``comm_rank`` is the rank inside the communicator.
FIELD_COLUMNS: tuple[tuple[str, str], ...] = (
    ("communicator", "comm_id"),
    ("message size", "bytes"),
    ("reduction", "reduction_code"),
    ("peer", "peer"),
    ("root", "root"),
    ("no. of ranks", "comm_nranks"),
    ("number of ranks", "comm_nranks"),
    ("nranks", "comm_nranks"),
    ("cuda device", "cuda_device"),
    ("data type", "dtype_code"),
    ("datatype", "dtype_code"),
    ("rank", "comm_rank"),
)

_OUT_SCHEMA: dict[str, pl.DataType | type[pl.DataType]] = {
    "comm_id": pl.UInt64,
    "bytes": pl.Int64,
    "reduction_code": pl.Int64,
    "peer": pl.Int64,
    "root": pl.Int64,
    "comm_nranks": pl.Int64,
    "comm_rank": pl.Int64,
    "cuda_device": pl.Int64,
    "dtype_code": pl.Int64,
    "payload_schema_id": pl.Int64,
    "payload_schema": pl.Utf8,
}

# (name, type code, offset) of NCCL's payload structs (src/include/nvtx_payload_schemas.h).
_COMM = ("NCCL communicator ID", 18, 0)
_SIZE = ("Message size [bytes]", 22, 8)
NCCL_BUILTIN_LAYOUTS: dict[str, tuple[tuple[str, int, int], ...]] = {
    "ncclAllReduce": (_COMM, _SIZE, ("Reduction operation", 5, 16)),
    "ncclReduceScatter": (_COMM, _SIZE, ("Reduction operation", 5, 16)),
    "ncclAllGather": (_COMM, _SIZE),
    "ncclAlltoAll": (_COMM, _SIZE),
    "ncclAllToAll": (_COMM, _SIZE),
    "ncclBroadcast": (_COMM, _SIZE, ("Root", 5, 16)),
    "ncclBcast": (_COMM, _SIZE, ("Root", 5, 16)),
    "ncclReduce": (_COMM, _SIZE, ("Root", 5, 16), ("Reduction operation", 5, 20)),
    "ncclSend": (_COMM, _SIZE, ("Peer rank", 5, 16)),
    "ncclRecv": (_COMM, _SIZE, ("Peer rank", 5, 16)),
    "ncclCommInitRank": (_COMM, ("No. of ranks", 5, 8), ("Rank", 5, 12), ("CUDA device", 5, 16)),
    "ncclCommInitRankConfig": (_COMM, ("No. of ranks", 5, 8), ("Rank", 5, 12), ("CUDA device", 5, 16)),
    "ncclCommFinalize": (_COMM,),
    "ncclCommDestroy": (_COMM,),
    "ncclCommAbort": (_COMM,),
}


@dataclass
class PayloadSchemas:
    """Payload schemas of one export, deduplicated on (domain, schema, index).

    ``entries``: ``domain_id, schema_id, idx, type, name, offset`` (offset filled in where the
    export left it NULL); ``payload_size``: ``{(domain_id, schema_id): bytes}``;
    ``enum_sizes``: ``{(domain_id, schema_id): bytes}``; ``enums``:
    ``{(domain_id, schema_id): {value: name}}``.
    """

    entries: pl.DataFrame = field(
        default_factory=lambda: pl.DataFrame(
            schema={"domain_id": pl.Int64, "schema_id": pl.Int64, "idx": pl.Int64, "type": pl.Int64,
                    "name": pl.Utf8, "offset": pl.Int64}
        )
    )
    payload_size: dict[tuple[int, int], int] = field(default_factory=dict)
    enum_sizes: dict[tuple[int, int], int] = field(default_factory=dict)
    enums: dict[tuple[int, int], dict[int, str]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        """No schema was exported."""
        return self.entries.height == 0

    def layout(self, domain_id: int, schema_id: int) -> list[tuple[str, int, int]] | None:
        """``[(entry name, type, offset), …]`` of a schema, or None when unknown."""
        cache: dict[tuple[int, int], list[tuple[str, int, int]] | None] = self.__dict__.setdefault("_layouts", {})
        key = (domain_id, schema_id)
        if key not in cache:
            rows = self.entries.filter(
                (pl.col("domain_id") == domain_id) & (pl.col("schema_id") == schema_id)
            ).sort("idx")
            cache[key] = [(str(n), int(t), int(o)) for n, t, o in rows.select("name", "type", "offset").iter_rows()] or None
        return cache[key]


def read_payload_schemas(db: Any) -> PayloadSchemas:
    """Read the ``NVTX_PAYLOAD_*`` tables of an open export (``tracekit.nsys.database.ExportDatabase``).

    Rows repeat once per process and carry no pid: they are deduplicated on (domain, schema,
    index). Entry offsets left NULL are computed with natural alignment (the first entry's
    NULL means 0, as nsys writes it).
    """
    out = PayloadSchemas()
    if not db.has_table("NVTX_PAYLOAD_SCHEMA_ENTRIES"):
        return out
    enum_sizes: dict[tuple[int, int], int] = {}
    if db.has_table("NVTX_PAYLOAD_ENUMS") and "size" in db.columns("NVTX_PAYLOAD_ENUMS"):
        for dom, sid, size in db.rows('SELECT domainId, schemaId, "size" FROM NVTX_PAYLOAD_ENUMS'):
            if size is not None:
                enum_sizes[(int(dom or 0), int(sid))] = int(size)
    enums: dict[tuple[int, int], dict[int, str]] = {}
    if db.has_table("NVTX_PAYLOAD_ENUM_ENTRIES"):
        for dom, sid, name, value in db.rows(
            "SELECT domainId, schemaId, name, value FROM NVTX_PAYLOAD_ENUM_ENTRIES"
        ):
            # nsys writes NULL for a value of 0 (Sum)
            enums.setdefault((int(dom or 0), int(sid)), {})[int(value or 0)] = str(name)
    if db.has_table("NVTX_PAYLOAD_SCHEMAS") and "payloadSize" in db.columns("NVTX_PAYLOAD_SCHEMAS"):
        for dom, sid, size in db.rows("SELECT domainId, schemaId, payloadSize FROM NVTX_PAYLOAD_SCHEMAS"):
            if size is not None:
                out.payload_size[(int(dom or 0), int(sid))] = int(size)
    cols = set(db.columns("NVTX_PAYLOAD_SCHEMA_ENTRIES"))
    offset = '"offset"' if "offset" in cols else "NULL"
    raw = db.rows(
        f'SELECT domainId, schemaId, idx, type, name, {offset} FROM NVTX_PAYLOAD_SCHEMA_ENTRIES'
    )
    seen: dict[tuple[int, int, int], tuple[int, str, int | None]] = {}
    for dom, sid, idx, typ, name, off in raw:
        key = (int(dom or 0), int(sid), int(idx or 0))
        seen.setdefault(key, (int(typ or 0), "" if name is None else str(name), None if off is None else int(off)))
    rows = []
    for (dom, sid), items in _group_by_schema(seen).items():
        pos = 0
        for idx, (typ, name, off) in items:
            size = _entry_size(typ, dom, enum_sizes)
            if off is None:
                off = _align(pos, size) if idx else 0
            rows.append((dom, sid, idx, typ, name, off))
            pos = off + size
    out.entries = pl.DataFrame(
        rows, schema=list(out.entries.schema.items()), orient="row"
    )
    out.enum_sizes = enum_sizes
    out.enums = enums
    return out


def _group_by_schema(
    seen: Mapping[tuple[int, int, int], tuple[int, str, int | None]],
) -> dict[tuple[int, int], list[tuple[int, tuple[int, str, int | None]]]]:
    grouped: dict[tuple[int, int], list[tuple[int, tuple[int, str, int | None]]]] = {}
    for (dom, sid, idx), value in sorted(seen.items()):
        grouped.setdefault((dom, sid), []).append((idx, value))
    return grouped


def _align(pos: int, size: int) -> int:
    a = max(1, min(size, 8))
    return (pos + a - 1) // a * a


def _entry_size(typ: int, domain_id: int, enum_sizes: Mapping[tuple[int, int], int]) -> int:
    if typ >= SCHEMA_ID_BASE:
        return enum_sizes.get((domain_id, typ), 4)
    return ENTRY_TYPES.get(typ, ("Q", 8))[1]


def _read(blob: bytes, pos: int, typ: int, size: int) -> int | float | None:
    if typ >= SCHEMA_ID_BASE:  # an enum: an integer of the enum's size
        fmt = {1: "b", 2: "h", 4: "i", 8: "q"}.get(size)
    else:
        fmt = ENTRY_TYPES.get(typ, (None, 0))[0]
    if fmt is None or pos < 0 or pos + struct.calcsize(fmt) > len(blob):
        return None
    value: int | float = struct.unpack_from("<" + fmt, blob, pos)[0]
    return value


def _column_for(name: str) -> str | None:
    low = name.lower().strip()
    if low == "rank" or low == "my rank":
        return "comm_rank"
    for needle, column in FIELD_COLUMNS:
        if needle != "rank" and needle in low:
            return column
    return None


def _headers(blob: bytes) -> list[tuple[int, int, int]]:
    """``[(schema id, payload size, payload offset), …]`` from a blob's header."""
    if len(blob) < 32:
        return []
    first = struct.unpack_from("<Q", blob, 0)[0]
    if 2 <= first <= 64 and 8 + 24 * first <= len(blob):
        heads = [struct.unpack_from("<3Q", blob, 8 + 24 * i) for i in range(first)]
        if all(sid >= SCHEMA_ID_BASE and off + size <= len(blob) for sid, size, off in heads):
            return [(int(s), int(z), int(o)) for s, z, o in heads]
    sid, size, off = struct.unpack_from("<3Q", blob, 8)
    if off + size > len(blob) or off < 32:
        return []
    return [(int(sid), int(size), int(off))]


def decode_blob(
    blob: bytes | None,
    schemas: PayloadSchemas,
    *,
    domain_id: int = 1,
    range_name: str | None = None,
) -> dict[str, Any]:
    """Decode one ``binaryData`` blob into ``{column: value}`` (see :data:`FIELD_COLUMNS`).

    Returns ``{}`` when the blob is empty or its schema is unknown. ``payload_schema`` says
    which description was used: ``"export"`` (the file's schema tables) or ``"builtin"``
    (:data:`NCCL_BUILTIN_LAYOUTS`, used when the file has no schema for the blob).
    """
    if not blob:
        return {}
    out: dict[str, Any] = {}
    for sid, _size, base in _headers(blob):
        layout = schemas.layout(domain_id, sid)
        source = "export"
        if layout is None and range_name in NCCL_BUILTIN_LAYOUTS:
            layout = list(NCCL_BUILTIN_LAYOUTS[range_name])
            source = "builtin"
        if layout is None:
            continue
        out.setdefault("payload_schema_id", sid)
        out.setdefault("payload_schema", source)
        for name, typ, off in layout:
            column = _column_for(name)
            if column is None or column in out:
                continue
            size = _entry_size(typ, domain_id, schemas.enum_sizes)
            value = _read(blob, base + off, typ, size)
            if value is None:
                continue
            if typ >= SCHEMA_ID_BASE and column == "reduction_code":
                out["reduction_name"] = schemas.enums.get((domain_id, typ), {}).get(int(value))
            out[column] = value
    return out


def decode_payloads(
    ranges: pl.DataFrame,
    schemas: PayloadSchemas,
) -> pl.DataFrame:
    """Decode the payload blob of every row of ``ranges``.

    Parameters
    ----------
    ranges
        NVTX rows with ``binary_data`` (Binary), ``domain_id`` and ``name`` (a slice of the
        ``nvtx`` table).
    schemas
        From :func:`read_payload_schemas`.

    Returns
    -------
    ``ranges`` in its order plus ``comm_id`` (UInt64: NCCL's ``commHash``), ``bytes``
    (message size as NCCL reports it: per-rank send count × type size for AllGather,
    per-rank receive count × type size for ReduceScatter, the buffer for the others),
    ``reduction`` (``Sum``, ``Prod``, ``Max``, ``Min``, ``Avg`` or ``custom(<n>)``), ``peer``,
    ``root``, ``comm_nranks``, ``comm_rank``, ``cuda_device``, ``dtype_code``,
    ``payload_schema_id`` and ``payload_schema`` (``"export"``, ``"builtin"``, null when no
    payload was decoded). Unique blobs are decoded once.
    """
    if ranges.height == 0 or "binary_data" not in ranges.columns:
        return _with_empty_payload(ranges)
    keys = ranges.select("binary_data", pl.col("domain_id").fill_null(0), "name").unique()
    decoded = []
    for blob, dom, name in keys.iter_rows():
        values = decode_blob(blob, schemas, domain_id=int(dom), range_name=name)
        reduction = values.pop("reduction_name", None)
        code = values.get("reduction_code")
        if reduction is None and code is not None:
            reduction = REDUCTION_OPS.get(int(code), f"custom({int(code)})")
        decoded.append({"binary_data": blob, "domain_id": int(dom), "name": name, **values,
                        "reduction": reduction})
    schema = {"binary_data": pl.Binary, "domain_id": pl.Int64, "name": pl.Utf8, **_OUT_SCHEMA,
              "reduction": pl.Utf8}
    table = pl.DataFrame(decoded, schema=schema)
    base = ranges.drop([c for c in (*_OUT_SCHEMA, "reduction") if c in ranges.columns])
    base = base.with_columns(pl.col("domain_id").fill_null(0).alias("_dom"))
    out = base.join(
        table.rename({"domain_id": "_dom"}), on=["binary_data", "_dom", "name"], how="left",
        nulls_equal=True, maintain_order="left",
    )
    return out.drop("_dom")


def _with_empty_payload(ranges: pl.DataFrame) -> pl.DataFrame:
    return ranges.with_columns(
        *(pl.lit(None, dtype=t).alias(c) for c, t in _OUT_SCHEMA.items()),
        pl.lit(None, dtype=pl.Utf8).alias("reduction"),
    )


def payload_columns() -> Iterable[str]:
    """Names of the columns :func:`decode_payloads` adds."""
    return (*_OUT_SCHEMA, "reduction")
