"""`tracekit mcp` on the wire (issue 44, §3): raw JSON-RPC bytes written to the server's stdin
by a subprocess pipe, as a hostile or broken client would send them, and the same edges through
the official SDK's client. Every request with an id gets an answer (a result or a JSON-RPC
error); input is read while tools run; a cancelled call frees the worker; bad input is one
capped `tracekit: error:` line, never an internal error."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SAMPLES, mutated_copy, run_capture
from tests.test_mcp import Client, _env

pytest.importorskip("mcp", reason="the agent extra (pip install 'tracekit[agent]') is not installed")

DECODE = SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
TP2 = SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"
REL = "llm_decode_1gpu/llm_decode_1gpu.sqlite"


class Raw:
    """The server as a subprocess driven with raw bytes: answers are collected by id (in the
    order they arrive) by a reader thread."""

    def __init__(self, roots: list[Path], cache: Path) -> None:
        args = [sys.executable, "-m", "tracekit.agent.server"]
        for r in roots:
            args += ["--root", str(r)]
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=_env(cache), cwd=SAMPLES.parent)
        self.answers: list[dict[str, Any]] = []
        self.lock = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.send({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
        assert "result" in self.wait("init")
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.lock:
                self.answers.append(json.loads(line))
                self.lock.notify_all()

    def send(self, message: Any) -> None:
        data = message if isinstance(message, bytes) else json.dumps(message).encode()
        assert self.proc.stdin is not None
        self.proc.stdin.write(data + b"\n")
        self.proc.stdin.flush()

    def call(self, rid: Any, tool: str, **args: Any) -> None:
        self.send({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {"name": tool, "arguments": args}})

    def wait(self, rid: Any, timeout: float = 300) -> dict[str, Any]:
        end = time.monotonic() + timeout
        with self.lock:
            while True:
                got = next((a for a in self.answers if a.get("id") == rid), None)
                if got is not None:
                    return got
                left = end - time.monotonic()
                assert left > 0, f"no answer to {rid!r}"
                self.lock.wait(left)

    def position(self, rid: Any) -> int:
        return next(i for i, a in enumerate(self.answers) if a.get("id") == rid)

    def worker_pids(self) -> set[int]:
        """The server's child processes (its worker)."""
        pid = self.proc.pid
        try:
            text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
        except OSError:
            return set()
        return {int(p) for p in text.split()}

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self._reader.join(timeout=30)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


def _text(answer: dict[str, Any]) -> str:
    result = answer["result"]
    assert result.get("isError"), answer
    text = result["content"][0]["text"]
    assert "\n" not in text and text.startswith("tracekit: error: "), text
    return str(text)


@pytest.fixture(scope="module")
def bad_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("wire_root")
    (d / "loop_a").symlink_to(d / "loop_b")
    (d / "loop_b").symlink_to(d / "loop_a")
    mutated_copy(DECODE, d / "no_strings.sqlite", "DROP TABLE StringIds")
    # a report whose export beside it is fresh by its stamp, the stamp a link out of every root
    outside = tmp_path_factory.mktemp("outside_roots")
    shutil.copy(SAMPLES / "planted" / "planted_clean" / "planted_clean.nsys-rep", d / "stamped.nsys-rep")
    shutil.copy(SAMPLES / "planted" / "planted_clean" / "planted_clean.sqlite", d / "stamped.sqlite")
    (outside / "secret.json").write_text('{"size": 1}')
    (d / "stamped.sqlite.tracekit.json").symlink_to(outside / "secret.json")
    return d


@pytest.fixture(scope="module")
def raw(bad_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Raw]:
    r = Raw([SAMPLES, bad_root], tmp_path_factory.mktemp("wire_cache"))
    yield r
    r.close()


def test_every_request_with_an_id_is_answered(raw: Raw) -> None:
    """Each of these got no answer at all, or no -32700, before."""
    cases: list[tuple[Any, bytes, int, str]] = [
        ("surrogate", b'{"jsonrpc":"2.0","id":"surrogate","method":"tools/call","params":{"name":"describe",'
                      b'"arguments":{"path":"\\ud800.sqlite"}}}', -32602, "lone UTF-16 surrogate"),
        ("digits", b'{"jsonrpc":"2.0","id":"digits","method":"ping","params":{"n":' + b"7" * 5000 + b"}}", -32600,
         "5,000 digits"),
        ("list", b'{"jsonrpc":"2.0","id":"list","method":"tools/call","params":["describe"]}', -32602, "give an object"),
        ("deep", b'{"jsonrpc":"2.0","id":"deep","method":"ping","params":{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}}",
         -32600, "100,002 levels deep"),
        ("broken", b'{"jsonrpc":"2.0","id":"broken","method":"ping"', -32700, "parse error"),
        (None, b"this is not JSON", -32700, "parse error"),
        (None, b"\xff\xfe{}", -32700, "not UTF-8"),
        (None, b'[{"jsonrpc":"2.0","id":"in_batch","method":"ping"}]', -32600, "batch"),
        (None, b'{"jsonrpc":"2.0","id":true,"method":"ping"}', -32600, "id: give a string or an integer"),
        ("v1", b'{"jsonrpc":"1.0","id":"v1","method":"ping"}', -32600, "JSON-RPC 2.0"),
        ("nomethod", b'{"jsonrpc":"2.0","id":"nomethod","method":"no/such/method"}', -32601, ""),
    ]
    for rid, line, code, text in cases:
        before = len(raw.answers)
        raw.send(line)
        raw.send({"jsonrpc": "2.0", "id": f"after-{rid}-{before}", "method": "ping"})
        raw.wait(f"after-{rid}-{before}")  # the server goes on
        got = [a for a in raw.answers[before:] if a.get("id") == rid and "error" in a]
        assert got, (rid, raw.answers[before:])
        assert got[0]["error"]["code"] == code and text in got[0]["error"]["message"], got[0]


def test_a_ping_is_answered_behind_sixty_calls(raw: Raw) -> None:
    """60 calls at once (they take turns for the one worker): the ping sent after them is
    answered before most of them (input is never held up by the calls), and none is 'busy'."""
    raw.call("warm", "summary", path=REL, findings=0)
    raw.wait("warm")
    for i in range(60):
        raw.call(f"c{i}", "summary", path=REL, findings=0)
    raw.send({"jsonrpc": "2.0", "id": "ping60", "method": "ping"})
    assert raw.wait("ping60")["result"] == {}
    for i in range(60):
        assert not raw.wait(f"c{i}")["result"].get("isError"), raw.wait(f"c{i}")
    calls = sorted(raw.position(f"c{i}") for i in range(60))
    assert raw.position("ping60") < calls[30], "the ping waited behind the calls"


def test_a_cancelled_call_frees_the_worker(raw: Raw, bad_root: Path) -> None:
    link = bad_root / "train_ddp_2gpu.sqlite"
    if not link.exists():
        shutil.copy(run_capture("train_ddp_2gpu") / "train_ddp_2gpu.sqlite", link)
    raw.call("warmup", "top_kernels", path=REL, n=1)
    raw.wait("warmup")
    before = raw.worker_pids()
    assert len(before) == 1
    raw.call("slow", "diff", before=str(link), after=str(link))  # two diagnoses of a 27 s training: seconds
    time.sleep(0.5)
    raw.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "slow", "reason": "test"}})
    raw.call("next", "top_kernels", path=REL, n=1)
    assert not raw.wait("next")["result"].get("isError")
    assert raw.worker_pids().isdisjoint(before)  # the worker that ran the cancelled call was ended
    assert not any(a.get("id") == "slow" for a in raw.answers)  # a cancelled request is not answered


def test_bad_input_is_one_capped_line(raw: Raw, bad_root: Path) -> None:
    cases = [
        ("describe", {"path": "loop_a"}, "link that leads back to itself"),
        ("describe", {"path": "a" * 256 + ".sqlite"}, "File name too long"),
        ("query", {"path": REL, "sql": "SELECT 1 FROM kernels", "offset": 2**63}, "offset: Input should be less than or equal"),
        ("stats", {"path": REL, "offset": 2**62}, "offset: Input should be less than or equal"),
        ("diagnose", {"path": REL, "window_start_ns": 0, "window_end_ns": 1e40}, "window_end_ns"),
        ("top_kernels", {"path": REL, "n": "ten"}, "n: Input should be a valid integer"),
        ("summary", {"top": 3}, "give path (it is required)"),
        ("diff", {"before": REL, "after": REL, "levels": "kernel,--by"}, "levels: String should match pattern"),
        ("describe", {"path": "x" * 100_001}, "a path of 100,001 characters"),
        ("describe", {"path": "stamped.nsys-rep"}, "stamped.sqlite.tracekit.json links outside the folders"),
    ]
    for i, (tool, args, want) in enumerate(cases):
        raw.call(f"bad{i}", tool, **args)
        text = _text(raw.wait(f"bad{i}"))
        assert want in text and len(text) <= 1000, (tool, text[:300])
    # an export without StringIds: every tool answers, one line at most, never an internal error
    for i, (tool, args) in enumerate([("describe", {}), ("summary", {}), ("diagnose", {}), ("stats", {}),
                                      ("top_kernels", {}), ("kernel", {"name": "x"}),
                                      ("query", {"sql": "SELECT name FROM kernels"})]):
        raw.call(f"nostr{i}", tool, path="no_strings.sqlite", **args)
        result = raw.wait(f"nostr{i}")["result"]
        text = result["content"][0]["text"]
        assert "internal error" not in text and "\n" not in text, (tool, text)


def test_list_traces_lists_what_the_tools_take(raw: Raw, bad_root: Path) -> None:
    raw.call("ls", "list_traces", limit=5000)
    data = raw.wait("ls")["result"]["structuredContent"]
    paths = {(e["root"], e["path"]): e for e in data["traces"]}
    entry = paths[(str(SAMPLES.resolve()), REL)]
    assert entry["kind"] == "nsys-sqlite" and entry["bytes"] == DECODE.stat().st_size
    assert (str(SAMPLES.resolve()), "llm_tp2_nccl_per_rank") in paths  # a folder of per-rank reports
    assert paths[(str(SAMPLES.resolve()), "llm_tp2_nccl_per_rank")]["kind"].startswith("folder of")
    assert (str(bad_root.resolve()), "stamped.nsys-rep") in paths
    # torch.profiler traces, told by content, and a folder of two ranks of them
    kineto = (str(SAMPLES.resolve()), "kineto/sampled_2rank/sampled_rank-0.json.gz")
    assert paths[kineto]["kind"] == "kineto"
    assert paths[(str(SAMPLES.resolve()), "kineto/sampled_2rank")]["kind"] == "folder of 2 reports"
    assert data["total_rows"] == len(data["traces"]) and data["next_offset"] is None
    raw.call("ls2", "list_traces", under="llm_tp2_nccl_per_rank", limit=2)
    page = raw.wait("ls2")["result"]["structuredContent"]
    assert [e["path"] for e in page["traces"]][:1] == ["llm_tp2_nccl_per_rank"] and page["next_offset"] == 2
    raw.call("ls3", "list_traces", under="/etc")
    assert "outside the folders this server may read" in _text(raw.wait("ls3"))


def test_a_large_answer_arrives_whole(raw: Raw) -> None:
    """A 20 MB answer (two copies of 10 MB of rows: structured and as text) is written by its
    own thread as soon as it is built, and the server answers on behind it."""
    sql = "SELECT start_ns, " + " || ".join(["name"] * 90) + " AS n FROM cuda_api"
    raw.call("large", "query", path=str(TP2), sql=sql, limit=5000)
    raw.send({"jsonrpc": "2.0", "id": "behind", "method": "ping"})
    got = raw.wait("large")["result"]
    assert got["structuredContent"]["returned_rows"] == 5000
    assert len(json.dumps(got)) > 20_000_000
    assert raw.wait("behind")["result"] == {}


def test_the_same_edges_through_the_sdk_client(bad_root: Path, tmp_path: Path) -> None:
    c = Client(["-m", "tracekit.agent.server", "--root", str(SAMPLES), "--root", str(bad_root)], _env(tmp_path))
    try:
        assert "link that leads back to itself" in c.error("describe", path="loop_a")
        assert "offset: Input should be less than or equal" in c.error("stats", path=REL, offset=2**62)
        assert "window_end_ns: Input should be less than or equal to 9223372036854775807" in c.error(
            "diagnose", path=REL, window_start_ns=0, window_end_ns=10**40)
        assert len(c.error("describe", path="y" * 100_001)) < 1000
        assert 'by "size": choose one of name or short_name' in c.error("top_kernels", path=REL, by="size")
        # issue 44 §1 through the tool: a join side whose columns the query does not use keeps its rows
        count = c.ok("query", path=REL, sql="SELECT count(*) AS n FROM kernels a CROSS JOIN kernels b")
        assert count["rows"] == [{"n": 480 * 480}]
        both = c.ok("query", path=REL, sql="SELECT a.name, b.bytes FROM kernels a CROSS JOIN memcpys b", limit=3)
        assert both["total_rows"] == 480 * 16 and both["returned_rows"] == 3
        listed = c.ok("list_traces", under="planted", limit=50)
        assert any(e["path"] == "planted/planted_clean/planted_clean.sqlite" for e in listed["traces"])
        # the diff tool's hint in its own terms, its sides named as given (a link, not its target)
        (bad_root / "given_name.sqlite").symlink_to(TP2)
        d = c.ok("diff", before=str(TP2), after="given_name.sqlite", levels="kernel", findings=False)
        assert d["after"] == "given_name.sqlite" and d["before"] == "llm_tp2_nccl.sqlite"
        assert "add step to levels" in d["summary"] and "--by" not in json.dumps(d)
        # a folder of unrelated reports: one line in the tool's terms; side by side on request
        mixed = bad_root / "mixed"
        mixed.mkdir(exist_ok=True)
        for f in (*sorted((SAMPLES / "llm_tp2_nccl_per_rank").glob("*.sqlite")), DECODE):
            shutil.copy(f, mixed / f.name)
        line = c.error("describe", path="mixed")
        assert "the reports are not one run: llm_decode_1gpu.sqlite" in line and "side_by_side=true" in line
        side = c.ok("describe", path="mixed", side_by_side=True)
        assert side["format"] == "side-by-side" and len(side["reports"]) == 3 and "not one run" in side["unrelated"]
        assert c.ok("describe", path="llm_tp2_nccl_per_rank")["format"] == "nsys-ranks"
    finally:
        c.close()


def test_cancelling_through_the_sdk_client(tmp_path: Path) -> None:
    """The SDK client's own cancellation (a call's task cancelled): the next call is served by a
    fresh worker, not after the cancelled one finishes."""
    import anyio

    ddp = run_capture("train_ddp_2gpu")
    c = Client(["-m", "tracekit.agent.server", "--root", str(SAMPLES), "--root", str(ddp)], _env(tmp_path))
    try:
        c.ok("top_kernels", path=REL, n=1)

        async def cancel_slow() -> None:
            with anyio.move_on_after(1.0):
                await c.session.call_tool("diff", {"before": str(ddp / "train_ddp_2gpu.sqlite"),
                                                   "after": str(ddp / "train_ddp_2gpu.sqlite")})
                raise AssertionError("the slow call finished within a second")

        c.run(cancel_slow())
        assert c.ok("top_kernels", path=REL, n=1)["kernels"][0]["instances"] > 0
    finally:
        c.close()


def test_transport_checks_lines() -> None:
    """The line checks themselves, without a server."""
    from tracekit.agent.transport import Rejected, _top_level_id, check_line

    assert check_line(b"  \n") is None
    assert check_line(b'{"jsonrpc":"2.0","id":3,"method":"ping"}') == {"jsonrpc": "2.0", "id": 3, "method": "ping"}
    assert _top_level_id(b'{"params":{"id":9},"id":"top"') == "top"  # the top-level id, not a nested one
    assert _top_level_id(b'{"id":12345678901234567890123,') is None  # beyond 64 bits: no id here
    with pytest.raises(Rejected) as err:
        check_line(b'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"arguments":{"k":"\\udc00"}}}')
    assert err.value.rid == 5 and "the message.params.arguments.k" in err.value.message
    with pytest.raises(Rejected) as err:
        check_line(b'{"jsonrpc":"2.0","id":6,"method":"ping","params":{"n":' + b"9" * 301 + b"}}")
    assert err.value.code == -32600 and err.value.rid == 6 and "301 digits" in err.value.message
    with pytest.raises(Rejected) as err:  # an id beyond 64 bits is no id
        check_line(b'{"jsonrpc":"2.0","id":99999999999999999999999,"method":"ping"}')
    assert err.value.rid is None
