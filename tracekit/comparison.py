"""``tracekit.diff(before, after)``: did my change help? Per kernel, family, NVTX range and step,
the per-step GPU time of two runs with a verdict against the step-to-step noise.

Each run's steady steps come from the diagnosis' window (NVTX ``step|iter`` ranges, else the
repeating kernel sequence; warm-up excluded: :mod:`tracekit.diagnosis.window`). A GPU operation
belongs to the step range of its own process (rank, pid) whose CPU interval holds its launch
call (NVTX steps), or to the step whose GPU span holds its start (steps found from the kernel
sequence). Without steps the whole trace is one step and
a fixed threshold decides. The statistic is :func:`tracekit.analysis.compare.compare_per_step`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from tracekit.analysis.attribution import attribute_nvtx
from tracekit.analysis.compare import compare_step_stats, per_step_stats
from tracekit.analysis.families import with_family

__all__ = ["FINDING_CHANGE", "LEVELS", "Diff", "diff", "findings_change", "row_texts"]

#: What a diff compares: kernel names, kernel families, innermost NVTX ranges (GPU time of
#: the work launched inside), and per-step totals (``step_time``: the iteration's length;
#: ``gpu_time``: summed GPU operation time; ``kernels``: kernel launches).
LEVELS = ("kernel", "family", "range", "step")


@dataclass
class _Side:
    ops: pl.DataFrame
    steps: list[int]
    method: str
    step_lengths: pl.DataFrame | None
    #: labels of the NVTX step ranges themselves (``step.7``): one key per run, ``step.N``
    step_labels: list[str] = field(default_factory=list)


_EMPTY = {"step": pl.Int64, "key": pl.Utf8, "value": pl.Int64}


def _steady_steps(trace: Any) -> _Side:
    """The steady steps of one run and every GPU operation in them, with its ``step``.

    NVTX steps: an operation belongs to the step range *of its own process* (``rank``,
    ``pid``) whose CPU interval holds its launch call; steps are numbered per process, so
    step N of every rank or process is step N (operations of a process without step ranges
    fall back to the main process's ranges, by time). ``step_time`` of a step is its slowest
    process's length (CPU range or GPU span, the longer). Steps from the kernel sequence: an
    operation belongs to the step whose GPU span holds its start. Without steps every
    operation is in step 0.
    """
    from tracekit.analysis.run.iterations import iteration_ranges, iterations
    from tracekit.diagnosis.config import DiagnoseConfig
    from tracekit.diagnosis.context import Context
    from tracekit.diagnosis.window import window_of

    cfg = DiagnoseConfig(exact_steps=10**9, max_window_ops=10**12)  # every step measured, no sampling
    ctx = Context(trace, cfg)
    # the run's one structure, as the diagnosis reads it (a training run's micro-batches merged
    # into optimizer steps need its kind)
    w = window_of(ctx.structure, ctx.ops_for_window, cfg)
    ops = ctx.ops_with_launch
    it = w.iterations
    if it.height == 0:
        return _Side(ops.with_columns(pl.lit(0, pl.Int64).alias("step")), [0], w.method, None)
    steady = it.slice(w.warmup_steps).select(
        pl.col("iteration").cast(pl.Int64).alias("step"), "start_ns", "end_ns", "w_start", "w_end", "length_ns"
    )
    numbers = steady["step"].to_list()
    if w.method != "nvtx":
        j = ops.sort("start_ns").join_asof(
            steady.select("step", pl.col("w_start").alias("start_ns"), pl.col("w_end").alias("_e")).sort("start_ns"),
            on="start_ns", strategy="backward",
        ).filter(pl.col("step").is_not_null() & (pl.col("start_ns") < pl.col("_e"))).drop("_e")
        return _Side(j, numbers, w.method, steady.select("step", "length_ns"))
    ranges = iteration_ranges(ctx.nvtx, pattern=cfg.iteration_pattern).filter(pl.col("iteration").is_in(numbers))
    proc = [c for c in ("rank", "pid") if c in ranges.columns and c in ops.columns]
    calls = ops.filter(pl.col("api_start_ns").is_not_null())
    win = ranges.select(*proc, pl.col("iteration").cast(pl.Int64).alias("step"), pl.col("start_ns").alias("api_start_ns"),
                        pl.col("end_ns").alias("_e"))
    own = calls.join(win.select(proc).unique(), on=proc, how="semi").sort([*proc, "api_start_ns"]).join_asof(
        win.sort([*proc, "api_start_ns"]), on="api_start_ns", by=proc, strategy="backward", check_sortedness=False,
    )
    main = steady.select("step", pl.col("start_ns").alias("api_start_ns"), pl.col("end_ns").alias("_e")).sort("api_start_ns")
    other = calls.join(win.select(proc).unique(), on=proc, how="anti").sort("api_start_ns").join_asof(
        main, on="api_start_ns", strategy="backward"
    )
    j = pl.concat([own, other], how="diagonal_relaxed").filter(
        pl.col("step").is_not_null() & (pl.col("api_start_ns") <= pl.col("_e"))
    ).drop("_e")
    per_proc = iterations(ops, ctx.nvtx, pattern=cfg.iteration_pattern)
    lengths = (
        per_proc.filter(pl.col("iteration").is_in(numbers))
        .group_by(pl.col("iteration").cast(pl.Int64).alias("step"))
        .agg(pl.max_horizontal("duration_ns", pl.col("gpu_span_ns").fill_null(0)).max().alias("length_ns"))
    )
    labels = iteration_ranges(ctx.nvtx, pattern=cfg.iteration_pattern)["name"].drop_nulls().unique().to_list()
    return _Side(j, numbers, w.method, lengths, labels)


def _level_values(trace: Any, level: str, side: _Side) -> pl.DataFrame:
    ops = side.ops
    kern = ops.filter(pl.col("op_kind") == "kernel") if "op_kind" in ops.columns else ops
    # CUDA graph replays traced whole hide their kernels: each replay is one key of its own
    # (``[CUDA graph N]``, family ``graph``), so that their time is compared, not dropped
    replays = ops.filter(pl.col("op_kind") == "graph") if "op_kind" in ops.columns else ops.clear()
    if level in ("kernel", "family") and replays.height:
        whole = replays.select("step", pl.col("name").alias("key"), pl.col("duration_ns").alias("value"))
        rest = _level_values(trace, level, _Side(kern, side.steps, side.method, side.step_lengths, side.step_labels))
        if level == "family":
            whole = whole.with_columns(pl.lit("graph").alias("key"))
        return pl.concat([rest, whole.select(rest.columns)], how="vertical_relaxed")
    if level == "kernel":
        col = "name"
        if "short_name" not in kern.columns and "short_name" in trace.kernels.columns:
            # a kernel is known by where and when it ran: correlation ids repeat across
            # processes and ranks, and one graph launch has many kernels
            keys = [c for c in ("rank", "global_pid", "pid", "device_id", "stream_id", "correlation_id", "start_ns")
                    if c in kern.columns and c in trace.kernels.columns]
            short = trace.kernels.select(*keys, "short_name").unique(keys, keep="first", maintain_order=True)
            kern = kern.join(short, on=keys, how="left")
            col = "short_name"
        return kern.select("step", pl.coalesce(col, "name").alias("key"), pl.col("duration_ns").alias("value"))
    if level == "family":
        return with_family(kern).select("step", pl.col("family").alias("key"), pl.col("duration_ns").alias("value"))
    if level == "range":
        nvtx = trace.nvtx
        if nvtx.height == 0:
            return pl.DataFrame(schema=_EMPTY)
        att = attribute_nvtx(ops, nvtx)
        key = pl.col("nvtx_range").fill_null("(none)")
        # work launched directly inside a step range: one key (step.N) whatever the step's number
        key = pl.when(key.is_in(side.step_labels)).then(key.str.replace_all(r"\d+", "N")).otherwise(key)
        return att.select("step", key.alias("key"), pl.col("duration_ns").alias("value"))
    # step metrics
    parts = [
        ops.group_by("step").agg(pl.col("duration_ns").sum().alias("value")).with_columns(pl.lit("gpu_time").alias("key")),
        kern.group_by("step").agg(pl.len().cast(pl.Int64).alias("value")).with_columns(pl.lit("kernels").alias("key")),
    ]
    if side.step_lengths is not None and side.step_lengths.height:
        parts.append(side.step_lengths.select("step", pl.lit("step_time").alias("key"), pl.col("length_ns").alias("value")))
    return pl.concat([p.select("step", "key", pl.col("value").cast(pl.Int64)) for p in parts])


@dataclass
class Diff:
    """The comparison of two runs: one frame per level (``kernel``, ``family``, ``range``,
    ``step``) with the columns of :func:`tracekit.analysis.compare.compare_per_step` (values
    in ns, ``kernels`` in launches), plus what each side's steps were.

    ``threshold`` (relative, per step) is the default bar of :meth:`regressions`,
    :meth:`to_dict` and :meth:`to_json`."""

    before: str
    after: str
    levels: dict[str, pl.DataFrame]
    steps: dict[str, int]
    methods: dict[str, str]
    settings: dict[str, float] = field(default_factory=dict)
    threshold: float = 0.05
    #: How the findings of :func:`tracekit.diagnose` changed (:func:`findings_change`); empty
    #: when ``diff(findings=False)``.
    findings: pl.DataFrame = field(default_factory=pl.DataFrame)
    #: What the reader should know about the comparison (graph replays whose kernels are unseen …).
    notes: list[str] = field(default_factory=list)
    #: Each run's structure in one line (``before``/``after``: kind, steady steps, warm-up,
    #: start-up; :meth:`tracekit.analysis.run.structure.RunStructure.headline`).
    runs: dict[str, str] = field(default_factory=dict)

    def headline(self) -> dict[str, Any] | None:
        """The answer first: the step level's ``step_time`` row — ``verdict`` (``slower``,
        ``faster``, ``no change``), ``before_ns``/``after_ns`` (median-free per-step means),
        ``delta_ns``, ``delta_pct``, ``noise_ns`` (null with the fixed threshold),
        ``noise_basis``; ``None`` when the step level was not compared."""
        step = self.levels.get("step")
        if step is None or step.height == 0:
            return None
        rows = step.filter(pl.col("key") == "step_time")
        if rows.height == 0:
            return None
        r = rows.row(0, named=True)
        return {"verdict": r["verdict"], "before_ns": r["mean_a"], "after_ns": r["mean_b"], "delta_ns": r["delta"],
                "delta_pct": r["delta_pct"], "noise_ns": r["noise"], "noise_basis": r["noise_basis"],
                "steps_before": self.steps.get("before"), "steps_after": self.steps.get("after")}

    def verdict_line(self) -> str:
        """One line: ``slower: step time 35.8 ms → 48.3 ms (+35.0 %, noise ±1.2 ms; 8 vs 8
        steps)`` — what a reader wants before any table."""
        from tracekit.diagnosis.result import fmt_ns

        h = self.headline()
        if h is None:
            return f"{self.before} → {self.after}: step level not compared (add step to --by for the verdict)"
        pct = "new" if h["delta_pct"] is None else f"{100 * h['delta_pct']:+.1f}%"
        noise = (f"noise ±{fmt_ns(h['noise_ns'])} per step" if h["noise_ns"] is not None
                 else f"fixed {100 * self.settings.get('fixed', 0.05):.0f}% bar (too few steps for their spread)")
        return (f"{h['verdict']}: step time {fmt_ns(h['before_ns'])} → {fmt_ns(h['after_ns'])} ({pct}, {noise}; "
                f"{h['steps_before']} vs {h['steps_after']} steps)")

    def why_lines(self) -> list[str]:
        """The findings that appeared, went away, grew or shrank, largest change first: one line each."""
        from tracekit.diagnosis.result import fmt_ns

        f = self.findings
        if f.height == 0:
            return []
        out = []
        for r in f.filter(pl.col("change") != "about the same").iter_rows(named=True):
            unit = " per step" if r["per_step"] else ""
            b = "–" if r["time_before_ns"] is None else f"{fmt_ns(r['time_before_ns'])}{unit} ({r['severity_before']})"
            a = "–" if r["time_after_ns"] is None else f"{fmt_ns(r['time_after_ns'])}{unit} ({r['severity_after']})"
            title = r["title_after"] if r["title_after"] is not None else r["title_before"]
            out.append(f"{r['category']} {r['change']}: {b} → {a} — {title}")
        return out

    def regressions(self, threshold: float | None = None) -> pl.DataFrame:
        """Rows of every level that are ``slower`` by at least ``threshold`` (relative, per
        step; default :attr:`threshold`); ``level`` says which table each comes from. Only
        times count (the step level's ``kernels`` count is reported, never a regression by
        itself)."""
        bar = self.threshold if threshold is None else _check_threshold(threshold)
        parts = [
            f.filter((pl.col("verdict") == "slower") & (pl.col("delta_pct").fill_null(float("inf")) >= bar)
                     & ~((pl.lit(name) == "step") & (pl.col("key") == "kernels")))
            .with_columns(pl.lit(name).alias("level"))
            for name, f in self.levels.items()
        ]
        return pl.concat(parts, how="diagonal_relaxed") if parts else pl.DataFrame()

    def to_dict(self, threshold: float | None = None) -> dict[str, Any]:
        """The structure ``tracekit diff --format json`` prints (docs/diff.md)."""
        bar = self.threshold if threshold is None else _check_threshold(threshold)
        return {
            "verdict": self.headline(), "verdict_line": self.verdict_line(),
            "findings": self.findings.to_dicts(), "notes": self.notes,
            "before": self.before, "after": self.after, "runs": self.runs, "steps": self.steps, "step_source": self.methods,
            "settings": {**self.settings, "threshold": bar},
            "levels": {k: v.to_dicts() for k, v in self.levels.items()},
            "regressions": self.regressions(bar).to_dicts(),
        }

    def to_json(self, threshold: float | None = None) -> str:
        return json.dumps(self.to_dict(threshold), indent=2, default=str)

    def _repr_html_(self) -> str:
        """Jupyter's rich display, in the order of every other output: the verdict line, why
        (the findings that changed), the notes, then each level's table behind a disclosure."""
        import html

        colors = {"slower": "#D55E00", "faster": "#009E73", "no change": "#555555"}
        h = self.headline()
        color = colors.get(h["verdict"], "#555") if h else "#555"
        out = ["<div class='tk-diff' style='font-family:sans-serif;font-size:13px;max-width:1100px'>",
               f"<div style='font-size:16px;font-weight:600;color:{color}'>{html.escape(self.verdict_line())}</div>"]
        why = self.why_lines()
        if why:
            out.append("<div style='margin-top:6px'><b>Why</b> — findings of <code>tracekit.diagnose</code> that changed:<ul>"
                       + "".join(f"<li>{html.escape(w)}</li>" for w in why) + "</ul></div>")
        out += [f"<p style='color:#666'><i>{html.escape(n)}</i></p>" for n in self.notes]
        for level, frame in self.levels.items():
            rows = []
            for r in frame.head(20).iter_rows(named=True):
                t = row_texts(level, r)
                c = colors.get(r["verdict"], "#555")
                rows.append(f"<tr><td style='text-align:left'>{html.escape(t['key'])}</td><td>{t['before']}</td>"
                            f"<td>{t['after']}</td><td>{t['delta']}</td><td>{t['delta %']}</td>"
                            f"<td style='color:{c}'>{r['verdict']}</td></tr>")
            out.append(f"<details{' open' if level == 'step' else ''}><summary><b>{level}</b> (per step; {frame.height} rows)</summary>"
                       "<table style='border-collapse:collapse;font-size:12px'><tr><th style='text-align:left'>key</th><th>before</th>"
                       "<th>after</th><th>delta</th><th>delta %</th><th>verdict</th></tr>" + "".join(rows) + "</table></details>")
        out.append("</div>")
        return "".join(out)

    def to_markdown(self, top: int = 10) -> str:
        """The verdict line, then why (the findings that changed), then the tables (``top``
        rows each)."""
        lines = [f"# {self.before} → {self.after}", "", f"**{self.verdict_line()}**", ""]
        lines += [*(f"> {n}" for n in self.notes), *([""] if self.notes else [])]
        why = self.why_lines()
        if why:
            lines += ["## Why: findings of `tracekit diagnose` that changed", "", *[f"- {w}" for w in why], ""]
        elif self.findings.height:
            lines += ["No finding of `tracekit diagnose` changed by more than 10 %.", ""]
        for level, frame in self.levels.items():
            lines += [f"## {level}", "", "| key | before | after | delta | delta % | verdict |", "|---|---:|---:|---:|---:|---|"]
            for r in frame.head(top).iter_rows(named=True):
                t = row_texts(level, r)
                lines.append(f"| {t['key']} | {t['before']} | {t['after']} | {t['delta']} | {t['delta %']} | {r['verdict']} |")
            lines.append("")
        return "\n".join(lines)


def row_texts(level: str, r: dict[str, Any]) -> dict[str, str]:
    """One row of a diff level as the text every output prints: ``key``, ``before``,
    ``after``, ``delta``, ``noise`` (durations; launches for the step level's ``kernels``)
    and ``delta %``."""
    from tracekit.diagnosis.result import fmt_ns

    def show(v: Any) -> str:
        return fmt_ns(v) if (level != "step" or r["key"] != "kernels") else f"{v:.1f}"

    return {"key": str(r["key"]), "before": show(r["mean_a"]), "after": show(r["mean_b"]), "delta": show(r["delta"]),
            "noise": "fixed" if r["noise"] is None else show(r["noise"]),
            "delta %": "–" if r["delta_pct"] is None else f"{100 * r['delta_pct']:+.1f}%"}


#: A finding's time at stake that changed by less than this share (of the larger) is "about the same".
FINDING_CHANGE = 0.10
_SEVERITY_RANK = {"info": 0, "low": 1, "medium": 2, "high": 3}


def findings_change(before: pl.DataFrame, after: pl.DataFrame, *, steps_before: int | None = None,
                    steps_after: int | None = None) -> pl.DataFrame:
    """How the findings of two diagnoses differ, per category.

    Parameters
    ----------
    before, after
        ``Diagnosis.findings`` of each run (``info`` rows are left out: they cost no time).
    steps_before, steps_after
        Steady steps of each run's window (``Diagnosis.window.steps``): with both, times are
        compared per step, so that runs of different lengths compare.

    Returns
    -------
    ``category``, ``change`` (``appeared``, ``went away``, ``grew``, ``shrank``, ``about the
    same``: within :data:`FINDING_CHANGE` of the larger), ``severity_before``/``severity_after``
    (the highest of the category), ``time_before_ns``/``time_after_ns`` (summed time at stake
    per step with both step counts, else over the window, ns; null where the run has no such
    finding), ``share_before``/``share_after`` (of each run's window), ``delta_ns``,
    ``per_step`` (whether times are per step), ``title_before``/``title_after``; largest
    |delta| first.
    """
    per_step = bool(steps_before) and bool(steps_after)

    def per_category(f: pl.DataFrame, side: str, steps: int | None) -> pl.DataFrame:
        f = f.filter(pl.col("severity") != "info") if f.height else f
        if f.height == 0:
            return pl.DataFrame(schema={"category": pl.Utf8, f"severity_{side}": pl.Utf8, f"time_{side}_ns": pl.Float64,
                                        f"share_{side}": pl.Float64, f"title_{side}": pl.Utf8})
        time = pl.col("time_ns").sum().cast(pl.Float64)
        return f.with_columns(pl.col("severity").replace_strict(_SEVERITY_RANK, return_dtype=pl.Int64).alias("_r")).group_by(
            "category", maintain_order=True).agg(
            pl.col("severity").sort_by("_r", descending=True).first().alias(f"severity_{side}"),
            (time / steps if per_step and steps else time).alias(f"time_{side}_ns"), pl.col("share").sum().alias(f"share_{side}"),
            pl.col("title").first().alias(f"title_{side}"))

    j = per_category(before, "before", steps_before).join(per_category(after, "after", steps_after), on="category",
                                                         how="full", coalesce=True)
    tb, ta = pl.col("time_before_ns"), pl.col("time_after_ns")
    biggest = pl.max_horizontal(tb.fill_null(0), ta.fill_null(0))
    delta = ta.fill_null(0) - tb.fill_null(0)
    change = (pl.when(tb.is_null()).then(pl.lit("appeared")).when(ta.is_null()).then(pl.lit("went away"))
              .when(delta.abs() < FINDING_CHANGE * biggest).then(pl.lit("about the same"))
              .when(delta > 0).then(pl.lit("grew")).otherwise(pl.lit("shrank")))
    return j.with_columns(delta.alias("delta_ns"), change.alias("change"), pl.lit(per_step).alias("per_step")).sort(
        [pl.col("delta_ns").abs(), "category"], descending=[True, False]).select(
        "category", "change", "severity_before", "severity_after", "time_before_ns", "time_after_ns", "share_before",
        "share_after", "delta_ns", "per_step", "title_before", "title_after")


def _check_threshold(value: float) -> float:
    if not (isinstance(value, int | float) and value >= 0 and value == value):
        from tracekit.errors import TracekitError

        msg = f"threshold {value!r}: give a relative change of 0 or more (0.05 = 5 % slower per step)"
        raise TracekitError(msg)
    return float(value)


#: Peak memory of ``diff``'s whole-table path, measured with ``/usr/bin/time`` on copies of one
#: export built by ``benchmarks/make_big_trace.py`` (both runs held: 1.8 GB for 2 × 1 M kernels,
#: 11.9 GB for 2 × 8 M); modelled, a little above both, per GPU operation of the runs that take
#: it. Runs past :data:`~tracekit.comparison_by_column.BOUNDED_MIN_OPS` operations take the
#: bounded path instead; this guards the whole-table runs below that (or a kernel table already
#: loaded), conservatively now that a run's tables go before the other run is read.
DIFF_BASE_BYTES = 500 << 20
DIFF_BYTES_PER_OP = 750


def _ensure_fits(before: Any, after: Any) -> None:
    """Refuse, in one :class:`~tracekit.errors.TraceMemoryError` line, a comparison of single
    exports whose whole tables would not fit in the memory left (polars aborted the process
    before: 2 × 8 M kernels under a 12 GB address-space limit, SIGABRT after 19 s). ``None``
    for a run that takes the bounded path (:func:`~tracekit.comparison_by_column.ensure_bounded_fits`
    estimates it); trace sets (per-rank folders) are not estimated."""
    from tracekit.nsys.database import gpu_op_estimate, refuse_unless_fits

    whole = [t for t in (before, after) if t is not None]
    dbs = [getattr(t, "db", None) for t in whole]  # None for a trace set
    if not whole or any(db is None for db in dbs):
        return
    ops = sum(gpu_op_estimate(db) for db in dbs if db is not None)
    names = " vs ".join(os.path.basename(str(t.path)) for t in whole)
    refuse_unless_fits(
        DIFF_BASE_BYTES + DIFF_BYTES_PER_OP * ops,
        f"{names}: comparing {ops:,} GPU operations",
        "compare shorter captures (nsys --capture-range, or a few steps of each run), or run the diff on a machine with more memory",
    )


def _open_run(obj: Any) -> Any:
    """A path (an export, or a folder of per-rank exports) opened; a trace or trace set as is."""
    from tracekit.errors import TracekitError

    if isinstance(obj, str | os.PathLike):
        path = os.fspath(obj)
        if os.path.isdir(path):
            from tracekit.scale.reduced import open_many

            obj = open_many(path)
        else:
            from tracekit.opening import open as tk_open

            obj = tk_open(path)
    # asked of the class: hasattr on the trace built its kernel table (4 s and 4 GB on 8 M kernels)
    if type(obj).__name__ == "NcuReport" or not hasattr(type(obj), "kernels"):
        what = getattr(obj, "path", obj)
        msg = f"{what} is not an Nsight Systems trace; tracekit diff compares two Nsight Systems exports (.sqlite, .nsys-rep)"
        raise TracekitError(msg)
    return obj


def diff(
    before: Any,
    after: Any,
    *,
    threshold: float = 0.05,
    levels: tuple[str, ...] = LEVELS,
    k: float = 3.0,
    min_effect: float = 0.02,
    fixed: float = 0.05,
    findings: bool = True,
    bounded_from: int | None = None,
) -> Diff:
    """Compare two runs: see the module doc and docs/diff.md.

    Parameters
    ----------
    before, after
        Each an :class:`~tracekit.nsys.trace.NsysTrace`, a trace set of
        :func:`tracekit.open_many`, a path to an export, or a folder of per-rank exports.
    threshold
        Relative per-step slowdown that counts as a regression (0.05 = 5 %).
    levels
        Which tables to build, from :data:`LEVELS`.
    k, min_effect, fixed
        The verdict's settings (:func:`tracekit.analysis.compare.compare_per_step`).
    findings
        Also diagnose both runs and say which findings appeared, went away, grew or shrank
        (:func:`findings_change`, ``Diff.findings``): the *why* under the verdict.
    bounded_from
        A single export with at least this many GPU operations is compared a column at a time
        (:mod:`tracekit.comparison_by_column`: the same tables in bounded memory); default
        :data:`~tracekit.comparison_by_column.BOUNDED_MIN_OPS` or
        ``TRACEKIT_DIFF_BOUNDED_MIN_OPS``.

    Returns
    -------
    A :class:`Diff`; ``Diff.regressions()`` lists what got slower by at least ``threshold``
    per step, ``tracekit diff`` exits 1 when that list is not empty.
    """
    from tracekit.errors import TracekitError

    bad = [lv for lv in levels if lv not in LEVELS]
    if bad or not levels:
        msg = f"unknown level(s) {', '.join(bad) or '(none given)'}; choose from {', '.join(LEVELS)}"
        raise TracekitError(msg)
    for option, value in (("k", k), ("min_effect", min_effect), ("fixed", fixed)):
        if not (isinstance(value, int | float) and value >= 0 and value == value):
            msg = f"{option}={value!r}: give a number of 0 or more"
            raise TracekitError(msg)
    _check_threshold(threshold)
    from tracekit.comparison_by_column import (
        bounded_min_ops,
        ensure_bounded_fits,
        takes_bounded_path,
    )

    min_ops = bounded_min_ops() if bounded_from is None else bounded_from
    # one run at a time: its statistics per level (small) and its findings are kept, its
    # tables let go before the other run is read
    ta, tb = _open_run(before), _open_run(after)
    bounded = [takes_bounded_path(t, min_ops) for t in (ta, tb)]
    _ensure_fits(None if bounded[0] else ta, None if bounded[1] else tb)
    for t, big in zip((ta, tb), bounded, strict=True):
        if big:
            ensure_bounded_fits(t)
    ra = _run_stats(ta, levels, "a", "before", findings, bounded=bounded[0], opened=ta is not before)
    del ta  # opened here: let its tables go before the other run is read
    rb = _run_stats(tb, levels, "b", "after", findings, bounded=bounded[1], opened=tb is not after)
    del tb
    out = {
        level: compare_step_stats(ra.stats[level], rb.stats[level], ra.steps, rb.steps, k=k, min_effect=min_effect, fixed=fixed)
        for level in levels
    }

    def name(obj: Any) -> str:
        return os.path.basename(str(getattr(obj, "path", obj)).rstrip("/"))

    changed = pl.DataFrame()
    if findings:
        changed = findings_change(ra.findings, rb.findings, steps_before=ra.window_steps, steps_after=rb.window_steps)
    notes = [*ra.notes, *rb.notes]
    if ra.kind and rb.kind and ra.kind != rb.kind and "unknown" not in (ra.kind, rb.kind):
        notes.insert(0, f"the runs are of different kinds (before: {ra.kind}, after: {rb.kind}): their steps are not the same "
                        "unit of work, so per-step times compare different things")
    return Diff(
        name(before), name(after), out,
        steps={"before": ra.steps, "after": rb.steps},
        methods={"before": ra.method, "after": rb.method},
        settings={"k": k, "min_effect": min_effect, "fixed": fixed},
        threshold=float(threshold),
        findings=changed,
        notes=notes,
        runs={k: v for k, v in (("before", ra.run), ("after", rb.run)) if v},
    )


@dataclass
class _Run:
    """One run's share of a diff: per-level :func:`~tracekit.analysis.compare.per_step_stats`,
    its steady step count, how the steps were found, notes, and (with findings) its
    diagnosis' findings and window steps."""

    stats: dict[str, pl.DataFrame]
    steps: int
    method: str
    notes: list[str]
    findings: pl.DataFrame = field(default_factory=pl.DataFrame)
    window_steps: int | None = None
    run: str = ""
    kind: str = ""


def _run_stats(trace: Any, levels: tuple[str, ...], suffix: str, side: str, findings: bool, *, bounded: bool,
               opened: bool) -> _Run:
    """One run's :class:`_Run`: a column at a time (``bounded``:
    :func:`~tracekit.comparison_by_column.bounded_run_stats`) or from its whole tables; the
    trace is closed afterwards when ``opened`` here (from a path)."""
    if bounded:
        from tracekit.comparison_by_column import bounded_run_stats

        r = bounded_run_stats(trace, levels, suffix, side)
        run = _Run(r.stats, r.steps, r.method, r.notes)
    else:
        s = _steady_steps(trace)
        stats = {level: per_step_stats(_level_values(trace, level, s), s.steps, suffix) for level in levels}
        note = _graph_note(side, s)
        run = _Run(stats, len(s.steps), s.method, [note] if note else [])
        del s
    if findings:
        from tracekit.diagnosis import diagnose

        d = diagnose(trace)
        run.findings, run.window_steps = d.findings, d.window.steps
        if d.structure is not None:
            run.run, run.kind = d.structure.headline(), d.structure.kind
    if opened and hasattr(trace, "close"):
        trace.close()
    return run


def _graph_note(side: str, s: _Side) -> str | None:
    """A note when a run's steps hold CUDA graph replays traced whole: their kernels are in no
    level but as one ``[CUDA graph N]`` key (family ``graph``)."""
    ops = s.ops
    if "op_kind" not in ops.columns:
        return None
    replays = ops.filter(pl.col("op_kind") == "graph")
    if replays.height == 0:
        return None
    total = int(ops["duration_ns"].sum() or 0)
    share = f" ({int(replays['duration_ns'].sum() or 0) / total:.0%} of its GPU time in the steps)" if total else ""
    return (f"{side}: {replays.height:,} CUDA graph replays traced whole{share}: their kernels are compared as one "
            "[CUDA graph N] key (family graph); capture both runs with --cuda-graph-trace=node to compare the kernels inside")
