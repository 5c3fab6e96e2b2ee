"""Impossible times in mutated copies of real exports (issue 19.1): NVTX ranges that end before
they start, and ends of INT64_MAX. Each stays within bounded memory (checked under an
address-space limit in a subprocess) and is either kept as nsys keeps it or left out with one
warning that gives the count."""

from __future__ import annotations

import os
import resource
import sqlite3
import subprocess
import sys
import warnings
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit.nsys.trace import DamagedRowsWarning
from tracekit.stats import run_report

from .conftest import NSYS_CORPUS, ROOT, SAMPLES, mutated_copy

#: 19 118 NVTX ranges on two threads in 2.7 MB: the export of the issue's 2.3 GB stats run
MFU = NSYS_CORPUS / "nsys2026.2_nsysai_mfu_2xh100_nccl_slice.sqlite"
TRAIN = SAMPLES / "llm_train_emit_nvtx_1gpu" / "llm_train_emit_nvtx_1gpu.sqlite"
INT64_MAX = (1 << 63) - 1
#: address space the subprocesses may take; before the fix they aborted under 5 GB
LIMIT = 2 << 30


def _query(path: Path, sql: str) -> list[tuple[object, ...]]:
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    rows = con.execute(sql).fetchall()
    con.close()
    return rows


def _limited(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``python args…`` from the repository root with at most :data:`LIMIT` of address space."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))

    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRACEKIT_CACHE": str(tmp_path / "cache"), "POLARS_MAX_THREADS": "2"}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                          preexec_fn=limit, check=False)  # fmt: skip


SWAP = 'UPDATE NVTX_EVENTS SET start = "end", "end" = start WHERE rowid % 7 = 0 AND "end" IS NOT NULL AND eventType IN (59, 60)'


def test_inverted_nvtx_ranges_are_left_out_of_the_projection_in_bounded_memory(tmp_path: Path) -> None:
    """Every 7th range of the 2.7 MB export inverted: the crossing-range self-join grew past
    5 GB (SIGABRT under this limit; the issue saw 2.3 GB for the stats report). nsys 2023.4
    stops on such ranges ("rtree constraint failed"); tracekit leaves them out with one warning."""
    if not MFU.is_file():
        pytest.skip("public corpus not found")
    copy = mutated_copy(MFU, tmp_path / "mfu.sqlite", SWAP)
    inverted = {r[0] for r in _query(copy, 'SELECT rowid FROM NVTX_EVENTS WHERE "end" < start')}
    assert len(inverted) > 2000
    run = _limited(["-m", "tracekit.cli.main", "stats", "-r", "nvtx_gpu_proj_trace", "-f", "csv", str(copy)], tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stderr.strip().splitlines() == [
        f"tracekit: warning: {len(inverted)} NVTX range(s) end before they start or have no start (a damaged export?); "
        "they are left out of the NVTX attribution and projections"
    ]
    csv = tmp_path / "out.csv"
    csv.write_text(run.stdout)
    ids = set(pl.read_csv(csv)["RangeId"].drop_nulls().to_list())
    assert ids and not ids & inverted


ATTRIBUTE = """
import sys, warnings
import tracekit
from tracekit.analysis.attribution import attribute_trace
from tracekit.nsys.trace import DamagedRowsWarning
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    damaged = attribute_trace(tracekit.open(sys.argv[1]))
marked = attribute_trace(tracekit.open(sys.argv[2]))
assert damaged.equals(marked), "attribution differs from the copy whose inverted ranges are marks"
ours = [str(w.message) for w in seen if issubclass(w.category, DamagedRowsWarning)]
print(damaged.height, damaged["nvtx_range_id"].is_not_null().sum(), len(ours), ours[0] if ours else "")
"""


def test_attribution_leaves_inverted_ranges_out_exactly(tmp_path: Path) -> None:
    """attribute_trace on the same damaged copy equals attribute_trace on a copy where those
    rows are NVTX marks instead of ranges (row numbers, hence range ids, unchanged)."""
    if not MFU.is_file():
        pytest.skip("public corpus not found")
    damaged = mutated_copy(MFU, tmp_path / "damaged.sqlite", SWAP)
    marked = mutated_copy(damaged, tmp_path / "marked.sqlite", 'UPDATE NVTX_EVENTS SET eventType = 34 WHERE "end" < start')
    n = _query(damaged, 'SELECT count(*) FROM NVTX_EVENTS WHERE "end" < start')[0][0]
    run = _limited(["-c", ATTRIBUTE, str(damaged), str(marked)], tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    height, attributed, n_warnings, message = run.stdout.split(" ", 3)
    kernels = _query(MFU, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0][0]
    assert int(height) >= kernels and int(attributed) > 0
    assert n_warnings == "1" and message.startswith(f"{n} NVTX range(s) end before they start")


def _nmax(tmp_path: Path) -> Path:
    """The training sample with the end of its 41st push/pop range set to INT64_MAX: the range
    then crosses its parent, and that thread took the exact (crossing) join."""
    return mutated_copy(TRAIN, tmp_path / "nmax.sqlite",
                 f'UPDATE NVTX_EVENTS SET "end" = {INT64_MAX} WHERE rowid = (SELECT rowid FROM NVTX_EVENTS '
                 'WHERE eventType = 59 AND "end" IS NOT NULL LIMIT 1 OFFSET 40)')  # fmt: skip


@pytest.mark.nsys
@pytest.mark.parametrize("report", ["nvtx_gpu_proj_trace", "nvtx_gpu_proj_sum", "nvtx_kern_sum"])
def test_an_int64_max_range_end_is_kept_as_nsys_keeps_it(report: str, tmp_path: Path) -> None:
    """nsys 2023.4 prints the projections of an export with an INT64_MAX range end; tracekit's
    CSV is byte-identical (the range is kept, its thread joined exactly, in bounded memory)."""
    from .test_stats_nvtx_projection import nsys_2023_or_skip, nsys_stats

    nsys = nsys_2023_or_skip()
    copy = _nmax(tmp_path)
    (tmp_path / "nsys").mkdir()
    reference = nsys_stats(nsys, copy, (report,), tmp_path / "nsys")[report]
    run = _limited(["-m", "tracekit.cli.main", "stats", "-r", report, "-f", "csv", "--convention", "2023", str(copy)], tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout == reference.read_text()


def test_nvtx_sum_leaves_out_an_int64_max_end_where_nsys_overflows(tmp_path: Path) -> None:
    """nsys 2023.4's nvtx_sum stops with "integer overflow" on that copy; tracekit summed it into
    a negative total (Time (%) -100.0). Now the range is left out with one warning and the
    other ranges' totals are those of the intact sample, less that one instance."""
    copy = _nmax(tmp_path)
    with pytest.warns(DamagedRowsWarning, match="1 NVTX range.*end after"):
        damaged = run_report(tracekit.open(copy), "nvtx_sum", convention="2023").frame
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        intact = run_report(tracekit.open(TRAIN), "nvtx_sum", convention="2023").frame
    assert damaged["Total Time (ns)"].min() > 0 and 99.0 < damaged["Time (%)"].sum() < 101.0
    assert damaged["Instances"].sum() == intact["Instances"].sum() - 1


def _kmax(tmp_path: Path) -> Path:
    """The training sample with one kernel end and one runtime API end set to INT64_MAX."""
    return mutated_copy(TRAIN, tmp_path / "kmax.sqlite",
                 f'UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = {INT64_MAX} WHERE rowid = 7',
                 f'UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET "end" = {INT64_MAX} WHERE rowid = 9')  # fmt: skip


KMAX_REPORTS = ("cuda_gpu_kern_sum", "cuda_api_sum", "cuda_kern_exec_sum", "cuda_gpu_trace", "cuda_kern_exec_trace")


@pytest.mark.nsys
def test_int64_max_kernel_and_api_ends_print_as_nsys_2023_prints_them(tmp_path: Path) -> None:
    """nsys 2023.4 keeps such rows in its kernel and API reports. Values past 2**52 printed as
    ``1.15292150460218e+18`` (15 digits) where nsys prints the double itself
    (``1.1529215046021768e+18``: SQLite's ROUND returns a whole number unchanged), and the
    means differed in the last digits (SQLite's AVG sums floats in row order). Byte-identical now."""
    from .test_stats_nvtx_projection import nsys_2023_or_skip, nsys_stats

    nsys = nsys_2023_or_skip()
    copy = _kmax(tmp_path)
    (tmp_path / "nsys").mkdir()
    references = nsys_stats(nsys, copy, KMAX_REPORTS, tmp_path / "nsys")
    trace = tracekit.open(copy, column_cache=False)
    for report, reference in references.items():
        ours = run_report(trace, report, convention="2023").to_csv()
        assert ours == reference.read_text(), report


def test_whole_numbers_past_2_52_keep_their_digits() -> None:
    from tracekit.stats.common import round1

    for value in (1.1529215046021768e18, 2.8823037614853766e17, -6.457652085323805e17):
        assert repr(round1(value, "2023")) == repr(value) == repr(round1(value, "2025"))
    assert repr(round1(4639.95, "2023")) == "4640.0" and repr(round1(4639.95, "2025")) == "4639.9"


def test_summary_and_gpu_ops_leave_out_an_int64_max_kernel_end(tmp_path: Path) -> None:
    """``tracekit summary`` reported 9,223,372,036,755.254 ms of GPU time for the copy, silently.
    The loader now warns with the count, and the summary's GPU time and gpu_ops leave that kernel
    out: the intact sample's total less that kernel's own duration (plain SQL)."""
    from tracekit.analysis._frames import gpu_ops
    from tracekit.nsys.summary import trace_summary

    copy = _kmax(tmp_path)
    own = _query(TRAIN, 'SELECT "end" - start FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid = 7')[0][0]
    total = _query(TRAIN, 'SELECT sum("end" - start) FROM CUPTI_ACTIVITY_KIND_KERNEL')[0][0]
    trace = tracekit.open(copy, column_cache=False)
    with pytest.warns(DamagedRowsWarning, match="1 kernels row.*end more than an hour past the last start"):
        kernels = trace.kernels
    ops = gpu_ops(kernels)
    assert ops.height == kernels.height - 1 and ops["duration_ns"].sum() == total - own
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the cuda_api row's warning
        info = trace_summary(trace).info["kernels"]
    assert info == f"{kernels.height:,} launches, {(total - own) / 1e6:,.3f} ms GPU time"


@pytest.mark.nsys
@pytest.mark.parametrize("duration", [1234567890123457, 2469135780246913])
def test_durations_past_2_42_round_as_nsys_2023_rounds_them(duration: int, tmp_path: Path) -> None:
    """One kernel of the training sample lasting ~1.2e15 or ~2.5e15 ns: nsys 2023.4 printed the
    StdDev as 218242831735121.9 where tracekit printed 218242831735122.0 (15 digits): SQLite's
    printf rounds the exact value past 2**42. Both reports byte-identical now."""
    from .test_stats_nvtx_projection import nsys_2023_or_skip, nsys_stats

    nsys = nsys_2023_or_skip()
    copy = mutated_copy(TRAIN, tmp_path / "long.sqlite", f'UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = start + {duration} WHERE rowid = 7')
    (tmp_path / "nsys").mkdir()
    reports = ("cuda_gpu_kern_sum", "cuda_kern_exec_sum")
    references = nsys_stats(nsys, copy, reports, tmp_path / "nsys")
    trace = tracekit.open(copy, column_cache=False)
    for report, reference in references.items():
        assert run_report(trace, report, convention="2023").to_csv() == reference.read_text(), report


def test_past_2_42_the_2023_rounding_is_the_exact_one() -> None:
    from tracekit.stats.common import round1

    for value in (4398046511104.25, 218242831735121.94, 3.9e15 + 0.75):
        assert round1(value, "2023") == round1(value, "2025")
    assert repr(round1(4639.95, "2023")) == "4640.0"  # below: the ~15-digit text, as before


def test_an_int64_max_range_end_is_said_once(tmp_path: Path) -> None:
    """Issue 29 §4: a range ending at INT64_MAX is kept (nsys keeps it in its projections) but
    no longer silently: one warning where the NVTX tree is built, in the API and the CLI."""
    import subprocess
    import sys
    import warnings

    import tracekit
    from tracekit.analysis.attribution import attribute_trace

    copy = _nmax(tmp_path)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        att = attribute_trace(tracekit.open(copy))
    far = [w for w in seen if "end far past the capture" in str(w.message)]
    assert len(far) == 1 and str(far[0].message).startswith("1 NVTX range(s)") and far[0].category is DamagedRowsWarning
    assert att.height > 0
    run = subprocess.run([sys.executable, "-m", "tracekit.cli.main", "stats", "-r", "nvtx_gpu_proj_trace", "-f", "csv", str(copy)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stderr.count("end far past the capture") == 1
