"""Scans started before polars is imported (tracekit/nsys/readahead.py,
tracekit/cli/stats_readahead.py) and the typer-free ``tracekit stats`` (tracekit/cli/main.py):
a cold report takes every scan it started and prints what it printed without them; a scan
is taken only for exactly the table, filter and columns it read, as 64-bit integers; the
conditions that start nothing do start nothing."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import warnings
from pathlib import Path

import polars as pl
import pytest

from tracekit.cli import stats_readahead
from tracekit.cli.stats_readahead import start_reads
from tracekit.nsys import database, launch_scans, readahead
from tracekit.nsys.trace import IncompleteTraceWarning, NsysTrace
from tracekit.stats import run_report

from .conftest import SAMPLES, mutated_copy

ROOT = Path(__file__).resolve().parents[1]
#: 5 CUDA API calls per kernel (the calls are read with the launch filter), and a decode
#: export whose calls are read whole.
TP2 = SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"
DECODE = SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
KERNELS, CALLS = launch_scans.KERNEL_TABLE, launch_scans.API_TABLE


def _trace(path: Path, **options: object) -> NsysTrace:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IncompleteTraceWarning)
        return NsysTrace(path, **options)  # type: ignore[arg-type]


def _reference(path: Path) -> str:
    return run_report(_trace(path, column_cache=False), "cuda_kern_exec_sum", convention="2023").to_csv()


def _argv(path: Path, *more: str) -> list[str]:
    return ["stats", str(path), "-r", "cuda_kern_exec_sum", "-f", "csv", "--convention", "2023", *more]


def _scans(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[str]]]:
    """The scans the export reader makes from now on (table, expressions)."""
    seen: list[tuple[str, list[str]]] = []
    original = database.ExportDatabase._scan_table

    def counted(self: database.ExportDatabase, table: str, exprs: list[str], *args: object, **kwargs: object) -> pl.DataFrame:
        seen.append((table, list(exprs)))
        return original(self, table, exprs, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(database.ExportDatabase, "_scan_table", counted)
    return seen


@pytest.fixture(autouse=True)
def _fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> object:
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TRACEKIT_READ_AHEAD", raising=False)
    yield
    readahead.drop()


@pytest.mark.parametrize(("path", "narrow_from"), [(TP2, 2), (TP2, 1 << 40), (DECODE, 2)], ids=["tp2", "tp2-every-call", "decode"])
def test_a_cold_report_takes_every_scan_it_started(path: Path, narrow_from: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scans of ``cuda_kern_exec_sum`` (the kernels' six columns; the calls' five, with the
    launch filter where calls outnumber kernels twice, else every call) are all taken: the
    report scans the calls not at all and the kernels only for their names a second time (read
    before the launch join, again after it: on these small tables, below the column cache's
    size, that is a scan), holds nothing read ahead afterwards, and equals the report made with
    no scan read ahead and no column cache."""
    monkeypatch.setattr(launch_scans, "NARROW_FROM_CALLS_PER_KERNEL", narrow_from)
    expected = _reference(path)
    db = _trace(path, column_cache=False).db
    narrowed = launch_scans.narrows_by_rows(db.row_estimate(KERNELS), db.row_estimate(CALLS))
    assert narrowed == (narrow_from == 2)  # both ways of reading the calls are exercised
    seen = _scans(monkeypatch)
    assert start_reads(_argv(path))
    assert readahead.pending(path)
    assert run_report(_trace(path), "cuda_kern_exec_sum", convention="2023").to_csv() == expected
    assert seen == [(KERNELS, ['"demangledName"'])]
    assert not readahead.pending(path)


def test_a_column_is_taken_once_for_exactly_its_table_filter_and_type() -> None:
    """What :func:`readahead.take` gives: the columns asked for, in that order, once; nothing
    for another filter, a column not read ahead, or a column that is not 64-bit integers
    (``StringIds.value`` is text); nothing from a scan that failed."""
    readahead.start(TP2, [
        readahead.Scan(KERNELS, ("start", "end", "correlationId")),
        readahead.Scan("StringIds", ("id", "value")),
        readahead.Scan("NoSuchTable", ("start",)),
    ])

    def take(table: str, columns: list[str], where: str = "") -> pl.DataFrame | None:
        return readahead.take(TP2, table, where, columns, pl.DataFrame, lambda f, c: f.schema[c] == pl.Int64)

    truth = _trace(TP2, column_cache=False).db.query(f'SELECT "end", "start" FROM "{KERNELS}"', {"end": pl.Int64, "start": pl.Int64})
    assert take(KERNELS, ["start", "deviceId"]) is None
    got = take(KERNELS, ["end", "start"])
    assert got is not None and got.columns == ["end", "start"] and got.equals(truth)
    assert take(KERNELS, ["start"]) is None  # taken already
    assert readahead.pending(TP2)  # correlationId is left
    assert take("StringIds", ["value"]) is None  # text: refused, and the scan freed at once
    assert take("StringIds", ["id"]) is None
    assert take("NoSuchTable", ["start"]) is None  # its statement failed
    assert take(KERNELS, ["correlationId"], where="deviceId = 0") is None  # read another way: the scan is dropped
    assert not readahead.pending(TP2)


def test_a_file_put_in_the_export_s_place_is_read_as_itself(tmp_path: Path) -> None:
    """The scans read one file; another file renamed over the export before the report opens
    it is not answered with their rows (device, inode, size and mtime are compared)."""
    path = tmp_path / "export.sqlite"
    mutated_copy(DECODE, path)
    assert start_reads(_argv(path))
    mutated_copy(TP2, tmp_path / "other.sqlite")
    os.replace(tmp_path / "other.sqlite", path)
    assert run_report(_trace(path), "cuda_kern_exec_sum", convention="2023").to_csv() == _reference(TP2)
    assert not readahead.pending(path)


def test_an_index_that_holds_the_columns_changes_no_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An export carrying indexes that hold the scanned columns (SQLite answered such reads from
    the index, in its order: columns of one table read apart no longer lined up, and a report
    differed from the export without them): the reports equal the un-indexed export's, read
    ahead or not, through the column cache (its size threshold lowered) or not."""
    copy = mutated_copy(DECODE, tmp_path / "indexed.sqlite",
                        f'CREATE INDEX kx ON {KERNELS}("deviceId", "demangledName", "globalPid", "correlationId", "start", "end")',
                        f'CREATE INDEX ky ON {KERNELS}("end" DESC, "demangledName", "start", "deviceId")',
                        f'CREATE INDEX ax ON {CALLS}("nameId", "globalTid", "correlationId", "start", "end")')
    reports = ("cuda_kern_exec_sum", "cuda_gpu_kern_sum")
    expected = [run_report(_trace(DECODE, column_cache=False), r, convention="2023").to_csv() for r in reports]
    assert [run_report(_trace(copy, column_cache=False), r, convention="2023").to_csv() for r in reports] == expected
    monkeypatch.setattr(database, "CACHE_MIN_ROWS", 2)
    assert start_reads(_argv(copy))
    assert [run_report(_trace(copy), r, convention="2023").to_csv() for r in reports] == expected  # cold, then warm


def test_what_starts_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another first report, the switch off, a WAL beside the export, columns in the cache
    already, the columns' bytes over the limit, or the address space limited: no scan."""
    assert not start_reads(["stats", str(TP2), "-r", "cuda_gpu_kern_sum,cuda_kern_exec_sum"])
    assert not start_reads(["stats", str(TP2), "-r", "cuda_kern_exec_sum", "-o", str(tmp_path / "x")])
    with monkeypatch.context() as m:
        m.setenv("TRACEKIT_READ_AHEAD", "off")
        assert not start_reads(_argv(TP2))
    with monkeypatch.context() as m:
        m.setattr(stats_readahead, "MAX_BYTES", 1024)
        assert not start_reads(_argv(TP2))
    copy = mutated_copy(TP2, tmp_path / "wal.sqlite")
    Path(f"{copy}-wal").write_bytes(b"\0" * 32)
    assert not start_reads(_argv(copy))
    assert not readahead.pending(TP2) and not readahead.pending(copy)
    # warm: a report made the columns cached (these tables are below the cache's size
    # threshold: lowered here); the next command line reads the cache, not the export
    assert start_reads(_argv(TP2))  # small tables are never cached: every run is a cold one
    readahead.drop()
    with monkeypatch.context() as m:
        m.setattr(database, "CACHE_MIN_ROWS", 2)
        run_report(_trace(TP2), "cuda_kern_exec_sum", convention="2023")
    assert not start_reads(_argv(TP2))
    assert not readahead.pending(TP2)
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (16 << 30, resource.RLIM_INFINITY))\n"
        "from tracekit.cli.stats_readahead import start_reads\n"
        "print(start_reads(sys.argv[1:]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRACEKIT_CACHE": str(tmp_path / "other")}
    run = subprocess.run([sys.executable, "-c", code, *_argv(TP2)], env=env, cwd=ROOT, capture_output=True, text=True,
                         check=False, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "False", run.stderr[-2000:]
    assert resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY  # the test's own process is not limited


def _cli(path: Path, cache: Path, *more: str, **env: str) -> subprocess.CompletedProcess[bytes]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TRACEKIT_")}
    argv = [sys.executable, "-m", "tracekit.cli.entry", *_argv(path, *more)]
    return subprocess.run(argv, capture_output=True, env={**clean, "TRACEKIT_CACHE": str(cache), **env}, cwd=ROOT,
                          check=False, timeout=300)


def test_the_command_prints_the_same_bytes_with_and_without_reading_ahead(tmp_path: Path) -> None:
    """The console script, cold: read ahead and typer-free, read ahead through typer (``--rows``
    sends the command line there; CSV ignores it), and with the switch off: the same stdout,
    no stderr, equal to the report made in this process."""
    expected = _reference(TP2).encode()
    runs = [
        _cli(TP2, tmp_path / "a"),
        _cli(TP2, tmp_path / "b", "--rows", "5"),
        _cli(TP2, tmp_path / "c", TRACEKIT_READ_AHEAD="0"),
    ]
    for run in runs:
        assert run.returncode == 0 and run.stderr == b"", run.stderr[-2000:]
        assert run.stdout == expected


def test_a_plain_stats_command_line_does_not_import_typer(tmp_path: Path) -> None:
    """``tracekit stats FILE -r R -f csv`` runs the report without importing typer (0.05 s of
    a cold run); one error line, the same as through typer, for a file that is not there."""
    probe = (
        "import sys\n"
        "from tracekit.cli.main import main\n"
        "code = main(sys.argv[1:])\n"
        "sys.stderr.write('typer imported\\n' if 'typer' in sys.modules else 'no typer\\n')\n"
        "sys.exit(code)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRACEKIT_CACHE": str(tmp_path / "cache")}

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", probe, *argv], env=env, cwd=ROOT, capture_output=True, text=True,
                              check=False, timeout=300)

    plain = run(*_argv(DECODE))
    assert plain.returncode == 0 and plain.stderr.splitlines()[-1] == "no typer", plain.stderr[-2000:]
    typed = run(*_argv(DECODE, "--rows", "3"))
    assert typed.returncode == 0 and typed.stderr.splitlines()[-1] == "typer imported"
    assert plain.stdout == typed.stdout == _reference(DECODE)
    missing = [run(*_argv(tmp_path / "none.sqlite", *more)) for more in ((), ("--rows", "3"))]
    assert [m.returncode for m in missing] == [2, 2]
    assert missing[0].stderr.splitlines()[0] == missing[1].stderr.splitlines()[0]
    assert missing[0].stderr.splitlines()[0].startswith("tracekit: error: ")


def test_stderr_is_typer_s(tmp_path: Path) -> None:
    """The typer-free path prints its lines as typer did: an escape sequence in a report name
    echoed back is dropped when stderr is not a terminal, the same line through typer."""
    bad = "\x1b[31mbogus"
    lines = []
    for more in ((), ("--rows", "5")):
        argv = [sys.executable, "-m", "tracekit.cli.entry", "stats", str(TP2), "-r", f"{bad},cuda_gpu_kern_sum", "-f", "csv", *more]
        run = subprocess.run(argv, capture_output=True, cwd=ROOT, check=False, timeout=300,
                             env={**os.environ, "PYTHONPATH": str(ROOT), "TRACEKIT_CACHE": str(tmp_path / f"d{len(more)}")})
        assert run.returncode == 0, run.stderr[-2000:]
        lines.append(run.stderr.decode().splitlines())
    assert lines[0] == lines[1] and lines[0][0].startswith("tracekit: skipping bogus: ")
    assert "\x1b" not in "".join(lines[0])


def test_a_damaged_column_is_read_as_usual(tmp_path: Path) -> None:
    """A kernel start stored as text (SQLite allows it): the driver types the column read ahead
    as text, so it is not taken and the usual read handles it; the command prints what it
    prints with the switch off, warning included."""
    copy = mutated_copy(TP2, tmp_path / "damaged.sqlite",
                        f"UPDATE {KERNELS} SET start = 'soon' WHERE rowid = (SELECT min(rowid) FROM {KERNELS})")
    ahead = _cli(copy, tmp_path / "a")
    plain = _cli(copy, tmp_path / "b", TRACEKIT_READ_AHEAD="0")
    assert (ahead.returncode, ahead.stdout, ahead.stderr) == (plain.returncode, plain.stdout, plain.stderr)
    assert ahead.stdout or ahead.stderr


@pytest.mark.parametrize(("raised", "code"), [(KeyboardInterrupt, 130), (EOFError, 1)])
def test_an_interrupted_plain_command_ends_as_through_typer(raised: type[BaseException], code: int,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C (or end of input) while a report runs: the same exit code and the same stderr
    (nothing; click's empty line for end of input) whether the command line went through typer
    or not."""
    from tracekit.cli import main as cli_main
    from tracekit.cli import stats as cli_stats

    def interrupted(*_args: object, **_kwargs: object) -> None:
        raise raised

    monkeypatch.setattr(cli_main, "run_stats", interrupted, raising=False)
    monkeypatch.setattr("tracekit.cli.stats_run.run_stats", interrupted)
    monkeypatch.setattr(cli_stats, "run_stats", interrupted)
    results = []
    for more in ((), ("--rows", "5")):
        results.append(cli_main.main(_argv(DECODE, *more)))
        results.append(capsys.readouterr().err)
    err = "\n" if raised is EOFError else ""
    assert results == [code, err, code, err]


def _open(path: Path) -> int:
    """Descriptors of this process open on ``path``."""
    target = str(path.resolve())
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == target
        except OSError:
            continue
    return count


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_a_dropped_scan_closes_its_connection(tmp_path: Path) -> None:
    """A scan dropped before it is taken (finished, or still running: a slow filter) frees its
    rows and closes its SQLite connection once it has finished; so does one taken whole."""
    path = mutated_copy(TP2, tmp_path / "export.sqlite")
    # a filter that keeps SQLite busy for a while first: that scan is still running when dropped
    slow = "start > (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 2000000) SELECT count(*) FROM c)"
    for take_it, where in ((False, ""), (False, slow), (True, "")):
        readahead.start(path, [readahead.Scan(CALLS, ("start", "end"), where)])
        started = list(readahead._started.values())
        if take_it:
            assert readahead.take(path, CALLS, "", ["start", "end"], pl.DataFrame,
                                  lambda f, c: f.schema[c] == pl.Int64) is not None
        else:
            readahead.drop(path)
        for s in started:
            s._thread.join()
        assert not readahead.pending(path)
        assert _open(path) == 0
