"""Sweeps: one experiment per combination of parameters, and one results table over all of them.

The command is a template: ``{batch}`` in any argument (or environment value) takes each
point's value. Every point runs in its own experiment folder inside
``<out>/<name>_sweep_<timestamp>/``, which also receives ``sweep.json`` and the results table
(``results.csv``, ``results.parquet``): parameters × wall time, GPU time, top kernel, idle %,
communication %.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tracekit.capture.config import check_template, fill, sweep_points
from tracekit.capture.experiment import ExperimentResult, run
from tracekit.capture.options import Experiment
from tracekit.capture.prepare import experiment_folder, preflight_check
from tracekit.errors import CaptureError

if TYPE_CHECKING:
    import polars as pl

log = logging.getLogger(__name__)

RESULT_COLUMNS = ("name", "folder", "status", "target_exit_code", "wall_s", "gpu_time_ns", "kernel_count",
                  "top_kernel", "top_kernel_pct", "idle_pct", "comm_pct", "error")  # fmt: skip


def point_slug(params: Mapping[str, Any]) -> str:
    """A folder-friendly label for one point: ``batch-4-steps-8``."""
    text = "-".join(f"{k}-{v}" for k, v in params.items())
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)


def result_row(
    params: Mapping[str, Any],
    result: ExperimentResult | None,
    *,
    folder: str = "",
    error: str | None = None,
) -> dict[str, Any]:
    """One row of the results table from an experiment's result (or from the error that stopped it)."""
    row: dict[str, Any] = {
        ("param_" + k if k in RESULT_COLUMNS else k): v for k, v in params.items()
    }
    row.update(dict.fromkeys(RESULT_COLUMNS))
    row.update(folder=folder, error=error, status="error" if result is None else None)
    if result is None:
        return row
    summary = result.summary.get("nsys") or result.summary.get("torch") or {}
    top = (summary.get("top_kernels") or [None])[0] or {}
    row.update(
        name=result.experiment.display_name,
        folder=str(result.folder),
        status=result.status,
        target_exit_code=result.target_exit_code,
        wall_s=result.program_wall_s,
        gpu_time_ns=summary.get("gpu_time_ns"),
        kernel_count=summary.get("kernel_count"),
        top_kernel=top.get("short_name") or top.get("name"),
        top_kernel_pct=top.get("pct"),
        idle_pct=summary.get("idle_pct"),
        comm_pct=summary.get("comm_pct"),
        error=result.error or summary.get("error"),
    )
    return row


def results_frame(rows: Sequence[Mapping[str, Any]]) -> pl.DataFrame:
    """The results table: one row per point, parameter columns first, numbers typed."""
    import polars as pl

    schema = {
        "name": pl.String,
        "folder": pl.String,
        "status": pl.String,
        "target_exit_code": pl.Int64,
        "wall_s": pl.Float64,
        "gpu_time_ns": pl.Int64,
        "kernel_count": pl.Int64,
        "top_kernel": pl.String,
        "top_kernel_pct": pl.Float64,
        "idle_pct": pl.Float64,
        "comm_pct": pl.Float64,
        "error": pl.String,
    }
    if not rows:
        return pl.DataFrame(schema=schema)
    frame = pl.DataFrame([dict(r) for r in rows], infer_schema_length=None)
    frame = frame.with_columns(pl.col(c).cast(t) for c, t in schema.items())
    params = [c for c in frame.columns if c not in schema]
    return frame.select(*params, *schema)


def sweep(
    command: Sequence[str] | str,
    parameters: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]] | str,
    *,
    mode: str = "nsys",
    experiment: Experiment | None = None,
    named: Mapping[str, Any] | None = None,
    on_output: Any = None,
    stop_event: threading.Event | None = None,
    stop_on_error: bool = False,
    system_checks: bool = True,
    **fields: Any,
) -> pl.DataFrame:
    """Run ``command`` once per combination of ``parameters``; return the results table.

    Parameters
    ----------
    command
        The command template: ``{name}`` is replaced by each point's value of ``name``.
    parameters
        ``{"batch_size": [1, 2, 4], "max_tokens": [50, 100]}`` (every combination), a list of
        points, ``"batch_size=1,2,4;max_tokens=50,100"``, or the name of a sweep in ``named``.
    mode
        Capture mode of every point (ignored when ``experiment`` is given).
    experiment
        A template experiment (options, preset settings); its command is replaced.
    named
        Named sweeps, as in an experiment file's ``sweeps:``.
    on_output, stop_event
        As for :func:`tracekit.capture.run`.
    stop_on_error
        Stop at the first point whose capture fails (default: record it and go on).
    system_checks
        As for :func:`tracekit.capture.run`.
    **fields
        Further :class:`Experiment` fields (``out``, ``name``, ``nsys``, ``timeout_s``…).

    Returns
    -------
    polars.DataFrame
        One row per point: the parameters, then ``name``, ``folder``, ``status``,
        ``target_exit_code``, ``wall_s`` (s), ``gpu_time_ns`` (sum of kernel time),
        ``kernel_count``, ``top_kernel``, ``top_kernel_pct``, ``idle_pct``, ``comm_pct``, ``error``.
        Written to ``results.csv`` and ``results.parquet`` in the sweep folder.

    Examples
    --------
    >>> table = sweep("python3 decode.py --batch {batch} --steps {steps}",
    ...               {"batch": [1, 4], "steps": [4, 8]}, out="experiments")  # doctest: +SKIP
    """
    argv = tuple(shlex.split(command) if isinstance(command, str) else command)
    template = (
        experiment.replace(command=argv)
        if experiment
        else Experiment(command=argv, mode=mode, **fields)
    )
    points = sweep_points(parameters, named)
    if not points:
        msg = "the sweep has no points; give at least one value per parameter"
        raise CaptureError(msg)
    check_template(template.command, template.env, list(points[0]))
    first = _point(template, points[0], template.out)
    # fail once, before any folder exists, when the setup cannot work
    preflight_check(first, system_checks=system_checks)
    folder = experiment_folder(template.out, template.display_name, "sweep")
    (folder / "sweep.json").write_text(
        json.dumps(
            {
                "command": list(template.command),
                "mode": template.mode,
                "points": points,
                "experiment": template.to_dict(),
            },
            indent=2,
            default=str,
        )
        + "\n"
    )
    rows: list[dict[str, Any]] = []
    try:
        for params in points:
            if stop_event is not None and stop_event.is_set():
                break
            exp = _point(template, params, str(folder))
            log.info("sweep point %s", params)
            try:
                result = run(
                    exp,
                    on_output=on_output,
                    stop_event=stop_event,
                    check=False,
                    system_checks=system_checks,
                )
            except CaptureError as exc:
                rows.append(result_row(params, None, error=str(exc)))
                if stop_on_error:
                    break
                continue
            rows.append(result_row(params, result))
            if stop_on_error and result.status != "complete":
                break
    finally:
        table = results_frame(rows)
        table.write_csv(folder / "results.csv")
        table.write_parquet(folder / "results.parquet")
    return table


def _point(template: Experiment, params: Mapping[str, Any], out: str) -> Experiment:
    return template.replace(
        command=tuple(fill(t, params) for t in template.command),
        env={k: fill(v, params) for k, v in template.env.items()},
        name=f"{template.display_name}-{point_slug(params)}",
        out=out,
    )
