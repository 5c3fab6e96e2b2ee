"""`tracekit mcp`: the MCP server driven by the SDK's own client over stdio, on bundled captures.

One server per module (a thread runs the client's event loop); every tool is called, and its
numbers are compared with what the CLI prints (`tracekit stats -f csv`, `tracekit diagnose -f
json`, `tracekit diff -f json`) or with the library functions the CLI calls. Refusals (a path
outside the roots, a write query) and damaged exports are one `tracekit: error:` line, after
which the server still answers.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from .conftest import SAMPLES

TP2 = SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"
DECODE = SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
HOST_BOUND = SAMPLES / "planted" / "planted_host_bound" / "planted_host_bound.sqlite"
CLEAN = SAMPLES / "planted" / "planted_clean" / "planted_clean.sqlite"
NCU = SAMPLES / "ncu" / "ncu_decode_drilldown" / "ncu_decode_drilldown.ncu-rep"
TOOLS = {"list_traces", "describe", "summary", "diagnose", "stats", "top_kernels", "kernel", "query", "diff"}


class Client:
    """An MCP client session on a server subprocess, usable from synchronous tests: an event
    loop runs in a thread, ``call`` submits to it and waits."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self._loop = asyncio.new_event_loop()
        self._ready: Future[Any] = Future()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._serve, args=(args, env), daemon=True)
        self._thread.start()
        self.init = self._ready.result(timeout=120)

    def _serve(self, args: list[str], env: dict[str, str]) -> None:
        try:
            self._loop.run_until_complete(self._main(args, env))
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        finally:
            self._loop.close()

    async def _main(self, args: list[str], env: dict[str, str]) -> None:
        from mcp import ClientSession, StdioServerParameters, stdio_client

        self._stop = asyncio.Event()
        params = StdioServerParameters(command=sys.executable, args=args, env=env, cwd=str(SAMPLES.parent))
        try:
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                self.session = session
                self._ready.set_result(await session.initialize())
                await self._stop.wait()
        except BaseException as exc:  # noqa: BLE001 - handed to the test that waits
            if not self._ready.done():
                self._ready.set_exception(exc)
            else:
                raise

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=600)

    def call(self, tool: str, **args: Any) -> Any:
        return self.run(self.session.call_tool(tool, args))

    def ok(self, tool: str, **args: Any) -> dict[str, Any]:
        res = self.call(tool, **args)
        assert not res.is_error, res.content[0].text
        data = res.structured_content
        assert isinstance(data, dict)
        assert res.content[0].text == data["summary"] and "\n" not in data["summary"]
        assert json.loads(res.content[1].text) == data  # the same JSON as text, for text-only clients
        return data

    def error(self, tool: str, **args: Any) -> str:
        res = self.call(tool, **args)
        assert res.is_error, res.structured_content
        assert len(res.content) == 1
        text = res.content[0].text
        assert "\n" not in text and text.startswith("tracekit: error:"), text
        return str(text)

    def close(self) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=30)


def _env(cache: Path) -> dict[str, str]:
    return {**os.environ, "TRACEKIT_CACHE": str(cache), "COLUMNS": "250"}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second root holding damaged copies, a report without its export and a link out."""
    d = tmp_path_factory.mktemp("mcp_root")
    trunc, mid = d / "truncated.sqlite", d / "overwritten.sqlite"
    shutil.copy(DECODE, trunc)
    shutil.copy(DECODE, mid)
    size = trunc.stat().st_size
    os.truncate(trunc, size // 2)
    with mid.open("r+b") as fh:
        fh.seek(size // 2)
        fh.write(b"\xff" * 65536)
    shutil.copy(SAMPLES / "planted" / "planted_clean" / "planted_clean.nsys-rep", d / "lonely.nsys-rep")
    (d / "link_out.sqlite").symlink_to(TP2)  # leads to the other root: followed
    (d / "link_etc").symlink_to("/etc")  # leads out of every root: refused
    # links out of every root hidden inside what is opened: a columnar export's table files,
    # and the export beside a report (newer than it, so it would be read)
    outside = tmp_path_factory.mktemp("outside_every_root")
    (outside / "StringIds.parquet").write_bytes(b"PAR1")
    (outside / "export.sqlite").write_bytes(DECODE.read_bytes())
    (d / "escape.parquetdir").mkdir()
    (d / "escape.parquetdir" / "StringIds.parquet").symlink_to(outside / "StringIds.parquet")
    shutil.copy(SAMPLES / "planted" / "planted_clean" / "planted_clean.nsys-rep", d / "escape.nsys-rep")
    os.utime(d / "escape.nsys-rep", (1_000_000_000, 1_000_000_000))
    (d / "escape.sqlite").symlink_to(outside / "export.sqlite")
    return d


@pytest.fixture(scope="module")
def client(root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    pytest.importorskip("mcp", reason="the agent extra (pip install 'tracekit[agent]') is not installed")
    cache = tmp_path_factory.mktemp("mcp_cache")
    c = Client(["-m", "tracekit.agent.server", "--root", str(SAMPLES), "--root", str(root)], _env(cache))
    yield c
    c.close()


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracekit.cli.main", *args], capture_output=True, text=True,
                          check=False, env=env, cwd=SAMPLES.parent)


def _number(text: str) -> Any:
    if text == "":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def test_tools_are_listed_read_only(client: Client) -> None:
    from tracekit.agent.server import STATS_REPORTS
    from tracekit.stats import REPORTS

    tools = client.run(client.session.list_tools()).tools
    assert {t.name for t in tools} == TOOLS
    assert all(t.annotations.read_only_hint and not t.annotations.destructive_hint for t in tools)
    assert set(STATS_REPORTS) == set(REPORTS)  # the stats tool's description lists every report
    assert client.init.server_info.name == "tracekit" and str(SAMPLES) in client.init.instructions


def test_schemas_say_what_the_tools_take(client: Client) -> None:
    """Issue 44: enums for report/convention/by, maxima for limit/n/offset, output schemas,
    table columns in the query tool's schema, descriptions without docstring indentation or
    pointers to docs the agent cannot read; the server's static lists equal the library's."""
    import dataclasses

    from tracekit.agent.server import (
        DIAGNOSE_SETTINGS,
        STATS_CONVENTIONS,
        STATS_VARIANTS,
        TABLE_COLUMNS,
    )
    from tracekit.agent.tools import MAX_LIMIT, MAX_OFFSET
    from tracekit.diagnosis import DiagnoseConfig
    from tracekit.nsys.schema import TABLES
    from tracekit.stats import REPORTS, VARIANTS
    from tracekit.stats.common import CONVENTIONS

    assert STATS_VARIANTS == VARIANTS and STATS_CONVENTIONS == CONVENTIONS
    assert tuple(f.name for f in dataclasses.fields(DiagnoseConfig)) == DIAGNOSE_SETTINGS
    assert {n: list(c) for n, c in TABLE_COLUMNS.items() if n in TABLES} == {n: list(s) for n, s in TABLES.items()}
    import tracekit

    tp2 = tracekit.open(TP2)
    assert list(TABLE_COLUMNS["nccl"]) == tp2.table("nccl").columns and list(TABLE_COLUMNS["graphs"]) == tp2.table("graphs").columns
    tools = {t.name: t for t in client.run(client.session.list_tools()).tools}
    for t in tools.values():
        assert t.output_schema is not None and "summary" in t.output_schema["properties"], t.name
        assert "\n    " not in t.description and "docs/" not in t.description, t.name
        props = t.input_schema["properties"]
        for name in ("limit", "offset"):
            if name in props:
                spec = props[name]["anyOf"][0] if "anyOf" in props[name] else props[name]
                assert spec["maximum"] == {"limit": MAX_LIMIT, "offset": MAX_OFFSET}[name], (t.name, name)
    stats = tools["stats"].input_schema["properties"]
    assert set(stats["report"]["enum"]) == set(REPORTS) | {f"{b}:{v}" for b, vs in VARIANTS.items() for v in vs}
    assert stats["convention"]["enum"] == list(CONVENTIONS)
    assert tools["top_kernels"].input_schema["properties"]["by"]["enum"] == ["name", "short_name"]
    assert tools["top_kernels"].input_schema["properties"]["n"]["maximum"] == MAX_LIMIT
    sql = tools["query"].input_schema["properties"]["sql"]["description"]
    for name, columns in TABLE_COLUMNS.items():
        assert f"{name}({', '.join(columns)})" in sql
    assert "list_traces" in tools["describe"].input_schema["properties"]["path"]["description"]


def test_describe_counts_and_structure(client: Client) -> None:
    import tracekit
    from tracekit.agent.tools import jsonable

    data = client.ok("describe", path=str(TP2))
    trace = tracekit.open(TP2)
    assert data["tables"]["kernels"] == trace.kernels.height == 1076
    assert data["tables"]["cuda_api"] == trace.cuda_api.height
    assert data["tables"]["nvtx"] == trace.nvtx.height
    assert data["gpus"] == jsonable(trace.gpus.to_dicts())
    st = tracekit.structure(trace)
    assert data["structure"] == jsonable(st.as_dict()) and data["headline"] == st.headline()
    assert data["capture"]["duration_ns"] == trace.meta.duration_ns
    # a relative path is taken under the roots; the report beside its fresh export reads that export
    again = client.ok("describe", path="llm_tp2_nccl/llm_tp2_nccl.nsys-rep")
    assert again["tables"] == data["tables"]


def test_summary_equals_the_cli(client: Client) -> None:
    import tracekit
    from tracekit.nsys.summary import top_kernels

    data = client.ok("summary", path=str(TP2))
    proc = _cli("summary", str(TP2), env={**os.environ, "COLUMNS": "400"})
    assert proc.returncode == 0, proc.stderr
    for key in ("kernels", "CUDA API calls", "NVTX events", "time window", "run"):
        assert data["info"][key] in proc.stdout, key
    trace = tracekit.open(TP2)
    expected = top_kernels(trace.kernels, 10).to_dicts()
    assert data["tables"]["top kernels"]["rows"] == expected
    assert data["findings"] and data["findings"][0]["title"].split(" (")[0] in " ".join(proc.stdout.split())


def test_diagnose_equals_cli_json(client: Client) -> None:
    data = client.ok("diagnose", path=str(HOST_BOUND), limit=5000, evidence_rows=5000)
    proc = _cli("diagnose", "-f", "json", str(HOST_BOUND))
    assert proc.returncode == 0, proc.stderr
    cli = json.loads(proc.stdout)
    for f in data["findings"]:
        assert f.pop("evidence_total_rows") == len(f["evidence"])
    for key in ("findings", "window", "structure", "phases", "training", "trace"):
        assert data[key] == cli[key], key
    assert data["total_rows"] == len(cli["findings"]) and data["findings"][0]["category"] == "host_bound"
    # paged: one finding, evidence cut
    one = client.ok("diagnose", path=str(HOST_BOUND), offset=1, limit=1, evidence_rows=1)
    assert [f["title"] for f in one["findings"]] == [cli["findings"][1]["title"]]
    assert len(one["findings"][0]["evidence"]) <= 1 and one["total_rows"] == len(cli["findings"])
    # with an ncu report, and a bad setting: the CLI's line
    assert client.ok("diagnose", path=str(DECODE), ncu_path=str(NCU))["total_rows"] >= 1
    bad = client.error("diagnose", path=str(HOST_BOUND), settings=["no_such_rule=1"])
    line = _cli("diagnose", "--set", "no_such_rule=1", str(HOST_BOUND)).stderr.strip()
    assert bad == line


@pytest.mark.parametrize("report", ["cuda_gpu_kern_sum", "cuda_api_sum", "nvtx_sum", "cuda_gpu_mem_time_sum",
                                    "cuda_kern_exec_sum", "nvtx_gpu_proj_sum", "cuda_gpu_kern_sum:base"])
def test_stats_equals_cli_csv(client: Client, report: str) -> None:
    import tracekit
    from tracekit.stats import run_report

    data = client.ok("stats", path=str(TP2), report=report, limit=5000, csv=True)
    proc = _cli("stats", "-r", report, "-f", "csv", str(TP2))
    assert proc.returncode == 0, proc.stderr
    assert data["csv"] == proc.stdout  # byte for byte
    cli_rows = list(csv.reader(io.StringIO(proc.stdout)))
    assert data["columns"] == cli_rows[0]
    assert [[r[c] for c in data["columns"]] for r in data["rows"]] == [[_number(x) for x in row] for row in cli_rows[1:]]
    lib = run_report(tracekit.open(TP2), report)
    assert [[r[c] for c in data["columns"]] for r in data["rows"]] == [[_number(x) for x in row] for row in lib.formatted_rows()]
    assert data["total_rows"] == lib.frame.height and data["next_offset"] is None


def test_stats_pages_a_long_report(client: Client) -> None:
    import tracekit
    from tracekit.stats import run_report

    lib = run_report(tracekit.open(TP2), "cuda_gpu_trace").formatted_rows()
    page = client.ok("stats", path=str(TP2), report="cuda_gpu_trace", offset=100, limit=7)
    assert page["total_rows"] == len(lib) and page["returned_rows"] == 7 and page["next_offset"] == 107
    assert [[r[c] for c in page["columns"]] for r in page["rows"]] == [[_number(x) for x in row] for row in lib[100:107]]
    default = client.ok("stats", path=str(TP2), report="cuda_gpu_trace")
    assert default["returned_rows"] == 200 and default["total_rows"] == len(lib)
    # a bad report name: one line with the choices (the schema's enum, checked before the call)
    line = client.error("stats", path=str(TP2), report="nope")
    assert line.startswith('tracekit: error: stats: report "nope": choose one of cuda_gpu_kern_sum, cuda_gpu_mem_time_sum')
    assert "cuda_kern_exec_trace" in line


def test_top_kernels_equal_kern_sum(client: Client) -> None:
    for by, report in (("name", "cuda_gpu_kern_sum"), ("short_name", "cuda_gpu_kern_sum:base")):
        data = client.ok("top_kernels", path=str(TP2), n=5, by=by)
        rows = list(csv.reader(io.StringIO(_cli("stats", "-r", report, "-f", "csv", str(TP2)).stdout)))
        fields = ["time_pct", "total_ns", "instances", "mean_ns", "median_ns", "min_ns", "max_ns", "stddev_ns", "name"]
        assert rows[0] == ["Time (%)", "Total Time (ns)", "Instances", "Avg (ns)", "Med (ns)", "Min (ns)", "Max (ns)",
                           "StdDev (ns)", "Name"]
        assert [[k[f] for f in fields] for k in data["kernels"]] == [[_number(x) for x in r] for r in rows[1:6]]
        assert data["distinct_kernels"] == len(rows) - 1
        assert data["launches"] == sum(int(r[2]) for r in rows[1:]) == 1076


def test_kernel_across_nsys_and_ncu(client: Client) -> None:
    import polars as pl

    import tracekit
    from tracekit.analysis import ncu_views
    from tracekit.stats import run_report

    name = "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT"
    data = client.ok("kernel", path=str(DECODE), name=name, ncu_path=str(NCU))
    row = run_report(tracekit.open(DECODE), "cuda_gpu_kern_sum:base").frame.filter(pl.col("Name") == name).row(0, named=True)
    d = data["durations"]
    assert (d["count"], d["total_ns"], d["min_ns"], d["max_ns"]) == (row["Instances"], row["Total Time (ns)"], row["Min (ns)"], row["Max (ns)"])
    assert d["median_ns"] == pytest.approx(row["Med (ns)"]) and d["mean_ns"] == pytest.approx(row["Avg (ns)"])
    assert sum(c["launches"] for c in data["launch_configs"]) == d["count"]
    assert all(c["grid_x"] and c["block_x"] and c["registers_per_thread"] for c in data["launch_configs"])
    report = tracekit.open(NCU)
    ids = report.kernels.filter(pl.col("short_name") == name)["id"].to_list()
    got = data["ncu"]["results"]
    assert [r["id"] for r in got] == sorted(ids) and data["ncu"]["profiled"] == len(ids)
    tc = ncu_views.tensor_core_utilization(report).filter(pl.col("id").is_in(ids)).sort("id")
    dram = ncu_views.dram_bandwidth(report).filter(pl.col("id").is_in(ids)).sort("id")
    assert [r["tensor_pipe_pct"] for r in got] == tc["tensor_pipe_pct"].to_list()
    assert [r["bandwidth_pct_of_peak"] for r in got] == dram["bandwidth_pct_of_peak"].to_list()
    # a part of several kernels' names is refused with the candidates; a part of one is taken
    assert "give one of them" in client.error("kernel", path=str(DECODE), name="nvjet")
    assert client.ok("kernel", path=str(DECODE), name="4x1_v_bz_tnt")["durations"]["count"] == d["count"]


def test_query_reads_tracekits_tables(client: Client) -> None:
    import polars as pl

    import tracekit

    sql = "SELECT short_name, count(*) AS launches, sum(duration_ns) AS total_ns FROM kernels GROUP BY short_name ORDER BY total_ns DESC, short_name"
    data = client.ok("query", sql=sql, path=str(TP2), limit=3, offset=2)
    expected = (tracekit.open(TP2).kernels.group_by("short_name")
                .agg(pl.len().alias("launches"), pl.col("duration_ns").sum().alias("total_ns"))
                .sort(["total_ns", "short_name"], descending=[True, False]))
    assert data["total_rows"] == expected.height and data["columns"] == ["short_name", "launches", "total_ns"]
    assert data["rows"] == expected.slice(2, 3).to_dicts() and data["next_offset"] == 5
    joined = client.ok("query", path=str(TP2), sql="WITH k AS (SELECT correlation_id, pid FROM kernels) "
                       "SELECT count(*) AS n FROM k JOIN cuda_api USING (correlation_id, pid)")
    assert joined["rows"] == [{"n": 1076}]
    ncu = client.ok("query", path=str(NCU), sql="SELECT count(*) AS n FROM kernels")
    assert ncu["rows"] == [{"n": tracekit.open(NCU).kernels.height}]


@pytest.mark.parametrize("sql", [
    "COPY (SELECT * FROM kernels) TO '/tmp/x.csv'",
    "CREATE TABLE x AS SELECT * FROM kernels",
    "INSERT INTO kernels VALUES (1)",
    "DROP TABLE kernels",
    "ATTACH DATABASE '/tmp/x.sqlite' AS x",
    "PRAGMA table_info(kernels)",
    "SELECT * INTO copy FROM kernels",
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM \"read_csv\"('/etc/passwd')",  # a quoted table function is still called
    "SELECT * FROM `scan_parquet`('/tmp/x.parquet')",
    # the checker's reading of strings and comments is not polars': read_* refused in any of them
    "SELECT $$/*$$ AS a, * FROM read_csv('/etc/passwd', has_header => false) -- */ kernels",
    "SELECT 1 AS a /* /* */ -- */, * FROM read_csv('/etc/hostname', has_header => false)\n, kernels",
    "SELECT $t$x$t$ AS a FROM kernels",
    "SELECT 1 AS a /* /* nested */ */ FROM kernels",
    "SELECT 1 FROM kernels; DROP TABLE kernels",
    "DELETE FROM kernels",
])
def test_query_refuses_anything_but_one_select(client: Client, sql: str) -> None:
    assert client.error("query", sql=sql, path=str(TP2)).startswith("tracekit: error: query:")


def test_an_answer_too_large_is_one_line(client: Client) -> None:
    """Rows are as wide as a query makes them, so the row limit bounds no answer's size: one
    over the worker's cap (32 MiB of JSON) is answered with one line, and the server goes on."""
    text = client.error("query", sql="SELECT LPAD(name, 200000, 'x') AS s FROM kernels", path=str(TP2), limit=300)
    assert "more than the 32 MiB this server sends" in text
    assert client.ok("top_kernels", path=str(TP2), n=1)["kernels"][0]["instances"] == 128


def test_diff_equals_cli_json(client: Client) -> None:
    data = client.ok("diff", before=str(HOST_BOUND), after=str(CLEAN), limit=5000)
    proc = _cli("diff", "-f", "json", str(HOST_BOUND), str(CLEAN))
    assert proc.returncode in (0, 1), proc.stderr
    cli = json.loads(proc.stdout)
    for key in ("verdict", "verdict_line", "findings", "levels", "regressions", "steps", "runs", "before", "after"):
        assert data[key] == cli[key], key
    assert data["summary"] == cli["verdict_line"]
    paged = client.ok("diff", before=str(HOST_BOUND), after=str(CLEAN), levels="kernel", limit=1, findings=False)
    assert paged["levels"]["kernel"] == cli["levels"]["kernel"][:1] and paged["level_rows"]["kernel"] == len(cli["levels"]["kernel"])


def test_paths_outside_the_roots_are_refused(client: Client, root: Path) -> None:
    for path in ("/etc/passwd", str(SAMPLES.parent / "README.md"), "../README.md", str(root / "link_etc" / "passwd")):
        text = client.error("describe", path=path)
        assert "is outside the folders this server may read" in text, text
    assert "is outside" in client.error("diff", before="/etc/hosts", after=str(TP2))
    assert "is outside" in client.error("kernel", path=str(DECODE), name="x", ncu_path="/etc/hosts")
    # a link inside a root to a file under a root is followed
    assert client.ok("describe", path=str(root / "link_out.sqlite"))["tables"]["kernels"] == 1076
    # links out hidden inside an export folder, or as the export beside a report: refused
    for path in (root / "escape.parquetdir", root / "escape.nsys-rep"):
        assert "links outside the folders this server may read" in client.error("query", sql="SELECT count(*) FROM kernels",
                                                                                  path=str(path))
    assert "NUL" in client.error("describe", path="a\x00b")
    assert "must be after" in client.error("diagnose", path=str(TP2), window_start_ns=10, window_end_ns=5)


def test_bad_input_is_the_clis_line_and_the_server_goes_on(client: Client, root: Path) -> None:
    before = sorted(p.name for p in root.iterdir())
    for name, tool in (("truncated.sqlite", "summary"), ("overwritten.sqlite", "diagnose"), ("missing.sqlite", "describe")):
        path = root / name
        got = client.error(tool, path=str(path))
        cli = _cli(tool if tool != "describe" else "summary", str(path))
        assert cli.returncode == 2 and got == cli.stderr.strip(), (got, cli.stderr)
        assert client.ok("top_kernels", path=str(TP2), n=1)["kernels"][0]["instances"] == 128  # still serving
    # a report with no export beside it: exported into the cache (with an nsys) or refused, never beside it
    res = client.call("describe", path=str(root / "lonely.nsys-rep"))
    assert res.is_error == (shutil.which("nsys") is None and not os.environ.get("NSYS"))
    assert sorted(p.name for p in root.iterdir()) == before  # nothing written in the root
    assert not list(SAMPLES.rglob("*.sqlite-shm")) and not list(SAMPLES.rglob("*.tracekit.json"))


def test_a_call_past_the_deadline_is_one_line(tmp_path: Path) -> None:
    """`tracekit mcp` (the CLI command) with a deadline no call can meet: the call answers one
    line, the worker is replaced, the server keeps answering."""
    pytest.importorskip("mcp", reason="the agent extra (pip install 'tracekit[agent]') is not installed")
    c = Client(["-m", "tracekit.cli.main", "mcp", "--root", str(SAMPLES), "--timeout", "0.001"], _env(tmp_path))
    try:
        text = c.error("diagnose", path=str(HOST_BOUND))
        assert "took longer than 0.001 s" in text
        assert {t.name for t in c.run(c.session.list_tools()).tools} == TOOLS
        assert "took longer than" in c.error("describe", path=str(TP2))
    finally:
        c.close()


def test_without_mcp_one_line_names_the_extra() -> None:
    code = ("import sys; sys.modules['mcp'] = None\n"
            "from tracekit.cli.main import main\n"
            f"sys.exit(main(['mcp', '--root', {str(SAMPLES)!r}]))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == ["tracekit: error: mcp is not installed; install it with: pip install 'tracekit[agent]'"]
    # the console script's own entry says the same
    code = code.replace("from tracekit.cli.main import main", "from tracekit.agent.server import main").replace("['mcp', ", "[")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "pip install 'tracekit[agent]'" in proc.stderr and len(proc.stderr.splitlines()) == 1
