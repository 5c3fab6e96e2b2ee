"""``tracekit capture``: run a program under nsys and/or ncu, one recorded experiment folder per run.

    tracekit capture nsys [OPTIONS] -- python3 decode.py --steps 8
    tracekit capture ncu --preset kernel-drilldown --nvtx-include step.1/ -- python3 decode.py
    tracekit capture both --top-n 3 -- python3 decode.py
    tracekit capture none --sweep "batch=1,4" -- python3 decode.py --batch {batch}
    tracekit capture torch --skip 3 --steps 5 -- python3 train.py
    tracekit capture --config configs/default.yaml [--out runs]

Arguments override the experiment file, which overrides the preset.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from tracekit.cli.terminal import help_markup_mode

_EXP, _NSYS, _NCU = "Experiment", "Nsight Systems (nsys)", "Nsight Compute (ncu)"
_TORCH = "PyTorch profiler (torch.profiler)"
_MODES = {"nsys": "nsys", "ncu": "ncu", "both": "nsys+ncu", "none": "none"}
_CONTEXT = {"allow_interspersed_args": False, "help_option_names": ["-h", "--help"]}

app = typer.Typer(
    help="Run a program under nsys, ncu or torch.profiler; each run gets its own folder with reports, logs and summary.",
    invoke_without_command=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode=help_markup_mode(),
)


def register(parent: typer.Typer) -> None:
    """Mount :data:`app` on ``parent`` as ``tracekit capture``."""
    parent.add_typer(app, name="capture")


#: Options whose value may be left out (``--annotate-torch`` alone means the default depth).
OPTIONAL_VALUES = {"--annotate-torch": "default"}


def expand_optional_values(args: list[str]) -> list[str]:
    """``--annotate-torch`` alone → ``--annotate-torch=default``; ``--annotate-torch 2`` →
    ``--annotate-torch=2`` (only before ``--``: the program's own arguments are left alone).

    Examples
    --------
    >>> expand_optional_values(["capture", "nsys", "--annotate-torch", "--", "python3", "x.py"])
    ['capture', 'nsys', '--annotate-torch=default', '--', 'python3', 'x.py']
    >>> expand_optional_values(["capture", "nsys", "--annotate-torch", "2", "--", "python3", "x.py"])
    ['capture', 'nsys', '--annotate-torch=2', '--', 'python3', 'x.py']
    """
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            out.extend(args[i:])
            break
        if arg in OPTIONAL_VALUES:
            nxt = args[i + 1] if i + 1 < len(args) else None
            if nxt is not None and (nxt.isdigit() or nxt in ("all", "default")):
                out.append(f"{arg}={nxt}")
                i += 2
                continue
            out.append(f"{arg}={OPTIONAL_VALUES[arg]}")
        else:
            out.append(arg)
        i += 1
    return out


def _annotate_value(value: str | None, include: list[str] | None, exclude: list[str] | None) -> dict[str, Any] | None:
    """``--annotate-torch[=DEPTH|all]`` and its filters as the experiment's ``annotate_torch``."""
    from tracekit.capture.torch_nvtx import DEFAULT_DEPTH
    from tracekit.errors import CaptureError

    if value is None:
        if include or exclude:
            msg = "--annotate-include/--annotate-exclude need --annotate-torch"
            raise CaptureError(msg)
        return None
    if value == "default":
        depth: int | None = DEFAULT_DEPTH
    elif value == "all":
        depth = None
    elif value.isdigit():
        depth = int(value)
    else:
        msg = f"--annotate-torch takes a depth (0, 1, 2 …) or 'all', not {value!r}"
        raise CaptureError(msg)
    return {"depth": depth, "include": list(include or []), "exclude": list(exclude or [])}


def _kv(items: list[str] | None) -> dict[str, str]:
    from tracekit.errors import CaptureError

    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            msg = f"--env takes KEY=VALUE, not {item!r}"
            raise CaptureError(msg)
        out[key] = value
    return out


def _drop_none(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if v is not None and v != [] and v != {}}


# options shared by the group callback and each capture command
ConfigOption = Annotated[
    Path | None, typer.Option("--config", help="Experiment file (YAML).", rich_help_panel=_EXP)
]
OutOption = Annotated[
    Path | None,
    typer.Option("--out", "-o", help="Parent folder of experiment folders.", rich_help_panel=_EXP),
]
DryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="Print the command lines; run nothing.", rich_help_panel=_EXP)
]
QuietOption = Annotated[
    bool, typer.Option("--quiet", "-q", help="Do not echo the program's output.", rich_help_panel=_EXP)
]


@app.callback()
def _group(
    ctx: typer.Context,
    config: ConfigOption = None,
    sweep: Annotated[
        str | None,
        typer.Option(
            "--sweep", help="'A=1,2;B=3,4' or a sweep named in the file.", rich_help_panel=_EXP
        ),
    ] = None,
    out: OutOption = None,
    dry_run: DryRunOption = False,
    quiet: QuietOption = False,
) -> None:
    """Run a program under nsys, ncu or torch.profiler (see the commands), or the experiment in --config."""
    ctx.obj = {
        "config": config,
        "sweep": sweep,
        "out": str(out) if out else None,
        "dry_run": dry_run,
        "quiet": quiet,
    }
    if ctx.invoked_subcommand is None:
        if config is None:
            typer.echo(ctx.get_help())
            raise typer.Exit(0)
        _execute(ctx.obj, {}, mode=None)


@app.command("presets")
def _presets() -> None:
    """List the built-in presets."""
    from rich.console import Console
    from rich.table import Table

    from tracekit.capture.config import PRESETS

    table = Table("preset", "mode", "what it sets")
    for name, data in PRESETS.items():
        table.add_row(name, data.get("mode", ""), data["description"])
    Console().print(table)


def _capture(
    ctx: typer.Context,
    command: Annotated[
        list[str] | None, typer.Argument(help="The program and its arguments (after --).")
    ] = None,
    config: ConfigOption = None,
    preset: Annotated[
        str | None,
        typer.Option(
            "--preset", help="quick, llm-serving, torchrun, kernel-drilldown.", rich_help_panel=_EXP
        ),
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="Folder name prefix.", rich_help_panel=_EXP)
    ] = None,
    out: OutOption = None,
    sweep: Annotated[
        str | None,
        typer.Option(
            "--sweep",
            help="'A=1,2;B=3,4' or a sweep named in the file; {A} in the command takes each value.",
            rich_help_panel=_EXP,
        ),
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout", help="Seconds before the process tree is stopped.", rich_help_panel=_EXP
        ),
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option("--env", help="KEY=VALUE for the program (repeatable).", rich_help_panel=_EXP),
    ] = None,
    cwd: Annotated[
        Path | None,
        typer.Option("--cwd", help="Working folder of the program.", rich_help_panel=_EXP),
    ] = None,
    per_rank: Annotated[
        bool | None,
        typer.Option(
            "--per-rank/--no-per-rank", help="One profiler per torchrun rank.", rich_help_panel=_EXP
        ),
    ] = None,
    top_n: Annotated[
        int | None,
        typer.Option(
            "--top-n",
            help="Kernels handed from nsys to ncu (both): one ncu pass each, -c launches each.",
            rich_help_panel=_EXP,
        ),
    ] = None,
    nsys_path: Annotated[
        str | None, typer.Option("--nsys-path", help="The nsys to use.", rich_help_panel=_EXP)
    ] = None,
    ncu_path: Annotated[
        str | None, typer.Option("--ncu-path", help="The ncu to use.", rich_help_panel=_EXP)
    ] = None,
    annotate_torch: Annotated[
        str | None,
        typer.Option(
            "--annotate-torch",
            help="NVTX range per PyTorch module, named by path (model.layers.3.self_attn), in the unmodified "
            "program: --annotate-torch[=DEPTH|all] (default depth 3).",
            rich_help_panel=_EXP,
        ),
    ] = None,
    annotate_include: Annotated[
        list[str] | None,
        typer.Option("--annotate-include", help="Regex: only modules whose path matches (repeatable).", rich_help_panel=_EXP),
    ] = None,
    annotate_exclude: Annotated[
        list[str] | None,
        typer.Option("--annotate-exclude", help="Regex: no range for modules whose path matches (repeatable).", rich_help_panel=_EXP),
    ] = None,
    dry_run: DryRunOption = False,
    quiet: QuietOption = False,
    skip_system_checks: Annotated[
        bool,
        typer.Option(
            "--skip-system-checks",
            help="Skip the machine checks (nsys importer libraries, counter permission).",
            rich_help_panel=_EXP,
        ),
    ] = False,
    trace: Annotated[
        str | None,
        typer.Option("--trace", "-t", help="cuda,nvtx,osrt,cublas,cudnn…", rich_help_panel=_NSYS),
    ] = None,
    cuda_graph_trace: Annotated[
        str | None, typer.Option("--cuda-graph-trace", help="graph or node.", rich_help_panel=_NSYS)
    ] = None,
    capture_range: Annotated[
        str | None,
        typer.Option(
            "--capture-range", help="none, cudaProfilerApi or nvtx.", rich_help_panel=_NSYS
        ),
    ] = None,
    capture_range_end: Annotated[
        str | None,
        typer.Option(
            "--capture-range-end", help="stop, stop-shutdown, repeat:N.", rich_help_panel=_NSYS
        ),
    ] = None,
    nvtx_capture: Annotated[
        str | None,
        typer.Option(
            "--nvtx-capture", help="NVTX range[@domain] opening the capture.", rich_help_panel=_NSYS
        ),
    ] = None,
    delay: Annotated[
        float | None,
        typer.Option("--delay", help="Seconds before collection starts.", rich_help_panel=_NSYS),
    ] = None,
    duration: Annotated[
        float | None,
        typer.Option("--duration", help="Seconds of collection.", rich_help_panel=_NSYS),
    ] = None,
    gpu_metrics_devices: Annotated[
        str | None,
        typer.Option("--gpu-metrics-devices", help="all, none or 0,1.", rich_help_panel=_NSYS),
    ] = None,
    gpu_metrics_frequency: Annotated[
        int | None,
        typer.Option("--gpu-metrics-frequency", help="Samples per second.", rich_help_panel=_NSYS),
    ] = None,
    gpu_metrics_set: Annotated[
        str | None, typer.Option("--gpu-metrics-set", rich_help_panel=_NSYS)
    ] = None,
    cuda_memory_usage: Annotated[
        bool | None,
        typer.Option("--cuda-memory-usage/--no-cuda-memory-usage", rich_help_panel=_NSYS,
                     help="Record device allocations and frees (the memory_usage table: memory over time, per NVTX layer)."),
    ] = None,
    trace_fork_before_exec: Annotated[
        bool | None,
        typer.Option("--trace-fork-before-exec/--no-trace-fork-before-exec", rich_help_panel=_NSYS),
    ] = None,
    sample: Annotated[
        str | None,
        typer.Option("--sample", help="process-tree, system-wide or none.", rich_help_panel=_NSYS),
    ] = None,
    cpuctxsw: Annotated[str | None, typer.Option("--cpuctxsw", rich_help_panel=_NSYS)] = None,
    pytorch: Annotated[
        str | None, typer.Option("--pytorch", help="autograd-nvtx, …", rich_help_panel=_NSYS)
    ] = None,
    wait: Annotated[
        str | None, typer.Option("--wait", help="all or primary.", rich_help_panel=_NSYS)
    ] = None,
    nsys_output: Annotated[
        str | None,
        typer.Option(
            "--nsys-output", help="Report name (may hold %q{RANK}).", rich_help_panel=_NSYS
        ),
    ] = None,
    export_sqlite: Annotated[
        bool | None, typer.Option("--export-sqlite/--no-export-sqlite", rich_help_panel=_NSYS)
    ] = None,
    include_blobs: Annotated[
        bool | None, typer.Option("--include-blobs/--no-include-blobs", rich_help_panel=_NSYS)
    ] = None,
    nsys_arg: Annotated[
        list[str] | None,
        typer.Option(
            "--nsys-arg", help="Extra nsys profile argument (repeatable).", rich_help_panel=_NSYS
        ),
    ] = None,
    set_: Annotated[
        str | None,
        typer.Option("--set", help="basic, detailed, roofline, full…", rich_help_panel=_NCU),
    ] = None,
    section: Annotated[
        list[str] | None,
        typer.Option("--section", help="Section (repeatable).", rich_help_panel=_NCU),
    ] = None,
    metrics: Annotated[
        str | None,
        typer.Option(
            "--metrics", help="a,b,… (regex:, group:, breakdown: too).", rich_help_panel=_NCU
        ),
    ] = None,
    kernel_name: Annotated[
        str | None,
        typer.Option("--kernel-name", "-k", help="Name or regex:….", rich_help_panel=_NCU),
    ] = None,
    kernel_name_base: Annotated[
        str | None,
        typer.Option(
            "--kernel-name-base", help="function, demangled, mangled.", rich_help_panel=_NCU
        ),
    ] = None,
    kernel_id: Annotated[str | None, typer.Option("--kernel-id", rich_help_panel=_NCU)] = None,
    launch_skip: Annotated[
        int | None, typer.Option("--launch-skip", "-s", rich_help_panel=_NCU)
    ] = None,
    launch_count: Annotated[
        int | None, typer.Option("--launch-count", "-c", rich_help_panel=_NCU)
    ] = None,
    launch_skip_before_match: Annotated[
        int | None, typer.Option("--launch-skip-before-match", rich_help_panel=_NCU)
    ] = None,
    nvtx_include: Annotated[
        list[str] | None, typer.Option("--nvtx-include", help="Repeatable.", rich_help_panel=_NCU)
    ] = None,
    nvtx_exclude: Annotated[
        list[str] | None, typer.Option("--nvtx-exclude", help="Repeatable.", rich_help_panel=_NCU)
    ] = None,
    replay_mode: Annotated[
        str | None,
        typer.Option(
            "--replay-mode", help="kernel, application, range, app-range.", rich_help_panel=_NCU
        ),
    ] = None,
    graph_profiling: Annotated[
        str | None, typer.Option("--graph-profiling", help="node or graph.", rich_help_panel=_NCU)
    ] = None,
    target_processes: Annotated[
        str | None,
        typer.Option("--target-processes", help="all or application-only.", rich_help_panel=_NCU),
    ] = None,
    devices: Annotated[str | None, typer.Option("--devices", rich_help_panel=_NCU)] = None,
    clock_control: Annotated[
        str | None,
        typer.Option("--clock-control", help="base, none or reset.", rich_help_panel=_NCU),
    ] = None,
    cache_control: Annotated[
        str | None, typer.Option("--cache-control", help="all or none.", rich_help_panel=_NCU)
    ] = None,
    import_source: Annotated[
        bool | None, typer.Option("--import-source/--no-import-source", rich_help_panel=_NCU)
    ] = None,
    import_sass: Annotated[
        bool | None, typer.Option("--import-sass/--no-import-sass", rich_help_panel=_NCU)
    ] = None,
    ncu_output: Annotated[
        str | None,
        typer.Option("--ncu-output", help="Report name (may hold %q{RANK}).", rich_help_panel=_NCU),
    ] = None,
    export_csv: Annotated[
        bool | None, typer.Option("--export-csv/--no-export-csv", rich_help_panel=_NCU)
    ] = None,
    ncu_arg: Annotated[
        list[str] | None,
        typer.Option("--ncu-arg", help="Extra ncu argument (repeatable).", rich_help_panel=_NCU),
    ] = None,
) -> None:
    group = dict(ctx.obj or {})
    overrides = _drop_none(
        {
            "command": list(command) if command else None,
            "preset": preset,
            "name": name,
            "out": str(out) if out else None,
            "timeout_s": timeout,
            "env": _kv(env),
            "cwd": str(cwd) if cwd else None,
            "per_rank": per_rank,
            "top_n": top_n,
            "nsys_path": nsys_path,
            "ncu_path": ncu_path,
            "annotate_torch": _annotate_value(annotate_torch, annotate_include, annotate_exclude),
            "nsys": _drop_none(
                {
                    "trace": trace,
                    "cuda_graph_trace": cuda_graph_trace,
                    "capture_range": capture_range,
                    "capture_range_end": capture_range_end,
                    "nvtx_capture": nvtx_capture,
                    "delay_s": delay,
                    "duration_s": duration,
                    "gpu_metrics_devices": gpu_metrics_devices,
                    "gpu_metrics_frequency_hz": gpu_metrics_frequency,
                    "gpu_metrics_set": gpu_metrics_set,
                    "cuda_memory_usage": cuda_memory_usage,
                    "trace_fork_before_exec": trace_fork_before_exec,
                    "sample": sample,
                    "cpuctxsw": cpuctxsw,
                    "pytorch": pytorch,
                    "wait": wait,
                    "output_name": nsys_output,
                    "export_sqlite": export_sqlite,
                    "include_blobs": include_blobs,
                    "extra_args": nsys_arg,
                }
            ),
            "ncu": _drop_none(
                {
                    "set": set_,
                    "sections": section,
                    "metrics": metrics,
                    "kernel_name": kernel_name,
                    "kernel_name_base": kernel_name_base,
                    "kernel_id": kernel_id,
                    "launch_skip": launch_skip,
                    "launch_count": launch_count,
                    "launch_skip_before_match": launch_skip_before_match,
                    "nvtx_include": nvtx_include,
                    "nvtx_exclude": nvtx_exclude,
                    "replay_mode": replay_mode,
                    "graph_profiling": graph_profiling,
                    "target_processes": target_processes,
                    "devices": devices,
                    "clock_control": clock_control,
                    "cache_control": cache_control,
                    "import_source": import_source,
                    "import_sass": import_sass,
                    "output_name": ncu_output,
                    "export_csv": export_csv,
                    "extra_args": ncu_arg,
                }
            ),
        }
    )
    if group.get("out") and "out" not in overrides:
        overrides["out"] = group["out"]
    settings = {
        "config": config or group.get("config"),
        "sweep": sweep or group.get("sweep"),
        "dry_run": dry_run or group.get("dry_run", False),
        "quiet": quiet or group.get("quiet", False),
        "system_checks": not skip_system_checks,
    }
    _execute(settings, overrides, mode=_MODES[ctx.info_name or "nsys"])


for _name, _help in (
    ("nsys", "Profile with Nsight Systems (then export .sqlite and summarize)."),
    ("ncu", "Profile kernels with Nsight Compute."),
    ("both", "Nsight Systems, then Nsight Compute on the top kernels it found."),
    ("none", "Only run and time the program (no profiler)."),
):
    app.command(_name, help=_help, context_settings=_CONTEXT)(_capture)


@app.command("torch", context_settings=_CONTEXT)
def _capture_torch(
    ctx: typer.Context,
    command: Annotated[
        list[str] | None, typer.Argument(help="The program and its arguments (after --), unmodified.")
    ] = None,
    skip: Annotated[
        int | None,
        typer.Option("--skip", min=0, help="Optimizer steps waited before recording (default 3; the last one warms "
                     "the profiler up).", rich_help_panel=_TORCH),
    ] = None,
    steps: Annotated[
        int | None,
        typer.Option("--steps", min=0, help="Optimizer steps recorded (default 5); 0 = the whole run, written at exit "
                     "(inference, generate(): a program that never steps an optimizer is recorded whole).",
                     rich_help_panel=_TORCH),
    ] = None,
    record_shapes: Annotated[
        bool | None,
        typer.Option("--record-shapes/--no-record-shapes", help="Input shapes of each operator (default on).",
                     rich_help_panel=_TORCH),
    ] = None,
    profile_memory: Annotated[
        bool | None,
        typer.Option("--profile-memory/--no-profile-memory", help="Tensor allocations and frees.", rich_help_panel=_TORCH),
    ] = None,
    with_stack: Annotated[
        bool | None,
        typer.Option("--with-stack/--no-with-stack", help="Python stack of each operator (traces several times larger).",
                     rich_help_panel=_TORCH),
    ] = None,
    with_modules: Annotated[
        bool | None,
        typer.Option("--with-modules/--no-with-modules", help="nn.Module hierarchy of each operator (TorchScript "
                     "models only; --annotate-torch ranges eager modules).", rich_help_panel=_TORCH),
    ] = None,
    annotate_torch: Annotated[
        str | None,
        typer.Option(
            "--annotate-torch",
            help="A torch.profiler range (record_function) per PyTorch module, named by path (model.layers.3.self_attn): "
            "per-layer time and memory; --annotate-torch[=DEPTH|all] (default depth 3).",
            rich_help_panel=_TORCH,
        ),
    ] = None,
    annotate_include: Annotated[
        list[str] | None,
        typer.Option("--annotate-include", help="Regex: only modules whose path matches (repeatable).", rich_help_panel=_TORCH),
    ] = None,
    annotate_exclude: Annotated[
        list[str] | None,
        typer.Option("--annotate-exclude", help="Regex: no range for modules whose path matches (repeatable).",
                     rich_help_panel=_TORCH),
    ] = None,
    config: ConfigOption = None,
    name: Annotated[
        str | None, typer.Option("--name", help="Folder name prefix.", rich_help_panel=_EXP)
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", "--output", "-o", help="Parent folder of experiment folders (the traces go into the "
                     "run's folder).", rich_help_panel=_EXP),
    ] = None,
    sweep: Annotated[
        str | None,
        typer.Option("--sweep", help="'A=1,2;B=3,4' or a sweep named in the file; {A} in the command takes each value.",
                     rich_help_panel=_EXP),
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option("--timeout", help="Seconds before the process tree is stopped.", rich_help_panel=_EXP),
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option("--env", help="KEY=VALUE for the program (repeatable).", rich_help_panel=_EXP),
    ] = None,
    cwd: Annotated[
        Path | None, typer.Option("--cwd", help="Working folder of the program.", rich_help_panel=_EXP)
    ] = None,
    dry_run: DryRunOption = False,
    quiet: QuietOption = False,
) -> None:
    """Run an unmodified PyTorch program under torch.profiler (a schedule of optimizer steps, or the whole run);
    each Python process that imports torch writes its own trace (torchrun: one per rank), then it is opened."""
    group = dict(ctx.obj or {})
    overrides = _drop_none(
        {
            "command": list(command) if command else None,
            "name": name,
            "out": str(out) if out else group.get("out"),
            "timeout_s": timeout,
            "env": _kv(env),
            "cwd": str(cwd) if cwd else None,
            "annotate_torch": _annotate_value(annotate_torch, annotate_include, annotate_exclude),
            "torch": _drop_none(
                {
                    "skip": skip,
                    "steps": steps,
                    "record_shapes": record_shapes,
                    "profile_memory": profile_memory,
                    "with_stack": with_stack,
                    "with_modules": with_modules,
                }
            ),
        }
    )
    settings = {
        "config": config or group.get("config"),
        "sweep": sweep or group.get("sweep"),
        "dry_run": dry_run or group.get("dry_run", False),
        "quiet": quiet or group.get("quiet", False),
        "system_checks": True,
    }
    _execute(settings, overrides, mode="torch")


def _execute(settings: dict[str, Any], overrides: dict[str, Any], mode: str | None) -> None:
    from rich.console import Console

    from tracekit.capture import config as cfg

    console = Console(stderr=True)
    file_layer = cfg.load_config(settings["config"]) if settings.get("config") else {}
    if settings.get("out") and "out" not in overrides:
        overrides = {**overrides, "out": settings["out"]}
    mode_layer = {"mode": mode} if mode else {}
    exp, sweep_spec, named = cfg.resolve(file_layer, mode_layer, overrides)
    sweep_spec = settings.get("sweep") or sweep_spec
    if settings.get("dry_run"):
        _print_plan(exp, sweep_spec, named)
        return
    from tracekit.capture.output import ConsoleReporter

    reporter = ConsoleReporter(console, echo=not settings.get("quiet"))
    if sweep_spec:
        from tracekit.capture.sweep import sweep

        with reporter:
            table = sweep(
                exp.command,
                sweep_spec,
                experiment=exp,
                named=named,
                on_output=reporter,
                system_checks=settings.get("system_checks", True),
            )
        _print_sweep(console, table)
        bad = table.filter(table["status"] != "complete").height
        _exit(1 if bad else 0)
        return
    from tracekit.capture.experiment import run

    with reporter:
        result = run(
            exp, on_output=reporter, check=False, system_checks=settings.get("system_checks", True)
        )
    _print_result(console, result)
    _exit(_exit_code(result.status, result.target_exit_code, result.error))


def _exit(code: int) -> None:
    """Leave with ``code``; SystemExit (not typer.Exit) so that callers in non-standalone mode see it."""
    if code:
        raise SystemExit(code)


def _exit_code(status: str, target: int | None, error: str | None) -> int:
    if status == "complete":
        return 0
    if status == "timeout":
        return 124
    if status == "interrupted":
        return 130
    if error:
        return 2
    return target if target and 0 < target < 256 else 1


def _print_plan(exp: Any, sweep_spec: Any, named: dict[str, Any]) -> None:
    import shlex

    from tracekit.capture.config import fill, sweep_points
    from tracekit.capture.prepare import plan

    points = sweep_points(sweep_spec, named) if sweep_spec else [{}]
    for params in points:
        point = exp.replace(command=tuple(fill(t, params) for t in exp.command)) if params else exp
        if params:
            typer.echo(f"# sweep point {params}")
        if point.annotate_torch is not None:
            from tracekit.capture.prepare import annotation_env

            extra = annotation_env(point.annotate_torch)
            typer.echo("env: " + " ".join(f"{k}={shlex.quote(v)}" for k, v in extra.items()) + " (PYTHONPATH: prepended)")
        if point.mode == "torch":
            from tracekit.capture.prepare import profile_env

            extra = profile_env(point.torch.profile_config("<folder>"))
            typer.echo("env: " + " ".join(f"{k}={shlex.quote(v)}" for k, v in extra.items()) + " (PYTHONPATH: prepended)")
        for step, argv in plan(point):
            typer.echo(f"{step}: {shlex.join(argv)}")


def _print_result(console: Any, result: Any) -> None:

    style = "green" if result.complete else "red"
    console.print(f"[{style}]{result.status}[/{style}]  {result.folder}", soft_wrap=True)
    console.print(
        f"target exit code {result.target_exit_code} ({result.target_exit_code_source}), "
        f"profiler exit code {result.profiler_exit_code}, {result.wall_s or 0:.1f} s"
    )
    if result.experiment.mode == "torch":
        _print_torch(console, result)
    if result.error:
        console.print(f"[red]{result.error}[/red]", soft_wrap=True)
    for warning in result.warnings:
        console.print(f"[yellow]note:[/yellow] {warning}", soft_wrap=True)
    top = (result.summary.get("nsys") or result.summary.get("torch") or {}).get("top_kernels") or (
        result.summary.get("ncu") or {}
    ).get("top_kernels")
    if top:
        from tracekit.cli.tables import print_table

        rows = [[k.get("short_name") or k["name"], str(k["count"]), f"{k['total_ns'] / 1e6:.3f}",
                 "" if k.get("pct") is None else f"{k['pct']:.1f}"] for k in top[:10]]
        print_table(console, ["kernel", "count", "total ms", "%"], rows, text_columns={"kernel"})


def _print_torch(console: Any, result: Any) -> None:
    """The traces of mode ``torch``, the profiler steps they hold, and how to open them."""
    traces = result.reports.get("torch") or []
    found = result.summary.get("torch") or {}
    per_trace = found.get("reports") or ({traces[0].name: found} if traces else {})
    for path in traces:
        steps = (per_trace.get(path.name) or {}).get("profiler_steps")
        held = f"  (ProfilerStep#{steps[0]}..#{steps[-1]})" if steps else ""
        console.print(f"trace {path}{held}", soft_wrap=True, highlight=False)
    if not traces or found.get("no_gpu_activity") or "kernel_count" not in found:
        return
    target = f"'{traces[0]}'" if len(traces) == 1 else f"'{result.folder}'"
    opener = "tracekit.open" if len(traces) == 1 else "tracekit.open_many"
    console.print(f"open: {opener}({target}) · tracekit summary {target[1:-1]}", soft_wrap=True, highlight=False)


def _print_sweep(console: Any, table: Any) -> None:
    from rich.table import Table

    from tracekit.capture.sweep import RESULT_COLUMNS

    params = [c for c in table.columns if c not in RESULT_COLUMNS]
    shown = [
        *params,
        "status",
        "target_exit_code",
        "wall_s",
        "gpu_time_ns",
        "top_kernel",
        "idle_pct",
        "comm_pct",
    ]
    view = Table(
        *[c.replace("target_exit_code", "exit").replace("gpu_time_ns", "gpu ms") for c in shown]
    )
    for row in table.select(shown).iter_rows(named=True):
        cells = []
        for key in shown:
            value = row[key]
            if value is None:
                cells.append("")
            elif key == "gpu_time_ns":
                cells.append(f"{value / 1e6:.3f}")
            elif isinstance(value, float):
                cells.append(f"{value:.2f}")
            else:
                cells.append(str(value)[:40])
        view.add_row(*cells)
    console.print(view)
    if table.height:
        folder = Path(table["folder"][0]).parent
        console.print(f"results: {folder / 'results.csv'} (and results.parquet)", soft_wrap=True)


if __name__ == "__main__":
    app()
