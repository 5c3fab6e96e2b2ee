"""Experiment folders, the record of a run, sweeps and summaries, with real programs (mode ``none``)."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import threading
from datetime import datetime
from pathlib import Path

import polars as pl
import pytest
import yaml

from tracekit.capture import Experiment, run, sweep
from tracekit.capture.prepare import environment_snapshot, experiment_folder, gpu_info
from tracekit.capture.summary import (
    _kernels_from_sqlite,
    combine,
    kernel_summary,
    summarize_ncu_csv,
    summarize_nsys,
)
from tracekit.errors import CaptureError

from .conftest import NSYS_CORPUS as CORPUS

PY = sys.executable
STUBBORN = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                      "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])
    print("started", flush=True)
    time.sleep(60)
    """
)


def _exp(tmp_path: Path, code: str, **fields: object) -> Experiment:
    return Experiment(command=[PY, "-c", code], mode="none", out=str(tmp_path / "runs"), **fields)  # type: ignore[arg-type]


def test_folder_layout_and_record(tmp_path: Path) -> None:
    exp = _exp(
        tmp_path,
        "import os, sys; print('hello'); print(os.environ['CUDA_VISIBLE_DEVICES']); "
        "print('warn', file=sys.stderr)",
        name="hello",
        env={"CUDA_VISIBLE_DEVICES": "0", "MY_SECRET_TOKEN": "xyz", "RANK": "0"},
    )
    result = run(exp)
    folder = result.folder
    assert folder.parent == tmp_path / "runs"
    assert folder.name.startswith("hello_none_")
    assert sorted(p.name for p in folder.iterdir()) == [
        "command.txt",
        "config.yaml",
        "env.json",
        "experiment.json",
        "gpu.json",
        "run.stderr.log",
        "run.stdout.log",
        "summary.json",
    ]
    record = json.loads((folder / "experiment.json").read_text())
    assert record["status"] == "complete" and record["complete"] is True
    assert record["command"] == [PY, "-c", exp.command[2]]
    assert record["target_exit_code"] == 0 and record["profiler_exit_code"] is None
    assert record["steps"][0]["step"] == "run" and record["steps"][0]["returncode"] == 0
    assert record["started_at"] <= record["ended_at"]
    assert record["wall_s"] >= record["program_wall_s"] > 0
    assert (folder / "run.stdout.log").read_text() == "hello\n0\n"
    assert (folder / "run.stderr.log").read_text() == "warn\n"
    assert (folder / "command.txt").read_text().splitlines()[0] == "# run"
    env = json.loads((folder / "env.json").read_text())
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["RANK"] == "0"
    assert "MY_SECRET_TOKEN" not in env
    assert yaml.safe_load((folder / "config.yaml").read_text()) == exp.to_dict()
    assert "gpus" in json.loads((folder / "gpu.json").read_text())
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["mode"] == "none" and summary["status"] == "complete"


def test_nothing_is_overwritten(tmp_path: Path) -> None:
    moment = datetime(2026, 11, 21, 10, 30, 0)
    first = experiment_folder(tmp_path, "decode", "nsys+ncu", now=moment)
    second = experiment_folder(tmp_path, "decode", "nsys+ncu", now=moment)
    assert first.name == "decode_nsys-ncu_20261121-103000"
    assert second.name == "decode_nsys-ncu_20261121-103000-2"
    runs = [run(_exp(tmp_path, "pass", name="same")).folder for _ in range(2)]
    assert runs[0] != runs[1] and all(p.is_dir() for p in runs)


def test_failing_program_keeps_its_exit_code(tmp_path: Path) -> None:
    result = run(_exp(tmp_path, "import sys; sys.exit(3)"))
    assert (result.status, result.target_exit_code, result.target_exit_code_source) == (
        "failed",
        3,
        "direct",
    )
    assert json.loads((result.folder / "experiment.json").read_text())["status"] == "failed"


def test_timeout_stops_the_tree_and_marks_the_record(tmp_path: Path) -> None:
    result = run(_exp(tmp_path, STUBBORN, timeout_s=1.5, kill_grace_s=0.3))
    record = json.loads((result.folder / "experiment.json").read_text())
    assert record["status"] == "timeout" and record["complete"] is False
    assert "SIGKILL" in record["steps"][0]["signals_sent"]
    assert (result.folder / "run.stdout.log").read_text() == "started\n"
    assert json.loads((result.folder / "summary.json").read_text())["status"] == "timeout"


def test_stop_event_marks_interrupted(tmp_path: Path) -> None:
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    result = run(_exp(tmp_path, "import time; time.sleep(60)", kill_grace_s=1), stop_event=stop)
    assert result.status == "interrupted"


def test_keyboard_interrupt_keeps_the_folder(tmp_path: Path) -> None:
    # Ctrl-C once the program has started (a fixed 1 s timer raced a slow start on a loaded
    # machine: the test once saw run() return without the interrupt)
    timers: list[threading.Timer] = []

    def interrupt_when_started(line: object) -> None:
        if getattr(line, "text", "") == "started" and not timers:
            timers.append(threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)))
            timers[0].start()

    with pytest.raises(KeyboardInterrupt):
        run(_exp(tmp_path, STUBBORN, kill_grace_s=0.3, name="ctrlc"), on_output=interrupt_when_started)
    for timer in timers:
        timer.join()
    (folder,) = (tmp_path / "runs").iterdir()
    record = json.loads((folder / "experiment.json").read_text())
    assert record["status"] == "interrupted" and record["steps"][0]["status"] == "interrupted"


def test_output_goes_to_a_callback_or_a_widget(tmp_path: Path) -> None:
    lines: list[str] = []
    run(_exp(tmp_path, "print('a'); print('b')"), on_output=lambda line: lines.append(line.text))
    assert lines == ["a", "b"]

    class Output:  # the one method of ipywidgets.Output the reporter uses
        def __init__(self) -> None:
            self.text = ""

        def append_stdout(self, text: str) -> None:
            self.text += text

    widget = Output()
    run(_exp(tmp_path, "print('to the widget')"), on_output=widget)
    assert "to the widget" in widget.text


def test_environment_snapshot_filters() -> None:
    snap = environment_snapshot(
        {
            "NCCL_DEBUG": "INFO",
            "AWS_SECRET_ACCESS_KEY": "x",
            "LOCAL_RANK": "1",
            "HOME": "/root",
            "CUDA_HOME": "/usr/local/cuda",
        }
    )
    assert snap == {"CUDA_HOME": "/usr/local/cuda", "LOCAL_RANK": "1", "NCCL_DEBUG": "INFO"}


def test_gpu_info_without_nvidia_smi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpu_info() == {"error": "nvidia-smi not found on PATH", "gpus": []}


# --- sweeps -------------------------------------------------------------------------------------------


def test_sweep_runs_every_point_in_its_own_folder(tmp_path: Path) -> None:
    table = sweep(
        [PY, "-c", "import time; time.sleep(0.01 * {batch}); print({batch} * {steps})"],
        {"batch": [1, 2], "steps": [4, 8]},
        mode="none",
        out=str(tmp_path),
        name="toy",
    )
    assert table.columns[:2] == ["batch", "steps"]
    assert table.select("batch", "steps").rows() == [(1, 4), (1, 8), (2, 4), (2, 8)]
    assert table["status"].to_list() == ["complete"] * 4
    assert table.schema["wall_s"] == pl.Float64 and table["wall_s"].min() > 0
    (sweep_folder,) = tmp_path.iterdir()
    assert sweep_folder.name.startswith("toy_sweep_")
    outputs = sorted(int((Path(f) / "run.stdout.log").read_text()) for f in table["folder"])
    assert outputs == [4, 8, 8, 16]
    assert all(Path(f).parent == sweep_folder for f in table["folder"])
    assert pl.read_csv(sweep_folder / "results.csv").height == 4
    assert pl.read_parquet(sweep_folder / "results.parquet").equals(table)
    assert json.loads((sweep_folder / "sweep.json").read_text())["points"][3] == {
        "batch": 2,
        "steps": 8,
    }


def test_sweep_records_failures_and_can_stop(tmp_path: Path) -> None:
    code = "import sys; sys.exit({code})"
    table = sweep([PY, "-c", code], "code=0,5,0", mode="none", out=str(tmp_path))
    assert table["status"].to_list() == ["complete", "failed", "complete"]
    assert table["target_exit_code"].to_list() == [0, 5, 0]
    table = sweep(
        [PY, "-c", code], "code=0,5,0", mode="none", out=str(tmp_path), stop_on_error=True
    )
    assert table.height == 2


def test_sweep_parameter_must_appear_in_the_command(tmp_path: Path) -> None:
    with pytest.raises(CaptureError, match=r"appear nowhere in the command; add \{steps\}"):
        sweep(
            [PY, "-c", "print({batch})"],
            {"batch": [1], "steps": [2]},
            mode="none",
            out=str(tmp_path),
        )
    assert not any(tmp_path.iterdir())


def test_sweep_parameter_in_environment(tmp_path: Path) -> None:
    table = sweep(
        [PY, "-c", "import os; print(os.environ['BATCH'])"],
        {"b": [3]},
        mode="none",
        out=str(tmp_path),
        env={"BATCH": "{b}"},
    )
    assert (Path(table["folder"][0]) / "run.stdout.log").read_text() == "3\n"


# --- summaries ----------------------------------------------------------------------------------------


def test_kernel_summary_numbers() -> None:
    kernels = pl.DataFrame(
        {
            "name": ["gemm", "gemm", "ncclDevKernel_AllReduce", "gemm"],
            "start_ns": [0, 10, 40, 0],
            "end_ns": [10, 20, 50, 30],
            "device_id": [0, 0, 0, 1],
        }
    )
    s = kernel_summary(kernels, top_n=1)
    assert s["kernel_count"] == 4
    assert s["gpu_time_ns"] == 60
    assert (s["span_ns"], s["busy_ns"], s["idle_pct"]) == (80, 60, 25.0)
    assert s["comm_pct"] == round(100 * 10 / 60, 3)
    assert s["devices"] == [0, 1]
    assert s["top_kernels"] == [
        {
            "name": "gemm",
            "short_name": "gemm",
            "count": 3,
            "total_ns": 50,
            "mean_ns": 16,
            "pct": round(100 * 50 / 60, 3),
        }
    ]
    assert kernel_summary(kernels.clear())["kernel_count"] == 0


def test_combine_per_rank_summaries() -> None:
    one = kernel_summary(
        pl.DataFrame({"name": ["a"], "start_ns": [0], "end_ns": [10], "device_id": [0]})
    )
    two = kernel_summary(
        pl.DataFrame(
            {"name": ["a", "b"], "start_ns": [0, 20], "end_ns": [10, 30], "device_id": [1, 1]}
        )
    )
    merged = combine([{**one, "report": "r0"}, {**two, "report": "r1"}])
    assert (
        merged["kernel_count"] == 3 and merged["gpu_time_ns"] == 30 and merged["devices"] == [0, 1]
    )
    assert merged["top_kernels"][0]["name"] == "a" and merged["top_kernels"][0]["count"] == 2
    assert merged["idle_pct"] == round(100 * 10 / 40, 3)
    assert set(merged["reports"]) == {"r0", "r1"}


@pytest.mark.skipif(not CORPUS.is_dir(), reason="the public corpus (tests/data/corpus.tar.xz) is missing")
def test_summary_of_a_real_export_and_the_sqlite_fallback() -> None:
    path = CORPUS / "nsys2026.2_nsysai_mfu_2xh100_nccl_slice.sqlite"
    direct = _kernels_from_sqlite(path)
    assert direct.height == 4010
    fallback = kernel_summary(direct)
    assert fallback["comm_pct"] is not None and fallback["comm_pct"] > 0
    s = summarize_nsys(path, top_n=3)
    assert s["kernel_count"] == 4010 and len(s["top_kernels"]) == 3
    assert s["gpu_time_ns"] == fallback["gpu_time_ns"]


def test_summary_of_an_unreadable_report_records_the_error(tmp_path: Path) -> None:
    bogus = tmp_path / "report.sqlite"
    bogus.write_bytes(b"not a database")
    s = summarize_nsys(bogus)
    assert "error" in s and s["source"] == "none"


def test_ncu_csv_summary(tmp_path: Path) -> None:
    csv = tmp_path / "report.raw.csv"
    csv.write_text(
        '"ID","Process ID","Kernel Name","gpu__time_duration.sum","dram__bytes_read.sum"\n'
        '"","","","ns","byte"\n'
        '"0","1","gemm","1,500","10"\n"1","1","softmax","200","5"\n"2","1","gemm","1,000","10"\n'
    )
    s = summarize_ncu_csv(csv)
    assert s["profiled_kernels"] == 3
    assert s["top_kernels"][0] == {"name": "gemm", "count": 2, "total_ns": 2500}
    empty = tmp_path / "empty.csv"
    empty.write_text("==PROF== Disconnected from process 1\n")
    assert summarize_ncu_csv(empty)["profiled_kernels"] == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_stop_the_program_and_are_recorded(tmp_path: Path, sig: signal.Signals) -> None:
    """Issue 18.5: a capture killed by a scheduler (SIGTERM) or a closed terminal (SIGHUP) stops
    the program's tree and records the run as interrupted, naming the signal; the CLI exits 130."""
    import subprocess
    import time

    marker = tmp_path / "child.pid"
    code = f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    cli = subprocess.Popen(
        [sys.executable, "-m", "tracekit.cli.main", "capture", "none", "-o", str(tmp_path / "runs"),
         "-q", "--", sys.executable, "-c", code],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not (marker.exists() and marker.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    child = int(marker.read_text())
    cli.send_signal(sig)
    _, err = cli.communicate(timeout=60)
    assert cli.returncode == 130, err
    (record,) = (tmp_path / "runs").glob("*/experiment.json")
    data = json.loads(record.read_text())
    assert data["status"] == "interrupted"
    assert sig.name in data["error"]
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)  # the program was stopped with the capture


def test_a_program_killed_from_outside_is_said_in_the_record(tmp_path: Path) -> None:
    """Issue 29.6 (seen on an H100 with a real nsys: the program SIGKILLed during the capture,
    nsys passed 137 through): the record says which signal ended the program; the reports stay
    usable, so it is a warning, not an error."""
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    result = run(_exp(tmp_path, code, name="killed"), check=False)
    assert result.status == "failed" and result.error is None
    assert result.target_exit_code == -9
    assert "the program was ended by SIGKILL (exit code -9) (killed from outside, or by the out-of-memory killer)" in result.warnings
    from tracekit.capture.experiment import _exit_reason

    assert _exit_reason(137) == "the program was ended by SIGKILL (exit code 137) (killed from outside, or by the out-of-memory killer)"
    assert _exit_reason(139) == "the program was ended by SIGSEGV (exit code 139)"
    assert _exit_reason(3) == "the program exited with code 3" and _exit_reason(0) is None


def test_an_interrupted_capture_records_the_reports_written(tmp_path: Path) -> None:
    """Issue 29.6 (seen on an H100: SIGHUP to a `tracekit capture nsys` session; nsys, stopped with
    SIGINT, wrote report.nsys-rep, which the record did not list): the reports a stopped profiler
    left in the folder are recorded and named in the error."""
    import threading

    from tracekit.capture.experiment import _Run
    from tracekit.capture.options import Experiment

    folder = tmp_path / "exp"
    folder.mkdir()
    (folder / "report.nsys-rep").write_bytes(b"NVIDIA Tegra Profiler Report")
    state = _Run(Experiment(command=["x"], mode="nsys"), folder, {}, {}, None, threading.Event())
    assert state.keep_written_reports() == ["report.nsys-rep"]
    assert [p.name for p in state.result.reports["nsys"]] == ["report.nsys-rep"]
