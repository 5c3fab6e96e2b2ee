"""Damaged and unusual real exports: every table emptied, invalid UTF-8 in StringIds, engine
panics at the CLI. Each case is a mutated copy of a sample made here; the answer is a result
or one line (TracekitError / exit 2), never a traceback, and the input is never modified."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit.errors import TracekitError
from tracekit.nsys.summary import trace_summary
from tracekit.stats import REPORTS, run_report

from .conftest import SAMPLES

TP2 = SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"


def _tables(path: Path) -> list[str]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    con.close()
    return names


@pytest.mark.parametrize("table", _tables(TP2))
def test_every_table_empty(table: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Real exports hold empty tables: emptied one at a time, the summary, every nsys-stats
    report and the diagnosis either answer or raise one TracekitError."""
    monkeypatch.setenv("TRACEKIT_COLUMN_CACHE", "0")
    copy = tmp_path / "t.sqlite"
    shutil.copyfile(TP2, copy)
    con = sqlite3.connect(copy)
    con.execute(f'DELETE FROM "{table}"')
    con.commit()
    con.close()
    digest = hashlib.sha256(copy.read_bytes()).hexdigest()
    try:
        trace = tracekit.open(copy)
    except TracekitError:
        return  # e.g. no StringIds: not an export any more, said in one line
    for call in (lambda: trace_summary(trace), lambda: tracekit.diagnose(trace),
                 *[(lambda r=r: run_report(trace, r)) for r in REPORTS]):
        try:
            call()
        except TracekitError as exc:
            assert "\n" not in str(exc)
    trace.close()
    assert hashlib.sha256(copy.read_bytes()).hexdigest() == digest


def test_empty_nvtx_gives_an_empty_nvtx_sum(tmp_path: Path) -> None:
    """nsys 2023.4 prints nothing for nvtx_sum on an empty NVTX_EVENTS; tracekit an empty table
    (it raised 'internal error: ValueError' before)."""
    copy = tmp_path / "n.sqlite"
    shutil.copyfile(TP2, copy)
    con = sqlite3.connect(copy)
    con.execute("DELETE FROM NVTX_EVENTS")
    con.commit()
    con.close()
    assert run_report(tracekit.open(copy), "nvtx_sum").frame.height == 0


def _bad_utf8_copy(tmp_path: Path) -> tuple[Path, int]:
    copy = tmp_path / "u.sqlite"
    shutil.copyfile(SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite", copy)
    con = sqlite3.connect(copy)
    sid = con.execute("SELECT id FROM StringIds WHERE value LIKE 'nvjet_sm90_tst_64x8%' LIMIT 1").fetchone()[0]
    con.execute("UPDATE StringIds SET value = CAST(? AS TEXT) WHERE id = ?", (b"bad\xff\xfename", sid))
    con.commit()
    con.close()
    return copy, sid


def test_invalid_utf8_in_stringids_is_decoded_with_replacement(tmp_path: Path) -> None:
    from tracekit.nsys.database import InvalidTextWarning

    copy, sid = _bad_utf8_copy(tmp_path)
    trace = tracekit.open(copy)
    with pytest.warns(InvalidTextWarning, match="StringIds.value: 1 value"):
        strings = trace.strings
    value = strings.filter(strings["id"] == sid)["value"][0]
    assert value == "bad\ufffd\ufffdname"
    report = run_report(trace, "cuda_gpu_kern_sum")
    assert "bad\ufffd\ufffdname" in report.frame["Name"].to_list()
    con = sqlite3.connect(f"file:{copy}?mode=ro", uri=True)  # the bytes stay recoverable in the export
    assert con.execute("SELECT CAST(value AS BLOB) FROM StringIds WHERE id = ?", (sid,)).fetchone()[0] == b"bad\xff\xfename"
    con.close()


def test_cli_on_invalid_utf8_answers(tmp_path: Path) -> None:
    copy, _ = _bad_utf8_copy(tmp_path)
    for args in (["stats", "-r", "cuda_gpu_kern_sum", "-f", "csv"], ["summary", "--findings", "0"]):
        r = subprocess.run([sys.executable, "-m", "tracekit.cli.main", *args, str(copy)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert "Traceback" not in r.stderr and "Panic" not in r.stderr


@pytest.mark.parametrize("name", ["nsys2020.5_kmeans_report2", "nsys2021.2_mordred_report1"])
def test_gpus_of_2020_2021_exports(name: str) -> None:
    """2020.x exports keep the device properties in TARGET_INFO_CUDA_GPU (id in deviceId, clock
    in kHz, bandwidth in kB/s; one row per device and process), 2021.x in TARGET_INFO_GPU:
    tracekit's gpus equal the raw rows by SQL, in bytes and Hz."""
    from .conftest import NSYS_CORPUS

    path = NSYS_CORPUS / f"{name}.sqlite"
    g = tracekit.open(path).gpus.sort("device_id")
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    cols = {r[1] for r in con.execute("PRAGMA table_info(TARGET_INFO_GPU)")}
    if "totalMemory" in cols:
        rows = con.execute("SELECT id, name, totalMemory, clockRate, memoryBandwidth, smCount FROM TARGET_INFO_GPU ORDER BY id").fetchall()
    else:
        rows = con.execute(
            "SELECT deviceId, name, globalMemorySize, coreClockRate * 1000, globalMemoryBandwidth * 1000, numMultiprocessors "
            "FROM TARGET_INFO_CUDA_GPU GROUP BY deviceId ORDER BY deviceId"
        ).fetchall()
    ids = {r[0] for r in con.execute("SELECT DISTINCT deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL")}
    con.close()
    assert g.height == len(rows) and set(ids) <= set(g["device_id"].to_list())
    for row, ours in zip(rows, g.iter_rows(named=True), strict=True):
        assert (ours["device_id"], ours["name"], ours["total_memory_bytes"], ours["clock_rate_hz"],
                ours["memory_bandwidth_bytes_per_s"], ours["sm_count"]) == row
        assert 1e9 < ours["clock_rate_hz"] < 3e9  # a GPU clock in Hz, not kHz


def test_empty_results_say_why() -> None:
    """iterations() without step ranges and collective_bandwidth() without payload sizes warn
    with the reason instead of returning an empty frame silently."""
    import polars as pl

    from tracekit.analysis.attribution import launch_info
    from tracekit.analysis.comm_bandwidth import collective_bandwidth
    from tracekit.analysis.gpu_time import gpu_ops
    from tracekit.analysis.run.iterations import iterations
    from tracekit.errors import EmptyResultWarning

    t = tracekit.open(SAMPLES / "planted" / "planted_clean_nonvtx" / "planted_clean_nonvtx.sqlite")
    ops = launch_info(gpu_ops(t.kernels, t.memcpys, t.memsets), t.cuda_api)
    with pytest.warns(EmptyResultWarning, match="no NVTX ranges.*kernel_loop_iterations"):
        assert iterations(ops, t.nvtx).height == 0
    tp2 = tracekit.open(TP2)
    with pytest.warns(EmptyResultWarning, match="no NVTX range name matches 'nope'"):
        assert iterations(launch_info(gpu_ops(tp2.kernels, tp2.memcpys, tp2.memsets), tp2.cuda_api), tp2.nvtx, pattern="nope").height == 0
    nccl = tp2.nccl.with_columns(pl.lit(None, pl.Int64).alias("bytes"))
    with pytest.warns(EmptyResultWarning, match=f"{nccl.height} without bytes"):
        assert collective_bandwidth(nccl).height == 0


def test_stats_exits_2_when_every_report_is_skipped() -> None:
    """An export without NVTX: asking only for NVTX reports gives exit 2 and the reasons, in
    one line (issue 19.7: it was two "skipping" lines and the error)."""
    path = SAMPLES / "planted" / "planted_clean_nonvtx" / "planted_clean_nonvtx.sqlite"
    r = subprocess.run([sys.executable, "-m", "tracekit.cli.main", "stats", "-r", "nvtx_sum,nvtx_gpu_proj_sum", str(path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tracekit: error: none of the 2 reports")
    assert "nvtx_sum: " in lines[0] and "nvtx_gpu_proj_sum: " in lines[0]
    ok = subprocess.run([sys.executable, "-m", "tracekit.cli.main", "stats", "-r", "nvtx_sum,cuda_gpu_kern_sum", "-f", "csv",
                         str(path)], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0 and "Time (%)" in ok.stdout


def test_rank_given_explicitly_on_a_rank_set() -> None:
    """On an open_many set every table carries rank: naming it again in by/extra gives the same
    table as leaving it out (it raised polars' DuplicateError)."""
    from tracekit.analysis.attribution import attribute_nvtx, launch_info
    from tracekit.analysis.breakdowns import range_breakdown
    from tracekit.analysis.families import family_breakdown
    from tracekit.analysis.gpu_time import gpu_ops
    from tracekit.analysis.launch import launch_cost
    from tracekit.analysis.memory import copy_summary
    from tracekit.analysis.metrics import kernel_metrics, metrics_by

    ts = tracekit.open_many(SAMPLES / "llm_tp2_nccl_per_rank", max_workers=1)
    att = attribute_nvtx(launch_info(gpu_ops(ts.kernels, ts.memcpys, ts.memsets), ts.cuda_api), ts.nvtx)
    km = kernel_metrics(ts.kernels, ts.gpu_metrics)
    pairs = [
        (copy_summary(ts.memcpys, by=("rank", "kind")), copy_summary(ts.memcpys, by=("kind",))),
        (launch_cost(ts.kernels, ts.cuda_api, by=("rank", "name")), launch_cost(ts.kernels, ts.cuda_api, by=("name",))),
        (range_breakdown(att, extra=["rank"]), range_breakdown(att)),
        (family_breakdown(ts.kernels, by=["rank"]), family_breakdown(ts.kernels)),
        (metrics_by(km, ["rank"]), metrics_by(km, [])),
    ]
    for explicit, implicit in pairs:
        assert explicit.columns.count("rank") == 1 and explicit.height > 0
        key = [c for c in explicit.columns if explicit.schema[c] in (pl.Utf8, pl.Int64) and c in implicit.columns][:2]
        assert explicit.sort(key).equals(implicit.select(explicit.columns).sort(key))


def test_rows_ending_before_they_start_are_counted_once(tmp_path: Path) -> None:
    """Three kernels with start and end swapped: nsys 2023.4 prints their negative durations
    (the Min column of cuda_gpu_kern_sum), so tracekit keeps them too, and says so once."""
    from tracekit.nsys.trace import DamagedRowsWarning

    copy = tmp_path / "inv.sqlite"
    shutil.copyfile(SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite", copy)
    con = sqlite3.connect(copy)
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = end, end = start WHERE rowid IN (1, 2, 3)")
    con.commit()
    con.close()
    trace = tracekit.open(copy)
    with pytest.warns(DamagedRowsWarning, match="3 kernels row"):
        report = run_report(trace, "cuda_gpu_kern_sum")
    assert report.frame["Min (ns)"].min() < 0
    r = subprocess.run([sys.executable, "-m", "tracekit.cli.main", "stats", "-r", "cuda_gpu_kern_sum", "-f", "csv", str(copy)],
                       capture_output=True, text=True, timeout=300, env={**__import__("os").environ, "TRACEKIT_COLUMN_CACHE": "0"})
    assert r.returncode == 0 and r.stderr.strip().splitlines() == [
        "tracekit: warning: inv.sqlite: 3 kernels row(s) end before they start (a damaged export?); "
        "they are kept as nsys keeps them, with negative durations"
    ]


def _debian_nsys() -> Path:
    from .test_stats_nvtx_projection import nsys_2023_or_skip

    return nsys_2023_or_skip()


def test_export_by_an_older_nsys_fails_cleanly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nsys 2023.4 cannot read a 2025.3 report: one line naming both versions, and no partial
    .sqlite left for a later open to read silently (it used to show '0 launches')."""
    nsys = _debian_nsys()
    monkeypatch.setenv("NSYS", str(nsys))
    rep = tmp_path / "r.nsys-rep"
    shutil.copyfile(SAMPLES / "planted" / "planted_host_bound" / "planted_host_bound.nsys-rep", rep)
    with pytest.raises(TracekitError, match=r"written by nsys 2025\.3\.1, newer than the nsys found \(2023\.4") as err:
        tracekit.open(rep)
    assert "\n" not in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.nsys-rep"]


def test_a_users_own_export_is_never_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An r.sqlite beside r.nsys-rep that tracekit did not write, older than the report, is
    left alone: tracekit's own export goes to its cache folder."""
    import os as _os

    from tracekit.nsys.export import export_path_for

    nsys = _debian_nsys()
    monkeypatch.setenv("NSYS", str(nsys))
    rep = tmp_path / "r.nsys-rep"
    mine = tmp_path / "r.sqlite"
    shutil.copyfile(SAMPLES / "planted" / "planted_host_bound" / "planted_host_bound.sqlite", mine)
    shutil.copyfile(SAMPLES / "planted" / "planted_host_bound" / "planted_host_bound.nsys-rep", rep)
    _os.utime(mine, ns=(rep.stat().st_mtime_ns - 10**9, rep.stat().st_mtime_ns - 10**9))  # older than the report
    before = hashlib.sha256(mine.read_bytes()).hexdigest()
    assert export_path_for(rep) != mine
    with pytest.raises(TracekitError):  # this nsys cannot export the 2025 report
        tracekit.open(rep)
    assert hashlib.sha256(mine.read_bytes()).hexdigest() == before


def test_debian_nsys_layout_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    from tracekit.tools import find_tool

    nsys = _debian_nsys()
    if not str(nsys).startswith("/opt/"):
        pytest.skip("the Debian nsys is not unpacked under /opt")
    monkeypatch.delenv("NSYS", raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    tool = find_tool("nsys")
    assert tool is not None and "nsight-systems/target-linux-x64/nsys" in str(tool.path)


def test_text_in_integer_columns_is_never_reinterpreted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite lets an INTEGER column hold text. A number written as text ('123') is read as that
    number; anything else ('abc') as null, with one warning and the count — never as another
    value (it once made kernel durations equal absolute timestamps)."""
    from tracekit.nsys.trace import DamagedRowsWarning

    monkeypatch.setenv("TRACEKIT_COLUMN_CACHE", "0")
    copy = tmp_path / "txt.sqlite"
    shutil.copyfile(SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite", copy)
    con = sqlite3.connect(copy)
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = 'abc' WHERE rowid % 3 = 0")
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = CAST(start AS TEXT) WHERE rowid % 3 = 1")
    con.commit()
    starts = [int(r[0]) for r in con.execute("SELECT start FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY rowid")]
    n_abc = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE typeof(end) = 'text'").fetchone()[0]
    con.close()
    trace = tracekit.open(copy)
    with pytest.warns(DamagedRowsWarning, match=f"{n_abc} kernels row.*no start or end"):
        k = trace.kernels
    assert k["start_ns"].to_list() == starts  # text '123…' read as the number it spells
    assert k["end_ns"].null_count() == n_abc and k["duration_ns"].drop_nulls().max() < 10_000_000


def test_malformed_ncu_raw_csv_is_one_line(tmp_path: Path) -> None:
    """A repeated header line, ragged rows: one TraceFormatError (they raised polars'
    InvalidOperationError); an empty body: an empty report that says it holds no kernels."""
    from tracekit.errors import TraceFormatError
    from tracekit.ncu.report import IncompleteReportWarning

    lines = (SAMPLES / "ncu" / "ncu_probe_full" / "ncu_probe_full.raw.csv").read_text().splitlines(True)
    dup = tmp_path / "dup.raw.csv"
    dup.write_text("".join(lines[:2] + lines[:1] + lines[2:]))
    ragged = tmp_path / "ragged.raw.csv"
    ragged.write_text("".join(lines[:2] + [ln.rsplit(",", 5)[0] + "\n" for ln in lines[2:]]))
    empty = tmp_path / "empty.raw.csv"
    empty.write_text("".join(lines[:2]))
    with pytest.raises(TraceFormatError, match="not a number.*repeated header"):
        tracekit.open(dup).kernels  # noqa: B018
    with pytest.raises(TraceFormatError, match="not a readable ncu CSV"):
        tracekit.open(ragged).kernels  # noqa: B018
    with pytest.warns(IncompleteReportWarning, match="0 profiled kernels"):
        assert tracekit.open(empty).kernels.height == 0


def test_memcpy_table_without_its_end_column(tmp_path: Path) -> None:
    """An export whose CUPTI_ACTIVITY_KIND_MEMCPY lacks `end`: every command answers, promptly,
    with one warning naming the rows (one API path once ran for more than 90 s)."""
    copy = tmp_path / "noend.sqlite"
    shutil.copyfile(SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite", copy)
    con = sqlite3.connect(copy)
    con.execute("ALTER TABLE CUPTI_ACTIVITY_KIND_MEMCPY DROP COLUMN end")
    con.commit()
    con.close()
    for args in (["summary", "--findings", "2"], ["stats", "-r", "cuda_gpu_mem_time_sum,cuda_gpu_trace", "-f", "csv"], ["diagnose"]):
        r = subprocess.run([sys.executable, "-m", "tracekit.cli.main", *args, str(copy)], capture_output=True, text=True,
                           timeout=60, env={**__import__("os").environ, "TRACEKIT_COLUMN_CACHE": "0"})
        assert r.returncode == 0, r.stderr
        assert all(ln.startswith("tracekit: warning:") for ln in r.stderr.strip().splitlines()), r.stderr


def _wal_copy(tmp_path: Path) -> tuple[Path, int]:
    """A copy of TP2 whose kernels are doubled by a committed transaction that is still only in
    its ``-wal`` (both files copied while the writer holds the database open, as a copy taken
    mid-run would be). Returns the copied export and the kernel count the writer sees."""
    work = tmp_path / "writer.sqlite"
    shutil.copyfile(TP2, work)
    con = sqlite3.connect(work)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA wal_autocheckpoint=0")
    con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL")
    con.commit()
    expected = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    copy = tmp_path / "copy" / "t.sqlite"
    copy.parent.mkdir()
    shutil.copyfile(work, copy)
    shutil.copyfile(work.with_name(work.name + "-wal"), copy.with_name(copy.name + "-wal"))
    con.close()
    return copy, expected


def test_committed_rows_in_a_wal_are_read(tmp_path: Path) -> None:
    """Issue 19.4: rows committed to the -wal but not checkpointed are part of the export."""
    copy, expected = _wal_copy(tmp_path)
    before = hashlib.sha256(copy.read_bytes()).hexdigest()
    with pytest.warns(UserWarning, match="t.sqlite-wal holds committed rows"):
        trace = tracekit.open(copy)
    assert trace.kernels.height == expected
    plain = sqlite3.connect(f"file:{TP2}?mode=ro", uri=True)
    assert expected == 2 * plain.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    plain.close()
    assert hashlib.sha256(copy.read_bytes()).hexdigest() == before  # the main file is untouched


def test_a_hot_journal_is_one_line(tmp_path: Path) -> None:
    """A non-empty -journal beside the export (a write that never finished) is refused."""
    copy = tmp_path / "t.sqlite"
    shutil.copyfile(TP2, copy)
    copy.with_name("t.sqlite-journal").write_bytes(b"\0" * 512)
    with pytest.raises(TracekitError, match="never finished"):
        tracekit.open(copy)
    r = subprocess.run(
        [sys.executable, "-m", "tracekit.cli.main", "summary", str(copy)], capture_output=True, text=True, check=False
    )
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "never finished" in r.stderr
