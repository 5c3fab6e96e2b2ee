"""The big-trace paths of ``cuda_kern_exec_sum`` and ``nvtx_gpu_proj_sum`` (issue 14 §1) give
nsys's CSVs too.

Past a few million launches these reports switch to paths that hold less at a time: the
kernel summary codes its group keys into one integer and summarises one duration at a time,
the projection searches the calls' innermost ranges in chunks and reads the operations'
columns one at a time. The thresholds are lowered here so that the small real exports take
those paths (with chunks of 7 calls, so every export is cut into many), and every CSV is
compared with the one nsys printed.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit.analysis import op_launches
from tracekit.nsys.database import ExportDatabase
from tracekit.stats import launch, nvtx_projection, run_report

from .nsys_reference import read_reference
from .test_stats_nvtx_projection import (
    COARSE,
    _coarse_copy,
    _corpus_cases,
    _crossing_copy,
    _sample_cases,
    assert_identical,
)

REPORTS = ("cuda_kern_exec_sum", "nvtx_gpu_proj_sum")


@pytest.fixture
def big_trace_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "ONE_PASS_ROWS", 0)
    monkeypatch.setattr(op_launches, "LEAN_FROM_OPS", 0)
    monkeypatch.setattr(nvtx_projection, "INNERMOST_CHUNK", 7)
    # as if the column cache served the API table: each column is read afresh, none pinned
    monkeypatch.setattr(ExportDatabase, "caches", lambda self, table: True)


def _cases() -> list[tuple[Path, Path, str, str]]:
    return [
        *((e, r, rep, "2025") for e, r, rep in _sample_cases(REPORTS)),
        *((e, r, rep, "2023") for e, r, rep in _corpus_cases(REPORTS)),
    ]


def test_cases_exist() -> None:
    cases = _cases()
    assert {c[2] for c in cases} == set(REPORTS)
    assert len(cases) >= 20  # the samples (nsys 2025.x); the 2023 convention: the coarse copy below


@pytest.mark.parametrize(("export", "ref", "report", "convention"), _cases(), ids=lambda x: f"{x.parent.parent.name}/{x.stem}" if isinstance(x, Path) and x.suffix == ".csv" else "")
@pytest.mark.usefixtures("big_trace_paths")
def test_big_trace_paths_equal_nsys(export: Path, ref: Path, report: str, convention: str) -> None:
    reference = read_reference(ref)
    if not reference:  # nsys skipped the report (no NVTX, no launches): covered elsewhere
        pytest.skip("nsys printed no rows")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trace = tracekit.open(export)
    assert_identical(run_report(trace, report, convention=convention), reference)


@pytest.mark.usefixtures("big_trace_paths")
def test_big_trace_projection_with_coarse_timestamps(tmp_path: Path) -> None:
    """Calls ending exactly where a range ends (the boundary memberships), found chunk by chunk."""
    copy = _coarse_copy(tmp_path)
    reference = read_reference(COARSE / "ref_nvtx_gpu_proj_sum.csv")
    assert_identical(run_report(tracekit.open(copy), "nvtx_gpu_proj_sum", convention="2023"), reference)


@pytest.mark.usefixtures("big_trace_paths")
def test_big_trace_projection_with_crossing_ranges_matches_the_trace_report(tmp_path: Path) -> None:
    """A start/end range crossing others sends the totals down the pair expansion. The chunked
    sum's totals per range name equal those of ``nvtx_gpu_proj_trace``, which projects the
    whole trace at once."""
    copy = _crossing_copy(tmp_path)
    trace = tracekit.open(copy)
    summed = run_report(trace, "nvtx_gpu_proj_sum").frame.select(
        pl.col("Range"), "Style", "Total Proj Time (ns)", "Range Instances", "Total GPU Ops"
    )
    rows = run_report(tracekit.open(copy), "nvtx_gpu_proj_trace").frame.filter(pl.col("RangeId").is_not_null())
    expected = rows.group_by(pl.col("Name").alias("Range"), "Style").agg(
        pl.col("Projected Duration (ns)").sum().alias("Total Proj Time (ns)"),
        pl.len().cast(pl.Int64).alias("Range Instances"),
        pl.col("NumGPUOps").sum().alias("Total GPU Ops"),
    )
    assert summed.height > 5
    assert summed.sort("Range", "Style").to_dicts() == expected.sort("Range", "Style").to_dicts()
