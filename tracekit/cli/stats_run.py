"""The ``tracekit stats`` command's work, without typer: :mod:`tracekit.cli.stats` registers it
with typer, and :func:`tracekit.cli.main.main` calls it directly for a plain command line
(:func:`tracekit.cli.stats_cache.parse_stats`: the export, ``-r``, ``-f``, ``--convention``),
which spares a cold run typer's import (0.05 s)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import BinaryIO

from tracekit.cli import stats_cache
from tracekit.cli.terminal import echo_err
from tracekit.nsys import readahead

#: Rows of a report ``tracekit stats`` shows as a table by default (``--rows``).
TABLE_ROWS = 100


def run_stats(file: str, report: str = "cuda_gpu_kern_sum", fmt: str = "table", output: str | None = None,
              convention: str = "2025", rows: int = TABLE_ROWS) -> None:
    """Print (or write, with ``output``) the reports named in ``report`` (comma-separated) of
    the export ``file``, as ``tracekit stats`` does (docs/cli.md)."""
    import tracekit
    from tracekit.errors import TraceFormatError, TracekitError
    from tracekit.nsys.trace import NsysTrace
    from tracekit.stats import report_options, run_report

    if fmt not in ("csv", "table"):
        msg = f"unknown format {fmt!r}; use csv or table"
        raise TraceFormatError(msg)
    if rows < 0:
        msg = f"--rows {rows}: give a number of rows, or 0 for all"
        raise TracekitError(msg)
    names = [r.strip() for r in report.split(",") if r.strip()]
    if not names:  # `-r ,` or `-r ''` printed nothing and exited 0
        msg = f"-r {report!r} names no report; give report names, e.g. -r cuda_gpu_kern_sum,cuda_api_sum"
        raise TracekitError(msg)
    if output and not Path(output).parent.is_dir():
        msg = f"-o {output}: folder {Path(output).parent} does not exist; create it or choose another prefix"
        raise TracekitError(msg)
    skipped: list[str] = []
    reasons: list[str] = []  # printed once a report is made; folded into the one error line if none is
    printed: list[tuple[str, bytes | None]] = []
    with stats_cache.warnings_counted() as warned:
        trace = tracekit.open(file)
        if not isinstance(trace, NsysTrace):
            msg = f"{file} is an Nsight Compute report; `tracekit stats` reads Nsight Systems exports"
            raise TraceFormatError(msg)
        options = report_options(names)
        for name in names:
            try:
                result = run_report(trace, name, convention=convention, **options[name])
            except TracekitError as exc:
                if len(names) == 1:
                    raise
                reasons.append(f"skipping {name}: {exc}")
                skipped.append(name)
                continue
            finally:
                readahead.drop()  # what the first report read ahead and did not take is not kept
            for reason in reasons:
                echo_err(f"tracekit: {reason}")
            reasons.clear()
            if output:
                path = Path(f"{output}_{result.name}.csv")
                from tracekit.outputs import write_output

                write_output(path, result.write_csv)
                echo_err(f"wrote {path}")
            elif fmt == "csv":
                sys.stdout.flush()
                sink = _Tee(sys.stdout.buffer, stats_cache.MAX_BYTES)
                result.write_csv(sink)  # type: ignore[arg-type]
                sys.stdout.buffer.flush()
                printed.append((name, sink.kept()))
            else:
                _print_table(result, rows)
    if names and len(skipped) == len(names):
        msg = f"none of the {len(names)} reports could be made from {file}: " + "; ".join(r.removeprefix("skipping ") for r in reasons)
        raise TracekitError(msg)
    for reason in reasons:
        echo_err(f"tracekit: {reason}")
    if printed and not skipped and not warned[0]:  # the next identical command prints these again
        for name, data in printed:
            if data is not None:
                stats_cache.store(Path(file), name, convention, data)


class _Tee:
    """A binary sink that writes through to ``out`` and keeps a copy of up to ``limit`` bytes
    (``kept()`` is None once more was written)."""

    def __init__(self, out: BinaryIO, limit: int) -> None:
        self._out, self._limit = out, limit
        self._parts: list[bytes] | None = []
        self._size = 0

    def write(self, data: bytes) -> int:
        self._out.write(data)
        if self._parts is not None:
            self._size += len(data)
            if self._size <= self._limit:
                self._parts.append(bytes(data))
            else:
                self._parts = None
        return len(data)

    def kept(self) -> bytes | None:
        return None if self._parts is None else b"".join(self._parts)


def _print_table(result, rows: int) -> None:  # type: ignore[no-untyped-def]
    """The report as a table of its first ``rows`` rows (all: 0), saying how many are left
    out and how to see them: a terminal table of 100 k rows (a report per kernel name of a
    program with that many names) took rich 110 s and 1 GB to lay out."""
    from rich.console import Console

    from tracekit.cli.tables import print_table

    cells = result.formatted_rows(rows or None)
    total = result.frame.height
    caption = None
    if len(cells) < total:
        caption = (f"first {len(cells):,} of {total:,} rows; --rows 0 shows all, "
                   f"-f csv or -o PREFIX writes all")
    print_table(Console(), result.columns, cells, title=result.name, caption=caption)
