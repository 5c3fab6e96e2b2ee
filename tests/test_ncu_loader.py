"""NcuReport on real reports: the three H200 samples (ncu 2025.3) and the public corpus
(ncu 2023.3, 2025.1); values checked cell by cell against ncu's own raw CSV."""

from __future__ import annotations

import csv
import importlib.util
import re
import sys
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit.errors import MissingDependencyError, TraceFormatError, TraceNotFoundError
from tracekit.ncu import (
    DamagedReportWarning,
    IncompleteReportWarning,
    NcuReport,
    is_ncu_report,
    schema,
)
from tracekit.ncu.container import walk
from tracekit.ncu.raw_csv import is_ncu_csv, read_details_rules

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces" / "ncu"
from .conftest import CORPUS as _CORPUS  # noqa: E402

CORPUS = _CORPUS / "ncu"
SAMPLE_NAMES = ("ncu_decode_drilldown", "ncu_probe_full", "ncu_precisions")
HAVE_WHEEL = importlib.util.find_spec("ncu_report") is not None
needs_wheel = pytest.mark.skipif(
    not HAVE_WHEEL, reason="ncu-report not installed (pip install 'tracekit[ncu]')"
)
CSV_NULLS = ("", "n/a", "no data", "nan")


def sample(name: str, suffix: str) -> Path:
    path = SAMPLES / name / f"{name}{suffix}"
    if not path.exists():
        pytest.skip(f"sample {path} not captured yet")
    return path


def all_reports() -> list[Path]:
    found = sorted(SAMPLES.glob("*/*.ncu-rep")) + sorted(CORPUS.glob("*.ncu-rep"))
    return found or [Path("missing.ncu-rep")]


def read_raw_csv(path: Path) -> tuple[list[str], list[str], list[list[str]]]:
    """ncu's raw page, parsed with the csv module only (the oracle for the loaders)."""
    with path.open(newline="") as fh:
        rows = [r for r in csv.reader(fh) if r and not r[0].startswith("==")]
    return rows[0], rows[1], rows[2:]


def csv_number(cell: str) -> float | None:
    if re.fullmatch(r"-?(\d{1,3}(,\d{3})+|\d+)(\.\d+)?", cell):
        return float(cell.replace(",", ""))
    return None


_cache: dict[tuple[str, str], NcuReport] = {}


def load(path: Path) -> NcuReport:
    key = (str(path), "report")
    if key not in _cache:
        _cache[key] = NcuReport.from_path(path)
    return _cache[key]


# -- format detection (no wheel needed) ------------------------------------------------------


def test_magic_and_csv_detection() -> None:
    assert is_ncu_report(b"NVR\x00\x02\x00\x00\x00\x08\x07")
    assert not is_ncu_report(b"SQLite format 3\x00")
    assert not is_ncu_report(b"")
    assert is_ncu_csv(b'"ID","Process ID","Process Name"')
    assert is_ncu_csv(b'==PROF== Connected to process 1\n"ID","Process ID"')
    assert not is_ncu_csv(b"NVR\x00")


@pytest.mark.parametrize("path", all_reports(), ids=lambda p: p.name)
def test_container_walk_counts_results(path: Path) -> None:
    if not path.exists():
        pytest.skip("no ncu reports found")
    found = walk(path)
    assert found.size == path.stat().st_size
    assert found.results >= 1


# -- every report loads ----------------------------------------------------------------------


@pytest.mark.ncu
@needs_wheel
@pytest.mark.parametrize("path", all_reports(), ids=lambda p: p.name)
def test_every_report_loads(path: Path) -> None:
    if not path.exists():
        pytest.skip("no ncu reports found")
    report = load(path)
    kernels, metrics = report.kernels, report.metrics
    assert report.source == "ncu_report"
    assert kernels.height == walk(path).results == report.expected_results
    assert dict(kernels.schema) == dict(schema.KERNELS)
    assert dict(metrics.schema) == dict(schema.METRICS)
    assert dict(report.rules.schema) == dict(schema.RULES)
    assert kernels["id"].to_list() == list(range(kernels.height))
    assert metrics["value"].is_nan().sum() == 0
    assert metrics.group_by("id").len().height == kernels.height
    assert kernels["short_name"].null_count() == 0
    assert kernels["family"].null_count() == 0
    devices = report.devices
    assert devices.height == 1 and devices["display_name"][0].startswith("NVIDIA")
    assert devices["compute_capability"][0] == "9.0"
    assert path.name in repr(report)


@pytest.mark.ncu
@needs_wheel
def test_corpus_metric_kind_drift_is_invisible() -> None:
    """``launch__grid_size`` is a DOUBLE in the ncu 2023.3 report and a UINT64 in the 2025.1
    one: the tables store both as Float64 / Int64 all the same."""
    import ncu_report

    old = CORPUS / "ncu2023.3_sglang_profile.ncu-rep"
    new = CORPUS / "ncu2025.1_cs599k_rms_norm_pytorch.ncu-rep"
    if not (old.exists() and new.exists()):
        pytest.skip("corpus not found")
    kinds = []
    for path in (old, new):
        act = ncu_report.load_report(str(path))[0][0]
        kinds.append(act.metric_by_name("launch__grid_size").kind())
    assert kinds[0] != kinds[1]  # the drift is real
    for path, device in ((old, "NVIDIA H800"), (new, "NVIDIA GH200 480GB")):
        report = load(path)
        row = report.metrics.filter((pl.col("id") == 0) & (pl.col("metric") == "launch__grid_size"))
        assert row["value"].to_list() == [1056.0]
        assert report.kernels["grid_x"][0] == 1056
        assert report.kernels["registers_per_thread"].dtype == pl.Int64
        assert report.devices["display_name"][0] == device
    old_report = load(old)
    assert old_report.kernels.height == 5
    assert old_report.kernels["short_name"][4] == "flash_fwd_kernel"
    assert old_report.kernels["family"][4] == "attention"
    # this kernel's counters failed at capture: its launch metrics are absent, not zero
    assert old_report.kernels["grid_x"][4] is None
    assert old_report.kernels["duration_ns"][4] is None


# -- values equal ncu's own CSV ------------------------------------------------------------


@pytest.mark.ncu
@needs_wheel
@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_metrics_equal_ncu_raw_csv_cell_by_cell(name: str) -> None:
    header, units, rows = read_raw_csv(sample(name, ".raw.csv"))
    metrics = load(sample(name, ".ncu-rep")).metrics
    lookup = {
        (r[0], r[1]): r[2:]
        for r in metrics.select("id", "metric", "value", "text", "unit").iter_rows()
    }
    first_metric = header.index("CC") + 1
    compared = 0
    for row in rows:
        kernel_id = int(row[0])
        for column, unit, cell in zip(
            header[first_metric:], units[first_metric:], row[first_metric:], strict=True
        ):
            value, text, our_unit = lookup[(kernel_id, column)]
            number = csv_number(cell)
            if number is not None:
                assert value is not None, (kernel_id, column, cell)
                # ncu prints doubles with two decimals and integers exactly
                tolerance = 0.0 if "." not in cell else 0.005 + 1e-12 * abs(number)
                assert abs(value - number) <= tolerance, (kernel_id, column, value, cell)
            elif cell in CSV_NULLS:
                assert value is None and text is None, (kernel_id, column, value, text)
            else:
                assert text == cell, (kernel_id, column, text, cell)
            if not column.startswith(("derived__", "sass__", "idc__")):  # see the units test
                assert our_unit == (unit or None), (column, our_unit, unit)
            compared += 1
    assert compared == len(rows) * (len(header) - first_metric)
    # the only metrics the CSV leaves out are breakdown:/group: lists
    extra = set(metrics["metric"].unique()) - set(header)
    assert all(m.startswith(("breakdown:", "group:")) for m in extra)


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_csv_loader_reads_every_cell(name: str) -> None:
    """Without the wheel: the CSV loader's values are ncu's cells, thousands separators gone."""
    path = sample(name, ".raw.csv")
    header, units, rows = read_raw_csv(path)
    report = NcuReport.from_path(path)
    assert report.source == "csv"
    metrics = report.metrics
    first_metric = header.index("CC") + 1
    assert metrics.height == len(rows) * (len(header) - first_metric)
    lookup = {
        (r[0], r[1]): r[2:]
        for r in metrics.select("id", "metric", "value", "text", "unit").iter_rows()
    }
    for row in rows:
        for column, unit, cell in zip(
            header[first_metric:], units[first_metric:], row[first_metric:], strict=True
        ):
            value, text, our_unit = lookup[(int(row[0]), column)]
            number = csv_number(cell)
            if number is not None:
                assert value == number
            elif cell in CSV_NULLS:
                assert value is None and text is None
            else:
                assert text == cell
            assert our_unit == (unit or None)
    kernels = report.kernels
    assert kernels.height == len(rows)
    assert dict(kernels.schema) == dict(schema.KERNELS)
    assert kernels["pid"].null_count() == 0 and kernels["tid"].null_count() == 0


@pytest.mark.ncu
@needs_wheel
@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_csv_and_binary_give_the_same_tables(name: str) -> None:
    binary = load(sample(name, ".ncu-rep"))
    text = NcuReport.from_path(sample(name, ".raw.csv"))
    same = [
        "id", "short_name", "device_id", "context_id", "stream_id", "grid_x", "grid_y", "grid_z",
        "block_x", "block_y", "block_z", "registers_per_thread", "static_shared_memory_bytes",
        "dynamic_shared_memory_bytes", "compute_capability", "nvtx_path", "nvtx_paths", "duration_ns",
        "family",
    ]  # fmt: skip
    assert binary.kernels.select(same).equals(text.kernels.select(same))
    joined = binary.metrics.join(text.metrics, on=["id", "metric"], suffix="_csv")
    assert joined.height == text.metrics.height
    # rollup and subtype inferred from names agree with ncu_report's, except that ncu_report
    # calls ".peak_sustained_elapsed.per_second" plain "peak_sustained_elapsed"
    rollups = joined.filter(pl.col("rollup_csv").is_not_null())
    assert (rollups["rollup"] == rollups["rollup_csv"]).all()
    subtypes = joined.filter(
        pl.col("subtype_csv").is_not_null() & ~pl.col("subtype_csv").str.ends_with("_per_second")
    )
    assert (subtypes["subtype"] == subtypes["subtype_csv"]).all()
    types = joined.filter(pl.col("metric_type_csv").is_not_null())
    assert (types["metric_type"] == types["metric_type_csv"]).all()
    assert types.height > 0.9 * joined.height
    # units agree except on derived metrics whose section files define them differently
    units = joined.filter(pl.col("unit").fill_null("") != pl.col("unit_csv").fill_null(""))
    assert all(m.startswith(("derived__", "sass__", "idc__")) for m in units["metric"].unique())
    if binary.devices.width > 3:
        assert binary.devices.select("device_id", "display_name", "multiprocessor_count").equals(
            text.devices.select("device_id", "display_name", "multiprocessor_count")
        )


@pytest.mark.ncu
@needs_wheel
@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_rules_equal_ncu_details_csv(name: str) -> None:
    """Rule results, link markup rendered as ncu renders it, equal the details page."""
    cols = ["id", "rule_id", "section", "message", "type", "speedup_type"]
    ours = load(sample(name, ".ncu-rep")).rules.sort("id", "rule_id", "message")
    theirs = read_details_rules(sample(name, ".details.csv")).sort("id", "rule_id", "message")
    assert ours.height == theirs.height > 0
    assert ours.select(cols).equals(theirs.select(cols))
    assert not ours["message"].str.contains("@url:|@section:").any()
    for a, b in zip(ours["estimated_speedup_pct"], theirs["estimated_speedup_pct"], strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert abs(a - b) <= max(0.006, 1e-3 * abs(a))  # the CSV prints 4 digits


def test_csv_report_takes_rules_from_details_csv() -> None:
    raw = sample("ncu_probe_full", ".raw.csv")
    details = sample("ncu_probe_full", ".details.csv")
    assert NcuReport.from_path(raw).rules.height == 0
    rules = NcuReport.from_path(raw, details_csv=details).rules
    assert rules.height == 29
    assert set(rules["type"].unique()) <= {"info", "optimization", "warning", "error"}
    assert rules.filter(pl.col("rule_id") == "SOLBottleneck").height == 3


# -- other tables ------------------------------------------------------------------------------


@pytest.mark.ncu
@needs_wheel
def test_instances_of_an_occupancy_curve() -> None:
    report = load(sample("ncu_probe_full", ".ncu-rep"))
    name = "launch__occupancy_per_block_size"
    expected = report.metrics.filter(pl.col("metric") == name)["num_instances"].to_list()
    inst = report.instances_of([name])
    assert dict(inst.schema) == dict(schema.INSTANCES)
    assert inst.group_by("id").len().sort("id")["len"].to_list() == expected
    # correlation ids are the block sizes of the curve: 1, 2, … up to 1024 threads
    first = inst.filter(pl.col("id") == 0).sort("instance")
    assert first["correlation_id"].null_count() == 0
    assert first["correlation_id"].is_sorted()


@pytest.mark.ncu
@needs_wheel
def test_kernels_of_the_precision_sample() -> None:
    kernels = load(sample("ncu_precisions", ".ncu-rep")).kernels
    assert kernels["nvtx_path"].to_list() == [
        f"prec/{p}" for p in ("bf16", "fp16", "tf32", "fp32_simt", "fp8", "fp64")
    ]
    assert kernels["nvtx_paths"][0].to_list() == [
        {"domain": "<default domain>", "path": "prec/bf16"}
    ]
    assert kernels["family"].to_list() == ["gemm"] * 6
    assert kernels["workload_type"].unique().to_list() == ["kernel"]
    first = kernels.row(0, named=True)
    assert (first["grid_x"], first["grid_y"], first["block_x"]) == (2, 66, 384)
    assert first["short_name"] == first["name"] == first["mangled_name"]  # extern "C" cuBLAS name
    assert first["duration_ns"] == 177152


def test_csv_nvtx_stack_and_thread() -> None:
    kernels = NcuReport.from_path(sample("ncu_decode_drilldown", ".raw.csv")).kernels
    assert kernels["nvtx_path"][1] == "step.1/layer.0/attn"
    assert kernels["nvtx_path"][0] == "step.1"
    assert (kernels["tid"] == kernels["pid"]).all()  # launched from the main thread
    assert kernels["process_name"][0] == "python3.12"


def test_wide_pivots_chosen_metrics() -> None:
    report = NcuReport.from_path(sample("ncu_precisions", ".raw.csv"))
    wide = report.wide(
        ["gpu__time_duration.sum", "device__attribute_display_name", "no__such_metric"]
    )
    assert wide.columns == [
        "id",
        "gpu__time_duration.sum",
        "device__attribute_display_name",
        "no__such_metric",
    ]
    assert wide.schema["device__attribute_display_name"] == pl.Utf8
    assert wide["no__such_metric"].null_count() == wide.height == 6
    assert (
        wide["gpu__time_duration.sum"].to_list()
        == report.kernels["duration_ns"].cast(pl.Float64).to_list()
    )
    assert report.wide("gpu__time_duration.sum").width == 2


# -- bad input ----------------------------------------------------------------------------


def one_line_error(exc: pytest.ExceptionInfo[BaseException]) -> str:
    message = str(exc.value)
    assert "\n" not in message and message
    return message


def test_random_bytes_are_refused(tmp_path: Path) -> None:
    import random

    path = tmp_path / "random.ncu-rep"
    path.write_bytes(random.Random(0).randbytes(5000))
    with pytest.raises(TraceFormatError) as exc:
        NcuReport.from_path(path)
    assert "neither an Nsight Compute report" in one_line_error(exc)


def test_truncated_report_is_refused(tmp_path: Path) -> None:
    source = sample("ncu_decode_drilldown", ".ncu-rep")
    path = tmp_path / "truncated.ncu-rep"
    path.write_bytes(source.read_bytes()[:100_000])
    with pytest.raises(TraceFormatError) as exc:
        NcuReport.from_path(path)
    assert "truncated" in one_line_error(exc)
    with pytest.raises(TraceFormatError):
        tracekit.open(path)


def test_corrupt_block_header_is_refused(tmp_path: Path) -> None:
    data = bytearray(sample("ncu_precisions", ".ncu-rep").read_bytes())
    data[10:14] = (0xFFFFFFF0).to_bytes(4, "little")  # first block header length
    path = tmp_path / "corrupt.ncu-rep"
    path.write_bytes(bytes(data))
    with pytest.raises(TraceFormatError) as exc:
        NcuReport.from_path(path)
    one_line_error(exc)


def test_empty_missing_and_directory(tmp_path: Path) -> None:
    empty = tmp_path / "empty.ncu-rep"
    empty.write_bytes(b"")
    with pytest.raises(TraceFormatError) as exc:
        NcuReport.from_path(empty)
    assert "empty" in one_line_error(exc)
    with pytest.raises(TraceNotFoundError):
        NcuReport.from_path(tmp_path / "nope.ncu-rep")
    with pytest.raises(TraceFormatError):
        NcuReport.from_path(tmp_path)


def test_details_csv_is_not_a_raw_csv() -> None:
    with pytest.raises(TraceFormatError) as exc:
        NcuReport.from_path(sample("ncu_probe_full", ".details.csv"))
    assert "--page raw" in one_line_error(exc)


def test_csv_without_results_warns(tmp_path: Path) -> None:
    header, units, _ = read_raw_csv(sample("ncu_precisions", ".raw.csv"))
    path = tmp_path / "empty.csv"
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh, quoting=csv.QUOTE_ALL)
        writer.writerow(header)
        writer.writerow(units)
    with pytest.warns(IncompleteReportWarning, match="0 profiled kernels"):
        report = NcuReport.from_path(path)
    assert report.kernels.height == 0
    assert dict(report.kernels.schema) == dict(schema.KERNELS)


@pytest.mark.ncu
@needs_wheel
def test_report_without_results_warns(tmp_path: Path) -> None:
    """Magic and file header only: ncu_report loads it as an empty context."""
    data = sample("ncu_precisions", ".ncu-rep").read_bytes()
    length = int.from_bytes(data[4:8], "little")
    path = tmp_path / "header_only.ncu-rep"
    path.write_bytes(data[: 8 + length])
    with pytest.warns(IncompleteReportWarning, match="0 profiled kernels"):
        report = NcuReport.from_path(path)
    assert report.kernels.height == 0
    assert report.metrics.height == 0


@pytest.mark.ncu
@needs_wheel
def test_validate_false_loads_what_ncu_report_reads(tmp_path: Path) -> None:
    source = sample("ncu_decode_drilldown", ".ncu-rep")
    path = tmp_path / "truncated.ncu-rep"
    path.write_bytes(source.read_bytes()[:1_000_000])
    with pytest.warns(DamagedReportWarning, match="ends inside block 18"):
        report = NcuReport.from_path(path, validate=False)  # read in a child process (auto)
    assert 0 < report.kernels.height < 60
    assert report.damaged and report.damaged[0].startswith("container: ends inside block 18")


def test_missing_wheel_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ncu_report", None)  # what an absent package looks like
    with pytest.raises(MissingDependencyError) as exc:
        NcuReport.from_path(sample("ncu_precisions", ".ncu-rep"))
    assert "tracekit[ncu]" in one_line_error(exc)
    # the CSV path needs no wheel
    assert NcuReport.from_path(sample("ncu_precisions", ".raw.csv")).kernels.height == 6


@needs_wheel
def test_invalid_utf8_in_a_damaged_report_is_replaced(tmp_path: Path) -> None:
    """Issue 18.6: one flipped bit (found by a flip campaign) makes ncu_report hand a metric's text
    over as lone surrogates; polars refused it (UnicodeEncodeError). Now: decoded with U+FFFD,
    one warning, the same number of metrics as the intact report."""
    src = SAMPLES / "ncu_planted_clean" / "ncu_planted_clean.ncu-rep"
    data = bytearray(src.read_bytes())
    data[181335] ^= 128
    damaged = tmp_path / "damaged.ncu-rep"
    damaged.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="not valid UTF-8"):
        metrics = tracekit.open(damaged).metrics
    intact = tracekit.open(src).metrics
    assert metrics.height == intact.height
    text = metrics.select(
        pl.concat_str([pl.col("metric"), pl.col("text").fill_null(""), pl.col("unit").fill_null("")])
    ).to_series()
    assert text.str.contains("\ufffd", literal=True).any()
