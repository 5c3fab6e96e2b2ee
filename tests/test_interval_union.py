"""``interval_union`` per group: the shifted-times path (one running maximum over the whole
column, in numpy) and the per-group path it falls back to give the rows of a plain polars
window-function merge, on random intervals with null keys, null ends and ends before starts,
and on a real export's kernels; it steps aside where the shifted times would not fit in Int64."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

import tracekit
from tracekit.analysis import _frames

from .conftest import SAMPLES


def _by_window(frame: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """The merge written with polars window functions: a row opens a run when it starts after
    the running maximum of the ends before it in its group; the run ends at the running
    maximum of its last row."""
    f = frame.select(*by, "start_ns", "end_ns").drop_nulls(["start_ns", "end_ns"]).sort([*by, "start_ns"])
    prev = pl.col("end_ns").cum_max().shift(1).over(by)
    f = f.with_columns((prev.is_null() | (pl.col("start_ns") > prev)).alias("_new"))
    f = f.with_columns(pl.col("end_ns").cum_max().over(by).alias("_max"), pl.col("_new").shift(-1).fill_null(True).alias("_last"))
    return pl.concat([f.filter(pl.col("_new")).select(*by, "start_ns"), f.filter(pl.col("_last")).select(pl.col("_max").alias("end_ns"))],
                     how="horizontal")


def _per_group(monkeypatch: pytest.MonkeyPatch, frame: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    with monkeypatch.context() as m:
        m.setattr(_frames, "_SHIFT_LIMIT", 0)  # every input takes the per-group path
        return _frames.interval_union(frame, by)


def test_random_intervals_merge_as_by_window(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(1)
    for _ in range(150):
        n = int(rng.integers(1, 300))
        a = pl.Series("a", rng.integers(0, 4, n), dtype=pl.Int64)
        if n > 5:
            a = a.scatter(rng.integers(0, n, n // 5), None)
        start = pl.Series("start_ns", rng.integers(-1000, 100_000, n))
        frame = pl.DataFrame({"a": a, "b": rng.integers(0, 3, n), "start_ns": start,
                              "end_ns": start + pl.Series(rng.integers(-50, 3000, n))})
        frame = frame.with_columns(pl.when(pl.int_range(pl.len()) % 17 == 3).then(None).otherwise(pl.col("end_ns")).alias("end_ns"))
        for by in (["a"], ["a", "b"], ["b"]):
            want = _by_window(frame, by)
            assert _frames.interval_union(frame, by).equals(want), by
            assert _per_group(monkeypatch, frame, by).equals(want), by


def test_kernels_of_an_export_merge_as_by_window(monkeypatch: pytest.MonkeyPatch) -> None:
    k = tracekit.open(SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite").kernels
    for by in (["device_id"], ["device_id", "stream_id"], ["pid", "device_id"]):
        got = _frames.interval_union(k, by)
        assert got.equals(_by_window(k, by))
        assert _per_group(monkeypatch, k, by).equals(got)
        assert 0 < got.height <= k.height


def test_times_too_wide_to_shift_take_the_per_group_path() -> None:
    big = (1 << 62) - 10
    frame = pl.DataFrame({"g": [0, 1, 2], "start_ns": [-big, 0, 5], "end_ns": [0, 3, big]})
    assert (2 * big + 1) * 4 >= _frames._SHIFT_LIMIT  # too wide to shift
    got = _frames.interval_union(frame, ["g"])
    assert got.equals(pl.DataFrame({"g": [0, 1, 2], "start_ns": [-big, 0, 5], "end_ns": [0, 3, big]}))


def test_one_group_and_frames_in_order_merge_as_by_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """One group (one device; no ``by`` at all) takes the path without shifted times, and a
    frame already in order is merged without a sorted copy: the same rows as the window
    merge, sorted or shuffled, on random intervals and on one device of a real export."""
    rng = np.random.default_rng(2)
    frames = []
    for _ in range(100):
        n = int(rng.integers(1, 200))
        start = pl.Series("start_ns", rng.integers(-1000, 50_000, n))
        frames.append(pl.DataFrame({"d": [0] * n, "start_ns": start, "end_ns": start + pl.Series(rng.integers(-50, 3000, n))}))
    k = tracekit.open(SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite").kernels
    frames.append(k.filter(pl.col("device_id") == k["device_id"][0]).select(pl.col("device_id").alias("d"), "start_ns", "end_ns"))
    in_order = 0
    for frame in frames:
        for f in (frame, frame.sort("start_ns"), frame.sample(fraction=1.0, shuffle=True, seed=3)):
            in_order += f.get_column("start_ns").is_sorted()
            for by in (["d"], []):
                want = _by_window(f.with_columns(pl.lit(0).alias("_k")), ["_k"]).drop("_k") if not by else _by_window(f, by)
                assert _frames.interval_union(f, by).equals(want), by
    assert in_order >= len(frames)
