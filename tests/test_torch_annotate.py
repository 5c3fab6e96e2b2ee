"""Per-module NVTX ranges (tracekit.torch.annotate and ``capture --annotate-torch``) on real
PyTorch modules shaped like a Hugging Face decoder (``model.layers.N.self_attn``).

The ranges' names and nesting are read through a recorder put in place of the NVTX emitter
(a CPU-only PyTorch cannot emit NVTX); that the ranges reach nsys is checked on the GPU capture
``sample_traces/llm_stacks/hf_generate_eager`` (tests/test_llm_stacks.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import tracekit.torch as tk_torch  # noqa: E402
from tracekit.capture import torch_nvtx  # noqa: E402
from tracekit.capture.prepare import AUTOLOAD_DIR, annotation_env  # noqa: E402
from tracekit.errors import CaptureError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


class Attn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(8, 8)
        self.o_proj = nn.Linear(8, 8)

    def forward(self, x):  # type: ignore[no-untyped-def]
        return self.o_proj(self.q_proj(x))


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.input_layernorm = nn.LayerNorm(8)
        self.self_attn = Attn()
        self.mlp = nn.Sequential(nn.Linear(8, 16), nn.SiLU(), nn.Linear(16, 8))

    def forward(self, x):  # type: ignore[no-untyped-def]
        return x + self.mlp(x + self.self_attn(self.input_layernorm(x)))


class Inner(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(32, 8)
        self.layers = nn.ModuleList(Layer() for _ in range(n))
        self.norm = nn.LayerNorm(8)

    def forward(self, ids):  # type: ignore[no-untyped-def]
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class TinyForCausalLM(nn.Module):
    def __init__(self, n: int = 2) -> None:
        super().__init__()
        self.model = Inner(n)
        self.lm_head = nn.Linear(8, 32)

    def forward(self, ids):  # type: ignore[no-untyped-def]
        return self.lm_head(self.model(ids))


class Recorder:
    available = True

    def __init__(self) -> None:
        self.events: list[tuple[str, str | None]] = []

    def push(self, name: str) -> None:
        self.events.append(("push", name))

    def pop(self) -> None:
        self.events.append(("pop", None))

    def names(self) -> list[str]:
        return [n for kind, n in self.events if kind == "push" and n is not None]

    def balanced(self) -> bool:
        depth = 0
        for kind, _ in self.events:
            depth += 1 if kind == "push" else -1
            if depth < 0:
                return False
        return depth == 0


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    rec = Recorder()
    monkeypatch.setattr(torch_nvtx, "_emitter", rec)
    return rec


def test_module_levels_join_list_indices() -> None:
    assert torch_nvtx.module_level("") == 0
    assert torch_nvtx.module_level("model") == 1
    assert torch_nvtx.module_level("model.layers.3") == 2
    assert torch_nvtx.module_level("model.layers.3.self_attn") == 3
    assert torch_nvtx.module_level("model.layers.3.mlp.0") == 3


def test_annotate_names_ranges_by_path_and_nests_them(recorder: Recorder) -> None:
    m = TinyForCausalLM(2)
    ids = torch.tensor([[1, 2, 3]])
    with tk_torch.annotate(m, depth=3) as ann:
        m(ids)
    names = recorder.names()
    assert names[0] == "TinyForCausalLM"
    assert names[1:3] == ["model", "model.embed_tokens"]
    assert "model.layers.1.self_attn" in names and "model.layers.0.mlp" in names
    assert not any(n.endswith("q_proj") for n in names)  # level 4: below depth 3
    assert "model.layers" not in names  # a ModuleList is never called
    assert recorder.balanced()
    # nesting: self_attn's push comes after its layer's and before the layer's pop
    ev = recorder.events
    i_layer = ev.index(("push", "model.layers.1"))
    i_attn = ev.index(("push", "model.layers.1.self_attn"))
    assert i_layer < i_attn
    assert ann.ranges_pushed == len(names)
    # removed: no more ranges
    recorder.events.clear()
    m(ids)
    assert recorder.events == []


def test_include_exclude_and_depth_none(recorder: Recorder) -> None:
    m = TinyForCausalLM(3)
    ids = torch.tensor([[4, 5]])
    with tk_torch.annotate(m, depth=None, include=r"layers\.\d+$", exclude=r"layers\.1$"):
        m(ids)
    assert recorder.names() == ["model.layers.0", "model.layers.2"]


def test_depth_zero_is_the_root_only(recorder: Recorder) -> None:
    m = TinyForCausalLM(2)
    with tk_torch.annotate(m, depth=0):
        m(torch.tensor([[1]]))
        m(torch.tensor([[2]]))
    assert recorder.names() == ["TinyForCausalLM", "TinyForCausalLM"]


def test_bad_options_are_one_line_errors() -> None:
    with pytest.raises(ValueError, match="depth must be a whole number"):
        tk_torch.annotate(TinyForCausalLM(1), depth=-1)
    with pytest.raises(ValueError, match="is not a regular expression"):
        tk_torch.annotate(TinyForCausalLM(1), include="layers.(")


def test_backward_ranges(recorder: Recorder) -> None:
    m = TinyForCausalLM(1)
    with tk_torch.annotate(m, depth=2, backward=True):
        out = m(torch.tensor([[1, 2]]))
        recorder.events.clear()
        out.sum().backward()
    names = recorder.names()
    assert "model.layers.0.backward" in names and "lm_head.backward" in names
    assert recorder.balanced()


def test_global_hooks_name_every_root_tree(recorder: Recorder) -> None:
    m1, m2 = TinyForCausalLM(1), TinyForCausalLM(2)
    ann = torch_nvtx.install_global(depth=2)
    try:
        m1(torch.tensor([[1]]))
        m2(torch.tensor([[1]]))
        m2.model(torch.tensor([[1]]))  # a known submodule called on its own keeps its path
    finally:
        ann.remove()
    names = recorder.names()
    assert names.count("TinyForCausalLM") == 2
    assert names[-5:] == ["model", "model.embed_tokens", "model.layers.0", "model.layers.1", "model.norm"]
    assert names.count("model") == 3
    assert recorder.balanced()
    recorder.events.clear()
    m1(torch.tensor([[1]]))
    assert recorder.events == []  # removed


@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")  # Dynamo's own
def test_compile_wrapper_is_seen_through(recorder: Recorder) -> None:
    m = TinyForCausalLM(1)
    compiled = torch.compile(m, backend="eager")
    with tk_torch.annotate(compiled, depth=1):
        compiled(torch.tensor([[1, 2]]))
    # the wrapper's own call is outside the compiled code: its range carries the model's class;
    # inside Dynamo's tracing no range is pushed
    assert recorder.names()[0] == "TinyForCausalLM"
    assert recorder.balanced()


SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    sys.path.insert(0, {tests!r})
    from test_torch_annotate import TinyForCausalLM
    mod = sys.modules.get("_tracekit_torch_nvtx")
    names = []
    if mod is not None:
        mod._nvtx().push = names.append
    m = TinyForCausalLM(2)
    m(torch.tensor([[1, 2]]))
    print(json.dumps({{"loaded": mod is not None, "names": names}}))
    """
)


def _run_script(tmp_path: Path, env: dict[str, str]) -> dict:
    script = tmp_path / "prog.py"
    script.write_text(SCRIPT.format(tests=str(ROOT / "tests")))
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_autoload_ranges_an_unmodified_script(tmp_path: Path) -> None:
    env = {**os.environ, **annotation_env({"depth": 2, "include": [], "exclude": ["embed"], "backward": False}, os.environ.get("PYTHONPATH"))}
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(AUTOLOAD_DIR)
    got = _run_script(tmp_path, env)
    assert got["loaded"]
    assert got["names"] == ["TinyForCausalLM", "model", "model.layers.0", "model.layers.1", "model.norm", "lm_head"]


def test_autoload_is_inert_without_the_variable(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(AUTOLOAD_DIR), os.environ.get("PYTHONPATH", "")])}
    env.pop("TRACEKIT_ANNOTATE_TORCH", None)
    assert _run_script(tmp_path, env) == {"loaded": False, "names": []}


def test_autoload_runs_the_sitecustomize_it_hides(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIR_SITECUSTOMIZE'] = 'ran'\n")
    env = {**os.environ, **annotation_env({"depth": 1}, str(theirs))}
    code = "import os; print(os.environ.get('THEIR_SITECUSTOMIZE'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "ran"


def test_autoload_bad_variable_is_one_line_and_the_program_runs(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(AUTOLOAD_DIR), "TRACEKIT_ANNOTATE_TORCH": "{not json"}
    out = subprocess.run([sys.executable, "-c", "print('ok')"], env=env, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "ok"
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("tracekit: TRACEKIT_ANNOTATE_TORCH is not valid")


def test_capture_cli_annotates_the_program(tmp_path: Path) -> None:
    """``tracekit capture none --annotate-torch 2``: the real CLI, the real start-up hook, a
    program that knows nothing of tracekit; the experiment records the variables."""
    script = tmp_path / "prog.py"
    script.write_text(SCRIPT.format(tests=str(ROOT / "tests")))
    out = subprocess.run(
        [sys.executable, "-m", "tracekit.cli.main", "capture", "none", "--annotate-torch", "2", "--annotate-exclude", "embed",
         "--out", str(tmp_path / "runs"), "--quiet", "--", sys.executable, str(script)],
        capture_output=True, text=True, timeout=180, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr
    (folder,) = (tmp_path / "runs").iterdir()
    stdout = (folder / "run.stdout.log").read_text()
    got = json.loads(stdout.strip().splitlines()[-1])
    assert got["names"] == ["TinyForCausalLM", "model", "model.layers.0", "model.layers.1", "model.norm", "lm_head"]
    env = json.loads((folder / "env.json").read_text())
    assert json.loads(env["TRACEKIT_ANNOTATE_TORCH"]) == {"backward": False, "depth": 2, "exclude": ["embed"], "include": []}
    config = (folder / "config.yaml").read_text()
    assert "annotate_torch:" in config and "depth: 2" in config


def test_annotate_option_values() -> None:
    from tracekit.capture.options import Experiment
    from tracekit.cli.capture import expand_optional_values

    assert Experiment(command=["x"], annotate_torch=True).annotate_torch == {"depth": 3, "include": [], "exclude": [], "backward": False}
    assert Experiment(command=["x"], annotate_torch=5).annotate_torch["depth"] == 5
    assert Experiment(command=["x"], annotate_torch=False).annotate_torch is None
    with pytest.raises(CaptureError, match="unknown annotate_torch option"):
        Experiment(command=["x"], annotate_torch={"deep": 2})
    with pytest.raises(CaptureError, match="annotate_torch: depth must be"):
        Experiment(command=["x"], annotate_torch={"depth": "two"})
    assert expand_optional_values(["capture", "nsys", "--annotate-torch", "--trace", "cuda", "--", "p", "--annotate-torch"]) == [
        "capture", "nsys", "--annotate-torch=default", "--trace", "cuda", "--", "p", "--annotate-torch"]
    assert expand_optional_values(["capture", "nsys", "--annotate-torch", "all", "--", "p"])[2] == "--annotate-torch=all"


def test_dry_run_shows_the_environment() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tracekit.cli.main", "capture", "nsys", "--dry-run", "--annotate-torch", "--", "python3", "x.py"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[0]
    assert first.startswith("env: PYTHONPATH=") and str(AUTOLOAD_DIR) in first and '"depth": 3' in first
