"""The CLI's tables and help in a pipe or an 80-column terminal (issue 37 §3): numbers never
wrap, long names are shortened (never stacked in pieces over several lines), option names are
never cut. Each command runs as a user runs it, in a subprocess with ``COLUMNS=80`` and its
output going to a pipe."""

from __future__ import annotations

import csv
import io
import os
import re
import subprocess
import sys

import pytest

from tracekit.cli.tables import shorten_middle

from .conftest import SAMPLES

CLI = [sys.executable, "-m", "tracekit.cli.main"]
TP2 = SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"
RANKS = SAMPLES / "llm_tp2_nccl_per_rank"
CLEAN = SAMPLES / "planted" / "planted_clean" / "planted_clean.sqlite"
HOST = SAMPLES / "planted" / "planted_host_bound" / "planted_host_bound.sqlite"
NUMBER = re.compile(r"^[-+]?[\d,]*\.?\d+%?$")


def _run(*args: str) -> str:
    env = {**os.environ, "COLUMNS": "80", "NO_COLOR": "1"}
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, check=False, timeout=600)
    assert proc.returncode == 0 or (args[0] == "diff" and proc.returncode == 1), proc.stderr  # diff: 1 = a regression
    return proc.stdout


def _tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Each box table of the output: its header (the header lines' cells joined per column)
    and its body rows (one per line between the header rule and the bottom rule)."""
    out = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("┏"):
            head: list[list[str]] = []
            i += 1
            while not lines[i].startswith("┡"):
                head.append([c.strip() for c in lines[i].strip("┃").split("┃")])
                i += 1
            i += 1
            body = []
            while not lines[i].startswith("└"):
                body.append([c.strip() for c in lines[i].strip("│").split("│")])
                i += 1
            header = [" ".join(p for p in col if p) for col in zip(*head, strict=True)]
            out.append((header, body))
        i += 1
    return out


def _no_continuation_lines(header: list[str], body: list[list[str]]) -> None:
    """A cell's text split over two lines leaves the other cells of the second line empty:
    every body line here has its first cell and every number cell of the first row filled."""
    numeric = [j for j, c in enumerate(body[0]) if NUMBER.match(c)] if body else []
    for row in body:
        assert len(row) == len(header)
        assert row[0], f"a continuation line in {header}: {row}"
        for j in numeric:
            assert row[j] == "" or NUMBER.match(row[j]) or row[j] in ("-", "–"), f"{header[j]} broken: {row[j]!r}"


@pytest.mark.parametrize("report", ["cuda_gpu_kern_sum", "cuda_api_sum", "nvtx_sum", "cuda_gpu_mem_time_sum"])
def test_stats_tables_keep_every_number_whole(report: str) -> None:
    """Every row of the table is one line whose numbers equal the CSV's cell for cell; names
    wider than their column are shortened with an ellipsis to exactly what shorten_middle
    gives, never folded."""
    table = _tables(_run("stats", "-r", report, str(TP2)))
    (header, body), = table
    rows = list(csv.reader(io.StringIO(_run("stats", "-r", report, "-f", "csv", str(TP2)))))
    assert header == rows[0]
    assert len(body) == len(rows) - 1
    for shown, full in zip(body, rows[1:], strict=True):
        for h, a, b in zip(header, shown, full, strict=True):
            if NUMBER.match(b):
                assert a == b, f"{report} {h}: {a!r} vs {b!r}"
            else:
                assert a == b or ("…" in a and a == shorten_middle(b, len(a))), (h, a, b)


@pytest.mark.parametrize(("args", "fits"), [
    (["summary", str(TP2)], True),
    (["diff", str(CLEAN), str(HOST)], True),
    (["summary", str(RANKS)], False),
], ids=["summary", "diff", "summary-ranks"])
def test_summary_and_diff_tables_fit_80_columns(args: list[str], fits: bool) -> None:
    """summary and diff (one trace, two runs, a folder of ranks): one line per row and whole
    numbers in every table; at most 80 columns wide where the numbers leave room (the per-rank
    table's eleven columns of numbers need more: its name column is then at its narrowest,
    MIN_TEXT_WIDTH, and the lines run longer rather than cut a number)."""
    from tracekit.cli.tables import MIN_TEXT_WIDTH

    out = _run(*args)
    tables = _tables(out)
    assert len(tables) >= 3
    for header, body in tables:
        _no_continuation_lines(header, body)
    wide = [line for line in out.splitlines() if line[:1] in "┏┃┡│└" and len(line) > 80]
    if fits:
        assert not wide, wide[0]
    else:
        header, body = next(t for t in tables if "top_kernel" in t[0])
        assert max(len(r[header.index("top_kernel")]) for r in body) <= MIN_TEXT_WIDTH


def test_kernel_names_in_summary_are_shortened_in_one_line() -> None:
    """The top-kernels table shows a long kernel name on one line, its head and tail kept."""
    header, body = next(t for t in _tables(_run("summary", str(TP2))) if t[0][0] == "kernel")
    names = [r[0] for r in body]
    assert any("…" in n for n in names)
    assert all(len(n) <= 40 for n in names)
    assert any(n.startswith("cudnn_") and n.endswith("kernel0_0") for n in names)


@pytest.mark.parametrize("command", [["capture", "nsys"], ["capture", "ncu"], ["summary"], ["stats"], ["diagnose"],
                                     ["diff"], ["report"], ["model"], ["export", "perfetto"], ["mcp"]], ids=" ".join)
def test_help_never_cuts_an_option_name(command: list[str]) -> None:
    """In a pipe (and below 100 columns) the help is click's plain layout: every option of the
    command appears whole."""
    import typer

    from tracekit.cli.main import build_app

    out = _run(*command, "--help")
    click_cmd = typer.main.get_command(build_app(command))
    for name in command:
        click_cmd = click_cmd.commands[name] if hasattr(click_cmd, "commands") else click_cmd
    for param in click_cmd.params:
        for opt in [*param.opts, *getattr(param, "secondary_opts", [])]:
            if opt.startswith("--"):
                assert re.search(re.escape(opt) + r"(?![\w-])", out), f"{opt} cut or missing in {' '.join(command)} --help"
    assert not re.search(r"--[\w-]+…", out)


def test_shorten_middle() -> None:
    """Return type, arguments and namespaces go before anything is cut; then the middle."""
    name = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int, T2, T3)"
    assert shorten_middle(name, 200) == name
    assert shorten_middle(name, 80) == "at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>"
    assert shorten_middle(name, 60) == "vectorized_elementwise_kernel<4, FillFunctor<float>>"
    cut = shorten_middle(name, 40)
    assert len(cut) == 40 and cut.startswith("vectorized_") and cut.endswith("FillFunctor<float>>") and "…" in cut
    short = shorten_middle("cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_3_64x64x128_4x1x1_cga1x1x1_kernel0_0", 32)
    assert len(short) == 32 and short.startswith("cudnn_") and short.endswith("_cga1x1x1_kernel0_0") and "…" in short


def test_stats_table_shows_rows_asked_for_and_says_how_many_are_left_out() -> None:
    """``--rows N`` shows a report's first N rows as a table, in the CSV's order, and says how
    many the report has and how to see them all; ``--rows 0`` shows every row (issue 44: a
    table of 100 k kernel names took 110 s and 1 GB to lay out). A bad count is one line."""
    full = list(csv.reader(io.StringIO(_run("stats", "-f", "csv", "-r", "cuda_gpu_kern_sum", str(TP2)))))[1:]
    assert len(full) > 3
    (_, body), = _tables(few := _run("stats", "-r", "cuda_gpu_kern_sum", "--rows", "3", str(TP2)))
    assert [r[2] for r in body] == [r[2] for r in full[:3]]  # Instances, row by row
    assert f"first 3 of {len(full):,} rows" in few and "--rows 0" in few
    (_, body), = _tables(every := _run("stats", "-r", "cuda_gpu_kern_sum", "--rows", "0", str(TP2)))
    assert len(body) == len(full) and "rows;" not in every
    proc = subprocess.run([*CLI, "stats", "--rows", "-2", str(TP2)], capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "--rows -2" in proc.stderr
