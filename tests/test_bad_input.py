"""Bad input gets one clear line (a TracekitError, exit code 2 in the CLI), never a traceback,
and input files are never modified."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest

import tracekit
from tracekit.errors import (
    ToolNotFoundError,
    TraceFormatError,
    TracekitError,
    TraceNotFoundError,
    UnsupportedReportError,
)
from tracekit.stats import REPORTS, run_report

from .conftest import NSYS_CORPUS, SAMPLES, corpus_files, sample_exports

CLI = [sys.executable, "-m", "tracekit.cli.main"]


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, check=False)


def _assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("tracekit: error: ")
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0]


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceNotFoundError, match="does not exist"):
        tracekit.open(tmp_path / "nope.sqlite")
    _assert_one_line_error(_cli("summary", str(tmp_path / "nope.sqlite")), "does not exist")


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="is a directory"):
        tracekit.open(tmp_path)
    _assert_one_line_error(_cli("stats", str(tmp_path)), "open_many")


def test_zero_bytes(tmp_path: Path) -> None:
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    with pytest.raises(TraceFormatError, match="empty"):
        tracekit.open(empty)
    _assert_one_line_error(_cli("summary", str(empty)), "0 bytes")


def test_random_bytes(tmp_path: Path) -> None:
    junk = tmp_path / "junk.nsys-rep"
    junk.write_bytes(os.urandom(4096))
    with pytest.raises(TraceFormatError, match="not an Nsight"):
        tracekit.open(junk)
    _assert_one_line_error(_cli("summary", str(junk)), "not an Nsight")


def test_truncated_sqlite(tmp_path: Path) -> None:
    source = NSYS_CORPUS / "nsys2024.5_pipit_cloverleaf_4xa100.sqlite"
    cut = tmp_path / "cut.sqlite"
    cut.write_bytes(source.read_bytes()[: source.stat().st_size // 3])
    with pytest.raises(TraceFormatError, match="truncated or corrupt"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trace = tracekit.open(cut)
        for table in ("kernels", "memcpys", "cuda_api", "nvtx", "gpus", "syncs"):
            trace.table(table)
    _assert_one_line_error(_cli("stats", "-r", "cuda_gpu_trace", str(cut)), "truncated or corrupt")


@pytest.mark.parametrize("command", [["summary"], ["stats", "-r", "cuda_gpu_kern_sum"], ["diagnose"]])
def test_damaged_schema_text(tmp_path: Path, command: list[str]) -> None:
    """Bytes that are not UTF-8 flipped into a CREATE TABLE statement of sqlite_master make
    SQLite report a malformed schema whose message quotes them, which Python's sqlite3 fails
    to decode (UnicodeDecodeError): one line saying the schema is damaged, and the input
    unchanged."""
    source = SAMPLES / "planted" / "planted_clean" / "planted_clean.sqlite"
    data = bytearray(source.read_bytes())
    at = data.find(b"CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL")
    assert at > 0
    data[at + 3 : at + 9] = b"\x91\x92\x93\x94\x95\x96"
    damaged = tmp_path / "damaged_schema.sqlite"
    damaged.write_bytes(bytes(data))
    with pytest.raises(UnicodeDecodeError):  # what Python's sqlite3 itself does on it
        sqlite3.connect(f"file:{damaged}?mode=ro", uri=True).execute("SELECT count(*) FROM sqlite_master").fetchone()
    with pytest.raises(TraceFormatError, match="damaged schema"):
        _ = tracekit.open(damaged).kernels
    before = hashlib.sha256(damaged.read_bytes()).hexdigest()
    _assert_one_line_error(_cli(*command, str(damaged)), "damaged schema", "nsys export")
    assert hashlib.sha256(damaged.read_bytes()).hexdigest() == before


def test_sqlite_of_another_program(tmp_path: Path) -> None:
    other = tmp_path / "shop.sqlite"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    con.execute("INSERT INTO customers (name) VALUES ('ada')")
    con.commit()
    con.close()
    with pytest.raises(TraceFormatError, match="not an Nsight Systems export"):
        tracekit.open(other)
    _assert_one_line_error(_cli("summary", str(other)), "not an Nsight Systems export")


def test_export_without_cuda_tables() -> None:
    path = NSYS_CORPUS / "incomplete_cardiac_report1.sqlite"
    with pytest.warns(UserWarning, match="missing CUDA trace"):
        trace = tracekit.open(path)
    with pytest.raises(UnsupportedReportError, match="cannot give cuda_gpu_kern_sum"):
        run_report(trace, "cuda_gpu_kern_sum")
    proc = _cli("stats", "-r", "cuda_api_sum", str(path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "cannot give cuda_api_sum" in proc.stderr


def _reports() -> list[Path]:
    return sorted(SAMPLES.rglob("*.nsys-rep"))


@pytest.mark.skipif(not _reports(), reason="no .nsys-rep in sample_traces/")
def test_report_without_nsys(tmp_path: Path) -> None:
    # copy the report where no export sits beside it, and hide every nsys
    report = tmp_path / "r.nsys-rep"
    shutil.copy(_reports()[0], report)
    env = {k: v for k, v in os.environ.items() if k != "NSYS"}
    env["PATH"] = str(Path(sys.executable).parent)
    probe = subprocess.run([sys.executable, "-c", "from tracekit.tools import find_tool; print(find_tool('nsys', required=False))"],
                           capture_output=True, text=True, env=env, check=True)
    if probe.stdout.strip() != "None":
        pytest.skip(f"an nsys is installed on this machine: {probe.stdout.strip()}")
    code = (
        "import sys, tracekit\n"
        "from tracekit.errors import ToolNotFoundError\n"
        "try:\n    tracekit.open(sys.argv[1])\nexcept ToolNotFoundError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(report)], capture_output=True, text=True, env=env, check=True)
    assert "nsys export --type sqlite" in out.stdout
    _assert_one_line_error(_cli("summary", str(report), env=env), "nsys export --type sqlite")
    assert ToolNotFoundError.__mro__[1] is TracekitError


def _run_as(uid: int | None, fn) -> str:  # type: ignore[no-untyped-def]
    """Run ``fn`` in a forked child (as ``uid`` when given) and return what it wrote."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_fd)
        try:
            if uid is not None:
                os.setgid(uid)
                os.setuid(uid)
            out = fn()
        except BaseException as exc:  # report anything to the parent
            out = f"unexpected {type(exc).__name__}: {exc}"
        os.write(write_fd, out.encode())
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as fh:
        text = fh.read()
    os.waitpid(pid, 0)
    return text


def test_unreadable_file() -> None:
    # root reads everything, so the check runs as an unprivileged user in a forked child
    source = NSYS_CORPUS / "nsys2026.1_nsysai_mock.sqlite"
    folder = Path(tempfile.mkdtemp())
    try:
        folder.chmod(0o755)
        locked = folder / "locked.sqlite"
        shutil.copy(source, locked)
        locked.chmod(0o000)
        uid = 65534 if os.geteuid() == 0 else None

        def api() -> str:
            try:
                tracekit.open(locked)
            except TracekitError as exc:
                return f"{type(exc).__name__}|{exc}"
            return "opened"

        def cli() -> str:
            import contextlib
            import io

            from tracekit.cli.main import main

            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                code = main(["summary", str(locked)])
            return f"{code}|{err.getvalue()}"

        # import everything the CLI needs while we can still read the interpreter's files
        import contextlib
        import io

        from tracekit.cli.main import main

        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            main(["summary", str(source)])
        kind, _, message = _run_as(uid, api).partition("|")
        assert kind == "TracePermissionError", message
        assert "not readable" in message and "\n" not in message
        code, _, stderr = _run_as(uid, cli).partition("|")
        assert code == "2", stderr
        assert stderr.startswith("tracekit: error: ") and "not readable" in stderr
        assert len(stderr.strip().splitlines()) == 1
    finally:
        shutil.rmtree(folder)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("path", corpus_files()[:0] + [*corpus_files(), *sample_exports()[:2]], ids=lambda p: p.name)
def test_input_bytes_unchanged_after_every_report(path: Path) -> None:
    before = (_sha256(path), path.stat().st_mtime_ns)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trace = tracekit.open(path)
        for table in ("kernels", "memcpys", "memsets", "syncs", "cuda_api", "nvtx", "gpus", "processes",
                      "threads", "memory_usage", "gpu_metrics"):
            trace.table(table)
        for name in REPORTS:
            with contextlib.suppress(TracekitError):
                run_report(trace, name)
    trace.close()
    assert (_sha256(path), path.stat().st_mtime_ns) == before
    assert not path.with_name(path.name + "-journal").exists()
    assert not path.with_name(path.name + "-wal").exists()
