"""Running an experiment: pre-flight, its own folder, the profiler steps, and the record of it all.

Each run writes ``<out>/<name>_<mode>_<timestamp>/`` (a new suffix rather than overwriting):

``experiment.json`` (command, options, tools, times, status, exit codes), ``config.yaml`` (the
resolved configuration), ``command.txt`` (the exact command lines), ``env.json`` (CUDA_*, NCCL_*,
RANK… as the program saw them), ``gpu.json`` (nvidia-smi), ``<step>.stdout.log`` /
``<step>.stderr.log``, the reports (``.nsys-rep`` + ``.sqlite``, ``.ncu-rep`` + ``.raw.csv``,
mode ``torch``: ``<host>_<pid>[.rank<RANK>].pt.trace.json.gz`` per process) and ``summary.json``.
"""

from __future__ import annotations

import platform
import re
import shlex
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracekit.capture import commands as cmds
from tracekit.capture import handoff, preflight, summary
from tracekit.capture.handoff import handoff_passes
from tracekit.capture.options import Experiment, NcuOptions, NsysOptions, TorchOptions
from tracekit.capture.output import OutputLine, as_callback, target_exit_code
from tracekit.capture.prepare import (
    environment_snapshot,
    experiment_folder,
    gpu_info,
    preflight_check,
    profiler_command,
    program_env,
    write_json,
)
from tracekit.capture.runner import (
    ProcessResult,
    _Interrupted,
    now_iso,
    run_process,
    signals_deferred,
    stop_on_signals,
)
from tracekit.errors import CaptureError
from tracekit.tools import Tool

OnOutput = Callable[[OutputLine], None]
__all__ = ["ExperimentResult", "handoff_passes", "ncu", "nsys", "run", "torch"]

#: The traces mode ``torch`` leaves in the experiment folder (``torch_profile.py`` names them).
TORCH_TRACES = "*.pt.trace.json.gz"


@dataclass
class ExperimentResult:
    """What a capture left behind.

    Attributes
    ----------
    folder
        The experiment folder.
    status
        ``"complete"``, ``"partial"`` (mode ``nsys+ncu``: a handed-over kernel got no profiled
        launch; ``handoff["missing"]`` names it), ``"failed"``, ``"timeout"``,
        ``"interrupted"`` or ``"error"``.
    target_exit_code
        The profiled program's exit code (``None`` when unknown).
    profiler_exit_code
        The last profiler's own exit code (``None`` in mode ``none``).
    reports
        Report files by kind: ``nsys``, ``sqlite``, ``ncu``, ``csv``, ``torch`` (lists of paths).
    summary
        The content of ``summary.json``.
    error
        Why the capture produced nothing usable, if it did not.
    """

    folder: Path
    experiment: Experiment
    status: str = "incomplete"
    target_exit_code: int | None = None
    target_exit_code_source: str | None = None
    profiler_exit_code: int | None = None
    wall_s: float | None = None
    program_wall_s: float | None = None
    started_at: str = ""
    ended_at: str | None = None
    reports: dict[str, list[Path]] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    tools: dict[str, dict[str, str | None]] = field(default_factory=dict)
    handoff: dict[str, Any] | None = None

    @property
    def complete(self) -> bool:
        """Whether every step finished and the program exited 0."""
        return self.status == "complete"

    def open(self, kind: str | None = None, index: int = 0) -> Any:
        """Open a report of this capture with :func:`tracekit.open` (``kind``: sqlite, nsys, ncu
        or torch; by default torch in mode ``torch``, else sqlite).

        Mode ``torch`` with several traces (one per torchrun rank) opens them all with
        :func:`tracekit.open_many` (``index`` then picks nothing)."""
        import tracekit

        kind = kind or ("torch" if self.experiment.mode == "torch" else "sqlite")
        paths = self.reports.get(kind) or []
        if kind == "torch" and len(paths) > 1:
            return tracekit.open_many(paths)
        if index >= len(paths):
            msg = f"this capture has no {kind} report #{index} (it has: {', '.join(self.reports) or 'none'})"
            raise CaptureError(msg)
        return tracekit.open(paths[index])

    def to_dict(self) -> dict[str, Any]:
        """The record written to ``experiment.json``."""
        from tracekit import __version__

        exp = self.experiment
        return {
            "tracekit_version": __version__,
            "name": exp.display_name,
            "mode": exp.mode,
            "status": self.status,
            "complete": self.complete,
            "error": self.error,
            "command": list(exp.command),
            "command_line": shlex.join(exp.command),
            "cwd": str(Path(exp.cwd or ".").resolve()),
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "wall_s": self.wall_s,
            "program_wall_s": self.program_wall_s,
            "target_exit_code": self.target_exit_code,
            "target_exit_code_source": self.target_exit_code_source,
            "profiler_exit_code": self.profiler_exit_code,
            "tools": self.tools,
            "steps": self.steps,
            "reports": {k: [p.name for p in v] for k, v in self.reports.items()},
            "handoff": self.handoff,
            "warnings": self.warnings,
            "host": socket.gethostname(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "options": exp.to_dict(),
        }


def _exit_reason(code: int | None) -> str | None:
    """What a failing exit code of the program says: a signal for codes 129–159 (the shell's
    128 + N, as nsys passes it through) and for -N (a direct child killed by signal N), else
    the code."""
    import signal

    if code is None or code == 0:
        return None
    number = -code if code < 0 else (code - 128 if 128 < code < 160 else None)  # a direct child: -N
    if number is not None:
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        how = " (killed from outside, or by the out-of-memory killer)" if name == "SIGKILL" else ""
        return f"the program was ended by {name} (exit code {code}){how}"
    return f"the program exited with code {code}"


def _natural(name: str) -> list[Any]:
    """Sort key: ``rank2`` before ``rank10``."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _no_trace_reason(res: ProcessResult, said: Sequence[str]) -> str:
    """Why mode ``torch`` found no trace, as one line: stopped, the profiler did not start, the
    program failed, or it never imported torch / left through ``os._exit``."""
    if res.status in ("timeout", "interrupted"):
        return f"the program was stopped ({res.status}) before it wrote a torch.profiler trace"
    hook = [n for n in said if not n.startswith("torch.profiler trace written")]
    if hook:  # the start-up hook said why: the profiler did not start, nothing was recorded …
        return f"no torch.profiler trace: {hook[0]}"
    if res.returncode not in (0, None):
        reason = _exit_reason(res.returncode) or f"the program exited with code {res.returncode}"
        return f"{reason} before a torch.profiler trace was written; see torch.stderr.log"
    return ("the program wrote no torch.profiler trace: it never imported torch (is it a Python program using "
            "PyTorch?), or it left through os._exit, which skips the exit hook that writes a whole-run trace "
            "(--steps 0, or fewer optimizer steps than the schedule); see torch.stderr.log")


def _killed_by(res: ProcessResult) -> str | None:
    """The signal that ended a profiler on its own (``SIGKILL``), or ``None``: it exited, or
    tracekit stopped it (timeout, interrupt)."""
    import signal

    rc = res.returncode
    if rc is None or rc >= 0 or res.status in ("timeout", "interrupted"):
        return None
    try:
        return f"{signal.Signals(-rc).name} (signal {-rc})"
    except ValueError:
        return f"signal {-rc}"


class _Run:
    """The mutable state of one experiment while it runs."""

    def __init__(
        self,
        exp: Experiment,
        folder: Path,
        tools: dict[str, Tool],
        env: dict[str, str],
        on_output: OnOutput | None,
        stop_event: threading.Event | None,
    ) -> None:
        self.exp, self.folder, self.tools, self.env = exp, folder, tools, env
        self.on_output, self.stop_event = on_output, stop_event
        self.result = ExperimentResult(folder=folder, experiment=exp, started_at=now_iso())
        self.result.tools = {
            k: {"path": str(t.path), "version": t.version} for k, t in tools.items()
        }
        self.kernel_frames: list[Any] = []
        self.t0 = time.monotonic()

    def save(self) -> None:
        write_json(self.folder / "experiment.json", self.result.to_dict())

    def step(
        self,
        name: str,
        argv: list[str],
        *,
        tool: str | None,
        profiled: bool = True,
        stdout_name: str | None = None,
    ) -> ProcessResult:
        with (self.folder / "command.txt").open("a") as fh:
            fh.write(f"# {name}\n{shlex.join(argv)}\n")
        stdout = self.folder / (stdout_name or f"{name}.stdout.log")
        record: dict[str, Any] = {
            "step": name,
            "argv": argv,
            "status": "running",
            "started_at": now_iso(),
            "stdout": stdout.name,
            "stderr": f"{name}.stderr.log",
        }
        self.result.steps.append(record)
        self.save()
        try:
            res = run_process(
                argv,
                cwd=self.exp.cwd,
                env=self.env,
                stdout_path=stdout,
                stderr_path=self.folder / f"{name}.stderr.log",
                on_output=self.on_output if profiled else None,
                step=name,
                tool=tool,
                timeout_s=self.exp.timeout_s if profiled else 3600,
                kill_grace_s=self.exp.kill_grace_s,
                stop_event=self.stop_event,
            )
        except _Interrupted as exc:
            record.update(self._record(exc.result))
            raise
        record.update(self._record(res))
        return res

    @staticmethod
    def _record(res: ProcessResult) -> dict[str, Any]:
        return {
            "status": res.status,
            "returncode": res.returncode,
            "wall_s": res.wall_s,
            "started_at": res.started_at,
            "ended_at": res.ended_at,
            "signals_sent": list(res.signals_sent),
        }

    def lines(self, name: str) -> list[str]:
        text: list[str] = []
        for stream in ("stdout", "stderr"):
            path = self.folder / f"{name}.{stream}.log"
            if path.exists():
                text += path.read_text(errors="replace").replace("\r", "\n").splitlines()
        return text

    def stop_status(self, res: ProcessResult) -> bool:
        """Record a timeout/interrupt; return True when later steps must not run."""
        if res.status in ("timeout", "interrupted"):
            self.result.status = res.status
            return True
        return False

    # --- modes -----------------------------------------------------------------------------------

    def run_plain(self) -> None:
        res = self.step("run", list(self.exp.command), tool=None)
        self.result.program_wall_s = res.wall_s
        self.result.target_exit_code, self.result.target_exit_code_source = res.returncode, "direct"
        self.stop_status(res)
        self.result.summary = {"mode": "none"}

    def run_torch(self) -> None:
        """Mode ``torch``: the program itself, ``torch.profiler`` started inside each of its Python
        processes by the start-up hook (:func:`~tracekit.capture.prepare.profile_env`); then the
        traces they wrote, opened for the summary."""
        res = self.step("torch", list(self.exp.command), tool=None)
        self.result.program_wall_s = res.wall_s
        self.result.target_exit_code, self.result.target_exit_code_source = res.returncode, "direct"
        self.stop_status(res)
        traces = sorted(self.folder.glob(TORCH_TRACES), key=lambda p: _natural(p.name))
        self.result.reports["torch"] = traces
        # what the hook said (it never stops the program): the schedule not reached, no profiler…
        said = [line.strip()[len("tracekit: "):] for line in self.lines("torch") if line.startswith("tracekit: ")]
        if not traces:
            self.result.error = _no_trace_reason(res, said)
            self.result.summary["torch"] = {"error": "no trace"}
        for note in dict.fromkeys(n for n in said if not n.startswith("torch.profiler trace written")):
            if note not in (self.result.error or ""):
                self.result.warnings.append(note)
        if not traces:
            return
        found = summary.summarize_torch(traces)
        self.result.summary["torch"] = found
        if found.get("no_gpu_activity"):
            self.result.error = found["error"]
        elif found.get("error"):
            self.result.warnings.append(f"the trace did not open: {found['error']}")

    def run_nsys(self) -> bool:
        nsys = self.tools["nsys"]
        res = self.step(
            "nsys", profiler_command(self.exp, "nsys", nsys.path, self.folder), tool="nsys"
        )
        self.result.program_wall_s = res.wall_s
        stopped = self.stop_status(res)
        lines = self.lines("nsys")
        self.result.profiler_exit_code = res.returncode
        rc_source = (
            (res.returncode, "direct")
            if self.exp.per_rank
            else target_exit_code(lines, "nsys", res.returncode)
        )
        self.result.target_exit_code, self.result.target_exit_code_source = rc_source
        reports = sorted([*self.folder.glob("*.nsys-rep"), *self.folder.glob("*.qdrep")])
        self.result.reports["nsys"] = reports
        killed = _killed_by(res)
        if killed:  # nsys itself died of a signal nobody in tracekit sent
            self.result.error = (
                f"nsys was killed by {killed} after {res.wall_s:.0f} s (not by tracekit); "
                + ("its report was not written" if not reports else "its report may be incomplete")
                + ("; the program's processes it left were stopped" if res.signals_sent else "")
            )
            if not reports:
                return False
        error = preflight.nsys_outcome_error(self.folder, reports, lines)
        if error:
            self.result.error = self.result.error or error
            return False
        sqlites: list[Path] = []
        if self.exp.nsys.export_sqlite and res.status != "interrupted":
            blobs = self.exp.nsys.include_blobs
            if (
                blobs is None
            ):  # payload blobs (NCCL sizes, NVTX payloads) when this nsys can export them
                export_help = preflight.help_text(str(nsys.path), "export")
                blobs = bool(export_help.strip()) and not preflight.unsupported_flags(
                    ["--include-blobs"], export_help
                )
            for report in reports:
                sqlite = report.with_suffix(".sqlite")
                name = "export" if len(reports) == 1 else f"export-{report.stem}"
                exported = self.step(
                    name,
                    cmds.nsys_export_command(nsys.path, report, sqlite, include_blobs=blobs),
                    tool="nsys",
                    profiled=False,
                )
                if exported.returncode == 0 and sqlite.exists():
                    sqlites.append(sqlite)
                else:
                    self.result.warnings.append(
                        f"nsys export of {report.name} failed; see {name}.stderr.log"
                    )
            self.result.reports["sqlite"] = sqlites
        per_report = []
        for path in sqlites or reports:
            per_report.append(summary.summarize_nsys(path, frames=self.kernel_frames))
        self.result.summary["nsys"] = (
            summary.combine(per_report) if per_report else {"error": "no report"}
        )
        return not stopped

    def run_ncu(self) -> None:
        ncu = self.tools["ncu"]
        opts = self.exp.ncu
        res = self.step(
            "ncu", profiler_command(self.exp, "ncu", ncu.path, self.folder, opts), tool="ncu"
        )
        if self.result.program_wall_s is None:
            self.result.program_wall_s = res.wall_s
        self.stop_status(res)
        lines = self.lines("ncu")
        self.result.profiler_exit_code = res.returncode
        code, source = (
            (res.returncode, "direct")
            if self.exp.per_rank
            else target_exit_code(lines, "ncu", res.returncode)
        )
        if self.exp.mode == "ncu" or self.result.target_exit_code in (None, 0):
            self.result.target_exit_code, self.result.target_exit_code_source = code, source
        reports = sorted(self.folder.glob("*.ncu-rep"))
        self.result.reports["ncu"] = reports
        error = preflight.ncu_outcome_error(lines)
        if error or not reports:
            self.result.error = error or (
                "ncu wrote no report: no kernel passed the filters "
                "(kernel name, NVTX include/exclude, launch skip); loosen them"
            )
            return
        if opts.export_csv and res.status != "interrupted":
            self.export_ncu_csv(reports)

    def export_ncu_csv(self, reports: Sequence[Path]) -> None:
        """``ncu --import --csv --page raw`` of each report, and the ncu summary from them."""
        ncu = self.tools["ncu"]
        csvs, tops = [], []
        for report in reports:
            csv_path = report.with_suffix(".raw.csv")
            name = "csv" if len(reports) == 1 else f"csv-{report.stem}"
            done = self.step(
                name,
                cmds.ncu_csv_command(ncu.path, report),
                tool="ncu",
                profiled=False,
                stdout_name=csv_path.name,
            )
            if done.returncode == 0:
                csvs.append(csv_path)
                tops.append(summary.summarize_ncu_csv(csv_path))
        self.result.reports["csv"] = csvs
        self.result.summary["ncu"] = tops[0] if len(tops) == 1 else {"reports": tops}

    def run_handoff(self) -> None:
        """Mode ``nsys+ncu``: one ncu pass per top kernel, then the launches each one got."""
        ncu = self.tools["ncu"]
        info: dict[str, Any] = {}
        self.result.handoff = info
        try:
            passes = handoff_passes(
                self.exp,
                self.result.summary.get("nsys", {}),
                self.kernel_frames,
                compute_capability=handoff.gpu_compute_capability(
                    self.result.reports.get("sqlite") or []
                ),
                info=info,
                reports=self.result.reports.get("sqlite") or [],
            )
        except CaptureError as exc:  # nothing to hand over: the nsys half stays usable
            self.result.error = str(exc)
            return
        by_pass: dict[int, list[Path]] = {}
        done: list[handoff.HandoffPass] = []
        stopped = False
        for p in passes:
            before = set(self.folder.glob("*.ncu-rep"))
            argv = profiler_command(self.exp, "ncu", ncu.path, self.folder, p.options)
            res = self.step(p.step, argv, tool="ncu")
            done.append(p)
            by_pass[p.index] = sorted(set(self.folder.glob("*.ncu-rep")) - before)
            lines = self.lines(p.step)
            self.result.profiler_exit_code = res.returncode
            code, source = (
                (res.returncode, "direct")
                if self.exp.per_rank
                else target_exit_code(lines, "ncu", res.returncode)
            )
            if self.result.target_exit_code in (None, 0):
                self.result.target_exit_code, self.result.target_exit_code_source = code, source
            error = preflight.ncu_outcome_error(lines)
            if error:
                self.result.error = error
            stopped = self.stop_status(res)
            if error or stopped:
                break
        reports = sorted(self.folder.glob("*.ncu-rep"))
        self.result.reports["ncu"] = reports
        records = handoff.launch_records(done, by_pass)
        info["passes"] = records
        info["not_run"] = [p.kernel for p in passes[len(done) :]]
        self.result.summary["handoff"] = {
            r["kernel"] or "(user filter)": r["profiled_launches"] for r in records
        }
        if not reports and self.result.error is None:
            self.result.error = (
                "ncu wrote no report in any handoff pass: no launch of the top kernels passed "
                "the filters (NVTX include/exclude, launch skip); loosen them"
            )
        missing = handoff.missing_kernels(records)
        if missing and not stopped:
            info["missing"] = missing
            self.result.warnings.append(
                f"ncu profiled no launch of {', '.join(missing)}; see the ncu-<pass> logs "
                "(the kernel may not run inside the NVTX include, or fewer times than --launch-skip)"
            )
        if reports and self.exp.ncu.export_csv and not stopped:
            self.export_ncu_csv(reports)

    def keep_written_reports(self) -> list[str]:
        """Record the reports a stopped profiler wrote (nsys writes its report after SIGINT, as
        after Ctrl-C in a terminal) under ``reports``; their file names."""
        kinds = {"nsys": ("*.nsys-rep", "*.qdrep"), "sqlite": ("*.sqlite",), "ncu": ("*.ncu-rep",),
                 "torch": (TORCH_TRACES,)}
        names: list[str] = []
        for kind, patterns in kinds.items():
            found = sorted(p for pattern in patterns for p in self.folder.glob(pattern))
            if found:
                self.result.reports[kind] = sorted(set(self.result.reports.get(kind, [])) | set(found))
                names += [p.name for p in found]
        return names

    def finish(self) -> None:
        res = self.result
        res.ended_at = now_iso()
        res.wall_s = round(time.monotonic() - self.t0, 3)
        if res.status == "incomplete":
            failed = (
                res.error
                or (res.target_exit_code not in (0, None))
                or any(s.get("returncode") not in (0, None) for s in res.steps)
            )
            partial = bool(res.handoff and res.handoff.get("missing"))
            res.status = "failed" if failed else ("partial" if partial else "complete")
            reason = _exit_reason(res.target_exit_code) if res.status == "failed" else None
            if reason and reason not in res.warnings:  # said, not an error: the reports are usable
                res.warnings.append(reason)
        res.summary.setdefault("mode", self.exp.mode)
        res.summary.update(
            status=res.status,
            wall_s=res.wall_s,
            program_wall_s=res.program_wall_s,
            target_exit_code=res.target_exit_code,
        )
        write_json(self.folder / "summary.json", res.summary)
        self.save()


def run(
    experiment: Experiment,
    *,
    on_output: OnOutput | Any = None,
    stop_event: threading.Event | None = None,
    check: bool = True,
    system_checks: bool = True,
) -> ExperimentResult:
    """Run ``experiment``: pre-flight, a new folder, the profiler steps, exports, summary.

    Parameters
    ----------
    experiment
        What to run (see :class:`~tracekit.capture.options.Experiment`).
    on_output
        Where the live output goes: a callable taking an
        :class:`~tracekit.capture.output.OutputLine`, a rich ``Console``, or a widget with
        ``append_stdout``.
    stop_event
        Set from another thread to stop the run (the folder is kept, status ``interrupted``).
    check
        Raise :class:`CaptureError` when the profiler produced no usable report.
    system_checks
        Check the machine before starting (nsys importer libraries, counter permission);
        ``False`` skips those checks, to see what the profiler itself does.

    Returns
    -------
    ExperimentResult
        The folder, status, exit codes, reports and summary.

    Raises
    ------
    CaptureError, ToolNotFoundError
        A pre-flight check failed (nothing was started), or with ``check`` the capture failed.
    KeyboardInterrupt
        After the process tree was stopped and the folder marked ``interrupted``.
    """
    exp = experiment
    env = program_env(exp)
    tools, notes = preflight_check(exp, env, system_checks=system_checks)
    folder = experiment_folder(exp.out, exp.display_name, exp.mode)
    if exp.mode == "torch":  # the traces go to the folder, named absolutely: the program has its own cwd
        env = program_env(exp, folder.resolve())
    state = _Run(exp, folder, tools, env, as_callback(on_output), stop_event)
    state.result.warnings += notes
    import yaml

    (folder / "config.yaml").write_text(yaml.safe_dump(exp.to_dict(), sort_keys=False))
    write_json(folder / "env.json", environment_snapshot(env))
    write_json(folder / "gpu.json", gpu_info())
    state.save()
    try:
        with stop_on_signals():  # SIGTERM/SIGHUP stop the program tree as Ctrl-C does
            if exp.mode == "none":
                state.run_plain()
            elif exp.mode == "torch":
                state.run_torch()
            else:
                go_on = True
                if exp.mode in ("nsys", "nsys+ncu"):
                    go_on = state.run_nsys() and state.result.error is None
                if exp.mode == "ncu":
                    state.run_ncu()
                elif exp.mode == "nsys+ncu" and go_on:
                    state.run_handoff()
    except KeyboardInterrupt as exc:
        state.result.status = "interrupted"
        signame = getattr(exc, "signame", "SIGINT")
        kept = state.keep_written_reports()
        state.result.error = f"stopped by {signame}; the program's processes were stopped too" + (
            f"; the profiler wrote {', '.join(kept)} before it stopped" if kept else "; no report was written")
        with signals_deferred():  # recording the outcome is not cut short by a second signal
            state.finish()
        raise
    except Exception as exc:
        state.result.status = "error"
        state.result.error = (
            str(exc) if isinstance(exc, CaptureError) else f"{type(exc).__name__}: {exc}"
        )
        state.finish()
        raise
    state.finish()
    if check and state.result.error:
        raise CaptureError(f"{state.result.error} (folder: {folder})")
    return state.result


def nsys(
    command: list[str] | str, options: NsysOptions | None = None, **experiment: Any
) -> ExperimentResult:
    """Profile ``command`` with Nsight Systems; ``experiment`` takes :class:`Experiment` fields.

    Examples
    --------
    >>> result = nsys(["python3", "decode.py"], NsysOptions(capture_range="cudaProfilerApi"),
    ...               out="experiments")  # doctest: +SKIP
    >>> result.summary["nsys"]["top_kernels"][0]["name"]  # doctest: +SKIP
    """
    on_output = experiment.pop("on_output", None)
    exp = Experiment(command=command, mode="nsys", nsys=options or NsysOptions(), **experiment)  # type: ignore[arg-type]
    return run(exp, on_output=on_output)


def ncu(
    command: list[str] | str, options: NcuOptions | None = None, **experiment: Any
) -> ExperimentResult:
    """Profile ``command`` with Nsight Compute; ``experiment`` takes :class:`Experiment` fields."""
    on_output = experiment.pop("on_output", None)
    exp = Experiment(command=command, mode="ncu", ncu=options or NcuOptions(), **experiment)  # type: ignore[arg-type]
    return run(exp, on_output=on_output)


def torch(
    command: list[str] | str, options: TorchOptions | None = None, **experiment: Any
) -> ExperimentResult:
    """Run ``command`` unmodified under ``torch.profiler`` (mode ``torch``); ``experiment`` takes
    :class:`Experiment` fields.

    Every Python process of the program that imports ``torch`` (each torchrun worker, not the
    launcher) writes ``<host>_<pid>[.rank<RANK>].pt.trace.json.gz`` into the experiment folder:
    ``options.skip`` optimizer steps waited, ``options.steps`` recorded (``0``: the whole run).
    ``result.open()`` opens the trace (several ranks: :func:`tracekit.open_many`).

    Examples
    --------
    >>> result = torch(["python3", "train.py"], TorchOptions(skip=3, steps=5), out="experiments")  # doctest: +SKIP
    >>> result.reports["torch"]  # doctest: +SKIP
    >>> trace = result.open()  # doctest: +SKIP
    """
    on_output = experiment.pop("on_output", None)
    check = experiment.pop("check", True)
    exp = Experiment(command=command, mode="torch", torch=options or TorchOptions(), **experiment)  # type: ignore[arg-type]
    return run(exp, on_output=on_output, check=check)
