"""tracekit.cli.allocator: jemalloc returns all freed memory at once for long commands on big
exports, large allocations' at once for the rest; the user's own setting wins; and polars (a
real subprocess) reads the variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tracekit.cli import allocator
from tracekit.cli.allocator import DECAY_NOW, EAGER_LARGE, map_large_blocks, tune_allocator

ROOT = Path(__file__).resolve().parents[1]
EXPORT = ROOT / "sample_traces" / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"


def test_set_for_a_stepped_command_on_a_big_input() -> None:
    size = EXPORT.stat().st_size
    env: dict[str, str] = {}
    assert tune_allocator(["diff", str(EXPORT), str(EXPORT)], env, min_bytes=2 * size) == DECAY_NOW  # the two add up
    assert env == {"_RJEM_MALLOC_CONF": DECAY_NOW}
    env = {}
    assert tune_allocator(["export", "perfetto", "--window", "steady", str(EXPORT)], env, min_bytes=size) == DECAY_NOW
    env = {}
    assert tune_allocator(["report", str(EXPORT.parent)], env, min_bytes=size) == DECAY_NOW  # a folder: its files


def test_summary_and_diagnose_return_pages_from_a_smaller_input(monkeypatch: pytest.MonkeyPatch) -> None:
    """Their threshold is their own (192 MiB), below the other stepped commands' (1 GiB);
    below it they return freed pages after 0.2 s (DECAY_SHORT)."""
    assert allocator.DECAY_NOW_FROM["summary"] == allocator.DECAY_NOW_FROM["diagnose"] < allocator.BIG_INPUT_BYTES
    size = EXPORT.stat().st_size
    for cmd in ("summary", "diagnose"):
        monkeypatch.setitem(allocator.DECAY_NOW_FROM, cmd, size)
        assert tune_allocator([cmd, str(EXPORT)], {}) == DECAY_NOW
        monkeypatch.setitem(allocator.DECAY_NOW_FROM, cmd, size + 1)
        assert tune_allocator([cmd, str(EXPORT)], {}) == allocator.DECAY_SHORT  # below it: pages back after 0.2 s
    assert tune_allocator(["report", str(EXPORT)], {}) == EAGER_LARGE  # BIG_INPUT_BYTES


def test_stats_returns_pages_soon_on_any_input() -> None:
    """``stats``, whatever its input's size: large allocations eager and freed pages back after
    0.2 s; DECAY_NOW still wins where a stepped command gets it; the jemalloc options parse
    (polars starts with them)."""
    assert allocator.DECAY_SHORT.startswith(EAGER_LARGE + ",") and "dirty_decay_ms:200" in allocator.DECAY_SHORT
    assert {"stats", "summary", "diagnose"} <= allocator.DECAY_SHORT_COMMANDS
    for argv in (["stats", "-r", "nvtx_gpu_proj_sum", str(EXPORT)], ["stats", "/no/such/file.sqlite"], ["stats"]):
        env: dict[str, str] = {}
        assert tune_allocator(argv, env) == allocator.DECAY_SHORT
        assert env == {"_RJEM_MALLOC_CONF": allocator.DECAY_SHORT}
    assert tune_allocator(["summary", str(EXPORT)], {}, min_bytes=1) == DECAY_NOW  # DECAY_NOW wins
    assert tune_allocator(["summary", str(EXPORT)], {}, min_bytes=EXPORT.stat().st_size + 1) == allocator.DECAY_SHORT
    assert tune_allocator(["report", str(EXPORT)], {}, min_bytes=EXPORT.stat().st_size + 1) == EAGER_LARGE
    r = subprocess.run([sys.executable, "-c", "import polars as pl; print(pl.Series([1, 2]).sum())"],
                       env={**os.environ, "_RJEM_MALLOC_CONF": allocator.DECAY_SHORT}, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "3" and "Invalid conf" not in r.stderr, r.stderr


def test_large_allocations_eager_for_small_inputs_and_other_commands() -> None:
    size = EXPORT.stat().st_size
    for argv in (["report", str(EXPORT)], ["export", "perfetto", str(EXPORT)], ["report", "/no/such/file.sqlite"]):
        env: dict[str, str] = {}
        assert tune_allocator(argv, env, min_bytes=size + 1) == EAGER_LARGE
        assert env == {"_RJEM_MALLOC_CONF": EAGER_LARGE}
    env = {}
    assert tune_allocator(["query", str(EXPORT), "SELECT 1"], env, min_bytes=1) == EAGER_LARGE  # not a stepped command


def test_left_alone_without_a_command_and_for_a_user_setting() -> None:
    env: dict[str, str] = {}
    assert tune_allocator([], env, min_bytes=1) is None and env == {}
    # the program capture profiles would inherit the variable
    assert tune_allocator(["capture", "nsys", "--", "python3", "train.py"], env, min_bytes=1) is None and env == {}
    env = {"_RJEM_MALLOC_CONF": "narenas:1"}
    assert tune_allocator(["diff", str(EXPORT), str(EXPORT)], env, min_bytes=1) is None
    assert tune_allocator(["stats", str(EXPORT)], env, min_bytes=1) is None
    assert env == {"_RJEM_MALLOC_CONF": "narenas:1"}
    before = dict(os.environ)
    assert tune_allocator(["summary", str(EXPORT)], {}, min_bytes=1 << 60) == allocator.DECAY_SHORT
    assert dict(os.environ) == before  # os.environ untouched when another mapping is given


def test_polars_reads_the_setting() -> None:
    """A malformed jemalloc option makes jemalloc print a warning at start-up: proof that the
    variable reaches polars' allocator under that name (a silent no-op would hide a rename)."""
    code = "import polars as pl; pl.DataFrame({'a': list(range(1000))}).sum()"
    env = {**os.environ, "_RJEM_MALLOC_CONF": "no_such_option:1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert "no_such_option" in out.stderr, out.stderr
    for value in (DECAY_NOW, EAGER_LARGE):
        env["_RJEM_MALLOC_CONF"] = value
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
        assert out.returncode == 0 and out.stderr == "", (value, out.stderr)


def test_glibc_maps_large_blocks_unless_the_user_chose() -> None:
    """In a real subprocess (the setting is process-wide): glibc accepts the threshold; a
    user's ``MALLOC_MMAP_THRESHOLD_`` keeps it from being touched."""
    code = "from tracekit.cli.allocator import map_large_blocks; print(map_large_blocks())"
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    glibc = sys.platform.startswith("linux") and os.confstr("CS_GNU_LIBC_VERSION") is not None
    assert out.stdout.strip() == str(glibc)
    assert map_large_blocks({"MALLOC_MMAP_THRESHOLD_": "65536"}) is False


def test_torch_profiler_traces_return_pages_at_once() -> None:
    """A torch.profiler trace (a file, or a folder of ranks) gets DECAY_NOW from any size: its
    first open stages columns batch by batch, and freed pages kept by jemalloc were most of its
    peak (benchmarks/README.md, "Kineto open"); an nsys export of the same size does not; the
    sniff imports no polars."""
    root = Path(__file__).resolve().parents[1] / "sample_traces"
    env: dict[str, str] = {}
    assert tune_allocator(["summary", str(root / "kineto" / "ddp_nccl_1rank" / "nccl_data.json.gz")], env) == DECAY_NOW
    assert tune_allocator(["diagnose", str(root / "kineto" / "sampled_2rank")], {}) == DECAY_NOW
    assert tune_allocator(["summary", str(root / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite")], {}) == allocator.DECAY_SHORT
    code = ("import sys; from tracekit.cli.allocator import tune_allocator; "
            f"tune_allocator(['summary', {str(root / 'kineto' / 'sampled_2rank')!r}], {{}}); print('polars' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"
