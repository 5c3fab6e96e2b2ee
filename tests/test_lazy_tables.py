"""``trace.scan(name)``: lazy tables equal the eager ones, read only the export columns a query
needs, filter as they read, and read an nsys parquetdir folder's event tables in windows."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import tracekit
from tracekit.nsys import gpu_metrics as gpu_metrics_module
from tracekit.nsys import lazy
from tracekit.nsys.columnar import ExportFolder
from tracekit.nsys.schema import TABLES

ROOT = Path(__file__).resolve().parents[1]
DECODE = ROOT / "sample_traces" / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"


@pytest.fixture(scope="module")
def folders(nsys_columnar: Path) -> Path:
    return nsys_columnar


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


TP2 = ROOT / "sample_traces" / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"  # 75,750 samples of 30 metrics, 2 GPUs


def test_gpu_metrics_in_windows_equal_one_piece(monkeypatch: pytest.MonkeyPatch) -> None:
    whole = tracekit.open(TP2).gpu_metrics
    assert whole.height == 75_750
    monkeypatch.setattr(gpu_metrics_module, "WINDOW_ROWS", 10_000)  # eager: labelled 10,000 rows at a time
    assert_frame_equal(tracekit.open(TP2).gpu_metrics, whole, check_exact=True)
    assert_frame_equal(tracekit.open(TP2).scan("gpu_metrics").collect(), whole, check_exact=True)


def test_gpu_metrics_filter_reaches_the_read(monkeypatch: pytest.MonkeyPatch) -> None:
    trace = tracekit.open(TP2)
    whole = trace.gpu_metrics
    keep = (pl.col("metric") == "sms_active") & (pl.col("device_id") == 1)
    fresh = tracekit.open(TP2)
    seen: list[str] = []
    real = type(fresh.db).query

    def query(self: object, sql: str, schema: dict[str, pl.DataType], **kwargs: bool) -> pl.DataFrame:
        seen.append(sql)
        return real(self, sql, schema, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(type(fresh.db), "query", query)
    got = fresh.scan("gpu_metrics").filter(keep).collect(engine="streaming")
    assert_frame_equal(got, whole.filter(keep))
    assert got.height == 1456
    samples_sql = [s for s in seen if "FROM GPU_METRICS WHERE" in s]
    assert samples_sql and all("NOT (typeId" in s and "metricId IN" in s for s in samples_sql)
    # an aggregate over every sample, streamed, equals the eager one
    agg = [pl.col("value").mean().alias("mean"), pl.len().alias("n")]
    assert_frame_equal(trace.scan("gpu_metrics").group_by("device_id", "metric").agg(agg).sort("device_id", "metric")
                       .collect(engine="streaming"),
                       whole.group_by("device_id", "metric").agg(agg).sort("device_id", "metric"))


def test_gpu_metrics_windows_of_a_folder(folders: Path, tmp_path: Path) -> None:
    """No report that nsys 2023.4 can export has GPU metrics, so this folder is a mutated copy:
    the nsys-written memfusion parquetdir plus the GPU_METRICS and TARGET_INFO_GPU_METRICS
    tables of the llm_tp2_nccl sample, written as Parquet with the SQLite rows unchanged."""
    import sqlite3

    folder = tmp_path / "with_metrics.parquetdir"
    shutil.copytree(folders / "memfusion_report1.parquetdir", folder)
    con = sqlite3.connect(TP2)
    for table in ("GPU_METRICS", "TARGET_INFO_GPU_METRICS"):
        cur = con.execute(f"SELECT * FROM {table}")
        names = [d[0] for d in cur.description]
        pl.DataFrame(cur.fetchall(), schema=names, orient="row").write_parquet(folder / f"{table}.parquet")
    con.close()
    expected = tracekit.open(TP2).gpu_metrics
    trace = tracekit.open(folder)
    assert_frame_equal(trace.gpu_metrics, expected, check_exact=True)
    windows = list(gpu_metrics_module.gpu_metric_windows(trace.db, window_rows=20_000))
    assert [w.height for w in windows] == [20_000, 20_000, 20_000, 15_750]
    assert_frame_equal(pl.concat(windows), expected, check_exact=True)
    keep = pl.col("metric") == "sms_active"
    assert_frame_equal(trace.scan("gpu_metrics").filter(keep).collect(), expected.filter(keep))


def test_a_derived_table_scans_too() -> None:
    """``trace.scan("nccl")`` raised KeyError although ``trace.table("nccl")`` works (review
    finding): derived tables come back lazy, equal to the eager table."""
    nccl = ROOT / "sample_traces" / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"
    trace = tracekit.open(nccl)
    eager = trace.table("nccl")
    assert eager.height > 0
    got = trace.scan("nccl").filter(pl.col("bytes") > 0).collect()
    assert got.height > 0
    assert_frame_equal(got, eager.filter(pl.col("bytes") > 0))
