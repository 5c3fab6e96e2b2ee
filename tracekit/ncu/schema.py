"""The documented schema of every table :class:`~tracekit.ncu.report.NcuReport` returns.

``docs/tables_ncu.md`` describes each column; a test keeps the two in step. Both loaders
(the ``ncu_report`` module and ncu's raw CSV) cast their output to these schemas, so a
table's shape never depends on how a report was read or which ncu version wrote it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import polars as pl

SCHEMA_VERSION = "1.0"

I64 = pl.Int64
F64 = pl.Float64
STR = pl.Utf8

NVTX_PATHS = pl.List(pl.Struct({"domain": STR, "path": STR}))

Schema = Mapping[str, pl.DataType | type[pl.DataType]]

KERNELS: Schema = {
    "id": I64,
    "range_id": I64,
    "pid": I64,
    "tid": I64,
    "process_name": STR,
    "name": STR,
    "short_name": STR,
    "mangled_name": STR,
    "workload_type": STR,
    "device_id": I64,
    "context_id": I64,
    "stream_id": I64,
    "grid_x": I64,
    "grid_y": I64,
    "grid_z": I64,
    "block_x": I64,
    "block_y": I64,
    "block_z": I64,
    "registers_per_thread": I64,
    "static_shared_memory_bytes": I64,
    "dynamic_shared_memory_bytes": I64,
    "compute_capability": STR,
    "nvtx_path": STR,
    "nvtx_paths": NVTX_PATHS,
    "duration_ns": I64,
    "family": STR,
}

#: The ``kernels`` columns read from a result itself (the rest come from its metrics).
IDENTITY_COLUMNS = (
    "id", "range_id", "name", "short_name", "mangled_name", "workload_type", "nvtx_path", "nvtx_paths",
)  # fmt: skip

METRICS: Schema = {
    "id": I64,
    "metric": STR,
    "value": F64,
    "text": STR,
    "unit": STR,
    "metric_type": STR,
    "subtype": STR,
    "rollup": STR,
    "num_instances": I64,
}

INSTANCES: Schema = {
    "id": I64,
    "metric": STR,
    "instance": I64,
    "correlation_id": I64,
    "correlation_text": STR,
    "value": F64,
    "text": STR,
}

RULES: Schema = {
    "id": I64,
    "rule_id": STR,
    "rule_name": STR,
    "section": STR,
    "title": STR,
    "message": STR,
    "type": STR,
    "speedup_type": STR,
    "estimated_speedup_pct": F64,
    "focus_metrics": pl.List(STR),
}

#: Leading columns of ``devices``; one column per ``device__attribute_*`` metric follows.
DEVICES_LEADING: Schema = {
    "device_id": I64,
    "display_name": STR,
    "compute_capability": STR,
}

#: ncu's rule-message kinds (``MsgType``) and the labels of its details CSV.
RULE_TYPES = {0: "none", 1: "info", 2: "optimization", 3: "warning", 4: "error"}
RULE_TYPES_CSV = {"INF": "info", "OPT": "optimization", "WRN": "warning", "ERR": "error"}
SPEEDUP_TYPES = {0: "unknown", 1: "local", 2: "global"}
WORKLOAD_TYPES = {0: "kernel", 1: "range", 2: "graph", 3: "cmdlist", 4: "subgrid_schedule"}


def empty(schema: Schema) -> pl.DataFrame:
    """An empty frame with ``schema``."""
    return pl.DataFrame(schema=dict(schema))


def conform(frame: pl.DataFrame, schema: Schema) -> pl.DataFrame:
    """Select ``schema``'s columns in order, cast to its dtypes; absent columns become null."""
    exprs = [
        (pl.col(name) if name in frame.columns else pl.lit(None)).cast(dtype).alias(name)
        for name, dtype in schema.items()
    ]
    return frame.select(exprs)


# ---------------------------------------------------------------------------------------
# Names


_ROLLUPS = ("sum", "avg", "min", "max")
_RATIO_SUFFIXES = ("ratio", "pct", "max_rate")


def split_metric_name(name: str) -> tuple[str, str | None, str | None]:
    """``(base, rollup, subtype)`` of a metric name by ncu's suffix grammar.

    ``dram__bytes.sum.per_second`` → ``("dram__bytes", "sum", "per_second")``;
    ``sm__throughput.avg.pct_of_peak_sustained_elapsed`` → ``(…, "avg",
    "pct_of_peak_sustained_elapsed")``; ``lts__t_sector_hit_rate.pct`` → ``(…, None, None)``;
    names without a suffix (``launch__grid_size``) → ``(name, None, None)``.
    """
    parts = name.split(".")
    if len(parts) >= 2 and parts[1] in _ROLLUPS:
        rest = "_".join(parts[2:]) or None
        return parts[0], parts[1], rest
    return parts[0], None, None


def infer_metric_type(name: str) -> str | None:
    """ncu's metric type guessed from a name (for the CSV loader, which has no types).

    ``counter`` for ``<base>.<rollup>…``, ``throughput`` when the base names a throughput,
    ``ratio`` for ``.ratio``/``.pct``/``.max_rate``, ``other`` for launch/device attributes;
    ``None`` where the name does not say (derived and sampled metrics).
    """
    if "." not in name:
        return "other" if name.startswith(("launch__", "device__", "profiler__")) else None
    parts = name.split(".")
    if len(parts) != 2 and parts[1] not in _ROLLUPS:
        return None
    if parts[-1] in _RATIO_SUFFIXES and len(parts) == 2:
        return "ratio"
    if parts[1] in _ROLLUPS:
        if name.startswith(("derived__", "profiler__")):
            return None
        return "throughput" if "throughput" in parts[0] else "counter"
    return None


def enum_label(prefix: str, value: object, labels: Mapping[int, str]) -> str | None:
    """``MetricSubtype_PER_SECOND``-style enum value → ``"per_second"``."""
    if value is None:
        return None
    label = labels.get(int(value))  # type: ignore[call-overload]
    if label is None:
        return f"{prefix.lower()}_{int(value)}"  # type: ignore[call-overload]
    return label


_LINKS = (
    (re.compile(r"@url:([^:@]*):([^@\s]+)@"), r"\1 (\2)"),
    (re.compile(r"@section:[^:@]*:([^@]*)@"), r"\1"),
    (re.compile(r"@sass:[^:@]*:([^@]*)@"), r"\1"),
    (re.compile(r"@source:[^@]*:\d+:([^@]*)@"), r"\1"),
)


def strip_markup(message: str | None) -> str | None:
    """Render ncu's rule-message link markup as its details CSV does.

    ``@section:Id:Text@`` → ``Text``; ``@url:Text:https://…@`` → ``Text (https://…)``;
    ``@sass:addr:Text@`` and ``@source:file:line:Text@`` → ``Text``.
    """
    if message is None:
        return None
    for pattern, repl in _LINKS:
        message = pattern.sub(repl, message)
    return message


def short_name_of(demangled: str | None) -> str | None:
    """The function name of a demangled kernel name, without scope, template or arguments.

    ``void at::native::vectorized_elementwise_kernel<4, …>(int, T2, T3)`` →
    ``vectorized_elementwise_kernel``; extern-C names come back unchanged. This is ncu's
    ``NameBase_FUNCTION`` and nsys's ``shortName`` for the names seen so far; the CSV loader
    uses it because ncu's CSV carries only the (renamed) demangled name.
    """
    if not demangled:
        return demangled
    text = demangled.replace("(anonymous namespace)", "{anon}").replace("<unnamed>", "{anon}")
    depth = 0
    end = len(text)
    for i, ch in enumerate(text):
        if ch in "<[":
            depth += 1
        elif ch in ">]":
            depth -= 1
        elif ch == "(" and depth == 0:
            end = i
            break
    head = text[:end]
    # drop template arguments at depth 0
    out: list[str] = []
    depth = 0
    for ch in head:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    qualified = "".join(out).strip().split(" ")[-1]
    return qualified.split("::")[-1] or demangled
