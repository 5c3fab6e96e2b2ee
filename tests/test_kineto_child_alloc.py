"""The Kineto converter child's allocator options (``tracekit.kineto.convert._child_malloc_conf``).

``import polars`` writes its own decays into ``_RJEM_MALLOC_CONF``, so the variable is always set
in a process that opens a trace; the child must still get decay 0 unless a decay was chosen.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import polars  # noqa: F401 - the variable as a process that opens a trace has it

from tracekit.kineto import convert as C

DECAY_0 = "dirty_decay_ms:0,muzzy_decay_ms:0"
POLARS = "dirty_decay_ms:500,muzzy_decay_ms:1000"


def test_unset_gets_decay_0() -> None:
    assert C._child_malloc_conf(None) == DECAY_0
    assert C._child_malloc_conf("") == DECAY_0


def test_polars_defaults_get_decay_0_last() -> None:
    assert C._child_malloc_conf(POLARS) == f"{POLARS},{DECAY_0}"
    # polars with THP on, or the CLI's large-allocation arena after polars' defaults: kept, decay 0 added
    assert C._child_malloc_conf(f"{POLARS},thp:always,metadata_thp:always") == f"{POLARS},thp:always,metadata_thp:always,{DECAY_0}"
    assert C._child_malloc_conf(f"{POLARS},oversize_threshold:131072") == f"{POLARS},oversize_threshold:131072,{DECAY_0}"


def test_a_chosen_decay_is_left_alone() -> None:
    for chosen in (f"{POLARS},dirty_decay_ms:10000", f"{POLARS},{DECAY_0}", "dirty_decay_ms:200,muzzy_decay_ms:0",
                   f"{POLARS},muzzy_decay_ms:0"):
        assert C._child_malloc_conf(chosen) == chosen


def test_convert_isolated_passes_decay_0_after_polars_import(tmp_path: Path, monkeypatch) -> None:
    """What ``convert_isolated`` hands its child, in this process (polars imported)."""
    assert os.environ.get("_RJEM_MALLOC_CONF")  # set by polars' import
    monkeypatch.delenv("TRACEKIT_KINETO_IN_PROCESS", raising=False)
    trace = tmp_path / "big.json"
    trace.write_bytes(b" " * C.CHILD_BYTES)
    seen: dict[str, str] = {}

    def run(cmd: list[str], env: dict[str, str], **_: object) -> subprocess.CompletedProcess[str]:
        seen.update(env)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", run)
    C.convert_isolated(trace, tmp_path)
    conf = seen["_RJEM_MALLOC_CONF"]
    assert conf.endswith(DECAY_0), conf
