"""Damaged ``.ncu-rep`` files (issue 18.6): bit-flipped COPIES of the repo's real reports.

Each flip below was found by ``benchmarks/ncu_flip_campaign.py``; what ``ncu_report`` does
with it on its own is checked first (in a child process: some of them abort it), then what
tracekit makes of it: one TraceFormatError line by default, a DamagedReportWarning and
``report.damaged`` with ``validate=False``, and never a dead Python process with
``isolate``. docs/ncu.md, "Damaged reports", has the campaign's numbers.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit.errors import TraceFormatError, TracekitError
from tracekit.ncu import DamagedReportWarning, NcuReport, container
from tracekit.ncu.damage import capture_fd2
from tracekit.ncu.isolated import IsolatedReport, isolate_mode

from .conftest import CORPUS

ROOT = Path(__file__).resolve().parents[1]
NCU = ROOT / "sample_traces" / "ncu"
PLANTED = NCU / "ncu_planted_clean" / "ncu_planted_clean.ncu-rep"  # 20 results x 785 metrics
PRECISIONS = NCU / "ncu_precisions" / "ncu_precisions.ncu-rep"  # 6 results x 785 metrics
REPORTS = sorted(NCU.glob("*/*.ncu-rep")) + sorted((CORPUS / "ncu").glob("*.ncu-rep"))

pytestmark = [
    pytest.mark.ncu,
    pytest.mark.skipif(importlib.util.find_spec("ncu_report") is None, reason="needs ncu-report"),
]

# What ncu_report alone reads: every result, metric, instance value; run in a child process.
PROBE = """
import json, sys, ncu_report
ctx = ncu_report.load_report(sys.argv[1])
out = {"results": 0, "metrics": 0, "instances": 0, "names": []}
for r in range(ctx.num_ranges()):
    rng = ctx.range_by_idx(r)
    for i in range(rng.num_actions()):
        act = rng.action_by_idx(i)
        out["results"] += 1
        out["names"].append(act.name(act.NameBase_FUNCTION))
        for name in act.metric_names():
            out["metrics"] += 1
            out["instances"] += act.metric_by_name(name).num_instances()
print(json.dumps(out))
"""


def flipped(tmp_path: Path, source: Path, offset: int, bit: int) -> Path:
    """A copy of ``source`` with one bit flipped (the source is only read)."""
    data = bytearray(source.read_bytes())
    data[offset] ^= 1 << bit
    path = tmp_path / f"{source.stem}_{offset}_{bit}.ncu-rep"
    path.write_bytes(bytes(data))
    return path


def probe(path: Path) -> tuple[int, dict[str, object] | None, str]:
    """``(returncode, counts or None, stderr)`` of ncu_report alone reading ``path``."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, check=False
    )
    counts = json.loads(proc.stdout) if proc.returncode == 0 else None
    return proc.returncode, counts, proc.stderr


def one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    message = str(exc.value)
    assert message and "\n" not in message
    return message


def result_length_offset(path: Path, index: int = 0) -> int:
    """Byte offset of result ``index``'s uint32 length prefix (4 bytes before its protobuf)."""
    return container.walk(path).shapes[index].offset - 4


# -- the container walk ---------------------------------------------------------------------


@pytest.mark.parametrize("path", REPORTS, ids=lambda p: p.name)
def test_walk_counts_what_ncu_report_reads(path: Path) -> None:
    """Per result, the walk's metric and instance counts equal ncu_report's on every sound
    report of the repo and the corpus, ncu 2023.3 to 2025.3 (the basis of the silent-loss
    checks)."""
    walked = container.walk(path)
    code, counts, _ = probe(path)
    assert code == 0 and counts is not None
    assert counts["results"] == walked.results == len(walked.shapes)
    assert counts["metrics"] == sum(s.metrics for s in walked.shapes)
    assert counts["instances"] == sum(s.instances for s in walked.shapes)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = NcuReport.from_path(path)
        assert report.damaged == ()
        per_result = report.metrics.group_by("id").agg(pl.len(), pl.col("num_instances").sum())
    assert sorted(per_result["len"].to_list()) == sorted(s.metrics for s in walked.shapes)
    assert per_result["num_instances"].sum() == counts["instances"]


def test_walk_names_the_byte_of_a_wire_type_flip(tmp_path: Path) -> None:
    """0x1a → 0x18 turns an instance entry into a varint field that ncu_report skips without
    a word (31,729 of 31,730 instance values); the walk refuses it and names the byte."""
    path = flipped(tmp_path, PRECISIONS, 580694, 1)
    code, counts, _ = probe(path)
    assert code == 0 and counts is not None and counts["instances"] == 31729
    with pytest.raises(TraceFormatError) as exc:
        NcuReport.from_path(path)
    message = one_line(exc)
    assert "metric field 3 with protobuf wire type 0 at byte 580694" in message
    assert "capture again" in message


def test_walk_catches_a_metric_renumbered_into_a_singular_field(tmp_path: Path) -> None:
    """0x6a → 0x7a renumbers one metric entry (field 13) as field 15: ncu_report silently reads
    784 of result 2's 785 metrics; field 15 then appears twice, which no report has."""
    path = flipped(tmp_path, PLANTED, 233551, 4)
    code, counts, _ = probe(path)
    assert code == 0 and counts is not None and counts["metrics"] == 15699
    with pytest.raises(TraceFormatError) as exc:
        tracekit.open(path)
    assert "result field 15 appears twice (bytes 233551 and 290066)" in one_line(exc)


# -- SIGABRT ---------------------------------------------------------------------------------


def test_result_length_flip_aborts_the_process_without_isolation(tmp_path: Path) -> None:
    """One flipped bit in a result's length prefix kills a Python process that reads the copy
    in process (SIGABRT from a failed protobuf check); tracekit's walk refuses it first, and
    with validate=False the child process turns the abort into one error line."""
    offset = result_length_offset(PRECISIONS) + 2
    path = flipped(tmp_path, PRECISIONS, offset, 4)
    code, _, stderr = probe(path)
    assert code == -signal.SIGABRT
    assert "Check failed" in stderr
    in_process = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from tracekit.ncu import NcuReport; "
            "NcuReport.from_path(sys.argv[1], validate=False, isolate=False).metrics",
            str(path),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert in_process.returncode == -signal.SIGABRT
    with pytest.raises(TraceFormatError) as exc:
        NcuReport.from_path(path)
    assert (
        f"the result at byte {offset + 2} says 1144236 bytes but its block holds 95660"
        in one_line(exc)
    )
    for isolate in ("auto", True):
        with pytest.raises(TraceFormatError) as exc:
            NcuReport.from_path(path, validate=False, isolate=isolate)
        message = one_line(exc)
        assert "ncu_report crashed (SIGABRT)" in message
        assert "Check failed: count >= 0" in message


def test_crash_through_tracekit_open_and_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = flipped(tmp_path, PRECISIONS, result_length_offset(PRECISIONS, 1) + 3, 0)
    monkeypatch.setenv("TRACEKIT_NCU_ISOLATE", "1")
    with pytest.raises(TraceFormatError) as exc:
        tracekit.open(path, validate=False)
    assert "crashed (SIGABRT)" in one_line(exc)


# -- silent losses ---------------------------------------------------------------------------


def test_dropped_result_is_refused(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A flip that breaks result 7's protobuf: ncu_report returns 20 results, one of them with
    no name and no metrics (14,915 of 15,700), and says so only on file descriptor 2."""
    path = flipped(tmp_path, PLANTED, 727574, 1)
    code, counts, stderr = probe(path)
    assert code == 0 and counts is not None
    assert (counts["results"], counts["metrics"]) == (20, 14915)
    assert counts["names"][7] is None  # type: ignore[index]
    assert "Can't parse message" in stderr
    capfd.readouterr()
    with pytest.raises(TraceFormatError) as exc:
        NcuReport.from_path(path)
    message = one_line(exc)
    assert "result 7 has no kernel name" in message and "capture again" in message
    assert "Can't parse" not in capfd.readouterr().err  # caught, not printed


def test_validate_false_warns_and_lists_the_damage(tmp_path: Path) -> None:
    path = flipped(tmp_path, PLANTED, 727574, 1)
    with pytest.warns(DamagedReportWarning, match="result 7 has no kernel name"):
        report = NcuReport.from_path(path, validate=False)
    assert report.kernels.height == 20
    assert report.kernels["short_name"].null_count() == 1
    assert (
        "result 7 has 0 of its 785 metrics (785 missing in all; record at byte 673351)"
        in report.damaged
    )
    assert any("Can't parse message" in p and "MetricResults[779]" in p for p in report.damaged)
    with pytest.warns(DamagedReportWarning, match="0 of its 2472 instance values"):
        metrics = report.metrics  # the instance check runs when metrics are read
    assert metrics.height == 14915
    intact = NcuReport.from_path(PLANTED)
    assert metrics.filter(pl.col("id") != 7).equals(intact.metrics.filter(pl.col("id") != 7))


def test_dropped_metric_name_is_refused(tmp_path: Path) -> None:
    """A flip in the metric-name table of the first block: one metric vanishes from every
    result (15,680 of 15,700) with no message at all."""
    path = flipped(tmp_path, PLANTED, 25974, 0)
    code, counts, stderr = probe(path)
    assert code == 0 and counts is not None and counts["metrics"] == 15680
    assert stderr == ""
    with pytest.raises(TraceFormatError) as exc:
        NcuReport.from_path(path)
    assert (
        "result 0 has 784 of its 785 metrics (20 missing in all; record at byte 41279)"
        in one_line(exc)
    )


def test_empty_context_is_refused(tmp_path: Path) -> None:
    """A flip in the device-attribute block: ncu_report reads 0 of the 6 results, silently."""
    path = flipped(tmp_path, PRECISIONS, 138172, 1)
    code, counts, _ = probe(path)
    assert code == 0 and counts is not None and counts["results"] == 0
    with pytest.raises(TraceFormatError) as exc:
        NcuReport.from_path(path)
    assert "ncu_report read 0 results but the file holds 6" in one_line(exc)


def test_metric_name_that_is_not_utf8(tmp_path: Path) -> None:
    """A flip in a metric name: ncu_report hands it over as lone surrogates and
    ``metric_by_name`` raises TypeError on it; tracekit refuses the report, or with
    validate=False reads the other metrics."""
    path = flipped(tmp_path, PRECISIONS, 25635, 7)
    code, _, stderr = probe(path)
    assert code == 1 and "TypeError" in stderr
    with pytest.raises(TraceFormatError) as exc:
        NcuReport.from_path(path)
    assert "result 0 has 1 metric name(s) that are not valid UTF-8" in one_line(exc)
    with pytest.warns(DamagedReportWarning):
        report = NcuReport.from_path(path, validate=False)
    assert report.metrics.height == 4710 - 6  # that name is unreadable in each of 6 results


# -- isolation -------------------------------------------------------------------------------


def test_isolated_tables_equal_in_process_tables() -> None:
    inside = NcuReport.from_path(PRECISIONS, isolate=False)
    child = NcuReport.from_path(PRECISIONS, isolate=True)
    assert isinstance(child._binary, IsolatedReport)
    assert child.kernels.equals(inside.kernels)
    assert child.metrics.equals(inside.metrics)
    assert child.rules.equals(inside.rules)
    wanted = ["sm__warps_active.avg.pct_of_peak_sustained_active", "launch__occupancy_limit_blocks"]
    assert child.instances_of(wanted).equals(inside.instances_of(wanted))
    assert repr(child) == repr(inside)


def test_isolate_mode_from_argument_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRACEKIT_NCU_ISOLATE", raising=False)
    assert isolate_mode(None) == "auto"
    assert (isolate_mode(True), isolate_mode(False), isolate_mode("auto")) == (
        "always",
        "never",
        "auto",
    )
    for value, mode in (("1", "always"), ("0", "never"), ("AUTO", "auto"), ("yes", "always")):
        monkeypatch.setenv("TRACEKIT_NCU_ISOLATE", value)
        assert isolate_mode(None) == mode
    monkeypatch.setenv("TRACEKIT_NCU_ISOLATE", "sometimes")
    with pytest.raises(TracekitError) as exc:
        NcuReport.from_path(PRECISIONS)
    assert "TRACEKIT_NCU_ISOLATE='sometimes'" in one_line(exc)
    monkeypatch.setenv("TRACEKIT_NCU_ISOLATE", "1")
    assert isinstance(NcuReport.from_path(PRECISIONS)._binary, IsolatedReport)


def test_open_passes_ncu_options_and_keeps_them_from_nsys(tmp_path: Path) -> None:
    path = flipped(tmp_path, PLANTED, 25974, 0)
    with pytest.warns(DamagedReportWarning):
        report = tracekit.open(path, validate=False, isolate=False)
    assert report.damaged
    trace = tracekit.open(
        ROOT / "sample_traces" / "planted" / "planted_clean" / "planted_clean.sqlite", isolate=True
    )
    assert type(trace).__name__ == "NsysTrace"


def test_capture_fd2_keeps_other_output(capfd: pytest.CaptureFixture[str]) -> None:
    sink: list[str] = []
    with capture_fd2(sink):
        os.write(2, b'E0000 00:00:1.0 1 message_lite.cc:195] Can\'t parse message of type "X"\n')
        os.write(2, b"a line of someone else\n")
    assert sink == ['E0000 00:00:1.0 1 message_lite.cc:195] Can\'t parse message of type "X"']
    assert capfd.readouterr().err == "a line of someone else\n"


def test_cli_prints_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from tracekit.cli.main import main

    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    damaged = flipped(tmp_path, PLANTED, 727574, 1)
    export = ROOT / "sample_traces" / "planted" / "planted_clean" / "planted_clean.sqlite"
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["diagnose", str(export), "--ncu", str(damaged)])
    lines = err.getvalue().strip().splitlines()
    assert code == 2
    assert len(lines) == 1 and lines[0].startswith("tracekit: error:") and "is damaged" in lines[0]


# -- what stays undetectable -----------------------------------------------------------------


def test_a_flipped_metric_value_is_not_detected(tmp_path: Path) -> None:
    """A bit flipped inside a stored number changes the value and nothing else: no count,
    length or wire type moves, so the report loads as sound (documented limitation)."""
    intact = NcuReport.from_path(PRECISIONS).metrics
    path = flipped(tmp_path, PRECISIONS, first_double(PRECISIONS) + 6, 0)  # a mantissa bit
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        damaged = NcuReport.from_path(path)
        metrics = damaged.metrics
    assert damaged.damaged == ()
    changed = metrics.join(intact, on=["id", "metric"]).filter(
        pl.col("value").ne_missing(pl.col("value_right"))
    )
    assert changed.height == 1


def first_double(path: Path) -> int:
    """Byte offset of the first 8-byte number stored in a metric value of the first result."""
    data = path.read_bytes()
    shape = container.walk(path).shapes[0]
    end = shape.offset + int.from_bytes(data[shape.offset - 4 : shape.offset], "little")
    for number, _, _, pos, length in container._fields(data, shape.offset, end):
        if number != 13:
            continue
        for sub, _, _, sub_pos, sub_len in container._fields(data, pos, pos + length):
            if sub != 2:
                continue
            for _, wire, _, value_pos, _ in container._fields(data, sub_pos, sub_pos + sub_len):
                if wire == 1:
                    return value_pos
    raise AssertionError("no double metric value in the first result")


def test_flipped_name_id_that_repeats_another_metric(tmp_path: Path) -> None:
    """A flipped metric name id that equals another metric's id: ncu_report keeps one of the
    two (4,709 of 4,710 metrics). Sound reports repeat an id only as byte-identical entries
    (3 in ncu_probe_full), so a repeat with other content is refused."""
    path = flipped(tmp_path, PRECISIONS, 672663, 6)
    code, counts, _ = probe(path)
    assert code == 0 and counts is not None and counts["metrics"] == 4709
    with pytest.raises(TraceFormatError) as exc:
        NcuReport.from_path(path)
    assert "metric name id 332 appears twice with different content (bytes 672660 and 673812)" in (
        one_line(exc)
    )


def test_flipped_name_id_out_of_the_name_table(tmp_path: Path) -> None:
    """A name id past the name table: ncu_report lists the metric (with an empty name) but
    ``metric_by_name`` returns None. Found when the metrics are read."""
    path = flipped(tmp_path, PRECISIONS, 203326, 6)
    code, _, stderr = probe(path)
    assert code == 1 and "AttributeError" in stderr
    report = NcuReport.from_path(path)
    assert report.kernels.height == 6
    with pytest.raises(TraceFormatError) as exc:
        report.metrics  # noqa: B018
    assert "result 1 lists metric '' but it cannot be read" in one_line(exc)
    with pytest.warns(DamagedReportWarning, match="cannot be read"):
        metrics = NcuReport.from_path(path, validate=False).metrics
    assert metrics.height == 4709


def test_kernel_name_that_is_not_utf8(tmp_path: Path) -> None:
    """Bit 7 flipped in a kernel's name (its mangled name: nvjet kernels are extern "C", so
    the mangled name is the plain one): ncu_report hands the name over as lone surrogates. Kernel names are join keys (nsys, diff), so this is damage; with
    validate=False the name is shown with U+FFFD."""
    data = PRECISIONS.read_bytes()
    name = b"nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
    offset = data.index(name, container.walk(PRECISIONS).shapes[0].offset) + 3
    path = flipped(tmp_path, PRECISIONS, offset, 7)
    with pytest.raises(TraceFormatError) as exc:
        NcuReport.from_path(path)
    assert "result 0 has a kernel name that is not valid UTF-8" in one_line(exc)
    with pytest.warns(UserWarning) as caught:
        report = NcuReport.from_path(path, validate=False)
        mangled = report.kernels["mangled_name"][0]
    assert any(isinstance(w.message, DamagedReportWarning) for w in caught)
    assert mangled == "nvj\ufffdt_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"


def test_fd2_capture_in_two_threads_restores_fd2() -> None:
    """Two reports loaded at once in threads: the second capture saved the first one's
    temporary file as 'fd 2' and put it back, so stderr pointed at a deleted file ever after."""
    import threading
    import time

    from tracekit.ncu.damage import capture_fd2

    before = os.readlink("/proc/self/fd/2")
    first_in = threading.Event()

    def first() -> None:
        with capture_fd2([]):
            first_in.set()
            time.sleep(0.3)

    def second() -> None:
        first_in.wait(5)
        with capture_fd2([]):
            time.sleep(0.5)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert os.readlink("/proc/self/fd/2") == before


def test_the_isolated_child_has_a_time_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hang of ncu_report in the child hung the caller (no timeout; review finding). The
    limit is TRACEKIT_NCU_ISOLATE_TIMEOUT: 0.05 s cannot even start Python, so the child is
    killed and the caller gets one line."""
    monkeypatch.setenv("TRACEKIT_NCU_ISOLATE_TIMEOUT", "0.05")
    with pytest.raises(TraceFormatError, match=r"did not finish in 0\.05 s \(TRACEKIT_NCU_ISOLATE_TIMEOUT\)"):
        NcuReport.from_path(PRECISIONS, isolate=True).kernels  # noqa: B018
    monkeypatch.setenv("TRACEKIT_NCU_ISOLATE_TIMEOUT", "soon")
    with pytest.raises(TracekitError, match="TRACEKIT_NCU_ISOLATE_TIMEOUT='soon' is not a number of seconds"):
        NcuReport.from_path(PRECISIONS, isolate=True).kernels  # noqa: B018
