"""Gaps left by the robustness and fuzz tests, each on a real export or a mutated copy made
here: empty tables of an old export (columns that newer readers select are absent), a text
cell in ``start`` that SQLite's arithmetic read as 0, and ``memory_usage.name``."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import warnings
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit.errors import TracekitError
from tracekit.nsys.database import TypeMismatchWarning
from tracekit.nsys.summary import trace_summary
from tracekit.nsys.trace import DamagedRowsWarning
from tracekit.stats import REPORTS, run_report

from .conftest import NSYS_CORPUS, SAMPLES

#: nsys 2020.5: its CUPTI tables lack greenContextId, copyCount … (selected as NULL)
KMEANS = NSYS_CORPUS / "nsys2020.5_kmeans_report2.sqlite"
DECODE = SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
ALLREDUCE = SAMPLES / "custom_allreduce_2gpu" / "custom_allreduce_2gpu.sqlite"


def _tables(path: Path) -> list[str]:
    if not path.is_file():
        return []
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    con.close()
    return names


def _copy(src: Path, dst: Path, *statements: str) -> Path:
    shutil.copyfile(src, dst)
    con = sqlite3.connect(dst)
    for sql in statements:
        con.execute(sql)
    con.commit()
    con.close()
    return dst


@pytest.mark.parametrize("table", _tables(KMEANS))
def test_every_table_of_an_old_export_empty(table: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty table read with two or more absent columns (``SELECT NULL, NULL``) made the
    ADBC driver panic (PanicException: multiple fields with name 'NULL'), e.g. the memcpy
    table of this nsys 2020.5 export in ``tracekit summary``."""
    monkeypatch.setenv("TRACEKIT_COLUMN_CACHE", "0")
    copy = _copy(KMEANS, tmp_path / "k.sqlite", f'DELETE FROM "{table}"')
    digest = hashlib.sha256(copy.read_bytes()).hexdigest()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # damaged-data warnings are not what is tested here
        try:
            trace = tracekit.open(copy)
        except TracekitError:
            return
        for name in ("kernels", "memcpys", "memsets", "syncs", "cuda_api", "nvtx", "gpus", "threads", "memory_usage"):
            assert isinstance(getattr(trace, name), pl.DataFrame)
        for call in (lambda: trace_summary(trace), *[(lambda r=r: run_report(trace, r)) for r in REPORTS]):
            try:
                call()
            except TracekitError as exc:
                assert "\n" not in str(exc)
        trace.close()
    assert hashlib.sha256(copy.read_bytes()).hexdigest() == digest


def test_empty_memcpy_table_of_an_old_export_has_the_documented_schema(tmp_path: Path) -> None:
    copy = _copy(KMEANS, tmp_path / "k.sqlite", "DELETE FROM CUPTI_ACTIVITY_KIND_MEMCPY")
    trace = tracekit.open(copy)
    assert trace.memcpys.height == 0
    assert trace.memcpys.schema == tracekit.nsys.schema.empty("memcpys").schema
    assert trace.kernels.height == 9


def test_text_in_start_is_not_read_as_zero_by_the_sql_duration(tmp_path: Path) -> None:
    """``"end" - "start"`` computed by SQLite read ``start = 'abc'`` as 0: the report's
    durations became absolute timestamps (Max 474,550,417 ns for a 2 µs kernel), silently.
    Now those durations are null, with one warning; text that is an exact integer converts."""
    garbage = "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET \"start\" = 'abc' WHERE rowid % 11 = 0"
    as_text = 'UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = CAST("end" AS TEXT) WHERE rowid % 5 = 0'
    bad = _copy(DECODE, tmp_path / "bad.sqlite", garbage, as_text)
    con = sqlite3.connect(f"file:{bad}?mode=ro&immutable=1", uri=True)
    n_bad = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE typeof(start) = 'text'").fetchone()[0]
    good = con.execute(
        'SELECT max(CAST("end" AS INTEGER) - start) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE typeof(start) = \'integer\''
    ).fetchone()[0]
    con.close()
    assert n_bad > 0 and good < 1_000_000
    trace = tracekit.open(bad)
    with pytest.warns(TypeMismatchWarning, match=f"{n_bad} duration_ns cell"):
        report = run_report(trace, "cuda_gpu_kern_sum")
    assert report.frame["Max (ns)"].max() == good
    assert report.frame["Instances"].sum() == 480
    # the full table, read through polars casts, agrees
    with pytest.warns(DamagedRowsWarning, match=f"{n_bad} kernels row"):
        kernels = tracekit.open(bad).kernels
    assert kernels["duration_ns"].null_count() == n_bad and kernels["duration_ns"].max() == good


def test_memory_usage_names_are_the_text_of_the_export() -> None:
    """``CUDA_GPU_MEMORY_USAGE_EVENTS.name`` is TEXT (the symbol itself); it was read as a
    StringIds id, so every ``name`` was null."""
    con = sqlite3.connect(f"file:{ALLREDUCE}?mode=ro&immutable=1", uri=True)
    expected = [r[0] for r in con.execute("SELECT name FROM CUDA_GPU_MEMORY_USAGE_EVENTS ORDER BY rowid")]
    con.close()
    names = tracekit.open(ALLREDUCE).memory_usage["name"].to_list()
    assert names == expected
    assert sum(n is not None for n in names) == 2412
