"""Out of memory is one line that names the table and the ways around it (issue 19.6), checked
under a real address-space limit (``RLIMIT_AS``) in a subprocess, on an export built by
repeating a real one (``benchmarks/make_big_trace.py``, decode sample, 300 k kernels)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT, SAMPLES, build_big_trace

#: run in the subprocess: import everything the command needs and start the process as main()
#: does (polars' reader threads included), then allow only ``headroom`` more bytes of
#: address space than are mapped, then run the API or the CLI
SCRIPT = """
import resource, sys
import tracekit
from tracekit.cli.main import main, prepare_process
import tracekit.cli.summary, tracekit.nsys.summary, tracekit.cli.stats, tracekit.stats, tracekit.cli.diagnose, tracekit.diagnosis, tracekit.cli.report, tracekit.report.html, tracekit.cli.diff, tracekit.comparison  # noqa: F401  (imported before the limit)
from tracekit.errors import TraceMemoryError

def mapped():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024

path, headroom, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
trace = tracekit.open(path) if mode == "api" else None
prepare_process(sys.argv[4] if mode == "cli" else None)  # what main() does first, while the process still has room
resource.setrlimit(resource.RLIMIT_AS, (mapped() + headroom, resource.RLIM_INFINITY))
if mode == "api":
    try:
        trace.kernels
    except TraceMemoryError as exc:
        assert isinstance(exc, MemoryError)
        print("refused:", exc)
    sys.exit(0)
sys.exit(main(sys.argv[4:]))
"""


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_big_trace(tmp_path_factory.mktemp("big"), 300000)


def _run(big: Path, headroom: int, mode: str, *argv: str, tmp_path: Path, cache: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRACEKIT_CACHE": str(tmp_path / "cache"),
           "TRACEKIT_COLUMN_CACHE": "1" if cache else "0", "POLARS_MAX_THREADS": "1"}  # fmt: skip
    return subprocess.run([sys.executable, "-c", SCRIPT, str(big), str(headroom), mode, *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip


def test_reading_a_table_that_cannot_fit_is_one_error_naming_it(big: Path, tmp_path: Path) -> None:
    """300 k kernels × 23 columns need ~55 MB; with 40 MB of address space left the read is
    refused before it starts (it used to end in SIGABRT or "internal error: MemoryError")."""
    run = _run(big, 40 << 20, "api", tmp_path=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert lines[0].startswith("refused: big.sqlite: reading CUPTI_ACTIVITY_KIND_KERNEL (300,000 rows x ")
    assert "columns=" in lines[0] and "columns_on_demand" in lines[0] and "TRACEKIT_COLUMN_CACHE" in lines[0]
    assert len(lines) == 1


def test_the_cli_says_it_in_one_line(big: Path, tmp_path: Path) -> None:
    run = _run(big, 40 << 20, "cli", "summary", str(big), tmp_path=tmp_path)
    assert run.returncode == 2, run.stderr[-2000:]
    (line,) = run.stderr.splitlines()
    assert line.startswith("tracekit: error: big.sqlite: reading CUPTI_ACTIVITY_KIND_KERNEL (300,000 rows x ")
    assert "columns_on_demand" in line


def test_the_same_commands_pass_with_room(big: Path, tmp_path: Path) -> None:
    """The limit is what refused them: with 2 GB of headroom both run."""
    run = _run(big, 2 << 30, "cli", "summary", str(big), tmp_path=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stderr == ""


def test_less_room_is_still_an_error_not_a_crash(big: Path, tmp_path: Path) -> None:
    """With 16 MB left and the column cache on, polars itself may run out first (it cannot
    spawn a worker thread and panics): exit 2 with an out-of-memory error, never an internal
    error, a traceback or a signal. (polars prints its own panic lines before it, and its allocator may print one after.)"""
    run = _run(big, 16 << 20, "cli", "summary", str(big), tmp_path=tmp_path, cache=True)
    assert run.returncode == 2, run.stderr[-2000:]
    # jemalloc (polars' allocator) may also note a failed background thread, even after the error
    last = [line for line in run.stderr.splitlines() if not line.startswith("<jemalloc>")][-1]
    assert last.startswith("tracekit: error: ") and ("out of memory" in last or "needs about" in last)
    assert "Traceback" not in run.stderr and "internal error" not in run.stderr


def test_cgroup_page_cache_counts_as_free(tmp_path: Path) -> None:
    """cgroup v2's memory.current includes the page cache the kernel reclaims on demand. Files
    with the kernel's format (the numbers of a container that had just read a 3 GB export
    under a 4 GiB limit): 3.9 GiB current of which 3.2 GiB is file cache. Counting all of it as
    used left 0.1 GiB 'free', so reading any large table was refused up front."""
    from tracekit.nsys.memory import cgroup_free

    gib = 1 << 30
    (tmp_path / "memory.max").write_text(f"{4 * gib}\n")
    current = int(3.9 * gib)
    (tmp_path / "memory.current").write_text(f"{current}\n")
    active, inactive, anon = int(1.2 * gib), 2 * gib, current - int(3.2 * gib)
    (tmp_path / "memory.stat").write_text(
        f"anon {anon}\nfile {active + inactive + 4096}\nkernel 1048576\nshmem 4096\n"
        f"inactive_anon {anon}\nactive_anon 0\ninactive_file {inactive}\nactive_file {active}\nunevictable 0\n"
    )
    assert cgroup_free(tmp_path) == 4 * gib - anon  # 3.3 GiB, not 0.1 GiB
    (tmp_path / "memory.stat").unlink()  # no memory.stat: the usage as it is
    assert cgroup_free(tmp_path) == 4 * gib - current
    (tmp_path / "memory.max").write_text("max\n")
    assert cgroup_free(tmp_path) is None


WINDOW_SCRIPT = """
import resource, sys
import tracekit
from tracekit.errors import TraceMemoryError
from tracekit.nsys.gpu_metrics import gpu_metric_samples

def mapped():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024

db = tracekit.open(sys.argv[1]).db
lo, hi = 100_000_000, 101_000_000
gpu_metric_samples(db, ["sms_active"], start_ns=lo, end_ns=lo + 100_000)  # every import done first
resource.setrlimit(resource.RLIMIT_AS, (mapped() + int(sys.argv[2]), resource.RLIM_INFINITY))
try:
    print("read", gpu_metric_samples(db, ["sms_active"], start_ns=lo, end_ns=hi).height)
except TraceMemoryError as exc:
    print("refused:", exc)
"""


def test_a_short_window_of_a_large_table_is_not_refused(tmp_path: Path) -> None:
    """A read bounded by a rowid range (gpu_metric_samples of a 1 ms window: the export's
    perfetto window, trace.scan) was refused up front for the size of the whole table: 2.1 M
    GPU-metric samples x 4 columns 'need about 68 MB' with 30 MB left, for a read of a few
    rows. Now the estimate uses the rowid range."""
    big = tmp_path / "tp2_metrics.sqlite"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "make_big_trace.py"), "--kernels", "30000",
                    "--seed", str(SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"), "-o", str(big)],
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    import tracekit
    from tracekit.nsys.gpu_metrics import gpu_metric_samples

    db = tracekit.open(big).db
    assert db.row_count("GPU_METRICS") * 4 * 8 > 60 << 20  # the whole table does not fit in 30 MB
    want = gpu_metric_samples(db, ["sms_active"], start_ns=100_000_000, end_ns=101_000_000).height
    assert want > 0
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRACEKIT_CACHE": str(tmp_path / "cache"),
           "TRACEKIT_COLUMN_CACHE": "0", "POLARS_MAX_THREADS": "1"}  # fmt: skip
    run = subprocess.run([sys.executable, "-c", WINDOW_SCRIPT, str(big), str(30 << 20)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.splitlines() == [f"read {want}"]


def _last_line(stderr: str) -> str:
    # jemalloc (polars' allocator) may note a failed background thread, even after the error
    return [line for line in stderr.splitlines() if line and not line.startswith("<jemalloc>")][-1]


def test_a_cached_table_that_cannot_fit_is_one_error_naming_it(big: Path, tmp_path: Path) -> None:
    """Cached columns (the column cache's Arrow files) were read without the check: with the
    cache warm, reading all 23 kernel columns (~55 MB) with 40 MB of address space left
    aborted the process inside polars ("memory allocation of N bytes failed", SIGABRT).
    Their size is known from their files: the read is refused before it starts."""
    warm = _run(big, 8 << 30, "api", tmp_path=tmp_path, cache=True)
    assert warm.returncode == 0 and warm.stdout == "", warm.stderr[-2000:]
    assert len(list((tmp_path / "cache" / "columns").glob("*/CUPTI_ACTIVITY_KIND_KERNEL.*.arrow"))) >= 20
    run = _run(big, 40 << 20, "api", tmp_path=tmp_path, cache=True)
    assert run.returncode == 0, run.stderr[-2000:]
    (line,) = run.stdout.splitlines()
    assert line.startswith("refused: big.sqlite: reading CUPTI_ACTIVITY_KIND_KERNEL (300,000 rows x ")
    assert "needs about" in line and "columns_on_demand" in line


@pytest.mark.parametrize("headroom_mb", [10, 40, 100])
def test_warm_stats_fits_or_is_one_error_never_an_abort(big: Path, tmp_path: Path, headroom_mb: int) -> None:
    """``tracekit stats`` with the column cache warm (benchmarks/README.md, s30x: SIGABRT in
    polars). With 40 or 100 MB left it aborted while reading a cached column when that read
    started polars' reader threads (~390 MB of address space at once, after the check had
    let the read through): now the CLI starts them first (prepare_process → start_reader).
    40 and 100 MB are enough; 10 MB is the one-line error, exit 2."""
    warm = _run(big, 8 << 30, "cli", "stats", str(big), tmp_path=tmp_path, cache=True)
    assert warm.returncode == 0, warm.stderr[-2000:]
    run = _run(big, headroom_mb << 20, "cli", "stats", str(big), tmp_path=tmp_path, cache=True)
    assert run.returncode in (0, 2), run.stderr[-3000:]
    if headroom_mb >= 40:
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout == warm.stdout
    else:
        assert run.returncode == 2, run.stderr[-3000:]
        line = _last_line(run.stderr)
        # the cached kernel columns' check (measured: "reading CUPTI_ACTIVITY_KIND_KERNEL
        # (300,000 rows x 2 column(s)) needs about 7.2 MB and 1.81 MB is left"); under load
        # another step may be the one that cannot fit: still one line, exit 2
        assert line.startswith("tracekit: error: ") and ("needs about" in line or "out of memory" in line), line
    assert "Traceback" not in run.stderr and "panicked" not in run.stderr


def test_openblas_threads_default_to_one(tmp_path: Path) -> None:
    """prepare_process sets OPENBLAS_NUM_THREADS=1 when unset (its per-thread buffers are
    address space under ``ulimit -v``) and leaves a value the user set."""
    code = "import os, sys; from tracekit.cli.main import prepare_process; prepare_process(); print(os.environ.get('OPENBLAS_NUM_THREADS'))"
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "1"
    out = subprocess.run([sys.executable, "-c", code], env={**env, "OPENBLAS_NUM_THREADS": "4"}, capture_output=True,
                         text=True, check=True, timeout=120)  # fmt: skip
    assert out.stdout.strip() == "4"


@pytest.mark.parametrize("headroom_mb", [50, 60])
def test_warm_diagnose_is_one_error_not_an_abort(big: Path, tmp_path: Path, headroom_mb: int) -> None:
    """``tracekit diagnose`` with the column cache warm (benchmarks/README.md, s30x: SIGABRT).
    Here it aborted with 50 or 60 MB of address space left: in polars, while reading cached
    kernel columns or adding the kernels' derived columns (names looked up: 16-byte string
    views), or when numpy, imported late, could not map OpenBLAS. Now those steps are
    checked first: exit 2 and one line naming the table."""
    warm = _run(big, 8 << 30, "cli", "diagnose", str(big), tmp_path=tmp_path, cache=True)
    assert warm.returncode == 0, warm.stderr[-2000:]
    run = _run(big, headroom_mb << 20, "cli", "diagnose", str(big), tmp_path=tmp_path, cache=True)
    assert run.returncode == 2, run.stderr[-3000:]
    line = _last_line(run.stderr)
    assert line.startswith("tracekit: error: big.sqlite: ") and "needs about" in line, line
    assert "Traceback" not in run.stderr and "panicked" not in run.stderr


PUT_SCRIPT = """
import resource, sys
import tracekit
from tracekit.nsys.column_cache import ColumnCache
from tracekit.nsys.database import free_memory

def mapped():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024

path, cache_root, headroom = sys.argv[1], sys.argv[2], int(sys.argv[3])
column = tracekit.open(path, column_cache=False).table("kernels", columns=["start_ns"])["start_ns"]
from pathlib import Path
cache = ColumnCache(Path(path), root=Path(cache_root), free_memory=free_memory)
resource.setrlimit(resource.RLIMIT_AS, (mapped() + headroom, resource.RLIM_INFINITY))
cache.put("CUPTI_ACTIVITY_KIND_KERNEL", '"start"', column)
print("cached" if cache.has("CUPTI_ACTIVITY_KIND_KERNEL", '"start"') else "not cached")
"""


def test_a_column_is_not_cached_without_room_to_write_it(big: Path, tmp_path: Path) -> None:
    """Writing a column to the cache is best effort: with less than three times its size left
    (300 k starts: 2.4 MB; 4 MB left) it is not written and the command goes on (a cold
    ``stats`` on 3 M kernels under ``ulimit -v`` 1.3 GB failed with ``ArrowMemoryError`` in
    the write although the report fitted; here, before, the write raised ImportError: pyarrow
    could not be mapped); with room it is written."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "POLARS_MAX_THREADS": "1"}
    for headroom, want in ((4 << 20, "not cached"), (512 << 20, "cached")):
        root = tmp_path / f"cache{headroom}"
        run = subprocess.run([sys.executable, "-c", PUT_SCRIPT, str(big), str(root), str(headroom)], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.splitlines() == [want]


def test_nvtx_kern_sum_refuses_pairs_that_cannot_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    """nvtx_kern_sum builds one row per (kernel, enclosing range): 86 M rows on the 30 M-kernel
    export, where polars aborted the process (SIGABRT at 7.5 GB under a 12 GB cap; now one line,
    benchmarks/README.md). With just less room than that frame needs the report goes window by
    window (issue 28), which on a trace this small needs more than the frame, so it is the
    one-line error naming the windowed pairs; with just more, the report is the same as
    without a limit."""
    import tracekit
    from tracekit.errors import TraceMemoryError
    from tracekit.nsys import database
    from tracekit.stats import nvtx_projection, run_report

    path = ROOT / "sample_traces" / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
    pairs = nvtx_projection.projection(tracekit.open(path), kernels_only=True).pairs().height
    assert pairs > 1000
    need = 2 * pairs * (7 * 8 + 16)
    expected = run_report(tracekit.open(path), "nvtx_kern_sum").frame
    monkeypatch.setattr(database, "free_memory", lambda: need - 1)  # the reads before it need far less
    with pytest.raises(TraceMemoryError, match=r"building nvtx_kern_sum's kernel/range pairs, window by window \(.* rows x 6 column\(s\)\) needs about"):
        run_report(tracekit.open(path), "nvtx_kern_sum")
    monkeypatch.setattr(database, "free_memory", lambda: need + (1 << 20))
    assert run_report(tracekit.open(path), "nvtx_kern_sum").frame.equals(expected)


def test_a_report_that_cannot_fit_is_one_error_before_it_starts(big: Path, tmp_path: Path) -> None:
    """``tracekit report`` holds whole tables: on 8 M kernels under a 12 GB address-space limit
    it ended in SIGABRT after 42 s. It now refuses up front, in one line, when its estimate
    (500 MB + 1.5 KB per GPU operation: ~1 GB for these 300 k kernels and 10 k memcpys) exceeds
    what is left;
    the HTML file is not written."""
    out = tmp_path / "r.html"
    run = _run(big, 300 << 20, "cli", "report", str(big), "-o", str(out), tmp_path=tmp_path)
    assert run.returncode == 2, run.stderr[-2000:]
    (line,) = run.stderr.splitlines()
    assert line.startswith("tracekit: error: big.sqlite: the HTML report of 310,000 GPU operations needs about 1.0 GB")
    assert "tracekit summary" in line
    assert not out.exists()


def test_the_report_check_lets_it_through_with_room(big: Path) -> None:
    """Same export, same estimate, 2 GB left: the check passes (it reads nothing)."""
    code = (
        "import resource, sys, tracekit\n"
        "from tracekit.report.html import _ensure_fits\n"
        "trace = tracekit.open(sys.argv[1])\n"
        "size = next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmSize:'))\n"
        "resource.setrlimit(resource.RLIMIT_AS, (size + (2 << 30), resource.RLIM_INFINITY))\n"
        "_ensure_fits(trace)\n"
        "print('fits')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRACEKIT_COLUMN_CACHE": "0"}
    run = subprocess.run([sys.executable, "-c", code, str(big)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0 and run.stdout.strip() == "fits", run.stderr[-2000:]


def test_a_diff_that_cannot_fit_is_one_error_before_it_starts(big: Path, tmp_path: Path) -> None:
    """``tracekit diff`` holds both runs' whole tables: two 8 M-kernel exports under a 12 GB
    limit ended in SIGABRT after 19 s. It now refuses up front (500 MB + 750 B per GPU
    operation of both runs: ~0.97 GB here) in one line, and opening the runs no longer builds
    their kernel tables first (a ``hasattr`` on the trace did: 4 s and 4 GB on 8 M kernels)."""
    run = _run(big, 300 << 20, "cli", "diff", str(big), str(big), tmp_path=tmp_path)
    assert run.returncode == 2, run.stderr[-2000:]
    (line,) = run.stderr.splitlines()
    assert line.startswith("tracekit: error: big.sqlite vs big.sqlite: comparing 620,000 GPU operations needs about 1.0 GB")
    assert "shorter captures" in line


@pytest.mark.parametrize(("command", "warm", "headroom_mb"), [
    ("summary", True, 150), ("summary", True, 250), ("summary", True, 300), ("diagnose", True, 150),
    ("diagnose", True, 220), ("diagnose", True, 245), ("diagnose", True, 290), ("diagnose", False, 400), ("summary", False, 400),
])
def test_analysis_frames_are_checked_before_they_are_built(big: Path, tmp_path: Path, command: str, warm: bool,
                                                           headroom_mb: int) -> None:
    """Issue 29 §7, under a real address-space limit on the 300 k-kernel export: polars aborted
    (SIGABRT) building the generation phases' launch join and range tree with 250–400 MB left
    (warm summary, cold diagnose), and OpenBLAS ended the process (exit 1, "Memory allocation
    still failed") at its first BLAS call with 150 MB left. Now the phases are left out when
    they would not fit and no BLAS call is made: a result or one error line. A warm diagnose
    aborted with 150–300 MB left (a sweep in 4 MB steps) in two more places: the coverage
    check's as-of join of 310 k operations (now left out, as an ``info`` finding, when it would
    not fit) and the module loads' filter of the whole API name column (now a ``WHERE`` on the
    matching name ids)."""
    if warm:
        assert _run(big, 8 << 30, "cli", command, str(big), tmp_path=tmp_path, cache=True).returncode == 0
    run = _run(big, headroom_mb << 20, "cli", command, str(big), tmp_path=tmp_path, cache=warm)
    assert run.returncode in (0, 2), run.stderr[-3000:]
    assert "OpenBLAS" not in run.stderr and "panicked" not in run.stderr and "Traceback" not in run.stderr
    if run.returncode == 2:
        assert _last_line(run.stderr).startswith("tracekit: error: big.sqlite: ")
