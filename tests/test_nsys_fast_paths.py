"""The speed paths of the loader give exactly the frames of the plain path.

Parallel rowid slices, column projection and the on-disk column cache only switch on for
large tables (≥ 200,000 rows), which the bundled traces do not have; these tests lower the
thresholds so that every real export goes through them, and compare with the
single-threaded standard-library reader.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import warnings
from pathlib import Path

import polars as pl
import pytest

from tracekit.nsys import database
from tracekit.nsys.schema import TABLES
from tracekit.nsys.trace import IncompleteTraceWarning, NsysTrace

from .conftest import NSYS_CORPUS, SAMPLES, corpus_files, mutated_copy, sample_exports

LARGE_TABLES = ("kernels", "memcpys", "memsets", "syncs", "cuda_api", "nvtx")
EXPORTS = sample_exports() + [p for p in corpus_files() if "incomplete" not in p.name][:6]


def _trace(path: Path, **options: object) -> NsysTrace:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IncompleteTraceWarning)
        return NsysTrace(path, **options)  # type: ignore[arg-type]


@pytest.fixture
def small_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(database, "PARALLEL_MIN_ROWS", 2)
    monkeypatch.setattr(database, "CACHE_MIN_ROWS", 2)
    monkeypatch.setenv("TRACEKIT_READ_THREADS", "3")


@pytest.mark.parametrize("path", EXPORTS, ids=lambda p: p.name)
def test_parallel_slices_give_the_single_threaded_tables(path: Path, small_thresholds: None) -> None:
    fast = _trace(path, column_cache=False)
    slow = _trace(path, engine="sqlite3", column_cache=False)
    assert fast.db.engine == "adbc"
    kernel_rows = fast.db.row_count("CUPTI_ACTIVITY_KIND_KERNEL")
    if kernel_rows >= 3:
        assert len(fast.db._rowid_slices("CUPTI_ACTIVITY_KIND_KERNEL")) == 3
    for table in LARGE_TABLES:
        a, b = fast.table(table), slow.table(table)
        assert a.equals(b, null_equal=True), table


@pytest.mark.parametrize("path", EXPORTS, ids=lambda p: p.name)
def test_projected_reads_equal_the_full_tables(path: Path) -> None:
    full = _trace(path, column_cache=False)
    for table in LARGE_TABLES:
        whole = full.table(table)
        columns = list(TABLES[table])
        for pick in (columns[::4], columns[1::3], ["name"] if "name" in columns else columns[:1], columns[-2:]):
            narrow = _trace(path, column_cache=False).table(table, pick)
            assert narrow.columns == [c for c in columns if c in pick]
            assert narrow.equals(whole.select(narrow.columns), null_equal=True), (table, pick)


def test_projection_rejects_unknown_columns() -> None:
    trace = _trace(SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite", column_cache=False)
    with pytest.raises(KeyError, match="kernels has no column 'gridx'"):
        trace.table("kernels", ["gridx", "name"])


def test_projection_reuses_a_loaded_table() -> None:
    trace = _trace(SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite", column_cache=False)
    assert not trace.is_loaded("kernels")
    trace.table("kernels", ["name"])
    assert not trace.is_loaded("kernels")  # narrow reads are not kept
    kernels = trace.kernels
    assert trace.is_loaded("kernels")
    assert trace.table("kernels", ["name", "start_ns"]).equals(kernels.select("start_ns", "name"))


def _cache_files(root: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in root.rglob("*.arrow")}


def test_column_cache_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_thresholds: None) -> None:
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    path = SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"
    reference = _trace(path, engine="sqlite3", column_cache=False)
    first = _trace(path)
    tables = {t: first.table(t) for t in LARGE_TABLES}
    files = _cache_files(tmp_path / "cache")
    assert len(files) > 40  # every raw column of six tables
    assert all(p.parent.name == first.db.column_cache.key for p in files)  # type: ignore[union-attr]
    second = _trace(path)
    for table, frame in tables.items():
        again = second.table(table)
        assert again.equals(frame, null_equal=True), table
        assert again.equals(reference.table(table), null_equal=True), table
    assert _cache_files(tmp_path / "cache") == files  # read, not rewritten
    import pyarrow as pa

    for file in files:  # one record batch each: read back as one buffer, no copy to join batches
        with pa.ipc.open_file(file) as reader:
            assert reader.num_record_batches == 1, file.name


def test_filling_the_column_cache_does_not_import_pyarrow(tmp_path: Path) -> None:
    """Columns are written by polars itself: importing pyarrow cost 0.07–0.1 s of every cold
    ``tracekit stats`` run. A fresh interpreter fills the cache (thresholds lowered so the
    sample's tables go through it) and reads it back."""
    import subprocess
    import sys

    path = SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
    code = (
        "import sys\n"
        "from tracekit.nsys import database\n"
        "from tracekit.nsys.trace import NsysTrace\n"
        "database.PARALLEL_MIN_ROWS = database.CACHE_MIN_ROWS = 2\n"
        "first = NsysTrace(sys.argv[1]).table('kernels', ['start_ns', 'end_ns', 'name_id'])\n"
        "again = NsysTrace(sys.argv[1]).table('kernels', ['start_ns', 'end_ns', 'name_id'])\n"
        "assert again.equals(first) and first.height > 0\n"
        "print(first.height, 'pyarrow' in sys.modules)\n"
    )
    env = {**os.environ, "TRACEKIT_CACHE": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env, check=True)
    rows, imported = out.stdout.split()
    assert int(rows) == _trace(path, column_cache=False).kernels.height
    assert imported == "False"
    assert len(_cache_files(tmp_path / "cache")) >= 3  # the columns read, each written once


def test_column_cache_key_follows_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_thresholds: None) -> None:
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    copy = tmp_path / "trace.sqlite"
    shutil.copyfile(SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite", copy)
    key_before = _trace(copy).db.column_cache.key  # type: ignore[union-attr]
    assert _trace(copy).kernels.height > 0
    st = copy.stat()
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    after = _trace(copy)
    assert after.db.column_cache.key != key_before  # type: ignore[union-attr]
    assert after.kernels.equals(_trace(copy, engine="sqlite3", column_cache=False).kernels, null_equal=True)


def test_damaged_cache_file_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_thresholds: None) -> None:
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    path = SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
    expected = _trace(path).kernels
    for file in (tmp_path / "cache").rglob("*.arrow"):
        file.write_bytes(b"not arrow at all")
    from tracekit.nsys.column_cache import CacheIntegrityWarning

    with pytest.warns(CacheIntegrityWarning, match="failed its checksum"):
        assert _trace(path).kernels.equals(expected, null_equal=True)
    rebuilt = list((tmp_path / "cache").rglob("CUPTI_ACTIVITY_KIND_KERNEL.*.arrow"))
    assert len(rebuilt) > 10
    assert all(pl.read_ipc(f).height == expected.height for f in rebuilt)


def test_column_cache_can_be_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_thresholds: None) -> None:
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TRACEKIT_COLUMN_CACHE", "0")
    trace = _trace(SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite")
    assert trace.kernels.height > 0
    assert trace.db.column_cache is None
    assert not (tmp_path / "cache").exists()


def test_unwritable_cache_only_skips_caching(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_thresholds: None) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder would go")
    monkeypatch.setenv("TRACEKIT_CACHE", str(blocker))
    path = NSYS_CORPUS / "nsys2026.2_nsysai_mfu_2xh100_nccl_slice.sqlite"
    if not path.is_file():
        path = SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
    assert _trace(path).kernels.equals(_trace(path, column_cache=False).kernels, null_equal=True)


ATTRIBUTED = [
    SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite",
    SAMPLES / "llm_tp2pp2_nccl" / "llm_tp2pp2_nccl.sqlite",
    SAMPLES / "custom_allreduce_2gpu" / "custom_allreduce_2gpu.sqlite",
    NSYS_CORPUS / "nsys2022.2_pipit_saxpy_mpi_cuda.sqlite",  # wrapper API rows: the dedupe path
]


@pytest.mark.parametrize("cache", ["off", "filled by the first open", "read by the second"])
@pytest.mark.parametrize("path", ATTRIBUTED, ids=lambda p: p.stem)
def test_attribute_trace_equals_the_full_table_pipeline(
    path: Path, cache: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_thresholds: None
) -> None:
    """attribute_trace reads a few columns, the API calls one at a time from the column cache
    (or all at once without it); the result equals the pipeline over the full tables."""
    from tracekit.analysis.attribution import attribute_nvtx, attribute_trace, launch_info
    from tracekit.analysis.gpu_time import gpu_ops

    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    full = _trace(path, column_cache=False)
    expected = attribute_nvtx(launch_info(gpu_ops(full.kernels, full.memcpys, full.memsets), full.cuda_api), full.nvtx)
    if cache == "read by the second":
        attribute_trace(_trace(path))  # fills the cache
    trace = _trace(path, column_cache=cache != "off")
    ours = attribute_trace(trace)
    assert ours.equals(expected)
    assert not trace.is_loaded("cuda_api")
    cached = list((tmp_path / "cache").rglob("CUPTI_ACTIVITY_KIND_RUNTIME.*.arrow"))
    assert bool(cached) == (cache != "off")


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def test_column_cache_keeps_under_its_size_limit_dropping_the_least_recently_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_thresholds: None
) -> None:
    """Three exports cached one after the other under a limit that holds two of them: the
    one least recently read goes, a read refreshes an export, the one being written stays."""
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    a, b, c = (SAMPLES / n / f"{n}.sqlite" for n in ("llm_decode_1gpu", "llm_tp2_nccl", "llm_tp2pp2_nccl"))
    folders = {}
    for path in (a, b):
        trace = _trace(path)
        trace.kernels  # noqa: B018 - fills the cache
        folders[path] = trace.db.column_cache.folder  # type: ignore[union-attr]
    sizes = {p: _folder_bytes(f) for p, f in folders.items()}
    os.utime(folders[a], (1, 1))  # a was used long ago and b recently ...
    os.utime(folders[b], (2, 2))
    assert _trace(a).kernels.height > 0  # ... until a is read again (from the cache)
    limit_gb = (sizes[a] + sizes[b] + 1) / 1e9  # room for two of the three
    monkeypatch.setenv("TRACEKIT_COLUMN_CACHE_MAX_GB", f"{limit_gb:.12f}")
    fresh = _trace(c)
    fresh.kernels  # noqa: B018
    kept = {p.name for p in (tmp_path / "cache" / "columns").iterdir()}
    assert folders[a].name in kept and fresh.db.column_cache.folder.name in kept  # type: ignore[union-attr]
    assert folders[b].name not in kept
    assert _trace(b).kernels.equals(_trace(b, column_cache=False).kernels, null_equal=True)  # rebuilt when needed


def test_column_cache_limit_of_zero_keeps_only_the_export_being_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_thresholds: None
) -> None:
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TRACEKIT_COLUMN_CACHE_MAX_GB", "0")
    first, second = _trace(SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"), _trace(SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite")
    first.kernels  # noqa: B018
    second.kernels  # noqa: B018
    kept = [p.name for p in (tmp_path / "cache" / "columns").iterdir()]
    assert kept == [second.db.column_cache.key]  # type: ignore[union-attr]


def _count_scans(monkeypatch: pytest.MonkeyPatch, wheres: list[str] | None = None) -> list[tuple[str, list[str]]]:
    """Record every scan of the export (table, expressions; its ``WHERE`` in ``wheres``) while
    still running it."""
    scans: list[tuple[str, list[str]]] = []
    original = database.ExportDatabase._scan_table

    def counted(self: database.ExportDatabase, table: str, exprs: list[str], schema: dict, where: str = "",  # type: ignore[type-arg]
                **kwargs: bool) -> pl.DataFrame:
        scans.append((table, list(exprs)))
        if wheres is not None:
            wheres.append(where)
        return original(self, table, exprs, schema, where, **kwargs)

    monkeypatch.setattr(database.ExportDatabase, "_scan_table", counted)
    return scans


def test_prefetch_reads_the_columns_a_report_needs_in_one_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_thresholds: None
) -> None:
    """A cold ``cuda_kern_exec_sum`` puts its six kernel and five API columns in the cache with
    one scan of each table (it read them one scan per column), then reads them back one at a
    time; the report equals the one made without any cache, and a warm run scans nothing.
    (With every call read: this export has 5 calls per kernel, so it would read only the
    launches otherwise; see the next test.)"""
    from tracekit.nsys import launch_scans
    from tracekit.stats import run_report

    monkeypatch.setattr(launch_scans, "NARROW_FROM_CALLS_PER_KERNEL", 1 << 40)
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    path = SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"
    expected = run_report(_trace(path, column_cache=False), "cuda_kern_exec_sum", convention="2023").to_csv()
    scans = _count_scans(monkeypatch)
    cold = run_report(_trace(path), "cuda_kern_exec_sum", convention="2023").to_csv()
    big = [s for s in scans if s[0] in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME")]
    assert [t for t, _ in big] == ["CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME"]
    assert sorted(big[0][1]) == sorted(['"globalPid"', '"correlationId"', '"deviceId"', '"demangledName"', '"start"', '"end"'])
    assert sorted(big[1][1]) == sorted(['"globalTid"', '"correlationId"', '"nameId"', '"start"', '"end"'])
    assert cold == expected
    scans.clear()
    # the prefetched columns were held until read: a second prefetch finds them cached
    db = database.ExportDatabase(path)
    database.prefetch_columns(db, "CUPTI_ACTIVITY_KIND_RUNTIME", ["start", "end"])
    assert scans == [] and db.column_cache is not None and not db.column_cache._held
    assert run_report(_trace(path), "cuda_kern_exec_sum", convention="2023").to_csv() == expected
    assert not [s for s in scans if s[0] in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME")]


def test_a_cold_launch_join_reads_only_the_calls_that_launch_a_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_thresholds: None
) -> None:
    """With several calls per kernel, a cold ``cuda_kern_exec_sum`` and ``cuda_kern_exec_trace``
    read the API calls once, filtered in SQLite to the correlation ids of the kernels, and
    write none of their columns to the cache; the reports equal those made from every call
    without any cache, and a warm run reads neither table (the join is kept)."""
    from tracekit.analysis import op_launches
    from tracekit.nsys import launch_scans
    from tracekit.stats import run_report

    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    path = SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"
    api = "CUPTI_ACTIVITY_KIND_RUNTIME"
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    calls, launches = con.execute(
        f"SELECT count(*), sum(correlationId IN (SELECT correlationId FROM {op_launches.KERNEL_TABLE})) FROM {api}"
    ).fetchone()
    con.close()
    assert calls >= 2 * launches > 0  # most calls launch no kernel: the filter has rows to drop
    wheres: list[str] = []
    scans = _count_scans(monkeypatch, wheres)
    for report in ("cuda_kern_exec_sum", "cuda_kern_exec_trace"):
        shutil.rmtree(tmp_path / "cache", ignore_errors=True)
        with monkeypatch.context() as m:  # every call, no cache: the reference
            m.setattr(launch_scans, "NARROW_FROM_CALLS_PER_KERNEL", 1 << 40)
            expected = run_report(_trace(path, column_cache=False), report, convention="2023").to_csv()
        trace = _trace(path)
        assert op_launches.narrows_launch_calls(trace)
        scans.clear()
        wheres.clear()
        assert run_report(trace, report, convention="2023").to_csv() == expected
        on_api = [w for (t, _), w in zip(scans, wheres, strict=True) if t == api]
        assert on_api == [f"+correlationId IN (SELECT correlationId FROM {op_launches.KERNEL_TABLE})"]
        got = op_launches.kernel_launch_calls(trace)
        assert got is not None and got.height == launches
        db = database.ExportDatabase(path)
        assert db.column_cache is not None
        assert not any(db.column_cache.has(api, f'"{c}"') for c in ("globalTid", "correlationId", "nameId", "start", "end"))
        scans.clear()
        assert run_report(_trace(path), report, convention="2023").to_csv() == expected
        assert not [s for s in scans if s[0] in (op_launches.KERNEL_TABLE, api)]  # warm: the kept join


def test_launch_reports_read_every_call_beside_a_report_that_reads_them_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_thresholds: None
) -> None:
    """``tracekit stats -r cuda_kern_exec_sum,cuda_api_sum`` has the launch report read every
    call in one scan into the cache (the next report reads them from there), as alone, or
    after such a report, it reads only the launches; the report is the same."""
    from tracekit.stats import report_options, run_report

    assert report_options(["cuda_kern_exec_sum"]) == {"cuda_kern_exec_sum": {}}
    assert report_options(["cuda_gpu_kern_sum", "cuda_kern_exec_trace"]) == {"cuda_gpu_kern_sum": {}, "cuda_kern_exec_trace": {}}
    both = report_options(["cuda_kern_exec_sum", "cudaapisum", "cuda_kern_exec_trace"])
    assert both == {"cuda_kern_exec_sum": {"every_call": True}, "cudaapisum": {}, "cuda_kern_exec_trace": {}}
    after = report_options(["cuda_gpu_kern_sum", "nvtx_gpu_proj_sum", "cuda_kern_exec_sum"])  # the reader went first
    assert after == {"cuda_gpu_kern_sum": {}, "nvtx_gpu_proj_sum": {}, "cuda_kern_exec_sum": {}}
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    path = SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"
    narrowed = run_report(_trace(path, column_cache=False), "cuda_kern_exec_sum", convention="2023").to_csv()
    wheres: list[str] = []
    scans = _count_scans(monkeypatch, wheres)
    every = run_report(_trace(path), "cuda_kern_exec_sum", convention="2023", every_call=True).to_csv()
    assert every == narrowed
    assert [w for (t, _), w in zip(scans, wheres, strict=True) if t == "CUPTI_ACTIVITY_KIND_RUNTIME"] == [""]
    db = database.ExportDatabase(path)
    assert db.all_cached("CUPTI_ACTIVITY_KIND_RUNTIME", ['"globalTid"', '"correlationId"', '"nameId"', '"start"', '"end"'])


def test_launch_calls_are_read_whole_where_the_filter_cannot_be_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_thresholds: None
) -> None:
    """No ``correlationId`` in the API table: no filtered read (it was an SQL error); the
    filtered read refused for memory (it is checked as if every call came back): the calls
    are read a column at a time as before, and the report is the one every call gives."""
    from tracekit.analysis import op_launches
    from tracekit.stats import run_report

    src = SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"
    no_corr = mutated_copy(src, tmp_path / "no_corr.sqlite", "ALTER TABLE CUPTI_ACTIVITY_KIND_RUNTIME DROP COLUMN correlationId")
    trace = _trace(no_corr, column_cache=False)
    assert not op_launches.narrows_launch_calls(trace)
    assert run_report(trace, "cuda_kern_exec_sum").frame.height == 0  # no call can be matched
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    expected = run_report(_trace(src, column_cache=False), "cuda_kern_exec_sum", convention="2023").to_csv()
    calls = database.ExportDatabase(src).row_estimate("CUPTI_ACTIVITY_KIND_RUNTIME")
    # room for one column of every call at a time, not for the five the filtered read asks
    monkeypatch.setenv("TRACEKIT_READ_THREADS", "1")  # no thread stacks to count
    monkeypatch.setattr(database, "free_memory", lambda: 3 * calls * 8)
    trace = _trace(src)
    assert op_launches.narrows_launch_calls(trace) and op_launches.kernel_launch_calls(trace) is None
    wheres: list[str] = []
    scans = _count_scans(monkeypatch, wheres)
    assert run_report(trace, "cuda_kern_exec_sum", convention="2023").to_csv() == expected
    assert all(w == "" for (t, _), w in zip(scans, wheres, strict=True) if t == "CUPTI_ACTIVITY_KIND_RUNTIME")


@pytest.mark.parametrize("name", ["cuda_api", "kernels"])
def test_gathered_rows_of_cached_columns_equal_the_table(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_thresholds: None
) -> None:
    """Columns derived after a gather from the column cache (each input read and gathered in
    turn, each column derived once its inputs are in, inputs let go when no longer needed,
    columns of one value held once) equal the table's rows, as a frame and as Series: random
    rows with repeats, out of order, and none."""
    import random

    from tracekit.nsys.readers import gathered

    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    path = SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"
    table = _trace(path, column_cache=False).table(name)
    source = _trace(path).columns_on_demand(name, list(table.columns))
    assert source._from_cache()  # the derived path, not a frame read once
    rnd = random.Random(11)
    for n in (0, 1, 7, 500, table.height):
        rows = pl.Series([rnd.randrange(table.height) for _ in range(n)], dtype=pl.UInt32)
        cols = rnd.sample(table.columns, rnd.randint(1, table.width)) if n != table.height else list(table.columns)
        want = table.select(cols)[rows]
        assert gathered(source, cols, rows).equals(want)
        assert pl.DataFrame(source.gather_columns(cols, rows)).equals(want)
    rows = pl.Series([3, 1, 3], dtype=pl.UInt32)
    twice = source.gather_columns(["start_ns", "name", "start_ns"], rows)  # a name asked twice comes twice
    assert [s.name for s in twice] == ["start_ns", "name", "start_ns"] and twice[0].equals(table["start_ns"][rows])


def test_a_column_derived_from_no_input_is_made_last_for_every_row(tmp_path: Path) -> None:
    """A literal column beside ones derived from two inputs: one value per row asked for."""
    from tracekit.nsys import readers

    trace = _trace(SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite", column_cache=False)
    raw, derived = readers.cuda_api_spec(trace.strings)
    rows = pl.Series([0, 5, 2, 9], dtype=pl.UInt32)
    out = readers.gather_derived_frame(trace.db, readers.CUDA_API_SOURCE, "cuda_api", raw, {**derived, "api": pl.lit("runtime")},
                                       ["duration_ns", "api"], rows)
    assert out.height == 4 and out["api"].to_list() == ["runtime"] * 4
    assert out["duration_ns"].equals(trace.cuda_api["duration_ns"][rows])


def test_a_cold_read_scans_text_columns_apart_from_the_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_thresholds: None
) -> None:
    """A table read cold through the cache scans its number columns, then its text columns
    (a scan's batches and their contiguous copy are alive together; text is the bulk of a
    table of names): two scans, every column cached, the table equal to one read without the
    cache; warm, no scan."""
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    path = SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
    want = _trace(path, column_cache=False).nvtx
    scans = _count_scans(monkeypatch)
    got = _trace(path).nvtx
    assert got.equals(want, null_equal=True)
    nvtx = [exprs for t, exprs in scans if t == "NVTX_EVENTS"]
    assert len(nvtx) == 2 and '"text"' not in " ".join(nvtx[0]) and any("text" in e for e in nvtx[1])
    scans.clear()
    assert _trace(path).nvtx.equals(want, null_equal=True)
    assert not [t for t, _ in scans if t == "NVTX_EVENTS"]


def test_cache_integer_columns_reads_only_the_named_columns_within_scan_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_thresholds: None
) -> None:
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    path = SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
    db = database.ExportDatabase(path)
    table = "CUPTI_ACTIVITY_KIND_RUNTIME"
    rows = db.row_count(table)
    scans = _count_scans(monkeypatch)
    assert db.cache_integer_columns(table, ["start", "end", "globalTid", "nameId"], scan_bytes=2 * rows * 8)
    assert [len(exprs) for _, exprs in scans] == [2, 2]  # two columns' bytes per scan
    assert {e for _, exprs in scans for e in exprs} == {'"start"', '"end"', '"globalTid"', '"nameId"'}
    scans.clear()
    assert db.cache_integer_columns(table, ["start", "end"])  # cached: nothing read
    assert scans == []
    reference = database.ExportDatabase(path, column_cache=False)
    for column in ("start", "nameId"):
        got = db.query_table(table, [f'"{column}"'], {column: pl.Int64})
        assert got.equals(reference.query_table(table, [f'"{column}"'], {column: pl.Int64}))


def test_a_prefetch_without_room_reads_nothing_and_raises_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_thresholds: None
) -> None:
    """Without memory for the one scan, the prefetch leaves the columns to the report's own
    reads (one column at a time needs less), silently."""
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    db = database.ExportDatabase(SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite")
    room = database.free_memory
    monkeypatch.setattr(database, "free_memory", lambda: 1000)
    database.prefetch_columns(db, "CUPTI_ACTIVITY_KIND_RUNTIME", ["start", "end"])
    assert not _cache_files(tmp_path / "cache")
    monkeypatch.setattr(database, "free_memory", room)
    database.prefetch_columns(db, "CUPTI_ACTIVITY_KIND_RUNTIME", ["start", "end"])
    assert len(_cache_files(tmp_path / "cache")) == 2
    # held in memory until read once: the read returns them without the file, then they go
    assert db.column_cache is not None and len(db.column_cache._held) == 2
    reference = database.ExportDatabase(SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite", column_cache=False)
    for file in _cache_files(tmp_path / "cache"):
        file.write_bytes(b"damaged: a read of the file would warn and rebuild")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reading a damaged file would warn (CacheIntegrityWarning)
        got = db.query_table("CUPTI_ACTIVITY_KIND_RUNTIME", ['"start"', '"end"'], {"start": pl.Int64, "end": pl.Int64})
    want = reference.query_table("CUPTI_ACTIVITY_KIND_RUNTIME", ['"start"', '"end"'], {"start": pl.Int64, "end": pl.Int64})
    assert got.equals(want)
    assert not db.column_cache._held
