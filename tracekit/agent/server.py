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

__all__ = ["DEFAULT_TIMEOUT_S", "DIAGNOSE_SETTINGS", "STATS_REPORTS", "TABLE_COLUMNS", "Worker", "build_server",
           "default_memory_gb", "main", "serve"]

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
        self._busy = False

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

    def cancel(self) -> None:
        """End the worker if it runs a call (whose caller cancelled it): its thread then gets
        the worker's end at once, and the next call a fresh worker instead of waiting for the
        cancelled call to finish (issue 44: a call after a cancelled one waited 27 s)."""
        proc = self._proc
        if self._busy and proc is not None and proc.poll() is None:
            _kill_group(proc)

    def call(self, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        """Run ``tool`` with ``args`` in the worker: its answer (``ok``, ``result`` or
        ``error``, ``warnings``), or an error line when it outlives the deadline or the
        worker dies."""
        with self._lock:
            self._busy = True
            try:
                return self._call(tool, args)
            finally:
                self._busy = False

    def _call(self, tool: str, args: dict[str, Any]) -> dict[str, Any]:
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


#: Variants of a report (``REPORT:VARIANT``), as :data:`tracekit.stats.VARIANTS` (a test keeps them in step).
STATS_VARIANTS: dict[str, tuple[str, ...]] = {"cuda_gpu_kern_sum": ("demangled", "base", "mangled")}
#: Rounding conventions of the stats tool (:data:`tracekit.stats.common.CONVENTIONS`).
STATS_CONVENTIONS = ("2025", "2023")
#: ``NAME=VALUE`` thresholds the diagnose tool takes (fields of ``DiagnoseConfig``; a test keeps them in step).
DIAGNOSE_SETTINGS = ("iteration_pattern", "warmup_factor", "period_match", "min_repeats", "period_coverage", "exact_steps",
                     "sample_steps", "max_window_ops", "high_share", "medium_share", "low_share", "min_gap_ns",
                     "short_kernel_ns", "min_stretch_kernels", "tensor_active_min", "tensor_speedup", "growth_min_bytes",
                     "growth_monotonic", "oom_high_steps", "idle_share", "straggler_share", "imbalance_min",
                     "data_movement_share", "ncu_top_share", "efficiency_min")
#: Columns of the tables the query tool reads (tracekit.nsys.schema.TABLES and the derived ``graphs`` and ``nccl``;
#: listed here so that starting the server imports no polars; a test keeps them in step).
TABLE_COLUMNS: dict[str, tuple[str, ...]] = {
    "kernels": ("pid", "global_pid", "device_id", "context_id", "stream_id", "correlation_id", "start_ns", "end_ns", "duration_ns", "green_context_id", "name", "short_name", "mangled_name", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "registers_per_thread", "static_shared_memory_bytes", "dynamic_shared_memory_bytes", "local_memory_per_thread_bytes", "launch_type", "graph_node_id", "graph_id",),
    "memcpys": ("pid", "global_pid", "device_id", "context_id", "stream_id", "correlation_id", "start_ns", "end_ns", "duration_ns", "green_context_id", "bytes", "copy_kind", "copy_kind_label", "src_kind", "dst_kind", "src_device_id", "dst_device_id", "graph_node_id", "copy_count",),
    "memsets": ("pid", "global_pid", "device_id", "context_id", "stream_id", "correlation_id", "start_ns", "end_ns", "duration_ns", "green_context_id", "bytes", "value", "mem_kind", "graph_node_id",),
    "syncs": ("pid", "global_pid", "device_id", "context_id", "stream_id", "correlation_id", "start_ns", "end_ns", "duration_ns", "sync_type", "event_id",),
    "graph_trace": ("pid", "global_pid", "device_id", "context_id", "stream_id", "correlation_id", "start_ns", "end_ns", "duration_ns", "green_context_id", "graph_id", "graph_exec_id",),
    "cuda_api": ("pid", "tid", "global_tid", "start_ns", "end_ns", "duration_ns", "name", "api", "correlation_id", "return_value", "callchain_id",),
    "nvtx": ("pid", "tid", "global_tid", "event_type", "event_type_id", "start_ns", "end_ns", "duration_ns", "name", "domain_id", "domain", "category", "color", "range_id", "end_global_tid", "uint64_value", "int64_value", "double_value", "uint32_value", "int32_value", "float_value", "json_text", "binary_data",),
    "gpus": ("device_id", "name", "bus_location", "uuid", "chip_name", "compute_capability", "sm_count", "total_memory_bytes", "memory_bandwidth_bytes_per_s", "clock_rate_hz", "l2_cache_bytes",),
    "processes": ("pid", "global_pid", "name",),
    "threads": ("pid", "tid", "global_tid", "name",),
    "memory_usage": ("pid", "global_pid", "device_id", "context_id", "stream_id", "correlation_id", "start_ns", "address", "bytes", "mem_kind", "operation", "name",),
    "gpu_metrics": ("device_id", "timestamp_ns", "metric", "metric_label", "value",),
    "graphs": ("pid", "global_pid", "device_id", "stream_id", "correlation_id", "graph_id", "graph_exec_id", "start_ns", "end_ns", "duration_ns", "gpu_time_ns", "kernels", "memcpys", "memsets", "mode", "tid", "global_tid", "api_name", "api_start_ns", "api_end_ns", "launch_api_ns", "nvtx_path",),
    "nccl": ("rank", "rank_source", "pid", "tid", "global_tid", "call_index", "op", "api", "source", "group_id", "group_size", "comm_id", "comm_rank", "comm_nranks", "nranks_source", "peer", "root", "bytes", "size_source", "reduction", "reduction_source", "dtype", "algorithm", "protocol", "kernel_name", "naming_era", "host_start_ns", "host_end_ns", "host_duration_ns", "launch_ns", "gpu_start_ns", "gpu_end_ns", "gpu_duration_ns", "kernel_count", "device_id", "stream_id", "context_id", "correlation_id", "correlation_ids", "kernel_share",),
}
#: Tool calls that may wait for the worker; more are answered "busy" at once.
MAX_WAITING_CALLS = 200
#: Rows of a paged answer at most, and the largest offset (tracekit.agent.tools.MAX_LIMIT, MAX_OFFSET).
MAX_LIMIT, MAX_OFFSET = 5000, (1 << 53) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

_PATH = ("Path of an Nsight Systems export (.sqlite, .nsys-rep, an nsys parquetdir/arrowdir folder) or a folder of per-rank "
         "exports, under the server's roots; a relative path is taken under them (list_traces lists what is there).")
_OFFSET = "First row to return (paging)."
_LIMIT = f"Rows to return, 1 to {MAX_LIMIT} (default: the server's --max-rows, 200); total_rows and next_offset say what is left."

INSTRUCTIONS = (
    "tracekit answers questions about GPU profiles: Nsight Systems exports (.sqlite, .nsys-rep, nsys parquetdir/arrowdir "
    "folders, folders of per-rank exports) and Nsight Compute reports (.ncu-rep, ncu raw CSV) under these folders: {roots}. "
    "list_traces lists them. Start with describe (what the capture holds, the run's structure) or summary, then diagnose "
    "(findings with time at stake and what to try). stats reproduces `nsys stats` reports; top_kernels and kernel look at "
    "kernels (kernel joins an ncu report); query runs one read-only SQL SELECT over tracekit's tables; diff compares two "
    "runs. Times are in ns unless a field name says otherwise (_ms, _us, _s); percentages end in _pct or (%). A failed "
    "call answers one line starting `tracekit: error:` that says what to change."
)


def _tables_text() -> str:
    return "; ".join(f"{name}({', '.join(cols)})" for name, cols in TABLE_COLUMNS.items())


def validation_line(tool: str, exc: Any) -> str:
    """One line for the SDK's validation error of a tool's arguments: the first problem's
    argument, what is wrong and what was given (quoted, cut), and how many more there are."""
    errors = exc.errors()
    if not errors:
        return f"tracekit: error: {tool}: invalid arguments"
    first = errors[0]
    where = ".".join(str(p) for p in first.get("loc", ())) or "arguments"
    given = first.get("input")
    shown = json.dumps(given, default=str, ensure_ascii=True) if not isinstance(given, dict) else "{…}"
    shown = shown if len(shown) <= 60 else shown[:59] + "…"
    more = f" ({len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    text = " ".join(str(first.get("msg", "invalid")).split())
    if first.get("type") == "missing":
        return f"tracekit: error: {tool}: give {where} (it is required){more}"
    if first.get("type") in ("literal_error", "enum"):
        expected = str((first.get("ctx") or {}).get("expected", "")).replace("'", "")
        line = f"tracekit: error: {tool}: {where} {shown}: choose one of {expected}{more}"
        return line if len(line) <= 500 else line[:499] + "…"
    line = f"tracekit: error: {tool}: {where}: {text}, got {shown}{more}"
    return line if len(line) <= 500 else line[:499] + "…"


def build_server(worker: Worker, roots: Sequence[str]) -> Any:
    """The ``MCPServer`` whose tools send their calls to ``worker``."""
    import inspect
    from typing import Annotated, Literal

    import anyio
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
    from mcp.types import CallToolResult, TextContent, ToolAnnotations
    from pydantic import BaseModel, ConfigDict, Field, ValidationError

    import tracekit

    def failed(line: str) -> CallToolResult:
        return CallToolResult(content=[TextContent(type="text", text=line)], is_error=True)

    class Server(MCPServer):  # type: ignore[misc]
        async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
            try:
                return await super().call_tool(name, arguments, context)
            except ToolError as exc:
                if isinstance(exc.__cause__, ValidationError):  # the SDK's multi-line text: one line instead
                    return failed(validation_line(name, exc.__cause__))
                if isinstance(exc, UnexpectedToolError):
                    cause = exc.__cause__ or exc
                    return failed(f"tracekit: internal error: {name}: {type(cause).__name__}: {' '.join(str(cause).split())[:300]}")
                return failed(f"tracekit: error: {' '.join(str(exc).split())[:500]}")

    app = Server("tracekit", instructions=INSTRUCTIONS.format(roots=", ".join(roots)), version=tracekit.__version__,
                 log_level="WARNING")
    read_only = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)

    def tool(fn: Any) -> Any:  # the docstring, dedented, is the description
        return app.tool(annotations=read_only, description=inspect.cleandoc(fn.__doc__ or ""))(fn)

    waiting = [0]
    turn = anyio.Lock()
    threads = anyio.CapacityLimiter(4)

    async def run(tool_name: str, **args: Any) -> CallToolResult:
        """Send one call to the worker: calls take turns (an async lock: no thread is held while
        waiting, so input and pings are never held up); past MAX_WAITING_CALLS waiting, answer
        busy; a call cancelled while it runs ends the worker, which frees it for the next."""
        if waiting[0] >= MAX_WAITING_CALLS:
            return failed(f"tracekit: error: busy: {waiting[0]} calls wait for this server's worker; send {tool_name} again "
                          "when some have answered")
        waiting[0] += 1
        queued = True
        try:
            async with turn:
                waiting[0] -= 1
                queued = False
                try:
                    answer = await anyio.to_thread.run_sync(worker.call, tool_name, args, abandon_on_cancel=True,
                                                            limiter=threads)
                except anyio.get_cancelled_exc_class():
                    worker.cancel()
                    raise
        finally:
            if queued:
                waiting[0] -= 1
        if not answer.get("ok"):
            return failed(str(answer.get("error")))
        data = answer["result"]
        if answer.get("warnings"):
            data["warnings"] = answer["warnings"]
        text = str(data.get("summary") or tool_name)
        return CallToolResult(content=[TextContent(type="text", text=text), TextContent(type="text", text=json.dumps(data))],
                              structured_content=data)

    # -- output schemas: the fields every answer of a tool has (more may follow) -----------------
    class Answer(BaseModel):
        model_config = ConfigDict(extra="allow")
        summary: str = Field(description="One line: the answer in short.")
        warnings: list[str] | None = Field(None, description="Warnings tracekit raised during the call (damaged rows kept …).")

    class Paged(Answer):
        total_rows: int = Field(description="Rows in all.")
        offset: int
        limit: int
        returned_rows: int
        next_offset: int | None = Field(description="offset of the next page; null on the last page.")

    class ListOut(Paged):
        traces: list[dict[str, Any]] = Field(description="path (relative to root), root, kind, bytes per trace.")
        notes: list[str]

    class DescribeOut(Answer):
        path: str
        format: str = Field(description="nsys, nsys-ranks, ncu or side-by-side.")
        file_bytes: int | None = None
        capture: dict[str, Any] | None = None
        gpus: list[dict[str, Any]] | None = None
        tables: dict[str, int] | None = Field(None, description="Row count of each table.")
        structure: dict[str, Any] | None = None
        headline: str | None = None
        reports: list[dict[str, Any]] | None = None
        unrelated: str | None = None

    class SummaryOut(Answer):
        path: str
        info: dict[str, str]
        tables: dict[str, dict[str, Any]] = Field(description="title → columns, rows and paging fields.")
        notes: list[str]
        findings: list[dict[str, Any]]

    class DiagnoseOut(Paged):
        path: str
        trace: str
        window: dict[str, Any]
        findings: list[dict[str, Any]]
        window_text: str

    class StatsOut(Paged):
        path: str
        report: str
        convention: str
        columns: list[str]
        rows: list[dict[str, Any]]
        notes: list[str]
        csv: str | None = None

    class TopKernelsOut(Answer):
        kernels: list[dict[str, Any]]
        distinct_kernels: int
        launches: int
        kernel_time_ns: int

    class KernelOut(Answer):
        matched_by: str
        durations: dict[str, Any]

    class QueryOut(Paged):
        path: str
        tables: list[str]
        columns: list[str]
        dtypes: list[str]
        rows: list[dict[str, Any]]

    class DiffOut(Answer):
        verdict: dict[str, Any] | None
        levels: dict[str, list[dict[str, Any]]]
        level_rows: dict[str, int]
        regressions: list[dict[str, Any]]
        regression_count: int

    Path_ = Annotated[str, Field(description=_PATH)]
    Offset = Annotated[int, Field(description=_OFFSET, ge=0, le=MAX_OFFSET)]
    Limit = Annotated[int | None, Field(description=_LIMIT, ge=1, le=MAX_LIMIT)]
    NcuPath = Annotated[str | None, Field(description="Nsight Compute report (.ncu-rep or raw CSV) of the same program, under the roots.")]
    Report = Literal[tuple([*STATS_REPORTS, *(f"{b}:{v}" for b, vs in STATS_VARIANTS.items() for v in vs)])]  # type: ignore[valid-type]
    Convention = Literal[STATS_CONVENTIONS]  # type: ignore[valid-type]
    TimeNs = Annotated[int | None, Field(ge=INT64_MIN, le=INT64_MAX)]

    @tool
    async def list_traces(
        under: Annotated[str | None, Field(description="A folder under the roots to list (default: every root).")] = None,
        offset: Offset = 0,
        limit: Limit = None,
    ) -> Annotated[CallToolResult, ListOut]:
        """The traces under the server's roots: Nsight Systems exports (.sqlite), reports (.nsys-rep), nsys
        parquetdir/arrowdir folders, Nsight Compute reports (.ncu-rep) and folders holding several reports (per-rank
        runs), each with path (relative to its root: what the other tools take), root, kind and bytes."""
        return await run("list_traces", under=under, offset=offset, limit=limit)

    @tool
    async def describe(
        path: Path_,
        side_by_side: Annotated[bool, Field(description="For a folder of reports that are not one run: describe each report on its own (reports), never as ranks.")] = False,
    ) -> Annotated[CallToolResult, DescribeOut]:
        """What a capture holds: file size, nsys version and captured command, capture window (start_ns, end_ns,
        duration_ns), GPUs (sm_count, total_memory_bytes, memory_bandwidth_bytes_per_s …), tracekit's tables with
        their row counts, and the run's structure (kind: training/generation/serving/microbenchmark, steady
        iterations, step_ns, warm-up, startup_ns, segments, requests) with its one-line headline. For an ncu report:
        its kernel results and devices. A folder of per-rank reports must be one run (same job or command,
        overlapping capture times, distinct ranks); other folders are refused unless side_by_side is true."""
        return await run("describe", path=path, side_by_side=side_by_side)

    @tool
    async def summary(
        path: Path_,
        top: Annotated[int, Field(description="Rows in the top-kernel and NVTX tables.", ge=0, le=MAX_LIMIT)] = 10,
        findings: Annotated[int, Field(description="Top findings of diagnose to include (0: none, faster).", ge=0, le=100)] = 3,
        nvtx_each: Annotated[bool, Field(description="List numbered NVTX ranges one by one (default: step.* grouped).")] = False,
    ) -> Annotated[CallToolResult, SummaryOut]:
        """What `tracekit summary` shows: info (run structure, capture, GPUs, kernel launches and GPU time …), tables
        (run structure, top kernels: calls/total_ms/mean_us/gpu_time_pct, CUDA graphs, memory operations:
        total_bytes/total_ms/bandwidth_gbps, top NVTX ranges, GPU metrics, generation phases: ttft_ms/tpot_median_ms,
        training step), notes, and the top findings (category, severity, time_ns, share, title, advice, next)."""
        return await run("summary", path=path, top=top, findings=findings, nvtx_each=nvtx_each)

    @tool
    async def diagnose(
        path: Path_,
        ncu_path: NcuPath = None,
        window_start_ns: Annotated[TimeNs, Field(description="Analyse [window_start_ns, window_end_ns) on the trace's timeline instead of the steady state.")] = None,
        window_end_ns: Annotated[TimeNs, Field(description="End of the window (with window_start_ns).")] = None,
        settings: Annotated[list[str] | None, Field(description="Rule thresholds NAME=VALUE; names: " + ", ".join(DIAGNOSE_SETTINGS) + ".", max_length=len(DIAGNOSE_SETTINGS))] = None,
        offset: Offset = 0,
        limit: Limit = None,
        evidence_rows: Annotated[int, Field(description="Evidence rows kept per finding (evidence_total_rows says how many it had).", ge=0, le=MAX_LIMIT)] = 20,
    ) -> Annotated[CallToolResult, DiagnoseOut]:
        """What `tracekit diagnose -f json` prints: findings sorted by severity and time at stake (category, severity,
        time_ns, share, title, evidence rows, advice, next commands), the analysed window (start_ns, end_ns,
        duration_ns, steps, step_ns, method, reason), generation phases, training breakdown and the run's structure.
        Findings are paged (offset/limit)."""
        return await run("diagnose", path=path, ncu_path=ncu_path, window_start_ns=window_start_ns,
                         window_end_ns=window_end_ns, settings=list(settings or []), offset=offset, limit=limit,
                         evidence_rows=evidence_rows)

    @tool
    async def stats(
        path: Path_,
        report: Annotated[Report, Field(description="One nsys stats report (cuda_gpu_kern_sum:base groups kernels by short name, :mangled by mangled name).")] = "cuda_gpu_kern_sum",  # type: ignore[valid-type]
        convention: Annotated[Convention, Field(description="Rounding of nsys 2025.x (default) or 2023.x reports.")] = "2025",  # type: ignore[valid-type]
        offset: Offset = 0,
        limit: Limit = None,
        csv: Annotated[bool, Field(description="Also return the page as CSV text, exactly as `tracekit stats -f csv` prints it.")] = False,
    ) -> Annotated[CallToolResult, StatsOut]:
        """An `nsys stats` report as `tracekit stats -r REPORT -f csv` computes it (no nsys needed): nsys's columns with
        their units (Total Time (ns), Time (%) …), each cell as nsys prints it (numbers as JSON numbers), rows paged."""
        return await run("stats", path=path, report=report, convention=convention, offset=offset, limit=limit, csv=csv)

    @tool
    async def top_kernels(
        path: Path_,
        n: Annotated[int, Field(description="How many kernels.", ge=1, le=MAX_LIMIT)] = 10,
        by: Annotated[Literal["name", "short_name"], Field(description="name (demangled, as cuda_gpu_kern_sum) or short_name (cuda_gpu_kern_sum:base).")] = "name",
    ) -> Annotated[CallToolResult, TopKernelsOut]:
        """The n kernels with most GPU time (cuda_gpu_kern_sum's rows): time_pct, total_ns, instances, mean_ns,
        median_ns, min_ns, max_ns, stddev_ns, name; plus distinct_kernels, launches and kernel_time_ns of the whole
        trace."""
        return await run("top_kernels", path=path, n=n, by=by)

    @tool
    async def kernel(
        path: Path_,
        name: Annotated[str, Field(description="A kernel's demangled or short name (see top_kernels), or a case-insensitive part of names sharing one short name.", min_length=1, max_length=4096)],
        ncu_path: NcuPath = None,
        limit: Limit = None,
    ) -> Annotated[CallToolResult, KernelOut]:
        """One kernel across nsys and ncu: durations (count, total_ns, mean_ns, median_ns, min_ns, max_ns, stddev_ns,
        gpu_time_pct), devices, launch configurations (grid_x/y/z, block_x/y/z, registers_per_thread,
        static/dynamic_shared_memory_bytes, launches, total_ns); with ncu_path, per profiled result its Tensor Core
        (tensor_pipe_pct, tensor_pct_of_peak, tensor_flops_per_s), DRAM (dram_bytes, bandwidth_gbps,
        bandwidth_pct_of_peak) and speed-of-light (compute/memory_throughput_pct, achieved_occupancy_pct, bound)
        figures, and their medians."""
        return await run("kernel", path=path, name=name, ncu_path=ncu_path, limit=limit)

    @tool
    async def query(
        sql: Annotated[str, Field(description="One read-only SELECT (or WITH … SELECT), polars SQL, over these tables (times in ns): " + _tables_text() + ". An ncu report gives kernels, metrics, instances, rules, devices.", min_length=1, max_length=100_000)],
        path: Path_,
        offset: Offset = 0,
        limit: Limit = None,
    ) -> Annotated[CallToolResult, QueryOut]:
        """Run one read-only SQL query over tracekit's tables of a trace (never the raw SQLite file): columns, dtypes,
        rows (paged), total_rows. Anything but a single SELECT is refused. The tables and their columns are listed
        with the sql argument."""
        return await run("query", sql=sql, path=path, offset=offset, limit=limit)

    @tool
    async def diff(
        before: Annotated[str, Field(description="The run before the change: " + _PATH)],
        after: Annotated[str, Field(description="The run after the change (same kinds of path).")],
        threshold_pct: Annotated[float, Field(description="A row slower by at least this many % per step is a regression.", ge=0, le=1e6)] = 5.0,
        levels: Annotated[str, Field(description="Comma-separated levels to compare: kernel, family, range, step.", pattern=r"^\s*(kernel|family|range|step)\s*(,\s*(kernel|family|range|step)\s*)*$")] = "kernel,family,range,step",
        findings: Annotated[bool, Field(description="Diagnose both runs and say which findings appeared, went away, grew or shrank.")] = True,
        offset: Offset = 0,
        limit: Limit = None,
    ) -> Annotated[CallToolResult, DiffOut]:
        """What `tracekit diff -f json BEFORE AFTER` prints: the verdict (before_ns, after_ns, delta_ns, delta_pct,
        noise_ns per step), the verdict line, the findings that changed, per level (kernel, family, range, step) its
        rows (key, mean_a, mean_b, delta, delta_pct, noise, verdict; values in ns per step), paged, and the
        regressions; before and after name the paths given."""
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
        app = build_server(worker, names)
        import anyio

        from tracekit.agent.transport import guarded_stdio

        async def serve_stdio() -> None:
            async with guarded_stdio() as (read_stream, write_stream):
                low = app._lowlevel_server
                await low.run(read_stream, write_stream, low.create_initialization_options())

        anyio.run(serve_stdio)
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
