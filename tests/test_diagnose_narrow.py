"""The narrow paths of ``diagnose`` and ``summary`` (issue 14 §1) against the whole-table ones.

``Context.launched_ops`` joins launch columns only for the operations launched in some CPU
ranges and ``Context.ops_with_launch_w`` only for the window's operations; the summary's kernel
figures come from name ids. Each must give what the whole-table computation gives, checked
here on real exports with sampling forced on (tiny thresholds) so that the sampled code runs.
The expected rows are picked by plain Python over the whole join, not by the code under test.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit.analysis.run.iterations import iteration_ranges
from tracekit.diagnosis import DiagnoseConfig
from tracekit.diagnosis.context import Context
from tracekit.diagnosis.window import steady_window
from tracekit.nsys import summary as S

from .conftest import NSYS_CORPUS, SAMPLES

SAMPLED = DiagnoseConfig(exact_steps=3, sample_steps=2, max_window_ops=50)
NVTX_STEPS = [
    SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite",
    SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite",
    SAMPLES / "planted" / "planted_launch_bound" / "planted_launch_bound.sqlite",
]
ALL = sorted(SAMPLES.rglob("*.sqlite")) + sorted(NSYS_CORPUS.glob("*.sqlite"))


def _rows(frame: pl.DataFrame) -> list[tuple]:  # type: ignore[type-arg]
    return sorted(frame.rows(), key=repr)


@pytest.mark.parametrize("path", NVTX_STEPS, ids=lambda p: p.stem)
def test_launched_ops_holds_every_op_launched_in_the_ranges_with_the_same_call(path: Path) -> None:
    whole = Context(tracekit.open(path), SAMPLED).ops_with_launch
    ranges = iteration_ranges(tracekit.open(path).nvtx).slice(2, 5)
    spans = list(zip(ranges["start_ns"].to_list(), ranges["end_ns"].to_list(), strict=True))
    inside = [
        i for i, s in enumerate(whole["api_start_ns"].to_list())
        if s is not None and any(a <= s <= b for a, b in spans if a is not None and b is not None)
    ]
    assert inside, "the ranges launch operations"
    part = Context(tracekit.open(path), SAMPLED).launched_ops(ranges)
    assert part.columns == whole.columns
    assert part.height < whole.height  # not the whole join
    # every operation launched in a range is there, with the same launch columns
    in_part = set(part.rows())
    assert all(row in in_part for row in whole[inside].rows())
    # and whatever else it holds is a row of the whole join too
    assert in_part <= set(whole.rows())


@pytest.mark.parametrize("path", NVTX_STEPS, ids=lambda p: p.stem)
def test_window_and_its_launch_columns_equal_the_whole_join(path: Path) -> None:
    ref = Context(tracekit.open(path), SAMPLED)
    w_ref = steady_window(ref.ops, ref.ops_with_launch, ref.nvtx, SAMPLED)
    ctx = Context(tracekit.open(path), SAMPLED)
    w = steady_window(ctx.ops, ctx.launched_ops, ctx.nvtx, SAMPLED)
    assert w.sampled and "ops_with_launch" not in ctx.__dict__  # the narrow path ran
    assert (w.start_ns, w.end_ns, w.sample_start_ns, w.sample_end_ns, w.steps) == (
        w_ref.start_ns, w_ref.end_ns, w_ref.sample_start_ns, w_ref.sample_end_ns, w_ref.steps)
    assert w.iterations.equals(w_ref.iterations)
    for c in (ref, ctx):
        c.full_window, c.window = w, w.analysed()
    got = ctx.ops_with_launch_w
    assert "ops_with_launch" not in ctx.__dict__
    expected = ref._in_window(ref.ops_with_launch)
    assert got.height > 0 and got.equals(expected)


@pytest.mark.filterwarnings("ignore::tracekit.nsys.trace.IncompleteTraceWarning")  # corpus exports without CUDA tables
@pytest.mark.parametrize("path", ALL, ids=lambda p: p.stem)
def test_summary_kernel_figures_from_name_ids_equal_the_name_frame(path: Path) -> None:
    by_id = S._kernel_figures_by_id(tracekit.open(path), 10)
    by_name = S._kernel_figures(tracekit.open(path), 10)
    assert by_id[:3] == by_name[:3]
    assert by_id[3].schema == by_name[3].schema
    assert _rows(by_id[3]) == _rows(by_name[3])
    assert by_id[3].equals(by_name[3])  # same order too


def test_summary_groups_numbered_nvtx_siblings() -> None:
    """Issue 27 §3: step.0 … step.7 are one row `step.*` (count 8, total = the sum of the
    eight ranges by SQL); `--nvtx-each` lists them one by one; HF module paths group by layer
    (`model.layers.*.mlp`)."""
    import sqlite3
    import subprocess
    import sys

    from .conftest import llm_capture

    path = SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
    nvtx = tracekit.open(path).table("nvtx", ["event_type_id", "end_ns", "duration_ns", "name", "domain"])
    grouped = S.top_nvtx(nvtx, 50).rows_by_key("range", named=True, unique=True)
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    (n, total) = con.execute("SELECT COUNT(*), SUM(end - start) FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
                             "WHERE COALESCE(e.text, s.value) LIKE 'step.%' AND e.end IS NOT NULL").fetchone()
    con.close()
    assert grouped["step.*"]["count"] == n == 8 and grouped["step.*"]["names"] == 8
    assert grouped["step.*"]["total_ms"] == pytest.approx(total / 1e6)
    assert "attn" in grouped and grouped["attn"]["names"] == 1  # an unnumbered name stays as is
    each = S.top_nvtx(nvtx, 50, group_numbered=False)["range"].to_list()
    assert {f"step.{i}" for i in range(8)} <= set(each) and "step.*" not in each
    hf = tracekit.open(llm_capture("hf_generate_eager"))
    rows = S.top_nvtx(hf.table("nvtx", ["event_type_id", "end_ns", "duration_ns", "name", "domain"]), 50)
    mlp = rows.filter(pl.col("range") == "model.layers.*.mlp").row(0, named=True)
    assert mlp["names"] == 28 and mlp["count"] == 28 * 24
    out = subprocess.run([sys.executable, "-m", "tracekit.cli.main", "summary", str(path), "--findings", "0", "--nvtx-each",
                          "-n", "20"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "step.3" in out.stdout and "step.*" not in out.stdout
