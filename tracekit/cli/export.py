"""``tracekit export``: write a trace's timeline for other viewers.

    tracekit export perfetto run.sqlite -o run.pftrace
    tracekit export perfetto rank0.sqlite rank1.sqlite --window steady --ranks 0
    tracekit export perfetto run.sqlite --format chrome-json -o run.json --window 1.2s:1.5s
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

from tracekit.cli.terminal import help_markup_mode

app = typer.Typer(
    help="Write a trace's timeline for other viewers (Perfetto UI, chrome://tracing).",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=help_markup_mode(),
)

_FORMATS = {"perfetto": ".pftrace", "chrome-json": ".json"}


def register(parent: typer.Typer) -> None:
    """Mount :data:`app` on ``parent`` as ``tracekit export``."""
    parent.add_typer(app, name="export")


def _ranks(text: str | None) -> list[int] | None:
    from tracekit.errors import TracekitError

    if not text:
        return None
    out: list[int] = []
    try:
        for part in text.replace(" ", "").split(","):
            if not part:
                continue
            if "-" in part:
                a, b = part.split("-", 1)
                if int(b) < int(a):
                    msg = f"--ranks {text!r}: the range {part} is empty; write the lower rank first, e.g. {b}-{a}"
                    raise TracekitError(msg)
                out.extend(range(int(a), int(b) + 1))
            else:
                out.append(int(part))
    except ValueError:
        msg = f"--ranks {text!r}: give rank numbers and ranges, e.g. --ranks 0,2-3"
        raise TracekitError(msg) from None
    if not out:
        msg = f"--ranks {text!r}: no rank given; give rank numbers and ranges, e.g. --ranks 0,2-3"
        raise TracekitError(msg)
    return out


def _check_output(out: Path) -> None:
    """Refuse an output the export could not be renamed onto, before the trace is read."""
    from tracekit.errors import TracekitError

    if out.is_dir():
        msg = f"cannot write {out}: it is a folder; name a file with -o"
        raise TracekitError(msg)
    if not out.parent.is_dir():
        msg = f"-o {out}: folder {out.parent} does not exist; create it or choose another file"
        raise TracekitError(msg)


@app.command("perfetto")
def perfetto(
    traces: Annotated[list[Path], typer.Argument(
        help="Nsight Systems export(s) (.sqlite, .nsys-rep, or an nsys parquetdir/arrowdir folder); several, or a folder of them = one report per rank.")],
    output: Annotated[Path | None, typer.Option("-o", "--output",
                                                help="File to write (default: the first trace's name with .pftrace / .json).")] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="perfetto (protobuf, default) or chrome-json.")] = "perfetto",
    window: Annotated[str | None, typer.Option(
        "--window",
        help="START:END on the trace's timeline, ns since the session start (units allowed: 1.2s:1.5s, 300ms:), "
             "or 'steady' for the steady-state window of tracekit diagnose (on a big trace, the sample of steps it analyses).")] = None,
    ranks: Annotated[str | None, typer.Option("--ranks", help="Only these ranks, e.g. 0,2-3.")] = None,
    metrics: Annotated[str | None, typer.Option(
        "--metrics", help="GPU metrics to write as counters: comma-separated gpu_metrics names, 'all' or 'none' "
                          "(default: those of sms_active, tensor_active, dram_read_bandwidth, dram_write_bandwidth the trace has).")] = None,
) -> None:
    """Write a Perfetto trace (ui.perfetto.dev): one process per rank, a track per GPU stream
    (kernels, copies, CUDA graph replays), CPU threads with CUDA API calls and NVTX ranges,
    launch → kernel flows, memory and GPU-metric counters, NCCL calls with op, bytes and peer.
    Streamed to disk; see docs/export.md."""
    import tracekit
    from tracekit.errors import TracekitError
    from tracekit.export import DEFAULT_METRICS, chrome_json, parse_window
    from tracekit.export import perfetto as write

    if fmt not in _FORMATS:
        msg = f"--format {fmt!r}: choose perfetto or chrome-json"
        raise TracekitError(msg)
    win = parse_window(window) if window else None
    chosen_ranks = _ranks(ranks)
    first = traces[0]
    out = output or Path(first.name if not first.is_dir() else first.resolve().name).with_suffix(_FORMATS[fmt])
    _check_output(out)
    if len(traces) == 1 and not traces[0].is_dir():
        trace = tracekit.open(traces[0])
        if type(trace).__name__ == "NcuReport":
            msg = f"{traces[0]} is an Nsight Compute report; export an Nsight Systems trace"
            raise TracekitError(msg)
    else:
        trace = tracekit.open_many(traces[0] if len(traces) == 1 else traces)
    chosen: Sequence[str] | str = DEFAULT_METRICS if metrics is None else (
        "all" if metrics.strip() == "all" else [m.strip() for m in metrics.split(",") if m.strip() not in ("", "none")])
    if metrics is not None and not isinstance(chosen, str) and chosen:  # the defaults: those the trace has
        _check_metrics(trace, chosen)
    fn = write if fmt == "perfetto" else chrome_json
    summary = fn(trace, out, window=win, ranks=chosen_ranks, metrics=chosen)
    typer.echo(str(summary))
    for what, n in summary.skipped.items():
        typer.echo(f"left out: {n} {what}")
    for note in summary.notes:
        typer.echo(f"note: {note}")


def _check_metrics(trace: object, chosen: Sequence[str]) -> None:
    """Names given with --metrics that no report has are an error listing the ones there
    (they were left out without a word)."""
    import tracekit
    from tracekit.errors import TracekitError
    from tracekit.export.events import _metric_names

    paths = getattr(trace, "_paths", None)
    available: set[str] = set()
    if paths is None:
        available.update(_metric_names(trace, "all"))
    else:  # a per-rank set: each report's metric list, one report open at a time
        for path in paths:
            with tracekit.open(path) as one:
                available.update(_metric_names(one, "all"))
    unknown = [m for m in chosen if m not in available]
    if unknown:
        have = ", ".join(repr(m) for m in sorted(available)) or "none: the trace has no GPU metrics"
        msg = f"--metrics: {', '.join(repr(m) for m in unknown)} not in the trace; its GPU metrics: {have}"
        raise TracekitError(msg)

