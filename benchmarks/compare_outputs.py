"""Dump what ``diagnose`` and ``trace_summary`` give for some exports, to compare two checkouts.

Run it once with each checkout first on ``PYTHONPATH`` and diff the two folders (``diff -r``):

    PYTHONPATH=/work/main python benchmarks/compare_outputs.py /tmp/cmp_main FILE...
    PYTHONPATH=$PWD       python benchmarks/compare_outputs.py /tmp/cmp_new  FILE...
    diff -r /tmp/cmp_main /tmp/cmp_new

Per export: ``diagnose(...).to_json()`` with the default thresholds and with tiny sampling
thresholds (``exact_steps=8``, ``sample_steps=4``, ``max_window_ops=50``; and ``3``, ``2``, ``50``,
which samples the steps of 8-step traces: the sampled-window code paths run on small traces
too), and ``trace_summary``'s info, tables and notes.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path


def main() -> int:
    import tracekit
    from tracekit.diagnosis import DiagnoseConfig, diagnose
    from tracekit.nsys.summary import trace_summary

    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    warnings.simplefilter("ignore")
    configs = {
        "default": DiagnoseConfig(),
        "sampled": DiagnoseConfig(exact_steps=8, sample_steps=4, max_window_ops=50),
        "sampled_steps": DiagnoseConfig(exact_steps=3, sample_steps=2, max_window_ops=50),
    }
    for f in sys.argv[2:]:
        name = Path(f).stem
        for label, cfg in configs.items():
            try:
                text = diagnose(tracekit.open(f), config=cfg).to_json()
            except Exception as exc:  # noqa: BLE001 — an error is an output too
                text = f"ERROR {type(exc).__name__}: {exc}"
            (out / f"{name}.diagnose_{label}.json").write_text(text)
        try:
            s = trace_summary(tracekit.open(f))
            parts = [repr(s.info), repr(s.notes)]
            for key, frame in s.tables.items():
                parts.append(f"{key}\n{frame.to_dicts()!r}\n{frame.schema!r}")
            text = "\n".join(parts)
        except Exception as exc:  # noqa: BLE001
            text = f"ERROR {type(exc).__name__}: {exc}"
        (out / f"{name}.summary.txt").write_text(text)
        print(name, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
