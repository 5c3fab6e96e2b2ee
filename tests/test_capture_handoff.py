"""The nsys -> ncu handoff: one ncu pass per top kernel instantiation, launches read back,
status ``partial``.

The kernels come from the real decode export (``sample_traces/llm_decode_1gpu``). By function
name its most frequent kernel (``elementwise_kernel``: 128 launches of several instantiations —
copies, multiplies, adds) sits between two cuBLAS GEMMs in the top three; by instantiation, what
ncu targets with ``--kernel-name-base mangled``, no single elementwise instantiation makes the
top three and the RMSNorm kernel (``vectorized_layer_norm_kernel``) does. The launches are read
back from the real ncu reports in ``sample_traces/ncu``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import sys
import textwrap
from pathlib import Path

import polars as pl
import pytest

from tracekit.capture import Experiment, NcuOptions
from tracekit.capture.config import DRILLDOWN_SECTIONS
from tracekit.capture.experiment import _Run
from tracekit.capture.handoff import (
    HANDOFF_SECTIONS,
    LAUNCHES_PER_KERNEL,
    dram_byte_metrics,
    gpu_compute_capability,
    handoff_passes,
    launch_records,
    missing_kernels,
    profiled_launches,
    top_kernels,
)
from tracekit.capture.prepare import profiler_command
from tracekit.capture.summary import summarize_nsys
from tracekit.errors import CaptureError
from tracekit.tools import Tool

from .conftest import NSYS_CORPUS

ROOT = Path(__file__).resolve().parents[1]
DECODE = ROOT / "sample_traces" / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
NCU = ROOT / "sample_traces" / "ncu"
DRILL = NCU / "ncu_decode_drilldown" / "ncu_decode_drilldown.ncu-rep"
FULL = NCU / "ncu_probe_full" / "ncu_probe_full.ncu-rep"
GEMM_A = "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT"
GEMM_B = "nvjet_sm90_tst_8x64_64x16_2x1_v_bz_TNN"
#: The RMSNorm kernel's mangled name (what nsys and ncu both record for it).
NORM = ("_ZN2at6native53_GLOBAL__N__21739cd4_20_layer_norm_kernel_cu_9c5ada8a28vectorized_layer_norm_kernelIN"
        "3c108BFloat16EfLb1EEEviT0_PKT_S8_S8_PS5_S9_PS6_")
SECTIONS = [a for s in HANDOFF_SECTIONS for a in ("--section", s)]


def _both(**ncu: object) -> Experiment:
    return Experiment(
        command=["python3", "decode.py", "--steps", "4"],
        mode="both",
        top_n=3,
        ncu=NcuOptions(**ncu),  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def decode() -> tuple[dict[str, object], list[pl.DataFrame]]:
    frames: list[pl.DataFrame] = []
    return summarize_nsys(DECODE, frames=frames), frames


def test_top_kernels_of_the_decode_export(decode: tuple[dict, list[pl.DataFrame]]) -> None:
    summary, frames = decode
    top = top_kernels(frames, summary, 3)
    assert top == [
        {"name": GEMM_A, "launches": 64, "total_ns": 312832},
        {"name": "elementwise_kernel", "launches": 128, "total_ns": 287616},
        {"name": GEMM_B, "launches": 32, "total_ns": 204384},
    ]
    # the most frequent of the three is not the longest: one shared --launch-count would go to it
    assert max(top, key=lambda k: k["launches"])["name"] == "elementwise_kernel"


def test_one_pass_per_kernel_with_its_own_launches(decode: tuple[dict, list[pl.DataFrame]]) -> None:
    summary, frames = decode
    exp = _both(nvtx_include="step.1/")
    info: dict[str, object] = {}
    cc = gpu_compute_capability([DECODE])
    assert cc == "9.0"  # two H200s
    passes = handoff_passes(exp, summary, frames, compute_capability=cc, info=info, reports=[DECODE])
    assert [(p.index, p.kernel, p.short_name, p.step) for p in passes] == [
        (1, GEMM_A, GEMM_A, "ncu-1"),
        (2, GEMM_B, GEMM_B, "ncu-2"),
        (3, NORM, "vectorized_layer_norm_kernel", "ncu-3"),
    ]
    assert passes[2].demangled is not None and passes[2].demangled.startswith("void at::native::<unnamed>::vectorized_layer_norm_kernel<")
    for p in passes:
        argv = profiler_command(exp, "ncu", "/opt/ncu", Path("/exp"), p.options)
        assert argv == [
            "/opt/ncu", *SECTIONS,
            "--metrics", "dram__bytes_read.sum,dram__bytes_write.sum",
            "--kernel-name-base", "mangled",
            "--kernel-name", f"regex:^{re.escape(p.kernel or '')}$",
            "--launch-count", str(LAUNCHES_PER_KERNEL),
            "--nvtx", "--nvtx-include", "step.1/",
            "--import-sass", "no",
            "--export", f"/exp/report_k{p.index}",
            "python3", "decode.py", "--steps", "4",
        ]  # fmt: skip
    # ranked by GPU time inside step.1 (the NVTX filter ncu applies), checked by SQL below
    assert [p.nsys_launches for p in passes] == [8, 4, 9]
    assert info["source"] == "nsys" and info["launch_count"] == 3 and info["ranked"] == "inside --nvtx-include step.1/"
    assert info["sections"] == [*DRILLDOWN_SECTIONS, "SpeedOfLight_HierarchicalHalfRooflineChart"]


def test_ranking_inside_the_nvtx_range_by_sql() -> None:
    """The launches and GPU time of each handed-over kernel inside step.1: kernels whose
    launching call lies inside the step.1 range (same thread), summed by mangled name."""
    import sqlite3

    con = sqlite3.connect(f"file:{DECODE}?mode=ro", uri=True)
    (s0, s1, tid), = con.execute("SELECT e.start, e.end, e.globalTid FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
                                 "WHERE COALESCE(e.text, s.value) = 'step.1'").fetchall()
    rows = dict(((m, (n, t)) for m, n, t in con.execute(
        "SELECT m.value, COUNT(*), SUM(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
        "ON r.correlationId = k.correlationId AND (r.globalTid >> 24) = (k.globalPid >> 24) JOIN StringIds m ON m.id = k.mangledName "
        f"WHERE r.globalTid = {tid} AND r.start >= {s0} AND r.end <= {s1} GROUP BY m.value")))
    con.close()
    top = sorted(rows.items(), key=lambda kv: -kv[1][1])[:3]
    summary: dict[str, object] = {}
    frames: list[pl.DataFrame] = []
    summary = summarize_nsys(DECODE, frames=frames)
    passes = handoff_passes(_both(nvtx_include="step.1/"), summary, frames, reports=[DECODE])
    assert [(p.kernel, p.nsys_launches, p.nsys_total_ns) for p in passes] == [(m, n, t) for m, (n, t) in top]


def test_without_the_exports_ranking_is_over_the_whole_trace(decode: tuple[dict, list[pl.DataFrame]]) -> None:
    summary, frames = decode
    info: dict[str, object] = {}
    passes = handoff_passes(_both(nvtx_include="step.1/"), summary, frames, info=info)
    assert [p.short_name for p in passes] == [GEMM_A, GEMM_B, "vectorized_layer_norm_kernel"]
    assert [p.nsys_launches for p in passes] == [64, 32, 72] and info["ranked"] == "whole trace"


def test_user_options_are_kept_and_extended(decode: tuple[dict, list[pl.DataFrame]]) -> None:
    summary, frames = decode
    exp = _both(
        set="basic",
        sections=["WarpStateStats", "SpeedOfLight"],
        metrics=["sm__inst_executed.sum", "dram__bytes_read.sum"],
        launch_skip=2,
        launch_count=5,
        import_sass=True,
    )
    passes = handoff_passes(exp, summary, frames, compute_capability="12.0")
    opts = passes[1].options
    assert opts.set == "basic" and opts.import_sass is True
    assert opts.sections == ("WarpStateStats", "SpeedOfLight", *HANDOFF_SECTIONS[1:])
    assert opts.metrics == (
        "sm__inst_executed.sum",
        "dram__bytes_read.sum",
        "dram__bytes_op_read.sum",
        "dram__bytes_op_write.sum",
    )
    assert all((p.options.launch_skip, p.options.launch_count) == (2, 5) for p in passes)
    assert dram_byte_metrics(None) == ("dram__bytes_read.sum", "dram__bytes_write.sum")


def test_user_filter_gives_one_pass_and_no_kernels_is_an_error() -> None:
    info: dict[str, object] = {}
    passes = handoff_passes(_both(kernel_name="regex:gemm"), {}, [], info=info)
    assert len(passes) == 1 and passes[0].kernel is None
    assert passes[0].options.kernel_name == "regex:gemm"
    assert passes[0].options.output_name == "report_k1"
    assert info["source"] == "user"
    with pytest.raises(CaptureError, match="found no kernels to hand to ncu"):
        handoff_passes(_both(), {"top_kernels": []}, [])


def test_summary_fallback_merges_template_variants() -> None:
    summary = {
        "top_kernels": [
            {"name": "void ns::gemm<1>(int)", "short_name": "gemm", "count": 2, "total_ns": 50},
            {"name": "softmax(float*)", "count": 9, "total_ns": 70},
            {"name": "void ns::gemm<2>(int)", "short_name": "gemm", "count": 1, "total_ns": 30},
        ]
    }
    passes = handoff_passes(_both(), summary, [])
    assert [(p.kernel, p.nsys_launches, p.nsys_total_ns) for p in passes] == [
        ("gemm", 3, 80),
        ("softmax", 9, 70),
    ]
    assert passes[0].options.kernel_name == "regex:^gemm$"


def test_handoff_from_a_corpus_export() -> None:
    frames: list[pl.DataFrame] = []
    summary = summarize_nsys(
        NSYS_CORPUS / "nsys2026.2_nsysai_mfu_2xh100_nccl_slice.sqlite", frames=frames
    )
    passes = handoff_passes(_both(), summary, frames)
    assert passes[0].short_name == "flash_fwd_kernel" and passes[0].kernel.startswith("_ZN5flash16flash_fwd_kernelI")  # type: ignore[union-attr]
    assert passes[0].options.kernel_name == f"regex:^{re.escape(passes[0].kernel or '')}$"
    assert passes[0].options.kernel_name_base == "mangled" and passes[0].match == "mangled_name"
    assert len({p.kernel for p in passes}) == 3


def test_launches_read_back_from_real_reports(decode: tuple[dict, list[pl.DataFrame]]) -> None:
    counts = profiled_launches([DRILL])
    assert counts[GEMM_A] == 8 and counts["elementwise_kernel"] == 16 and counts[GEMM_B] == 4
    assert sum(counts.values()) == 60
    assert profiled_launches([DRILL], "mangled_name")[NORM] == 9
    summary, frames = decode
    passes = handoff_passes(_both(), summary, frames)
    # passes 1 and 2 got the decode step's report; pass 3's report holds no RMSNorm kernel
    records = launch_records(passes, {1: [DRILL], 2: [DRILL], 3: [FULL]})
    assert [(r["kernel"], r["short_name"], r["match"], r["profiled_launches"]) for r in records] == [
        (GEMM_A, GEMM_A, "mangled_name", 8),
        (GEMM_B, GEMM_B, "mangled_name", 4),
        (NORM, "vectorized_layer_norm_kernel", "mangled_name", 0),
    ]
    assert records[2]["reports"] == ["ncu_probe_full.ncu-rep"]
    assert (
        sum(records[2]["other_kernels"].values()) == 3 and NORM not in records[2]["other_kernels"]
    )
    assert missing_kernels(records) == [NORM]
    broken = launch_records(passes[:1], {1: [DECODE]})  # not an ncu report: count unknown
    assert broken[0]["profiled_launches"] is None and broken[0]["error"]
    assert missing_kernels(broken) == []


# A stand-in for ncu that replays recorded reports (this machine has no GPU): it copies the
# report named for the --kernel-name in $TK_REPLAY to --export, or profiles nothing, then runs
# the program. Everything else is the real run_handoff.
REPLAY = textwrap.dedent(
    """
    import json, os, re, shutil, subprocess, sys
    argv = sys.argv[1:]
    replay = json.loads(os.environ["TK_REPLAY"])
    name = re.sub(r"\\\\(.)", r"\\1", argv[argv.index("--kernel-name") + 1][7:-1])
    export = argv[argv.index("--export") + 1]
    program = argv[argv.index("--export") + 2:]
    print("==PROF== Connected to process 1 (" + program[0] + ")", flush=True)
    rc = subprocess.call(program)
    if replay.get(name):
        shutil.copyfile(replay[name], export + ".ncu-rep")
        print("==PROF== Report: " + export + ".ncu-rep")
    else:
        print("==WARNING== No kernels were profiled.")
    print("==PROF== Disconnected from process 1")
    sys.exit(0)
    """
)


def _replay_run(
    folder: Path, decode: tuple[dict, list[pl.DataFrame]], replay: dict[str, str | None]
) -> _Run:
    """run_handoff + finish after the real decode export's nsys step, with the stand-in ncu."""
    folder.mkdir(parents=True)
    ncu = folder.parent / f"ncu_replay_{folder.name}"
    ncu.write_text(f"#!{sys.executable}\n{REPLAY}")
    ncu.chmod(0o755)
    summary, frames = decode
    exp = Experiment(
        command=[sys.executable, "-c", "pass"],
        mode="both",
        top_n=3,
        out=str(folder.parent),
        ncu=NcuOptions(export_csv=False, nvtx_include="step.1/"),
    )
    env = {"TK_REPLAY": json.dumps(replay), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    state = _Run(exp, folder, {"ncu": Tool("ncu", ncu, None)}, env, None, None)
    state.result.summary["nsys"] = summary
    state.result.reports["sqlite"] = [DECODE]
    state.kernel_frames = frames
    state.run_handoff()
    state.finish()
    return state


def test_a_kernel_without_launches_makes_the_capture_partial(
    tmp_path: Path, decode: tuple[dict, list[pl.DataFrame]]
) -> None:
    state = _replay_run(
        tmp_path / "exp",
        decode,
        {GEMM_A: str(DRILL), GEMM_B: str(DRILL), NORM: None},
    )
    res = state.result
    assert res.status == "partial" and not res.complete and res.error is None
    assert res.handoff is not None and res.handoff["missing"] == [NORM]
    assert res.handoff["ranked"] == "inside --nvtx-include step.1/"
    assert any(NORM in w for w in res.warnings)
    assert [s["step"] for s in res.steps] == ["ncu-1", "ncu-2", "ncu-3"]
    assert [p.name for p in res.reports["ncu"]] == ["report_k1.ncu-rep", "report_k2.ncu-rep"]
    record = json.loads((state.folder / "experiment.json").read_text())
    assert record["status"] == "partial"
    assert [
        (p["kernel"], p["profiled_launches"], p["reports"]) for p in record["handoff"]["passes"]
    ] == [
        (GEMM_A, 8, ["report_k1.ncu-rep"]),
        (GEMM_B, 4, ["report_k2.ncu-rep"]),
        (NORM, 0, []),
    ]
    written = json.loads((state.folder / "summary.json").read_text())
    assert written["status"] == "partial"
    assert written["handoff"] == {GEMM_A: 8, GEMM_B: 4, NORM: 0}
    commands = (state.folder / "command.txt").read_text()
    assert commands.count("--kernel-name-base mangled") == 3
    assert f"regex:^{GEMM_B}$" in commands and f"regex:^{re.escape(NORM)}$" in commands


def test_every_kernel_profiled_is_complete_and_none_is_failed(
    tmp_path: Path, decode: tuple[dict, list[pl.DataFrame]]
) -> None:
    every = {GEMM_A: str(DRILL), GEMM_B: str(DRILL), NORM: str(DRILL)}
    state = _replay_run(tmp_path / "all", decode, every)
    assert state.result.status == "complete"
    assert state.result.handoff is not None and "missing" not in state.result.handoff
    assert state.result.summary["handoff"] == {GEMM_A: 8, GEMM_B: 4, NORM: 9}
    none = _replay_run(tmp_path / "none", decode, {})
    assert none.result.status == "failed"
    assert none.result.error is not None and "no report in any handoff pass" in none.result.error


# -- tests/gpu/handoff_e2e.py: the local steps of the GPU test, on the recorded data ------------


@pytest.fixture(scope="module")
def e2e() -> object:
    spec = importlib.util.spec_from_file_location("handoff_e2e", ROOT / "tests/gpu/handoff_e2e.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_nsys_command_is_what_capture_builds(e2e: object) -> None:
    committed = json.loads((ROOT / "tests/gpu/handoff_nsys_command.json").read_text())
    assert committed == json.loads(json.dumps(e2e.nsys_command_spec()))  # type: ignore[attr-defined]
    assert committed["nsys"] == [
        "{NSYS}", "profile", "--trace=cuda,nvtx,osrt", "--capture-range=cudaProfilerApi",
        "--capture-range-end=stop", "--output={WORK}/report", "python3", "tests/gpu/handoff_workload.py",
    ]  # fmt: skip


def _copies(folder: Path, source: Path, names: list[str]) -> Path:
    folder.mkdir()
    for name in names:
        shutil.copyfile(source, folder / name)
    return folder


def test_plan_and_check_on_recorded_reports(e2e: object, tmp_path: Path) -> None:
    spec = json.loads((ROOT / "tests/gpu/handoff_nsys_command.json").read_text())
    plan = e2e.make_plan(DECODE, spec)  # type: ignore[attr-defined]
    assert [p["kernel"] for p in plan["passes"]] == [GEMM_A, GEMM_B, NORM]
    assert [p["match"] for p in plan["passes"]] == ["mangled_name"] * 3
    argv = plan["passes"][2]["argv"]
    assert argv[0] == "{NCU}" and argv[-2:] == ["python3", "tests/gpu/handoff_workload.py"]
    assert argv[argv.index("--kernel-name") + 1] == f"regex:^{re.escape(NORM)}$"
    assert argv[argv.index("--kernel-name-base") + 1] == "mangled"
    assert argv[argv.index("--export") + 1] == "{WORK}/report_k3"
    old = plan["baseline"]["argv"]
    assert old[old.index("--launch-count") + 1] == "9" and old[old.index("--kernel-name-base") + 1] == "function"
    reports = [p["report"] for p in plan["passes"]]
    # the decode drill-down report has the three kernels but no DRAM byte or tensor FLOP counters
    drill = _copies(tmp_path / "drill", DRILL, reports)
    failures, seen = e2e.check_reports(plan, drill, DECODE)  # type: ignore[attr-defined]
    assert [e["launches"][e["kernel"]] for e in seen["passes"]] == [8, 4, 9]
    assert all(
        j["status"].startswith("matched")
        for e in seen["passes"]
        for j in e["join"]
        if j["side"] == "ncu"
    )
    assert (
        f"ncu-3: dram_bandwidth of {NORM}: 9 rows, null ['dram_read_bytes', 'dram_write_bytes']"
        in failures
    )
    assert any(
        f.startswith(f"ncu-1: tensor_core_utilization of {GEMM_A}") and "tensor_flop" in f
        for f in failures
    )
    # a report without the kernel
    full = _copies(tmp_path / "full", FULL, reports)
    failures, _ = e2e.check_reports(plan, full, None)  # type: ignore[attr-defined]
    assert len(failures) == 3 and all(" not in report_k" in f for f in failures)
    # the probe's --set full report has every column for its three kernels (GEMM, SDPA, SiLU)
    kernels = sorted(profiled_launches([FULL]))
    plan3 = {
        "passes": [
            {"step": f"ncu-{i}", "kernel": k, "report": f"report_k{i}.ncu-rep"}
            for i, k in enumerate(kernels, start=1)
        ],
        "baseline": {"report": "baseline_single_filter.ncu-rep"},
    }
    names = [p["report"] for p in plan3["passes"]] + ["baseline_single_filter.ncu-rep"]
    failures, seen = e2e.check_reports(plan3, _copies(tmp_path / "ok", FULL, names), None)  # type: ignore[attr-defined]
    assert failures == []
    assert seen["baseline_launches"] == {k: 1 for k in kernels}
    assert {e["kernel"]: e["tensor_flop"][0] > 0 for e in seen["passes"]} == {
        k: k != "vectorized_elementwise_kernel" for k in kernels
    }


H100_RUN = ROOT / "tests" / "data" / "handoff_h100.tar.xz"


def test_the_h100_run_profiled_every_handed_over_kernel(e2e: object, tmp_path: Path) -> None:
    """Issue 17 on the GPU (H100, ncu 2025.3.1, nsys 2025.3.1; 2026-11-24): the four device/local
    steps of tests/gpu/README.md, their outputs committed in ``tests/data/handoff_h100.tar.xz``
    (nsys export, plan, the three per-kernel reports and the old single-filter report, logs).
    The workload's most frequent kernel (the elementwise multiply, 1536 launches) is not the
    longest; each pass profiled 3 launches of its own kernel with every Tensor Core / DRAM / SOL /
    roofline column filled, while the old command (one regex, --launch-count 9) reached only the
    elementwise kernel."""
    import tarfile

    with tarfile.open(H100_RUN) as tar:
        tar.extractall(tmp_path, filter="data")
    run_dir = tmp_path / "handoff_h100"
    plan = json.loads((run_dir / "plan.json").read_text())
    kernels = [p["kernel"] for p in plan["passes"]]
    assert kernels[0] == "vectorized_elementwise_kernel" and all(k.startswith("nvjet_sm90_") for k in kernels[1:])
    failures, seen = e2e.check_reports(plan, run_dir, run_dir / "report.sqlite")  # type: ignore[attr-defined]
    assert failures == []
    assert [e["launches"] for e in seen["passes"]] == [{k: 3} for k in kernels]
    assert seen["baseline_launches"] == {"vectorized_elementwise_kernel": 9}
    # the GEMM passes carry tensor FLOPs, the elementwise pass none
    assert [all(f > 0 for f in e["tensor_flop"]) for e in seen["passes"]] == [False, True, True]
    # tracekit's capture on this export plans the same three passes, and reads the reports back
    frames: list[pl.DataFrame] = []
    summary = summarize_nsys(run_dir / "report.sqlite", frames=frames)
    exp = Experiment(command=["python3", "tests/gpu/handoff_workload.py"], mode="both", top_n=3)
    passes = handoff_passes(exp, summary, frames, compute_capability="9.0")
    # each of the three is one instantiation: the passes now target it by its mangled name
    assert [p.short_name for p in passes] == kernels and [p.match for p in passes] == ["mangled_name"] * 3
    assert [p.nsys_launches for p in passes] == [1536, 12, 12]  # the frequent kernel is not the longest
    records = launch_records(passes, {p.index: [run_dir / f"report_k{p.index}.ncu-rep"] for p in passes})
    assert [(r["profiled_launches"], r["other_kernels"]) for r in records] == [(3, {})] * 3
    assert missing_kernels(records) == []


DECODE_RUN = ROOT / "tests" / "data" / "handoff_decode_h100.tar.xz"


def test_the_decode_handoff_on_h100_profiled_the_step_it_was_asked_for(e2e: object, tmp_path: Path) -> None:
    """Issue 27 §2 on the GPU (H100, nsys and ncu 2025.3.1; 2026-11-27): ``capture both --top-n 3
    --nvtx-include decode.2/`` on a decode loop whose prefill (batch 8 × 2048 tokens) dominates
    the whole trace. Ranked inside decode.2 and targeted by mangled name, each pass profiled its
    own kernel inside the step; the passes of before (function names ranked over the whole
    trace) asked for a prefill GEMM that never runs in decode.2 — ncu profiled nothing and wrote
    no report — and for ``elementwise_kernel``, whichever instantiation came first. Everything
    the four steps wrote is ``tests/data/handoff_decode_h100.tar.xz`` (155 KB)."""
    import tarfile

    with tarfile.open(DECODE_RUN) as tar:
        tar.extractall(tmp_path, filter="data")
    run_dir = tmp_path / "handoff_decode_h100"
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["handoff"]["ranked"] == "inside --nvtx-include decode.2/"
    failures, seen = e2e.check_reports(plan, run_dir, run_dir / "report.sqlite")  # type: ignore[attr-defined]
    assert failures == []
    asked = [min(3, p["nsys_launches"]) for p in plan["passes"]]
    assert [e["launches"][e["kernel"]] for e in seen["passes"]] == asked == [3, 3, 1]
    # before: the prefill GEMM ranked third over the whole trace got no launch inside decode.2
    before = {b["kernel"]: b["launches"] for b in seen["before"]}
    assert before["nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_TNN"] == {}
    assert not (run_dir / "before_k3.ncu-rep").exists()
    # tracekit plans the same passes from the export today, and reads the reports back
    frames: list[pl.DataFrame] = []
    summary = summarize_nsys(run_dir / "report.sqlite", frames=frames)
    exp = Experiment.from_dict(json.loads((ROOT / "tests/gpu/handoff_decode_nsys_command.json").read_text())["experiment"])
    passes = handoff_passes(exp, summary, frames, compute_capability="9.0", reports=[run_dir / "report.sqlite"])
    assert [p.kernel for p in passes] == [p["kernel"] for p in plan["passes"]]
    records = launch_records(passes, {p.index: [run_dir / f"report_k{p.index}.ncu-rep"] for p in passes})
    assert [r["profiled_launches"] for r in records] == [3, 3, 1] and missing_kernels(records) == []
