"""The notebooks: committed without outputs, parameterised, and executed top to bottom."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ROOT, SAMPLES

nbformat = pytest.importorskip("nbformat", reason="needs nbformat/nbclient (dev group)")
pytest.importorskip("nbclient", reason="needs nbclient (dev group)")

pytestmark = [
    pytest.mark.notebook,
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
]

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
EXPECTED = [
    "01_capture",
    "02_overview",
    "03_kernel_drilldown",
    "04_multi_gpu_nccl",
    "05_compare",
    "06_paper_figures",
    "07_diagnose",
    "08_memory",
    "09_export_perfetto",
]


def test_the_notebooks_exist() -> None:
    assert [p.stem for p in NOTEBOOKS] == EXPECTED


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_clean_and_parameterised(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code), (
        "commit notebooks without outputs"
    )
    tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and tagged[0] is code[0], (
        "the first code cell is the one tagged 'parameters'"
    )
    assert len(code) <= 8, "keep notebooks short: they call the library"
    assert "sample_traces" in tagged[0].source or path.stem == "01_capture"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path: Path, tmp_path: Path) -> None:
    from nbclient import NotebookClient

    if not (SAMPLES / "llm_decode_1gpu").is_dir():
        pytest.skip("sample traces missing")
    if "drilldown" in path.stem or "paper" in path.stem:
        pytest.importorskip("ncu_report", reason="needs the ncu extra")
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
