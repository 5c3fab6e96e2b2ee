"""Shared fixtures: where the bundled sample traces and the public corpus live."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

# A suite started in the background by a shell without job control (`nohup bash tests/run.sh &`)
# inherits SIGINT ignored, and so would every program the capture tests start, which then
# outlive their Ctrl-C: give the suite the Ctrl-C of a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
CORPUS_ARCHIVE = ROOT / "tests" / "data" / "corpus.tar.xz"


def build_big_trace(folder: Path, kernels: int, seed: Path | None = None) -> Path:
    """``folder/big.sqlite``: the decode sample (or ``seed``) repeated to ``kernels`` kernels by
    ``benchmarks/make_big_trace.py`` (no GPU metrics), for tests that need a large real export."""
    out = folder / "big.sqlite"
    seed = seed or SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "make_big_trace.py"), "--kernels", str(kernels), "--no-gpu-metrics",
         "--seed", str(seed), "-o", str(out)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return out


def mutated_copy(src: Path, dst: Path, *statements: str) -> Path:
    """``dst``: a writable copy of the export ``src`` with the SQL ``statements`` run on it (a
    damaged or trimmed real export; ``src`` is never written)."""
    shutil.copyfile(src, dst)
    dst.chmod(0o644)
    con = sqlite3.connect(dst)
    for sql in statements:
        con.execute(sql)
    con.commit()
    con.close()
    return dst


def growth_moved_into_layer(src: Path, dst: Path, layer: str = "layer.2") -> int:
    """``dst``: a copy of the planted memory-growth export ``src`` whose per-step 64 MiB
    allocations are each moved into their step's ``layer`` range (just after it starts);
    returns how many were moved. ``src`` is never written."""
    mutated_copy(src, dst)
    con = sqlite3.connect(dst)
    layers = con.execute(
        "SELECT n.start FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId "
        "WHERE coalesce(n.text, s.value) = ? ORDER BY n.start", (layer,)
    ).fetchall()
    moved = 0
    for rowid, start in con.execute(
        "SELECT rowid, start FROM CUDA_GPU_MEMORY_USAGE_EVENTS WHERE bytes = 67108864 AND start > 0 ORDER BY start"
    ).fetchall():
        before = [s for (s,) in layers if s < start]  # the layer range of the allocation's step
        if before:
            con.execute("UPDATE CUDA_GPU_MEMORY_USAGE_EVENTS SET start = ? WHERE rowid = ?", (before[-1] + 1, rowid))
            moved += 1
    con.commit()
    con.close()
    return moved


def _unpacked_corpus() -> Path:
    """The public corpus of ``tests/data/corpus.tar.xz``, unpacked once into
    ``.cache/corpus-<hash>/corpus`` (atomically: a temporary folder, then a rename); the
    team's ``../shared/corpus`` only when the archive is missing."""
    import hashlib

    if not CORPUS_ARCHIVE.is_file():
        return ROOT.parent / "shared" / "corpus"
    digest = hashlib.sha256(CORPUS_ARCHIVE.read_bytes()).hexdigest()[:12]
    target = ROOT / ".cache" / f"corpus-{digest}"

    def fill(tmp: Path) -> None:
        with tarfile.open(CORPUS_ARCHIVE, "r:xz") as tar:
            tar.extractall(tmp, filter="data")

    _unpack_once(target, target / "corpus", fill)
    return target / "corpus"


def _unpack_once(target: Path, done: Path, fill: Callable[[Path], None]) -> None:
    """Unless ``done`` exists, ``fill`` a temporary folder beside ``target`` and rename it to
    ``target`` (atomic: a parallel run that got there first keeps its copy)."""
    if done.exists():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{target.name}-", dir=target.parent))
    fill(tmp)
    try:
        tmp.rename(target)
    except OSError:  # another process unpacked it first
        shutil.rmtree(tmp, ignore_errors=True)


CORPUS = _unpacked_corpus()
NSYS_CORPUS = CORPUS / "nsys"
NSYS_REFERENCE = NSYS_CORPUS / "reference"


def pytest_configure(config: pytest.Config) -> None:
    """Keep tracekit's caches (column cache, exports of reports) out of the user's home."""
    if "TRACEKIT_CACHE" not in os.environ:
        folder = tempfile.mkdtemp(prefix="tracekit-test-cache-")
        os.environ["TRACEKIT_CACHE"] = folder
        config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


def corpus_files() -> list[Path]:
    """Every Nsight Systems export of the public corpus."""
    return sorted(NSYS_CORPUS.glob("*.sqlite"))


def sample_exports() -> list[Path]:
    """Every ``.sqlite`` export bundled in ``sample_traces/``."""
    return sorted(p for p in SAMPLES.rglob("*.sqlite") if "workloads" not in p.parts)


#: H100 captures of LLM stacks (HF generate, CUDA graphs, torch.compile, TP in graphs), each
#: ``<name>/<name>.sqlite.xz`` and the ``nsys stats`` CSVs of that nsys in ``stats.tar.xz``.
LLM_STACKS = SAMPLES / "llm_stacks"


def llm_capture_names() -> list[str]:
    """The bundled LLM-stack captures (folders of ``sample_traces/llm_stacks``)."""
    return sorted(p.parent.name for p in LLM_STACKS.glob("*/*.sqlite.xz"))


@functools.cache
def llm_capture(name: str) -> Path:
    """The ``.sqlite`` of capture ``name``, unpacked once (with its ``stats/``) into
    ``.cache/llm_stacks-<hash>/<name>/`` (a temporary folder, then a rename); the archive is
    hashed once per test process."""
    import hashlib
    import lzma

    packed = LLM_STACKS / name / f"{name}.sqlite.xz"
    digest = hashlib.sha256(packed.read_bytes()).hexdigest()[:12]
    target = ROOT / ".cache" / f"llm_stacks-{digest}" / name

    def fill(tmp: Path) -> None:
        with lzma.open(packed) as src, open(tmp / f"{name}.sqlite", "wb") as dst:
            shutil.copyfileobj(src, dst)
        stats = LLM_STACKS / name / "stats.tar.xz"
        if stats.is_file():
            with tarfile.open(stats, "r:xz") as tar:
                tar.extractall(tmp, filter="data")

    _unpack_once(target, target / f"{name}.sqlite", fill)
    return target / f"{name}.sqlite"


#: Whole-run captures of programs as users run them (issue 36: data-parallel training, generate()
#: calls, a serving engine in-process and in a forked child, a compiled decode, microbenchmarks),
#: each ``<name>/<file>.sqlite.xz`` (two for per-rank captures) and ``stats.tar.xz``.
RUN_STRUCTURE = SAMPLES / "run_structure"


def run_capture_names() -> list[str]:
    """The bundled whole-run captures (folders of ``sample_traces/run_structure``)."""
    return sorted(p.name for p in RUN_STRUCTURE.iterdir() if any(p.glob("*.sqlite.xz")))


@functools.cache
def run_capture(name: str) -> Path:
    """The folder of capture ``name`` with its ``.sqlite`` files and ``stats/`` unpacked once
    into ``.cache/run_structure-<hash>/<name>/`` (a temporary folder, then a rename)."""
    import hashlib
    import lzma

    packed = sorted((RUN_STRUCTURE / name).glob("*.sqlite.xz"))
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in packed)).hexdigest()[:12]
    target = ROOT / ".cache" / f"run_structure-{digest}" / name

    def fill(tmp: Path) -> None:
        for p in packed:
            with lzma.open(p) as src, open(tmp / p.name[: -len(".xz")], "wb") as dst:
                shutil.copyfileobj(src, dst)
        with tarfile.open(RUN_STRUCTURE / name / "stats.tar.xz", "r:xz") as tar:
            tar.extractall(tmp, filter="data")

    _unpack_once(target, target / packed[-1].name[: -len(".xz")], fill)
    return target


def run_capture_log(name: str) -> list[dict]:  # type: ignore[type-arg]
    """The JSON lines the captured program printed (its own timings: the ground truth the
    tracekit reading is compared with), from ``profile_log.txt``."""
    import json

    out = []
    for line in (RUN_STRUCTURE / name / "profile_log.txt").read_text().splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


#: The generation zoo (issue 42): programs written as users write them, each printing its own
#: clock (``TRUTH {json}``), captured whole on an H200: ``zoo/generation/gNN_*.py`` and
#: ``zoo/generation/runs/<name>/`` (``<name>.sqlite.xz``, ``<name>.program.log``, ``command.txt``).
ZOO = SAMPLES / "zoo" / "generation"
#: Field captures of other programs with their truths (the team's ``../shared/field``; not
#: bundled: the tests that read them are skipped without it).
FIELD = ROOT.parent / "shared" / "field"


#: The training zoo (issue 43): ``zoo/training/tNN_*.py`` and ``zoo/training/runs/<name>/``.
TRAINING_ZOO = SAMPLES / "zoo" / "training"


def _zoo_folder(name: str) -> Path:
    return (TRAINING_ZOO if name.startswith("t") else ZOO) / "runs"


def zoo_capture_names(folder: Path = ZOO) -> list[str]:
    """The bundled zoo captures (folders of ``sample_traces/zoo/<generation|training>/runs``)."""
    return sorted(p.parent.name for p in (folder / "runs").glob("*/*.sqlite.xz"))


@functools.cache
def zoo_capture(name: str) -> Path:
    """The ``.sqlite`` of zoo capture ``name``, unpacked once into ``.cache/zoo-<hash>/``."""
    return _unpacked_xz(_zoo_folder(name) / name / f"{name}.sqlite.xz", "zoo")


def zoo_truth(name: str) -> dict:  # type: ignore[type-arg]
    """The ``TRUTH`` line the zoo program printed: its own clock (``clock.py`` / ``tclock.py``)."""
    import json

    for line in (_zoo_folder(name) / name / f"{name}.program.log").read_text().splitlines():
        if line.startswith("TRUTH "):
            return json.loads(line[len("TRUTH "):])  # type: ignore[no-any-return]
    raise AssertionError(f"{name}: the program printed no TRUTH line")


@functools.cache
def field_capture(name: str) -> Path:
    """The ``.sqlite`` of field capture ``name`` (``../shared/field/<name>.sqlite.xz``), unpacked
    once into ``.cache/field-<hash>/``; skips the test where the field folder is absent."""
    packed = FIELD / f"{name}.sqlite.xz"
    if not packed.is_file():
        pytest.skip(f"field capture {packed} not found (the team's ../shared/field is not beside this clone)")
    return _unpacked_xz(packed, "field")


#: The zoo under torch.profiler (issue 45): ``zoo/kineto/runs/<name>/`` (``<name>.pt.trace.json.xz``,
#: ``<name>.program.log`` with the program's own clock in the profiled run, ``command.txt``).
KINETO_ZOO = SAMPLES / "zoo" / "kineto"


def kineto_zoo_names() -> list[str]:
    """The bundled torch.profiler zoo captures."""
    return sorted(p.parent.name for p in (KINETO_ZOO / "runs").glob("*/*.pt.trace.json.xz"))


@functools.cache
def kineto_zoo_capture(name: str) -> Path:
    """The torch.profiler trace (JSON) of zoo program ``name``, unpacked once into ``.cache/``."""
    return _unpacked_xz(KINETO_ZOO / "runs" / name / f"{name}.pt.trace.json.xz", "kineto-zoo")


def kineto_zoo_truth(name: str) -> dict:  # type: ignore[type-arg]
    """The ``TRUTH`` line the program printed in its profiled run."""
    import json

    for line in (KINETO_ZOO / "runs" / name / f"{name}.program.log").read_text().splitlines():
        if line.startswith("TRUTH "):
            return json.loads(line[len("TRUTH "):])  # type: ignore[no-any-return]
    raise AssertionError(f"{name}: the program printed no TRUTH line")


#: The memory programs under torch.profiler (``profile_memory`` and a range per module).
KINETO_MEMORY = KINETO_ZOO / "memory"


@functools.cache
def kineto_memory_capture(name: str) -> Path:
    """The torch.profiler trace (JSON) of memory program ``name``, unpacked once into ``.cache/``."""
    return _unpacked_xz(KINETO_MEMORY / "runs" / name / f"{name}.pt.trace.json.xz", "kineto-memory")


def kineto_memory_truth(name: str) -> list[dict]:  # type: ignore[type-arg]
    """The ``LAYERMEM`` lines the memory program printed: its own allocator readings per layer call."""
    import json

    lines = (KINETO_MEMORY / "runs" / name / f"{name}.program.log").read_text().splitlines()
    return [json.loads(line[len("LAYERMEM "):]) for line in lines if line.startswith("LAYERMEM ")]


#: Two-GPU programs, each run under torch.profiler and under nsys per rank (issue 45):
#: ``zoo/ranks/runs/<name>/`` (``<name>.rank{0,1}.pt.trace.json.xz`` and ``.sqlite.xz``, the
#: programs' own clocks in ``<name>.kineto.log`` and ``<name>.nsys.log``).
RANKS_ZOO = SAMPLES / "zoo" / "ranks"


@functools.cache
def ranks_capture(name: str, source: str) -> Path:
    """A folder holding both ranks' traces of two-GPU program ``name`` from ``source``
    (``kineto``: ``.pt.trace.json``; ``nsys``: ``.sqlite``), unpacked once into ``.cache/``."""
    import hashlib
    import lzma

    ext = ".pt.trace.json.xz" if source == "kineto" else ".sqlite.xz"
    packed = sorted((RANKS_ZOO / "runs" / name).glob(f"{name}.rank*{ext}"))
    assert len(packed) == 2, packed
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in packed)).hexdigest()[:12]
    target = ROOT / ".cache" / f"ranks-{source}-{digest}"

    def fill(tmp: Path) -> None:
        for p in packed:
            with lzma.open(p) as src, open(tmp / p.name[: -len(".xz")], "wb") as dst:
                shutil.copyfileobj(src, dst)

    _unpack_once(target, target / packed[-1].name[: -len(".xz")], fill)
    return target


def ranks_truth(name: str, source: str) -> dict[int, dict]:  # type: ignore[type-arg]
    """The ``TRUTH`` line of each rank that program ``name`` printed in its ``source`` run."""
    import json

    out = {}
    for line in (RANKS_ZOO / "runs" / name / f"{name}.{source}.log").read_text().splitlines():
        if line.startswith("TRUTH "):
            truth = json.loads(line[len("TRUTH "):])
            out[int(truth["rank"])] = truth
    return out


def _unpacked_xz(packed: Path, kind: str) -> Path:
    import hashlib
    import lzma

    digest = hashlib.sha256(packed.read_bytes()).hexdigest()[:12]
    name = packed.name[: -len(".xz")]  # x.sqlite.xz → x.sqlite, x.pt.trace.json.xz → x.pt.trace.json
    target = ROOT / ".cache" / f"{kind}-{digest}"

    def fill(tmp: Path) -> None:
        with lzma.open(packed) as src, open(tmp / name, "wb") as dst:
            shutil.copyfileobj(src, dst)

    _unpack_once(target, target / name, fill)
    return target / name


def force_by_column(monkeypatch: pytest.MonkeyPatch, cache: Path) -> list:  # type: ignore[type-arg]
    """Make every export take the big-export path: read a column at a time from a real column
    cache (in ``cache``; small tables allowed in), names as integer codes; returns the list of
    the :class:`~tracekit.diagnosis.ops_by_column.OpsByColumn` made (a test can tell the path
    ran)."""
    from tracekit.diagnosis import context as context_mod
    from tracekit.diagnosis import ops_by_column as obc
    from tracekit.nsys import database

    made: list = []  # type: ignore[type-arg]
    monkeypatch.setattr(obc, "MIN_KERNELS", 0)
    monkeypatch.setattr(database, "CACHE_MIN_ROWS", 1)
    monkeypatch.setenv("TRACEKIT_CACHE", str(cache))
    monkeypatch.setenv("TRACEKIT_COLUMN_CACHE", "1")
    real = obc.by_column

    def recording(trace):  # type: ignore[no-untyped-def]
        got = real(trace)
        if got is not None:
            made.append(got)
        return got

    monkeypatch.setattr(context_mod, "by_column", recording)
    return made


@pytest.fixture(scope="session")
def corpus_dir() -> Path:
    if not NSYS_CORPUS.is_dir():
        pytest.skip(f"public corpus not found at {NSYS_CORPUS}")
    return NSYS_CORPUS


@pytest.fixture(scope="session")
def nsys_columnar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``tests/data/nsys_columnar.tar.xz`` unpacked once: ``memfusion_report1.{sqlite,parquetdir,
    arrowdir}`` exported by nsys 2023.4.4, with what ``nsys stats`` printed (tests/data/README.md).
    Read-only for tests: damage copies of it."""
    target = tmp_path_factory.mktemp("nsys_columnar")
    with tarfile.open(ROOT / "tests" / "data" / "nsys_columnar.tar.xz", "r:xz") as tar:
        tar.extractall(target, filter="data")
    return target / "nsys_columnar"


def union_ns(intervals: list[tuple[int, int]], lo: int | None = None, hi: int | None = None) -> int:
    """Length of the union of ``(start, end)`` intervals (ns), each clipped to ``[lo, hi]`` when
    given: the GPU's busy time computed by hand, to check tracekit's against."""
    total, cur_lo, cur_hi = 0, None, None
    for s, e in sorted(intervals):
        s, e = (s if lo is None else max(s, lo)), (e if hi is None else min(e, hi))
        if e <= s:
            continue
        if cur_hi is None or s > cur_hi:
            total += (cur_hi - cur_lo) if cur_hi is not None else 0  # type: ignore[operator]
            cur_lo, cur_hi = s, e
        else:
            cur_hi = max(cur_hi, e)
    return total + ((cur_hi - cur_lo) if cur_hi is not None else 0)  # type: ignore[operator]
