"""Seeded mutations of real exports through the CLI: every outcome is a result (exit 0) or
one error line (exit 2, "tracekit: error: …") — never a traceback, an "internal error" or a
hang — and the input file is never modified.

Mutations: byte flips, truncation, a dropped or emptied table, a dropped column, NULLs and
text in key columns, start and end swapped. ``TRACEKIT_FUZZ_CASES`` sets how many (default
60; the campaign behind the issue ran a few thousand).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import os
import random
import shutil
import sqlite3
import warnings
from pathlib import Path

import pytest

from tracekit.cli.main import main

from .conftest import SAMPLES

SEEDS = [SAMPLES / "planted" / "planted_sync_stall" / "planted_sync_stall.sqlite",
         SAMPLES / "llm_tp2_nccl_per_rank" / "llm_tp2_nccl_per_rank_rank0.sqlite"]
TABLES = ["CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMCPY", "NVTX_EVENTS", "StringIds",
          "TARGET_INFO_GPU", "CUDA_GPU_MEMORY_USAGE_EVENTS", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"]
KEYS = ["start", "end", "correlationId", "globalPid", "globalTid", "deviceId", "shortName", "demangledName", "nameId", "textId", "text"]
N = int(os.environ.get("TRACEKIT_FUZZ_CASES", "60"))


def _columns(con: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]


def mutate(seed: Path, out: Path, rng: random.Random) -> str:
    """One mutation of ``seed`` written to ``out``; returns what was done."""
    shutil.copyfile(seed, out)
    kind = rng.choice(["flip", "truncate", "drop_table", "empty_table", "drop_column", "nulls", "text", "swap"])
    if kind in ("flip", "truncate"):
        data = bytearray(out.read_bytes())
        if kind == "flip":
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(100, len(data))] ^= 1 << rng.randrange(8)
        else:
            data = data[: rng.randrange(100, len(data))]
        out.write_bytes(bytes(data))
        return kind
    con = sqlite3.connect(out)
    tables = [t for t in TABLES if con.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (t,)).fetchone()]
    table = rng.choice(tables)
    cols = _columns(con, table)
    keys = [c for c in cols if c in KEYS] or cols
    col = rng.choice(keys)
    try:
        if kind == "drop_table":
            con.execute(f'DROP TABLE "{table}"')
        elif kind == "empty_table":
            con.execute(f'DELETE FROM "{table}"')
        elif kind == "drop_column":
            con.execute(f'ALTER TABLE "{table}" DROP COLUMN "{col}"')
        elif kind == "nulls":
            con.execute(f'UPDATE "{table}" SET "{col}" = NULL WHERE rowid % ? = 0', (rng.randint(1, 5),))
        elif kind == "text":
            con.execute(f'UPDATE "{table}" SET "{col}" = ? WHERE rowid % ? = 0', (rng.choice(["abc", "12x", "", "1e3"]), rng.randint(1, 5)))
        elif kind == "swap" and "start" in cols and "end" in cols:
            con.execute(f'UPDATE "{table}" SET start = end, end = start WHERE rowid % ? = 0', (rng.randint(1, 5),))
        con.commit()
    except sqlite3.Error:
        pass  # e.g. a column SQLite will not drop: the copy stays as it was
    con.close()
    return f"{kind} {table}.{col}"


def _run(args: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.TextIOWrapper(io.BytesIO())), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # warnings are part of an answer; only errors are judged here
        code = main(args)
    return code, err.getvalue()


@pytest.mark.parametrize("case", range(N))
def test_mutated_export_answers_or_says_why(case: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    rng = random.Random(case)
    seed = SEEDS[case % len(SEEDS)]
    path = tmp_path / f"m{case}.sqlite"
    what = mutate(seed, path, rng)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    for args in (["summary", "--findings", "2", str(path)],
                 ["stats", "-r", "cuda_gpu_kern_sum,cuda_api_sum,nvtx_sum,nvtx_gpu_proj_sum,cuda_kern_exec_sum", "-f", "csv", str(path)],
                 ["diagnose", "-f", "json", str(path)]):
        code, err = _run(args)
        errors = [ln for ln in err.splitlines() if ln.startswith("tracekit: error") or "internal error" in ln or "Traceback" in ln]
        assert "internal error" not in err and "Traceback" not in err, f"{what}: {args[0]}: {err[-400:]}"
        assert code in (0, 2), f"{what}: {args[0]} exit {code}: {err[-300:]}"
        if code == 2:
            assert len(errors) == 1, f"{what}: {args[0]}: {err[-300:]}"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest, f"{what}: the input was modified"


# -- Nsight Compute reports (issue 18.6) ------------------------------------------------------

NCU_SEEDS = [SAMPLES / "ncu" / "ncu_precisions" / "ncu_precisions.ncu-rep",
             SAMPLES / "ncu" / "ncu_planted_clean" / "ncu_planted_clean.ncu-rep"]
N_NCU = max(6, N // 5)


def mutate_ncu(seed: Path, out: Path, rng: random.Random) -> str:
    """Byte flips, truncation, or a flip in a result's length prefix (the flips that abort
    ncu_report with SIGABRT)."""
    from tracekit.ncu.container import walk

    data = bytearray(seed.read_bytes())
    kind = rng.choice(["flip", "flip", "truncate", "length"])
    if kind == "flip":
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(8, len(data))] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        data = data[: rng.randrange(8, len(data))]
    else:
        shape = rng.choice(walk(seed).shapes)
        data[shape.offset - 4 + rng.randrange(1, 4)] ^= 1 << rng.randrange(8)
    out.write_bytes(bytes(data))
    return kind


@pytest.mark.ncu
@pytest.mark.skipif(importlib.util.find_spec("ncu_report") is None, reason="needs ncu-report")
@pytest.mark.parametrize("case", range(N_NCU))
def test_mutated_ncu_report_answers_or_says_why(case: int, tmp_path: Path) -> None:
    """Every mutated copy opens (tables read, warnings allowed) or raises one TracekitError
    line; read in a child process (isolate=True), so a crash of ncu_report is such a line too."""
    import tracekit
    from tracekit.errors import TracekitError

    rng = random.Random(f"ncu{case}")
    seed = NCU_SEEDS[case % len(NCU_SEEDS)]
    path = tmp_path / f"m{case}.ncu-rep"
    what = mutate_ncu(seed, path, rng)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    for validate in (True, False):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                report = tracekit.open(path, validate=validate, isolate=True)
                report.kernels, report.metrics, report.rules  # noqa: B018
        except TracekitError as exc:
            assert str(exc) and "\n" not in str(exc), f"{what}: {exc!r}"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest, f"{what}: the input was modified"


# -- byte flips of every sample export (issue 29) ----------------------------------------------
def _flipped(rel: str, flips: list[tuple[int, int]], out: Path) -> Path:
    data = bytearray((SAMPLES / rel).read_bytes())
    for offset, bit in flips:
        data[offset] ^= 1 << bit
    out.write_bytes(bytes(data))
    return out


@pytest.mark.parametrize(("rel", "flip", "expect"), [
    # a flip in StringIds' B-tree gave one id two texts: every id → text lookup ended in
    # "internal error: InvalidOperationError: `old` input for `replace` must not contain duplicates"
    ("llm_tp2_nccl_per_rank/llm_tp2_nccl_per_rank_rank0.sqlite", (71762, 1), "StringIds id(s) appear more than once"),
    # a flip in the schema's SQL: SQLite's message quoted 25 lines of CREATE TABLE
    ("planted/planted_launch_bound/planted_launch_bound.sqlite", (664744, 6), "malformed database schema (TARGET_INFO_GPU)"),
])
def test_found_by_the_byte_flip_campaign(rel: str, flip: tuple[int, int], expect: str, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    path = _flipped(rel, [flip], tmp_path / "flipped.sqlite")
    for args in (["summary", str(path)], ["stats", "-r", "cuda_gpu_kern_sum,nvtx_sum", "-f", "csv", str(path)],
                 ["diagnose", "-f", "json", str(path)]):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.TextIOWrapper(io.BytesIO())), \
                warnings.catch_warnings():
            warnings.simplefilter("default")  # the CLI prints them: they are part of the answer here
            code = main(args)
        text = err.getvalue()
        assert code in (0, 2) and "internal error" not in text, text[-400:]
        assert expect in text
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if code == 2:
            assert len(lines) == 1 and lines[0].startswith("tracekit: error:"), text
        else:
            assert all(ln.startswith("tracekit: warning:") for ln in lines), text


def _small_exports() -> list[Path]:
    return sorted(p for p in SAMPLES.rglob("*.sqlite") if p.stat().st_size < 8_000_000)


@pytest.mark.parametrize("case", range(max(len(_small_exports()), 1) * 2))
def test_byte_flips_of_every_sample_export(case: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """1–8 bit flips of each sample export (two seeds each) through summary, stats and
    diagnose: a result, or one error line; the input untouched. TRACEKIT_FUZZ_CASES scales the
    seeded campaign above; this one covers every export."""
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    exports = _small_exports()
    seed = exports[case % len(exports)]
    rng = random.Random(20_000 + case)
    size = seed.stat().st_size
    flips = [(rng.randrange(100, size), rng.randrange(8)) for _ in range(rng.randint(1, 8))]
    path = _flipped(str(seed.relative_to(SAMPLES)), flips, tmp_path / "f.sqlite")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    for args in (["summary", "--findings", "2", str(path)], ["stats", "-r", "cuda_gpu_kern_sum,cuda_api_sum,nvtx_sum", "-f", "csv", str(path)],
                 ["diagnose", "-f", "json", str(path)]):
        code, err = _run(args)
        assert "internal error" not in err and "Traceback" not in err, f"{seed.name} {flips}: {args[0]}: {err[-400:]}"
        assert code in (0, 2), f"{seed.name} {flips}: {args[0]} exit {code}: {err[-300:]}"
        if code == 2:
            lines = [ln for ln in err.splitlines() if ln.strip()]
            assert len(lines) == 1, f"{seed.name} {flips}: {args[0]}: {err[-300:]}"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


def _text_columns(path: Path) -> list[tuple[str, str]]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        out = []
        for (table,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"):
            for _cid, name, typ, *_ in con.execute(f'PRAGMA table_info("{table}")'):
                if typ.upper() in ("TEXT", "") and con.execute(f'SELECT 1 FROM "{table}" WHERE "{name}" IS NOT NULL LIMIT 1').fetchone():
                    out.append((table, name))
        return out
    finally:
        con.close()


DECODE = SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"


@pytest.mark.parametrize(("table", "column"), _text_columns(DECODE))
def test_invalid_utf8_in_any_text_column(table: str, column: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 29 §2: invalid UTF-8 (bytes FF and 80) in three values of each text column of an
    export — what a flipped byte in a string does — through summary, stats and diagnose: a
    result (text decoded with U+FFFD and a warning where tracekit reads it) or one error line,
    never an internal error such as UnicodeDecodeError."""
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "u.sqlite"
    shutil.copyfile(DECODE, path)
    con = sqlite3.connect(path)
    con.execute(f"UPDATE \"{table}\" SET \"{column}\" = CAST(X'66FF6F80' AS TEXT) WHERE rowid IN "
                f'(SELECT rowid FROM "{table}" WHERE "{column}" IS NOT NULL LIMIT 3)')
    con.commit()
    con.close()
    for args in (["summary", str(path)], ["stats", "-r", "cuda_gpu_kern_sum,cuda_api_sum,nvtx_sum,nvtx_gpu_proj_trace", "-f", "csv", str(path)],
                 ["diagnose", "-f", "json", str(path)]):
        code, err = _run(args)
        assert code in (0, 2) and "internal error" not in err, f"{table}.{column}: {args[0]}: {err[-400:]}"
        if code == 2:
            assert len([ln for ln in err.splitlines() if ln.strip()]) == 1, err
