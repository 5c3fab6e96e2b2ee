"""What a view needs, what a trace lacks, and the one line that says so.

A chart with no data is never drawn empty (or, in Vega, infinitely wide): it becomes a
*message chart* — one line of text saying what is missing and how to capture it, marked in
the spec's ``usermeta`` so that :func:`tracekit.viz.save` refuses to write it as a figure.
A table with no rows is shown as a :class:`Note` with the same line.
"""

from __future__ import annotations

import html
from typing import Any

import polars as pl

#: What is missing → how to capture it (one line each; the views and notebooks quote them).
CAPTURE_HINTS: dict[str, str] = {
    "kernels": "no GPU kernels in the trace: the GPU work ran in a process nsys did not follow "
    "(capture with nsys profile --trace=cuda --trace-fork-before-exec=true)",
    "gpu_metrics": "no GPU metrics in the trace (capture with nsys profile --gpu-metrics-devices=all)",
    "memory_usage": "no CUDA memory events in the trace (capture with nsys profile --cuda-memory-usage=true)",
    "nvtx": "no NVTX ranges in the trace (annotate the program: tracekit capture nsys --annotate-torch, "
    "or torch.cuda.nvtx.range; capture with --trace=cuda,nvtx)",
    "nccl": "no NCCL calls in the trace (a multi-GPU run captured with nsys profile --trace=cuda,nvtx: "
    "NCCL marks its calls with NVTX)",
    "nccl_sizes": "the NCCL calls carry no message sizes (export with nsys export --type=sqlite "
    "--include-blobs=true, NCCL 2.19 or later)",
    "cuda_api": "no CUDA API calls in the trace (capture with nsys profile --trace=cuda)",
    "layers": "no NVTX layer ranges (layer.N, model.layers.N …) around GPU work (capture with "
    "tracekit capture nsys --annotate-torch, or name ranges layer.0, layer.1 …)",
    "iterations": "no iterations found (no NVTX step ranges and no repeating kernel sequence)",
    "ranks": "no per-rank reports in the folder (capture with tracekit capture nsys --preset torchrun)",
    "ncu": "no Nsight Compute report (profile kernels with tracekit capture ncu --preset kernel-drilldown)",
    "roofline": "no kernel with FLOP and DRAM counters in the Nsight Compute report (profile with "
    "ncu --section SpeedOfLight_RooflineChart: tracekit capture ncu --preset kernel-drilldown)",
}

#: The same for a torch.profiler (Kineto) trace, where the nsys options do not apply.
TORCH_PROFILER_HINTS: dict[str, str] = {
    "memory_usage": "no memory events in the trace (profile with torch.profiler.profile(profile_memory=True): "
    "tracekit capture torch --profile-memory)",
    "nvtx": "no record_function ranges in the trace (tracekit capture torch --annotate-torch ranges every module, "
    "or torch.profiler.record_function)",
    "layers": "no layer ranges (layer.N, model.layers.N …) around GPU work (capture with tracekit capture torch "
    "--annotate-torch, or record_function ranges named layer.0, layer.1 …)",
    "gpu_metrics": "torch.profiler records no GPU metrics (capture the program with nsys: tracekit capture nsys "
    "--gpu-metrics-devices=all)",
    "cuda_api": "no CUDA runtime calls in the trace (profile with activities=[ProfilerActivity.CPU, "
    "ProfilerActivity.CUDA])",
}

#: The prefix of a message chart's ``description`` (a property every view may have, so the
#: mark survives concatenation, where a top-level ``usermeta`` would not be valid).
MESSAGE_KEY = "tracekit_missing: "


def hint(what: str, trace: Any = None) -> str:
    """The line for ``what`` (a key of :data:`CAPTURE_HINTS`, or of
    :data:`TORCH_PROFILER_HINTS` for a ``trace`` that torch.profiler recorded), or ``what``
    itself."""
    if getattr(trace, "profiler", None) == "torch.profiler" and what in TORCH_PROFILER_HINTS:
        return TORCH_PROFILER_HINTS[what]
    return CAPTURE_HINTS.get(what, what)


def _rows(trace: Any, table: str) -> int:
    try:
        frame = getattr(trace, table)
    except Exception:  # a table that cannot be read is missing for the view
        return 0
    return frame.height if isinstance(frame, pl.DataFrame) else 0


def missing(trace: Any, *needs: str) -> str | None:
    """The first of ``needs`` (table names: ``kernels``, ``gpu_metrics``, ``memory_usage``,
    ``nvtx``, ``nccl``, ``cuda_api``) the trace has no rows of, as its one line; ``None`` when
    it has them all. GPU work counts CUDA graph replays traced whole as kernels."""
    for need in needs:
        if need == "kernels":
            from tracekit.analysis.graphs import graph_trace_of, whole_graphs

            if _rows(trace, "kernels") == 0 and whole_graphs(graph_trace_of(trace)) is None:
                return hint("kernels", trace)
        elif _rows(trace, need) == 0:
            return hint(need, trace)
    return None


class Note:
    """One line shown in a notebook instead of an empty table or chart (``_repr_html_``: an
    italic paragraph; ``str``: the line)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text

    __str__ = __repr__

    def _repr_html_(self) -> str:
        return f'<p class="tk-note" style="font-style:italic;color:#444">{html.escape(self.text)}</p>'


def shown(frame: pl.DataFrame, why: str) -> pl.DataFrame | Note:
    """``frame`` when it has rows, else a :class:`Note` with ``why`` (a
    :data:`CAPTURE_HINTS` key or a sentence)."""
    return frame if frame.height else Note(hint(why))


def message_chart(text: str, *, width: int = 480, title: str | None = None) -> Any:
    """A chart that shows one line of text (what is missing and how to capture it) instead of
    an empty frame; :func:`message_of` reads the line back, :func:`tracekit.viz.save`
    refuses to write it."""
    from tracekit.viz._deps import import_altair

    alt = import_altair()
    text = hint(text)
    chart = (
        alt.Chart(pl.DataFrame({"text": [text]}))
        .mark_text(align="left", baseline="middle", fontStyle="italic", color="#555555", limit=0, lineBreak="\n")
        .encode(x=alt.value(0), y=alt.value(12), text="text:N")
        .properties(width=width, height=24, description=MESSAGE_KEY + text)
    )
    return chart.properties(title=title) if title else chart


def message_of(chart: Any) -> str | None:
    """The line of a :func:`message_chart` (also of a layer or concatenation made of message
    charts only), else ``None``."""
    if chart is None:
        return None
    if isinstance(chart, dict):
        spec = chart
    else:
        try:
            spec = chart.to_dict(validate=False)
        except Exception:
            return None

    def lines(node: Any) -> list[str | None]:
        if not isinstance(node, dict):
            return [None]
        parts = [p for key in ("layer", "hconcat", "vconcat", "concat") for p in node.get(key, [])]
        if "spec" in node:
            parts.append(node["spec"])
        if parts:
            return [line for p in parts for line in lines(p)]
        text = node.get("description")
        return [text[len(MESSAGE_KEY):] if isinstance(text, str) and text.startswith(MESSAGE_KEY) else None]

    found = lines(spec)
    return "; ".join(dict.fromkeys(str(f) for f in found)) if found and all(found) else None


def quietly(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, str | None]:
    """``fn(*args, **kwargs)`` with the :class:`~tracekit.errors.EmptyResultWarning` it raises
    caught: ``(result, the warning's line)``, or ``(result, None)`` when it warned of nothing.
    A notebook then shows the line with the empty result (:func:`shown`) instead of a warning
    on stderr."""
    import warnings

    from tracekit.errors import EmptyResultWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", EmptyResultWarning)
        result = fn(*args, **kwargs)
    lines = [str(w.message) for w in caught if issubclass(w.category, EmptyResultWarning)]
    for w in caught:  # any other warning goes on as it came
        if not issubclass(w.category, EmptyResultWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return result, (lines[0] if lines else None)
