"""The apps on traces they were not written for (issue 46), driven through their traits: the
explorer opens on the steady window and says so, keeps every tab up on a capture without
kernels, opens another trace from its picker; the picker remembers the last trace; the capture
form shows a preset's settings as fields and the command line as it will run; Compare works
per steady step."""

from __future__ import annotations

import html
import shlex
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tests.conftest import SAMPLES, run_capture

pytest.importorskip("ipywidgets", reason="needs the notebook extra: pip install 'tracekit[notebook]'")
pytest.importorskip("altair", reason="needs the notebook extra")

import tracekit  # noqa: E402
from tracekit.widgets import CaptureForm, Compare, TraceExplorer, TracePicker  # noqa: E402
from tracekit.widgets.picker import last_trace  # noqa: E402

pytestmark = [pytest.mark.notebook, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.fixture(scope="module")
def ddp() -> Any:
    return tracekit.open(run_capture("train_ddp_2gpu") / "train_ddp_2gpu.sqlite")


def test_explorer_opens_on_the_steady_window_and_names_it(ddp: Any) -> None:
    s = tracekit.structure(ddp)
    ex = TraceExplorer(ddp)
    assert ex.errors == {}
    assert ex.window == (s.start_ns, s.end_ns) and ex.current_window().kind == "steady"
    label = ex.current_window().label()
    assert label.startswith("steady window: 10 steps of 42.6 ms on 2 ranks")
    assert html.escape(label) in ex.window_bar.value and html.escape(label) in ex.summary.value
    assert f"Top {ex.top.height} kernels by GPU time</b> — {html.escape(label)}" in ex.top_table.value
    # the table: units in the headers, numbers formatted, the full name on hover
    assert "<th class=\"\">total_ms</th>" in ex.top_table.value and "share_pct" in ex.top_table.value
    first = ex.top.row(0, named=True)
    assert f'title="{html.escape(first["name"])}"' in ex.top_table.value
    assert ex.top["label"].n_unique() == ex.top.height  # distinct labels, full names as keys
    steady_kernels = ex.top["instances"].sum()
    ex.reset_button.click()
    assert ex.window is None and ex.current_window().kind == "whole" and "whole trace" in ex.window_bar.value
    assert ex.top["instances"].sum() > steady_kernels
    ex.steady_button.click()
    assert ex.window == (s.start_ns, s.end_ns)
    # sorting: the table, the chart and its title follow
    ex.sort_by.value = "mean duration"
    assert ex.top["mean_ns"].to_list() == sorted(ex.top["mean_ns"].to_list(), reverse=True)
    assert ex.views["top"].chart.to_dict()["title"]["text"] == "Top kernels by mean duration"
    # the timeline: GPU streams, CPU lanes, iteration starts
    ex.tabs.selected_index = 3
    lanes = {r["lane"] for rows in ex.views["timeline"].chart.to_dict()["datasets"].values() for r in rows if "lane" in r}
    assert any(lane.startswith("CPU ") for lane in lanes) and any(lane.startswith("GPU ") for lane in lanes)
    # iterations: log axis, warm-up marked
    it = ex.views["iterations"].chart.to_dict()
    assert "log" in str(it) and "warm-up" in str(it)


def test_explorer_on_a_capture_without_kernels_says_what_is_missing() -> None:
    t = tracekit.open(run_capture("serve_child_nofollow") / "serve_child_nofollow.sqlite")
    ex = TraceExplorer(t)
    for i in range(len(ex.TAB_TITLES)):
        ex.tabs.selected_index = i
    assert ex.errors == {}
    assert ex.current_window().kind == "whole" and "no steady iterations" in ex.window_bar.value
    assert ex.steady_button.disabled
    assert "--trace-fork-before-exec" in (ex.views["top"].error or "")
    assert "--cuda-memory-usage" in (ex.views["memory"].error or "")
    assert ex.views["metrics"].chart is not None  # the GPU metrics are all this capture has
    assert "no GPU kernels" in ex.summary.value and "83,974" in ex.summary.value
    ex.selected_kernel = None


def test_picker_lists_traces_remembers_the_last_and_the_explorer_opens_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    folder = SAMPLES / "planted"
    picker = TracePicker(folder)
    assert picker.value == "" and last_trace() is None
    names = [v for _, v in picker.listing.options]
    assert names[0] == ".." and "planted_clean/" in names
    picker.listing.value = "planted_clean/"  # a folder opens
    assert Path(picker.folder) == folder / "planted_clean"
    assert [p.name for p in picker.traces()] == ["planted_clean.nsys-rep", "planted_clean.sqlite"]
    picker.listing.value = "planted_clean.sqlite"  # a file is picked and remembered
    assert picker.value == str(folder / "planted_clean" / "planted_clean.sqlite")
    assert last_trace() == (folder / "planted_clean" / "planted_clean.sqlite").resolve()
    again = TracePicker()  # a new notebook starts from it
    assert Path(again.value) == last_trace() and "2 traces here" in again.status.value
    # the explorer's own picker opens another trace in place
    ex = TraceExplorer(str(SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"))
    assert ex.picker is not None and ex.trace.path.name == "llm_decode_1gpu.sqlite"
    ex.picker.pick(SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite")
    assert ex.trace.path.name == "llm_tp2_nccl.sqlite" and ex.errors == {}
    assert ex.top["name"][0].startswith("ncclDevKernel_AllReduce") and ex.current_window().kind == "steady"
    ex.load(str(tmp_path / "no such.sqlite"))
    assert "cannot open" in ex.message.value and ex.trace.path.name == "llm_tp2_nccl.sqlite"


def test_capture_form_shows_a_presets_settings_as_fields(tmp_path: Path) -> None:
    form = CaptureForm([sys.executable, "-c", "print('hello from the profiled program')"], mode="nsys",
                       preset="llm-serving", out=str(tmp_path))
    # readable quoting that a shell splits back exactly
    assert form.command == f"{sys.executable} -c \"print('hello from the profiled program')\""
    assert shlex.split(form.command)[-1] == "print('hello from the profiled program')"
    assert form.fields[("nsys", "capture_range")].value == "nvtx"
    assert form.fields[("nsys", "cuda_graph_trace")].value == "node" and form.fields[("nsys", "trace_fork_before_exec")].value
    assert "name it in 'NVTX range that opens it'" in form.command_line()
    form.fields[("nsys", "nvtx_capture")].value = "decode@vllm"
    line = form.command_line().splitlines()[0]
    assert "--capture-range=nvtx --nvtx-capture=decode@vllm" in line and "--cuda-graph-trace=node" in line
    assert line.endswith(form.command) and "--nvtx-capture" in form.command_preview.value
    # a field emptied overrides the preset; the experiment is what the line says
    form.fields[("nsys", "cuda_graph_trace")].value = ""
    assert "--cuda-graph-trace" not in form.command_line() and form.experiment().nsys.cuda_graph_trace is None
    form.preset = "quick"
    assert form.fields[("nsys", "trace")].value == "cuda,nvtx" and form.fields[("nsys", "capture_range")].value == "none"
    assert "the capture starts at an NVTX range" not in form.command_line()
    # labels are never cut: the preset dropdown holds names, the description its own line
    assert [v for _, v in form.preset_box.options][1:] == ["quick", "llm-serving", "torchrun", "kernel-drilldown"]
    assert "low-overhead first look" in form.preset_help.value
    assert all(box.style.description_width == "initial" for box in form.fields.values())
    assert form.describe() == "idle"


def test_compare_per_steady_step(ddp: Any) -> None:
    other = tracekit.open(run_capture("train_ddp_exposed_2gpu") / "train_ddp_exposed_2gpu.sqlite")
    c = Compare(ddp, other, labels=("ddp", "exposed"))
    assert [w.kind for w in c.windows] == ["steady", "steady"] and c.steps == (10, 10)
    row = c.kernels.row(0, named=True)
    assert row["per_step_a_ms"] == pytest.approx(row["total_a_ns"] / 10 / 1e6)
    in_window = c.windows[0].filter(ddp.kernels)
    assert c.kernels["instances_a"].sum() == in_window.height
    assert "ddp per step (ms)" in c.kernel_html.value and "kernels per step" in c.verdict_html.value
    assert "steady window: 10 steps" in c.summary.value
    # the step table's kernel count is a count, not a time
    step = c.diff.levels["step"].filter(pl.col("key") == "kernels").row(0, named=True)
    assert f"{step['mean_a']:,.3f}" in c.verdict_html.value


def test_explorer_on_a_torch_profiler_trace() -> None:
    """A torch.profiler trace in the explorer: the steady window is its ProfilerSteps, every tab
    draws without error, the timeline has its GPU streams and CPU lanes (issue 45: notebooks and
    widgets on Kineto traces)."""
    from .conftest import kineto_zoo_capture

    trace = tracekit.open(kineto_zoo_capture("t04_accelerate_accum"))
    s = tracekit.structure(trace)
    ex = TraceExplorer(trace)
    assert ex.errors == {}
    assert ex.window == (s.start_ns, s.end_ns) and ex.current_window().label().startswith("steady window: 5 steps of 63.6 ms")
    for i in range(len(ex.tabs.children)):
        ex.tabs.selected_index = i
    assert ex.errors == {}
    lanes = {r["lane"] for rows in ex.views["timeline"].chart.to_dict()["datasets"].values() for r in rows if "lane" in r}
    assert any(lane.startswith("CPU ") for lane in lanes) and any(lane.startswith("GPU ") for lane in lanes)
