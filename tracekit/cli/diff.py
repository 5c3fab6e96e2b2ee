"""``tracekit diff BEFORE AFTER``: did the change help? Exit 1 on a regression (for CI)."""

from __future__ import annotations

import typer


def register(parent: typer.Typer) -> None:
    """Add the ``diff`` command to ``parent``."""
    parent.command("diff")(diff)


def diff(
    before: str = typer.Argument(..., help="Nsight Systems export of the run before the change (or a folder of per-rank exports)."),
    after: str = typer.Argument(..., help="Nsight Systems export of the run after the change (or a folder of per-rank exports)."),
    fmt: str = typer.Option("table", "--format", "-f", help="table, json or markdown (each leads with the verdict)."),
    threshold: float = typer.Option(5.0, "--threshold", help="Regression (exit 1) when a row is slower by at least this many % per step."),
    by: str = typer.Option("kernel,family,range,step", "--by", help="Levels: kernel, family, range, step."),
    top: int = typer.Option(10, "--top", "-n", help="Rows per level in the table."),
    findings: bool = typer.Option(True, "--findings/--no-findings",
                                  help="Diagnose both runs and say which findings appeared, went away, grew or shrank."),
) -> int:
    """Per kernel, family, NVTX range and step: before, after, delta and a verdict against the step-to-step noise.

    Exit 0: no regression; 1: something is slower by at least --threshold % per step; 2: bad input.
    """
    from tracekit.comparison import diff as run
    from tracekit.errors import TracekitError

    if fmt not in ("table", "json", "markdown"):
        msg = f"--format {fmt!r}: choose table, json or markdown"
        raise TracekitError(msg)
    if not threshold >= 0:
        msg = f"--threshold {threshold}: give a percentage of 0 or more (5 = fail when 5 % slower per step)"
        raise TracekitError(msg)
    levels = tuple(x.strip() for x in by.split(",") if x.strip())
    d = run(before, after, levels=levels, threshold=threshold / 100, findings=findings)
    if fmt == "json":
        print(d.to_json())
    elif fmt == "markdown":
        print(d.to_markdown(top))
    else:
        _render(d, d.threshold, top)
    return 1 if d.regressions().height else 0


def _render(d, threshold: float, top: int) -> None:  # type: ignore[no-untyped-def]
    from rich.console import Console

    from tracekit.comparison import row_texts

    console = Console()
    colors = {"slower": "red", "faster": "green", "no change": "dim"}
    # the answer first, then why, then the tables
    h = d.headline()
    color = colors.get(h["verdict"], "") if h else ""
    # whole lines (soft wrap): a log or a pipe keeps each on one line
    console.print(f"[bold {color}]{d.verdict_line()}[/]" if color else d.verdict_line(), highlight=False, soft_wrap=True)
    for side, line in d.runs.items():
        console.print(f"{side}: {line}", highlight=False, markup=False, soft_wrap=True)
    why = d.why_lines()
    if why:
        console.print("why — findings of tracekit diagnose that changed:", highlight=False, soft_wrap=True)
        for line in why:
            console.print(f"  {line}", highlight=False, markup=False, soft_wrap=True)
    elif d.findings.height:
        console.print("why: no finding of tracekit diagnose changed by more than 10 %", highlight=False)
    for note in d.notes:
        console.print(f"note: {note}", highlight=False, markup=False, soft_wrap=True)
    console.print()
    from tracekit.cli.tables import print_table

    for level, frame in d.levels.items():
        headers = ["key", "before", "after", "delta", "delta %", "noise", "verdict"]
        rows = []
        for r in frame.head(top).iter_rows(named=True):
            t = row_texts(level, r)
            rows.append([t["key"], t["before"], t["after"], t["delta"], t["delta %"], t["noise"],
                         f"[{colors.get(r['verdict'], '')}]{r['verdict']}[/]"])
        print_table(console, headers, rows, text_columns={"key", "verdict"}, markup_columns={"verdict"},
                    title=f"{level}: {d.before} → {d.after} (per step; steps {d.steps['before']} / {d.steps['after']})")
    reg = d.regressions(threshold)
    console.print(f"{reg.height} regression(s) of at least {100 * threshold:.0f}% per step" if reg.height else
                  f"no regression of {100 * threshold:.0f}% or more per step")
