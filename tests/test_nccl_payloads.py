"""NVTX payload blobs of NCCL ranges (layout verified on real blobs) and kernel-name parsing."""

from __future__ import annotations

import sqlite3
import struct

import polars as pl
import pytest

from tests.conftest import SAMPLES
from tracekit.analysis.nccl import parse_kernel_name
from tracekit.analysis.nccl_payloads import decode_blob, decode_payloads, read_payload_schemas
from tracekit.nsys.trace import NsysTrace

TP2 = SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"
TP2PP2 = SAMPLES / "llm_tp2pp2_nccl" / "llm_tp2pp2_nccl.sqlite"


@pytest.fixture(scope="module")
def tp2() -> NsysTrace:
    if not TP2.exists():
        pytest.skip("sample llm_tp2_nccl not present")
    return NsysTrace(TP2)


@pytest.mark.parametrize("path", [TP2, TP2PP2], ids=["tp2", "tp2pp2"])
def test_blob_header_layout(path) -> None:
    """Every blob: u64 1, u64 schema id, u64 payload size, u64 offset 32, then the payload."""
    if not path.exists():
        pytest.skip("sample not present")
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    sizes = {(d, s): z for d, s, z in con.execute("SELECT domainId, schemaId, payloadSize FROM NVTX_PAYLOAD_SCHEMAS")}
    blobs = con.execute("SELECT domainId, CAST(binaryData AS BLOB) FROM NVTX_EVENTS WHERE binaryData IS NOT NULL").fetchall()
    con.close()
    assert blobs
    for dom, blob in blobs:
        first, schema, size, offset = struct.unpack_from("<4Q", blob)
        assert first == 1 and offset == 32
        assert sizes[(dom, schema)] == size
        assert len(blob) == 32 + size


def test_schema_tables_are_deduplicated(tp2: NsysTrace) -> None:
    schemas = read_payload_schemas(tp2.db)
    e = schemas.entries
    assert e.height == e.select("domain_id", "schema_id", "idx").unique().height == 16
    ar = schemas.layout(1, 0x01000005)
    assert ar == [("NCCL communicator ID", 18, 0), ("Message size [bytes]", 22, 8), ("Reduction operation", 0x01000014, 16)]
    assert schemas.enums[(1, 0x01000014)][0] == "Sum"  # NULL value in the export means 0


def test_decode_known_blob(tp2: NsysTrace) -> None:
    schemas = read_payload_schemas(tp2.db)
    # an ncclAllReduce blob of the sample, as stored (padding after the op is garbage)
    blob = bytes.fromhex(
        "0100000000000000" "0500000100000000" "1800000000000000" "2000000000000000"
        "8482DFC2CEE1036E" "0020000000000000" "00000000FF7F0000"
    )
    got = decode_blob(blob, schemas, domain_id=1, range_name="ncclAllReduce")
    assert got["comm_id"] == 0x6E03E1CEC2DF8284
    assert got["bytes"] == 8192 and got["reduction_code"] == 0 and got["reduction_name"] == "Sum"
    assert got["payload_schema"] == "export"
    # without schema tables the built-in NCCL layout gives the same
    from tracekit.analysis.nccl_payloads import PayloadSchemas

    builtin = decode_blob(blob, PayloadSchemas(), domain_id=1, range_name="ncclAllReduce")
    assert builtin["bytes"] == 8192 and builtin["comm_id"] == got["comm_id"]
    assert builtin["payload_schema"] == "builtin"
    assert decode_blob(None, schemas) == {} and decode_blob(b"\x01" * 8, schemas) == {}


def test_decode_every_nccl_range(tp2: NsysTrace) -> None:
    ranges = tp2.nvtx.filter(pl.col("domain") == "NCCL")
    out = decode_payloads(ranges, read_payload_schemas(tp2.db))
    assert out.height == ranges.height
    with_blob = out.filter(pl.col("binary_data").is_not_null())
    assert with_blob["payload_schema"].null_count() == 0
    send = out.filter(pl.col("name") == "ncclSend")
    assert set(send["peer"]) == {1} and set(send["bytes"]) == {32}
    assert out.filter(pl.col("name") == "ncclGroupStart")["comm_id"].null_count() == 16


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)",
         ("AllReduce", "Sum", "bf16", "RING", "LL", "ncclDevKernel")),
        ("ncclDevKernel_AllGather_RING_LL", ("AllGather", None, None, "RING", "LL", "ncclDevKernel")),
        ("ncclDevKernel_ReduceScatter_Sum_f32_COLLNET_DIRECT_SIMPLE",
         ("ReduceScatter", "Sum", "f32", "COLLNET_DIRECT", "SIMPLE", "ncclDevKernel")),
        ("ncclDevKernel_AllReduce_Sum_u32_NVLS_TREE_SIMPLE", ("AllReduce", "Sum", "u32", "NVLS_TREE", "SIMPLE", "ncclDevKernel")),
        ("ncclDevKernel_SendRecv", ("SendRecv", None, None, None, None, "ncclDevKernel")),
        ("ncclDevKernel_Generic_1(ncclDevKernelArgsStorage<4096ul>)", (None, None, None, None, None, "ncclDevKernel")),
        ("ncclSymkDevKernel_AllReduce_AGxLL_R_sum_bf16", ("AllReduce", "Sum", "bf16", "AGxLL_R", None, "symmetric")),
        ("ncclSymkDevKernel_AllGather_LLMC_profile", ("AllGather", None, None, "LLMC", None, "symmetric")),
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", ("AllReduce", "Sum", "f32", "RING", "LL", "ncclKernel")),
        ("ncclKernel_AllReduce_TREE_LL128_Sum___nv_bfloat16", ("AllReduce", "Sum", "bf16", "TREE", "LL128", "ncclKernel")),
        ("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
         ("AllGather", "Sum", None, "RING", "LL", "ncclKernel")),
        ("_Z42ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_tP11ncclDevCommPvP8ncclWork",
         ("SendRecv", None, None, None, None, "ncclKernel")),
        ("_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL24ncclDevKernelArgsStorageILm4096EE",
         ("AllReduce", "Sum", "f32", "RING", "LL", "ncclDevKernel")),
        ("ncclFooKernel", (None, None, None, None, None, "unknown")),
        ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", ("SendRecv", None, None, None, None, "ncclKernel")),
        ("ncclAllReduceRingLLKernel_sum_f32(ncclColl)", ("AllReduce", "Sum", "f32", "RING", "LL", "legacy")),
        ("ncclAllReduceTreeLL128Kernel_sum_f16", ("AllReduce", "Sum", "f16", "TREE", "LL128", "legacy")),
        ("ncclBroadcastRingLLKernel_copy_i8", ("Broadcast", None, None, "RING", "LL", "legacy")),
        ("ncclSendRecvKernel_copy_i8", ("SendRecv", None, None, None, None, "legacy")),
    ],
)
def test_parse_kernel_name_eras(name: str, expected: tuple) -> None:
    p = parse_kernel_name(name)
    got = (p["kernel_op"], p["reduction"], p["dtype"], p["algorithm"], p["protocol"], p["naming_era"])
    assert got == expected
