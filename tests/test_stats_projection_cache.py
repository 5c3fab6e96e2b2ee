"""The projections' launch join kept in the column cache (issue 28).

``nvtx_gpu_proj_trace`` and ``nvtx_gpu_proj_sum`` join every kernel, memcpy and memset to its
API call. A cold run keeps each pair's operation row and the call's thread, start and end as
derived columns; a warm run reads those instead of the API table. Both must print nsys's CSV
on every sample (nsys 2025.3 references) and corpus export (nsys 2023.4 references); a
missing or damaged derived column is computed again.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import tracekit
from tracekit.analysis import op_launches
from tracekit.nsys import database
from tracekit.nsys.column_cache import CacheIntegrityWarning
from tracekit.stats import run_report

from .conftest import NSYS_CORPUS
from .nsys_reference import read_reference
from .test_stats_launch_cache import _open, _reads
from .test_stats_nvtx_projection import _corpus_cases, _sample_cases, assert_identical

KERNELS = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
DERIVED = ("lrow", "global_tid", "api_start_ns", "api_end_ns")
REPORTS = ("nvtx_gpu_proj_trace", "nvtx_gpu_proj_sum")


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


def _derived_path(trace, name: str) -> Path:  # noqa: ANN001
    cache = trace.db.column_cache
    assert cache is not None
    return cache._path(KERNELS, f"{op_launches.OP_LAUNCH_KEY}:{name}")


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
    assert {f"{op_launches.OP_LAUNCH_KEY}:{n}" for n in DERIVED} <= {expr for _, expr in reads}
    assert not [r for r in reads if r[0] == RUNTIME], reads  # the join is not made again


def test_a_missing_or_damaged_launch_column_is_computed_again(cache: Path) -> None:
    """Only the pairs' rows cached (another column evicted or never written): the join is made
    again for the rest; a damaged column is dropped with a warning and written again."""
    export = NSYS_CORPUS / "nsys2026.2_nsysai_mfu_2xh100_nccl_slice.sqlite"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = {r: run_report(tracekit.open(export, column_cache=False), r, convention="2023").to_csv() for r in REPORTS}
    trace = _open(export)
    assert run_report(trace, "nvtx_gpu_proj_trace", convention="2023").to_csv() == expected["nvtx_gpu_proj_trace"]
    missing = _derived_path(trace, "api_start_ns")
    missing.unlink()
    assert run_report(_open(export), "nvtx_gpu_proj_sum", convention="2023").to_csv() == expected["nvtx_gpu_proj_sum"]
    assert missing.is_file()
    damaged = _derived_path(trace, "global_tid")
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    with pytest.warns(CacheIntegrityWarning, match="failed its checksum"):
        assert run_report(_open(export), "nvtx_gpu_proj_trace", convention="2023").to_csv() == expected["nvtx_gpu_proj_trace"]
    assert run_report(_open(export), "nvtx_gpu_proj_trace", convention="2023").to_csv() == expected["nvtx_gpu_proj_trace"]


def test_operations_matching_two_calls_keep_every_pair(cache: Path) -> None:
    """Each kernel of this 2022 export matches two API rows (a CUDA runtime call and its
    eventClass-67 wrapper): the cached pairs hold both, as the join does."""
    export = NSYS_CORPUS / "nsys2022.2_pipit_saxpy_mpi_cuda.sqlite"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        off = tracekit.open(export, column_cache=False)
    expected = run_report(off, "nvtx_gpu_proj_trace", convention="2023").to_csv()
    trace = _open(export)
    assert run_report(trace, "nvtx_gpu_proj_trace", convention="2023").to_csv() == expected
    lrow = trace.db.derived_column(KERNELS, f"{op_launches.OP_LAUNCH_KEY}:lrow", lambda: pytest.fail("not cached"))
    kernels = trace.db.row_count(KERNELS)
    assert lrow.len() > lrow.unique().len() and lrow.filter(lrow < kernels).len() == 2 * kernels
    assert run_report(_open(export), "nvtx_gpu_proj_trace", convention="2023").to_csv() == expected
