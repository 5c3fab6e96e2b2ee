"""Iteration charts of long runs: more iterations than altair embeds (5,000 rows) are drawn
binned, in the whole-table report, the CUDA graph replay chart and ``iterations_chart`` itself.

Found on the 1 M-kernel benchmark export (benchmarks/out/s1x.sqlite, 16,672 ``step.N``
ranges): the whole-table report's Overview said "This section could not be built:
MaxRowsError" while the column-at-a-time report binned the same chart."""

from __future__ import annotations

import re
from typing import Any

import polars as pl
import pytest

import tracekit
from tests.conftest import SAMPLES, llm_capture

pytest.importorskip("altair", reason="needs the notebook extra")
pytest.importorskip("vl_convert", reason="needs vl-convert-python (notebook extra)")

from tracekit.report import html as H  # noqa: E402
from tracekit.viz import iterations_chart, prep  # noqa: E402

pytestmark = [pytest.mark.notebook]

DECODE = SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"


def _section(document: str, anchor: str) -> str:
    body = document.split(f'<section id="{anchor}">', 1)[1].split("</section>", 1)[0]
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body))


def _long_run(its: pl.DataFrame, copies: int) -> pl.DataFrame:
    """``its`` (a real capture's iterations) repeated ``copies`` times end to end, numbered on:
    the shape of a long run's iteration table."""
    span = int(its["end_ns"].max()) - int(its["start_ns"].min()) + 1  # type: ignore[operator]
    n = its.height
    return pl.concat([
        its.with_columns(pl.col("iteration") + k * n, pl.col("start_ns") + k * span, pl.col("end_ns") + k * span)
        for k in range(copies)
    ])  # fmt: skip


def test_binned_iterations_by_hand() -> None:
    its = prep.iteration_times(tracekit.open(DECODE).nvtx)
    assert its.height >= 6
    same, size = prep.binned_iterations(its)
    assert same is its and size == 1
    shown, size = prep.binned_iterations(its, max_points=3)
    assert size == -(-its.height // 3) and shown.height == -(-its.height // size)
    first = its.head(size)
    row = shown.row(0, named=True)
    assert row["iteration"] == first["iteration"][0] and row["start_ns"] == first["start_ns"][0]
    assert row["end_ns"] == first["end_ns"][-1]
    assert row["duration_ns"] == round(first["duration_ns"].median())  # type: ignore[arg-type]
    assert row["name"] == f"{first['name'][0]} … {first['name'][-1]}"
    assert shown.columns == its.columns


def test_chart_of_more_iterations_than_altair_embeds() -> None:
    its = prep.iteration_times(tracekit.open(DECODE).nvtx)
    long = _long_run(its, -(-6000 // its.height))
    assert long.height > 5000
    spec: dict[str, Any] = iterations_chart(long, title="Iteration times").to_dict()  # raised MaxRowsError
    rows = next(iter(spec["datasets"].values()))
    assert len(rows) <= prep.MAX_ITERATION_POINTS
    _, size = prep.binned_iterations(long)
    assert " ".join(spec["title"]["subtitle"]) == f"each point: the median of {size:,} consecutive iterations"
    small = iterations_chart(its, title="Iteration times").to_dict()
    assert small["title"] == "Iteration times" and len(next(iter(small["datasets"].values()))) == its.height


def test_whole_table_report_bins_a_long_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Run section draws the run structure's iterations (the same steps the diagnosis's
    window is made of), binned past the limit."""
    trace = tracekit.open(DECODE)
    n = prep.structure_iterations(tracekit.structure(trace)).height
    assert n == 8  # the capture's 8 decode steps (NVTX step.N)
    monkeypatch.setattr(prep, "MAX_ITERATION_POINTS", 4)
    document = H.build_report(trace)
    text = _section(document, "run")
    assert "could not be built" not in text
    size = -(-n // 4)
    assert f"{n:,} iterations: each point is the median duration of {size:,} consecutive iterations" in text


def test_graph_replay_chart_bins_many_launches(monkeypatch: pytest.MonkeyPatch) -> None:
    trace = tracekit.open(llm_capture("graph_decode_graphtrace"))
    monkeypatch.setattr(prep, "MAX_ITERATION_POINTS", 8)
    text = _section(H.build_report(trace), "graphs")
    assert "could not be built" not in text
    assert "32 launches: each point is the median duration of 4 consecutive launches" in text
