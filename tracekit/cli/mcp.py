"""``tracekit mcp``: tracekit's answers as a Model Context Protocol server (stdio), for agents."""

from __future__ import annotations

import typer


def register(parent: typer.Typer) -> None:
    """Add the ``mcp`` command to ``parent``."""
    parent.command("mcp")(mcp)


def mcp(
    roots: list[str] = typer.Option([], "--root", help="A folder whose traces the server may open (repeatable; at least one)."),  # noqa: B008
    timeout: float = typer.Option(120.0, "--timeout", help="Seconds one tool call may take; past them its worker is stopped."),
    max_memory_gb: float | None = typer.Option(None, "--max-memory-gb",
                                               help="Address space of the worker process, GB (default: half the machine's memory; 0: no bound)."),
    keep_open: int = typer.Option(2, "--keep-open", min=0, help="Traces kept open between calls (their tables stay read)."),
    max_rows: int = typer.Option(200, "--max-rows", min=1, help="Rows a paged answer holds unless the call gives a limit."),
) -> None:
    """Serve describe, summary, diagnose, stats, top_kernels, kernel, query and diff over MCP on stdin/stdout
    (docs/agents.md). Needs the agent extra: pip install 'tracekit[agent]'."""
    from tracekit.agent.server import serve

    serve(roots, timeout_s=timeout, max_memory_gb=max_memory_gb, keep_open=keep_open, max_rows=max_rows)
