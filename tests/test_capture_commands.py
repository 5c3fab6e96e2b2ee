"""Command builders: exact argument lists for nsys, ncu, exports, torchrun wrapping and handoff."""

from __future__ import annotations

import pytest

from tracekit.capture import commands as c
from tracekit.capture.options import Experiment, NcuOptions, NsysOptions
from tracekit.errors import CaptureError


def test_nsys_defaults() -> None:
    assert c.nsys_profile_command("/opt/nsys", NsysOptions(), "/x/report", ["python3", "a.py"]) == [
        "/opt/nsys",
        "profile",
        "--trace=cuda,nvtx,osrt",
        "--output=/x/report",
        "python3",
        "a.py",
    ]


def test_nsys_every_option() -> None:
    opts = NsysOptions(
        trace=("cuda", "nvtx", "osrt", "cublas", "cudnn"),
        cuda_graph_trace="node",
        capture_range="cudaProfilerApi",
        capture_range_end="repeat:2",
        delay_s=2,
        duration_s=1.5,
        gpu_metrics_devices="0,1",
        gpu_metrics_frequency_hz=2000,
        gpu_metrics_set="gh100",
        cuda_memory_usage=True,
        trace_fork_before_exec=True,
        sample="none",
        cpuctxsw="none",
        pytorch="autograd-nvtx",
        wait="primary",
        extra_args=("--stats=false",),
    )
    assert c.nsys_profile_args(opts, "out/r") == [
        "--trace=cuda,nvtx,osrt,cublas,cudnn",
        "--cuda-graph-trace=node",
        "--capture-range=cudaProfilerApi",
        "--capture-range-end=repeat:2",
        "--delay=2",
        "--duration=1.5",
        "--gpu-metrics-devices=0,1",
        "--gpu-metrics-frequency=2000",
        "--gpu-metrics-set=gh100",
        "--cuda-memory-usage=true",
        "--trace-fork-before-exec=true",
        "--sample=none",
        "--cpuctxsw=none",
        "--pytorch=autograd-nvtx",
        "--wait=primary",
        "--stats=false",
        "--output=out/r",
    ]


def test_nsys_nvtx_capture_range_defaults_end_to_stop() -> None:
    opts = NsysOptions(trace="cuda,nvtx", capture_range="nvtx", nvtx_capture="step.2@tinyllm")
    assert c.nsys_profile_args(opts, "r") == [
        "--trace=cuda,nvtx",
        "--capture-range=nvtx",
        "--nvtx-capture=step.2@tinyllm",
        "--capture-range-end=stop",
        "--output=r",
    ]


def test_capture_range_spelling_is_normalized() -> None:
    assert NsysOptions(capture_range="cuda-profiler-api").capture_range == "cudaProfilerApi"
    with pytest.raises(CaptureError, match="capture_range must be one of"):
        NsysOptions(capture_range="profilerstart")
    with pytest.raises(CaptureError, match="needs capture_range='nvtx'"):
        NsysOptions(nvtx_capture="step.0")


def test_nsys_export_with_and_without_blobs() -> None:
    assert c.nsys_export_command("nsys", "d/r.nsys-rep", "d/r.sqlite", include_blobs=True) == [
        "nsys",
        "export",
        "--type=sqlite",
        "--include-blobs=true",
        "--force-overwrite=true",
        "--output=d/r.sqlite",
        "d/r.nsys-rep",
    ]
    assert "--include-blobs=true" not in c.nsys_export_command("nsys", "r.nsys-rep", "r.sqlite")


def test_ncu_every_option() -> None:
    opts = NcuOptions(
        set="detailed",
        sections=("SpeedOfLight", "Occupancy"),
        metrics="dram__bytes_read.sum,dram__bytes_write.sum",
        kernel_name="regex:gemm",
        kernel_name_base="demangled",
        kernel_id="::regex:^gemm:3",
        filter_mode="per-gpu",
        launch_skip_before_match=1,
        launch_skip=2,
        launch_count=5,
        nvtx_include=("step.1/", "prof/"),
        nvtx_exclude="warmup/",
        replay_mode="application",
        graph_profiling="graph",
        target_processes="all",
        target_processes_filter="regex:python",
        devices="0",
        clock_control="none",
        cache_control="none",
        import_source=True,
        import_sass=False,
        extra_args="--print-summary per-kernel",
    )
    assert c.ncu_profile_command("ncu", opts, "d/report", ["./app"]) == [
        "ncu",
        "--set",
        "detailed",
        "--section",
        "SpeedOfLight",
        "--section",
        "Occupancy",
        "--metrics",
        "dram__bytes_read.sum,dram__bytes_write.sum",
        "--kernel-name-base",
        "demangled",
        "--kernel-name",
        "regex:gemm",
        "--kernel-id",
        "::regex:^gemm:3",
        "--filter-mode",
        "per-gpu",
        "--launch-skip-before-match",
        "1",
        "--launch-skip",
        "2",
        "--launch-count",
        "5",
        "--nvtx",
        "--nvtx-include",
        "step.1/",
        "--nvtx-include",
        "prof/",
        "--nvtx-exclude",
        "warmup/",
        "--replay-mode",
        "application",
        "--graph-profiling",
        "graph",
        "--target-processes",
        "all",
        "--target-processes-filter",
        "regex:python",
        "--devices",
        "0",
        "--clock-control",
        "none",
        "--cache-control",
        "none",
        "--import-source",
        "yes",
        "--import-sass",
        "no",
        "--print-summary",
        "per-kernel",
        "--export",
        "d/report",
        "./app",
    ]


def test_ncu_minimal_and_csv() -> None:
    assert c.ncu_profile_command("ncu", NcuOptions(), "r", ["a"]) == ["ncu", "--export", "r", "a"]
    assert c.ncu_profile_args(NcuOptions(nvtx=True), "r") == ["--nvtx", "--export", "r"]
    assert c.ncu_csv_command("ncu", "r.ncu-rep") == [
        "ncu",
        "--import",
        "r.ncu-rep",
        "--csv",
        "--page",
        "raw",
        "--print-units",
        "base",
    ]


def test_ncu_nvtx_expression_with_comma_stays_whole() -> None:
    assert NcuOptions(nvtx_include="A,B").nvtx_include == ("A,B",)


@pytest.mark.parametrize(
    ("command", "launcher", "program"),
    [
        (
            ["torchrun", "--nproc-per-node", "2", "decode.py", "--tp", "2"],
            ["torchrun", "--nproc-per-node", "2"],
            ["decode.py", "--tp", "2"],
        ),
        (
            [
                "python3",
                "-m",
                "torch.distributed.run",
                "--nproc-per-node=2",
                "--standalone",
                "t.py",
            ],
            ["python3", "-m", "torch.distributed.run", "--nproc-per-node=2", "--standalone"],
            ["t.py"],
        ),
        (
            ["torchrun", "--nnodes", "1", "-m", "pkg.train", "--lr", "3"],
            ["torchrun", "--nnodes", "1"],
            ["pkg.train", "--lr", "3"],
        ),
        (["torchrun", "--no-python", "./bin", "-x"], ["torchrun", "--no-python"], ["./bin", "-x"]),
    ],
)
def test_split_torchrun(command: list[str], launcher: list[str], program: list[str]) -> None:
    got_launcher, got_program, _ = c.split_torchrun(command)
    assert (got_launcher, got_program) == (launcher, program)


def test_per_rank_command_puts_profiler_inside_the_launcher() -> None:
    prefix = ["nsys", "profile", "--output=out/report_rank%q{RANK}"]
    assert c.per_rank_command(
        ["torchrun", "--nproc-per-node", "2", "decode.py", "--tp", "2"], prefix, "py"
    ) == [
        "torchrun",
        "--nproc-per-node",
        "2",
        "--no-python",
        "nsys",
        "profile",
        "--output=out/report_rank%q{RANK}",
        "py",
        "decode.py",
        "--tp",
        "2",
    ]
    assert c.per_rank_command(["torchrun", "-m", "pkg.train"], ["ncu"], "py") == [
        "torchrun",
        "--no-python",
        "ncu",
        "py",
        "-m",
        "pkg.train",
    ]
    assert c.per_rank_command(["torchrun", "--no-python", "./bin"], ["ncu"], "py") == [
        "torchrun",
        "--no-python",
        "ncu",
        "./bin",
    ]


def test_per_rank_needs_torchrun() -> None:
    with pytest.raises(CaptureError, match="needs a torchrun command"):
        c.split_torchrun(["python3", "decode.py"])
    with pytest.raises(CaptureError, match="names no script"):
        c.split_torchrun(["torchrun", "--nproc-per-node", "2"])


@pytest.mark.parametrize(
    ("name", "base"),
    [
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
            "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)",
            "vectorized_elementwise_kernel",
        ),
        ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "ncclDevKernel_SendRecv"),
        (
            "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64",
            "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64",
        ),
        (
            "void (anonymous namespace)::softmax_warp_forward<float, float, 1>(float*)",
            "softmax_warp_forward",
        ),
    ],
)
def test_kernel_function_name(name: str, base: str) -> None:
    assert c.kernel_function_name(name) == base


def test_kernel_name_regex_dedupes_and_escapes() -> None:
    assert c.kernel_name_regex(["k<1>(int)", "k<2>(int)", "a.b"]) == r"regex:^(?:k|a\.b)$"
    with pytest.raises(CaptureError, match="no kernel names"):
        c.kernel_name_regex([])


def test_kernel_filter_and_flags_from_a_command_line() -> None:
    assert c.kernel_filter_from_command(["ncu", "-k", "regex:x", "a"]) == "regex:x"
    assert c.kernel_filter_from_command(["ncu", "--kernel-name=gemm"]) == "gemm"
    assert c.kernel_filter_from_command(["ncu", "a"]) is None
    assert c.option_flags(["--trace=cuda", "--trace=nvtx", "--set", "basic", "-c", "1"]) == [
        "--trace",
        "--set",
    ]


def test_experiment_accepts_a_string_command_and_mode_aliases() -> None:
    exp = Experiment(command="python3 decode.py --steps '8'", mode="both")
    assert exp.command == ("python3", "decode.py", "--steps", "8")
    assert exp.mode == "nsys+ncu"
    assert exp.display_name == "decode"
    with pytest.raises(CaptureError, match="mode must be one of"):
        Experiment(command=["a"], mode="perf")
    with pytest.raises(CaptureError, match="the command is empty"):
        Experiment(command=[])
