"""Other people's torch.profiler traces (``sample_traces/kineto/public``: TraceLens' vLLM, SGLang
and Hugging Face traces, PARAM's 8-rank DLRM training), each answer checked against what the
JSON itself holds, counted here without tracekit:

* a trace that opens with a big ``metadata`` object is recognised (its ``traceEvents`` key
  lies past the first 8 KiB);
* a program that stepped the profiler once has one step, its ``ProfilerStep#N`` range, not
  its layers as steps;
* one engine step of a serving engine (one prefill, 36 decoder layers around one or two token
  embedding lookups) is not 36 steps or forward passes;
* older Kineto, whose runtime calls carry their correlation id as ``External id``, links each
  kernel to the innermost CPU operator of its launching thread by time;
* an operator whose inputs' bytes would need more than the GPU's bandwidth gets no rate;
* eight per-rank files are eight ranks;
* ``--side-by-side`` takes torch.profiler traces.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit.diagnosis import structure
from tracekit.kineto import KinetoTrace
from tracekit.kineto.sniff import SNIFF_BYTES

from .conftest import ROOT, SAMPLES

PUBLIC = SAMPLES / "kineto" / "public"
VLLM = PUBLIC / "tracelens_vllm_b200_eager" / "eager_trace.json.gz"
QWEN = PUBLIC / "tracelens_hf_qwen_h100" / "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
SGLANG = PUBLIC / "tracelens_sglang_mi300_prefilldecode" / "sglang_Qwen3-8B_prefilldecode.json.gz"
DLRM = PUBLIC / "param_dlrm_8rank"


def _text(path: Path) -> bytes:
    return gzip.decompress(path.read_bytes())


def _events(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return list(json.loads(_text(path))["traceEvents"])


def _of(events: list[dict], *cats: str) -> list[dict]:  # type: ignore[type-arg]
    return [e for e in events if e.get("cat") in cats and e.get("ph") == "X"]


def test_the_public_traces_are_bundled_with_their_licenses() -> None:
    for p in (VLLM, QWEN, SGLANG):
        assert p.stat().st_size > 100_000, p
    assert len(sorted(DLRM.glob("worker*.pt.trace.json.gz"))) == 8
    assert "MIT License" in (PUBLIC / "LICENSE.TraceLens").read_text()
    assert "MIT License" in (PUBLIC / "LICENSE.param").read_text()


def test_a_trace_opening_with_a_big_metadata_object_is_recognised() -> None:
    text = _text(QWEN)
    assert text.index(b'"traceEvents"') > SNIFF_BYTES  # what the first look misses
    trace = tracekit.open(QWEN)
    assert isinstance(trace, KinetoTrace)
    kernels = _of(_events(QWEN), "kernel")
    assert trace.kernels.height == len(kernels) == 1465


def test_one_profiler_step_is_the_one_step() -> None:
    steps = [e for e in _of(_events(QWEN), "user_annotation") if e["name"].startswith("ProfilerStep#")]
    assert len(steps) == 1
    s = structure(tracekit.open(QWEN))
    assert (s.method, s.total, s.steps) == ("nvtx", 1, 1)
    row = s.iterations.row(0, named=True)
    assert row["name"] == steps[0]["name"] == "ProfilerStep#6"
    assert row["start_ns"] == round(steps[0]["ts"] * 1000)
    assert row["end_ns"] == round((steps[0]["ts"] + steps[0]["dur"]) * 1000)
    assert "stepped the profiler once" in s.reason
    assert s.headline().startswith("run of unknown kind: 1 iteration of")


@pytest.mark.parametrize(("path", "lookups", "layers"), [(VLLM, 1, 36), (SGLANG, 2, 36)], ids=["vllm_b200", "sglang_mi300"])
def test_the_layers_of_one_engine_step_are_not_steps(path: Path, lookups: int, layers: int) -> None:
    events = _events(path)
    kernels = _of(events, "kernel")
    gathers = [e for e in kernels if "vectorized_gather_kernel" in e["name"]]
    rotary = [e for e in kernels if "rotary_embedding" in e["name"]]
    assert len(gathers) == lookups  # the token embedding lookups: one per forward
    assert len(rotary) == layers  # RoPE: one per layer of the step's one forward
    assert not [e for e in _of(events, "user_annotation") if e["name"].startswith("ProfilerStep#")]
    s = structure(tracekit.open(path))
    assert s.total == 0 and s.steps == 0, s.headline()
    fw = "a forward" if lookups == 1 else f"at most {lookups} forwards"
    assert f"token embedding lookup{'s' if lookups > 1 else ''}: the layers of {fw}, not steps" in s.reason


def test_old_kineto_launches_reach_the_innermost_operator_of_their_thread() -> None:
    path = sorted(DLRM.glob("worker0_*.json.gz"))[0]
    events = _events(path)
    ops = _of(events, "cpu_op", "user_annotation")
    calls = {e["args"]["correlation"]: e for e in _of(events, "cuda_runtime", "cuda_driver") if "correlation" in e.get("args", {})}
    op_ids = {e["args"].get("External id") for e in ops}
    assert not any(c["args"].get("External id") in op_ids for c in calls.values())  # no call names its operator
    want = {}
    for k in _of(events, "kernel"):
        call = calls[k["args"]["correlation"]]
        around = [o for o in ops if (o["pid"], o["tid"]) == (call["pid"], call["tid"]) and o["ts"] <= call["ts"] < o["ts"] + o["dur"]]
        # the innermost: the latest start, and of equal starts the shortest
        want[k["args"]["correlation"]] = min(around, key=lambda o: (-o["ts"], o["dur"]))["name"] if around else None
    flows = tracekit.open(path).flows.filter(pl.col("kind") == "kernel")
    got = dict(zip(flows["correlation_id"].to_list(), flows["op_name"].to_list(), strict=True))
    assert got == want
    assert sum(v is not None for v in want.values()) == len(want) == 245


def test_operators_of_old_kineto_hold_every_kernel() -> None:
    path = sorted(DLRM.glob("worker0_*.json.gz"))[0]
    trace = tracekit.open(path)
    kernel_ns = sum(round(e["dur"] * 1000) for e in _of(_events(path), "kernel"))
    assert int(trace.operators["gpu_ns"].sum()) == int(trace.kernels["duration_ns"].sum()) == kernel_ns


def test_no_operator_runs_faster_than_the_gpus_bandwidth() -> None:
    ops = tracekit.open(VLLM).operators
    cache = ops.filter(pl.col("name").str.contains("reshape_and_cache"))
    assert cache.height == 36  # one KV-cache write per layer, each given the whole cache
    first = next(e for e in _of(_events(VLLM), "cpu_op") if "reshape_and_cache" in e["name"])
    dims = first["args"]["Input Dims"]
    assert max(d[0] for d in dims if d) > 4_000_000  # the cache's blocks, of which the step writes 888 tokens
    assert cache["bytes"].null_count() == cache.height and cache["pct_of_peak"].null_count() == cache.height
    rated = ops.filter(pl.col("pct_of_peak").is_not_null())
    assert rated.height > 100 and float(rated["pct_of_peak"].max()) <= 1.0  # type: ignore[arg-type]


def test_eight_per_rank_files_are_eight_ranks() -> None:
    files = sorted(DLRM.glob("worker*.json.gz"))
    ranks = {json.loads(_text(p))["distributedInfo"]["rank"]: p for p in files}
    assert sorted(ranks) == list(range(8))
    ts = tracekit.open_many(DLRM)
    per = ts.kernels.group_by("rank").len().sort("rank")
    assert per["rank"].to_list() == list(range(8))
    assert per["len"].to_list() == [len(_of(_events(ranks[r]), "kernel")) for r in range(8)]


def test_side_by_side_takes_torch_profiler_traces() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "tracekit.cli.entry", "summary", "--side-by-side", str(QWEN), str(VLLM)],
                         capture_output=True, text=True, env=env, cwd=ROOT, check=False, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Nsight Compute report" not in run.stdout + run.stderr
    assert QWEN.name[:20] in run.stdout and "eager_trace" in run.stdout


def test_one_gpu_numbered_otherwise_than_its_properties_is_that_gpu() -> None:
    doc = json.loads(_text(SGLANG))
    props = doc["deviceProperties"]
    devices = {e["args"]["device"] for e in _of(doc["traceEvents"], "kernel")}
    assert [p["id"] for p in props] == [0] and devices == {9}  # ROCm: HIP's number, not the properties'
    gpus = tracekit.open(SGLANG).gpus
    assert gpus["device_id"].to_list() == [9]
    assert gpus["name"].to_list() == [props[0]["name"]] == ["AMD Instinct MI300X"]
    assert gpus["total_memory_bytes"].to_list() == [props[0]["totalGlobalMem"]]
