"""nsys ↔ ncu on one program: the TinyLLM decode loop traced with nsys (8 steps) and its
step.1 profiled with ncu (``--nvtx-include step.1/``)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit.analysis.nsys_ncu import (
    DRILLDOWN_SECTIONS,
    join_ncu_to_nsys,
    ncu_command_for_top_kernels,
    nvtx_include_matches,
    top_kernels_plan,
)
from tracekit.ncu import NcuReport

ROOT = Path(__file__).resolve().parents[1]
NSYS = ROOT / "sample_traces" / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
NCU = ROOT / "sample_traces" / "ncu" / "ncu_decode_drilldown"
HAVE_WHEEL = importlib.util.find_spec("ncu_report") is not None
_cache: dict[str, pl.DataFrame] = {}


def attribute_nvtx(trace: object) -> pl.DataFrame:
    """``kernels`` with ``nvtx_path``: the push/pop ranges open on the launching thread when
    the kernel was launched (a stand-in for tracekit's NVTX attribution)."""
    kernels = trace.kernels.with_row_index("_k")  # type: ignore[attr-defined]
    api = trace.cuda_api.select(
        "pid", "tid", "correlation_id", pl.col("start_ns").alias("launch_ns")
    )  # type: ignore[attr-defined]
    ranges = trace.nvtx.filter(pl.col("event_type") == "PushPop").select(  # type: ignore[attr-defined]
        "pid",
        "tid",
        pl.col("start_ns").alias("r0"),
        pl.col("end_ns").alias("r1"),
        pl.col("name").alias("range"),
    )
    launched = kernels.join(api, on=["pid", "correlation_id"], how="left")
    inside = (
        launched.select("_k", "pid", "tid", "launch_ns")
        .join(ranges, on=["pid", "tid"])
        .filter((pl.col("r0") <= pl.col("launch_ns")) & (pl.col("launch_ns") <= pl.col("r1")))
    )
    paths = (
        inside.sort("_k", "r0").group_by("_k").agg(pl.col("range").str.join("/").alias("nvtx_path"))
    )
    return kernels.join(paths, on="_k", how="left").drop("_k")


def nsys_kernels(with_nvtx: bool = True) -> pl.DataFrame:
    if not NSYS.exists():
        pytest.skip(f"{NSYS} not captured")
    key = f"nsys{with_nvtx}"
    if key not in _cache:
        trace = tracekit.open(NSYS)
        _cache[key] = attribute_nvtx(trace) if with_nvtx else trace.kernels
    return _cache[key]


def ncu_kernels(source: str) -> pl.DataFrame:
    suffix = ".ncu-rep" if source == "binary" else ".raw.csv"
    if source == "binary" and not HAVE_WHEEL:
        pytest.skip("ncu-report not installed")
    path = NCU / f"ncu_decode_drilldown{suffix}"
    if not path.exists():
        pytest.skip(f"{path} not captured")
    if source not in _cache:
        _cache[source] = NcuReport.from_path(path).kernels
    return _cache[source]


def counts(summary: pl.DataFrame) -> dict[tuple[str, str], int]:
    return {(r["side"], r["status"]): r["kernels"] for r in summary.iter_rows(named=True)}


# -- NVTX include grammar ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "expression", "expected"),
    [
        ("step.1/layer.0/attn", "step.1/", True),
        ("step.1/layer.0/attn", "layer.0/", True),  # anywhere in the stack
        ("step.1/layer.0/attn", "[layer.0/", False),  # anchored at the outermost range
        ("step.1/layer.0/attn", "[step.1/", True),
        ("step.1/layer.0/attn", "step.1/attn/", False),  # B directly inside A
        ("step.1/layer.0/attn", "step.1/*/attn/", True),
        ("step.1/attn", "step.1/*/attn/", True),  # zero ranges between
        ("step.1/layer.0/attn", "step.1/+/attn/", True),  # exactly one between
        ("step.1/attn", "step.1/+/attn/", False),
        ("step.1/layer.0/attn", "layer.0]/", False),  # anchored at the innermost range
        ("step.1/layer.0/attn", "attn]/", True),
        ("step.10/layer.0", "step.1/", False),
        (None, "step.1/", False),
        ("step.1", "step.1", None),  # a start/end range: undecidable from push/pop paths
        ("step.1", "regex:step.*/", None),
    ],
)
def test_nvtx_include_grammar(path: str | None, expression: str, expected: bool | None) -> None:
    assert nvtx_include_matches(path, expression) is expected


# -- nsys → ncu ------------------------------------------------------------------------------


def test_plan_for_top_kernels_of_one_step() -> None:
    kernels = nsys_kernels()
    plan = top_kernels_plan(kernels, top_n=5, nvtx_include="step.1/")
    step = kernels.filter(pl.col("nvtx_path").str.starts_with("step.1"))
    expected = (
        step.group_by("short_name")
        .agg(pl.col("duration_ns").sum())
        .sort("duration_ns", descending=True)
        .head(5)
    )
    assert plan["short_name"].to_list() == expected["short_name"].to_list()
    assert plan["total_duration_ns"].to_list() == expected["duration_ns"].to_list()
    assert plan["rank"].to_list() == [1, 2, 3, 4, 5]
    assert plan["launches"].sum() <= step.height == 60
    assert plan["pct_of_gpu_time"].sum() < 100
    # one ncu run over step.1 must reach the first launch of each of the five kernels
    assert plan["launch_count"][0] == plan["first_launch"].max() + 1
    assert plan["kernel_id"][0].startswith("::regex:^")


def test_command_for_top_kernels() -> None:
    kernels = nsys_kernels()
    program = ["python3", "decode.py", "--steps", "2"]
    args = ncu_command_for_top_kernels(kernels, top_n=3, nvtx_include="step.1/", program=program)
    assert args[0] == "ncu" and args[-4:] == program
    assert args[args.index("--nvtx-include") + 1] == "step.1/" and "--nvtx" in args
    regex = args[args.index("-k") + 1]
    assert regex.startswith("regex:")
    plan = top_kernels_plan(kernels, top_n=3, nvtx_include="step.1/")
    pattern = re.compile(regex.removeprefix("regex:"))
    for name in kernels["short_name"].unique().to_list():
        assert (pattern.match(name) is not None) == (name in plan["short_name"].to_list())
    assert args[args.index("--launch-count") + 1] == str(plan["launch_count"][0])
    assert [args[i + 1] for i, a in enumerate(args) if a == "--section"] == list(DRILLDOWN_SECTIONS)
    assert "--launch-skip" not in args
    more = ncu_command_for_top_kernels(
        kernels,
        top_n=2,
        program=program,
        launch_skip=60,
        launches_per_kernel=2,
        metrics=["dram__bytes_read.sum"],
    )
    assert more[more.index("--launch-skip") + 1] == "60"
    assert more[more.index("--metrics") + 1] == "dram__bytes_read.sum"
    assert "--nvtx" not in more
    with pytest.raises(ValueError, match="program"):
        ncu_command_for_top_kernels(kernels, program=[])
    with pytest.raises(ValueError, match="no kernels"):
        ncu_command_for_top_kernels(kernels, nvtx_include="step.99/", program=program)


# -- ncu → nsys -------------------------------------------------------------------------------


@pytest.mark.parametrize("source", [pytest.param("binary", marks=pytest.mark.ncu), "csv"])
def test_join_by_nvtx_path(source: str) -> None:
    nsys, ncu = nsys_kernels(), ncu_kernels(source)
    matched, summary = join_ncu_to_nsys(nsys, ncu)
    assert matched.height == ncu.height == 60
    assert sorted(matched["ncu_id"].to_list()) == list(range(60))
    assert matched["nvtx_path"].str.starts_with("step.1").all()
    assert matched["launch_config_equal"].all()
    assert (matched["short_name"] == ncu.sort("id")["short_name"]).all()
    # nsys timings beside ncu's replayed durations; both measured the same kernels
    assert set(matched.columns) >= {
        "start_ns",
        "duration_ns",
        "correlation_id",
        "ncu_id",
        "ncu_duration_ns",
    }
    assert (matched["duration_ns"] > 0).all() and (matched["ncu_duration_ns"] > 0).all()
    assert counts(summary) == {
        ("ncu", "matched"): 60,
        ("nsys", "matched"): 60,
        ("nsys", "outside_ncu_capture"): 420,
    }


def test_join_falls_back_to_launch_order() -> None:
    """Without NVTX the N-th launch of a name pairs with the N-th: here step.0, since ncu saw
    step.1 only; an offset per name (its launches per step) realigns it."""
    nsys, ncu = nsys_kernels(), ncu_kernels("csv")
    matched, summary = join_ncu_to_nsys(nsys, ncu, use_nvtx=False)
    assert matched.height == 60
    assert matched["nvtx_path"].str.starts_with("step.0").all()
    assert counts(summary)[("nsys", "not_profiled")] == 420
    per_step = ncu.group_by("short_name").len()
    offsets = dict(zip(per_step["short_name"], per_step["len"], strict=True))
    shifted, _ = join_ncu_to_nsys(nsys, ncu, use_nvtx=False, launch_offset=offsets)
    assert shifted["nvtx_path"].str.starts_with("step.1").all()
    plain, _ = join_ncu_to_nsys(nsys_kernels(with_nvtx=False), ncu)
    assert plain.height == 60 and "nvtx_path" not in plain.columns


def test_join_reports_why_kernels_did_not_match() -> None:
    nsys = nsys_kernels()
    other = NcuReport.from_path(
        ROOT / "sample_traces" / "ncu" / "ncu_precisions" / "ncu_precisions.raw.csv"
    )
    matched, summary = join_ncu_to_nsys(nsys, other.kernels)
    assert matched.height == 0
    assert counts(summary) == {("ncu", "name_not_in_nsys"): 6, ("nsys", "outside_ncu_capture"): 480}
    # same names, an NVTX path nsys never saw
    moved = ncu_kernels("csv").with_columns(pl.lit("step.99").alias("nvtx_path"))
    _, summary = join_ncu_to_nsys(nsys, moved)
    assert counts(summary)[("ncu", "nvtx_path_not_in_nsys")] == 60
    # more ncu launches than nsys has for the key
    doubled = pl.concat([ncu_kernels("csv"), ncu_kernels("csv").with_columns(pl.col("id") + 60)])
    matched, summary = join_ncu_to_nsys(
        nsys.filter(pl.col("nvtx_path").str.starts_with("step.1")), doubled
    )
    assert counts(summary)[("ncu", "more_launches_than_nsys")] == 60
    assert matched.height == 60
    # a launch configuration that differs is matched but flagged
    regrid = ncu_kernels("csv").with_columns(
        pl.when(pl.col("id") == 0).then(999).otherwise(pl.col("grid_x")).alias("grid_x")
    )
    matched, summary = join_ncu_to_nsys(nsys, regrid)
    assert counts(summary)[("ncu", "matched_config_differs")] == 1
    assert matched.filter(pl.col("ncu_id") == 0)["launch_config_equal"].to_list() == [False]
    # with the configuration in the key it cannot match at all, and the summary says why
    matched, summary = join_ncu_to_nsys(nsys, regrid, match_launch_config=True)
    assert counts(summary)[("ncu", "launch_config_not_in_nsys")] == 1
    assert matched.height == 59 and matched["launch_config_equal"].all()


def test_join_with_tracekit_nvtx_attribution() -> None:
    attribution = pytest.importorskip("tracekit.analysis.attribution")
    if not NSYS.exists():
        pytest.skip(f"{NSYS} not captured")
    trace = tracekit.open(NSYS)
    kernels = attribution.attribute_nvtx(
        attribution.launch_info(trace.kernels, trace.cuda_api), trace.nvtx
    )
    matched, summary = join_ncu_to_nsys(kernels, ncu_kernels("csv"))
    assert matched.height == 60
    assert matched["nvtx_path"].str.starts_with("step.1").all()
    assert counts(summary)[("ncu", "matched")] == 60
