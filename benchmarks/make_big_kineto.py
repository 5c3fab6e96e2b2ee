"""Build a large PyTorch profiler (Kineto) trace by repeating a real trace's events.

The seed's top-level members (``schemaVersion``, ``deviceProperties``, ``baseTimeNanoseconds``,
``traceName`` …) are written once, as the seed has them; its ``traceEvents`` are written again
and again, copy ``k`` (k = 0 … copies-1) with

* every ``ts`` shifted by ``k × (span + gap)`` µs, where ``span`` runs from the seed's earliest
  ``ts`` to its latest ``ts + dur`` (rounded up to a whole µs), so copies follow one another and
  never overlap; the shift is added to the number's integer part, so the three decimals (the
  nanoseconds) stay exactly as written;
* correlation ids (``args.correlation``) and flow ids (``id`` of the ``ac2g`` ``s``/``f`` events,
  which are correlation ids) offset by ``k × (their max + 1)``, so a kernel still pairs with
  exactly one runtime call;
* ``External id``, ``Ev Idx`` and ``Sequence number`` offset by ``k × (max + 1)`` each, and the
  ``N`` of ``ProfilerStep#N`` by ``k × (max N + 1)``;
* ``dur``, names, pids, tids, devices, streams and every other field unchanged.

Metadata events (``ph: "M"``: process and thread names, sort indexes) are written once, after
the last copy (Kineto writes them once, at the end). Each event keeps the seed's text (its
layout, its key order, its number formats): only the numbers above are rewritten, in place.

The output is written a copy at a time to ``OUTPUT.partial`` and renamed; ``--gz`` also writes
``OUTPUT.gz``. A sidecar ``OUTPUT.json`` records the seed, its sha256, the strides and counts.
Then it checks the result: the whole file decodes as JSON, copy 1 decodes to exactly the seed's
events shifted as said, and ``tracekit.open`` (in a temporary cache) finds ``copies ×`` the
seed's kernels.

Example
-------
    python benchmarks/make_big_kineto.py --seed /work/x/g03.json --size-gb 1.0 -o /work/x/kbig/g03x12.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import sha256  # noqa: E402

#: ``args`` keys offset per copy (the flow events' ``id`` shares ``correlation``'s stride).
ID_KEYS = ("correlation", "External id", "Ev Idx", "Sequence number")
GAP_US = 1000
STEP = re.compile(rb'"ProfilerStep#(\d+)"')
#: a key whose number is rewritten: "ts", "id", or one of ID_KEYS, then its JSON number
NUMBER = re.compile(rb'(?<!\\)"(ts|id|correlation|External id|Ev Idx|Sequence number)"(\s*:\s*)(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)'
                    rb'|"ProfilerStep#(\d+)"')


class _Doc(msgspec.Struct):
    traceEvents: list[msgspec.Raw]  # noqa: N815 - the JSON's key


def _read(seed: Path) -> bytes:
    data = seed.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def _plan(data: bytes) -> dict[str, Any]:
    """The seed's events (raw text), their split into repeated and metadata events, and the
    strides."""
    raws = msgspec.json.decode(data, type=_Doc).traceEvents
    events = orjson.loads(data)["traceEvents"]
    assert len(raws) == len(events)
    repeated = [bytes(r) for r, e in zip(raws, events, strict=True) if e.get("ph") != "M"]
    meta = [bytes(r) for r, e in zip(raws, events, strict=True) if e.get("ph") == "M"]
    first, last = bytes(raws[0]), bytes(raws[-1])
    start = data.index(b"[", data.index(b'"traceEvents"')) + 1
    start = data.index(first, start)
    end = data.rindex(last) + len(last)
    maxima: dict[str, int] = dict.fromkeys(ID_KEYS, 0)
    counts: dict[str, int] = dict.fromkeys(("ts", "id", *ID_KEYS, "ProfilerStep"), 0)
    lo, hi, step = math.inf, -math.inf, -1
    for e in events:
        if e.get("ph") == "M":
            continue
        ts = e.get("ts")
        if isinstance(ts, int | float):
            counts["ts"] += 1
            lo, hi = min(lo, ts), max(hi, ts + (e.get("dur") or 0))
        if "id" in e:
            counts["id"] += 1
            maxima["correlation"] = max(maxima["correlation"], int(e["id"]))
        args = e.get("args")
        if isinstance(args, dict):
            for k in ID_KEYS:
                if isinstance(args.get(k), int):
                    counts[k] += 1
                    maxima[k] = max(maxima[k], args[k])
        m = STEP.fullmatch(json.dumps(e.get("name")).encode())
        if m:
            counts["ProfilerStep"] += 1
            step = max(step, int(m.group(1)))
    stride_us = math.ceil(hi - lo) + GAP_US
    strides = {k: v + 1 for k, v in maxima.items()}
    strides["id"] = strides["correlation"]
    strides["ProfilerStep"] = step + 1
    return {"head": data[:start], "tail": data[end:], "repeated": b",\n  ".join(repeated), "meta": b",\n  ".join(meta), "n_meta": len(meta),
            "events": events, "counts": counts, "strides": strides, "stride_us": stride_us, "span_us": [lo, hi]}


def _shifted(template: bytes, k: int, stride_us: int, strides: dict[str, int], counts: dict[str, int]) -> bytes:
    """The repeated events' text for copy ``k``."""
    seen: dict[str, int] = dict.fromkeys(counts, 0)
    if k == 0:
        return template
    shift = k * stride_us

    def sub(m: re.Match[bytes]) -> bytes:
        if m.group(4) is not None:
            seen["ProfilerStep"] += 1
            return b'"ProfilerStep#%d"' % (int(m.group(4)) + k * strides["ProfilerStep"])
        key = m.group(1).decode()
        seen[key] += 1
        if key == "ts":
            value = Decimal(m.group(3).decode()) + shift
            text = format(value, "f").encode()
        else:
            text = b"%d" % (int(m.group(3)) + k * strides[key])
        return b'"%s"%s%s' % (m.group(1), m.group(2), text)

    out = NUMBER.sub(sub, template)
    if seen != counts:  # a match inside a string, or a number form not expected
        msg = f"copy {k}: rewrote {seen}, expected {counts}"
        raise SystemExit(msg)
    return out


def _expected(event: dict[str, Any], k: int, stride_us: int, strides: dict[str, int]) -> dict[str, Any]:
    """``event`` as copy ``k`` should hold it (for the check)."""
    e = dict(event)
    if isinstance(e.get("ts"), int | float):
        e["ts"] = e["ts"] + k * stride_us
    if "id" in e:
        e["id"] = e["id"] + k * strides["id"]
    if isinstance(e.get("args"), dict):
        e["args"] = {a: (v + k * strides[a] if a in ID_KEYS and isinstance(v, int) else v) for a, v in e["args"].items()}
    m = STEP.fullmatch(json.dumps(e.get("name")).encode())
    if m:
        e["name"] = f"ProfilerStep#{int(m.group(1)) + k * strides['ProfilerStep']}"
    return e


def _check_copy(plan: dict[str, Any], copy1: bytes) -> None:
    got = orjson.loads(b"[" + copy1 + b"]")
    want = [_expected(e, 1, plan["stride_us"], plan["strides"]) for e in plan["events"] if e.get("ph") != "M"]
    assert len(got) == len(want), (len(got), len(want))
    for g, w in zip(got, want, strict=True):
        if isinstance(w.get("ts"), float):  # the text was shifted exactly; the float of it rounds
            assert abs(g["ts"] - w["ts"]) < 1e-3, (g, w)
            g, w = {**g, "ts": 0}, {**w, "ts": 0}
        assert g == w, (g, w)


def build(seed: Path, output: Path, copies: int, *, gz: bool = False) -> dict[str, Any]:
    t0 = time.perf_counter()
    data = _read(seed)
    plan = _plan(data)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + ".partial")
    with tmp.open("wb") as fh:
        fh.write(plan["head"])
        for k in range(copies):
            text = _shifted(plan["repeated"], k, plan["stride_us"], plan["strides"], plan["counts"])
            if k == 1:
                _check_copy(plan, text)
            fh.write(text if k == 0 else b",\n  " + text)
            print(f"  copy {k + 1}/{copies} written", file=sys.stderr, flush=True)
        if plan["meta"]:
            fh.write(b",\n  " + plan["meta"])
        fh.write(plan["tail"])
    os.replace(tmp, output)
    if gz:
        gz_tmp = output.with_name(output.name + ".gz.partial")
        with output.open("rb") as src, gzip.open(gz_tmp, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 1 << 24)
        os.replace(gz_tmp, output.with_name(output.name + ".gz"))
    info: dict[str, Any] = {
        "seed": str(seed), "seed_sha256": sha256(seed), "seed_json_bytes": len(data), "seed_events": len(plan["events"]),
        "output": str(output), "output_bytes": output.stat().st_size, "copies": copies,
        "gap_us": GAP_US, "time_stride_us": plan["stride_us"], "seed_span_us": plan["span_us"],
        "id_strides": plan["strides"], "rewritten_per_copy": plan["counts"],
        "metadata_events_once": plan["n_meta"], "seconds": round(time.perf_counter() - t0, 1),
    }
    output.with_name(output.name + ".json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def _kernels(path: Path) -> int:
    """``tracekit.open(path)``'s kernel count, converted in a temporary cache."""
    import subprocess

    with tempfile.TemporaryDirectory() as cache:
        code = "import sys, tracekit; print(tracekit.open(sys.argv[1]).kernels.height)"
        env = {**os.environ, "TRACEKIT_CACHE": cache,
               "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
        out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env, check=True)
        return int(out.stdout.split()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=Path, default=Path("/work/x/g03.json"), help="a real Kineto trace (.json or .json.gz)")
    parser.add_argument("--size-gb", type=float, default=1.0, help="target JSON size (GB of 10⁹ bytes); sets --copies")
    parser.add_argument("--copies", type=int, help="number of copies of the seed's events (overrides --size-gb)")
    parser.add_argument("--gz", action="store_true", help="also write OUTPUT.gz")
    parser.add_argument("--no-check", action="store_true", help="skip the tracekit.open kernel count")
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args()
    copies = args.copies
    if copies is None:
        per_copy = len(_read(args.seed))
        copies = max(1, round(args.size_gb * 1e9 / per_copy))
    info = build(args.seed, args.output, copies, gz=args.gz)
    print(f"{args.output}: {info['output_bytes'] / 1e6:,.0f} MB, {copies} copies of {args.seed} "
          f"({info['seed_json_bytes'] / 1e6:,.0f} MB, {info['seed_events']:,} events), {info['seconds']} s")
    with args.output.open("rb") as fh:  # the whole file is JSON of the Kineto shape
        events = msgspec.json.decode(fh.read(), type=_Doc).traceEvents
    want = copies * (info["seed_events"] - info["metadata_events_once"]) + info["metadata_events_once"]
    assert len(events) == want, (len(events), want)
    del events
    if not args.no_check:
        seed_k, big_k = _kernels(args.seed), _kernels(args.output)
        print(f"kernels: seed {seed_k:,}, output {big_k:,} (= {copies} × {seed_k:,}: {big_k == copies * seed_k})")
        assert big_k == copies * seed_k, (big_k, copies, seed_k)
        info["kernels"] = {"seed": seed_k, "output": big_k}
        args.output.with_name(args.output.name + ".json").write_text(json.dumps(info, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
