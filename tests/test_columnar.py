"""nsys's own columnar exports (``nsys export --type parquetdir`` / ``arrowdir``) opened with
``tracekit.open``: every table, the metadata and the ``tracekit stats`` CSVs equal those of the
SQLite export that the same nsys (2023.4.4) made of the same report (tests/data/README.md)."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import tracekit
from tracekit.errors import TraceFormatError
from tracekit.nsys.columnar import ExportFolder
from tracekit.opening import sniff

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("parquetdir", "arrowdir")
TABLES = ["kernels", "memcpys", "memsets", "syncs", "cuda_api", "nvtx", "gpus", "processes", "threads",
          "memory_usage", "gpu_metrics"]


@pytest.fixture(scope="module")
def exports(nsys_columnar: Path) -> Path:
    """The unpacked archive: ``memfusion_report1.{sqlite,parquetdir,arrowdir}``."""
    return nsys_columnar


def _export(exports: Path, kind: str) -> Path:
    return exports / f"memfusion_report1.{kind}"


@pytest.mark.parametrize("kind", KINDS)
def test_sniff_and_open(exports: Path, kind: str) -> None:
    folder = _export(exports, kind)
    assert sniff(folder) == f"nsys-{kind}"
    trace = tracekit.open(folder)
    assert isinstance(trace.db, ExportFolder)
    assert trace.meta.version == "2023.4.4.54"
    assert trace.meta.missing == []


@pytest.mark.parametrize("kind", KINDS)
def test_tables_equal_the_sqlite_export(exports: Path, kind: str) -> None:
    sqlite = tracekit.open(_export(exports, "sqlite"), column_cache=False)
    folder = tracekit.open(_export(exports, kind))
    for name in TABLES:
        assert_frame_equal(getattr(folder, name), getattr(sqlite, name), check_exact=True)
    # the tables the brief names are real, not empty frames that trivially agree
    raw = {"kernels": "CUPTI_ACTIVITY_KIND_KERNEL", "memcpys": "CUPTI_ACTIVITY_KIND_MEMCPY",
           "cuda_api": "CUPTI_ACTIVITY_KIND_RUNTIME", "nvtx": "NVTX_EVENTS", "syncs": "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"}
    con = sqlite3.connect(_export(exports, "sqlite"))
    counts = {n: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for n, t in raw.items()}
    con.close()
    assert counts == {"kernels": 36, "memcpys": 4, "cuda_api": 5668, "nvtx": 60, "syncs": 2}
    assert {n: getattr(folder, n).height for n in raw} == counts
    assert folder.kernels["name"].null_count() == 0  # StringIds resolved
    assert folder.strings.equals(sqlite.strings)
    # projected reads (what the reports use) agree too
    cols = ["name", "duration_ns", "name_id"]
    assert_frame_equal(folder.table("kernels", cols), sqlite.table("kernels", cols))


@pytest.mark.parametrize("kind", KINDS)
def test_raw_rows_equal_sqlite(exports: Path, kind: str) -> None:
    """The folder's raw rows, through ExportFolder's SQL, equal sqlite3's rows of the same query
    (the stdlib module reads the .sqlite independently of tracekit)."""
    folder = ExportFolder(_export(exports, kind))
    con = sqlite3.connect(_export(exports, "sqlite"))
    queries = [
        'SELECT "start", "end", "deviceId", "demangledName" FROM CUPTI_ACTIVITY_KIND_KERNEL',
        'SELECT id, value FROM StringIds',
        'SELECT "start", "text", "textId", "domainId" FROM NVTX_EVENTS',
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME",
        "SELECT startTime, stopTime, duration FROM ANALYSIS_DETAILS",
    ]
    for sql in queries:
        assert [tuple(r) for r in folder.rows(sql)] == con.execute(sql).fetchall(), sql
    declared = {r[1]: r[2] for r in con.execute('PRAGMA table_info("CUPTI_ACTIVITY_KIND_KERNEL")')}
    assert {r[1]: r[2] for r in folder.rows('PRAGMA table_info("CUPTI_ACTIVITY_KIND_KERNEL")')} == declared
    assert folder.row_count("CUPTI_ACTIVITY_KIND_RUNTIME") == 5668
    con.close()


def _stats(export: Path, cache: Path, reports: str) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEKIT_")}
    argv = [sys.executable, "-m", "tracekit.cli.entry", "stats", "-r", reports, "-f", "csv", str(export)]
    return subprocess.run(argv, capture_output=True, env={**env, "TRACEKIT_CACHE": str(cache)}, cwd=ROOT, check=False)


def test_stats_csv_byte_identical(exports: Path, tmp_path: Path) -> None:
    reports = "cuda_gpu_kern_sum,cuda_api_sum,nvtx_sum,cuda_gpu_trace,nvtx_gpu_proj_trace,cuda_kern_exec_sum"
    runs = {kind: _stats(_export(exports, kind), tmp_path / kind, reports) for kind in ("sqlite", *KINDS)}
    for kind, run in runs.items():
        assert run.returncode == 0, (kind, run.stderr.decode())
        assert run.stderr == b"", (kind, run.stderr.decode())
    assert runs["sqlite"].stdout.count(b"\n") > 100  # the API calls are all there
    assert runs["parquetdir"].stdout == runs["sqlite"].stdout
    assert runs["arrowdir"].stdout == runs["sqlite"].stdout


def test_capture_command_absent(exports: Path) -> None:
    """nsys writes no META_DATA_CAPTURE file into columnar exports: the capture command is
    unknown there (documented), while the SQLite export has it."""
    folder = tracekit.open(_export(exports, "parquetdir"))
    assert not folder.db.has_table("META_DATA_CAPTURE")
    assert folder.meta.processes == []


def test_not_an_export_folder(tmp_path: Path) -> None:
    (tmp_path / "notes.parquet").write_bytes(b"PAR1")
    with pytest.raises(TraceFormatError, match="not an nsys parquetdir/arrowdir export"):
        tracekit.open(tmp_path)


@pytest.mark.parametrize("kind", KINDS)
def test_damaged_file_is_one_clear_error(exports: Path, kind: str, tmp_path: Path) -> None:
    copy = tmp_path / f"copy.{kind}"
    shutil.copytree(_export(exports, kind), copy)
    suffix = ".parquet" if kind == "parquetdir" else ".arrow"
    damaged = copy / f"CUPTI_ACTIVITY_KIND_KERNEL{suffix}"
    data = damaged.read_bytes()
    damaged.write_bytes(data[: len(data) // 2])  # a truncated copy
    trace = tracekit.open(copy)
    with pytest.raises(TraceFormatError, match=r"CUPTI_ACTIVITY_KIND_KERNEL.*export the report again") as info:
        _ = trace.kernels
    assert "\n" not in str(info.value)


def test_folder_is_not_written(exports: Path) -> None:
    folder = _export(exports, "parquetdir")
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    trace = tracekit.open(folder)
    _ = trace.kernels, trace.nvtx, trace.cuda_api
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before
    assert pl.DataFrame(trace.kernels).height == 36


def test_open_many_reads_folders(exports: Path, tmp_path: Path) -> None:
    sqlite = tracekit.open_many([_export(exports, "sqlite")])
    folder = tracekit.open_many([_export(exports, "parquetdir")])
    assert_frame_equal(folder.kernels, sqlite.kernels)
    # a folder holding one report's three exports: the SQLite one is read, once
    assert folder.reports["path"].to_list() == [str(_export(exports, "parquetdir"))]
    assert tracekit.open_many(exports).reports["path"].to_list() == [str(_export(exports, "sqlite"))]
    # folders of ranks found inside a directory
    shutil.copytree(_export(exports, "arrowdir"), tmp_path / "r0.arrowdir")
    from tracekit.multi import _resolve

    assert _resolve(tmp_path) == [tmp_path / "r0.arrowdir"]


REPORTS = ["cuda_gpu_kern_sum", "cuda_gpu_mem_time_sum", "cuda_gpu_mem_size_sum", "cuda_api_sum", "nvtx_sum",
           "cuda_gpu_trace", "nvtx_gpu_proj_trace", "nvtx_gpu_proj_sum", "nvtx_kern_sum", "cuda_kern_exec_sum",
           "cuda_kern_exec_trace"]


@pytest.mark.parametrize("kind", KINDS)
def test_stats_from_folder_equal_nsys_stats(exports: Path, kind: str, tmp_path: Path) -> None:
    """``tracekit stats --convention 2023`` on the folder prints what ``nsys stats`` (2023.4.4)
    printed for the SQLite export of the same report (reference/, the blank line nsys ends
    with left out)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEKIT_")}
    for report in REPORTS:
        argv = [sys.executable, "-m", "tracekit.cli.entry", "stats", "-f", "csv", "--convention", "2023",
                "-r", report, str(_export(exports, kind))]
        run = subprocess.run(argv, capture_output=True, env={**env, "TRACEKIT_CACHE": str(tmp_path)}, cwd=ROOT,
                             check=False)
        assert run.returncode == 0, run.stderr.decode()
        reference = (exports / "reference" / f"{report}.csv").read_bytes()
        assert reference.count(b"\n") > 2  # a header and rows, not an empty report
        assert run.stdout == reference.rstrip(b"\n") + b"\n", report


def test_unreadable_schema_names_its_own_file(exports: Path, tmp_path: Path) -> None:
    """An Arrow stream whose schema cannot be read (cut inside its first message) is named by
    itself, once, and only the tables that need it fail: the metadata and the API calls still
    read (the error named META_DATA_EXPORT.arrow, wrapping the kernel file's error, and no
    table of the folder could be read)."""
    copy = tmp_path / "copy.arrowdir"
    shutil.copytree(_export(exports, "arrowdir"), copy)
    damaged = copy / "CUPTI_ACTIVITY_KIND_KERNEL.arrow"
    damaged.write_bytes(damaged.read_bytes()[:2000])
    trace = tracekit.open(copy)
    assert trace.meta.version == "2023.4.4.54"
    assert trace.cuda_api.height == tracekit.open(_export(exports, "sqlite")).cuda_api.height
    with pytest.raises(TraceFormatError) as info:
        _ = trace.kernels
    message = str(info.value)
    assert message.startswith(f"{damaged} could not be read (")
    assert message.count("could not be read") == 1
    assert "META_DATA_EXPORT" not in message


def test_damaged_file_is_named_by_lazy_scans(exports: Path, tmp_path: Path) -> None:
    """trace.scan counts a folder table's rows first; on a truncated Parquet file that count's
    error named the folder ('copy.parquetdir could not be read'), not the file."""
    copy = tmp_path / "copy.parquetdir"
    shutil.copytree(_export(exports, "parquetdir"), copy)
    damaged = copy / "CUPTI_ACTIVITY_KIND_KERNEL.parquet"
    damaged.write_bytes(damaged.read_bytes()[:-100])
    with pytest.raises(TraceFormatError) as info:
        tracekit.open(copy).scan("kernels").collect()
    assert str(info.value).startswith(f"{damaged} could not be read (")


def test_open_many_reads_a_report_exported_to_both_folder_kinds_once(exports: Path, tmp_path: Path) -> None:
    """A directory holding one report's parquetdir and arrowdir exports (no .sqlite) was read
    as two reports (two ranks of the same data); now once, from the parquetdir."""
    from tracekit.multi import _resolve

    for kind in KINDS:
        shutil.copytree(_export(exports, kind), tmp_path / f"job.{kind}")
    shutil.copytree(_export(exports, "arrowdir"), tmp_path / "other.arrowdir")
    assert _resolve(tmp_path) == [tmp_path / "job.parquetdir", tmp_path / "other.arrowdir"]
