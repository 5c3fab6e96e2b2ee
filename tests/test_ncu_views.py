"""Drill-down views on the H200 samples: known FLOP counts of the GEMMs, ncu's own DRAM and
SOL figures, the report's peaks, and the same answers from the CSV as from the binary."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import polars as pl
import pytest

from tracekit.analysis.ncu_views import (
    dram_bandwidth,
    roofline,
    roofline_ceilings,
    speed_of_light,
    tensor_core_utilization,
)
from tracekit.ncu import NcuReport
from tracekit.ncu.metric_names import dense_peak_counters, parse_tensor_counter, tensor_flop_terms
from tracekit.ncu.specs import GPU_SPECS, find_spec, spec_table, tensor_peak_tflops

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces" / "ncu"
from .conftest import CORPUS as _CORPUS  # noqa: E402

CORPUS = _CORPUS / "ncu"
HAVE_WHEEL = importlib.util.find_spec("ncu_report") is not None
needs_wheel = pytest.mark.skipif(
    not HAVE_WHEEL, reason="ncu-report not installed (pip install 'tracekit[ncu]')"
)
N = 4096
GEMM_FLOP = 2 * N**3  # 137,438,953,472
PRECISIONS = ("bf16", "fp16", "tf32", "fp32_simt", "fp8", "fp64")
_cache: dict[Path, NcuReport] = {}


def report(name: str, suffix: str = ".raw.csv") -> NcuReport:
    path = SAMPLES / name / f"{name}{suffix}"
    if not path.exists():
        pytest.skip(f"sample {path} not captured yet")
    if path not in _cache:
        _cache[path] = NcuReport.from_path(path)
    return _cache[path]


def by_range(frame: pl.DataFrame) -> dict[str, dict]:
    return {row["nvtx_path"].split("/")[-1]: row for row in frame.iter_rows(named=True)}


# -- Tensor Cores ------------------------------------------------------------------------


def test_tensor_flops_equal_two_n_cubed() -> None:
    """sm__ops_path_tensor_* count 2 FLOPs per MAC: each 4096³ GEMM is 2·4096³ exactly."""
    rows = by_range(tensor_core_utilization(report("ncu_precisions")))
    for precision in ("bf16", "fp16", "tf32", "fp8"):
        assert rows[precision]["tensor_flop"] == GEMM_FLOP
        assert rows[precision]["tensor_precision"] == precision
        assert rows[precision]["tensor_pipe_pct"] > 80
        assert rows[precision]["hmma_pipe_pct"] == pytest.approx(rows[precision]["tensor_pipe_pct"])
        assert rows[precision]["dmma_pipe_pct"] == 0
    assert rows["fp64"]["tensor_flop"] == 2 * 2048**3  # DMMA, 2048³
    assert rows["fp64"]["tensor_precision"] == "fp64"
    assert rows["fp64"]["dmma_pipe_pct"] == pytest.approx(rows["fp64"]["tensor_pipe_pct"])
    assert rows["fp64"]["dmma_pipe_pct"] > 80
    assert rows["fp64"]["hmma_pipe_pct"] == 0
    assert rows["fp32_simt"]["tensor_flop"] == 0
    assert rows["fp32_simt"]["tensor_precision"] is None
    assert rows["fp32_simt"]["tensor_pipe_pct"] < 1
    assert (
        rows["bf16"]["tensor_pipe_metric"]
        == "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed"
    )


def test_tensor_peak_from_spec_when_the_report_has_none() -> None:
    """The precision sample was captured without the tensor-roofline section: the dense
    datasheet peaks of the H200 apply."""
    rows = by_range(tensor_core_utilization(report("ncu_precisions")))
    expected = {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp8": 1978.9, "fp64": 66.9}
    for precision, tflops in expected.items():
        assert rows[precision]["peak_source"] == "spec"
        assert rows[precision]["peak_tensor_flops_per_s"] == pytest.approx(tflops * 1e12)
        achieved = GEMM_FLOP / (rows[precision]["duration_ns"] * 1e-9)
        if precision == "fp64":
            achieved = 2 * 2048**3 / (rows[precision]["duration_ns"] * 1e-9)
        assert rows[precision]["tensor_flops_per_s"] == pytest.approx(achieved)
        assert rows[precision]["tensor_pct_of_peak"] == pytest.approx(
            100 * achieved / (tflops * 1e12)
        )


def test_tensor_peak_from_report_matches_pipe_utilization() -> None:
    """With the tensor-roofline section, the dense bf16 peak is the wgmma path's
    540,672 FLOP/cycle × the measured SM clock, and achieved/peak equals the pipe-busy %."""
    full = report("ncu_probe_full", ".ncu-rep") if HAVE_WHEEL else report("ncu_probe_full")
    rows = by_range(tensor_core_utilization(full))
    gemm = rows["gemm"]
    assert gemm["tensor_flop"] == GEMM_FLOP
    assert gemm["peak_source"] == "report"
    assert (
        gemm["tensor_peak_metric"]
        == "sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32_sparsity_off.sum.peak_sustained"
    )
    clock = full.wide(["sm__cycles_elapsed.avg.per_second"])["sm__cycles_elapsed.avg.per_second"][0]
    assert gemm["peak_tensor_flops_per_s"] == pytest.approx(540_672 * clock, rel=1e-9)
    assert gemm["tensor_pct_of_peak"] == pytest.approx(gemm["tensor_pipe_pct"], abs=1.0)
    assert rows["attn"]["tensor_precision"] == "bf16" and rows["attn"]["tensor_flop"] > 0
    assert rows["elementwise"]["tensor_flop"] == 0


# -- DRAM ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ncu_precisions", "ncu_probe_full"])
def test_dram_bandwidth_equals_ncu(name: str) -> None:
    rep = report(name)
    dram = dram_bandwidth(rep)
    raw = rep.wide(
        [
            "dram__bytes_read.sum",
            "dram__bytes_write.sum",
            "dram__bytes.sum.per_second",
            "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
            "lts__t_sector_hit_rate.pct",
        ]
    )
    joined = dram.join(raw, on="id")
    assert (
        joined["dram_bytes"] == joined["dram__bytes_read.sum"] + joined["dram__bytes_write.sum"]
    ).all()
    assert (joined["dram_bytes_source"] == "read+write").all()
    assert (joined["bandwidth_gbps"] == joined["dram__bytes.sum.per_second"] / 1e9).all()
    assert (joined["l2_hit_rate_pct"] == joined["lts__t_sector_hit_rate.pct"]).all()
    # H200: 1,504 B/cycle × 3.2 GHz = 4.8 TB/s, read from the report
    assert (joined["peak_source"] == "report").all()
    assert joined["peak_bandwidth_gbps"].min() == pytest.approx(4800, rel=0.01)
    # our bandwidth / peak reproduces ncu's "DRAM Throughput" percentage
    diff = (
        joined["bandwidth_pct_of_peak"]
        - joined["gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"]
    ).abs()
    assert diff.max() < 0.5


def test_dram_bytes_from_rate_when_counts_are_absent() -> None:
    dram = dram_bandwidth(report("ncu_decode_drilldown"))
    assert (dram["dram_bytes_source"] == "rate*duration").all()
    assert dram["dram_read_bytes"].null_count() == dram.height == 60
    assert (dram["dram_bytes"] > 0).all()


# -- speed of light ---------------------------------------------------------------------------

NCU_BOTTLENECK = {
    "High Compute Throughput": "compute",
    "High Memory Throughput": "memory",
    "Latency Issue": "latency",
}


@pytest.mark.ncu
@needs_wheel
def test_bound_agrees_with_ncu_bottleneck_rule() -> None:
    """ncu's SOLBottleneck rule titles its finding; our thresholds reproduce it."""
    compared = 0
    paths = sorted(SAMPLES.glob("*/*.ncu-rep")) + sorted(CORPUS.glob("*.ncu-rep"))
    for path in paths:
        rep = NcuReport.from_path(path)
        titles = rep.rules.filter(pl.col("rule_id") == "SOLBottleneck").select("id", "title")
        sol = speed_of_light(rep).join(titles, on="id")
        for row in sol.iter_rows(named=True):
            if row["title"] in NCU_BOTTLENECK:
                assert row["bound"] == NCU_BOTTLENECK[row["title"]], (path.name, row)
                compared += 1
    assert compared >= 4


def test_speed_of_light_columns() -> None:
    sol = by_range(speed_of_light(report("ncu_probe_full")))
    assert sol["gemm"]["bound"] == "high_throughput"  # 90 % compute: ncu's "High Throughput"
    assert sol["attn"]["bound"] == "latency"
    assert sol["gemm"]["compute_throughput_pct"] == pytest.approx(90.29, abs=0.01)
    assert sol["elementwise"]["achieved_occupancy_pct"] > 80
    assert sol["gemm"]["theoretical_occupancy_pct"] == 18.75
    assert 1.4e9 < sol["gemm"]["sm_clock_hz"] < 2.0e9
    loose = speed_of_light(report("ncu_probe_full"), latency_threshold_pct=30.0)
    assert by_range(loose)["attn"]["bound"] == "compute"


# -- roofline ------------------------------------------------------------------------------


def test_roofline_of_the_precision_gemms() -> None:
    rows = by_range(roofline(report("ncu_precisions")))
    simt = rows["fp32_simt"]
    assert simt["simt_fp32_flop"] == pytest.approx(GEMM_FLOP, rel=1e-3)  # FFMA×2 + FADD + FMUL
    assert simt["dominant"] == "simt_fp32"
    assert simt["peak_source"] == "report"
    bf16 = rows["bf16"]
    assert bf16["flop"] == pytest.approx(GEMM_FLOP, rel=1e-6)
    assert bf16["dominant"] == "tensor_bf16"
    assert bf16["arithmetic_intensity"] == pytest.approx(GEMM_FLOP / bf16["dram_bytes"], rel=1e-6)
    assert 700 < bf16["arithmetic_intensity"] < 850
    for name in PRECISIONS:
        assert rows[name]["bound"] == "compute"
        assert 0 < rows[name]["pct_of_attainable"] <= 100
        assert rows[name]["flop_sources"] == "simt+tensor"


def test_roofline_ceilings_from_report_peaks() -> None:
    ceilings = roofline_ceilings(report("ncu_probe_full"))
    first = {r["ceiling"]: r for r in ceilings.filter(pl.col("id") == 0).iter_rows(named=True)}
    clock = report("ncu_probe_full").wide(["sm__cycles_elapsed.avg.per_second"])[
        "sm__cycles_elapsed.avg.per_second"
    ][0]
    assert first["simt_fp32"]["value"] == pytest.approx(2 * 16_896 * clock)  # 132 SMs × 128 FMA
    assert first["simt_fp64"]["value"] == pytest.approx(2 * 8_448 * clock)
    assert first["tensor_fp64"]["value"] == pytest.approx(33_792 * clock)
    assert first["tensor_fp8"]["value"] == pytest.approx(1_081_344 * clock)  # dense, not 2,162,688
    assert {r["source"] for r in first.values()} == {"report"}
    assert first["dram"]["unit"] == "byte/s"
    elementwise = by_range(roofline(report("ncu_probe_full")))["elementwise"]
    assert elementwise["bound"] == "memory"
    assert elementwise["arithmetic_intensity"] < elementwise["ridge_point"]


@pytest.mark.ncu
@needs_wheel
def test_views_agree_between_csv_and_binary() -> None:
    for name in ("ncu_precisions", "ncu_probe_full", "ncu_decode_drilldown"):
        binary, text = report(name, ".ncu-rep"), report(name)
        for view in (tensor_core_utilization, dram_bandwidth, speed_of_light, roofline):
            a, b = view(binary), view(text)
            assert a.columns == b.columns and a.height == b.height
            for column in a.columns:
                if a.schema[column] == pl.Float64:
                    x, y = a[column], b[column]
                    assert (x.is_null() == y.is_null()).all(), (name, view.__name__, column)
                    # The CSV prints two decimals. SIMT FLOPs are per-cycle rates (0.33/cycle)
                    # × cycles, so a tiny kernel's count can move by 0.5%; the rest by ~1e-6.
                    rel = 1e-2 if view is roofline else 1e-5
                    close = ((x - y).abs() <= 0.01 + rel * x.abs()) | x.is_null()
                    assert close.all(), (name, view.__name__, column)
                else:
                    assert a[column].equals(b[column]), (name, view.__name__, column)


@pytest.mark.ncu
@needs_wheel
@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.ncu-rep")), ids=lambda p: p.name)
def test_views_run_on_the_corpus(path: Path) -> None:
    rep = NcuReport.from_path(path)
    for view in (tensor_core_utilization, dram_bandwidth, speed_of_light, roofline):
        out = view(rep)
        assert out.height == rep.kernels.height
    sol = speed_of_light(rep)
    assert sol["compute_throughput_pct"].null_count() <= 1  # the failed flash kernel of 2023.3


def test_views_take_a_bare_metrics_frame() -> None:
    rep = report("ncu_precisions")
    out = tensor_core_utilization(rep.metrics)
    assert out["short_name"].null_count() == out.height
    assert out["tensor_flop"].to_list() == tensor_core_utilization(rep)["tensor_flop"].to_list()


# -- registries ---------------------------------------------------------------------------


def test_tensor_counter_selection_avoids_double_counting() -> None:
    hopper = [
        "sm__ops_path_tensor_src_bf16_dst_fp32.sum",
        "sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32_sparsity_off.sum",
        "sm__ops_path_tensor_op_hmma_src_bf16_dst_fp32_sparsity_off.sum",
        "sm__ops_path_tensor_src_fp8_sparsity_off.sum",
        "sm__ops_path_tensor_src_fp8_sparsity_on.sum",
        "sm__ops_path_tensor_src_fp16.sum",
        "sm__ops_path_tensor_src_int8.sum",
        "sm__ops_path_tensor_src_bf16_dst_fp32_realtime.sum",
    ]
    assert [t.metric for t in tensor_flop_terms(hopper)] == [
        "sm__ops_path_tensor_src_bf16_dst_fp32.sum",
        "sm__ops_path_tensor_src_fp16.sum",
        "sm__ops_path_tensor_src_fp8_sparsity_off.sum",
        "sm__ops_path_tensor_src_fp8_sparsity_on.sum",
    ]
    ampere = [
        "sm__ops_path_tensor_src_fp16_dst_fp32.sum",
        "sm__ops_path_tensor_src_fp16_dst_fp16.sum",
    ]
    assert len(tensor_flop_terms(ampere)) == 2
    only_paths = ["sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32_sparsity_off.sum"]
    assert [t.op for t in tensor_flop_terms(only_paths)] == ["hgmma"]
    blackwell = parse_tensor_counter("sm__ops_path_tensor_src_fp4_fp6_fp8_dst_fp32.sum")
    assert blackwell is not None and blackwell.precision == "fp4_fp6_fp8"
    peaks = [
        "sm__ops_path_tensor_src_bf16_dst_fp32.sum.peak_sustained",
        "sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32_sparsity_off.sum.peak_sustained",
        "sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32_sparsity_on.sum.peak_sustained",
        "sm__ops_path_tensor_src_fp64.sum.peak_sustained",
    ]
    assert [c.op for c in dense_peak_counters(peaks, "bf16")] == ["hgmma"]
    assert [c.metric for c in dense_peak_counters(peaks, "fp64")] == [peaks[-1]]


def test_spec_table_lookup() -> None:
    assert find_spec("NVIDIA H200").name == "H200 SXM"
    assert find_spec("NVIDIA H100 80GB HBM3").name == "H100 SXM5"
    assert find_spec("NVIDIA H100 PCIe").name == "H100 PCIe"
    assert find_spec("NVIDIA A100-SXM4-80GB").bandwidth_gbps == 2039
    assert find_spec("NVIDIA A100-SXM4-40GB").bandwidth_gbps == 1555
    assert find_spec("NVIDIA L40S").tensor_tflops["fp8"] == 733
    assert find_spec("Tesla V100-SXM2-32GB").fp32_tflops == 15.7
    assert find_spec("Tesla T4").bandwidth_gbps == 320
    assert find_spec("NVIDIA B200").compute_capability == "10.0"
    assert find_spec("NVIDIA GeForce RTX 4090") is None
    assert tensor_peak_tflops(find_spec("NVIDIA B200"), "fp4_fp6_fp8") == 4500
    assert spec_table().height == len(GPU_SPECS)


def test_gpu_spec_matching_on_full_name_and_memory() -> None:
    """GH200 is not an H200; NVL, PCIe and SXM cards and the 40/80 GB A100s are kept apart."""
    from tracekit.ncu.specs import find_spec

    cases = {
        ("NVIDIA GH200 480GB", None): ("GH200 96GB HBM3", 4000.0),
        ("NVIDIA GH200 480GB", 144e9): ("GH200 144GB HBM3e", 4900.0),
        ("NVIDIA H200", None): ("H200 SXM", 4800.0),
        ("NVIDIA H200 NVL", None): ("H200 NVL", 4800.0),
        ("NVIDIA H100 80GB HBM3", None): ("H100 SXM5", 3350.0),
        ("NVIDIA H100 PCIe", None): ("H100 PCIe", 2000.0),
        ("NVIDIA H100 NVL", None): ("H100 NVL", 3900.0),
        ("NVIDIA A100-SXM4-40GB", None): ("A100 SXM4 40GB", 1555.0),
        ("NVIDIA A100-SXM4-80GB", None): ("A100 SXM4 80GB", 2039.0),
        ("NVIDIA A100 80GB PCIe", None): ("A100 PCIe 80GB", 1935.0),
        ("NVIDIA A100-PCIE-40GB", None): ("A100 PCIe 40GB", 1555.0),
        ("NVIDIA L4", None): ("L4", 300.0),
        ("NVIDIA L40S", None): ("L40S", 864.0),
        ("NVIDIA B200", None): ("B200", 8000.0),
    }
    for (name, mem), (expected, bw) in cases.items():
        spec = find_spec(name, mem)
        assert spec is not None and (spec.name, spec.bandwidth_gbps) == (expected, bw), name
    # the GPUs of our own captures, by the name and memory their exports record
    import tracekit

    from .conftest import SAMPLES

    for path, expected in ((SAMPLES / "planted" / "planted_clean" / "planted_clean.sqlite", "H100 SXM5"),
                           (SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite", "H200 SXM")):
        g = tracekit.open(path).gpus.row(0, named=True)
        assert find_spec(g["name"], g["total_memory_bytes"]).name == expected  # type: ignore[union-attr]


def test_bound_reproduces_ncus_solbottleneck_titles() -> None:
    """On every kernel of every sample and corpus ncu report, ``bound`` names the case ncu's
    SOLBottleneck rule printed (its title): "High Throughput" above 80 % included."""
    import glob

    import tracekit

    from .conftest import CORPUS, SAMPLES

    title_to_bound = {"High Throughput": "high_throughput", "High Compute Throughput": "compute",
                      "High Memory Throughput": "memory", "Balanced Throughput": "balanced",
                      "Latency Issue": "latency", "Small Grid": "latency"}
    checked = 0
    for path in [*glob.glob(str(SAMPLES / "ncu" / "*" / "*.ncu-rep")), *glob.glob(str(CORPUS / "ncu" / "*.ncu-rep"))]:
        rep = tracekit.open(path)
        sol = speed_of_light(rep).select("id", "bound")
        titles = rep.rules.filter((pl.col("rule_id") == "SOLBottleneck") & pl.col("title").is_not_null()).group_by("id").agg(
            pl.col("title").first()
        )
        for row in sol.join(titles, on="id").iter_rows(named=True):
            assert row["bound"] == title_to_bound[row["title"]], (path, row)
            checked += 1
    assert checked >= 90


def test_no_nan_in_the_views() -> None:
    """An unmodified report (the decode drill-down has no tensor counters: its GEMMs count 0
    FLOPs) gave NaN pct_of_attainable (0/0); every float of every view is a number or null."""
    import glob

    import tracekit

    from .conftest import CORPUS, SAMPLES

    for path in [*glob.glob(str(SAMPLES / "ncu" / "*" / "*.ncu-rep")), *glob.glob(str(CORPUS / "ncu" / "*.ncu-rep"))]:
        rep = tracekit.open(path)
        for view in (roofline, speed_of_light, tensor_core_utilization, dram_bandwidth):
            frame = view(rep)
            floats = [c for c, t in frame.schema.items() if t in (pl.Float32, pl.Float64)]
            nans = frame.select(pl.sum_horizontal(pl.col(c).is_nan().fill_null(False).cast(pl.Int64) for c in floats).sum()).item() if floats else 0
            assert nans == 0, (path, view.__name__)


def test_int8_tensor_gemm_counts_integer_operations() -> None:
    """An INT8 GEMM (torch._int_mm, 4096³, H100, ncu --set full): 2·4096³ integer tensor
    operations (sm__ops_path_tensor_src_int8.sum), none of them FLOPs; the roofline counts them
    as operations against the report's own INT8 peak (it gave 0 FLOPs, 0 intensity and NaN %)."""
    import tracekit

    from .conftest import SAMPLES

    rep = tracekit.open(SAMPLES / "ncu" / "ncu_int8" / "ncu_int8.raw.csv")
    tcu = tensor_core_utilization(rep)
    imma = tcu.filter(pl.col("tensor_precision") == "int8").row(0, named=True)
    assert imma["tensor_int_ops"] == 2 * 4096**3 and imma["tensor_flop"] == 0
    assert imma["imma_pipe_pct"] == pytest.approx(imma["tensor_pipe_pct"])  # one denominator on Hopper
    roof = roofline(rep).filter(pl.col("tensor_precision") == "int8").row(0, named=True)
    assert roof["flop"] == 2 * 4096**3 and roof["dominant"] == "tensor_int8"
    assert roof["arithmetic_intensity"] > 100 and 0 < roof["pct_of_attainable"] < 100
    ceil = roofline_ceilings(rep).filter(pl.col("ceiling") == "tensor_int8").row(0, named=True)
    assert ceil["source"] == "report" and ceil["unit"] == "op/s"
    assert roof["pct_of_attainable"] == pytest.approx(100 * roof["flops_per_s"] / ceil["value"])


def test_roofline_says_why_pct_of_attainable_is_missing() -> None:
    """Issue 19.7: an unmodified report gave pct_of_attainable without a number (NaN, then null)
    for its copy and elementwise-index kernels and never said why. Each such row now has a
    reason, checked against the columns it comes from; computed rows have none."""
    rows = roofline(report("ncu_decode_drilldown"))
    missing = rows.filter(pl.col("pct_of_attainable").is_null())
    assert missing.height > 0 and not rows["pct_of_attainable"].is_nan().any()
    assert missing["pct_of_attainable_reason"].null_count() == 0
    assert rows.filter(pl.col("pct_of_attainable").is_not_null())["pct_of_attainable_reason"].null_count() == (
        rows.height - missing.height
    )
    for row in missing.iter_rows(named=True):
        reason = row["pct_of_attainable_reason"]
        if reason == "no FLOPs counted":
            assert row["flop"] == 0 and row["flop_sources"] is not None
        elif reason == "no FLOP counters in the report":
            assert row["flop_sources"] is None
        else:
            assert reason in ("no duration", "no DRAM byte counters in the report") or reason.startswith("no peak rate")
    assert set(missing["pct_of_attainable_reason"]) == {"no FLOPs counted"}
