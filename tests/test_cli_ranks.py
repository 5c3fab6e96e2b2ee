"""Issue 27 §1: the CLI takes a folder of per-rank reports (or a list of them) wherever it reads
Nsight Systems exports — diagnose, summary, report — read here or reduced on a real Dask
``LocalCluster`` (``--engine dask``). Numbers of the per-rank table are recomputed from each
rank's export with plain SQL."""

from __future__ import annotations

import json
import os
import sqlite3
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

import tracekit
from tracekit.analysis.ranks import kernels_across_ranks, rank_summary
from tracekit.scale.reduce import reductions_of

from .conftest import SAMPLES

FOLDER = SAMPLES / "llm_tp2_nccl_per_rank"
RANK_FILES = sorted(FOLDER.glob("*_rank[0-9].sqlite"))
CLI = [sys.executable, "-m", "tracekit.cli.main"]
ENV = {**os.environ, "COLUMNS": "200"}


def _cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=ENV)


def _by_sql(path: Path) -> dict[str, float]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        kernels, gpu_ns = con.execute("SELECT COUNT(*), SUM(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
        steps = [e - s for s, e in con.execute(
            "SELECT e.start, e.end FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
            "WHERE COALESCE(e.text, s.value) LIKE 'step.%' AND e.end IS NOT NULL")]
    finally:
        con.close()
    return {"kernels": kernels, "gpu_time_ns": gpu_ns, "steps": len(steps), "median_step_ns": statistics.median(steps)}


def test_the_sample_has_one_report_per_rank() -> None:
    assert len(RANK_FILES) == 2


def test_diagnose_takes_a_folder_and_a_list_of_files() -> None:
    expected = tracekit.diagnose(tracekit.open_many(FOLDER, max_workers=1))
    for args in ([str(FOLDER)], [str(f) for f in RANK_FILES]):
        r = _cli("diagnose", *args, "-f", "json")
        assert r.returncode == 0, r.stderr
        payload = json.loads(r.stdout)
        got = [(f["category"], f["severity"], f["time_ns"]) for f in payload["findings"]]
        assert got == [(f.category, f.severity, f.time_ns) for f in expected.items]
        # rank keys in the evidence: the findings are per rank and across them
        assert any("rank" in row for f in payload["findings"] for row in f["evidence"])


def test_rank_summary_by_sql() -> None:
    ts = tracekit.open_many(FOLDER, max_workers=1)
    t = reductions_of(ts, ("kernel_summary", "busy", "overlap", "iterations"))
    per = rank_summary(t["kernel_summary"], t["busy"], t["overlap"], t["iterations"]).rows_by_key("rank", named=True, unique=True)
    assert sorted(per) == [0, 1]
    for rank, path in enumerate(RANK_FILES):
        ref = _by_sql(path)
        row = per[rank]
        assert row["kernels"] == ref["kernels"] and row["gpu_time_ns"] == ref["gpu_time_ns"]
        assert row["steps"] == ref["steps"] == 8 and row["median_step_ns"] == ref["median_step_ns"]
        assert row["devices"] == 1 and 0 < row["busy_share"] < 1
        assert 0 < row["exposed_comm_ns"] <= row["communication_ns"]
        assert row["top_kernel"].startswith("ncclDevKernel_AllReduce")
    across = kernels_across_ranks(t["kernel_summary"]).row(0, named=True)
    assert across["ranks"] == 2 and across["min_rank_ns"] < across["max_rank_ns"]
    assert across["total_ns"] == pytest.approx(across["min_rank_ns"] + across["max_rank_ns"])


def test_summary_of_a_folder_locally_and_on_dask() -> None:
    """The same per-rank table from a folder read here and reduced on a Dask LocalCluster of two
    worker processes; findings across ranks at the end; Dask's INFO lines kept off stderr."""
    local = _cli("summary", str(FOLDER), "--findings", "2")
    assert local.returncode == 0, local.stderr
    assert "per rank" in local.stdout and "kernels across ranks" in local.stdout
    assert "top findings across ranks" in local.stdout and "0. HIGH  host_bound" in local.stdout
    ref = _by_sql(RANK_FILES[1])
    assert f"{ref['kernels']:,}" in local.stdout and f"{ref['gpu_time_ns'] / 1e6:,.3f}" in local.stdout
    dask = _cli("summary", str(FOLDER), "--engine", "dask", "--workers", "2", "--findings", "2", timeout=600)
    assert dask.returncode == 0, dask.stderr
    assert "INFO distributed" not in dask.stderr

    def per_rank_block(text: str) -> str:
        return text.split("per rank", 1)[1].split("top findings", 1)[0]

    assert per_rank_block(dask.stdout) == per_rank_block(local.stdout)


def test_report_of_a_folder(tmp_path: Path) -> None:
    out = tmp_path / "ranks.html"
    r = _cli("report", str(FOLDER), "-o", str(out))
    assert r.returncode == 0, r.stderr
    page = out.read_text()
    assert "<title>2 ranks: llm_tp2_nccl_per_rank" in page and "rank 1" in page


def test_bad_inputs_say_what_to_do(tmp_path: Path) -> None:
    empty = tmp_path / "ranks"
    empty.mkdir()
    for args in (["diagnose", str(empty)], ["summary", str(empty)], ["diagnose", str(FOLDER), "--engine", "spark"]):
        r = _cli(*args)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, (args, r.stderr)
        assert r.stderr.startswith("tracekit: error:")
    assert "no Nsight Systems reports" in _cli("summary", str(empty)).stderr
    assert "choose local or dask" in _cli("diagnose", str(FOLDER), "--engine", "spark").stderr
