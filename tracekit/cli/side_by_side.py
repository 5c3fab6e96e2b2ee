"""``tracekit summary --side-by-side`` / ``tracekit diagnose --side-by-side``: several reports
(or a folder of them) compared side by side, each opened on its own — never merged as the ranks
of one run. For reports that :mod:`tracekit.runs` finds unrelated (a folder of different
programs' captures), which the commands otherwise refuse in one line."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["report_paths", "side_by_side_diagnoses", "side_by_side_summary"]


def report_paths(files: Sequence[str | Path]) -> list[Path]:
    """The reports that ``files`` name (files, folders of them: as ``tracekit.open_many`` finds
    them), in natural order."""
    from tracekit.multi import _resolve

    return _resolve([str(f) for f in files])


def _open(path: Path, command: str) -> Any:
    import tracekit
    from tracekit.errors import TracekitError
    from tracekit.nsys.trace import NsysTrace

    trace = tracekit.open(path)
    if not isinstance(trace, NsysTrace):  # a torch.profiler trace is one (KinetoTrace)
        msg = f"{path} is an Nsight Compute report; {command} --side-by-side compares Nsight Systems exports and torch.profiler traces"
        raise TracekitError(msg)
    return trace


def side_by_side_summary(files: Sequence[str | Path], *, build_summary: Any, top: int = 10, findings: int = 3) -> None:
    """Print one table whose columns are the reports and whose rows are ``tracekit summary``'s
    fields (run, command, capture window, GPUs, kernels …), then each report's top kernels and
    top ``findings`` findings; ``build_summary`` is :func:`tracekit.cli.summary.build_summary`
    (handed in: that module calls this one)."""
    from rich.console import Console

    from tracekit.cli.tables import print_table

    paths = report_paths(files)
    console = Console()
    summaries = []
    for path in paths:
        trace = _open(path, "tracekit summary")
        diagnosis = None
        if findings > 0:
            from tracekit.diagnosis import diagnose

            def diagnosis(t: Any = trace) -> Any:
                return diagnose(t)

        s, d = build_summary(trace, top=top, label=path.name, diagnosis=diagnosis)
        summaries.append((path, s, d))
    fields = list(dict.fromkeys(k for _, s, _ in summaries for k in s.info))
    names = _labels(paths)
    rows = [[k, *(s.info.get(k, "") for _, s, _ in summaries)] for k in fields]
    print_table(console, ["field", *names], rows, text_columns={"field", *names},
                title=f"tracekit summary: {len(paths)} reports side by side (not ranks of one run)")
    for (path, s, d), name in zip(summaries, names, strict=True):
        kernels = s.tables.get("top kernels")
        if kernels is not None and kernels.height:
            cells = [[_cell(v) for v in row] for row in kernels.iter_rows()]
            print_table(console, kernels.columns, cells, text_columns={"kernel"}, title=f"top kernels: {name}")
        if d is not None and findings > 0:
            console.print(f"top findings: {name} ({path})", highlight=False, markup=False, soft_wrap=True)
            for f in d.items[:findings]:
                console.print(f"  [{f.severity}] {f.category}: {f.title}", highlight=False, markup=False, soft_wrap=True)
            if not d.items:
                console.print("  no findings", highlight=False)


def side_by_side_diagnoses(files: Sequence[str | Path], *, fmt: str, top: int | None, run: Any, render: Any) -> None:
    """Diagnose each report on its own (``run(trace)`` gives its diagnosis) and print them one
    after the other with ``render`` (:func:`tracekit.cli.diagnose.render`; ``fmt="json"``: one
    JSON object, ``{"side_by_side": true, "reports": [{"path", "diagnosis"}]}``)."""
    paths = report_paths(files)
    done = [(path, run(_open(path, "tracekit diagnose"))) for path in paths]
    if fmt == "json":
        print(json.dumps({"side_by_side": True, "reports": [{"path": str(p), "diagnosis": d.to_dict()} for p, d in done]},
                         indent=2, default=str))
        return
    for (_, d), name in zip(done, _labels(paths), strict=True):
        if fmt == "markdown":
            print(d.to_markdown())
            continue
        render(d, top, title=f"tracekit diagnose: {name} (side by side, not ranks of one run)", fmt=fmt)


def _labels(paths: Sequence[Path]) -> list[str]:
    """Each report's file name, with its folder where two share a name."""
    names = [p.name for p in paths]
    return [f"{p.parent.name}/{p.name}" if names.count(p.name) > 1 else p.name for p in paths]


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:,.3f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)
