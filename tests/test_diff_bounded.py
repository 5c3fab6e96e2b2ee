"""``tracekit diff`` of big exports a column at a time (tracekit/comparison_by_column.py).

Past :data:`~tracekit.comparison_by_column.BOUNDED_MIN_OPS` GPU operations a run is compared
without its whole tables. Here the threshold is lowered so that real exports take that path,
their columns from a real column cache (small tables allowed in), and every level's table,
the step counts, how steps were found and the notes are compared with the whole-table path's.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from tracekit import comparison_by_column as cbc
from tracekit.comparison import diff
from tracekit.nsys import database

from .conftest import SAMPLES

CLEAN = SAMPLES / "planted" / "planted_clean" / "planted_clean.sqlite"
DECODE = SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
PAIRS = [
    (SAMPLES / "planted" / name / f"{name}.sqlite", CLEAN)
    for name in ("planted_host_bound", "planted_launch_bound", "planted_memory_growth", "planted_no_tensor_cores",
                 "planted_pageable_memcpy", "planted_sync_stall")
] + [
    (DECODE, CLEAN),
    (SAMPLES / "planted" / "planted_clean_nonvtx" / "planted_clean_nonvtx.sqlite", CLEAN),  # steps from the kernel sequence
    (SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite", DECODE),  # two processes
    (SAMPLES / "llm_train_emit_nvtx_1gpu" / "llm_train_emit_nvtx_1gpu.sqlite", DECODE),
    (SAMPLES / "custom_allreduce_2gpu" / "custom_allreduce_2gpu.sqlite", CLEAN),
]


@pytest.fixture
def cached(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Columns come one at a time from a real column cache in a temporary folder."""
    monkeypatch.setattr(database, "CACHE_MIN_ROWS", 1)
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path_factory.mktemp("diff_bounded_cache")))
    monkeypatch.setenv("TRACEKIT_COLUMN_CACHE", "1")


def _both(before: Path, after: Path, **kw: object) -> tuple[object, object]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the samples' own data warnings (damaged rows …), the same on both paths
        whole = diff(before, after, bounded_from=10**15, **kw)  # type: ignore[arg-type]
        bounded = diff(before, after, bounded_from=0, **kw)  # type: ignore[arg-type]
    return whole, bounded


@pytest.mark.parametrize(("before", "after"), PAIRS, ids=lambda p: p.parent.name)
def test_bounded_tables_equal_whole_tables(before: Path, after: Path, cached: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cbc, "CHUNK_ROWS", 97)  # many windows of rows, steps cut across them
    calls: list[str] = []
    real = cbc.bounded_run_stats

    def recording(trace, *a, **k):  # type: ignore[no-untyped-def]
        calls.append(str(trace.path))
        return real(trace, *a, **k)

    monkeypatch.setattr(cbc, "bounded_run_stats", recording)
    whole, bounded = _both(before, after, findings=False)
    assert len(calls) == 2  # both runs took the bounded path
    assert bounded.steps == whole.steps and bounded.methods == whole.methods  # type: ignore[attr-defined]
    assert bounded.notes == whole.notes  # type: ignore[attr-defined]
    assert list(bounded.levels) == list(whole.levels)  # type: ignore[attr-defined]
    for level, frame in whole.levels.items():  # type: ignore[attr-defined]
        assert frame.height > 0 or level == "range"
        assert_frame_equal(bounded.levels[level], frame)  # type: ignore[attr-defined]


def test_bounded_verdict_findings_and_text_equal(cached: None) -> None:
    whole, bounded = _both(SAMPLES / "planted" / "planted_launch_bound" / "planted_launch_bound.sqlite", CLEAN)
    assert bounded.to_markdown() == whole.to_markdown()  # type: ignore[attr-defined]
    assert_frame_equal(bounded.findings, whole.findings)  # type: ignore[attr-defined]


def test_levels_subset_and_threshold_from_environment(cached: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEKIT_DIFF_BOUNDED_MIN_OPS", "0")
    assert cbc.bounded_min_ops() == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bounded = diff(DECODE, CLEAN, levels=("step", "kernel"), findings=False)
        whole = diff(DECODE, CLEAN, levels=("step", "kernel"), findings=False, bounded_from=10**15)
    assert list(bounded.levels) == ["step", "kernel"]
    for level in ("step", "kernel"):
        assert_frame_equal(bounded.levels[level], whole.levels[level])
    monkeypatch.setenv("TRACEKIT_DIFF_BOUNDED_MIN_OPS", "")
    assert cbc.bounded_min_ops() == cbc.BOUNDED_MIN_OPS


def test_bounded_path_refuses_in_one_line_when_it_cannot_fit(cached: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from tracekit.errors import TraceMemoryError

    monkeypatch.setattr(database, "free_memory", lambda: 1 << 20)  # 1 MB left
    with pytest.raises(TraceMemoryError) as err:
        diff(DECODE, CLEAN, findings=False, bounded_from=0)
    msg = str(err.value)
    assert "\n" not in msg and "a column at a time" in msg and "GB is left" in msg


def test_per_step_stats_compose_to_compare_per_step() -> None:
    from tracekit.analysis.compare import compare_per_step, compare_step_stats, per_step_stats

    a = pl.DataFrame({"step": [0, 0, 1, 2], "key": ["x", "y", "x", "x"], "value": [5, 1, 7, 6]})
    b = pl.DataFrame({"step": [3, 4, 4], "key": ["x", "x", "z"], "value": [9, 8, 2]})
    assert_frame_equal(
        compare_step_stats(per_step_stats(a, [0, 1, 2], "a"), per_step_stats(b, [3, 4], "b"), 3, 2),
        compare_per_step(a, b, [0, 1, 2], [3, 4]),
    )
