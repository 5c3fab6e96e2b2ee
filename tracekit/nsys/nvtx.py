"""``NVTX_EVENTS`` → the ``nvtx`` table: ranges, marks and the rest, names and domains resolved."""

from __future__ import annotations

from collections.abc import Collection

import polars as pl

from tracekit.nsys import enums
from tracekit.nsys import schema as S
from tracekit.nsys.database import ExportSource
from tracekit.nsys.readers import (
    Col,
    lookup_strings,
    pid_from_global,
    read_projected,
    tid_from_global,
    wanted_columns,
)

DOMAIN_CREATE = 75


def nvtx(db: ExportSource, strings: pl.DataFrame, columns: Collection[str] | None = None) -> pl.DataFrame:
    """Every ``NVTX_EVENTS`` row, with ``name`` (registered string else ``text``) and ``domain``;
    only ``columns`` when given.

    Domain ids are per process: the name comes from the earliest domain-create row (event
    type 75) of the same pid. Domain 0 is the default domain (``domain`` null). A domain
    whose create row is missing (time-sliced exports) also has a null ``domain``; its
    ``domain_id`` is kept (nsys then shows the bare range name too).
    Open ranges keep a null ``end_ns``.
    """
    table = "NVTX_EVENTS"
    wanted = wanted_columns("nvtx", columns)
    if not db.has_table(table):
        return S.empty("nvtx").select(wanted)
    raw = [
        Col("start_ns", "start"),
        Col("end_ns", "end"),
        Col("event_type_id", "eventType"),
        Col("range_id", "rangeId"),
        Col("category", "category"),
        Col("color", "color"),
        Col("text", "text", pl.Utf8),
        Col("global_tid", "globalTid"),
        Col("end_global_tid", "endGlobalTid"),
        Col("text_id", "textId"),
        Col("domain_id", "domainId"),
        Col("uint64_value", "uint64Value"),
        Col("int64_value", "int64Value"),
        Col("double_value", "doubleValue", pl.Float64),
        Col("uint32_value", "uint32Value"),
        Col("int32_value", "int32Value"),
        Col("float_value", "floatValue", pl.Float64),
        Col("json_text_id", "jsonTextId"),
        Col("json_text_raw", "jsonText", pl.Utf8),
        Col("binary_data", "binaryData", pl.Binary, sql="CAST({col} AS BLOB)"),
    ]
    derived = {
        "pid": pid_from_global(pl.col("global_tid")),
        "tid": tid_from_global(pl.col("global_tid")),
        "duration_ns": pl.col("end_ns") - pl.col("start_ns"),
        "name": pl.coalesce(lookup_strings(pl.col("text_id"), strings), pl.col("text")),
        "json_text": pl.coalesce(lookup_strings(pl.col("json_text_id"), strings), pl.col("json_text_raw")),
        "event_type": enums.map_codes(pl.col("event_type_id"), enums.NVTX_EVENT_TYPE),
    }
    if "domain" not in wanted:
        return read_projected(db, table, "nvtx", raw, derived, wanted)
    # the domain's name is the name of its create row: build what that lookup needs too
    inputs = [c for c in S.NVTX if c in {*wanted, "pid", "domain_id", "event_type_id", "start_ns", "name"}]
    frame = read_projected(db, table, "nvtx", raw, derived, inputs)
    domains = (
        frame.filter(pl.col("event_type_id") == DOMAIN_CREATE)
        .sort("start_ns")
        .group_by("pid", "domain_id", maintain_order=True)
        .agg(pl.col("name").first().alias("domain"))
    )
    # the names joined to the two key columns only, not to the whole frame (1 M ranges: a copy
    # of every column read, ~60 MB); none to join where the export created no domain
    if domains.height:
        named = frame.select("pid", "domain_id").join(domains, on=["pid", "domain_id"], how="left", maintain_order="left")
        domain: pl.Expr | pl.Series = named.get_column("domain")
        del named
    else:
        domain = pl.lit(None, pl.Utf8)
    frame = frame.with_columns(
        pl.when(pl.col("domain_id").fill_null(0) == 0).then(None).otherwise(domain).alias("domain")
    )
    return S.conform(frame, "nvtx", wanted)


def ranges(frame: pl.DataFrame) -> pl.DataFrame:
    """Push/pop and start/end ranges of an ``nvtx`` table (marks and metadata rows dropped)."""
    return frame.filter(pl.col("event_type_id").is_in(list(enums.NVTX_RANGE_TYPES)))


def qualified_name(
    name: pl.Expr | None = None, domain: pl.Expr | None = None, *, colon_default: bool = False
) -> pl.Expr:
    """nsys's display name of a range: ``domain:name`` in a named domain; in the default
    domain (or one whose name the export lost) the bare ``name``, or ``:name`` with
    ``colon_default`` (what nsys 2025.x prints). Columns default to ``name`` and ``domain``."""
    name = pl.col("name") if name is None else name
    domain = pl.col("domain") if domain is None else domain
    bare = pl.format(":{}", name) if colon_default else name
    return pl.when(domain.is_null()).then(bare).otherwise(pl.format("{}:{}", domain, name))
