"""The zoo under torch.profiler (issue 45): ten of the generation and training zoo's programs,
run unmodified on an H200 through tracekit's start-up hook (``tracekit/capture/torch_profile.py``,
what ``tracekit capture torch`` runs: training on a schedule of 5 optimizer steps, generation
whole), each printing its own clock in the profiled run. The same programs' Nsight Systems
captures (``zoo/<generation|training>/runs``, another run of the same program) give the same
reading: both sources of one program are compared answer by answer."""

from __future__ import annotations

import functools
import statistics
import warnings

import polars as pl
import pytest

import tracekit

from .conftest import (
    KINETO_ZOO,
    kineto_zoo_capture,
    kineto_zoo_names,
    kineto_zoo_truth,
    zoo_capture,
)

NAMES = kineto_zoo_names()
TRAINING = [n for n in NAMES if n.startswith("t")]
GENERATION = [n for n in NAMES if n.startswith("g")]


def _quiet(fn):  # noqa: ANN001, ANN202
    @functools.cache
    def run(name: str):  # noqa: ANN202
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn(name)

    return run


@_quiet
def _kineto(name: str):  # noqa: ANN202
    return tracekit.diagnose(tracekit.open(kineto_zoo_capture(name)))


@_quiet
def _nsys(name: str):  # noqa: ANN202
    return tracekit.diagnose(tracekit.open(zoo_capture(name)))


def _close(got: float, want: float, rel: float = 0.10) -> bool:
    return abs(got - want) <= rel * want


def test_every_capture_is_bundled_small() -> None:
    assert len(TRAINING) >= 6 and len(GENERATION) >= 4
    for name in NAMES:
        folder = KINETO_ZOO / "runs" / name
        assert (folder / "command.txt").is_file() and kineto_zoo_truth(name)["program"] == name
        assert (folder / f"{name}.pt.trace.json.xz").stat().st_size <= 3 * 1024 * 1024, name


@pytest.mark.parametrize("name", TRAINING)
def test_training_steps_are_the_profiler_steps(name: str) -> None:
    """The 5 recorded optimizer steps are the iterations (torch.profiler's ProfilerStep#3…#7,
    opened by the hook after each optimizer step), each within 10 % of the program's own
    CUDA-event clock of the step it covers (ProfilerStep#k runs from optimizer step k's end to
    k+1's: the program's step k+1), where no periodic work falls in between."""
    d = _kineto(name)
    s = d.structure
    assert s.kind == "training" and s.method == "nvtx" and "ProfilerStep#N" in s.reason, s.headline()
    assert s.iterations["name"].to_list() == [f"ProfilerStep#{k}" for k in range(3, 8)]
    truth = kineto_zoo_truth(name)
    periodic_after = {p["after_step"] for p in truth["periodic"]}
    pairs = [(r["length_ns"] / 1e6, truth["steps"][k + 1]["step_ms"]) for k, r in zip(range(3, 7), s.iterations.iter_rows(named=True), strict=False)
             if k + 1 not in periodic_after and k not in periodic_after]
    assert len(pairs) >= 3
    for got, want in pairs:
        assert _close(got, want), (pairs)


@pytest.mark.parametrize("name", TRAINING)
def test_training_reads_as_under_nsys(name: str) -> None:
    """Phases by launching thread (Kineto names no threads: autograd's is the one that runs
    ``autograd::engine::evaluate_function`` ops), the micro-batches of the program, as the nsys
    capture of the same program reads them; forward and backward within 25 % of the step of the
    program's clock where it marks them."""
    k, n = _kineto(name), _nsys(name)
    assert set(k.training["by"]) == {"thread"} == set(n.training["by"])
    assert k.training["micro_batches"].to_list() == n.training["micro_batches"].to_list()
    truth = kineto_zoo_truth(name)
    steps = truth["steps"][4:8]
    assert k.training["micro_batches"][0] == statistics.median(st["micro"] for st in steps)
    step = statistics.median(st["step_ms"] for st in steps)
    phases = k.training.rows_by_key("phase", named=True, unique=True)
    for phase in ("forward", "backward"):
        want = statistics.median(st[phase] for st in steps)
        if want:
            assert abs(phases[phase]["time_ns"] / 1e6 - want) <= 0.25 * step, (phase, phases[phase]["time_ns"] / 1e6, want)


def test_trainer_evaluation_set_apart_in_the_profiler_steps() -> None:
    """The Trainer's evaluation after step 7 falls in ProfilerStep#7: set apart with its time,
    within 10 % of the program's clock of it."""
    d = _kineto("t01_trainer_accum")
    (ev,) = [p["ms"] for p in kineto_zoo_truth("t01_trainer_accum")["periodic"] if p["after_step"] == 7]
    row = d.periodic.row(0, named=True)
    assert d.periodic.height == 1 and row["what"] == "evaluation" and row["count"] == 1
    assert _close(row["max_ns"] / 1e6, ev), (row, ev)


@pytest.mark.parametrize("name", GENERATION)
def test_generation_requests_against_the_programs_clock(name: str) -> None:
    """Recorded whole: the requests the program made, the same ones warm-up, with time to
    first token and time per output token within 10 % of its own clock in the profiled run."""
    s = _kineto(name).structure
    truth = kineto_zoo_truth(name)["requests"]
    assert s.kind == "generation" and s.requests.height == len(truth), s.headline()
    assert s.requests["warmup"].to_list() == [r["warmup"] for r in truth]
    for got, want in zip(s.requests.iter_rows(named=True), truth, strict=True):
        if want["warmup"]:
            continue
        assert _close(got["ttft_ns"] / 1e6, want.get("ttft_ms") or want["ttft_host_ms"]), (got, want)
        assert _close(got["tpot_median_ns"] / 1e6, want.get("fwd_interval_ms") or want["tpot_ms"]), (got, want)


@pytest.mark.parametrize("name", GENERATION)
def test_generation_reads_as_under_nsys(name: str) -> None:
    """The Kineto trace and the nsys capture of the same program: the same kind, requests,
    warm-up, new tokens and prompt rows (the embedding gather's grid, which Kineto records too)."""
    k, n = _kineto(name).structure, _nsys(name).structure
    assert k.kind == n.kind == "generation"
    cols = ["warmup", "new_tokens", "prompt_rows"]
    assert k.requests.select(cols).to_dicts() == n.requests.select(cols).to_dicts()


def test_the_hook_wrote_one_trace_per_worker() -> None:
    """Under torchrun the launcher (which imports torch) writes no trace; the worker's is named
    by its rank."""
    log = (KINETO_ZOO / "runs" / "t07_fsdp2_1gpu" / "t07_fsdp2_1gpu.program.log").read_text()
    written = [line for line in log.splitlines() if "torch.profiler trace written" in line]
    assert any(".rank0.pt.trace.json.gz" in w for w in written)
    assert pl.Series(written).str.contains(r"\.rank0\.").sum() == 1


def _raw_events(name: str) -> list[dict]:  # type: ignore[type-arg]
    import json

    return json.loads(kineto_zoo_capture(name).read_text())["traceEvents"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", ["t04_accelerate_accum", "t09_timm_vit"])
def test_operator_gpu_time_through_the_flows(name: str) -> None:
    """Every kernel reaches the operator that launched it (External id on the op and its
    runtime call, correlation on the call and its kernel): the operators' GPU time adds up to
    the kernels' exactly, and one aten::mm's, recounted from the JSON, is its own kernels'."""
    from tracekit.analysis.op_costs import op_cost_summary

    t = tracekit.open(kineto_zoo_capture(name))
    ops = t.operators
    assert int(ops["gpu_ns"].sum()) == int(t.kernels["duration_ns"].sum())
    ev = _raw_events(name)
    mm = next(e for e in ev if e.get("cat") == "cpu_op" and e["name"] == "aten::mm")
    ext = mm["args"]["External id"]
    corr = {e["args"]["correlation"] for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("args", {}).get("External id") == ext}
    want = sum(round(e["dur"] * 1000) for e in ev if e.get("cat") == "kernel" and e["args"].get("correlation") in corr)
    row = ops.filter(pl.col("external_id") == ext).row(0, named=True)
    assert abs(row["gpu_ns"] - want) <= len(corr)  # µs with 3 decimals: at most 1 ns per kernel apart
    (m, k), (_, n) = mm["args"]["Input Dims"][:2]
    assert row["flops"] == 2 * m * k * n and row["bytes"] == 2 * (m * k + k * n + m * n)  # bf16
    assert row["tflops"] == pytest.approx(row["flops"] / row["gpu_ns"] / 1e3)
    top = op_cost_summary(ops, by=("name",))
    assert top.filter(pl.col("name") == "aten::mm")["bound"][0] == "compute-bound"


def test_convolution_and_attention_flops_by_hand() -> None:
    """The ViT's patch embedding (cuDNN convolution, 16×16 stride 16 on 224² images) and its
    cuDNN attention: FLOPs from the recorded shapes and arguments, counted here by hand."""
    ops = tracekit.open(kineto_zoo_capture("t09_timm_vit")).operators
    conv = ops.filter(pl.col("name") == "aten::cudnn_convolution").row(0, named=True)
    assert conv["input_dims"].startswith("[[64, 3, 224, 224], [384, 3, 16, 16]")
    assert conv["flops"] == 2 * 64 * 384 * 3 * 16 * 16 * 14 * 14
    att = ops.filter(pl.col("name") == "aten::_cudnn_attention_forward").row(0, named=True)
    assert att["input_dims"].startswith("[[64, 6, 197, 64], [64, 6, 197, 64], [64, 6, 197, 64]")
    assert att["flops"] == 4 * 64 * 6 * 197 * 197 * 64
    bwd = ops.filter(pl.col("name") == "aten::_cudnn_attention_backward").row(0, named=True)
    assert bwd["flops"] == 2.5 * att["flops"]
    # below the H200's bf16 ridge (989 TFLOP/s ÷ 4.8 TB/s ≈ 206 FLOP/B) attention of 197 keys is memory-bound
    assert att["intensity"] < 989.4e12 / 4.8e12 and att["bound"] == "memory-bound"
