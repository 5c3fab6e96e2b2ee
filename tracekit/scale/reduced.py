"""Per-rank reductions of many reports, computed as tasks on a ``dask.distributed`` cluster.

The client process never holds a rank's raw rows: each task opens one report, reduces it
(:mod:`tracekit.scale.reduce`) and sends back small frames; the :class:`ReducedSet` stacks them
with ``report``/``rank`` columns and one clock exactly as :class:`tracekit.multi.TraceSet`
does (same rank rules, same time shift), and runs the cross-rank analyses on them.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import polars as pl

from tracekit.errors import MissingDependencyError, TracekitError
from tracekit.multi import (
    POLICIES,
    ReportLoadError,
    ReportSkippedWarning,
    TraceSet,
    _Loaded,
    _resolve,
)
from tracekit.scale.reduce import REDUCTIONS, reduce_report

__all__ = ["ReducedSet", "open_many", "open_reduced"]


class ReducedSet(TraceSet):
    """Reductions of one report per rank (see :mod:`tracekit.scale.reduce`), stacked with
    ``report`` and ``rank`` columns on the earliest report's clock.

    Tables: ``kernel_summary``, ``nccl``, ``gpus``, ``iterations``, ``busy``, ``overlap``,
    ``findings`` (``set.table(name)`` or the properties). Raw tables (``kernels``,
    ``cuda_api`` …) are not brought to this process: ``set.open(i)`` opens one report.
    """

    def table(self, name: str) -> pl.DataFrame:
        if name not in self._tables:
            if name in REDUCTIONS:
                msg = f"reduction {name!r} was not computed; pass reductions=(…, {name!r}) to open_many"
            else:
                msg = (
                    f"{name!r} holds raw rows, which engine='dask' keeps on the workers; use the reductions "
                    f"({', '.join(REDUCTIONS)}) or set.open(report) for one rank"
                )
            raise TracekitError(msg)
        return self._tables[name]

    @property
    def kernel_summary(self) -> pl.DataFrame:
        """Per rank, process, device and kernel name: ``kernels``, ``total_ns``, ``min_ns``, ``max_ns``."""
        return self.table("kernel_summary")

    @property
    def iterations(self) -> pl.DataFrame:
        """Per rank and step: the columns of :func:`tracekit.analysis.run.iterations.iterations`."""
        return self.table("iterations")

    @property
    def busy(self) -> pl.DataFrame:
        """Per rank and device: :func:`tracekit.analysis.gpu_time.busy_time`."""
        return self.table("busy")

    @property
    def overlap(self) -> pl.DataFrame:
        """Per rank and device: :func:`tracekit.analysis.comm.overlap_breakdown`."""
        return self.table("overlap")

    @property
    def findings(self) -> pl.DataFrame:
        """Per rank: the findings of :func:`tracekit.diagnose` on its report."""
        return self.table("findings")

    # -- cross-rank analyses -------------------------------------------------------------
    def kernels_across_ranks(self) -> pl.DataFrame:
        """Per kernel name: ``ranks``, ``kernels``, ``total_ns``, and the spread of the per-rank
        totals ``min_rank_ns``, ``max_rank_ns``, ``mean_rank_ns`` (ns); largest total first
        (:func:`tracekit.analysis.ranks.kernels_across_ranks`)."""
        from tracekit.analysis.ranks import kernels_across_ranks

        return kernels_across_ranks(self.kernel_summary)

    def step_times(self) -> pl.DataFrame:
        """Per rank: ``steps``, median CPU step ``median_step_ns`` and GPU busy per step
        ``median_gpu_busy_ns`` (ns), from ``iterations``."""
        it = self.iterations
        if it.height == 0:
            return pl.DataFrame(schema={"rank": pl.Int64, "steps": pl.Int64, "median_step_ns": pl.Float64,
                                        "median_gpu_busy_ns": pl.Float64})
        return it.group_by("rank").agg(
            pl.len().cast(pl.Int64).alias("steps"), pl.col("duration_ns").median().alias("median_step_ns"),
            pl.col("gpu_busy_ns").median().alias("median_gpu_busy_ns"),
        ).sort("rank")

    def compute_per_rank(self) -> pl.DataFrame:
        """Per rank: ``compute_ns`` (compute-only + overlapped with communication),
        ``communication_ns``, ``exposed_comm_ns`` (ns) and ``imbalance`` = (max − this) / max
        of compute over the ranks."""
        ov = self.overlap
        per = ov.group_by("rank").agg(
            (pl.col("compute_only_ns") + pl.col("overlap_ns")).sum().alias("compute_ns"),
            pl.col("communication_ns").sum(), pl.col("communication_only_ns").sum().alias("exposed_comm_ns"),
        )
        top = pl.col("compute_ns").max()
        return per.with_columns(((top - pl.col("compute_ns")) / top).alias("imbalance")).sort("rank")

    def collective_skew(self) -> pl.DataFrame:
        """:func:`tracekit.analysis.ranks.collective_skew` of the matched NCCL collectives."""
        from tracekit.analysis.ranks import collective_skew, match_collectives

        return collective_skew(match_collectives(self.nccl))

    def skew_by_rank(self) -> pl.DataFrame:
        """:func:`tracekit.analysis.ranks.skew_by_rank`: who waits, who arrives last."""
        from tracekit.analysis.ranks import match_collectives, skew_by_rank

        return skew_by_rank(match_collectives(self.nccl))

    def __repr__(self) -> str:
        ranks = self.ranks["rank"].drop_nulls()
        span = f"ranks {ranks.min()!s}–{ranks.max()!s}" if ranks.len() else "no ranks"
        return f"ReducedSet({len(self)} reports, {span}, {len(self.failures)} failed)"


def _client(client: Any, n_workers: int) -> tuple[Any, Any]:
    try:
        import distributed
    except ImportError as exc:
        msg = "engine='dask' needs dask.distributed: pip install 'tracekit[scale]'"
        raise MissingDependencyError(msg) from exc
    if client is not None:
        if isinstance(client, str):
            return distributed.Client(client), True
        return client, False
    import logging

    # the scheduler runs in this process: its INFO lines (workers starting, closing) are noise
    # on a command's stderr; warnings and errors still show
    cluster = distributed.LocalCluster(
        n_workers=n_workers, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=logging.WARNING
    )
    return distributed.Client(cluster), True


def open_reduced(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    *,
    client: Any = None,
    n_workers: int = 2,
    policy: str = "warn",
    reductions: Sequence[str] = REDUCTIONS,
    engine: str = "auto",
    retries: int = 1,
    allow_unrelated: bool = False,
) -> ReducedSet:
    """Reduce one report per rank on a Dask cluster (``open_many(…, engine="dask")``).

    Parameters
    ----------
    client
        A ``distributed.Client``, a scheduler address (``"tcp://host:8786"``), or ``None`` for a
        ``LocalCluster`` of ``n_workers`` processes started and closed here.
    policy, engine
        As for :func:`tracekit.open_many`: a report that cannot be read is left out
        (``"warn"``/``"skip"``) or raises (``"raise"``); ``engine`` is the SQLite reader.
    reductions
        Which reductions to compute (:data:`tracekit.scale.reduce.REDUCTIONS`).
    retries
        Extra attempts of a task whose worker raised; a task whose worker died is rescheduled
        by Dask itself (up to its ``allowed-failures``).
    allow_unrelated
        As for :func:`tracekit.open_many`: reports that are not one run raise
        :class:`~tracekit.multi.UnrelatedReportsError` unless this is ``True``.
    """
    if policy not in POLICIES:
        msg = f"unknown policy {policy!r}; use one of {', '.join(POLICIES)}"
        raise ValueError(msg)
    bad = [r for r in reductions if r not in REDUCTIONS]
    if bad:
        msg = f"unknown reduction(s) {', '.join(bad)}; choose from {', '.join(REDUCTIONS)}"
        raise ValueError(msg)
    files = _resolve(paths)
    dask_client, own = _client(client, n_workers)
    try:
        futures = dask_client.map(
            reduce_report, [str(f) for f in files], names=tuple(reductions), engine=engine, pure=False, retries=retries
        )
        loaded: list[_Loaded] = []
        from tracekit.multi import ReportFailure

        for path, fut in zip(files, futures, strict=True):
            try:
                item = fut.result()
            except Exception as exc:  # the task failed for good (e.g. it killed its workers)
                item = _Loaded(path=path, failure=ReportFailure(path, type(exc).__name__, str(exc).splitlines()[0]))
            loaded.append(item)
    finally:
        if own:
            cluster = getattr(dask_client, "cluster", None)
            dask_client.close()
            if cluster is not None:
                cluster.close()
    good = [item for item in loaded if item.failure is None]
    failures = [item.failure for item in loaded if item.failure is not None]
    if failures and policy == "raise":
        msg = f"{len(failures)} of {len(files)} reports could not be read; first: {failures[0]}"
        raise ReportLoadError(msg)
    if not good:
        msg = f"none of the {len(files)} reports could be read; first: {failures[0]}"
        raise ReportLoadError(msg)
    from tracekit.multi import check_one_run

    unrelated = check_one_run(good, paths, allow_unrelated=allow_unrelated)
    if policy == "warn":
        for failure in failures:
            warnings.warn(f"left out {failure}", ReportSkippedWarning, stacklevel=2)
    return ReducedSet(good, failures, engine=engine, max_workers=1, mp_context="spawn", unrelated=unrelated)


def open_many(paths: Any, *, engine: str = "auto", client: Any = None, **options: Any) -> Any:
    """``tracekit.open_many``: the process-pool :class:`~tracekit.multi.TraceSet`
    (:func:`tracekit.multi.open_many`), or with ``engine="dask"`` a :class:`ReducedSet` of
    per-rank reductions made on a Dask cluster (``client``, ``max_workers`` local workers when
    none; docs/scale.md). Lives here, above both, so that neither loader imports the other."""
    if engine == "dask":
        workers = options.pop("max_workers", None) or 2
        policy = options.pop("policy", "warn")
        reductions = options.pop("reductions", REDUCTIONS)
        allow = bool(options.pop("allow_unrelated", False))
        if options:
            msg = f"engine='dask' does not take {', '.join(sorted(options))}"
            raise TypeError(msg)
        return open_reduced(paths, client=client, n_workers=workers, policy=policy, reductions=reductions,
                            allow_unrelated=allow)
    if client is not None:
        msg = "client= is for engine='dask'"
        raise TypeError(msg)
    from tracekit.multi import open_many as pool_open_many

    return pool_open_many(paths, engine=engine, **options)
