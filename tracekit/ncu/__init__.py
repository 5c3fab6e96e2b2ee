"""Nsight Compute reports (``.ncu-rep`` via ``ncu_report``, or ncu's raw CSV) as polars tables.

Also the metric-name registry per architecture and the fallback GPU peak table.
"""

from __future__ import annotations

from tracekit.ncu.report import (
    DamagedReportWarning,
    IncompleteReportWarning,
    NcuReport,
    is_ncu_report,
)

__all__ = ["DamagedReportWarning", "IncompleteReportWarning", "NcuReport", "is_ncu_report"]
