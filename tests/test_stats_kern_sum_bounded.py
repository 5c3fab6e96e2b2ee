"""The windowed path of ``nvtx_kern_sum`` gives nsys's CSVs too.

From a few million kernels ``nvtx_kern_sum`` builds its (kernel, enclosing range) pairs a
window of kernel launches at a time and merges per-group value counts (on the 30 M-kernel
export the whole pair table, 86 M rows, did not fit 12 GB). Here the threshold is lowered so
that the small real exports take that path, with windows of 50 launches and merges every 100
rows (so every export is cut into many windows and the merges run), and every CSV is compared
with the one nsys printed.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit.errors import TraceMemoryError
from tracekit.nsys import database
from tracekit.stats import kern_sum_windows, nvtx_projection, run_report

from .conftest import SAMPLES
from .nsys_reference import read_reference
from .test_stats_nvtx_projection import (
    COARSE,
    _coarse_copy,
    _corpus_cases,
    _crossing_copy,
    _sample_cases,
    assert_identical,
)

REPORT = "nvtx_kern_sum"
DECODE = SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"


@pytest.fixture
def windowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvtx_projection, "KERN_SUM_WINDOWED_FROM", 0)
    monkeypatch.setattr(nvtx_projection, "KERN_SUM_WINDOW", 50)
    monkeypatch.setattr(kern_sum_windows, "COMPACT_ROWS", 100)
    monkeypatch.setattr(kern_sum_windows, "EXPAND_ROWS", 60)


def _open(path: Path):  # noqa: ANN202 - NsysTrace
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tracekit.open(path)


def _cases() -> list[tuple[Path, Path, str]]:
    return [
        *((e, r, "2025") for e, r, _ in _sample_cases((REPORT,))),
        *((e, r, "2023") for e, r, _ in _corpus_cases((REPORT,))),
    ]


def test_cases_exist() -> None:
    assert len(_cases()) >= 15


@pytest.mark.parametrize(("export", "ref", "convention"), _cases(), ids=lambda x: f"{x.parent.parent.name}/{x.stem}" if isinstance(x, Path) and x.suffix == ".csv" else "")
@pytest.mark.usefixtures("windowed")
def test_windowed_path_equals_nsys(export: Path, ref: Path, convention: str) -> None:
    reference = read_reference(ref)
    if not reference:  # nsys skipped the report (no NVTX): covered elsewhere
        pytest.skip("nsys printed no rows")
    assert_identical(run_report(_open(export), REPORT, convention=convention), reference)


@pytest.mark.usefixtures("windowed")
def test_windowed_path_with_coarse_timestamps(tmp_path: Path) -> None:
    """Calls ending exactly where a range ends (the boundary memberships), found window by window."""
    reference = read_reference(COARSE / f"ref_{REPORT}.csv")
    assert_identical(run_report(_open(_coarse_copy(tmp_path)), REPORT, convention="2023"), reference)


def test_windowed_path_with_crossing_ranges_equals_the_whole_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A start/end range crossing others (the exact joins on its thread), window by window: the
    same CSV; every number equal but the standard deviations, which a group-by over rows in
    another order gives to the last bits only."""
    copy = _crossing_copy(tmp_path)
    whole = run_report(_open(copy), REPORT)
    monkeypatch.setattr(nvtx_projection, "KERN_SUM_WINDOWED_FROM", 0)
    monkeypatch.setattr(nvtx_projection, "KERN_SUM_WINDOW", 7)
    windowed = run_report(_open(copy), REPORT)
    assert whole.frame.height > 100
    assert windowed.formatted_rows() == whole.formatted_rows()
    assert windowed.frame.drop("StdDev (ns)").equals(whole.frame.drop("StdDev (ns)"))
    std = (windowed.frame["StdDev (ns)"] - whole.frame["StdDev (ns)"]).abs() / whole.frame["StdDev (ns)"].clip(lower_bound=1.0)
    assert std.max() < 1e-12  # type: ignore[operator]


def test_the_environment_selects_the_windowed_path(monkeypatch: pytest.MonkeyPatch) -> None:
    whole = run_report(_open(DECODE), REPORT).frame
    taken: list[bool] = []
    real = nvtx_projection._kern_sum_windowed

    def spy(trace: object, convention: str) -> pl.DataFrame:
        taken.append(True)
        return real(trace, convention)  # type: ignore[arg-type]

    monkeypatch.setattr(nvtx_projection, "_kern_sum_windowed", spy)
    monkeypatch.setenv("TRACEKIT_KERN_SUM_WINDOWED_FROM", "0")
    assert run_report(_open(DECODE), REPORT).frame.drop("StdDev (ns)").equals(whole.drop("StdDev (ns)"))
    assert taken == [True]


def test_pairs_that_cannot_fit_whole_are_built_window_by_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """Below the room the whole pair table needs, the report is the same, built window by
    window; below the room the windows need, it is the one-line error naming them (polars
    would abort the process: SIGABRT at 7.5 GB under a 12 GB cap on 30 M kernels)."""
    expected = run_report(_open(DECODE), REPORT).frame
    pairs = nvtx_projection.projection(_open(DECODE), kernels_only=True).pairs().height
    assert pairs > 1000
    # as if each pair took 4 GB: the whole table cannot fit what is free
    monkeypatch.setattr(nvtx_projection, "_WHOLE_PAIR_BYTES", 4 << 30)
    assert run_report(_open(DECODE), REPORT).frame.drop("StdDev (ns)").equals(expected.drop("StdDev (ns)"))
    monkeypatch.setattr(database, "free_memory", lambda: 150_000)  # the reads need less, the windows ~0.3 MB
    with pytest.raises(TraceMemoryError, match=r"building nvtx_kern_sum's kernel/range pairs, window by window \(.* rows x 6 column\(s\)\) needs about"):
        run_report(_open(DECODE), REPORT)


def test_value_counts_give_the_whole_table_statistics() -> None:
    """Merged across windows (and folded), value counts give stat_aggs of the durations."""
    rows = pl.DataFrame({
        "_g": [1, 1, 1, 2, 1, 2, 2, 1],
        "duration_ns": [5, 9, 5, 4, 12, 4, 7, 1],
        "_gpu": [0, 1, 1, 2, 3, 4, 5, 6],
        "_r": [10, 10, 11, None, 10, 20, 20, 12],
    })
    acc = kern_sum_windows.KernSumWindows()
    for lo, hi in ((0, 3), (3, 5), (5, 8)):  # _gpu 1's rows in one window
        acc.add(rows.slice(lo, hi - lo))
    got = acc.finish(lambda keys: keys // 10).sort("_g")
    from tracekit.stats.common import stat_aggs

    want = rows.group_by("_g").agg(*stat_aggs("duration_ns")).sort("_g")
    assert got.select(want.columns).drop("_std").equals(want.drop("_std"))
    assert got["_std"].to_list() == pytest.approx(want["_std"].to_list(), rel=1e-12)
    assert got["_kinst"].to_list() == [4, 3]
    assert got["_ninst"].to_list() == [3, 1]
