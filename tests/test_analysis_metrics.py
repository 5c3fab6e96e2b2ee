"""GPU metrics attributed to kernels, names and ranges: time-weighted means checked against a
direct integration over the raw GPU_METRICS rows."""

from __future__ import annotations

import sqlite3
import warnings

import polars as pl
import pytest

import tracekit
from tracekit.analysis.attribution import attribute_nvtx, launch_info
from tracekit.analysis.metrics import (
    kernel_metrics,
    metric_names,
    metrics_by,
    resample_metrics,
    window_metrics,
)
from tracekit.nsys.gpu_metrics import stable_metric_name

from .conftest import SAMPLES

TP2 = SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"


@pytest.fixture(scope="module")
def trace() -> tracekit.NsysTrace:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tracekit.open(TP2)  # type: ignore[return-value]


def _samples(device: int, label: str) -> list[tuple[int, int]]:
    """(timestamp, value) of one metric of one GPU, straight from the export."""
    con = sqlite3.connect(f"file:{TP2}?mode=ro", uri=True)
    try:
        return con.execute(
            "SELECT g.timestamp, g.value FROM GPU_METRICS g JOIN TARGET_INFO_GPU_METRICS i "
            "ON i.typeId = g.typeId AND i.metricId = g.metricId WHERE i.metricName = ? AND g.typeId % 256 = ? ORDER BY g.timestamp",
            (label, device),
        ).fetchall()
    finally:
        con.close()


def _integrate(samples: list[tuple[int, int]], a: int, b: int) -> float:
    """Mean over [a, b) of the step function v_i on (t_{i-1}, t_i] (first interval: one median period)."""
    ts = [t for t, _ in samples]
    diffs = sorted(y - x for x, y in zip(ts, ts[1:], strict=False))
    n = len(diffs)
    period = diffs[n // 2] if n % 2 else (diffs[n // 2 - 1] + diffs[n // 2]) / 2
    total, prev = 0.0, ts[0] - period
    for t, v in samples:
        total += v * max(0.0, min(t, b) - max(prev, a))
        prev = t
    return total / (b - a)


def test_stable_names_do_not_collide(trace: tracekit.NsysTrace) -> None:
    g = trace.gpu_metrics
    per = g.group_by("device_id", "metric").agg(pl.col("metric_label").n_unique())
    assert (per["metric_label"] == 1).all()
    assert {"tensor_active", "sms_active", "sm_issue", "dram_read_bandwidth", "nvlink_tx_requests_user_data"} <= set(metric_names(g))
    assert stable_metric_name("Tensor Active") == stable_metric_name("Tensor Active [Throughput %]") == "tensor_active"
    assert stable_metric_name("SM Active") == "sms_active"


def test_kernel_means_equal_direct_integration(trace: tracekit.NsysTrace) -> None:
    km = kernel_metrics(trace.kernels, trace.gpu_metrics, metrics=["sms_active", "tensor_active", "dram_read_bandwidth"])
    assert km.height == trace.kernels.height
    labels = {"sms_active": "SMs Active [Throughput %]", "tensor_active": "Tensor Active [Throughput %]",
              "dram_read_bandwidth": "DRAM Read Bandwidth [Throughput %]"}
    raw = {(d, m): _samples(d, lab) for d in (0, 1) for m, lab in labels.items()}
    picks = pl.concat([km.sort("duration_ns").head(5), km.sort("duration_ns").tail(5)])
    for row in picks.iter_rows(named=True):
        for m in labels:
            expected = _integrate(raw[(row["device_id"], m)], row["start_ns"], row["end_ns"])
            assert row[m] == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert km["below_sample_period"].sum() == (km["duration_ns"] < km["metric_period_ns"]).sum() > 0


def test_zero_length_and_outside_windows(trace: tracekit.NsysTrace) -> None:
    s = _samples(0, "SMs Active [Throughput %]")
    t_mid = (s[10][0] + s[11][0]) // 2
    w = pl.DataFrame({"device_id": [0, 0, 0], "start_ns": [t_mid, s[-1][0] + 10**9, s[10][0]], "end_ns": [t_mid, s[-1][0] + 2 * 10**9, s[12][0]]})
    out = window_metrics(w, trace.gpu_metrics, metrics=["sms_active"])
    assert out["sms_active"][0] == s[11][1]  # inside interval 11
    assert out["sms_active"][1] is None  # after the last sample
    assert out["sms_active"][2] == pytest.approx((s[11][1] * (s[11][0] - s[10][0]) + s[12][1] * (s[12][0] - s[11][0])) / (s[12][0] - s[10][0]))
    with pytest.raises(ValueError, match="not in this trace"):
        window_metrics(w, trace.gpu_metrics, metrics=["no_such_metric"])


def test_group_means_are_duration_weighted(trace: tracekit.NsysTrace) -> None:
    km = kernel_metrics(trace.kernels, trace.gpu_metrics)
    by_name = metrics_by(km, ["name"])
    row = by_name.row(0, named=True)
    mine = km.filter(pl.col("name") == row["name"])
    expected = (mine["tensor_active"] * mine["duration_ns"]).sum() / mine["duration_ns"].sum()
    assert row["tensor_active"] == pytest.approx(expected)
    assert by_name["gpu_time_ns"].sum() == km["duration_ns"].sum()
    ranges = metrics_by(attribute_nvtx(launch_info(km, trace.cuda_api), trace.nvtx), ["nvtx_range"])
    assert "NCCL:ncclAllReduce" in set(ranges["nvtx_range"])
    assert any(c.startswith("nvlink_") for c in ranges.columns)


def test_resampled_series_conserve_the_integral(trace: tracekit.NsysTrace) -> None:
    r = resample_metrics(trace.gpu_metrics, bin_ns=5_000_000, metrics=["sms_active"])
    s = _samples(1, "SMs Active [Throughput %]")
    bins = r.filter(pl.col("device_id") == 1).sort("bin_start_ns")
    first = bins.row(3, named=True)
    assert first["value"] == pytest.approx(_integrate(s, first["bin_start_ns"], first["bin_start_ns"] + 5_000_000))
    with pytest.raises(ValueError, match="positive"):
        resample_metrics(trace.gpu_metrics, bin_ns=0)
