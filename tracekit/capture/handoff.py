"""The nsys → ncu handoff of mode ``nsys+ncu``: one ncu pass per top kernel, and what each got.

One ncu run with ``-k regex:^(?:a|b|c)$ --launch-count N`` profiles the first N launches that
match any of the names, so the most frequent kernel can take them all. ncu has a single kernel
filter and one launch count per run (``--filter-mode per-launch-config`` counts per grid/block
shape, not per kernel), so the handoff runs the program once per kernel:
``--kernel-name-base mangled -k regex:^<mangled name>$ [--launch-skip S] --launch-count C`` — one
kernel *instantiation*, not every kernel sharing a function name — each pass writing
``<output_name>_k<i>.ncu-rep``. With an NVTX include/exclude the kernels are ranked by their GPU
time inside those ranges (the nsys projection ncu's filter means), not over the whole trace. Every pass collects at least the ``kernel-drilldown``
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
    "top_kernel_instances",
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
    #: The ncu ``kernels`` column ``kernel`` is compared with: ``mangled_name`` (the pass targets
    #: one instantiation by its mangled name), ``name`` (demangled) or ``short_name`` (function).
    match: str = "short_name"
    #: The kernel's function and demangled names (shown; ``kernel`` may be a mangled name).
    short_name: str | None = None
    demangled: str | None = None

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


#: The nsys kernel columns an NVTX-scoped ranking reads.
_SCOPE_COLUMNS = ["pid", "global_pid", "device_id", "correlation_id", "start_ns", "end_ns", "duration_ns",
                  "name", "short_name", "mangled_name"]


def _scoped_kernels(path: Path, includes: Sequence[str], excludes: Sequence[str], notes: list[str]) -> pl.DataFrame | None:
    """The kernels of the nsys export ``path`` launched inside the NVTX ``includes`` and
    outside the ``excludes`` (ncu's push/pop grammar evaluated on each kernel's NVTX path, the
    ranges that enclose its launching call: what ncu's filter sees); ``None`` when the export
    cannot be read. Expressions a push/pop path cannot decide (start/end ranges, ``regex:``,
    ``Domain@``) filter nothing and are named in ``notes``."""
    try:
        import polars as pl

        import tracekit
        from tracekit.analysis.attribution import NVTX_COLUMNS, attribute_nvtx, launch_info
        from tracekit.analysis.nsys_ncu import nvtx_include_matches

        trace: Any = tracekit.open(path)
        kernels = trace.table("kernels", _SCOPE_COLUMNS)
        api = trace.columns_on_demand("cuda_api", ["correlation_id", "global_tid", "name", "start_ns", "end_ns", "api"])
        att = attribute_nvtx(launch_info(kernels, api), trace.table("nvtx", list(NVTX_COLUMNS)), fallback="none")
    except Exception as exc:  # ranked over the whole trace instead (noted)
        notes.append(f"could not read the NVTX ranges of {path.name} ({type(exc).__name__}: {exc}); ranked over the whole trace")
        return None
    paths = att["nvtx_path"].to_list()
    keep = [True] * len(paths)
    for expr in includes:
        if nvtx_include_matches("x", expr) is None:
            notes.append(f"--nvtx-include {expr!r} cannot be judged from push/pop paths; not applied to the ranking")
            continue
    judged_in = [e for e in includes if nvtx_include_matches("x", e) is not None]
    judged_out = [e for e in excludes if nvtx_include_matches("x", e) is not None]
    notes.extend(f"--nvtx-exclude {e!r} cannot be judged from push/pop paths; not applied to the ranking"
                 for e in excludes if e not in judged_out)
    for i, p in enumerate(paths):
        if judged_in and not any(nvtx_include_matches(p, e) for e in judged_in) or any(nvtx_include_matches(p, e) for e in judged_out):
            keep[i] = False
    return att.filter(pl.Series(keep, dtype=pl.Boolean))


def top_kernel_instances(
    kernel_frames: Sequence[pl.DataFrame],
    nsys_summary: Mapping[str, Any],
    top_n: int,
    *,
    reports: Sequence[Path] = (),
    nvtx_include: Sequence[str] = (),
    nvtx_exclude: Sequence[str] = (),
    notes: list[str] | None = None,
) -> tuple[list[dict[str, Any]], str]:
    """The ``top_n`` kernel instantiations by GPU time, and where they were ranked.

    With an NVTX include or exclude and the nsys exports (``reports``), kernels are ranked by
    their GPU time inside those ranges (the nsys projection the ncu filter means: the ranges
    that enclose each kernel's launching call); otherwise over the whole trace. A kernel is its
    *instantiation*: the mangled name where nsys recorded one, else the demangled name — not
    the function name that ``elementwise_kernel``'s multiply, SiLU and add share.

    Returns ``(kernels, scope)``: one dict per kernel (``key`` — the name an ncu pass matches,
    ``name_base`` — ``mangled``/``demangled``/``function``, ``name`` — the function name,
    ``demangled``, ``mangled``, ``launches``, ``total_ns``) and ``scope`` (``"whole trace"`` or
    the NVTX filter).
    """
    notes = [] if notes is None else notes
    frames = list(kernel_frames)
    scope = "whole trace"
    if (nvtx_include or nvtx_exclude) and reports:
        scoped = [_scoped_kernels(Path(r), nvtx_include, nvtx_exclude, notes) for r in reports]
        if all(f is not None for f in scoped):
            frames = [f for f in scoped if f is not None]
            parts = [f"--nvtx-include {e}" for e in nvtx_include] + [f"--nvtx-exclude {e}" for e in nvtx_exclude]
            scope = "inside " + " ".join(parts)
    if not frames:
        return [{**k, "key": k["name"], "name_base": "function", "demangled": None, "mangled": None}
                for k in top_kernels([], nsys_summary, top_n)], scope
    import polars as pl

    frame = pl.concat(frames, how="diagonal_relaxed")
    if "duration_ns" not in frame.columns:
        frame = frame.with_columns(duration_ns=pl.col("end_ns") - pl.col("start_ns"))
    for col in ("short_name", "mangled_name", "name"):
        if col not in frame.columns:
            frame = frame.with_columns(pl.lit(None, pl.Utf8).alias(col))
    function = pl.coalesce(pl.col("short_name"), pl.col("name").map_elements(cmds.kernel_function_name, return_dtype=pl.Utf8))
    mangled = pl.col("mangled_name").filter(pl.col("mangled_name").is_not_null())
    ranked = (
        frame.with_columns(pl.coalesce("mangled_name", "name", function).alias("_key"), function.alias("_function"))
        .filter(pl.col("_key").is_not_null() & (pl.col("_key") != ""))
        .group_by("_key")
        .agg(pl.len().alias("launches"), pl.col("duration_ns").sum().alias("total_ns"), pl.col("_function").first(),
             pl.col("name").first().alias("_demangled"), mangled.first().alias("_mangled"))
        .sort(["total_ns", "_key"], descending=[True, False])
        .head(top_n)
    )
    out = []
    for r in ranked.iter_rows(named=True):
        base = "mangled" if r["_mangled"] else ("demangled" if r["_demangled"] else "function")
        out.append({"key": r["_key"], "name_base": base, "name": r["_function"], "demangled": r["_demangled"],
                    "mangled": r["_mangled"], "launches": int(r["launches"]), "total_ns": int(r["total_ns"] or 0)})
    return out, scope


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
    reports: Sequence[Path] = (),
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
        Receives what was decided: ``kernels`` (names, nsys launches, total ns), ``ranked``
        (where: the whole trace or the NVTX filter), ``notes``, ``launch_count`` and
        ``launch_skip`` per pass, ``sections``, ``metrics``, ``source``.
    reports
        The nsys ``.sqlite`` exports: with an NVTX include/exclude in ``exp.ncu``, kernels are
        ranked by their GPU time inside those ranges (:func:`top_kernel_instances`).

    Returns
    -------
    list[HandoffPass]
        One pass per kernel instantiation with ``--kernel-name-base mangled`` and
        ``-k regex:^<mangled name>$`` (``demangled``/the demangled name where nsys recorded no
        mangled name; ``function``/the function name without kernel tables), the user's
        ``--launch-skip`` (if any) and ``--launch-count`` (the user's, else
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
    notes: list[str] = []
    top, scope = top_kernel_instances(kernel_frames, nsys_summary, exp.top_n, reports=reports,
                                      nvtx_include=opts.nvtx_include, nvtx_exclude=opts.nvtx_exclude, notes=notes)
    if not top:
        where = "" if scope == "whole trace" else f" {scope}"
        msg = (
            f"the nsys step found no kernels{where} to hand to ncu; check the capture range and the NVTX "
            "filter, or run mode 'ncu' with a kernel filter"
        )
        raise CaptureError(msg)
    count = opts.launch_count or LAUNCHES_PER_KERNEL
    info.update(source="nsys", launch_count=count, launch_skip=opts.launch_skip, kernels=top, ranked=scope, notes=notes)
    match = {"mangled": "mangled_name", "demangled": "name", "function": "short_name"}
    passes = []
    for index, kernel in enumerate(top, start=1):
        pass_opts = dataclasses.replace(
            opts,
            kernel_name=f"regex:^{re.escape(kernel['key'])}$",
            kernel_name_base=kernel["name_base"],
            launch_count=count,
            output_name=f"{opts.output_name}_k{index}",
        )
        passes.append(HandoffPass(index, kernel["key"], pass_opts, kernel["launches"], kernel["total_ns"],
                                  match=match[kernel["name_base"]], short_name=kernel["name"], demangled=kernel["demangled"]))
    return passes


def profiled_launches(reports: Iterable[Path], column: str = "short_name") -> dict[str, int]:
    """Launches per kernel name over ncu reports: by ``column`` of their ``kernels`` table
    (``short_name``: the function; ``mangled_name`` or ``name``: the instantiation).

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
            for name in report.kernels[column].to_list():
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
            "short_name": p.short_name,
            "demangled": p.demangled,
            "match": p.match,
            "launch_skip": p.options.launch_skip,
            "launch_count": p.options.launch_count,
            "nsys_launches": p.nsys_launches,
            "reports": [path.name for path in paths],
            "profiled_launches": 0,
            "other_kernels": {},
        }
        try:
            counts = profiled_launches(paths, p.match if p.kernel is not None else "short_name")
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
