"""Finding the Nsight Systems (``nsys``) and Nsight Compute (``ncu``) command-line tools.

Search order: the ``NSYS`` / ``NCU`` environment variable, ``PATH``, the usual CUDA and
Nsight install folders (newest version first) and, for nsys, the copy that Nsight Compute
ships under ``host/target-linux-x64/nsys``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tracekit.errors import ToolNotFoundError

_INSTALL_ROOTS = ("/opt/nvidia", "/usr/local", "/usr/lib", "/opt")


@dataclass(frozen=True)
class Tool:
    """A profiler executable and the version it reports (``None`` when it printed none)."""

    name: str
    path: Path
    version: str | None


def _version_key(path: Path) -> tuple[int, ...]:
    numbers = re.findall(r"\d+", str(path))
    return tuple(int(n) for n in numbers)


def _candidates(tool: str) -> list[Path]:
    found: list[Path] = []
    env = os.environ.get(tool.upper())
    if env:
        found.append(Path(env))
    on_path = shutil.which(tool)
    if on_path:
        found.append(Path(on_path))
    patterns = {
        "nsys": [
            "nvidia/nsight-systems/*/bin/nsys",  # /opt/nvidia/nsight-systems/2025.3.1/bin/nsys
            "nsight-systems/*/bin/nsys",
            "nvidia/nsight-systems*/bin/nsys",
            "x86_64-linux-gnu/nsight-systems/target-linux-x64/nsys",  # Debian's nsight-systems-target
            "*/usr/lib/x86_64-linux-gnu/nsight-systems/target-linux-x64/nsys",  # that .deb unpacked under /opt
            "nsight-systems*/bin/nsys",
            "cuda*/bin/nsys",
            "cuda*/nsight-systems*/bin/nsys",
            "nsight-systems*/target-linux-x64/nsys",
            "nvidia/nsight-compute/*/host/target-linux-x64/nsys",
            "nsight-compute*/host/target-linux-x64/nsys",
            "cuda*/nsight-compute*/host/target-linux-x64/nsys",
        ],
        "ncu": [
            "nvidia/nsight-compute/*/ncu",
            "nsight-compute*/ncu",
            "cuda*/bin/ncu",
            "cuda*/nsight-compute*/ncu",
        ],
    }[tool]
    for root in _INSTALL_ROOTS:
        base = Path(root)
        if not base.is_dir():
            continue
        matches: list[Path] = []
        for pattern in patterns:
            matches.extend(p for p in base.glob(pattern) if p.is_file())
        found.extend(sorted(set(matches), key=_version_key, reverse=True))
    unique: list[Path] = []
    for path in found:
        if path not in unique:
            unique.append(path)
    return unique


def tool_version(path: Path, timeout_s: float = 30.0) -> str | None:
    """Return the version string ``path --version`` prints, or ``None``."""
    try:
        proc = subprocess.run(
            [str(path), "--version"], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"(\d{4}\.\d+(?:\.\d+)*)", proc.stdout + proc.stderr)
    return match.group(1) if match else None


def find_tool(tool: str, *, required: bool = True) -> Tool | None:
    """Locate ``nsys`` or ``ncu``.

    Parameters
    ----------
    tool
        ``"nsys"`` or ``"ncu"``.
    required
        Raise :class:`~tracekit.errors.ToolNotFoundError` when nothing is found (default);
        with ``False`` return ``None`` instead.
    """
    if tool not in ("nsys", "ncu"):
        msg = f"unknown tool {tool!r}; expected 'nsys' or 'ncu'"
        raise ValueError(msg)
    for path in _candidates(tool):
        if os.access(path, os.X_OK):
            return Tool(tool, path, tool_version(path))
    if not required:
        return None
    hint = {
        "nsys": "install Nsight Systems (or Nsight Compute, which ships an nsys) or set NSYS=/path/to/nsys",
        "ncu": "install Nsight Compute or set NCU=/path/to/ncu",
    }[tool]
    msg = f"{tool} was not found on PATH, in ${tool.upper()} or in the CUDA/Nsight install folders; {hint}"
    raise ToolNotFoundError(msg)
