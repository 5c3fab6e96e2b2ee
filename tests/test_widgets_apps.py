"""The notebook apps, driven headlessly: set traits (or a chart's selection) and check Python state."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tests.conftest import SAMPLES

pytest.importorskip(
    "ipywidgets", reason="needs the notebook extra: pip install 'tracekit[notebook]'"
)
pytest.importorskip("altair", reason="needs the notebook extra")

import tracekit  # noqa: E402
from tracekit.widgets import CaptureForm, Compare, KernelDrilldown, TraceExplorer  # noqa: E402

pytestmark = [pytest.mark.notebook, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

DECODE = SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
TP2 = SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"
NCU = SAMPLES / "ncu" / "ncu_decode_drilldown" / "ncu_decode_drilldown.ncu-rep"


def _open(path: Path) -> Any:
    if not path.exists():
        pytest.skip(f"sample trace missing: {path}")
    return tracekit.open(path)


@pytest.fixture(scope="module")
def tp2() -> Any:
    return _open(TP2)


@pytest.fixture(scope="module")
def decode() -> Any:
    return _open(DECODE)


def _frontend_selects(view: Any, name: str, value: Any) -> None:
    """What the browser sends when a user clicks or drags in a JupyterChart."""
    pytest.importorskip("anywidget", reason="chart selections reach Python through alt.JupyterChart (anywidget)")
    view.jupyter_chart._vl_selections = {name: {"value": value, "store": []}}


# -- TraceExplorer ---------------------------------------------------------------------------------
def test_explorer_builds_every_tab(tp2: Any) -> None:
    ex = TraceExplorer(tp2)
    assert ex.errors == {}
    assert len(ex.tabs.children) == 8 and ex.tabs.get_title(3) == "Timeline" and ex.tabs.get_title(7) == "Findings"
    assert ex.top["name"][0].startswith("ncclDevKernel_AllReduce")
    assert not ex.nvtx_rows.is_empty() and ex.timeline_lanes.height > 0
    assert ex.nccl_calls.height > 0 and ex.nccl_calls["bus_bandwidth_gbps"].drop_nulls().len() > 0
    if importlib.util.find_spec("anywidget") is None:
        return
    assert ex.views["overview"].jupyter_chart is not None  # the visible tab's charts exist ...
    assert (
        ex.views["timeline"].jupyter_chart is None and ex.views["timeline"].chart is not None
    )  # ... hidden ones wait
    ex.tabs.selected_index = 3
    assert ex.views["timeline"].jupyter_chart is not None


def test_selecting_a_kernel_updates_the_other_views(tp2: Any) -> None:
    ex = TraceExplorer(tp2)
    name = "ncclDevKernel_SendRecv"
    ex.selected_kernel = name
    assert ex.kernel_picker.value == name
    assert ex.instances.height == 16 and set(ex.instances.columns) >= {
        "start_ns",
        "duration_ns",
        "nvtx_path",
    }
    assert ex.nvtx_rows["ops"].max() <= 16  # the NVTX tree shows only this kernel's ranges
    spec = ex.views["top"].chart.to_dict()
    assert spec["params"][0]["value"] == [{"name": name}]
    ex.kernel_picker.value = ex.top["name"][1]  # picking in the list
    assert ex.selected_kernel == ex.top["name"][1]
    ex.selected_kernel = None
    assert ex.instances.is_empty() and ex.kernel_picker.value == ""


def test_a_click_in_a_chart_selects_the_kernel(tp2: Any) -> None:
    ex = TraceExplorer(tp2)
    ex.tabs.selected_index = 1
    first = ex.top["name"][0]
    _frontend_selects(ex.views["top"], "kernel", {"vlPoint": {"or": [{"name": first}]}})
    assert ex.selected_kernel == first


def test_window_selection_filters_every_tab(tp2: Any) -> None:
    ex = TraceExplorer(tp2, window="whole")
    total = ex.top["instances"].sum()
    ex.window = (ex.origin_ns, ex.origin_ns + 50_000_000)
    assert ex.window_slider.value == (0.0, 50.0)
    assert ex.top["instances"].sum() < total
    assert ex.timeline_lanes["end_ns"].max() <= ex.origin_ns + 50_000_000
    # dragging on the timeline zooms (ms from the origin)
    ex.tabs.selected_index = 3
    _frontend_selects(ex.views["timeline"], "window", {"start_ms": [10.0, 20.0]})
    assert ex.window == (ex.origin_ns + 10_000_000, ex.origin_ns + 20_000_000)
    ex.window_slider.value = (1.0, 2.0)  # the slider too
    assert ex.window == (ex.origin_ns + 1_000_000, ex.origin_ns + 2_000_000)
    ex.reset_button.click()
    assert ex.window is None and ex.top["instances"].sum() == total
    with pytest.raises(Exception, match="must be after"):
        ex.window = (5, 1)


def test_filter_and_sort_top_kernels(decode: Any) -> None:
    ex = TraceExplorer(decode, top_n=10)
    ex.filter_text.value = "nvjet"
    assert ex.top.height > 0 and all("nvjet" in n for n in ex.top["name"])
    ex.sort_by.value = "instances"
    assert ex.top["instances"].to_list() == sorted(ex.top["instances"].to_list(), reverse=True)
    ex.filter_text.value = "[no such kernel"  # an invalid regex falls back to a literal match
    assert ex.top.is_empty()
    ex.top_n.value = 5
    ex.filter_text.value = ""
    assert ex.top.height == 5


def test_explorer_without_gpu_metrics_or_nccl(decode: Any) -> None:
    train = _open(SAMPLES / "llm_train_emit_nvtx_1gpu" / "llm_train_emit_nvtx_1gpu.sqlite")
    ex = TraceExplorer(train)
    assert ex.errors == {}
    assert "no GPU metrics" in (ex.views["metrics"].error or "")
    assert "no NCCL" in (ex.views["nccl"].error or "")
    assert ex.nvtx_rows["depth"].max() >= 3


def test_explorer_memory_tab_per_layer() -> None:
    """The Memory tab's per-range views: the training capture's one 16 MiB allocation inside a
    range lands in step 0's backward; the pattern and the window are traits."""
    train = _open(SAMPLES / "llm_train_emit_nvtx_1gpu" / "llm_train_emit_nvtx_1gpu.sqlite")
    ex = TraceExplorer(train)
    assert ex.errors == {}
    rows = ex.layer_rows
    assert sorted(set(rows["name"])) == ["backward", "layer.0", "layer.1", "layer.2", "layer.3", "optimizer"]
    assert rows.height == 12 and rows["net_growth_bytes"].sum() == 16 * 2**20
    back = ex.layer_summary.filter(pl.col("name") == "backward").row(0, named=True)
    assert (back["phase"], back["instances"], back["mean_net_growth_bytes"]) == ("backward", 2, 8 * 2**20)
    assert ex.views["layer_memory"].chart is not None and ex.views["layer_growth"].chart is not None
    assert "16.0 MiB" in ex.layer_html.value or "8.0 MiB" in ex.layer_html.value
    steps = train.nvtx.filter(pl.col("name") == "step.1").row(0, named=True)
    ex.window = (steps["start_ns"], steps["end_ns"])  # step 1 allocates nothing
    assert ex.layer_rows.height == 6 and ex.layer_rows["net_growth_bytes"].sum() == 0
    ex.window = None
    ex.layer_ranges.value = r"^attn$"
    assert set(ex.layer_rows["name"]) == {"attn"} and ex.layer_rows.height == 8
    ex.layer_ranges.value = "^no such range$"
    assert ex.layer_rows.is_empty() and "no NVTX range label matches" in (ex.views["layer_memory"].error or "")
    assert ex.errors == {}
    if importlib.util.find_spec("anywidget") is None:
        return
    ex.layer_ranges.value = r"^layer\.\d+$"
    assert ex.views["layer_memory"].jupyter_chart is None  # hidden tab: created when shown
    ex.tabs.selected_index = 6
    assert ex.views["layer_memory"].jupyter_chart is not None and ex.views["layer_growth"].jupyter_chart is not None


# -- KernelDrilldown -------------------------------------------------------------------------------
def test_drilldown_follows_the_picker_and_the_roofline(decode: Any) -> None:
    pytest.importorskip("ncu_report", reason="needs the ncu extra")
    report = _open(NCU)
    d = KernelDrilldown(report, decode)
    assert d.errors == {}
    first = d.current
    assert first is not None and first["duration_ns"] == d.table["duration_ns"].max()
    assert d.instances.height > 0  # the nsys instances of the same kernel
    assert "Speed of light" in str(d.sol_view.chart.to_dict().get("title"))
    d.kernel_id = 5
    assert d.picker.value == 5 and d.current["id"] == 5 and "sdpa" in d.current["kernel"]
    assert not d.rules.is_empty() and {"rule_name", "message"} <= set(d.rules.columns)
    label = d.points.filter(pl.col("id") == 8)["kernel"][0]
    _frontend_selects(d.roofline_view, "kernel", {"vlPoint": {"or": [{"kernel": label}]}})
    assert d.kernel_id == 8
    spec = d.roofline_view.chart.to_dict()
    assert spec["params"][0]["value"] == [{"kernel": label}]
    d.picker.value = d.picker.options[2][1]
    assert d.kernel_id == d.picker.options[2][1]


# -- Compare ---------------------------------------------------------------------------------------
def test_compare_two_traces(decode: Any, tp2: Any) -> None:
    c = Compare(decode, tp2, labels=("1 GPU", "TP2"), window="whole")
    k = c.kernels
    nccl = k.filter(pl.col("name") == "ncclDevKernel_SendRecv").row(0, named=True)
    assert nccl["instances_a"] == 0 and nccl["instances_b"] == 16 and nccl["ratio"] is None
    assert (k["delta_ns"] == k["total_b_ns"] - k["total_a_ns"]).all()
    steps = c.ranges.filter(pl.col("range") == "step.0").row(0, named=True)
    assert steps["count_a"] == 1 and steps["count_b"] == 2
    c.n = 5
    assert c.kernels_shown.height == 5 and c.n_slider.value == 5
    c.sort = "a"
    assert c.kernels_shown["total_a_ns"].to_list() == sorted(
        c.kernels_shown["total_a_ns"].to_list(), reverse=True
    )
    c.sort_picker.value = "b"
    assert c.sort == "b"
    assert "1 GPU" in c.kernel_html.value and c.kernel_view.chart is not None
    # the Verdict tab shows tracekit.diff's per-step tables; each kernel row carries its verdict
    assert set(c.diff.levels) == {"kernel", "family", "range", "step"}
    assert "verdict" in c.verdict_html.value and "step (per step" in c.verdict_html.value
    assert nccl["verdict"] == "slower"  # absent in the 1-GPU run: new in TP2
    kv = c.diff.levels["kernel"].select(pl.col("key").alias("name"), pl.col("verdict").alias("v"))
    joined = c.kernels.join(kv, on="name", how="left")
    assert (joined["verdict"] == joined["v"]).all()  # equal where the kernel ran in a steady step
    assert joined.filter(pl.col("v").is_null())["verdict"].is_null().all()  # no verdict outside them
    # the answer first: the verdict line leads the summary, the Verdict tab comes first
    import html as _html

    assert c.summary.value.index(_html.escape(c.diff.verdict_line())) < c.summary.value.index("kernel time:")
    assert c.diff.verdict_line().split(":")[0] in ("slower", "faster", "no change")
    assert c.children[2].get_title(0) == "Verdict"


# -- CaptureForm -----------------------------------------------------------------------------------
def _program(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_capture_form_runs_a_real_command_in_the_background(tmp_path: Path) -> None:
    code = "import time\nfor i in range(3):\n    print('line', i, flush=True)\n    time.sleep(0.2)"
    form = CaptureForm(_program(code), mode="none", out=str(tmp_path))
    done: list[str] = []
    form.on_done(lambda f: done.append(f.status))
    started = time.monotonic()
    form.run()
    assert time.monotonic() - started < 2.0 and form.status == "running"  # did not block
    assert form.run_button.disabled and not form.cancel_button.disabled
    assert form.wait(60)
    assert form.status == "complete" and done == ["complete"]
    assert [line.split("] ", 1)[1] for line in form.log_lines] == ["line 0", "line 1", "line 2"]
    assert "line 2" in form.log_box.value and form.progress == 100
    assert form.result.folder.is_dir() and (form.result.folder / "experiment.json").is_file()
    assert form.result.target_exit_code == 0 and form.trace is None  # mode none: no report to load
    assert not form.run_button.disabled


def test_capture_form_cancel_stops_the_process(tmp_path: Path) -> None:
    form = CaptureForm(
        _program("import time; print('started', flush=True); time.sleep(120)"),
        mode="none",
        out=str(tmp_path),
    )
    form.run()
    deadline = time.monotonic() + 30
    while not any("started" in line for line in form.log_lines) and time.monotonic() < deadline:
        time.sleep(0.05)
    form.cancel_button.click()
    assert form.wait(60)
    assert form.status == "interrupted"
    assert time.monotonic() < deadline + 60


def test_capture_form_reports_bad_input(tmp_path: Path) -> None:
    form = CaptureForm("", mode="none", out=str(tmp_path))
    form.run()
    assert form.status == "error" and "no command" in (form.error or "")
    form.command = "echo hi"
    form.options = "nsys: ["
    form.run()
    assert form.status == "error" and "YAML" in (form.error or "")
    form.options = "timeout_s: 30"
    form.preset = "quick"
    form.mode_box.value = "none"
    assert form.experiment().mode == "none" and form.experiment().timeout_s == 30


def test_explorer_findings_tab_selects_the_evidence() -> None:
    """The Findings tab lists tracekit.diagnose's findings; picking one shows its card (the one
    a notebook displays), sets the window to its evidence's time span (the idle gaps of
    host_bound); the button switches to the timeline."""
    trace = tracekit.open(SAMPLES / "planted" / "planted_host_bound" / "planted_host_bound.sqlite")
    ex = TraceExplorer(trace)
    assert ex.findings_select.options == ()  # built when the tab is first shown
    ex.tabs.selected_index = ex.FINDINGS_TAB
    labels = [label for label, _ in ex.findings_select.options]
    assert labels[0].startswith("0. [high] host_bound")  # numbered as the cards (and d.evidence(0)) are
    ex.findings_select.value = 0
    ev = ex.diagnosis.evidence(0)
    assert ex.window == (int(ev["start_ns"].min()), int(ev["end_ns"].max()))
    card = ex.findings_html.value
    f = ex.diagnosis.items[0]
    assert "prepare_batch" in card and "tk-finding" in card and "What to try:" in card
    assert __import__("html").escape(f.title) in card and all(__import__("html").escape(c) in card for c in f.next)
    assert ex.tabs.selected_index == ex.FINDINGS_TAB and not ex.timeline_button.disabled
    ex.timeline_button.click()
    assert ex.tabs.selected_index == 3
    assert ex.errors == {}


def test_explorer_of_four_gpus_draws_the_gpu_metrics() -> None:
    """On llm_tp2pp2_nccl (4 GPUs) the GPU metrics tab showed 'could not draw this view:
    MaxRowsError' (5,676 rows of metric bins; altair takes 5,000)."""
    ex = TraceExplorer(tracekit.open(SAMPLES / "llm_tp2pp2_nccl" / "llm_tp2pp2_nccl.sqlite"))
    assert ex.errors == {}
    spec = ex.views["metrics"].chart.to_dict()
    assert sorted({r["device_id"] for r in next(iter(spec["datasets"].values()))}) == [0, 1, 2, 3]
