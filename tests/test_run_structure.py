"""The structure of runs as users run them (issue 36), on whole-run captures of real programs
(sample_traces/run_structure, two H200s): data-parallel training over torchrun without NVTX
(DDP, FSDP2 per rank, and a planted all-reduce after backward), HF generate() called three
times (plain and with --annotate-torch), a continuous-batching engine in-process and in a
forked child (followed or not), a compiled decode rewriting its KV cache, JAX and Triton
microbenchmarks; plus every other bundled capture and the public corpus.

Counts are checked against plain SQL on the exports, and times against what the captured
program printed about itself (its own host timers, in profile_log.txt): the ground truth an
expert reading of the timeline has to match (docs/diagnose.md, "Run structure")."""

from __future__ import annotations

import functools
import json
import sqlite3
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import tracekit
from tracekit.analysis.run.loops import find_loops, main_loop, token_loop
from tracekit.stats import run_report

from .conftest import (
    NSYS_CORPUS,
    ROOT,
    RUN_STRUCTURE,
    SAMPLES,
    llm_capture,
    run_capture,
    run_capture_log,
    run_capture_names,
)
from .nsys_reference import assert_same_as_nsys, read_reference

NAMES = run_capture_names()


def _file(name: str, rank: int | None = None) -> Path:
    folder = run_capture(name)
    return folder / (f"{name}_rank{rank}.sqlite" if rank is not None else f"{name}.sqlite")


@functools.cache
def _trace(name: str, rank: int | None = None):  # noqa: ANN202 - NsysTrace
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tracekit.open(_file(name, rank))


@functools.cache
def _structure(name: str, rank: int | None = None):  # noqa: ANN202
    return tracekit.structure(_trace(name, rank))


@functools.cache
def _diagnose(name: str, rank: int | None = None):  # noqa: ANN202
    return tracekit.diagnose(_trace(name, rank))


def _sql(name: str, query: str, rank: int | None = None) -> list[tuple]:
    con = sqlite3.connect(f"file:{_file(name, rank)}?mode=ro", uri=True)
    try:
        return con.execute(query).fetchall()
    finally:
        con.close()


def _log(name: str) -> dict:  # type: ignore[type-arg]
    """The captured program's final JSON line (rank 0's summary)."""
    return run_capture_log(name)[-1]


def test_the_captures_are_there() -> None:
    assert sorted(["compile_where_decode", "hf_generate_calls", "hf_generate_calls_annotated", "microbench_jax",
                            "microbench_triton", "serve_cb_1gpu", "serve_child_follow", "serve_child_nofollow", "train_ddp_2gpu",
                            "train_ddp_exposed_2gpu", "train_fsdp2_2gpu"]) == NAMES


# -- the capturing nsys's own statistics: tracekit prints the same -----------------------------------
def _stats_cases() -> list[tuple[str, str, str]]:
    cases = []
    for name in NAMES:
        for ref in sorted((run_capture(name) / "stats").glob("*.csv")):
            stem, report = ref.stem.split("_cuda_", 1) if "_cuda_" in ref.stem else ref.stem.split("_nvtx_", 1)
            report = ("cuda_" if "_cuda_" in ref.stem else "nvtx_") + report
            cases.append((name, stem, report))
    return cases


@pytest.mark.parametrize(("name", "stem", "report"), _stats_cases())
def test_stats_equal_the_capturing_nsys(name: str, stem: str, report: str) -> None:
    reference = read_reference(run_capture(name) / "stats" / f"{stem}_{report}.csv")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trace = tracekit.open(run_capture(name) / f"{stem}.sqlite")
    if not reference:  # nsys printed nothing (no NVTX, no kernels in the capture): tracekit says why
        from tracekit.errors import UnsupportedReportError

        with pytest.raises(UnsupportedReportError, match="NVTX|has no"):
            run_report(trace, report, convention="2025")
        return
    result = run_report(trace, report, convention="2025")
    assert_same_as_nsys(result, reference, ordered=report != "nvtx_sum")


@pytest.mark.parametrize(("name", "rank"), [("train_ddp_2gpu", None), ("train_fsdp2_2gpu", 0)])
def test_nvtx_projection_equals_nsys_2023(name: str, rank: int | None) -> None:
    """nvtx_gpu_proj_trace in nsys 2023.4.4's convention, byte for byte what that nsys printed
    (Debian's CPU-only build, run here on the export). The operations outside every NVTX range
    (NCCL's own ranges are the only NVTX here) get one row whose PID and TID are the main
    thread's although the last outside launch came from autograd's backward thread."""
    stem = f"{name}_rank{rank}" if rank is not None else name
    reference = read_reference(RUN_STRUCTURE / name / f"nsys2023.4_{stem}_nvtx_gpu_proj_trace.csv")
    report = run_report(_trace(name, rank), "nvtx_gpu_proj_trace", convention="2023")
    assert [report.columns, *report.formatted_rows()] == reference  # every cell, in nsys's order
    outside = report.frame.filter(pl.col("RangeId").is_null()).row(0, named=True)
    assert outside["TID"] == outside["PID"]


def test_every_capture_has_its_stats() -> None:
    assert len(_stats_cases()) == 7 * (len(NAMES) + 1)  # FSDP2: two per-rank reports


# -- training without NVTX ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["train_ddp_2gpu", "train_ddp_exposed_2gpu"])
def test_data_parallel_training_steps_from_the_kernels(name: str) -> None:
    """One report over torchrun, two ranks: each GPU's steps are the instances of the kernels
    that run once per step; their number is the loss kernel's count on that GPU (SQL), each
    step holds exactly one loss kernel, the first ones are warm-up, and the steady median is
    the program's own (host-timed, synchronised) step time within 3 %."""
    s = _structure(name)
    assert s.kind == "training" and s.method == "kernel_loop" and s.ranks == 2
    losses = dict(_sql(name, "SELECT k.deviceId, COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
                             "WHERE s.value LIKE 'nll_loss_forward%' GROUP BY 1"))
    assert losses == {0: 12, 1: 12}
    for dl in s.loops:
        dev = dl.keys["device_id"]
        assert dl.iterations.height == losses[dev]
        starts = [r[0] for r in _sql(name, "SELECT k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
                                           f"WHERE s.value LIKE 'nll_loss_forward%' AND k.deviceId = {dev} ORDER BY 1")]
        it = dl.iterations
        inside = [int(((it["start_ns"] <= t) & (it["end_ns"] > t)).sum()) for t in starts]
        assert inside == [1] * 12  # one loss per step
        assert dl.warmup in (1, 2)  # DDP's first step (bucket set-up), and the second on the slower start
    log = _log(name)
    program = float(np.median(log["step_ms"][2:]))
    assert s.warmup_steps == 2 and s.steps == 10
    assert abs(s.step_ns / 1e6 - program) / program < 0.03
    # start-up (model construction, NCCL set-up, the first step's cuBLAS/cuDNN heuristics) is
    # counted apart, never in the window
    assert s.startup_ns > 10e9 and s.start_ns > int(s.iterations["w_start"][1])
    assert any("backward kernels" in e for e in s.evidence) and any("gradient collectives" in e for e in s.evidence)


def test_fsdp2_per_rank_reports() -> None:
    """FSDP2, one nsys per rank: each report reads as training of 12 steps on its own GPU, the
    steady median within 4 % of the program's (the ranks wait for each other every step)."""
    log = _log("train_fsdp2_2gpu")
    program = float(np.median(log["step_ms"][1:]))
    for rank in (0, 1):
        s = _structure("train_fsdp2_2gpu", rank)
        assert s.kind == "training" and s.total == 12 and s.steps == 11
        assert abs(s.step_ns / 1e6 - program) / program < 0.04
        assert any("ReduceScatter" in e for e in s.evidence)


def test_fsdp2_folder_of_ranks_diagnoses() -> None:
    """The two per-rank reports as one set: the structure is found on every rank's GPU."""
    ts = tracekit.open_many(sorted(run_capture("train_fsdp2_2gpu").glob("*.sqlite")))
    s = tracekit.structure(ts)
    assert s.kind == "training" and s.ranks == 2 and s.total == 12


def test_training_breakdown_by_hand() -> None:
    """Each step's backward starts at its first backward-named kernel (the loss's
    ``SoftMaxBackward``, by SQL) and the phases add up to the step; DDP overlaps most of its
    gradient all-reduces with the backward, the planted loop after backward exposes them all."""
    from tracekit.analysis.comm import categorize_ops
    from tracekit.analysis.run.training import training_phases

    t = _trace("train_ddp_2gpu")
    s = _structure("train_ddp_2gpu")
    dl = s.loops[0]
    step = dl.iterations.row(dl.warmup + 3, named=True)
    ops = categorize_ops(t.kernels, t.memcpys, t.memsets)
    steps = pl.DataFrame([{**dl.keys, "step": step["iteration"], "start_ns": step["start_ns"], "end_ns": step["end_ns"]}])
    ph = training_phases(ops, steps).rows_by_key("phase", named=True, unique=True)
    dev = dl.keys["device_id"]
    (first_bwd,) = _sql("train_ddp_2gpu", "SELECT MIN(k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName "
                                          f"WHERE k.deviceId = {dev} AND k.start >= {step['start_ns']} AND k.start < {step['end_ns']} "
                                          "AND (s.value LIKE '%Backward%' OR s.value LIKE '%backward%' OR s.value LIKE '%bprop%' "
                                          "OR s.value LIKE '%grad_weight%' OR s.value LIKE '%grad_input%')")[0]
    assert ph["forward"]["end_ns"] == first_bwd == ph["backward"]["start_ns"]
    assert sum(ph[p]["window_ns"] for p in ph) == step["end_ns"] - step["start_ns"]
    for p in ph.values():
        assert p["compute_only_ns"] + p["overlap_ns"] + p["communication_only_ns"] + p["memcpy_ns"] + p["idle_ns"] == p["window_ns"]
    ddp = _diagnose("train_ddp_2gpu").training.rows_by_key("phase", named=True, unique=True)
    bad = _diagnose("train_ddp_exposed_2gpu").training.rows_by_key("phase", named=True, unique=True)
    assert ddp["backward"]["exposed_comm_ns"] < 0.5 * ddp["backward"]["communication_ns"]
    assert bad["backward"]["exposed_comm_ns"] >= 0.95 * bad["backward"]["communication_ns"] > 0


def test_training_throughput_and_mfu_by_hand() -> None:
    from tracekit.analysis.run.training import training_throughput

    log = _log("train_ddp_2gpu")
    tp = training_throughput(42.5e6, log["tokens_per_step"], params=log["params"], gpus=2, peak_flops=989e12)
    assert tp["tokens_per_s"] == pytest.approx(16384 / 0.0425)
    assert tp["mfu"] == pytest.approx(6 * 136328192 * 16384 / 0.0425 / (2 * 989e12))
    with pytest.raises(ValueError, match="positive"):
        training_throughput(0, 1)


def test_summary_prints_the_training_run() -> None:
    r = subprocess.run([sys.executable, "-m", "tracekit.cli.main", "summary", str(_file("train_ddp_2gpu")), "--findings", "0",
                        "--tokens-per-step", "16384", "--params", "136328192"],
                       capture_output=True, text=True, timeout=600, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert "training: 10 steady steps of 42.6 ms on 2 ranks, 2 warm-up, start-up 21.42 s not counted" in r.stdout
    assert "training step (median per step and GPU; read by launching thread)" in r.stdout and "MFU 15." in r.stdout


def test_exposed_all_reduce_is_what_diff_says_changed() -> None:
    d = tracekit.diff(_trace("train_ddp_2gpu"), _trace("train_ddp_exposed_2gpu"))
    assert d.headline()["verdict"] == "slower"
    grew = d.findings.filter(pl.col("category") == "exposed_communication").row(0, named=True)
    assert grew["change"] in ("grew", "appeared") and grew["severity_after"] == "high"
    assert d.runs["before"].startswith("training: ") and d.runs["after"].startswith("training: ")


# -- generate() called three times -----------------------------------------------------------------
@pytest.mark.parametrize("name", ["hf_generate_calls", "hf_generate_calls_annotated"])
def test_three_generate_calls_are_three_requests(name: str) -> None:
    """Three generate() calls of 32 tokens: three requests of a prefill and 31 decode steps
    (the prefill's attention kernel runs once per layer per call: 24 = 8 layers × 3, by SQL);
    the cold first call is set apart as warm-up; the steady figures are the measured calls':
    time per output token within 10 % of the program's, time to first token (on the GPU) below
    the program's (which also counts generate()'s set-up and the copy to the host)."""
    s = _structure(name)
    assert s.kind == "generation"
    # the prompt's attention (cuDNN's sm90 wgmma kernel; decode uses the sm80 one)
    (prefill_attn,) = _sql(name, "SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
                                 "WHERE s.value LIKE 'cudnn_generated_fort_native_sdpa_sm90%'")[0]
    assert prefill_attn == 24
    r = s.requests.sort("request")
    assert r.height == 3 and r["prefill_steps"].to_list() == [1, 1, 1] and r["decode_steps"].to_list() == [31, 31, 31]
    assert r["warmup"].to_list() == [True, False, False]
    calls = _log(name)["calls"]
    for got, want in zip(r.slice(1).iter_rows(named=True), calls[1:], strict=True):
        assert abs(got["tpot_median_ns"] / 1e6 - want["tpot_ms"]) / want["tpot_ms"] < 0.10
        assert got["ttft_ns"] / 1e6 < want["ttft_ms"]
    # the steady phases are the measured calls' only
    ph = _diagnose(name).phases.rows_by_key("phase", named=True, unique=True)
    assert ph["prefill"]["steps"] == 2 and ph["decode"]["steps"] == 62
    assert ph["decode"]["tpot_median_ns"] < 1.1 * max(c["tpot_ms"] for c in calls[1:]) * 1e6


def test_an_eager_generate_is_not_862_layer_steps() -> None:
    """Without per-forward ranges the steps are the forwards (one per token), not the layers."""
    s = _structure("hf_generate_calls")
    st = s.steps_table
    assert st.height == 96 and st.filter(pl.col("phase") == "decode").height == 93


# -- serving -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["serve_cb_1gpu", "serve_child_follow"])
def test_continuous_batching_engine(name: str) -> None:
    """An engine's steps end with the copy of the sampled tokens: their number is the
    program's (its warm-up's 4, the test request's and the load's steps); 14 prompts ran (the
    engine's own warm-up prompt of 64 tokens, the test request and 12 arrivals), some in the
    same step as others' decode; the engine's warm-up and the test request, alone before the
    client's pause, are set apart as warm-up."""
    log = _log(name)
    s = _structure(name)
    assert s.kind == "serving"
    assert s.steps_table.height == log["test_steps"] + log["load_steps"] + 4
    assert int(s.steps_table["prefills"].sum()) == 1 + len(log["test_request"]) + log["n_requests"] == 14
    warm = s.steps_table.filter(pl.col("warmup"))
    assert int(warm["prefills"].sum()) == 2
    # the engine's step interval is every running request's time per output token
    (copies,) = _sql(name, "SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 2")[0]
    assert copies == s.steps_table.height
    assert "continuous batching" in s.evidence[0]


def test_forked_engine_not_followed() -> None:
    """Without --trace-fork-before-exec the engine's kernels are not in the export, but the GPU
    metrics show its work: diagnose says so, names the engine's process (the program's own
    record of its pid) and how to capture it."""
    t = _trace("serve_child_nofollow")
    assert t.kernels.height == 0
    d = _diagnose("serve_child_nofollow")
    f = d.items[0]
    assert f.category == "trace_coverage" and f.severity == "high"
    assert f"python3 {_log('serve_child_nofollow')['engine_pid']}" in f.title
    assert any("--trace-fork-before-exec=true" in c for c in f.next)
    assert "no kernels" in d.structure.reason and "SMs active" in d.structure.evidence[0]


def test_metric_activity_by_hand() -> None:
    """Time with SMs active = the summed sample intervals whose SMs Active value is above 0
    (SQL over GPU_METRICS; the first interval one median period long)."""
    from tracekit.analysis.metrics import metric_activity

    name = "serve_child_nofollow"
    rows = _sql(name, "SELECT g.timestamp, g.value FROM GPU_METRICS g JOIN TARGET_INFO_GPU_METRICS m ON m.metricId = g.metricId "
                      "AND m.typeId = g.typeId WHERE m.metricName LIKE 'SMs Active%' ORDER BY g.timestamp")
    ts = np.array([r[0] for r in rows], dtype=np.int64)
    v = np.array([r[1] for r in rows], dtype=np.float64)
    dt = np.diff(ts, prepend=ts[0] - int(np.median(np.diff(ts))))
    act = metric_activity(_trace(name).gpu_metrics)
    row = act.row(0, named=True)
    assert row["active_ns"] == int(dt[v > 0].sum())
    assert row["sms_active_mean"] == pytest.approx(float((v * dt).sum() / dt.sum()))
    assert row["untraced_active_ns"] == row["active_ns"]  # nothing traced
    followed = metric_activity(_trace("serve_child_follow").gpu_metrics, _trace("serve_child_follow").kernels)
    assert followed["untraced_active_ns"][0] < 0.25 * followed["active_ns"][0]


# -- compiled decode that rewrites its cache ---------------------------------------------------------
def test_compiled_decode_rewriting_its_cache() -> None:
    """Inductor fused the cache update (``copy_`` of a ``torch.where`` over the whole cache)
    into two pointwise kernels per layer: data_movement names them (inplace_copy) with their
    share of the window's GPU time, recomputed here by SQL over the window."""
    d = _diagnose("compile_where_decode")
    s = d.structure
    assert s.kind == "generation" and s.requests["warmup"].to_list() == [True, False]
    f = d.findings.filter(pl.col("category") == "data_movement").row(0, named=True)
    assert "inplace_copy" in f["title"]
    w = d.window
    rows = _sql("compile_where_decode", "SELECT s.value, SUM(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s "
                                        f"ON s.id = k.shortName WHERE k.start >= {w.start_ns} AND k.start < {w.end_ns} GROUP BY 1")
    total = sum(r[1] for r in rows)
    copying = sum(r[1] for r in rows if r[0].startswith("triton_poi_fused") and "_copy__" in r[0])
    ev = d.evidence(d.findings["category"].to_list().index("data_movement"))
    got = ev.filter(pl.col("kind") == "inplace_copy")
    assert int(got["gpu_time_ns"].sum()) == copying and copying / total > 0.4


def test_compiled_prompt_forward_is_its_own_step() -> None:
    """The compiled prompt forward is specialised to the prompt's length, so it runs none of
    the decode step's kernel names and the loop glues it to the warm-up decode step before it;
    that step's copy of the sampled ids to the host, followed by the GPU idling, ends it. The
    steady request is then the program's: a prefill and 24 decode steps, time to first token
    within 5 % of the program's own timer (prefill launch to the token on the host; ours is the
    prompt forward's GPU span), 24 copies of 64 B to the host after it (SQL)."""
    s = _structure("compile_where_decode")
    log = _log("compile_where_decode")
    r = s.requests.filter(~pl.col("warmup")).row(0, named=True)
    assert (r["prefill_steps"], r["decode_steps"]) == (1, log["steps"])
    assert abs(r["ttft_ns"] / 1e6 - log["ttft_ms"]) / log["ttft_ms"] < 0.05
    assert abs(r["tpot_median_ns"] / 1e6 - log["ms_per_token"]) / log["ms_per_token"] < 0.05
    prefill = s.steps_table.filter(~pl.col("warmup") & (pl.col("phase") == "prefill")).row(0, named=True)
    (copies,) = _sql("compile_where_decode", "SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 2 "
                                             f"AND bytes = 64 AND start > {prefill['gpu_end_ns']}")[0]
    assert copies == log["steps"]


def test_inplace_copy_names() -> None:
    from tracekit.analysis.data_movement import inplace_copy

    names = ["triton_poi_fused_copy__19", "triton_poi_fused__unsafe_view_arange_copy__eq_where_4",
             "triton_per_fused__to_copy__unsafe_view_add_10", "triton_poi_fused__unsafe_view_index_copy__split_3",
             "triton_poi_fused__to_copy_unsqueeze_1", "triton_per_fused__to_copy__add_arange_copy__x_2", "copy_kernel"]
    got = pl.DataFrame({"n": names}).select(inplace_copy(pl.col("n")))["n"].to_list()
    assert got == [True, True, False, False, False, True, False]


# -- microbenchmarks ---------------------------------------------------------------------------------
def test_microbenchmarks_are_called_so() -> None:
    """The JAX loop (500 timed calls after 3 warm-up ones) and Triton's do_bench: a loop timing a
    few kernels, with the kernels' own medians beside what the benchmarks printed."""
    jax = _structure("microbench_jax")
    assert jax.kind == "microbenchmark" and jax.steps >= 500
    assert abs(jax.step_ns / 1e3 - _log("microbench_jax")["median_us"]) / _log("microbench_jax")["median_us"] < 0.03
    tri = _structure("microbench_triton")
    assert tri.kind == "microbenchmark"
    ev = tri.evidence[0]
    med = float(ev.split("softmax_kernel ×")[1].split("median ")[1].split(" µs")[0])
    assert abs(med / 1e3 - _log("microbench_triton")["triton_ms"]) / _log("microbench_triton")["triton_ms"] < 0.1


# -- no run is called a generation that is not one -----------------------------------------------------
GENERATIONS = {"llm_decode_1gpu", "llm_tp2_nccl", "llm_tp2_nccl_per_rank_rank0", "llm_tp2_nccl_per_rank_rank1", "llm_tp2pp2_nccl"}


def _bundled() -> list[Path]:
    return sorted(p for p in SAMPLES.rglob("*.sqlite") if "workloads" not in p.parts)


@pytest.mark.parametrize("path", _bundled(), ids=lambda p: p.stem)
def test_bundled_captures_kind(path: Path) -> None:
    s = tracekit.structure(path)
    want = "generation" if path.stem in GENERATIONS else "training" if "train" in path.stem else (
        "microbenchmark" if "custom_allreduce" in path.stem else "unknown")
    assert s.kind == want, (s.headline(), s.evidence)


@pytest.mark.parametrize("name", ["graph_decode_graphtrace", "graph_decode_nodetrace", "tp2_graph_decode_graphtrace", "hf_generate_eager",
                                  "hf_generate_compile", "compile_kvcopy", "compile_functional"])
def test_llm_stacks_are_generations(name: str) -> None:
    s = tracekit.structure(llm_capture(name))
    assert s.kind == "generation" and s.requests.height == 1


@pytest.mark.parametrize("path", sorted(NSYS_CORPUS.glob("*.sqlite")), ids=lambda p: p.stem)
def test_public_exports_are_never_called_generations(path: Path) -> None:
    """Exports other people made (k-means, a CFD code, TensorRT, an MPI SAXPY, an FSDP training
    slice…): none is a generation or a server."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            s = tracekit.structure(path)
        except tracekit.TracekitError:
            return  # an export that cannot be read says so (tested elsewhere)
    assert s.kind not in ("generation", "serving"), s.headline()


# -- the loop finder itself ---------------------------------------------------------------------------
def test_loops_of_nested_sequences() -> None:
    """Three 'calls' of a prompt forward and 6 one-token forwards of 2 layers each, after a
    start-up: the calls are the main loop, the forwards the token loop, and the layers a loop
    too (every layer's ops interleaving the same way)."""
    startup = [90, 91, 92]
    layer = [1, 2, 3]
    fwd = [10, *layer, *layer, 11, 12, 13]  # embed, 2 layers, norm, head, sample
    prompt = [20, *layer, *layer, 11, 12, 13]  # the prompt's own embedding kernel
    call = [30, *prompt, *fwd * 6]
    seq = np.array(startup + call * 3)
    starts = np.arange(seq.size, dtype=np.int64) * 10
    ends = starts + 5
    loops = find_loops(seq, starts, ends)
    main = main_loop(loops)
    assert main is not None and main.count == 3 and main.bounds[0] == len(startup) and main.stop == seq.size
    assert set(main.anchors) == {20, 30}
    tok = token_loop(loops, main)
    assert tok.count == 21 and set(tok.anchors) == {11, 12, 13}
    assert [lp.count for lp in loops if set(lp.anchors) == {1, 2, 3}] == [42]  # the layers


def test_loop_boundaries_sit_in_the_idle_gap_before_a_step() -> None:
    """A step whose first once-per-step kernel comes after a copy: the step starts at the copy,
    where the GPU idled (the host prepared the batch)."""
    step = [5, 6, 7, 8, 9]  # copy, first anchor, …, last anchor
    seq = np.array(step * 6)
    starts = np.zeros(seq.size, dtype=np.int64)
    t = 0
    for i in range(seq.size):
        t += 1000 if i % 5 == 0 else 10  # a long gap before each copy
        starts[i] = t
    loop = main_loop(find_loops(seq, starts, starts + 5))
    assert loop is not None and loop.count == 6 and list(loop.bounds) == [0, 5, 10, 15, 20, 25]


def test_structure_json_and_the_cli() -> None:
    d = _diagnose("hf_generate_calls")
    payload = json.loads(d.to_json())
    st = payload["structure"]
    assert st["kind"] == "generation" and len(st["requests"]) == 3
    # one iteration per forward pass: the warm-up call's forwards (its prefill and decode steps) are warm-up
    warm = st["requests"][0]
    assert warm["warmup"] and st["warmup_iterations"] == warm["prefill_steps"] + warm["decode_steps"] == 32
    assert st["headline"].startswith("generation: 3 requests (1 warm-up set apart)")
    r = subprocess.run([sys.executable, "-m", "tracekit.cli.main", "diagnose", str(_file("hf_generate_calls")), "--format", "json"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0 and json.loads(r.stdout)["structure"]["kind"] == "generation"


def test_name_codes_counted_as_numpy_unique_gives_them() -> None:
    """``find_loops`` counts the operations' name codes instead of sorting them (issue 44: on
    2 M operations np.unique's sorted copy and permutation were 32 MB): the distinct codes,
    each operation's index among them and the counts equal ``np.unique``'s, on a real
    export's codes with missing names (-1) among them and on codes that start above 0."""
    from tracekit.analysis.run.loops import _unique_codes, name_codes

    names = tracekit.open(SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite").kernels.sort("start_ns")["name"]
    codes = name_codes(names).copy()  # (a view of the column: read-only)
    codes[::97] = -1  # operations without a name
    for c in (codes, codes[codes >= 0] + 7):
        want = np.unique(c, return_inverse=True, return_counts=True)
        got = _unique_codes(c)
        assert len(want[0]) > 10 and all(np.array_equal(w, g) for w, g in zip(want, got, strict=True))
    # ids spread far apart (a damaged export's name id of 10^15): counting would need a count
    # for every value in between; the sorted path gives the same answer
    wide = codes.copy()
    wide[5] = 10**15
    want = np.unique(wide, return_inverse=True, return_counts=True)
    got = _unique_codes(wide)
    assert want[0][-1] == 10**15 and all(np.array_equal(w, g) for w, g in zip(want, got, strict=True))
    empty = np.zeros(0, dtype=np.int64)  # no operations: empty answers, as np.unique gives
    assert all(g.size == 0 and g.dtype == np.int64 for g in _unique_codes(empty))


def test_idle_before_on_a_real_gpu_and_with_missing_times() -> None:
    """``idle_before`` works in place on integer times (issue 44); a damaged export's missing
    times read as NaN (the CI run of 2026-11-29 failed there: the in-place subtraction cannot
    write floats into integers). On a real GPU's kernels the gaps equal start minus the
    latest earlier end, by hand; with starts and ends missing, each gap next to a missing
    time is 0 and every other one is what the times around it give."""
    from tracekit.analysis.run.loops import idle_before

    k = tracekit.open(SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite").kernels
    k = k.filter(pl.col("device_id") == k["device_id"].min()).sort("start_ns")
    s, e = k["start_ns"].to_numpy(), k["end_ns"].to_numpy()
    gap = idle_before(s, e)
    latest, want = e[0], [0]
    for i in range(1, s.size):
        want.append(max(int(s[i]) - int(latest), 0))
        latest = max(latest, e[i])
    assert gap.dtype == np.int64 and gap.tolist() == want and sum(want) > 0

    starts = np.array([np.nan, 100.0, 250.0, np.nan, 500.0, 900.0])
    ends = np.array([50.0, 200.0, np.nan, 450.0, 700.0, 1000.0])
    # gaps: none first; 100-50; 250-200; missing start; 500-450; 900-700
    assert idle_before(starts, ends).tolist() == [0, 50, 50, 0, 50, 200]


def test_loop_time_coverage_by_hand() -> None:
    """``find_loops`` sums the operations' own time in place, only once a loop needs it (issue
    44: one array of the operations' size fewer at the structure's peak): each loop's
    ``time_coverage`` equals, by hand, the summed ``end - start`` (0 when negative) of the
    operations in its instances of the usual size over that of all operations, on a real
    GPU's kernels with one duration made negative."""
    from tracekit.analysis.run.loops import _TYPICAL, find_loops, name_codes

    k = tracekit.open(SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite").kernels.sort("start_ns")
    s, e = k["start_ns"].to_numpy().copy(), k["end_ns"].to_numpy().copy()
    e[3] = s[3] - 500  # a damaged row: negative time counts as none
    loops = find_loops(name_codes(k["name"]), s, e)
    assert loops
    own = [max(int(b) - int(a), 0) for a, b in zip(s, e, strict=True)]
    for lp in loops:
        sizes = np.diff(np.append(lp.bounds, lp.stop))
        limit = _TYPICAL * float(np.median(sizes))
        ends_at = [*lp.bounds[1:].tolist(), lp.stop]
        inside = sum(sum(own[int(b):int(t)]) for b, t, n in zip(lp.bounds, ends_at, sizes, strict=True) if n <= limit)
        assert lp.time_coverage == pytest.approx(inside / sum(own), rel=1e-12)
        assert 0 < lp.time_coverage <= 1
