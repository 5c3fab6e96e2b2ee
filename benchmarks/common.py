"""Shared helpers of the benchmark scripts: paths, machine facts, timed subprocesses, tables.

Every measured variant runs in a fresh subprocess so that its wall time and peak RSS are its
own; :func:`run_measured` waits for it with ``os.wait4``, whose resource usage covers the child
and the descendants it waited for (nsys runs its report scripts in child processes).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
OUT = BENCH_DIR / "out"
DEFAULT_BIG = OUT / "big.sqlite"
DEFAULT_SEEDS = (
    REPO / "sample_traces" / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite",
    REPO.parent / "shared" / "corpus" / "nsys" / "nsys2026.2_nsysai_mfu_2xh100_nccl_slice.sqlite",
)
#: Where `nsys` from Debian's ``nsight-systems-target`` .deb is unpacked (see README.md).
NSYS_CANDIDATES = (
    Path("/opt/nsys-debian/usr/lib/x86_64-linux-gnu/nsight-systems/target-linux-x64/nsys"),
)


@dataclass
class Measured:
    """One subprocess run: wall time, peak RSS of its process tree, exit code, what it printed."""

    wall_s: float
    peak_rss_mb: float
    returncode: int
    stdout: str
    stderr: str
    cpu_s: float = 0.0  # user + system time of the child and its waited-for descendants
    others_cores: float = 0.0  # busy CPU (incl. steal) not spent by the child ÷ wall: noise


def _busy_s() -> float:
    """CPU seconds all cores spent busy so far, steal included (from /proc/stat)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def run_measured(
    argv: list[str],
    *,
    stdout_path: Path | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Measured:
    """Run ``argv`` and measure it; stdout goes to ``stdout_path`` when given (kept otherwise)."""
    import tempfile

    with tempfile.TemporaryFile() as err_fh, tempfile.TemporaryFile() as tmp_out:
        out_fh = stdout_path.open("wb") if stdout_path is not None else tmp_out
        try:
            busy0 = _busy_s()
            t0 = time.perf_counter()
            # files, not pipes: nothing is read while the child runs, and Popen never reaps it,
            # so os.wait4 gets the child's own resource usage
            proc = subprocess.Popen(argv, stdout=out_fh, stderr=err_fh, env=env, cwd=cwd)
            _, status, usage = os.wait4(proc.pid, 0)
            wall = time.perf_counter() - t0
            busy = _busy_s() - busy0
            proc.returncode = os.waitstatus_to_exitcode(status)
        finally:
            if stdout_path is not None:
                out_fh.close()
        err_fh.seek(0)
        tmp_out.seek(0)
        err_b, out_b = err_fh.read(), tmp_out.read()
    return Measured(
        wall_s=wall,
        peak_rss_mb=usage.ru_maxrss / 1024.0,  # Linux reports KiB
        returncode=proc.returncode,
        stdout=out_b.decode(errors="replace"),
        stderr=err_b.decode(errors="replace"),
        cpu_s=usage.ru_utime + usage.ru_stime,
        others_cores=max(0.0, busy - (usage.ru_utime + usage.ru_stime)) / wall if wall > 0 else 0.0,
    )


def wait_for_idle(max_wait_s: float = 30.0, max_busy_cores: float = 0.5) -> float:
    """Wait until other processes use less than ``max_busy_cores`` (1 s samples, steal included).

    Returns the busy cores of the last sample; gives up after ``max_wait_s`` (the machine is
    shared with other sessions, so a quiet moment may not come).
    """
    deadline = time.monotonic() + max_wait_s
    while True:
        b0, t0 = _busy_s(), time.monotonic()
        time.sleep(1.0)
        busy = (_busy_s() - b0) / (time.monotonic() - t0)
        if busy < max_busy_cores or time.monotonic() >= deadline:
            return busy


def find_nsys() -> Path | None:
    """The nsys CLI: ``$NSYS``, then the unpacked Debian package, then ``nsys`` on the PATH."""
    env = os.environ.get("NSYS")
    if env:
        return Path(env)
    for cand in NSYS_CANDIDATES:
        if cand.exists():
            return cand
    found = shutil.which("nsys")
    return Path(found) if found else None


def nsys_version(nsys: Path) -> str:
    try:
        out = subprocess.run(
            [str(nsys), "--version"], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "unavailable"
    return out.strip().removeprefix("NVIDIA Nsight Systems version ").strip() or "unknown"


def sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def warm_page_cache(path: Path) -> None:
    """Read the file once so every variant starts with it in the page cache (all runs are warm)."""
    with path.open("rb") as fh:
        while fh.read(1 << 24):
            pass


def machine() -> dict[str, Any]:
    """CPU model, cores, RAM, OS and Python, for the README."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return {
        "loadavg_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gib": mem_gib,
        "os": platform.platform(),
        "python": platform.python_version(),
    }


def versions() -> dict[str, str]:
    """Versions of the libraries the benchmarks compare."""
    import importlib.metadata as md

    out = {}
    for dist in (
        "tracekit",
        "polars",
        "pyarrow",
        "adbc-driver-sqlite",
        "adbc-driver-manager",
        "pandas",
    ):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = "absent"
    import sqlite3

    out["sqlite (stdlib)"] = sqlite3.sqlite_version
    return out


def source_state() -> str:
    """``git`` commit of the checkout and whether ``tracekit/`` has uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--", "tracekit"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head or 'unknown'}{' + uncommitted tracekit/ changes' if dirty else ''}"


def table_info(path: Path) -> dict[str, int]:
    """Row counts of the tables the benchmarks read."""
    import sqlite3

    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        counts = {}
        for t in (
            "CUPTI_ACTIVITY_KIND_KERNEL",
            "CUPTI_ACTIVITY_KIND_RUNTIME",
            "CUPTI_ACTIVITY_KIND_MEMCPY",
            "CUPTI_ACTIVITY_KIND_MEMSET",
            "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
            "NVTX_EVENTS",
            "GPU_METRICS",
            "StringIds",
        ):
            if t in names:
                counts[t] = con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]
        return counts
    finally:
        con.close()


def print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    """A rich table on a terminal-less stdout too (plain text when rich is absent)."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(title)
        print(" | ".join(header))
        for row in rows:
            print(" | ".join(row))
        return
    table = Table(title=title)
    for i, h in enumerate(header):
        table.add_column(h, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    Console(width=220).print(table)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    align = ["---"] + ["---:"] * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_results(name: str, payload: dict[str, Any], markdown: str) -> tuple[Path, Path]:
    """Write ``out/<name>.json`` (``payload`` plus where it was measured: tracekit source,
    machine, versions, command line) and ``out/<name>.md``."""
    OUT.mkdir(parents=True, exist_ok=True)
    jpath, mpath = OUT / f"{name}.json", OUT / f"{name}.md"
    record = {
        "tracekit_source": source_state(),
        "machine": machine(),
        "versions": versions(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        **payload,
    }
    jpath.write_text(json.dumps(record, indent=2, default=_jsonable) + "\n")
    mpath.write_text(markdown)
    return jpath, mpath


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "__dataclass_fields__"):
        return asdict(obj)
    raise TypeError(type(obj))


def fmt_s(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def fmt_ratio(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}×"


def python() -> str:
    return sys.executable


_FALLBACK = (
    "import sys; import tracekit; from tracekit.stats import run_report; "
    "t = tracekit.open(sys.argv[2]); sys.stdout.write(run_report(t, sys.argv[1], convention='2023').to_csv())"
)


def tracekit_command(python: str) -> tuple[list[str], str]:
    """argv prefix for `tracekit stats` (the CLI when it works, else an equivalent python -c)."""
    exe = Path(python).with_name("tracekit")
    try:
        help_text = subprocess.run(
            [str(exe), "stats", "--help"], capture_output=True, text=True, timeout=120
        ).stdout
    except (OSError, subprocess.SubprocessError):
        help_text = ""
    if "--report" in help_text and "--convention" in help_text:
        return [str(exe), "stats", "-f", "csv", "--convention", "2023", "-r"], "tracekit stats CLI"
    return [python, "-c", _FALLBACK], "python -c run_report(...).to_csv() (CLI unavailable)"


def precompile_tracekit(tree: Path = REPO) -> None:
    """Compile the modules of ``tree/tracekit`` (this checkout's by default; a ``--before``
    tree too) to bytecode before timing anything.

    An installed wheel has its ``.pyc`` files; a source checkout run with
    ``PYTHONDONTWRITEBYTECODE=1`` (as on the benchmark machine) would otherwise recompile
    every imported tracekit module in every child: 0.05–0.1 s per process that no user pays
    (a ``git archive`` tree, with no ``.pyc`` at all, every module).
    """
    subprocess.run([python(), "-m", "compileall", "-q", str(tree / "tracekit")], check=False, capture_output=True)


def drop_kept_reports(cache: Path) -> None:
    """Delete the report CSVs ``tracekit stats`` kept under ``cache`` (the columns stay), so the
    next run computes its report from the cached columns."""
    for folder in cache.glob("columns/*/reports"):
        shutil.rmtree(folder, ignore_errors=True)
