"""The nsys loader on every real export we have: row counts, schema, metadata."""

from __future__ import annotations

import contextlib
import sqlite3
import warnings
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit.nsys.schema import SCHEMA_VERSION, TABLES
from tracekit.nsys.trace import IncompleteTraceWarning, NsysTrace

from .conftest import NSYS_CORPUS, ROOT, SAMPLES, corpus_files, sample_exports

ALL_EXPORTS = corpus_files() + sample_exports()

# tidy table -> the raw table whose every row it keeps
ROW_SOURCES = {
    "kernels": "CUPTI_ACTIVITY_KIND_KERNEL",
    "memcpys": "CUPTI_ACTIVITY_KIND_MEMCPY",
    "memsets": "CUPTI_ACTIVITY_KIND_MEMSET",
    "syncs": "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
    "cuda_api": "CUPTI_ACTIVITY_KIND_RUNTIME",
    "nvtx": "NVTX_EVENTS",
    "memory_usage": "CUDA_GPU_MEMORY_USAGE_EVENTS",
    "gpu_metrics": "GPU_METRICS",
}


def _raw_count(path: Path, table: str) -> int:
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        exists = con.execute("SELECT count(*) FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
        return con.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0] if exists else 0
    finally:
        con.close()


def _open(path: Path) -> NsysTrace:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IncompleteTraceWarning)
        trace = tracekit.open(path)
    assert isinstance(trace, NsysTrace)
    return trace


@pytest.mark.parametrize("path", ALL_EXPORTS, ids=lambda p: p.name)
def test_row_counts_match_sqlite(path: Path) -> None:
    trace = _open(path)
    for table, raw in ROW_SOURCES.items():
        frame = trace.table(table)
        assert frame.height == _raw_count(path, raw), f"{table} vs {raw}"
        assert dict(frame.schema) == {k: (v if isinstance(v, pl.DataType) else v()) for k, v in TABLES[table].items()}


@pytest.mark.parametrize("path", ALL_EXPORTS, ids=lambda p: p.name)
def test_both_engines_give_identical_tables(path: Path) -> None:
    fast = _open(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IncompleteTraceWarning)
        slow = NsysTrace(path, engine="sqlite3")
    for table in ("kernels", "memcpys", "cuda_api", "nvtx", "gpus", "threads"):
        assert fast.table(table).equals(slow.table(table), null_equal=True), table


def test_kernel_names_and_ids_decoded() -> None:
    path = NSYS_CORPUS / "nsys2026.2_nsysai_mfu_2xh100_nccl_slice.sqlite"
    trace = _open(path)
    k = trace.kernels
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    row = con.execute(
        "SELECT k.start, k.end, k.globalPid, s.value, k.deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "JOIN StringIds s ON s.id = k.demangledName ORDER BY k.start LIMIT 1"
    ).fetchone()
    first = k.sort("start_ns").row(0, named=True)
    assert first["start_ns"] == row[0] and first["duration_ns"] == row[1] - row[0]
    assert first["pid"] == (row[2] >> 24) & 0xFFFFFF
    assert first["name"] == row[3] and first["device_id"] == row[4]
    assert set(k["device_id"].unique().to_list()) == {0, 1}
    assert k.filter(pl.col("name").str.starts_with("ncclDevKernel")).height > 0


def test_api_pid_tid_and_runtime_driver_split() -> None:
    trace = _open(NSYS_CORPUS / "nsys2026.2_nsysai_mfu_2xh100_nccl_slice.sqlite")
    api = trace.cuda_api
    assert set(api["api"].unique().to_list()) <= {"runtime", "driver"}
    assert (api["global_tid"] // 0x1000000 % 0x1000000 == api["pid"]).all()
    assert (api["global_tid"] % 0x1000000 == api["tid"]).all()
    assert api.filter(pl.col("name").str.starts_with("cudaLaunchKernel")).height > 0


def test_nvtx_domains_and_names() -> None:
    trace = _open(NSYS_CORPUS / "nsys2023.1_memfusion_tensorrt.sqlite")
    ranges = trace.nvtx.filter(pl.col("event_type") == "PushPop")
    assert "TensorRT" in ranges["domain"].unique().to_list()
    assert ranges["name"].null_count() == 0
    # the time slice lost its domain-create rows: domain unknown, id kept
    sliced = _open(NSYS_CORPUS / "nsys2026.2_nsysai_mfu_2xh100_nccl_slice.sqlite").nvtx
    nccl = sliced.filter(pl.col("name") == "ncclGroupEnd")
    assert nccl.height > 0 and nccl["domain"].null_count() == nccl.height
    assert (nccl["domain_id"] == 1).all()


def test_memcpy_labels_without_enum_tables() -> None:
    # 2021.2 has no ENUM_* tables: the built-in CUPTI maps must still label copies
    trace = _open(NSYS_CORPUS / "nsys2021.2_mordred_report1.sqlite")
    kinds = set(trace.memcpys["copy_kind"].to_list())
    assert kinds <= {"HtoD", "DtoH", "DtoD", "HtoH", "PtoP"} and kinds
    assert trace.memcpys["copy_kind_label"].str.contains("-to-").all()


def test_meta_versions() -> None:
    assert _open(NSYS_CORPUS / "nsys2024.5_pipit_cloverleaf_4xa100.sqlite").meta.product_version == "2024.5.1.113"
    assert _open(NSYS_CORPUS / "nsys2023.1_memfusion_tensorrt.sqlite").meta.schema_version is not None
    old = _open(NSYS_CORPUS / "nsys2020.5_kmeans_report2.sqlite").meta
    assert old.product_version is None and old.version_inferred == "2020.5"
    meta = _open(NSYS_CORPUS / "nsys2026.2_nsysai_mfu_2xh100_nccl_slice.sqlite").meta
    assert meta.processes[0].command[:2] == ["torchrun", "--nnodes=1"]
    assert meta.processes[0].environment["NCCL_VERSION"] == "2.25.1-1"
    assert meta.session_epoch_ns == 1779782330176752435
    assert meta.duration_ns == meta.end_ns - meta.start_ns


@pytest.mark.parametrize("path", [
    SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite",  # --capture-range=cudaProfilerApi
    SAMPLES / "planted" / "planted_host_bound" / "planted_host_bound.sqlite",  # the whole run
    NSYS_CORPUS / "nsys2022.2_pipit_saxpy_mpi_cuda.sqlite",
], ids=lambda p: p.stem)
def test_capture_window_is_on_the_events_timeline(path: Path) -> None:
    """A capture opened by a capture range times its events from the capture's start, while
    ANALYSIS_DETAILS keeps start and stop on another clock (llm_tp2_nccl: 9.99 s → 10.40 s
    beside kernels at 16–395 ms); the window is then [0, duration]. Either way every CUDA call
    and GPU operation lies inside it (SQL)."""
    meta = _open(path).meta
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    start, stop = con.execute("SELECT startTime, stopTime FROM ANALYSIS_DETAILS").fetchone()
    lo = min(con.execute(f"SELECT min(start) FROM {t}").fetchone()[0] for t in ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL"))
    hi = max(con.execute(f"SELECT max(end) FROM {t}").fetchone()[0] for t in ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL"))
    con.close()
    assert meta.start_ns <= lo and hi <= meta.end_ns
    assert meta.end_ns - meta.start_ns == stop - start == meta.duration_ns
    assert (meta.start_ns == 0) == (lo < start)


def test_incomplete_export_warns_and_gives_empty_tables() -> None:
    path = NSYS_CORPUS / "incomplete_cardiac_report1.sqlite"
    with pytest.warns(IncompleteTraceWarning, match="CUDA trace"):
        trace = tracekit.open(path)
    assert isinstance(trace, NsysTrace)
    for table in ("kernels", "memcpys", "cuda_api", "nvtx"):
        frame = trace.table(table)
        assert frame.is_empty()
        assert list(frame.columns) == list(TABLES[table])


def test_schema_version_is_documented() -> None:
    doc = (Path(__file__).parents[1] / "docs" / "tables.md").read_text()
    assert f"Schema version: {SCHEMA_VERSION}" in doc
    for table, columns in TABLES.items():
        assert f"## `{table}`" in doc, table
        for column in columns:
            assert f"`{column}`" in doc, f"{table}.{column} undocumented"


@pytest.mark.parametrize("path", ALL_EXPORTS, ids=lambda p: p.name)
def test_name_ids_on_request_match_stringids(path: Path) -> None:
    """``name_id`` & co. are the raw ``StringIds`` ids (checked against SQLite), only given when
    asked for, and looked up they give the name columns of the full table, row for row."""
    from tracekit.nsys.readers import canonical_string_ids, lookup_strings

    trace = _open(path)
    k = trace.table("kernels", ["name_id", "short_name_id", "mangled_name_id", "name", "short_name", "mangled_name"])
    assert "name_id" not in trace.kernels.columns  # not part of the documented table
    # on request even once the full table is built
    k2 = trace.table("kernels", ["name_id", "name"])
    assert k2.equals(k.select("name", "name_id"), null_equal=True)
    for ids, text in (("name_id", "name"), ("short_name_id", "short_name"), ("mangled_name_id", "mangled_name")):
        looked_up = k.select(lookup_strings(pl.col(ids), trace.strings).alias(text))
        assert looked_up[text].equals(k[text], null_equal=True), ids
    if k.height:
        con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
        raw = [r[0] for r in con.execute("SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY rowid")]
        con.close()
        assert k["name_id"].to_list() == raw
        canon = k.select(canonical_string_ids(pl.col("name_id"), trace.strings).alias("c"), "name")
        # one canonical id per name text, and one text per id
        assert canon.group_by("name").agg(pl.col("c").n_unique())["c"].max() == 1
        assert canon.group_by("c").agg(pl.col("name").n_unique())["name"].max() == 1
    api = trace.table("cuda_api", ["name_id", "name"])
    assert api.select(lookup_strings(pl.col("name_id"), trace.strings).alias("n"))["n"].equals(api["name"], null_equal=True)


def test_unload_lets_go_of_built_tables_and_reads_them_again() -> None:
    """NsysTrace.unload: a pipeline step frees what an earlier one built (the bounded report
    does between its sections); a table asked for again is read again, the same."""
    trace = tracekit.open(ROOT / "sample_traces" / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite")
    kernels = trace.kernels
    trace.unload("kernels", "nvtx")  # nvtx was never built: skipped
    assert not trace.is_loaded("kernels") and not trace.is_loaded("nvtx")
    again = trace.kernels
    assert again is not kernels and again.equals(kernels)


def test_string_lookup_by_position_equals_the_hash_lookup() -> None:
    """``lookup_strings`` takes a text by position where the StringIds ids are 0, 1, 2 … (as
    nsys writes them) and by ``replace_strict`` otherwise: both give each id's text, null for
    an id the table lacks or a null id, and keep the input's name (issue 44: the hash table of
    the whole StringIds was ~30 MB per lookup on 300 k strings)."""
    from tracekit.nsys.readers import lookup_strings

    strings = tracekit.open(SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite").strings
    ids = strings["id"]
    assert ids.is_sorted() and int(ids[-1]) - int(ids[0]) == strings.height - 1  # the dense case is the real one
    probe = pl.DataFrame({"nameId": pl.Series([*ids.gather([0, 5, strings.height - 1]).to_list(), None, -1,
                                               int(ids.max()) + 1, 3, 3], dtype=pl.Int64)})
    want = probe.select(pl.col("nameId").replace_strict(ids, strings["value"], default=None, return_dtype=pl.Utf8))
    got = probe.select(lookup_strings(pl.col("nameId"), strings))
    assert got.columns == ["nameId"] and got.to_series().to_list() == want.to_series().to_list()
    assert got.to_series().null_count() == 3
    gappy = strings.filter(pl.col("id") != 5)  # not 0, 1, 2 …: the hash lookup, same answers
    got = probe.select(lookup_strings(pl.col("nameId"), gappy).alias("text"))["text"].to_list()
    assert got == [t if i != 5 else None for i, t in zip(probe["nameId"].to_list(), want.to_series().to_list(), strict=True)]
    # ids that are no integers (a NaN, text): null by position as by the hash lookup
    odd = pl.DataFrame({"f": [0.0, float("nan"), 5.0], "s": ["5", "x", None]})
    by_hash = [odd.select(pl.col(c).cast(pl.Int64, strict=False).replace_strict(ids, strings["value"], default=None,
                                                                                 return_dtype=pl.Utf8))[c].to_list() for c in ("f", "s")]
    assert [odd.select(lookup_strings(pl.col(c), strings))[c].to_list() for c in ("f", "s")] == by_hash
    assert by_hash[0][1] is None and by_hash[0][2] == by_hash[1][0] is not None


def test_one_value_columns_hold_the_exports_values_once() -> None:
    """A table of at least ONE_VALUE_FROM_ROWS rows holds a column whose rows are all one
    value (one GPU's device and context, one process) as that value once, and an all-null
    column as null once: the rows equal the export's by SQL; those columns add nothing to the
    frame's size, where the same rows taken out one column at a time hold every row."""
    from tracekit.nsys.readers import ONE_VALUE_FROM_ROWS, one_value_columns

    from .conftest import llm_capture

    path = llm_capture("hf_generate_eager")
    t = tracekit.open(path)
    cols = ["device_id", "context_id", "global_pid", "stream_id", "correlation_id", "start_ns"]
    k = t.table("kernels", cols)
    assert k.height >= ONE_VALUE_FROM_ROWS
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        rows = db.execute("SELECT deviceId, contextId, globalPid, streamId, correlationId, start FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall()
        one = {c: db.execute(f"SELECT count(DISTINCT {c}) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
               for c in ("deviceId", "contextId", "globalPid", "streamId")}
    assert one["deviceId"] == one["contextId"] == one["globalPid"] == 1
    held = k.estimated_size()
    whole = pl.DataFrame([k.get_column(c) for c in cols])
    # each one-value Int64 column held once (8 bytes) instead of 8 bytes a row
    assert whole.estimated_size() - held == sum(n == 1 for n in one.values()) * 8 * (k.height - 1)
    assert sorted(k.select(cols).rows()) == sorted(rows)
    # an all-null column, and a frame below the bound left as it is
    with_nulls = k.select("start_ns").with_columns(pl.Series("x", [None] * k.height, pl.Int64))
    nulls = one_value_columns(with_nulls)
    assert with_nulls.estimated_size() - nulls.estimated_size() >= 8 * k.height
    assert nulls["x"].null_count() == k.height and nulls.equals(with_nulls)
    small = k.head(ONE_VALUE_FROM_ROWS - 1)
    assert one_value_columns(small) is small
