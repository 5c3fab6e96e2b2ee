"""docs/tables_ncu.md documents every column of every NcuReport table."""

from __future__ import annotations

from pathlib import Path

from tracekit.ncu import schema

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_every_ncu_column_is_documented() -> None:
    doc = (DOCS / "tables_ncu.md").read_text()
    assert f"Schema version: {schema.SCHEMA_VERSION}" in doc
    tables = {
        "kernels": schema.KERNELS,
        "metrics": schema.METRICS,
        "instances": schema.INSTANCES,
        "rules": schema.RULES,
        "devices": schema.DEVICES_LEADING,
    }
    for table, columns in tables.items():
        assert f"## `{table}`" in doc, table
        section = doc.split(f"## `{table}`", 1)[1].split("\n## ", 1)[0]
        for column in columns:
            assert f"`{column}`" in section, f"{table}.{column} undocumented"


def test_views_document_their_metric_names() -> None:
    doc = (DOCS / "ncu.md").read_text()
    for name in (
        "sm__pipe_tensor_cycles_active_v2",
        "sm__pipe_tc_cycles_active",
        "sm__ops_path_tensor_src",
        "dram__bytes.sum.peak_sustained",
        "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
        "sm__warps_active.avg.pct_of_peak_sustained_active",
        "smsp__sass_thread_inst_executed_op_<op>_pred_on.sum",
    ):
        assert name in doc, name
