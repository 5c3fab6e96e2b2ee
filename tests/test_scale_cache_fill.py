"""Filling the column cache of a big table reads a bounded number of columns per scan
(``CACHE_FILL_BYTES``), and the columns come back equal to an uncached read (issue 14 §1: a
76 M-row API table's eight integer columns were 4.9 GB in one read). The export is built by
repeating a real one (``benchmarks/make_big_trace.py``, decode sample, 100 k kernels)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_series_equal

import tracekit
from tracekit.nsys import database

from .conftest import build_big_trace

API = "CUPTI_ACTIVITY_KIND_RUNTIME"


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_big_trace(tmp_path_factory.mktemp("fill"), 100000)


def test_cache_fill_reads_a_few_columns_per_scan(big: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TRACEKIT_COLUMN_CACHE", "1")
    trace = tracekit.open(big)
    db = trace.db
    rows = db.scalar(f"SELECT count(*) FROM {API}")
    assert rows >= database.CACHE_MIN_ROWS  # else nothing is cached
    integer = [r[1] for r in db.rows(f'PRAGMA table_info("{API}")') if str(r[2]).upper() == "INTEGER"]
    monkeypatch.setattr(database, "CACHE_FILL_BYTES", rows * 8 * 3)  # three columns per scan
    scans: list[int] = []
    real = database.ExportDatabase._read_table

    def counted(self, table, exprs, schema, where="", **kwargs):  # type: ignore[no-untyped-def]
        if table == API:
            scans.append(len(exprs))
        return real(self, table, exprs, schema, where, **kwargs)

    monkeypatch.setattr(database.ExportDatabase, "_read_table", counted)
    assert db.cache_integer_columns(API)
    assert scans == [min(3, len(integer) - i) for i in range(0, len(integer), 3)]
    assert len(scans) >= 2
    cols = ["pid", "tid", "global_tid", "start_ns", "end_ns", "duration_ns", "name", "correlation_id"]
    cached = trace.columns_on_demand("cuda_api", cols)
    monkeypatch.setenv("TRACEKIT_COLUMN_CACHE", "0")
    plain = tracekit.open(big).cuda_api
    assert plain.height == rows
    for c in cols:
        assert_series_equal(cached[c], plain[c], check_names=False)
    # a second fill finds every column cached and reads nothing
    scans.clear()
    assert db.cache_integer_columns(API)
    assert scans == []
    assert isinstance(plain, pl.DataFrame)


def test_the_api_columns_read_a_column_at_a_time_fill_only_their_sources(big: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Diagnose's API columns come from six of the table's eight integer columns: the return
    values and call chains are not read into the cache for them (a report that needs them
    fills them later)."""
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TRACEKIT_COLUMN_CACHE", "1")
    trace = tracekit.open(big)
    cols = ["pid", "tid", "global_tid", "start_ns", "end_ns", "duration_ns", "name", "api", "correlation_id"]
    source = trace.columns_on_demand("cuda_api", cols)
    assert source.one_at_a_time
    cache = trace.db.column_cache
    assert cache is not None
    cached = {c for c in ("start", "end", "eventClass", "globalTid", "correlationId", "nameId", "returnValue", "callchainId")
              if cache.has(API, f'"{c}"')}
    assert cached == {"start", "end", "eventClass", "globalTid", "correlationId", "nameId"}
    monkeypatch.setenv("TRACEKIT_COLUMN_CACHE", "0")
    plain = tracekit.open(big).table("cuda_api", cols)
    for c in cols:
        assert_series_equal(source[c], plain[c], check_names=False)


def test_the_fill_budget_grows_with_the_export() -> None:
    """A small export's scans stay small (its fill is the run's peak); a big one's read up to
    1 GiB a scan (a scan costs a pass over the table's pages)."""
    assert database.fill_budget(0) == database.CACHE_FILL_BYTES
    assert database.fill_budget(363_589_632) == database.CACHE_FILL_BYTES  # h1x: 2 of its API table's 40 MB columns
    assert database.fill_budget(2_929_131_520) == int(0.1 * 2_929_131_520)  # s8x
    assert database.fill_budget(11_012_861_952) == database.CACHE_FILL_MAX_BYTES  # s30x
