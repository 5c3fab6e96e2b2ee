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

#: The profiler settings the form shows as fields: (section, option, kind, label, choices).
#: ``kind``: ``text``, ``list`` (comma-separated), ``choice``, ``bool``, ``int`` (0 = unset),
#: ``count`` (a whole number, 0 included).
FIELDS: tuple[tuple[str, str, str, str, tuple[str, ...]], ...] = (
    ("nsys", "trace", "list", "trace APIs (--trace)", ()),
    ("nsys", "sample", "choice", "CPU sampling (--sample)", ("", "none", "process-tree", "system-wide", "cpu")),
    ("nsys", "cpuctxsw", "choice", "context switches (--cpuctxsw)", ("", "none", "process-tree", "system-wide")),
    ("nsys", "cuda_graph_trace", "choice", "CUDA graphs (--cuda-graph-trace)", ("", "graph", "node")),
    ("nsys", "capture_range", "choice", "capture range (--capture-range)", ("none", "cudaProfilerApi", "nvtx")),
    ("nsys", "nvtx_capture", "text", "NVTX range that opens it (--nvtx-capture)", ()),
    ("nsys", "capture_range_end", "text", "capture range end (--capture-range-end)", ()),
    ("nsys", "gpu_metrics_devices", "text", "GPU metrics devices (--gpu-metrics-devices)", ()),
    ("nsys", "cuda_memory_usage", "bool", "CUDA memory usage (--cuda-memory-usage)", ()),
    ("nsys", "trace_fork_before_exec", "bool", "trace forked children (--trace-fork-before-exec)", ()),
    ("nsys", "output_name", "text", "report name (--output)", ()),
    ("ncu", "set", "text", "section set (--set)", ()),
    ("ncu", "sections", "list", "sections (--section)", ()),
    ("ncu", "kernel_name", "text", "kernel filter (--kernel-name)", ()),
    ("ncu", "launch_count", "int", "launches to profile (-c; 0 = all)", ()),
    ("ncu", "target_processes", "choice", "processes (--target-processes)", ("", "all", "application-only")),
    ("ncu", "graph_profiling", "choice", "CUDA graphs (--graph-profiling)", ("", "node", "graph")),
    ("ncu", "output_name", "text", "report name (--export)", ()),
    ("torch", "skip", "count", "optimizer steps waited (--skip)", ()),
    ("torch", "steps", "count", "optimizer steps recorded (--steps; 0 = whole run)", ()),
    ("torch", "record_shapes", "bool", "operator input shapes (--record-shapes)", ()),
    ("torch", "profile_memory", "bool", "tensor allocations (--profile-memory)", ()),
    ("torch", "with_stack", "bool", "Python stacks (--with-stack)", ()),
    ("torch", "with_modules", "bool", "module hierarchy, TorchScript only (--with-modules)", ()),
)
#: The settings panes: section → title.
SECTIONS = {"nsys": "Nsight Systems settings", "ncu": "Nsight Compute settings",
            "torch": "PyTorch profiler settings (mode torch)"}
#: Labels as wide as they need: ipywidgets cuts descriptions at 80 px by default.
LABEL_STYLE = {"description_width": "initial"}
_SAFE_IN_DOUBLE_QUOTES = frozenset('"$`\\!')


def quote(arg: str) -> str:
    """One argument quoted for a POSIX shell, readably: bare when safe, in double quotes when
    it holds single quotes but nothing a shell expands inside double quotes (``print('hi')``
    becomes ``"print('hi')"``, not ``'print('"'"'hi'"'"')'``), else :func:`shlex.quote`."""
    plain = shlex.quote(arg)
    if plain == arg or "'" not in arg:
        return plain
    if not any(c in _SAFE_IN_DOUBLE_QUOTES for c in arg):
        return f'"{arg}"'
    return plain


def join(argv: list[str] | tuple[str, ...]) -> str:
    """A command line from ``argv`` that :func:`shlex.split` gives back exactly (:func:`quote`)."""
    return " ".join(quote(a) for a in argv)


class CaptureForm(widgets.VBox):  # type: ignore[misc,name-defined]
    """A form that runs ``tracekit.capture`` and loads the result.

    Parameters
    ----------
    command
        The program to profile (a string split like a shell would, or a list).
    mode
        ``"nsys"``, ``"ncu"``, ``"nsys+ncu"``, ``"torch"`` (``torch.profiler`` inside the
        unmodified program: the *PyTorch profiler settings* pane) or ``"none"`` (just run it).
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
            description="command", layout=wide, placeholder="python3 train.py --steps 10", style=LABEL_STYLE
        )
        self.mode_box = w.Dropdown(options=list(MODES), description="mode", style=LABEL_STYLE)
        # the preset's name only: its description is the line below it, never cut
        self.preset_box = w.Dropdown(options=[("(none)", ""), *[(k, k) for k in PRESETS]],
                                     description="preset", style=LABEL_STYLE)  # fmt: skip
        self.preset_help = w.HTML()
        self.options_box = w.Textarea(description="more options (YAML)", placeholder="nsys: {gpu_metrics_frequency_hz: 10000}\ntimeout_s: 600",
                                      layout=w.Layout(width="95%", height="60px"), style=LABEL_STYLE)  # fmt: skip
        self.out_box = w.Text(description="out", layout=w.Layout(width="50%"), style=LABEL_STYLE)
        #: One field per profiler setting of :data:`FIELDS`, filled from the preset.
        self.fields: dict[tuple[str, str], Any] = {}
        for section, name, kind, label, choices in FIELDS:
            common = {"description": label, "style": LABEL_STYLE, "layout": w.Layout(width="48%")}
            if kind == "bool":
                box = w.Checkbox(value=False, indent=False, **common)
            elif kind == "choice":
                box = w.Dropdown(options=[(c or "(default)", c) for c in choices], value=choices[0], **common)
            elif kind in ("int", "count"):
                box = w.BoundedIntText(value=0, min=0, max=10**9, **common)
            else:
                box = w.Text(value="", continuous_update=False, **common)
            box.observe(lambda _c: self._show_command(), names="value")
            self.fields[(section, name)] = box
        self.per_rank_box = w.Checkbox(value=False, indent=False, description="one profiler per rank inside torchrun",
                                       style=LABEL_STYLE, layout=w.Layout(width="48%"))
        self.per_rank_box.observe(lambda _c: self._show_command(), names="value")
        row = w.Layout(flex_flow="row wrap", width="100%")
        panes = []
        for section in SECTIONS:
            boxes = [b for (sec, _n), b in self.fields.items() if sec == section]
            panes.append(w.Box([*boxes, self.per_rank_box] if section == "ncu" else boxes, layout=row))
        self.settings = w.Accordion(children=panes)
        for i, title in enumerate(SECTIONS.values()):
            self.settings.set_title(i, title)
        self.command_preview = w.HTML()
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
            self.command_box, w.HBox([self.mode_box, self.out_box]), w.HBox([self.preset_box, self.preset_help]),
            self.settings, self.options_box, self.command_preview,
            w.HBox([self.run_button, self.cancel_button, self.bar, self.status_html]), self.log_box, self.result_html,
        )  # fmt: skip

        self.command = command if isinstance(command, str) else join(command)
        self.mode = mode
        self.preset = preset
        self._fill_fields(preset)
        self.options = options
        self.out = out
        self._show_command()

    # -- the preset's settings as fields ----------------------------------------------------------------
    @traitlets.observe("preset")
    def _preset_changed(self, change: dict[str, Any]) -> None:
        if hasattr(self, "fields"):
            self._fill_fields(change["new"])
            self._show_command()

    @traitlets.observe("command", "mode", "options", "out")
    def _inputs_changed(self, _change: dict[str, Any]) -> None:
        if hasattr(self, "command_preview"):
            self._show_command()

    def _fill_fields(self, name: str) -> None:
        """Show the settings of preset ``name`` (the defaults for none) in the fields."""
        from tracekit.capture import NcuOptions, NsysOptions, TorchOptions
        from tracekit.capture.config import PRESETS

        data = PRESETS.get(name, {}) if name else {}
        defaults = {"nsys": NsysOptions(), "ncu": NcuOptions(), "torch": TorchOptions()}
        self.preset_help.value = (f"<small style='color:#444'>{html.escape(str(data.get('description', '')))}</small>"
                                  if data else "")
        self._filling = True
        try:
            for (section, option), box in self.fields.items():
                value = (data.get(section) or {}).get(option, getattr(defaults[section], option))
                if isinstance(box, widgets.Checkbox):
                    box.value = bool(value)
                elif isinstance(box, widgets.BoundedIntText):
                    box.value = int(value or 0)
                elif isinstance(box, widgets.Dropdown):
                    box.value = value if value in [v for _, v in box.options] else box.options[0][1]
                else:
                    box.value = ",".join(value) if isinstance(value, list | tuple) else str(value or "")
            self.per_rank_box.value = bool(data.get("per_rank", False))
        finally:
            self._filling = False

    def settings_layer(self) -> dict[str, Any]:
        """The fields as an experiment layer (``nsys: {...}``, ``ncu: {...}``, ``torch: {...}``,
        ``per_rank``): every field, so that a field emptied here overrides the preset's value."""
        layer: dict[str, Any] = {section: {} for section in SECTIONS}
        layer["per_rank"] = bool(self.per_rank_box.value)
        kinds = {(sec, name): kind for sec, name, kind, _l, _c in FIELDS}
        for key, box in self.fields.items():
            kind = kinds[key]
            value: Any = box.value
            if kind == "list":
                value = [v.strip() for v in str(value).split(",") if v.strip()]
            elif kind == "int":
                value = int(value) or None
            elif kind == "count":
                value = int(value)
            elif kind in ("text", "choice"):
                value = str(value).strip() or None
            if key[1] == "output_name" and not value:
                continue  # keep the default report name
            layer[key[0]][key[1]] = value
        return layer

    def command_line(self) -> str:
        """The profiler command line the form would run (shell-quoted), or the one line that
        says why the settings are not valid."""
        from tracekit.capture.commands import ncu_profile_args, nsys_profile_args

        try:
            e = self.experiment()
        except Exception as exc:
            return f"error: {exc}"
        program = list(e.command)
        lines = []
        where = f"{e.out}/RUN"  # the run's folder is named when it starts
        if e.mode in ("nsys", "nsys+ncu"):
            lines.append(join(["nsys", "profile", *nsys_profile_args(e.nsys, f"{where}/{e.nsys.output_name}"), *program]))
        if e.mode in ("ncu", "nsys+ncu"):
            lines.append(join(["ncu", *ncu_profile_args(e.ncu, f"{where}/{e.ncu.output_name}"), *program]))
        if e.mode == "none":
            lines.append(join(program))
        if e.mode == "torch":  # the profiler starts inside the program, from the start-up hook
            import os

            from tracekit.capture.prepare import profile_env

            env = profile_env(e.torch.profile_config(where), os.environ.get("PYTHONPATH"))
            lines.append(join(["env", *[f"{k}={v}" for k, v in env.items()], *program]))
        if e.mode in ("nsys", "nsys+ncu") and e.nsys.capture_range == "nvtx" and not e.nsys.nvtx_capture:
            lines.append("note: the capture starts at an NVTX range: name it in 'NVTX range that opens it' "
                         "(--nvtx-capture=RANGE or RANGE@DOMAIN), or set the capture range to none")
        return "\n".join(lines)

    def _show_command(self) -> None:
        if getattr(self, "_filling", False) or not hasattr(self, "command_preview"):
            return
        text = self.command_line()
        color = "#b00020" if text.startswith("error:") else "#222"
        self.command_preview.value = (
            "<div style='font-size:12px'>command line:</div>"
            f"<pre style='white-space:pre-wrap;word-break:break-all;margin:2px 0;padding:4px 6px;background:#f6f6f6;"
            f"color:{color}'>{html.escape(text)}</pre>")

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
        experiment, _sweep, _named = resolve(layer, self.settings_layer(), extra)
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

    def describe(self) -> str:
        """One line on the last run: status, folder, exit code, time and the error, if any
        (``idle`` before a run)."""
        parts = [self.status]
        if self.result is not None:
            parts.append(f"folder {self.result.folder}")
            if self.result.target_exit_code is not None:
                parts.append(f"exit code {self.result.target_exit_code}")
            if self.result.wall_s is not None:
                parts.append(f"{self.result.wall_s:.1f} s")
        if self.trace is not None:
            parts.append(f"opened as form.trace ({type(self.trace).__name__})")
        if self.error:
            parts.append(self.error)
        return " · ".join(parts)

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
        for kind in ("sqlite", "torch", "ncu"):
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
