"""tracekit.diff / tracekit diff on real captures and mutated copies of them (made here)."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit.analysis.compare import compare_per_step

from .conftest import CORPUS, SAMPLES

CLEAN = SAMPLES / "planted" / "planted_clean" / "planted_clean.sqlite"
LN = "vectorized_layer_norm_kernel"


def _scaled(tmp_path: Path, factor: float, like: str = "%") -> Path:
    """A copy whose kernels with a short name LIKE ``like`` last ``factor`` times as long
    (start kept, end moved)."""
    copy = tmp_path / f"scaled_{factor}.sqlite"
    shutil.copyfile(CLEAN, copy)
    con = sqlite3.connect(copy)
    con.execute(
        "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = start + CAST((end - start) * ? AS INTEGER) "
        "WHERE shortName IN (SELECT id FROM StringIds WHERE value LIKE ?)", (factor, like),
    )
    con.commit()
    con.close()
    return copy


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracekit.cli.main", "diff", *args], capture_output=True, text=True, timeout=300)


def test_a_run_against_itself_is_no_change() -> None:
    d = tracekit.diff(CLEAN, CLEAN)
    for level, frame in d.levels.items():
        assert frame.height > 0, level
        assert set(frame["verdict"]) == {"no change"}, level
        assert (frame["delta"] == 0).all()
    assert d.regressions().height == 0
    assert _cli(str(CLEAN), str(CLEAN)).returncode == 0


def test_one_kernel_slower_is_flagged_alone(tmp_path: Path) -> None:
    slow = _scaled(tmp_path, 1.5, LN)
    d = tracekit.diff(CLEAN, slow)
    k = d.levels["kernel"]
    row = k.filter(pl.col("key") == LN).row(0, named=True)
    assert row["verdict"] == "slower" and row["delta_pct"] == pytest.approx(0.5, abs=0.01)
    assert set(k.filter(pl.col("key") != LN)["verdict"]) == {"no change"}
    assert d.levels["family"].filter(pl.col("key") == "normalization")["verdict"][0] == "slower"
    r = _cli(str(CLEAN), str(slow), "--threshold", "5", "--format", "json")
    assert r.returncode == 1
    payload = json.loads(r.stdout)
    assert {x["key"] for x in payload["regressions"] if x["level"] == "kernel"} == {LN}
    assert _cli(str(CLEAN), str(slow), "--threshold", "60").returncode == 0  # 50 % is below a 60 % bar


def test_everything_faster(tmp_path: Path) -> None:
    fast = _scaled(tmp_path, 0.5)
    d = tracekit.diff(CLEAN, fast)
    gpu = d.levels["step"].filter(pl.col("key") == "gpu_time").row(0, named=True)
    assert gpu["verdict"] == "faster" and gpu["delta_pct"] < -0.3
    assert d.regressions().height == 0


def test_per_step_numbers_by_hand() -> None:
    """The mean per-step GPU time of the layer-norm kernel: its launches inside the steady
    NVTX steps (step.1 … step.19; step.0 is warm-up), summed per step with SQL."""
    d = tracekit.diff(CLEAN, CLEAN, levels=("kernel",))
    row = d.levels["kernel"].filter(pl.col("key") == LN).row(0, named=True)
    con = sqlite3.connect(f"file:{CLEAN}?mode=ro", uri=True)
    per_step = con.execute(
        "SELECT n.text, sum(k.end - k.start) FROM NVTX_EVENTS n JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
        "ON r.start >= n.start AND r.start <= n.end AND r.globalTid = n.globalTid "
        "JOIN CUPTI_ACTIVITY_KIND_KERNEL k ON k.correlationId = r.correlationId "
        "JOIN StringIds s ON s.id = k.shortName "
        "WHERE n.text LIKE 'step.%' AND n.text != 'step.0' AND s.value = ? GROUP BY n.text", (LN,),
    ).fetchall()
    con.close()
    assert len(per_step) == row["steps_a"] == 19
    assert row["mean_a"] == pytest.approx(sum(v for _, v in per_step) / 19)
    assert row["total_a"] == sum(v for _, v in per_step)


def test_no_steps_uses_the_fixed_threshold() -> None:
    path = CORPUS / "nsys" / "nsys2023.1_memfusion_tensorrt.sqlite"
    d = tracekit.diff(path, path)
    assert set(d.levels["kernel"]["noise_basis"]) == {"fixed"} and d.steps == {"before": 1, "after": 1}


def test_statistic_on_known_numbers() -> None:
    """Welch: a 10 % shift with tiny noise is slower; the same shift drowned in noise is not."""
    steps = list(range(10))
    a = pl.DataFrame({"step": steps, "key": ["x"] * 10, "value": [100] * 10})
    b = pl.DataFrame({"step": steps, "key": ["x"] * 10, "value": [110] * 10})
    assert compare_per_step(a, b, steps, steps)["verdict"][0] == "slower"
    noisy = pl.DataFrame({"step": steps, "key": ["x"] * 10, "value": [60, 160] * 5})
    assert compare_per_step(a, noisy, steps, steps)["verdict"][0] == "no change"
    small = pl.DataFrame({"step": steps, "key": ["x"] * 10, "value": [101] * 10})  # 1 % < min_effect
    assert compare_per_step(a, small, steps, steps)["verdict"][0] == "no change"


def test_bad_level_is_one_line() -> None:
    r = _cli(str(CLEAN), str(CLEAN), "--by", "nope")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "unknown level" in r.stderr
