"""Nsight Compute drill-down views: Tensor Cores, DRAM, speed of light, roofline.

Pure functions over the tables of :class:`~tracekit.ncu.report.NcuReport`: each takes the
long ``metrics`` frame (``id, metric, value, …``) and optionally ``kernels`` (for names,
family and NVTX path), or the report itself, and returns one row per kernel. Metric names
differ between architectures; each view tries the candidates listed in
:mod:`tracekit.ncu.metric_names` and reports which one it used. Formulas and the
per-architecture names are documented in ``docs/ncu.md``.

Peaks ("ceilings") come from the report where it has them (``<counter>.peak_sustained`` ×
the clock the kernel ran at, as ncu's own roofline does) and otherwise from the built-in
table :data:`tracekit.ncu.specs.GPU_SPECS`; ``peak_source`` says which (``"report"`` or
``"spec"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl

from tracekit.ncu import metric_names as mn
from tracekit.ncu.specs import find_spec, tensor_peak_tflops

__all__ = [
    "dram_bandwidth",
    "roofline",
    "roofline_ceilings",
    "speed_of_light",
    "tensor_core_utilization",
]

DISPLAY_NAME = "device__attribute_display_name"
_KERNEL_COLUMNS = ("short_name", "family", "nvtx_path")


# -- plumbing --------------------------------------------------------------------------------


def _inputs(
    report_or_metrics: Any, kernels: pl.DataFrame | None
) -> tuple[pl.DataFrame, pl.DataFrame | None]:
    """``(metrics, kernels)`` from an NcuReport-like object or a metrics frame."""
    if isinstance(report_or_metrics, pl.DataFrame):
        return report_or_metrics, kernels
    metrics = report_or_metrics.metrics
    return metrics, kernels if kernels is not None else report_or_metrics.kernels


def _wide(metrics: pl.DataFrame, names: Sequence[str]) -> pl.DataFrame:
    """``id`` plus one Float64 column per name in ``names`` (null where absent)."""
    names = list(dict.fromkeys(names))
    ids = metrics.select(pl.col("id").unique().sort())
    picked = metrics.filter(pl.col("metric").is_in(names))
    if picked.height:
        wide = picked.pivot(on="metric", index="id", values="value", aggregate_function="first")
        ids = ids.join(wide, on="id", how="left")
    return ids.with_columns(
        pl.lit(None, pl.Float64).alias(n) for n in names if n not in ids.columns
    ).with_columns(pl.col(n).cast(pl.Float64) for n in names)


def _first(candidates: Sequence[str]) -> pl.Expr:
    """The first non-null of ``candidates`` per row."""
    return pl.coalesce([pl.col(c) for c in candidates])


def _which(candidates: Sequence[str]) -> pl.Expr:
    """The name of the candidate :func:`_first` took (null if none)."""
    expr: pl.Expr = pl.lit(None, pl.Utf8)
    for name in reversed(candidates):
        expr = pl.when(pl.col(name).is_not_null()).then(pl.lit(name)).otherwise(expr)
    return expr


def _pct_candidates(bases: Sequence[str]) -> list[str]:
    return [b + s for s in mn.PIPE_PCT_SUFFIXES for b in bases]


def _base(metrics: pl.DataFrame, kernels: pl.DataFrame | None) -> pl.DataFrame:
    """``id, short_name, family, nvtx_path, duration_ns, display_name`` per kernel."""
    wide = _wide(metrics, [mn.DURATION])
    names = (
        metrics.filter(pl.col("metric") == DISPLAY_NAME)
        .group_by("id")
        .agg(pl.col("text").first().alias("display_name"))
    )
    base = wide.select("id", pl.col(mn.DURATION).round(0).cast(pl.Int64).alias("duration_ns"))
    if kernels is not None:
        keep = ["id", *[c for c in _KERNEL_COLUMNS if c in kernels.columns]]
        base = kernels.select(keep).join(base, on="id", how="left")
    for column in _KERNEL_COLUMNS:
        if column not in base.columns:
            base = base.with_columns(pl.lit(None, pl.Utf8).alias(column))
    base = base.join(names, on="id", how="left")
    return base.select("id", *_KERNEL_COLUMNS, "duration_ns", "display_name")


def _spec_value(display: pl.Series, getter: Any) -> pl.Series:
    """Per row: ``getter(spec)`` for the spec matching the display name (None if none)."""
    out = []
    for name in display.to_list():
        spec = find_spec(name)
        out.append(getter(spec) if spec is not None else None)
    return pl.Series(out, dtype=pl.Float64)


def _spec_tensor_peak(display: pl.Series, precision: pl.Series) -> pl.Series:
    """Per row: datasheet dense tensor FLOP/s of ``precision`` on the named GPU."""
    out = []
    for name, prec in zip(display.to_list(), precision.to_list(), strict=True):
        spec = find_spec(name)
        value = tensor_peak_tflops(spec, prec) if spec is not None else None
        out.append(value * 1e12 if value is not None else None)
    return pl.Series(out, dtype=pl.Float64)


def _source(report: pl.Expr, spec: pl.Expr) -> pl.Expr:
    """``"report"`` where the report gave the peak, ``"spec"`` where the table did."""
    return (
        pl.when(report.is_not_null())
        .then(pl.lit("report"))
        .when(spec.is_not_null())
        .then(pl.lit("spec"))
        .otherwise(pl.lit(None, pl.Utf8))
        .alias("peak_source")
    )


# -- tensor FLOPs --------------------------------------------------------------------------


def _tensor_table(metrics: pl.DataFrame) -> pl.DataFrame:
    """Per kernel: ``tensor_flop``, ``tensor_precision``, ``peak_tensor_ops_per_cycle``,
    ``tensor_peak_metric`` (dense peak of the precision used), and the FLOP per precision."""
    tensor = metrics.filter(pl.col("metric").str.starts_with("sm__ops_path_tensor_"))
    rows: list[dict[str, Any]] = []
    for (kernel_id,), part in tensor.group_by("id", maintain_order=True):
        values = dict(zip(part["metric"].to_list(), part["value"].to_list(), strict=True))
        terms = mn.tensor_flop_terms(list(values))
        int_terms = mn.tensor_flop_terms(list(values), integer=True)
        if not terms and not int_terms:
            continue
        by_precision: dict[str, float] = {}
        for term in terms:
            by_precision[term.precision] = by_precision.get(term.precision, 0.0) + (
                values[term.metric] or 0.0
            )
        int_by_precision: dict[str, float] = {}
        for term in int_terms:
            int_by_precision[term.precision] = int_by_precision.get(term.precision, 0.0) + (values[term.metric] or 0.0)
        total = sum(by_precision.values())
        int_total = sum(int_by_precision.values())
        both = {**by_precision, **int_by_precision}
        # the precision doing most tensor work: FLOPs and integer operations alike
        precision = max(both, key=lambda p: both[p]) if total + int_total > 0 else None
        peak_value = peak_metric = None
        if precision is not None:
            peaks = [
                (values[c.metric], c.metric)
                for c in mn.dense_peak_counters(list(values), precision)
                if values.get(c.metric)
            ]
            if peaks:
                peak_value, peak_metric = max(peaks)
        rows.append(
            {
                "id": kernel_id,
                "tensor_flop": total if terms else None,
                "tensor_int_ops": int_total if int_terms else None,
                "tensor_precision": precision,
                "peak_tensor_ops_per_cycle": peak_value,
                "tensor_peak_metric": peak_metric,
                "tensor_flop_by_precision": [
                    {"precision": p, "flop": f} for p, f in sorted(by_precision.items())
                ],
            }
        )
    schema: dict[str, pl.DataType | type[pl.DataType]] = {
        "id": pl.Int64,
        "tensor_flop": pl.Float64,
        "tensor_int_ops": pl.Float64,
        "tensor_precision": pl.Utf8,
        "peak_tensor_ops_per_cycle": pl.Float64,
        "tensor_peak_metric": pl.Utf8,
        "tensor_flop_by_precision": pl.List(pl.Struct({"precision": pl.Utf8, "flop": pl.Float64})),
    }
    return pl.DataFrame(rows, schema=schema)


def tensor_core_utilization(
    report_or_metrics: Any, kernels: pl.DataFrame | None = None
) -> pl.DataFrame:
    """Tensor Core utilisation per kernel: pipe busy %, HMMA/IMMA/DMMA split, tensor FLOPs.

    Parameters
    ----------
    report_or_metrics
        An :class:`~tracekit.ncu.report.NcuReport`, or its ``metrics`` frame (columns
        ``id``, ``metric``, ``value``, ``text``).
    kernels
        The report's ``kernels`` frame (``id``, ``short_name``, ``family``, ``nvtx_path``);
        optional when a report is passed.

    Returns
    -------
    polars.DataFrame
        One row per kernel:

        * ``id``, ``short_name``, ``family``, ``nvtx_path``, ``duration_ns`` (ns)
        * ``tensor_pipe_pct`` (%): tensor pipe busy cycles over elapsed cycles —
          ``sm__pipe_tensor_cycles_active`` (``_v2`` on CC 8.9), on CC 10.x the larger of it
          and the tcgen05 pipe ``sm__pipe_tc_cycles_active``; ``tensor_pipe_metric`` names it
        * ``hmma_pipe_pct``, ``imma_pipe_pct``, ``dmma_pipe_pct``, ``tc_pipe_pct`` (%)
        * ``tensor_flop`` (FLOP): sum of ``sm__ops_path_tensor_src_*`` aggregates (2 FLOPs
          per MAC, integer types excluded, no double counting); null when the report has no
          tensor counters
        * ``tensor_precision``: the source type with the most FLOPs (``bf16``, ``fp8``…)
        * ``tensor_int_ops`` (operations): integer tensor operations (``sm__ops_path_tensor_src_int*``,
          2 per MAC like FLOPs, INT8 IMMA/IGMMA GEMMs); null without integer counters
        * ``tensor_flops_per_s`` (operations/s): (``tensor_flop`` + ``tensor_int_ops``) / duration
        * ``peak_tensor_flops_per_s`` (FLOP/s): dense peak of ``tensor_precision``;
          ``peak_source`` ``"report"`` (``…_sparsity_off.sum.peak_sustained`` × SM clock) or
          ``"spec"`` (datasheet)
        * ``tensor_pct_of_peak`` (%): ``tensor_flops_per_s`` / ``peak_tensor_flops_per_s``
        * ``tensor_peak_metric``: the ``.peak_sustained`` counter behind a report peak
    """
    metrics, kernels = _inputs(report_or_metrics, kernels)
    pipes = {
        "tensor": _pct_candidates(mn.TENSOR_PIPE),
        "tc": _pct_candidates(mn.TC_PIPE),
        "hmma": _pct_candidates(mn.HMMA_PIPE),
        "imma": _pct_candidates(mn.IMMA_PIPE),
        "dmma": _pct_candidates(mn.DMMA_PIPE),
    }
    wide = _wide(metrics, [n for c in pipes.values() for n in c] + list(mn.SM_CLOCK))
    pct = wide.select(
        "id",
        *[_first(c).alias(f"{k}_pipe_pct") for k, c in pipes.items()],
        _which(pipes["tensor"]).alias("tensor_pipe_metric"),
        _first(mn.SM_CLOCK).alias("_clock"),
    )
    out = (
        _base(metrics, kernels)
        .join(pct, on="id", how="left")
        .join(_tensor_table(metrics), on="id", how="left")
    )
    out = out.with_columns(
        _spec_tensor_peak(out["display_name"], out["tensor_precision"]).alias("_spec")
    )
    seconds = pl.col("duration_ns") * 1e-9
    report_peak = pl.col("peak_tensor_ops_per_cycle") * pl.col("_clock")
    ops = pl.when(pl.col("tensor_flop").is_not_null() | pl.col("tensor_int_ops").is_not_null()).then(
        pl.col("tensor_flop").fill_null(0) + pl.col("tensor_int_ops").fill_null(0)
    )
    return out.with_columns(
        pl.max_horizontal("tensor_pipe_pct", "tc_pipe_pct").alias("tensor_pipe_pct"),
        (ops / seconds).alias("tensor_flops_per_s"),
        pl.coalesce(report_peak, pl.col("_spec")).alias("peak_tensor_flops_per_s"),
        _source(report_peak, pl.col("_spec")),
    ).with_columns(
        (100.0 * pl.col("tensor_flops_per_s") / pl.col("peak_tensor_flops_per_s")).alias("tensor_pct_of_peak")
    ).select(
        "id", *_KERNEL_COLUMNS, "duration_ns",
        "tensor_pipe_pct", "tensor_pipe_metric", "hmma_pipe_pct", "imma_pipe_pct", "dmma_pipe_pct", "tc_pipe_pct",
        "tensor_flop", "tensor_int_ops", "tensor_precision", "tensor_flops_per_s", "peak_tensor_flops_per_s", "peak_source",
        "tensor_pct_of_peak", "tensor_peak_metric",
    )  # fmt: skip


# -- DRAM ------------------------------------------------------------------------------------


def dram_bandwidth(report_or_metrics: Any, kernels: pl.DataFrame | None = None) -> pl.DataFrame:
    """DRAM traffic and bandwidth per kernel, with L1 and L2 hit rates.

    Parameters
    ----------
    report_or_metrics, kernels
        As for :func:`tensor_core_utilization`.

    Returns
    -------
    polars.DataFrame
        One row per kernel:

        * ``id``, ``short_name``, ``family``, ``nvtx_path``, ``duration_ns`` (ns)
        * ``dram_read_bytes``, ``dram_write_bytes`` (bytes): ``dram__bytes_read.sum`` /
          ``dram__bytes_write.sum`` (``dram__bytes_op_*`` on GB20x); null if not captured
        * ``dram_bytes`` (bytes): read + write, else ``dram__bytes.sum``, else
          ``dram__bytes.sum.per_second`` × duration; ``dram_bytes_source`` says which
        * ``bandwidth_gbps`` (1e9 B/s): ``dram__bytes.sum.per_second``, else bytes / duration
        * ``peak_bandwidth_gbps`` (1e9 B/s): ``dram__bytes.sum.peak_sustained`` ×
          ``dram__cycles_elapsed.avg.per_second`` (``peak_source`` ``"report"``), else the
          datasheet figure (``"spec"``)
        * ``bandwidth_pct_of_peak`` (%): ``bandwidth_gbps`` / ``peak_bandwidth_gbps``
        * ``dram_throughput_pct`` (%): ncu's ``gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed``
        * ``l1_hit_rate_pct``, ``l2_hit_rate_pct`` (%): ``l1tex__t_sector_hit_rate.pct``,
          ``lts__t_sector_hit_rate.pct``
    """
    metrics, kernels = _inputs(report_or_metrics, kernels)
    names = [
        *mn.DRAM_READ, *mn.DRAM_WRITE, *mn.DRAM_TOTAL, *mn.DRAM_RATE, *mn.DRAM_PEAK_PER_CYCLE,
        *mn.DRAM_CLOCK, *mn.DRAM_THROUGHPUT_PCT, *mn.L1_HIT_PCT, *mn.L2_HIT_PCT,
    ]  # fmt: skip
    wide = _wide(metrics, names)
    out = _base(metrics, kernels).join(wide, on="id", how="left")
    seconds = pl.col("duration_ns") * 1e-9
    read, write, total, rate = (
        _first(mn.DRAM_READ),
        _first(mn.DRAM_WRITE),
        _first(mn.DRAM_TOTAL),
        _first(mn.DRAM_RATE),
    )
    report_peak = _first(mn.DRAM_PEAK_PER_CYCLE) * _first(mn.DRAM_CLOCK) / 1e9
    out = out.with_columns(
        _spec_value(out["display_name"], lambda s: s.bandwidth_gbps).alias("_spec")
    )
    spec_peak = pl.col("_spec")
    return out.with_columns(
        read.alias("dram_read_bytes"),
        write.alias("dram_write_bytes"),
        pl.coalesce(read + write, total, rate * seconds).alias("dram_bytes"),
        pl.when((read + write).is_not_null())
        .then(pl.lit("read+write"))
        .when(total.is_not_null())
        .then(pl.lit("total"))
        .when((rate * seconds).is_not_null())
        .then(pl.lit("rate*duration"))
        .alias("dram_bytes_source"),
        pl.coalesce(rate, (read + write) / seconds, total / seconds).truediv(1e9).alias("bandwidth_gbps"),
        pl.coalesce(report_peak, spec_peak).alias("peak_bandwidth_gbps"),
        _source(report_peak, spec_peak),
        _first(mn.DRAM_THROUGHPUT_PCT).alias("dram_throughput_pct"),
        _first(mn.L1_HIT_PCT).alias("l1_hit_rate_pct"),
        _first(mn.L2_HIT_PCT).alias("l2_hit_rate_pct"),
    ).with_columns(
        (100.0 * pl.col("bandwidth_gbps") / pl.col("peak_bandwidth_gbps")).alias("bandwidth_pct_of_peak")
    ).select(
        "id", *_KERNEL_COLUMNS, "duration_ns", "dram_read_bytes", "dram_write_bytes", "dram_bytes",
        "dram_bytes_source", "bandwidth_gbps", "peak_bandwidth_gbps", "peak_source", "bandwidth_pct_of_peak",
        "dram_throughput_pct", "l1_hit_rate_pct", "l2_hit_rate_pct",
    )  # fmt: skip


# -- speed of light --------------------------------------------------------------------------

#: ncu's SOLBottleneck rule: below this (%) for both compute and memory → latency bound.
LATENCY_THRESHOLD_PCT = 60.0
#: ... and a unit must lead the other by this many points to be called the bottleneck.
BALANCE_MARGIN_PCT = 10.0
#: ... and above this (%) for either, ncu says "High Throughput" whatever the other does.
HIGH_THROUGHPUT_PCT = 80.0


def speed_of_light(
    report_or_metrics: Any,
    kernels: pl.DataFrame | None = None,
    *,
    latency_threshold_pct: float = LATENCY_THRESHOLD_PCT,
    balance_margin_pct: float = BALANCE_MARGIN_PCT,
    high_throughput_pct: float = HIGH_THROUGHPUT_PCT,
) -> pl.DataFrame:
    """Compute vs memory throughput (% of peak), occupancy and a bound classification.

    ``bound`` follows ncu's own SOLBottleneck rule: ``"high_throughput"`` when compute or
    memory throughput is above ``high_throughput_pct`` (80%); ``"latency"`` when both are below
    ``latency_threshold_pct`` (60%); otherwise ``"compute"`` or ``"memory"`` when one leads the
    other by at least ``balance_margin_pct`` (10 points); otherwise ``"balanced"``. Null when
    the throughputs were not captured.

    Parameters
    ----------
    report_or_metrics, kernels
        As for :func:`tensor_core_utilization`.

    Returns
    -------
    polars.DataFrame
        One row per kernel: ``id``, ``short_name``, ``family``, ``nvtx_path``,
        ``duration_ns`` (ns), ``compute_throughput_pct`` (``sm__throughput``),
        ``memory_throughput_pct`` (``gpu__compute_memory_throughput``),
        ``dram_throughput_pct``, ``l1_throughput_pct``, ``l2_throughput_pct``,
        ``achieved_occupancy_pct`` (``sm__warps_active`` % of peak),
        ``theoretical_occupancy_pct`` (``sm__maximum_warps_per_active_cycle_pct``), all in %;
        ``sm_clock_hz`` (Hz, ``sm__cycles_elapsed.avg.per_second``); ``bound``.
    """
    metrics, kernels = _inputs(report_or_metrics, kernels)
    groups = {
        "compute_throughput_pct": mn.COMPUTE_SOL,
        "memory_throughput_pct": mn.MEMORY_SOL,
        "dram_throughput_pct": mn.DRAM_THROUGHPUT_PCT,
        "l1_throughput_pct": mn.L1_SOL,
        "l2_throughput_pct": mn.L2_SOL,
        "achieved_occupancy_pct": mn.ACHIEVED_OCCUPANCY,
        "theoretical_occupancy_pct": mn.THEORETICAL_OCCUPANCY,
        "sm_clock_hz": mn.SM_CLOCK,
    }
    wide = _wide(metrics, [n for c in groups.values() for n in c])
    values = wide.select("id", *[_first(c).alias(k) for k, c in groups.items()])
    compute, memory = pl.col("compute_throughput_pct"), pl.col("memory_throughput_pct")
    bound = (
        pl.when(compute.is_null() | memory.is_null())
        .then(pl.lit(None, pl.Utf8))
        .when(pl.max_horizontal(compute, memory) > high_throughput_pct)
        .then(pl.lit("high_throughput"))
        .when(pl.max_horizontal(compute, memory) < latency_threshold_pct)
        .then(pl.lit("latency"))
        .when(compute - memory >= balance_margin_pct)
        .then(pl.lit("compute"))
        .when(memory - compute >= balance_margin_pct)
        .then(pl.lit("memory"))
        .otherwise(pl.lit("balanced"))
    )
    out = _base(metrics, kernels).join(values, on="id", how="left")
    return out.with_columns(bound.alias("bound")).select(
        "id", *_KERNEL_COLUMNS, "duration_ns", *groups, "bound"
    )


# -- roofline --------------------------------------------------------------------------------


def _simt_flop(wide: pl.DataFrame, precision: str) -> pl.Expr:
    """SIMT FLOPs of one precision: Σ FLOPs-per-instruction × thread instructions.

    Counts come from ``….sum`` when captured, else from the roofline sections'
    ``….sum.per_cycle_elapsed`` × ``smsp__cycles_elapsed.avg``, else × SM clock × duration.
    """
    terms = []
    for op, weight in mn.SIMT_OPS[precision]:
        per_cycle = _first(mn.simt_rate_names(op))
        count = pl.coalesce(
            _first(mn.simt_count_names(op)),
            per_cycle * _first(mn.SMSP_CYCLES),
            per_cycle * _first(mn.SMSP_CLOCK) * pl.col("duration_ns") * 1e-9,
        )
        terms.append(weight * count)
    return pl.sum_horizontal(terms, ignore_nulls=False)


def _simt_names() -> list[str]:
    names = [*mn.SMSP_CYCLES, *mn.SMSP_CLOCK, *mn.SM_CLOCK, *mn.DRAM_PEAK_PER_CYCLE, *mn.DRAM_CLOCK]
    for precision, ops in mn.SIMT_OPS.items():
        for op, _ in ops:
            names += [*mn.simt_count_names(op), *mn.simt_rate_names(op)]
        names += mn.simt_peak_names(mn.SIMT_PEAK_OPS[precision][0])
    return names


def roofline_ceilings(report_or_metrics: Any, kernels: pl.DataFrame | None = None) -> pl.DataFrame:
    """Every ceiling per kernel: SIMT and tensor FLOP/s by precision, and DRAM bandwidth.

    Returns
    -------
    polars.DataFrame
        Long: ``id``, ``ceiling`` (``simt_fp32``, ``simt_fp64``, ``simt_fp16``,
        ``tensor_<precision>``, ``dram``), ``value`` (FLOP/s, or bytes/s for ``dram``),
        ``unit`` (``flop/s`` or ``byte/s``), ``source`` (``report`` or ``spec``), ``metric``
        (the peak counter used, null for spec values). Report ceilings are
        ``<counter>.peak_sustained`` × FLOPs per instruction × ``sm__cycles_elapsed.avg.per_second``
        (tensor: dense ``_sparsity_off`` peaks), DRAM ``dram__bytes.sum.peak_sustained`` ×
        ``dram__cycles_elapsed.avg.per_second``.
    """
    metrics, kernels = _inputs(report_or_metrics, kernels)
    base = _base(metrics, kernels)
    wide = _wide(metrics, _simt_names())
    clock = wide.select(
        "id",
        _first(mn.SM_CLOCK).alias("clock"),
        (_first(mn.DRAM_PEAK_PER_CYCLE) * _first(mn.DRAM_CLOCK)).alias("dram"),
    )
    clocks = dict(zip(clock["id"].to_list(), clock.select("clock", "dram").rows(), strict=True))
    peaks = wide.to_dicts()
    by_id = {row["id"]: row for row in peaks}
    tensor_names = (
        metrics.filter(
            pl.col("metric").str.contains(r"^sm__ops_path_tensor_.*\.sum\.peak_sustained$")
        )
        .group_by("id")
        .agg(pl.col("metric"), pl.col("value"))
    )
    tensor_by_id = {
        r["id"]: dict(zip(r["metric"], r["value"], strict=True)) for r in tensor_names.to_dicts()
    }
    rows: list[dict[str, Any]] = []
    for kernel_id, display in zip(
        base["id"].to_list(), base["display_name"].to_list(), strict=True
    ):
        sm_clock, dram = clocks.get(kernel_id, (None, None))
        row = by_id.get(kernel_id, {})
        # (ceiling, value, unit, source, metric), report values first: the first one wins.
        found: list[tuple[str, float | None, str, str, str | None]] = []
        for precision, (op, weight) in mn.SIMT_PEAK_OPS.items():
            name = mn.simt_peak_names(op)[0]
            if row.get(name) and sm_clock:
                found.append(
                    (f"simt_{precision}", row[name] * weight * sm_clock, "flop/s", "report", name)
                )
        names = tensor_by_id.get(kernel_id, {})
        precisions = {c.src for c in map(mn.parse_tensor_counter, names) if c}
        for precision in sorted(precisions):
            dense = mn.dense_peak_counters(list(names), precision)
            best = max(
                ((names[c.metric], c.metric) for c in dense if names.get(c.metric)), default=None
            )
            if best and sm_clock:
                unit = "flop/s" if precision not in mn.INTEGER_SOURCES else "op/s"
                found.append((f"tensor_{precision}", best[0] * sm_clock, unit, "report", best[1]))
        if dram:
            found.append(("dram", dram, "byte/s", "report", mn.DRAM_PEAK_PER_CYCLE[0]))
        spec = find_spec(display)
        if spec is not None:
            found.append(("simt_fp32", spec.fp32_tflops * 1e12, "flop/s", "spec", None))
            found.append(("simt_fp64", spec.fp64_tflops * 1e12, "flop/s", "spec", None))
            for precision, tflops in spec.tensor_tflops.items():
                found.append((f"tensor_{precision}", tflops * 1e12, "flop/s", "spec", None))
            found.append(("dram", spec.bandwidth_gbps * 1e9, "byte/s", "spec", None))
        seen: set[str] = set()
        for ceiling, value, unit, source, metric in found:
            if value is not None and ceiling not in seen:
                seen.add(ceiling)
                rows.append(
                    {
                        "id": kernel_id,
                        "ceiling": ceiling,
                        "value": value,
                        "unit": unit,
                        "source": source,
                        "metric": metric,
                    }
                )
    schema: dict[str, pl.DataType | type[pl.DataType]] = {
        "id": pl.Int64,
        "ceiling": pl.Utf8,
        "value": pl.Float64,
        "unit": pl.Utf8,
        "source": pl.Utf8,
        "metric": pl.Utf8,
    }
    return pl.DataFrame(rows, schema=schema)


def roofline(report_or_metrics: Any, kernels: pl.DataFrame | None = None) -> pl.DataFrame:
    """Roofline coordinates per kernel: FLOPs (SIMT + tensor), DRAM bytes, intensity, ceilings.

    Parameters
    ----------
    report_or_metrics, kernels
        As for :func:`tensor_core_utilization`.

    Returns
    -------
    polars.DataFrame
        One row per kernel:

        * ``id``, ``short_name``, ``family``, ``nvtx_path``, ``duration_ns`` (ns)
        * ``simt_fp16_flop``, ``simt_fp32_flop``, ``simt_fp64_flop`` (FLOP): SASS
          add/mul/fma thread instructions × 1/1/2 (half: 2/2/4, as ncu's half roofline)
        * ``tensor_flop`` (FLOP), ``tensor_int_ops`` (integer tensor operations),
          ``tensor_precision``: as in :func:`tensor_core_utilization`
        * ``flop`` (operations: FLOPs, plus integer tensor operations for INT8 GEMMs): sum of the
          above that were captured; ``flop_sources`` lists them
          (``"simt"``, ``"tensor"``, ``"simt+tensor"``) — without tensor counters a GEMM's
          FLOPs are undercounted, so check it
        * ``dram_bytes`` (bytes), as in :func:`dram_bandwidth`
        * ``arithmetic_intensity`` (FLOP/byte): ``flop`` / ``dram_bytes``
        * ``flops_per_s`` (FLOP/s): ``flop`` / duration
        * ``dominant``: the path with most FLOPs (``tensor_bf16``, ``simt_fp32``…)
        * ``peak_flops_per_s`` (FLOP/s), ``peak_bandwidth_gbps`` (1e9 B/s): the ceilings of
          ``dominant`` and of DRAM (see :func:`roofline_ceilings`); ``peak_source``
        * ``ridge_point`` (FLOP/byte): ``peak_flops_per_s`` / peak bandwidth
        * ``attainable_flops_per_s`` (FLOP/s): min(peak, intensity × peak bandwidth)
        * ``pct_of_attainable`` (%; null when it cannot be computed), ``bound``
          (``"memory"`` left of the ridge, else ``"compute"``)
        * ``pct_of_attainable_reason``: why ``pct_of_attainable`` is null (``"no duration"``,
          ``"no FLOP counters in the report"``, ``"no FLOPs counted"`` — a copy, integer or
          data-movement kernel —, ``"no DRAM byte counters in the report"``,
          ``"no peak rate for <path>"``); null when it was computed
    """
    metrics, kernels = _inputs(report_or_metrics, kernels)
    base = _base(metrics, kernels)
    wide = base.select("id", "duration_ns").join(_wide(metrics, _simt_names()), on="id", how="left")
    simt = wide.select(
        "id", *[_simt_flop(wide, p).alias(f"simt_{p}_flop") for p in ("fp16", "fp32", "fp64")]
    )
    tensor = _tensor_table(metrics).select("id", "tensor_flop", "tensor_int_ops", "tensor_precision").with_columns(
        # tensor work in operations: FLOPs and integer ops (an INT8 GEMM counts 0 FLOPs otherwise)
        pl.when(pl.col("tensor_flop").is_not_null() | pl.col("tensor_int_ops").is_not_null())
        .then(pl.col("tensor_flop").fill_null(0) + pl.col("tensor_int_ops").fill_null(0)).alias("_tensor_ops")
    )
    dram = dram_bandwidth(metrics, kernels).select("id", "dram_bytes")
    out = (
        base.join(simt, on="id", how="left")
        .join(tensor, on="id", how="left")
        .join(dram, on="id", how="left")
    )
    simt_cols = ["simt_fp16_flop", "simt_fp32_flop", "simt_fp64_flop"]
    has_simt = pl.any_horizontal([pl.col(c).is_not_null() for c in simt_cols])
    has_tensor = pl.col("_tensor_ops").is_not_null()
    paths = {**{c: c.removesuffix("_flop") for c in simt_cols}}
    dominant: pl.Expr = pl.lit(None, pl.Utf8)
    best = pl.max_horizontal([pl.col(c).fill_null(0) for c in [*simt_cols, "_tensor_ops"]])
    for column, label in paths.items():
        dominant = (
            pl.when((pl.col(column).fill_null(0) == best) & (best > 0))
            .then(pl.lit(label))
            .otherwise(dominant)
        )
    dominant = (
        pl.when(has_tensor & (pl.col("_tensor_ops") == best) & (best > 0))
        .then(pl.lit("tensor_") + pl.col("tensor_precision"))
        .otherwise(dominant)
    )
    out = out.with_columns(
        pl.sum_horizontal([*simt_cols, "_tensor_ops"]).alias("flop"),
        pl.when(has_simt & has_tensor).then(pl.lit("simt+tensor"))
        .when(has_simt).then(pl.lit("simt"))
        .when(has_tensor).then(pl.lit("tensor")).alias("flop_sources"),
        dominant.alias("dominant"),
    ).with_columns(
        pl.when(pl.col("flop_sources").is_null()).then(None).otherwise(pl.col("flop")).alias("flop")
    )  # fmt: skip
    ceilings = roofline_ceilings(metrics, kernels)
    peaks = ceilings.rename(
        {"ceiling": "dominant", "value": "peak_flops_per_s", "source": "peak_source"}
    ).select("id", "dominant", "peak_flops_per_s", "peak_source")
    bandwidth = ceilings.filter(pl.col("ceiling") == "dram").select(
        "id", (pl.col("value") / 1e9).alias("peak_bandwidth_gbps")
    )
    out = out.join(peaks, on=["id", "dominant"], how="left").join(bandwidth, on="id", how="left")
    intensity = pl.col("flop") / pl.col("dram_bytes")
    ridge = pl.col("peak_flops_per_s") / (pl.col("peak_bandwidth_gbps") * 1e9)
    attainable = pl.min_horizontal(
        pl.col("peak_flops_per_s"), intensity * pl.col("peak_bandwidth_gbps") * 1e9
    )
    return out.with_columns(
        intensity.alias("arithmetic_intensity"),
        (pl.col("flop") / (pl.col("duration_ns") * 1e-9)).alias("flops_per_s"),
        ridge.alias("ridge_point"),
        attainable.alias("attainable_flops_per_s"),
    ).with_columns(
        # null, not NaN (0/0), when no FLOPs were counted (no tensor counters, a copy kernel)
        pl.when(pl.col("attainable_flops_per_s") > 0)
        .then(100.0 * pl.col("flops_per_s") / pl.col("attainable_flops_per_s")).alias("pct_of_attainable"),
        pl.when(pl.col("arithmetic_intensity").is_null() | pl.col("ridge_point").is_null()).then(None)
        .when(pl.col("arithmetic_intensity") < pl.col("ridge_point")).then(pl.lit("memory"))
        .otherwise(pl.lit("compute")).alias("bound"),
    ).with_columns(
        pl.when(pl.col("pct_of_attainable").is_not_null()).then(None)
        .when(pl.col("duration_ns").fill_null(0) <= 0).then(pl.lit("no duration"))
        .when(pl.col("flop_sources").is_null()).then(pl.lit("no FLOP counters in the report"))
        .when(pl.col("flop").fill_null(0) <= 0).then(pl.lit("no FLOPs counted"))
        .when(pl.col("dram_bytes").is_null()).then(pl.lit("no DRAM byte counters in the report"))
        .when(pl.col("peak_flops_per_s").is_null()).then(pl.format("no peak rate for {}", pl.col("dominant")))
        .otherwise(pl.lit("no attainable rate")).alias("pct_of_attainable_reason"),
    ).select(
        "id", *_KERNEL_COLUMNS, "duration_ns", *simt_cols, "tensor_flop", "tensor_int_ops", "tensor_precision", "flop", "flop_sources",
        "dram_bytes", "arithmetic_intensity", "flops_per_s", "dominant", "peak_flops_per_s", "peak_bandwidth_gbps",
        "peak_source", "ridge_point", "attainable_flops_per_s", "pct_of_attainable", "bound", "pct_of_attainable_reason",
    )  # fmt: skip
