"""Mode ``torch`` (``tracekit capture torch``): real programs under the start-up hook's
``torch.profiler``, on this machine's CPU-only PyTorch, so every trace they write is CPU-only and
the opening step must say so; the traces themselves are read back as gzipped JSON. The opening
step on GPU traces runs on real ones from ``sample_traces/kineto``, copied in by the program."""

from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracekit.capture import Experiment, TorchOptions
from tracekit.capture.prepare import PROFILE_ENV, check_start_up_hook, plan, program_env
from tracekit.capture.torch_profile import _module_run
from tracekit.cli.capture import app
from tracekit.errors import CaptureError

PY = sys.executable

#: A tiny training loop: 8 optimizer steps of an nn.Linear with SGD.
TRAIN = """\
import torch

model = torch.nn.Linear(8, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(8):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("trained", flush=True)
"""


@pytest.fixture
def cli() -> CliRunner:
    return CliRunner()


@pytest.fixture
def train(tmp_path: Path) -> Path:
    pytest.importorskip("torch")
    path = tmp_path / "train.py"
    path.write_text(TRAIN)
    return path


def _run_folder(out: Path) -> Path:
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    return folder


def _profiler_steps(trace: Path) -> list[int]:
    """The N of every ``ProfilerStep#N`` range in a gzipped torch.profiler trace."""
    with gzip.open(trace, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    steps = {int(m.group(1)) for e in events if (m := re.fullmatch(r"ProfilerStep#(\d+)", str(e.get("name", ""))))}
    return sorted(steps)


def test_schedule_records_the_steps_after_skip(cli: CliRunner, train: Path, tmp_path: Path) -> None:
    out = tmp_path / "runs"
    result = cli.invoke(app, ["torch", "--skip", "2", "--steps", "3", "-o", str(out), "--", PY, str(train)])
    folder = _run_folder(out)
    (trace,) = folder.glob("*.pt.trace.json.gz")
    assert re.fullmatch(r".+_\d+\.pt\.trace\.json\.gz", trace.name)  # <host>_<pid>: no rank outside torchrun
    assert _profiler_steps(trace) == [2, 3, 4]  # 2 skipped (the second warms up), 3 recorded
    assert (folder / "torch.stdout.log").read_text() == "trained\n"
    record = json.loads((folder / "experiment.json").read_text())
    assert record["mode"] == "torch" and record["reports"] == {"torch": [trace.name]}
    assert record["target_exit_code"] == 0 and record["options"]["torch"]["skip"] == 2
    profile = json.loads(json.loads((folder / "env.json").read_text())[PROFILE_ENV])
    assert profile == {"out": str(folder.resolve()), "skip": 2, "steps": 3, "record_shapes": True,
                       "profile_memory": False, "with_stack": False, "with_modules": False}
    # the opening step on this CPU-only trace: one line saying why, no traceback
    assert result.exit_code == 2, result.output
    assert "has no GPU activity" in result.output and "torch saw no CUDA device" in result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
    assert "ProfilerStep#2..#4" in result.output
    assert "no GPU activity" in record["error"] and record["status"] == "failed"
    summary = json.loads((folder / "summary.json").read_text())["torch"]
    assert summary["no_gpu_activity"] is True and summary["profiler_steps"] == [2, 3, 4]


def test_whole_run_has_a_range_per_optimizer_step(cli: CliRunner, train: Path, tmp_path: Path) -> None:
    out = tmp_path / "runs"
    result = cli.invoke(app, ["torch", "-q", "--steps", "0", "--no-record-shapes", "-o", str(out), "--", PY, str(train)])
    assert result.exit_code == 2 and "no GPU activity" in result.output
    (trace,) = _run_folder(out).glob("*.pt.trace.json.gz")
    # ProfilerStep#0 runs from the start to the first step; each of the 8 steps opens the next
    assert _profiler_steps(trace) == list(range(9))


def test_schedule_longer_than_the_run(cli: CliRunner, train: Path, tmp_path: Path) -> None:
    """More steps asked than the program takes: what was recorded is written once, and said;
    a skip the program never gets past records nothing, and that is the one-line error."""
    out = tmp_path / "long"
    result = cli.invoke(app, ["torch", "-q", "--skip", "1", "--steps", "20", "-o", str(out), "--", PY, str(train)])
    folder = _run_folder(out)
    (trace,) = folder.glob("*.pt.trace.json.gz")
    assert _profiler_steps(trace) == list(range(1, 8))
    record = json.loads((folder / "experiment.json").read_text())
    assert any("fewer than the schedule's 21" in w for w in record["warnings"]), record["warnings"]
    assert not any("could not" in w for w in record["warnings"]), record["warnings"]
    assert "fewer than" in result.output

    out = tmp_path / "never"
    result = cli.invoke(app, ["torch", "-q", "--skip", "10", "--steps", "2", "-o", str(out), "--", PY, str(train)])
    folder = _run_folder(out)
    assert not list(folder.glob("*.pt.trace.json.gz"))
    record = json.loads((folder / "experiment.json").read_text())
    assert record["error"].startswith("no torch.profiler trace: the program stepped its optimizer 8 times, not past")
    assert result.exit_code == 2 and "nothing was recorded" in result.output


def test_a_program_without_torch_says_why_no_trace(cli: CliRunner, tmp_path: Path) -> None:
    out = tmp_path / "runs"
    result = cli.invoke(app, ["torch", "-q", "-o", str(out), "--", PY, "-c", "print('hi')"])
    assert result.exit_code == 2
    folder = _run_folder(out)
    assert not list(folder.glob("*.pt.trace.json.gz"))
    error = json.loads((folder / "experiment.json").read_text())["error"]
    assert "never imported torch" in error and "os._exit" in error
    assert "never imported torch" in result.output and "Traceback" not in result.output


def test_a_failing_program_gives_its_exit_code(cli: CliRunner, tmp_path: Path) -> None:
    out = tmp_path / "runs"
    result = cli.invoke(app, ["torch", "-q", "-o", str(out), "--", PY, "-c", "import sys; sys.exit(3)"])
    record = json.loads((_run_folder(out) / "experiment.json").read_text())
    assert record["target_exit_code"] == 3 and record["status"] == "failed"
    assert record["error"] == "the program exited with code 3 before a torch.profiler trace was written; see torch.stderr.log"
    assert "exited with code 3" in result.output and result.exit_code == 2


@pytest.mark.slow
def test_torchrun_writes_one_trace_per_worker(cli: CliRunner, train: Path, tmp_path: Path) -> None:
    """``python -m torch.distributed.run`` (CPU, no process group): the two workers inherit the
    hook and write a trace each, named by rank; the launcher, which imports torch too, writes none."""
    out = tmp_path / "runs"
    result = cli.invoke(app, ["torch", "-q", "--skip", "1", "--steps", "2", "-o", str(out), "--",
                              PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(train)])
    folder = _run_folder(out)
    traces = sorted(folder.glob("*.pt.trace.json.gz"))
    assert [re.sub(r"^.+_\d+\.", "", t.name) for t in traces] == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]
    assert [_profiler_steps(t) for t in traces] == [[1, 2], [1, 2]]
    record = json.loads((folder / "experiment.json").read_text())
    assert record["target_exit_code"] == 0 and record["reports"]["torch"] == [t.name for t in traces]
    assert record["error"].startswith("the 2 traces have no GPU activity")
    assert result.exit_code == 2 and "Traceback" not in result.output


#: Stands in for a GPU run on this CPU machine: copies real GPU traces (sample_traces/kineto,
#: captured by torch.profiler on GPUs) to where the hook would write them, named by rank.
COPY_IN = """\
import json, os, shutil, sys
out = json.loads(os.environ["TRACEKIT_TORCH_PROFILE"])["out"]
for rank, src in enumerate(sys.argv[1:]):
    shutil.copy(src, os.path.join(out, f"gpuhost_{100 + rank}.rank{rank}.pt.trace.json.gz"))
"""


def test_opening_step_on_gpu_traces(cli: CliRunner, tmp_path: Path) -> None:
    """The opening step on real GPU traces (two ranks): complete, the kernels summarized over
    both, each trace's ProfilerStep ranges listed, and the call that opens them printed."""
    from tests.conftest import SAMPLES

    ranks = [SAMPLES / "kineto" / "sampled_2rank" / f"sampled_rank-{r}.json.gz" for r in (0, 1)]
    script = tmp_path / "copy_in.py"
    script.write_text(COPY_IN)
    out = tmp_path / "runs"
    result = cli.invoke(app, ["torch", "-q", "-o", str(out), "--", PY, str(script), *map(str, ranks)])
    assert result.exit_code == 0, result.output
    folder = _run_folder(out)
    summary = json.loads((folder / "summary.json").read_text())["torch"]
    assert summary["devices"] == [0, 1] and summary["kernel_count"] > 0 and "error" not in summary
    assert summary["top_kernels"][0]["name"].startswith("ncclKernel_SendRecv")
    assert [r["profiler_steps"] for r in summary["reports"].values()] == [[551, 552], [551, 552]]
    assert result.output.count("(ProfilerStep#551..#552)") == 2
    assert f"tracekit.open_many('{folder}')" in result.output.replace("\n", "")


def test_python_api(train: Path, tmp_path: Path) -> None:
    from tracekit.capture import torch as capture_torch
    from tracekit.errors import TraceFormatError

    result = capture_torch([PY, str(train)], TorchOptions(skip=1, steps=1), out=str(tmp_path), check=False)
    (trace,) = result.reports["torch"]
    assert result.target_exit_code == 0 and "no GPU activity" in (result.error or "")
    assert _profiler_steps(trace) == [1]
    with pytest.raises(TraceFormatError, match="no GPU activity"):
        result.open()  # mode torch opens its trace by default
    with pytest.raises(CaptureError, match="no GPU activity"):
        capture_torch([PY, str(train)], TorchOptions(skip=1, steps=1), out=str(tmp_path))


def test_dry_run_prints_the_environment_and_the_program(cli: CliRunner) -> None:
    result = cli.invoke(app, ["torch", "--dry-run", "--skip", "1", "--steps", "0", "--with-stack", "--",
                              "python3", "train.py", "--lr", "1"])
    assert result.exit_code == 0, result.output
    env_line, run_line = result.output.strip().splitlines()
    assert run_line == "torch: python3 train.py --lr 1"
    assert "PYTHONPATH=" in env_line and "torch_autoload" in env_line
    config = json.loads(re.search(r"TRACEKIT_TORCH_PROFILE='(\{.*?\})'", env_line).group(1))  # type: ignore[union-attr]
    assert config["skip"] == 1 and config["steps"] == 0 and config["with_stack"] is True


#: A model of two blocks called three times, under the optimizer of TRAIN.
MODULES = """\
import torch

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
    def forward(self, x):
        return torch.relu(self.fc(x))

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])
    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x

model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.randn(4, 8)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_annotate_torch_gives_torch_profiler_ranges(cli: CliRunner, tmp_path: Path) -> None:
    """``--annotate-torch`` in mode torch: each module's forward is a ``record_function`` range
    (a ``user_annotation`` event of the Kineto trace: NVTX reaches no profiler there), named by
    its path, once per call, nested as the modules are."""
    pytest.importorskip("torch")
    program = tmp_path / "modules.py"
    program.write_text(MODULES)
    out = tmp_path / "runs"
    result = cli.invoke(app, ["torch", "-q", "--steps", "0", "--annotate-torch=default", "-o", str(out), "--", PY, str(program)])
    assert result.exit_code == 2 and "no GPU activity" in result.output  # CPU-only here: the opening step says so
    (trace,) = _run_folder(out).glob("*.pt.trace.json.gz")
    with gzip.open(trace, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    # PyTorch's own (ProfilerStep#N, Optimizer.step#SGD.step …) left aside
    ranges = [e for e in events if e.get("cat") == "user_annotation" and re.match(r"Net$|blocks\.", str(e["name"]))]
    names = [e["name"] for e in sorted(ranges, key=lambda e: e["ts"])]
    assert names == ["Net", "blocks.0", "blocks.0.fc", "blocks.1", "blocks.1.fc"] * 3
    net, block, fc = (next(e for e in ranges if e["name"] == n) for n in ("Net", "blocks.0", "blocks.0.fc"))
    assert net["ts"] <= block["ts"] <= fc["ts"] and fc["ts"] + fc["dur"] <= block["ts"] + block["dur"] <= net["ts"] + net["dur"]


def test_options_and_checks() -> None:
    exp = Experiment(command=["python3", "train.py"], mode="torch", torch={"steps": 0})
    assert exp.torch == TorchOptions(skip=3, steps=0) and plan(exp) == [("torch", ["python3", "train.py"])]
    env = program_env(exp, "/runs/x")
    assert env["PYTHONPATH"].split(":")[0].endswith("torch_autoload")
    assert json.loads(env[PROFILE_ENV])["out"] == "/runs/x"
    assert PROFILE_ENV not in program_env(exp.replace(mode="none"))
    with pytest.raises(CaptureError, match="torch.steps must be a whole number"):
        TorchOptions(steps=-1)
    both = program_env(Experiment(command=["python3", "x.py"], mode="torch", annotate_torch=2), "/runs/x")
    assert json.loads(both["TRACEKIT_ANNOTATE_TORCH"])["depth"] == 2 and PROFILE_ENV in both
    with pytest.raises(CaptureError, match="already profiles every torchrun worker"):
        Experiment(command=["torchrun", "x.py"], mode="torch", per_rank=True)
    with pytest.raises(CaptureError, match="skips the start-up hook"):
        check_start_up_hook(["python3", "-u", "-I", "train.py"])
    check_start_up_hook(["python3", "-u", "-W", "ignore", "train.py", "-I"])  # the program's own -I


@pytest.mark.parametrize(("argv", "module"), [
    (["python", "-m", "torch.distributed.run", "--nproc_per_node=2", "x.py"], "torch.distributed.run"),
    (["python", "-u", "-mtorch.distributed.launch", "x.py"], "torch.distributed.launch"),
    (["python", "-W", "ignore", "-m", "pkg.train"], "pkg.train"),
    (["python", "x.py", "-m", "torch.distributed.run"], None),
    (["python", "-c", "pass", "-m", "torch.distributed.run"], None),
])
def test_launcher_run_as_a_module(argv: list[str], module: str | None) -> None:
    assert _module_run(argv) == module


@pytest.mark.notebook
def test_capture_form_torch_mode(tmp_path: Path) -> None:
    pytest.importorskip("ipywidgets", reason="needs the notebook extra")
    from tracekit.widgets import CaptureForm

    form = CaptureForm("python3 train.py --lr 1", mode="torch", out=str(tmp_path))
    assert "torch" in form.mode_box.options
    assert form.fields[("torch", "skip")].value == 3 and form.fields[("torch", "steps")].value == 5
    form.fields[("torch", "skip")].value = 1
    form.fields[("torch", "steps")].value = 0  # 0 is the whole run, not "unset"
    form.fields[("torch", "with_modules")].value = True
    exp = form.experiment()
    assert exp.mode == "torch" and exp.command == ("python3", "train.py", "--lr", "1")
    assert exp.torch == TorchOptions(skip=1, steps=0, with_modules=True)
    line = form.command_line()
    assert line.startswith("env PYTHONPATH=") and line.endswith(" python3 train.py --lr 1")
    assert '"steps": 0' in line and '"with_modules": true' in line and f"{tmp_path}/RUN" in line
    assert "error" not in form.command_preview.value
    form.per_rank_box.value = True
    assert form.command_line().startswith("error:") and "torchrun worker" in form.command_line()
