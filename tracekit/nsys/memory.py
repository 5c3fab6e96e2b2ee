"""What memory this process can still take, as far as is cheap to know (Linux's ``/proc`` and
cgroup files, ``RLIMIT_AS``). Standard library only: the CLI asks before polars is imported
(:mod:`tracekit.nsys.readahead`); the export reader before every large read
(:mod:`tracekit.nsys.database`)."""

from __future__ import annotations

from pathlib import Path


def free_memory() -> int | None:
    """Bytes this process can still allocate, as far as is cheap to know: the address-space
    limit (``RLIMIT_AS``) less what is mapped, the cgroup's ``memory.max`` less its usage and
    the machine's available memory and free swap; None when none is known (not Linux)."""
    import resource

    bounds = []
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    if soft != resource.RLIM_INFINITY:  # /proc/self/status only when there is a limit (it is called often)
        status = _kb_fields("/proc/self/status")
        if "VmSize" in status:
            bounds.append(soft - status["VmSize"])
    meminfo = _kb_fields("/proc/meminfo")
    if "MemAvailable" in meminfo:
        bounds.append(meminfo["MemAvailable"] + meminfo.get("SwapFree", 0))
    cgroup = cgroup_free()
    if cgroup is not None:
        bounds.append(cgroup)
    return max(min(bounds), 0) if bounds else None


def cgroup_free(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Bytes the cgroup (v2) can still take: ``memory.max`` less ``memory.current``, less the
    page cache in it (``active_file`` + ``inactive_file`` of ``memory.stat``), which the kernel
    reclaims before it refuses memory. ``memory.current`` counts that cache: once an export
    larger than the headroom had been read, it filled the cgroup to its limit and every read of
    a large table was refused although the memory was there. None without a limit."""
    try:
        limit = (root / "memory.max").read_text().strip()
        if limit == "max":
            return None
        used = int((root / "memory.current").read_text())
    except (OSError, ValueError):
        return None
    cache = 0
    try:
        for line in (root / "memory.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name in ("active_file", "inactive_file") and value.strip().isdigit():
                cache += int(value)
    except OSError:
        pass
    try:
        return int(limit) - max(used - cache, 0)
    except ValueError:
        return None


def _kb_fields(path: str) -> dict[str, int]:
    """``Name: <n> kB`` lines of a /proc file, in bytes."""
    out = {}
    try:
        with open(path) as fh:
            for line in fh:
                name, _, rest = line.partition(":")
                parts = rest.split()
                if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
                    out[name] = int(parts[0]) * 1024
    except OSError:
        pass
    return out
