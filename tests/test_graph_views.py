"""CUDA graph replays in every timeline view: ``tracekit export perfetto`` (protobuf and Chrome
JSON), the HTML report and TraceExplorer, on the bundled H100 captures of one decode loop
replayed from a CUDA graph (nsys 2025.3.1): ``graph_decode_graphtrace`` (nsys's default
``--cuda-graph-trace=graph``: one ``CUPTI_ACTIVITY_KIND_GRAPH_TRACE`` row per replay, no
kernels), ``graph_decode_nodetrace`` (per-node tracing) and ``tp2_graph_decode_graphtrace``
(2 GPUs, NCCL inside the graph, no NVTX). Expected values come from SQL over the exports."""

from __future__ import annotations

import json
import re
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import tracekit
from tests.conftest import llm_capture, union_ns
from tracekit.cli.main import main
from tracekit.export import chrome_json, perfetto

GRAPH = "graph_decode_graphtrace"
NODE = "graph_decode_nodetrace"
TP2 = "tp2_graph_decode_graphtrace"


def _sql(name: str, query: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(llm_capture(name)) as con:
        return con.execute(query).fetchall()


def _graph_rows(name: str) -> list[tuple[int, int, int, int, int, int]]:
    """(start, end, graphId, graphExecId, correlationId, deviceId) of every whole-graph row."""
    return sorted(_sql(name, "SELECT start, end, graphId, graphExecId, correlationId, deviceId "
                             "FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE"))


@pytest.fixture(scope="module")
def graph_trace() -> Any:
    return tracekit.open(llm_capture(GRAPH))


@pytest.fixture(scope="module")
def node_trace() -> Any:
    return tracekit.open(llm_capture(NODE))


# -- Perfetto protobuf -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("perfetto")
    from tests.test_export_perfetto import read_back

    out = {}
    folder = tmp_path_factory.mktemp("graph_export")
    for name in (GRAPH, NODE, TP2):
        path = folder / f"{name}.pftrace"
        summary = perfetto(tracekit.open(llm_capture(name)), path)
        out[name] = (path, summary, read_back(path))
    return out


def test_each_graph_replay_is_a_slice_on_its_stream(exported: dict[str, Any]) -> None:
    _, summary, rb = exported[GRAPH]
    rows = _graph_rows(GRAPH)
    assert len(rows) == 32
    slices = sorted(rb.by_cat("graph"), key=lambda s: s.start)
    assert summary.slices["graph"] == len(slices) == 32
    assert [(s.start, s.end) for s in slices] == [(r[0], r[1]) for r in rows]
    for s, (_, _, graph_id, exec_id, corr, dev) in zip(slices, rows, strict=True):
        assert s.name == f"[CUDA graph {graph_id}]"
        assert (s.args["graph_id"], s.args["graph_exec_id"], s.args["correlation_id"], s.args["device_id"]) == (
            graph_id, exec_id, corr, dev)
        assert re.fullmatch(rf"GPU {dev} · stream \d+", rb.track_name(s.track))
    assert {rb.track_name(s.track) for s in slices} == {"GPU 0 · stream 7"}
    from tests.test_export_perfetto import _nested

    assert _nested(rb.slices)


def test_each_graph_replay_has_a_flow_from_its_launch(exported: dict[str, Any]) -> None:
    _, _, rb = exported[GRAPH]
    src = {f: s for s in rb.slices for f in s.flows}
    for s in rb.by_cat("graph"):
        assert len(s.terminating) == 1
        launch = src[s.terminating[0]]
        assert launch.cat == "cuda_api" and launch.name.startswith("cudaGraphLaunch")
        assert launch.args["correlation_id"] == s.args["correlation_id"]
        assert launch.start <= s.start


def test_two_gpus_each_replay_on_its_process_and_device(exported: dict[str, Any]) -> None:
    _, summary, rb = exported[TP2]
    rows = _graph_rows(TP2)
    slices = rb.by_cat("graph")
    assert summary.slices["graph"] == len(slices) == len(rows) == 64
    assert sorted((s.start, s.end) for s in slices) == sorted((r[0], r[1]) for r in rows)
    per_device = Counter(s.args["device_id"] for s in slices)
    assert per_device == Counter(r[5] for r in rows) == {0: 32, 1: 32}
    for s in slices:  # the stream track of the GPU it ran on, under the process that launched it
        assert rb.track_name(s.track).startswith(f"GPU {s.args['device_id']} · stream")
    assert all(len(s.terminating) == 1 for s in slices)


def test_ranks_keep_their_replays(tmp_path: Path) -> None:
    trace = tracekit.open(llm_capture(TP2))
    pid = trace.nccl.filter(pl.col("rank") == 1)["pid"][0]
    s = perfetto(trace, tmp_path / "r1.pftrace", ranks=[1])
    assert s.slices["graph"] == trace.graph_trace.filter(pl.col("pid") == pid).height == 32


def test_node_mode_replays_have_a_track_of_their_own(exported: dict[str, Any]) -> None:
    _, summary, rb = exported[NODE]
    assert _sql(NODE, "SELECT name FROM sqlite_master WHERE name = 'CUPTI_ACTIVITY_KIND_GRAPH_TRACE'") == []
    # each replay: the span of the kernels and memsets sharing its launch's correlation id
    spans = {corr: (lo, hi, n) for corr, lo, hi, n in _sql(NODE, """
        SELECT correlationId, min(start), max(end), sum(kernel) FROM (
          SELECT correlationId, start, end, 1 AS kernel FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE graphNodeId IS NOT NULL
          UNION ALL SELECT correlationId, start, end, 0 FROM CUPTI_ACTIVITY_KIND_MEMSET WHERE graphNodeId IS NOT NULL
          UNION ALL SELECT correlationId, start, end, 0 FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE graphNodeId IS NOT NULL)
        GROUP BY correlationId""")}
    assert len(spans) == 32
    replays = rb.by_cat("graph")
    assert summary.slices["graph"] == len(replays) == 32
    assert {rb.track_name(s.track) for s in replays} == {"GPU 0 · CUDA graph replays"}
    for s in replays:
        lo, hi, kernels = spans[s.args["correlation_id"]]
        assert (s.start, s.end) == (lo, hi)
        assert s.args["kernel_count"] == kernels == 875
        assert s.name == f"[CUDA graph exec {s.args['graph_exec_id']}]"
        assert not s.flows and not s.terminating  # the launch's flow goes to the replay's first node
    # the replay track comes before the stream tracks of its process (lower uuid, name sorts first)
    tracks = {rb.track_name(u): u for u in rb.tracks}
    assert tracks["GPU 0 · CUDA graph replays"] < tracks["GPU 0 · stream 7"]
    # the node kernels stay on their stream, and their launch flows are unchanged
    assert summary.slices["kernel"] == _sql(NODE, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0][0]
    first_nodes = [s for s in rb.by_cat("kernel") if s.terminating and s.args["correlation_id"] in spans]
    assert len(first_nodes) == 32


def test_graph_mode_has_no_replay_track(exported: dict[str, Any]) -> None:
    for name in (GRAPH, TP2):
        _, _, rb = exported[name]
        assert not any("CUDA graph replays" in rb.track_name(u) for u in rb.tracks)


@pytest.mark.parametrize(("name", "rows"), [(GRAPH, 40), (NODE, 2000)])
def test_time_slices_write_the_same_graph_events(tmp_path: Path, name: str, rows: int) -> None:
    """Streamed in small time slices (the replays spread over a dozen or more, replays open
    across their boundaries), the graph slices (and everything else) decode the same."""
    pytest.importorskip("perfetto")
    from tests.test_export_perfetto import _decoded, _json_events
    from tracekit.export.events import stream_model

    trace = tracekit.open(llm_capture(name))
    with_graphs = [frame for kind, frame in stream_model(trace, slice_rows=rows).events
                   if kind == "slices" and (frame["cat"] == "graph").any()]
    assert len(with_graphs) >= 8
    one, small = tmp_path / "one.pftrace", tmp_path / "small.pftrace"
    perfetto(trace, one, slice_rows=10**9)
    perfetto(trace, small, slice_rows=rows, chunk_rows=7)
    assert _decoded(small) == _decoded(one)
    j1, j2 = tmp_path / "one.json", tmp_path / "small.json"
    chrome_json(trace, j1, slice_rows=10**9)
    chrome_json(trace, j2, slice_rows=rows, chunk_rows=11)
    assert _json_events(j1) == _json_events(j2)


def test_export_reads_no_large_table_whole(tmp_path: Path) -> None:
    """The graph rows are read whole; kernels, copies and API calls still a column at a time."""
    for name in (GRAPH, NODE):
        trace = tracekit.open(llm_capture(name))
        chrome_json(trace, tmp_path / f"{name}.json")
        assert not any(trace.is_loaded(t) for t in ("kernels", "memcpys", "memsets", "cuda_api"))


# -- windows ------------------------------------------------------------------------------------------------
def test_steady_window_keeps_the_decode_replays(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("perfetto")
    from tests.test_export_perfetto import read_back

    out = tmp_path / "steady.pftrace"
    assert main(["export", "perfetto", str(llm_capture(GRAPH)), "-o", str(out), "--window", "steady"]) == 0
    printed = capsys.readouterr().out
    m = re.search(r"window (\d+):(\d+) ns \(steady state \(nvtx\)", printed)
    assert m, printed
    lo, hi = int(m.group(1)), int(m.group(2))
    inside = [r for r in _graph_rows(GRAPH) if r[0] < hi and r[1] > lo]
    assert len(inside) >= 31  # every decode step but the warm-up one
    replays = read_back(out).by_cat("graph")
    assert sorted((s.start, s.end) for s in replays) == [(r[0], r[1]) for r in inside]
    assert all(len(s.terminating) == 1 for s in replays)  # their launches are inside too


def test_steady_window_of_a_capture_without_nvtx(tmp_path: Path) -> None:
    """Without NVTX the steady window is one step per replay of the main graph: all 64 kept."""
    trace = tracekit.open(llm_capture(TP2))
    s = chrome_json(trace, tmp_path / "s.json", window="steady")
    assert s.window_source.startswith("steady state (graph_replays)")
    lo, hi = s.window
    assert s.slices["graph"] == sum(1 for r in _graph_rows(TP2) if r[0] < hi and r[1] > lo) == 64


# -- Chrome JSON ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [GRAPH, TP2])
def test_chrome_json_graph_replays_with_flows(tmp_path: Path, name: str) -> None:
    path = tmp_path / "g.json"
    summary = chrome_json(tracekit.open(llm_capture(name)), path)
    ev = json.loads(path.read_text())["traceEvents"]
    rows = _graph_rows(name)
    graphs = sorted((e for e in ev if e["ph"] == "X" and e["cat"] == "graph"), key=lambda e: e["ts"])
    assert summary.slices["graph"] == len(graphs) == len(rows)
    by_start = {r[0]: r for r in rows}
    for e in graphs:
        start = round(e["ts"] * 1000)
        _, end, graph_id, exec_id, corr, dev = by_start[start]
        assert round(e["dur"] * 1000) == end - start
        assert e["name"] == f"[CUDA graph {graph_id}]"
        assert e["args"] == {"graph_id": graph_id, "graph_exec_id": exec_id, "device_id": dev, "stream_id": 7,
                             "correlation_id": corr}
    # each replay ends a flow that starts on its cudaGraphLaunch call
    at = {(e["pid"], e["tid"], e["ts"]): e for e in ev if e["ph"] == "X"}
    starts = {e["id"]: at[(e["pid"], e["tid"], e["ts"])] for e in ev if e["ph"] == "s"}
    ends = {e["id"]: at[(e["pid"], e["tid"], e["ts"])] for e in ev if e["ph"] == "f"}
    into_graphs = {i: e for i, e in ends.items() if e["cat"] == "graph"}
    assert len(into_graphs) == len(rows)
    for i, e in into_graphs.items():
        launch = starts[i]
        assert launch["name"].startswith("cudaGraphLaunch")
        assert launch["args"]["correlation_id"] == e["args"]["correlation_id"]


def test_chrome_json_node_replays(tmp_path: Path) -> None:
    path = tmp_path / "n.json"
    chrome_json(tracekit.open(llm_capture(NODE)), path)
    ev = json.loads(path.read_text())["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    replays = [e for e in ev if e["ph"] == "X" and e["cat"] == "graph"]
    assert len(replays) == 32
    assert {names[(e["pid"], e["tid"])] for e in replays} == {"GPU 0 · CUDA graph replays"}
    assert all(e["args"]["kernel_count"] == 875 and e["args"]["gpu_time_ns"] <= round(e["dur"] * 1000) for e in replays)


# -- HTML report ----------------------------------------------------------------------------------------------
def _text(document: str, anchor: str) -> str:
    start = document.index(f'<section id="{anchor}">')
    body = document[start:document.index("</section>", start)]
    return re.sub(r"\s+", " ", re.sub(r"<style>.*?</style>|<[^>]+>", " ", body)).replace("&#x27;", "'")


@pytest.fixture(scope="module")
def graph_report(graph_trace: Any) -> str:
    pytest.importorskip("altair")
    pytest.importorskip("vl_convert")
    from tracekit.report.html import build_report

    return build_report(graph_trace)


def test_report_has_a_cuda_graphs_section(graph_report: str) -> None:
    from tracekit.viz.tables import fmt_ns

    text = _text(graph_report, "graphs")
    assert "Traced whole (nsys --cuda-graph-trace=graph" in text
    assert "graph launches 32 of 1 graph" in text
    replay_ns = sum(e - s for s, e, *_ in _graph_rows(GRAPH))
    assert f"GPU time in replays {fmt_ns(replay_ns)}" in text
    # the table row: pid, graph exec, graph, mode, device, launches, GPU time
    (pid,) = _sql(GRAPH, "SELECT DISTINCT globalPid / 16777216 % 16777216 FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE")[0]
    assert f"{pid} 2 1 graph 0 32 {fmt_ns(replay_ns)}" in text
    assert "decode.0" in text  # the NVTX path of the first launch
    assert '<a href="#graphs">CUDA graphs</a>' in graph_report


def test_report_busy_time_counts_replays(graph_report: str) -> None:
    """GPU 0's busy time, by hand: the union of every kernel, copy, memset and graph replay."""
    from tracekit.viz.tables import fmt_ns

    ops = [(s, e) for table in ("KERNEL", "MEMCPY", "MEMSET", "GRAPH_TRACE")
           for s, e in _sql(GRAPH, f"SELECT start, end FROM CUPTI_ACTIVITY_KIND_{table}")]
    busy = union_ns(ops)
    without = union_ns([(s, e) for table in ("KERNEL", "MEMCPY", "MEMSET")
                         for s, e in _sql(GRAPH, f"SELECT start, end FROM CUPTI_ACTIVITY_KIND_{table}")])
    span = max(e for _, e in ops) - min(s for s, _ in ops)
    assert busy == 79_414_494 and without < busy / 10  # replays are 95 % of it
    text = _text(graph_report, "overview")
    assert f"GPU 0 busy {fmt_ns(busy)} of {fmt_ns(span)}" in text
    assert f"GPU work span {fmt_ns(span)}" in text
    assert "CUDA graph replays 32 launches traced whole" in text
    assert "Not listed: 32 CUDA graph replays" in _text(graph_report, "kernels")
    # the NVTX breakdown sees the decode steps (one replay each)
    nvtx = _text(graph_report, "nvtx")
    assert "decode.5" in nvtx and 'class="err"' not in graph_report


def test_report_of_a_node_mode_capture(node_trace: Any) -> None:
    pytest.importorskip("altair")
    pytest.importorskip("vl_convert")
    from tracekit.report.html import build_report

    document = build_report(node_trace)
    text = _text(document, "graphs")
    assert "Traced per node" in text and "graph launches 32 of 1 graph" in text
    assert " node 0 32 " in text and " 875 " in text  # mode, device, launches; kernels per replay
    assert "CUDA graph replays" not in _text(document, "overview")  # the kernels are counted as kernels
    assert "Not listed" not in _text(document, "kernels") and 'class="err"' not in document


def test_report_of_a_trace_without_graphs_has_no_graph_section() -> None:
    pytest.importorskip("altair")
    pytest.importorskip("vl_convert")
    from tracekit.report.html import build_report

    document = build_report(tracekit.open(llm_capture("hf_generate_eager")))
    assert 'id="graphs"' not in document and "CUDA graph" not in _text(document, "overview")


def test_memory_estimate_counts_graph_launches(graph_trace: Any) -> None:
    from tracekit.nsys.database import GPU_OP_TABLES, gpu_op_estimate

    counts = {t: _sql(GRAPH, f"SELECT count(*) FROM CUPTI_ACTIVITY_KIND_{t}")[0][0]
              for t in ("KERNEL", "MEMCPY", "MEMSET", "GRAPH_TRACE")}
    assert gpu_op_estimate(graph_trace.db) == sum(counts.values()) == 764 + 97 + 30 + 32
    # nsys's cuda_gpu_trace lists no graph rows, and the stats reports read GPU_OP_TABLES
    assert "CUPTI_ACTIVITY_KIND_GRAPH_TRACE" not in GPU_OP_TABLES


# -- viz.prep ---------------------------------------------------------------------------------------------
def test_prep_gpu_ops_and_breakdown_count_replays(graph_trace: Any, node_trace: Any) -> None:
    from tracekit.viz import prep

    t = graph_trace
    ops = prep.gpu_ops(t.kernels, t.memcpys, t.memsets, t.graph_trace)
    g = ops.filter(pl.col("family") == "graph")
    assert g.height == 32 and set(g["name"]) == {"[CUDA graph 1]"}
    assert g["duration_ns"].sum() == sum(e - s for s, e, *_ in _graph_rows(GRAPH))
    assert prep.gpu_ops(t.kernels, t.memcpys, t.memsets, t.graphs).equals(ops)  # trace.graphs: the same rows
    lanes = prep.timeline_ops(ops, max_marks=10_000)
    assert lanes.filter(pl.col("family") == "graph").height == 32
    b = prep.temporal_breakdown(t.kernels, t.memcpys, t.memsets, t.graph_trace)
    busy = b.filter(pl.col("category") != "idle")["time_ns"].sum()
    assert busy == 79_414_494  # test_report_busy_time_counts_replays: the union by hand
    # per-node launches add nothing: their kernels are kernels already
    n = node_trace
    assert prep.gpu_ops(n.kernels, n.memcpys, n.memsets, n.graphs).height == n.kernels.height + n.memcpys.height + (
        n.memsets.height)


def test_timeline_chart_draws_replays(graph_trace: Any) -> None:
    pytest.importorskip("altair")
    from tracekit.viz import timeline_chart
    from tracekit.viz.export import chart_spec

    t = graph_trace
    spec = json.dumps(chart_spec(timeline_chart(t.kernels, memcpys=t.memcpys, memsets=t.memsets, graphs=t.graph_trace)))
    assert spec.count("[CUDA graph 1]") >= 32 and '"graph"' in spec


# -- TraceExplorer ------------------------------------------------------------------------------------------
@pytest.mark.notebook
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_explorer_timeline_and_overview_include_replays(graph_trace: Any) -> None:
    pytest.importorskip("ipywidgets")
    pytest.importorskip("altair")
    from tracekit.widgets import TraceExplorer

    ex = TraceExplorer(graph_trace, max_marks=10_000, window="whole")
    assert ex.errors == {}
    rows = _graph_rows(GRAPH)
    lanes = ex.timeline_lanes.filter(pl.col("family") == "graph")
    assert lanes.height == 32 and set(lanes["lane"]) == {"GPU 0 · stream 7"}
    ends = [_sql(GRAPH, f"SELECT min(start), max(end) FROM CUPTI_ACTIVITY_KIND_{t}")[0] for t in ("KERNEL", "MEMCPY", "MEMSET")]
    assert ex.full_window == (min(lo for lo, _ in ends), max(rows[-1][1], *(hi for _, hi in ends)))
    assert max(hi for _, hi in (ends[0], ends[2])) < rows[-1][1]  # no kernel or memset after the last replay
    assert "CUDA graph replays</b></td><td>32 traced whole" in ex.summary.value
    decode = ex.nvtx_rows.filter(pl.col("name").str.starts_with("decode."))
    assert decode.height == 32 and decode["gpu_time_ns"].sum() == sum(e - s for s, e, *_ in rows)
    # a window over the last 10 replays: the views follow
    lo, hi = rows[-10][0], rows[-1][1]
    ex.window = (lo, hi)
    assert ex.timeline_lanes.filter(pl.col("family") == "graph")["count"].sum() == 10
    compute = ex.breakdown.filter(pl.col("category") == "compute")["time_ns"].item()
    assert compute >= sum(e - s for s, e, *_ in rows[-10:])
    assert "CUDA graph replays</b></td><td>10 traced whole" in ex.summary.value


@pytest.mark.notebook
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_compare_says_what_the_kernel_time_leaves_out(graph_trace: Any, node_trace: Any) -> None:
    """The same decode loop traced per node (A) and whole (B): B's kernel time is 95 % lower
    only because its replays' kernels were not traced; the summary says how much they hold."""
    pytest.importorskip("ipywidgets")
    pytest.importorskip("altair")
    from tracekit.viz.tables import fmt_ns
    from tracekit.widgets import Compare

    c = Compare(node_trace, graph_trace, labels=("node", "graph"))
    replay_ns = sum(e - s for s, e, *_ in _graph_rows(GRAPH))
    assert "CUDA graph replays traced whole" in c.summary.value
    assert f"node 0 (0 ns) · graph 32 ({fmt_ns(replay_ns)})" in c.summary.value
