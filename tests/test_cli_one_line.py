"""A CLI error is exactly one line on stderr (issue 19.7): warnings shown before it, the
"skipping" lines of a multi-report run whose every report was skipped, and a write into a
missing folder or onto a folder each used to add lines or end as an internal error. Real CLI
runs (subprocesses) on sample exports and mutated copies."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

from .conftest import ROOT, SAMPLES

NO_NVTX = SAMPLES / "planted" / "planted_clean_nonvtx" / "planted_clean_nonvtx.sqlite"
DECODE = SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"


def _cli(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRACEKIT_CACHE": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, "-m", "tracekit.cli.main", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip


def _inverted_kernels(tmp_path: Path) -> tuple[Path, int]:
    """The decode sample with every 9th kernel's start and end swapped (the loader warns)."""
    copy = tmp_path / "inv.sqlite"
    shutil.copyfile(DECODE, copy)
    con = sqlite3.connect(copy)
    con.execute('UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = "end", "end" = start WHERE rowid % 9 = 0')
    con.commit()
    n = con.execute('SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE "end" < start').fetchone()[0]
    con.close()
    return copy, n


def test_every_report_skipped_is_one_line(tmp_path: Path) -> None:
    run = _cli("stats", "-r", "nvtx_sum,nvtx_gpu_proj_trace", "-f", "csv", str(NO_NVTX), tmp_path=tmp_path)
    assert run.returncode == 2 and run.stdout == ""
    (line,) = run.stderr.splitlines()
    assert line.startswith("tracekit: error: none of the 2 reports could be made from ")
    assert "nvtx_sum: planted_clean_nonvtx.sqlite has no NVTX_EVENTS table" in line
    assert "; nvtx_gpu_proj_trace: planted_clean_nonvtx.sqlite has no NVTX_EVENTS table" in line


def test_a_skipped_report_beside_a_made_one_is_still_said(tmp_path: Path) -> None:
    run = _cli("stats", "-r", "nvtx_sum,cuda_gpu_kern_sum", "-f", "csv", str(NO_NVTX), tmp_path=tmp_path)
    assert run.returncode == 0
    assert run.stdout.startswith("Time (%),Total Time (ns),Instances")
    assert run.stderr.splitlines() == [
        "tracekit: skipping nvtx_sum: planted_clean_nonvtx.sqlite has no NVTX_EVENTS table, so it cannot give "
        "nvtx_sum: capture with the matching --trace option"
    ]


def test_output_into_a_missing_folder_is_one_line(tmp_path: Path) -> None:
    prefix = tmp_path / "missing" / "r"
    run = _cli("stats", "-r", "cuda_gpu_kern_sum", "-o", str(prefix), str(DECODE), tmp_path=tmp_path)
    assert run.returncode == 2
    assert run.stderr.splitlines() == [f"tracekit: error: -o {prefix}: folder {prefix.parent} does not exist; "
                                       "create it or choose another prefix"]  # fmt: skip
    assert not prefix.parent.exists()


def test_warnings_before_an_error_do_not_add_lines(tmp_path: Path) -> None:
    """The damaged copy warns while the report is computed, then the CSV cannot be written
    (a folder has its name): was the warning plus 'internal error: IsADirectoryError'."""
    copy, _ = _inverted_kernels(tmp_path)
    out = tmp_path / "out"
    (out / "P_cuda_gpu_kern_sum.csv").mkdir(parents=True)
    run = _cli("stats", "-r", "cuda_gpu_kern_sum", "-o", str(out / "P"), str(copy), tmp_path=tmp_path)
    assert run.returncode == 2
    assert run.stderr.splitlines() == [f"tracekit: error: cannot write {out / 'P_cuda_gpu_kern_sum.csv'}: Is a directory"]
    assert [p.name for p in out.iterdir()] == ["P_cuda_gpu_kern_sum.csv"]  # no temporary file left


def test_warnings_of_a_run_that_ends_well_are_printed_once(tmp_path: Path) -> None:
    copy, n = _inverted_kernels(tmp_path)
    run = _cli("stats", "-r", "cuda_gpu_kern_sum,cuda_kern_exec_sum", "-f", "csv", str(copy), tmp_path=tmp_path)
    assert run.returncode == 0
    assert run.stderr.splitlines() == [
        f"tracekit: warning: inv.sqlite: {n} kernels row(s) end before they start (a damaged export?); "
        "they are kept as nsys keeps them, with negative durations"
    ]


def test_export_output_errors_are_one_line(tmp_path: Path) -> None:
    """tracekit export perfetto -o into a missing folder or onto a folder was
    'internal error: FileNotFoundError / IsADirectoryError' after the timeline was built; an
    empty --ranks range (1-0, or only commas) exported nothing and then said the trace had no
    CUDA events. Each is now one error line before the export is read, and nothing is written."""
    missing = tmp_path / "missing" / "x.pftrace"
    run = _cli("export", "perfetto", str(DECODE), "-o", str(missing), tmp_path=tmp_path)
    assert (run.returncode, run.stdout) == (2, "")
    assert run.stderr.splitlines() == [f"tracekit: error: -o {missing}: folder {missing.parent} does not exist; "
                                       "create it or choose another file"]  # fmt: skip
    assert not missing.parent.exists()
    folder = tmp_path / "out"
    folder.mkdir()
    run = _cli("export", "perfetto", str(DECODE), "-o", str(folder), tmp_path=tmp_path)
    assert run.returncode == 2
    assert run.stderr.splitlines() == [f"tracekit: error: cannot write {folder}: it is a folder; name a file with -o"]
    assert list(folder.iterdir()) == []
    for ranks, why in (("1-0", "the range 1-0 is empty; write the lower rank first, e.g. 0-1"), (",", "no rank given")):
        run = _cli("export", "perfetto", str(DECODE), "-o", str(tmp_path / "r.pftrace"), "--ranks", ranks,
                   tmp_path=tmp_path)  # fmt: skip
        assert run.returncode == 2
        (line,) = run.stderr.splitlines()
        assert line.startswith(f"tracekit: error: --ranks {ranks!r}: {why}")
    assert not (tmp_path / "r.pftrace").exists()


def test_stats_with_no_report_name_is_an_error(tmp_path: Path) -> None:
    """``tracekit stats -r ,`` (or an empty -r) printed nothing and exited 0."""
    for given in (",", " ", ""):
        run = _cli("stats", "-r", given, "-f", "csv", str(DECODE), tmp_path=tmp_path)
        assert (run.returncode, run.stdout) == (2, "")
        assert run.stderr.splitlines() == [f"tracekit: error: -r {given!r} names no report; give report names, "
                                           "e.g. -r cuda_gpu_kern_sum,cuda_api_sum"]  # fmt: skip


def test_summary_top_below_zero_is_a_usage_error(tmp_path: Path) -> None:
    """``summary -n -3`` showed all kernels but the last 3 (a negative slice) without a word."""
    run = _cli("summary", "-n", "-3", str(DECODE), tmp_path=tmp_path)
    assert run.returncode == 2 and run.stdout == ""
    assert "-3 is not in the range x>=0" in run.stderr
