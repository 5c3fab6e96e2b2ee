"""``tracekit mcp`` / ``tracekit-mcp``: the Model Context Protocol server (stdio) over the tools
of :mod:`tracekit.agent.tools`.

Each tool call is sent to one worker process (:mod:`tracekit.agent.worker`) and waited for
with a deadline (``--timeout``, default :data:`DEFAULT_TIMEOUT_S`): past it the worker is
killed and the call answers one line; the next call starts a fresh worker. Calls run one at a
time, in the order they come. The worker's address space is bounded (``--max-memory-gb``,
default half the machine's memory). A tool's answer is a ``CallToolResult`` whose
``structuredContent`` is the tool's JSON and whose content is its one-line summary followed
by the same JSON as text (for clients that read text only); a refused or failed call is an
``isError`` result holding the CLI's one line. See docs/agents.md.

The ``mcp`` package (the ``agent`` extra) is imported only when the server starts.
"""

# no ``from __future__ import annotations``: the SDK reads each tool's parameters from its
# annotations, which name types imported inside build_server (mcp is imported lazily)
import argparse
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from tracekit.agent.worker import MAX_ANSWER_BYTES

__all__ = ["DEFAULT_TIMEOUT_S", "STATS_REPORTS", "Worker", "build_server", "default_memory_gb", "main", "serve"]

#: Seconds one tool call may take unless ``--timeout`` says otherwise.
DEFAULT_TIMEOUT_S = 120.0
#: Report names of the ``stats`` tool (those of :data:`tracekit.stats.REPORTS`; listed here so
#: that starting the server imports no polars; a test keeps the two in step).
STATS_REPORTS = ("cuda_gpu_kern_sum", "cuda_gpu_mem_time_sum", "cuda_gpu_mem_size_sum", "cuda_api_sum", "nvtx_sum",
                 "cuda_gpu_trace", "nvtx_gpu_proj_trace", "nvtx_gpu_proj_sum", "nvtx_kern_sum", "cuda_kern_exec_sum",
                 "cuda_kern_exec_trace")


def default_memory_gb() -> float:
    """Half the machine's memory in GB (10⁹ bytes; ``MemTotal``), the default bound of the
    worker's address space; 0 (no bound) where it is unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) * 1024 / 2 / 1e9, 1)
    except OSError:
        pass
    return 0.0


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the worker's process group (it leads its own session), else the worker."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


class Worker:
    """The worker process and the one call it runs at a time (thread-safe).

    ``config``: what :func:`tracekit.agent.worker.main` takes (``roots``,
    ``max_memory_bytes``, ``keep_open``, ``max_rows``); ``timeout_s``: the deadline of each
    call, from the moment it is sent (a call that follows a restart includes the worker's
    start, about a second)."""

    def __init__(self, config: dict[str, Any], timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.config = config
        self.timeout_s = float(timeout_s)
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._buf = bytearray()
        self._next_id = 0

    @property
    def pid(self) -> int | None:
        """The worker's process id (None when none runs)."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def start(self) -> None:
        """Start the worker if none runs."""
        if self._proc is not None and self._proc.poll() is None:
            return
        self._buf.clear()
        # its own process group: a kill at the deadline ends what it started too (nsys export)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tracekit.agent.worker", json.dumps(self.config)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, close_fds=True, start_new_session=True,
        )

    def stop(self) -> None:
        """End the worker (closing its stdin, then a kill if it does not go within 2 s)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            _kill_group(proc)
            proc.wait()
        finally:
            if proc.stdout is not None:
                proc.stdout.close()

    def _kill(self) -> None:
        """End the worker at once (SIGKILL)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        _kill_group(proc)
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass

    def call(self, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        """Run ``tool`` with ``args`` in the worker: its answer (``ok``, ``result`` or
        ``error``, ``warnings``), or an error line when it outlives the deadline or the
        worker dies."""
        with self._lock:
            self.start()
            proc = self._proc
            assert proc is not None and proc.stdin is not None and proc.stdout is not None
            self._next_id += 1
            request = json.dumps({"id": self._next_id, "tool": tool, "args": args}) + "\n"
            try:
                proc.stdin.write(request.encode())
                proc.stdin.flush()
            except OSError:
                return self._died(tool)
            line = self._read_line(proc, time.monotonic() + self.timeout_s)
            if line is None:
                self._kill()
                return {"ok": False, "error": (
                    f"tracekit: error: {tool} took longer than {self.timeout_s:g} s, this server's limit per call "
                    "(--timeout); its worker was stopped and a fresh one takes the next call (traces are opened again): "
                    "ask for less (a window, fewer rows, a narrower query) or restart the server with a longer --timeout")}
            if not line:
                return self._died(tool)
            try:
                answer: dict[str, Any] = json.loads(line)
            except ValueError:
                self._kill()
                return {"ok": False, "error": f"tracekit: internal error: the worker's answer to {tool} was not JSON"}
            return answer

    def _read_line(self, proc: subprocess.Popen[bytes], deadline: float) -> bytes | None:
        """The next answer line (b"" when the worker closed its end); None past ``deadline``."""
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b""
            self._buf += chunk
            if len(self._buf) > MAX_ANSWER_BYTES + (1 << 20):  # the worker caps its answers; never hold more
                return b'{"ok": false, "error": "tracekit: error: the answer is larger than this server sends: ask for fewer rows or narrower columns"}'

        line, _, rest = bytes(self._buf).partition(b"\n")
        self._buf = bytearray(rest)
        return line

    def _died(self, tool: str) -> dict[str, Any]:
        proc, self._proc = self._proc, None
        code = proc.wait() if proc is not None else None
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            how = f"was killed by {name}"
        else:
            how = f"ended with exit code {code}"
        return {"ok": False, "error": (
            f"tracekit: error: the worker running {tool} {how} (SIGKILL: most likely the system ran out of memory; "
            "SIGABRT or SIGSEGV: an allocation failed in the table engine, or a damaged file crashed a native reader); "
            "a fresh worker takes the next call: ask for less, or restart the server with a larger --max-memory-gb")}


_PATH = "Path of an Nsight Systems export (.sqlite, .nsys-rep, an nsys parquetdir/arrowdir folder) or a folder of per-rank exports, under the server's roots (relative paths are taken under them)."
_OFFSET = "First row to return (paging)."
_LIMIT = "Rows to return (default: the server's --max-rows, 200); total_rows and next_offset say what is left."

INSTRUCTIONS = (
    "tracekit answers questions about GPU profiles: Nsight Systems exports (.sqlite, .nsys-rep, nsys parquetdir/arrowdir "
    "folders, folders of per-rank exports) and Nsight Compute reports (.ncu-rep, ncu raw CSV) under these folders: {roots}. "
    "Start with describe (what the capture holds, the run's structure) or summary, then diagnose (findings with time at "
    "stake and what to try). stats reproduces `nsys stats` reports; top_kernels and kernel look at kernels (kernel joins "
    "an ncu report); query runs one read-only SQL SELECT over tracekit's tables; diff compares two runs. Times are in ns "
    "unless a field name says otherwise (_ms, _us, _s); percentages end in _pct or (%)."
)


def build_server(worker: Worker, roots: Sequence[str]) -> Any:
    """The ``MCPServer`` whose tools send their calls to ``worker``."""
    from typing import Annotated

    import anyio
    from mcp.server.mcpserver import MCPServer
    from mcp.types import CallToolResult, TextContent, ToolAnnotations
    from pydantic import Field

    import tracekit

    app = MCPServer("tracekit", instructions=INSTRUCTIONS.format(roots=", ".join(roots)), version=tracekit.__version__,
                    log_level="WARNING")
    read_only = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)

    async def run(tool: str, **args: Any) -> CallToolResult:
        answer = await anyio.to_thread.run_sync(worker.call, tool, args, abandon_on_cancel=True)
        if not answer.get("ok"):
            return CallToolResult(content=[TextContent(type="text", text=str(answer.get("error")))], is_error=True)
        data = answer["result"]
        if answer.get("warnings"):
            data["warnings"] = answer["warnings"]
        text = str(data.get("summary") or tool)
        return CallToolResult(content=[TextContent(type="text", text=text), TextContent(type="text", text=json.dumps(data))],
                              structured_content=data)

    Path_ = Annotated[str, Field(description=_PATH)]
    Offset = Annotated[int, Field(description=_OFFSET, ge=0)]
    Limit = Annotated[int | None, Field(description=_LIMIT, ge=1)]
    NcuPath = Annotated[str | None, Field(description="Nsight Compute report (.ncu-rep or raw CSV) of the same program, under the roots.")]

    @app.tool(annotations=read_only)
    async def describe(path: Path_) -> CallToolResult:
        """What a capture holds: file size, nsys version and captured command, capture window (start_ns, end_ns,
        duration_ns), GPUs (sm_count, total_memory_bytes, memory_bandwidth_bytes_per_s …), tracekit's tables with
        their row counts, and the run's structure (kind: training/generation/serving/microbenchmark, steady
        iterations, step_ns, warm-up, startup_ns, segments, requests) with its one-line headline. For an ncu report:
        its kernel results and devices."""
        return await run("describe", path=path)

    @app.tool(annotations=read_only)
    async def summary(
        path: Path_,
        top: Annotated[int, Field(description="Rows in the top-kernel and NVTX tables.", ge=0)] = 10,
        findings: Annotated[int, Field(description="Top findings of diagnose to include (0: none, faster).", ge=0)] = 3,
        nvtx_each: Annotated[bool, Field(description="List numbered NVTX ranges one by one (default: step.* grouped).")] = False,
    ) -> CallToolResult:
        """What `tracekit summary` shows: info (run structure, capture, GPUs, kernel launches and GPU time …), tables
        (run structure, top kernels: calls/total_ms/mean_us/gpu_time_pct, CUDA graphs, memory operations:
        total_bytes/total_ms/bandwidth_gbps, top NVTX ranges, GPU metrics, generation phases: ttft_ms/tpot_median_ms,
        training step), notes, and the top findings (category, severity, time_ns, share, title, advice, next)."""
        return await run("summary", path=path, top=top, findings=findings, nvtx_each=nvtx_each)

    @app.tool(annotations=read_only)
    async def diagnose(
        path: Path_,
        ncu_path: NcuPath = None,
        window_start_ns: Annotated[int | None, Field(description="Analyse [window_start_ns, window_end_ns) on the trace's timeline instead of the steady state.")] = None,
        window_end_ns: Annotated[int | None, Field(description="End of the window (with window_start_ns).")] = None,
        settings: Annotated[list[str] | None, Field(description="Rule thresholds NAME=VALUE (docs/diagnose.md), as `tracekit diagnose --set`.")] = None,
        offset: Offset = 0,
        limit: Limit = None,
        evidence_rows: Annotated[int, Field(description="Evidence rows kept per finding (evidence_total_rows says how many it had).", ge=0)] = 20,
    ) -> CallToolResult:
        """What `tracekit diagnose -f json` prints: findings sorted by severity and time at stake (category, severity,
        time_ns, share, title, evidence rows, advice, next commands), the analysed window (start_ns, end_ns,
        duration_ns, steps, step_ns, method, reason), generation phases, training breakdown and the run's structure.
        Findings are paged (offset/limit)."""
        return await run("diagnose", path=path, ncu_path=ncu_path, window_start_ns=window_start_ns,
                         window_end_ns=window_end_ns, settings=list(settings or []), offset=offset, limit=limit,
                         evidence_rows=evidence_rows)

    @app.tool(annotations=read_only)
    async def stats(
        path: Path_,
        report: Annotated[str, Field(description="One nsys stats report: " + ", ".join(STATS_REPORTS) + " (cuda_gpu_kern_sum:base groups kernels by short name).")] = "cuda_gpu_kern_sum",
        convention: Annotated[str, Field(description="Rounding of nsys 2025.x (default) or 2023.x reports.")] = "2025",
        offset: Offset = 0,
        limit: Limit = None,
        csv: Annotated[bool, Field(description="Also return the page as CSV text, exactly as `tracekit stats -f csv` prints it.")] = False,
    ) -> CallToolResult:
        """An `nsys stats` report as `tracekit stats -r REPORT -f csv` computes it (no nsys needed): nsys's columns with
        their units (Total Time (ns), Time (%) …), each cell as nsys prints it (numbers as JSON numbers), rows paged."""
        return await run("stats", path=path, report=report, convention=convention, offset=offset, limit=limit, csv=csv)

    @app.tool(annotations=read_only)
    async def top_kernels(
        path: Path_,
        n: Annotated[int, Field(description="How many kernels.", ge=1)] = 10,
        by: Annotated[str, Field(description="name (demangled, as cuda_gpu_kern_sum) or short_name (cuda_gpu_kern_sum:base).")] = "name",
    ) -> CallToolResult:
        """The n kernels with most GPU time (cuda_gpu_kern_sum's rows): time_pct, total_ns, instances, mean_ns,
        median_ns, min_ns, max_ns, stddev_ns, name; plus distinct_kernels, launches and kernel_time_ns of the whole
        trace."""
        return await run("top_kernels", path=path, n=n, by=by)

    @app.tool(annotations=read_only)
    async def kernel(
        path: Path_,
        name: Annotated[str, Field(description="A kernel's demangled or short name (see top_kernels), or a case-insensitive part of names sharing one short name.")],
        ncu_path: NcuPath = None,
        limit: Limit = None,
    ) -> CallToolResult:
        """One kernel across nsys and ncu: durations (count, total_ns, mean_ns, median_ns, min_ns, max_ns, stddev_ns,
        gpu_time_pct), devices, launch configurations (grid_x/y/z, block_x/y/z, registers_per_thread,
        static/dynamic_shared_memory_bytes, launches, total_ns); with ncu_path, per profiled result its Tensor Core
        (tensor_pipe_pct, tensor_pct_of_peak, tensor_flops_per_s), DRAM (dram_bytes, bandwidth_gbps,
        bandwidth_pct_of_peak) and speed-of-light (compute/memory_throughput_pct, achieved_occupancy_pct, bound)
        figures, and their medians."""
        return await run("kernel", path=path, name=name, ncu_path=ncu_path, limit=limit)

    @app.tool(annotations=read_only)
    async def query(
        sql: Annotated[str, Field(description="One read-only SELECT (or WITH … SELECT), polars SQL, over the tables kernels, memcpys, memsets, syncs, graph_trace, cuda_api, nvtx, gpus, processes, threads, memory_usage, gpu_metrics, graphs, nccl (docs/tables.md; times in ns). An ncu report gives kernels, metrics, instances, rules, devices.")],
        path: Path_,
        offset: Offset = 0,
        limit: Limit = None,
    ) -> CallToolResult:
        """Run one read-only SQL query over tracekit's tables of a trace (never the raw SQLite file): columns, dtypes,
        rows (paged), total_rows. Anything but a single SELECT is refused."""
        return await run("query", sql=sql, path=path, offset=offset, limit=limit)

    @app.tool(annotations=read_only)
    async def diff(
        before: Annotated[str, Field(description="The run before the change: " + _PATH)],
        after: Annotated[str, Field(description="The run after the change (same kinds of path).")],
        threshold_pct: Annotated[float, Field(description="A row slower by at least this many % per step is a regression.", ge=0)] = 5.0,
        levels: Annotated[str, Field(description="Comma-separated levels: kernel, family, range, step.")] = "kernel,family,range,step",
        findings: Annotated[bool, Field(description="Diagnose both runs and say which findings appeared, went away, grew or shrank.")] = True,
        offset: Offset = 0,
        limit: Limit = None,
    ) -> CallToolResult:
        """What `tracekit diff -f json BEFORE AFTER` prints: the verdict (before_ns, after_ns, delta_ns, delta_pct,
        noise_ns per step), the verdict line, the findings that changed, per level (kernel, family, range, step) its
        rows (key, mean_a, mean_b, delta, delta_pct, noise, verdict; values in ns per step), paged, and the
        regressions."""
        return await run("diff", before=before, after=after, threshold_pct=threshold_pct, levels=levels,
                         findings=findings, offset=offset, limit=limit)

    return app


def serve(roots: Sequence[str], *, timeout_s: float = DEFAULT_TIMEOUT_S, max_memory_gb: float | None = None,
          keep_open: int = 2, max_rows: int = 200) -> None:
    """Serve MCP on stdin/stdout until the client closes it (``tracekit mcp``).

    Raises a one-line :class:`~tracekit.errors.TracekitError` for bad options and a
    :class:`~tracekit.errors.MissingDependencyError` when ``mcp`` is not installed."""
    from tracekit.agent.sandbox import Roots
    from tracekit.errors import TracekitError

    checked = Roots(roots)
    if not timeout_s > 0:
        raise TracekitError(f"--timeout {timeout_s}: give seconds above 0")
    if max_rows < 1:
        raise TracekitError(f"--max-rows {max_rows}: give 1 or more")
    memory_gb = default_memory_gb() if max_memory_gb is None else max_memory_gb
    if not memory_gb >= 0:
        raise TracekitError(f"--max-memory-gb {max_memory_gb}: give GB of address space (0: no bound)")
    names = [str(p) for p in checked.paths]
    config = {"roots": names, "max_memory_bytes": int(memory_gb * 1e9) or None, "keep_open": keep_open, "max_rows": max_rows}
    worker = Worker(config, timeout_s)
    worker.start()  # the worker imports polars and tracekit while this process imports mcp (0.5 s)
    try:
        try:
            import mcp.server.mcpserver  # noqa: F401
        except ImportError:
            worker._kill()
            from tracekit.errors import missing_extra

            raise missing_extra("mcp", "agent") from None
        build_server(worker, names).run("stdio")
    finally:
        worker.stop()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``tracekit-mcp`` (``tracekit mcp`` has the same)."""
    parser.add_argument("--root", action="append", default=[], metavar="DIR",
                        help="a folder whose traces the server may open (repeatable; at least one)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                        help=f"seconds one tool call may take (default {DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--max-memory-gb", type=float, default=None, metavar="GB",
                        help="address space of the worker process, GB (default: half the machine's memory; 0: no bound)")
    parser.add_argument("--keep-open", type=int, default=2, metavar="N", help="traces kept open between calls (default 2)")
    parser.add_argument("--max-rows", type=int, default=200, metavar="N", help="rows a paged answer holds by default (default 200)")


def main(argv: list[str] | None = None) -> int:
    """The ``tracekit-mcp`` console script: :func:`serve` with its options; a bad option or a
    missing ``mcp`` package is one ``tracekit: error:`` line on stderr, exit code 2."""
    from tracekit.errors import TracekitError

    parser = argparse.ArgumentParser(prog="tracekit-mcp", description="tracekit's answers as an MCP server (stdio).")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        serve(args.root, timeout_s=args.timeout, max_memory_gb=args.max_memory_gb, keep_open=args.keep_open,
              max_rows=args.max_rows)
    except TracekitError as exc:
        print(f"tracekit: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
