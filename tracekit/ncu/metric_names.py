"""Metric names behind tracekit's ncu views, per architecture, and the tensor-counter parser.

Candidates are tried in order and the first present in a report wins, so one list serves
every chip: names that exist on one architecture only simply never match on another.
``docs/ncu.md`` has the per-architecture table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# -- Tensor Core pipe utilisation ----------------------------------------------------------
#: Suffixes tried for pipe-busy percentages: elapsed cycles first (what ncu's own
#: "Tensor Core utilization" rules use), then active cycles.
PIPE_PCT_SUFFIXES = (".avg.pct_of_peak_sustained_elapsed", ".avg.pct_of_peak_sustained_active")

#: Any tensor pipe busy: ``_v2`` on CC 8.9 (the stock section uses it there), else plain.
TENSOR_PIPE = ("sm__pipe_tensor_cycles_active_v2", "sm__pipe_tensor_cycles_active")
#: tcgen05 (UTC*MMA) pipe on CC 10.x, a separate pipeline from the legacy tensor pipe.
TC_PIPE = ("sm__pipe_tc_cycles_active",)
HMMA_PIPE = (
    "sm__pipe_tensor_op_hmma_cycles_active_v2",
    "sm__pipe_tensor_op_hmma_cycles_active",
    "sm__pipe_tensor_subpipe_hmma_cycles_active",
)
IMMA_PIPE = (
    "sm__pipe_tensor_op_imma_cycles_active_v2",
    "sm__pipe_tensor_op_imma_cycles_active",
    "sm__pipe_tensor_subpipe_imma_cycles_active",
)
DMMA_PIPE = ("sm__pipe_tensor_op_dmma_cycles_active", "sm__pipe_tensor_subpipe_dmma_cycles_active")

# -- Clocks, duration ------------------------------------------------------------------------
DURATION = "gpu__time_duration.sum"
SM_CLOCK = (
    "sm__cycles_elapsed.avg.per_second",
    "gpc__cycles_elapsed.avg.per_second",
    "smsp__cycles_elapsed.avg.per_second",
)
SMSP_CYCLES = ("smsp__cycles_elapsed.avg", "sm__cycles_elapsed.avg")
SMSP_CLOCK = ("smsp__cycles_elapsed.avg.per_second", "sm__cycles_elapsed.avg.per_second")
DRAM_CLOCK = ("dram__cycles_elapsed.avg.per_second",)

# -- DRAM and caches ------------------------------------------------------------------------
DRAM_READ = ("dram__bytes_read.sum", "dram__bytes_op_read.sum")  # _op_ on gb202
DRAM_WRITE = ("dram__bytes_write.sum", "dram__bytes_op_write.sum")
DRAM_TOTAL = ("dram__bytes.sum",)
DRAM_RATE = ("dram__bytes.sum.per_second",)
DRAM_PEAK_PER_CYCLE = ("dram__bytes.sum.peak_sustained",)
DRAM_THROUGHPUT_PCT = (
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
)
L1_HIT_PCT = ("l1tex__t_sector_hit_rate.pct",)
L2_HIT_PCT = ("lts__t_sector_hit_rate.pct",)

# -- Speed of light ---------------------------------------------------------------------------
COMPUTE_SOL = ("sm__throughput.avg.pct_of_peak_sustained_elapsed",)
MEMORY_SOL = ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",)
L1_SOL = ("l1tex__throughput.avg.pct_of_peak_sustained_active",)
L2_SOL = ("lts__throughput.avg.pct_of_peak_sustained_elapsed",)
ACHIEVED_OCCUPANCY = ("sm__warps_active.avg.pct_of_peak_sustained_active",)
THEORETICAL_OCCUPANCY = ("sm__maximum_warps_per_active_cycle_pct",)

# -- SIMT FLOPs (SASS thread instructions; FLOPs per instruction as ncu's rooflines) ---------
#: precision → [(opcode, FLOPs per thread instruction)]
SIMT_OPS: dict[str, tuple[tuple[str, int], ...]] = {
    "fp32": (("fadd", 1), ("fmul", 1), ("ffma", 2)),
    "fp64": (("dadd", 1), ("dmul", 1), ("dfma", 2)),
    "fp16": (("hadd", 2), ("hmul", 2), ("hfma", 4)),
}
#: precision → (peak opcode, FLOPs per instruction) for the SIMT ceiling.
SIMT_PEAK_OPS = {"fp32": ("ffma", 2), "fp64": ("dfma", 2), "fp16": ("hfma", 4)}


def simt_count_names(op: str) -> tuple[str, ...]:
    """Names giving a thread-instruction count for opcode ``op`` (sum over the GPU)."""
    return (
        f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum",
        f"sm__sass_thread_inst_executed_op_{op}_pred_on.sum",
    )


def simt_rate_names(op: str) -> tuple[str, ...]:
    """Per-elapsed-cycle rates of opcode ``op`` (what the roofline sections collect)."""
    return (f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum.per_cycle_elapsed",)


def simt_peak_names(op: str) -> tuple[str, ...]:
    """Per-cycle peak thread instructions of opcode ``op`` over the whole GPU."""
    return (f"sm__sass_thread_inst_executed_op_{op}_pred_on.sum.peak_sustained",)


# -- Tensor FLOPs ----------------------------------------------------------------------------
_TENSOR = re.compile(
    r"^sm__ops_path_tensor_(?:op_(?P<op>[a-z0-9]+)_)?src_(?P<src>[a-z0-9_]+?)"
    r"(?:_dst_(?P<dst>[a-z0-9]+))?(?:_sparsity_(?P<sparsity>on|off))?"
    r"(?P<realtime>_realtime)?\.sum(?P<suffix>\.peak_sustained)?$"
)
INTEGER_SOURCES = ("int1", "int4", "int8")


@dataclass(frozen=True)
class TensorCounter:
    """One parsed ``sm__ops_path_tensor_*`` name."""

    metric: str
    op: str | None  # instruction path (hmma, hgmma, utchmma…); None for aggregates
    src: str  # source type(s): bf16, fp16, tf32, fp8, fp64, fp4_fp6_fp8, …
    dst: str | None
    sparsity: str | None  # "on", "off" or None (no split)
    peak: bool  # the name ends in .sum.peak_sustained

    @property
    def precision(self) -> str:
        """The label tracekit reports: the source type (``bf16``, ``fp8``, ``fp4_fp6_fp8``)."""
        return self.src

    @property
    def is_float(self) -> bool:
        return self.src not in INTEGER_SOURCES


def parse_tensor_counter(name: str) -> TensorCounter | None:
    """Parse ``sm__ops_path_tensor_…{.sum,.sum.peak_sustained}``; None for other names
    (including ``_realtime`` variants, which duplicate the plain counters)."""
    match = _TENSOR.match(name)
    if match is None or match.group("realtime"):
        return None
    return TensorCounter(
        metric=name,
        op=match.group("op"),
        src=match.group("src"),
        dst=match.group("dst"),
        sparsity=match.group("sparsity"),
        peak=match.group("suffix") is not None,
    )


def tensor_flop_terms(names: list[str], *, integer: bool = False) -> list[TensorCounter]:
    """The ``.sum`` counters whose values add up to a kernel's tensor FLOPs, without double
    counting.

    * Prefer aggregate counters (no ``_op_``); use per-instruction-path counters only when a
      report has no aggregate at all.
    * Per ``(op, src, dst)``: the plain counter if present, else ``_sparsity_on`` +
      ``_sparsity_off`` (the plain one is their sum).
    * Drop a ``src_X_dst_Y`` counter when ``src_X`` (all destinations) is present.
    * Integer sources count operations, not FLOPs: left out, unless ``integer`` (then only
      they are chosen: the integer tensor operations, 2 per MAC like FLOPs).
    """
    parsed = [
        c for c in (parse_tensor_counter(n) for n in names) if c and not c.peak and c.is_float != integer
    ]
    aggregates = [c for c in parsed if c.op is None]
    chosen = aggregates if aggregates else [c for c in parsed if c.op is not None]
    groups: dict[tuple[str | None, str, str | None], list[TensorCounter]] = {}
    for c in chosen:
        groups.setdefault((c.op, c.src, c.dst), []).append(c)
    terms: list[TensorCounter] = []
    for (op, src, dst), members in groups.items():
        if dst is not None and (op, src, None) in groups:
            continue
        plain = [c for c in members if c.sparsity is None]
        terms.extend(plain if plain else members)
    return sorted(terms, key=lambda c: c.metric)


def dense_peak_counters(names: list[str], precision: str) -> list[TensorCounter]:
    """``.sum.peak_sustained`` counters giving the dense peak of ``precision``.

    Dense means ``_sparsity_off`` where a sparsity split exists (on Hopper an aggregate's
    peak is the *sparse* rate), else counters without a split (fp64). The caller takes the
    largest (wgmma paths beat mma.sync paths: 540,672 vs 360,448 bf16 ops/cycle on H100).
    """
    parsed = [
        c for c in (parse_tensor_counter(n) for n in names) if c and c.peak and c.src == precision
    ]
    dense = [c for c in parsed if c.sparsity == "off"]
    if dense:
        return dense
    split = {(c.op, c.src, c.dst) for c in parsed if c.sparsity is not None}
    return [c for c in parsed if c.sparsity is None and (c.op, c.src, c.dst) not in split]
