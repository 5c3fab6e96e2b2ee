"""tracekit.diff / tracekit diff on real captures and mutated copies of them (made here)."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit.analysis.compare import compare_per_step

from .conftest import CORPUS, SAMPLES

CLEAN = SAMPLES / "planted" / "planted_clean" / "planted_clean.sqlite"
LN = "vectorized_layer_norm_kernel"


def _scaled(tmp_path: Path, factor: float, like: str = "%") -> Path:
    """A copy whose kernels with a short name LIKE ``like`` last ``factor`` times as long
    (start kept, end moved)."""
    copy = tmp_path / f"scaled_{factor}.sqlite"
    shutil.copyfile(CLEAN, copy)
    con = sqlite3.connect(copy)
    con.execute(
        "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = start + CAST((end - start) * ? AS INTEGER) "
        "WHERE shortName IN (SELECT id FROM StringIds WHERE value LIKE ?)", (factor, like),
    )
    con.commit()
    con.close()
    return copy


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracekit.cli.main", "diff", *args], capture_output=True, text=True, timeout=300)


def test_a_run_against_itself_is_no_change() -> None:
    d = tracekit.diff(CLEAN, CLEAN)
    for level, frame in d.levels.items():
        assert frame.height > 0, level
        assert set(frame["verdict"]) == {"no change"}, level
        assert (frame["delta"] == 0).all()
    assert d.regressions().height == 0
    assert _cli(str(CLEAN), str(CLEAN)).returncode == 0


def test_one_kernel_slower_is_flagged_alone(tmp_path: Path) -> None:
    slow = _scaled(tmp_path, 1.5, LN)
    d = tracekit.diff(CLEAN, slow)
    k = d.levels["kernel"]
    row = k.filter(pl.col("key") == LN).row(0, named=True)
    assert row["verdict"] == "slower" and row["delta_pct"] == pytest.approx(0.5, abs=0.01)
    assert set(k.filter(pl.col("key") != LN)["verdict"]) == {"no change"}
    assert d.levels["family"].filter(pl.col("key") == "normalization")["verdict"][0] == "slower"
    r = _cli(str(CLEAN), str(slow), "--threshold", "5", "--format", "json")
    assert r.returncode == 1
    payload = json.loads(r.stdout)
    assert {x["key"] for x in payload["regressions"] if x["level"] == "kernel"} == {LN}
    assert _cli(str(CLEAN), str(slow), "--threshold", "60").returncode == 0  # 50 % is below a 60 % bar


def test_everything_faster(tmp_path: Path) -> None:
    fast = _scaled(tmp_path, 0.5)
    d = tracekit.diff(CLEAN, fast)
    gpu = d.levels["step"].filter(pl.col("key") == "gpu_time").row(0, named=True)
    assert gpu["verdict"] == "faster" and gpu["delta_pct"] < -0.3
    assert d.regressions().height == 0


def test_per_step_numbers_by_hand() -> None:
    """The mean per-step GPU time of the layer-norm kernel: its launches inside the steady
    NVTX steps (step.1 … step.19; step.0 is warm-up), summed per step with SQL."""
    d = tracekit.diff(CLEAN, CLEAN, levels=("kernel",))
    row = d.levels["kernel"].filter(pl.col("key") == LN).row(0, named=True)
    con = sqlite3.connect(f"file:{CLEAN}?mode=ro", uri=True)
    per_step = con.execute(
        "SELECT n.text, sum(k.end - k.start) FROM NVTX_EVENTS n JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
        "ON r.start >= n.start AND r.start <= n.end AND r.globalTid = n.globalTid "
        "JOIN CUPTI_ACTIVITY_KIND_KERNEL k ON k.correlationId = r.correlationId "
        "JOIN StringIds s ON s.id = k.shortName "
        "WHERE n.text LIKE 'step.%' AND n.text != 'step.0' AND s.value = ? GROUP BY n.text", (LN,),
    ).fetchall()
    con.close()
    assert len(per_step) == row["steps_a"] == 19
    assert row["mean_a"] == pytest.approx(sum(v for _, v in per_step) / 19)
    assert row["total_a"] == sum(v for _, v in per_step)


def test_no_steps_uses_the_fixed_threshold() -> None:
    path = CORPUS / "nsys" / "nsys2023.1_memfusion_tensorrt.sqlite"
    d = tracekit.diff(path, path)
    assert set(d.levels["kernel"]["noise_basis"]) == {"fixed"} and d.steps == {"before": 1, "after": 1}


def test_statistic_on_known_numbers() -> None:
    """Welch: a 10 % shift with tiny noise is slower; the same shift drowned in noise is not."""
    steps = list(range(10))
    a = pl.DataFrame({"step": steps, "key": ["x"] * 10, "value": [100] * 10})
    b = pl.DataFrame({"step": steps, "key": ["x"] * 10, "value": [110] * 10})
    assert compare_per_step(a, b, steps, steps)["verdict"][0] == "slower"
    noisy = pl.DataFrame({"step": steps, "key": ["x"] * 10, "value": [60, 160] * 5})
    assert compare_per_step(a, noisy, steps, steps)["verdict"][0] == "no change"
    small = pl.DataFrame({"step": steps, "key": ["x"] * 10, "value": [101] * 10})  # 1 % < min_effect
    assert compare_per_step(a, small, steps, steps)["verdict"][0] == "no change"


def test_bad_level_is_one_line() -> None:
    r = _cli(str(CLEAN), str(CLEAN), "--by", "nope")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "unknown level" in r.stderr


TP2 = SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"
PER_RANK = SAMPLES / "llm_tp2_nccl_per_rank"


def test_range_level_is_gpu_time_by_hand() -> None:
    """The range level counts the GPU time of the work launched inside a range (innermost, on
    the launching thread), not the range's CPU duration: layer.2 summed with SQL over the
    steady steps (step.1 … step.19)."""
    d = tracekit.diff(CLEAN, CLEAN, levels=("range",))
    row = d.levels["range"].filter(pl.col("key") == "layer.2").row(0, named=True)
    con = sqlite3.connect(f"file:{CLEAN}?mode=ro", uri=True)
    gpu, cpu = con.execute(
        "WITH steady AS (SELECT min(start) AS s FROM NVTX_EVENTS WHERE text = 'step.1'), "
        "lay AS (SELECT n.start, n.end, n.globalTid FROM NVTX_EVENTS n, steady WHERE n.text = 'layer.2' AND n.start >= steady.s), "
        "ops AS (SELECT correlationId, start, end FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL "
        "        SELECT correlationId, start, end FROM CUPTI_ACTIVITY_KIND_MEMCPY UNION ALL "
        "        SELECT correlationId, start, end FROM CUPTI_ACTIVITY_KIND_MEMSET) "
        "SELECT (SELECT sum(o.end - o.start) FROM lay JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
        "        ON r.start >= lay.start AND r.end <= lay.end AND r.globalTid = lay.globalTid "
        "        JOIN ops o ON o.correlationId = r.correlationId), "
        "       (SELECT sum(end - start) FROM lay)"
    ).fetchone()
    con.close()
    assert row["total_a"] == gpu and row["mean_a"] == pytest.approx(gpu / 19)
    assert abs(gpu - cpu) > 0.5 * cpu  # the ranges' CPU duration (1.87 ms) is another number (4.09 ms of GPU work)
    assert "step.N" in d.levels["range"]["key"].to_list()  # work launched directly in a step: one key


def test_per_step_kernel_count_by_hand() -> None:
    """The step level's ``kernels``: launches per steady step, counted with SQL."""
    d = tracekit.diff(CLEAN, CLEAN, levels=("step",))
    row = d.levels["step"].filter(pl.col("key") == "kernels").row(0, named=True)
    con = sqlite3.connect(f"file:{CLEAN}?mode=ro", uri=True)
    (n,) = con.execute(
        "SELECT count(*) FROM NVTX_EVENTS n JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
        "ON r.start >= n.start AND r.start <= n.end AND r.globalTid = n.globalTid "
        "JOIN CUPTI_ACTIVITY_KIND_KERNEL k ON k.correlationId = r.correlationId "
        "WHERE n.text LIKE 'step.%' AND n.text != 'step.0'"
    ).fetchone()
    con.close()
    assert row["total_a"] == n and row["mean_a"] == pytest.approx(n / 19)


def test_different_step_counts_compare_per_step(tmp_path: Path) -> None:
    """A copy that keeps only step.0 … step.9 (the other step ranges deleted, so their work is in
    no step): 9 steady steps against 19; per-step means unchanged, totals about 9/19."""
    short = tmp_path / "ten_steps.sqlite"
    shutil.copyfile(CLEAN, short)
    con = sqlite3.connect(short)
    con.execute("DELETE FROM NVTX_EVENTS WHERE text LIKE 'step.1_'")
    con.commit()
    con.close()
    d = tracekit.diff(CLEAN, short)
    assert d.steps == {"before": 19, "after": 9}
    k = d.levels["kernel"]
    assert set(k["verdict"]) == {"no change"}
    ln = k.filter(pl.col("key") == LN).row(0, named=True)
    assert ln["total_b"] / ln["total_a"] == pytest.approx(9 / 19, rel=0.02)
    assert d.levels["step"].filter(pl.col("key") == "kernels")["delta"][0] == 0
    assert _cli(str(CLEAN), str(short), "--threshold", "5").returncode == 0


def test_two_real_tp2_captures() -> None:
    """The same TP2 program captured twice: both processes in one export, and one export per
    rank (a folder, opened with open_many). Same kernels per step, compute unchanged within
    noise; the collectives waited much less in the per-rank capture (NCCL kernels include the
    wait for the peer)."""
    d = tracekit.diff(TP2, PER_RANK)
    assert d.steps == {"before": 8, "after": 8} and d.methods == {"before": "nvtx", "after": "nvtx"}
    fam = {r["key"]: r for r in d.levels["family"].iter_rows(named=True)}
    for compute in ("gemm", "attention", "normalization", "elementwise"):
        assert fam[compute]["verdict"] == "no change", compute
        assert abs(fam[compute]["delta_pct"]) < 0.02
    assert fam["communication"]["verdict"] == "faster"
    kernels = d.levels["step"].filter(pl.col("key") == "kernels").row(0, named=True)
    assert kernels["mean_a"] == kernels["mean_b"] == 134  # 67 per rank and step, both ranks
    assert d.regressions().height == 0
    r = _cli(str(PER_RANK), str(TP2), "--threshold", "5", "--format", "json")
    assert r.returncode == 1  # the other way round, communication got slower
    assert {x["key"] for x in json.loads(r.stdout)["regressions"] if x["level"] == "family"} == {"communication"}


def test_a_rank_set_against_itself_is_no_change() -> None:
    """Steps are taken per process, so which rank leads the window does not move work between
    steps (both ranks have 10 step ranges)."""
    s = tracekit.open_many(PER_RANK)
    d = tracekit.diff(s, s)
    for level, frame in d.levels.items():
        assert (frame["delta"] == 0).all() and set(frame["verdict"]) == {"no change"}, level
    assert _cli(str(PER_RANK), str(PER_RANK)).returncode == 0


def test_bad_inputs_exit_2(tmp_path: Path) -> None:
    ncu = SAMPLES / "ncu" / "ncu_precisions" / "ncu_precisions.ncu-rep"
    for args in (
        (str(ncu), str(CLEAN)),
        (str(CLEAN), str(tmp_path / "missing.sqlite")),
        (str(CLEAN), str(CLEAN), "--threshold", "-1"),
        (str(CLEAN), str(CLEAN), "--format", "xml"),
    ):
        r = _cli(*args)
        assert r.returncode == 2 and r.stderr.startswith("tracekit: error:") and r.stderr.count("\n") == 1, args
    with pytest.raises(tracekit.TracekitError, match="threshold"):
        tracekit.diff(CLEAN, CLEAN, threshold=-0.1)


def test_threshold_is_kept_on_the_diff(tmp_path: Path) -> None:
    slow = _scaled(tmp_path, 1.5, LN)
    assert tracekit.diff(CLEAN, slow, threshold=0.6).regressions().height == 0
    d = tracekit.diff(CLEAN, slow, threshold=0.05, levels=("kernel",))
    assert d.regressions()["key"].to_list() == [LN] and d.to_dict()["settings"]["threshold"] == 0.05


def test_opening_the_runs_reads_no_table() -> None:
    """``diff`` checks that each run is an Nsight Systems trace by its class: asking the trace
    itself (``hasattr(trace, "kernels")``) built the whole kernel table before the memory check."""
    from tracekit.comparison import _open_run

    trace = _open_run(str(SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"))
    assert type(trace).__name__ == "NsysTrace"
    assert not trace.is_loaded("kernels")


# -- the answer first (issue 27 §5) --------------------------------------------------------------
def test_diff_leads_with_the_verdict_and_says_why() -> None:
    """A real change on an H100 capture pair (sample_traces/llm_stacks): a torch.compile decode
    whose step mutates its KV cache (Inductor skips CUDA graphs: 109 kernels launched per step)
    against the same decode with a functional step (graphs replayed, whole-cache copies). The
    diff says "faster" first, then why: launch_bound went away, data_movement and graph_launch
    appeared, host_bound grew — each per step, equal to the two diagnoses by hand."""
    from .conftest import llm_capture

    before, after = llm_capture("compile_kvcopy"), llm_capture("compile_functional")
    d = tracekit.diff(before, after)
    h = d.headline()
    step = d.levels["step"].filter(pl.col("key") == "step_time").row(0, named=True)
    assert h is not None and h["verdict"] == "faster" == step["verdict"] and h["before_ns"] == step["mean_a"]
    assert d.verdict_line().startswith("faster: step time ") and "-70." in d.verdict_line()
    da, db = tracekit.diagnose(before), tracekit.diagnose(after)
    change = dict(d.findings.select("category", "change").iter_rows())
    assert change["launch_bound"] == "went away" and change["data_movement"] == "appeared"
    assert change["graph_launch"] == "appeared" and change["host_bound"] == "grew"
    hb = d.findings.filter(pl.col("category") == "host_bound").row(0, named=True)
    tb = da.findings.filter(pl.col("category") == "host_bound")["time_ns"][0] / da.window.steps
    ta = db.findings.filter(pl.col("category") == "host_bound")["time_ns"][0] / db.window.steps
    assert hb["per_step"] and hb["time_before_ns"] == pytest.approx(tb) and hb["time_after_ns"] == pytest.approx(ta)
    # the replays traced whole are compared as their own key, and said so
    fam = d.levels["family"].filter(pl.col("key") == "graph").row(0, named=True)
    con = sqlite3.connect(f"file:{after}?mode=ro", uri=True)
    (replays,) = con.execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE").fetchone()
    con.close()
    assert fam["mean_a"] == 0 and fam["steps_b"] == 24 and replays == 24
    assert any("24 CUDA graph replays traced whole" in n for n in d.notes)
    # the same order in every output
    payload = json.loads(d.to_json())
    assert list(payload)[:4] == ["verdict", "verdict_line", "findings", "notes"]
    md = d.to_markdown().splitlines()
    assert md[2] == f"**{d.verdict_line()}**" and any(ln.startswith("## Why") for ln in md)
    assert md.index(next(ln for ln in md if ln.startswith("## Why"))) < md.index(next(ln for ln in md if ln == "## kernel"))
    r = _cli(str(before), str(after), "--by", "step,family")
    lines = r.stdout.splitlines()
    # the verdict, each run's structure, then why
    assert lines[0] == d.verdict_line() and lines[1] == f"before: {d.runs['before']}" and lines[2] == f"after: {d.runs['after']}"
    assert d.runs["before"].startswith("generation: ") and lines[3].startswith("why")
    assert "launch_bound went away" in r.stdout.split("step:")[0]  # before the first table
    back = _cli(str(after), str(before), "--by", "step")
    assert back.returncode == 1 and back.stdout.startswith("slower: step time")
    assert "launch_bound appeared" in back.stdout


def test_a_planted_problem_appears_in_the_why() -> None:
    host = SAMPLES / "planted" / "planted_host_bound" / "planted_host_bound.sqlite"
    d = tracekit.diff(CLEAN, host, levels=("step",))
    assert d.headline()["verdict"] == "slower"  # type: ignore[index]
    row = d.findings.filter(pl.col("category") == "host_bound").row(0, named=True)
    assert row["change"] == "appeared" and row["severity_after"] == "high"
    assert d.why_lines()[0].startswith("host_bound appeared")
    quiet = tracekit.diff(CLEAN, CLEAN, levels=("step",))
    assert quiet.headline()["verdict"] == "no change" and quiet.why_lines() == []  # type: ignore[index]
    assert tracekit.diff(CLEAN, CLEAN, levels=("step",), findings=False).findings.height == 0
