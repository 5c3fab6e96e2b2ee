"""Tool discovery and the checks before and after a capture, on real files and executables."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tracekit.capture import preflight
from tracekit.capture.options import Experiment, NcuOptions, NsysOptions
from tracekit.capture.prepare import preflight_check
from tracekit.errors import CaptureError, ToolNotFoundError
from tracekit.tools import Tool, find_tool

PY = sys.executable


def _executable(path: Path) -> Path:
    """An executable that prints nothing: enough for discovery, which only looks for the file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def bare_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No nsys/ncu on PATH or in NSYS/NCU; skip where the machine has them in install folders."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv(
        "PATH", os.pathsep.join([str(empty), str(Path(PY).parent), "/usr/bin", "/bin"])
    )
    monkeypatch.delenv("NSYS", raising=False)
    monkeypatch.delenv("NCU", raising=False)
    if find_tool("nsys", required=False) or find_tool("ncu", required=False):
        pytest.skip("this machine has Nsight tools in its install folders")
    return empty


def test_env_variable_names_the_tool(
    bare_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nsys = _executable(tmp_path / "custom" / "nsys")
    monkeypatch.setenv("NSYS", str(nsys))
    assert preflight.resolve_tool("nsys").path == nsys


def test_path_is_searched(bare_env: Path) -> None:
    ncu = _executable(bare_env / "ncu")
    tool = preflight.resolve_tool("ncu")
    assert tool.path == ncu and tool.name == "ncu"


def test_nsys_inside_an_nsight_compute_install(
    bare_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install = tmp_path / "nsight-compute" / "2025.3.1"
    monkeypatch.setenv("NCU", str(_executable(install / "ncu")))
    nsys = _executable(install / "host" / "target-linux-x64" / "nsys")
    assert preflight.resolve_tool("nsys").path == nsys


def test_explicit_path_wins_and_is_checked(bare_env: Path, tmp_path: Path) -> None:
    nsys = _executable(tmp_path / "x" / "nsys")
    assert preflight.resolve_tool("nsys", nsys).path == nsys
    plain = tmp_path / "not-executable"
    plain.write_text("")
    with pytest.raises(ToolNotFoundError, match="is not an executable file"):
        preflight.resolve_tool("nsys", plain)


def test_missing_tool_says_how_to_install(bare_env: Path) -> None:
    with pytest.raises(ToolNotFoundError, match=r"NSYS=/path/to/nsys"):
        preflight.resolve_tool("nsys")
    with pytest.raises(ToolNotFoundError, match=r"install Nsight Compute"):
        preflight.resolve_tool("ncu")


def test_preflight_fails_before_anything_is_created(bare_env: Path, tmp_path: Path) -> None:
    out = tmp_path / "runs"
    exp = Experiment(command=[PY, "-c", "pass"], mode="nsys", out=str(out))
    with pytest.raises(ToolNotFoundError):
        preflight_check(exp)
    assert not out.exists()


def test_preflight_program_missing(tmp_path: Path) -> None:
    with pytest.raises(CaptureError, match="program 'no-such-program-xyz' was not found on PATH"):
        preflight_check(Experiment(command=["no-such-program-xyz"], mode="none", out=str(tmp_path)))
    with pytest.raises(CaptureError, match="does not exist"):
        preflight_check(
            Experiment(command=["./missing.sh"], mode="none", out=str(tmp_path), cwd=str(tmp_path))
        )


def test_preflight_output_folder_not_writable(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(
        CaptureError, match="cannot create the output folder .* choose another --out"
    ):
        preflight_check(
            Experiment(command=[PY, "-c", "pass"], mode="none", out=str(blocker / "runs"))
        )


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_preflight_read_only_folder(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o500)
    with pytest.raises(CaptureError, match="is not writable"):
        preflight.check_writable(folder)


def test_preflight_nvtx_range_and_per_rank(bare_env: Path, tmp_path: Path) -> None:
    exp = Experiment(
        command=[PY, "-c", "pass"],
        mode="nsys",
        out=str(tmp_path),
        nsys=NsysOptions(capture_range="nvtx"),
    )
    with pytest.raises(CaptureError, match="pass --nvtx-capture NAME"):
        preflight_check(exp)
    with pytest.raises(CaptureError, match="needs a torchrun command"):
        preflight_check(
            Experiment(command=[PY, "x.py"], mode="none", per_rank=True, out=str(tmp_path))
        )


def test_unsupported_flags_are_read_from_help() -> None:
    help_2022 = "usage: nsys profile [<args>]\n  -t, --trace=\n  --capture-range=\n  --gpu-metrics-device=\n"
    flags = ["--trace", "--capture-range", "--gpu-metrics-devices", "--cuda-graph-trace"]
    assert preflight.unsupported_flags(flags, help_2022) == [
        "--gpu-metrics-devices",
        "--cuda-graph-trace",
    ]
    assert preflight.unsupported_flags(flags, "") == []
    tool = Tool("nsys", Path("/opt/nsys"), "2022.1.1")
    with pytest.raises(
        CaptureError,
        match=r"nsys 2022.1.1 at /opt/nsys does not accept --gpu-metrics-devices, "
        r"--cuda-graph-trace; install a newer Nsight Systems",
    ):
        preflight.check_flags_supported(tool, flags, help_2022)


def test_help_text_of_a_real_program() -> None:
    assert "usage" in preflight.help_text(PY).lower()
    assert preflight.help_text("/no/such/tool") == ""


def test_missing_libraries_parser() -> None:
    ldd = (
        "\tlinux-vdso.so.1 (0x7)\n\tlibdw.so.1 => not found\n\tlibc.so.6 => /lib/libc.so.6 (0x1)\n"
    )
    assert preflight.missing_libraries(ldd) == ["libdw.so.1"]


def _importer_missing_a_library(folder: Path) -> Path:
    """Build a real ELF that needs a shared library, then remove the library (needs a C compiler)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or shutil.which("ldd") is None:
        pytest.skip("needs a C compiler and ldd")
    build = folder / "build"
    build.mkdir(parents=True)
    (build / "lib.c").write_text("int tracekit_probe(void) { return 1; }\n")
    (build / "main.c").write_text(
        "int tracekit_probe(void);\nint main(void) { return tracekit_probe(); }\n"
    )
    subprocess.run(
        [
            cc,
            "-shared",
            "-fPIC",
            "-Wl,-soname,libtracekit_missing.so.1",
            "-o",
            str(build / "libtracekit_missing.so.1"),
            str(build / "lib.c"),
        ],
        check=True,
    )
    importer = folder / "host-linux-x64" / "QdstrmImporter"
    importer.parent.mkdir(parents=True)
    subprocess.run(
        [cc, "-o", str(importer), str(build / "main.c"), str(build / "libtracekit_missing.so.1")],
        check=True,
    )
    shutil.rmtree(build)
    return importer


def test_importer_with_a_missing_library_is_caught(
    tmp_path: Path, bare_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install = tmp_path / "nsight-systems"
    importer = _importer_missing_a_library(install)
    nsys = _executable(install / "target-linux-x64" / "nsys")
    assert preflight.importer_candidates(nsys) == [importer]
    with pytest.raises(
        CaptureError, match=r"cannot load libtracekit_missing.so.1, so nsys would write a \.qdstrm"
    ):
        preflight.check_importer(nsys)
    monkeypatch.setenv("NSYS", str(nsys))
    exp = Experiment(command=[PY, "-c", "pass"], mode="nsys", out=str(tmp_path / "runs"))
    with pytest.raises(CaptureError, match="QdstrmImporter cannot load"):
        preflight_check(exp)
    tools, _ = preflight_check(exp, system_checks=False)  # to watch nsys fail by itself
    assert tools["nsys"].path == nsys


def test_importer_with_all_libraries_passes(tmp_path: Path) -> None:
    nsys = _executable(tmp_path / "target-linux-x64" / "nsys")
    importer = tmp_path / "host-linux-x64" / "QdstrmImporter"
    importer.parent.mkdir()
    shutil.copy(PY, importer)
    assert (
        preflight.check_importer(
            nsys,
            {"LD_LIBRARY_PATH": str(Path(PY).parent.parent / "lib"), "PATH": os.environ["PATH"]},
        )
        == []
    )
    lone = _executable(tmp_path / "elsewhere" / "bin" / "nsys")
    assert "QdstrmImporter not found" in preflight.check_importer(lone)[0]


def test_counter_permission(tmp_path: Path) -> None:
    params = tmp_path / "params"
    params.write_text("ResmanDebugLevel: 4294967295\nRmProfilingAdminOnly: 1\n")
    with pytest.raises(CaptureError, match="ERR_NVGPUCTRPERM"):
        preflight.check_counter_permission("ncu", params, euid=1000)
    preflight.check_counter_permission("ncu", params, euid=0)
    params.write_text("RmProfilingAdminOnly: 0\n")
    preflight.check_counter_permission("ncu", params, euid=1000)
    preflight.check_counter_permission("ncu", tmp_path / "absent", euid=1000)


def test_qdstrm_without_report_is_explained(tmp_path: Path) -> None:
    (tmp_path / "report.qdstrm").write_bytes(b"")
    message = preflight.nsys_outcome_error(tmp_path, [], ["Generating '/tmp/nsys-report-1.qdstrm'"])
    assert message is not None and "but no .nsys-rep" in message and "libdw" in message
    assert preflight.nsys_outcome_error(tmp_path, [tmp_path / "report.nsys-rep"], []) is None
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "capture range never opened" in (
        preflight.nsys_outcome_error(empty, [], ["No reports were generated"]) or ""
    )
    # issue 19.5: no report and nsys silent about it is still an error (status failed), never complete
    silent = preflight.nsys_outcome_error(empty, [], ["Collecting data...", "Process exited with 0"])
    assert silent is not None and "wrote no report" in silent and "capture range" in silent


def test_ncu_permission_failure_is_explained() -> None:
    lines = [
        "==PROF== Connected to process 17664 (/usr/bin/python3.12)",
        "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters",
    ]
    assert "NVreg_RestrictProfilingToAdminUsers=0" in (preflight.ncu_outcome_error(lines) or "")
    assert preflight.ncu_outcome_error(["==PROF== Disconnected from process 1"]) is None


def test_ncu_flags_are_checked_against_help(bare_env: Path) -> None:
    from tracekit.capture import commands

    flags = commands.option_flags(
        commands.ncu_profile_args(NcuOptions(graph_profiling="graph"), "r")
    )
    help_2022 = "  --set arg\n  --section arg\n  -o [ --export ] arg\n"
    assert preflight.unsupported_flags(flags, help_2022) == ["--graph-profiling"]
