"""NVTX ranges per PyTorch module, named by module path, for a profiler to see.

``tracekit.torch.annotate(model, depth=3)`` puts forward (and, with ``backward=True``,
backward) hooks on ``model``'s submodules that push an NVTX range named by the module's path
(``model.layers.3.self_attn``) and pop it when the module returns; the result is removable and
a context manager. ``tracekit capture nsys --annotate-torch[=DEPTH] -- python3 script.py``
does the same for an unmodified script (``docs/capture.md``, "Per-module NVTX ranges").

Imports only the standard library and ``torch``: usable where the workload runs, without
polars.
"""

from __future__ import annotations

from tracekit.capture.torch_nvtx import (
    DEFAULT_DEPTH,
    Annotation,
    AnnotationConfig,
    annotate,
    annotated,
    install_global,
    module_level,
)

__all__ = ["DEFAULT_DEPTH", "Annotation", "AnnotationConfig", "annotate", "annotated", "install_global", "module_level"]
