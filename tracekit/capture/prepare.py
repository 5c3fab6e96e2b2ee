"""Everything settled before the program starts: pre-flight, command lines, folder and snapshots.

:func:`preflight_check` runs every check that can fail early; :func:`plan` and
:func:`profiler_command` give the exact command lines; :func:`experiment_folder` picks a fresh
``<out>/<name>_<mode>_<timestamp>/``; :func:`environment_snapshot` and :func:`gpu_info` record
what the program ran with.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from tracekit.capture import commands as cmds
from tracekit.capture import preflight
from tracekit.capture.options import Experiment, NcuOptions
from tracekit.errors import CaptureError
from tracekit.tools import Tool

ENV_PREFIXES = ("CUDA_", "NCCL_", "NVSHMEM_", "TORCH_", "PYTORCH_", "NSYS_", "NV_", "OMP_", "SLURM_",
                "OMPI_", "PMI_", "TRITON_", "VLLM_", "NVIDIA_", "TRACEKIT_")  # fmt: skip
ENV_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
             "LD_LIBRARY_PATH", "PATH", "PYTHONPATH", "HOSTNAME", "VIRTUAL_ENV", "CONDA_PREFIX")  # fmt: skip
GPU_QUERY = ("index", "name", "uuid", "pci.bus_id", "driver_version", "memory.total", "clocks.max.sm",
             "clocks.max.mem", "power.limit", "compute_mode")  # fmt: skip


def experiment_folder(
    out: str | Path, name: str, mode: str, *, now: datetime | None = None
) -> Path:
    """Create and return ``<out>/<name>_<mode>_<YYYYmmdd-HHMMSS>/``, adding ``-2``, ``-3``… if taken."""
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    base = Path(out) / f"{name}_{mode.replace('+', '-')}_{stamp}"
    Path(out).mkdir(parents=True, exist_ok=True)
    for attempt in range(1, 10_000):
        folder = base if attempt == 1 else base.with_name(f"{base.name}-{attempt}")
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder
    msg = f"could not find a free folder name beside {base}; clean up {out}"
    raise CaptureError(msg)


def environment_snapshot(env: Mapping[str, str]) -> dict[str, str]:
    """The variables that shape a GPU run (CUDA_*, NCCL_*, RANK…), without the rest (tokens, keys)."""
    return {k: v for k, v in sorted(env.items()) if k in ENV_NAMES or k.startswith(ENV_PREFIXES)}


def gpu_info(timeout_s: float = 20.0) -> dict[str, Any]:
    """``nvidia-smi --query-gpu`` as a list of dicts (``{"error": …}`` when nvidia-smi is absent or fails)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {"error": "nvidia-smi not found on PATH", "gpus": []}
    argv = [smi, f"--query-gpu={','.join(GPU_QUERY)}", "--format=csv,noheader,nounits"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"nvidia-smi failed: {exc}", "gpus": []}
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout).strip()[:500], "gpus": [], "command": argv}
    gpus = [
        dict(zip(GPU_QUERY, (v.strip() for v in line.split(",")), strict=False))
        for line in proc.stdout.splitlines()
        if line.strip()
    ]
    return {"gpus": gpus, "command": argv}


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


def program_env(exp: Experiment, folder: str | Path | None = None) -> dict[str, str]:
    """The environment the program gets: this process's, the experiment's ``env`` on top.

    A capture range opened by an NVTX range adds ``NSYS_NVTX_PROFILER_REGISTER_ONLY=0``: without it
    nsys only sees registered strings, and PyTorch's ranges are not registered. Mode ``torch``
    adds :func:`profile_env` with the traces going to ``folder`` (``<folder>`` until it exists).
    """
    env = dict(os.environ)
    if exp.mode in ("nsys", "nsys+ncu") and exp.nsys.capture_range == "nvtx":
        env.setdefault("NSYS_NVTX_PROFILER_REGISTER_ONLY", "0")
    env.update(exp.env)
    if exp.annotate_torch is not None:
        env.update(annotation_env(exp.annotate_torch, env.get("PYTHONPATH")))
    if exp.mode == "torch":
        env.update(profile_env(exp.torch.profile_config(folder or "<folder>"), env.get("PYTHONPATH")))
    return env


#: The folder whose ``sitecustomize.py`` installs the per-module NVTX hooks (``--annotate-torch``)
#: or starts ``torch.profiler`` (mode ``torch``) in every Python process of the program.
AUTOLOAD_DIR = Path(__file__).resolve().parent / "torch_autoload"
#: The variable holding mode ``torch``'s settings (JSON) for ``torch_profile.py``.
PROFILE_ENV = "TRACEKIT_TORCH_PROFILE"


def _autoload_path(pythonpath: str | None) -> str:
    """``PYTHONPATH`` with :data:`AUTOLOAD_DIR` first (Python then runs its ``sitecustomize`` at start-up)."""
    parts = [str(AUTOLOAD_DIR), *[p for p in (pythonpath or "").split(os.pathsep) if p and p != str(AUTOLOAD_DIR)]]
    return os.pathsep.join(parts)


def annotation_env(config: Mapping[str, Any], pythonpath: str | None = None) -> dict[str, str]:
    """The variables that make every Python process of the program range its torch modules:
    :data:`AUTOLOAD_DIR` first on ``PYTHONPATH`` and the wanted ranges as JSON in
    ``TRACEKIT_ANNOTATE_TORCH``."""
    return {"PYTHONPATH": _autoload_path(pythonpath), "TRACEKIT_ANNOTATE_TORCH": json.dumps(dict(config), sort_keys=True)}


def profile_env(config: Mapping[str, Any], pythonpath: str | None = None) -> dict[str, str]:
    """The variables that make every Python process of the program that imports ``torch`` run
    ``torch.profiler`` (mode ``torch``): :data:`AUTOLOAD_DIR` first on ``PYTHONPATH`` and
    ``config`` (:meth:`~tracekit.capture.options.TorchOptions.profile_config`) as JSON in
    :data:`PROFILE_ENV`. torchrun's workers inherit both: each rank writes its own trace."""
    return {"PYTHONPATH": _autoload_path(pythonpath), PROFILE_ENV: json.dumps(dict(config), sort_keys=True)}


def _python_for(exp: Experiment) -> str:
    """The interpreter a per-rank wrapper should start: the launcher's own when it names one."""
    first = exp.command[0]
    if re.match(r"python[\d.]*$", Path(first).name):
        return first
    path = shutil.which(first)
    if path:
        try:
            with open(path, "rb") as fh:
                shebang = fh.readline().decode(errors="replace")
        except OSError:
            shebang = ""
        if shebang.startswith("#!") and "python" in shebang:
            return (
                shebang[2:].split()[0] if "env" not in shebang.split()[0] else shebang.split()[-1]
            )
    return sys.executable


def profiler_command(
    exp: Experiment,
    tool: str,
    path: str | Path,
    folder: Path,
    ncu_options: NcuOptions | None = None,
) -> list[str]:
    """The exact command line of one profiler step (per-rank wrapping included)."""
    if tool == "nsys":
        output = folder / exp.nsys.output_name
        prefix = [str(path), "profile", *cmds.nsys_profile_args(exp.nsys, output)]
    else:
        opts = ncu_options or exp.ncu
        prefix = [str(path), *cmds.ncu_profile_args(opts, folder / opts.output_name)]
    if exp.per_rank:
        return cmds.per_rank_command(exp.command, prefix, _python_for(exp))
    return [*prefix, *exp.command]


def plan(exp: Experiment, folder: str | Path = "<folder>") -> list[tuple[str, list[str]]]:
    """The command lines a run of ``exp`` would start, without running or checking anything.

    In mode ``nsys+ncu`` there is one ncu pass per top kernel, whose names come from the nsys
    results; the plan shows ``TOP_KERNEL_<i>_FROM_NSYS`` in their place.
    """
    folder = Path(folder)
    nsys_path = exp.nsys_path or "nsys"
    ncu_path = exp.ncu_path or "ncu"
    steps: list[tuple[str, list[str]]] = []
    if exp.mode == "none":
        steps.append(("run", list(exp.command)))
    if exp.mode == "torch":  # the profiler starts inside the program (profile_env)
        steps.append(("torch", list(exp.command)))
    if exp.mode in ("nsys", "nsys+ncu"):
        steps.append(("nsys", profiler_command(exp, "nsys", nsys_path, folder)))
        if exp.nsys.export_sqlite:
            report = folder / f"{exp.nsys.output_name}.nsys-rep"
            steps.append(
                (
                    "export",
                    cmds.nsys_export_command(
                        nsys_path,
                        report,
                        report.with_suffix(".sqlite"),
                        include_blobs=exp.nsys.include_blobs is True,
                    ),
                )
            )
    if exp.mode == "ncu":
        steps.append(("ncu", profiler_command(exp, "ncu", ncu_path, folder)))
    if exp.mode == "nsys+ncu":  # one pass per kernel; the names come from the nsys results
        for p in _placeholder_passes(exp):
            steps.append((p.step, profiler_command(exp, "ncu", ncu_path, folder, p.options)))
    return steps


def _placeholder_passes(exp: Experiment) -> list[Any]:
    """The handoff's ncu passes with ``TOP_KERNEL_<i>_FROM_NSYS`` for the kernel names."""
    from tracekit.capture.handoff import handoff_passes

    names = [{"name": f"TOP_KERNEL_{i}_FROM_NSYS"} for i in range(1, exp.top_n + 1)]
    return handoff_passes(exp, {"top_kernels": names}, [])


def check_start_up_hook(command: tuple[str, ...] | list[str]) -> None:
    """Raise when the Python that runs ``command`` is told to skip the start-up hook of mode
    ``torch`` (``-I``, ``-E`` ignore ``PYTHONPATH``; ``-S`` skips ``sitecustomize``)."""
    if not re.match(r"python[\d.]*$", Path(command[0]).name):
        return
    for token in command[1:]:
        if not re.fullmatch(r"-[A-Za-z]+", token) or token in ("-m", "-c"):
            break
        if token[1] in "WX":  # -Wdefault, -Xdev: an option's value, not flags
            continue
        flags = sorted(set(token[1:]) & set("IES"))
        if flags:
            msg = (f"{command[0]} {token} skips the start-up hook that starts torch.profiler (-I/-E ignore PYTHONPATH, "
                   "-S skips sitecustomize); run the program without it")
            raise CaptureError(msg)


def preflight_check(
    exp: Experiment, env: Mapping[str, str] | None = None, *, system_checks: bool = True
) -> tuple[dict[str, Tool], list[str]]:
    """Every check that can fail before anything runs; returns the tools found and notes.

    With ``system_checks=False`` the machine checks (nsys importer libraries, counter
    permission) are skipped; the program, tools, options and output folder are still checked.

    Raises
    ------
    CaptureError, ToolNotFoundError
        With one line that says what to fix.
    """
    env = program_env(exp) if env is None else env
    notes: list[str] = []
    preflight.check_program(exp.command, exp.cwd, env)
    if exp.per_rank:
        cmds.split_torchrun(exp.command)
    if exp.mode == "torch":
        check_start_up_hook(exp.command)
    tools: dict[str, Tool] = {}
    if exp.mode in ("nsys", "nsys+ncu"):
        if exp.nsys.capture_range == "nvtx" and not exp.nsys.nvtx_capture:
            msg = "capture_range='nvtx' needs the range that opens the capture; pass --nvtx-capture NAME[@DOMAIN]"
            raise CaptureError(msg)
        nsys = tools["nsys"] = preflight.resolve_tool("nsys", exp.nsys_path)
        flags = cmds.option_flags(cmds.nsys_profile_args(exp.nsys, "x"))
        preflight.check_flags_supported(nsys, flags, preflight.help_text(str(nsys.path), "profile"))
        if exp.nsys.export_sqlite and exp.nsys.include_blobs is True:
            preflight.check_flags_supported(
                nsys, ["--include-blobs"], preflight.help_text(str(nsys.path), "export")
            )
        if system_checks:
            notes += preflight.check_importer(nsys.path, env)
        if system_checks and exp.nsys.gpu_metrics_devices not in (None, "none"):
            preflight.check_counter_permission("nsys GPU metrics sampling")
    if exp.mode in ("ncu", "nsys+ncu"):
        ncu = tools["ncu"] = preflight.resolve_tool("ncu", exp.ncu_path)
        ncu_options = _placeholder_passes(exp)[0].options if exp.mode == "nsys+ncu" else exp.ncu
        flags = cmds.option_flags(cmds.ncu_profile_args(ncu_options, "x"))
        preflight.check_flags_supported(ncu, flags, preflight.help_text(str(ncu.path)))
        if system_checks:
            preflight.check_counter_permission("ncu")
    preflight.check_writable(Path(exp.out))
    return tools, notes
