"""Two-GPU programs, each run twice on two H200s: under torch.profiler per rank and under Nsight
Systems per rank (``sample_traces/zoo/ranks``): FSDP2 training, DDP training with two
micro-batches, and tensor-parallel ``generate()``. Each source is read as a set of ranks and
checked against the program's own clock in that run (CUDA events, a streamer's token times:
``<name>.kineto.log``, ``<name>.nsys.log``), and the two sources of one program against each
other (kind, steps, collectives per step, requests)."""

from __future__ import annotations

import polars as pl
import pytest

import tracekit
from tracekit.analysis.nccl import NCCL_KERNEL_PATTERN
from tracekit.diagnosis import structure

from .conftest import RANKS_ZOO, ranks_capture, ranks_truth

PROGRAMS = ("r01_fsdp2_2gpu", "r02_ddp_2gpu", "r03_tp2_generate")


def _set(name: str, source: str):  # noqa: ANN202 - TraceSet
    return tracekit.open_many(ranks_capture(name, source))


def _close(got: float, want: float, tol: float) -> bool:
    return abs(got - want) <= tol * abs(want)


def test_every_program_has_both_sources_of_both_ranks() -> None:
    for name in PROGRAMS:
        folder = RANKS_ZOO / "runs" / name
        for ext in (".pt.trace.json.xz", ".sqlite.xz"):
            files = sorted(folder.glob(f"{name}.rank*{ext}"))
            assert [f.name for f in files] == [f"{name}.rank0{ext}", f"{name}.rank1{ext}"]
            assert all(f.stat().st_size <= 3 * 1024 * 1024 for f in files), files
        for source in ("kineto", "nsys"):
            assert sorted(ranks_truth(name, source)) == [0, 1]


@pytest.mark.parametrize("source", ["kineto", "nsys"])
def test_ranks_are_the_programs_two(source: str) -> None:
    ts = _set("r02_ddp_2gpu", source)
    assert ts.profiler == {"kineto": "torch.profiler", "nsys": "nsys"}[source]  # which capture its hints name
    assert ts.kernels["rank"].unique().sort().to_list() == [0, 1]
    assert ts.kernels.group_by("rank").agg(pl.col("device_id").n_unique())["device_id"].to_list() == [1, 1]


@pytest.mark.parametrize("name", ["r01_fsdp2_2gpu", "r02_ddp_2gpu"])
def test_training_under_nsys_has_the_programs_steps(name: str) -> None:
    truth = ranks_truth(name, "nsys")
    s = structure(_set(name, "nsys"))
    assert s.kind == "training", s.headline()
    it = s.iterations.sort("iteration")
    # the iterations are the busiest rank's
    rank = int(it["rank"][0]) if "rank" in it.columns else int(s.loops[0].keys.get("rank") or 0) if s.loops else 0
    steps = [t["step_ms"] for t in truth[rank]["steps"]]
    # DDP broadcasts its parameters before step 0: set-up, not a step; step 0 (NCCL's and the
    # model's first-use set-up, whose start the GPU and the program's mark see apart) is warm-up
    assert s.total == len(steps) and s.warmup_steps == 1 and bool(it["warmup"][0])
    assert float(it["length_ns"][0]) / 1e6 > 5 * float(pl.Series(steps[1:]).median())  # type: ignore[arg-type]
    got = (it["length_ns"].slice(1) / 1e6).to_list()
    assert all(_close(g, w, 0.10) for g, w in zip(got, steps[1:], strict=True)), list(zip(got, steps[1:], strict=True))
    assert _close(float(s.step_ns) / 1e6, float(pl.Series(steps[1:]).median()), 0.05)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["r01_fsdp2_2gpu", "r02_ddp_2gpu"])
def test_training_under_torch_profiler_has_its_recorded_steps(name: str) -> None:
    truth = ranks_truth(name, "kineto")
    s = structure(_set(name, "kineto"))
    assert s.kind == "training", s.headline()
    it = s.iterations.sort("iteration")
    assert it["name"].to_list() == [f"ProfilerStep#{k}" for k in range(3, 8)]  # skip 3, warm 1, record 5
    # ProfilerStep#k runs from optimizer step k's end to step k+1's: the program's step k + 1
    # (one step may start a few ms apart, the CPU range against the GPU clock; three together agree)
    rank = int(it["rank"][0]) if "rank" in it.columns else 0
    steps = [t["step_ms"] for t in truth[rank]["steps"]]
    got = float(it.filter(pl.col("name").is_in(["ProfilerStep#4", "ProfilerStep#5", "ProfilerStep#6"]))["duration_ns"].sum()) / 1e6
    assert _close(got, sum(steps[5:8]), 0.05), (rank, got, steps[5:8])


@pytest.mark.parametrize("name", ["r01_fsdp2_2gpu", "r02_ddp_2gpu"])
def test_both_sources_see_the_same_collectives_per_step(name: str) -> None:
    want = {"r01_fsdp2_2gpu": 20, "r02_ddp_2gpu": 5}[name]  # FSDP2: an all-gather per layer forward and
    # backward, a reduce-scatter per layer backward (and the root's); DDP: one all-reduce per bucket
    nsys = _set(name, "nsys")
    s = structure(nsys)
    it = s.iterations.filter(~pl.col("warmup"))
    for r in (0, 1):
        comm = nsys.kernels.filter(pl.col("name").str.contains(NCCL_KERNEL_PATTERN) & (pl.col("rank") == r))
        counts = [comm.filter((pl.col("start_ns") >= a) & (pl.col("start_ns") < b)).height
                  for a, b in zip(it["w_start"], it["w_end"], strict=True)]
        assert int(pl.Series(counts).median()) == want, (r, counts)  # type: ignore[arg-type]
    kineto = _set(name, "kineto")
    for r in (0, 1):
        # each rank's own step ranges; FSDP2 prefetches the next step's first all-gather, so three
        # steps are counted together
        steps = kineto.nvtx.filter((pl.col("rank") == r) & pl.col("name").is_in(["ProfilerStep#4", "ProfilerStep#6"])).sort("start_ns")
        lo, hi = steps["start_ns"][0], steps["end_ns"][1]
        comm = kineto.kernels.filter(pl.col("name").str.contains(NCCL_KERNEL_PATTERN) & (pl.col("rank") == r))
        assert round(comm.filter((pl.col("start_ns") >= lo) & (pl.col("start_ns") < hi)).height / 3) == want, r


@pytest.mark.parametrize("source", ["kineto", "nsys"])
def test_tensor_parallel_generation_against_the_programs_clock(source: str) -> None:
    truth = ranks_truth("r03_tp2_generate", source)[0]["requests"]
    s = structure(_set("r03_tp2_generate", source))
    assert s.kind == "generation", s.headline()
    req = s.requests.sort("request")
    assert req["prompt_rows"].to_list() == [t["prompt"] for t in truth] == [32, 128, 1024, 64]
    assert req["new_tokens"].to_list() == [t["new"] for t in truth] == [4, 16, 16, 16]
    assert req["warmup"].to_list() == [t["warmup"] for t in truth]
    for row, t in zip(req.iter_rows(named=True), truth, strict=True):
        assert _close(row["ttft_ns"] / 1e6, t["ttft_ms"], 0.02), (row, t)
        if not t["warmup"]:
            assert _close(row["tpot_median_ns"] / 1e6, t["tpot_ms"], 0.02), (row, t)


def test_the_two_sources_of_the_generation_agree_on_its_shape() -> None:
    a, b = (structure(_set("r03_tp2_generate", src)) for src in ("kineto", "nsys"))
    assert a.total == b.total == sum(t["new"] for t in ranks_truth("r03_tp2_generate", "nsys")[0]["requests"])
    cols = ["prompt_rows", "new_tokens", "prefill_steps", "decode_steps", "warmup"]
    assert a.requests.sort("request").select(cols).equals(b.requests.sort("request").select(cols))


def test_a_gather_before_a_training_loop_leaves_its_steps() -> None:
    """The layer-stack guard (one or two token embedding lookups opening a loop: one forward's
    layers) never takes a training loop: its instances hold backward kernels. A ViT has no
    token embedding; one gather put right before its first step (an ``x[idx]`` in the
    program's set-up) changes nothing."""
    from tracekit.analysis.run.forwards import token_lookup_names
    from tracekit.analysis.run.structure import kernel_loop_iterations

    from .conftest import zoo_capture

    k = tracekit.open(zoo_capture("t09_timm_vit")).kernels.select("device_id", "start_ns", "end_ns", "duration_ns", "name").sort("start_ns")
    assert int(token_lookup_names(k["name"]).sum()) == 0
    base = kernel_loop_iterations(k)[0]
    first = int(base.iterations["start_ns"][0])
    gather = pl.DataFrame({"device_id": [int(k["device_id"][0])], "start_ns": [first - 2_000], "end_ns": [first - 1_000],
                           "duration_ns": [1_000], "name": ["void at::native::vectorized_gather_kernel<16, long>(char*, char*, long*)"]})
    notes: list[str] = []
    got = kernel_loop_iterations(pl.concat([k, gather], how="vertical_relaxed").sort("start_ns"), notes=notes)
    assert not notes
    assert got and got[0].iterations["start_ns"].equals(base.iterations["start_ns"]) and base.iterations.height >= 10
