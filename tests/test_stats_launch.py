"""cuda_kern_exec_trace and cuda_kern_exec_sum equal `nsys stats`, cell by cell.

References: the sample traces' CSVs (nsys 2025.3) and, with an nsys 2023.4 CLI on the machine,
fresh runs on corpus files (marker ``nsys``).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tracekit.errors import UnsupportedReportError
from tracekit.stats import run_report

from .conftest import NSYS_CORPUS, SAMPLES, mutated_copy
from .nsys_reference import read_reference
from .test_stats_nvtx_projection import (
    _open,
    _sample_cases,
    assert_identical,
    nsys_2023_or_skip,
    nsys_stats,
)

REPORTS = ("cuda_kern_exec_trace", "cuda_kern_exec_sum")


@pytest.mark.parametrize(("export", "ref", "report"), _sample_cases(REPORTS), ids=lambda x: x.stem if isinstance(x, Path) and x.suffix == ".csv" else "")
def test_samples_equal_nsys_2025(export: Path, ref: Path, report: str) -> None:
    assert_identical(run_report(_open(export), report, convention="2025"), read_reference(ref))


def test_reference_cases_exist() -> None:
    assert len(_sample_cases(REPORTS)) >= 12


def test_queue_and_total_hand_computed_from_sqlite() -> None:
    """Every kernel of the decode sample: queue = start − API end when ≥ 0, total = max(API
    end, kernel end) − API start, from the raw rows."""
    path = SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    raw = con.execute(
        "SELECT r.start, r.end, k.start, k.end FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
        "ON r.correlationId = k.correlationId AND k.globalPid = (r.globalTid / 16777216) * 16777216 ORDER BY r.start"
    ).fetchall()
    con.close()
    frame = run_report(_open(path), "cuda_kern_exec_trace").frame
    assert frame.height == len(raw)
    for row, (a0, a1, k0, k1) in zip(frame.iter_rows(named=True), raw, strict=True):
        assert row["API Start (ns)"] == a0 and row["API Dur (ns)"] == a1 - a0
        assert row["Queue Dur (ns)"] == (k0 - a1 if k0 >= a1 else None)
        assert row["Total Dur (ns)"] == max(a1, k1) - a0


def test_needs_kernels_and_api_calls() -> None:
    trace = _open(NSYS_CORPUS / "incomplete_cardiac_report1.sqlite")
    for report in REPORTS:
        with pytest.raises(UnsupportedReportError, match="CUPTI_ACTIVITY_KIND_KERNEL"):
            run_report(trace, report)


LIVE_FILES = (
    NSYS_CORPUS / "nsys2022.2_pipit_saxpy_mpi_cuda.sqlite",  # each kernel matches two API rows
    NSYS_CORPUS / "nsys2020.5_kmeans_report2.sqlite",
    NSYS_CORPUS / "nsys2021.2_mordred_report1.sqlite",
    NSYS_CORPUS / "nsys2023.1_memfusion_tensorrt.sqlite",
    NSYS_CORPUS / "nsys2024.5_pipit_cloverleaf_4xa100.sqlite",
    NSYS_CORPUS / "nsys2026.1_nsysai_mock.sqlite",
    SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite",
)


@pytest.mark.nsys
@pytest.mark.parametrize("export", LIVE_FILES, ids=lambda p: p.stem)
def test_fresh_nsys_2023_run(export: Path, tmp_path: Path) -> None:
    nsys = nsys_2023_or_skip()
    for report, csv_path in nsys_stats(nsys, export, REPORTS, tmp_path).items():
        assert_identical(run_report(_open(export), report, convention="2023"), read_reference(csv_path))


def test_reading_narrow_columns_or_reusing_loaded_tables_gives_the_same_report() -> None:
    """Reports read only the columns they need unless the trace already built its tables."""
    import tracekit

    path = SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"
    fresh = tracekit.open(path)
    loaded = tracekit.open(path)
    for table in ("kernels", "memcpys", "memsets", "cuda_api"):
        getattr(loaded, table)
    for report in ("cuda_kern_exec_sum", "cuda_kern_exec_trace", "nvtx_kern_sum", "nvtx_gpu_proj_trace"):
        a = run_report(fresh, report).formatted_rows()
        b = run_report(loaded, report).formatted_rows()
        assert a == b, report
    assert "kernels" not in fresh.__dict__ and "cuda_api" not in fresh.__dict__


@pytest.mark.parametrize("convention", ["2023", "2025"])
def test_trace_reports_print_the_same_csv_as_the_cell_by_cell_formatter(convention: str) -> None:
    """Reports format with polars (millions of rows); the text must equal csv.writer's
    output of the cell-by-cell Python formatting."""
    import csv
    import io

    for path in (SAMPLES / "custom_allreduce_2gpu" / "custom_allreduce_2gpu.sqlite", NSYS_CORPUS / "nsys2022.2_pipit_saxpy_mpi_cuda.sqlite"):
        for report in ("cuda_kern_exec_trace", "nvtx_gpu_proj_trace", "cuda_gpu_trace", "cuda_gpu_kern_sum", "nvtx_sum"):
            rep = run_report(_open(path), report, convention=convention)
            buf = io.StringIO()
            csv.writer(buf, lineterminator="\n").writerows([rep.columns, *rep.reference_rows()])
            assert rep.formatted_rows() == rep.reference_rows()
            assert rep.to_csv() == buf.getvalue()


def test_launch_shapes_are_formatted_once_per_shape_and_equal_per_row_formatting() -> None:
    """GridXYZ/BlockXYZ come from one string per distinct shape, keyed by packing (x, y, z)
    into one integer; shapes that cannot be packed (y or z ≥ 65536, negative, null) are
    formatted row by row. Both give nsys's three 4-wide fields."""
    import polars as pl

    from tracekit.stats.launch import _xyz, _xyz_text

    trace = _open(SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite")
    real = trace.kernels.select("grid_x", "grid_y", "grid_z")
    odd = pl.DataFrame({"grid_x": [70000, 1, 5, None], "grid_y": [1, 70000, -1, 2], "grid_z": [1, 1, 1, 3]})
    for frame in (real, pl.concat([real, odd])):
        expected = frame.select(_xyz_text(pl.col("grid_x"), pl.col("grid_y"), pl.col("grid_z"))).to_series()
        assert _xyz(frame, "grid_x", "grid_y", "grid_z").to_list() == expected.to_list()
    assert _xyz(real, "grid_x", "grid_y", "grid_z").n_unique() < real.height
    assert _xyz(odd, "grid_x", "grid_y", "grid_z").to_list()[:2] == ["70000    1    1", "   1 70000    1"]


def test_packed_group_numbers_group_as_the_key_columns_do() -> None:
    """Launch groups are numbered by packing the integer keys' offsets in mixed radix; the
    groups (and each group's keys, decoded from its number) must be those of grouping on the
    key columns, nulls (one group of their own) and negative values included. Keys whose
    ranges cannot be packed fall back to coding each column by its distinct values."""
    import polars as pl

    from tracekit.stats.common import group_numbers as _group_numbers
    from tracekit.stats.common import packed_group_numbers as _packed_group_numbers

    trace = _open(SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite")
    real = trace.table("kernels", ["global_pid", "device_id", "name_id", "stream_id"]).select("global_pid", "device_id", "name_id", "stream_id")
    odd = pl.DataFrame(
        {"global_pid": [None, real["global_pid"].max(), real["global_pid"].min(), None], "device_id": [0, None, -1, None],
         "name_id": [-5, 2, None, None], "stream_id": [1, 1, 1, None]},
        schema=real.schema,
    )
    wide = pl.DataFrame({"a": [0, 1 << 40, 5], "b": [0, 1 << 30, 7], "c": [1, 2, 3]})  # 2**70 combinations
    unsigned = pl.DataFrame({"a": pl.Series([(1 << 64) - 1, 0, (1 << 64) - 1], dtype=pl.UInt64), "b": [1, 2, 1]})
    n = 1 << 16  # four columns of 65,536 distinct spread-out values: 2**64 codes, hashed
    hashed = pl.DataFrame({c: [i * 7919 + k for i in range(n)] for k, c in enumerate("abcd")}).vstack(
        pl.DataFrame({c: [k] for k, c in enumerate("abcd")})
    )
    for keys in (real, pl.concat([real, odd]), odd, wide, unsigned, hashed):
        gid, decode = _group_numbers(keys)
        groups = decode(gid.unique())
        packed = _packed_group_numbers(keys)
        assert (packed is None) == (keys is wide or keys is unsigned or keys is hashed)
        expected = keys.with_row_index("_r").group_by(keys.columns).agg(pl.col("_r"))
        got = keys.with_row_index("_r").with_columns(gid).group_by("_g").agg(pl.col("_r"))
        assert sorted(expected["_r"].to_list()) == sorted(got["_r"].to_list())
        # each group's decoded keys equal the keys of its rows
        back = keys.with_columns(gid).join(groups, on="_g", how="left", suffix="_decoded")
        for column in keys.columns:
            assert back[column].equals(back[f"{column}_decoded"], check_names=False, null_equal=True), column
        assert groups.schema == {**keys.schema, "_g": pl.Int64}


def test_gpu_trace_device_text_with_and_without_the_gpu_list(tmp_path: Path) -> None:
    """``Device`` is made once per device id: ``"<GPU name> (<id>)"`` from the GPU list, and
    ``"GPU <id> (<id>)"`` for a copy of the export whose GPU list was dropped (time-sliced
    exports have none); every row of a device has its text."""

    path = SAMPLES / "custom_allreduce_2gpu" / "custom_allreduce_2gpu.sqlite"
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    names = dict(con.execute("SELECT id, name FROM TARGET_INFO_GPU").fetchall())
    present = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    tables = [t for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET") if t in present]
    union = " UNION ALL ".join(f"SELECT deviceId FROM {t}" for t in tables)
    ops = con.execute(f"SELECT deviceId, count(*) FROM ({union}) GROUP BY deviceId").fetchall()
    con.close()
    assert len(ops) == 2
    copy = mutated_copy(path, tmp_path / "no_gpu_list.sqlite", "DROP TABLE TARGET_INFO_GPU")
    for export, text in ((path, lambda d: f"{names[d]} ({d})"), (copy, lambda d: f"GPU {d} ({d})")):
        counts = run_report(_open(export), "cuda_gpu_trace").frame.group_by("Device").len()
        assert dict(counts.iter_rows()) == {text(d): n for d, n in ops}
