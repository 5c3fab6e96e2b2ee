"""GPU check of issue 29.6: a ``tracekit capture nsys`` stopped from outside, three ways.

Each scenario starts ``python3 -m tracekit.cli.main capture nsys -- python3 loop.py`` (an endless
4096² matmul loop) in a session of its own, as a terminal would, waits ``WARMUP_S`` and then:

* ``kill_target``: SIGKILL the profiled program (``loop.py``);
* ``kill_nsys``: SIGKILL the ``nsys profile`` process;
* ``hangup_session``: SIGHUP the whole session (the terminal closing).

It then waits for the CLI to end (at most ``WAIT_S``), reads the experiment record
(``experiment.json``: status, error, exit codes, signals sent) and lists every process left whose
command line names the nsys folder, the loop or the work folder, or whose environment carries
``TRACEKIT_RUN_ID`` — what "nothing keeps running" means — then kills them so the next scenario
starts clean. Only the standard library is imported here; the CLI runs without polars (its
summary then says so). Writes ``stop_e2e.json`` and ``stop_e2e.txt`` to ``$OUT``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import procscan  # tests/gpu/procscan.py, beside this script

ROOT = Path(__file__).resolve().parents[2]
NSYS = os.environ.get("NSYS", "/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys")
WARMUP_S = float(os.environ.get("WARMUP_S", "20"))
WAIT_S = float(os.environ.get("WAIT_S", "90"))
PATTERN = os.environ.get("PATTERN", "/nsight-compute/")
OUT = Path(os.environ.get("OUT", "/tmp/stop_e2e_out"))
WORK = Path("/tmp/stop_e2e")
LOOP = (
    "import torch\n"
    "x = torch.randn(4096, 4096, device='cuda')\n"
    "print('started', flush=True)\n"
    "while True:\n"
    "    x = (x @ x).clamp(-1, 1)\n"
)


def _ours(cmd: str, marker: str | None) -> bool:
    return PATTERN in cmd or str(WORK) in cmd or "tracekit.cli.main capture" in cmd or marker is not None


def processes(skip: set[int] = frozenset()) -> list[dict[str, object]]:  # type: ignore[assignment]
    """Live processes (not this one) of the capture: nsys, the loop, the CLI, or marked."""
    return procscan.processes(_ours, skip=skip, cmd_chars=160)


def find(word: str) -> list[int]:
    return [int(p["pid"]) for p in processes() if word in str(p["cmd"])]  # type: ignore[arg-type]


def clean() -> list[int]:
    return procscan.kill_all([int(p["pid"]) for p in processes()])  # type: ignore[arg-type]


def scenario(name: str) -> dict[str, object]:
    out = WORK / name
    argv = [sys.executable, "-m", "tracekit.cli.main", "capture", "nsys", "--nsys-path", NSYS, "--trace", "cuda",
            "--sample", "none", "--cpuctxsw", "none", "--out", str(out), "--name", name, "--quiet", "--",
            sys.executable, str(WORK / "loop.py")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = open(WORK / f"{name}.cli.log", "wb")  # noqa: SIM115 - closed below
    cli = subprocess.Popen(argv, env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
    time.sleep(WARMUP_S)
    during = processes()
    action: dict[str, object] = {}
    if name == "kill_target":
        pids = find("loop.py")
        pids = [p for p in pids if not any(w in str(next((q["cmd"] for q in during if q["pid"] == p), "")) for w in ("nsys", "tracekit.cli.main"))]
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        action = {"killed": pids, "signal": "SIGKILL"}
    elif name == "kill_nsys":
        pids = [int(p["pid"]) for p in during if " profile " in str(p["cmd"]) and PATTERN in str(p["cmd"])]  # type: ignore[arg-type]
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        action = {"killed": pids, "signal": "SIGKILL"}
    else:
        os.killpg(cli.pid, signal.SIGHUP)  # the terminal's session goes away
        action = {"killpg": cli.pid, "signal": "SIGHUP"}
    t0 = time.monotonic()
    try:
        rc: int | None = cli.wait(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        rc = None
    ended_s = round(time.monotonic() - t0, 1)
    log.close()
    time.sleep(3)
    left = processes()
    folders = sorted(out.glob("*/")) if out.is_dir() else []
    record: dict[str, object] = {}
    if folders:
        path = folders[0] / "experiment.json"
        if path.is_file():
            full = json.loads(path.read_text())
            record = {k: full.get(k) for k in ("status", "error", "target_exit_code", "target_exit_code_source",
                                               "profiler_exit_code", "wall_s", "warnings", "reports")}
            record["steps"] = [{k: s.get(k) for k in ("step", "status", "returncode", "signals_sent")} for s in full.get("steps", [])]
        record["files"] = sorted(p.name for p in folders[0].iterdir())
    return {"action": action, "during": len(during), "cli_returncode": rc, "cli_ended_after_s": ended_s,
            "cli_output": (WORK / f"{name}.cli.log").read_text(errors="replace")[-1500:], "record": record,
            "left": left, "killed_after": clean()}


def main() -> int:
    WORK.mkdir(parents=True, exist_ok=True)
    OUT.mkdir(parents=True, exist_ok=True)
    (WORK / "loop.py").write_text(LOOP)
    results: dict[str, object] = {"nsys": subprocess.run([NSYS, "--version"], capture_output=True, text=True).stdout.strip(),
                                  "before": clean()}
    lines = [f"nsys {results['nsys']}"]
    for name in ("kill_target", "kill_nsys", "hangup_session"):
        t0 = time.monotonic()
        try:
            r = scenario(name)
        except Exception as exc:  # record and go on
            r = {"error": repr(exc), "killed_after": clean()}
        r["seconds"] = round(time.monotonic() - t0, 1)
        results[name] = r
        rec = r.get("record", {}) or {}
        lines.append(f"{name}: cli rc={r.get('cli_returncode')} after {r.get('cli_ended_after_s')} s; status={rec.get('status')}; "
                     f"error={rec.get('error')}; target={rec.get('target_exit_code')} ({rec.get('target_exit_code_source')}); "
                     f"nsys rc={rec.get('profiler_exit_code')}; left={len(r.get('left', []))}")  # type: ignore[arg-type]
    (OUT / "stop_e2e.json").write_text(json.dumps(results, indent=1, default=str))
    (OUT / "stop_e2e.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
