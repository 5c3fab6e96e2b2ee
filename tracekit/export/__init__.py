"""Timeline exports: a trace (or a set of per-rank traces) written as a Perfetto protobuf trace or
as Chrome trace-event JSON, for ui.perfetto.dev and chrome://tracing (docs/export.md)."""

from __future__ import annotations

from tracekit.export.chrome_json import chrome_json
from tracekit.export.events import DEFAULT_METRICS, ExportSummary, build_model, parse_window
from tracekit.export.perfetto import perfetto
from tracekit.export.readback import kernel_tracks, perfetto_slices, slice_arguments

__all__ = ["DEFAULT_METRICS", "ExportSummary", "build_model", "chrome_json", "kernel_tracks", "parse_window", "perfetto",
           "perfetto_slices", "slice_arguments"]
