"""Scale: many per-rank reports reduced per rank as tasks on ``dask.distributed``.

``tracekit.open_many(paths, engine="dask", client=None)`` (or :func:`open_reduced`) runs one
task per report on a Dask cluster; only each rank's reductions (:mod:`.reduce`) come back to
this process, as a :class:`~tracekit.scale.reduced.ReducedSet`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["REDUCTIONS", "ReducedSet", "open_reduced", "reduce_report"]

if TYPE_CHECKING:
    from tracekit.scale.reduce import REDUCTIONS, reduce_report
    from tracekit.scale.reduced import ReducedSet, open_reduced


def __getattr__(name: str) -> Any:
    import importlib

    where = {"REDUCTIONS": "reduce", "reduce_report": "reduce", "ReducedSet": "reduced", "open_reduced": "reduced"}
    if name in where:
        return getattr(importlib.import_module(f"tracekit.scale.{where[name]}"), name)
    raise AttributeError(f"module 'tracekit.scale' has no attribute {name!r}")
