"""Running one command: argument list in, streamed lines out, the whole process tree stopped at the end.

The child starts in a new session (its own process group), so a timeout, an interrupt or a stop
request can signal every process it started (``os.killpg``) plus any descendant that moved to
another group (found through ``/proc``). A daemon that left the tree altogether (``setsid`` and a
double fork, as the agent that ``nsys --start-agent`` leaves running) is found by the
``TRACEKIT_RUN_ID`` marker set in the child's environment, which it inherited (``/proc/<pid>/environ``
of this user's processes), and stopped after the process group. Signals escalate SIGINT → SIGTERM → SIGKILL: a profiler
stopped with SIGINT still writes its report, as it would after Ctrl-C in a terminal.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from tracekit.capture.output import OutputLine, parse_progress
from tracekit.errors import CaptureError

log = logging.getLogger(__name__)

OnOutput = Callable[[OutputLine], None]
_LINE_END = re.compile(rb"\r\n|\r|\n")


def now_iso() -> str:
    """The current time, ISO 8601 with the local UTC offset, to the millisecond."""
    return datetime.now(UTC).astimezone().isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class ProcessResult:
    """How one command ended.

    Attributes
    ----------
    returncode
        The exit status (negative: killed by that signal); ``None`` if it could not be read.
    status
        ``"ok"`` (exit 0), ``"failed"`` (non-zero exit), ``"timeout"`` or ``"interrupted"``.
    wall_s
        Seconds from start to the end of the process tree.
    """

    argv: tuple[str, ...]
    returncode: int | None
    status: str
    wall_s: float
    started_at: str
    ended_at: str
    pid: int
    lines: int
    signals_sent: tuple[str, ...] = ()


def _proc_table() -> dict[int, tuple[str, int, int]]:
    """``pid -> (state, ppid, pgrp)`` for every process in ``/proc`` (empty where there is none)."""
    table: dict[int, tuple[str, int, int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2:
            table[int(entry)] = (fields[0].decode(), int(fields[1]), int(fields[2]))
    return table


def descendants(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (children, grandchildren, …), read from ``/proc``."""
    tree: dict[int, list[int]] = {}
    for child, (state, ppid, _) in _proc_table().items():
        if state not in ("Z", "X"):
            tree.setdefault(ppid, []).append(child)
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def group_members(pgid: int) -> set[int]:
    """Live (non-zombie) processes of process group ``pgid``."""
    table = _proc_table()
    if not table:  # no /proc: ask the kernel whether the group still exists
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return set()
        except PermissionError:
            pass
        return {pgid}
    return {
        pid for pid, (state, _, pgrp) in table.items() if pgrp == pgid and state not in ("Z", "X")
    }


def is_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting to be reaped counts as gone)."""
    entry = _proc_table().get(pid)
    if entry is not None:
        return entry[0] not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not Path("/proc").is_dir()


#: Environment variable set on every program :func:`run_process` starts; its value names the run.
RUN_ID_VARIABLE = "TRACEKIT_RUN_ID"


def marked(run_id: str | None) -> set[int]:
    """Live processes of this user whose environment carries ``TRACEKIT_RUN_ID=run_id``: what a
    run started, wherever it moved (another session, reparented to init). Empty without /proc."""
    if not run_id:
        return set()
    needle = f"{RUN_ID_VARIABLE}={run_id}".encode()
    uid, me = os.getuid(), os.getpid()
    found: set[int] = set()
    for pid, (state, _, _) in _proc_table().items():
        if pid == me or state in ("Z", "X"):
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            with open(f"/proc/{pid}/environ", "rb") as fh:
                environ = fh.read()
        except OSError:  # gone, or not ours to read
            continue
        if needle in environ.split(b"\0"):
            found.add(pid)
    return found


def _signal_tree(pgid: int, pids: set[int], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def kill_tree(proc: subprocess.Popen[bytes], grace_s: float, run_id: str | None = None) -> list[str]:
    """Stop ``proc``, its process group and all its descendants (SIGINT, SIGTERM, then SIGKILL),
    then the processes that still carry ``run_id`` in their environment (:func:`marked`).

    SIGINT gets ``grace_s`` seconds (a profiler writes its report then), SIGTERM at most five
    more. Marked processes outside the tree are left alone until the tree is gone and have
    ``min(grace_s, 5)`` seconds to exit by themselves: the agent that ``nsys profile`` starts in
    its own session writes the report with it, and signalling it together with nsys lost the
    report of a timed-out capture (seen on an H100 with nsys 2025.3.1; tests/gpu/agent_e2e.py).
    Returns the names of the signals sent.
    """
    pgid = proc.pid
    sent = _escalate(lambda: descendants(proc.pid), grace_s, pgid=pgid, proc=proc)
    if run_id and not _gone(lambda: marked(run_id), min(grace_s, 5.0)):
        for name in _escalate(lambda: marked(run_id), min(grace_s, 5.0)):
            if name not in sent:
                sent.append(name)
    return sent


def _gone(find: Callable[[], set[int]], wait_s: float) -> bool:
    """Whether ``find()`` comes back empty within ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    while find():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _escalate(
    find: Callable[[], set[int]],
    grace_s: float,
    *,
    pgid: int | None = None,
    proc: subprocess.Popen[bytes] | None = None,
) -> list[str]:
    """SIGINT, SIGTERM, SIGKILL to the processes ``find()`` returns (and the group ``pgid``),
    each after the last has had its time, until ``proc`` has exited and none is left."""
    tracked = find()
    sent: list[str] = []
    for sig, wait_s in (
        (signal.SIGINT, grace_s),
        (signal.SIGTERM, min(grace_s, 5.0)),
        (signal.SIGKILL, 5.0),
    ):
        tracked |= find()
        if pgid is not None:
            _signal_tree(pgid, tracked, sig)
        else:
            for pid in tracked:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
        sent.append(sig.name)
        deadline = time.monotonic() + wait_s
        while True:
            if proc is None or proc.poll() is not None:
                tracked = {p for p in tracked if is_alive(p)}
                if not tracked and (pgid is None or not group_members(pgid)):
                    return sent
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
    return sent


class _Reader(threading.Thread):
    """Copy one pipe to a log file byte for byte and hand each line to the callback."""

    def __init__(
        self, fd: int, stream: str, log_path: Path | None, emit: Callable[[str, str, bool], None]
    ):
        super().__init__(daemon=True, name=f"tracekit-{stream}")
        self.fd, self.stream, self.log_path, self.emit = fd, stream, log_path, emit
        self.lines = 0

    def run(self) -> None:
        sink = open(self.log_path, "wb") if self.log_path else None  # noqa: SIM115
        pending = b""
        try:
            while True:
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    break
                if sink:
                    sink.write(chunk)
                    sink.flush()
                pending += chunk
                pos = 0
                for match in _LINE_END.finditer(pending):
                    if match.group() == b"\r" and match.end() == len(pending):
                        break  # might be the first half of "\r\n"; wait for more
                    self._line(pending[pos : match.start()], match.group() == b"\r")
                    pos = match.end()
                pending = pending[pos:]
            if pending.rstrip(b"\r"):
                self._line(pending.rstrip(b"\r"), False)
        finally:
            os.close(self.fd)
            if sink:
                sink.close()

    def _line(self, raw: bytes, overwrite: bool) -> None:
        self.lines += 1
        self.emit(self.stream, raw.decode("utf-8", errors="replace"), overwrite)


def run_process(
    argv: Sequence[str],
    *,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    stdout_path: str | Path | None = None,
    stderr_path: str | Path | None = None,
    on_output: OnOutput | None = None,
    step: str = "run",
    tool: str | None = None,
    timeout_s: float | None = None,
    kill_grace_s: float = 30.0,
    stop_event: threading.Event | None = None,
) -> ProcessResult:
    """Run ``argv`` (no shell), stream its output, and stop its whole tree on timeout or interrupt.

    Parameters
    ----------
    argv
        Program and arguments.
    cwd, env
        Working folder and complete environment of the child (default: inherited).
    stdout_path, stderr_path
        Files that receive the raw output (``None``: not kept).
    on_output
        Called with an :class:`~tracekit.capture.output.OutputLine` for every line of either
        stream, one call at a time, from reader threads.
    step, tool
        Labels for the lines; ``tool`` (``"nsys"``/``"ncu"``) turns on progress parsing.
    timeout_s
        Stop the process tree after this many seconds (status ``"timeout"``).
    kill_grace_s
        Seconds between SIGINT and SIGTERM when stopping.
    stop_event
        Set it from another thread to stop the run (status ``"interrupted"``).

    Raises
    ------
    KeyboardInterrupt
        After stopping the process tree, when the caller was interrupted (Ctrl-C).
    CaptureError
        When the program cannot be started.
    """
    argv = [str(a) for a in argv]
    lock = threading.Lock()
    started = time.monotonic()

    def emit(stream: str, text: str, overwrite: bool) -> None:
        if on_output is None:
            return
        line = OutputLine(
            step, stream, text, time.monotonic() - started, overwrite, parse_progress(text, tool)
        )
        with lock:
            try:
                on_output(line)
            except Exception:  # a broken display must not break the capture
                log.exception("output callback failed")

    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    started_at = now_iso()
    # every process of the run inherits the marker, so one that leaves the tree is still found
    run_id = f"{os.getpid()}-{time.time_ns()}-{threading.get_ident()}"
    child_env = {**(os.environ if env is None else env), RUN_ID_VARIABLE: run_id}
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=child_env,
            stdin=subprocess.DEVNULL,
            stdout=out_w,
            stderr=err_w,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        for fd in (out_r, out_w, err_r, err_w):
            os.close(fd)
        msg = f"cannot start {argv[0]!r}: {exc.strerror or exc}; check the program name and that it is executable"
        raise CaptureError(msg) from exc
    status: str | None = None
    signals: list[str] = []
    interrupted: str | None = None
    deadline = started + timeout_s if timeout_s else None
    readers: list[_Reader] = []
    # from here on the program runs: an interrupt (Ctrl-C, SIGTERM, SIGHUP), even one that comes
    # before the readers are started, stops its tree (it was left running when it came earlier)
    try:
        os.close(out_w)
        os.close(err_w)
        readers = [
            _Reader(out_r, "stdout", _path(stdout_path), emit),
            _Reader(err_r, "stderr", _path(stderr_path), emit),
        ]
        for reader in readers:
            reader.start()
        while proc.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                status = "timeout"
                break
            if stop_event is not None and stop_event.is_set():
                status = "interrupted"
                break
            time.sleep(0.05)
        else:
            if group_members(proc.pid) or marked(run_id):  # processes the program left behind: stop them too
                signals = kill_tree(proc, min(kill_grace_s, 5.0), run_id)
    except KeyboardInterrupt as exc:
        status = "interrupted"
        interrupted = getattr(exc, "signame", None) or "SIGINT"
    if status is not None:
        log.info("stopping %s (%s)", argv[0], status)
        with signals_deferred():  # a second Ctrl-C (or SIGTERM) must not cut the stop short
            signals = kill_tree(proc, kill_grace_s, run_id)
    proc.wait()
    for reader in readers:
        reader.join(timeout=10)
    wall_s = time.monotonic() - started
    returncode = proc.returncode
    result = ProcessResult(
        argv=tuple(argv),
        returncode=returncode,
        status=status or ("ok" if returncode == 0 else "failed"),
        wall_s=round(wall_s, 3),
        started_at=started_at,
        ended_at=now_iso(),
        pid=proc.pid,
        lines=sum(r.lines for r in readers),
        signals_sent=tuple(signals),
    )
    if interrupted:
        raise _Interrupted(result, interrupted)
    return result


#: Signals that stop a capture the way Ctrl-C does (the program's tree is stopped, the run recorded).
STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Ignore :data:`STOP_SIGNALS` inside the block (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived: handled like Ctrl-C (``signame`` says which)."""

    def __init__(self, signame: str) -> None:
        super().__init__(signame)
        self.signame = signame


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into :class:`Terminated` inside the block (main thread only), so a
    capture killed by a scheduler or a closed terminal stops its program tree and records why."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise Terminated(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS if sig != signal.SIGINT}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class _Interrupted(KeyboardInterrupt):
    """A KeyboardInterrupt that carries how the stopped process ended."""

    def __init__(self, result: ProcessResult, signame: str = "SIGINT") -> None:
        super().__init__("interrupted")
        self.result = result
        self.signame = signame


def _path(value: str | Path | None) -> Path | None:
    return Path(value) if value is not None else None
