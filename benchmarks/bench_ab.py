"""Two tracekit checkouts, run by turns on the same exports: before/after without drift.

``bench_scale.py --source`` measures one checkout after the other; on a shared machine whose
speed drifts by 20-30 % over ten minutes, the second set then looks faster or slower for
reasons of its own. Here every run of checkout A is followed at once by the same run of
checkout B (each with a column cache of its own, so *cold* and *warm* mean the same for
both), and the table gives both medians side by side, with peak RSS (``ru_maxrss``, MiB):

    git worktree add /tmp/before <commit>
    python benchmarks/bench_ab.py benchmarks/out/h1x.sqlite benchmarks/out/s1x.sqlite \\
        --before /tmp/before --commands summary,stats,diagnose --rounds 3 --name ab_1x

The commands are bench_scale.py's (``summary``, ``stats``, ``stats-default``, ``diagnose``,
``report``, ``perfetto``…). Each run's output is kept and compared between the two checkouts
(``same output`` column: byte-identical stdout or written file).
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scale import COMMANDS  # noqa: E402
from common import (  # noqa: E402
    OUT,
    drop_kept_reports,
    markdown_table,
    print_table,
    python,
    run_measured,
    warm_page_cache,
    write_results,
)

HERE = Path(__file__).resolve().parents[1]


def _outputs_equal(a: Path, b: Path, a_stem: Path, b_stem: Path) -> bool:
    """stdout equal, and every file a run wrote next to its stem equal too."""
    if not filecmp.cmp(a, b, shallow=False):
        return False
    for f in a_stem.parent.glob(a_stem.name + "*"):
        other = b_stem.parent / (b_stem.name + f.name[len(a_stem.name):])
        if f != a and (not other.exists() or not filecmp.cmp(f, other, shallow=False)):
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--before", type=Path, required=True, help="checkout A (e.g. a git worktree)")
    parser.add_argument("--after", type=Path, default=HERE, help="checkout B (default: this one)")
    parser.add_argument("--commands", default="summary,stats,diagnose")
    parser.add_argument("--variants", default="cold,warm")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--name", default="ab")
    args = parser.parse_args(argv)
    commands = [c for c in args.commands.split(",") if c]
    unknown = [c for c in commands if c not in COMMANDS or c == "diff"]
    if unknown:
        parser.error(f"unknown command(s) {unknown}; choose from {sorted(set(COMMANDS) - {'diff'})}")
    variants = [v for v in args.variants.split(",") if v]
    sides = {"before": args.before.resolve(), "after": args.after.resolve()}
    exe = [python(), "-m", "tracekit.cli.entry"]
    OUT.mkdir(parents=True, exist_ok=True)
    rows: list[list[str]] = []
    results: list[dict[str, object]] = []
    for path in (p.resolve() for p in args.files):
        warm_page_cache(path)
        for cmd in commands:
            runs: dict[tuple[str, str], list] = {(s, v): [] for s in sides for v in variants}
            same = True
            for rnd in range(args.rounds):
                for variant in variants:
                    stems = {}
                    # alternate which side goes first, so neither always follows the other
                    order = list(sides) if rnd % 2 == 0 else list(sides)[::-1]
                    for side in order:
                        source = sides[side]
                        cache = OUT / f"ab_cache_{path.stem}_{side}"
                        if variant == "cold":
                            shutil.rmtree(cache, ignore_errors=True)
                        else:
                            drop_kept_reports(cache)
                        stem = OUT / f"ab_{path.stem}_{cmd}_{variant}_{side}"
                        stems[side] = stem
                        made = [a.format(out=stem) for a in COMMANDS[cmd]]
                        env = {**os.environ, "TRACEKIT_CACHE": str(cache), "PYTHONPATH": str(source)}
                        m = run_measured([*exe, *made, str(path)], stdout_path=stem.with_suffix(".out"), env=env, cwd=source)
                        runs[(side, variant)].append(m)
                        print(f"  {path.name} {cmd:8s} {variant:4s} {side:6s} {m.wall_s:6.2f} s  CPU {m.cpu_s:6.2f} s"
                              f"  {m.peak_rss_mb:5.0f} MiB  exit {m.returncode}", flush=True)
                        results.append({"file": str(path), "command": cmd, "variant": variant, "side": side,
                                        "checkout": str(source), "wall_s": m.wall_s, "cpu_s": m.cpu_s,
                                        "peak_rss_mib": m.peak_rss_mb, "returncode": m.returncode,
                                        "others_cores": m.others_cores, "stderr_tail": m.stderr[-1000:]})
                    b, a = stems["before"], stems["after"]
                    same &= _outputs_equal(b.with_suffix(".out"), a.with_suffix(".out"), b, a)
            for variant in variants:
                row = [path.name, cmd, variant]
                for side in sides:
                    ms = runs[(side, variant)]
                    ok = all(m.returncode == 0 for m in ms)
                    row += [f"{statistics.median(m.wall_s for m in ms):.2f}" + ("" if ok else " (failed)"),
                            f"{statistics.median(m.cpu_s for m in ms):.2f}",
                            f"{min(m.peak_rss_mb for m in ms):,.0f}–{max(m.peak_rss_mb for m in ms):,.0f}"]
                row.append("yes" if same else "NO")
                rows.append(row)
    header = ["export", "command", "run", "before wall s", "before CPU s", "before MiB",
              "after wall s", "after CPU s", "after MiB", "same output"]
    title = f"before {sides['before']} / after {sides['after']}, by turns, median of {args.rounds}"
    print_table(title, header, rows)
    payload = {"title": title, "header": header, "rows": rows, "results": results,
               "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    write_results(args.name, payload, f"### {title}\n\n" + markdown_table(header, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
