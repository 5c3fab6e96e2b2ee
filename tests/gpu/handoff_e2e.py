"""GPU test of ``tracekit capture both --top-n 3``: every handed-over kernel gets its own launches.

The device machine cannot run tracekit (no polars there), so the capture is split in four
steps. Steps 1 and 3 run on the device and use only the standard library; steps 2 and 4 run
tracekit on the development machine. The nsys and ncu command lines are the exact ones
``tracekit capture both`` builds (steps 0 and 2 build them with tracekit's own code).

0. (local, already done: ``tests/gpu/handoff_nsys_command.json`` is committed; a unit test
   checks that it is current)::

       python3 tests/gpu/handoff_e2e.py nsys-command

1. (device; carry ``[".dw"]``; ~1 min) nsys on ``tests/gpu/handoff_workload.py`` plus the
   sqlite export, as ``capture both`` runs them; ``$OUT`` gets ``report.sqlite``,
   ``nsys.log`` and ``nsys_step.json``::

       python3 tests/gpu/handoff_e2e.py nsys-step

2. (local) the handoff passes from that export, through ``tracekit.capture.handoff`` (the code
   ``capture both`` runs), written to ``tests/artifacts/handoff/plan.json`` (git-ignored)::

       PYTHONPATH=$PWD python3 tests/gpu/handoff_e2e.py plan --sqlite <step-1 files>/report.sqlite

3. (device; carry ``["tests/artifacts/handoff"]``; ~2 min) the planned ncu passes, then the
   old single-filter command for comparison; ``$OUT`` gets ``report_k<i>.ncu-rep``,
   ``baseline_single_filter.ncu-rep``, ``ncu.log`` and ``ncu_step.json`` (wall time of
   each run)::

       python3 tests/gpu/handoff_e2e.py ncu-step

4. (local) all three kernels in the reports, each with non-null Tensor Core, DRAM, SOL and
   roofline columns, each profiled launch matched to an nsys launch by ``join_ncu_to_nsys``;
   exit code 1 and the failures listed otherwise; ``tests/artifacts/handoff/check.json``::

       PYTHONPATH=$PWD python3 tests/gpu/handoff_e2e.py check \\
           --ncu-dir <step-3 files> --sqlite <step-1 files>/report.sqlite

Device tools: ``NSYS`` (default: the nsys inside Nsight Compute 2025.3.1) and ``NCU``
(default: ``/opt/nvidia/nsight-compute/2025.3.1/ncu``, else ``ncu`` on the PATH).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
COMMAND_FILE = ROOT / "tests" / "gpu" / "handoff_nsys_command.json"
ARTIFACTS = ROOT / "tests" / "artifacts" / "handoff"
NSYS_DEFAULT = "/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys"
NCU_DEFAULT = "/opt/nvidia/nsight-compute/2025.3.1/ncu"
WORK_TOKEN, NSYS_TOKEN, NCU_TOKEN = "{WORK}", "{NSYS}", "{NCU}"
BASELINE = "baseline_single_filter"
#: the capture: ``tracekit capture both --top-n 3 --capture-range cudaProfilerApi
#: --nvtx-include step.1/ -- python3 tests/gpu/handoff_workload.py`` (from the repository root)
CAPTURE_LAYER: dict[str, Any] = {
    "mode": "both",
    "top_n": 3,
    "command": ["python3", "tests/gpu/handoff_workload.py"],
    "nsys": {"capture_range": "cudaProfilerApi"},
    "ncu": {"nvtx_include": ["step.1/"]},
}
#: Issue 27 §2: ``tracekit capture both --top-n 3 --capture-range cudaProfilerApi --nvtx-include
#: decode.2/ -- python3 sample_traces/workloads/graph_decode.py --mode eager --nvtx --batch 8
#: --prompt 2048 --steps 4 --layers 8``: a long prefill whose GEMMs dominate the whole trace,
#: then decode steps whose kernels differ; the filter asks for decode step 2.
DECODE_LAYER: dict[str, Any] = {
    "mode": "both",
    "top_n": 3,
    "command": ["python3", "sample_traces/workloads/graph_decode.py", "--mode", "eager", "--nvtx", "--batch", "8",
                "--prompt", "2048", "--steps", "4", "--layers", "8"],
    "nsys": {"capture_range": "cudaProfilerApi"},
    "ncu": {"nvtx_include": ["decode.2/"]},
}
SCENARIOS: dict[str, dict[str, Any]] = {"gemm": CAPTURE_LAYER, "decode": DECODE_LAYER}


def command_file(scenario: str) -> Path:
    """The committed nsys command spec of ``scenario`` (``gemm``: issue 17's; ``decode``: 27 §2)."""
    return COMMAND_FILE if scenario == "gemm" else ROOT / "tests" / "gpu" / f"handoff_{scenario}_nsys_command.json"


def _subst(argv: list[str], values: dict[str, str]) -> list[str]:
    out = []
    for token in argv:
        for key, value in values.items():
            token = token.replace(key, value)
        out.append(token)
    return out


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    tmp.replace(path)


def _out_dir(given: str | None) -> Path:
    out = Path(given or os.environ.get("OUT") or "/tmp/handoff_out")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _run(argv: list[str], log: Path, env: dict[str, str], timeout_s: float) -> dict[str, Any]:
    """Run ``argv`` from the repository root, output to ``log``; return rc and wall time."""
    t0 = time.monotonic()
    with log.open("a") as fh:  # one log per step: $OUT brings back at most 8 files
        fh.write("$ " + " ".join(argv) + "\n")
        fh.flush()
        try:
            rc = subprocess.run(
                argv,
                cwd=ROOT,
                env=env,
                stdout=fh,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
                check=False,
            ).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    return {
        "argv": argv,
        "returncode": rc,
        "wall_s": round(time.monotonic() - t0, 2),
        "log": log.name,
    }


# -- step 0 (local): the nsys command lines ------------------------------------------------------


def nsys_command_spec(scenario: str = "gemm") -> dict[str, Any]:
    """What ``capture both`` runs for the nsys half, with ``{NSYS}``/``{WORK}`` placeholders."""
    from tracekit.capture import commands as cmds
    from tracekit.capture.config import resolve
    from tracekit.capture.prepare import profiler_command, program_env

    exp, _, _ = resolve(SCENARIOS[scenario])
    folder = Path(WORK_TOKEN)
    report = folder / f"{exp.nsys.output_name}.nsys-rep"
    extra_env = {k: v for k, v in program_env(exp).items() if os.environ.get(k) != v}
    return {
        "about": "written by `python3 tests/gpu/handoff_e2e.py nsys-command`; do not edit",
        "experiment": exp.to_dict(),
        "env": extra_env,
        "nsys": profiler_command(exp, "nsys", NSYS_TOKEN, folder),
        "export": cmds.nsys_export_command(
            NSYS_TOKEN, report, report.with_suffix(".sqlite"), include_blobs=True
        ),
    }


def cmd_nsys_command(args: argparse.Namespace) -> int:
    path = command_file(args.scenario)
    _write_json(path, nsys_command_spec(args.scenario))
    print(f"wrote {path.relative_to(ROOT)}")
    return 0


# -- step 1 (device): nsys + export ---------------------------------------------------------------


def _libdw_env() -> dict[str, str]:
    """This environment with libdw/libelf from ``.dw/*.deb`` on LD_LIBRARY_PATH (for the nsys
    report importer shipped inside Nsight Compute), as sample_traces/workloads/device_run.sh."""
    env = dict(os.environ)
    debs = sorted(glob.glob(str(ROOT / ".dw" / "*.deb")))
    if not debs:
        print("warning: no .dw/*.deb (carry .dw); the nsys importer may fail", file=sys.stderr)
    for deb in debs:
        subprocess.run(["dpkg", "-x", deb, "/tmp/dw"], check=False)
    lib = "/tmp/dw/usr/lib/x86_64-linux-gnu"
    env["LD_LIBRARY_PATH"] = lib + (
        ":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else ""
    )
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def cmd_nsys_step(args: argparse.Namespace) -> int:
    spec = json.loads(command_file(args.scenario).read_text())
    out = _out_dir(args.out)
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    nsys = os.environ.get("NSYS", NSYS_DEFAULT)
    env = {**_libdw_env(), **spec["env"]}
    values = {NSYS_TOKEN: nsys, WORK_TOKEN: str(work)}
    record: dict[str, Any] = {"nsys": nsys, "work": str(work)}
    record["nsys_version"] = subprocess.run(
        [nsys, "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    record["profile"] = _run(_subst(spec["nsys"], values), out / "nsys.log", env, args.timeout)
    export = _subst(spec["export"], values)
    export_help = subprocess.run(
        [nsys, "export", "--help"], capture_output=True, text=True, check=False
    )
    if "--include-blobs" not in export_help.stdout + export_help.stderr:  # as capture decides
        export = [t for t in export if t != "--include-blobs=true"]
    record["export"] = _run(export, out / "nsys.log", env, args.timeout)
    sqlite = work / "report.sqlite"
    if sqlite.exists():
        shutil.copyfile(sqlite, out / "report.sqlite")
    record["sqlite_bytes"] = sqlite.stat().st_size if sqlite.exists() else None
    _write_json(out / "nsys_step.json", record)
    print(json.dumps(record, indent=1))
    ok = record["profile"]["returncode"] == 0 and record["sqlite_bytes"]
    return 0 if ok else 1


# -- step 2 (local): the handoff passes ---------------------------------------------------------


def make_plan(sqlite: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """The ncu passes ``capture both`` would run after an nsys step that exported ``sqlite``."""
    import dataclasses

    from tracekit.capture import commands as cmds
    from tracekit.capture.handoff import gpu_compute_capability, handoff_passes
    from tracekit.capture.options import Experiment
    from tracekit.capture.prepare import profiler_command
    from tracekit.capture.summary import summarize_nsys

    exp = Experiment.from_dict(spec["experiment"])
    frames: list[Any] = []
    summary = summarize_nsys(sqlite, frames=frames)  # as the nsys step of a capture does
    cc = gpu_compute_capability([sqlite])
    info: dict[str, Any] = {}
    passes = handoff_passes(exp, summary, frames, compute_capability=cc, info=info, reports=[sqlite])
    work = Path(WORK_TOKEN)
    names = [p.short_name or p.kernel for p in passes if p.kernel]
    old = dataclasses.replace(  # what the handoff ran before issue 17: one function-name filter, one shared count
        passes[0].options,
        kernel_name=cmds.kernel_name_regex(names),
        kernel_name_base="function",
        launch_count=3 * len(names),
        output_name=BASELINE,
    )
    # what it ran before issue 27: one pass per function name, ranked over the whole trace
    from tracekit.capture.handoff import top_kernels

    before = [
        {"step": f"before-{i}", "kernel": k["name"], "match": "short_name", "report": f"before_k{i}.ncu-rep",
         "nsys_launches": k["launches"], "nsys_total_ns": k["total_ns"],
         "argv": profiler_command(exp, "ncu", NCU_TOKEN, work, dataclasses.replace(
             passes[0].options, kernel_name=f"regex:^{re.escape(k['name'])}$", kernel_name_base="function",
             output_name=f"before_k{i}"))}
        for i, k in enumerate(top_kernels(frames, summary, exp.top_n), start=1)
    ]
    return {
        "sqlite": sqlite.name,
        "compute_capability": cc,
        "env": spec.get("env", {}),
        "handoff": info,
        "passes": [
            {
                "index": p.index,
                "step": p.step,
                "kernel": p.kernel,
                "match": p.match,
                "short_name": p.short_name,
                "demangled": p.demangled,
                "nsys_launches": p.nsys_launches,
                "nsys_total_ns": p.nsys_total_ns,
                "report": f"{p.options.output_name}.ncu-rep",
                "argv": profiler_command(exp, "ncu", NCU_TOKEN, work, p.options),
            }
            for p in passes
        ],
        "baseline": {
            "step": "baseline",
            "report": f"{BASELINE}.ncu-rep",
            "argv": profiler_command(exp, "ncu", NCU_TOKEN, work, old),
        },
        "before": before,
    }


def cmd_plan(args: argparse.Namespace) -> int:
    spec = json.loads(command_file(args.scenario).read_text())
    plan = make_plan(Path(args.sqlite), spec)
    _write_json(Path(args.plan), plan)
    for p in plan["passes"]:
        print(f"{p['step']}: {p['kernel']} ({p['nsys_launches']} launches in nsys)")
    print(f"wrote {args.plan}")
    return 0


# -- step 3 (device): the ncu passes ------------------------------------------------------------


def cmd_ncu_step(args: argparse.Namespace) -> int:
    plan = json.loads(Path(args.plan).read_text())
    out = _out_dir(args.out)
    ncu = os.environ.get("NCU") or (
        NCU_DEFAULT if Path(NCU_DEFAULT).exists() else shutil.which("ncu") or "ncu"
    )
    env = {**os.environ, **plan.get("env", {}), "PYTHONUNBUFFERED": "1"}
    values = {NCU_TOKEN: ncu, WORK_TOKEN: str(out)}
    record: dict[str, Any] = {"ncu": ncu, "runs": []}
    record["ncu_version"] = subprocess.run(
        [ncu, "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    runs = list(plan["passes"]) + ([] if args.no_baseline else [plan["baseline"]]) + (
        list(plan.get("before", [])) if args.before else [])
    for run in runs:
        result = _run(_subst(run["argv"], values), out / "ncu.log", env, args.timeout)
        result.update(step=run["step"], kernel=run.get("kernel"), report=run["report"])
        result["report_bytes"] = (
            (out / run["report"]).stat().st_size if (out / run["report"]).exists() else None
        )
        record["runs"].append(result)
        _write_json(out / "ncu_step.json", record)
        print(
            f"{run['step']}: rc {result['returncode']}, {result['wall_s']} s, {result['report_bytes']} bytes"
        )
    passes = [r for r in record["runs"] if r["step"] != "baseline"]
    return 0 if all(r["returncode"] == 0 and r["report_bytes"] for r in passes) else 1


# -- step 4 (local): the check ------------------------------------------------------------------

#: columns that may be null: chip-specific ones, and the tensor ones of a kernel without tensor FLOPs
MAY_BE_NULL = {"tc_pipe_pct"}  # tcgen05 (compute capability 10.x) only
NO_TENSOR_MAY_BE_NULL = {
    "tensor_precision",
    "peak_tensor_flops_per_s",
    "peak_source",
    "tensor_pct_of_peak",
    "tensor_peak_metric",
}


def check_reports(
    plan: dict[str, Any], ncu_dir: Path, sqlite: Path | None
) -> tuple[list[str], dict[str, Any]]:
    """Check every pass's report; return the failures (empty when all pass) and what was seen."""
    import polars as pl

    from tracekit.analysis import ncu_views as views
    from tracekit.analysis.nsys_ncu import join_ncu_to_nsys
    from tracekit.capture.handoff import profiled_launches
    from tracekit.ncu.report import NcuReport

    failures: list[str] = []
    seen: dict[str, Any] = {"passes": []}
    nsys_kernels = None
    if sqlite is not None:
        import tracekit

        nsys_kernels = tracekit.open(sqlite).kernels
    for p in plan["passes"]:
        kernel, path = p["kernel"], ncu_dir / p["report"]
        entry: dict[str, Any] = {"step": p["step"], "kernel": kernel, "report": p["report"]}
        seen["passes"].append(entry)
        if not path.exists():
            failures.append(f"{p['step']}: no report {p['report']}")
            continue
        column = p.get("match", "short_name")  # plans made before instantiation targeting: function names
        counts = profiled_launches([path], column)
        entry["launches"] = counts
        if not counts.get(kernel):
            failures.append(f"{p['step']}: {kernel} not in {p['report']} (it holds {counts})")
            continue
        report = NcuReport.from_path(path)
        ids = report.kernels.filter(pl.col(column) == kernel)["id"]
        tensor = views.tensor_core_utilization(report).filter(pl.col("id").is_in(ids.to_list()))
        has_tensor = bool((tensor["tensor_flop"].fill_null(0) > 0).all())
        entry["tensor_flop"] = tensor["tensor_flop"].to_list()
        tables = {
            "tensor_core_utilization": tensor,
            "dram_bandwidth": views.dram_bandwidth(report),
            "speed_of_light": views.speed_of_light(report),
            "roofline": views.roofline(report),
        }
        if nsys_kernels is not None:
            matched, summary = join_ncu_to_nsys(nsys_kernels, report.kernels)
            entry["join"] = summary.to_dicts()
            matched = matched.filter(pl.col("ncu_id").is_in(ids.implode()))
            if matched.height != ids.len():
                failures.append(
                    f"{p['step']}: {matched.height} of {ids.len()} {kernel} launches matched in nsys"
                )
        for name, table in tables.items():
            rows = table.filter(pl.col("id").is_in(ids.to_list()))
            if nsys_kernels is not None:  # the views on the nsys rows the join put them on
                rows = matched.select("ncu_id").join(rows, left_on="ncu_id", right_on="id")
            allowed = MAY_BE_NULL | (set() if has_tensor else NO_TENSOR_MAY_BE_NULL)
            # a ``*_reason`` column says why a number is missing: null where the number is there
            nulls = [c for c in rows.columns if c not in allowed and not c.endswith("_reason") and rows[c].null_count()]
            entry[name] = {"rows": rows.height, "null_columns": nulls}
            if rows.height == 0 or nulls:
                failures.append(
                    f"{p['step']}: {name} of {kernel}: {rows.height} rows, null {nulls}"
                )
    baseline = ncu_dir / plan["baseline"]["report"]
    if baseline.exists():  # the old command: which kernels one shared count reached
        seen["baseline_launches"] = profiled_launches([baseline])
    if plan.get("before"):  # the passes issue 27 replaced: function names ranked over the whole trace
        seen["before"] = [{"kernel": b["kernel"], "nsys_launches": b["nsys_launches"],
                           "launches": profiled_launches([ncu_dir / b["report"]]) if (ncu_dir / b["report"]).exists() else {}}
                          for b in plan["before"]]
    return failures, seen


def cmd_check(args: argparse.Namespace) -> int:
    plan = json.loads(Path(args.plan).read_text())
    sqlite = Path(args.sqlite) if args.sqlite else None
    failures, seen = check_reports(plan, Path(args.ncu_dir), sqlite)
    _write_json(Path(args.result), {"ok": not failures, "failures": failures, **seen})
    for entry in seen["passes"]:
        print(f"{entry['step']}: {entry['kernel']}: {entry.get('launches')}")
    if "baseline_launches" in seen:
        print(f"baseline (one filter, one count): {seen['baseline_launches']}")
    for failure in failures:
        print("FAIL", failure)
    print("OK" if not failures else f"{len(failures)} failure(s)")
    return 0 if not failures else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("nsys-command", help="(local) write tests/gpu/handoff[_SCENARIO]_nsys_command.json")
    p.add_argument("--scenario", choices=sorted(SCENARIOS), default="gemm")
    p = sub.add_parser("nsys-step", help="(device) nsys + sqlite export into $OUT")
    p.add_argument("--scenario", choices=sorted(SCENARIOS), default="gemm")
    p.add_argument("--out", help="default $OUT")
    p.add_argument("--work", default="/tmp/handoff_nsys")
    p.add_argument("--timeout", type=float, default=240)
    p = sub.add_parser("plan", help="(local) the handoff passes from the step-1 export")
    p.add_argument("--scenario", choices=sorted(SCENARIOS), default="gemm")
    p.add_argument("--sqlite", required=True)
    p.add_argument("--plan", default=str(ARTIFACTS / "plan.json"))
    p = sub.add_parser("ncu-step", help="(device) the planned ncu passes into $OUT")
    p.add_argument("--plan", default=str(ARTIFACTS / "plan.json"))
    p.add_argument("--out", help="default $OUT")
    p.add_argument("--timeout", type=float, default=120, help="per ncu run")
    p.add_argument("--no-baseline", action="store_true", help="skip the old single-filter run")
    p.add_argument("--before", action="store_true", help="also run the passes of before issue 27 (function names, whole trace)")
    p = sub.add_parser("check", help="(local) the three kernels and their columns")
    p.add_argument("--ncu-dir", required=True)
    p.add_argument("--sqlite", help="the step-1 export, for join_ncu_to_nsys")
    p.add_argument("--plan", default=str(ARTIFACTS / "plan.json"))
    p.add_argument("--result", default=str(ARTIFACTS / "check.json"))
    args = parser.parse_args(argv)
    handler = {
        "nsys-command": cmd_nsys_command,
        "nsys-step": cmd_nsys_step,
        "plan": cmd_plan,
        "ncu-step": cmd_ncu_step,
        "check": cmd_check,
    }[args.cmd]
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
