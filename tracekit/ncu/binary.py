"""Reading ``.ncu-rep`` files with NVIDIA's ``ncu_report`` module (the ``ncu`` extra).

The module is imported on first use. Every value is read through the raw accessors
(``as_double``/``as_uint64``/``as_string``) chosen by the metric's kind, so a metric that is
an integer in one ncu version and a double in another lands in the same ``Float64`` column.
Objects from the module are SWIG proxies over C++ objects: the loaded context stays
referenced by :class:`BinaryReport` for as long as its actions are used.
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import polars as pl

from tracekit.errors import missing_extra
from tracekit.ncu import schema
from tracekit.ncu.container import Container
from tracekit.ncu.damage import capture_fd2, compare, instance_problems, ncu_messages

log = logging.getLogger(__name__)

_INT_KINDS = ("ValueKind_UINT32", "ValueKind_UINT64")
_FLOAT_KINDS = ("ValueKind_FLOAT", "ValueKind_DOUBLE")

#: Metrics the ``kernels`` table is built from (read one by one, without the whole table).
KERNEL_METRICS = (
    "launch__device_id",
    "launch__context_id",
    "launch__stream_id",
    "launch__grid_dim_x",
    "launch__grid_dim_y",
    "launch__grid_dim_z",
    "launch__block_dim_x",
    "launch__block_dim_y",
    "launch__block_dim_z",
    "launch__registers_per_thread",
    "launch__shared_mem_per_block_static",
    "launch__shared_mem_per_block_dynamic",
    "device__attribute_compute_capability_major",
    "device__attribute_compute_capability_minor",
    "gpu__time_duration.sum",
)


def import_ncu_report() -> ModuleType:
    """Import ``ncu_report`` or raise the one-line error naming the ``ncu`` extra."""
    try:
        with warnings.catch_warnings():
            # SWIG-generated modules warn about their builtin types on Python >= 3.12.
            warnings.simplefilter("ignore", DeprecationWarning)
            import ncu_report
    except ImportError:
        raise missing_extra("ncu-report", "ncu") from None
    module: ModuleType = ncu_report
    return module


def _labels(module: ModuleType, prefix: str) -> dict[int, str]:
    """``{MetricSubtype_PER_SECOND: "per_second", …}`` read from the module's constants."""
    out: dict[int, str] = {}
    for attr in dir(module):
        if attr.startswith(prefix + "_"):
            label = attr[len(prefix) + 1 :].lower()
            if label != "none":
                out[int(getattr(module, attr))] = label
    return out


class BinaryReport:
    """One ``.ncu-rep`` loaded with ``ncu_report``: iterates actions and reads their tables.

    :attr:`problems` lists the signs of damage found while loading (ncu's parse errors on
    fd 2, results without a name, metric counts short of ``container``'s); the instance-value
    count is checked when :meth:`metrics` or :meth:`instances` reads it
    (:attr:`late_problems`).
    """

    def __init__(
        self, path: Path, *, container: Container | None = None, capture: bool = True
    ) -> None:
        self.module = import_ncu_report()
        self.path = path
        self.container = container
        lines: list[str] = []
        with capture_fd2(lines) if capture else contextlib.nullcontext():
            self.context: Any = self.module.load_report(str(path))
            self._load_actions()
        #: Damage found at load, one sentence each (empty for a sound report).
        self.problems: list[str] = self._check() + ncu_messages(lines)[:1]
        #: Damage found later, by :meth:`metrics`/:meth:`instances` (instance-value counts).
        self.late_problems: list[str] = []

    def _load_actions(self) -> None:
        # The enums live on the SWIG classes (IMetric.ValueKind_STRING, …).
        probe = getattr(self.module, "IMetric", self.module)
        self._int_kinds = {int(getattr(probe, k)) for k in _INT_KINDS if hasattr(probe, k)}
        self._float_kinds = {int(getattr(probe, k)) for k in _FLOAT_KINDS if hasattr(probe, k)}
        self._string_kind = int(getattr(probe, "ValueKind_STRING", 2))
        self._types = _labels(probe, "MetricType")
        self._subtypes = _labels(probe, "MetricSubtype")
        self._rollups = _labels(probe, "RollupOperation")
        self.actions: list[tuple[int, int, Any]] = list(self._walk())
        self._names: list[tuple[str, ...]] = [
            tuple(act.metric_names()) for _, _, act in self.actions
        ]
        self._kernel_names: list[str | None] = [
            act.name(act.NameBase_FUNCTION) or None for _, _, act in self.actions
        ]

    @property
    def num_results(self) -> int:
        """Profiled results (kernels) ncu_report read."""
        return len(self.actions)

    def _check(self) -> list[str]:
        problems: list[str] = []
        if self.container is not None:
            found = list(zip(self._kernel_names, map(len, self._names), strict=True))
            problems += compare(self.container.shapes, found, announced=self.container.results)
        for action_id, (_, _, act) in enumerate(self.actions):
            # kernel names are join keys (nsys, diff): a damaged one is damage, not text to show
            kinds = (act.NameBase_FUNCTION, act.NameBase_DEMANGLED, act.NameBase_MANGLED)
            if any(not _is_utf8(act.name(kind) or "") for kind in kinds):
                problems.append(f"result {action_id} has a kernel name that is not valid UTF-8")
                break
        for action_id, names in enumerate(self._names):
            bad = sum(1 for name in names if not _is_utf8(name))
            if bad:
                problems.append(
                    f"result {action_id} has {bad} metric name(s) that are not valid UTF-8"
                )
                break
        return problems

    def _check_instances(self, counts: list[int]) -> None:
        if self.container is not None and not self.late_problems:
            self.late_problems += instance_problems(self.container.shapes, counts)

    def _metric(self, act: Any, name: str) -> Any:
        """``act.metric_by_name(name)``; None for a name SWIG cannot pass (invalid UTF-8)."""
        try:
            return act.metric_by_name(name)
        except TypeError:
            return None

    def _walk(self) -> Iterator[tuple[int, int, Any]]:
        """``(id, range_id, action)`` for every action; ids run across ranges like ncu's ``ID``."""
        next_id = 0
        for range_id in range(self.context.num_ranges()):
            rng = self.context.range_by_idx(range_id)
            for index in range(rng.num_actions()):
                yield next_id, range_id, rng.action_by_idx(index)
                next_id += 1

    # -- values ---------------------------------------------------------------------------

    def _read(self, metric: Any, index: int | None = None) -> tuple[float | None, str | None]:
        """``(value, text)`` of a metric (or one instance); NaN and absent values are null."""
        args = () if index is None else (index,)
        if index is None and not metric.has_value():
            return None, None
        kind = int(metric.kind(*args))
        if kind in self._float_kinds:
            number = float(metric.as_double(*args))
            return (None if math.isnan(number) else number), None
        if kind in self._int_kinds:
            integer = int(metric.as_uint64(*args))
            # Float64 holds integers exactly up to 2**53; keep larger ones exact in text.
            return float(integer), (str(integer) if integer > 2**53 else None)
        if kind == self._string_kind:
            return None, metric.as_string(*args) or None
        return None, None

    # -- tables -----------------------------------------------------------------------------

    def kernel_rows(self) -> tuple[list[dict[str, Any]], pl.DataFrame]:
        """Identity rows per action, and the long frame of :data:`KERNEL_METRICS`."""
        rows: list[dict[str, Any]] = []
        ids: list[int] = []
        names: list[str] = []
        values: list[float | None] = []
        for action_id, range_id, act in self.actions:
            paths = _nvtx_paths(act)
            default = next((p["path"] for p in paths if p["domain"] == "<default domain>"), None)
            rows.append(
                {
                    "id": action_id,
                    "range_id": range_id,
                    "name": act.name(act.NameBase_DEMANGLED),
                    "short_name": act.name(act.NameBase_FUNCTION),
                    "mangled_name": act.name(act.NameBase_MANGLED),
                    "workload_type": schema.WORKLOAD_TYPES.get(int(act.workload_type()), "unknown"),
                    "nvtx_path": default,
                    "nvtx_paths": paths,
                }
            )
            for name in KERNEL_METRICS:
                metric = self._metric(act, name)
                if metric is None:
                    continue
                ids.append(action_id)
                names.append(name)
                values.append(self._read(metric)[0])
        frame = _frame(
            {"id": ids, "metric": names, "value": values},
            schema={"id": pl.Int64, "metric": pl.Utf8, "value": pl.Float64},
        )
        return _scrub(rows), frame

    def metrics(self) -> pl.DataFrame:
        """The long ``metrics`` table (see :data:`tracekit.ncu.schema.METRICS`)."""
        cols: dict[str, list[Any]] = {name: [] for name in schema.METRICS}
        counts: list[int] = []
        unreadable: list[tuple[int, str]] = []
        for action_id, _, act in self.actions:
            count = 0
            for name in self._names[action_id]:
                metric = self._metric(act, name)
                if metric is None:
                    unreadable.append((action_id, name))
                    continue
                count += int(metric.num_instances())
                value, text = self._read(metric)
                cols["id"].append(action_id)
                cols["metric"].append(name)
                cols["value"].append(value)
                cols["text"].append(text)
                cols["unit"].append(metric.unit() or None)
                cols["metric_type"].append(self._types.get(int(metric.metric_type())))
                cols["subtype"].append(_enum(metric.metric_subtype(), self._subtypes))
                cols["rollup"].append(_enum(metric.rollup_operation(), self._rollups))
                cols["num_instances"].append(int(metric.num_instances()))
            counts.append(count)
        self._check_instances(counts)
        readable = [(i, n) for i, n in unreadable if _is_utf8(n)]  # the others: at load
        if (
            readable
            and self.container is not None
            and not any("cannot be read" in p for p in self.late_problems)
        ):
            action_id, name = readable[0]
            self.late_problems.append(
                f"result {action_id} lists metric {name!r} but it cannot be read "
                f"({len(readable)} such metric(s) in all)"
            )
        return _frame(cols, schema=dict(schema.METRICS))

    def instances(self, metrics: list[str] | None = None) -> pl.DataFrame:
        """The long ``instances`` table: one row per instance value of instanced metrics."""
        cols: dict[str, list[Any]] = {name: [] for name in schema.INSTANCES}
        wanted = set(metrics) if metrics is not None else None
        counts: list[int] = []
        for action_id, _, act in self.actions:
            counts.append(0)
            for name in self._names[action_id]:
                if wanted is not None and name not in wanted:
                    continue
                metric = self._metric(act, name)
                if metric is None or metric.num_instances() == 0:
                    continue
                counts[-1] += int(metric.num_instances())
                corr = metric.correlation_ids() if metric.has_correlation_ids() else None
                for i in range(int(metric.num_instances())):
                    value, text = self._read(metric, i)
                    cid, ctext = (None, None) if corr is None else self._read(corr, i)
                    cols["id"].append(action_id)
                    cols["metric"].append(name)
                    cols["instance"].append(i)
                    cols["correlation_id"].append(
                        int(cid) if cid is not None and ctext is None and cid < 2**63 else None
                    )
                    cols["correlation_text"].append(ctext)
                    cols["value"].append(value)
                    cols["text"].append(text)
        if wanted is None:
            self._check_instances(counts)
        return _frame(cols, schema=dict(schema.INSTANCES))

    def rules(self) -> pl.DataFrame:
        """One row per rule result (``IAction.rule_results_as_dicts``)."""
        rows: list[dict[str, Any]] = []
        for action_id, _, act in self.actions:
            for result in act.rule_results_as_dicts():
                message = result.get("rule_message") or {}
                speedup = result.get("speedup_estimation") or {}
                rows.append(
                    {
                        "id": action_id,
                        "rule_id": result.get("rule_identifier"),
                        "rule_name": result.get("name"),
                        "section": result.get("section_identifier"),
                        "title": message.get("title") or None,
                        "message": schema.strip_markup(message.get("message")),
                        "type": schema.RULE_TYPES.get(int(message.get("type", 0))),
                        "speedup_type": (
                            schema.SPEEDUP_TYPES.get(int(speedup["type"])) if speedup else None
                        ),
                        "estimated_speedup_pct": speedup.get("speedup") if speedup else None,
                        "focus_metrics": [f.get("name") for f in result.get("focus_metrics") or []],
                    }
                )
        if not rows:
            return schema.empty(schema.RULES)
        return schema.conform(_frame(rows, infer_schema_length=None), schema.RULES)


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _scrub(data: Any) -> Any:
    """``data`` with strings that are not valid UTF-8 decoded with U+FFFD (``ncu_report`` hands
    such bytes over as lone surrogates, which polars cannot store); warns once per call."""
    found = 0

    def clean(value: Any) -> Any:
        nonlocal found
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                found += 1
                return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            return value
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    out = clean(data)
    if found:
        warnings.warn(
            f"{found} text value(s) in the Nsight Compute report are not valid UTF-8 (a damaged "
            "report?); shown with U+FFFD replacement characters",
            stacklevel=3,
        )
    return out


def _frame(data: Any, **kwargs: Any) -> pl.DataFrame:
    """``pl.DataFrame(data, **kwargs)``, scrubbing invalid UTF-8 first only when polars refuses it."""
    try:
        return pl.DataFrame(data, **kwargs)
    except UnicodeEncodeError:
        return pl.DataFrame(_scrub(data), **kwargs)


def _enum(value: Any, labels: dict[int, str]) -> str | None:
    if value is None:
        return None
    return labels.get(int(value))


def _nvtx_paths(act: Any) -> list[dict[str, str]]:
    """Push/pop stack per NVTX domain, outermost first, as ``[{domain, path}]``."""
    state = act.nvtx_state()
    if state is None:
        return []
    paths: list[dict[str, str]] = []
    for domain_id in state.domains():
        info = state[domain_id]
        stack = [str(name) for name in info.push_pop_ranges()]
        if stack:
            paths.append({"domain": str(info.name()), "path": "/".join(stack)})
    return paths
