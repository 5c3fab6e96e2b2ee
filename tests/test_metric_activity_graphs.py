"""GPU metrics against the traced work on a capture whose CUDA graphs were traced whole
(``--cuda-graph-trace=graph``): the replays are traced work, so the sample intervals they
cover are not "untraced" in ``summary``'s GPU metrics table, the report's note or the
diagnosis (one list of operations, :func:`tracekit.diagnosis.context.activity_ops`)."""

from __future__ import annotations

import sqlite3

import polars as pl

import tracekit
from tracekit.analysis.metrics import metric_activity
from tracekit.diagnosis.context import activity_ops, activity_samples

from .conftest import llm_capture


def test_graph_replays_traced_whole_count_as_traced_work() -> None:
    path = llm_capture("graph_decode_graphtrace")
    trace = tracekit.open(path)
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    (n_kernels,), (n_copies,), (n_graphs,) = (con.execute(f"SELECT COUNT(*) FROM {t}").fetchone() for t in (
        "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"))
    has_memset = con.execute("SELECT COUNT(*) FROM sqlite_master WHERE name = 'CUPTI_ACTIVITY_KIND_MEMSET'").fetchone()[0]
    n_sets = con.execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_MEMSET").fetchone()[0] if has_memset else 0
    con.close()
    ops = activity_ops(trace)
    assert n_graphs == 32 and ops.height == n_kernels + n_copies + n_sets + n_graphs
    assert ops.columns == ["device_id", "start_ns", "end_ns"]
    samples = activity_samples(trace)
    with_graphs = metric_activity(samples, ops).row(0, named=True)
    without = metric_activity(samples, ops.head(n_kernels + n_copies + n_sets)).row(0, named=True)
    # the replays held the GPU's work: without them 53 ms of the 123 ms active looked untraced
    assert with_graphs["active_ns"] == without["active_ns"] > 0
    assert with_graphs["untraced_active_ns"] < 0.1 * without["untraced_active_ns"]
    from tracekit.cli.summary import build_summary

    s, _ = build_summary(trace)
    table = next(v for k, v in s.tables.items() if k.startswith("GPU metrics"))
    assert table["untraced_s"][0] == with_graphs["untraced_active_ns"] / 1e9
    assert table.filter(pl.col("GPU") == 0).height == 1
    # the diagnosis' own list of the window's operations says the same
    from tracekit.diagnosis.config import DiagnoseConfig
    from tracekit.diagnosis.context import Context

    ctx = Context(tracekit.open(path), DiagnoseConfig())
    ctx.prepare_reads()
    ops_w = ctx.ops_for_window(["rank", "device_id", "start_ns", "end_ns"])
    assert ctx.metric_activity(ops_w)["untraced_active_ns"][0] == with_graphs["untraced_active_ns"]
