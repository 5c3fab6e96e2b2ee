"""Exceptions raised by tracekit: one root class, one line that says what to do."""

from __future__ import annotations


def one_line(text: str, limit: int = 200) -> str:
    """A library's message made fit for a one-line error: its first line (SQLite quotes a
    damaged schema's SQL over many lines after it), whitespace collapsed, cut at ``limit``
    characters with ``…``."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    first = " ".join(first.split())
    return first if len(first) <= limit else first[: limit - 1] + "…"


class TracekitError(Exception):
    """Root of every error tracekit raises on purpose.

    The message is one line that says what is wrong and what to do about it.
    """


class TraceNotFoundError(TracekitError, FileNotFoundError):
    """The path does not exist or is not a regular file."""


class TracePermissionError(TracekitError, PermissionError):
    """The file exists but cannot be read."""


class TraceFormatError(TracekitError, ValueError):
    """The file is not a trace tracekit can read (wrong format, truncated, corrupt)."""


class UnsupportedReportError(TracekitError, ValueError):
    """The trace lacks the data a report or analysis needs."""


class MissingDependencyError(TracekitError, ImportError):
    """An optional dependency (an extra) is not installed."""


class ToolNotFoundError(TracekitError):
    """An external tool (nsys, ncu) could not be found."""


class ExportError(TracekitError):
    """Running ``nsys export`` on a report failed."""


class TraceMemoryError(TracekitError, MemoryError):
    """Reading a table of a trace needs more memory than the process can have."""


class UnrelatedReportsError(TracekitError):
    """Reports given as the ranks of one run are not one run (:mod:`tracekit.runs`);
    ``reason`` is the line that says which report does not belong and why."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or message


class CaptureError(TracekitError):
    """Running a profiler on a program failed."""


class DamagedRowsWarning(UserWarning):
    """Rows of an export whose times cannot be right (an end before its start, no start)."""


class EmptyResultWarning(UserWarning):
    """An analysis returned no rows although its input had some; the message says why."""


class ModelConfigWarning(UserWarning):
    """A model description has fields that change the cost of a step but that the model does
    not represent (attention logit soft-capping, multi-head latent attention …); the message
    names them."""


def missing_extra(package: str, extra: str) -> MissingDependencyError:
    """Build the error for a missing optional dependency ``package`` of extra ``extra``."""
    msg = f"{package} is not installed; install it with: pip install 'tracekit[{extra}]'"
    return MissingDependencyError(msg)
