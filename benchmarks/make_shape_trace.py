"""Build a synthetic Nsight Systems export of a chosen *shape*: kernels, CUDA API rows per kernel,
NVTX ranges per kernel and distinct kernel names (issue 44 §4: memory and first open on shapes
tracekit was not tuned for).

``make_big_trace.py`` repeats a real export, so every ratio is the seed's (4.5 API rows per
kernel would need a seed that has them). Here the seed (default: the bundled decode export) gives
everything but the three event tables: schema, metadata, StringIds, threads, GPUs, the other
activity tables. Its kernel, CUDA API and NVTX rows are replaced by

* ``--kernels`` kernels of 1–12 µs on the seed's device, context and stream, in steps of ``--step``
  kernels; 80 % of a step's slots repeat the same core sequence of names (the run has a
  structure to find), the rest cycle through the ``--names`` distinct names, each a templated
  C++-like demangled name (≈ 90 bytes) with its short and mangled names;
* ``--api`` CUDA API rows per kernel on the seed's launching thread (a fraction is spread
  evenly): the launch call (``cudaLaunchKernel``, the kernel's correlation id) and the rest
  other runtime calls taken from the seed (``cudaStreamIsCapturing``, ``cudaEventRecord`` …);
* ``--nvtx`` NVTX push/pop ranges per kernel (0–1; a fraction spread evenly), each around its
  kernel's launch, named from a small set of layer names (as ``text``, the way PyTorch's
  ``nvtxRangePushA`` records them), plus one ``step.N`` range per step.

Times grow monotonically (4–9 µs of host time per kernel, then its calls of 1.5–4 µs; each
kernel queued behind its launch and the kernel before it), ids are unique, and every kernel joins exactly one API call, as in nsys's own exports.

Example
-------
    python benchmarks/make_shape_trace.py --kernels 1000000 --api 4.5 --nvtx 0.42 --names 10000 \\
        -o benchmarks/out/shape.sqlite
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DEFAULT_SEEDS  # noqa: E402

KERNEL, RUNTIME, NVTX = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS"
CHUNK = 200_000
LAYERS = ("attn", "mlp", "norm", "rope", "embed", "lm_head", "all_reduce", "sample")


def _columns(con: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]


def _string_ids(con: sqlite3.Connection, texts: list[str]) -> list[int]:
    start = int(con.execute("SELECT coalesce(max(id), 0) + 1 FROM StringIds").fetchone()[0])
    con.executemany("INSERT INTO StringIds (id, value) VALUES (?, ?)", ((start + i, t) for i, t in enumerate(texts)))
    return list(range(start, start + len(texts)))


def _spread(n: int, rate: float) -> np.ndarray:
    """How many of something each of ``n`` items gets for ``rate`` per item (fraction spread evenly)."""
    edges = np.floor(np.arange(n + 1, dtype=np.float64) * rate).astype(np.int64)
    return np.diff(edges)


def build(seed: Path, out: Path, *, kernels: int, api: float, nvtx: float, names: int, step: int, rng_seed: int = 44) -> dict:
    """Write the export (see the module doc); its row counts and shape."""
    if api < 1:
        raise SystemExit("--api: every kernel has its launch call: give 1 or more")
    if not 0 <= nvtx <= 1:
        raise SystemExit("--nvtx: give 0 to 1 ranges per kernel")
    rng = np.random.default_rng(rng_seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".building")
    shutil.copyfile(seed, tmp)
    tmp.chmod(0o644)
    con = sqlite3.connect(tmp)
    con.execute("PRAGMA journal_mode = OFF")
    con.execute("PRAGMA synchronous = OFF")
    kcols, rcols = _columns(con, KERNEL), _columns(con, RUNTIME)
    ktpl = dict(zip(kcols, con.execute(f"SELECT * FROM {KERNEL} ORDER BY start LIMIT 1").fetchone(), strict=True))
    launch = con.execute(f"SELECT r.* FROM {RUNTIME} r JOIN {KERNEL} k USING (correlationId) LIMIT 1").fetchone()
    rtpl = dict(zip(rcols, launch, strict=True))
    others = [r[0] for r in con.execute(
        f"SELECT nameId FROM {RUNTIME} WHERE correlationId NOT IN (SELECT correlationId FROM {KERNEL}) "
        "GROUP BY nameId ORDER BY count(*) DESC LIMIT 8")] or [rtpl["nameId"]]
    first = int(con.execute(f"SELECT min(start) FROM {KERNEL}").fetchone()[0])
    for table in (KERNEL, RUNTIME, NVTX):
        con.execute(f"DELETE FROM {table}")
    # names: a core sequence per step (80 %) and rare names cycling through the rest
    core = min(names, max(1, int(step * 0.8)))
    demangled = [f"void synth::kernel_{i:06d}<float, {i % 7 + 1}, true>(synth::Params<{i % 13}>, float const*, float*, int)"
                 for i in range(names)]
    short = [f"kernel_{i:06d}" for i in range(names)]
    mangled = [f"_ZN5synth11kernel_{i:06d}IfLi{i % 7 + 1}ELb1EEEvNS_6ParamsILi{i % 13}EEEPKfPfi" for i in range(names)]
    dem_ids, short_ids, mang_ids = _string_ids(con, demangled), _string_ids(con, short), _string_ids(con, mangled)
    slot = np.arange(kernels, dtype=np.int64) % step
    rare = np.cumsum(slot >= core) - 1
    name_idx = np.where(slot < core, slot % core, core + rare % max(names - core, 1))
    name_idx = np.minimum(name_idx, names - 1)
    extra = _spread(kernels, api - 1)  # API calls per kernel besides its launch
    ranges = _spread(kernels, nvtx)
    call_ns = rng.integers(1500, 4000, size=kernels + int(extra.sum()) + 1)
    dur = rng.integers(1000, 12000, size=kernels)
    # host timeline: for each kernel, Python's own time, then its extra calls, then its launch
    # (the host keeps up with the GPU on average: queues stay short, as in a decode loop)
    calls_per_kernel = extra + 1
    n_calls = int(calls_per_kernel.sum())
    think = np.zeros(n_calls, dtype=np.int64)
    think[np.cumsum(calls_per_kernel) - calls_per_kernel] = rng.integers(4000, 9000, size=kernels)
    call_end = first + np.cumsum(call_ns[:n_calls] + 200 + think)
    call_start = call_end - call_ns[: int(calls_per_kernel.sum())]
    launch_pos = np.cumsum(calls_per_kernel) - 1
    launch_end = call_end[launch_pos]
    # a kernel starts after its launch and after the previous kernel: start_i = max(q_i, end_{i-1});
    # with C_i the durations before i, start_i - C_i is the running maximum of q_i - C_i
    queued = launch_end + 3000
    before = np.concatenate(([0], np.cumsum(dur)[:-1]))
    gpu_start = before + np.maximum.accumulate(queued - before)
    gpu_end = gpu_start + dur
    corr0 = 10_000_000
    kernel_corr = corr0 + np.arange(kernels, dtype=np.int64) * 8
    grid_id = np.arange(1, kernels + 1, dtype=np.int64)
    kinsert = f"INSERT INTO {KERNEL} ({', '.join(kcols)}) VALUES ({', '.join('?' * len(kcols))})"
    for lo in range(0, kernels, CHUNK):
        hi = min(lo + CHUNK, kernels)
        rows = []
        for i in range(lo, hi):
            r = dict(ktpl)
            n = int(name_idx[i])
            r.update(start=int(gpu_start[i]), end=int(gpu_end[i]), correlationId=int(kernel_corr[i]),
                     demangledName=dem_ids[n], shortName=short_ids[n], gridId=int(grid_id[i]))
            if "mangledName" in r:
                r["mangledName"] = mang_ids[n]
            rows.append(tuple(r[c] for c in kcols))
        con.executemany(kinsert, rows)
    # API rows: kernel k's calls are positions launch_pos[k]-extra[k] … launch_pos[k]
    owner = np.repeat(np.arange(kernels), calls_per_kernel)
    is_launch = np.zeros(len(owner), dtype=bool)
    is_launch[launch_pos] = True
    within = np.arange(len(owner)) - np.repeat(launch_pos - extra, calls_per_kernel)
    corr = np.where(is_launch, kernel_corr[owner], kernel_corr[owner] + 1 + np.minimum(within, 6))
    other_name = np.asarray(others, dtype=np.int64)[np.arange(len(owner)) % len(others)]
    name_col = np.where(is_launch, rtpl["nameId"], other_name)
    rinsert = f"INSERT INTO {RUNTIME} ({', '.join(rcols)}) VALUES ({', '.join('?' * len(rcols))})"
    for lo in range(0, len(owner), CHUNK):
        hi = min(lo + CHUNK, len(owner))
        rows = []
        for j in range(lo, hi):
            r = dict(rtpl)
            r.update(start=int(call_start[j]), end=int(call_end[j]), correlationId=int(corr[j]), nameId=int(name_col[j]),
                     returnValue=0, callchainId=None)
            rows.append(tuple(r[c] for c in rcols))
        con.executemany(rinsert, rows)
    # NVTX: one push/pop range around a kernel's launch per range slot, and step.N ranges
    tid = rtpl["globalTid"]
    ninsert = (f"INSERT INTO {NVTX} (start, end, eventType, rangeId, text, globalTid, endGlobalTid, textId, domainId) "
               "VALUES (?, ?, 59, NULL, ?, ?, ?, ?, 0)")
    with_range = np.flatnonzero(ranges)
    for lo in range(0, len(with_range), CHUNK):
        part = with_range[lo:lo + CHUNK]
        rows = [(int(call_start[launch_pos[k]] - 100), int(call_end[launch_pos[k]] + 100), LAYERS[int(k) % len(LAYERS)],
                 tid, tid, None) for k in part]
        con.executemany(ninsert, rows)
    steps = (kernels + step - 1) // step
    step_rows = []
    for s in range(steps):
        a, b = s * step, min((s + 1) * step, kernels) - 1
        lo_call = launch_pos[a] - extra[a]
        step_rows.append((int(call_start[lo_call] - 500), int(call_end[launch_pos[b]] + 500), f"step.{s}", tid, tid, None))
    con.executemany(ninsert, step_rows)
    last = int(max(gpu_end.max(), call_end.max()))
    if "ANALYSIS_DETAILS" in {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}:
        # the seed's events run from 0 to its duration (a capture range's timeline): lengthen it
        # to the new last event, as make_big_trace.py does
        old_end = int(con.execute("SELECT duration FROM ANALYSIS_DETAILS").fetchone()[0])
        grow = max(last + 1_000_000 - old_end, 0)
        con.execute("UPDATE ANALYSIS_DETAILS SET stopTime = stopTime + ?, duration = duration + ?", (grow, grow))
    con.commit()
    counts = {t: int(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]) for t in (KERNEL, RUNTIME, NVTX)}
    con.close()
    tmp.replace(out)
    return {"seed": str(seed), "kernels": kernels, "api_per_kernel": api, "nvtx_per_kernel": nvtx, "names": names,
            "step": step, "rows": counts, "bytes": out.stat().st_size}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", type=int, default=1_000_000)
    parser.add_argument("--api", type=float, default=4.5, help="CUDA API rows per kernel (≥ 1)")
    parser.add_argument("--nvtx", type=float, default=0.42, help="NVTX ranges per kernel (0–1)")
    parser.add_argument("--names", type=int, default=10_000, help="distinct kernel names")
    parser.add_argument("--step", type=int, default=500, help="kernels per step")
    parser.add_argument("--seed", type=Path, default=DEFAULT_SEEDS[0])
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    sidecar = args.output.with_name(args.output.name + ".json")
    want = {"kernels": args.kernels, "api_per_kernel": args.api, "nvtx_per_kernel": args.nvtx, "names": args.names,
            "step": args.step}
    if args.output.exists() and sidecar.exists() and not args.force:
        have = json.loads(sidecar.read_text())
        if all(have.get(k) == v for k, v in want.items()):
            print(f"{args.output}: up to date ({have['bytes'] / 1e6:,.0f} MB)")
            return 0
    t = time.perf_counter()
    info = build(args.seed, args.output, kernels=args.kernels, api=args.api, nvtx=args.nvtx, names=args.names, step=args.step)
    info["build_s"] = round(time.perf_counter() - t, 1)
    sidecar.write_text(json.dumps(info, indent=2))
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
