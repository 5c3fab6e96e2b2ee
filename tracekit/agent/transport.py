"""The MCP server's stdio transport: every request with an id gets an answer, and reading
never waits on writing or on the tools.

The SDK's own stdio transport (``mcp.server.stdio``) left some requests without any answer
(issue 44: a lone UTF-16 surrogate in a string, a 5,000-digit number, ``params`` given as a
list, 100,000-deep nesting; a line that is not JSON got no ``-32700``), and it read and wrote
through anyio's worker threads, which 40 concurrent tool calls could all hold: a ``ping`` then
waited 18.5 s. Here

* one thread reads stdin and checks each line before the SDK sees it (:func:`check_line`):
  what is not JSON is answered ``-32700`` (parse error), what is JSON but no valid JSON-RPC
  message ``-32600`` (invalid request) or ``-32602`` (invalid params), with the request's id
  whenever one can be read from the line, even one too deep or too long to parse;
* another thread writes the answers, serialising each one there (a 20 MB answer is written
  as soon as it is built, without holding the event loop);
* between them the SDK's session runs on the event loop, with room for
  :data:`QUEUED_MESSAGES` messages read and not yet handled (past that, requests are answered
  ``-32000``: busy, never left waiting).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["MAX_DEPTH", "MAX_LINE_BYTES", "QUEUED_MESSAGES", "check_line", "guarded_stdio"]

#: Nesting of arrays and objects a message may have (MCP's messages need a handful).
MAX_DEPTH = 64
#: Bytes one message (one line) may have.
MAX_LINE_BYTES = 64 << 20
#: Digits an integer may have (Python refuses to read more than 4,300; a tool's own bounds, in
#: its schema, refuse what is beyond them in one line).
MAX_DIGITS = 300
#: Messages read and not yet handled before requests are answered "busy".
QUEUED_MESSAGES = 1024
#: Characters of a value quoted in an error message.
QUOTE_CHARS = 60

PARSE_ERROR, INVALID_REQUEST, INVALID_PARAMS, BUSY = -32700, -32600, -32602, -32000

_ID_KEY = re.compile(rb'"id"\s*:\s*')
_NUMBER = re.compile(rb"-?\d{1,19}(?![\d.eE])")  # an id: 64-bit
_STRING = re.compile(rb'"((?:[^"\\]|\\.){0,256})"')


class Rejected(Exception):
    """A line that is answered here: ``code``, ``message`` and the request's ``id`` (None
    when it has none or none could be read)."""

    def __init__(self, code: int, message: str, rid: Any = None) -> None:
        super().__init__(message)
        self.code, self.message, self.rid = code, message, rid


def _quote(text: str) -> str:
    return text if len(text) <= QUOTE_CHARS else text[: QUOTE_CHARS - 1] + "…"


def _top_level_id(line: bytes) -> Any:
    """The ``id`` of the top-level object of ``line`` when it can be read without parsing the
    line (too deep, too long, or broken further on): an integer of at most
    :data:`MAX_DIGITS` digits or a short string; None otherwise."""
    depth, i, n = 0, 0, len(line)
    in_string = False
    while i < n:
        c = line[i]
        if in_string:
            if c == 0x5C:  # backslash
                i += 2
                continue
            if c == 0x22:
                in_string = False
            i += 1
            continue
        if c == 0x22:  # a string: a key of the top-level object?
            if depth == 1:
                m = _ID_KEY.match(line, i)
                if m:
                    value = line[m.end():]
                    num = _NUMBER.match(value)
                    if num:
                        return int(num.group(0))
                    s = _STRING.match(value)
                    if s:
                        try:
                            text = json.loads(b'"' + s.group(1) + b'"')
                        except ValueError:
                            return None
                        return text if _valid_text(text) else None
                    return None
            in_string = True
        elif c in (0x7B, 0x5B):  # { [
            depth += 1
        elif c in (0x7D, 0x5D):
            depth -= 1
        i += 1
    return None


def _depth(line: bytes) -> int:
    """The deepest nesting of ``line``'s arrays and objects (strings skipped)."""
    depth = deepest = 0
    in_string = escaped = False
    for c in line:
        if in_string:
            if escaped:
                escaped = False
            elif c == 0x5C:
                escaped = True
            elif c == 0x22:
                in_string = False
        elif c == 0x22:
            in_string = True
        elif c in (0x7B, 0x5B):
            depth += 1
            deepest = max(deepest, depth)
        elif c in (0x7D, 0x5D):
            depth -= 1
    return deepest


def _valid_text(text: str) -> bool:
    """Whether ``text`` is valid Unicode (no lone UTF-16 surrogate: JSON's ``\\ud800`` escapes
    decode to one, and no UTF-8 can carry it)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_values(value: Any, where: str) -> str | None:
    """Where ``value`` holds a string that is not valid Unicode (a phrase), or None."""
    stack = [(value, where)]
    while stack:
        v, at = stack.pop()
        if isinstance(v, str):
            if not _valid_text(v):
                return f"{at} holds a lone UTF-16 surrogate (not valid Unicode)"
        elif isinstance(v, dict):
            for k, item in v.items():
                if not _valid_text(k):
                    return f"a key of {at} holds a lone UTF-16 surrogate (not valid Unicode)"
                stack.append((item, f"{at}.{_quote(k)}"))
        elif isinstance(v, list):
            stack.extend((item, f"{at}[{i}]") for i, item in enumerate(v))
    return None


def _big_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise ValueError(f"a number of {len(text.lstrip('-')):,} digits")
    return int(text)


def check_line(line: bytes) -> dict[str, Any] | None:
    """The JSON-RPC message of one line of input, checked (None for a blank line); raises
    :class:`Rejected` with the answer's code, message and id for anything else."""
    line = line.strip()
    if not line:
        return None
    if len(line) > MAX_LINE_BYTES:
        raise Rejected(INVALID_REQUEST, f"message of {len(line):,} bytes, more than the {MAX_LINE_BYTES:,} this server reads",
                       _top_level_id(line))
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Rejected(PARSE_ERROR, f"parse error: the message is not UTF-8 (byte {exc.start})", _top_level_id(line)) from None
    deep = _depth(line) if line.count(b"[") + line.count(b"{") > MAX_DEPTH else 0
    if deep > MAX_DEPTH:
        raise Rejected(INVALID_REQUEST, f"message nested {deep:,} levels deep, more than the {MAX_DEPTH} this server reads",
                       _top_level_id(line))
    try:
        msg = json.loads(text, parse_int=_big_int)
    except RecursionError:
        raise Rejected(INVALID_REQUEST, "message nested too deep", _top_level_id(line)) from None
    except ValueError as exc:
        what = str(exc)
        if what.startswith("a number of"):
            raise Rejected(INVALID_REQUEST, f"{what}: integers here have at most {MAX_DIGITS} digits",
                           _top_level_id(line)) from None
        raise Rejected(PARSE_ERROR, f"parse error: not JSON ({_quote(what)})", _top_level_id(line)) from None
    if isinstance(msg, list):
        raise Rejected(INVALID_REQUEST, "a batch (a JSON array of messages): send one message per line")
    if not isinstance(msg, dict):
        raise Rejected(INVALID_REQUEST, "a message is a JSON object")
    rid = msg.get("id")
    has_id = "id" in msg
    id_ok = isinstance(rid, str | int) and not isinstance(rid, bool) and (not isinstance(rid, str) or _valid_text(rid)) and (
        not isinstance(rid, int) or -(1 << 63) <= rid < (1 << 63))
    answer_id = rid if id_ok else None
    if msg.get("jsonrpc") != "2.0":
        raise Rejected(INVALID_REQUEST, 'not JSON-RPC 2.0: give "jsonrpc": "2.0"', answer_id)
    if has_id and not id_ok:
        raise Rejected(INVALID_REQUEST, "id: give a string or an integer", None)
    method = msg.get("method")
    if "method" in msg:
        if not isinstance(method, str) or not _valid_text(method):
            raise Rejected(INVALID_REQUEST, "method: give the method's name as a string", answer_id)
        params = msg.get("params")
        if "params" in msg and not isinstance(params, dict):
            raise Rejected(INVALID_PARAMS, f"params of {_quote(method)}: give an object (by name), not {type(params).__name__}",
                           answer_id)
    elif not has_id:
        raise Rejected(INVALID_REQUEST, "a message needs a method (request, notification) or an id (response)")
    bad = _check_values(msg, "the message")
    if bad:
        raise Rejected(INVALID_PARAMS, bad, answer_id)
    return msg  # type: ignore[no-any-return]


def error_line(code: int, message: str, rid: Any) -> bytes:
    """A JSON-RPC error answer, as one line of bytes."""
    return (json.dumps({"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}, ensure_ascii=True)
            + "\n").encode()


def _claim(fd: int, flags: int) -> int:
    """A private copy of ``fd`` (the wire); ``fd`` itself then points at the null device (stdin)
    or stderr (stdout), so that nothing else in this process reads or writes the wire."""
    private = os.dup(fd)
    os.set_inheritable(private, False)
    if fd == 0:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
    else:
        os.dup2(2, fd)
    return private


@asynccontextmanager
async def guarded_stdio(stdin_fd: int = 0, stdout_fd: int = 1) -> AsyncIterator[tuple[Any, Any]]:
    """``(read_stream, write_stream)`` for ``Server.run`` over this process's stdin/stdout
    (see the module doc)."""
    import anyio
    import mcp_types as types
    from mcp.shared.message import SessionMessage

    wire_in = _claim(stdin_fd, os.O_RDONLY)
    wire_out = _claim(stdout_fd, os.O_WRONLY)
    sys.stdout = sys.stderr  # a stray print goes to the log, never the wire
    inbound_send, inbound = anyio.create_memory_object_stream[Any](QUEUED_MESSAGES)
    outbound, outbound_recv = anyio.create_memory_object_stream[Any](QUEUED_MESSAGES)
    answers: queue.SimpleQueue[Any] = queue.SimpleQueue()
    portal_token = anyio.lowlevel.current_token()
    closed = threading.Event()

    def write_all(data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(wire_out, view[: 1 << 20])
            view = view[n:]

    def writer() -> None:
        while True:
            item = answers.get()
            if item is None:
                return
            try:
                if isinstance(item, bytes):
                    data = item
                else:
                    data = (item.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n").encode()
                write_all(data)
            except BrokenPipeError:
                closed.set()
                return
            except Exception:  # an answer that cannot be written must not end the others
                log.exception("could not write an answer")
                rid = getattr(getattr(item, "message", None), "id", None)
                if rid is not None:
                    try:
                        write_all(error_line(-32603, "internal error: the answer could not be encoded", rid))
                    except OSError:
                        return

    def deliver(message: Any) -> bool:
        try:
            inbound_send.send_nowait(message)
        except anyio.WouldBlock:
            return False
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            return True
        return True

    def reader() -> None:
        with os.fdopen(wire_in, "rb", buffering=1 << 16, closefd=False) as stream:
            for line in stream:
                try:
                    msg = check_line(line)
                    if msg is None:
                        continue
                    try:
                        parsed = types.jsonrpc_message_adapter.validate_python(msg, by_name=False)
                    except Exception as exc:  # valid JSON-RPC, not a valid MCP message
                        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                        code = INVALID_PARAMS if "method" in msg and "id" in msg else INVALID_REQUEST
                        raise Rejected(code, f"invalid message: {_quote(first)}", msg.get("id")) from None
                except Rejected as r:
                    if r.rid is not None or r.code == PARSE_ERROR or r.code == INVALID_REQUEST:
                        answers.put(error_line(r.code, r.message, r.rid))
                    continue
                ok = anyio.from_thread.run_sync(deliver, SessionMessage(parsed), token=portal_token)
                if not ok and "method" in msg and "id" in msg:
                    answers.put(error_line(BUSY, f"busy: {QUEUED_MESSAGES} messages wait to be handled; send this again later",
                                           msg["id"]))
        anyio.from_thread.run_sync(inbound_send.close, token=portal_token)

    async def forward() -> None:
        async with outbound_recv:
            async for message in outbound_recv:
                answers.put(message)

    threading.Thread(target=writer, name="mcp-writer", daemon=True).start()
    threading.Thread(target=reader, name="mcp-reader", daemon=True).start()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(forward)
            try:
                yield inbound, outbound
            finally:
                tg.cancel_scope.cancel()
    finally:
        answers.put(None)
