"""The profilers' console output: progress lines, the target's exit code, known failures, displays.

nsys prints progress bars (``Processing [====48%   ]``, ``[1/1] [====100%] report.nsys-rep``),
ncu one line per profiled kernel (``==PROF== Profiling "gemm" - 3: 0%....50%....100% - 20
passes``). Both report the profiled program's exit status in their own words; this module reads
it so that the target's exit code can be recorded apart from the profiler's.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Progress:
    """A progress report parsed from a profiler line: what it is doing and, if said, how far."""

    phase: str
    percent: int | None = None
    count: int | None = None


@dataclass(frozen=True)
class OutputLine:
    """One line of a running step's output.

    Attributes
    ----------
    step
        The step that printed it (``"run"``, ``"nsys"``, ``"export"``, ``"ncu"``…).
    stream
        ``"stdout"`` or ``"stderr"``.
    text
        The line, without its line ending.
    elapsed_s
        Seconds since the step started.
    overwrite
        The line ended with a bare carriage return: a progress bar redrawing itself.
    progress
        What :func:`parse_progress` read from the line, if anything.
    """

    step: str
    stream: str
    text: str
    elapsed_s: float
    overwrite: bool = False
    progress: Progress | None = None


_BAR = re.compile(r"^(?P<phase>.*?)\s*\[[=\s]*(?P<pct>\d{1,3})%[=\s]*\]\s*(?P<tail>.*)$")
_NCU_KERNEL = re.compile(r'==PROF== Profiling "(?P<name>.*)" - (?P<idx>\d+): (?P<rest>.*)')
_NSYS_PHASES = (
    "Collecting data", "Processing events", "Capture range started", "Capture range ended",
    "Generating", "Generated", "Importing", "Exporting", "Saving temporary", "Creating final output",
)  # fmt: skip


def parse_progress(text: str, tool: str | None) -> Progress | None:
    """Read a progress report from one line of nsys or ncu output (``None`` if it holds none).

    Examples
    --------
    >>> parse_progress("Processing [=============48%          ]", "nsys")
    Progress(phase='Processing', percent=48, count=None)
    >>> parse_progress('==PROF== Profiling "gemm" - 3: 0%....50%....100% - 20 passes', "ncu")
    Progress(phase='profiling gemm', percent=100, count=4)
    """
    if tool == "nsys":
        match = _BAR.match(text.strip())
        if match:
            phase = match.group("phase").strip() or "processing"
            if phase.startswith("[") and match.group("tail"):  # "[1/1] [===100%] report.nsys-rep"
                phase = f"{phase} {match.group('tail').strip()}"
            return Progress(phase, min(int(match.group("pct")), 100))
        stripped = text.strip()
        for phase in _NSYS_PHASES:
            if stripped.startswith(phase):
                return Progress(stripped.rstrip(".:"))
    elif tool == "ncu":
        match = _NCU_KERNEL.search(text)
        if match:
            percents = re.findall(r"(\d{1,3})%", match.group("rest"))
            return Progress(
                f"profiling {match.group('name')}",
                int(percents[-1]) if percents else None,
                int(match.group("idx")) + 1,
            )
    return None


_NSYS_EXIT = (
    re.compile(r"returned non-zero exit code[:\s(]*(-?\d+)"),
    re.compile(r"(?:application|process) exited with (?:exit )?code[:\s(]*(-?\d+)"),
)
_SIGNAL = re.compile(r"terminated with signal (\d+)")
_NCU_EXIT = re.compile(r"==ERROR== The application returned an error code \((-?\d+)\)")


def target_exit_code(
    lines: Iterable[str], tool: str, profiler_rc: int | None
) -> tuple[int | None, str]:
    """The profiled program's exit code, read from the profiler's output.

    Returns ``(code, source)``; ``source`` says how it was found: ``"reported"`` (the profiler
    printed it), ``"signal"`` (the program died of signal N: code ``128 + N``), ``"clean"``
    (the profiler exited 0 and reported no failure: 0), ``"profiler"`` (nsys passes the
    program's code through as its own) or ``"unknown"``.

    Examples
    --------
    >>> target_exit_code(["==ERROR== The application returned an error code (3)."], "ncu", 0)
    (3, 'reported')
    >>> target_exit_code(["The target application terminated with signal 11 (SIGSEGV)"], "nsys", 0)
    (139, 'signal')
    """
    codes: list[tuple[int, str]] = []
    for line in lines:
        patterns = _NSYS_EXIT if tool == "nsys" else (_NCU_EXIT,)
        for pattern in patterns:
            match = pattern.search(line)
            if match:
                codes.append((int(match.group(1)), "reported"))
        match = _SIGNAL.search(line)
        if match:
            codes.append((128 + int(match.group(1)), "signal"))
    failing = [c for c in codes if c[0] != 0]
    if failing:
        return failing[-1]
    if codes:
        return codes[-1]
    if profiler_rc == 0:
        return 0, "clean"
    if tool == "nsys" and profiler_rc is not None and profiler_rc > 0:
        return profiler_rc, "profiler"
    return None, "unknown"


# --- where the lines go ---------------------------------------------------------------------------


class ConsoleReporter:
    """Show a step's output on a rich console: each line as printed, a status line with progress.

    Use it as the ``on_output`` callback inside ``with reporter:``; redrawn progress bars update
    the status line instead of filling the screen.

    Parameters
    ----------
    console
        A ``rich.console.Console``; a new one on stderr if omitted.
    echo
        Print the program's own lines (otherwise only the status line moves).
    """

    def __init__(self, console: Any = None, *, echo: bool = True) -> None:
        from rich.console import Console

        self.console = console if console is not None else Console(stderr=True)
        self.echo = echo
        self._status: Any = None
        self._phase = ""
        self._step = ""
        self._started = time.monotonic()

    def __enter__(self) -> ConsoleReporter:
        self._status = self.console.status("starting…")
        self._status.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._status is not None:
            self._status.__exit__(*exc)
            self._status = None

    def __call__(self, line: OutputLine) -> None:
        if line.step != self._step:
            self._step, self._phase = line.step, ""
        if line.progress is not None:
            pct = f" {line.progress.percent}%" if line.progress.percent is not None else ""
            count = f" (#{line.progress.count})" if line.progress.count is not None else ""
            self._phase = f"{line.progress.phase}{pct}{count}"
        if self._status is not None:
            self._status.update(f"[bold]{line.step}[/bold] {line.elapsed_s:6.1f} s  {self._phase}")
        if self.echo and not line.overwrite and line.text.strip():
            style = "dim" if line.stream == "stderr" else None
            self.console.print(
                f"[{line.step}] {line.text}", style=style, markup=False, highlight=False
            )


class WidgetReporter:
    """Append a step's output to a notebook widget with ``append_stdout`` (an ``ipywidgets.Output``)."""

    def __init__(self, widget: Any) -> None:
        self.widget = widget

    def __call__(self, line: OutputLine) -> None:
        if not line.overwrite:
            self.widget.append_stdout(f"[{line.step} {line.elapsed_s:6.1f}s] {line.text}\n")


def as_callback(target: Any) -> Callable[[OutputLine], None] | None:
    """Turn a callable, a rich ``Console`` or a widget with ``append_stdout`` into an output callback."""
    if target is None:
        return None
    if callable(target):
        return target  # type: ignore[no-any-return]
    if hasattr(target, "append_stdout"):
        return WidgetReporter(target)
    if hasattr(target, "print") and hasattr(target, "status"):
        return ConsoleReporter(target)
    msg = f"on_output must be a callable, a rich Console or a widget with append_stdout, not {type(target).__name__}"
    raise TypeError(msg)
