"""Telling a damaged ``.ncu-rep`` from a good one after ``ncu_report`` has read it.

``ncu_report`` does not fail on most damage: a result whose protobuf no longer parses comes
back with no name and no metrics (ncu only logs "Can't parse message …" on file descriptor 2,
past Python's ``sys.stderr``); a flipped bit in the metric-name table drops that metric from
every result; a flipped bit in an instance list drops one value. :func:`compare` sets what
``ncu_report`` handed over against what :func:`tracekit.ncu.container.walk` counted, and
:func:`capture_fd2` catches ncu's own messages.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence

from tracekit.ncu.container import ResultShape

__all__ = [
    "DamagedReportWarning",
    "IncompleteReportWarning",
    "capture_fd2",
    "compare",
    "instance_problems",
    "ncu_messages",
]

# Lines ncu_report's protobuf/absl logging writes on fd 2; the first is absl's preamble.
_NCU_LINE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog|[EWF]\d{4} |\*\*\* Check failure)"
)
_PARSE_ERROR = re.compile(r"(Can't parse message.*|Check failed.*)$")


class IncompleteReportWarning(UserWarning):
    """A report loaded, but with no profiled results."""


class DamagedReportWarning(UserWarning):
    """A report loaded with ``validate=False`` although it is damaged; ``report.damaged`` says how."""


@contextlib.contextmanager
def capture_fd2(sink: list[str]) -> Iterator[None]:
    """Catch what native code writes on file descriptor 2 while the block runs.

    ncu's lines are appended to ``sink``; anything else is written back to fd 2 afterwards,
    so other output is delayed, never lost. Without a usable fd 2 the block runs uncaptured.
    fd 2 belongs to the whole process: loads in several threads take turns (one lock), or the
    second to start would restore the first one's temporary file as fd 2.
    """
    with _FD2_LOCK:
        yield from _capture_fd2(sink)


_FD2_LOCK = threading.RLock()


def _capture_fd2(sink: list[str]) -> Iterator[None]:
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode("utf-8", "replace")
    other = []
    for line in text.splitlines(keepends=True):
        if _NCU_LINE.match(line):
            sink.append(line.rstrip("\n"))
        else:
            other.append(line)
    if other:
        with contextlib.suppress(OSError):
            os.write(2, "".join(other).encode())


def ncu_messages(lines: Sequence[str]) -> list[str]:
    """The parse errors and failed checks among ncu's fd-2 lines, without absl's prefix."""
    found = []
    for line in lines:
        match = _PARSE_ERROR.search(line)
        if match:
            found.append(match.group(1).strip())
    return found


def compare(
    shapes: Sequence[ResultShape],
    found: Sequence[tuple[str | None, int]],
    *,
    announced: int | None = None,
) -> list[str]:
    """Problems, one short sentence each, between the container and what ncu_report read.

    ``shapes`` are the container's results in file order (:attr:`Container.shapes`);
    ``found`` is ``(kernel name, number of metrics)`` per action in ncu_report's order;
    ``announced`` the result count of the block headers.
    """
    problems: list[str] = []
    expected = announced if announced is not None else len(shapes)
    if len(found) != expected:
        problems.append(f"ncu_report read {len(found)} results but the file holds {expected}")
    for index, (name, _) in enumerate(found):
        if not name:
            problems.append(f"result {index} has no kernel name (its record did not parse)")
            break
    if shapes and len(found) == len(shapes):
        counts = [count for _, count in found]
        wanted = [shape.metrics for shape in shapes]
        if counts != wanted and sorted(counts) != sorted(wanted):
            index = next(i for i, (a, b) in enumerate(zip(counts, wanted, strict=True)) if a != b)
            missing = sum(wanted) - sum(counts)
            problems.append(
                f"result {index} has {counts[index]} of its {wanted[index]} metrics "
                f"({missing} missing in all; record at byte {shapes[index].offset})"
            )
    return problems


def instance_problems(shapes: Sequence[ResultShape], counts: Sequence[int]) -> list[str]:
    """The instance-value check: ``counts`` per action against the container's per result."""
    if not shapes or len(shapes) != len(counts):
        return []
    wanted = [shape.instances for shape in shapes]
    if list(counts) == wanted or sorted(counts) == sorted(wanted):
        return []
    index = next(i for i, (a, b) in enumerate(zip(counts, wanted, strict=True)) if a != b)
    return [
        f"result {index} has {counts[index]} of its {wanted[index]} instance values "
        f"(record at byte {shapes[index].offset})"
    ]
