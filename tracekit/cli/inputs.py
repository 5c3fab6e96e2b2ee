"""What the commands that read Nsight Systems exports accept: one export, several (one per
rank), or a folder of per-rank reports — read in this process, or reduced per rank on Dask.

* one ``.sqlite``/``.nsys-rep`` file, or one nsys ``parquetdir``/``arrowdir`` folder: that trace
  (:func:`tracekit.open`);
* several paths, or a folder of reports (``.sqlite``, ``.nsys-rep``, per-rank
  ``parquetdir``/``arrowdir`` folders; ``rank%q{RANK}`` outputs): a
  :class:`~tracekit.multi.TraceSet` (:func:`tracekit.open_many`), one rank per report;
* reports that are not one run (:mod:`tracekit.runs`: another program or job, captured at
  another time, the same rank twice) are refused in one line naming the odd one out;
  ``--side-by-side`` (``summary``, ``diagnose``) shows them side by side instead;
* ``--engine dask`` (with ``--scheduler ADDRESS`` for a running cluster, else ``--workers``
  local worker processes) or ``--scheduler`` alone: each report reduced on a Dask worker, a
  :class:`~tracekit.scale.reduced.ReducedSet` back (docs/scale.md) — for hundreds of ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["ENGINE_HELP", "SCHEDULER_HELP", "SIDE_BY_SIDE_HELP", "WORKERS_HELP", "is_many", "open_traces"]

ENGINE_HELP = "How several reports are read: local (worker processes here) or dask (reduced per rank on a Dask cluster)."
SCHEDULER_HELP = "Address of a running Dask scheduler (tcp://host:8786): implies --engine dask."
WORKERS_HELP = "Worker processes: of the local pool, or of the local Dask cluster started when no --scheduler is given."
SIDE_BY_SIDE_HELP = ("Several reports (or a folder) each read on its own and shown side by side, never merged as the ranks of "
                     "one run: for exports of unrelated runs, which are otherwise refused.")

ENGINES = ("local", "dask")


def is_many(paths: Sequence[str | Path]) -> bool:
    """Whether ``paths`` name several reports (several paths, or a folder that is not itself one
    nsys parquetdir/arrowdir export)."""
    from tracekit.nsys.columnar import folder_format

    if len(paths) != 1:
        return True
    p = Path(paths[0])
    return p.is_dir() and folder_format(p) is None


def open_traces(
    paths: Sequence[str | Path],
    *,
    engine: str = "local",
    scheduler: str | None = None,
    workers: int | None = None,
    command: str = "this command",
) -> Any:
    """Open what ``paths`` name (see the module doc): an ``NsysTrace``, a ``TraceSet`` or a
    ``ReducedSet``. Raises :class:`~tracekit.errors.TracekitError` (one line) for a bad engine,
    an empty list or an Nsight Compute report among Nsight Systems ones."""
    import tracekit
    from tracekit.errors import TracekitError

    if engine not in ENGINES:
        msg = f"--engine {engine!r}: choose {' or '.join(ENGINES)}"
        raise TracekitError(msg)
    if not paths:
        msg = f"{command}: give an Nsight Systems export, several (one per rank) or a folder of them"
        raise TracekitError(msg)
    if scheduler is not None or engine == "dask":
        _quiet_dask()
        return tracekit.open_many([str(p) for p in paths], engine="dask", client=scheduler, max_workers=workers)
    if not is_many(paths):
        trace = tracekit.open(paths[0])
        if type(trace).__name__ == "NcuReport":
            msg = f"{paths[0]} is an Nsight Compute report; {command} reads Nsight Systems exports (give the report with --ncu where the command has it)"
            raise TracekitError(msg)
        return trace
    items = [str(p) for p in paths]
    return tracekit.open_many(items[0] if len(items) == 1 else items, max_workers=workers)


def _quiet_dask() -> None:
    """Keep Dask's INFO lines (scheduler and workers starting, closing) off the command's
    stderr: ``distributed`` sets its loggers to INFO when imported, and the command's root
    handler would print them. ``--debug`` (root at DEBUG) keeps them."""
    import logging

    try:
        import distributed  # noqa: F401 - its import sets the levels replaced here
    except ImportError:
        return  # open_many says how to install it
    if not logging.getLogger().isEnabledFor(logging.INFO):
        for name in ("distributed", "distributed.scheduler", "distributed.nanny", "distributed.core",
                     "distributed.http.proxy", "distributed.worker", "distributed.diskutils"):
            logging.getLogger(name).setLevel(logging.WARNING)
