"""Per-layer memory from torch.profiler traces (issue 45 item 2): two programs run on an H200
under the start-up hook with ``profile_memory=True`` and a ``record_function`` range per module
(``--annotate-torch``, depth 3): a 4-layer Llama's training steps (activations kept for
backward) and ``generate()`` at batch 1 (the KV cache per token). Each program read
``torch.cuda.memory_allocated()`` in its own hooks on every decoder layer's entry and exit, and
the allocator's peak in between (``sample_traces/zoo/kineto/memory/memtruth.py``): tracekit's
``layer_memory`` of the trace's allocator events must give the same bytes, call by call."""

from __future__ import annotations

import functools
import warnings

import polars as pl
import pytest

import tracekit
from tracekit.analysis.memory import layer_memory, memory_peak

from .conftest import KINETO_MEMORY, kineto_memory_capture, kineto_memory_truth

NAMES = ["m01_train_memory", "m02_generate_memory"]
LAYERS = r"^model\.layers\.\d+$"


@functools.cache
def _trace(name: str):  # noqa: ANN202
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tracekit.open(kineto_memory_capture(name))


def test_the_programs_and_their_captures_are_bundled_small() -> None:
    for name in NAMES:
        folder = KINETO_MEMORY / "runs" / name
        assert "profile_memory\": true" in (folder / "command.txt").read_text()
        assert (folder / f"{name}.pt.trace.json.xz").stat().st_size <= 3 * 1024 * 1024
        assert len(kineto_memory_truth(name)) >= 16


@pytest.mark.parametrize("name", NAMES)
def test_layer_memory_is_the_programs_own_reading(name: str) -> None:
    """Entry, exit and peak of every decoder-layer call equal the program's allocator readings,
    to the byte, less one offset for the whole run (memory allocated before the trace's first
    event; 0 here, where the profiler started at ``import torch``)."""
    trace = _trace(name)
    got = layer_memory(trace.memory_usage, trace.nvtx, ranges=LAYERS, per_step=False)
    truth = pl.DataFrame(kineto_memory_truth(name))
    assert got.height == truth.height  # every call of every layer, no more
    both = got.select(pl.col("name").alias("layer"), pl.col("instance").alias("call"), "in_use_at_entry_bytes",
                      "in_use_at_exit_bytes", "peak_inside_bytes", "net_growth_bytes").join(truth, on=["layer", "call"])
    assert both.height == truth.height
    offset = both["entry"] - both["in_use_at_entry_bytes"]
    assert offset.n_unique() == 1
    off = int(offset[0])
    assert (both["in_use_at_exit_bytes"] + off == both["exit"]).all()
    assert (both["peak_inside_bytes"] + off == both["peak"]).all()
    assert (both["net_growth_bytes"] == both["exit"] - both["entry"]).all()


def test_training_layers_keep_their_activations_and_generation_grows_by_the_kv_cache() -> None:
    """What the numbers say, checked against the programs' readings: in training each layer's
    forward keeps the same activations every step (one value across layers and steps); in
    generation each layer's KV cache grows by the same bytes per token: a decode step adds one
    token's, the prefills of 64 and 384 tokens 64 and 384 times that."""
    train = layer_memory(_trace("m01_train_memory").memory_usage, _trace("m01_train_memory").nvtx, ranges=LAYERS, per_step=False)
    growth = train["net_growth_bytes"].unique().to_list()
    assert len(growth) == 1 and growth[0] > 0
    truth = pl.DataFrame(kineto_memory_truth("m02_generate_memory")).with_columns((pl.col("exit") - pl.col("entry")).alias("net"))
    gen = layer_memory(_trace("m02_generate_memory").memory_usage, _trace("m02_generate_memory").nvtx, ranges=LAYERS,
                       per_step=False)
    per_call = gen.group_by("instance").agg(pl.col("net_growth_bytes").max()).sort("instance")["net_growth_bytes"].to_list()
    want = truth.group_by("call").agg(pl.col("net").max()).sort("call")["net"].to_list()
    assert per_call == want
    token = min(per_call)
    assert token > 0 and per_call[0] == 64 * token and per_call[12] == 384 * token
    assert per_call[1:12] == [token] * 11 and per_call[13:] == [token] * 11


@pytest.mark.parametrize("name", NAMES)
def test_memory_usage_is_the_allocators_events(name: str) -> None:
    """``memory_usage`` of a Kineto trace is its ``[memory]`` events in nsys's columns: CUDA
    blocks as ``Device``, the CPU allocator's as ``Pageable`` (left out of device memory), and
    the peak of the running total is Kineto's own ``Total Allocated`` at its largest."""
    trace = _trace(name)
    mu, ev = trace.memory_usage, trace.memory_events
    assert mu.height == ev.height and set(mu["mem_kind"]) == {"Device", "Pageable"}
    assert set(mu["operation"]) == {"alloc", "free"} and (mu["bytes"] > 0).all()
    assert mu.columns == trace.table("memory_usage").columns
    peak = memory_peak(mu)
    cuda = ev.filter(pl.col("device_type") == 1)
    assert peak.height == 1 and int(peak["peak_bytes"][0]) == int(cuda["total_allocated_bytes"].max())


def test_every_view_of_memory_reads_them(tmp_path) -> None:  # noqa: ANN001
    """The report's per-layer memory section, the diagnosis (memory_growth is checked, not
    'not checked') and a trace without memory events telling how to record them with
    torch.profiler, not with nsys."""
    from tracekit.report.html import write_report
    from tracekit.viz.notes import missing

    trace = _trace("m01_train_memory")
    out = write_report(trace, tmp_path / "r.html")
    text = out.read_text()
    assert "Memory per layer" in text and "model.layers.3" in text
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = tracekit.diagnose(trace)
    assert not any("memory_growth not checked: no" in t for t in d.findings["title"].to_list())
    from .conftest import kineto_zoo_capture

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        other = tracekit.open(kineto_zoo_capture("g06_llama_2layer_b64"))
        titles = tracekit.diagnose(other).findings.filter(pl.col("category") == "memory_growth")
    assert "no memory events" in titles["title"][0] and "--profile-memory" in titles["next"][0][0]
    assert "profile_memory=True" in (missing(other, "memory_usage") or "")


def test_generate_with_module_ranges_reads_its_requests() -> None:
    """``generate()`` at batch 1 with ``--annotate-torch`` ranges: the root module's ranges are
    the forwards, and the kernels' reading of the same forwards says which read a prompt (it
    was read as 'serving: 24 engine steps, 12 prefills': the ranges were refused because the
    model's random initialisation on the GPU outweighed the generation, and the kernel loop
    alternated). The program printed what it asked for: prompts of 64 and 384 tokens, 12 new
    tokens each."""
    import re

    log = (KINETO_MEMORY / "runs" / "m02_generate_memory" / "m02_generate_memory.program.log").read_text()
    asked = [(int(p), int(n)) for p, n in re.findall(r"^prompt (\d+): (\d+) new tokens$", log, re.M)]
    assert asked == [(64, 12), (384, 12)]
    s = tracekit.structure(_trace("m02_generate_memory"))
    assert s.kind == "generation" and s.method == "forwards"
    req = s.requests.sort("request")
    assert list(zip(req["prompt_rows"].to_list(), req["new_tokens"].to_list(), strict=True)) == asked
    assert req["prefill_steps"].to_list() == [1, 1] and req["decode_steps"].to_list() == [11, 11]


def test_the_explorer_shows_memory_per_layer() -> None:
    """The notebook's explorer on the training trace: the memory tab charts the allocator's
    total and the per-layer tab has every decoder layer, with the net growth the program
    read (one value: each layer keeps the same activations)."""
    pytest.importorskip("ipywidgets")
    pytest.importorskip("altair")
    from tracekit.widgets import TraceExplorer

    trace = _trace("m01_train_memory")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = TraceExplorer(trace)
        ex._refresh_memory()
    assert ex.errors == {} and ex.views["memory"].chart is not None
    summary = ex.layer_summary.filter(pl.col("name").str.contains(LAYERS))
    assert sorted(summary["name"].to_list()) == [f"model.layers.{i}" for i in range(4)]
    truth = pl.DataFrame(kineto_memory_truth("m01_train_memory"))
    assert set(summary["mean_net_growth_bytes"].to_list()) == {float((truth["exit"] - truth["entry"]).unique().item())}


def test_model_against_measured_compares_the_decode_forwards_only() -> None:
    """``tracekit.model.compare`` with the program's own model (4 layers, hidden 1024): a decode
    model sees the 22 one-token forwards, not the two prompts' (forwards 0 and 12; the 64-token
    prompt at batch 1 takes 1.2× a decode forward's GPU time, which the time rule alone took
    for a decode), and each of the 4 layers gets a row per forward."""
    from tracekit.model.compare import compare

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = compare(_trace("m02_generate_memory"), KINETO_MEMORY / "m02_config.json")
    steps = sorted(rows["step"].unique().to_list())
    assert steps == [s for s in range(24) if s not in (0, 12)]
    assert set(rows["phase"].to_list()) == {"decode"}
    assert rows.filter(pl.col("layer").is_not_null()).group_by("step").len()["len"].unique().to_list() == [4]
