"""A diagnosis as HTML, for Jupyter (``Diagnosis._repr_html_``), TraceExplorer's Findings tab
and the HTML report: one card per finding and a bar of where the window's time goes.

Plain HTML with inline styles (no JavaScript), so it renders in JupyterLab, VS Code, a static
notebook viewer or an exported page alike. Every number is the diagnosis' own: the cards show
what :class:`~tracekit.diagnosis.result.Diagnosis` holds, nothing is recomputed here.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

import polars as pl

from tracekit.diagnosis.text import _evidence_line, cell_text, fmt_ns

if TYPE_CHECKING:
    from tracekit.diagnosis.result import Diagnosis, Finding

__all__ = ["SEVERITY_COLORS", "diagnosis_html", "finding_card", "time_bar"]

#: Card border and badge colours per severity (colour-blind-safe Okabe–Ito hues).
SEVERITY_COLORS = {"high": "#D55E00", "medium": "#E69F00", "low": "#0072B2", "info": "#888888"}
_FONT = "font-family:-apple-system,'Segoe UI',Roboto,'Liberation Sans',Arial,sans-serif;font-size:13px;line-height:1.4"
#: Evidence rows shown inside a card's disclosure.
EVIDENCE_ROWS = 20


def _e(text: Any) -> str:
    return html.escape(str(text))


def _evidence_table(ev: pl.DataFrame) -> str:
    rows = ev.head(EVIDENCE_ROWS)
    head = "".join(f"<th style='text-align:left;padding:2px 8px;border-bottom:1px solid #ccc'>{_e(c)}</th>" for c in rows.columns)
    body = []
    for row in rows.iter_rows(named=True):
        cells = []
        for k, v in row.items():
            text = cell_text(k, v, digits=4)
            cells.append(f"<td style='padding:2px 8px;border-bottom:1px solid #eee;max-width:420px;overflow-wrap:anywhere'>{_e(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    more = f"<p style='color:#666'>first {EVIDENCE_ROWS} of {ev.height} rows</p>" if ev.height > EVIDENCE_ROWS else ""
    return (f"<div style='overflow-x:auto'><table style='border-collapse:collapse;font-size:12px'><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table></div>{more}")


def finding_card(f: Finding, index: int) -> str:
    """One finding as a card: severity badge, category and time at stake with a bar for its
    share of the window, the whole title, an evidence summary, the advice, the next commands
    and the evidence rows behind a disclosure (``<details>``)."""
    color = SEVERITY_COLORS.get(f.severity, "#888")
    stake = ""
    if f.time_ns is not None:
        share = f" · {f.share:.1%} of the window" if f.share is not None else ""
        stake = f"<span style='font-weight:600'>{_e(fmt_ns(f.time_ns))}</span>{_e(share)}"
    bar = ""
    if f.share is not None:
        width = max(min(f.share, 1.0), 0.0) * 100
        bar = (f"<div title='{f.share:.1%} of the window' style='background:#eee;height:6px;border-radius:3px;margin:4px 0 6px'>"
               f"<div style='background:{color};width:{width:.2f}%;height:6px;border-radius:3px'></div></div>")
    parts = [
        f"<div class='tk-finding' data-category='{_e(f.category)}' data-severity='{_e(f.severity)}' "
        f"style='border-left:5px solid {color};background:#fff;padding:8px 12px;margin:8px 0;border:1px solid #e3e3e3;"
        f"border-left-width:5px;border-left-color:{color};border-radius:4px'>",
        f"<div><span style='background:{color};color:#fff;border-radius:3px;padding:1px 6px;font-size:11px;"
        f"text-transform:uppercase'>{_e(f.severity)}</span> <b>{index}. {_e(f.category)}</b> {stake}</div>",
        bar,
        f"<div style='font-size:14px;margin:2px 0 6px'>{_e(f.title)}</div>",
    ]
    if f.evidence.height:
        parts.append(f"<div style='color:#444'><b>Evidence:</b> {_e(_evidence_line(f.evidence, index))}</div>")
    if f.advice:
        parts.append(f"<div style='margin-top:4px'><b>What to try:</b> {_e(f.advice)}</div>")
    if f.next:
        cmds = "".join(f"<pre style='margin:2px 0;padding:4px 6px;background:#f6f6f6;white-space:pre-wrap'>$ {_e(c)}</pre>"
                       for c in f.next)
        parts.append(f"<div style='margin-top:4px'><b>Next:</b>{cmds}</div>")
    if f.evidence.height:
        parts.append(f"<details style='margin-top:4px'><summary>{f.evidence.height} evidence row(s)</summary>"
                     f"{_evidence_table(f.evidence)}</details>")
    parts.append("</div>")
    return "".join(parts)


def time_bar(d: Diagnosis) -> str:
    """Where the window's time goes on its busiest GPU — computing, exposed communication,
    idle (``Diagnosis.gpu_time``) — and under it each finding's time at stake as its share of
    the window. Findings may overlap each other (a launch-bound stretch is also idle time):
    they are drawn one per line, not stacked."""
    rows: list[str] = []
    g = d.gpu_time
    if g.height:
        top = g.sort("busy_ns", descending=True).row(0, named=True)
        span = max(int(top.get("window_ns") or d.window.duration_ns), 1)
        comm = int(top.get("communication_only_ns") or 0)
        compute = max(int(top["busy_ns"]) - comm, 0)
        idle = max(span - int(top["busy_ns"]), 0)
        segs = [("computing (and copies)", compute, "#009E73"), ("communication only", comm, "#CC79A7"), ("GPU idle", idle, "#dddddd")]
        where = ", ".join(f"{k} {top[k]}" for k in ("rank", "device_id") if k in top)
        inner = "".join(
            f"<div title='{_e(label)}: {_e(fmt_ns(v))} ({v / span:.1%})' style='background:{c};width:{100 * v / span:.3f}%;height:14px'></div>"
            for label, v, c in segs if v > 0)
        legend = " · ".join(f"<span style='color:{c if c != '#dddddd' else '#888'}'>■</span> {_e(label)} {_e(fmt_ns(v))} ({v / span:.0%})"
                            for label, v, c in segs if v > 0)
        rows.append(f"<div style='margin:4px 0'><b>The window on its busiest GPU</b> ({_e(where)}, {_e(fmt_ns(span))}):"
                    f"<div style='display:flex;border:1px solid #ccc;margin:4px 0'>{inner}</div>"
                    f"<div style='font-size:12px;color:#444'>{legend}</div></div>")
    staked = [f for f in d.items if f.time_ns is not None and f.share is not None]
    if staked:
        lines = []
        for f in staked:
            c = SEVERITY_COLORS.get(f.severity, "#888")
            w = max(min(float(f.share or 0.0), 1.0), 0.0) * 100
            lines.append(
                "<div style='display:flex;align-items:center;gap:6px;margin:2px 0'>"
                f"<div style='width:170px;font-size:12px'>{_e(f.category)}</div>"
                f"<div style='flex:1;background:#f0f0f0;height:10px'><div style='background:{c};width:{w:.2f}%;height:10px'></div></div>"
                f"<div style='width:140px;font-size:12px;text-align:right'>{_e(fmt_ns(f.time_ns))} ({f.share:.1%})</div></div>")
        rows.append("<div style='margin:6px 0'><b>Time at stake per finding</b> (share of the window; findings can overlap)"
                    + "".join(lines) + "</div>")
    return "".join(rows)


def diagnosis_html(d: Diagnosis) -> str:
    """The whole diagnosis: title, window and phases line, the time bar, then one card per
    finding (or why there is none)."""
    window = "<br>".join(_e(line) for line in d.window_text().splitlines())
    cards = "".join(finding_card(f, i) for i, f in enumerate(d.items))
    if not d.items:
        cards = "<p><i>No findings: nothing above the severity thresholds in this window.</i></p>"
    return (f"<div class='tk-diagnosis' style='{_FONT};max-width:1100px'>"
            f"<div style='font-size:16px;font-weight:600'>tracekit diagnose: {_e(d.trace_name)}</div>"
            f"<div style='color:#555;margin:2px 0 6px'>{window}</div>{time_bar(d)}{cards}</div>")
