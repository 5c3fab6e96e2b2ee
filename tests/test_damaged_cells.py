"""Gaps left by the robustness and fuzz tests, each on a real export or a mutated copy made
here: empty tables of an old export (columns that newer readers select are absent), a text
cell in ``start`` that SQLite's arithmetic read as 0, and ``memory_usage.name``."""

from __future__ import annotations

import hashlib
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

from .conftest import NSYS_CORPUS, SAMPLES, mutated_copy

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


@pytest.mark.parametrize("table", _tables(KMEANS))
def test_every_table_of_an_old_export_empty(table: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty table read with two or more absent columns (``SELECT NULL, NULL``) made the
    ADBC driver panic (PanicException: multiple fields with name 'NULL'), e.g. the memcpy
    table of this nsys 2020.5 export in ``tracekit summary``."""
    monkeypatch.setenv("TRACEKIT_COLUMN_CACHE", "0")
    copy = mutated_copy(KMEANS, tmp_path / "k.sqlite", f'DELETE FROM "{table}"')
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
    copy = mutated_copy(KMEANS, tmp_path / "k.sqlite", "DELETE FROM CUPTI_ACTIVITY_KIND_MEMCPY")
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
    bad = mutated_copy(DECODE, tmp_path / "bad.sqlite", garbage, as_text)
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


def test_invalid_utf8_in_an_nvtx_text_cell_is_decoded_with_one_warning(tmp_path: Path) -> None:
    """NVTX_EVENTS.text went to Arrow as invalid UTF-8: ``tracekit summary`` ended in a polars
    panic ("internal error: the table engine panicked"), nvtx_sum printed the bad bytes. Now
    every text column is read as bytes and decoded with U+FFFD, after one warning per column
    that counts the values; StringIds' warning is the same one-line warning (it was a log
    record, ``WARNING tracekit.nsys.readers: …``). nsys 2023.4 stops on both ("Could not decode
    to UTF-8")."""
    import subprocess
    import sys

    from .conftest import ROOT

    first = "(SELECT min(rowid) FROM NVTX_EVENTS WHERE text IS NOT NULL)"
    sid = "(SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid = 1)"
    bad = mutated_copy(DECODE, tmp_path / "utf.sqlite",
                f"UPDATE NVTX_EVENTS SET text = CAST(X'73746570ff' AS TEXT) WHERE rowid = {first}",
                f"UPDATE StringIds SET value = CAST(X'6b65726e656cfffe41' AS TEXT) WHERE id = {sid}")  # fmt: skip
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT), "TRACEKIT_CACHE": str(tmp_path / "cache")}
    warnings_seen = [
        "tracekit: warning: utf.sqlite: StringIds.value: 1 value(s) are not valid UTF-8; decoded with replacement characters (U+FFFD)",
        "tracekit: warning: utf.sqlite: NVTX_EVENTS.text: 1 value(s) are not valid UTF-8; decoded with replacement characters (U+FFFD)",
    ]
    for args in (["summary"], ["stats", "-r", "nvtx_sum", "-f", "csv"]):
        run = subprocess.run([sys.executable, "-m", "tracekit.cli.main", *args, str(bad)], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
        assert run.returncode == 0, run.stderr[-1500:]
        assert run.stderr.splitlines() == warnings_seen
    assert ",PushPop,:step\ufffd\n" in run.stdout
    from tracekit.nsys.database import InvalidTextWarning

    with pytest.warns(InvalidTextWarning) as seen:
        names = tracekit.open(bad).table("nvtx", ["name"])["name"]
    assert sorted(str(w.message).split(": ")[1] for w in seen) == ["NVTX_EVENTS.text", "StringIds.value"]
    assert "step\ufffd" in names.to_list()


def test_an_export_without_string_ids_warns_that_names_are_empty(tmp_path: Path) -> None:
    """A damaged export without StringIds gave empty kernel names in every table and report
    with no word (review finding)."""
    damaged = mutated_copy(DECODE, tmp_path / "no_strings.sqlite", "DROP TABLE StringIds")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trace = tracekit.open(damaged, column_cache=False)
        kernels = trace.kernels
    assert kernels.height == 480 and kernels["name"].null_count() + (kernels["name"] == "").sum() == 480
    said = [str(w.message) for w in seen if issubclass(w.category, DamagedRowsWarning)]
    assert said == ["no_strings.sqlite: the export has no StringIds table, so the names in CUPTI_ACTIVITY_KIND_KERNEL, "
                    "CUPTI_ACTIVITY_KIND_RUNTIME, NVTX_EVENTS are empty; export the report again (nsys export --type sqlite)"]  # fmt: skip
