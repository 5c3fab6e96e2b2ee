"""The HTML report of a big export, drawn from columns (issue 14 §1; tracekit/report/bounded.py).

Past :data:`~tracekit.report.bounded.MIN_KERNELS` kernels the report builds no kernel, API
or GPU-metric table. Here the threshold is lowered (``TRACEKIT_REPORT_BOUNDED_MIN_KERNELS=0``)
so that real sample exports take that path, with a real column cache (small tables allowed
in) and windows of a few hundred rows, so that the one-column reads, the carried windows of
the busy/idle sweep and the merged histogram all run; every whole-trace table and number is
compared with what the whole tables give.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import tracekit
from tracekit.nsys import database
from tracekit.report import bounded as B
from tracekit.report import html as H
from tracekit.report import html_bounded as HB
from tracekit.viz import prep
from tracekit.viz.charts import within_row_budget

from .conftest import SAMPLES

EXPORTS = [
    SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite",
    SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite",
    SAMPLES / "custom_allreduce_2gpu" / "custom_allreduce_2gpu.sqlite",
    SAMPLES / "planted" / "planted_pageable_memcpy" / "planted_pageable_memcpy.sqlite",
    SAMPLES / "planted" / "planted_clean_nonvtx" / "planted_clean_nonvtx.sqlite",
    SAMPLES / "planted" / "planted_memory_growth" / "planted_memory_growth.sqlite",
]
IDS = [p.stem for p in EXPORTS]


@pytest.fixture
def bounded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every export is reported from columns, through a real column cache, in windows of 300 rows."""
    monkeypatch.setenv("TRACEKIT_REPORT_BOUNDED_MIN_KERNELS", "0")
    monkeypatch.setattr(database, "CACHE_MIN_ROWS", 1)
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TRACEKIT_COLUMN_CACHE", "1")
    monkeypatch.setattr(B, "CHUNK_ROWS", 300)


def _open(path: Path) -> tracekit.NsysTrace:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tracekit.open(path)  # type: ignore[return-value]


@pytest.mark.parametrize("path", EXPORTS, ids=IDS)
def test_whole_trace_tables_equal_the_whole_tables(bounded: None, path: Path) -> None:
    whole, by_column = _open(path), _open(path)
    kc = B.KernelColumns(by_column)
    assert B.use_bounded(by_column)
    k = whole.kernels
    facts = kc.facts()
    assert facts.launches == k.height
    assert facts.distinct == k["short_name"].n_unique()
    assert facts.gpu_time_ns == k["duration_ns"].sum()
    assert facts.devices == sorted(set(k["device_id"].drop_nulls().to_list()))
    assert (facts.first_start_ns, facts.last_end_ns) == (k["start_ns"].min(), k["end_ns"].max())
    assert_frame_equal(kc.top_kernels(30), prep.top_kernels(k, n=30, by="short_name"))
    assert_frame_equal(kc.top_kernels(500), prep.top_kernels(k, n=500, by="short_name"))
    comm = prep.gpu_ops(k).filter(pl.col("family") == "communication")
    expected = prep.top_kernels(comm, n=30, by="name") if comm.height else comm.head(0)
    got = kc.top_kernels(30, family="communication")
    assert got.height == expected.height
    if got.height:
        assert_frame_equal(got, expected)
    assert_frame_equal(kc.duration_histogram(), prep.duration_histogram(k))
    graphs = H._graph_rows(whole)
    assert_frame_equal(kc.breakdown(by_column.memcpys, by_column.memsets, graphs), H._breakdown(whole))


def test_busy_sweep_carries_long_operations(bounded: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows of 7 rows: most operations of a window end after the next one starts."""
    monkeypatch.setattr(B, "CHUNK_ROWS", 7)
    path = EXPORTS[1]
    whole, by_column = _open(path), _open(path)
    got = B.KernelColumns(by_column).breakdown(by_column.memcpys, by_column.memsets, None)
    assert_frame_equal(got, H._breakdown(whole))


@pytest.mark.parametrize("path", [EXPORTS[0], EXPORTS[3]], ids=[IDS[0], IDS[3]])
def test_gpu_metrics_streamed(bounded: None, path: Path) -> None:
    whole, by_column = _open(path), _open(path)
    total, series, summary = B.gpu_metric_figures(by_column)
    g = whole.gpu_metrics
    assert total == g.height
    expected = within_row_budget(lambda n: prep.gpu_metrics_series(g, max_points=n), 600)
    assert_frame_equal(series, expected, check_exact=False, rel_tol=1e-9)
    wanted = g.filter(pl.col("metric").is_in(list(prep.DEFAULT_GPU_METRICS)) & pl.col("metric_label").str.contains("%", literal=True))
    means = wanted.group_by("device_id", "metric_label").agg(
        pl.col("value").cast(pl.Float64).mean().alias("mean_pct"), pl.col("value").max().cast(pl.Float64).alias("max_pct"),
    ).sort("device_id", "metric_label")
    assert_frame_equal(summary, means, check_exact=False, rel_tol=1e-9, check_dtypes=False)


def _sections(document: str) -> dict[str, str]:
    return dict(re.findall(r'<section id="([a-z_]+)"><h2>[^<]*</h2>(.*?)</section>', document, re.S))


_WINDOW_NOTE = re.compile(r'<p class="note">Drawn from one window of the trace: .*?</p>')
_CHART_ID = re.compile(r'id="chart-\d+"')


@pytest.mark.parametrize("path", EXPORTS, ids=IDS)
def test_report_sections_equal_the_whole_table_report(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, path: Path) -> None:
    """The whole-trace sections are byte-identical; the windowed ones (NVTX, timeline) say which
    window they draw."""
    whole = H.build_report(_open(path))
    monkeypatch.setenv("TRACEKIT_REPORT_BOUNDED_MIN_KERNELS", "0")
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    by_column = H.build_report(_open(path))
    a, b = _sections(whole), _sections(by_column)
    assert list(a) == list(b)
    assert 'class="err"' not in by_column
    for name in a:
        if name in ("nvtx", "timeline"):
            continue
        x, y = _CHART_ID.sub("", a[name]), _CHART_ID.sub("", b[name])
        assert x == y, name
    assert _WINDOW_NOTE.search(b["timeline"])
    assert _WINDOW_NOTE.search(b["nvtx"]) or "No NVTX ranges" in b["nvtx"]


@pytest.mark.parametrize("path", [EXPORTS[0], EXPORTS[1], EXPORTS[3]], ids=[IDS[0], IDS[1], IDS[3]])
def test_nvtx_tree_of_a_window_covering_everything(bounded: None, path: Path) -> None:
    """The windowed NVTX section over a window that holds every kernel equals the whole one."""
    from tracekit.analysis.attribution import NVTX_COLUMNS

    whole, by_column = _open(path), _open(path)
    kc = B.KernelColumns(by_column)
    facts = kc.facts()
    assert facts.first_start_ns is not None and facts.last_end_ns is not None
    window = (facts.first_start_ns, facts.last_end_ns + 1)
    detail = HB._Detail(window, "everything", kc.kernels_in(window, [*B._OP_COLUMNS, "name", "short_name"]), False)
    assert detail.kernels.height == whole.kernels.height
    page_a, page_b = H._Page("a", ""), H._Page("b", "")
    a = H._nvtx(page_a, whole)
    b = HB._nvtx(page_b, by_column, kc, detail, by_column.table("nvtx", list(NVTX_COLUMNS)))
    assert _WINDOW_NOTE.sub("", b) == a
    assert page_a.charts == page_b.charts


def test_small_exports_keep_the_whole_table_report() -> None:
    for path in EXPORTS:
        assert not B.use_bounded(_open(path))  # below MIN_KERNELS: the report is as it was


def test_iteration_points_binned(monkeypatch: pytest.MonkeyPatch) -> None:
    from tracekit.report.sections import _iteration_points

    its = prep.iteration_times(_open(EXPORTS[0]).nvtx)
    shown, note = _iteration_points(its)
    assert shown is its and note == ""
    monkeypatch.setattr(prep, "MAX_ITERATION_POINTS", 5)
    shown, note = _iteration_points(its)
    assert shown.height <= 5 < its.height
    assert "median duration" in note
    assert shown.columns == its.columns


def test_capped_window(bounded: None) -> None:
    kc = B.KernelColumns(_open(EXPORTS[0]))
    facts = kc.facts()
    assert facts.first_start_ns is not None and facts.last_end_ns is not None
    window = kc.capped((facts.first_start_ns, facts.last_end_ns + 1), 100)
    assert kc.kernels_in(window, ["start_ns"]).height == 100
