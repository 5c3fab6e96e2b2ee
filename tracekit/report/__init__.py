"""The HTML report: one self-contained, offline file with the tables and charts of a trace.

:func:`build_report` returns the HTML; :func:`write_report` opens the files and writes it
(what ``tracekit report`` runs).
"""

from __future__ import annotations

from tracekit.report.html import build_report, write_report

__all__ = ["build_report", "write_report"]
