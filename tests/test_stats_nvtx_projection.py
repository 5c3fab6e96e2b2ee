"""nvtx_gpu_proj_trace, nvtx_gpu_proj_sum and nvtx_kern_sum equal `nsys stats`, cell by cell
and row by row.

References: the sample traces' CSVs (printed by the capturing nsys 2025.3, convention "2025"),
the public corpus' CSVs (nsys 2023.4.4, convention "2023"), and — when an nsys CLI is on this
machine — fresh `nsys stats` runs on corpus and sample files (marker ``nsys``).
"""

from __future__ import annotations

import collections
import sqlite3
import subprocess
import warnings
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit.errors import UnsupportedReportError
from tracekit.stats import run_report

from .conftest import NSYS_CORPUS, NSYS_REFERENCE, ROOT, SAMPLES
from .nsys_reference import read_reference

REPORTS = ("nvtx_gpu_proj_trace", "nvtx_gpu_proj_sum", "nvtx_kern_sum")
NSYS_DEBIAN = Path("/opt/nsys-debian/usr/lib/x86_64-linux-gnu/nsight-systems/target-linux-x64/nsys")

_TRACES: dict[Path, object] = {}


def _open(path: Path):  # noqa: ANN202 - NsysTrace
    if path not in _TRACES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _TRACES[path] = tracekit.open(path)
    return _TRACES[path]


def assert_identical(report, reference: list[list[str]]) -> None:  # noqa: ANN001
    """Header, every cell, and the row order equal nsys's output."""
    ours = [report.columns, *report.formatted_rows()]
    assert ours[0] == reference[0], "header differs"
    assert len(ours) == len(reference), f"{len(ours) - 1} rows, nsys printed {len(reference) - 1}"
    a, b = collections.Counter(map(tuple, ours[1:])), collections.Counter(map(tuple, reference[1:]))
    only_ours, only_nsys = list((a - b).elements())[:2], list((b - a).elements())[:2]
    assert a == b, f"cells differ: ours {only_ours} nsys {only_nsys}"
    assert ours == reference, "row order differs"


def _sample_cases(reports: tuple[str, ...]) -> list[tuple[Path, Path, str]]:
    cases = []
    for ref in sorted(SAMPLES.rglob("stats/*.csv")):
        for report in reports:
            if ref.stem.endswith("_" + report):
                export = ref.parent.parent / f"{ref.stem[: -len(report) - 1]}.sqlite"
                if export.is_file():
                    cases.append((export, ref, report))
    return cases


def _corpus_cases(reports: tuple[str, ...]) -> list[tuple[Path, Path, str]]:
    cases = []
    for ref_dir in sorted(NSYS_REFERENCE.glob("*")):
        for report in reports:
            ref = ref_dir / f"{report}.csv"
            if ref.is_file():
                cases.append((NSYS_CORPUS / f"{ref_dir.name}.sqlite", ref, report))
    return cases


def _check(export: Path, ref: Path, report: str, convention: str) -> None:
    reference = read_reference(ref)
    trace = _open(export)
    if not reference:  # nsys skipped it: tracekit must say why
        with pytest.raises(UnsupportedReportError, match="NVTX"):
            run_report(trace, report, convention=convention)
        return
    assert_identical(run_report(trace, report, convention=convention), reference)


@pytest.mark.parametrize(("export", "ref", "report"), _sample_cases(REPORTS), ids=lambda x: x.stem if isinstance(x, Path) and x.suffix == ".csv" else "")
def test_samples_equal_nsys_2025(export: Path, ref: Path, report: str) -> None:
    _check(export, ref, report, "2025")


@pytest.mark.parametrize(("export", "ref", "report"), _corpus_cases(REPORTS), ids=lambda x: f"{x.parent.name}/{x.stem}" if isinstance(x, Path) and x.suffix == ".csv" else "")
def test_corpus_equals_nsys_2023(export: Path, ref: Path, report: str) -> None:
    _check(export, ref, report, "2023")


def test_reference_cases_exist() -> None:
    assert len(_sample_cases(REPORTS)) >= 18
    assert len(_corpus_cases(REPORTS)) >= 10


def test_default_domain_prefix_is_a_2025_convention() -> None:
    trace = _open(SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite")
    new = run_report(trace, "nvtx_gpu_proj_trace", convention="2025").frame
    old = run_report(trace, "nvtx_gpu_proj_trace", convention="2023").frame
    assert new["Name"].to_list() == [":" + n for n in old["Name"].to_list()]
    # the 2025 CSV nsys printed has the prefix
    ref = read_reference(SAMPLES / "llm_decode_1gpu" / "stats" / "llm_decode_1gpu_nvtx_gpu_proj_trace.csv")
    assert ref[1][0] == ":step.0"


def test_named_domains_look_the_same_in_both_conventions() -> None:
    trace = _open(SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite")
    for conv in ("2023", "2025"):
        names = set(run_report(trace, "nvtx_kern_sum", convention=conv).frame["NVTX Range"].drop_nulls())
        assert "NCCL:ncclAllReduce" in names


def test_projection_hand_computed_from_sqlite() -> None:
    """step.0 of the decode sample: first op start, last op end, distinct correlation ids of the
    kernels and memcpys whose launch call lies inside the range on the same thread."""
    path = SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rid, start, end, gtid = con.execute(
        "SELECT rowid, start, end, globalTid FROM NVTX_EVENTS WHERE text = 'step.0'"
    ).fetchone()
    rows = []
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY"):
        rows += con.execute(
            f"SELECT o.start, o.end, o.correlationId FROM {table} o JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
            "ON r.correlationId = o.correlationId AND o.globalPid = (r.globalTid / 16777216) * 16777216 "
            "WHERE r.globalTid = ? AND r.start >= ? AND r.end <= ?",
            (gtid, start, end),
        ).fetchall()
    con.close()
    frame = run_report(_open(path), "nvtx_gpu_proj_trace").frame
    row = frame.filter(frame["RangeId"] == rid).row(0, named=True)
    assert row["Projected Start (ns)"] == min(r[0] for r in rows)
    assert row["Projected Duration (ns)"] == max(r[1] for r in rows) - min(r[0] for r in rows)
    assert row["NumGPUOps"] == len({r[2] for r in rows})
    assert row["Orig Start (ns)"] == start and row["Orig Duration (ns)"] == end - start


def _sql_projection(path: Path) -> dict[int, tuple[int, int, int]]:
    """RangeId → (first op start, last op end, distinct correlation ids) straight from the
    export: every closed range on its thread, every kernel/memcpy/memset whose launching call
    (same correlation id and process) ran on that thread inside the range."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    ops = " UNION ALL ".join(
        f"SELECT start, end, correlationId, globalPid FROM {t}"
        for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
        if t in tables
    )
    rows = con.execute(
        f"WITH ops AS ({ops}), launched AS ("
        "  SELECT o.start, o.end, o.correlationId AS corr, r.globalTid, r.start AS rs, r.end AS re FROM ops o"
        "  JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = o.correlationId"
        "  AND o.globalPid = (r.globalTid / 16777216) * 16777216)"
        " SELECT n.rowid, min(l.start), max(l.end), count(DISTINCT l.corr) FROM NVTX_EVENTS n"
        " JOIN launched l ON l.globalTid = n.globalTid AND l.rs >= n.start AND l.re <= n.end"
        " WHERE n.eventType IN (59, 60, 70, 71) AND n.endGlobalTid IS NULL AND n.end IS NOT NULL GROUP BY n.rowid"
    ).fetchall()
    con.close()
    return {rid: (s, e, n) for rid, s, e, n in rows}


def _crossing_copy(tmp_path: Path) -> Path:
    """The decode sample plus a start/end range that crosses layer boundaries (start/end ranges
    need not nest), which sends the projection down its exact path."""
    copy = tmp_path / "crossing.sqlite"
    copy.write_bytes((SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite").read_bytes())
    con = sqlite3.connect(copy)
    s2, g = con.execute("SELECT start, globalTid FROM NVTX_EVENTS WHERE rowid = 3").fetchone()
    e5 = con.execute("SELECT end FROM NVTX_EVENTS WHERE rowid = 6").fetchone()[0]
    con.execute(
        "INSERT INTO NVTX_EVENTS (start, end, eventType, globalTid, text, domainId) VALUES (?, ?, 60, ?, 'window', 0)",
        (s2 + 1, e5 - 1, g),
    )
    con.commit()
    con.close()
    return copy


PROJECTED = [
    *(p for p in sorted(SAMPLES.rglob("*.sqlite")) if "per_rank" not in p.name and "nonvtx" not in p.name),
    NSYS_CORPUS / "nsys2022.2_pipit_saxpy_mpi_cuda.sqlite",
    NSYS_CORPUS / "nsys2023.1_memfusion_tensorrt.sqlite",
    NSYS_CORPUS / "nsys2026.2_nsysai_mfu_2xh100_nccl_slice.sqlite",
]


@pytest.mark.parametrize("path", [*PROJECTED, "crossing"], ids=lambda p: p if isinstance(p, str) else p.stem)
def test_every_range_projection_equals_sql(path: Path | str, tmp_path: Path) -> None:
    """Each range's projected start, duration and NumGPUOps, for every range of the trace:
    the tree fold (nested ranges), the pair expansion (crossing ranges) and the duplicate
    correlation ids of several processes (tp2, allreduce, mfu) all agree with plain SQL."""
    export = _crossing_copy(tmp_path) if path == "crossing" else Path(path)
    expected = _sql_projection(export)
    frame = run_report(tracekit.open(export), "nvtx_gpu_proj_trace").frame.filter(pl.col("RangeId").is_not_null())
    ours = {
        r["RangeId"]: (r["Projected Start (ns)"], r["Projected Start (ns)"] + r["Projected Duration (ns)"], r["NumGPUOps"])
        for r in frame.iter_rows(named=True)
    }
    closed = {rid: v for rid, v in ours.items() if rid in expected or rid not in _open_ranges(export)}
    assert expected, "the trace should have ranges with GPU work"
    assert closed == expected


def _open_ranges(path: Path) -> set[int]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = {r[0] for r in con.execute("SELECT rowid FROM NVTX_EVENTS WHERE end IS NULL")}
    con.close()
    return rows


def test_no_nvtx_table_is_explained() -> None:
    trace = _open(NSYS_CORPUS / "nsys2021.2_mordred_report1.sqlite")
    for report in REPORTS:
        with pytest.raises(UnsupportedReportError, match="no NVTX_EVENTS"):
            run_report(trace, report)


# -- fresh nsys runs --------------------------------------------------------------------
def _nsys() -> Path | None:
    import os
    import shutil

    for cand in (os.environ.get("NSYS"), str(NSYS_DEBIAN), shutil.which("nsys")):
        if cand and Path(cand).is_file():
            return Path(cand)
    return None


def nsys_stats(nsys: Path, export: Path, reports: tuple[str, ...], out: Path) -> dict[str, Path]:
    """Run ``nsys stats`` on a copy of ``export``; return report → CSV path."""
    copy = out / export.name
    copy.write_bytes(export.read_bytes())
    prefix = out / export.stem
    subprocess.run(
        [str(nsys), "stats", "--format", "csv", "--force-export=false", "--force-overwrite=true", "--report", ",".join(reports),
         "-o", str(prefix), str(copy)],
        check=True, capture_output=True, timeout=300,
    )
    return {r: Path(f"{prefix}_{r}.csv") for r in reports}


def nsys_version(nsys: Path) -> str:
    return subprocess.run([str(nsys), "--version"], capture_output=True, text=True, timeout=60).stdout


def nsys_2023_or_skip() -> Path:
    """The nsys 2023.4 CLI that convention "2023" is checked against; skips the test without it."""
    nsys = _nsys()
    if nsys is None:
        pytest.skip("no nsys CLI on this machine (set NSYS)")
    version = nsys_version(nsys)
    if "2023.4" not in version:
        pytest.skip(f"convention '2023' is checked against nsys 2023.4; found {version.strip()}")
    return nsys


LIVE_FILES = (
    NSYS_CORPUS / "nsys2022.2_pipit_saxpy_mpi_cuda.sqlite",  # wrapper API rows, ops outside ranges
    NSYS_CORPUS / "nsys2026.2_nsysai_mfu_2xh100_nccl_slice.sqlite",  # ties in proj_sum order
    SAMPLES / "custom_allreduce_2gpu" / "custom_allreduce_2gpu.sqlite",  # one outside row for 2 processes
    SAMPLES / "llm_tp2pp2_nccl" / "llm_tp2pp2_nccl.sqlite",
    SAMPLES / "llm_train_emit_nvtx_1gpu" / "llm_train_emit_nvtx_1gpu.sqlite",
)


@pytest.mark.nsys
@pytest.mark.parametrize("export", LIVE_FILES, ids=lambda p: p.stem)
def test_fresh_nsys_2023_run(export: Path, tmp_path: Path) -> None:
    nsys = nsys_2023_or_skip()
    csvs = nsys_stats(nsys, export, REPORTS, tmp_path)
    for report, csv_path in csvs.items():
        _check(export, csv_path, report, "2023")


COARSE = Path(__file__).parent / "data" / "coarse_ties"


def _coarse_copy(tmp_path: Path) -> Path:
    """The decode sample with NVTX and CUDA API timestamps floored to 100 µs: calls and ranges
    then share end points, as in exports with coarse clocks."""
    copy = tmp_path / "coarse.sqlite"
    copy.write_bytes((SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite").read_bytes())
    con = sqlite3.connect(copy)
    con.execute("UPDATE NVTX_EVENTS SET start = (start / 100000) * 100000, end = (end / 100000) * 100000 WHERE end IS NOT NULL")
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET start = (start / 100000) * 100000, end = (end / 100000) * 100000")
    con.commit()
    con.close()
    return copy


@pytest.mark.parametrize("report", ["nvtx_gpu_proj_trace", "nvtx_gpu_proj_sum", "nvtx_kern_sum"])
def test_coarse_timestamps_count_calls_in_every_range_that_holds_them(report: str, tmp_path: Path) -> None:
    """nsys puts a launch call in every range with start <= call start and call end <= end
    (closed). With coarse timestamps a call can end exactly where a range ends while a sibling
    starting at the same tick is its innermost range; tracekit counted it in the sibling only
    (10 vs nsys's 16 ops in one range). References: nsys 2023.4.4 on this same copy."""
    copy = _coarse_copy(tmp_path)
    reference = read_reference(COARSE / f"ref_{report}.csv")
    assert_identical(run_report(tracekit.open(copy), report, convention="2023"), reference)


def _with_threads_moved(tmp_path: Path, where: str) -> Path:
    """A copy of the host-bound capture whose CUDA calls selected by ``where`` are moved to
    thread 756 + 7 (the same process)."""
    copy = tmp_path / "tid.sqlite"
    copy.write_bytes((SAMPLES / "planted" / "planted_host_bound" / "planted_host_bound.sqlite").read_bytes())
    con = sqlite3.connect(copy)
    con.execute(f"UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET globalTid = globalTid + 7 WHERE {where}")
    con.commit()
    con.close()
    return copy


def _outside(path: Path) -> dict:  # type: ignore[type-arg]
    frame = run_report(tracekit.open(path), "nvtx_gpu_proj_trace", convention="2023").frame
    return frame.filter(pl.col("RangeId").is_null()).row(0, named=True)


_OUTSIDE = "start < (SELECT min(start) FROM NVTX_EVENTS) OR start > (SELECT max(end) FROM NVTX_EVENTS)"


def test_outside_row_carries_the_launching_thread(tmp_path: Path) -> None:
    """nsys 2023.4 gives the GPU work outside every range one row with a PID and TID of one of
    them: with every outside launch of the host-bound capture moved to thread 756 + 7, nsys
    2023.4.4 printed PID 756, TID 763 (not the main thread) — and so does tracekit."""
    outside = _outside(_with_threads_moved(tmp_path, _OUTSIDE))
    assert (outside["PID"], outside["TID"], outside["NumGPUOps"]) == (756, 763, 21)


@pytest.mark.parametrize(("moved", "tid"), [
    ("the last launch, a memcpy that ends after every other outside operation", 763),
    ("the first launch, a kernel", 756),
    ("the last memset (last in the kernels-memcpys-memsets order, not the latest end)", 756),
    ("the last outside kernel", 756),
])
def test_outside_row_thread_is_sqlite_bare_column(tmp_path: Path, moved: str, tid: int) -> None:
    """Which thread: SQLite's bare columns beside ``min(start)`` and ``max(end)`` in nsys's
    GROUP BY, i.e. the last operation, in launch order, that started earlier or ended later
    than every one before it. One launch of the 21 outside ones moved to thread 763 at a time;
    what nsys 2023.4.4 printed for each (the first case's whole report is
    tests/data/outside_tid/, compared cell by cell)."""
    con = sqlite3.connect(f"file:{SAMPLES / 'planted' / 'planted_host_bound' / 'planted_host_bound.sqlite'}?mode=ro", uri=True)
    rows = con.execute(
        "SELECT r.rowid, EXISTS(SELECT 1 FROM CUPTI_ACTIVITY_KIND_KERNEL k WHERE k.correlationId = r.correlationId), "
        "EXISTS(SELECT 1 FROM CUPTI_ACTIVITY_KIND_MEMCPY m WHERE m.correlationId = r.correlationId), "
        "EXISTS(SELECT 1 FROM CUPTI_ACTIVITY_KIND_MEMSET s WHERE s.correlationId = r.correlationId) "
        "FROM CUPTI_ACTIVITY_KIND_RUNTIME r WHERE r.start < (SELECT min(start) FROM NVTX_EVENTS) "
        "OR r.start > (SELECT max(end) FROM NVTX_EVENTS) ORDER BY r.start").fetchall()
    con.close()
    launches = [r for r in rows if r[1] or r[2] or r[3]]
    assert len(launches) == 21
    pick = {"the last launch, a memcpy that ends after every other outside operation": launches[-1],
            "the first launch, a kernel": launches[0],
            "the last memset (last in the kernels-memcpys-memsets order, not the latest end)": [r for r in launches if r[3]][-1],
            "the last outside kernel": [r for r in launches if r[1]][-1]}[moved]
    path = _with_threads_moved(tmp_path, f"rowid = {pick[0]}")
    assert (_outside(path)["PID"], _outside(path)["TID"]) == (756, tid)
    if tid == 763:
        assert_identical(run_report(tracekit.open(path), "nvtx_gpu_proj_trace", convention="2023"),
                         read_reference(ROOT / "tests" / "data" / "outside_tid" / "ref_nvtx_gpu_proj_trace_last_memcpy_on_thread7.csv"))
