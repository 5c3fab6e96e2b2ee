"""tracekit.diagnose on the planted-problem captures (sample_traces/planted, H100) and the
other samples: each rule fires on its own trace, ranks its problem first or second, stays
quiet on the clean runs; time-at-stake estimates are recomputed here from the export by hand
(plain SQL and Python, not tracekit's analyses)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit.diagnosis import DiagnoseConfig, diagnose
from tracekit.diagnosis.result import fmt_ns

from .conftest import (
    ROOT,
    SAMPLES,
    growth_moved_into_layer,
    llm_capture,
    llm_capture_names,
    union_ns,
)

PLANTED = SAMPLES / "planted"


def _export(name: str) -> Path:
    return PLANTED / f"planted_{name}" / f"planted_{name}.sqlite"


def _categories(d, severities=("high", "medium", "low")) -> list[str]:  # type: ignore[no-untyped-def]
    f = d.findings.filter(pl.col("severity").is_in(list(severities)))
    return f["category"].to_list()


@pytest.mark.parametrize(
    ("name", "category"),
    [
        ("host_bound", "host_bound"),
        ("launch_bound", "launch_bound"),
        ("sync_stall", "sync_stall"),
        ("pageable_memcpy", "pageable_memcpy"),
        ("no_tensor_cores", "no_tensor_cores"),
        ("memory_growth", "memory_growth"),
    ],
)
def test_planted_problem_ranked_first_or_second(name: str, category: str) -> None:
    d = diagnose(_export(name))
    cats = _categories(d)
    assert category in cats[:2], f"{name}: {cats}"
    row = d.findings.filter(pl.col("category") == category).row(0, named=True)
    assert row["severity"] in ("high", "medium")
    assert row["advice"] and row["next"], "every finding says what to try and what to run next"
    assert row["evidence"] and isinstance(row["evidence"][0], dict), "the evidence rows are there, as structs"


@pytest.mark.parametrize("name", ["clean", "clean_nonvtx"])
def test_clean_runs_raise_nothing(name: str) -> None:
    d = diagnose(_export(name))
    assert _categories(d) == [], d.to_text()
    assert d.window.steps >= 10 and d.window.warmup_steps == 1


def test_window_from_nvtx_excludes_warmup_by_hand() -> None:
    """The window starts at step.1 (step.0 pays for cuBLAS start-up) and ends with the last
    step's GPU work: recomputed from NVTX_EVENTS and the kernels launched inside the steps."""
    path = _export("host_bound")
    d = diagnose(path)
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    steps = con.execute(
        "SELECT n.text, n.start, n.end FROM NVTX_EVENTS n WHERE n.text LIKE 'step.%' ORDER BY n.start"
    ).fetchall()
    gpu_end_of = lambda r: con.execute(  # noqa: E731
        "SELECT max(k.end) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
        "ON r.correlationId = k.correlationId WHERE r.start >= ? AND r.start <= ?", (r[1], r[2]),
    ).fetchone()[0]
    warm_end = gpu_end_of(steps[0])
    last_gpu_end = con.execute(
        "SELECT max(k.end) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
        "ON r.correlationId = k.correlationId WHERE r.start >= ? AND r.start <= ?",
        (steps[-1][1], steps[-1][2]),
    ).fetchone()[0]
    con.close()
    assert d.window.method == "nvtx"
    assert d.window.warmup_steps == 1 and d.window.steps == len(steps) - 1
    # the window opens at step.1 on the host, or when step.0's GPU work is over if later
    assert d.window.start_ns == max(steps[1][1], warm_end)
    assert d.window.end_ns == max(last_gpu_end, steps[-1][2])


def test_window_from_kernel_loop_matches_nvtx_steps() -> None:
    """Without NVTX the kernel loop gives the same steps: 12 iterations of as many operations
    as the NVTX steps of the same program launch (the step's only once-per-step operation, a
    device-to-device copy, marks it), the first one warm-up, and a median step within 5 % of
    the NVTX-delimited run."""
    d = diagnose(_export("clean_nonvtx"))
    ref = diagnose(_export("clean"))
    assert d.window.method == "kernel_loop"
    its = d.window.iterations
    per_step = set(ref.window.iterations["ops"].to_list())
    assert len(per_step) == 1
    assert its.height == 12 and set(its["kernels"].to_list()[1:]) == per_step
    assert d.window.steps == 11
    assert abs(d.window.step_ns - ref.window.step_ns) / ref.window.step_ns < 0.05  # type: ignore[operator]


def test_host_bound_time_by_hand() -> None:
    """host_bound's time = GPU idle gaps in the window whose next kernel's launch call began
    after the gap began, with the host outside CUDA calls: recomputed from the raw tables as
    the union of GPU work's holes ≥ 10 µs, minus the gaps covered by CUDA calls."""
    path = _export("host_bound")
    d = diagnose(path)
    row = d.findings.filter(pl.col("category") == "host_bound").row(0, named=True)
    assert "prepare_batch" in row["title"]
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    ops = con.execute(
        "SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMCPY "
        "UNION ALL SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMSET ORDER BY 1"
    ).fetchall()
    ranges = con.execute("SELECT start, end FROM NVTX_EVENTS WHERE text = 'prepare_batch'").fetchall()
    con.close()
    w0, w1 = d.window.start_ns, d.window.end_ns
    gaps, end = [], None
    for s, e in ops:
        if end is not None and s - end >= 10_000:
            gaps.append((max(end, w0), min(s, w1)))
        end = e if end is None else max(end, e)
    gaps = [(a, b) for a, b in gaps if b > a]
    # the planted Python work: gaps that overlap a prepare_batch range
    planted = sum(b - a for a, b in gaps if any(r0 < b and r1 > a for r0, r1 in ranges))
    assert planted > 0
    # tracekit's estimate covers the planted gaps and little else (the other gaps are launch latencies)
    assert planted <= row["time_ns"] <= 1.05 * planted
    assert row["share"] == pytest.approx(row["time_ns"] / d.window.duration_ns)


def test_pageable_memcpy_time_by_hand() -> None:
    """The planted 32 MiB pageable uploads: count, bytes and GPU time from the raw memcpy table
    (copyKind 1 = HtoD, srcKind 0 = pageable) inside the window; no kernel runs under them."""
    path = _export("pageable_memcpy")
    d = diagnose(path)
    row = d.findings.filter(pl.col("category") == "pageable_memcpy").row(0, named=True)
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = con.execute(
        "SELECT start, end, bytes FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 1 AND srcKind = 0 AND start >= ? AND start < ?",
        (d.window.start_ns, d.window.end_ns),
    ).fetchall()
    con.close()
    assert len(rows) == d.window.steps
    assert all(b == 32 << 20 for _, _, b in rows)
    by_hand = sum(e - s for s, e, _ in rows)
    assert row["time_ns"] == pytest.approx(by_hand, rel=0.02)


def test_no_tensor_cores_by_name_and_metrics() -> None:
    """The fp32 GEMMs are CUTLASS SIMT kernels; GPU metrics show Tensor Active ~0 while they run."""
    d = diagnose(_export("no_tensor_cores"))
    i = d.findings["category"].to_list().index("no_tensor_cores")
    ev = d.evidence(i)
    assert ev["launches"].sum() == d.window.steps * 8  # 4 layers x 2 GEMMs per steady step
    assert "simt_sgemm" in ev["name"][0]
    cfg = DiagnoseConfig(tensor_speedup=4.0)
    d4 = diagnose(_export("no_tensor_cores"), config=cfg)
    t2 = d.findings.filter(pl.col("category") == "no_tensor_cores")["time_ns"][0]
    t4 = d4.findings.filter(pl.col("category") == "no_tensor_cores")["time_ns"][0]
    assert t4 == pytest.approx(t2 * (0.75 / 0.5), rel=1e-6)
    assert diagnose(_export("clean")).findings.filter(pl.col("category") == "no_tensor_cores").height == 0


def test_memory_growth_slope_by_hand() -> None:
    d = diagnose(_export("memory_growth"))
    i = d.findings["category"].to_list().index("memory_growth")
    ev = d.evidence(i)
    deltas = ev["delta_bytes"].drop_nulls()
    assert (deltas == 64 << 20).mean() >= 0.75  # the planted 64 MiB per step
    assert "64.0 MiB per step" in d.findings["title"][i]
    assert d.findings["time_ns"][i] is None


def test_memory_growth_names_the_range_it_happens_in(tmp_path: Path) -> None:
    """The planted growth is a 64 MiB allocation per step after the layers: no range inside
    the steps grows. On a copy where each of them is moved into its step's ``layer.2``
    range, the title names that range (from layer_memory)."""
    d = diagnose(_export("memory_growth"))
    title = d.findings.filter(pl.col("category") == "memory_growth")["title"][0]
    assert "no NVTX range inside the steps grows" in title
    copy = tmp_path / "growth_in_layer2.sqlite"
    moved = growth_moved_into_layer(_export("memory_growth"), copy)
    assert moved >= 10
    d = diagnose(copy)
    row = d.findings.filter(pl.col("category") == "memory_growth").row(0, named=True)
    assert "64.0 MiB per step" in row["title"] and "100% of it inside NVTX range 'layer.2'" in row["title"]


def test_launch_bound_counts() -> None:
    d = diagnose(_export("launch_bound"))
    row = d.findings.filter(pl.col("category") == "launch_bound").row(0, named=True)
    # 4 layers x (30 x 2 elementwise + 1 add) = 244 kernels per step
    assert "244 kernels per step" in row["title"]


def test_sync_stall_counts() -> None:
    d = diagnose(_export("sync_stall"))
    i = d.findings["category"].to_list().index("sync_stall")
    ev = d.evidence(i)
    sync = ev.filter(pl.col("name").str.contains("StreamSynchronize"))
    assert sync["calls"][0] == 4 * d.window.steps  # one .item() per layer


def test_communication_on_tp_sample() -> None:
    """Two ranks in one report: exposed communication per GPU from the overlap breakdown."""
    d = diagnose(SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite")
    cats = d.findings["category"].to_list()
    assert "exposed_communication" in cats
    ev = d.evidence(cats.index("exposed_communication"))
    assert ev.height == 2 and (ev["communication_only_ns"] <= ev["communication_ns"]).all()
    # the two TP ranks compute the same (decode, split evenly): load_imbalance stays quiet
    from tracekit.analysis.comm import activity_segments, categorize_ops, overlap_breakdown

    t = tracekit.open(SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite")
    k = t.kernels.filter((pl.col("start_ns") >= d.window.start_ns) & (pl.col("start_ns") < d.window.end_ns))
    br = overlap_breakdown(activity_segments(categorize_ops(k), start_ns=d.window.start_ns, end_ns=d.window.end_ns))
    compute = (br["compute_only_ns"] + br["overlap_ns"]).to_list()
    assert (max(compute) - min(compute)) / max(compute) < 0.10 and "load_imbalance" not in cats


def test_per_rank_set_and_ncu() -> None:
    s = tracekit.open_many(sorted((SAMPLES / "llm_tp2_nccl_per_rank").glob("*.sqlite")))
    d = diagnose(s)
    assert d.window.steps > 0
    d2 = diagnose(SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite",
                  ncu=SAMPLES / "ncu" / "ncu_decode_drilldown" / "ncu_decode_drilldown.ncu-rep")
    assert d2.findings.height > 0


@pytest.mark.parametrize("path", sorted(p for p in SAMPLES.rglob("*.sqlite") if "per_rank" not in p.name), ids=lambda p: p.stem)
def test_every_sample_diagnoses(path: Path) -> None:
    d = diagnose(path)
    f = d.findings
    assert f.columns == ["category", "severity", "time_ns", "share", "title", "evidence", "advice", "next"]
    assert set(f["severity"]) <= {"high", "medium", "low", "info"}
    payload = json.loads(d.to_json())
    assert payload["window"]["method"] in ("nvtx", "forwards", "graph_replays", "kernel_loop", "whole_trace")
    assert d.to_markdown().startswith("# Diagnosis")


def test_cli_formats_and_errors(tmp_path: Path) -> None:
    exe = [sys.executable, "-m", "tracekit.cli.main", "diagnose"]
    out = subprocess.run([*exe, str(_export("host_bound")), "--format", "json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    payload = json.loads(out.stdout)
    assert payload["findings"][0]["category"] == "host_bound"
    assert set(payload) == {"trace", "structure", "window", "phases", "training", "periodic", "findings"}
    assert payload["structure"]["kind"] == "unknown" and payload["structure"]["steady_iterations"] == payload["window"]["steps"]
    bad = subprocess.run([*exe, str(_export("host_bound")), "--set", "nope=1"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "unknown diagnosis setting" in bad.stderr
    md = subprocess.run([*exe, str(_export("launch_bound")), "-f", "markdown"], capture_output=True, text=True, timeout=300)
    assert md.returncode == 0 and "launch_bound" in md.stdout


def test_no_tensor_cores_from_ncu_tensor_pipe() -> None:
    """With an ncu report, a GEMM whose tensor pipe is idle is named by the report. The
    precision probe (H200) profiled an fp32 GEMM with TF32 off (`sm80_xmma_gemm_f32f32_f32f32…`,
    tensor pipe 0.0003 %) next to tensor-core GEMMs; the rule matches by kernel name, so the
    probe's report is paired here with the planted fp32 trace of the same kernel family."""
    from tracekit.analysis.ncu_views import tensor_core_utilization

    rep = tracekit.open(SAMPLES / "ncu" / "ncu_precisions" / "ncu_precisions.ncu-rep")
    tcu = tensor_core_utilization(rep)
    fp32 = tcu.filter(pl.col("nvtx_path") == "prec/fp32_simt").row(0, named=True)
    assert fp32["tensor_pipe_pct"] < 0.01 and "f32f32_f32f32" in fp32["short_name"]
    from tracekit.diagnosis.rules_gpu import SIMT_GEMM_PATTERN

    names = tcu.with_columns(pl.col("short_name").str.contains(SIMT_GEMM_PATTERN).alias("simt"))
    # the name rule flags exactly the GEMMs whose tensor pipe idled
    assert names.filter(pl.col("simt"))["short_name"].to_list() == [fp32["short_name"]]
    d = diagnose(_export("clean"), ncu=rep)  # bf16 nvjet GEMMs: tensor pipe ~90 % in the report
    assert d.findings.filter(pl.col("category") == "no_tensor_cores").height == 0


def test_sampled_window_estimates_the_whole_window() -> None:
    """Big traces are analysed on consecutive steady steps from the middle of the window and
    scaled (steps ÷ sampled steps). Forced on the launch-bound capture (11 steady steps, 4
    sampled; iterations measured for a subset only): same categories, launch_bound's time
    within 10 % of the exact run's."""
    exact = diagnose(_export("launch_bound"))
    cfg = DiagnoseConfig(max_window_ops=500, sample_steps=4, exact_steps=6)
    sampled = diagnose(_export("launch_bound"), config=cfg)
    w = sampled.window
    assert w.sampled and w.sample_steps == 4 and w.steps == exact.window.steps
    assert w.scale == pytest.approx(exact.window.steps / 4)
    assert exact.window.start_ns <= w.sample_start_ns < w.sample_end_ns <= exact.window.end_ns  # type: ignore[operator]
    t_exact = exact.findings.filter(pl.col("category") == "launch_bound")["time_ns"][0]
    t_sampled = sampled.findings.filter(pl.col("category") == "launch_bound")["time_ns"][0]
    assert t_sampled == pytest.approx(t_exact, rel=0.10)
    assert _categories(sampled) == _categories(exact)
    assert "from its middle" in sampled.window_text()


def test_ncu_bound_kernels_by_hand() -> None:
    """With the ncu report of the same program (20 kernels of step 3 of planted_clean,
    H100): the clean run stays quiet (its GEMMs reach 84–88 % of peak compute), and with the
    bar raised to 90 % the GEMM is a compute-bound kernel whose time at stake is its window
    time × (1 − mean sm__throughput / 100), recomputed from ncu's raw CSV and plain SQL."""
    import csv

    ncu_dir = SAMPLES / "ncu" / "ncu_planted_clean"
    rep = ncu_dir / "ncu_planted_clean.ncu-rep"
    quiet = diagnose(_export("clean"), ncu=rep)
    assert _categories(quiet) == []
    d = diagnose(_export("clean"), ncu=rep, config=DiagnoseConfig(efficiency_min=0.9))
    row = d.findings.filter(pl.col("category") == "compute_bound_kernel").row(0, named=True)
    with (ncu_dir / "ncu_planted_clean.raw.csv").open() as fh:
        rows = list(csv.reader(fh))
    head, body = rows[0], rows[2:]  # row 1 holds the units
    name, sm = head.index("Kernel Name"), head.index("sm__throughput.avg.pct_of_peak_sustained_elapsed")
    pct = [float(r[sm]) for r in body if r[name].startswith("nvjet")]
    assert len(pct) == 8
    con = sqlite3.connect(f"file:{_export('clean')}?mode=ro", uri=True)
    t = con.execute(
        "SELECT sum(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
        "WHERE s.value LIKE 'nvjet%' AND k.start >= ? AND k.start < ?", (d.window.start_ns, d.window.end_ns),
    ).fetchone()[0]
    con.close()
    # the CSV prints the percentages rounded (6 digits): agreement to 1e-4
    assert row["time_ns"] == pytest.approx(t * (1 - sum(pct) / len(pct) / 100), rel=1e-4)


def _all_exports() -> list[Path]:
    from .conftest import NSYS_CORPUS

    return [*sorted(p for p in SAMPLES.rglob("*.sqlite") if "per_rank" not in p.name), *sorted(NSYS_CORPUS.glob("*.sqlite"))]


@pytest.mark.filterwarnings("ignore::tracekit.nsys.trace.IncompleteTraceWarning")  # the cardiac export says it lacks CUDA
@pytest.mark.parametrize("path", _all_exports(), ids=lambda p: p.stem)
def test_the_three_commands_on_every_export(path: Path) -> None:
    """diagnose, diff (a run against itself) and the model comparison answer on every sample and
    corpus export: a result, or an info row / empty frame that says why."""
    from tracekit.model import compare

    d = diagnose(path)
    assert d.findings.height >= 0 and d.window.method in ("nvtx", "forwards", "graph_replays", "forward_passes", "kernel_loop", "whole_trace")
    assert all(f.title for f in d.items)
    diff = tracekit.diff(path, path)
    assert all(set(frame["verdict"]) <= {"no change"} for frame in diff.levels.values())
    cmp = compare(tracekit.open(path), ROOT / "configs" / "models" / "tinyllm_decode.yaml")
    assert cmp.height == 0 or (cmp["measured_ns"] > 0).all()


def test_pageable_uncovered_time_equals_activity_segments() -> None:
    """pageable_memcpy's sorted-union arithmetic gives what activity_segments' memcpy state gives."""
    from tracekit.analysis.comm import activity_segments, categorize_ops, overlap_breakdown
    from tracekit.analysis.memory import copies
    from tracekit.diagnosis.rules_host import _uncovered_ns

    d = diagnose(_export("pageable_memcpy"))
    t = tracekit.open(_export("pageable_memcpy"))
    w = d.window
    k = t.kernels.filter((pl.col("start_ns") >= w.start_ns) & (pl.col("start_ns") < w.end_ns))
    m = t.memcpys.filter((pl.col("start_ns") >= w.start_ns) & (pl.col("start_ns") < w.end_ns))
    bad = copies(m, t.cuda_api).filter(pl.col("pageable").fill_null(False) & pl.col("copy_kind").is_in(["HtoD", "DtoH"]))
    seg = overlap_breakdown(activity_segments(categorize_ops(k, bad), start_ns=w.start_ns, end_ns=w.end_ns))
    assert _uncovered_ns(bad, k, w.start_ns, w.end_ns) == int(seg["memcpy_ns"].sum())


def test_straggler_on_the_tp2_capture() -> None:
    """One report, two ranks: rank 0 samples and sends the token ids, so it reaches the
    collectives last — collective_skew's straggler_rank, recounted here."""
    from tracekit.analysis.ranks import collective_skew, match_collectives

    path = SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"
    d = diagnose(path)
    row = d.findings.filter(pl.col("category") == "straggler").row(0, named=True)
    sk = collective_skew(match_collectives(tracekit.open(path).nccl))
    sk = sk.filter((pl.col("last_start_ns") >= d.window.start_ns) & (pl.col("first_start_ns") < d.window.end_ns))
    last0 = sk.filter(pl.col("straggler_rank") == 0)
    assert row["title"].startswith(f"Rank 0 starts last in {last0.height / sk.height:.0%}")
    # time at stake: of rank 1's waits for rank 0 (its collective kernel's start to rank 0's,
    # on its GPU), the part with no compute kernel running on that GPU, recounted by hand
    t = tracekit.open(path)
    matched = match_collectives(t.nccl)
    waits = matched.filter(pl.col("match_id").is_in(last0["match_id"].implode()) & (pl.col("wait_ns") > 0))
    w = d.window
    nccl = t.kernels.filter(pl.col("name").str.contains("nccl"))["correlation_id"]
    idle = 0
    for r in waits.iter_rows(named=True):
        a, b = max(r["start_ns"], w.start_ns), min(r["last_start_ns"], w.end_ns)
        if b <= a:
            continue
        k = t.kernels.filter((pl.col("device_id") == r["device_id"]) & ~pl.col("correlation_id").is_in(nccl.implode())
                             & (pl.col("end_ns") > a) & (pl.col("start_ns") < b) & (pl.col("start_ns") >= w.start_ns)
                             & (pl.col("start_ns") < w.end_ns))
        busy = union_ns(k.select("start_ns", "end_ns").rows(), a, b)
        idle += (b - a) - busy
    assert row["time_ns"] == idle <= int(last0["skew_ns"].sum())  # decode: the waiting GPU has nothing else to run
    assert "with nothing else running on the waiting GPU" in row["title"]


def test_the_straggler_leads_what_it_causes() -> None:
    """The rank that waits for the straggler (rank 1, GPU 1) shows its waits as exposed
    communication: the straggler is listed before it, as the cause, and the effect's title says
    whom it waits for; the host-bound finding on the straggler's own GPU 0 (rank 0 samples the
    tokens) is its cause and keeps its place."""
    d = diagnose(SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite")
    order = d.findings["category"].to_list()
    assert order.index("straggler") < order.index("exposed_communication")
    exposed = d.findings.filter(pl.col("category") == "exposed_communication").row(0, named=True)
    assert exposed["title"].endswith("— waiting for rank 0, the straggler") and "device_id 1" in exposed["title"]
    host = d.findings.filter(pl.col("category") == "host_bound").row(0, named=True)
    assert "straggler" not in host["title"] and order.index("host_bound") < order.index("straggler")
    assert d.findings.filter(pl.col("category") == "straggler")["title"][0].endswith(
        "the waiting shows as exposed communication on the other rank(s)")


def test_findings_read_as_a_list_in_a_pipe_or_a_narrow_terminal() -> None:
    """Issue 27 §3: piped (a CI log), `tracekit diagnose` and summary's findings print a list —
    header line, title, evidence, advice and the next commands as indented lines wrapped to the
    width — not a six-column table that wraps its advice to a word per line; `-f table` keeps
    the table. Checked on the planted host-bound capture and the HF generate() capture."""
    import os

    exe = [sys.executable, "-m", "tracekit.cli.main"]
    for path in (_export("host_bound"), llm_capture("hf_generate_eager")):
        d = diagnose(path)
        out = subprocess.run([*exe, "diagnose", str(path)], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert not any(ch in out.stdout for ch in "┃│┏"), "no table borders"
        heads = [ln for ln in lines if ln[:1].isdigit()]
        assert [h.split()[1] for h in heads] == [f.severity.upper() for f in d.items]
        assert [h.split()[2] for h in heads] == [f.category for f in d.items]
        first = d.items[0]
        assert f"({first.share:.1%} of the window)" in heads[0]
        # wrapped to the width (100 in a pipe), commands left whole so that they can be copied
        assert all(len(ln) <= 100 for ln in lines if not ln.lstrip().startswith(("next:", "$")))
        assert any(ln.startswith("   try: ") for ln in lines) and any(ln.startswith("   next: $ ") for ln in lines)
        assert "   evidence: " in out.stdout and "Diagnosis.evidence(0)" in out.stdout
        for c in first.next:
            assert f"$ {c}" in out.stdout
        # a finding takes under twenty lines, not 40+
        blocks = out.stdout.split("\n\n")[1:]
        assert blocks and max(len(b.splitlines()) for b in blocks) <= 20
    table = subprocess.run([*exe, "diagnose", str(_export("host_bound")), "-f", "table"], capture_output=True, text=True,
                           timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert table.returncode == 0 and "what to try / next" in table.stdout
    summ = subprocess.run([*exe, "summary", str(_export("host_bound"))], capture_output=True, text=True, timeout=300)
    assert summ.returncode == 0 and "0. HIGH  host_bound" in summ.stdout and "top findings (tracekit diagnose" in summ.stdout
    bad = subprocess.run([*exe, "diagnose", str(_export("host_bound")), "-f", "wide"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "auto, table, list, json, markdown" in bad.stderr


def test_to_list_wraps_to_the_width_asked() -> None:
    d = diagnose(_export("launch_bound"))
    text = d.to_list(width=60)
    assert all(len(ln) <= 60 for ln in text.splitlines() if not ln.lstrip().startswith(("next:", "$")))
    assert text.splitlines()[0] == f"tracekit diagnose: {d.trace_name}"
    assert d.to_list(1).count("\n0. ") == 1 and "\n1. " not in d.to_list(1)


def test_notebook_display_is_one_card_per_finding() -> None:
    """Issue 27 §6: in Jupyter a Diagnosis displays as cards (severity, category, time at stake
    with a bar for its share, the whole title, evidence summary, advice, next commands, evidence
    rows behind a disclosure) and a bar of where the window goes, whose busy time equals the
    union of the GPU's work in the window recomputed from the export by SQL."""
    import html as html_mod
    import re
    import sqlite3

    path = _export("host_bound")
    d = diagnose(path)
    page = d._repr_html_()
    cards = re.findall(r"<div class='tk-finding' data-category='([^']+)' data-severity='([^']+)'", page)
    assert cards == [(f.category, f.severity) for f in d.items]
    for f in d.items:
        assert html_mod.escape(f.title) in page and html_mod.escape(f.advice) in page
        for c in f.next:
            assert f"$ {html_mod.escape(c)}" in page
        if f.share is not None:
            assert f"width:{max(min(f.share, 1.0), 0.0) * 100:.2f}%" in page
        if f.evidence.height:
            assert f"<summary>{f.evidence.height} evidence row(s)</summary>" in page
    # the window bar: busy time of the GPU = union of its kernels, copies and memsets in the window
    w = d.window
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = con.execute(" UNION ALL ".join(f"SELECT start, end FROM {t}" for t in (
        "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"))).fetchall()
    con.close()
    busy = union_ns(rows, w.start_ns, w.end_ns)
    g = d.gpu_time.row(0, named=True)
    assert g["busy_ns"] == busy and g["window_ns"] == w.end_ns - w.start_ns
    idle = w.end_ns - w.start_ns - busy
    assert f"GPU idle {fmt_ns(idle)} ({idle / (w.end_ns - w.start_ns):.0%})" in page
    clean = diagnose(_export("clean"))
    assert "tk-finding" in clean._repr_html_() or "No findings" in clean._repr_html_()


def test_diff_displays_the_verdict_first() -> None:
    d = tracekit.diff(_export("clean"), _export("host_bound"), levels=("step", "kernel"))
    page = d._repr_html_()
    import html as html_mod

    assert page.index(html_mod.escape(d.verdict_line())) < page.index("Why") < page.index("<details")
    assert "host_bound appeared" in page


def test_a_step_loop_is_not_called_a_generation() -> None:
    """Steps named step.N with no prefill are not decode steps: no phases line, no time per
    output token (the planted loops and the training capture); a generate() trace keeps them."""
    from tracekit.analysis.run.phases import phase_summary, trace_generation_steps

    for path in (_export("host_bound"), SAMPLES / "llm_train_emit_nvtx_1gpu" / "llm_train_emit_nvtx_1gpu.sqlite"):
        d = diagnose(path)
        assert d.phases.height == 0 and "phases" not in d.window_text()
        assert phase_summary(trace_generation_steps(tracekit.open(path))).height == 0


def test_phases_do_not_depend_on_group_order_or_held_tables() -> None:
    """Two processes with as many steps (custom_allreduce_2gpu: one per GPU) tie; the pick of
    the main process and of the busiest device is fixed (lowest pid/device), so the steps are
    the same in every run and whichever tables the trace already holds (a group-by's row order
    had made the first step's time 444 µs or 2.43 ms from one call to the next). The run is a
    collective microbenchmark: no generation phases (its heavy first iteration is no prompt)."""
    from tracekit.analysis.run.phases import generation_steps
    from tracekit.diagnosis.config import DiagnoseConfig
    from tracekit.diagnosis.context import Context

    path = ROOT / "sample_traces" / "custom_allreduce_2gpu" / "custom_allreduce_2gpu.sqlite"
    ctx = Context(tracekit.open(path), DiagnoseConfig())
    ctx.prepare_reads()
    # tokens=True: as if the steps made tokens, so that there are steps to compare
    runs = {generation_steps(ctx.ops_with_launch, ctx.nvtx, ctx.graph_launches, tokens=True).to_dicts().__repr__() for _ in range(12)}
    assert len(runs) == 1
    fresh = tracekit.diagnose(tracekit.open(path))
    held = tracekit.open(path)
    _ = held.kernels, held.memcpys
    again = tracekit.diagnose(held)
    assert fresh.structure.kind == again.structure.kind == "microbenchmark"
    assert fresh.phases.height == 0 and again.phases.height == 0
    assert fresh.window.start_ns == again.window.start_ns and fresh.window.end_ns == again.window.end_ns
    # the first process (lowest pid) is the one measured: its first step's busy time, 245,696 ns
    # by hand in SQL (union of its 6 kernels, copies and memsets launched inside iter.2)
    steps = generation_steps(ctx.ops_with_launch, ctx.nvtx, ctx.graph_launches, tokens=True)
    assert steps["gpu_busy_ns"].to_list()[0] == 245696
    assert generation_steps(ctx.ops_with_launch, ctx.nvtx, ctx.graph_launches).height == 0


@pytest.mark.parametrize("name", ["llm_decode_1gpu", "custom_allreduce_2gpu", "llm_tp2_nccl", *[f"stack:{n}" for n in llm_capture_names()]])
def test_phases_from_the_narrow_launch_join_equal_the_whole_join(name: str) -> None:
    """Context.phases joins only the columns generation_steps reads; its steps equal those
    of the whole ops_with_launch (HF generate, CUDA graph replays, compiled decode, TP)."""
    from tracekit.analysis.run.phases import generation_steps
    from tracekit.diagnosis.config import DiagnoseConfig
    from tracekit.diagnosis.context import Context

    path = llm_capture(name.split(":", 1)[1]) if name.startswith("stack:") else ROOT / "sample_traces" / name / f"{name}.sqlite"
    ctx = Context(tracekit.open(path), DiagnoseConfig())
    ctx.prepare_reads()
    narrow = generation_steps(ctx._phase_ops(), ctx.nvtx, ctx.graph_launches)
    assert "ops_with_launch" not in ctx.__dict__  # the whole join was not built for it
    whole = generation_steps(ctx.ops_with_launch, ctx.nvtx, ctx.graph_launches)
    assert narrow.equals(whole)


@pytest.mark.parametrize("name", ["host_bound", "sync_stall", "launch_bound"])
def test_calls_during_the_gaps_by_hand(name: str) -> None:
    """host_bound's 'inside <call>' reads _calls_during: per call name, the time of each call
    inside each of the device's gaps, summed. Here every (gap, call) pair is walked in Python
    on the window's real calls, on the rule's named gaps and on every gap of the device."""
    from tracekit.diagnosis.config import DiagnoseConfig
    from tracekit.diagnosis.context import Context
    from tracekit.diagnosis.rules_host import _calls_during, _main_gaps
    from tracekit.diagnosis.window import search_window

    ctx = Context(tracekit.open(_export(name)), DiagnoseConfig())
    ctx.prepare_reads()
    ctx.full_window = search_window(ctx)
    ctx.window = ctx.full_window.analysed()
    gaps = _main_gaps(ctx)
    dev = gaps.filter(pl.col("device_id") == gaps["device_id"][0])
    assert dev.height > 1
    calls = ctx.api_w.select("name", "start_ns", "end_ns").rows()
    for chosen in (dev, dev.sort("duration_ns", descending=True).head(5)):
        pairs: dict[str, list[int]] = {}
        for g0, g1 in chosen.select("start_ns", "end_ns").rows():
            for nm, s, e in calls:
                ov = min(e, g1) - max(s, g0)
                if ov > 0:
                    p = pairs.setdefault(nm.split("_v")[0] if "_v" in nm else nm, [0, 0])
                    p[0] += 1
                    p[1] += ov
        got = _calls_during(ctx, chosen)
        assert pairs, "the gaps hold some call time"
        assert {r["name"]: [r["calls"], r["overlap_ns"]] for r in got.iter_rows(named=True)} == pairs
        top = max(pairs.values(), key=lambda p: p[1])[1]
        assert got["overlap_ns"][0] == top


@pytest.mark.parametrize("name", ["host_bound", "sync_stall", "pageable_memcpy"])
def test_idle_gaps_next_operation_and_its_launch_by_hand(name: str) -> None:
    """Each idle gap names the operation that ends it and the call that launched it: here the
    operations starting at each gap's end on the device (one of them, when several start
    together), looked up in the whole ops table joined with every launch (idle_gaps joins
    only the gaps' operations)."""
    from tracekit.analysis.attribution import launch_info
    from tracekit.analysis.gpu_time import idle_gaps
    from tracekit.diagnosis.config import DiagnoseConfig
    from tracekit.diagnosis.context import Context

    ctx = Context(tracekit.open(_export(name)), DiagnoseConfig())
    ops = ctx.ops
    gaps = idle_gaps(ops, ctx.cuda_api)
    assert gaps.height > 10
    whole = launch_info(ops, ctx.cuda_api).with_row_index("_r")
    for g in gaps.iter_rows(named=True):
        at = whole.filter((pl.col("device_id") == g["device_id"]) & (pl.col("start_ns") == g["end_ns"]))
        assert at.height >= 1
        assert (g["next_op"], g["next_api"], g["next_launched_ns"]) in set(at.select("name", "api_name", "api_start_ns").rows())
