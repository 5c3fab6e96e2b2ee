"""Ranks: which rank each process is, and cross-rank matching of NCCL calls.

*Which rank.* A rank process is one that issued NCCL calls (else one that ran kernels).
Its rank comes from, in order:

1. ``nccl``: the ``Rank`` of an ``ncclCommInitRank*`` payload captured for the process (the
   communicator with the most ranks, normally the world);
2. ``env:<NAME>``: the capture environment (``RANK``, ``OMPI_COMM_WORLD_RANK``, ``PMI_RANK``,
   ``PMIX_RANK``, ``SLURM_PROCID``, then ``LOCAL_RANK``), used when the report holds a single
   rank process (nsys launched the rank itself);
3. ``file_name``: a ``rank3``/``rank_3``/``r3`` token in the file name (single rank process
   per report; a bare number such as the ``2022.4`` of ``nsys2022.4_x.sqlite`` is not a rank);
4. ``device_order``: several rank processes in one report (``nsys profile torchrun …``): the
   processes ordered by the lowest CUDA device they ran kernels on, then pid.

Ranks must be unique. When the per-process choice collides (64 copies of two per-rank
files all say ``RANK=0``/``1``), the first source that is complete and unique over the whole
set is used for all processes; failing that, ranks are numbered in order (report, device,
pid), with ``rank_source == "order"``.

*Matching.* :func:`match_collectives` pairs the n-th call of each communicator across ranks
(p2p calls per communicator and rank pair), from ordinary captures: the communicator id comes
from NCCL's NVTX payloads, the order from the host ranges. :func:`collective_skew` gives per
collective the start spread, the wait of early ranks and the straggler;
:func:`skew_by_op` and :func:`skew_by_rank` summarise.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import polars as pl

__all__ = [
    "RANK_ENV_VARS",
    "RANK_SOURCES",
    "choose_ranks",
    "collective_skew",
    "kernels_across_ranks",
    "rank_summary",
    "match_collectives",
    "rank_candidates",
    "rank_from_environment",
    "rank_from_file_name",
    "skew_by_op",
    "skew_by_rank",
]

#: Environment variables that hold a process's global rank, in order; ``LOCAL_RANK`` last.
RANK_ENV_VARS: tuple[str, ...] = (
    "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID", "MV2_COMM_WORLD_RANK",
    "LOCAL_RANK",
)
#: Candidate columns of :func:`rank_candidates`, in precedence order, and their labels.
RANK_SOURCES: tuple[tuple[str, str], ...] = (
    ("rank_nccl", "nccl"),
    ("rank_env", "env"),
    ("rank_file", "file_name"),
    ("rank_device", "device_order"),
)
_FILE_RANK = re.compile(r"(?:^|[^a-z])(?:rank|r)[_\-.]?(\d+)", re.IGNORECASE)

P2P_OPS: tuple[str, ...] = ("Send", "Recv")


# -- which rank ---------------------------------------------------------------------------------
def rank_from_environment(environments: Sequence[Mapping[str, str]]) -> tuple[int | None, str | None]:
    """``(rank, "env:<NAME>")`` from captured process environments, or ``(None, None)``.

    The first variable of :data:`RANK_ENV_VARS` that holds one integer value across the
    captured processes wins.
    """
    for name in RANK_ENV_VARS:
        values = {env[name].strip() for env in environments if name in env}
        if len(values) == 1:
            (value,) = values
            if value.lstrip("-").isdigit():
                return int(value), f"env:{name}"
    return None, None


def rank_from_file_name(name: str | None) -> int | None:
    """The rank written in a report's file name as an explicit token (``…_rank3.sqlite``,
    ``rank_3``, ``r3`` → 3), else None: a bare number (``nsys2022.4_x``, ``node3_gpu5``) is not
    a rank."""
    if not name:
        return None
    stem = name.split("/")[-1]
    for suffix in (".sqlite", ".nsys-rep", ".qdrep"):
        stem = stem.removesuffix(suffix)
    hits = _FILE_RANK.findall(stem)
    return int(hits[-1]) if hits else None


def rank_candidates(
    processes: pl.DataFrame,
    comm_inits: pl.DataFrame | None = None,
    *,
    environments: Sequence[Mapping[str, str]] = (),
    file_name: str | None = None,
) -> pl.DataFrame:
    """Candidate ranks of the rank processes of one report, one column per source.

    Parameters
    ----------
    processes
        One row per rank process: ``pid`` and ``device_id`` (lowest CUDA device it used,
        null when unknown).
    comm_inits
        Decoded ``ncclCommInitRank*`` payloads: ``pid``, ``comm_nranks``, ``comm_rank``
        (optional).
    environments
        The captured processes' environments (``TraceMeta.processes[i].environment``).
    file_name
        The report's file name.

    Returns
    -------
    ``pid``, ``device_id``, ``rank_nccl``, ``rank_env``, ``env_var``, ``rank_file``,
    ``rank_device`` (Int64; null where the source says nothing). ``rank_env`` and
    ``rank_file`` are set only when the report holds one rank process.
    """
    procs = processes.select(pl.col("pid").cast(pl.Int64), pl.col("device_id").cast(pl.Int64)).unique(
        subset=["pid"], keep="first", maintain_order=True
    )
    procs = procs.sort(["device_id", "pid"], nulls_last=True).with_columns(
        pl.int_range(pl.len(), dtype=pl.Int64).alias("rank_device")
    )
    if comm_inits is not None and comm_inits.height:
        best = (
            comm_inits.filter(pl.col("comm_rank").is_not_null())
            .sort(["pid", "comm_nranks"], descending=[False, True], nulls_last=True)
            .unique(subset=["pid"], keep="first", maintain_order=True)
            .select(pl.col("pid").cast(pl.Int64), pl.col("comm_rank").cast(pl.Int64).alias("rank_nccl"))
        )
        procs = procs.join(best, on="pid", how="left", maintain_order="left")
    else:
        procs = procs.with_columns(pl.lit(None, pl.Int64).alias("rank_nccl"))
    single = procs.height == 1
    env_rank, env_var = rank_from_environment(environments) if single else (None, None)
    file_rank = rank_from_file_name(file_name) if single else None
    procs = procs.with_columns(
        pl.lit(env_rank, pl.Int64).alias("rank_env"),
        pl.lit(env_var, pl.Utf8).alias("env_var"),
        pl.lit(file_rank, pl.Int64).alias("rank_file"),
    )
    if single:  # one process: "device order" says nothing about the global rank
        procs = procs.with_columns(pl.lit(None, pl.Int64).alias("rank_device"))
    return procs.select("pid", "device_id", "rank_nccl", "rank_env", "env_var", "rank_file", "rank_device")


def choose_ranks(candidates: pl.DataFrame, *, keys: Sequence[str] = ()) -> tuple[pl.DataFrame, list[str]]:
    """Pick one unique rank per process from :func:`rank_candidates` rows.

    ``keys`` identify a process together with ``pid`` (``["report"]`` for a set of reports;
    row order is the fallback order). Returns the candidates with ``rank`` and
    ``rank_source`` added, and a list of notes (why a fallback was taken).
    """
    notes: list[str] = []
    c = candidates.with_row_index("_ord")
    per_row = pl.coalesce([pl.col(col) for col, _ in RANK_SOURCES])
    label = pl.lit(None, pl.Utf8)
    for col, name in reversed(RANK_SOURCES):
        src = pl.col("env_var") if col == "rank_env" else pl.lit(name)
        label = pl.when(pl.col(col).is_not_null()).then(src).otherwise(label)
    c = c.with_columns(per_row.alias("rank"), label.alias("rank_source"))
    if _unique_complete(c["rank"]):
        return c.drop("_ord"), notes
    for col, name in RANK_SOURCES:
        if _unique_complete(c[col]):
            src = pl.col("env_var") if col == "rank_env" else pl.lit(name)
            notes.append(f"per-process ranks collide or are missing; using {name} ranks for every process")
            return c.with_columns(pl.col(col).alias("rank"), src.alias("rank_source")).drop("_ord"), notes
    notes.append("no rank source is complete and unique; ranks numbered in report/device/pid order")
    ordered = c.sort([*keys, "device_id", "pid", "_ord"], nulls_last=True) if keys else c.sort(["device_id", "pid", "_ord"], nulls_last=True)
    ordered = ordered.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias("rank"), pl.lit("order").alias("rank_source"))
    return ordered.sort("_ord").drop("_ord"), notes


def _unique_complete(s: pl.Series) -> bool:
    return s.len() > 0 and s.null_count() == 0 and s.n_unique() == s.len()


# -- matching ----------------------------------------------------------------------------------
def _time_cols(nccl: pl.DataFrame) -> tuple[pl.Expr, pl.Expr]:
    start = pl.coalesce(pl.col("gpu_start_ns"), pl.col("host_start_ns"))
    end = pl.coalesce(pl.col("gpu_end_ns"), pl.col("host_end_ns"))
    return start, end


#: The NCCL table's columns :func:`match_collectives` reads (``report`` when present): a
#: caller that needs only the matching (:func:`collective_skew`) can pass these alone, not
#: the table's 40 columns that each step would carry and the last sort copy.
MATCH_COLUMNS = ("report", "rank", "pid", "op", "comm_id", "comm_rank", "comm_nranks", "peer", "group_id", "call_index",
                 "host_start_ns", "host_end_ns", "gpu_start_ns", "gpu_end_ns", "bytes", "size_source")


def match_collectives(nccl: pl.DataFrame) -> pl.DataFrame:
    """Pair the n-th call of each communicator across ranks.

    Parameters
    ----------
    nccl
        An NCCL calls table (``NsysTrace.nccl``, or ``TraceSet.nccl`` with reports aligned on
        one clock): ``rank``, ``op``, ``comm_id``, ``peer``, ``group_id``, ``host_start_ns``,
        ``host_end_ns``, ``gpu_start_ns``, ``gpu_end_ns``; ``report`` when present.

    Returns
    -------
    The calls (those with a rank) in (rank, time) order, plus:

    ``match_basis``
        ``"comm"`` (communicator id from the payload) or ``"op_order"`` (no payload: calls
        keyed by op and order, Send/Recv together; exact only when each op runs on one
        communicator).
    ``seq``
        the n-th launch unit (a call, or all calls of an ``ncclGroupStart/End`` group on the
        same communicator) of this rank on the communicator; p2p calls count per rank pair.
    ``match_id``
        one id per matched collective (same for the matching call of every rank).
    ``match_ranks``
        ranks that took part; ``expected_ranks`` (``comm_nranks``, or 2 for p2p) and
        ``complete``.
    ``time_base``
        ``"gpu"`` (kernel starts, when every rank has one) or ``"host"``; ``start_ns``/``end_ns``
        are the times on that base.
    ``first_start_ns``, ``last_start_ns``, ``first_end_ns``, ``last_end_ns``
        over the ranks of the match; ``skew_ns`` = last − first start.
    ``wait_ns``
        last start − this rank's start: how long this rank waited for the last one to arrive.
    ``straggler_rank``, ``is_straggler``
        the rank that started last (lowest rank on ties).

    A call without a size (its report was exported without payload blobs) takes the size of
    the matching calls of the other ranks, with ``size_source == "inferred"``.
    """
    if "rank" not in nccl.columns:
        msg = "the NCCL table has no rank column; use NsysTrace.nccl or TraceSet.nccl"
        raise ValueError(msg)
    keys = ["report"] if "report" in nccl.columns else []
    calls = nccl.filter(pl.col("rank").is_not_null() & pl.col("op").is_not_null())
    start, end = _time_cols(calls)
    calls = calls.with_columns(
        start.alias("_start"),
        end.alias("_end"),
        pl.col("op").is_in(list(P2P_OPS)).alias("_p2p"),
    )
    has_comm = pl.col("comm_id").is_not_null()
    # p2p: the communicator-local pair {me, peer}; my communicator rank is the payload's when
    # captured, else the global rank (PyTorch's p2p runs on the world or a 2-rank pair comm)
    me = pl.coalesce(pl.col("comm_rank"), pl.col("rank"))
    lo = pl.min_horizontal(me, pl.col("peer"))
    hi = pl.max_horizontal(me, pl.col("peer"))
    op_class = pl.when(pl.col("_p2p")).then(pl.lit("SendRecv")).otherwise(pl.col("op"))
    calls = calls.with_columns(
        pl.when(has_comm).then(pl.lit("comm")).otherwise(pl.lit("op_order")).alias("match_basis"),
        pl.when(pl.col("_p2p") & pl.col("peer").is_not_null()).then(lo).alias("_lo"),
        pl.when(pl.col("_p2p") & pl.col("peer").is_not_null()).then(hi).alias("_hi"),
        op_class.alias("_class"),
        # launch unit: the group for grouped calls, the call otherwise (a key only: odd for a
        # group, even for a call, not a text per call)
        pl.when(pl.col("group_id").is_not_null())
        .then(pl.col("group_id").cast(pl.Int64) * 2 + 1)
        .otherwise(pl.col("call_index").cast(pl.Int64) * 2)
        .alias("_unit"),
    )
    stream = [
        pl.when(pl.col("match_basis") == "comm").then(pl.col("comm_id").cast(pl.Utf8)).otherwise(pl.col("_class")),
        pl.when(pl.col("_p2p")).then(pl.lit("p2p")).otherwise(pl.lit("coll")),
        pl.col("_lo").cast(pl.Utf8).fill_null(""),
        pl.col("_hi").cast(pl.Utf8).fill_null(""),
    ]
    # each stream's text ("comm|coll|lo|hi") made for the distinct streams only (a few), and
    # its rank among them kept per call: equal texts, equal codes, in the texts' order (the
    # match ids break ties by it)
    parts = ["match_basis", "comm_id", "_class", "_p2p", "_lo", "_hi"]
    streams = calls.select(parts).unique().with_columns(pl.concat_str(stream, separator="|").alias("_text"))
    streams = streams.with_columns(pl.col("_text").rank("dense").cast(pl.Int64).alias("_stream")).drop("_text")
    calls = calls.join(streams, on=parts, how="left", maintain_order="left", nulls_equal=True)
    units = (
        calls.group_by([*keys, "rank", "pid", "_stream", "_unit"])
        .agg(pl.col("_start").min().alias("_ustart"), pl.col("host_start_ns").min().alias("_uhost"))
        .sort([*keys, "rank", "pid", "_stream", "_uhost", "_ustart"])
        .with_columns(pl.int_range(pl.len(), dtype=pl.Int64).over([*keys, "rank", "pid", "_stream"]).alias("seq"))
    )
    calls = calls.join(units.select(*keys, "rank", "pid", "_stream", "_unit", "seq"),
                       on=[*keys, "rank", "pid", "_stream", "_unit"], how="left", maintain_order="left")
    per_rank = calls.group_by("_stream", "seq", "rank").agg(
        pl.col("_start").min().alias("_rstart"),
        pl.col("_end").max().alias("_rend"),
        pl.col("gpu_start_ns").null_count().alias("_nogpu"),
    )
    # time base per match: GPU when every rank has a kernel start
    base = per_rank.group_by("_stream", "seq").agg((pl.col("_nogpu") == 0).all().alias("_gpu"))
    host = calls.group_by("_stream", "seq", "rank").agg(
        pl.col("host_start_ns").min().alias("_hstart"), pl.col("host_end_ns").max().alias("_hend")
    )
    per_rank = per_rank.join(host, on=["_stream", "seq", "rank"]).join(base, on=["_stream", "seq"])
    per_rank = per_rank.with_columns(
        pl.when(pl.col("_gpu")).then(pl.col("_rstart")).otherwise(pl.col("_hstart")).alias("start_ns"),
        pl.when(pl.col("_gpu")).then(pl.col("_rend")).otherwise(pl.col("_hend")).alias("end_ns"),
    )
    last = pl.col("start_ns").max().over("_stream", "seq")
    per_rank = per_rank.with_columns(
        pl.len().over("_stream", "seq").cast(pl.Int64).alias("match_ranks"),
        pl.col("start_ns").min().over("_stream", "seq").alias("first_start_ns"),
        last.alias("last_start_ns"),
        pl.col("end_ns").min().over("_stream", "seq").alias("first_end_ns"),
        pl.col("end_ns").max().over("_stream", "seq").alias("last_end_ns"),
        (last - pl.col("start_ns")).alias("wait_ns"),
        pl.when(pl.col("_gpu")).then(pl.lit("gpu")).otherwise(pl.lit("host")).alias("time_base"),
    )
    straggler = (
        per_rank.sort(["_stream", "seq", "start_ns", "rank"], descending=[False, False, True, False])
        .unique(subset=["_stream", "seq"], keep="first", maintain_order=True)
        .select("_stream", "seq", pl.col("rank").alias("straggler_rank"))
    )
    ids = (
        per_rank.group_by("_stream", "seq").agg(pl.col("first_start_ns").first())
        .sort("first_start_ns", "_stream", "seq")
        .with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias("match_id"))
        .drop("first_start_ns")
    )
    per_rank = per_rank.join(straggler, on=["_stream", "seq"]).join(ids, on=["_stream", "seq"])
    per_rank = per_rank.with_columns((pl.col("rank") == pl.col("straggler_rank")).alias("is_straggler"))
    out = calls.join(
        per_rank.select("_stream", "seq", "rank", "match_id", "match_ranks", "time_base", "start_ns", "end_ns",
                        "first_start_ns", "last_start_ns", "first_end_ns", "last_end_ns", "wait_ns",
                        "straggler_rank", "is_straggler"),
        on=["_stream", "seq", "rank"], how="left", maintain_order="left",
    )
    expected = (
        pl.when(pl.col("_p2p") & (pl.col("_lo") == pl.col("_hi"))).then(pl.lit(1, pl.Int64))  # to itself
        .when(pl.col("_p2p")).then(pl.lit(2, pl.Int64))
        .otherwise(pl.col("comm_nranks"))
    )
    out = out.with_columns(
        expected.alias("expected_ranks"),
        (pl.col("last_start_ns") - pl.col("first_start_ns")).alias("skew_ns"),
    ).with_columns(
        pl.when(pl.col("expected_ranks").is_not_null())
        .then(pl.col("match_ranks") == pl.col("expected_ranks"))
        .alias("complete")
    )
    # a rank exported without payload blobs takes the size its peers' payloads give
    peer_size = pl.col("bytes").max().over("match_id")
    out = out.with_columns(
        pl.when(pl.col("bytes").is_null() & peer_size.is_not_null()).then(pl.lit("inferred"))
        .otherwise(pl.col("size_source")).alias("size_source"),
        pl.coalesce(pl.col("bytes"), peer_size).alias("bytes"),
    )
    return out.drop("_start", "_end", "_p2p", "_lo", "_hi", "_class", "_unit", "_stream").sort(
        [*keys, "rank", "match_id", "call_index"]
    )


def collective_skew(matched: pl.DataFrame) -> pl.DataFrame:
    """One row per matched collective from :func:`match_collectives`.

    Returns ``match_id``, ``op`` (``Send/Recv`` for p2p pairs), ``comm_id``, ``seq``,
    ``bytes`` (largest message size of the match), ``match_ranks``, ``expected_ranks``,
    ``complete``, ``time_base``, ``first_start_ns``, ``last_start_ns``, ``skew_ns``,
    ``straggler_rank``, ``max_wait_ns``, ``mean_wait_ns`` (over the ranks), ``first_end_ns``,
    ``last_end_ns``, ``sync_duration_ns`` (first end − last start: the part every rank spent
    together, what the transfer itself took at most) and ``duration_ns`` (last end − first
    start).
    """
    per_rank = matched.unique(subset=["match_id", "rank"], keep="first", maintain_order=True)
    # each match's distinct ops, sorted, joined: from the distinct (match, op) pairs, not a
    # list of ops per match (150 k calls: ~60 MB of per-group lists)
    ops = (
        matched.select("match_id", "op").unique().sort("match_id", "op")
        .group_by("match_id", maintain_order=True).agg(pl.col("op").str.join("/"))
    )
    out = per_rank.group_by("match_id").agg(
        pl.col("comm_id").first(),
        pl.col("seq").first(),
        pl.col("match_basis").first(),
        pl.col("match_ranks").first(),
        pl.col("expected_ranks").first(),
        pl.col("complete").first(),
        pl.col("time_base").first(),
        pl.col("first_start_ns").first(),
        pl.col("last_start_ns").first(),
        pl.col("skew_ns").first(),
        pl.col("straggler_rank").first(),
        pl.col("wait_ns").max().alias("max_wait_ns"),
        pl.col("wait_ns").mean().alias("mean_wait_ns"),
        pl.col("first_end_ns").first(),
        pl.col("last_end_ns").first(),
    )
    size = matched.group_by("match_id").agg(pl.col("bytes").max())
    out = out.join(ops, on="match_id").join(size, on="match_id").with_columns(
        (pl.col("first_end_ns") - pl.col("last_start_ns")).alias("sync_duration_ns"),
        (pl.col("last_end_ns") - pl.col("first_start_ns")).alias("duration_ns"),
    )
    return out.select(
        "match_id", "op", "comm_id", "seq", "match_basis", "bytes", "match_ranks", "expected_ranks", "complete",
        "time_base", "first_start_ns", "last_start_ns", "skew_ns", "straggler_rank", "max_wait_ns",
        "mean_wait_ns", "first_end_ns", "last_end_ns", "sync_duration_ns", "duration_ns",
    ).sort("match_id")


def skew_by_op(matched: pl.DataFrame) -> pl.DataFrame:
    """Skew per op: ``op``, ``collectives``, ``median_skew_ns``, ``p95_skew_ns``, ``max_skew_ns``,
    ``total_wait_ns`` (summed over ranks and collectives), ``incomplete`` (matches missing a
    rank)."""
    per = collective_skew(matched)
    return (
        per.group_by("op")
        .agg(
            pl.len().alias("collectives"),
            pl.col("skew_ns").median().alias("median_skew_ns"),
            pl.col("skew_ns").quantile(0.95, "nearest").alias("p95_skew_ns"),
            pl.col("skew_ns").max().alias("max_skew_ns"),
            (pl.col("mean_wait_ns") * pl.col("match_ranks")).sum().round(0).cast(pl.Int64).alias("total_wait_ns"),
            (~pl.col("complete").fill_null(True)).sum().alias("incomplete"),
        )
        .sort("total_wait_ns", descending=True)
    )


def skew_by_rank(matched: pl.DataFrame) -> pl.DataFrame:
    """Per rank: ``rank``, ``collectives``, ``total_wait_ns``, ``mean_wait_ns``, ``straggler_count``
    (how often it started last), ``straggler_share`` (0–1)."""
    per_rank = matched.unique(subset=["match_id", "rank"], keep="first", maintain_order=True)
    return (
        per_rank.group_by("rank")
        .agg(
            pl.len().alias("collectives"),
            pl.col("wait_ns").sum().alias("total_wait_ns"),
            pl.col("wait_ns").mean().alias("mean_wait_ns"),
            (pl.col("is_straggler") & (pl.col("match_ranks") > 1)).sum().alias("straggler_count"),
        )
        .with_columns((pl.col("straggler_count") / pl.col("collectives")).alias("straggler_share"))
        .sort("rank")
    )


def kernels_across_ranks(kernel_summary: pl.DataFrame) -> pl.DataFrame:
    """Per kernel function over the ranks.

    Parameters
    ----------
    kernel_summary
        Per rank and kernel: ``rank``, ``short_name``, ``kernels``, ``total_ns``
        (:func:`tracekit.scale.reduce.reductions_of`'s ``kernel_summary``).

    Returns
    -------
    ``short_name``, ``ranks`` (how many ran it), ``kernels``, ``total_ns`` and the spread of
    the per-rank totals ``min_rank_ns``, ``max_rank_ns``, ``mean_rank_ns`` (ns); largest total
    first.
    """
    per_rank = kernel_summary.group_by("rank", "short_name").agg(pl.col("kernels").sum(), pl.col("total_ns").sum())
    return per_rank.group_by("short_name").agg(
        pl.col("rank").n_unique().alias("ranks"), pl.col("kernels").sum(), pl.col("total_ns").sum(),
        pl.col("total_ns").min().alias("min_rank_ns"), pl.col("total_ns").max().alias("max_rank_ns"),
        pl.col("total_ns").mean().alias("mean_rank_ns"),
    ).sort(["total_ns", "short_name"], descending=[True, False])


def rank_summary(
    kernel_summary: pl.DataFrame,
    busy: pl.DataFrame,
    overlap: pl.DataFrame | None = None,
    iterations: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """One row per rank: what ``tracekit summary`` says of each report of a multi-rank job.

    Parameters
    ----------
    kernel_summary, busy, overlap, iterations
        The per-rank reductions (:func:`tracekit.scale.reduce.reductions_of` of a
        :class:`~tracekit.multi.TraceSet`, or a :class:`~tracekit.scale.reduced.ReducedSet`'s
        tables): kernels per name, :func:`~tracekit.analysis.gpu_time.busy_time`,
        :func:`~tracekit.analysis.comm.overlap_breakdown` and
        :func:`~tracekit.analysis.run.iterations.iterations`, each with a ``rank`` column.

    Returns
    -------
    ``rank``, ``devices`` (how many GPUs it used), ``kernels``, ``gpu_time_ns`` (summed kernel
    durations), ``busy_share`` (busy ÷ span over its GPUs, 0–1), ``communication_ns`` and
    ``exposed_comm_ns`` (communication not overlapped by compute; null without ``overlap``),
    ``steps`` and ``median_step_ns`` (NVTX iterations; null without), ``top_kernel`` and
    ``top_kernel_share`` (of its kernel time). Sorted by rank.
    """
    k = kernel_summary.group_by("rank").agg(
        pl.col("kernels").sum().cast(pl.Int64), pl.col("total_ns").sum().alias("gpu_time_ns"))
    top = (kernel_summary.group_by("rank", "short_name").agg(pl.col("total_ns").sum())
           .sort(["rank", "total_ns", "short_name"], descending=[False, True, False])
           .group_by("rank", maintain_order=True).first()
           .select("rank", pl.col("short_name").alias("top_kernel"), pl.col("total_ns").alias("_top")))
    b = busy.group_by("rank").agg(pl.col("device_id").n_unique().cast(pl.Int64).alias("devices"),
                                  (pl.col("busy_ns").sum() / pl.col("span_ns").sum()).alias("busy_share"))
    out = b.join(k, on="rank", how="full", coalesce=True).join(top, on="rank", how="left")
    if overlap is not None and overlap.height:
        out = out.join(overlap.group_by("rank").agg(pl.col("communication_ns").sum(), pl.col("exposed_comm_ns").sum()),
                       on="rank", how="left")
    else:
        out = out.with_columns(pl.lit(None, pl.Int64).alias("communication_ns"), pl.lit(None, pl.Int64).alias("exposed_comm_ns"))
    if iterations is not None and iterations.height:
        out = out.join(iterations.group_by("rank").agg(pl.len().cast(pl.Int64).alias("steps"),
                                                       pl.col("duration_ns").median().alias("median_step_ns")), on="rank", how="left")
    else:
        out = out.with_columns(pl.lit(None, pl.Int64).alias("steps"), pl.lit(None, pl.Float64).alias("median_step_ns"))
    return out.with_columns((pl.col("_top") / pl.col("gpu_time_ns")).alias("top_kernel_share")).select(
        "rank", "devices", "kernels", "gpu_time_ns", "busy_share", "communication_ns", "exposed_comm_ns", "steps",
        "median_step_ns", "top_kernel", "top_kernel_share").sort("rank")
