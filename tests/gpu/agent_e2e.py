"""GPU check of issue 19.5: after a timeout, no nsys process outlives tracekit's run.

Runs ``nsys profile`` on an endless GPU loop twice and stops it after ``TIMEOUT_S``:

* ``group``: the stop that tracekit used before the fix — the process group and its descendants
  (``kill_tree`` without a run id);
* ``run_process``: tracekit's runner as captures use it (TRACEKIT_RUN_ID marker in the child's
  environment, marked processes stopped after the group).

After each stop it lists every process left whose command line names nsys (or whose
environment carries the marker), then kills them so the next variant starts clean. Only the
standard library and tracekit.capture.runner (stdlib-only) are imported: no wheels needed.
Writes agent_e2e.json and agent_e2e.txt to $OUT.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import procscan  # noqa: E402 - tests/gpu/procscan.py, beside this script

from tracekit.capture import runner  # noqa: E402

NSYS = os.environ.get("NSYS", "/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys")
TIMEOUT_S = float(os.environ.get("TIMEOUT_S", "30"))
# What a command line must name to be listed: the nsys install's folder (not "nsys" alone, which
# the device tool's own shell line may contain; signalling that shell ends the call).
PATTERN = os.environ.get("PATTERN", "/nsight-compute/")
OUT = Path(os.environ.get("OUT", "/tmp/agent_e2e_out"))
WORK = Path("/tmp/agent_e2e")
LOOP = (
    "import torch\n"
    "x = torch.randn(4096, 4096, device='cuda')\n"
    "print('started', flush=True)\n"
    "while True:\n"
    "    x = (x @ x).clamp(-1, 1)\n"
)


def processes() -> list[dict[str, object]]:
    """Every live process (not this one) whose command line names nsys or whose environment
    carries TRACEKIT_RUN_ID."""
    return procscan.processes(
        lambda cmd, marker: PATTERN in cmd or "nsys-tee" in cmd or str(WORK / "loop.py") in cmd or marker is not None)


def clean() -> list[int]:
    return procscan.kill_all([int(p["pid"]) for p in processes()])  # type: ignore[arg-type]


def argv(name: str) -> list[str]:
    return [NSYS, "profile", "-o", str(WORK / name), "--force-overwrite", "true", "-t", "cuda",
            sys.executable, str(WORK / "loop.py")]


def variant_group(env: dict[str, str]) -> dict[str, object]:
    proc = subprocess.Popen(argv("group"), env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(TIMEOUT_S)
    during = processes()
    sent = runner.kill_tree(proc, grace_s=30.0, run_id=None)
    time.sleep(3)
    return {"during": during, "signals": sent, "left": processes()}


def variant_run_process(env: dict[str, str]) -> dict[str, object]:
    import threading

    during: list[dict[str, object]] = []
    sampler = threading.Timer(TIMEOUT_S - 3, lambda: during.extend(processes()))
    sampler.start()
    res = runner.run_process(argv("run_process"), env=env, timeout_s=TIMEOUT_S,
                             kill_grace_s=30.0, tool="nsys", step="nsys")
    sampler.cancel()
    time.sleep(3)
    return {"status": res.status, "returncode": res.returncode, "signals": list(res.signals_sent),
            "during": during, "left": processes()}


def main() -> int:
    WORK.mkdir(parents=True, exist_ok=True)
    OUT.mkdir(parents=True, exist_ok=True)
    (WORK / "loop.py").write_text(LOOP)
    env = dict(os.environ)
    results: dict[str, object] = {"nsys": subprocess.run([NSYS, "--version"], capture_output=True, text=True).stdout.strip(),
                                  "timeout_s": TIMEOUT_S, "before": clean()}
    for name, fn in (("group", variant_group), ("run_process", variant_run_process)):
        t0 = time.monotonic()
        try:
            results[name] = fn(env)
        except Exception as exc:  # record and go on to the next variant
            results[name] = {"error": repr(exc)}
        results[name]["seconds"] = round(time.monotonic() - t0, 1)  # type: ignore[index]
        results[name]["killed_after"] = clean()  # type: ignore[index]
    results["reports"] = sorted(p.name for p in WORK.iterdir())
    (OUT / "agent_e2e.json").write_text(json.dumps(results, indent=1, default=str))
    lines = [f"nsys {results['nsys']}", f"timeout {TIMEOUT_S} s", f"reports: {results['reports']}"]
    for name in ("group", "run_process"):
        r = results[name]
        left = r.get("left", [])  # type: ignore[union-attr]
        lines.append(f"{name}: {len(left)} nsys/marked process(es) left after the stop: "
                     + "; ".join(f"{p['pid']} sid={p['sid']} marker={bool(p['marker'])} {p['cmd'][:80]}" for p in left))
    (OUT / "agent_e2e.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
