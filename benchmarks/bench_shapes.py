"""Issue 44 §4: memory and first open on a grid of export *shapes*, before and after, in one run.

Each shape is a synthetic export built by ``make_shape_trace.py`` (kernels, CUDA API rows per
kernel, NVTX ranges per kernel, distinct kernel names). Per shape, measured here in this order:

1. ``summary``, ``stats`` (``cuda_gpu_kern_sum,nvtx_gpu_proj_sum,cuda_kern_exec_sum``) and
   ``diagnose``, cold (column cache emptied) and warm, by ``bench_scale.py`` — once on the
   *before* tree (``--before``: a copy of another commit's ``tracekit/``) and once on this
   tree, one after the other: peak RSS (``ru_maxrss``) against the target
   ``0.4 × export MB + 200`` MiB;
2. first open of kernels + CUDA API + NVTX with the column cache filled on the way, against a
   raw ADBC ``fetch_arrow_table`` of the same SELECTs (and connectorx's, when installed), by
   ``bench_load.py`` (1 round): target ≤ 1.3× by wall;
3. ``cuda_kern_exec_sum`` cold (empty cache, whole process) against ``nsys stats`` of the same
   report (nsys 2023.4.4, see README.md "nsys without a GPU"), :data:`KEXEC_ROUNDS` runs of
   each in turn, medians: target nsys ÷ tracekit ≥ 3.5×.

Results: ``out/bench_shapes.json`` and ``out/bench_shapes.md`` (the table README.md quotes).

    git -C . archive BASE tracekit | tar -x -C /tmp/base   # the "before" tree
    python benchmarks/bench_shapes.py --before /tmp/base [--shapes k200_a1_v0_n1k,...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    OUT,
    REPO,
    find_nsys,
    markdown_table,
    precompile_tracekit,
    print_table,
    python,
    run_measured,
    write_results,
)

#: name → (kernels, CUDA API rows per kernel, NVTX ranges per kernel, distinct kernel names)
SHAPES: dict[str, tuple[int, float, float, int]] = {
    "k200_a1_v0_n1k": (200_000, 1.0, 0.0, 1_000),
    "k200_a6_v1_n100k": (200_000, 6.0, 1.0, 100_000),
    "k1m_a4.5_v0.42_n10k": (1_000_000, 4.5, 0.42, 10_000),  # the held-out decode export's ratios
    "k1m_a1_v1_n100k": (1_000_000, 1.0, 1.0, 100_000),
    "k2m_a1_v0_n1k": (2_000_000, 1.0, 0.0, 1_000),
    "k2m_a6_v1_n100k": (2_000_000, 6.0, 1.0, 100_000),
}
COMMANDS = "summary,stats,diagnose"


def target_mib(size_bytes: int) -> float:
    """Issue 44's memory target: 0.4 × the export's size in MB, plus 200 (MiB)."""
    return 0.4 * size_bytes / 1e6 + 200


def build(name: str, *, reuse: bool = False) -> Path:
    """The shape's export under ``out/shapes`` (written by ``make_shape_trace.py``; with
    ``reuse``, one already there is kept: the generator is seeded, so it is the same file)."""
    kernels, api, nvtx, names = SHAPES[name]
    out = OUT / "shapes" / f"{name}.sqlite"
    if reuse and out.exists():
        return out
    subprocess.run([python(), str(REPO / "benchmarks" / "make_shape_trace.py"), "--kernels", str(kernels), "--api", str(api),
                    "--nvtx", str(nvtx), "--names", str(names), "-o", str(out)], check=True)
    return out


def scale(path: Path, source: Path, label: str) -> list[dict]:
    name = f"shapes_scale_{path.stem}_{label}"
    subprocess.run([python(), str(REPO / "benchmarks" / "bench_scale.py"), str(path), "--commands", COMMANDS,
                    "--variants", "cold,warm", "--source", str(source), "--name", name], check=True)
    return list(json.loads((OUT / f"{name}.json").read_text())["results"])


def first_open(path: Path) -> dict:
    variants = "arrow,tracekit-fill" + (",connectorx" if _has("connectorx") else "")
    run = subprocess.run([python(), str(REPO / "benchmarks" / "bench_load.py"), "--file", str(path), "--variants", variants,
                          "--rounds", "1", "--idle-wait", "0"], check=False)
    if run.returncode != 0:
        return {"failed": f"bench_load.py exit {run.returncode}"}
    return dict(json.loads((OUT / f"bench_load_{path.stem}.json").read_text())["summary"])


def _has(module: str) -> bool:
    return subprocess.run([python(), "-c", f"import {module}"], capture_output=True, check=False).returncode == 0


#: Runs of each side of ``cuda_kern_exec_sum``, alternating; the table shows their medians.
KEXEC_ROUNDS = 3


def kern_exec(path: Path, rounds: int = KEXEC_ROUNDS) -> dict:
    """``cuda_kern_exec_sum`` cold: tracekit (empty column cache) and nsys, whole processes,
    ``rounds`` of each in turn (tracekit, nsys, tracekit, …): the median wall of each (one
    run of either varies by ±15 % on this machine)."""
    cache = OUT / f"shapes_kexec_cache_{path.stem}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRACEKIT_CACHE": str(cache)}
    nsys = find_nsys()
    tks, nss = [], []
    for _ in range(rounds):
        shutil.rmtree(cache, ignore_errors=True)
        tks.append(run_measured([python(), "-m", "tracekit.cli.entry", "stats", "-f", "csv", "--convention", "2023", "-r",
                                 "cuda_kern_exec_sum", str(path)], env=env, cwd=REPO))
        if nsys is not None:
            nss.append(run_measured([str(nsys), "stats", "-q", "-f", "csv", "-r", "cuda_kern_exec_sum", "--force-export=false",
                                     str(path)]))
    tk = tks[-1]
    tk_s = statistics.median(m.wall_s for m in tks)
    out = {"tracekit_s": tk_s, "tracekit_runs_s": [m.wall_s for m in tks], "tracekit_rss_mb": max(m.peak_rss_mb for m in tks),
           "tracekit_rc": max(m.returncode for m in tks)}
    if nsys is None:
        out["nsys"] = "no nsys on this machine"
        return out
    ns = nss[-1]
    ns_s = statistics.median(m.wall_s for m in nss)
    out.update(nsys_s=ns_s, nsys_runs_s=[m.wall_s for m in nss], nsys_rc=max(m.returncode for m in nss),
               ratio=ns_s / tk_s if tk_s else None,
               identical=tk.stdout.strip().splitlines() == ns.stdout.strip().splitlines(),
               # the same rows, ties of the report's order put either way (nsys's own order of ties)
               same_rows=sorted(tk.stdout.strip().splitlines()) == sorted(ns.stdout.strip().splitlines()))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="a folder holding the before commit's tracekit/")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated names of SHAPES")
    parser.add_argument("--skip", default="", help="parts to skip: scale,load,kexec")
    parser.add_argument("--name", default="bench_shapes", help="out/<name>.json and .md")
    parser.add_argument("--reuse", action="store_true", help="keep a shape's export already in out/shapes")
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    for tree in (args.before.resolve(), REPO):  # both as installed: no module compiled per run
        precompile_tracekit(tree)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    mem_rows, open_rows, kexec_rows, results = [], [], [], {}
    for name in filter(None, args.shapes.split(",")):
        path = build(name, reuse=args.reuse)
        size = path.stat().st_size
        goal = target_mib(size)
        rec: dict = {"file": str(path), "bytes": size, "target_mib": goal, "shape": SHAPES[name]}
        if "scale" not in skip:
            before = scale(path, args.before.resolve(), "before")
            after = scale(path, REPO, "after")
            rec["scale"] = {"before": before, "after": after}
            for cmd in COMMANDS.split(","):
                for variant in ("cold", "warm"):
                    b = next(r for r in before if r["command"] == cmd and r["variant"] == variant)
                    a = next(r for r in after if r["command"] == cmd and r["variant"] == variant)
                    mem_rows.append([name, f"{size / 1e6:,.0f}", cmd, variant, f"{b['peak_rss_mb']:,.0f}", f"{a['peak_rss_mb']:,.0f}",
                                     f"{goal:,.0f}", "met" if a["peak_rss_mb"] <= goal and a["returncode"] == 0 else "MISSED",
                                     f"{b['wall_s']:.1f}", f"{a['wall_s']:.1f}"])
        if "load" not in skip:
            s = first_open(path)
            rec["first_open"] = s
            if "failed" in s or "tracekit-fill" not in s or "arrow" not in s:
                open_rows.append([name, "—", "—", "—", s.get("failed", "a variant failed")])
                results[name] = rec
                continue
            base = "connectorx" if "connectorx" in s else "arrow"
            ratio = s["tracekit-fill"]["load_s"] / s[base]["load_s"]
            open_rows.append([name, f"{s[base]['load_s']:.2f} ({base})", f"{s['tracekit-fill']['load_s']:.2f}", f"{ratio:.2f}×",
                              "met" if ratio <= 1.3 else "MISSED"])
        if "kexec" not in skip:
            k = kern_exec(path)
            rec["kern_exec"] = k
            ratio = k.get("ratio")
            kexec_rows.append([name, f"{k['tracekit_s']:.2f}", f"{k.get('nsys_s', float('nan')):.2f}",
                               "—" if ratio is None else f"{ratio:.2f}×",
                               "identical" if k.get("identical") else ("same rows, ties ordered apart" if k.get("same_rows") else "NO"),
                               "—" if ratio is None else ("met" if ratio >= 3.5 else "MISSED")])
        results[name] = rec
    md = []
    if mem_rows:
        header = ["shape", "MB", "command", "run", "before MiB", "after MiB", "target MiB", "after", "before s", "after s"]
        print_table("peak RSS per shape (target 0.4 × MB + 200 MiB)", header, mem_rows)
        md.append(markdown_table(header, mem_rows))
    if open_rows:
        header = ["shape", "raw read s", "first open s", "ratio", "≤ 1.3×"]
        print_table("first open (cache filled) ÷ raw read of the same columns", header, open_rows)
        md.append(markdown_table(header, open_rows))
    if kexec_rows:
        header = ["shape", "tracekit cold s", "nsys stats s", "nsys ÷ tracekit", "CSV vs nsys", "≥ 3.5×"]
        print_table("cuda_kern_exec_sum cold", header, kexec_rows)
        md.append(markdown_table(header, kexec_rows))
    write_results(args.name, {"started": started, "before": str(args.before), "results": results}, "\n\n".join(md) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
