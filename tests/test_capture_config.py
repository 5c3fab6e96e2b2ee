"""Presets, experiment files and sweep specifications."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tracekit.capture import config as cfg
from tracekit.capture.options import Experiment, NcuOptions, NsysOptions, default_name
from tracekit.capture.prepare import plan
from tracekit.errors import CaptureError

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_every_preset_has_an_example_config() -> None:
    assert sorted(p.stem for p in CONFIGS.glob("*.yaml")) == sorted([*cfg.PRESETS, "default"])


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.stem)
def test_example_configs_resolve_and_plan(path: Path) -> None:
    exp, sweep, named = cfg.resolve(cfg.load_config(path))
    points = cfg.sweep_points(sweep, named) if sweep else [{}]
    for params in points:
        point = exp.replace(command=tuple(cfg.fill(t, params) for t in exp.command))
        steps = plan(point, "/tmp/out")
        assert steps and all("{" not in " ".join(argv).replace("%q{RANK}", "") for _, argv in steps)
    if path.stem in cfg.PRESETS:
        assert exp.preset == path.stem


def test_kernel_drilldown_preset() -> None:
    exp, _, _ = cfg.resolve({"preset": "kernel-drilldown", "command": ["python3", "w.py"]})
    assert exp.mode == "ncu"
    assert exp.ncu.sections == (
        "SpeedOfLight",
        "SpeedOfLight_RooflineChart",
        "SpeedOfLight_HierarchicalTensorRooflineChart",
        "ComputeWorkloadAnalysis",
        "MemoryWorkloadAnalysis",
        "Occupancy",
        "LaunchStats",
    )
    assert exp.ncu.import_sass is False
    ((step, argv),) = plan(exp, "/o")
    assert argv[-4:] == ["--export", "/o/report", "python3", "w.py"]
    assert argv[argv.index("--import-sass") + 1] == "no"


def test_llm_serving_preset() -> None:
    exp, _, _ = cfg.resolve(
        {"preset": "llm-serving", "command": "python3 serve.py", "nsys": {"nvtx_capture": "s"}}
    )
    assert exp.nsys.cuda_graph_trace == "node"
    assert exp.nsys.capture_range == "nvtx" and exp.nsys.trace_fork_before_exec
    argv = plan(exp, "/o")[0][1]
    assert (
        "--cuda-graph-trace=node" in argv
        and "--nvtx-capture=s" in argv
        and "--trace-fork-before-exec=true" in argv
    )


def test_nvtx_capture_range_sets_the_register_only_variable() -> None:
    from tracekit.capture.prepare import program_env

    exp, _, _ = cfg.resolve(
        {"preset": "llm-serving", "command": "python3 serve.py", "nsys": {"nvtx_capture": "s"}}
    )
    assert program_env(exp)["NSYS_NVTX_PROFILER_REGISTER_ONLY"] == "0"
    plain = Experiment(command=["python3", "x.py"], env={"A": "1"})
    key = "NSYS_NVTX_PROFILER_REGISTER_ONLY"
    assert program_env(plain).get(key) == os.environ.get(key)
    assert program_env(plain)["A"] == "1"


def test_torchrun_preset_names_reports_per_rank() -> None:
    exp, _, _ = cfg.resolve(
        {
            "preset": "torchrun",
            "command": "torchrun --nproc-per-node 2 decode.py --tp 2",
            "nsys_path": "/x/nsys",
        }
    )
    assert exp.per_rank and exp.nsys.output_name == "report_rank%q{RANK}"
    argv = plan(exp, "/o")[0][1]
    assert argv[:5] == ["torchrun", "--nproc-per-node", "2", "--no-python", "/x/nsys"]
    assert "--output=/o/report_rank%q{RANK}" in argv
    assert argv[-3:] == ["decode.py", "--tp", "2"]


def test_layers_override_in_order() -> None:
    file_layer = {
        "preset": "quick",
        "command": "python3 a.py",
        "mode": "nsys+ncu",
        "nsys": {"trace": ["cuda", "nvtx", "cublas"]},
        "ncu": {"launch_count": 4},
    }
    exp, _, _ = cfg.resolve(file_layer, {"ncu": {"launch_count": 2}, "out": "elsewhere"})
    assert exp.nsys.trace == ("cuda", "nvtx", "cublas")  # file over preset
    assert exp.nsys.sample == "none"  # preset kept where nothing overrides it
    assert exp.ncu.set == "basic" and exp.ncu.launch_count == 2  # arguments over file
    assert (exp.mode, exp.out) == ("nsys+ncu", "elsewhere")


def test_round_trip_through_plain_data() -> None:
    exp = Experiment(
        command=("a", "b"),
        mode="nsys+ncu",
        nsys=NsysOptions(cuda_graph_trace="node"),
        ncu=NcuOptions(sections=("Occupancy",), nvtx_include=("x/",)),
        env={"K": "V"},
        top_n=3,
    )
    assert Experiment.from_dict(exp.to_dict()) == exp


def test_unknown_keys_and_bad_values_are_named() -> None:
    with pytest.raises(CaptureError, match="unknown nsys option.*trce.*valid ones: .*trace"):
        cfg.resolve({"command": "a", "nsys": {"trce": ["cuda"]}})
    with pytest.raises(CaptureError, match="unknown experiment option.*comand"):
        Experiment.from_dict({"comand": "a", "command": "a"})
    with pytest.raises(CaptureError, match="unknown preset 'fast'; choose one of quick"):
        cfg.resolve({"command": "a", "preset": "fast"})
    with pytest.raises(CaptureError, match="ncu.replay_mode must be one of"):
        NcuOptions(replay_mode="app")
    with pytest.raises(CaptureError, match="no command to run"):
        cfg.resolve({"mode": "nsys"})


def test_yaml_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("command: [unclosed\n")
    with pytest.raises(CaptureError, match="is not valid YAML"):
        cfg.load_config(bad)
    bad.write_text("- a\n- b\n")
    with pytest.raises(CaptureError, match="must hold a mapping"):
        cfg.load_config(bad)
    with pytest.raises(CaptureError, match="cannot read the experiment file"):
        cfg.load_config(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("command: 42\n", "command must be a string or a list of strings"),
        ("command: a\nenv: [1, 2]\n", "env must map variable names to values"),
        ("command: a\nenv: {X: null}\n", "env X has no value"),
        ("command: a\nenv: {X: {y: 1}}\n", "env X must be a string or a number"),
        ("command: a\nnsys: 5\n", "'nsys' must be a mapping of nsys options"),
        ("command: a\nncu: [set, full]\n", "'ncu' must be a mapping of ncu options"),
        ("command: a\ntop_n: many\n", "top_n must be a whole number"),
        ("command: a\ntimeout_s: soon\n", "timeout_s must be a number of seconds"),
    ],
)
def test_bad_config_values_are_one_error(tmp_path: Path, text: str, message: str) -> None:
    """Issue 19.7: each of these was an internal error, or (env X: null) set X='None'."""
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(CaptureError, match=message):
        cfg.resolve(cfg.load_config(path))


def test_binary_config_and_long_name(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(b"\x00\xff\xfe")
    with pytest.raises(CaptureError, match="not a text file"):
        cfg.load_config(path)
    with pytest.raises(CaptureError, match="name is 300 characters; use at most 128"):
        Experiment.from_dict({"command": "a", "name": "a" * 300})
    assert Experiment.from_dict({"command": "a", "env": {"X": 1, "Y": "b"}}).env == {"X": "1", "Y": "b"}


def test_parse_sweep() -> None:
    assert cfg.parse_sweep("batch_size=1,2,4;max_tokens=50,100") == {
        "batch_size": [1, 2, 4],
        "max_tokens": [50, 100],
    }
    assert cfg.parse_sweep("lr=0.1,1e-3;dtype=bf16") == {"lr": [0.1, 0.001], "dtype": ["bf16"]}
    for bad in ("", "batch", "1x=2", "batch="):
        with pytest.raises(CaptureError):
            cfg.parse_sweep(bad)


def test_sweep_points_forms() -> None:
    grid = {"a": [1, 2], "b": ["x", "y"]}
    assert cfg.sweep_points(grid) == [
        {"a": 1, "b": "x"},
        {"a": 1, "b": "y"},
        {"a": 2, "b": "x"},
        {"a": 2, "b": "y"},
    ]
    assert cfg.sweep_points([{"a": 1}, {"a": 5}]) == [{"a": 1}, {"a": 5}]
    assert cfg.sweep_points("small", {"small": {"a": [3]}}) == [{"a": 3}]
    assert cfg.sweep_points({"a": 7}) == [{"a": 7}]
    with pytest.raises(
        CaptureError, match="unknown sweep 'big'; named sweeps in the experiment file: small"
    ):
        cfg.sweep_points("big", {"small": {"a": [3]}})


def test_fill_leaves_other_braces_alone() -> None:
    assert cfg.fill("--batch={batch} {other} {}", {"batch": 4}) == "--batch=4 {other} {}"


@pytest.mark.parametrize(
    ("command", "name"),
    [
        (["python3", "decode.py", "--steps", "8"], "decode"),
        (["torchrun", "--nproc-per-node", "2", "train.py"], "train"),
        (["python", "-m", "vllm.entrypoints.api_server"], "api_server"),
        (["./build/bench", "-n", "3"], "bench"),
        (["python3", "-c", "print(1)"], "python3"),
    ],
)
def test_default_names(command: list[str], name: str) -> None:
    assert default_name(command) == name
