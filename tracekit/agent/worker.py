"""The process that runs the MCP server's tools: ``python -m tracekit.agent.worker CONFIG``.

The server (:mod:`tracekit.agent.server`) starts it and sends it one request per line on its
stdin (``{"id", "tool", "args"}``, JSON); it answers one line each on the stdout it was started
with (``{"id", "ok": true, "result", "warnings"}`` or ``{"id", "ok": false, "error"}``).
Anything a library prints goes to stderr instead (fd 1 is pointed at fd 2 once the answer
channel is kept aside), so it can never corrupt the answers.

Why a process of its own: the server stops it when a call outlives its deadline (a thread
cannot be stopped), an allocation that fails inside polars' Rust code or a native reader that
crashes on a damaged file ends this process and not the server, and the memory bound
(``RLIMIT_AS``, set here first thing) applies to the work and not to the server.

The process is set up as the CLI sets up its own (:func:`tracekit.cli.allocator.tune_allocator`,
:func:`~tracekit.cli.allocator.map_large_blocks`,
:func:`tracekit.cli.main.prepare_process`), so that running out of memory is a one-line
error wherever tracekit checks for it, and errors are the CLI's lines (``tracekit: error: …``).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
import warnings
from typing import Any, TextIO

__all__ = ["error_line", "handle", "main"]

log = logging.getLogger(__name__)

#: What the CLI prints when memory runs out (tracekit/cli/main.py, ``main``).
OUT_OF_MEMORY = ("tracekit: error: out of memory; read fewer columns (trace.table(name, columns=[...])), one column "
                 "at a time (trace.columns_on_demand), keep the column cache on (TRACEKIT_COLUMN_CACHE), a shorter "
                 "window where the tool has one, or restart the server with a larger --max-memory-gb")


#: Characters of an error line (a message quoting a long path or SQL is cut).
MAX_ERROR_CHARS = 1000


def error_line(exc: BaseException) -> str:
    """The one line the CLI prints for ``exc`` (``tracekit: error: …`` for what tracekit
    raises on purpose and for running out of memory, ``tracekit: internal error: …`` else),
    at most :data:`MAX_ERROR_CHARS` characters."""
    from tracekit.errors import one_line

    return one_line(_error_line(exc), MAX_ERROR_CHARS)


def _error_line(exc: BaseException) -> str:
    from tracekit.errors import TracekitError, one_line

    if isinstance(exc, TracekitError) and not isinstance(exc, MemoryError):
        return "tracekit: error: " + " ".join(str(exc).split())
    if isinstance(exc, MemoryError):
        text = " ".join(str(exc).split())
        return f"tracekit: error: {text}" if isinstance(exc, TracekitError) and text else OUT_OF_MEMORY
    if isinstance(exc, ImportError) and "failed to map segment" in str(exc):
        return OUT_OF_MEMORY
    if type(exc).__name__ == "PanicException":  # polars' Rust side: a BaseException
        first = str(exc).splitlines()[0] if str(exc) else ""
        if "memory allocation" in first or "spawn" in first:
            return (f"tracekit: error: out of memory in the table engine ({first}); read fewer columns, keep the column "
                    "cache on (TRACEKIT_COLUMN_CACHE), or restart the server with a larger --max-memory-gb")
        return f"tracekit: internal error: the table engine panicked ({first}); the export may be damaged"
    return (f"tracekit: internal error: {type(exc).__name__}: {one_line(str(exc), 400)} "
            "(the server's stderr has the traceback)")


def handle(session: Any, request: dict[str, Any]) -> dict[str, Any]:
    """Run one request on ``session`` (a :class:`tracekit.agent.tools.Session`): the answer
    with the warnings the call raised (one line each), or the error line."""
    from tracekit.agent.tools import TOOLS, jsonable

    rid = request.get("id")
    tool = request.get("tool")
    if tool not in TOOLS:
        return {"id": rid, "ok": False, "error": f"tracekit: error: unknown tool {tool!r}; choose one of {', '.join(TOOLS)}"}
    caught: list[str] = []
    with warnings.catch_warnings(record=True) as seen:  # the filters stay the CLI's (no DeprecationWarning)
        try:
            result = jsonable(getattr(session, TOOLS[tool])(**dict(request.get("args") or {})))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            if isinstance(exc, MemoryError) or type(exc).__name__ == "PanicException":
                session.forget()  # start the next call from a clean slate
                import gc

                gc.collect()
            line = error_line(exc)
            if line.startswith("tracekit: internal error"):
                traceback.print_exc(file=sys.stderr)
            return {"id": rid, "ok": False, "error": line}
        for w in seen:
            text = f"tracekit: warning: {' '.join(str(w.message).split())}"
            if text not in caught:
                caught.append(text)
    return {"id": rid, "ok": True, "result": result, "warnings": caught}


def _limit_memory(max_bytes: int | None) -> None:
    if not max_bytes:
        return
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    want = max_bytes if hard == resource.RLIM_INFINITY else min(max_bytes, hard)
    if soft == resource.RLIM_INFINITY or want < soft:
        resource.setrlimit(resource.RLIMIT_AS, (want, hard))


def _answers() -> TextIO:
    """The stdout the server reads, kept aside; fd 1 and ``sys.stdout`` then go to stderr."""
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8", newline="\n")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return channel


#: Largest answer (bytes of JSON) a worker sends; a bigger one is answered with one line.
MAX_ANSWER_BYTES = 32 << 20


def main(argv: list[str] | None = None) -> int:
    """Serve requests from stdin until it closes. ``argv[0]``: the JSON config (``roots``,
    ``max_memory_bytes``, ``keep_open``, ``max_rows``)."""
    args = sys.argv[1:] if argv is None else argv
    config = json.loads(args[0]) if args else {}
    answers = _answers()
    _limit_memory(config.get("max_memory_bytes"))
    from tracekit.cli.allocator import map_large_blocks, tune_allocator

    tune_allocator(["mcp"])  # before polars is imported: what every command but the stepped ones gets
    map_large_blocks()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from tracekit.cli.main import prepare_process

    prepare_process("diagnose")  # numpy, polars' reader threads, the ADBC driver: while there is room
    from tracekit.agent.tools import Session

    session = Session(config.get("roots") or [], keep_open=config.get("keep_open", 2),
                      max_rows=config.get("max_rows", 200))
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except ValueError:
            answer: dict[str, Any] = {"id": None, "ok": False, "error": "tracekit: internal error: a request that is not JSON"}
        else:
            answer = handle(session, request)
        try:
            text = json.dumps(answer, allow_nan=False)
        except (TypeError, ValueError) as exc:  # a value the tools did not make plain JSON
            text = json.dumps({"id": answer.get("id"), "ok": False, "error": error_line(exc)})
        if len(text) > MAX_ANSWER_BYTES:  # rows as wide as a query makes them: the row limit is no bound
            text = json.dumps({"id": answer.get("id"), "ok": False, "error": (
                f"tracekit: error: the answer is {len(text) / 2**20:,.0f} MiB, more than the {MAX_ANSWER_BYTES >> 20} MiB this "
                "server sends: ask for fewer rows (limit) or narrower columns")})
        answers.write(text + "\n")
        answers.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
