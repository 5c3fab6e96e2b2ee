"""``tracekit capture`` through typer's test runner: dry runs, real runs in mode none, files, sweeps."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tracekit.cli.capture import app
from tracekit.errors import CaptureError, ToolNotFoundError

PY = sys.executable


@pytest.fixture
def cli() -> CliRunner:
    return CliRunner()


def _folders(out: Path) -> list[Path]:
    return sorted(p for p in out.iterdir() if p.is_dir())


def test_dry_run_prints_exact_commands(cli: CliRunner) -> None:
    result = cli.invoke(
        app,
        [
            "both",
            "--dry-run",
            "--nsys-path",
            "/opt/nsys",
            "--ncu-path",
            "/opt/ncu",
            "--trace",
            "cuda,nvtx",
            "--cuda-graph-trace",
            "node",
            "--capture-range",
            "cudaProfilerApi",
            "--gpu-metrics-devices",
            "all",
            "--set",
            "basic",
            "--nvtx-include",
            "step.1/",
            "--launch-count",
            "6",
            "--no-import-sass",
            "--",
            "python3",
            "decode.py",
            "--steps",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == (
        "nsys: /opt/nsys profile --trace=cuda,nvtx --cuda-graph-trace=node "
        "--capture-range=cudaProfilerApi --capture-range-end=stop --gpu-metrics-devices=all "
        "'--output=<folder>/report' python3 decode.py --steps 2"
    )
    assert lines[1].startswith("export: /opt/nsys export --type=sqlite")
    sections = " ".join(
        f"--section {s}"
        for s in (
            "SpeedOfLight", "SpeedOfLight_RooflineChart",
            "SpeedOfLight_HierarchicalTensorRooflineChart", "ComputeWorkloadAnalysis",
            "MemoryWorkloadAnalysis", "Occupancy", "LaunchStats",
            "SpeedOfLight_HierarchicalHalfRooflineChart",
        )
    )  # fmt: skip
    assert len(lines) == 2 + 5  # one ncu pass per top kernel (top_n defaults to 5)
    for i in range(1, 6):
        assert lines[1 + i] == (
            f"ncu-{i}: /opt/ncu --set basic {sections} "
            "--metrics dram__bytes_read.sum,dram__bytes_write.sum --kernel-name-base function "
            f"--kernel-name 'regex:^TOP_KERNEL_{i}_FROM_NSYS$' --launch-count 6 "
            f"--nvtx --nvtx-include step.1/ --import-sass no --export '<folder>/report_k{i}' "
            "python3 decode.py --steps 2"
        )


def test_program_options_after_the_program_are_not_ours(cli: CliRunner) -> None:
    result = cli.invoke(app, ["none", "--dry-run", "python3", "x.py", "--trace", "--set", "1"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "run: python3 x.py --trace --set 1"


def test_none_mode_runs_and_reports_the_exit_code(cli: CliRunner, tmp_path: Path) -> None:
    result = cli.invoke(
        app,
        [
            "none",
            "--out",
            str(tmp_path),
            "--name",
            "probe",
            "--env",
            "NCCL_DEBUG=INFO",
            "--",
            PY,
            "-c",
            "import os, sys; print(os.environ['NCCL_DEBUG']); sys.exit(7)",
        ],
    )
    assert result.exit_code == 7
    (folder,) = _folders(tmp_path)
    assert folder.name.startswith("probe_none_")
    assert (folder / "run.stdout.log").read_text() == "INFO\n"
    record = json.loads((folder / "experiment.json").read_text())
    assert record["target_exit_code"] == 7 and record["status"] == "failed"


def test_timeout_exit_code(cli: CliRunner, tmp_path: Path) -> None:
    result = cli.invoke(
        app,
        [
            "none",
            "-q",
            "--out",
            str(tmp_path),
            "--timeout",
            "0.5",
            "--",
            PY,
            "-c",
            "import time; time.sleep(30)",
        ],
    )
    assert result.exit_code == 124
    (folder,) = _folders(tmp_path)
    assert json.loads((folder / "experiment.json").read_text())["status"] == "timeout"


def test_config_file_with_overrides(cli: CliRunner, tmp_path: Path) -> None:
    config = tmp_path / "exp.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "fromfile",
                "mode": "none",
                "out": str(tmp_path / "from-file"),
                "command": [PY, "-c", "print('configured')"],
                "timeout_s": 100,
            }
        )
    )
    result = cli.invoke(app, ["--config", str(config), "--out", str(tmp_path / "from-args")])
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "from-file").exists()
    (folder,) = _folders(tmp_path / "from-args")
    resolved = yaml.safe_load((folder / "config.yaml").read_text())
    assert resolved["out"] == str(tmp_path / "from-args") and resolved["timeout_s"] == 100
    assert (folder / "run.stdout.log").read_text() == "configured\n"


def test_subcommand_overrides_the_file(cli: CliRunner, tmp_path: Path) -> None:
    config = tmp_path / "exp.yaml"
    config.write_text(
        yaml.safe_dump({"mode": "nsys", "command": [PY, "-c", "print(1)"], "preset": "quick"})
    )
    result = cli.invoke(
        app, ["none", "--config", str(config), "--out", str(tmp_path / "o"), "--timeout", "50"]
    )
    assert result.exit_code == 0, result.output
    (folder,) = _folders(tmp_path / "o")
    resolved = yaml.safe_load((folder / "config.yaml").read_text())
    assert (resolved["mode"], resolved["preset"], resolved["timeout_s"]) == ("none", "quick", 50)


def test_sweep_from_the_command_line(cli: CliRunner, tmp_path: Path) -> None:
    result = cli.invoke(
        app,
        [
            "none",
            "-q",
            "--out",
            str(tmp_path),
            "--name",
            "sw",
            "--sweep",
            "a=1,2;b=10",
            "--",
            PY,
            "-c",
            "print({a} + {b})",
        ],
    )
    assert result.exit_code == 0, result.output
    (sweep_folder,) = _folders(tmp_path)
    assert sweep_folder.name.startswith("sw_sweep_")
    points = _folders(sweep_folder)
    assert [p.name.split("_none_")[0] for p in points] == ["sw-a-1-b-10", "sw-a-2-b-10"]
    assert sorted((p / "run.stdout.log").read_text() for p in points) == ["11\n", "12\n"]
    assert (
        (sweep_folder / "results.csv")
        .read_text()
        .splitlines()[0]
        .startswith("a,b,name,folder,status")
    )


def test_presets_listing(cli: CliRunner) -> None:
    result = cli.invoke(app, ["presets"])
    assert result.exit_code == 0
    for name in ("quick", "llm-serving", "torchrun", "kernel-drilldown"):
        assert name in result.output


def test_errors_are_tracekit_errors(
    cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = cli.invoke(
        app, ["nsys", "--nsys-path", str(tmp_path / "nope"), "--", PY, "-c", "pass"]
    )
    assert isinstance(result.exception, ToolNotFoundError)
    result = cli.invoke(app, ["none", "--env", "NOEQUALS", "--", PY, "-c", "pass"])
    assert isinstance(result.exception, CaptureError) and "KEY=VALUE" in str(result.exception)
    result = cli.invoke(app, ["none", "--out", str(tmp_path)])
    assert isinstance(result.exception, CaptureError) and "no command to run" in str(
        result.exception
    )


def test_group_without_config_shows_help(cli: CliRunner) -> None:
    result = cli.invoke(app, [])
    assert result.exit_code == 0 and "nsys" in result.output and "--config" in result.output


def test_through_the_tracekit_entry_point(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tracekit.cli.main import main

    code = "import sys; sys.exit(4)"
    assert main(["capture", "none", "-q", "--out", str(tmp_path), "--", PY, "-c", code]) == 4
    assert (
        main(["capture", "nsys", "--nsys-path", str(tmp_path / "nope"), "--", PY, "-c", "pass"])
        == 2
    )
    err = capsys.readouterr().err
    assert "tracekit: error: nsys path" in err and "Traceback" not in err


def test_capture_range_that_never_opens_is_not_complete(tmp_path: Path) -> None:
    """Issue 19.5 with a real nsys (2023.4): a cudaProfilerApi range the program never opens makes
    nsys print only 'Generated:' and write nothing; the run is 'failed' with the reason, exit 2."""
    import subprocess

    from .test_stats_nvtx_projection import nsys_2023_or_skip

    nsys = nsys_2023_or_skip()
    out = tmp_path / "exps"
    r = subprocess.run(
        [sys.executable, "-m", "tracekit.cli.main", "capture", "nsys", "--nsys-path", str(nsys),
         "--capture-range", "cudaProfilerApi", "-t", "osrt", "-o", str(out), "-q",
         "--", sys.executable, "-c", "print('hi')"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    (record,) = out.glob("*/experiment.json")
    data = json.loads(record.read_text())
    assert data["status"] == "failed" and data["complete"] is False
    assert "wrote no report" in data["error"] and "capture range" in data["error"]
    assert not list(record.parent.glob("*.nsys-rep"))
