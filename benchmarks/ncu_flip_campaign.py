"""Flip bits in copies of the repo's ``.ncu-rep`` files and see what ``ncu_report`` and
tracekit make of each copy (issue 18.6; the reproducer behind docs/ncu.md "Damaged reports").

For every mutated copy (one bit flipped at a random offset, or in one of the file's ``uint32``
length prefixes):

* a child process reads it with ``ncu_report`` alone, touching every result, metric, instance
  value and rule, and prints counts and digests; the outcome is ``crash`` (killed by a
  signal: SIGABRT), ``error`` (a Python exception), ``loss`` (fewer results, metrics,
  instance values or rules than the intact file: nothing said), ``changed`` (same counts,
  other names or values: nothing said), or ``same``;
* tracekit opens it (``NcuReport.from_path``, default ``validate=True``; in a child process
  when ``ncu_report`` crashed on it) and reads ``metrics`` and ``instances``: the verdict is
  ``walk`` (container walk refused it), ``load`` (refused after loading: counts, names, ncu's
  parse errors), ``crash`` (only the child process saw it), or ``loaded``.

Usage::

    python benchmarks/ncu_flip_campaign.py [--cases 200] [--seed 0] [--lengths] REPORT...

Prints one line per copy that is not ``same``/``loaded`` and a table of outcome × verdict.
Copies live in a temporary folder; the inputs are only read.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import random
import struct
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def probe(path: str) -> None:
    """Child: read everything with ncu_report alone; print counts and digests as JSON."""
    import ncu_report

    ctx = ncu_report.load_report(path)
    names = hashlib.sha256()
    values = hashlib.sha256()
    counts = collections.Counter()
    for r in range(ctx.num_ranges()):
        rng = ctx.range_by_idx(r)
        for i in range(rng.num_actions()):
            act = rng.action_by_idx(i)
            counts["results"] += 1
            names.update(repr(act.name(act.NameBase_FUNCTION)).encode())
            for name in act.metric_names():
                metric = act.metric_by_name(name)  # TypeError on a name that is not UTF-8
                counts["metrics"] += 1
                names.update(name.encode("utf-8", "surrogateescape"))
                if metric.has_value():
                    values.update(repr((metric.as_double(), metric.as_string())).encode("utf-8", "surrogateescape"))
                for j in range(metric.num_instances()):
                    counts["instances"] += 1
                    values.update(repr(metric.as_double(j)).encode())
            counts["rules"] += len(act.rule_results_as_dicts())
    print(json.dumps({**counts, "names": names.hexdigest(), "values": values.hexdigest()}))


def run_probe(path: Path) -> tuple[str, dict[str, object] | str]:
    proc = subprocess.run([sys.executable, __file__, "--probe", str(path)], capture_output=True, text=True, errors="replace", check=False)
    if proc.returncode < 0:
        return "crash", f"signal {-proc.returncode}"
    if proc.returncode != 0:
        return "error", (proc.stderr.strip().splitlines() or ["?"])[-1][:120]
    return "ok", json.loads(proc.stdout)


def outcome(intact: dict[str, object], got: tuple[str, dict[str, object] | str]) -> str:
    kind, data = got
    if kind != "ok":
        return kind
    assert isinstance(data, dict)
    if any(data.get(k, 0) != intact.get(k, 0) for k in ("results", "metrics", "instances", "rules")):
        return "loss"
    if data["names"] != intact["names"] or data["values"] != intact["values"]:
        return "changed"
    return "same"


def verdict(path: Path, crashed: bool) -> tuple[str, str]:
    from tracekit.errors import TraceFormatError
    from tracekit.ncu import NcuReport, container

    try:
        container.walk(path)
    except container.ContainerError as exc:
        return "walk", str(exc)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = NcuReport.from_path(path, isolate=crashed)
            report.metrics  # noqa: B018 - reading checks the instance counts
            report.instances  # noqa: B018
    except TraceFormatError as exc:
        return ("crash" if "crashed" in str(exc) else "load"), str(exc)
    return "loaded", ""


def length_offsets(data: bytes) -> list[int]:
    """Byte offsets of the container's and the results' uint32 length prefixes."""
    from tracekit.ncu.container import _varint_fields

    offsets, pos, first = [], 4, True
    while pos < len(data):
        offsets.append(pos)
        (length,) = struct.unpack_from("<I", data, pos)
        header = data[pos + 4 : pos + 4 + length]
        pos += 4 + length
        if first:
            first = False
            continue
        fields = _varint_fields(header)
        if fields.get(5, 0) and fields.get(1, 0) == 0:
            offsets.append(pos)
        pos += fields.get(5, 0)
    return offsets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--cases", type=int, default=200, help="random flips per report")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lengths", action="store_true", help="also flip bits 0, 4, 7 of bytes 1-3 of every length prefix")
    args = parser.parse_args()
    table: collections.Counter[tuple[str, str]] = collections.Counter()
    with tempfile.TemporaryDirectory(prefix="tracekit-flip-") as tmp:
        for report in args.reports:
            data = report.read_bytes()
            kind, intact = run_probe(report)
            assert kind == "ok" and isinstance(intact, dict), f"{report} does not load: {intact}"
            rng = random.Random(f"{args.seed}:{report.name}")
            flips = [(rng.randrange(8, len(data)), rng.randrange(8)) for _ in range(args.cases)]
            if args.lengths:
                flips += [(o + b, bit) for o in length_offsets(data) for b in (1, 2, 3) for bit in (0, 4, 7)]
            for offset, bit in flips:
                copy = bytearray(data)
                copy[offset] ^= 1 << bit
                path = Path(tmp) / report.name
                path.write_bytes(bytes(copy))
                got = run_probe(path)
                what = outcome(intact, got)
                seen, why = verdict(path, what == "crash")
                table[(what, seen)] += 1
                if (what, seen) != ("same", "loaded"):
                    print(f"{report.name} byte {offset} bit {bit}: ncu_report {what} -> tracekit {seen}: {why[:160]}", flush=True)
    print("\nncu_report outcome x tracekit verdict (copies)")
    verdicts = ["walk", "load", "crash", "loaded"]
    print(f"{'':10}" + "".join(f"{v:>8}" for v in verdicts))
    for what in ["crash", "error", "loss", "changed", "same"]:
        print(f"{what:10}" + "".join(f"{table[(what, v)]:>8}" for v in verdicts))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--probe":
        probe(sys.argv[2])
    else:
        main()
