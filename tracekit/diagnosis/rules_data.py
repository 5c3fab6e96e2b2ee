"""The ``data_movement`` rule: copy, concat, cast and layout kernels that take a large share
of the GPU's time (``tracekit.analysis.data_movement``).

Time at stake is in the rule's docstring and in docs/diagnose.md.
"""

from __future__ import annotations

import re

import polars as pl

from tracekit.analysis.data_movement import data_movement, large_pointwise
from tracekit.diagnosis.context import Context
from tracekit.diagnosis.result import Finding
from tracekit.diagnosis.rules_host import _cmd

__all__ = ["DATA_RULES", "REMOVABLE_KINDS", "data_movement_rule"]

#: Kinds whose time a change of code removes (a static KV cache instead of ``torch.cat``,
#: fused casts and layouts); index writes and fills stay (they are the cheap alternative).
REMOVABLE_KINDS: tuple[str, ...] = ("inplace_copy", "concat", "dtype_cast", "layout", "memcpy", "large_pointwise")

_ADVICE = {
    "inplace_copy": "a compiled step that writes a tensor it was given through copy_ (a KV cache updated as "
    "cache.copy_(torch.where(pos == positions, new, cache)), JAX-style) rewrites the whole tensor every call: write only "
    "the new position (cache.index_copy_(2, pos, new), cache[:, :, pos] = new), which Inductor keeps in place, or keep "
    "the cache a module buffer",
    "large_pointwise": "a pointwise kernel that outlasts the step's matrix products moves more memory than the weights "
    "(a cache or a buffer rewritten whole each token): find which tensor it writes (ncu's DRAM bytes, or the fused op "
    "names) and write only what changes",
    "concat": "torch.cat copies all of its inputs: a KV cache grown with it (Hugging Face's default DynamicCache) is "
    "re-copied whole every step — preallocate it and write each token in place (generate(..., "
    "cache_implementation='static'), a paged cache as in vLLM/SGLang, or index_copy_ into a buffer allocated once); small "
    "concatenations (RoPE's rotate_half) fuse away under torch.compile",
    "dtype_cast": "casts around the math (fp32 up-casts in RMSNorm/softmax, bf16↔fp32 glue): use fused kernels that read "
    "bf16 and accumulate in fp32 inside (fused RMSNorm, torch.compile), keep tensors in one dtype",
    "layout": ".contiguous()/transpose/clone copies: fuse layout changes into the kernels that consume them "
    "(torch.compile), or produce the layout the next kernel wants",
    "memcpy": "device-to-device copies of whole tensors (tensor.copy_, clones fed back into a compiled step): keep buffers "
    "the compiler treats as static (module buffers, torch._dynamo.mark_static_address) and write into them in place",
}


#: The same kinds' advice for a run that keeps no KV cache (training, a model run over and
#: over): the copies are the step's own tensors, not a cache.
_ADVICE_NO_CACHE = {
    "inplace_copy": "a compiled step that writes a tensor it was given through copy_ rewrites the whole tensor every "
    "call: write only what changes (index_copy_, a slice assignment), which Inductor keeps in place, or keep the tensor a "
    "module buffer",
    "concat": "torch.cat copies all of its inputs every step: build the tensor once in a preallocated buffer (write the "
    "parts into slices of it), or let torch.compile fuse the concatenation into the kernel that reads it",
    "large_pointwise": "a pointwise kernel that outlasts the step's matrix products moves more memory than the math "
    "needs: find which tensor it writes (ncu's DRAM bytes, or the fused op names) and fuse it into its neighbours "
    "(torch.compile) or write only what changes",
}


def data_movement_rule(ctx: Context) -> list[Finding]:
    """``data_movement``: on the GPU where it is largest, operations that only move data
    (:func:`~tracekit.analysis.data_movement.data_movement`: copy-family kernels, Inductor
    kernels that fuse only data movement, device-to-device memcpys, memsets) take at least
    ``data_movement_share`` of the window's GPU time (summed durations of its kernels,
    device-side copies, memsets and whole-graph replays, whose kernels are unseen).

    ``time_ns`` = the window's time in the removable kinds (:data:`REMOVABLE_KINDS`: concat,
    dtype_cast, layout, device-to-device memcpy, Inductor in-place ``copy_`` kernels, and — in a
    generation or a server — pointwise kernels far longer than the step's matrix products,
    :func:`~tracekit.analysis.data_movement.large_pointwise`): what a preallocated cache, fused
    casts and writes of only what changed take off the GPU. ``share`` is of the window, as for every rule; the title
    gives the share of GPU time too. Severity follows the share of the window, but a finding
    is kept (as ``low``) whenever the GPU share passes the threshold: once a host-bound loop is
    fixed (CUDA graphs), the copies are what is left."""
    ops = ctx.ops_w
    if ops.height == 0 or "name" not in ops.columns:
        return []
    dev = [*ctx.rk, "device_id"]
    by_dev = data_movement(ops, by=(*dev, "kind", "name"))
    if ctx.structure.kind in ("generation", "serving"):
        by_dev = pl.concat([by_dev, _large_pointwise(ops, dev, by_dev)], how="diagonal_relaxed")
    if by_dev.height == 0:
        return []
    per_dev = by_dev.group_by(dev).agg(
        pl.col("share").sum().alias("share"),
        pl.col("gpu_time_ns").filter(pl.col("kind").is_in(list(REMOVABLE_KINDS))).sum().alias("removable_ns"),
        pl.col("gpu_time_ns").sum().alias("moving_ns"),
    ).sort("removable_ns", descending=True)
    top = per_dev.row(0, named=True)
    gpu_share = float(top["share"] or 0.0)
    total = int(top["removable_ns"] or 0)
    if gpu_share < ctx.config.data_movement_share or total <= 0:
        return []
    sev = ctx.config.severity(ctx.share(total)) or "low"
    rows = by_dev.join(per_dev.head(1).select(dev), on=dev)
    kinds = rows.group_by("kind").agg(pl.col("gpu_time_ns").sum(), pl.col("share").sum()).sort("gpu_time_ns", descending=True)
    lead = kinds.filter(pl.col("kind").is_in(list(REMOVABLE_KINDS)) & (pl.col("share") >= 0.01)).head(3)
    parts = ", ".join(f"{r['kind']} {r['share']:.0%}" for r in lead.iter_rows(named=True))
    top_kernel = rows.filter(pl.col("kind").is_in(list(REMOVABLE_KINDS))).head(1)
    named = f"; largest: {_short(top_kernel['name'][0])} ({top_kernel['share'][0]:.0%})" if top_kernel.height else ""
    cache = ctx.structure.kind in ("generation", "serving")  # a KV cache is the generation's; training keeps none
    table = _ADVICE if cache else {**_ADVICE, **_ADVICE_NO_CACHE}
    advice = " ".join(f"{table[k]}." for k in lead["kind"].to_list() if k in table)
    fix = "a static cache and fused kernels" if cache else "in-place writes and fused kernels"
    ev = rows.head(20).select(*dev, "kind", "name", "ops", "gpu_time_ns", "mean_ns", "share")
    return [Finding(
        "data_movement", sev,
        f"Data movement takes {gpu_share:.0%} of GPU time ({parts}){named}: {ctx.per_step(total)} in copies {fix} would "
        "remove",
        time_ns=total, share=ctx.share(total), evidence=ev,
        advice=advice or "Write into preallocated buffers in place and fuse layout changes into the kernels that consume them.",
        next=[f"tracekit stats -r cuda_gpu_kern_sum {ctx.trace_path}",
              f"tracekit capture ncu --nvtx --kernel-name regex:'{_regex(top_kernel['name'][0]) if top_kernel.height else 'Copy'}' "
              f"--launch-count 5 -- {_cmd(ctx)}"],
    )]


def _large_pointwise(ops: pl.DataFrame, dev: list[str], moved: pl.DataFrame) -> pl.DataFrame:
    """:func:`~tracekit.analysis.data_movement.large_pointwise` per device, as rows of kind
    ``large_pointwise`` in ``data_movement``'s columns (kernels already counted as data
    movement left out)."""
    parts = []
    seen = set(moved["name"].to_list()) if moved.height else set()
    for keys, part in ops.group_by(dev):
        big = large_pointwise(part).filter(~pl.col("name").is_in(list(seen)))
        if big.height:
            parts.append(big.select(
                *[pl.lit(v).alias(k) for k, v in zip(dev, keys, strict=True)], pl.lit("large_pointwise").alias("kind"), "name",
                "ops", "gpu_time_ns", pl.col("median_ns").alias("mean_ns"), pl.lit(None, pl.Int64).alias("bytes"), "share"))
    return pl.concat(parts, how="diagonal_relaxed") if parts else pl.DataFrame()


def _short(name: str) -> str:
    """A demangled kernel name without return type, namespaces, template arguments and
    parameters: ``void at::native::<unnamed>::CatArrayBatchedCopy_vectorized<…>(…)`` →
    ``CatArrayBatchedCopy_vectorized``."""
    text = name
    while True:  # innermost template argument lists first
        stripped = re.sub(r"<[^<>]*>", "", text)
        if stripped == text:
            break
        text = stripped
    text = text.split("(", 1)[0].replace("void ", "").strip()
    return (text.rsplit("::", 1)[-1] or name)[:80]


def _regex(name: str) -> str:
    return _short(name).replace("(", r"\(").replace(")", r"\)")


DATA_RULES = (data_movement_rule,)
