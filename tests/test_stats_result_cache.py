"""Kept ``tracekit stats`` CSVs (tracekit/cli/stats_cache.py): a repeated command prints the
same bytes without importing polars; a changed export, a damaged kept file, a run that warned,
or the cache switched off never print a kept result."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tracekit.cli import stats_cache

ROOT = Path(__file__).resolve().parents[1]
DECODE = ROOT / "sample_traces" / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
PROBE = (
    "import sys; from tracekit.cli.stats_cache import cached_stats; rc = cached_stats(sys.argv[1:]); "
    "sys.stderr.write('polars imported\\n' if 'polars' in sys.modules else 'no polars\\n'); "
    "sys.exit(99 if rc is None else rc)"
)


def _env(cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEKIT_")}
    return {**env, "TRACEKIT_CACHE": str(cache), **extra}


def _stats(export: Path, cache: Path, *args: str, **env: str) -> subprocess.CompletedProcess[bytes]:
    argv = [sys.executable, "-m", "tracekit.cli.entry", "stats", str(export), *args]
    return subprocess.run(argv, capture_output=True, env=_env(cache, **env), cwd=ROOT, check=False)


def _kept(export: Path, cache: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    argv = [sys.executable, "-c", PROBE, "stats", str(export), *args]
    return subprocess.run(argv, capture_output=True, env=_env(cache), cwd=ROOT, check=False)


def _files(cache: Path) -> list[Path]:
    return sorted(cache.glob("columns/*/reports/*.csv"))


@pytest.fixture()
def export(tmp_path: Path) -> Path:
    copy = tmp_path / "decode.sqlite"
    shutil.copyfile(DECODE, copy)
    return copy


def test_a_repeated_command_prints_the_kept_csv_without_polars(export: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    args = ("-r", "cuda_gpu_kern_sum,cuda_api_sum", "-f", "csv")
    assert _kept(export, cache, *args).returncode == 99  # nothing kept yet
    first = _stats(export, cache, *args)
    assert first.returncode == 0 and first.stderr == b""
    assert len(_files(cache)) == 2
    again = _kept(export, cache, *args)
    assert again.returncode == 0 and again.stdout == first.stdout
    assert again.stderr == b"no polars\n"
    # the console script's path gives the same bytes; a report not kept yet is computed
    assert _stats(export, cache, *args).stdout == first.stdout
    assert _kept(export, cache, "-r", "cuda_gpu_kern_sum,nvtx_sum", "-f", "csv").returncode == 99
    # other command lines are not answered from the kept files
    for other in (("-r", "cuda_gpu_kern_sum"), ("-r", "cuda_gpu_kern_sum", "-f", "csv", "--convention", "2023"),
                  ("-r", "cuda_gpu_kern_sum", "-f", "csv", "-o", str(tmp_path / "p"))):  # fmt: skip
        assert _kept(export, cache, *other).returncode == 99, other


def test_a_changed_export_is_recomputed(export: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    before = _stats(export, cache, "-f", "csv").stdout
    st = export.stat()
    con = sqlite3.connect(export)
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET \"end\" = \"end\" + 1000000 WHERE rowid = 1")
    con.commit()
    con.close()
    os.utime(export, ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime: only the content differs
    assert _kept(export, cache, "-f", "csv").returncode == 99
    after = _stats(export, cache, "-f", "csv").stdout
    assert after != before
    # the changed kernel now runs > 1 ms: some Max (ns) is at least 1,000,000
    assert max(int(line.split(b",")[6]) for line in after.splitlines()[1:]) >= 1_000_000


def test_a_damaged_kept_file_is_dropped_and_recomputed(export: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    good = _stats(export, cache, "-r", "cuda_api_sum", "-f", "csv").stdout
    (kept,) = _files(cache)
    data = bytearray(kept.read_bytes())
    data[len(data) // 2] ^= 0x01
    kept.write_bytes(bytes(data))
    assert _kept(export, cache, "-r", "cuda_api_sum", "-f", "csv").returncode == 99
    assert not kept.exists()  # dropped
    assert _stats(export, cache, "-r", "cuda_api_sum", "-f", "csv").stdout == good
    assert _kept(export, cache, "-r", "cuda_api_sum", "-f", "csv").stdout == good


def test_runs_that_warn_or_have_the_cache_off_keep_nothing(export: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    off = _stats(export, cache, "-f", "csv", TRACEKIT_COLUMN_CACHE="0")
    assert off.returncode == 0 and _files(cache) == []
    con = sqlite3.connect(export)
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET \"start\" = 'abc' WHERE rowid = 1")  # one damaged cell
    con.commit()
    con.close()
    warned = _stats(export, cache, "-f", "csv")
    assert warned.returncode == 0 and b"warning" in warned.stderr
    assert _files(cache) == []
    again = _stats(export, cache, "-f", "csv")
    assert b"warning" in again.stderr  # the warning is seen on every run


def test_the_key_names_report_convention_and_code(export: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    a = stats_cache._path(export, "cuda_api_sum", "2025")
    assert a != stats_cache._path(export, "cuda_api_sum", "2023")
    assert a != stats_cache._path(export, "nvtx_sum", "2025")
    monkeypatch.setattr(stats_cache, "_stamp", ["another tracekit"])
    assert a != stats_cache._path(export, "cuda_api_sum", "2025")
    # a WAL beside the export: never kept nor served
    Path(f"{export}-wal").write_bytes(b"")
    assert not stats_cache.usable_export(export)


def test_output_files_are_written_whole(export: Path, tmp_path: Path) -> None:
    prefix = tmp_path / "out" / "run"
    prefix.parent.mkdir()
    done = _stats(export, tmp_path / "cache", "-r", "cuda_gpu_kern_sum,nvtx_sum", "-o", str(prefix))
    assert done.returncode == 0
    assert sorted(p.name for p in prefix.parent.iterdir()) == ["run_cuda_gpu_kern_sum.csv", "run_nvtx_sum.csv"]
    assert (prefix.parent / "run_nvtx_sum.csv").read_bytes().startswith(b"Time (%)")
