"""``trace.scan(name)``: lazy tables equal the eager ones, read only the export columns a query
needs, filter as they read, and read an nsys parquetdir folder's event tables in windows."""

from __future__ import annotations

import tarfile
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import tracekit
from tracekit.nsys import lazy
from tracekit.nsys.columnar import ExportFolder
from tracekit.nsys.schema import TABLES

ROOT = Path(__file__).resolve().parents[1]
DECODE = ROOT / "sample_traces" / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
ARCHIVE = ROOT / "tests" / "data" / "nsys_columnar.tar.xz"


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("lazy")
    with tarfile.open(ARCHIVE, "r:xz") as tar:
        tar.extractall(target, filter="data")
    return target / "nsys_columnar"


def _sources(folders: Path) -> list[Path]:
    return [DECODE, folders / "memfusion_report1.sqlite", folders / "memfusion_report1.parquetdir",
            folders / "memfusion_report1.arrowdir"]


def test_scan_equals_eager_tables(folders: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lazy, "SCAN_BATCH_ROWS", 500)  # several windows on the folders' 5,668 API calls
    for path in _sources(folders):
        lazy_trace, eager = tracekit.open(path), tracekit.open(path)
        for name in TABLES:
            scanned = lazy_trace.scan(name).collect()
            assert_frame_equal(scanned, eager.table(name), check_exact=True)
            assert scanned.schema == pl.Schema(TABLES[name])
        assert eager.kernels.height > 0 and eager.cuda_api.height > 0 and eager.nvtx.height > 0


def test_queries_equal_eager_queries(folders: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lazy, "SCAN_BATCH_ROWS", 700)
    for path in _sources(folders):
        trace = tracekit.open(path)

        def by_name(kernels: pl.LazyFrame) -> pl.LazyFrame:
            return (kernels.filter(pl.col("duration_ns") > 10_000).group_by("name")
                    .agg(pl.len().alias("count"), pl.col("duration_ns").sum().alias("total_ns")).sort("name"))

        assert_frame_equal(by_name(trace.scan("kernels")).collect(), by_name(trace.kernels.lazy()).collect())
        api = pl.col("name").str.starts_with("cudaMemcpy")
        assert_frame_equal(trace.scan("cuda_api").filter(api).select("start_ns", "name").collect(),
                           trace.cuda_api.filter(api).select("start_ns", "name"))
        assert_frame_equal(trace.scan("cuda_api").head(3).collect(), trace.cuda_api.head(3))
        assert_frame_equal(trace.scan("nvtx").select("domain", "name").collect(engine="streaming"),
                           trace.nvtx.select("domain", "name"))


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The SQL each ExportFolder query ran (the real method still runs)."""
    seen: list[str] = []
    real = ExportFolder.query

    def query(self: ExportFolder, sql: str, schema: dict[str, pl.DataType]) -> pl.DataFrame:
        seen.append(sql)
        return real(self, sql, schema)

    monkeypatch.setattr(ExportFolder, "query", query)
    return seen


def test_projection_reaches_the_folder(folders: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = tracekit.open(folders / "memfusion_report1.parquetdir")
    _ = trace.strings
    seen = _spy(monkeypatch)
    query = trace.scan("kernels").filter(pl.col("duration_ns") > 100_000).select("name")
    plan = query.explain()
    assert "PYTHON[tracekit kernels] SCAN" in plan and "SELECTION" in plan and "PROJECT 2/26" in plan
    out = query.collect()
    kernel_sql = [s for s in seen if "CUPTI_ACTIVITY_KIND_KERNEL" in s]
    assert len(kernel_sql) == 1
    for read in ("demangledName", '"start"', '"end"'):
        assert read in kernel_sql[0]
    for skipped in ("shortName", "gridX", "deviceId", "registersPerThread"):
        assert skipped not in kernel_sql[0]
    assert out.height == trace.kernels.filter(pl.col("duration_ns") > 100_000).height > 0


def test_folder_event_tables_read_in_windows(folders: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lazy, "SCAN_BATCH_ROWS", 1000)
    trace = tracekit.open(folders / "memfusion_report1.parquetdir")
    _ = trace.strings
    seen = _spy(monkeypatch)
    n = trace.scan("cuda_api").select("name").collect().height
    windows = [s for s in seen if "CUPTI_ACTIVITY_KIND_RUNTIME" in s]
    assert n == 5668 and len(windows) == 6  # ceil(5,668 / 1,000)
    assert all("LIMIT 1000 OFFSET" in s for s in windows)
    seen.clear()
    trace.scan("cuda_api").head(5).collect()
    assert len([s for s in seen if "CUPTI_ACTIVITY_KIND_RUNTIME" in s]) == 1  # stopped after one window


def test_unknown_table() -> None:
    with pytest.raises(KeyError, match="unknown table 'kernel'"):
        tracekit.open(DECODE).scan("kernel")
