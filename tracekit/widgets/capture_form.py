"""``CaptureForm``: run a capture from a notebook without blocking the kernel.

The form builds an :class:`~tracekit.capture.options.Experiment` (command, mode, preset, extra
options as YAML) and runs :func:`tracekit.capture.run` in a background thread: the log streams
into the form, a progress bar follows the profiler's own progress lines, *Cancel* stops the
whole process tree (the folder is kept, status ``interrupted``), and when the capture is done
its report is opened (``form.trace``) and ``on_done`` callbacks run.
"""

from __future__ import annotations

import html
import shlex
import threading
import time
from collections.abc import Callable
from typing import Any

from tracekit.viz._deps import import_ipywidgets

widgets = import_ipywidgets()
import traitlets  # noqa: E402

MAX_LOG_LINES = 400


class CaptureForm(widgets.VBox):  # type: ignore[misc,name-defined]
    """A form that runs ``tracekit.capture`` and loads the result.

    Parameters
    ----------
    command
        The program to profile (a string split like a shell would, or a list).
    mode
        ``"nsys"``, ``"ncu"``, ``"nsys+ncu"`` or ``"none"`` (just run it).
    preset
        A preset of :data:`tracekit.capture.PRESETS` (``"quick"``, ``"torchrun"``…) or ``""``.
    options
        Extra experiment settings as YAML (``nsys: {gpu_metrics_devices: all}``).
    out
        Parent folder of the experiment folders.

    Traits ``command``, ``mode``, ``preset``, ``options``, ``out`` mirror the inputs;
    ``status`` is ``"idle"``, ``"running"``, ``"complete"``, ``"failed"``, ``"interrupted"``,
    ``"timeout"`` or ``"error"``; ``progress`` is 0–100. After a run, ``result`` holds the
    :class:`~tracekit.capture.experiment.ExperimentResult`, ``trace`` the opened report (or
    ``None``), ``log_lines`` the output.

    Examples
    --------
    >>> form = CaptureForm("python3 train.py --steps 20", mode="nsys", preset="quick")  # doctest: +SKIP
    >>> form  # click Run, or: form.run(); form.wait()  # doctest: +SKIP
    """

    command = traitlets.Unicode("")
    mode = traitlets.Unicode("nsys")
    preset = traitlets.Unicode("")
    options = traitlets.Unicode("")
    out = traitlets.Unicode("experiments")
    status = traitlets.Unicode("idle")
    progress = traitlets.Int(0)

    def __init__(
        self,
        command: str | list[str] = "",
        *,
        mode: str = "nsys",
        preset: str = "",
        options: str = "",
        out: str = "experiments",
        timeout_s: float | None = None,
        load: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        from tracekit.capture import MODES, PRESETS

        self.timeout_s = timeout_s
        self.load = load
        self.result: Any = None
        self.trace: Any = None
        self.error: str | None = None
        self.log_lines: list[str] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._done_callbacks: list[Callable[[CaptureForm], None]] = []
        self._lock = threading.Lock()
        self._last_flush = 0.0

        w = widgets
        wide = w.Layout(width="95%")
        self.command_box = w.Text(
            description="command", layout=wide, placeholder="python3 train.py --steps 10"
        )
        self.mode_box = w.Dropdown(options=list(MODES), description="mode")
        self.preset_box = w.Dropdown(options=[("(none)", ""), *[(f"{k} — {v.get('description', '')[:60]}", k) for k, v in PRESETS.items()]],
                                     description="preset", layout=wide)  # fmt: skip
        self.options_box = w.Textarea(description="options", placeholder="nsys: {gpu_metrics_devices: all}\ntimeout_s: 600",
                                      layout=w.Layout(width="95%", height="70px"))  # fmt: skip
        self.out_box = w.Text(description="out", layout=w.Layout(width="50%"))
        for box, trait in ((self.command_box, "command"), (self.mode_box, "mode"), (self.preset_box, "preset"),
                           (self.options_box, "options"), (self.out_box, "out")):  # fmt: skip
            w.link((box, "value"), (self, trait))
        self.run_button = w.Button(description="Run", button_style="primary", icon="play")
        self.cancel_button = w.Button(
            description="Cancel", button_style="warning", icon="stop", disabled=True
        )
        self.run_button.on_click(lambda _b: self.run())
        self.cancel_button.on_click(lambda _b: self.cancel())
        self.bar = w.IntProgress(
            value=0, min=0, max=100, description="", layout=w.Layout(width="50%")
        )
        self.status_html = w.HTML("idle")
        self.log_box = w.Textarea(
            value="", layout=w.Layout(width="95%", height="220px"), disabled=True
        )
        self.result_html = w.HTML()
        self.children = (
            self.command_box, w.HBox([self.mode_box, self.out_box]), self.preset_box, self.options_box,
            w.HBox([self.run_button, self.cancel_button, self.bar, self.status_html]), self.log_box, self.result_html,
        )  # fmt: skip

        self.command = command if isinstance(command, str) else shlex.join(command)
        self.mode = mode
        self.preset = preset
        self.options = options
        self.out = out

    # -- public API ---------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        """Whether a capture is in progress."""
        return self._thread is not None and self._thread.is_alive()

    def on_done(self, callback: Callable[[CaptureForm], None]) -> None:
        """Call ``callback(form)`` when a run ends (in the capture's thread)."""
        self._done_callbacks.append(callback)

    def experiment(self) -> Any:
        """The :class:`~tracekit.capture.options.Experiment` the form describes (validated)."""
        import yaml

        from tracekit.capture import resolve
        from tracekit.errors import CaptureError

        try:
            extra = yaml.safe_load(self.options) if self.options.strip() else {}
        except yaml.YAMLError as exc:
            msg = f"the options are not valid YAML ({str(exc).splitlines()[0]})"
            raise CaptureError(msg) from exc
        if not isinstance(extra, dict):
            msg = "the options must be a YAML mapping (nsys: {...}, ncu: {...}, timeout_s: ...)"
            raise CaptureError(msg)
        layer: dict[str, Any] = {"command": self.command, "mode": self.mode, "out": self.out}
        if self.preset:
            layer["preset"] = self.preset
        if self.timeout_s is not None:
            layer["timeout_s"] = self.timeout_s
        experiment, _sweep, _named = resolve(layer, extra)
        if self.preset and "mode" not in extra:
            experiment = experiment.replace(mode=self.mode)
        return experiment

    def run(self) -> None:
        """Start the capture in the background (returns at once)."""
        if self.running:
            return
        self.result = self.trace = self.error = None
        self.log_lines = []
        self.log_box.value = ""
        self.result_html.value = ""
        self.progress = 0
        try:
            experiment = self.experiment()
        except Exception as exc:
            self._finish("error", str(exc))
            return
        self._stop = threading.Event()
        self._set_status("running")
        self.run_button.disabled = True
        self.cancel_button.disabled = False
        self._thread = threading.Thread(
            target=self._work, args=(experiment,), name="tracekit-capture", daemon=True
        )
        self._thread.start()

    def cancel(self) -> None:
        """Stop the running capture (its process tree is ended; the folder is kept)."""
        if self.running:
            self._stop.set()
            self._append("[tracekit] cancel requested")

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the run ends; ``True`` when it has (for scripts and tests)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    # -- the work ---------------------------------------------------------------------------------------
    def _work(self, experiment: Any) -> None:
        from tracekit.capture import run

        status, error = "error", None
        try:
            self.result = run(
                experiment, on_output=self._on_output, stop_event=self._stop, check=False
            )
            status = self.result.status
            error = self.result.error
            if self.load and status == "complete":
                self.trace = self._open(self.result)
        except KeyboardInterrupt:
            status = "interrupted"
        except Exception as exc:  # shown in the form; the notebook goes on
            error = (
                f"{type(exc).__name__}: {exc}"
                if not hasattr(exc, "args") or not str(exc)
                else str(exc)
            )
        if self._stop.is_set() and status not in ("complete",):
            status = "interrupted"
        self._finish(status, error)

    @staticmethod
    def _open(result: Any) -> Any:
        for kind in ("sqlite", "ncu"):
            if result.reports.get(kind):
                return result.open(kind)
        return None

    def _on_output(self, line: Any) -> None:
        if line.progress is not None and line.progress.percent is not None:
            self.progress = int(line.progress.percent)
        if line.overwrite or not line.text.strip():
            return
        self._append(f"[{line.step} {line.elapsed_s:6.1f}s] {line.text}")

    def _append(self, text: str) -> None:
        with self._lock:
            self.log_lines.append(text)
            now = time.monotonic()
            if now - self._last_flush > 0.2:  # do not flood the front end
                self._flush()

    def _flush(self) -> None:
        self._last_flush = time.monotonic()
        self.log_box.value = "\n".join(self.log_lines[-MAX_LOG_LINES:])

    def _finish(self, status: str, error: str | None) -> None:
        with self._lock:
            self._flush()
        self.error = error
        self.run_button.disabled = False
        self.cancel_button.disabled = True
        if status == "complete":
            self.progress = 100
        parts = [f"<b>{html.escape(status)}</b>"]
        if self.result is not None:
            parts.append(f"folder <code>{html.escape(str(self.result.folder))}</code>")
            if self.result.target_exit_code is not None:
                parts.append(f"exit code {self.result.target_exit_code}")
            if self.result.wall_s is not None:
                parts.append(f"{self.result.wall_s:.1f} s")
        if self.trace is not None:
            parts.append(
                f"loaded <code>{html.escape(type(self.trace).__name__)}</code> as <code>form.trace</code>"
            )
        if error:
            parts.append(f"<span style='color:#b00'>{html.escape(error)}</span>")
        self.result_html.value = " · ".join(parts)
        self._set_status(status)
        for callback in self._done_callbacks:
            callback(self)

    def _set_status(self, status: str) -> None:
        self.status = status
        self.status_html.value = html.escape(status)
        self.bar.bar_style = {
            "complete": "success",
            "failed": "danger",
            "error": "danger",
            "interrupted": "warning",
        }.get(status, "info")

    @traitlets.observe("progress")
    def _progress_changed(self, change: dict[str, Any]) -> None:
        self.bar.value = max(0, min(100, int(change["new"])))
