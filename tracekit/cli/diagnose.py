"""``tracekit diagnose``: findings with time at stake, evidence and what to try next."""

from __future__ import annotations

import typer

from tracekit.cli.inputs import ENGINE_HELP, SCHEDULER_HELP, SIDE_BY_SIDE_HELP, WORKERS_HELP


def register(parent: typer.Typer) -> None:
    """Add the ``diagnose`` command to ``parent``."""
    parent.command("diagnose")(diagnose)


#: ``--format`` values of ``diagnose`` (``auto``: :func:`render` picks table or list).
FORMATS = ("auto", "table", "list", "json", "markdown")

#: Below this many columns (or when the output is not a terminal) ``auto`` prints a list: the
#: six-column table wraps its advice to a word per line there.
TABLE_MIN_WIDTH = 140


def _window(text: str | None) -> tuple[int, int] | None:
    from tracekit.errors import TracekitError

    if not text:
        return None
    try:
        a, b = text.split(":", 1)
        return int(a), int(b)
    except ValueError:
        msg = f"--window {text!r}: give START_NS:END_NS on the trace's timeline, e.g. --window 1200000:5400000"
        raise TracekitError(msg) from None


def diagnose(
    files: list[str] = typer.Argument(..., help="Nsight Systems export(s): several files, or a folder of them, = one per rank."),  # noqa: B008
    ncu: str | None = typer.Option(None, "--ncu", help="Nsight Compute report of the same program (.ncu-rep)."),
    model: str | None = typer.Option(None, "--model", help="Transformer description (YAML or HF config.json)."),
    batch: int | None = typer.Option(None, "--batch", help="With --model: sequences per step (overrides the description)."),
    prompt_len: int | None = typer.Option(None, "--prompt-len", help="With --model: prompt tokens per sequence (the prefill)."),
    fmt: str = typer.Option("auto", "--format", "-f", help="auto (a table on a wide terminal, else a list), table, list, json or markdown."),
    window: str | None = typer.Option(None, "--window", help="START_NS:END_NS to analyse instead of the steady state."),
    settings: list[str] = typer.Option([], "--set", help="Rule threshold NAME=VALUE (repeatable; see docs/diagnose.md)."),  # noqa: B008
    top: int = typer.Option(0, "--top", "-n", help="Show only the first N findings (0: all)."),
    engine: str = typer.Option("local", "--engine", help=ENGINE_HELP),
    scheduler: str | None = typer.Option(None, "--scheduler", help=SCHEDULER_HELP),
    workers: int | None = typer.Option(None, "--workers", min=1, help=WORKERS_HELP),
    side_by_side: bool = typer.Option(False, "--side-by-side", help=SIDE_BY_SIDE_HELP),
) -> None:
    """Where the time goes and what to try: steady-state window, findings sorted by severity and time."""
    from tracekit.cli.inputs import open_traces
    from tracekit.diagnosis import DiagnoseConfig
    from tracekit.diagnosis import diagnose as run
    from tracekit.errors import TracekitError

    if fmt not in FORMATS:
        msg = f"--format {fmt!r}: choose {', '.join(FORMATS)}"
        raise TracekitError(msg)
    cfg = DiagnoseConfig().with_overrides(list(settings))
    if side_by_side:
        from tracekit.cli.side_by_side import side_by_side_diagnoses

        desc = model_with(model, batch, prompt_len)
        side_by_side_diagnoses(files, fmt=fmt, top=top or None, render=render,
                               run=lambda t: run(t, ncu=ncu, model=desc, window=_window(window), config=cfg))
        return
    trace = open_traces(files, engine=engine, scheduler=scheduler, workers=workers, command="tracekit diagnose")
    d = run(trace, ncu=ncu, model=model_with(model, batch, prompt_len), window=_window(window), config=cfg)
    if fmt == "json":
        print(d.to_json())
        return
    if fmt == "markdown":
        print(d.to_markdown())
        return
    render(d, top or None, fmt=fmt)


def model_with(model: str | None, batch: int | None, prompt_len: int | None) -> object:
    """``--model`` with ``--batch``/``--prompt-len`` applied (the description, loaded), or the
    path as given when neither is set; ``--batch`` without ``--model`` is an error."""
    from tracekit.errors import TracekitError

    overrides = {k: v for k, v in (("batch", batch), ("prompt_len", prompt_len)) if v is not None}
    if model is None:
        if overrides:
            raise TracekitError("--batch/--prompt-len describe the model's step: give --model too")
        return None
    if not overrides:
        return model
    from tracekit.model import load_model

    return load_model(model, **overrides)


def render(d, top: int | None = None, *, title: str | None = None, fmt: str = "auto") -> None:  # type: ignore[no-untyped-def]
    """Print a diagnosis (used by ``summary`` too): a rich table (``fmt="table"``), or a list
    (``"list"``: :meth:`~tracekit.diagnosis.result.Diagnosis.to_list`, wrapped to the width);
    ``"auto"`` prints the table on a terminal at least :data:`TABLE_MIN_WIDTH` columns wide and
    the list otherwise (a narrow terminal, a CI log, a pipe)."""
    from rich.console import Console
    from rich.table import Table

    from tracekit.diagnosis.result import fmt_ns

    console = Console()
    if fmt == "list" or (fmt == "auto" and (not console.is_terminal or console.width < TABLE_MIN_WIDTH)):
        width = console.width if console.is_terminal else 100
        print(d.to_list(top, width=width, title=title))
        return
    table = Table(title=title or f"tracekit diagnose: {d.trace_name}", caption=d.window_text(), show_lines=True)
    for col, just in (("#", "right"), ("severity", "left"), ("category", "left"), ("time at stake", "right"),
                      ("finding", "left"), ("what to try / next", "left")):
        table.add_column(col, justify=just, overflow="fold")  # type: ignore[arg-type]
    items = d.items[:top] if top else d.items
    colors = {"high": "red", "medium": "yellow", "low": "cyan", "info": "dim"}
    for i, f in enumerate(items):
        stake = "" if f.time_ns is None else f"{fmt_ns(f.time_ns)}" + (f"\n{f.share:.1%}" if f.share is not None else "")
        todo = f.advice + ("\n" + "\n".join(f"$ {c}" for c in f.next) if f.next else "")
        table.add_row(str(i), f"[{colors.get(f.severity, '')}]{f.severity}[/]", f.category, stake, f.title, todo)
    if not items:
        table.add_row("", "", "", "", "no findings", "")
    console.print(table)
