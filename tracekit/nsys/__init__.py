"""Nsight Systems: SQLite exports → tidy polars tables, and nsys-stats-compatible reports.

Entry point: :class:`tracekit.nsys.trace.NsysTrace` (usually through :func:`tracekit.open`).
"""
