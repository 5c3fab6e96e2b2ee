"""The launch join of ``cuda_kern_exec_sum`` and ``cuda_kern_exec_trace`` kept in the column
cache (issue 14 §3).

A cold run computes the join and keeps each launch's kernel row and API columns as derived
columns beside the kernel table's; a warm run reads those instead of the API table and the
kernels' correlation ids. Both must print nsys's CSV on every sample (nsys 2025.3 references)
and corpus export (nsys 2023.4 references), including the export whose kernels each match two
API rows; a damaged derived column is dropped with a warning and computed again.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import tracekit
from tracekit.nsys import database
from tracekit.nsys.column_cache import CacheIntegrityWarning, ColumnCache
from tracekit.stats import launch, run_report

from .conftest import NSYS_CORPUS
from .nsys_reference import read_reference
from .test_stats_nvtx_projection import _corpus_cases, _sample_cases, assert_identical

KERNELS = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
DERIVED = ("lrow", "api.global_tid", "api.name", "api.start_ns", "api.end_ns")


REPORTS = ("cuda_kern_exec_sum", "cuda_kern_exec_trace")


def _cases() -> list[tuple[Path, Path, str, str]]:
    samples = [(e, r, rep, "2025") for e, r, rep in _sample_cases(REPORTS)]
    corpus = [(e, r, rep, "2023") for e, r, rep in _corpus_cases(REPORTS) if read_reference(r)]
    return samples + corpus


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh column cache that takes every table, however small."""
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(database, "CACHE_MIN_ROWS", 1)
    return tmp_path / "cache"


def _open(path: Path):  # noqa: ANN202 - NsysTrace
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tracekit.open(path)


def _reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every (table, expression) read from the column cache from now on."""
    reads: list[tuple[str, str]] = []
    original = ColumnCache.get

    def get(self: ColumnCache, table: str, expr: str):  # noqa: ANN202
        reads.append((table, expr))
        return original(self, table, expr)

    monkeypatch.setattr(ColumnCache, "get", get)
    return reads


def _derived_path(trace, name: str) -> Path:  # noqa: ANN001
    cache = trace.db.column_cache
    assert cache is not None
    return cache._path(KERNELS, f"{launch.LAUNCH_JOIN_KEY}:{name}")


def test_cases_exist() -> None:
    cases = _cases()
    assert len(cases) >= 20 and {c[2] for c in cases} == set(REPORTS)


@pytest.mark.parametrize(("export", "ref", "report", "convention"), _cases(), ids=lambda x: x.stem if isinstance(x, Path) and x.suffix == ".sqlite" else None)
def test_cold_and_warm_runs_print_nsys_csv(
    export: Path, ref: Path, report: str, convention: str, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = read_reference(ref)
    cold = _open(export)
    assert_identical(run_report(cold, report, convention=convention), reference)
    for name in DERIVED:
        assert _derived_path(cold, name).is_file(), name
    reads = _reads(monkeypatch)
    warm = _open(export)
    assert_identical(run_report(warm, report, convention=convention), reference)
    read_keys = {expr for _, expr in reads}
    assert {f"{launch.LAUNCH_JOIN_KEY}:{n}" for n in DERIVED} <= read_keys
    # the join is not made again: no API column is read (nor, by the summary, the kernels'
    # correlation ids; the trace sorts ties by them)
    assert not [r for r in reads if r[0] == RUNTIME], reads
    if report == "cuda_kern_exec_sum":
        assert (KERNELS, '"correlationId"') not in reads


def test_kernels_matching_two_calls_keep_their_rows(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each kernel of this 2022 export matches two API rows (a CUDA runtime call and its
    eventClass-67 wrapper): the cached kernel rows are not the kernels in order, and the warm
    run gathers the kernel columns at them."""
    export = NSYS_CORPUS / "nsys2022.2_pipit_saxpy_mpi_cuda.sqlite"
    reference = read_reference(Path(__file__).parent / "data" / "saxpy_reference" / "cuda_kern_exec_sum.csv")
    trace = _open(export)
    assert_identical(run_report(trace, "cuda_kern_exec_sum", convention="2023"), reference)
    kernels = trace.db.row_count(KERNELS)
    lrow = trace.db.derived_column(KERNELS, f"{launch.LAUNCH_JOIN_KEY}:lrow", lambda: pytest.fail("not cached"))
    assert lrow.len() == 2 * kernels and lrow.unique().len() == kernels
    reads = _reads(monkeypatch)
    assert_identical(run_report(_open(export), "cuda_kern_exec_sum", convention="2023"), reference)
    assert (KERNELS, f"{launch.LAUNCH_JOIN_KEY}:lrow") in reads and not [r for r in reads if r[0] == RUNTIME]


def test_a_damaged_derived_column_is_computed_again(cache: Path) -> None:
    export = NSYS_CORPUS / "nsys2024.5_pipit_cloverleaf_4xa100.sqlite"
    expected = run_report(_open(export), "cuda_kern_exec_sum", convention="2023").to_csv()
    trace = _open(export)
    path = _derived_path(trace, "api.start_ns")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.warns(CacheIntegrityWarning, match="failed its checksum"):
        assert run_report(trace, "cuda_kern_exec_sum", convention="2023").to_csv() == expected
    assert path.is_file()  # written again
    assert run_report(_open(export), "cuda_kern_exec_sum", convention="2023").to_csv() == expected


def test_without_a_cache_nothing_is_kept_and_the_report_is_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(database, "CACHE_MIN_ROWS", 1)
    export = NSYS_CORPUS / "nsys2024.5_pipit_cloverleaf_4xa100.sqlite"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        off = tracekit.open(export, column_cache=False)
    on = _open(export)
    assert run_report(off, "cuda_kern_exec_sum").to_csv() == run_report(on, "cuda_kern_exec_sum").to_csv()
    assert off.db.column_cache is None
