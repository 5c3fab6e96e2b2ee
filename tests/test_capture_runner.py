"""The process runner on real child processes: streaming, exit codes, timeouts, interrupts, trees."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tracekit.capture.output import (
    ConsoleReporter,
    OutputLine,
    Progress,
    as_callback,
    parse_progress,
    target_exit_code,
)
from tracekit.capture.runner import descendants, is_alive, run_process
from tracekit.errors import CaptureError

PY = sys.executable

# A parent that starts a grandchild which ignores SIGINT and SIGTERM and sleeps, prints its pid,
# then sleeps itself: only a SIGKILL to the whole tree ends both.
STUBBORN_TREE = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])
    print("grandchild", child.pid, flush=True)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    time.sleep(60)
    """
)


def _grandchild_pid(lines: list[OutputLine]) -> int:
    for line in lines:
        if line.text.startswith("grandchild"):
            return int(line.text.split()[1])
    raise AssertionError("the child never printed its pid")


def test_streams_lines_in_order_and_keeps_logs(tmp_path: Path) -> None:
    seen: list[OutputLine] = []
    code = "import sys\nfor i in range(3): print(f'line {i}', flush=True)\nprint('oops', file=sys.stderr)\nsys.exit(4)"
    res = run_process(
        [PY, "-c", code],
        stdout_path=tmp_path / "o.log",
        stderr_path=tmp_path / "e.log",
        on_output=seen.append,
        step="run",
    )
    assert res.returncode == 4
    assert res.status == "failed"
    assert [ln.text for ln in seen if ln.stream == "stdout"] == ["line 0", "line 1", "line 2"]
    assert [ln.text for ln in seen if ln.stream == "stderr"] == ["oops"]
    assert all(ln.step == "run" and ln.elapsed_s >= 0 for ln in seen)
    assert (tmp_path / "o.log").read_text() == "line 0\nline 1\nline 2\n"
    assert (tmp_path / "e.log").read_text() == "oops\n"
    assert res.lines == 4


def test_success_status_and_environment(tmp_path: Path) -> None:
    env = {**os.environ, "TRACEKIT_TEST_VALUE": "42"}
    seen: list[str] = []
    res = run_process(
        [PY, "-c", "import os; print(os.environ['TRACEKIT_TEST_VALUE'])"],
        env=env,
        cwd=tmp_path,
        on_output=lambda ln: seen.append(ln.text),
    )
    assert (res.status, res.returncode, seen) == ("ok", 0, ["42"])


def test_carriage_return_progress_is_split_and_parsed() -> None:
    code = (
        "import sys\nfor p in (10, 55, 100):\n    sys.stdout.write(f'\\rProcessing [=====' + str(p) + '%   ]')\n"
        "    sys.stdout.flush()\nprint()\nprint('Generated:')"
    )
    seen: list[OutputLine] = []
    run_process([PY, "-c", code], on_output=seen.append, tool="nsys")
    percents = [
        ln.progress.percent for ln in seen if ln.progress and ln.progress.percent is not None
    ]
    assert percents == [10, 55, 100]
    assert any(ln.overwrite for ln in seen)
    assert seen[-1].text == "Generated:"


def test_timeout_kills_the_whole_process_tree(tmp_path: Path) -> None:
    seen: list[OutputLine] = []
    started = time.monotonic()
    res = run_process(
        [PY, "-c", STUBBORN_TREE], on_output=seen.append, timeout_s=2.0, kill_grace_s=0.5
    )
    assert res.status == "timeout"
    assert time.monotonic() - started < 30
    assert res.signals_sent[0] == "SIGINT" and "SIGKILL" in res.signals_sent
    grandchild = _grandchild_pid(seen)
    deadline = time.monotonic() + 5
    while is_alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not is_alive(grandchild)


def test_sigint_is_enough_for_a_well_behaved_program() -> None:
    res = run_process([PY, "-c", "import time; time.sleep(60)"], timeout_s=0.5, kill_grace_s=10)
    assert res.status == "timeout"
    assert res.signals_sent == ("SIGINT",)
    assert res.returncode != 0


def test_stop_event_interrupts(tmp_path: Path) -> None:
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    res = run_process([PY, "-c", "import time; time.sleep(60)"], stop_event=stop, kill_grace_s=1)
    assert res.status == "interrupted"
    assert res.wall_s < 20


def test_keyboard_interrupt_stops_the_tree_then_propagates() -> None:
    seen: list[OutputLine] = []
    timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt) as info:
        run_process([PY, "-c", STUBBORN_TREE], on_output=seen.append, kill_grace_s=0.5)
    timer.join()
    assert info.value.result.status == "interrupted"  # type: ignore[attr-defined]
    grandchild = _grandchild_pid(seen)
    deadline = time.monotonic() + 5
    while is_alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not is_alive(grandchild)


def test_leftover_background_processes_are_stopped() -> None:
    code = (
        "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "print(p.pid, flush=True)"
    )
    seen: list[str] = []
    res = run_process([PY, "-c", code], on_output=lambda ln: seen.append(ln.text), kill_grace_s=2)
    assert res.status == "ok"
    orphan = int(seen[0])
    deadline = time.monotonic() + 5
    while is_alive(orphan) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not is_alive(orphan)


def test_descendants_sees_grandchildren() -> None:
    import subprocess

    proc = subprocess.Popen(
        [PY, "-c", STUBBORN_TREE], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        grandchild = int(proc.stdout.readline().split()[1])  # type: ignore[union-attr]
        assert grandchild in descendants(proc.pid)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]


def test_missing_program_is_one_clear_error() -> None:
    with pytest.raises(CaptureError, match="cannot start 'no-such-program-xyz'"):
        run_process(["no-such-program-xyz"])


def test_a_failing_callback_does_not_break_the_run() -> None:
    def broken(line: OutputLine) -> None:
        raise RuntimeError("display gone")

    assert run_process([PY, "-c", "print(1)"], on_output=broken).status == "ok"


@pytest.mark.parametrize(
    ("line", "tool", "phase", "percent"),
    [
        (
            "Processing [==============================50%                 ]",
            "nsys",
            "Processing",
            50,
        ),
        (
            "[1/1] [========================100%] report.nsys-rep",
            "nsys",
            "[1/1] report.nsys-rep",
            100,
        ),
        ("Exporting 7675 events: [=================100%]", "nsys", "Exporting 7675 events:", 100),
        ("Collecting data...", "nsys", "Collecting data", None),
        (
            '==PROF== Profiling "gemm_kernel" - 7: 0%....50%....100% - 20 passes',
            "ncu",
            "profiling gemm_kernel",
            100,
        ),
    ],
)
def test_parse_progress(line: str, tool: str, phase: str, percent: int | None) -> None:
    progress = parse_progress(line, tool)
    assert progress is not None
    assert (progress.phase, progress.percent) == (phase, percent)


def test_parse_progress_ignores_program_output() -> None:
    assert parse_progress("loss 0.5 [50%]", None) is None
    assert parse_progress("rank 0: decoded 8 steps", "nsys") is None


@pytest.mark.parametrize(
    ("lines", "tool", "rc", "expected"),
    [
        (["The target application returned non-zero exit code 3"], "nsys", 3, (3, "reported")),
        (["The target application terminated with signal 9 (SIGKILL)"], "nsys", 0, (137, "signal")),
        (["Generated:", "  /x/report.nsys-rep"], "nsys", 0, (0, "clean")),
        ([], "nsys", 5, (5, "profiler")),
        (["==ERROR== The application returned an error code (1)."], "ncu", 1, (1, "reported")),
        (["==PROF== Disconnected from process 1"], "ncu", 0, (0, "clean")),
        ([], "ncu", 9, (None, "unknown")),
    ],
)
def test_target_exit_code(
    lines: list[str], tool: str, rc: int, expected: tuple[int | None, str]
) -> None:
    assert target_exit_code(lines, tool, rc) == expected


def test_console_reporter_echoes_lines_and_tracks_progress() -> None:
    import io

    from rich.console import Console

    console = Console(file=io.StringIO(), width=200)
    reporter = ConsoleReporter(console)
    with reporter:
        reporter(
            OutputLine(
                "nsys", "stdout", "Collecting data...", 0.5, progress=Progress("Collecting data")
            )
        )
        reporter(
            OutputLine(
                "nsys",
                "stdout",
                "Processing [==50%  ]",
                1.0,
                overwrite=True,
                progress=Progress("Processing", 50),
            )
        )
        reporter(OutputLine("nsys", "stderr", "a warning", 1.2))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "[nsys] Collecting data..." in text and "[nsys] a warning" in text
    assert "Processing [==50%" not in text  # redrawn bars move the status line only
    assert reporter._phase == "Processing 50%"


def test_as_callback_accepts_what_it_can_drive() -> None:
    from rich.console import Console

    assert as_callback(None) is None
    assert as_callback(print) is print
    assert isinstance(as_callback(Console()), ConsoleReporter)
    with pytest.raises(TypeError, match="on_output must be a callable"):
        as_callback(42)


# A program whose helper leaves the tree the way the agent of ``nsys --start-agent`` does: a middle
# process starts it in a new session and exits, so it is reparented, in no group of the run and
# no descendant of it; it ignores SIGINT and SIGTERM. Only its inherited environment says whose it is.
DETACHED_DAEMON = textwrap.dedent(
    """
    import subprocess, sys, time
    daemon = ("import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
              "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)")
    middle = ("import subprocess, sys; d = subprocess.Popen([sys.executable, '-c', %r], start_new_session=True, "
              "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(d.pid, flush=True)") % daemon
    mid = subprocess.Popen([sys.executable, "-c", middle], stdout=subprocess.PIPE, text=True)
    pid = int(mid.stdout.readline())
    mid.wait()
    print("daemon", pid, flush=True)
    time.sleep(60)
    """
)


@pytest.mark.parametrize("how", ["timeout", "stop_event"])
def test_a_detached_daemon_of_the_run_is_stopped_too(how: str) -> None:
    """Issue 19.5: after a timeout or interrupt the nsys agent survived (3 of 3 runs): it is in
    another session and was reparented. It carries TRACEKIT_RUN_ID, so it is stopped after the
    process group; SIGKILL, since it ignores the rest."""
    found: dict[str, object] = {}
    got_pid = threading.Event()

    def on_output(line: OutputLine) -> None:
        if line.text.startswith("daemon"):
            pid = int(line.text.split()[1])
            with open(f"/proc/{pid}/environ", "rb") as fh:
                found["environ"] = fh.read().split(b"\0")
            with open(f"/proc/{pid}/stat", "rb") as fh:
                stat = fh.read()
            found["pid"], found["pgrp"] = pid, int(stat[stat.rfind(b")") + 2 :].split()[2])
            got_pid.set()

    stop = threading.Event()
    if how == "stop_event":
        threading.Thread(target=lambda: got_pid.wait(30) and stop.set(), daemon=True).start()
    try:
        res = run_process([PY, "-c", DETACHED_DAEMON], on_output=on_output, kill_grace_s=0.5,
                          timeout_s=20 if how == "stop_event" else 3, stop_event=stop)  # fmt: skip
    finally:
        daemon = found.get("pid")
        deadline = time.monotonic() + 5
        while isinstance(daemon, int) and is_alive(daemon) and time.monotonic() < deadline:
            time.sleep(0.05)
        alive = isinstance(daemon, int) and is_alive(daemon)
        if alive:
            os.kill(daemon, signal.SIGKILL)  # type: ignore[arg-type]  # ours: started by this test
    assert isinstance(daemon, int), "the program never printed the daemon's pid"
    assert res.status == ("timeout" if how == "timeout" else "interrupted")
    assert found["pgrp"] != res.pid  # outside the run's process group
    assert not alive, "the detached daemon survived the stop"
    assert any(v.startswith(b"TRACEKIT_RUN_ID=") for v in found["environ"])  # type: ignore[attr-defined]
    assert "SIGKILL" in res.signals_sent


# The program stands for `nsys profile`: on SIGINT it takes a second to finish (nsys writes its
# report then, with its agent) and notes when it exits. Its detached helper stands for the agent:
# it notes when it receives SIGINT.
AGENT_AFTER_PROGRAM = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    out = sys.argv[1]
    agent = ("import signal, sys, time\\n"
             "def note(*_):\\n"
             "    open(%r + '/agent', 'w').write(repr(time.time())); sys.exit(0)\\n"
             "signal.signal(signal.SIGINT, note)\\n"
             "time.sleep(120)\\n") % out
    middle = ("import subprocess, sys; d = subprocess.Popen([sys.executable, '-c', %r], start_new_session=True, "
              "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(d.pid, flush=True)") % agent
    mid = subprocess.Popen([sys.executable, "-c", middle], stdout=subprocess.PIPE, text=True)
    pid = int(mid.stdout.readline())
    mid.wait()
    def finish(*_):
        time.sleep(1.0)
        open(out + "/program", "w").write(repr(time.time()))
        sys.exit(0)
    signal.signal(signal.SIGINT, finish)
    print("agent", pid, flush=True)
    time.sleep(60)
    """
)


def test_a_detached_agent_is_signalled_only_after_the_program_has_finished(tmp_path: Path) -> None:
    """On an H100 with nsys 2025.3.1 (tests/gpu/agent_e2e.py), signalling nsys's agent together
    with nsys lost the report of a timed-out capture: the agent is stopped only once the program's
    tree is gone."""
    pids: list[int] = []

    def on_output(line: OutputLine) -> None:
        if line.text.startswith("agent"):
            pids.append(int(line.text.split()[1]))

    try:
        res = run_process([PY, "-c", AGENT_AFTER_PROGRAM, str(tmp_path)], on_output=on_output,
                          timeout_s=3, kill_grace_s=10)  # fmt: skip
    finally:
        for pid in pids:
            if is_alive(pid):
                os.kill(pid, signal.SIGKILL)  # ours: started by this test
    assert res.status == "timeout"
    assert pids, "the program never printed its agent's pid"
    program_done = float((tmp_path / "program").read_text())
    agent_signalled = float((tmp_path / "agent").read_text())
    assert agent_signalled >= program_done, "the agent was signalled while the program was still finishing"
    assert res.signals_sent == ("SIGINT",)
