"""Checks before and after a capture, each failing with one line that says what to do.

Before: the program exists, the output folder is writable, the profilers are found
(:func:`resolve_tool`), they accept every option asked for (their ``--help``), the nsys report
importer has its shared libraries, and the GPU performance counters are open to this user.
After: nsys left a ``.qdstrm`` but no report (its importer failed), or ncu was refused the
counters (``ERR_NVGPUCTRPERM``).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from tracekit.errors import CaptureError, ToolNotFoundError
from tracekit.tools import Tool, find_tool, tool_version

_PRODUCT = {"nsys": "Nsight Systems", "ncu": "Nsight Compute"}
PARAMS_FILE = Path("/proc/driver/nvidia/params")


def resolve_tool(name: str, explicit: str | Path | None = None) -> Tool:
    """Find ``nsys`` or ``ncu``: an explicit path, else as :func:`tracekit.tools.find_tool` does.

    When no nsys is found but an ncu is, the nsys that Nsight Compute ships beside it
    (``<ncu folder>/host/target-linux-x64/nsys``) is used.

    Raises
    ------
    ToolNotFoundError
        With the install hint for the missing tool.
    """
    if explicit:
        path = Path(explicit).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            msg = f"{name} path {str(path)!r} is not an executable file; fix {name}_path or set {name.upper()}=/path/to/{name}"
            raise ToolNotFoundError(msg)
        return Tool(name, path, tool_version(path))
    found = find_tool(name, required=False)
    if found is not None:
        return found
    if name == "nsys":
        ncu = find_tool("ncu", required=False)
        if ncu is not None:
            for candidate in (ncu.path.parent / "host" / "target-linux-x64" / "nsys",):
                if candidate.is_file() and os.access(candidate, os.X_OK):
                    return Tool("nsys", candidate, tool_version(candidate))
    found = find_tool(name, required=True)
    assert found is not None  # find_tool raised otherwise
    return found


@functools.lru_cache(maxsize=32)
def help_text(path: str, *subcommand: str) -> str:
    """What ``path [subcommand] --help`` prints (empty when it cannot run)."""
    try:
        proc = subprocess.run(
            [path, *subcommand, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout + proc.stderr


def unsupported_flags(flags: Iterable[str], help_output: str) -> list[str]:
    """The long options in ``flags`` that ``help_output`` does not mention.

    An empty help text proves nothing, so nothing is reported then.

    Examples
    --------
    >>> unsupported_flags(["--trace", "--cuda-graph-trace"], "  -t, --trace=  ...\\n  --sample=")
    ['--cuda-graph-trace']
    """
    if not help_output.strip():
        return []
    return [f for f in flags if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", help_output)]


def check_flags_supported(tool: Tool, flags: Sequence[str], help_output: str) -> None:
    """Raise :class:`CaptureError` when ``tool`` is too old (or too new) for one of ``flags``."""
    missing = unsupported_flags(flags, help_output)
    if missing:
        version = tool.version or "(version unknown)"
        msg = (
            f"{tool.name} {version} at {tool.path} does not accept {', '.join(missing)}; "
            f"install a newer {_PRODUCT[tool.name]} (or point {tool.name.upper()}= at one) or drop that option"
        )
        raise CaptureError(msg)


def importer_candidates(nsys: Path) -> list[Path]:
    """Where nsys's report importer (``QdstrmImporter``) may live, relative to the nsys executable."""
    base = nsys.resolve().parent
    found: list[Path] = []
    for folder in (base, base.parent, *sorted(base.parent.glob("*-linux-*"))):
        candidate = folder / "QdstrmImporter"
        if candidate.is_file() and candidate not in found:
            found.append(candidate)
    return found


def missing_libraries(ldd_output: str) -> list[str]:
    """Library names ``ldd`` reported as ``not found``.

    Examples
    --------
    >>> missing_libraries("\\tlibc.so.6 => /lib/libc.so.6 (0x1)\\n\\tlibdw.so.1 => not found\\n")
    ['libdw.so.1']
    """
    return re.findall(r"^\s*(\S+)\s+=>\s+not found", ldd_output, flags=re.MULTILINE)


def check_importer(nsys: Path, env: Mapping[str, str] | None = None) -> list[str]:
    """Raise when nsys's importer lacks shared libraries; return notes on what could not be checked."""
    importers = importer_candidates(nsys)
    ldd = shutil.which("ldd")
    if not importers or ldd is None:
        return [
            f"could not check nsys's report importer ({'no ldd' if ldd is None else 'QdstrmImporter not found'})"
        ]
    for importer in importers:
        try:
            proc = subprocess.run(
                [ldd, str(importer)],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
                env=dict(env) if env is not None else None,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        missing = missing_libraries(proc.stdout + proc.stderr)
        if missing:
            hint = (
                "install libdw1 (apt-get install libdw1) or put the folder holding libdw.so.1 on LD_LIBRARY_PATH"
                if any(m.startswith("libdw") for m in missing)
                else "install them or add their folder to LD_LIBRARY_PATH"
            )
            msg = (
                f"nsys's report importer {importer} cannot load {', '.join(missing)}, so nsys would write a "
                f".qdstrm but no .nsys-rep; {hint}"
            )
            raise CaptureError(msg)
    return []


def profiling_restricted(params_path: Path = PARAMS_FILE) -> bool:
    """Whether the NVIDIA driver keeps GPU performance counters to administrators."""
    try:
        text = params_path.read_text()
    except OSError:
        return False
    match = re.search(r"^RmProfilingAdminOnly:\s*(\d+)", text, flags=re.MULTILINE)
    return bool(match and match.group(1) != "0")


def check_counter_permission(
    what: str, params_path: Path = PARAMS_FILE, euid: int | None = None
) -> None:
    """Raise when ``what`` (ncu, nsys GPU metrics) needs counters this user may not read."""
    uid = os.geteuid() if euid is None else euid
    if uid != 0 and profiling_restricted(params_path):
        msg = (
            f"{what} needs the GPU performance counters, which the driver keeps to administrators "
            "(ERR_NVGPUCTRPERM, RmProfilingAdminOnly=1); run as root, load nvidia with "
            "NVreg_RestrictProfilingToAdminUsers=0, or see https://developer.nvidia.com/ERR_NVGPUCTRPERM"
        )
        raise CaptureError(msg)


def check_writable(folder: Path) -> None:
    """Create ``folder`` if needed; raise when nothing can be written in it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        msg = f"cannot create the output folder {folder}: {exc.strerror or exc}; choose another --out or fix its permissions"
        raise CaptureError(msg) from exc
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        msg = f"the output folder {folder} is not writable; choose another --out or fix its permissions"
        raise CaptureError(msg)


def check_program(command: Sequence[str], cwd: str | Path | None, env: Mapping[str, str]) -> None:
    """Raise when the program to run is not found (before any profiler starts)."""
    program = command[0]
    if "/" in program:
        path = Path(cwd or ".") / program if not Path(program).is_absolute() else Path(program)
        if not path.exists():
            msg = f"program {program!r} does not exist; check the command after '--'"
            raise CaptureError(msg)
    elif shutil.which(program, path=env.get("PATH")) is None:
        msg = f"program {program!r} was not found on PATH; check the command after '--' or give its full path"
        raise CaptureError(msg)


# --- after the run ----------------------------------------------------------------------------


def nsys_outcome_error(folder: Path, reports: Sequence[Path], lines: Iterable[str]) -> str | None:
    """Why an nsys run produced no report, or ``None`` when it did; never ``None`` without a report."""
    if reports:
        return None
    text = list(lines)
    qdstrm = [str(p) for p in sorted(folder.glob("*.qdstrm"))]
    mentioned = [m for line in text for m in re.findall(r"(/[^\s\"')]+\.qdstrm)", line)]
    kept = qdstrm + [m for m in mentioned if Path(m).exists()]
    importer_trouble = any(
        "QdstrmImporter" in line or "libdw" in line or "mporter error" in line for line in text
    )
    no_report = any("No reports were generated" in line for line in text)
    if importer_trouble or kept or (mentioned and not no_report):
        where = (
            kept[0] if kept else (mentioned[0] + " (since removed)" if mentioned else "a .qdstrm")
        )
        return (
            f"nsys wrote {where} but no .nsys-rep: its importer failed (most likely libdw.so.1 is missing); "
            "install libdw1 or add the folder holding libdw.so.1 to LD_LIBRARY_PATH, then capture again"
        )
    if no_report:
        return (
            "nsys generated no report: the capture range never opened or no data was collected; "
            "check the capture range (cudaProfilerStart/Stop or the NVTX range name)"
        )
    # no report and nothing in nsys's output says why: still not a complete capture
    return (
        "nsys wrote no report and did not say why (see nsys.stderr.log): most often the capture "
        "range never opened (cudaProfilerStart/Stop or the NVTX range name) or the program exited first"
    )


def ncu_outcome_error(lines: Iterable[str]) -> str | None:
    """Why ncu failed to profile, when its output says (counter permission, driver connection)."""
    for line in lines:
        if "ERR_NVGPUCTRPERM" in line:
            return (
                "ncu was refused the GPU performance counters (ERR_NVGPUCTRPERM); run as root, load nvidia "
                "with NVreg_RestrictProfilingToAdminUsers=0, or see https://developer.nvidia.com/ERR_NVGPUCTRPERM"
            )
        if "LibraryNotLoaded" in line or "failed to connect to the CUDA driver" in line:
            return (
                "ncu could not attach to the CUDA driver (LibraryNotLoaded); sandboxed runtimes such as gVisor "
                "hide the counters, and a stub libcuda on LD_LIBRARY_PATH does too; run on a full VM or bare metal"
            )
    return None
