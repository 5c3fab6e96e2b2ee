"""End-to-end run of tracekit.capture on a GPU machine (started by tests/gpu/capture_e2e.sh).

Each check runs the public API on the sample workloads and records what came out in
``<work>/e2e_results.json``; a failing check is recorded and the next one runs. Checks that
would not fit in the remaining time budget are skipped (and recorded as skipped).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = ROOT / "sample_traces" / "workloads"
PY = "python3"
# a GPU program that runs until it is stopped: one small matmul every 10 ms
LONG_RUNNER = (
    "import time, torch\n"
    "x = torch.ones(512, 512, device='cuda')\n"
    "while True:\n"
    "    x = (x @ x) * 1e-3\n"
    "    torch.cuda.synchronize()\n"
    "    time.sleep(0.01)\n"
)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # the runner then stops the profiler's whole process tree


class Checks:
    def __init__(self, work: Path, budget_s: float) -> None:
        self.work, self.budget_s, self.t0 = work, budget_s, time.monotonic()
        self.out = work / "experiments"
        self.results: dict[str, dict[str, Any]] = {}

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.t0)

    def cap(self, seconds: float) -> float:
        """A run's timeout, shortened so that it ends inside the budget (with time to export)."""
        return max(10.0, min(seconds, self.left() - 20))

    def check(self, name: str, cost_s: float, fn: Callable[[], dict[str, Any]]) -> None:
        if self.left() < cost_s:
            self.results[name] = {
                "ok": None,
                "skipped": f"needs ~{cost_s:.0f} s, {self.left():.0f} s left",
            }
            print(f"== {name}: SKIPPED (time)", flush=True)
            return
        print(f"== {name} ({self.left():.0f} s left)", flush=True)
        started = time.monotonic()
        try:
            record = fn()
            record.setdefault("ok", True)
        except KeyboardInterrupt:
            self.results[name] = {"ok": False, "error": "interrupted"}
            raise
        except Exception as exc:
            record = {
                "ok": False,
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-3000:],
            }
        record["seconds"] = round(time.monotonic() - started, 1)
        self.results[name] = record
        print(
            f"== {name}: {'OK' if record['ok'] else 'FAILED'} in {record['seconds']} s "
            f"{'' if record['ok'] else record.get('error', '')}",
            flush=True,
        )
        self.save()

    def save(self) -> None:
        (self.work / "e2e_results.json").write_text(
            json.dumps(self.results, indent=2, default=str) + "\n"
        )


def describe(result: Any) -> dict[str, Any]:
    """The facts of an ExperimentResult worth keeping."""
    nsys = result.summary.get("nsys") or {}
    ncu = result.summary.get("ncu") or {}
    return {
        "folder": str(result.folder.relative_to(result.folder.parents[1])),
        "status": result.status,
        "error": result.error,
        "target_exit_code": result.target_exit_code,
        "target_exit_code_source": result.target_exit_code_source,
        "profiler_exit_code": result.profiler_exit_code,
        "wall_s": result.wall_s,
        "program_wall_s": result.program_wall_s,
        "reports": {k: [p.name for p in v] for k, v in result.reports.items()},
        "files": sorted(p.name for p in result.folder.iterdir()),
        "summary_source": nsys.get("source"),
        "summary_error": nsys.get("error") or ncu.get("error"),
        "kernel_count": nsys.get("kernel_count"),
        "gpu_time_ns": nsys.get("gpu_time_ns"),
        "idle_pct": nsys.get("idle_pct"),
        "comm_pct": nsys.get("comm_pct"),
        "top_kernels": [
            (k.get("short_name") or k["name"])[:60] for k in (nsys.get("top_kernels") or [])[:3]
        ],
        "ncu_profiled_kernels": ncu.get("profiled_kernels"),
        "ncu_top": [k["name"][:60] for k in (ncu.get("top_kernels") or [])[:3]],
        "handoff": result.handoff,
        "warnings": result.warnings,
        "commands": (result.folder / "command.txt").read_text().splitlines(),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--libdw", required=True, help="folder holding libdw.so.1")
    parser.add_argument("--budget", type=float, default=420)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _interrupt)
    args.work.mkdir(parents=True, exist_ok=True)

    from tracekit.capture import Experiment, NcuOptions, NsysOptions, preflight, run, sweep
    from tracekit.capture.config import resolve

    c = Checks(args.work, args.budget)
    base_ld = os.environ.get("LD_LIBRARY_PATH", "")
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
        gpus = listing.stdout.count("GPU ")
    except OSError:
        gpus = 0

    def tools() -> dict[str, Any]:
        nsys, ncu = preflight.resolve_tool("nsys"), preflight.resolve_tool("ncu")
        return {
            "nsys": [str(nsys.path), nsys.version],
            "ncu": [str(ncu.path), ncu.version],
            "gpus": gpus,
            "importers": [str(p) for p in preflight.importer_candidates(nsys.path)],
            "export_has_include_blobs": "--include-blobs"
            in preflight.help_text(str(nsys.path), "export"),
        }

    def preflight_without_libdw() -> dict[str, Any]:
        nsys = preflight.resolve_tool("nsys")
        env = {**os.environ, "LD_LIBRARY_PATH": base_ld}
        try:
            notes = preflight.check_importer(nsys.path, env)
        except Exception as exc:
            return {"raised": True, "message": str(exc), "ok": "libdw" in str(exc)}
        return {"raised": False, "notes": notes, "ok": False}

    def postrun_without_libdw() -> dict[str, Any]:
        exp = Experiment(
            command=[PY, "-c", "print('no libdw')"],
            mode="nsys",
            out=str(c.out),
            name="nolibdw",
            env={"LD_LIBRARY_PATH": base_ld},
            timeout_s=c.cap(90),
        )
        result = run(exp, check=False, system_checks=False)
        d = describe(result)
        d["ok"] = bool(result.error and "qdstrm" in result.error)
        return d

    c.check("tools", 5, tools)
    c.check("preflight_without_libdw", 5, preflight_without_libdw)
    os.environ["LD_LIBRARY_PATH"] = f"{args.libdw}:{base_ld}" if base_ld else args.libdw

    def exit_code_probe() -> dict[str, Any]:
        result = run(
            Experiment(
                command=[PY, "-c", "import sys; print('bye'); sys.exit(3)"],
                mode="nsys",
                out=str(c.out),
                name="exit3",
                timeout_s=c.cap(90),
            ),
            check=False,
        )
        d = describe(result)
        d["ok"] = result.target_exit_code == 3
        return d

    decode_opts = NsysOptions(
        trace=("cuda", "nvtx", "osrt"),
        capture_range="cudaProfilerApi",
        cuda_memory_usage=True,
        gpu_metrics_devices="0",
        gpu_metrics_frequency_hz=2000,
    )

    def nsys_decode() -> dict[str, Any]:
        exp = Experiment(
            command=[PY, "decode.py", "--steps", "8"],
            mode="nsys",
            cwd=str(WORKLOADS),
            out=str(c.out),
            nsys=decode_opts,
            timeout_s=c.cap(150),
        )
        result = run(exp, check=False)
        d = describe(result)
        if (
            not result.complete
        ):  # GPU metrics need counters a sandbox may hide: try once without them
            d["first_try"] = {"status": result.status, "error": result.error}
            result = run(
                exp.replace(
                    nsys=NsysOptions(
                        trace=decode_opts.trace,
                        capture_range="cudaProfilerApi",
                        cuda_memory_usage=True,
                    )
                ),
                check=False,
            )
            d.update(describe(result), retried_without_gpu_metrics=True)
        try:
            trace = result.open()
            d["loader"] = {
                name: getattr(trace, name).height
                for name in ("kernels", "memcpys", "nvtx", "gpu_metrics")
            }
        except Exception as exc:  # the loader's state is recorded, not required
            d["loader"] = f"{type(exc).__name__}: {exc}"
        d["ok"] = result.complete and (d["kernel_count"] or 0) > 0
        return d

    def ncu_drilldown() -> dict[str, Any]:
        exp, _, _ = resolve(
            {
                "preset": "kernel-drilldown",
                "command": [PY, "decode.py", "--steps", "2", "--warmup", "1"],
                "cwd": str(WORKLOADS),
                "out": str(c.out),
                "timeout_s": c.cap(200),
                "ncu": {"nvtx_include": ["step.1/"], "launch_count": 8},
            }
        )
        result = run(exp, check=False)
        d = describe(result)
        d["ok"] = result.complete and (d["ncu_profiled_kernels"] or 0) > 0
        return d

    def nsys_then_ncu() -> dict[str, Any]:
        exp = Experiment(
            command=[PY, "decode.py", "--steps", "4", "--warmup", "2"],
            mode="nsys+ncu",
            cwd=str(WORKLOADS),
            out=str(c.out),
            top_n=3,
            timeout_s=c.cap(150),
            nsys=NsysOptions(trace=("cuda", "nvtx"), capture_range="cudaProfilerApi"),
            ncu=NcuOptions(set="basic", nvtx_include=("step.1/",)),
        )
        result = run(exp, check=False)
        d = describe(result)
        d["ok"] = (
            result.complete
            and bool(result.handoff and result.handoff.get("kernels"))
            and bool(result.reports.get("ncu"))
        )
        return d

    def torchrun_per_rank() -> dict[str, Any]:
        if gpus < 2:
            return {"ok": None, "skipped": f"{gpus} GPU(s); needs 2"}
        exp, _, _ = resolve(
            {
                "preset": "torchrun",
                "cwd": str(WORKLOADS),
                "out": str(c.out),
                "timeout_s": c.cap(200),
                "command": [
                    PY,
                    "-m",
                    "torch.distributed.run",
                    "--nproc-per-node",
                    "2",
                    "decode.py",
                    "--tp",
                    "2",
                    "--steps",
                    "4",
                ],
                "nsys": {"capture_range": "cudaProfilerApi"},
            }
        )
        result = run(exp, check=False)
        d = describe(result)
        d["ok"] = result.complete and len(result.reports.get("sqlite", [])) == 2
        return d

    def sweep_2x2() -> dict[str, Any]:
        table = sweep(
            [PY, "decode.py", "--batch", "{batch}", "--steps", "{steps}"],
            {"batch": [1, 4], "steps": [4, 8]},
            mode="nsys",
            cwd=str(WORKLOADS),
            out=str(c.out),
            name="decode",
            timeout_s=c.cap(90),
            nsys=NsysOptions(trace=("cuda", "nvtx"), capture_range="cudaProfilerApi"),
        )
        print(table.drop("folder", "error"), flush=True)
        rows = table.drop("folder").to_dicts()
        return {
            "rows": rows,
            "sweep_folder": str(Path(table["folder"][0]).parent.name),
            "ok": table.height == 4
            and set(table["status"].to_list()) == {"complete"}
            and all((r["gpu_time_ns"] or 0) > 0 for r in rows),
        }

    def cli() -> dict[str, Any]:
        argv = [
            "capture",
            "nsys",
            "--preset",
            "quick",
            "--capture-range",
            "cudaProfilerApi",
            "--out",
            str(c.out / "cli"),
            "--name",
            "cli",
            "--timeout",
            str(int(c.cap(90))),
            "--cwd",
            str(WORKLOADS),
            "--",
            PY,
            "decode.py",
            "--steps",
            "2",
        ]
        probe = subprocess.run(
            [sys.executable, "-c", "import tracekit.cli.main"],
            capture_output=True,
            text=True,
            check=False,
        )
        entry = (
            ["-m", "tracekit.cli.main"] if probe.returncode == 0 else ["-m", "tracekit.cli.capture"]
        )
        if probe.returncode != 0:
            argv = argv[1:]
        proc = subprocess.run(
            [sys.executable, *entry, *argv],
            capture_output=True,
            text=True,
            timeout=150,
            check=False,
        )
        folders = sorted(p.name for p in (c.out / "cli").glob("cli_nsys_*"))
        return {
            "entry": entry,
            "main_import_error": probe.stderr[-500:],
            "returncode": proc.returncode,
            "tail": (proc.stdout + proc.stderr)[-1500:],
            "folders": folders,
            "ok": proc.returncode == 0 and len(folders) == 1,
        }

    def timeout_keeps_report() -> dict[str, Any]:
        exp = Experiment(
            command=[PY, "-c", LONG_RUNNER],
            mode="nsys",
            out=str(c.out),
            name="timeout",
            timeout_s=c.cap(25),
            kill_grace_s=60,
            nsys=NsysOptions(trace=("cuda",)),
        )
        result = run(exp, check=False)
        d = describe(result)
        d["signals"] = [s.get("signals_sent") for s in result.steps]
        d["ok"] = result.status == "timeout" and bool(result.reports.get("nsys"))
        return d

    try:
        c.check("exit_code_probe", 30, exit_code_probe)
        c.check("nsys_decode", 60, nsys_decode)
        c.check("ncu_drilldown", 90, ncu_drilldown)
        c.check("nsys_then_ncu", 90, nsys_then_ncu)
        c.check("torchrun_per_rank", 80, torchrun_per_rank)
        c.check("sweep_2x2", 100, sweep_2x2)
        c.check("cli", 40, cli)
        c.check("postrun_without_libdw", 25, postrun_without_libdw)
        c.check("timeout_keeps_report", 70, timeout_keeps_report)
    except KeyboardInterrupt:
        print("== interrupted (time limit); results so far are kept", flush=True)
    c.save()
    print("\n== summary", flush=True)
    for name, record in c.results.items():
        state = "SKIP" if record.get("ok") is None else ("OK" if record["ok"] else "FAIL")
        detail = record.get("skipped") or record.get("error") or ""
        facts = {
            k: record[k]
            for k in (
                "status",
                "target_exit_code",
                "kernel_count",
                "ncu_profiled_kernels",
                "comm_pct",
                "top_kernels",
            )
            if record.get(k) not in (None, [], "")
        }
        print(
            f"{state:4} {name:24} {record.get('seconds', '')!s:>6}s {detail[:160]} {facts}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
