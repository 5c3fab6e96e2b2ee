"""The ``tracekit`` console script: a repeated ``tracekit stats … -f csv`` is answered from the
kept CSVs (:mod:`tracekit.cli.stats_cache`) before typer or polars is imported; everything
else goes to :func:`tracekit.cli.main.run`, with jemalloc and glibc's malloc told to return
freed memory sooner (:mod:`tracekit.cli.allocator`) and, for a cold ``stats``, the first
report's scans of the export started on threads (:mod:`tracekit.cli.stats_readahead`)."""

from __future__ import annotations

import sys
from typing import NoReturn


def run() -> NoReturn:
    """Print kept ``stats`` CSVs when the command line asks only for those, else run the CLI."""
    from tracekit.cli.stats_cache import cached_stats

    code = cached_stats(sys.argv[1:])
    if code is not None:
        sys.exit(code)
    from tracekit.cli.allocator import map_large_blocks, tune_allocator

    tune_allocator(sys.argv[1:])  # before polars is imported
    map_large_blocks()
    if sys.argv[1:2] == ["stats"]:  # SQLite scans while polars is imported
        from tracekit.cli.stats_readahead import start_reads

        start_reads(sys.argv[1:])
    from tracekit.cli.main import run as run_cli

    run_cli()


if __name__ == "__main__":
    run()
