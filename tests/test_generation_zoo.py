"""Generation runs read right when they differ from ours (issue 42): the forward pass as the unit.

The zoo (sample_traces/zoo/generation): 20 programs written as users write them — Llama,
Qwen3, GPT-2, Mixtral-style MoE and T5 shapes of 2 to 32 layers; batch 1, 2, 4, 8 (padded) and
64; prompts of 16 to 8,192 tokens varying inside a run; greedy, sampling, beam search and
assisted decoding; a static cache compiled into CUDA graphs; streaming from a worker thread; a
slow host (Python sampling, a Python logits processor); forked and spawned children; a
continuous-batching engine; a diffusion-style sampler and an image classifier that must not get
tokens — each captured whole on an H200 and printing its own clock (CUDA events at each
forward's start and end, a streamer's token times: ``clock.py``). Programs g03, g06, g08, g11,
g13, g16, g17 and g18 were held out: looked at only once the rule was written.

Checked against the programs' clocks, never against what tracekit printed: the kind, the
requests and which are warm-up, the forwards per model, time to first token and time per
output token within 10 %. The three field captures of ``../shared/field`` (other programs,
with their truths) are read when present. And one reading at every size: the same structure
from the whole tables and from the column-at-a-time path of big exports.
"""

from __future__ import annotations

import functools
import re
import warnings

import polars as pl
import pytest

import tracekit
from tracekit.diagnosis import context as context_mod
from tracekit.diagnosis import ops_by_column as obc

from .conftest import ZOO, field_capture, force_by_column, zoo_capture, zoo_capture_names, zoo_truth

#: Programs that generate tokens (the others: g14 serves, g15 denoises, g16 classifies images).
GENERATION = [n for n in zoo_capture_names() if not n.startswith(("g14_", "g15_", "g16_"))]
#: Decoder-only programs without a draft model: their prompt's rows are batch × prompt (× beams).
DECODER_ONLY = [n for n in GENERATION if not n.startswith(("g09_", "g17_"))]


@functools.cache
def _structure(path: str):  # noqa: ANN202 - RunStructure
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tracekit.structure(tracekit.open(path))


def _zoo(name: str):  # noqa: ANN202
    return _structure(str(zoo_capture(name)))


def _close(got: float | None, want: float, tol: float = 0.10) -> bool:
    return got is not None and abs(got - want) <= tol * want


def test_every_program_has_its_capture() -> None:
    """Each program of the zoo has its capture, its log with a TRUTH line and its command, and
    the capture stays small (≤ 3 MB compressed)."""
    programs = sorted(p.stem for p in ZOO.glob("g[0-9][0-9]_*.py"))
    assert len(programs) >= 14
    assert programs == zoo_capture_names()
    for name in programs:
        folder = ZOO / "runs" / name
        assert (folder / "command.txt").is_file() and zoo_truth(name)["program"] == name
        assert (folder / f"{name}.sqlite.xz").stat().st_size <= 3 * 1024 * 1024, name


@pytest.mark.parametrize("name", GENERATION)
def test_requests_as_the_program_ran_them(name: str) -> None:
    """A generation of as many requests as the program made, the same ones warm-up, and as many
    forwards of the model it watched as its hooks counted."""
    s = _zoo(name)
    truth = zoo_truth(name)["requests"]
    assert s.kind == "generation", s.headline()
    assert s.requests.height == len(truth), s.requests
    assert s.requests["warmup"].to_list() == [r["warmup"] for r in truth]
    per_model: dict[str, int] = {}
    for r in truth:
        for m, n in r["forwards"].items():
            per_model[m] = per_model.get(m, 0) + n
    if per_model:  # the models the program hooked (none: g07, whose decode is compiled)
        want = max(per_model.values())  # the main model runs the most forwards (a T5 decoder, a draft's target)
        assert s.reading is not None and s.reading.main_forwards.filter(pl.col("attention").is_not_null()).height == want


@pytest.mark.parametrize("name", GENERATION)
def test_token_times_match_the_programs_clock(name: str) -> None:
    """Per steady request, time to first token (the request's first forward starting to its
    first token reaching the host, on the GPU's clock: CUDA events in the program's forward
    hook and streamer) and time per output token (the interval between its decode forwards'
    starts, the program's events; the streamer's interval where no hook could run, g07) within
    10 % of the program's own figures."""
    s = _zoo(name)
    truth = zoo_truth(name)["requests"]
    for got, want in zip(s.requests.iter_rows(named=True), truth, strict=True):
        if want["warmup"]:
            continue
        ttft = want.get("ttft_ms") or want.get("ttft_host_ms")
        assert _close(got["ttft_ns"] / 1e6, ttft), (got, want)
        tpot = want.get("fwd_interval_ms") or want.get("tpot_ms")
        assert _close(got["tpot_median_ns"] / 1e6, tpot), (got, want)


@pytest.mark.parametrize("name", DECODER_ONLY)
def test_new_tokens_and_prompt_rows(name: str) -> None:
    """New tokens per request are the program's; the prompt's forward gathered batch × prompt
    (× beams) embedding rows wherever the trace shows them (PyTorch's gather kernel for more
    than 16 rows)."""
    s = _zoo(name)
    for got, want in zip(s.requests.iter_rows(named=True), zoo_truth(name)["requests"], strict=True):
        assert got["new_tokens"] == want["new"]
        rows = want["batch"] * want.get("beams", 1) * want["prompt"]
        if rows > 16:
            assert got["prompt_rows"] == rows, (got, want)
        else:
            assert got["prompt_rows"] is None


def test_assisted_generation_counts_the_draft_apart() -> None:
    """Speculative decoding: the 12-layer target's verify forwards are the steps, the 2-layer
    draft's forwards are counted per request (as many as the program's hook saw), and the
    tokens each verify step accepted are not claimed."""
    s = _zoo("g09_assisted")
    truth = zoo_truth("g09_assisted")["requests"]
    assert s.reading is not None and s.reading.passes.depths == (12, 2)
    assert s.requests["draft_forwards"].to_list() == [r["forwards"].get("draft2", 0) for r in truth]
    assert s.requests.filter(pl.col("draft_forwards") > 0)["new_tokens"].null_count() == 2
    assert any("speculative decoding" in e for e in s.evidence)


def test_encoder_decoder() -> None:
    """T5: the encoder's stack runs once per request before the decoder's first step; the
    request's first token counts from the encoder's start (the program's clock starts there)."""
    s = _zoo("g17_t5")
    roles = s.reading.forwards["role"].value_counts() if s.reading is not None else None
    assert roles is not None and roles.filter(pl.col("role") == "encoder")["count"].item() >= 2
    steady = s.requests.filter(~pl.col("warmup"))
    truth = [r for r in zoo_truth("g17_t5")["requests"] if not r["warmup"]]
    assert [round(r / 1e6) for r in steady["ttft_ns"]] == pytest.approx([t["ttft_ms"] for t in truth], rel=0.02)


def test_continuous_batching_engine() -> None:
    """Prompts' forwards in the same engine step as other requests' decode, with decode batches
    of varying rows: serving. Engine steps and prompts as the engine's own log counted them
    (its start-up warm-up's 4 steps and 1 prompt included)."""
    s = _zoo("g14_cb_engine")
    truth = zoo_truth("g14_cb_engine")
    assert s.kind == "serving", s.headline()
    assert s.steps_table.height == truth["test_steps"] + truth["load_steps"] + 4
    assert int(s.steps_table["prefills"].sum()) == truth["prefills"] + len(truth["test_request"]) + 1
    assert _close(float(s.steps_table.filter(~pl.col("warmup"))["interval_ns"].median()) / 1e6,  # type: ignore[arg-type]
                  truth["step_interval_median_ms"])


def test_a_diffusion_sampler_gets_no_tokens() -> None:
    """A denoiser run 20 times per image batch: its forward passes (6 blocks, attention as
    softmax) are the iterations, and nothing makes them tokens."""
    s = _zoo("g15_diffusion")
    truth = zoo_truth("g15_diffusion")
    assert s.kind == "inference" and s.requests.height == 0
    assert s.total == sum(r["forwards"]["denoiser"] for r in truth["requests"])
    assert "not a generation" in s.evidence[0]


def test_an_image_classifier_gets_no_tokens() -> None:
    """A ResNet-50's argmax and copy of the classes to the host after each batch look like a
    decode step's, but no embedding lookup feeds it: no tokens, no requests."""
    s = _zoo("g16_vision")
    assert s.kind not in ("generation", "serving") and s.requests.height == 0


# -- one reading at every size ----------------------------------------------------------------


@pytest.fixture
def by_column(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> list[obc.OpsByColumn]:
    """Every export read as a big one is: a column at a time from a real column cache, names
    as integer codes, and the generation phases without the launch join."""
    monkeypatch.setattr(context_mod, "PHASES_ANY_OPS", 0)
    return force_by_column(monkeypatch, tmp_path_factory.mktemp("zoo_cache"))


_SAME = ["request", "warmup", "cold", "prefill_steps", "decode_steps", "ttft_ns", "tpot_median_ns", "new_tokens", "prompt_rows"]


@pytest.mark.parametrize("name", ["g19_serve_like_short", "g09_assisted", "g20_llama_eager_8k"])
def test_the_same_reading_from_the_big_export_path(name: str, by_column: list[obc.OpsByColumn]) -> None:
    """The column-at-a-time path of exports past 200,000 kernels gives the same structure as the
    whole tables: no size threshold changes the answer."""
    whole = _zoo(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        big = tracekit.structure(tracekit.open(zoo_capture(name)))
    assert by_column, "the by-column path did not run"
    assert big.headline() == whole.headline()
    assert big.requests.select(_SAME).equals(whole.requests.select(_SAME))


# -- the field captures (../shared/field) -------------------------------------------------------


def _field(name: str):  # noqa: ANN202
    return _structure(str(field_capture(name)))


def test_field_generate_calls() -> None:
    """Three generate() calls (a 4-token warm-up, then two of 48 tokens in NVTX ranges
    generate.0 and generate.1), batch 8, 28 layers, H100: 3 requests named by their ranges, the
    first a warm-up, generate.0 still cold (92.9 ms per token) and generate.1 warm (36.8 ms)."""
    s = _field("hf_generate_calls_h100")
    req = s.requests
    assert s.kind == "generation" and req.height == 3
    assert req["warmup"].to_list() == [True, False, False] and req["cold"].to_list() == [False, True, False]
    assert req["name"].to_list() == [None, "generate.0", "generate.1"]
    assert _close(req["tpot_median_ns"][1] / 1e6, 92.9) and _close(req["tpot_median_ns"][2] / 1e6, 36.8)
    assert "time per output token 36.8 ms" in s.headline()


@pytest.mark.parametrize("name", ["serve_requests_h200", "serve_engine_fork_h200"])
def test_field_batch_one_requests(name: str) -> None:
    """A warm-up and four requests of prompts 512/128/1024/256, batch 1, a slow host (the engine
    variant in a forked child, the capture ending inside request 4): a generation of 5 requests,
    the first a warm-up, 28 attention kernels per forward, and the field's truth for the time
    per output token: 115.6 / 122.8 / 112.7 / 112.7 ms median decode spacing per request, and
    118.6 ms mean decode spacing for the engine in a child."""
    s = _field(name)
    assert s.kind == "generation" and s.requests.height == 5, s.headline()
    assert s.requests["warmup"].to_list() == [True, False, False, False, False]
    assert s.reading is not None and s.reading.passes.depths == (28,)
    steady = s.requests.filter(~pl.col("warmup"))["tpot_median_ns"] / 1e6
    if name == "serve_requests_h200":
        assert [round(t, 1) for t in steady] == pytest.approx([115.6, 122.8, 112.7, 112.7], abs=0.6)
    else:  # the field's truth for the engine: 118.6 ms mean decode spacing over the steady requests
        assert any("may have ended inside it" in e for e in s.evidence)  # the capture ends inside request 4
        st = s.steady_steps.filter(pl.col("phase") == "decode").sort("start_ns")
        spacing = st.select(pl.col("start_ns").diff().over("request")).to_series().drop_nulls()
        assert _close(float(spacing.mean()) / 1e6, 118.6), spacing.mean()  # type: ignore[arg-type]


def test_field_long_and_zoo_short_capture_of_one_program() -> None:
    """serve_like.py's requests run, long (the field's 217,644 kernels, past the big-export
    threshold) and short (the zoo's g19: the warm-up and the first request): read alike — a
    generation whose warm-up is the 4-token call and whose first request makes 32 tokens in 31
    decode forwards after its 512-token prompt."""
    long, short = _field("serve_requests_h200"), _zoo("g19_serve_like_short")
    for s in (long, short):
        first = s.requests.row(1, named=True)
        assert s.requests["warmup"][0] and (first["prompt_rows"], first["new_tokens"], first["decode_steps"]) == (512, 32, 31)
    assert re.sub(r"[\d,]", "", long.evidence[0]) == re.sub(r"[\d,]", "", short.evidence[0])
