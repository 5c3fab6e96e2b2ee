"""The nsys → ncu handoff of mode ``nsys+ncu``: one ncu pass per top kernel, and what each got.

One ncu run with ``-k regex:^(?:a|b|c)$ --launch-count N`` profiles the first N launches that
match any of the names, so the most frequent kernel can take them all. ncu has a single kernel
filter and one launch count per run (``--filter-mode per-launch-config`` counts per grid/block
shape, not per kernel), so the handoff runs the program once per kernel:
``--kernel-name-base function -k regex:^name$ [--launch-skip S] --launch-count C``, each pass
writing ``<output_name>_k<i>.ncu-rep``. Every pass collects at least the ``kernel-drilldown``
sections (SOL, rooflines including the tensor roofline, compute and memory workload, occupancy,
launch statistics), the half-precision roofline and the DRAM byte counters, so tracekit's
Tensor Core, DRAM, SOL and roofline views have every column.

After the passes, :func:`profiled_launches` reads each report's ``kernels`` table back and
:func:`launch_records` says how many launches of each requested kernel were profiled; a
kernel with none makes the capture ``partial``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracekit.capture import commands as cmds
from tracekit.capture.config import DRILLDOWN_SECTIONS
from tracekit.capture.options import Experiment, NcuOptions
from tracekit.errors import CaptureError

if TYPE_CHECKING:
    import polars as pl

__all__ = [
    "HANDOFF_SECTIONS",
    "LAUNCHES_PER_KERNEL",
    "HandoffPass",
    "dram_byte_metrics",
    "gpu_compute_capability",
    "handoff_passes",
    "launch_records",
    "missing_kernels",
    "profiled_launches",
    "top_kernels",
]

LAUNCHES_PER_KERNEL = 3
"""Launches profiled per handed-over kernel when no ``launch_count`` is given."""

HANDOFF_SECTIONS = (*DRILLDOWN_SECTIONS, "SpeedOfLight_HierarchicalHalfRooflineChart")
"""Every pass collects at least these: the ``kernel-drilldown`` preset's sections, plus the
half-precision roofline (the FP16 SIMT counters behind the roofline view's ``simt_fp16_flop``)."""


@dataclass(frozen=True)
class HandoffPass:
    """One ncu run of the handoff.

    Attributes
    ----------
    index
        1-based pass number (the step is ``ncu-<index>``, the report ``<output_name>_k<index>``).
    kernel
        The kernel function name the pass profiles (``None`` when the user gave the filter).
    options
        The complete ncu options of this pass.
    nsys_launches, nsys_total_ns
        Launches of this kernel and their summed duration (ns) in the nsys capture.
    """

    index: int
    kernel: str | None
    options: NcuOptions
    nsys_launches: int | None = None
    nsys_total_ns: int | None = None

    @property
    def step(self) -> str:
        """The step (log) name of this pass."""
        return f"ncu-{self.index}"


def top_kernels(
    kernel_frames: Sequence[pl.DataFrame], nsys_summary: Mapping[str, Any], top_n: int
) -> list[dict[str, Any]]:
    """The ``top_n`` kernel functions by total GPU time: ``name``, ``launches``, ``total_ns``.

    Ranked over the nsys ``kernels`` tables (``short_name``: the function name ncu's default
    ``--kernel-name-base function`` matches; template variants together), or, without tables,
    over the summary's ``top_kernels``.
    """
    if kernel_frames:
        import polars as pl

        frame = pl.concat(list(kernel_frames), how="diagonal_relaxed")
        if "duration_ns" not in frame.columns:
            frame = frame.with_columns(duration_ns=pl.col("end_ns") - pl.col("start_ns"))
        key = pl.col("name").map_elements(cmds.kernel_function_name, return_dtype=pl.Utf8)
        if "short_name" in frame.columns:
            key = pl.coalesce(pl.col("short_name"), key)
        ranked = (
            frame.group_by(key.alias("kernel"))
            .agg(pl.len().alias("launches"), pl.col("duration_ns").sum().alias("total_ns"))
            .filter(pl.col("kernel").is_not_null() & (pl.col("kernel") != ""))
            .sort(["total_ns", "kernel"], descending=[True, False])
            .head(top_n)
        )
        return [
            {
                "name": r["kernel"],
                "launches": int(r["launches"]),
                "total_ns": int(r["total_ns"] or 0),
            }
            for r in ranked.iter_rows(named=True)
        ]
    merged: dict[str, dict[str, Any]] = {}
    for k in nsys_summary.get("top_kernels") or []:
        name = cmds.kernel_function_name(k.get("short_name") or k["name"])
        entry = merged.setdefault(name, {"name": name, "launches": 0, "total_ns": 0})
        entry["launches"] += int(k.get("count") or 0)
        entry["total_ns"] += int(k.get("total_ns") or 0)
    return sorted(merged.values(), key=lambda k: (-k["total_ns"], k["name"]))[:top_n]


def dram_byte_metrics(compute_capability: str | None) -> tuple[str, ...]:
    """The DRAM read/write byte counters of a chip (no section collects them).

    ``dram__bytes_op_read.sum`` / ``…_op_write.sum`` on compute capability 12.x (GB20x),
    ``dram__bytes_read.sum`` / ``dram__bytes_write.sum`` everywhere else (an unknown metric
    name aborts ncu, so the chip decides).

    Examples
    --------
    >>> dram_byte_metrics("9.0")
    ('dram__bytes_read.sum', 'dram__bytes_write.sum')
    >>> dram_byte_metrics("12.0")
    ('dram__bytes_op_read.sum', 'dram__bytes_op_write.sum')
    """
    if compute_capability and compute_capability.split(".")[0] == "12":
        return ("dram__bytes_op_read.sum", "dram__bytes_op_write.sum")
    return ("dram__bytes_read.sum", "dram__bytes_write.sum")


def gpu_compute_capability(reports: Iterable[Path]) -> str | None:
    """The compute capability (``"9.0"``) of the first GPU in the first readable nsys export."""
    for path in reports:
        try:
            import tracekit

            gpus = getattr(tracekit.open(path), "gpus", None)
        except Exception:  # optional: the default counter names are used without it
            continue
        if gpus is None:
            continue
        column = gpus["compute_capability"] if "compute_capability" in gpus.columns else []
        values = [v for v in column if v]
        if values:
            return str(values[0])
    return None


def _with_drilldown(opts: NcuOptions, dram_metrics: Sequence[str]) -> NcuOptions:
    """``opts`` plus every drill-down section and the DRAM byte counters it lacks; no SASS
    unless asked for (it makes reports several times larger)."""
    sections = tuple(dict.fromkeys([*opts.sections, *HANDOFF_SECTIONS]))
    metrics = tuple(dict.fromkeys([*opts.metrics, *dram_metrics]))
    import_sass = False if opts.import_sass is None else opts.import_sass
    return dataclasses.replace(opts, sections=sections, metrics=metrics, import_sass=import_sass)


def handoff_passes(
    exp: Experiment,
    nsys_summary: Mapping[str, Any],
    kernel_frames: Sequence[pl.DataFrame],
    *,
    compute_capability: str | None = None,
    info: dict[str, Any] | None = None,
) -> list[HandoffPass]:
    """The ncu passes of mode ``nsys+ncu``: one per top kernel that nsys found.

    Parameters
    ----------
    exp
        The experiment; ``exp.ncu`` gives every other ncu option (sections and metrics are
        extended, never dropped), ``exp.top_n`` the number of kernels.
    nsys_summary, kernel_frames
        What the nsys step left: its summary and the ``kernels`` tables it read (``short_name``
        or ``name``, ``duration_ns`` (ns) or ``start_ns``/``end_ns``).
    compute_capability
        Of the profiled GPU (``"9.0"``), to name the DRAM byte counters; ``None``: the common names.
    info
        Receives what was decided: ``kernels`` (name, nsys launches, total ns), ``launch_count``
        and ``launch_skip`` per pass, ``sections``, ``metrics``, ``source``.

    Returns
    -------
    list[HandoffPass]
        One pass per kernel with ``--kernel-name-base function``, ``-k regex:^name$``, the
        user's ``--launch-skip`` (if any) and ``--launch-count`` (the user's, else
        :data:`LAUNCHES_PER_KERNEL`); a single pass with the user's filter when ``exp.ncu``
        has a kernel name or id.

    Raises
    ------
    CaptureError
        nsys found no kernels.
    """
    info = {} if info is None else info
    opts = _with_drilldown(exp.ncu, dram_byte_metrics(compute_capability))
    info.update(top_n=exp.top_n, sections=list(opts.sections), metrics=list(opts.metrics))
    if opts.kernel_name or opts.kernel_id:
        info.update(source="user", kernel_name=opts.kernel_name, kernel_id=opts.kernel_id)
        return [
            HandoffPass(1, None, dataclasses.replace(opts, output_name=f"{opts.output_name}_k1"))
        ]
    top = top_kernels(kernel_frames, nsys_summary, exp.top_n)
    if not top:
        msg = (
            "the nsys step found no kernels to hand to ncu; check the capture range, "
            "or run mode 'ncu' with a kernel filter"
        )
        raise CaptureError(msg)
    count = opts.launch_count or LAUNCHES_PER_KERNEL
    info.update(source="nsys", launch_count=count, launch_skip=opts.launch_skip, kernels=top)
    passes = []
    for index, kernel in enumerate(top, start=1):
        pass_opts = dataclasses.replace(
            opts,
            kernel_name=f"regex:^{re.escape(kernel['name'])}$",
            kernel_name_base="function",
            launch_count=count,
            output_name=f"{opts.output_name}_k{index}",
        )
        passes.append(
            HandoffPass(index, kernel["name"], pass_opts, kernel["launches"], kernel["total_ns"])
        )
    return passes


def profiled_launches(reports: Iterable[Path]) -> dict[str, int]:
    """Launches per kernel function name (ncu ``short_name``) over ncu reports.

    Reads each report's ``kernels`` table with :class:`tracekit.ncu.report.NcuReport`.

    Raises
    ------
    TracekitError
        A report cannot be read (missing, truncated, not an ncu report).
    """
    from tracekit.ncu.report import NcuReport

    counts: dict[str, int] = {}
    for path in reports:
        with NcuReport.from_path(path) as report:
            for name in report.kernels["short_name"].to_list():
                counts[name] = counts.get(name, 0) + 1
    return counts


def launch_records(
    passes: Sequence[HandoffPass], reports_by_pass: Mapping[int, Sequence[Path]]
) -> list[dict[str, Any]]:
    """Per pass: the kernel, launches asked for and seen by nsys, and launches profiled.

    Returns
    -------
    list[dict]
        ``pass``, ``kernel``, ``launch_skip``, ``launch_count`` (asked for), ``nsys_launches``,
        ``reports`` (file names), ``profiled_launches`` (of ``kernel`` in the pass's reports;
        all results when the user gave the filter; ``None`` when unreadable), ``other_kernels``
        (other names in those reports with their counts) and ``error`` (why unreadable).
    """
    records = []
    for p in passes:
        paths = list(reports_by_pass.get(p.index, []))
        record: dict[str, Any] = {
            "pass": p.index,
            "kernel": p.kernel,
            "launch_skip": p.options.launch_skip,
            "launch_count": p.options.launch_count,
            "nsys_launches": p.nsys_launches,
            "reports": [path.name for path in paths],
            "profiled_launches": 0,
            "other_kernels": {},
        }
        try:
            counts = profiled_launches(paths)
        except Exception as exc:  # recorded: the count is then unknown, not zero
            record.update(profiled_launches=None, error=f"{type(exc).__name__}: {exc}")
            records.append(record)
            continue
        if p.kernel is None:
            record["profiled_launches"] = sum(counts.values())
            record["other_kernels"] = counts
        else:
            record["profiled_launches"] = counts.pop(p.kernel, 0)
            record["other_kernels"] = counts
        records.append(record)
    return records


def missing_kernels(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """The requested kernels of which no launch was profiled (unreadable counts excluded)."""
    return [r["kernel"] for r in records if r.get("kernel") and r.get("profiled_launches") == 0]
