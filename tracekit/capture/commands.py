"""Command builders: pure functions from options to argument lists (never a shell string).

Every function here returns ``list[str]`` and touches neither the file system nor the
environment, so the exact command lines are easy to test and to record.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from tracekit.capture.options import NcuOptions, NsysOptions
from tracekit.errors import CaptureError


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _yes_no(value: bool) -> str:
    return "yes" if value else "no"


def nsys_profile_args(options: NsysOptions, output: str | Path) -> list[str]:
    """The options part of ``nsys profile`` (everything between ``profile`` and the program).

    Parameters
    ----------
    options
        Nsight Systems options.
    output
        Report path without extension (nsys adds ``.nsys-rep``); placeholders such as
        ``%q{RANK}`` pass through untouched.

    Examples
    --------
    >>> nsys_profile_args(NsysOptions(trace=("cuda", "nvtx")), "out/report")
    ['--trace=cuda,nvtx', '--output=out/report']
    """
    args = [f"--trace={','.join(options.trace)}"] if options.trace else []
    if options.cuda_graph_trace:
        args.append(f"--cuda-graph-trace={options.cuda_graph_trace}")
    if options.capture_range != "none":
        args.append(f"--capture-range={options.capture_range}")
        if options.capture_range == "nvtx" and options.nvtx_capture:
            args.append(f"--nvtx-capture={options.nvtx_capture}")
        args.append(f"--capture-range-end={options.capture_range_end or 'stop'}")
    if options.delay_s:
        args.append(f"--delay={_seconds(options.delay_s)}")
    if options.duration_s:
        args.append(f"--duration={_seconds(options.duration_s)}")
    if options.gpu_metrics_devices:
        args.append(f"--gpu-metrics-devices={options.gpu_metrics_devices}")
    if options.gpu_metrics_frequency_hz:
        args.append(f"--gpu-metrics-frequency={options.gpu_metrics_frequency_hz}")
    if options.gpu_metrics_set:
        args.append(f"--gpu-metrics-set={options.gpu_metrics_set}")
    if options.cuda_memory_usage:
        args.append("--cuda-memory-usage=true")
    if options.trace_fork_before_exec:
        args.append("--trace-fork-before-exec=true")
    if options.sample:
        args.append(f"--sample={options.sample}")
    if options.cpuctxsw:
        args.append(f"--cpuctxsw={options.cpuctxsw}")
    if options.pytorch:
        args.append(f"--pytorch={options.pytorch}")
    if options.wait:
        args.append(f"--wait={options.wait}")
    args.extend(options.extra_args)
    args.append(f"--output={output}")
    return args


def nsys_profile_command(
    nsys: str | Path, options: NsysOptions, output: str | Path, program: Sequence[str]
) -> list[str]:
    """``nsys profile OPTIONS PROGRAM…``.

    Examples
    --------
    >>> nsys_profile_command("nsys", NsysOptions(trace=("cuda",)), "r", ["./app", "-n", "2"])
    ['nsys', 'profile', '--trace=cuda', '--output=r', './app', '-n', '2']
    """
    return [str(nsys), "profile", *nsys_profile_args(options, output), *program]


def nsys_export_command(
    nsys: str | Path, report: str | Path, sqlite: str | Path, *, include_blobs: bool = False
) -> list[str]:
    """``nsys export --type=sqlite`` of ``report`` into ``sqlite`` (payload blobs on request)."""
    args = [str(nsys), "export", "--type=sqlite"]
    if include_blobs:
        args.append("--include-blobs=true")
    return [*args, "--force-overwrite=true", f"--output={sqlite}", str(report)]


def ncu_profile_args(options: NcuOptions, output: str | Path) -> list[str]:
    """The options part of an ``ncu`` command line (everything before the program).

    Examples
    --------
    >>> ncu_profile_args(NcuOptions(set="basic", launch_count=3), "out/report")
    ['--set', 'basic', '--launch-count', '3', '--export', 'out/report']
    """
    args: list[str] = []
    if options.set:
        args += ["--set", options.set]
    for section in options.sections:
        args += ["--section", section]
    if options.metrics:
        args += ["--metrics", ",".join(options.metrics)]
    if options.kernel_name_base:
        args += ["--kernel-name-base", options.kernel_name_base]
    if options.kernel_name:
        args += ["--kernel-name", options.kernel_name]
    if options.kernel_id:
        args += ["--kernel-id", options.kernel_id]
    if options.filter_mode:
        args += ["--filter-mode", options.filter_mode]
    if options.launch_skip_before_match is not None:
        args += ["--launch-skip-before-match", str(options.launch_skip_before_match)]
    if options.launch_skip is not None:
        args += ["--launch-skip", str(options.launch_skip)]
    if options.launch_count is not None:
        args += ["--launch-count", str(options.launch_count)]
    if options.uses_nvtx:
        args.append("--nvtx")
    for expr in options.nvtx_include:
        args += ["--nvtx-include", expr]
    for expr in options.nvtx_exclude:
        args += ["--nvtx-exclude", expr]
    if options.replay_mode:
        args += ["--replay-mode", options.replay_mode]
    if options.graph_profiling:
        args += ["--graph-profiling", options.graph_profiling]
    if options.target_processes:
        args += ["--target-processes", options.target_processes]
    if options.target_processes_filter:
        args += ["--target-processes-filter", options.target_processes_filter]
    if options.devices:
        args += ["--devices", options.devices]
    if options.clock_control:
        args += ["--clock-control", options.clock_control]
    if options.cache_control:
        args += ["--cache-control", options.cache_control]
    if options.import_source is not None:
        args += ["--import-source", _yes_no(options.import_source)]
    if options.import_sass is not None:
        args += ["--import-sass", _yes_no(options.import_sass)]
    args.extend(options.extra_args)
    return [*args, "--export", str(output)]


def ncu_profile_command(
    ncu: str | Path, options: NcuOptions, output: str | Path, program: Sequence[str]
) -> list[str]:
    """``ncu OPTIONS --export OUTPUT PROGRAM…`` (ncu adds ``.ncu-rep``; nothing is overwritten)."""
    return [str(ncu), *ncu_profile_args(options, output), *program]


def ncu_csv_command(ncu: str | Path, report: str | Path) -> list[str]:
    """``ncu --import REPORT --csv --page raw --print-units base`` (one row per profiled kernel)."""
    return [str(ncu), "--import", str(report), "--csv", "--page", "raw", "--print-units", "base"]


# --- torchrun: one profiler per rank ------------------------------------------------------------

_TORCHRUN_FLAGS = {
    "--standalone", "--no-python", "--no_python", "-m", "--module", "--run-path", "--run_path",
    "--virtual-local-rank", "--virtual_local_rank",
}  # fmt: skip


def _is_torchrun(command: Sequence[str]) -> int:
    """How many leading tokens name the launcher (``torchrun`` or ``python -m torch.distributed.run``)."""
    if not command:
        return 0
    if Path(command[0]).name == "torchrun":
        return 1
    launchers = ("torch.distributed.run", "torch.distributed.launch")
    is_python = re.match(r"python[\d.]*$", Path(command[0]).name)
    if len(command) >= 3 and is_python and command[1] == "-m" and command[2] in launchers:
        return 3
    return 0


def split_torchrun(command: Sequence[str]) -> tuple[list[str], list[str], dict[str, bool]]:
    """Split a torchrun command into the launcher part and the per-rank program part.

    Returns
    -------
    launcher
        The launcher and its own options (``torchrun --nproc-per-node 2``).
    program
        The script (or executable with ``--no-python``, or ``-m module``) and its arguments.
    flags
        ``{"no_python": …, "module": …}`` as given to the launcher.

    Examples
    --------
    >>> split_torchrun(["torchrun", "--nproc-per-node", "2", "decode.py", "--tp", "2"])[:2]
    (['torchrun', '--nproc-per-node', '2'], ['decode.py', '--tp', '2'])
    """
    start = _is_torchrun(command)
    if not start:
        msg = (
            f"per-rank capture needs a torchrun command (torchrun … or python -m torch.distributed.run …), "
            f"not {command[0] if command else 'nothing'!r}; drop per_rank or start the command with torchrun"
        )
        raise CaptureError(msg)
    flags = {"no_python": False, "module": False}
    i = start
    while i < len(command):
        token = command[i]
        if token == "--":
            i += 1
            break
        if not token.startswith("-"):
            break
        if token in _TORCHRUN_FLAGS:
            flags["no_python"] |= token in ("--no-python", "--no_python")
            flags["module"] |= token in ("-m", "--module")
            i += 1
        elif "=" in token:
            i += 1
        else:
            i += 2
    if i >= len(command):
        msg = "the torchrun command names no script to run; add the training/serving script after the launcher options"
        raise CaptureError(msg)
    own = [t for t in command[start:i] if t not in ("-m", "--module", "--")]
    launcher = [*command[:start], *own]
    return launcher, list(command[i:]), flags


def per_rank_command(
    command: Sequence[str], profiler_prefix: Sequence[str], python: str = "python3"
) -> list[str]:
    """Put ``profiler_prefix`` (``nsys profile … -o …%q{RANK}``) inside the torchrun launcher.

    ``torchrun ARGS script.py A`` becomes
    ``torchrun ARGS --no-python PROFILER… python script.py A``, so each rank runs under its own
    profiler and writes its own report.

    Examples
    --------
    >>> per_rank_command(["torchrun", "--nproc-per-node=2", "t.py"], ["nsys", "profile"], "py")
    ['torchrun', '--nproc-per-node=2', '--no-python', 'nsys', 'profile', 'py', 't.py']
    """
    launcher, program, flags = split_torchrun(command)
    if flags["no_python"]:
        target = program
    elif flags["module"]:
        target = [python, "-m", *program]
    else:
        target = [python, *program]
    if "--no-python" not in launcher and "--no_python" not in launcher:
        launcher.append("--no-python")
    return [*launcher, *profiler_prefix, *target]


# --- nsys -> ncu handoff --------------------------------------------------------------------------


def kernel_function_name(name: str) -> str:
    """The ``function`` base name ncu matches by default: no return type, scope, template or parameters.

    Examples
    --------
    >>> kernel_function_name("void at::native::vectorized_elementwise_kernel<4, float>(int, float*)")
    'vectorized_elementwise_kernel'
    >>> kernel_function_name("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_tn")
    'ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_tn'
    """
    head = name.strip()
    if head.endswith(")"):  # drop the parameter list: the trailing, balanced "(...)"
        depth = 0
        for i in range(len(head) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(head[i], 0)
            if depth == 0:
                head = head[:i]
                break
    out, depth = [], 0
    for ch in head:  # drop template arguments
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(ch)
    base = "".join(out).strip().rsplit("::", 1)[-1].split(" ")[-1]
    return base or name


def kernel_name_regex(names: Iterable[str]) -> str:
    """A ``regex:`` filter for ncu's ``--kernel-name`` matching exactly the given kernels.

    Examples
    --------
    >>> kernel_name_regex(["void k1<int>(int)", "gemm_tn"])
    'regex:^(?:k1|gemm_tn)$'
    """
    bases = list(dict.fromkeys(kernel_function_name(n) for n in names if n))
    if not bases:
        msg = "no kernel names to hand over to ncu; the nsys step found no kernels"
        raise CaptureError(msg)
    return "regex:^(?:" + "|".join(re.escape(b) for b in bases) + ")$"


def kernel_filter_from_command(argv: Sequence[str]) -> str | None:
    """The ``--kernel-name``/``-k`` value of an ncu command line, or ``None``."""
    for i, token in enumerate(argv):
        if token in ("-k", "--kernel-name") and i + 1 < len(argv):
            return argv[i + 1]
        if token.startswith("--kernel-name="):
            return token.split("=", 1)[1]
    return None


def option_flags(argv: Sequence[str]) -> list[str]:
    """The long options (``--name``) used in a profiler argument list, without values."""
    return list(
        dict.fromkeys(t.split("=", 1)[0] for t in argv if t.startswith("--") and len(t) > 2)
    )
