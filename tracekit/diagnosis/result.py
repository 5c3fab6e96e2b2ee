"""Findings and the :class:`Diagnosis` that holds them (frame, evidence, JSON, Markdown, text)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from tracekit.diagnosis.text import _evidence_line, fmt_ns  # noqa: F401 - re-exported

__all__ = ["CATEGORIES", "SEVERITIES", "Diagnosis", "Finding", "Window"]

#: The categories a finding can have (rules may add more in later versions).
CATEGORIES = (
    "host_bound", "launch_bound", "graph_launch", "sync_stall", "pageable_memcpy", "data_movement", "no_tensor_cores", "memory_growth",
    "exposed_communication", "straggler", "load_imbalance", "low_gpu_utilization",
    "memory_bound_kernel", "compute_bound_kernel", "below_model_bound", "warmup", "trace_coverage",
)
SEVERITIES = ("high", "medium", "low", "info")
_SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}

FINDING_SCHEMA: dict[str, Any] = {
    "category": pl.Utf8, "severity": pl.Utf8, "time_ns": pl.Int64, "share": pl.Float64, "title": pl.Utf8,
    "advice": pl.Utf8, "next": pl.List(pl.Utf8),
}
COLUMNS = ("category", "severity", "time_ns", "share", "title", "evidence", "advice", "next")


def _evidence_column(findings: list[Finding]) -> pl.Series:
    """The findings' evidence rows as one ``List(Struct)`` column: the struct holds the union
    of the rows' fields (null where a finding's rows lack one). Should two findings give one
    field different types, every value is kept as text instead."""
    rows = [f.evidence.to_dicts() if f.evidence.height else [] for f in findings]
    try:
        return pl.Series("evidence", rows, strict=False)
    except (pl.exceptions.PolarsError, TypeError, ValueError):
        text = [[{k: None if v is None else str(v) for k, v in r.items()} for r in rs] for rs in rows]
        return pl.Series("evidence", text, strict=False)


@dataclass
class Finding:
    """One finding: what is wrong, what it costs, the rows that show it, what to try next.

    ``time_ns`` is the steady-state time the problem costs in the analysed window (null for
    findings that cost no time, such as memory growth, or that only say a rule could not
    run); ``share`` is ``time_ns`` over the window's length.
    """

    category: str
    severity: str
    title: str
    time_ns: int | None = None
    share: float | None = None
    evidence: pl.DataFrame = field(default_factory=pl.DataFrame)
    advice: str = ""
    next: list[str] = field(default_factory=list)
    #: Categories of findings this one causes (their time is this one's effect elsewhere: the
    #: ranks a straggler keeps waiting look host-bound or exposed): it is listed before them.
    causes: tuple[str, ...] = ()


def _ordered(findings: list[Finding]) -> list[Finding]:
    """Most severe first, then most time at stake; a finding that causes others (``causes``)
    just before the first of them when they would come first."""
    def key(f: Finding) -> tuple[int, float, int]:
        return _SEVERITY_RANK.get(f.severity, 9), -(f.time_ns if f.time_ns is not None else -1), 1

    keys = {id(f): key(f) for f in findings}
    for f in findings:
        effects = [keys[id(o)] for o in findings if o is not f and o.category in f.causes]
        if effects:
            first = min(effects)
            keys[id(f)] = min(keys[id(f)], (first[0], first[1], 0))
    return sorted(findings, key=lambda f: keys[id(f)])


@dataclass(frozen=True)
class Window:
    """The steady-state window the findings are about.

    ``method`` is ``nvtx`` (iterations from NVTX ranges), ``forwards`` (NVTX ranges of one
    forward each), ``graph_replays``, ``kernel_loop`` (the kernels that run once per iteration:
    :mod:`tracekit.analysis.run.structure`), ``given`` (passed by the caller) or ``whole_trace``;
    ``reason`` says why; ``steps`` counts the steady iterations in it (0 when none);
    ``warmup_steps`` the leading ones excluded; ``step_ns`` is the median steady iteration.

    On big traces the rules run on a sample: ``sample_steps`` consecutive steady iterations
    from the middle of the window, ``sample_start_ns``…``sample_end_ns`` (``sample_steps`` = 0
    when the whole window is analysed); times at stake are then scaled by ``scale``.
    """

    start_ns: int
    end_ns: int
    method: str
    reason: str
    steps: int = 0
    warmup_steps: int = 0
    step_ns: int | None = None
    iterations: pl.DataFrame = field(default_factory=pl.DataFrame, compare=False)
    sample_start_ns: int | None = None
    sample_end_ns: int | None = None
    sample_steps: int = 0

    @property
    def duration_ns(self) -> int:
        return max(self.end_ns - self.start_ns, 0)

    @property
    def sampled(self) -> bool:
        return self.sample_start_ns is not None and self.sample_end_ns is not None

    @property
    def scale(self) -> float:
        """Window time ÷ analysed time: steady steps ÷ sampled steps, else the length ratio."""
        if not self.sampled:
            return 1.0
        if self.steps and self.sample_steps:
            return self.steps / self.sample_steps
        span = (self.sample_end_ns or 0) - (self.sample_start_ns or 0)
        return self.duration_ns / span if span > 0 else 1.0

    def analysed(self) -> Window:
        """The window the rules look at: the sample when there is one, else this window."""
        if not self.sampled:
            return self
        its = self.iterations
        if its.height and "w_start" in its.columns:
            its = its.filter((pl.col("w_start") >= self.sample_start_ns) & (pl.col("w_end") <= self.sample_end_ns))
        return Window(
            int(self.sample_start_ns or 0), int(self.sample_end_ns or 0), self.method, self.reason,
            steps=self.sample_steps, warmup_steps=0, step_ns=self.step_ns, iterations=its,
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "start_ns": self.start_ns, "end_ns": self.end_ns, "duration_ns": self.duration_ns, "method": self.method,
            "reason": self.reason, "steps": self.steps, "warmup_steps": self.warmup_steps, "step_ns": self.step_ns,
            "sample_start_ns": self.sample_start_ns, "sample_end_ns": self.sample_end_ns,
            "sample_steps": self.sample_steps, "scale": self.scale,
        }


def _evidence_records(frame: pl.DataFrame) -> list[dict[str, Any]]:
    return frame.to_dicts() if frame.height else []


class Diagnosis:
    """What :func:`tracekit.diagnose` found.

    ``findings`` is a polars frame, one row per finding, sorted by severity and then by time at
    stake (largest first): ``category``, ``severity``, ``time_ns``, ``share``, ``title``,
    ``evidence`` (JSON text of the rows behind it; :meth:`evidence` gives them as a frame),
    ``advice``, ``next`` (list of commands). ``window`` is the analysed :class:`Window`.
    """

    def __init__(self, trace_name: str, window: Window, findings: list[Finding], *, phases: pl.DataFrame | None = None,
                 gpu_time: pl.DataFrame | None = None, structure: Any = None, training: pl.DataFrame | None = None,
                 periodic: pl.DataFrame | None = None, training_steps: pl.DataFrame | None = None) -> None:
        self.trace_name = trace_name
        self.window = window
        #: The run's structure (:class:`tracekit.analysis.run.structure.RunStructure`): its kind,
        #: iterations, warm-up, start-up and, for a generation or a server, its requests; the
        #: window is its steady iterations. ``None`` for a set reduced on Dask.
        self.structure = structure
        #: A training run's steady step taken apart (:func:`tracekit.analysis.run.training.
        #: training_summary`: forward, backward, optimizer with compute and exposed
        #: communication, medians per step, ns); empty for other runs.
        self.training = training if training is not None else pl.DataFrame()
        #: A training run's periodic work between steps (:func:`tracekit.analysis.run.training.
        #: periodic_summary`: evaluations, checkpoint saves with count and time, ns), set apart
        #: from the steps' figures; empty when none was seen.
        self.periodic = periodic if periodic is not None else pl.DataFrame()
        #: Every steady training step's phases and periodic work, per GPU (:func:`tracekit.
        #: analysis.run.training.training_phases`, ns): what :attr:`training` and :attr:`periodic`
        #: summarize; empty for other runs.
        self.training_steps = training_steps if training_steps is not None else pl.DataFrame()
        #: :func:`tracekit.analysis.run.phases.phase_summary` of the trace (with the model's MFU/MBU
        #: when ``diagnose(model=…)``); empty when no generation phases were found.
        self.phases = phases if phases is not None else pl.DataFrame()
        #: Per (``rank``,) ``device_id`` in the analysed window: ``window_ns``, ``busy_ns`` (union of
        #: its GPU work), ``idle_ns``, ``utilization`` and, when the trace communicates,
        #: ``communication_only_ns`` (communication not overlapped by compute); empty for a set
        #: reduced on Dask.
        self.gpu_time = gpu_time if gpu_time is not None else pl.DataFrame()
        self._findings = _ordered(findings)

    def __repr__(self) -> str:
        return f"Diagnosis({self.trace_name!r}, {len(self._findings)} findings, window={self.window.method})"

    def _repr_html_(self) -> str:
        """Jupyter's rich display: the time bar and one card per finding
        (:func:`tracekit.diagnosis.html.diagnosis_html`)."""
        from tracekit.diagnosis.html import diagnosis_html

        return diagnosis_html(self)

    def __len__(self) -> int:
        return len(self._findings)

    @property
    def items(self) -> list[Finding]:
        """The findings as :class:`Finding` objects, in the frame's order."""
        return list(self._findings)

    @property
    def findings(self) -> pl.DataFrame:
        rows = [
            {"category": f.category, "severity": f.severity, "time_ns": f.time_ns, "share": f.share, "title": f.title,
             "advice": f.advice, "next": f.next}
            for f in self._findings
        ]
        frame = pl.DataFrame(rows, schema=FINDING_SCHEMA)
        if not self._findings:
            return frame.with_columns(pl.lit(None, pl.List(pl.Struct({"row": pl.Utf8}))).alias("evidence")).select(COLUMNS)
        return frame.with_columns(_evidence_column(self._findings)).select(COLUMNS)

    def evidence(self, i: int) -> pl.DataFrame:
        """The rows behind finding ``i`` (its position in :attr:`findings`)."""
        return self._findings[i].evidence

    def top(self, n: int = 3, *, min_severity: str = "low") -> list[Finding]:
        """The first ``n`` findings at or above ``min_severity``."""
        limit = _SEVERITY_RANK[min_severity]
        return [f for f in self._findings if _SEVERITY_RANK.get(f.severity, 9) <= limit][:n]

    def to_dict(self) -> dict[str, Any]:
        return {
            "trace": self.trace_name,
            "structure": self.structure.as_dict() if self.structure is not None else None,
            "window": self.window.as_dict(),
            "phases": self.phases.to_dicts(),
            "training": self.training.to_dicts(),
            "periodic": self.periodic.to_dicts(),
            "findings": [
                {
                    "category": f.category, "severity": f.severity, "time_ns": f.time_ns, "share": f.share,
                    "title": f.title, "evidence": _evidence_records(f.evidence), "advice": f.advice, "next": f.next,
                }
                for f in self._findings
            ],
        }

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=str)

    def window_text(self) -> str:
        w = self.window
        steps = (f", {w.steps} steps" + (f" of {fmt_ns(w.step_ns)} (median)" if w.step_ns else "")) if w.steps else ""
        warm = f", {w.warmup_steps} warm-up step(s) excluded" if w.warmup_steps else ""
        sample = ""
        if w.sampled:
            what = (f"{w.sample_steps} step{'s' if w.sample_steps != 1 else ''}" if w.sample_steps
                    else fmt_ns((w.sample_end_ns or 0) - (w.sample_start_ns or 0)))
            sample = f"; rules run on {what} from its middle, times at stake scaled ×{w.scale:.3g}"
        text = f"window {fmt_ns(w.duration_ns)} ({w.method}{steps}{warm}): {w.reason}{sample}"
        if self.structure is not None and w.method != "given":
            text = f"run — {self.structure.headline()}\n{text}"
        phases = self.phases_text() or self.training_text()
        return f"{text}\n{phases}" if phases else text

    def training_text(self) -> str:
        """One line on a training step's phases (median per step): forward, backward,
        optimizer, the communication they expose, the micro-batches per optimizer step, and the
        periodic work set apart; ``""`` for other runs."""
        t = self.training
        if t.height == 0:
            return ""
        parts = []
        for r in t.iter_rows(named=True):
            exposed = f", {fmt_ns(r['exposed_comm_ns'])} exposed communication" if r["exposed_comm_ns"] else ""
            share = f" ({r['share']:.0%})" if r.get("share") is not None else ""
            parts.append(f"{r['phase']} {fmt_ns(r['time_ns'])}{share}{exposed}")
        micro = t["micro_batches"].drop_nulls() if "micro_batches" in t.columns else pl.Series([])
        head = "training step"
        if micro.len() and float(micro[0]) > 1:
            head += f" of {float(micro[0]):.0f} micro-batches"
        by = t["by"][0] if "by" in t.columns else None
        tail = " (read by launching thread: autograd's runs the backward)" if by == "thread" else ""
        if "recompute" in t.columns and t["recompute"][0]:
            tail += "; activation checkpointing: the forward's kernels run again inside the backward, counted there"
        text = f"{head} — " + "; ".join(parts) + tail
        p = self.periodic
        if p.height:
            text += "\nset apart from the steps — " + "; ".join(
                f"{r['count']} {r['what']}{'s' if r['count'] != 1 and r['what'] == 'evaluation' else ''}"
                f"{' saves' if r['what'] == 'checkpoint' and r['count'] != 1 else (' save' if r['what'] == 'checkpoint' else '')} "
                f"of {fmt_ns(r['median_ns'])} (longest {fmt_ns(r['max_ns'])})" for r in p.iter_rows(named=True))
        return text

    def phases_text(self) -> str:
        """One line on the generation phases of the steady requests: time to first token, time
        per output token (median and p90), GPU busy share, and MFU/MBU when the model was given;
        ``""`` when the run is no generation or server."""
        p = self.phases
        if p.height == 0:
            return ""
        parts = []
        for r in p.iter_rows(named=True):
            eff = ""
            if r.get("mfu") is not None and r.get("mbu") is not None:
                eff = f", MFU {r['mfu']:.1%}, MBU {r['mbu']:.1%}"
            busy = f", GPU busy {r['busy_share']:.0%}" if r.get("busy_share") is not None else ""
            if r["phase"] == "prefill":
                parts.append(f"prefill: time to first token {fmt_ns(r['ttft_ns'])}{busy}{eff}")
            else:
                tpot = (f"time per output token {fmt_ns(r['tpot_median_ns'])} (p90 {fmt_ns(r['tpot_p90_ns'])})"
                        if r.get("tpot_median_ns") is not None else f"step {fmt_ns(r['step_median_ns'])}")
                parts.append(f"decode: {r['steps']} steps, {tpot}{busy}{eff}")
        return "phases — " + "; ".join(parts)

    def to_markdown(self) -> str:
        lines = [f"# Diagnosis of `{self.trace_name}`", "", self.window_text(), ""]
        if not self._findings:
            lines.append("No findings.")
        for i, f in enumerate(self._findings, 1):
            share = f" ({f.share:.1%} of the window)" if f.share is not None else ""
            lines += [f"## {i}. [{f.severity}] {f.category}: {f.title}", ""]
            if f.time_ns is not None:
                lines += [f"Time at stake: {fmt_ns(f.time_ns)}{share}.", ""]
            if f.advice:
                lines += [f"**What to try:** {f.advice}", ""]
            if f.next:
                lines += ["**Next:**", "", *[f"    {c}" for c in f.next], ""]
            if f.evidence.height:
                ev = f.evidence.head(8)
                lines += ["| " + " | ".join(ev.columns) + " |", "|" + "---|" * len(ev.columns)]
                lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in ev.iter_rows()]
                lines.append("")
        return "\n".join(lines)

    def to_list(self, n: int | None = None, *, width: int = 80, title: str | None = None) -> str:
        """The findings as a list that reads at any width (a narrow terminal, a CI log, a pipe):
        per finding a header line (number, severity, category, time at stake), the title, the
        first evidence rows, the advice and the next commands as indented lines wrapped to
        ``width`` characters; the first ``n`` findings when given."""
        import textwrap

        width = max(int(width), 40)
        head = title or f"tracekit diagnose: {self.trace_name}"
        out = [head, *textwrap.wrap(self.window_text().replace("\n", " | "), width=width, subsequent_indent="  ")]
        items = self._findings[: n if n is not None else len(self._findings)]
        if not items:
            out += ["", "no findings" + ("" if self._findings else ": nothing above the severity thresholds in this window")]

        def para(text: str, label: str) -> list[str]:
            lead = f"   {label}: " if label else "   "
            return textwrap.wrap(text, width=width, initial_indent=lead, subsequent_indent=" " * 6,
                                 break_on_hyphens=False, break_long_words=False) or [lead.rstrip()]

        for i, f in enumerate(items):
            stake = ""
            if f.time_ns is not None:
                stake = f"  {fmt_ns(f.time_ns)}" + (f" ({f.share:.1%} of the window)" if f.share is not None else "")
            out += ["", f"{i}. {f.severity.upper()}  {f.category}{stake}"]
            out += para(f.title, "")
            if f.evidence.height:
                out += para(_evidence_line(f.evidence, i), "evidence")
            if f.advice:
                out += para(f.advice, "try")
            out += [f"   next: $ {c}" if j == 0 else f"         $ {c}" for j, c in enumerate(f.next)]
        return "\n".join(out)

    def to_text(self, n: int | None = None) -> str:
        """Plain text, one block per finding (the first ``n`` when given)."""
        out = [self.window_text()]
        for f in self._findings[: n if n is not None else len(self._findings)]:
            stake = f" — {fmt_ns(f.time_ns)} ({f.share:.1%})" if f.time_ns is not None and f.share is not None else ""
            out.append(f"[{f.severity}] {f.category}{stake}: {f.title}")
            if f.advice:
                out.append(f"    try: {f.advice}")
            for c in f.next[:2]:
                out.append(f"    next: {c}")
        return "\n".join(out)
