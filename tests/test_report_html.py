"""``tracekit report``: one self-contained HTML file with every section."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import SAMPLES

pytest.importorskip("altair", reason="needs the notebook extra")
pytest.importorskip("vl_convert", reason="needs vl-convert-python (notebook extra)")

from tracekit.cli.main import main  # noqa: E402

pytestmark = [pytest.mark.notebook]

TP2 = SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"
NCU = SAMPLES / "ncu" / "ncu_decode_drilldown" / "ncu_decode_drilldown.ncu-rep"
SECTIONS = ("findings", "overview", "kernels", "nvtx", "timeline", "communication", "metrics", "memory", "layer_memory")


def _need(*paths: Path) -> None:
    for p in paths:
        if not p.exists():
            pytest.skip(f"sample missing: {p}")


def _check_offline(page: str) -> None:
    assert "<script src" not in page.lower() and "<link" not in page.lower()
    for host in ("cdn.jsdelivr", "esm.sh", "unpkg.com", "cdnjs"):
        assert host not in page


def test_report_command_writes_one_offline_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("ncu_report", reason="needs the ncu extra")
    _need(TP2, NCU)
    out = tmp_path / "out" / "report.html"
    assert main(["report", str(TP2), "--ncu", str(NCU), "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    page = out.read_text()
    _check_offline(page)
    for anchor in (*SECTIONS, "ncu"):
        assert f'<section id="{anchor}">' in page
    assert "could not be built" not in page
    charts = re.findall(r'<div class="chart" id="(chart-\d+)">', page)
    assert len(charts) >= 9 and all(f'vegaEmbed("#{c}"' in page for c in charts)
    assert "ncclDevKernel_AllReduce_Sum_bf16_RING_LL" in page and "AllReduce" in page


def test_report_of_a_trace_without_gpu_metrics_or_nccl(tmp_path: Path) -> None:
    path = SAMPLES / "llm_train_emit_nvtx_1gpu" / "llm_train_emit_nvtx_1gpu.sqlite"
    _need(path)
    out = tmp_path / "train.html"
    assert main(["report", str(path), "-o", str(out), "--title", "training <step>"]) == 0
    page = out.read_text()
    assert "No GPU metrics" in page and "No communication kernels" in page
    assert "training &lt;step&gt;" in page and "could not be built" not in page
    # memory per layer: the one allocation inside a range is step 0's 16 MiB in backward (8 MiB mean)
    layer = page.split('<section id="layer_memory">', 1)[1].split("</section>", 1)[0]
    assert "Memory per layer" in layer and "layer.3" in layer and "8.0 MiB" in layer


def test_report_says_why_memory_per_layer_is_absent(tmp_path: Path) -> None:
    """A copy of the decode export without its NVTX rows: the section explains itself."""
    import shutil
    import sqlite3
    import warnings

    import tracekit
    from tracekit.report.html import build_report

    src = SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
    _need(src)
    copy = tmp_path / "no_nvtx.sqlite"
    shutil.copyfile(src, copy)
    con = sqlite3.connect(copy)
    con.execute("DELETE FROM NVTX_EVENTS")
    con.commit()
    con.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        page = build_report(tracekit.open(copy))
    layer = page.split('<section id="layer_memory">', 1)[1].split("</section>", 1)[0]
    assert "No NVTX ranges in this trace" in layer


def test_report_of_an_ncu_report_alone(tmp_path: Path) -> None:
    pytest.importorskip("ncu_report", reason="needs the ncu extra")
    _need(NCU)
    out = tmp_path / "ncu.html"
    assert main(["report", str(NCU), "-o", str(out)]) == 0
    page = out.read_text()
    assert '<section id="ncu">' in page and '<section id="overview">' not in page


def test_report_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path / "missing.sqlite"), "-o", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tracekit: error:") and err.count("\n") == 1


def test_report_opens_with_the_findings(tmp_path: Path) -> None:
    """The first section is tracekit.diagnose's findings, with the window it analysed."""
    path = SAMPLES / "planted" / "planted_host_bound" / "planted_host_bound.sqlite"
    _need(path)
    out = tmp_path / "host.html"
    assert main(["report", str(path), "-o", str(out)]) == 0
    page = out.read_text()
    first = re.search(r'<section id="([a-z]+)">', page)
    assert first is not None and first.group(1) == "findings"
    findings = page[page.index('<section id="findings">') : page.index('<section id="overview">')]
    assert "host_bound" in findings and "prepare_batch" in findings and "warm-up" in findings


def test_report_onto_a_folder_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """-o naming a folder was 'internal error: IsADirectoryError' after the whole report was
    built; now one error line before the trace is opened, and nothing is left in the folder."""
    _need(TP2)
    folder = tmp_path / "out.html"
    folder.mkdir()
    assert main(["report", str(TP2), "-o", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"tracekit: error: cannot write {folder}: it is a folder; name an HTML file"]
    assert list(folder.iterdir()) == []


def test_report_is_written_through_a_temporary_name(tmp_path: Path) -> None:
    """The page is written under a temporary name in the output's folder and renamed: the
    final name never holds a half-written file, and no temporary file is left behind."""
    _need(TP2)
    out = tmp_path / "report.html"
    out.write_text("old")
    before = out.stat().st_ino
    assert main(["report", str(TP2), "-o", str(out)]) == 0
    assert out.stat().st_ino != before  # a new file renamed over the old one, not rewritten in place
    assert out.read_text().lower().startswith("<!doctype html>")
    assert oct(out.stat().st_mode & 0o777) != "0o600"  # a normal file, not mkstemp's private mode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]


def test_report_refuses_max_marks_below_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--max-marks 0 or -5 wrote a report saying 'Lanes with more than -5 operations are shown
    as time bins'; now a usage error and no file."""
    _need(TP2)
    out = tmp_path / "m.html"
    assert main(["report", str(TP2), "--max-marks", "-5", "-o", str(out)]) == 2
    assert "--max-marks" in capsys.readouterr().err
    assert not out.exists()


def test_report_of_four_gpus_builds_every_section(tmp_path: Path) -> None:
    """On llm_tp2pp2_nccl (4 GPUs) the GPU metrics section said 'This section could not be
    built: MaxRowsError' (3 metrics x 4 GPUs x 600 points passed altair's 5,000 rows)."""
    path = SAMPLES / "llm_tp2pp2_nccl" / "llm_tp2pp2_nccl.sqlite"
    _need(path)
    out = tmp_path / "tp2pp2.html"
    assert main(["report", str(path), "-o", str(out)]) == 0
    page = out.read_text()
    assert "could not be built" not in page
    metrics = page[page.index('<section id="metrics">'):]
    assert '<div class="chart"' in metrics[: metrics.index("</section>")]


def test_two_ncu_reports_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`tracekit report A.ncu-rep --ncu B.ncu-rep` wrote a report of B alone, A dropped silently."""
    pytest.importorskip("ncu_report", reason="needs the ncu extra")
    other = SAMPLES / "ncu" / "ncu_precisions" / "ncu_precisions.ncu-rep"
    _need(NCU, other)
    out = tmp_path / "two.html"
    assert main(["report", str(other), "--ncu", str(NCU), "-o", str(out)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"tracekit: error: {other} and {NCU} are both Nsight Compute reports")
    assert not out.exists()
