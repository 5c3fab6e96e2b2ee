"""`tracekit mcp`: each tool's latency, cold and warm, against the same answer from the CLI.

For every tool, in each round:

* **cold**: a fresh server (``tracekit mcp --root DIR``) is started and sent the MCP
  handshake, then the tool call; *cold total* runs from starting the process to the answer
  (what an agent waits for on its first question), *first call* from sending the call.
* **warm**: the same call again in that server (the trace is open, its tables read).
* **CLI**: the same answer from the CLI, a fresh process (`tracekit stats -f csv`, `tracekit
  diagnose -f json` …; the stats CSVs the CLI keeps are deleted first so the report is
  computed, as a server call computes it).

The column cache (``$TRACEKIT_CACHE`` under benchmarks/out) is filled by one unmeasured run of
each CLI command and each tool first, so every number is with the cache warm, on both sides.
The client is a bare JSON-RPC one over the server's pipes (no SDK on the measuring side). Peak
RSS: ``VmHWM`` of the server process and of its worker, read before the server is closed; the
CLI's from ``wait4``. Ratios are of this run's medians.

    python benchmarks/mcp_latency.py [--file benchmarks/out/s1x.sqlite] [--rounds 3] [--tools a,b]

The 1 M-kernel export is built when missing (``make_big_trace.py --kernels 1000000
--gpu-metrics-every 16``: 0.36 GB, the ``s1x`` of README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    OUT,
    REPO,
    drop_kept_reports,
    fmt_ratio,
    fmt_s,
    markdown_table,
    precompile_tracekit,
    print_table,
    python,
    run_measured,
    sha256,
    source_state,
    table_info,
    wait_for_idle,
    warm_page_cache,
    write_results,
)

DEFAULT_FILE = OUT / "s1x.sqlite"
KERNEL = "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT"  # the decode seed's top GEMM, 21 % of its kernel time
QUERY = ("SELECT short_name, count(*) AS launches, sum(duration_ns) AS total_ns FROM kernels "
         "GROUP BY short_name ORDER BY total_ns DESC")
_QUERY_CLI = ("import sys, polars as pl, tracekit; t = tracekit.open(sys.argv[1]); "
              "r = pl.SQLContext({'kernels': t.scan('kernels')}, register_globals=False).execute(sys.argv[2], eager=True); "
              "sys.stdout.write(r.write_json())")


def cases(path: Path) -> dict[str, tuple[dict[str, Any], list[str]]]:
    """Tool → (its arguments, the CLI command giving the same answer)."""
    exe = str(Path(python()).with_name("tracekit"))
    f = str(path)
    return {
        "describe": ({"path": f}, [exe, "summary", "--findings", "0", f]),  # nearest: capture, GPUs, structure
        "summary": ({"path": f}, [exe, "summary", f]),
        "diagnose": ({"path": f}, [exe, "diagnose", "-f", "json", f]),
        "stats": ({"path": f, "report": "cuda_gpu_kern_sum"}, [exe, "stats", "-r", "cuda_gpu_kern_sum", "-f", "csv", f]),
        "top_kernels": ({"path": f, "n": 10}, [exe, "stats", "-r", "cuda_gpu_kern_sum", "-f", "csv", f]),
        "kernel": ({"path": f, "name": KERNEL}, [exe, "stats", "-r", "cuda_gpu_kern_sum:base", "-f", "csv", f]),
        "query": ({"path": f, "sql": QUERY}, [python(), "-c", _QUERY_CLI, f, QUERY]),
        "diff": ({"before": f, "after": f}, [exe, "diff", "-f", "json", f, f]),
    }


class Server:
    """``tracekit mcp --root ROOT`` on pipes, spoken to in newline-delimited JSON-RPC."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.t0 = time.perf_counter()
        exe = str(Path(python()).with_name("tracekit"))
        self.proc = subprocess.Popen([exe, "mcp", "--root", str(root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=env, cwd=REPO)
        self._buf = b""
        self._id = 0
        self.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                    "clientInfo": {"name": "mcp_latency", "version": "1"}})
        self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def _send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()

    def request(self, method: str, params: dict[str, Any], timeout: float = 900) -> dict[str, Any]:
        self._id += 1
        self._send({"jsonrpc": "2.0", "id": self._id, "method": method, "params": params})
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while True:
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                msg = json.loads(line)
                if msg.get("id") == self._id:
                    if "error" in msg:
                        raise RuntimeError(f"{method}: {msg['error']}")
                    return msg["result"]  # type: ignore[no-any-return]
            ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0))
            if not ready:
                raise TimeoutError(method)
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise RuntimeError(f"the server closed its output during {method}")
            self._buf += chunk

    def call(self, tool: str, args: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        t = time.perf_counter()
        result = self.request("tools/call", {"name": tool, "arguments": args})
        if result.get("isError"):
            raise RuntimeError(f"{tool}: {result['content'][0]['text']}")
        return time.perf_counter() - t, result

    def peak_rss_mb(self) -> tuple[float, float]:
        """``VmHWM`` of the server and of its worker (MiB)."""
        kids = []
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            kids += [int(x) for x in (task / "children").read_text().split()]
        return _hwm(self.proc.pid), sum(_hwm(k) for k in kids)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _hwm(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _ensure_export(path: Path) -> None:
    if path.is_file():
        return
    seed = REPO / "sample_traces" / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
    subprocess.run([python(), str(Path(__file__).with_name("make_big_trace.py")), "--kernels", "1000000",
                    "--gpu-metrics-every", "16", "--seed", str(seed), "-o", str(path)], check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", type=Path, default=DEFAULT_FILE)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tools", default="", help="comma-separated subset (default: all)")
    args = ap.parse_args()
    path: Path = args.file.resolve()
    _ensure_export(path)
    precompile_tracekit()
    cache = OUT / "cache_mcp"
    env = {**os.environ, "TRACEKIT_CACHE": str(cache), "COLUMNS": "200"}
    todo = cases(path)
    if args.tools:
        todo = {k: v for k, v in todo.items() if k in args.tools.split(",")}
    before = sha256(path)
    warm_page_cache(path)
    for tool, (targs, argv) in todo.items():  # fill the column cache (both sides); not timed
        drop_kept_reports(cache)
        first = run_measured(argv, env=env)
        if first.returncode not in (0, 1):  # diff exits 1 on a regression
            sys.exit(f"{argv} failed: {first.stderr.strip()}")
        s = Server(path.parent, env)
        s.call(tool, targs)
        s.close()
    rows_out: dict[str, dict[str, list[float]]] = {t: {"cold": [], "first": [], "warm": [], "cli": [], "server_mb": [],
                                                       "worker_mb": [], "cli_mb": [], "handshake": []} for t in todo}
    for _ in range(args.rounds):
        for tool, (targs, argv) in todo.items():
            wait_for_idle()
            s = Server(path.parent, env)
            r = rows_out[tool]
            r["handshake"].append(time.perf_counter() - s.t0)
            first, _ = s.call(tool, targs)
            r["cold"].append(time.perf_counter() - s.t0)
            r["first"].append(first)
            warm, _ = s.call(tool, targs)
            r["warm"].append(warm)
            server_mb, worker_mb = s.peak_rss_mb()
            r["server_mb"].append(server_mb)
            r["worker_mb"].append(worker_mb)
            s.close()
            wait_for_idle()
            drop_kept_reports(cache)
            m = run_measured(argv, env=env)
            if m.returncode not in (0, 1):
                sys.exit(f"{argv} failed: {m.stderr.strip()}")
            r["cli"].append(m.wall_s)
            r["cli_mb"].append(m.peak_rss_mb)
    after = sha256(path)
    med = {t: {k: statistics.median(v) for k, v in r.items()} for t, r in rows_out.items()}
    peak = {t: {k: max(r[k]) for k in ("server_mb", "worker_mb", "cli_mb")} for t, r in rows_out.items()}
    header = ["tool", "CLI (s)", "cold total (s)", "first call (s)", "warm (s)", "cold ÷ CLI", "warm ÷ CLI",
              "server / worker peak RSS (MiB)", "CLI peak RSS (MiB)"]
    rows = [[t, fmt_s(m["cli"]), fmt_s(m["cold"]), fmt_s(m["first"]), fmt_s(m["warm"]), fmt_ratio(m["cold"] / m["cli"]),
             fmt_ratio(m["warm"] / m["cli"]), f"{peak[t]['server_mb']:.0f} / {peak[t]['worker_mb']:.0f}",
             f"{peak[t]['cli_mb']:.0f}"] for t, m in med.items()]
    print_table(f"tracekit mcp tool latency on {path.name} (medians of {args.rounds}; column cache warm)", header, rows)
    write_results(
        "mcp_latency",
        {"file": str(path), "tables": table_info(path), "sha256_before": before, "sha256_after": after,
         "unchanged": before == after, "median_s": med, "peak_rss_mb": peak, "runs": rows_out,
         "cases": {t: {"args": a, "cli": c} for t, (a, c) in todo.items()}, "source": source_state()},
        markdown_table(header, rows),
    )


if __name__ == "__main__":
    main()
