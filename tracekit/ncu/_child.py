"""``python -m tracekit.ncu._child REPORT OUTDIR TABLE…``: read an ``.ncu-rep`` with
``ncu_report`` and write the asked tables as Arrow IPC files into OUTDIR (see
:mod:`tracekit.ncu.isolated`), with ``result.json`` saying what was found. If ``ncu_report``
aborts, this process dies and the parent reports it; nothing here is for users."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any


def _run(path: Path, out: Path, tables: list[str]) -> dict[str, Any]:
    import polars as pl

    from tracekit.ncu import container, schema
    from tracekit.ncu.binary import BinaryReport

    try:
        walked: container.Container | None = container.walk(path)
    except container.ContainerError:
        walked = None  # the parent knows; load what ncu_report can read
    # ncu's own lines go to this process's stderr, which the parent reads (and keeps when
    # ncu_report aborts)
    binary = BinaryReport(path, container=walked, capture=False)
    written: list[str] = []

    def write(name: str, frame: pl.DataFrame) -> None:
        frame.write_ipc(out / f"{name}.arrow")
        written.append(name)

    if "identity" in tables or "launch" in tables:
        rows, launch = binary.kernel_rows()
        identity_schema = {k: schema.KERNELS[k] for k in schema.IDENTITY_COLUMNS}
        write("identity", pl.DataFrame(rows, schema=identity_schema))
        write("launch", launch)
    if "metrics" in tables:
        write("metrics", binary.metrics())
    if "rules" in tables:
        write("rules", binary.rules())
    if "instances" in tables:
        wanted_file = out / "wanted.json"
        wanted = json.loads(wanted_file.read_text()) if wanted_file.exists() else None
        write("instances", binary.instances(wanted))
    return {
        "tables": written,
        "num_results": binary.num_results,
        "problems": binary.problems,
        "late_problems": binary.late_problems,
    }


def main(argv: list[str]) -> int:
    """Entry point; returns the exit status (0, or 2 with ``error`` in ``result.json``)."""
    from tracekit.errors import TracekitError

    path, out, tables = Path(argv[0]), Path(argv[1]), argv[2:]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = _run(path, out, tables)
            code = 0
        except TracekitError as exc:
            result = {"error": str(exc), "kind": type(exc).__name__}
            code = 2
    result["warnings"] = [
        [w.category.__name__, str(w.message)] for w in caught if issubclass(w.category, UserWarning)
    ]
    tmp = out / "result.json.tmp"
    tmp.write_text(json.dumps(result))
    tmp.replace(out / "result.json")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
