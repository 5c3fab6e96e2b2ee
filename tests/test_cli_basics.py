"""The CLI starts light and prints what `nsys stats` prints."""

from __future__ import annotations

import subprocess
import sys

from .conftest import NSYS_REFERENCE, SAMPLES
from .nsys_reference import read_reference


def test_help_imports_neither_polars_nor_altair() -> None:
    code = (
        "import sys\n"
        "from tracekit.cli.main import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = sorted(m for m in ('polars', 'altair', 'pyarrow', 'ncu_report') if m in sys.modules)\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "HEAVY=\n" in out or out.rstrip().endswith("HEAVY="), out


def test_stats_csv_on_stdout_is_byte_identical_to_nsys() -> None:
    export = SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"
    ref = SAMPLES / "llm_tp2_nccl" / "stats" / "llm_tp2_nccl_cuda_gpu_kern_sum.csv"
    proc = subprocess.run(
        [sys.executable, "-m", "tracekit.cli.main", "stats", "-r", "cuda_gpu_kern_sum", "--format", "csv", str(export)],
        capture_output=True, text=True, check=True,
    )
    assert [line.split(",")[:8] for line in proc.stdout.splitlines()] == [
        row[:8] for row in (line.split(",") for line in ref.read_text().splitlines())
    ]
    assert read_reference(ref)[0][0] == "Time (%)"


def test_stats_writes_one_file_per_report(tmp_path) -> None:  # type: ignore[no-untyped-def]
    export = SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
    prefix = tmp_path / "out"
    subprocess.run(
        [sys.executable, "-m", "tracekit.cli.main", "stats", "-r", "cuda_api_sum,cuda_gpu_mem_size_sum",
         "--format", "csv", "-o", str(prefix), str(export)],
        capture_output=True, text=True, check=True,
    )
    for report in ("cuda_api_sum", "cuda_gpu_mem_size_sum"):
        ours = (tmp_path / f"out_{report}.csv").read_text().splitlines()
        nsys = (SAMPLES / "llm_decode_1gpu" / "stats" / f"llm_decode_1gpu_{report}.csv").read_text().splitlines()
        assert sorted(ours) == sorted(nsys)


def test_summary_runs_on_every_sample() -> None:
    for export in sorted(SAMPLES.glob("*/*.sqlite")):
        proc = subprocess.run(
            [sys.executable, "-m", "tracekit.cli.main", "summary", str(export)],
            capture_output=True, text=True, check=False, env={"COLUMNS": "200", "PATH": ""},
        )
        assert proc.returncode == 0, proc.stderr
        assert "top kernels" in proc.stdout and "nsys version" in proc.stdout
    assert NSYS_REFERENCE.is_dir()


def test_console_entry_keeps_exit_codes_and_output() -> None:
    """`run()` ends the process with os._exit after main(): the exit code, stdout and the
    one-line error must come through as main() left them."""
    export = SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
    ok = subprocess.run(
        [sys.executable, "-m", "tracekit.cli.main", "stats", "-r", "cuda_kern_exec_sum", "-f", "csv", str(export)],
        capture_output=True, text=True, check=False,
    )
    assert ok.returncode == 0 and ok.stdout.startswith("PID,TID,DevId,Count,QCount,") and len(ok.stdout.splitlines()) > 2
    for report in ("no_such_report", "cuda_gpu_kern_sum:nope", "cuda_api_sum:base"):
        bad = subprocess.run(
            [sys.executable, "-m", "tracekit.cli.main", "stats", "-r", report, str(export)],
            capture_output=True, text=True, check=False,
        )
        assert bad.returncode == 2 and bad.stdout == "", report
        assert bad.stderr.startswith("tracekit: error:") and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_help_of_commands_that_read_folders_names_them() -> None:
    """stats and summary said they read parquetdir/arrowdir folders; report and export perfetto
    read them too but their help named .sqlite / .nsys-rep only."""
    import os

    env = {**os.environ, "COLUMNS": "200"}
    for args in (["report", "--help"], ["export", "perfetto", "--help"], ["stats", "--help"]):
        out = subprocess.run([sys.executable, "-m", "tracekit.cli.main", *args], capture_output=True, text=True,
                             env=env, check=True).stdout  # fmt: skip
        assert "parquetdir/arrowdir folder" in out, args
