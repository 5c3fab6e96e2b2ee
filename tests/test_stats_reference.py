"""tracekit's summary reports equal `nsys stats` output, cell by cell.

Corpus references were printed by nsys 2023.4.4 (convention "2023"); the sample traces'
references by the nsys that captured them (2025.x, convention "2025").
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import tracekit
from tracekit.errors import UnsupportedReportError
from tracekit.stats import run_report

from .conftest import NSYS_CORPUS, NSYS_REFERENCE, SAMPLES
from .nsys_reference import assert_same_as_nsys, read_reference

REPORTS = ("cuda_gpu_kern_sum", "cuda_gpu_mem_time_sum", "cuda_gpu_mem_size_sum", "cuda_api_sum", "nvtx_sum", "cuda_gpu_trace")


def _corpus_cases() -> list[tuple[Path, Path]]:
    cases = []
    for ref_dir in sorted(NSYS_REFERENCE.glob("*")):
        for report in REPORTS:
            ref = ref_dir / f"{report}.csv"
            if ref.is_file():
                cases.append((NSYS_CORPUS / f"{ref_dir.name}.sqlite", ref))
    return cases


def _sample_cases() -> list[tuple[Path, Path]]:
    cases = []
    for ref in sorted(SAMPLES.rglob("stats/*.csv")):
        stem = ref.stem
        for report in REPORTS:
            if stem.endswith("_" + report):
                export = ref.parent.parent / f"{stem[: -len(report) - 1]}.sqlite"
                if export.is_file():
                    cases.append((export, ref))
    return cases


def _check(export: Path, ref: Path, convention: str) -> None:
    report = ref.stem.rsplit("_", 0)[0]
    report = next(r for r in REPORTS if report.endswith(r))
    reference = read_reference(ref)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trace = tracekit.open(export)
    if not reference:
        # nsys skipped this report; tracekit must either compute it or say why not
        try:
            run_report(trace, report, convention=convention)
        except UnsupportedReportError as exc:
            assert str(exc)
        return
    result = run_report(trace, report, convention=convention)
    # nvtx_sum orders by total only; equal totals may come in any order
    assert_same_as_nsys(result, reference, ordered=report != "nvtx_sum")


@pytest.mark.parametrize("export,ref", _corpus_cases(), ids=lambda p: f"{p.parent.name}/{p.stem}" if p.suffix == ".csv" else "")
def test_corpus_reports_equal_nsys_2023_4(export: Path, ref: Path) -> None:
    _check(export, ref, "2023")


@pytest.mark.parametrize("export,ref", _sample_cases(), ids=lambda p: p.stem if p.suffix == ".csv" else "")
def test_sample_reports_equal_capture_nsys(export: Path, ref: Path) -> None:
    _check(export, ref, "2025")


def test_rounding_conventions_differ_where_nsys_versions_differ() -> None:
    # 92799 ns / 20 = 4639.95: SQLite (2023.x) printed 4640.0, binary rounding gives 4639.9
    from tracekit.stats.common import round1

    assert round1(92799 / 20, "2023") == 4640.0
    assert round1(92799 / 20, "2025") == 4639.9
    ref = read_reference(NSYS_REFERENCE / "nsys2024.5_pipit_cloverleaf_4xa100" / "cuda_gpu_kern_sum.csv")
    assert any(row[1] == "92799" and row[3] == "4640.0" for row in ref)


def test_api_name_cleanup_quirk() -> None:
    import polars as pl

    from tracekit.stats.summaries import api_display_name

    names = pl.DataFrame({"n": ["cudaLaunchKernel_v7000", "cuGetProcAddress_v2", "cudaStreamIsCapturing_v10000", "cudaFree"]})
    out = names.select(api_display_name(pl.col("n")))["n"].to_list()
    assert out == ["cudaLaunchKernel", "cuGetProcAddress_v2", "cudaStreamIsCapturing_v10000", "cudaFree"]


def test_corpus_has_reference_cases() -> None:
    assert len(_corpus_cases()) >= 20
