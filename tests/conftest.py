"""Shared fixtures: where the bundled sample traces and the public corpus live."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
CORPUS = ROOT.parent / "shared" / "corpus"
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


@pytest.fixture(scope="session")
def corpus_dir() -> Path:
    if not NSYS_CORPUS.is_dir():
        pytest.skip(f"public corpus not found at {NSYS_CORPUS}")
    return NSYS_CORPUS
