"""``NsysTrace.strings_of``: the ``StringIds`` rows of some ids, read by key on a cold export
(the reports name a few kernels of a large string table), equal to those rows of the whole
table; and the reports that use it give the same text as with the whole table read."""

from __future__ import annotations

import warnings
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import tracekit
from tracekit import stats
from tracekit.nsys import readers
from tracekit.nsys import trace as trace_module
from tracekit.nsys.database import InvalidTextWarning

from .conftest import SAMPLES, corpus_files, mutated_copy, sample_exports

DECODE = SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
REPORTS = ("cuda_kern_exec_sum", "nvtx_gpu_proj_sum", "cuda_gpu_kern_sum")


def _kernel_name_ids(trace: tracekit.NsysTrace) -> pl.Series:
    return trace.db.query('SELECT "demangledName" FROM CUPTI_ACTIVITY_KIND_KERNEL', {"i": pl.Int64})["i"]


def _exports() -> list[Path]:
    return [*sample_exports()[:4], *corpus_files()[:4]]


@pytest.mark.parametrize("path", _exports(), ids=lambda p: p.stem)
def test_rows_of_ids_equal_the_whole_table(path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trace = tracekit.open(path, column_cache=False)
        if not trace.db.has_table("CUPTI_ACTIVITY_KIND_KERNEL"):
            pytest.skip("no kernel table")
        ids = _kernel_name_ids(trace)
        some = trace.strings_of(ids, pl.Series([10**12, None], dtype=pl.Int64))  # an unknown id, a null
        by_key = "strings" not in trace.__dict__
        whole = tracekit.open(path, column_cache=False).strings
    wanted = whole.filter(pl.col("id").is_in(ids.unique().implode()))
    assert wanted.height > 0
    if by_key:  # read by key: exactly the rows asked for that exist
        assert_frame_equal(some.sort("id"), wanted.sort("id"))
    else:  # the ids were a quarter of the table or more: the whole table
        assert ids.n_unique() * trace_module._LOOKUP_ROWS >= whole.height
        assert_frame_equal(some, whole)


def test_read_by_key_only_below_a_quarter_of_the_table() -> None:
    trace = tracekit.open(DECODE, column_cache=False)
    ids = _kernel_name_ids(trace)
    rows = trace.db.row_estimate("StringIds")
    assert ids.n_unique() * 4 < rows  # 13 names of 1,213 strings
    assert trace.strings_of(ids).height == ids.n_unique()
    assert "strings" not in trace.__dict__
    assert trace.strings_of().height == 0  # no ids: no rows, nothing read
    # a quarter or more of the table asked for: the table itself, read once and kept
    many = pl.Series(range(rows // 4 + 1), dtype=pl.Int64)
    assert trace.strings_of(many) is trace.strings
    # once read, the table answers every later call
    assert trace.strings_of(ids) is trace.strings


def test_kept_strings_answer_without_a_lookup(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACEKIT_CACHE", str(cache))
        mp.setattr("tracekit.nsys.database.CACHE_MIN_ROWS", 1)  # the small sample's tables are cached
        first = tracekit.open(DECODE, column_cache=True)
        whole = first.strings  # fills the column cache
        assert first.db.all_cached("StringIds", readers.STRING_EXPRS)
        second = tracekit.open(DECODE, column_cache=True)
        got = second.strings_of(_kernel_name_ids(second))
        assert "strings" in second.__dict__  # from the cache, not by key
        assert_frame_equal(got, whole)


def _csv(path: Path, report: str, *, by_key: bool, mp: pytest.MonkeyPatch) -> str:
    mp.setattr(trace_module, "_LOOKUP_ROWS", 4 if by_key else 10**9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trace = tracekit.open(path, column_cache=False)
        out = stats.run_report(trace, report, convention="2023").to_csv()
        if by_key and report == "cuda_kern_exec_sum" and readers.strings_keyed(trace.db):  # its names only, by key
            assert "strings" not in trace.__dict__
    return out


@pytest.mark.parametrize("report", REPORTS)
def test_reports_equal_with_names_read_by_key(report: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two kernel names given one text (grouped by text then), a name that is not UTF-8: the
    reports with the names read by key equal those with the whole table."""
    trace = tracekit.open(DECODE, column_cache=False)
    a, b, c = _kernel_name_ids(trace).unique().sort().head(3).to_list()
    damaged = mutated_copy(
        DECODE, tmp_path / "names.sqlite",
        f"UPDATE StringIds SET value = (SELECT value FROM StringIds WHERE id = {a}) WHERE id = {b}",
        f"UPDATE StringIds SET value = CAST(X'6B65726E656C5FFF' AS TEXT) WHERE id = {c}",
    )  # fmt: skip
    for path in (DECODE, damaged):
        by_key = _csv(path, report, by_key=True, mp=monkeypatch)
        whole = _csv(path, report, by_key=False, mp=monkeypatch)
        assert by_key == whole
        assert by_key.count("\n") > 1


def test_invalid_text_read_by_key_warns_and_decodes(tmp_path: Path) -> None:
    trace = tracekit.open(DECODE, column_cache=False)
    c = int(_kernel_name_ids(trace).max())  # type: ignore[arg-type]
    damaged = mutated_copy(DECODE, tmp_path / "bad.sqlite", f"UPDATE StringIds SET value = CAST(X'6B5FFF' AS TEXT) WHERE id = {c}")
    bad = tracekit.open(damaged, column_cache=False)
    with pytest.warns(InvalidTextWarning, match="StringIds.value"):
        got = bad.strings_of(pl.Series([c]))
    assert got.rows() == [(c, "k_\ufffd")]


def test_names_without_text_are_one_group_as_nsys_groups_them(tmp_path: Path) -> None:
    """Two kernels whose name ids the export lacks (damage) are one group of blank names, as
    nsys 2023.4.4 prints ``cuda_kern_exec_sum`` of such a file (measured: one row, ``Count``
    2), whether the names are read by key or the whole table is."""
    damaged = mutated_copy(
        DECODE, tmp_path / "unknown.sqlite",
        "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET demangledName = 999991 WHERE rowid = 1",
        "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET demangledName = 999992 WHERE rowid = 2",
    )  # fmt: skip
    got = {}
    for by_key in (True, False):
        with pytest.MonkeyPatch.context() as mp:
            got[by_key] = _csv(damaged, "cuda_kern_exec_sum", by_key=by_key, mp=mp)
        blank = [line for line in got[by_key].splitlines() if line.endswith(",")]
        assert len(blank) == 1 and blank[0].split(",")[3] == "2"  # Count
    assert got[True] == got[False]


@pytest.mark.parametrize("edit", [
    # no id column: names blank (nsys itself fails on this file)
    'ALTER TABLE StringIds RENAME COLUMN id TO ident',
    # ids in a column without the integer key, one stored as text: the whole table is read
    "CREATE TABLE S2(id, value); INSERT INTO S2 SELECT id, value FROM StringIds; DROP TABLE StringIds; "
    "ALTER TABLE S2 RENAME TO StringIds; UPDATE StringIds SET id = CAST(id AS TEXT) WHERE id = "
    "(SELECT max(demangledName) FROM CUPTI_ACTIVITY_KIND_KERNEL)",
])
def test_string_table_without_its_key_is_read_whole(edit: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``StringIds`` without ``id`` as its ``INTEGER PRIMARY KEY`` (damage) is never read by key:
    the reports equal those made from the whole table, and nothing raises."""
    damaged = mutated_copy(DECODE, tmp_path / "nokey.sqlite", *edit.split("; "))
    assert not readers.strings_keyed(tracekit.open(damaged, column_cache=False).db)
    for report in REPORTS:
        assert _csv(damaged, report, by_key=True, mp=monkeypatch) == _csv(damaged, report, by_key=False, mp=monkeypatch)
