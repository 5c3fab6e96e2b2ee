"""The scans a cold ``tracekit stats`` starts before polars is imported
(:mod:`tracekit.nsys.readahead`: SQLite scans the export on threads while the interpreter
loads polars, and the report takes their columns instead of scanning again).

Standard library only. Started for the first report of the command line when it is one of
:data:`SCANS`, and only when:

- the export is an ordinary ``.sqlite`` file, nothing beside it (no WAL or journal), with the
  column cache on (:func:`tracekit.cli.stats_cache.usable_export`), and none of its columns
  cached yet: a warm run reads the cache, not the export;
- the ADBC SQLite driver is installed (the reads it makes are the ones read ahead);
- there is no address-space limit (``ulimit -v``: there the reader checks each read against
  what is left before it starts, and a thread started ahead of those checks could not be
  refused), and the columns fit, counted at 8 bytes a value: at most :data:`MAX_BYTES`, and
  at most a quarter of the memory left (:func:`tracekit.nsys.memory.free_memory`). A damaged
  export's text cells in those columns take more; the scan holding them is freed as soon as
  the report finds them (the usual read, which reads them too, comes after), and whatever
  the first report did not take is freed when it ends (:func:`tracekit.cli.stats_run.run_stats`;
  a scan still running then is freed, and its connection closed, when it finishes).

``TRACEKIT_READ_AHEAD=0`` (or ``off``, ``false``, ``no``) turns it off. Anything else, and
any failure here, starts nothing: the report reads as usual. What a scan
reads is its report's (:mod:`tracekit.nsys.launch_scans`); a column is taken only where the
report asks for exactly it, so a scan the report turns out not to make costs time on a spare
core, never a different answer.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import resource
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path

from tracekit.cache import COLUMN_CACHE_FORMAT, cache_dir, export_key, switched_off
from tracekit.cli.stats_cache import parse_stats, report_names, usable_export
from tracekit.nsys import readahead
from tracekit.nsys.launch_scans import exec_sum_scans
from tracekit.nsys.memory import free_memory
from tracekit.nsys.sqlite_file import rowid_bounds, sqlite_uri

log = logging.getLogger(__name__)

#: Reports whose scans of a cold export can be started ahead, and how to list them from the
#: export's tables' row estimates.
SCANS: dict[str, Callable[[Callable[[str], int]], list[readahead.Scan]]] = {"cuda_kern_exec_sum": exec_sum_scans}
#: Most bytes of columns read ahead (8 a value). A scan read ahead is one batch of every row,
#: whose buffers the driver grows as it goes, where the usual read takes 64 k rows a batch:
#: on 2 M kernels (176 MB of columns) a cold ``cuda_kern_exec_sum`` peaked at 365–381 MB
#: read ahead against 331 MB, in as much time; on 1 M (88 MB) 278 against 263–277 MB for
#: 0.1 s of 1.1; on 200 k kernels and 1.2 M calls (58 MB) 160 against 173 MB, 0.6 → 0.47 s.
#: Above this the import the scans overlap is a small part of the run.
MAX_BYTES = 64 << 20


def _cold(export: Path) -> bool:
    """Whether no column of ``export`` is in the column cache."""
    folder = cache_dir() / "columns" / export_key(export, COLUMN_CACHE_FORMAT)
    return not any(folder.glob("*.arrow"))


def _row_estimates(con: sqlite3.Connection) -> Callable[[str], int]:
    """A table's rowid span (its rows, as the export reader estimates them; 0 when absent),
    each table's asked of SQLite once."""
    spans: dict[str, int] = {}

    def rows(table: str) -> int:
        if table not in spans:
            try:
                lo, hi = rowid_bounds(lambda sql: con.execute(sql).fetchone()[0], table)
            except sqlite3.Error:  # no such table
                lo, hi = 0, -1
            spans[table] = hi - lo + 1
        return spans[table]

    return rows


def start_reads(argv: Sequence[str]) -> bool:
    """Start the scans of the ``tracekit stats`` command line ``argv`` (without the program)
    that the module docstring allows; whether any were started."""
    if switched_off("TRACEKIT_READ_AHEAD"):
        return False
    try:
        parsed = parse_stats(argv)
        first = report_names(parsed[1])[0] if parsed is not None else None
        if parsed is None or first not in SCANS:
            return False
        export = Path(parsed[0])
        if resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY:
            return False
        if not usable_export(export) or not _cold(export) or importlib.util.find_spec("adbc_driver_sqlite") is None:
            return False
        uri = sqlite_uri(export)
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as con:
            rows = _row_estimates(con)
            scans = SCANS[first](rows)
            need = sum(rows(s.table) * len(s.columns) * 8 for s in scans)
        free = free_memory()
        if need > MAX_BYTES or (free is not None and 4 * need > free):
            return False
        readahead.start(export, scans)
        return True
    except Exception as exc:  # never fail here: the report reads as usual
        log.debug("not reading ahead: %s", exc)
        return False
