"""Loading an ``.ncu-rep`` in a child process, so that a crash of ``ncu_report`` is one error.

``ncu_report`` aborts the whole process (SIGABRT from a failed protobuf check) on some damaged
files, e.g. a result whose length prefix was bit-flipped: in a notebook the kernel dies with
the user's work. :class:`IsolatedReport` runs ``python -m tracekit.ncu._child`` (argument
list, no shell), which reads the tables with the same :class:`~tracekit.ncu.binary.BinaryReport`
code and writes them as Arrow IPC files into a private temporary folder; the parent reads
them back and never touches ``ncu_report``. A child killed by a signal becomes one
:class:`~tracekit.errors.TraceFormatError` line.

When to isolate: ``NcuReport.from_path(isolate=…)`` or ``TRACEKIT_NCU_ISOLATE`` (``1``,
``0``, ``auto``); ``auto`` (default) isolates only reports whose container walk failed, the
only ones that crashed ``ncu_report`` in the flip campaigns (``docs/ncu.md``, "Damaged reports").
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Literal

import polars as pl

from tracekit.errors import TraceFormatError, TracekitError
from tracekit.ncu.damage import ncu_messages

__all__ = ["IsolateMode", "IsolatedReport", "isolate_mode"]

IsolateMode = Literal["always", "never", "auto"]
ENV = "TRACEKIT_NCU_ISOLATE"
_ENV_VALUES: dict[str, IsolateMode] = {
    "1": "always", "true": "always", "yes": "always", "always": "always",
    "0": "never", "false": "never", "no": "never", "never": "never",
    "auto": "auto", "": "auto",
}  # fmt: skip


def isolate_mode(isolate: bool | str | None) -> IsolateMode:
    """``isolate`` (``True``/``False``/``"auto"``), else ``TRACEKIT_NCU_ISOLATE``, else ``"auto"``."""
    if isinstance(isolate, bool):
        return "always" if isolate else "never"
    value = isolate if isolate is not None else os.environ.get(ENV, "auto")
    mode = _ENV_VALUES.get(str(value).strip().lower())
    if mode is None:
        source = "isolate=" if isolate is not None else f"{ENV}="
        msg = f"{source}{value!r} is not understood; use 1 (always), 0 (never) or auto"
        raise TracekitError(msg)
    return mode


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _last_ncu_line(stderr: str) -> str:
    """The most telling line ncu_report wrote before dying (a failed check or parse error)."""
    found = ncu_messages(stderr.splitlines())
    if found:
        return found[-1][:200]
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip() and not ln.startswith("***")]
    return lines[-1][:200] if lines else ""


def run_child(
    path: Path, tables: list[str], *, instances: list[str] | None = None
) -> dict[str, Any]:
    """Run the child on ``path``; return its result dict with the frames read back.

    ``tables`` from ``identity``, ``launch``, ``metrics``, ``rules``, ``instances``.
    """
    with tempfile.TemporaryDirectory(prefix="tracekit-ncu-") as tmp:
        out = Path(tmp)
        # absolute paths and the private folder as working directory: ``python -m`` puts the
        # working directory first on sys.path, where another tracekit could be lying around
        args = [sys.executable, "-m", "tracekit.ncu._child", str(path.resolve()), str(out), *tables]
        if instances is not None:
            (out / "wanted.json").write_text(json.dumps(instances))
        env = {**os.environ, "PYTHONPATH": _pythonpath()}
        limit_s = _timeout_s()
        try:
            proc = subprocess.run(
                args, capture_output=True, text=True, errors="replace", env=env, cwd=out, check=False,
                timeout=limit_s,
            )
        except subprocess.TimeoutExpired:  # run() has killed the child
            msg = (
                f"{path}: the process reading this report did not finish in {limit_s:g} s "
                f"({TIMEOUT_VARIABLE}); ncu_report may hang on a damaged file: capture it again, or "
                f"raise {TIMEOUT_VARIABLE} for a very large report"
            )
            raise TraceFormatError(msg) from None
        result_file = out / "result.json"
        if proc.returncode < 0:
            detail = _last_ncu_line(proc.stderr)
            msg = (
                f"{path}: ncu_report crashed ({_signal_name(proc.returncode)}) reading this report, "
                f"so it is damaged{f' ({detail})' if detail else ''}; capture it again or copy the "
                "whole file"
            )
            raise TraceFormatError(msg)
        if not result_file.exists():
            detail = _last_ncu_line(proc.stderr)
            msg = (
                f"{path}: the process loading this report failed (exit {proc.returncode}"
                f"{f': {detail}' if detail else ''}); run with TRACEKIT_NCU_ISOLATE=0 to see the error"
            )
            raise TraceFormatError(msg)
        result: dict[str, Any] = json.loads(result_file.read_text())
        if "error" in result:
            from tracekit import errors

            cls = getattr(errors, result.get("kind", ""), None)
            if not (isinstance(cls, type) and issubclass(cls, TracekitError)):
                cls = TraceFormatError
            raise cls(result["error"])
        result["problems"] = (
            list(result.get("problems", [])) + ncu_messages(proc.stderr.splitlines())[:1]
        )
        for category, message in result.get("warnings", []):
            warnings.warn(message, _warning_class(category), stacklevel=4)
        # read into memory: the folder is deleted on return, and a mapped file must not outlive it
        frames = {
            name: pl.read_ipc(io.BytesIO((out / f"{name}.arrow").read_bytes()))
            for name in result.get("tables", [])
        }
        result["frames"] = frames
        return result


#: Seconds the child may take (a hang in ncu_report must not hang the caller).
TIMEOUT_VARIABLE = "TRACEKIT_NCU_ISOLATE_TIMEOUT"
DEFAULT_TIMEOUT_S = 600.0


def _timeout_s() -> float:
    raw = os.environ.get(TIMEOUT_VARIABLE, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        msg = f"{TIMEOUT_VARIABLE}={raw!r} is not a number of seconds above 0; unset it for {DEFAULT_TIMEOUT_S:g} s"
        raise TracekitError(msg)
    return value


def _pythonpath() -> str:
    """The child must import this same tracekit (a worktree or an unpacked copy, not only
    the installed one): put its parent folder first."""
    here = str(Path(__file__).resolve().parents[2])
    rest = os.environ.get("PYTHONPATH", "")
    return here + (os.pathsep + rest if rest else "")


def _warning_class(name: str) -> type[Warning]:
    """The class of a warning the child caught, by name (tracekit's, else UserWarning)."""
    from tracekit.ncu import damage

    cls = getattr(damage, name, None)
    return cls if isinstance(cls, type) and issubclass(cls, Warning) else UserWarning


class IsolatedReport:
    """The tables of one ``.ncu-rep`` read by a child process; the reading API of
    :class:`~tracekit.ncu.binary.BinaryReport` (``kernel_rows``, ``metrics``, ``instances``,
    ``rules``, ``num_results``, ``problems``, ``late_problems``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        result = run_child(path, ["identity", "launch", "metrics", "rules"])
        frames = result["frames"]
        self._identity: pl.DataFrame = frames["identity"]
        self._launch: pl.DataFrame = frames["launch"]
        self._metrics: pl.DataFrame = frames["metrics"]
        self._rules: pl.DataFrame = frames["rules"]
        self.num_results: int = int(result["num_results"])
        #: Damage the child found (its metrics table was built, so this includes the
        #: instance-value check).
        self.problems: list[str] = list(result["problems"]) + list(result["late_problems"])
        self.late_problems: list[str] = []

    def kernel_rows(self) -> tuple[list[dict[str, Any]], pl.DataFrame]:
        """Identity rows per result and the long frame of the launch metrics."""
        return self._identity.to_dicts(), self._launch

    def metrics(self) -> pl.DataFrame:
        """The long ``metrics`` table."""
        return self._metrics

    def rules(self) -> pl.DataFrame:
        """ncu's rule results."""
        return self._rules

    def instances(self, metrics: list[str] | None = None) -> pl.DataFrame:
        """Instance values, read by another child run (only when asked for)."""
        result = run_child(self.path, ["instances"], instances=metrics)
        frame: pl.DataFrame = result["frames"]["instances"]
        return frame
