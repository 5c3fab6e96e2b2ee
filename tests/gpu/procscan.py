"""What a GPU check leaves running: the live processes whose command line or environment
marks them as the run's (standard library only: it runs on the device machine).

Shared by ``agent_e2e.py`` and ``stop_e2e.py``; each says which processes are its own."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Collection
from pathlib import Path

#: The marker every process of a tracekit capture inherits.
MARKER = b"TRACEKIT_RUN_ID="


def processes(ours: Callable[[str, str | None], bool], *, skip: Collection[int] = (), cmd_chars: int = 200) -> list[dict[str, object]]:
    """Live processes (not this one, not ``skip``, not zombies) for which ``ours(cmd, marker)``
    holds, ``cmd`` being the command line and ``marker`` the ``TRACEKIT_RUN_ID=…`` entry of
    the environment (or None): ``pid``, ``ppid``, ``pgid``, ``sid``, ``marker``, ``cmd`` (cut
    at ``cmd_chars``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid() or int(entry.name) in skip:
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            env = (entry / "environ").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        marker = next((e.decode() for e in env if e.startswith(MARKER)), None)
        if ours(cmd, marker) and stat[0] not in ("Z", "X"):
            found.append({"pid": int(entry.name), "ppid": int(stat[1]), "pgid": int(stat[2]), "sid": int(stat[3]),
                          "marker": marker, "cmd": cmd[:cmd_chars]})
    return found


def kill_all(pids: list[int]) -> list[int]:
    """SIGKILL each of ``pids`` (gone ones skipped), wait 2 s, return ``pids``."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    time.sleep(2)
    return pids
