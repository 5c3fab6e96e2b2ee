"""Configuration dataclasses for a capture: what to run, under which profiler, with which options.

:class:`NsysOptions`, :class:`NcuOptions` and :class:`TorchOptions` hold one profiler's settings
each; :class:`Experiment` holds the program, the mode and the option sets. All convert to and
from plain dictionaries (the shape of the YAML files in ``configs/``) and refuse unknown keys.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tracekit.errors import CaptureError

MODES = ("none", "nsys", "ncu", "nsys+ncu", "torch")
"""Capture modes: run only, Nsight Systems, Nsight Compute, Nsight Systems then Compute, or
``torch.profiler`` inside the program."""

_MODE_ALIASES = {"both": "nsys+ncu", "nsys-ncu": "nsys+ncu", "run": "none"}
_CAPTURE_RANGES = {
    "none": "none",
    "cudaprofilerapi": "cudaProfilerApi",
    "nvtx": "nvtx",
    "hotkey": "hotkey",
}
_T = TypeVar("_T")


def _choice(value: str | None, allowed: Sequence[str], what: str) -> str | None:
    if value is None or value in allowed:
        return value
    msg = f"{what} must be one of {', '.join(allowed)}, not {value!r}"
    raise CaptureError(msg)


def _as_tuple(value: Any, what: str) -> tuple[str, ...]:
    """Accept a list, a tuple or a comma-separated string; return a tuple of stripped strings."""
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if isinstance(value, Sequence):
        return tuple(str(part) for part in value)
    msg = (
        f"{what} must be a list of strings or a comma-separated string, not {type(value).__name__}"
    )
    raise CaptureError(msg)


def _positive(value: float | None, what: str) -> None:
    if value is not None and value < 0:
        msg = f"{what} must be zero or positive, not {value}"
        raise CaptureError(msg)


@dataclass(frozen=True)
class NsysOptions:
    """Options of ``nsys profile`` (and of the export that follows it).

    Attributes
    ----------
    trace
        APIs to trace (``--trace``): ``cuda``, ``nvtx``, ``osrt``, ``cublas``, ``cudnn``, ….
    cuda_graph_trace
        ``"graph"`` (one range per graph launch) or ``"node"`` (every kernel of the graph).
    capture_range
        ``"none"``, ``"cudaProfilerApi"`` (cudaProfilerStart/Stop) or ``"nvtx"``.
    capture_range_end
        ``"stop"``, ``"stop-shutdown"``, ``"repeat:N"``, ``"none"``; defaults to ``"stop"``
        when a capture range is set.
    nvtx_capture
        The NVTX range (``"range"`` or ``"range@domain"``) that opens the capture when
        ``capture_range="nvtx"``.
    delay_s, duration_s
        Start collecting after ``delay_s`` seconds; stop after ``duration_s`` seconds.
    gpu_metrics_devices, gpu_metrics_frequency_hz, gpu_metrics_set
        GPU hardware metrics sampling (``"all"``, ``"none"`` or ``"0,1"``; samples per second).
    cuda_memory_usage
        Track CUDA memory allocations (``--cuda-memory-usage``).
    trace_fork_before_exec
        Trace a forked child in the time between its ``fork`` and an ``exec``, i.e. a child
        that never calls ``exec`` (a serving engine started with ``multiprocessing``'s fork:
        ``--trace-fork-before-exec=true``). Children that ``exec`` (``spawn``, ``subprocess``)
        are traced without it. The child's CUDA activity is flushed only when it exits through
        libc's ``exit``; ``multiprocessing`` ends a forked child with ``os._exit``, which loses it.
    sample, cpuctxsw
        CPU sampling (``"process-tree"``, ``"system-wide"``, ``"none"``) and context switches.
    pytorch
        ``--pytorch`` mode of recent nsys (``"autograd-nvtx"``, ``"autograd-shapes-nvtx"``…).
    wait
        ``"all"`` or ``"primary"``: which processes nsys waits for.
    output_name
        Report file name without extension; may hold nsys placeholders such as ``%q{RANK}``.
    export_sqlite
        Export each report to ``.sqlite`` after the capture.
    include_blobs
        Export payload blobs (``--include-blobs``); ``None`` means "when this nsys can".
    extra_args
        Further ``nsys profile`` arguments, placed before the program.
    """

    trace: tuple[str, ...] = ("cuda", "nvtx", "osrt")
    cuda_graph_trace: str | None = None
    capture_range: str = "none"
    capture_range_end: str | None = None
    nvtx_capture: str | None = None
    delay_s: float | None = None
    duration_s: float | None = None
    gpu_metrics_devices: str | None = None
    gpu_metrics_frequency_hz: int | None = None
    gpu_metrics_set: str | None = None
    cuda_memory_usage: bool = False
    trace_fork_before_exec: bool = False
    sample: str | None = None
    cpuctxsw: str | None = None
    pytorch: str | None = None
    wait: str | None = None
    output_name: str = "report"
    export_sqlite: bool = True
    include_blobs: bool | None = None
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "trace", _as_tuple(self.trace, "nsys.trace"))
        object.__setattr__(self, "extra_args", _as_tuple_args(self.extra_args, "nsys.extra_args"))
        key = str(self.capture_range).replace("_", "").replace("-", "").lower()
        if key not in _CAPTURE_RANGES:
            msg = f"nsys.capture_range must be one of none, cudaProfilerApi, nvtx, hotkey, not {self.capture_range!r}"
            raise CaptureError(msg)
        object.__setattr__(self, "capture_range", _CAPTURE_RANGES[key])
        _choice(self.cuda_graph_trace, ("graph", "node"), "nsys.cuda_graph_trace")
        _choice(self.sample, ("process-tree", "system-wide", "none", "cpu"), "nsys.sample")
        _choice(self.wait, ("all", "primary"), "nsys.wait")
        _positive(self.delay_s, "nsys.delay_s")
        _positive(self.duration_s, "nsys.duration_s")
        _positive(self.gpu_metrics_frequency_hz, "nsys.gpu_metrics_frequency_hz")
        if self.nvtx_capture and self.capture_range != "nvtx":
            msg = "nsys.nvtx_capture needs capture_range='nvtx'; set both or neither"
            raise CaptureError(msg)
        if not self.output_name or "/" in self.output_name:
            msg = f"nsys.output_name must be a plain file name, not {self.output_name!r}"
            raise CaptureError(msg)


@dataclass(frozen=True)
class NcuOptions:
    """Options of ``ncu`` (Nsight Compute).

    Attributes
    ----------
    set, sections, metrics
        ``--set`` (``basic``, ``detailed``, ``full``, ``roofline``…), ``--section`` (repeated)
        and ``--metrics`` (joined by commas).
    kernel_name, kernel_name_base, kernel_id
        Kernel filters: a name or ``"regex:…"``; ``function``/``demangled``/``mangled``;
        ``context:stream:[regex:]name:invocation``.
    launch_skip, launch_count, launch_skip_before_match
        Skip or count launches that pass the filters (``-s``, ``-c``).
    nvtx, nvtx_include, nvtx_exclude
        NVTX filtering (``--nvtx`` is added whenever an include or exclude is given).
    replay_mode
        ``kernel``, ``application``, ``range`` or ``app-range``.
    graph_profiling
        ``node`` or ``graph``.
    target_processes, target_processes_filter
        ``all`` or ``application-only``; a process-name filter.
    devices
        GPUs to profile (``"0,1"``).
    clock_control, cache_control
        ``base``/``none``/``reset``; ``all``/``none``.
    import_source, import_sass
        Embed source / SASS in the report (``None``: ncu's default).
    filter_mode
        ``global``, ``per-gpu`` or ``per-launch-config``.
    output_name
        Report file name without extension (ncu adds ``.ncu-rep``); may hold ``%q{RANK}``.
    export_csv
        Write ``<output_name>.raw.csv`` (``--page raw --print-units base``) after the capture.
    extra_args
        Further ``ncu`` arguments, placed before the program.
    """

    set: str | None = None
    sections: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ()
    kernel_name: str | None = None
    kernel_name_base: str | None = None
    kernel_id: str | None = None
    launch_skip: int | None = None
    launch_count: int | None = None
    launch_skip_before_match: int | None = None
    nvtx: bool = False
    nvtx_include: tuple[str, ...] = ()
    nvtx_exclude: tuple[str, ...] = ()
    replay_mode: str | None = None
    graph_profiling: str | None = None
    target_processes: str | None = None
    target_processes_filter: str | None = None
    devices: str | None = None
    clock_control: str | None = None
    cache_control: str | None = None
    import_source: bool | None = None
    import_sass: bool | None = None
    filter_mode: str | None = None
    output_name: str = "report"
    export_csv: bool = True
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("sections", "metrics"):
            object.__setattr__(self, name, _as_tuple(getattr(self, name), f"ncu.{name}"))
        for name in ("nvtx_include", "nvtx_exclude"):  # NVTX expressions may hold commas
            value = getattr(self, name)
            object.__setattr__(
                self, name, (value,) if isinstance(value, str) else _as_tuple(value, f"ncu.{name}")
            )
        object.__setattr__(self, "extra_args", _as_tuple_args(self.extra_args, "ncu.extra_args"))
        _choice(self.kernel_name_base, ("function", "demangled", "mangled"), "ncu.kernel_name_base")
        _choice(
            self.replay_mode, ("kernel", "application", "range", "app-range"), "ncu.replay_mode"
        )
        _choice(self.graph_profiling, ("node", "graph"), "ncu.graph_profiling")
        _choice(self.target_processes, ("all", "application-only"), "ncu.target_processes")
        _choice(self.clock_control, ("base", "none", "reset"), "ncu.clock_control")
        _choice(self.cache_control, ("all", "none"), "ncu.cache_control")
        _choice(self.filter_mode, ("global", "per-gpu", "per-launch-config"), "ncu.filter_mode")
        for name in ("launch_skip", "launch_count", "launch_skip_before_match"):
            _positive(getattr(self, name), f"ncu.{name}")
        if self.launch_count == 0:
            msg = "ncu.launch_count must be at least 1; leave it unset to profile every launch"
            raise CaptureError(msg)
        if not self.output_name or "/" in self.output_name:
            msg = f"ncu.output_name must be a plain file name, not {self.output_name!r}"
            raise CaptureError(msg)

    @property
    def uses_nvtx(self) -> bool:
        """Whether ``--nvtx`` is needed (asked for, or implied by an include/exclude)."""
        return self.nvtx or bool(self.nvtx_include or self.nvtx_exclude)


@dataclass(frozen=True)
class TorchOptions:
    """Options of mode ``torch``: ``torch.profiler`` started inside the unmodified program.

    Attributes
    ----------
    skip
        Optimizer steps waited before recording (the last of them is the profiler's warm-up).
        A step is one ``Optimizer.step()``: gradient accumulation's micro-batches are one step.
    steps
        Optimizer steps recorded; the trace is written when they are done. ``0`` records the
        whole run and writes the trace at exit (a program that never steps an optimizer, such
        as inference or ``generate()``, is recorded whole either way).
    record_shapes, profile_memory, with_stack, with_modules
        ``torch.profiler.profile``'s options of the same names (a stack per operator makes the
        trace several times larger).
    """

    skip: int = 3
    steps: int = 5
    record_shapes: bool = True
    profile_memory: bool = False
    with_stack: bool = False
    with_modules: bool = False

    def __post_init__(self) -> None:
        for name in ("skip", "steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                msg = f"torch.{name} must be a whole number of optimizer steps, zero or more, not {value!r:.40}"
                raise CaptureError(msg)
        for name in ("record_shapes", "profile_memory", "with_stack", "with_modules"):
            if not isinstance(getattr(self, name), bool):
                msg = f"torch.{name} must be true or false, not {getattr(self, name)!r:.40}"
                raise CaptureError(msg)

    def profile_config(self, out: str | Path) -> dict[str, Any]:
        """The JSON the program's start-up hook reads from ``TRACEKIT_TORCH_PROFILE``
        (``tracekit/capture/torch_profile.py``): these options and the folder ``out``."""
        return {"out": str(out), **dataclasses.asdict(self)}


def _as_tuple_args(value: Any, what: str) -> tuple[str, ...]:
    """Extra arguments: a list, or one string split like a shell would (no shell runs it)."""
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(shlex.split(value))
    return _as_tuple(value, what)


@dataclass(frozen=True)
class Experiment:
    """One capture: the program, the mode, the profilers' options and where results go.

    Attributes
    ----------
    command
        The program and its arguments (a list; a string is split like a shell would, but no
        shell ever runs it).
    mode
        ``"none"``, ``"nsys"``, ``"ncu"``, ``"nsys+ncu"`` (``"both"`` is accepted) or
        ``"torch"`` (``torch.profiler`` inside the program, see :class:`TorchOptions`).
    name
        Folder name prefix; by default the script or program name.
    out
        Parent folder of the experiment folders.
    preset
        The preset the options came from (recorded, applied by :func:`resolve_experiment`).
    nsys, ncu, torch
        Profiler options (``torch``: mode ``torch``).
    per_rank
        Wrap the profiler *inside* a torchrun launcher, one report per rank.
    top_n
        Kernels handed from nsys to ncu in mode ``nsys+ncu``.
    timeout_s
        Wall-clock limit of each profiled run; the whole process tree is then stopped.
    kill_grace_s
        Seconds a stopped run gets to write its report before harder signals.
    env
        Extra environment variables for the program.
    cwd
        Working folder of the program (default: the current one).
    nsys_path, ncu_path
        Explicit profiler executables (otherwise found as :func:`tracekit.tools.find_tool` does).
    annotate_torch
        NVTX ranges per PyTorch module in the unmodified program (``--annotate-torch``): a
        depth (``3``), ``True`` for the default depth, or a mapping ``{depth, include,
        exclude, backward}`` (:class:`tracekit.capture.torch_nvtx.AnnotationConfig`);
        stored as that mapping. ``None``/``False``: off. In mode ``torch`` the ranges are
        ``torch.profiler`` ranges (``record_function``: the trace's ``user_annotation``
        events), since NVTX reaches no profiler there; ``with_modules`` records modules only
        for TorchScript. See ``docs/capture.md``.
    """

    command: tuple[str, ...]
    mode: str = "nsys"
    name: str | None = None
    out: str = "experiments"
    preset: str | None = None
    nsys: NsysOptions = field(default_factory=NsysOptions)
    ncu: NcuOptions = field(default_factory=NcuOptions)
    torch: TorchOptions = field(default_factory=TorchOptions)
    per_rank: bool = False
    top_n: int = 5
    timeout_s: float | None = None
    kill_grace_s: float = 30.0
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    nsys_path: str | None = None
    ncu_path: str | None = None
    annotate_torch: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "annotate_torch", _annotation(self.annotate_torch))
        command = self.command
        if isinstance(command, str):
            command = shlex.split(command)
        elif not isinstance(command, Sequence) or not all(isinstance(c, (str, int, float)) for c in command):
            msg = f"command must be a string or a list of strings, not {command!r:.60}"
            raise CaptureError(msg)
        object.__setattr__(self, "command", tuple(str(part) for part in command))
        if not self.command:
            msg = "the command is empty; give the program to run after '--' or as 'command:' in the config"
            raise CaptureError(msg)
        mode = _MODE_ALIASES.get(self.mode, self.mode)
        _choice(mode, MODES, "mode")
        object.__setattr__(self, "mode", mode)
        object.__setattr__(self, "out", str(self.out))
        object.__setattr__(self, "env", _env(self.env))
        for key, cls in (("nsys", NsysOptions), ("ncu", NcuOptions), ("torch", TorchOptions)):
            value = getattr(self, key)
            if value is None:
                value = {}
            if isinstance(value, Mapping):
                object.__setattr__(self, key, _build(cls, value, key))
            elif not isinstance(value, cls):
                example = {"nsys": "{trace: [cuda]}", "ncu": "{set: basic}", "torch": "{skip: 3, steps: 5}"}[key]
                msg = f"'{key}' must be a mapping of {key} options (e.g. {key}: {example}), not {value!r:.40}"
                raise CaptureError(msg)
        if mode == "torch" and self.per_rank:
            msg = ("per_rank puts nsys/ncu inside torchrun; mode torch already profiles every torchrun worker "
                   "(each writes its own trace): leave per_rank off")
            raise CaptureError(msg)
        if isinstance(self.top_n, bool) or not isinstance(self.top_n, int):
            msg = f"top_n must be a whole number, not {self.top_n!r:.40}"
            raise CaptureError(msg)
        for key in ("timeout_s", "kill_grace_s"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                msg = f"{key} must be a number of seconds, not {value!r:.40}"
                raise CaptureError(msg)
        if self.top_n < 1:
            msg = f"top_n must be at least 1, not {self.top_n}"
            raise CaptureError(msg)
        _positive(self.timeout_s, "timeout_s")
        _positive(self.kill_grace_s, "kill_grace_s")
        if self.name is not None and not re.fullmatch(r"[A-Za-z0-9._-]+", str(self.name)):
            msg = f"name {self.name!r:.60} may hold only letters, digits, '.', '_' and '-'"
            raise CaptureError(msg)
        if self.name is not None and len(self.name) > MAX_NAME:
            msg = f"name is {len(self.name)} characters; use at most {MAX_NAME} (it names the run's folder)"
            raise CaptureError(msg)

    @property
    def display_name(self) -> str:
        """``name``, or one derived from the command (the script's stem, or the program's name)."""
        return self.name or default_name(self.command)

    def replace(self, **changes: Any) -> Experiment:
        """Return a copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The experiment as plain data (lists, strings, numbers), as written to ``config.yaml``;
        the ``torch`` settings only in mode ``torch`` (the other modes' records stay as they were)."""
        plain: dict[str, Any] = _plain(dataclasses.asdict(self))
        if self.mode != "torch":
            plain.pop("torch", None)
        return plain

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Experiment:
        """Build an experiment from plain data; unknown keys raise :class:`CaptureError`."""
        return _build(cls, data, "experiment")


def _annotation(value: Any) -> dict[str, Any] | None:
    """``annotate_torch`` as the plain mapping of an
    :class:`~tracekit.capture.torch_nvtx.AnnotationConfig` (``None`` when off)."""
    from tracekit.capture.torch_nvtx import AnnotationConfig

    if value is None or value is False:
        return None
    try:
        if value is True:
            return AnnotationConfig().to_dict()
        if isinstance(value, int):
            return AnnotationConfig(depth=value).to_dict()
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - {"depth", "include", "exclude", "backward"})
            if unknown:
                msg = f"unknown annotate_torch option(s) {', '.join(map(str, unknown))}; valid: depth, include, exclude, backward"
                raise CaptureError(msg)
            return AnnotationConfig.from_dict(dict(value)).to_dict()
    except ValueError as exc:
        raise CaptureError(f"annotate_torch: {exc}") from None
    msg = f"annotate_torch must be a depth, true, or a mapping of depth/include/exclude/backward, not {value!r:.40}"
    raise CaptureError(msg)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def _build(cls: type[_T], data: Mapping[str, Any], what: str) -> _T:
    if not isinstance(data, Mapping):
        msg = f"{what} must be a mapping of option names to values, not {type(data).__name__}"
        raise CaptureError(msg)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - names)
    if unknown:
        msg = (
            f"unknown {what} option(s) {', '.join(unknown)}; valid ones: {', '.join(sorted(names))}"
        )
        raise CaptureError(msg)
    try:
        return cls(**dict(data))
    except TypeError as exc:
        msg = f"invalid {what} options: {exc}"
        raise CaptureError(msg) from exc


_INTERPRETERS = re.compile(r"^(python[\d.]*|pypy[\d.]*|torchrun|mpirun|srun|bash|sh|env|uv|time)$")


def default_name(command: Sequence[str]) -> str:
    """A folder-friendly name for ``command``: the script's stem, a module's last part, or the program.

    Examples
    --------
    >>> default_name(["python3", "decode.py", "--steps", "8"])
    'decode'
    >>> default_name(["python", "-m", "vllm.entrypoints.api_server"])
    'api_server'
    """
    for i, token in enumerate(command):
        if token == "-c" and i > 0:  # inline code: name it after the interpreter
            return _slug(Path(command[0]).name)
        if token.endswith(".py"):
            return _slug(Path(token).stem)
        if token == "-m" and i + 1 < len(command):
            return _slug(command[i + 1].rsplit(".", 1)[-1])
    for token in command:
        base = Path(token).name
        if not token.startswith("-") and not _INTERPRETERS.match(base):
            return _slug(base)
    return _slug(Path(command[0]).name)


#: Longest experiment name: ``<name>_<mode>_<timestamp>`` must fit a file name (255 bytes).
MAX_NAME = 128


def _env(env: Any) -> dict[str, str]:
    """``env:`` as strings; a missing value (``X: null``) or a nested value is an error, not ``'None'``."""
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        msg = f"env must map variable names to values (env: {{NAME: value}}), not {env!r:.40}"
        raise CaptureError(msg)
    out: dict[str, str] = {}
    for key, value in env.items():
        if value is None:
            msg = f"env {key} has no value; write {key}: '' for an empty string, or remove it"
            raise CaptureError(msg)
        if not isinstance(value, (str, int, float, bool)):
            msg = f"env {key} must be a string or a number, not {value!r:.40}"
            raise CaptureError(msg)
        out[str(key)] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:48] or "experiment"
