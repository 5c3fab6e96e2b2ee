"""The theoretical model: FLOPs, bytes and the roofline minimum of a transformer step, and how
far a trace's layers are from it (docs/model.md)."""

from __future__ import annotations

from tracekit.model.compare import compare
from tracekit.model.config import DTYPE_BYTES, TransformerConfig, load_model
from tracekit.model.costs import model_costs, model_summary, peaks

__all__ = ["DTYPE_BYTES", "TransformerConfig", "compare", "load_model", "model_costs", "model_summary", "peaks"]
