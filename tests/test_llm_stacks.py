"""The programs users profile, captured on an H100 (sample_traces/llm_stacks): HF generate()
with per-module ranges, a decode loop replayed from a CUDA graph (graph and node tracing), the
same on two GPUs with NCCL inside the graph, torch.compile decodes.

Every number checked here is recomputed from the export by plain SQL, or compared with the
`nsys stats` CSVs that the capturing nsys printed."""

from __future__ import annotations

import collections
import functools
import sqlite3
import warnings

import polars as pl
import pytest

import tracekit
from tracekit.analysis.graphs import graph_launch_cost, graph_summary
from tracekit.analysis.run.phases import phase_summary, trace_generation_steps
from tracekit.stats import REPORTS as STATS_REPORTS
from tracekit.stats import run_report

from .conftest import llm_capture, llm_capture_names, union_ns
from .nsys_reference import assert_same_as_nsys, read_reference

NAMES = llm_capture_names()


@functools.cache
def _trace(name: str):  # noqa: ANN202 - NsysTrace
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tracekit.open(llm_capture(name))


def _sql(name: str, query: str) -> list[tuple]:
    con = sqlite3.connect(f"file:{llm_capture(name)}?mode=ro", uri=True)
    try:
        return con.execute(query).fetchall()
    finally:
        con.close()


def test_the_captures_are_there() -> None:
    assert set(NAMES) >= {"hf_generate_eager", "graph_decode_graphtrace", "graph_decode_nodetrace", "tp2_graph_decode_graphtrace",
                          "tp2_graph_decode_nodetrace", "hf_generate_compile", "compile_kvcopy"}


# -- tracekit stats stays identical to nsys stats (graph rows are in none of its reports) -----------
def _stats_cases() -> list[tuple[str, str]]:
    cases = []
    for name in NAMES:
        stats = llm_capture(name).parent / "stats"
        for ref in sorted(stats.glob("*.csv")):
            report = ref.stem[len(name) + 1:]
            if report in STATS_REPORTS:
                cases.append((name, report))
    return cases


@pytest.mark.parametrize(("name", "report"), _stats_cases())
def test_stats_equal_the_capturing_nsys(name: str, report: str) -> None:
    reference = read_reference(llm_capture(name).parent / "stats" / f"{name}_{report}.csv")
    if not reference:  # nsys printed nothing (no NVTX in the capture): tracekit says why
        from tracekit.errors import UnsupportedReportError

        with pytest.raises(UnsupportedReportError, match="NVTX"):
            run_report(_trace(name), report, convention="2025")
        return
    result = run_report(_trace(name), report, convention="2025")
    ours = [result.columns, *result.formatted_rows()]
    assert collections.Counter(map(tuple, ours[1:])) == collections.Counter(map(tuple, reference[1:]))
    # rows in nsys's order; rows nsys's sort key leaves tied (two GPUs' operations starting in
    # the same nanosecond) are compared as sets
    assert_same_as_nsys(result, reference, ordered=report != "nvtx_sum")


def test_every_capture_has_its_stats() -> None:
    assert len(_stats_cases()) == 11 * len(NAMES)


# -- graph launches ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["graph_decode_graphtrace", "tp2_graph_decode_graphtrace"])
def test_graph_trace_rows_are_read_exactly(name: str) -> None:
    t = _trace(name)
    rows = _sql(name, "SELECT start, end, deviceId, streamId, correlationId, graphId, graphExecId FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE ORDER BY start")
    ours = t.graph_trace.sort("start_ns").select("start_ns", "end_ns", "device_id", "stream_id", "correlation_id", "graph_id", "graph_exec_id")
    assert ours.rows() == rows
    assert t.meta.cuda_graph_trace == "graph"
    assert _trace("graph_decode_nodetrace").meta.cuda_graph_trace == "node"


def test_graphs_name_the_launching_call_and_its_nvtx_range() -> None:
    g = _trace("graph_decode_graphtrace").graphs
    assert g.height == 32 and (g["mode"] == "graph").all()
    assert g["api_name"].str.starts_with("cudaGraphLaunch").all()
    assert g["nvtx_path"].to_list() == [f"decode.{i}" for i in range(32)]
    # the launching call by SQL: same correlation id, same process
    first = g.row(0, named=True)
    (api,) = _sql("graph_decode_graphtrace", f"SELECT r.start, r.end FROM CUPTI_ACTIVITY_KIND_RUNTIME r WHERE r.correlationId = {first['correlation_id']} "
                  f"AND (r.globalTid >> 24) = ({first['global_pid']} >> 24)")
    assert (first["api_start_ns"], first["api_end_ns"]) == api


def test_node_mode_groups_each_replay_by_its_launch() -> None:
    g = _trace("graph_decode_nodetrace").graphs
    assert g.height == 32 and (g["mode"] == "node").all()
    assert (g["kernels"] == 875).all() and (g["memsets"] == 2).all()
    # by SQL: kernels sharing a cudaGraphLaunch's correlation id
    rows = _sql("graph_decode_nodetrace", "SELECT correlationId, COUNT(*), MIN(start), MAX(end) FROM CUPTI_ACTIVITY_KIND_KERNEL "
                "WHERE graphNodeId IS NOT NULL GROUP BY correlationId ORDER BY MIN(start)")
    assert [(r[0], r[1]) for r in rows] == list(zip(g["correlation_id"].to_list(), g["kernels"].to_list(), strict=True))


def test_both_trace_modes_give_the_same_numbers() -> None:
    """Launches and GPU time per replay agree between the graph-mode and node-mode captures of
    one program (node mode's span is stretched by per-node tracing; its busy time is not)."""
    whole = graph_summary(_trace("graph_decode_graphtrace").graphs).row(0, named=True)
    nodes = graph_summary(_trace("graph_decode_nodetrace").graphs).row(0, named=True)
    assert whole["launches"] == nodes["launches"] == 32
    assert whole["graph_exec_id"] == nodes["graph_exec_id"]
    assert nodes["busy_median_ns"] == pytest.approx(whole["busy_median_ns"], rel=0.02)
    assert nodes["replay_median_ns"] > 1.1 * whole["replay_median_ns"]  # per-node tracing stretches the span
    for name in ("tp2_graph_decode_graphtrace", "tp2_graph_decode_nodetrace"):
        per_gpu = graph_summary(_trace(name).graphs)
        assert sorted(per_gpu["devices"].to_list()) == ["0", "1"] and (per_gpu["launches"] == 32).all()


def test_launch_cost_against_the_launches_a_replay_replaces() -> None:
    t = _trace("graph_decode_nodetrace")
    cost = graph_launch_cost(t.graphs, t.cuda_api).row(0, named=True)
    eager = _sql("graph_decode_nodetrace", "SELECT r.end - r.start FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
                 "WHERE s.value LIKE 'cudaLaunchKernel%' OR s.value LIKE 'cuLaunchKernel%'")
    median = float(pl.Series([e[0] for e in eager]).median())  # type: ignore[arg-type]
    assert cost["kernel_launch_median_ns"] == median
    assert cost["replaced_launch_ns"] == pytest.approx(875 * median)
    assert cost["saved_per_launch_ns"] == pytest.approx(875 * median - cost["launch_api_median_ns"])


def test_graph_replays_count_as_gpu_work() -> None:
    from tracekit.analysis._frames import gpu_ops
    from tracekit.analysis.gpu_time import busy_time

    t = _trace("graph_decode_graphtrace")
    busy = busy_time(gpu_ops(t.kernels, t.memcpys, t.memsets, t.graph_trace)).row(0, named=True)
    without = busy_time(gpu_ops(t.kernels, t.memcpys, t.memsets)).row(0, named=True)
    (graph_ns,) = _sql("graph_decode_graphtrace", "SELECT SUM(end - start) FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE")[0]
    assert busy["busy_ns"] >= graph_ns > 10 * without["busy_ns"]


# -- diagnose ------------------------------------------------------------------------------------------
@functools.cache
def _diagnose(name: str):  # noqa: ANN202 - Diagnosis
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tracekit.diagnose(_trace(name))


@pytest.mark.parametrize("name", ["graph_decode_graphtrace", "graph_decode_nodetrace", "tp2_graph_decode_graphtrace",
                                  "tp2_graph_decode_nodetrace"])
def test_graph_replayed_decode_is_never_launch_or_host_bound_at_high_severity(name: str) -> None:
    d = _diagnose(name)
    f = d.findings
    assert f.filter(pl.col("category") == "launch_bound").height == 0
    assert f.filter((pl.col("category") == "host_bound") & (pl.col("severity") == "high")).height == 0
    assert d.window.method in ("nvtx", "graph_replays")
    assert d.window.steps >= 30  # the decode steps, not the prefill's layers


def test_graph_launch_gap_is_the_launch_call() -> None:
    """graph_launch's time = GPU idle gaps before a replay filled by its cudaGraphLaunch call,
    recomputed from the graph rows: the gap from the previous GPU operation's end to each
    replay's start, where the launch call ends after the gap began."""
    d = _diagnose("graph_decode_graphtrace")
    row = d.findings.filter(pl.col("category") == "graph_launch").row(0, named=True)
    assert row["severity"] == "medium" and "cudaGraphLaunch takes 225 µs" in row["title"]
    w = d.window
    t = _trace("graph_decode_graphtrace")
    from tracekit.analysis._frames import gpu_ops

    ops = gpu_ops(t.kernels, t.memcpys, t.memsets, t.graph_trace).sort("start_ns")
    ends = ops["end_ns"].cum_max().shift(1)
    g = t.graphs.join(ops.with_columns(ends.alias("_prev")).select("start_ns", "_prev"), on="start_ns")
    gaps = g.filter((pl.col("start_ns") >= w.start_ns) & (pl.col("start_ns") < w.end_ns) & (pl.col("api_end_ns") > pl.col("_prev"))
                    & (pl.col("start_ns") - pl.col("_prev") >= 10_000))
    assert row["time_ns"] == pytest.approx(int((gaps["start_ns"] - gaps["_prev"]).sum()), rel=0.05)


def test_graph_mode_says_what_it_could_not_see() -> None:
    f = _diagnose("graph_decode_graphtrace").findings.filter(pl.col("category") == "trace_coverage")
    assert f.height == 1 and "31 CUDA graph replays" in f["title"][0] and "--cuda-graph-trace node" in f["next"][0][0]


def test_phases_in_the_window_line() -> None:
    d = _diagnose("graph_decode_graphtrace")
    p = d.phases.rows_by_key("phase", named=True, unique=True)
    assert p["decode"]["steps"] == 32 and p["prefill"]["steps"] == 1
    assert "time per output token 2.71 ms" in d.window_text()


def test_no_finding_claims_more_than_its_window() -> None:
    from .conftest import sample_exports

    for path in [*sample_exports(), *(llm_capture(n) for n in NAMES)]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            d = tracekit.diagnose(path)
        shares = d.findings["share"].drop_nulls()
        assert shares.len() == 0 or shares.max() <= 1.0, path.name  # type: ignore[operator]


def _idle_in_window_by_sql(name: str, start: int, end: int) -> int:
    """GPU idle time in ``[start, end)`` of the single GPU, from the union of the rows of the
    kernel, memcpy, memset and graph-trace tables (plain SQL and a sweep)."""
    tables = [t for (t,) in _sql(name, "SELECT name FROM sqlite_master WHERE type = 'table'")]
    parts = [f"SELECT start, end FROM {t}" for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
                                                      "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_GRAPH_TRACE") if t in tables]
    rows = _sql(name, " UNION ALL ".join(parts))
    return (end - start) - union_ns(rows, start, end)


@pytest.mark.parametrize("name", ["hf_generate_eager", "compile_kvcopy", "hf_generate_compile", "graph_decode_nodetrace",
                                  "compile_functional"])
def test_idle_findings_never_count_a_gap_twice(name: str) -> None:
    """Each idle gap goes to one of host_bound, launch_bound, graph_launch, sync_stall: on one
    GPU their sum stays within the GPU's idle time in the window (recomputed by SQL). Before the
    fix, HF generate()'s per-token sync made every later gap of the step both the sync's
    leftover (host_bound 95 %) and launch_bound's (52 %)."""
    d = _diagnose(name)
    f = d.findings.filter(pl.col("category").is_in(["host_bound", "launch_bound", "graph_launch", "sync_stall"]))
    assert f.height >= 1
    idle = _idle_in_window_by_sql(name, d.window.start_ns, d.window.end_ns)
    # launch_bound's stretches also hold the sub-10 µs holes idle_gaps leaves out: still idle time
    assert int(f["time_ns"].sum()) <= idle, (f.select("category", "time_ns").to_dicts(), idle)


# -- data movement ---------------------------------------------------------------------------------------
def test_kv_cache_grown_with_cat_is_named() -> None:
    """HF's DynamicCache grows the KV cache with torch.cat: the data_movement finding names the
    concat kernels; their share of GPU time is recomputed from the kernel table."""
    d = _diagnose("hf_generate_eager")
    row = d.findings.filter(pl.col("category") == "data_movement").row(0, named=True)
    assert "CatArrayBatchedCopy" in row["title"] and "concat" in row["title"] and "cache_implementation='static'" in row["advice"]
    w = d.window
    (cat, total) = _sql("hf_generate_eager", "SELECT SUM(CASE WHEN s.value LIKE '%CatArrayBatchedCopy%' THEN k.end - k.start END), "
                        "SUM(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName "
                        f"WHERE k.start >= {w.start_ns} AND k.start < {w.end_ns}")[0]
    ev = pl.DataFrame(d.items[[f.category for f in d.items].index("data_movement")].evidence)
    assert int(ev.filter(pl.col("kind") == "concat")["gpu_time_ns"].sum()) == cat
    assert f"concat {cat / total:.0%}" in row["title"]


@pytest.mark.parametrize("name", ["hf_generate_compile", "compile_kvcopy"])
def test_inductor_kernels_land_in_families(name: str) -> None:
    """Every Triton kernel Inductor generated in the compiled captures gets a family (none is
    'other'), by what it fuses: an RMS norm is normalization, an argmax a reduction, SiLU-mul
    elementwise, and a kernel fusing only views, casts and index writes is data movement."""
    from tracekit.analysis.data_movement import data_movement_ops
    from tracekit.taxonomy import kernel_family

    names = [r[0] for r in _sql(name, "SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s "
                                      "ON s.id = k.shortName WHERE s.value LIKE 'triton%'")]
    assert len(names) >= 10
    fams = {n: kernel_family(n) for n in names}
    assert "other" not in fams.values(), fams
    for n, fam in fams.items():
        if n.startswith(("triton_per", "triton_red")) and "rms_norm" in n:  # a pointwise kernel applying a norm is elementwise
            assert fam == "normalization", (n, fam)
        if n.startswith(("triton_per", "triton_red")):
            assert fam in ("normalization", "reduction", "softmax"), (n, fam)
        if n.startswith("triton_red_fused_argmax"):
            assert fam == "reduction"
        if "silu" in n:
            assert fam == "elementwise"
    moving = dict(data_movement_ops(pl.DataFrame({"name": names, "op_kind": ["kernel"] * len(names),
                                                  "duration_ns": [1] * len(names)})).select("name", "kind").iter_rows())
    # an in-place copy_ fused by Inductor (the static cache's position bump) is data movement too
    expected = {"hf_generate_compile": {"triton_poi_fused__to_copy_unsqueeze_1": "dtype_cast", "triton_poi_fused_add_copy__16": "inplace_copy"},
                "compile_kvcopy": {"triton_poi_fused__unsafe_view_index_copy_split_with_sizes_transpose_view_3": "index_write"}}
    assert moving == expected[name]


def test_graph_decode_without_big_copies_has_no_data_movement_finding() -> None:
    assert _diagnose("compile_kvcopy").findings.filter(pl.col("category") == "data_movement").height == 0


# -- phases ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "source", "decode_steps"), [
    ("graph_decode_graphtrace", "nvtx", 32), ("graph_decode_nodetrace", "nvtx", 32),
    ("tp2_graph_decode_graphtrace", "graph_replays", 32), ("tp2_graph_decode_nodetrace", "graph_replays", 32),
    ("hf_generate_eager", "module", 23), ("hf_generate_compile", "graph_replays", 23), ("compile_kvcopy", "nvtx", 24),
])
def test_generation_phases(name: str, source: str, decode_steps: int) -> None:
    steps = trace_generation_steps(_trace(name))
    assert steps["source"].unique().to_list() == [source]
    s = phase_summary(steps).rows_by_key("phase", named=True, unique=True)
    assert s["prefill"]["steps"] == 1 and s["decode"]["steps"] == decode_steps
    assert s["prefill"]["ttft_ns"] > 0 and s["decode"]["tpot_median_ns"] > 0


def test_time_per_output_token_by_hand() -> None:
    """TPOT = intervals between consecutive decode.N range starts (NVTX, plain SQL)."""
    s = phase_summary(trace_generation_steps(_trace("graph_decode_graphtrace"))).rows_by_key("phase", named=True, unique=True)
    starts = [r[0] for r in _sql("graph_decode_graphtrace", "SELECT e.start FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
                                 "WHERE COALESCE(e.text, s.value) LIKE 'decode.%' ORDER BY e.start")]
    diffs = pl.Series([b - a for a, b in zip(starts, starts[1:], strict=False)], dtype=pl.Float64)
    assert s["decode"]["tpot_median_ns"] == diffs.median()
    assert s["decode"]["tpot_p90_ns"] == diffs.quantile(0.9, interpolation="nearest")
    (pre,) = _sql("graph_decode_graphtrace", "SELECT e.start FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
                  "WHERE COALESCE(e.text, s.value) = 'prefill'")
    assert s["prefill"]["ttft_ns"] > 0 and pre[0] < starts[0]


def test_model_trace_compares_each_phase_with_the_model() -> None:
    """`tracekit model --trace` on a graph-replayed decode (no layer ranges: the graph hides
    them) still compares the phases: the decode's time per output token (the NVTX intervals
    above) against the model's minimum for a mean decode step of this request."""
    import json
    import os
    import subprocess
    import sys

    from tracekit.model import load_model
    from tracekit.model.phases import phase_costs

    from .conftest import ROOT

    cfg = ROOT / "sample_traces" / "workloads" / "qwen3_0.6b_config.json"
    path = llm_capture("graph_decode_graphtrace")
    r = subprocess.run([sys.executable, "-m", "tracekit.cli.main", "model", str(cfg), "--trace", str(path),
                        "--batch", "4", "--prompt-len", "128", "-f", "json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    payload = json.loads(r.stdout)
    assert payload["compare"] == []  # no layer ranges inside a replayed graph
    p = {row["phase"]: row for row in payload["phases"]}
    tpot = phase_summary(trace_generation_steps(_trace("graph_decode_graphtrace"))).filter(pl.col("phase") == "decode")["tpot_median_ns"][0]
    minimum = phase_costs(load_model(cfg, batch=4, prompt_len=128), decode_steps=32, gpu="NVIDIA H100 80GB HBM3")
    dec_min = minimum.filter(pl.col("phase") == "decode")["predicted_min_ns"][0]
    assert p["decode"]["time_ns"] == tpot and p["decode"]["predicted_min_ns"] == pytest.approx(dec_min)
    assert p["decode"]["efficiency"] == pytest.approx(dec_min / tpot) and 0 < p["decode"]["efficiency"] < 1
    table = subprocess.run([sys.executable, "-m", "tracekit.cli.main", "model", str(cfg), "--trace", str(path), "--batch", "4",
                            "--prompt-len", "128"], capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert table.returncode == 0 and "generation phases vs the model" in table.stdout and "no per-layer comparison" in table.stdout


def test_annotate_ranges_reached_nsys() -> None:
    """The HF capture's per-module ranges came from --annotate-torch (an unmodified script): 24
    forwards × (root + model + 28 layers × 5 + embed, rotary, norm, lm_head)."""
    counts = dict(_sql("hf_generate_eager", "SELECT COALESCE(e.text, s.value), COUNT(*) FROM NVTX_EVENTS e LEFT JOIN StringIds s "
                       "ON s.id = e.textId GROUP BY 1"))
    assert counts["Qwen3ForCausalLM"] == 24 and counts["model.layers.27.self_attn"] == 24 and counts["lm_head"] == 24
    assert len(counts) == 2 + 28 * 5 + 4
    assert not any(k.endswith("q_proj") for k in counts)  # depth 3


def test_the_hf_capture_records_how_it_was_annotated() -> None:
    import json

    from .conftest import LLM_STACKS

    record = json.loads((LLM_STACKS / "hf_generate_eager" / "tracekit_experiment.json").read_text())
    assert record["options"]["annotate_torch"] == {"depth": 3, "include": [], "exclude": [], "backward": False}
    assert record["status"] == "complete"


def test_graph_step_is_judged_against_the_model() -> None:
    """A replayed decode step hides its layers: the whole step is compared with the model
    (Qwen3-0.6B, batch 4, prompt 128): MBU = the model's decode bytes ÷ (TPOT × HBM bandwidth)."""
    from tracekit.model import load_model
    from tracekit.model.phases import phase_costs
    from tracekit.ncu.specs import find_spec

    cfg = load_model("tests/data/hf_configs/qwen3_0.6b.json", batch=4, prompt_len=128)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = tracekit.diagnose(_trace("graph_decode_graphtrace"), model=cfg)
    row = d.findings.filter(pl.col("category") == "below_model_bound").row(0, named=True)
    assert row["title"].startswith("Decode reaches 14% of the model's bound")
    dec = d.phases.filter(pl.col("phase") == "decode").row(0, named=True)
    spec = find_spec("NVIDIA H100 80GB HBM3", 85017493504)
    costs = phase_costs(cfg, decode_steps=32, gpu=spec).rows_by_key("phase", named=True, unique=True)
    assert dec["mbu"] == pytest.approx(costs["decode"]["bytes"] / (dec["tpot_median_ns"] * 1e-9 * spec.bandwidth_gbps * 1e9))
    assert row["time_ns"] == pytest.approx((dec["tpot_median_ns"] - costs["decode"]["predicted_min_ns"]) * d.window.steps, rel=1e-6)


def test_hf_window_is_one_step_per_forward() -> None:
    """No step ranges in the HF capture: the window's steps are the forwards (the root-module
    ranges that each run the 28 layers once), one per generated token."""
    w = _diagnose("hf_generate_eager").window
    assert w.method == "forwards" and w.steps == 24 and "Qwen3ForCausalLM" in w.reason and "28 layers" in w.reason
    (n,) = _sql("hf_generate_eager", "SELECT COUNT(*) FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
                "WHERE COALESCE(e.text, s.value) = 'Qwen3ForCausalLM'")[0]
    assert n == 24


def test_compiled_decode_that_copies_its_kv_cache_is_named() -> None:
    """torch.compile(reduce-overhead) decode whose step returns new caches, cloned outside the
    compiled code as PyTorch's CUDA-graph error asks (8 layers, batch 8, 8 KV heads × 128, a
    576-token static cache in bf16): every step copies every layer's K and V twice (the clone,
    and cudagraph trees copying the new input into the graph's own buffer) — 2 × 16 × 9,437,184
    bytes. data_movement names the device-to-device copies; their bytes by SQL."""
    d = _diagnose("compile_functional")
    row = d.findings.filter(pl.col("category") == "data_movement").row(0, named=True)
    assert row["severity"] == "medium" and "memcpy" in row["title"] and "Device-to-Device" in row["title"]
    assert "mark_static_address" in row["advice"]
    cache = 8 * 8 * 576 * 128 * 2
    (big, n) = _sql("compile_functional", f"SELECT SUM(bytes), COUNT(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 8 AND bytes = {cache}")[0]
    assert n == 2 * 16 * 24 and big == 2 * 16 * 24 * cache  # 24 decode steps
    w = d.window
    (dtod,) = _sql("compile_functional", "SELECT SUM(end - start) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 8 "
                   f"AND start >= {w.start_ns} AND start < {w.end_ns}")[0]
    assert row["time_ns"] == dtod


@pytest.mark.parametrize("name", ["hf_generate_compile", "compile_kvcopy", "hf_generate_eager"])
def test_data_movement_rows_decided_per_name_equal_each_row_decided(name: str) -> None:
    """data_movement_ops decides once per distinct name and kind which operations move data;
    the rows it keeps, in order, are those each row's own test keeps (its name's family,
    in-place copy, device-to-device memcpy, memset), on a capture's kernels, copies and sets."""
    from tracekit.analysis._frames import gpu_ops
    from tracekit.analysis.data_movement import data_movement_ops, inplace_copy
    from tracekit.taxonomy import kernel_family

    t = tracekit.open(llm_capture(name))
    ops = gpu_ops(t.kernels, t.memcpys, t.memsets).with_row_index("_r")
    got = data_movement_ops(ops)
    inplace = dict(zip(ops["name"], inplace_copy(ops["name"]), strict=True))
    want = [r for r, n, k in ops.select("_r", "name", "op_kind").iter_rows()
            if (k == "kernel" and (kernel_family(n) == "copy" or inplace[n]))
            or (k == "memcpy" and "device-to-device" in n.lower()) or k == "memset"]
    assert len(want) > 0 and got["_r"].to_list() == want
    assert got.columns == [*ops.columns, "family", "kind"]
