"""tracekit against Meta's HolisticTraceAnalysis (HTA) on the same Kineto traces.

Two halves, in two Python environments (HTA is never a dependency of tracekit):

``reference`` runs *inside HTA's environment* (imports ``hta``, never ``tracekit``) and writes,
per trace folder, one JSON file of HTA's five views (temporal breakdown, idle-time breakdown,
kernel-type breakdown, communication/computation overlap, kernel launch statistics), twice:

* ``"us"``: HTA as shipped. It rounds nanosecond-resolution traces to whole microseconds
  (``ceil(start)``, ``floor(end)``; ``hta.common.trace_parser.round_down_time_stamps``).
* ``"ns"``: HTA's own analysis code on exact times: ``HTA_DISABLE_NS_ROUNDING=1`` and, after
  loading, ``ts``/``dur`` scaled to integer nanoseconds (the idle-time threshold, 30 µs, scaled
  with them). The definitions are HTA's; only the rounding is gone. This is what tracekit's
  :mod:`tracekit.analysis.hta_views` is tested against (``tests/test_hta_parity.py``).

``compare`` runs in tracekit's environment: it computes the same views with tracekit (running
``reference`` through ``--hta-python`` for traces that have no reference yet) and prints, per
view and trace, the largest relative difference against both references.

    /work/x/htavenv/bin/python benchmarks/hta_parity.py reference DIR [DIR ...] --out tests/data/hta_reference
    .venv/bin/python benchmarks/hta_parity.py compare [--ref tests/data/hta_reference] [DIR ...]

A trace folder holds one trace file per rank (``*.json``/``*.json.gz``, as HTA wants them).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REF = ROOT / "tests" / "data" / "hta_reference"
#: HTA's defaults (``TraceAnalysis.get_idle_time_breakdown`` / ``get_cuda_kernel_launch_stats``), µs.
CONSECUTIVE_KERNEL_DELAY_US = 30
RUNTIME_CUTOFF_US = 50
LAUNCH_DELAY_CUTOFF_US = 100


# ---------------------------------------------------------------- HTA's side (htavenv only)
def _hta_views(trace_dir: Path, scale: int) -> dict:
    """HTA's five views of one trace folder; times in µs (``scale=1``) or ns (``scale=1000``)."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    from hta.trace_analysis import TraceAnalysis

    analysis = TraceAnalysis(trace_dir=str(trace_dir))
    if scale != 1:
        for rank, df in analysis.t.traces.items():
            df["ts"] = (df["ts"] * scale).round().astype("int64")
            df["dur"] = (df["dur"] * scale).round().astype("int64")
            df["end"] = df["ts"] + df["dur"]
            analysis.t.traces[rank] = df
    ranks = sorted(analysis.t.get_ranks())
    out: dict = {"ranks": ranks}
    for view in (_temporal, _comm_comp_overlap, _kernel_type, _idle_time, _launch_stats):
        try:
            view(analysis, ranks, scale, out)
        except Exception as exc:  # noqa: BLE001 - HTA's own failures are part of the record
            out[view.__name__.lstrip("_")] = {"error": f"{type(exc).__name__}: {exc}".strip()}
    return out


def _temporal(analysis, ranks, scale, out):  # noqa: ANN001, ANN202
    temporal = analysis.get_temporal_breakdown(visualize=False)
    out["temporal"] = [
        {"rank": int(r["rank"]), "idle_time": float(r["idle_time(us)"]), "compute_time": float(r["compute_time(us)"]),
         "non_compute_time": float(r["non_compute_time(us)"]), "kernel_time": float(r["kernel_time(us)"])}
        for _, r in temporal.iterrows()
    ]


def _comm_comp_overlap(analysis, ranks, scale, out):  # noqa: ANN001, ANN202
    overlap = analysis.get_comm_comp_overlap(visualize=False)
    out["comm_comp_overlap"] = [{"rank": int(r["rank"]), "pctg": _num(r["comp_comm_overlap_pctg"])} for _, r in overlap.iterrows()]


def _kernel_type(analysis, ranks, scale, out):  # noqa: ANN001, ANN202
    kinds, names = analysis.get_gpu_kernel_breakdown(visualize=False)
    out["kernel_type"] = [{"kernel_type": r["kernel_type"], "sum": float(r["sum"]), "percentage": float(r["percentage"])}
                          for _, r in kinds.iterrows()]
    out["kernel_names"] = [
        {"rank": int(r["rank"]), "kernel_type": r["kernel_type"], "name": r["name"], "sum": float(r["sum (us)"]),
         "max": float(r["max (us)"]), "min": float(r["min (us)"]), "mean": float(r["mean (us)"])}
        for _, r in names.iterrows()
    ]


def _idle_time(analysis, ranks, scale, out):  # noqa: ANN001, ANN202
    idle, _ = analysis.get_idle_time_breakdown(ranks=ranks, visualize=False,
                                               consecutive_kernel_delay=CONSECUTIVE_KERNEL_DELAY_US * scale)
    out["idle_time"] = [{"rank": int(r["rank"]), "stream": int(r["stream"]), "idle_category": r["idle_category"],
                         "idle_time": float(r["idle_time"])} for _, r in idle.iterrows()]


def _launch_stats(analysis, ranks, scale, out):  # noqa: ANN001, ANN202
    launch = analysis.get_cuda_kernel_launch_stats(ranks=ranks, visualize=False)
    out["launch_stats"] = []
    for rank, df in sorted(launch.items()):
        out["launch_stats"].append({
            "rank": int(rank), "events": len(df),
            "cpu_duration": float(df["cpu_duration"].sum()), "gpu_duration": float(df["gpu_duration"].sum()),
            "launch_delay": float(df["launch_delay"].sum()),
            "cpu_duration_median": _num(df["cpu_duration"].median()),
            "launch_delay_median": _num(df["launch_delay"].median()),
            "runtime_outliers": int((df["cpu_duration"] > RUNTIME_CUTOFF_US * scale).sum()),
            "launch_delay_outliers": int((df["launch_delay"] > LAUNCH_DELAY_CUTOFF_US * scale).sum()),
            "gpu_shorter_than_cpu": int((df["gpu_duration"] < df["cpu_duration"]).sum()),
        })


def _num(value: object) -> float | None:
    v = float(value)  # type: ignore[arg-type]
    return None if math.isnan(v) else v


#: Kernel names whose HTA type is recorded (``kernel_types.json``): NCCL's two naming schemes,
#: other communication libraries, Kineto's copy/memset names, and the odd cases of HTA's patterns.
SAMPLE_NAMES = (
    "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
    "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 2>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, __nv_bfloat16*, int, int)",
    "void nvshmemi_transfer_rma_nbi_kernel(void*)",
    "rcclKernel_AllReduce",
    "Memcpy DtoD (Device -> Device)",
    "Memcpy HtoD (Pinned -> Device)",
    "Memset (Device)",
    "Stream Sync",
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>(Params)",
    "triton_poi_fused_add_cudaMemcpy_0",
    "void kernelSyncBlocks<float>(float*)",
    "dma_copy",
)


def reference(dirs: list[Path], out_dir: Path) -> None:
    import importlib.metadata

    from hta.utils.utils import get_kernel_type

    version = importlib.metadata.version("HolisticTraceAnalysis")
    out_dir.mkdir(parents=True, exist_ok=True)
    kinds = {"hta_version": version, "kernel_type": {n: get_kernel_type(n) for n in SAMPLE_NAMES}}
    (out_dir / "kernel_types.json").write_text(json.dumps(kinds, indent=1) + "\n")
    for trace_dir in dirs:
        result: dict = {
            "trace": trace_dir.name,
            "files": sorted(p.name for p in trace_dir.iterdir() if p.is_file()),
            "hta_version": version,
            "command": f"python benchmarks/hta_parity.py reference {trace_dir.name}/ --out {out_dir.name}/",
            "units": {"us": "microseconds (HTA as shipped: times rounded to whole µs)",
                      "ns": "nanoseconds (HTA's code on exact times, HTA_DISABLE_NS_ROUNDING=1, ts/dur × 1000)"},
        }
        os.environ.pop("HTA_DISABLE_NS_ROUNDING", None)
        result["us"] = _hta_views(trace_dir, 1)
        os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"
        result["ns"] = _hta_views(trace_dir, 1000)
        os.environ.pop("HTA_DISABLE_NS_ROUNDING", None)
        path = out_dir / f"{trace_dir.name}.json"
        path.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {path}", file=sys.stderr)


# ---------------------------------------------------------------- tracekit's side
def trace_files(trace_dir: Path) -> list[Path]:
    return sorted(p for p in trace_dir.iterdir() if p.name.endswith((".json", ".json.gz")))


def tracekit_views(traces: list) -> dict:
    """tracekit's views of one trace per rank, shaped like :func:`_hta_views` (ns)."""
    import polars as pl

    import tracekit

    views = tracekit.hta(traces if len(traces) > 1 else traces[0])
    rank = (lambda f: f["rank"]) if len(traces) > 1 else (lambda f: pl.Series([0] * f.height))  # noqa: E731
    out: dict = {}
    t = views.temporal_breakdown()
    out["temporal"] = [{"rank": r, "idle_time": a, "compute_time": b, "non_compute_time": c, "kernel_time": d}
                       for r, a, b, c, d in zip(rank(t), t["idle_time_ns"], t["compute_time_ns"], t["non_compute_time_ns"],
                                                t["kernel_time_ns"], strict=True)]
    o = views.comm_comp_overlap()
    out["comm_comp_overlap"] = [{"rank": r, "pctg": None if s is None else 100 * s} for r, s in zip(rank(o), o["overlap_share"], strict=True)]
    k = views.kernel_type_breakdown().group_by("kernel_type").agg(pl.col("time_ns").sum().alias("sum"))
    k = k.with_columns((100 * pl.col("sum") / pl.col("sum").sum()).alias("percentage")).sort("sum", descending=True)
    out["kernel_type"] = k.to_dicts()
    n = views.kernel_breakdown()
    out["kernel_names"] = [{"rank": r, "kernel_type": kt, "name": nm, "sum": sm} for r, kt, nm, sm in
                           zip(rank(n), n["kernel_type"], n["name"], n["sum_ns"], strict=True)]
    i = views.idle_time_breakdown()
    out["idle_time"] = [{"rank": r, "stream": s, "idle_category": c, "idle_time": v} for r, s, c, v in
                        zip(rank(i), i["stream_id"], i["idle_category"], i["idle_time_ns"], strict=True)]
    launches = views.kernel_launch_stats()
    out["launch_stats"] = []
    for r in sorted(set(rank(launches).to_list())) if launches.height else []:
        df = launches.filter(rank(launches) == r)
        out["launch_stats"].append({
            "rank": r, "events": df.height, "cpu_duration": df["cpu_duration_ns"].sum(), "gpu_duration": df["gpu_duration_ns"].sum(),
            "launch_delay": df["launch_delay_ns"].sum(), "cpu_duration_median": df["cpu_duration_ns"].median(),
            "launch_delay_median": df["launch_delay_ns"].median(),
            "runtime_outliers": int((df["cpu_duration_ns"] > RUNTIME_CUTOFF_US * 1000).sum()),
            "launch_delay_outliers": int((df["launch_delay_ns"] > LAUNCH_DELAY_CUTOFF_US * 1000).sum()),
            "gpu_shorter_than_cpu": int((df["gpu_duration_ns"] < df["cpu_duration_ns"]).sum()),
        })
    return out


#: Fields compared per view, with the keys that identify a row.
VIEWS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "temporal": (("rank",), ("idle_time", "compute_time", "non_compute_time", "kernel_time")),
    "idle_time": (("rank", "stream", "idle_category"), ("idle_time",)),
    "kernel_type": (("kernel_type",), ("sum",)),
    "comm_comp_overlap": (("rank",), ("pctg",)),
    "launch_stats": (("rank",), ("events", "cpu_duration", "gpu_duration", "launch_delay", "runtime_outliers",
                                 "launch_delay_outliers", "gpu_shorter_than_cpu")),
}


def _rel(ours: float | None, theirs: float | None, floor: float) -> float:
    """Relative difference; values within ``floor`` of each other (HTA's own rounding of the
    number it prints) count as equal."""
    if ours is None or theirs is None:
        return 0.0 if ours is None and theirs is None else math.inf
    diff = abs(ours - theirs)
    if diff <= floor:
        return 0.0
    return diff / max(abs(theirs), 1e-12)


def compare_views(ours: dict, theirs: dict, *, scale: float = 1.0) -> dict[str, float]:
    """Largest relative difference per view between tracekit's views (ns, × ``scale``) and a
    reference; ``inf`` where a row is missing on one side, ``nan`` where HTA failed."""
    result: dict[str, float] = {}
    for view, (keys, fields) in VIEWS.items():
        ref = theirs.get(view)
        if isinstance(ref, dict):  # HTA raised
            result[view] = math.nan
            continue
        mine = {tuple(r[k] for k in keys): r for r in ours[view]}
        worst = 0.0
        # idle rows of 0 (a stream's first event) exist on one side only when the other has none
        ref_rows = {tuple(r[k] for k in keys): r for r in ref}
        for key in set(mine) | set(ref_rows):
            a, b = mine.get(key), ref_rows.get(key)
            if a is None or b is None:
                if all((r or {}).get(f) in (0, 0.0, None) for r in (a, b) for f in fields):
                    continue
                worst = math.inf
                continue
            for f in fields:
                floor = 0.005 if view == "comm_comp_overlap" else 0.0  # HTA prints the share rounded to 0.01 %
                value = a[f]
                if value is not None and f not in ("events", "runtime_outliers", "launch_delay_outliers", "gpu_shorter_than_cpu", "pctg"):
                    value = value * scale
                worst = max(worst, _rel(value, b[f], floor))
        result[view] = worst
    mine_names = {(r["rank"], r["kernel_type"], r["name"]): r["sum"] for r in ours["kernel_names"]}
    if not isinstance(theirs.get("kernel_names"), list):
        result["kernel_names"] = math.nan
        return result
    worst = 0.0
    for row in theirs["kernel_names"]:
        if row["name"] == "others":
            continue
        got = mine_names.get((row["rank"], row["kernel_type"], row["name"]))
        worst = max(worst, _rel(None if got is None else got * scale, row["sum"], 0.0))
    result["kernel_names"] = worst
    return result


def compare(dirs: list[Path], ref_dir: Path, hta_python: str | None) -> None:
    import tracekit

    print("| trace | HTA times | " + " | ".join([*VIEWS, "kernel_names"]) + " |")
    print("| --- | --- |" + " --- |" * (len(VIEWS) + 1))
    for trace_dir in dirs:
        ref_path = ref_dir / f"{trace_dir.name}.json"
        if not ref_path.exists():
            if hta_python is None:
                print(f"{trace_dir.name}: no reference and no --hta-python", file=sys.stderr)
                continue
            subprocess.run([hta_python, __file__, "reference", str(trace_dir), "--out", str(ref_dir)], check=True)
        ref = json.loads(ref_path.read_text())
        ours = tracekit_views([tracekit.open(p) for p in trace_files(trace_dir)])
        for units, scale in (("ns", 1.0), ("us", 1e-3)):
            diffs = compare_views(ours, ref[units], scale=scale)
            cells = [f"{100 * diffs[v]:.3g} %" if math.isfinite(diffs[v]) else ("HTA failed" if math.isnan(diffs[v]) else "rows differ")
                     for v in [*VIEWS, "kernel_names"]]
            print(f"| {trace_dir.name} | {units} | " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("reference", help="HTA's views (run in HTA's environment)")
    r.add_argument("dirs", nargs="+", type=Path)
    r.add_argument("--out", type=Path, default=REF)
    c = sub.add_parser("compare", help="tracekit against the references")
    c.add_argument("dirs", nargs="*", type=Path)
    c.add_argument("--ref", type=Path, default=REF)
    c.add_argument("--hta-python", default=None, help="python of an environment with HolisticTraceAnalysis")
    args = parser.parse_args()
    if args.cmd == "reference":
        reference(args.dirs, args.out)
    else:
        compare(args.dirs, args.ref, args.hta_python)


if __name__ == "__main__":
    main()
