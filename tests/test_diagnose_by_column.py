"""``diagnose`` of a big export without its kernel and operation tables (issue 14 §1).

Past :data:`~tracekit.diagnosis.ops_by_column.MIN_KERNELS` kernels, the diagnosis context
answers each filter of the operations a column at a time (:class:`OpsByColumn`) instead of
holding them. Here the threshold is lowered so that real exports take that path, and each
answer is compared with the same filter on the whole tables built by the loader: the
findings, the window, and ``ops.filter(expr)`` row for row. One export is big enough for
the column cache (a 300 k-kernel repeat of the decode sample), so the cached one-column reads
and the gathers after them run for real; the others read their columns in one go.
"""

from __future__ import annotations

import sqlite3
import warnings
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit.analysis._frames import gpu_ops
from tracekit.diagnosis import DiagnoseConfig, diagnose
from tracekit.diagnosis import ops_by_column as obc
from tracekit.nsys import database

from .conftest import (
    NSYS_CORPUS,
    SAMPLES,
    build_big_trace,
    force_by_column,
    growth_moved_into_layer,
    llm_capture,
    llm_capture_names,
    mutated_copy,
)

SAMPLED = DiagnoseConfig(exact_steps=3, sample_steps=2, max_window_ops=50)
EXPORTS = [p for p in sorted(SAMPLES.rglob("*.sqlite")) if "per_rank" not in p.name] + sorted(NSYS_CORPUS.glob("*.sqlite"))
INT64_MAX = (1 << 63) - 1


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_big_trace(tmp_path_factory.mktemp("bycol"), 300_000)


@pytest.fixture
def by_column(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> list[obc.OpsByColumn]:
    """Every export takes the by-column path, its columns from a real column cache (in a
    temporary folder; small tables allowed in); the instances made are collected (so a test
    can tell that the path ran)."""
    return force_by_column(monkeypatch, tmp_path_factory.mktemp("bycol_cache"))


def _whole(path: Path, config: DiagnoseConfig):  # type: ignore[no-untyped-def]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return diagnose(tracekit.open(path), config=config)


def _has_kernels(path: Path) -> bool:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return bool(con.execute("SELECT count(*) FROM sqlite_master WHERE name = 'CUPTI_ACTIVITY_KIND_KERNEL'").fetchone()[0])
    finally:
        con.close()


@pytest.mark.parametrize("config", [DiagnoseConfig(), SAMPLED], ids=["default", "sampled"])
@pytest.mark.parametrize("path", [p for p in EXPORTS if _has_kernels(p)], ids=lambda p: p.stem)
def test_findings_and_window_equal_the_whole_tables(path: Path, config: DiagnoseConfig, request: pytest.FixtureRequest) -> None:
    expected = _whole(path, config)  # before the fixture: the whole-table path
    made = request.getfixturevalue("by_column")
    trace = tracekit.open(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = diagnose(trace, config=config)
    assert made, "the by-column path ran"
    assert not trace.is_loaded("kernels")
    assert got.window.start_ns == expected.window.start_ns and got.window.end_ns == expected.window.end_ns
    assert (got.window.method, got.window.steps, got.window.sample_start_ns, got.window.sample_end_ns) == (
        expected.window.method, expected.window.steps, expected.window.sample_start_ns, expected.window.sample_end_ns)
    assert got.findings.equals(expected.findings)


def _phases(path: Path) -> pl.DataFrame:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return diagnose(tracekit.open(path)).phases


@pytest.mark.parametrize(
    "path", [*(p for p in EXPORTS if _has_kernels(p)), *(llm_capture(n) for n in llm_capture_names())], ids=lambda p: p.stem
)
def test_generation_phases_equal_the_whole_tables(path: Path, request: pytest.FixtureRequest) -> None:
    """The phases read every operation's columns narrow (names as codes) on the by-column
    path: the same steps as from the whole tables, on the HF generate, CUDA-graph and
    torch.compile captures (which have phases) and every other export."""
    expected = _phases(path)
    made = request.getfixturevalue("by_column")
    got = _phases(path)
    assert made, "the by-column path ran"
    assert got.equals(expected)


def test_generation_phases_are_found_by_column() -> None:
    """The comparison above is not of empty tables only: the generate captures have phases."""
    assert _phases(llm_capture("hf_generate_eager")).height > 0


def test_the_cached_big_export_is_diagnosed_by_column_with_the_same_findings(
    big: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TRACEKIT_COLUMN_CACHE", "1")
    config = DiagnoseConfig(max_window_ops=20_000)  # 300 k kernels: the window is sampled
    expected = _whole(big, config)
    assert expected.window.sampled
    monkeypatch.setattr(obc, "MIN_KERNELS", 100_000)
    trace = tracekit.open(big)
    assert obc.by_column(trace) is not None  # the real test: table size and cache, not a patch
    got = diagnose(trace, config=config)
    assert got.findings.equals(expected.findings)
    assert (got.window.start_ns, got.window.end_ns, got.window.sample_start_ns) == (
        expected.window.start_ns, expected.window.end_ns, expected.window.sample_start_ns)
    assert not trace.is_loaded("kernels")


def _ops(trace) -> pl.DataFrame:  # type: ignore[no-untyped-def]
    return gpu_ops(trace.kernels, trace.memcpys, trace.memsets)


def _predicates(ops: pl.DataFrame) -> list[pl.Expr]:
    lo, hi = int(ops["start_ns"].min()), int(ops["end_ns"].max())
    a, b = lo + (hi - lo) // 3, lo + 2 * (hi - lo) // 3
    ids = ops["correlation_id"].drop_nulls().unique().sort().gather_every(7)
    return [
        (pl.col("end_ns") > a) & (pl.col("start_ns") < b),
        (pl.col("start_ns") >= a) & (pl.col("start_ns") < b),
        pl.col("correlation_id").is_in(ids.implode()),
        pl.lit(True),
        pl.lit(False),
        pl.col("start_ns") > hi,  # nothing
    ]


def _check_where(trace, source: obc.OpsByColumn) -> None:  # type: ignore[no-untyped-def]
    ops = _ops(trace)
    kernels = trace.kernels.select(obc.KERNEL_COLUMNS)
    for expr in _predicates(ops):
        got, got_k = source.where_with_kernels(expr)
        assert got.equals(ops.filter(expr)), str(expr)
        assert got_k.equals(kernels.filter(expr)), str(expr)
    assert source.columns == ops.columns
    assert source.kernel_rows == trace.kernels.height


@pytest.mark.usefixtures("by_column")
@pytest.mark.parametrize("path", [SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite",
                                  SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"], ids=lambda p: p.stem)
def test_where_gives_the_rows_of_the_whole_operations(path: Path) -> None:
    source = obc.by_column(tracekit.open(path))
    assert source is not None
    _check_where(tracekit.open(path), source)


def test_where_on_the_cached_big_export(big: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TRACEKIT_COLUMN_CACHE", "1")
    monkeypatch.setattr(obc, "MIN_KERNELS", 100_000)
    source = obc.by_column(tracekit.open(big))
    assert source is not None
    assert source._src._from_cache()  # one column at a time from the cache
    _check_where(tracekit.open(big), source)


@pytest.mark.usefixtures("by_column")
def test_an_int64_max_end_is_left_out_as_gpu_ops_leaves_it_out(tmp_path: Path) -> None:
    """The bound of implausible ends is the whole table's (max start + span), not the part's."""
    src = SAMPLES / "llm_train_emit_nvtx_1gpu" / "llm_train_emit_nvtx_1gpu.sqlite"
    path = mutated_copy(src, tmp_path / "kmax.sqlite", f'UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = {INT64_MAX} WHERE rowid = 7')
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trace = tracekit.open(path)
        source = obc.by_column(tracekit.open(path))
        assert source is not None
        ops = _ops(trace)
        assert ops.height == trace.kernels.height + trace.memcpys.height + trace.memsets.height - 1
        _check_where(trace, source)
        assert source.narrow(["start_ns"]).height == ops.height


@pytest.mark.usefixtures("by_column")
@pytest.mark.parametrize("path", [SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite",
                                  SAMPLES / "planted" / "planted_clean_nonvtx" / "planted_clean_nonvtx.sqlite"],
                         ids=lambda p: p.stem)
def test_narrow_codes_names_one_to_one(path: Path) -> None:
    trace = tracekit.open(path)
    source = obc.by_column(tracekit.open(path))
    assert source is not None
    cols = ["device_id", "start_ns", "end_ns", "duration_ns", "name"]
    got = source.narrow(cols)
    ops = _ops(trace).select(cols)
    assert got.drop("name").equals(ops.drop("name"))
    assert got["name"].dtype == pl.Int64
    pairs = pl.DataFrame({"code": got["name"], "name": ops["name"]}).unique()
    # one code per name and one name per code: the period search sees the same sequence
    assert pairs["code"].n_unique() == pairs.height == pairs["name"].n_unique()
    assert pairs.height > 3


@pytest.mark.usefixtures("by_column")
def test_distinct_names_are_the_kernel_tables() -> None:
    path = SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"
    trace = tracekit.open(path)
    source = obc.by_column(tracekit.open(path))
    assert source is not None
    for col in ("name", "short_name"):
        assert sorted(source.distinct(col).to_list(), key=repr) == sorted(trace.kernels[col].unique().to_list(), key=repr)


def test_small_exports_and_loaded_tables_keep_the_whole_path() -> None:
    path = SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
    assert obc.by_column(tracekit.open(path)) is None  # a few thousand kernels
    trace = tracekit.open(path)
    trace.kernels  # noqa: B018
    assert obc.by_column(trace) is None


@pytest.mark.parametrize("kind", ["parquetdir", "arrowdir"])
def test_nsys_folders_are_diagnosed_by_column_as_their_sqlite_export(kind: str, nsys_columnar: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An nsys folder gives one column at a time by itself (no cache needed)."""
    sqlite = nsys_columnar / "memfusion_report1.sqlite"
    expected = _whole(sqlite, SAMPLED)
    monkeypatch.setattr(obc, "MIN_KERNELS", 0)
    trace = tracekit.open(nsys_columnar / f"memfusion_report1.{kind}")
    assert obc.by_column(trace) is not None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = diagnose(trace, config=SAMPLED)
    assert got.findings.equals(expected.findings)
    assert (got.window.start_ns, got.window.end_ns, got.window.method) == (
        expected.window.start_ns, expected.window.end_ns, expected.window.method)


_DAMAGE = {
    # an export from before shortName / globalPid (old nsys), read from the column cache
    "no_short_name_no_global_pid": ["ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN shortName",
                                    "ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN globalPid"],
    # kernel names that are no StringIds id, and text in integer cells (read as null)
    "unknown_names_and_text_cells": ["UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET demangledName = 987654321 WHERE rowid % 7 = 1",
                                     "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET deviceId = 'd' WHERE rowid % 13 = 3",
                                     "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'x' WHERE rowid % 17 = 3"],
    # only copies and memsets: an empty kernel table
    "no_kernels": ["DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL"],
}


@pytest.mark.usefixtures("by_column")
@pytest.mark.parametrize("damage", sorted(_DAMAGE))
@pytest.mark.parametrize("name", ["planted_clean_nonvtx", "planted_memory_growth"])  # kernel period / NVTX steps
def test_damaged_copies_through_the_column_cache_give_the_whole_tables_findings(
    name: str, damage: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mutated copies of real exports, small tables put in the column cache as a big one's are
    (so the one-column reads and the gathers of derived columns run): same window and findings
    as the whole tables, and ``ops.filter(expr)`` row for row."""

    path = mutated_copy(SAMPLES / "planted" / name / f"{name}.sqlite", tmp_path / f"{name}_{damage}.sqlite", *_DAMAGE[damage])
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TRACEKIT_COLUMN_CACHE", "1")
    with monkeypatch.context() as whole:  # the loader's path: nothing by column
        whole.setattr(obc, "MIN_KERNELS", 10**12)
        expected = _whole(path, SAMPLED)
    monkeypatch.setattr(database, "CACHE_MIN_ROWS", 1)
    trace = tracekit.open(path)
    source = obc.by_column(trace)
    if damage == "no_kernels":  # an empty table is not cached: the whole-table path (nothing to hold)
        assert source is None
    else:
        assert source is not None and source._src.one_at_a_time
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = diagnose(trace, config=SAMPLED)
    assert not trace.is_loaded("kernels")
    assert (got.window.start_ns, got.window.end_ns, got.window.method, got.window.sample_start_ns) == (
        expected.window.start_ns, expected.window.end_ns, expected.window.method, expected.window.sample_start_ns)
    assert got.findings.equals(expected.findings)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if source is not None:
            _check_where(tracekit.open(path), obc.by_column(tracekit.open(path)))  # row for row


def test_a_cache_that_cannot_be_filled_keeps_the_whole_table_path(big: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the cache on but unable to take the kernel columns (here: no room to write them),
    the column source would read all of them, names included, as one frame: the by-column path
    is not taken (the whole-table path reads fewer columns)."""
    from tracekit.nsys import column_cache

    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TRACEKIT_COLUMN_CACHE", "1")
    monkeypatch.setattr(obc, "MIN_KERNELS", 100_000)
    assert obc.by_column(tracekit.open(big)) is not None  # with room
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "full"))
    monkeypatch.setattr(column_cache.ColumnCache, "put", lambda self, *a, **k: None)  # nothing gets written
    assert obc.by_column(tracekit.open(big)) is None


def test_growth_inside_a_layer_on_a_sampled_window_by_column(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a sampled window of a big export the NVTX table is cut to the window's ranges once
    the structure is found (``Context.keep_window_nvtx``); the memory-growth rule still tells
    the step ranges from the layers inside them by their row numbers in the whole table. On
    the planted growth moved into each step's ``layer.2``, the by-column path names that
    range, with the whole tables' findings (before the fix the renumbered step ranges were no
    longer left out, and the step range itself was named)."""
    path = tmp_path / "growth_in_layer2.sqlite"
    assert growth_moved_into_layer(SAMPLES / "planted" / "planted_memory_growth" / "planted_memory_growth.sqlite", path) >= 10
    config = DiagnoseConfig(exact_steps=3, sample_steps=4, max_window_ops=50)  # growth needs a few steps
    expected = _whole(path, config)
    force_by_column(monkeypatch, tmp_path / "cache")
    trace = tracekit.open(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = diagnose(trace, config=config)
    assert got.window.sample_start_ns is not None  # a sampled window: the NVTX table was cut
    assert expected.window.sample_start_ns == got.window.sample_start_ns
    title = got.findings.filter(pl.col("category") == "memory_growth")["title"][0]
    assert "inside NVTX range 'layer.2'" in title, title
    assert got.findings.equals(expected.findings)
