"""PyTorch operators with their GPU time, shapes, FLOPs and bytes, against the GPU's roofline.

A torch.profiler trace records each CPU operator (``aten::mm`` with its input dims and dtypes
when ``record_shapes=True``) and links the launches it made to the kernels they ran (the
operator's ``External id`` on the runtime call, the call's correlation id on the kernel: the
trace's ``flows`` table). :func:`operator_costs` gives every operator instance that launched GPU
work its kernels' time, and, for the matrix products, attention and convolutions, the FLOPs
and the bytes its inputs and output must move at least once:

* ``aten::mm`` ``[M, K] @ [K, N]``: 2·M·K·N FLOPs; ``aten::addmm`` the same plus M·N for the
  bias; ``aten::bmm``/``aten::baddbmm`` ``[B, M, K] @ [B, K, N]``: 2·B·M·K·N; bytes = (inputs +
  output) × element size.
* scaled-dot-product attention (``aten::_scaled_dot_product_{flash,efficient,cudnn}_attention``,
  ``aten::_flash_attention_forward``, …) on ``q [B, H, L, D]``, ``k``/``v [B, H, S, D]``:
  4·B·H·L·S·D FLOPs (Q·Kᵀ and P·V; a causal mask's skipped half is counted, as FLOP counters
  do); its ``…_backward``: 2.5 × that (dQ, dK, dV, dP and the recomputed scores); bytes = q, k,
  v and the output (the backward: twice that).
* ``aten::convolution``/``aten::_convolution``/``aten::cudnn_convolution`` on ``x [N, C, H, W]``,
  ``w [O, C/g, kh, kw]``: 2·N·O·(C/g)·kh·kw·Ho·Wo, the output size from the recorded stride,
  padding and dilation (when recorded).

Other operators get their GPU time, no FLOPs, and as bytes what their tensor inputs hold
(each read at least once; outputs not counted), which makes them ``memory-bound`` against the
bandwidth peak. An operator may touch only part of an input (vLLM's ``reshape_and_cache``
writes a few tokens into the whole KV cache it is given): where those bytes would need more
than the GPU's bandwidth peak, the operator gets no bytes, rate, verdict or share of peak
(on a GPU whose peak tracekit does not know, such as AMD's, its rate stays unchecked).
Composite operators (``aten::linear``, ``aten::matmul``) launch nothing themselves: their
``aten::mm``/``addmm`` do, and are counted there. Achieved rates are per operator instance: FLOPs ÷ its kernels' time (``tflops``), bytes
÷ that time (``tbps``). The verdict compares the operator's arithmetic intensity (FLOPs per
byte) with the GPU's ridge point (peak FLOP/s ÷ peak bytes/s of the GPU's spec,
:mod:`tracekit.ncu.specs`, for the operator's dtype): above it ``compute-bound`` and ``pct_of_peak`` is of the FLOP/s peak,
below it ``memory-bound`` and of the bandwidth peak.
"""

from __future__ import annotations

import json
import re
from typing import Any

import polars as pl

__all__ = ["ELEMENT_BYTES", "op_cost_summary", "operator_costs", "operator_flops", "trace_operator_costs"]

#: Bytes per element of the dtypes torch.profiler records.
ELEMENT_BYTES = {"c10::BFloat16": 2, "c10::Half": 2, "float": 4, "double": 8, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
                 "int": 4, "long int": 8, "signed char": 1, "unsigned char": 1, "bool": 1, "short int": 2}
#: The peaks' dtype key for an operator's first input dtype.
_PEAK_DTYPE = {"c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32", "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8"}

_MM = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm"}
_ATTENTION = re.compile(r"^aten::_(?:scaled_dot_product_)?(?:flash|efficient|cudnn)_attention(?:_forward)?(?:_backward)?$")
_CONV = {"aten::convolution", "aten::_convolution", "aten::cudnn_convolution", "aten::conv2d"}


def _prod(xs: list[int]) -> int:
    out = 1
    for x in xs:
        out *= int(x)
    return out


def _json(text: str | None) -> list[Any]:
    if not text:
        return []
    try:
        value = json.loads(text)
    except ValueError:
        return []
    return value if isinstance(value, list) else []


def _size(dims: list[Any], types: list[Any], idx: int) -> int:
    if idx >= len(dims) or not isinstance(dims[idx], list) or not dims[idx]:
        return 0
    t = types[idx] if idx < len(types) else None
    return _prod(dims[idx]) * ELEMENT_BYTES.get(str(t), 2)


def operator_flops(name: str, input_dims: str | None, input_types: str | None,
                   concrete_inputs: str | None = None) -> tuple[float | None, float | None]:
    """``(flops, bytes)`` of one operator call from its name and recorded inputs (JSON text as
    torch.profiler writes them: ``[[2048, 512], [512, 512]]``); ``(None, None)`` for operators
    without a formula or without shapes (see the module doc)."""
    dims, types = _json(input_dims), _json(input_types)
    if not dims:
        return None, None
    try:
        if name in _MM:
            a_i, b_i = (1, 2) if name in ("aten::addmm", "aten::baddbmm") else (0, 1)
            a, b = dims[a_i], dims[b_i]
            if name in ("aten::bmm", "aten::baddbmm"):
                bsz, m, k = a
                n = b[2]
                flops = 2.0 * bsz * m * k * n
                out = bsz * m * n
            else:
                m, k = a[-2], a[-1]
                n = b[-1]
                flops = 2.0 * m * k * n + (m * n if name == "aten::addmm" else 0)
                out = m * n
            el = ELEMENT_BYTES.get(str(types[a_i]) if a_i < len(types) else "", 2)
            moved = _size(dims, types, a_i) + _size(dims, types, b_i) + out * el + (_size(dims, types, 0) if a_i == 1 else 0)
            return flops, float(moved)
        if _ATTENTION.match(name):
            q, k = dims[0], dims[1]
            if len(q) != 4 or len(k) != 4:
                return None, None
            bsz, heads, lq, d = q
            s = k[2]
            flops = 4.0 * bsz * heads * lq * s * d
            moved = _size(dims, types, 0) + _size(dims, types, 1) + _size(dims, types, 2) + _size(dims, types, 0)
            if name.endswith("_backward"):
                return 2.5 * flops, 2.0 * moved
            return flops, float(moved)
        if name in _CONV:
            x, w = dims[0], dims[1]
            if len(x) != 4 or len(w) != 4:
                return None, None
            conc = _json(concrete_inputs)
            # cudnn_convolution(self, weight, padding, stride, dilation, …); the others
            # (input, weight, bias, stride, padding, dilation, …)
            at = (3, 2, 4) if name == "aten::cudnn_convolution" else (3, 4, 5)
            stride, pad, dil = _conv_args(conc, at)
            n, _c, h, wd = x
            o, cg, kh, kw = w
            ho = (h + 2 * pad[0] - dil[0] * (kh - 1) - 1) // stride[0] + 1
            wo = (wd + 2 * pad[1] - dil[1] * (kw - 1) - 1) // stride[1] + 1
            flops = 2.0 * n * o * cg * kh * kw * ho * wo
            el = ELEMENT_BYTES.get(str(types[0]) if types else "", 2)
            return flops, float(_size(dims, types, 0) + _size(dims, types, 1) + n * o * ho * wo * el)
    except (TypeError, ValueError, IndexError):
        return None, None
    # no arithmetic formula: the bytes its tensor inputs must be read at least once
    moved = sum(_size(dims, types, i) for i in range(len(dims)) if isinstance(dims[i], list) and dims[i]
                and all(isinstance(x, int) for x in dims[i]))
    return None, (float(moved) if moved else None)


def _conv_args(conc: list[Any], at: tuple[int, int, int]) -> tuple[list[int], list[int], list[int]]:
    """Stride, padding and dilation from a convolution's concrete inputs (as recorded: strings
    such as ``"[1, 1]"``) at positions ``at``, else 1, 0, 1."""
    def pair(i: int, default: int) -> list[int]:
        if i < len(conc) and conc[i] not in ("", None):
            try:
                v = json.loads(conc[i]) if isinstance(conc[i], str) else conc[i]
                v = v if isinstance(v, list) else [v]
                return [int(v[0]), int(v[-1])]
            except (ValueError, TypeError, IndexError):
                pass
        return [default, default]
    return pair(at[0], 1), pair(at[1], 0), pair(at[2], 1)


def operator_costs(cpu_ops: pl.DataFrame, flows: pl.DataFrame, kernels: pl.DataFrame, *,
                   peaks: dict[str, tuple[float | None, float | None]] | None = None) -> pl.DataFrame:
    """Every operator instance that launched kernels, with their time, FLOPs, bytes and verdict.

    Parameters
    ----------
    cpu_ops
        A torch.profiler trace's ``cpu_ops`` (``name``, ``pid``, ``tid``, ``start_ns``,
        ``duration_ns``, ``external_id``, ``input_dims``, ``input_types``,
        ``concrete_inputs``; ``module_hierarchy`` when recorded).
    flows
        Its ``flows`` (``kind``, ``external_id``, ``correlation_id``, ``device_id``).
    kernels
        Its ``kernels`` (``correlation_id``, ``device_id``, ``duration_ns``).
    peaks
        Per dtype key (``bf16``, ``fp16``, ``fp32``, ``fp8``) the GPU's ``(FLOP/s, bytes/s)``
        (:func:`tracekit.model.costs.peaks`); without it no verdict.

    Returns
    -------
    One row per operator instance: ``name``, ``pid``, ``tid``, ``start_ns``, ``cpu_ns``,
    ``external_id``, ``input_dims``, ``input_types``, ``module`` (the module hierarchy, when
    recorded), ``device_id``, ``kernels``, ``gpu_ns`` (its kernels' durations summed), ``flops``,
    ``bytes``, ``intensity`` (FLOPs per byte), ``tflops``, ``tbps``, ``bound``
    (``compute-bound``/``memory-bound``) and ``pct_of_peak`` (0–1), in start order.
    """
    empty = {"name": pl.Utf8, "pid": pl.Int64, "tid": pl.Int64, "start_ns": pl.Int64, "cpu_ns": pl.Int64, "external_id": pl.Int64,
             "input_dims": pl.Utf8, "input_types": pl.Utf8, "module": pl.Utf8, "device_id": pl.Int64, "kernels": pl.Int64,
             "gpu_ns": pl.Int64, "flops": pl.Float64, "bytes": pl.Float64, "intensity": pl.Float64, "tflops": pl.Float64,
             "tbps": pl.Float64, "bound": pl.Utf8, "pct_of_peak": pl.Float64}
    if cpu_ops.height == 0 or flows.height == 0 or kernels.height == 0:
        return pl.DataFrame(schema=empty)
    k = flows.filter(pl.col("kind") == "kernel").select("external_id", "correlation_id", "device_id").join(
        kernels.select("correlation_id", "device_id", "duration_ns"), on=["correlation_id", "device_id"], how="inner")
    per = k.group_by("external_id").agg(pl.col("device_id").first(), pl.len().cast(pl.Int64).alias("kernels"),
                                        pl.col("duration_ns").sum().cast(pl.Int64).alias("gpu_ns"))
    cols = [c for c in ("concrete_inputs", "module_hierarchy") if c in cpu_ops.columns]
    ops = cpu_ops.filter(pl.col("external_id").is_not_null()).select(
        "name", "pid", "tid", "start_ns", pl.col("duration_ns").alias("cpu_ns"), "external_id", "input_dims", "input_types", *cols)
    # an External id is shared by nested ops on some PyTorch versions: the innermost (latest
    # start) holds the launch
    ops = ops.sort("start_ns").unique(subset=["external_id"], keep="last")
    out = ops.join(per, on="external_id", how="inner").sort("start_ns")
    conc = out["concrete_inputs"] if "concrete_inputs" in out.columns else pl.Series([None] * out.height, dtype=pl.Utf8)
    fb = [operator_flops(n, d, t, c) for n, d, t, c in zip(out["name"], out["input_dims"], out["input_types"], conc, strict=True)]
    out = out.with_columns(pl.Series("flops", [f for f, _ in fb], dtype=pl.Float64), pl.Series("bytes", [b for _, b in fb], dtype=pl.Float64),
                           (pl.col("module_hierarchy") if "module_hierarchy" in out.columns else pl.lit(None, pl.Utf8)).alias("module"))
    out = out.with_columns((pl.col("flops") / pl.col("bytes")).alias("intensity"),
                           (pl.col("flops") / pl.col("gpu_ns") / 1e3).alias("tflops"),
                           (pl.col("bytes") / pl.col("gpu_ns") / 1e3).alias("tbps"))
    first_type = out["input_types"].map_elements(lambda t: str((_json(t) or [None])[0]), return_dtype=pl.Utf8)
    key = first_type.replace_strict(_PEAK_DTYPE, default="bf16", return_dtype=pl.Utf8)
    pf = key.replace_strict({d: (v[0] or 0.0) for d, v in (peaks or {}).items()}, default=None, return_dtype=pl.Float64)
    pb = key.replace_strict({d: (v[1] or 0.0) for d, v in (peaks or {}).items()}, default=None, return_dtype=pl.Float64)
    out = out.with_columns(pf.alias("_pf"), pb.alias("_pb")).with_columns(
        pl.when(pl.col("_pf").is_null() | (pl.col("_pf") == 0) | pl.col("bytes").is_null()).then(None)
        .when(pl.col("flops").is_null()).then(pl.lit("memory-bound"))
        .when(pl.col("intensity") >= pl.col("_pf") / pl.col("_pb")).then(pl.lit("compute-bound")).otherwise(pl.lit("memory-bound")).alias("bound"))
    out = out.with_columns(
        pl.when(pl.col("bound") == "compute-bound").then(pl.col("tflops") * 1e12 / pl.col("_pf"))
        .when(pl.col("bound") == "memory-bound").then(pl.col("tbps") * 1e12 / pl.col("_pb")).otherwise(None).alias("pct_of_peak"))
    # an operator without a FLOP count whose inputs' bytes would take more than the GPU's
    # bandwidth touched only part of them (vLLM's reshape_and_cache writes a few tokens into the
    # whole KV cache it is given): its bytes are no estimate, so it gets none
    guess = pl.col("flops").is_null() & (pl.col("pct_of_peak") > 1)
    out = out.with_columns(*(pl.when(guess).then(None).otherwise(pl.col(c)).alias(c)
                             for c in ("bytes", "intensity", "tbps", "bound", "pct_of_peak")))
    return out.select(list(empty))


def op_cost_summary(costs: pl.DataFrame, *, by: tuple[str, ...] = ("name", "input_dims")) -> pl.DataFrame:
    """:func:`operator_costs` per ``by`` (name and shapes by default; ``("module",)`` per module,
    ``("step",)`` after joining steps): ``calls``, ``gpu_ns`` (total), ``flops``, ``bytes``,
    ``tflops``/``tbps`` (totals over total time), ``share`` of the GPU time, the verdict of the
    largest share of its time, and ``pct_of_peak`` (time-weighted); most GPU time first."""
    if costs.height == 0:
        return pl.DataFrame()
    total = int(costs["gpu_ns"].sum() or 0)
    return costs.group_by(list(by)).agg(
        pl.len().cast(pl.Int64).alias("calls"), pl.col("gpu_ns").sum().alias("gpu_ns"),
        pl.when(pl.col("flops").count() > 0).then(pl.col("flops").sum()).alias("flops"),
        pl.when(pl.col("bytes").count() > 0).then(pl.col("bytes").sum()).alias("bytes"),
        pl.when(pl.col("flops").count() > 0).then(pl.col("flops").sum() / pl.col("gpu_ns").filter(pl.col("flops").is_not_null()).sum() / 1e3)
        .alias("tflops"),
        pl.when(pl.col("bytes").count() > 0).then(pl.col("bytes").sum() / pl.col("gpu_ns").filter(pl.col("bytes").is_not_null()).sum() / 1e3)
        .alias("tbps"),
        pl.col("bound").filter(pl.col("bound").is_not_null()).mode().first().alias("bound"),
        pl.when(pl.col("pct_of_peak").count() > 0).then(
            (pl.col("pct_of_peak") * pl.col("gpu_ns")).sum() / pl.col("gpu_ns").filter(pl.col("pct_of_peak").is_not_null()).sum())
        .alias("pct_of_peak"),
    ).with_columns((pl.col("gpu_ns") / total if total else pl.lit(None, pl.Float64)).alias("share")).sort("gpu_ns", descending=True)


def trace_operator_costs(trace: Any) -> pl.DataFrame:
    """:func:`operator_costs` of a torch.profiler trace (``KinetoTrace.operators``), with the
    peaks of the trace's GPU (its spec by name and memory, :func:`tracekit.ncu.specs.dense_peaks`,
    as the model's peaks); an nsys export has no CPU
    operators with shapes (``docs/kineto.md``): an empty frame."""
    from tracekit.ncu.specs import dense_peaks, find_spec

    cpu_ops = getattr(trace, "cpu_ops", None)
    if not isinstance(cpu_ops, pl.DataFrame):
        return operator_costs(pl.DataFrame(), pl.DataFrame(), pl.DataFrame())
    gpus = getattr(trace, "gpus", pl.DataFrame())
    row = gpus.row(0, named=True) if gpus.height else {}
    spec = find_spec(row.get("name"), row.get("total_memory_bytes")) if row else None
    found: dict[str, tuple[float | None, float | None]] | None = (
        {d: dense_peaks(spec, d) for d in ("bf16", "fp16", "fp32", "fp8")} if spec is not None else None)
    return operator_costs(cpu_ops, trace.flows, trace.kernels, peaks=found)


def _register() -> None:
    from tracekit.nsys.trace import DERIVED_TABLES

    DERIVED_TABLES["operators"] = trace_operator_costs


_register()
