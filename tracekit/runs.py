"""Whether several Nsight Systems reports are the ranks of one run.

:func:`tracekit.open_many` stacks one report per rank (or node) into one set of tables and reads
them as one job. Reports of unrelated captures put in one folder were read that way too: four
exports of different programs became "training … on 5 ranks". Each report now carries a
:class:`RunIdentity` (what the export says about its capture: the program's command line, the
job's identity in the environment, the capture's wall-clock window, its ranks, host and GPUs),
and :func:`unrelated_reason` says, in one line naming the odd report, why a set is not one run.

Reports of one run agree on everything they both say. Two reports are **not** one run when

* a job identity both record differs (``SLURM_JOB_ID``, ``PMIX_NAMESPACE``, Open MPI's job id,
  ``TORCHELASTIC_RUN_ID`` unless ``none``, ``LSB_JOBID``, ``PBS_JOBID``, ``FLUX_JOB_ID``), or
  ``WORLD_SIZE`` does;
* they hold the same rank (from NCCL's ``ncclCommInitRank`` payload or ``RANK``-like
  environment variables), or they are the same capture twice (same session start, same
  process ids);
* without a shared job identity: their capture windows on the wall clock do not overlap
  (more than :data:`CLOCK_SLACK_NS` apart: two runs of one program, one after the other), or
  the captured command lines differ (rank arguments such as ``--local-rank=1`` or
  ``--node_rank 1`` left out), or they ran on the same GPU of the same host without ranks
  that tell them apart, or (when nothing else is recorded, as in exports of nsys ≤ 2021) they
  were captured by different nsys versions.

What the reports do not record is not held against them: exports without a session start, a
captured command or a host name are compared on what they have.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CLOCK_SLACK_NS", "JOB_KEYS", "RunIdentity", "require_one_run", "run_identity", "unrelated_reason"]

#: Environment variables that identify one job of a scheduler or launcher (equal in every rank).
JOB_KEYS: tuple[str, ...] = ("SLURM_JOB_ID", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid",
                             "TORCHELASTIC_RUN_ID", "LSB_JOBID", "PBS_JOBID", "FLUX_JOB_ID", "COBALT_JOBID")
#: Environment variables that give the job's number of ranks.
WORLD_KEYS: tuple[str, ...] = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "PMIX_SIZE")
#: How far apart (ns) two ranks' capture windows may be on the hosts' wall clocks and still be
#: one run: the clocks of several nodes differ by up to this much (NTP keeps them within ms).
CLOCK_SLACK_NS = 2_000_000_000
#: Command-line arguments that name a rank (they differ between the ranks of one run).
_RANK_ARG = re.compile(r"(?i)^--?[\w-]*rank[\w-]*(=.*)?$")


@dataclass(frozen=True)
class RunIdentity:
    """What one report says about the run it captured (picklable; built in the worker that
    reads the report).

    Attributes
    ----------
    path
        The report.
    command
        The captured program's command line, rank arguments left out (None: not recorded).
    job
        Job identities found in the captured environment (:data:`JOB_KEYS` → value).
    world_size
        Ranks of the job, from the environment (None: not recorded).
    start_utc_ns, end_utc_ns
        The capture window on the host's wall clock, UTC ns (None: no session start recorded).
    ranks
        Ranks of the report's rank processes that NCCL or the environment name.
    host
        The captured host's name (``TARGET_INFO_SYSTEM_ENV`` ``Hostname``).
    devices
        UUIDs (else PCI bus locations) of the GPUs the report's kernels ran on.
    pids
        Process ids that ran kernels.
    session_epoch_ns
        ``TARGET_INFO_SESSION_START_TIME`` (UTC ns of the report's timeline 0).
    nsys_version
        The nsys version that wrote the export.
    """

    path: Path
    command: tuple[str, ...] | None = None
    job: Mapping[str, str] = field(default_factory=dict)
    world_size: int | None = None
    start_utc_ns: int | None = None
    end_utc_ns: int | None = None
    ranks: frozenset[int] = frozenset()
    host: str | None = None
    devices: frozenset[str] = frozenset()
    pids: frozenset[int] = frozenset()
    session_epoch_ns: int | None = None
    nsys_version: str | None = None


def _command(parts: Sequence[str]) -> tuple[str, ...] | None:
    """``parts`` without the arguments that name a rank (``--local-rank=1``, ``--node_rank 1``)."""
    if not parts:
        return None
    out: list[str] = []
    skip = False
    for part in parts:
        if skip:
            skip = False
            if part.lstrip("-").isdigit():
                continue
        m = _RANK_ARG.match(part)
        if m:
            skip = m.group(1) is None  # ``--node_rank 1``: its value follows
            continue
        out.append(part)
    return tuple(out)


def run_identity(trace: Any, candidates: Any = None, *, path: Path | None = None) -> RunIdentity:
    """The :class:`RunIdentity` of an opened ``NsysTrace``; ``candidates`` are its rank
    candidates (:func:`tracekit.analysis.ranks.rank_candidates`: ``rank_nccl``, ``rank_env``),
    when known. Reads the metadata, the GPU list and the kernels' ``pid``/``device_id``."""
    import polars as pl

    meta = trace.meta
    environments = [p.environment for p in meta.processes]
    job: dict[str, str] = {}
    world: int | None = None
    for env in environments:
        for key in JOB_KEYS:
            value = env.get(key)
            if value and not (key == "TORCHELASTIC_RUN_ID" and value.lower() == "none"):
                job.setdefault(key, value)
        for key in WORLD_KEYS:
            if world is None and str(env.get(key, "")).strip().isdigit():
                world = int(env[key])
    command = _command(meta.processes[0].command) if meta.processes and meta.processes[0].command else None
    start = end = None
    if meta.session_epoch_ns is not None:
        lo = meta.start_ns if meta.start_ns is not None else 0
        hi = meta.end_ns if meta.end_ns is not None else (lo + meta.duration_ns if meta.duration_ns is not None else None)
        if hi is not None:
            start, end = meta.session_epoch_ns + lo, meta.session_epoch_ns + hi
    ranks: set[int] = set()
    if candidates is not None and candidates.height:
        # global ranks only: NCCL's, else the environment's (LOCAL_RANK repeats on every node)
        nccl = candidates["rank_nccl"].drop_nulls() if "rank_nccl" in candidates.columns else None
        if nccl is not None and nccl.len():
            ranks.update(int(r) for r in nccl.to_list())
        elif "rank_env" in candidates.columns:
            env = candidates.filter(pl.col("rank_env").is_not_null() & (pl.col("env_var") != "env:LOCAL_RANK"))
            ranks.update(int(r) for r in env["rank_env"].to_list())
    used = trace.table("kernels", ["pid", "device_id"]).select("pid", "device_id").unique()
    pids = frozenset(int(p) for p in used["pid"].drop_nulls().to_list())
    gpus = trace.gpus
    devices: set[str] = set()
    if gpus.height and used.height:
        named = gpus.select("device_id", pl.coalesce("uuid", "bus_location").alias("gpu")).drop_nulls()
        devices = {str(g) for g in used.join(named, on="device_id", how="inner")["gpu"].to_list()}
    host = meta.system.get("Hostname") or None
    return RunIdentity(path=Path(path or trace.path), command=command, job=job, world_size=world, start_utc_ns=start,
                       end_utc_ns=end, ranks=frozenset(ranks), host=host, devices=frozenset(devices), pids=pids,
                       session_epoch_ns=meta.session_epoch_ns, nsys_version=meta.version)


def _when(ns: int) -> str:
    return _dt.datetime.fromtimestamp(ns / 1e9, tz=_dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _gap(ns: int) -> str:
    s = ns / 1e9
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    if s < 172_800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86_400:.0f} days"


def _short(command: Sequence[str], limit: int = 60) -> str:
    text = " ".join(command)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _conflict(a: RunIdentity, b: RunIdentity) -> str | None:
    """Why ``b`` is not a rank of ``a``'s run, as a phrase naming them ``{a}`` and ``{b}``; or None."""
    shared_job = False
    for key in JOB_KEYS:
        if key in a.job and key in b.job:
            if a.job[key] != b.job[key]:
                return f"{{b}} belongs to job {key}={b.job[key]}, {{a}} to {a.job[key]}"
            shared_job = True
    if a.world_size is not None and b.world_size is not None and a.world_size != b.world_size:
        return f"{{b}} is one of {b.world_size} ranks (WORLD_SIZE), {{a}} one of {a.world_size}"
    if not shared_job:
        if None not in (a.start_utc_ns, a.end_utc_ns, b.start_utc_ns, b.end_utc_ns):
            gap = max(a.start_utc_ns, b.start_utc_ns) - min(a.end_utc_ns, b.end_utc_ns)  # type: ignore[type-var, operator]
            if gap > CLOCK_SLACK_NS:
                return (f"{{b}} was captured at {_when(b.start_utc_ns)}, {_gap(gap)} apart from {{a}} "  # type: ignore[arg-type]
                        f"({_when(a.start_utc_ns)})")  # type: ignore[arg-type]
        if a.command is not None and b.command is not None and a.command != b.command:
            return f"{{b}} ran `{_short(b.command)}`, {{a}} `{_short(a.command)}`"
    same_host = a.host is None or b.host is None or a.host == b.host
    if same_host and a.session_epoch_ns is not None and a.session_epoch_ns == b.session_epoch_ns and a.pids and a.pids == b.pids:
        return "{b} and {a} are the same capture (same session start, same processes)"
    both = a.ranks & b.ranks
    if both:
        return f"{{b}} and {{a}} both hold rank {min(both)}"
    if a.host is not None and a.host == b.host and a.devices and a.devices == b.devices and not (a.ranks and b.ranks):
        return f"{{b}} and {{a}} ran on the same GPU(s) of host {a.host}, with no rank to tell them apart"
    if shared_job:
        return None
    recorded = any(x is not None for x in (a.start_utc_ns, b.start_utc_ns, a.command, b.command))
    if not recorded and a.nsys_version and b.nsys_version and a.nsys_version != b.nsys_version:
        return f"{{b}} was captured by nsys {b.nsys_version}, {{a}} by nsys {a.nsys_version}"
    return None


def unrelated_reason(identities: Iterable[RunIdentity], *, where: str = "") -> str | None:
    """None when the reports are one run (see the module doc); else one line naming the report
    that does not belong (the one at odds with the largest group that agrees) and why."""
    ids = list(identities)
    if len(ids) < 2:
        return None
    conflicts = {(i, j): _conflict(ids[i], ids[j]) for i in range(len(ids)) for j in range(len(ids)) if i != j}
    if not any(conflicts.values()):
        return None
    agree = [sum(1 for j in range(len(ids)) if j != i and conflicts[(i, j)] is None) for i in range(len(ids))]
    ref = max(range(len(ids)), key=lambda i: (agree[i], -i))
    odd = next((j for j in range(len(ids)) if j != ref and conflicts[(ref, j)]), None)
    if odd is None:  # each agrees with the reference, not with each other
        ref, odd = next(k for k, v in conflicts.items() if v)
    others = len(ids) - 1 - agree[ref]
    reason = str(conflicts[(ref, odd)]).replace("{b}", ids[odd].path.name).replace("{a}", ids[ref].path.name)
    more = f"; {others} of the {len(ids)} reports differ from {ids[ref].path.name}" if others > 1 else ""
    head = f"{where}: " if where else ""
    return f"{head}the reports are not one run: {reason}{more}"


def require_one_run(trace: Any, what: str) -> None:
    """Raise :class:`~tracekit.errors.UnrelatedReportsError` (one line) when ``trace`` is a set
    of unrelated reports opened side by side (``open_many(..., allow_unrelated=True)``):
    ``what`` (an analysis) would read them as the ranks of one job."""
    reason = getattr(trace, "unrelated", None)
    if reason:
        from tracekit.errors import UnrelatedReportsError

        msg = (f"{what} reads several reports as the ranks of one run, and these are not ({reason}); "
               "look at each report on its own (TraceSet.open(i), or tracekit summary/diagnose --side-by-side)")
        raise UnrelatedReportsError(msg)
