"""The launch join narrows the API calls to those sharing an op's correlation id when the ops
are few (``attribution.NARROW_SHARE``; issue 28: NCCL kernels or a kernel per five calls
joined against millions of calls). On every bundled and corpus export the narrowed join
gives the same pairs and launch columns as the join of every call."""

from __future__ import annotations

import warnings
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import tracekit
from tracekit.analysis import attribution

from .conftest import corpus_files, llm_capture, llm_capture_names, sample_exports


def _exports() -> list[Path]:
    return [*sample_exports(), *corpus_files()]


@pytest.mark.parametrize("path", _exports(), ids=lambda p: p.stem)
def test_narrowed_join_equals_whole_join(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with warnings.catch_warnings():  # incomplete and damaged exports of the corpus: warned, read
        warnings.simplefilter("ignore")
        trace = tracekit.open(path)
        kernels, api = trace.kernels, trace.cuda_api
    if kernels.is_empty() or api.is_empty():
        pytest.skip("no kernels or no CUDA API calls")
    # every kernel, the NCCL-like sparse subset (every 7th), and none matched by some calls
    subsets = [kernels, kernels.gather_every(7), kernels.head(1)]
    for ops in subsets:
        monkeypatch.setattr(attribution, "NARROW_SHARE", 0.0)  # never narrow
        whole = attribution.launch_info(ops, api)
        whole_pairs = attribution.launch_pairs(ops, api)
        monkeypatch.setattr(attribution, "NARROW_SHARE", float("inf"))  # always narrow
        assert_frame_equal(attribution.launch_pairs(ops, api), whole_pairs)
        assert_frame_equal(attribution.launch_info(ops, api), whole)


@pytest.mark.parametrize("name", llm_capture_names()[:3])
def test_narrowed_join_on_llm_captures(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The H100 captures (graph replays, HF generate): memcpys and a sparse kernel subset."""
    trace = tracekit.open(llm_capture(name))
    api = trace.cuda_api
    for ops in (trace.kernels.gather_every(5), trace.memcpys):
        if ops.is_empty():
            continue
        monkeypatch.setattr(attribution, "NARROW_SHARE", 0.0)
        whole = attribution.launch_info(ops, api)
        monkeypatch.setattr(attribution, "NARROW_SHARE", float("inf"))
        narrowed = attribution.launch_info(ops, api)
        assert_frame_equal(narrowed, whole)
        assert narrowed["api_start_ns"].null_count() < narrowed.height  # the join matched calls


def test_calls_of_picks_the_matching_rows() -> None:
    api = pl.Series([5, 1, 9, 1, 7], dtype=pl.Int64)
    rows = attribution._calls_of(pl.Series([1], dtype=pl.Int64), api)
    assert rows is not None and rows.to_list() == [1, 3]
    assert attribution._calls_of(pl.Series([1, 5, 9, 7, 2, 3], dtype=pl.Int64), api) is None  # ops not fewer
