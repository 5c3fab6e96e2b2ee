"""nsys ↔ ncu: from an Nsight Systems trace to an Nsight Compute command, and back.

The documented workflow is nsys first (where does the time go?), then ncu on the few kernels
that matter. :func:`ncu_command_for_top_kernels` writes that ncu command from the nsys
``kernels`` table; :func:`join_ncu_to_nsys` puts the resulting ncu report's rows back on
the nsys kernel instances of the same program, so counters sit beside timings.

Matching is by kernel function name (nsys ``shortName`` = ncu's ``NameBase_FUNCTION``), the
NVTX push/pop path when both sides have one, and the launch's rank within that key: the
N-th ``elementwise_kernel`` under ``step.1/layer.0/attn`` in ncu is the N-th one there in
nsys. Pure functions: frames in, frames out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import polars as pl

from tracekit.ncu.schema import short_name_of
from tracekit.taxonomy import kernel_family

__all__ = [
    "DRILLDOWN_SECTIONS",
    "join_ncu_to_nsys",
    "ncu_command_for_top_kernels",
    "nvtx_include_matches",
    "top_kernels_plan",
]

#: The sections behind tracekit's drill-down views (SOL, roofline, tensor roofline with its
#: per-chip tensor counters and peaks, compute and memory workload, occupancy, launch).
DRILLDOWN_SECTIONS: tuple[str, ...] = (
    "SpeedOfLight",
    "SpeedOfLight_RooflineChart",
    "SpeedOfLight_HierarchicalTensorRooflineChart",
    "ComputeWorkloadAnalysis",
    "MemoryWorkloadAnalysis",
    "Occupancy",
    "LaunchStats",
)
_LAUNCH_CONFIG = ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z")
#: PyTorch ``emit_nvtx`` names (``aten::mm, seq = 146, op_id = 32, sizes = [...]``): nsys NVTX
#: attribution keeps only the operator in ``nvtx_path``; ncu's stacks carry the full name.
_TORCH_OP_NAME = r"^([^,\s]+), (?:seq|op_id|stashed seq|sizes) = "


# -- NVTX include expressions ------------------------------------------------------------------


def _include_regex(expression: str) -> re.Pattern[str] | None:
    """A regex over ``"a/b/c/"`` for an ncu push/pop ``--nvtx-include`` expression, or None
    when the expression cannot be judged from a push/pop path (start/end ranges, regex
    forms, named domains)."""
    if not expression.endswith("/") or expression.startswith("regex:") or "@" in expression:
        return None
    parts = expression[:-1].split("/")
    anchored_start = parts[0].startswith("[")
    anchored_end = parts[-1].endswith("]")
    parts[0] = parts[0].removeprefix("[")
    parts[-1] = parts[-1].removesuffix("]")
    body = ""
    for part in parts:
        if part == "*":
            body += r"(?:[^/]*/)*"
        elif part == "+":
            body += r"[^/]*/"
        else:
            body += re.escape(part) + "/"
    return re.compile(
        ("^" if anchored_start else "(?:^|.*/)") + body + ("$" if anchored_end else "")
    )


def nvtx_include_matches(path: str | None, expression: str) -> bool | None:
    """Whether an NVTX push/pop ``path`` (``"step.1/layer.0/attn"``) passes ncu's
    ``--nvtx-include expression`` (``"step.1/"``, ``"[step.1/layer.0/"``, ``"step.1/*/attn]/"``).

    Follows the CLI's grammar: ``A/B`` = B directly inside A, anywhere in the stack;
    ``*`` = zero or more ranges between, ``+`` = exactly one; ``[`` anchors at the
    outermost range, ``]`` at the innermost. Returns None for forms a push/pop path cannot
    decide (start/end ranges, ``regex:``, ``Domain@``).
    """
    pattern = _include_regex(expression)
    if pattern is None:
        return None
    if not path:
        return False
    return pattern.match(path + "/") is not None


# -- nsys → ncu ---------------------------------------------------------------------------------


def _with_short_name(kernels: pl.DataFrame) -> pl.DataFrame:
    if "short_name" in kernels.columns and kernels["short_name"].null_count() < kernels.height:
        return kernels
    return kernels.with_columns(
        pl.col("name").map_elements(short_name_of, return_dtype=pl.Utf8).alias("short_name")
    )


def _in_scope(kernels: pl.DataFrame, nvtx_include: str | None) -> pl.DataFrame:
    kernels = _with_short_name(kernels)
    if nvtx_include is None or "nvtx_path" not in kernels.columns:
        return kernels
    if _include_regex(nvtx_include) is None:
        return kernels
    keep = [nvtx_include_matches(p, nvtx_include) is True for p in kernels["nvtx_path"].to_list()]
    return kernels.filter(pl.Series(keep, dtype=pl.Boolean))


def top_kernels_plan(
    kernels: pl.DataFrame,
    *,
    top_n: int = 5,
    nvtx_include: str | None = None,
    launches_per_kernel: int = 1,
    launch_skip: int = 0,
) -> pl.DataFrame:
    """The kernels an ncu run should profile: the ``top_n`` by total GPU time.

    Parameters
    ----------
    kernels
        nsys ``kernels`` table: ``short_name`` (or ``name``), ``start_ns``, ``duration_ns``
        (ns); ``nvtx_path`` when NVTX attribution has run (needed for ``nvtx_include``).
    top_n
        How many kernel functions to keep (grouped by function name).
    nvtx_include
        ncu ``--nvtx-include`` expression; launches outside it are ignored (evaluated on
        ``nvtx_path`` for push/pop expressions, see :func:`nvtx_include_matches`).
    launches_per_kernel, launch_skip
        Launches to profile per kernel, and matching launches to skip first.

    Returns
    -------
    polars.DataFrame
        One row per chosen kernel: ``rank``, ``short_name``, ``family``, ``launches``,
        ``total_duration_ns`` (ns), ``mean_duration_ns`` (ns), ``pct_of_gpu_time`` (% of
        all in-scope kernel time), ``first_launch`` (0-based position of its first profiled
        launch among the launches ncu will count), ``kernel_id`` (an ncu ``--kernel-id``
        that profiles just this kernel's first counted launch), and ``launch_count``: the
        ``-c`` that makes one ncu run cover ``launches_per_kernel`` launches of every chosen
        kernel (same on every row).
    """
    scope = _in_scope(kernels, nvtx_include)
    total = scope["duration_ns"].sum() or 0
    ranked = (
        scope.group_by("short_name")
        .agg(
            pl.len().cast(pl.Int64).alias("launches"),
            pl.col("duration_ns").sum().alias("total_duration_ns"),
            pl.col("duration_ns").mean().round(0).cast(pl.Int64).alias("mean_duration_ns"),
        )
        .sort(["total_duration_ns", "short_name"], descending=[True, False])
        .head(top_n)
        .with_row_index("rank", offset=1)
    )
    chosen = ranked["short_name"].to_list()
    stream = scope.filter(pl.col("short_name").is_in(chosen)).sort("start_ns").slice(launch_skip)
    seen: dict[str, int] = {}
    first: dict[str, int] = {}
    count = 0
    for position, name in enumerate(stream["short_name"].to_list()):
        seen[name] = seen.get(name, 0) + 1
        first.setdefault(name, position)
        if all(seen.get(n, 0) >= launches_per_kernel for n in chosen):
            count = position + 1
            break
    else:
        count = stream.height
    return ranked.with_columns(
        pl.col("rank").cast(pl.Int64),
        pl.col("short_name").map_elements(kernel_family, return_dtype=pl.Utf8).alias("family"),
        (100.0 * pl.col("total_duration_ns") / total if total else pl.lit(None, pl.Float64)).alias("pct_of_gpu_time"),
        pl.col("short_name").replace_strict(first, default=None, return_dtype=pl.Int64).alias("first_launch"),
        pl.format("::regex:^{}$:{}", pl.col("short_name").map_elements(re.escape, return_dtype=pl.Utf8), pl.lit(1))
        .alias("kernel_id"),
        pl.lit(count, pl.Int64).alias("launch_count"),
    ).select(
        "rank", "short_name", "family", "launches", "total_duration_ns", "mean_duration_ns",
        "pct_of_gpu_time", "first_launch", "kernel_id", "launch_count",
    )  # fmt: skip


def ncu_command_for_top_kernels(
    kernels: pl.DataFrame,
    *,
    top_n: int = 5,
    nvtx_include: str | None = None,
    program: Sequence[str],
    launches_per_kernel: int = 1,
    launch_skip: int = 0,
    sections: Sequence[str] = DRILLDOWN_SECTIONS,
    metrics: Sequence[str] = (),
    output: str = "tracekit_top_kernels",
    ncu: str = "ncu",
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The ncu argument list that profiles the ``top_n`` kernels of an nsys trace.

    ``-k regex:^(?:a|b|…)$`` selects the kernels by function name (ncu's default
    ``--kernel-name-base function``, which equals nsys's ``short_name``); ``--nvtx
    --nvtx-include`` restricts to an NVTX range (one training step, say); ``--launch-skip``
    skips matching launches and ``--launch-count`` is computed from the trace so that each
    chosen kernel is profiled ``launches_per_kernel`` times (see :func:`top_kernels_plan`,
    which also gives a per-kernel ``--kernel-id``).

    Parameters
    ----------
    kernels
        nsys ``kernels`` (``short_name``/``name``, ``start_ns``, ``duration_ns``,
        optionally ``nvtx_path``).
    program
        The program and its arguments, appended last.
    sections, metrics
        ``--section`` per entry (default: the drill-down set) and one ``--metrics`` list.
        Metric names are chip-specific and an unknown one aborts ncu: prefer sections.
    output, ncu, extra_args
        ``-o`` target, the ncu executable, and arguments inserted before the program.

    Returns
    -------
    list[str]
        ``[ncu, …options…, *program]``, ready for :func:`subprocess.run`.
    """
    if not program:
        msg = "program is empty; pass the command to profile, e.g. program=['python', 'train.py']"
        raise ValueError(msg)
    plan = top_kernels_plan(
        kernels,
        top_n=top_n,
        nvtx_include=nvtx_include,
        launches_per_kernel=launches_per_kernel,
        launch_skip=launch_skip,
    )
    if plan.height == 0:
        msg = "no kernels in scope; check the nsys trace and the nvtx_include expression"
        raise ValueError(msg)
    names = "|".join(re.escape(n) for n in plan["short_name"].to_list())
    args = [ncu]
    if nvtx_include is not None:
        args += ["--nvtx", "--nvtx-include", nvtx_include]
    args += ["--kernel-name-base", "function", "-k", f"regex:^(?:{names})$"]
    if launch_skip:
        args += ["--launch-skip", str(launch_skip)]
    args += ["--launch-count", str(int(plan["launch_count"][0]))]
    for section in sections:
        args += ["--section", section]
    if metrics:
        args += ["--metrics", ",".join(metrics)]
    args += ["-f", "-o", output, *extra_args, *program]
    return args


# -- ncu → nsys ---------------------------------------------------------------------------------


def _comparable_path(path: pl.Expr) -> pl.Expr:
    """``nvtx_path`` with each PyTorch ``emit_nvtx`` step cut to its operator name."""
    steps = path.str.split("/").list.eval(
        pl.coalesce(pl.element().str.extract(_TORCH_OP_NAME, 1), pl.element())
    )
    return steps.list.join("/")


def _occurrence(frame: pl.DataFrame, keys: list[str], order: str) -> pl.DataFrame:
    return frame.sort(order).with_columns(
        pl.int_range(pl.len()).over(keys).cast(pl.Int64).alias("occurrence")
    )


def join_ncu_to_nsys(
    nsys_kernels: pl.DataFrame,
    ncu_kernels: pl.DataFrame,
    *,
    use_nvtx: bool | None = None,
    match_device: bool = True,
    match_launch_config: bool = False,
    launch_offset: int | Mapping[str, int] = 0,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Match each profiled ncu result to the nsys kernel instance it measured.

    Key: kernel function name (``short_name``), the NVTX push/pop path when both frames
    have ``nvtx_path`` (else the name alone), the device when ``match_device`` and both
    sides know it, and the launch's rank within that key (nsys by ``start_ns``, ncu by
    ``id``). ncu ranks can be shifted by ``launch_offset`` (per name or global) when the
    capture skipped launches (``-s``) that nsys saw. Paths are compared after cutting
    PyTorch ``emit_nvtx`` steps to their operator name, as nsys attribution does; ncu's path
    is its default NVTX domain's push/pop stack.

    Parameters
    ----------
    nsys_kernels
        nsys ``kernels``: ``short_name`` (or ``name``), ``start_ns``; optional
        ``nvtx_path``, ``device_id``, launch configuration (``grid_x``… ``block_z``).
    ncu_kernels
        :attr:`NcuReport.kernels <tracekit.ncu.report.NcuReport.kernels>`.
    use_nvtx
        Force (True) or forbid (False) NVTX paths in the key; default: when both have them.
    match_launch_config
        Put grid and block sizes in the key too. Needed when ncu skipped launches by
        configuration (``--filter-mode per-launch-config`` profiles the first launch of
        each distinct configuration); wrong when shapes change between the two runs.

    Returns
    -------
    matched : polars.DataFrame
        The nsys rows that were profiled, every nsys column kept, plus ``ncu_id`` (the
        report's ``id``: join ``report.wide([...])`` on it), ``occurrence``,
        ``ncu_duration_ns`` (ns, ncu's replayed duration) and ``launch_config_equal``
        (grid and block agree; null when either side lacks them).
    summary : polars.DataFrame
        ``side`` (``ncu``/``nsys``), ``status``, ``kernels`` (count) and ``examples`` (up
        to three names). ncu statuses: ``matched``, ``matched_config_differs``,
        ``name_not_in_nsys``, ``nvtx_path_not_in_nsys``, ``device_not_in_nsys``,
        ``launch_config_not_in_nsys``, ``more_launches_than_nsys``;
        nsys: ``matched``, ``not_profiled`` (its name/path was profiled, this launch was not),
        ``outside_ncu_capture``.
    """
    nsys = _with_short_name(nsys_kernels)
    ncu = _with_short_name(ncu_kernels)
    if use_nvtx is None:
        use_nvtx = all(
            "nvtx_path" in f.columns and f["nvtx_path"].null_count() < f.height for f in (nsys, ncu)
        )
    keys = ["short_name"] + (["nvtx_path"] if use_nvtx else [])
    if use_nvtx:
        nsys = nsys.with_columns(_comparable_path(pl.col("nvtx_path")).alias("nvtx_path"))
        ncu = ncu.with_columns(_comparable_path(pl.col("nvtx_path")).alias("nvtx_path"))
    if match_device and all(
        "device_id" in f.columns and f["device_id"].null_count() == 0 for f in (nsys, ncu)
    ):
        keys.append("device_id")
    if match_launch_config:
        keys += [c for c in _LAUNCH_CONFIG if c in nsys.columns and c in ncu.columns]
    nsys = _occurrence(nsys.with_row_index("_row"), keys, "start_ns")
    ncu = _occurrence(
        ncu.select(
            [
                "id",
                "duration_ns",
                *keys,
                *[c for c in _LAUNCH_CONFIG if c in ncu.columns and c not in keys],
            ]
        ),
        keys,
        "id",
    )
    if isinstance(launch_offset, Mapping):
        offset = pl.col("short_name").replace_strict(
            dict(launch_offset), default=0, return_dtype=pl.Int64
        )
    else:
        offset = pl.lit(int(launch_offset), pl.Int64)
    ncu = ncu.with_columns((pl.col("occurrence") + offset).alias("occurrence"))
    ncu_side = ncu.rename(
        {c: f"_ncu_{c}" for c in _LAUNCH_CONFIG if c in ncu.columns and c not in keys}
    ).rename({"id": "ncu_id", "duration_ns": "ncu_duration_ns"})
    joined = nsys.join(ncu_side, on=[*keys, "occurrence"], how="inner", nulls_equal=True)
    config = [c for c in _LAUNCH_CONFIG if c in nsys.columns and f"_ncu_{c}" in joined.columns]
    config_in_keys = any(c in keys for c in _LAUNCH_CONFIG)
    if config:
        equal = pl.all_horizontal([pl.col(c) == pl.col(f"_ncu_{c}") for c in config])
    else:  # equal by construction when the configuration is part of the key
        equal = pl.lit(True if config_in_keys else None, pl.Boolean)
    matched = (
        joined.with_columns(equal.alias("launch_config_equal"))
        .drop([c for c in joined.columns if c.startswith("_ncu_")])
        .sort("_row")
        .drop("_row")
    )
    summary = _summary(nsys, ncu, matched, keys)
    return matched, summary


def _summary(
    nsys: pl.DataFrame, ncu: pl.DataFrame, matched: pl.DataFrame, keys: list[str]
) -> pl.DataFrame:
    matched_ids = set(matched["ncu_id"].to_list())
    differs = set(matched.filter(pl.col("launch_config_equal").not_())["ncu_id"].to_list())
    # Key prefixes, coarse to fine: the first one nsys lacks names the reason.
    stages = [("name_not_in_nsys", ["short_name"])]
    for column, reason in (
        ("nvtx_path", "nvtx_path_not_in_nsys"),
        ("device_id", "device_not_in_nsys"),
        ("grid_x", "launch_config_not_in_nsys"),
    ):
        if column in keys:
            prefix = keys[: keys.index(column) + 1] if column != "grid_x" else keys
            stages.append((reason, prefix))
    seen = {reason: set(nsys.select(cols).unique().rows()) for reason, cols in stages}
    rows: list[tuple[str, str, str]] = []
    for row in ncu.iter_rows(named=True):
        if row["id"] in matched_ids:
            status = "matched_config_differs" if row["id"] in differs else "matched"
        else:
            status = "more_launches_than_nsys"
            for reason, cols in stages:
                if tuple(row[c] for c in cols) not in seen[reason]:
                    status = reason
                    break
        rows.append(("ncu", status, row["short_name"]))
    ncu_keys = set(ncu.select(keys).unique().rows())
    matched_rows = matched.select(keys + ["occurrence"]).rows()
    matched_set = set(matched_rows)
    for launch in nsys.select([*keys, "occurrence"]).iter_rows():
        if launch in matched_set:
            status = "matched"
        elif tuple(launch[:-1]) in ncu_keys:
            status = "not_profiled"
        else:
            status = "outside_ncu_capture"
        rows.append(("nsys", status, launch[0]))
    frame = pl.DataFrame(
        rows, schema={"side": pl.Utf8, "status": pl.Utf8, "name": pl.Utf8}, orient="row"
    )
    return (
        frame.group_by("side", "status", maintain_order=True)
        .agg(
            pl.len().cast(pl.Int64).alias("kernels"),
            pl.col("name").unique(maintain_order=True).head(3).alias("examples"),
        )
        .sort("side", "status")
    )
