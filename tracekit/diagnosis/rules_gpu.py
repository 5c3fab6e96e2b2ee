"""Rules about what the GPU runs: no_tensor_cores, memory_growth, and with an Nsight Compute
report memory_bound_kernel / compute_bound_kernel.

Time at stake per rule is in each docstring and in docs/diagnose.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from tracekit.analysis.families import with_family
from tracekit.analysis.layers import layer_of
from tracekit.analysis.memory import layer_memory, memory_timeline
from tracekit.analysis.metrics import kernel_metrics, metric_names
from tracekit.diagnosis.context import Context
from tracekit.diagnosis.result import Finding, fmt_ns
from tracekit.diagnosis.rules_host import _cmd

__all__ = ["GPU_RULES", "SIMT_GEMM_PATTERN"]

#: GEMM kernels that run on the SIMT (FMA) pipes, not on tensor cores: CUTLASS ``simt``
#: kernels, cuBLAS's ``<arch>_sgemm``/``dgemm`` families (``gemmSN`` small-N kernels too) and
#: the fp32-in/fp32-compute ``xmma_gemm_f32f32_f32f32`` kernels (no ``tf32``: seen for an fp32
#: GEMM with TF32 off on an H200, tensor pipe 0.0003 % in ncu).
SIMT_GEMM_PATTERN = (
    r"(?i)simt|(?:^|[^a-z])(?:maxwell|volta|turing|ampere|hopper|sm\d+)_[sd]gemm|gemmsn|gemmk1_kernel|gemm_f32f32_f32f32"
)


def _ncu_arg_regex(names: list[str]) -> str:
    return "regex:^(?:" + "|".join(n.replace("(", r"\(").replace(")", r"\)") for n in names) + ")"


#: Steady iterations whose GPU metrics are read (from the middle of the window): the loop
#: repeats, so a few steps tell which GEMMs use tensor cores without reading every sample.
METRIC_STEPS = 20


def _metric_span(ctx: Context) -> tuple[int, int]:
    w = ctx.window
    it = w.iterations.slice(w.warmup_steps) if w.iterations.height else w.iterations
    if it.height > METRIC_STEPS:
        mid = (it.height - METRIC_STEPS) // 2
        part = it.slice(mid, METRIC_STEPS)
        return int(part["w_start"].min()), int(part["w_end"].max())  # type: ignore[arg-type]
    return w.start_ns, w.end_ns


def _gemm_tensor_active(ctx: Context, fam: pl.DataFrame) -> pl.DataFrame | None:
    """``kernel_metrics`` (Tensor Active) of the GEMM kernels in :func:`_metric_span`, from
    the samples of that span only (``gpu_metric_samples``); ``None`` without GPU metrics."""
    a, b = _metric_span(ctx)
    sub = fam.filter((pl.col("start_ns") >= a) & (pl.col("start_ns") < b))
    if sub.height == 0:
        return None
    margin = 10_000_000  # 10 ms: the sample that covers a kernel's end comes after it
    db = getattr(ctx.trace, "db", None)
    if db is not None:
        from tracekit.nsys.gpu_metrics import gpu_metric_samples

        gm = gpu_metric_samples(db, ["tensor_active"], start_ns=a - margin, end_ns=b + margin)
    else:
        full = getattr(ctx.trace, "gpu_metrics", None)
        if full is None or full.height == 0:
            return None
        gm = full.filter((pl.col("metric") == "tensor_active") & pl.col("timestamp_ns").is_between(a - margin, b + margin))
    if gm.height == 0 or "tensor_active" not in metric_names(gm):
        return None
    return kernel_metrics(sub, gm, metrics=["tensor_active"])


def no_tensor_cores(ctx: Context) -> list[Finding]:
    """``no_tensor_cores``: GEMM-family kernels (``tracekit.taxonomy``) that ran without
    tensor cores, by name (:data:`SIMT_GEMM_PATTERN`), with GPU metrics by Tensor Active
    below ``tensor_active_min`` while they ran (kernels longer than one sample period, read
    over :data:`METRIC_STEPS` steady steps from the middle of the window), or with
    an ncu report by a tensor pipe below ``tensor_active_min`` (as %) for a GEMM of that name.
    ``time_ns`` = their time × (1 − 1/``tensor_speedup``): what a tensor-core version at
    ``tensor_speedup``× would save (the default 2× is conservative: H100's dense TF32 tensor
    peak is 7× its FP32 SIMT peak)."""
    k = ctx.kernels_w
    if k.height == 0:
        return []
    fam = with_family(k).filter(pl.col("family") == "gemm")
    if fam.height == 0:
        return []
    by_name = fam.filter(pl.col("name").str.contains(SIMT_GEMM_PATTERN)).with_columns(pl.lit("kernel name (SIMT)").alias("basis"))
    by_metric = pl.DataFrame()
    km = _gemm_tensor_active(ctx, fam)
    if km is not None and km.height:
        scale = 100.0 if float(km["tensor_active"].max() or 0) > 1.0 else 1.0  # type: ignore[arg-type]
        by_metric = km.filter(
            ~pl.col("below_sample_period") & (pl.col("tensor_active") / scale < ctx.config.tensor_active_min)
        ).with_columns(pl.lit("GPU metrics: Tensor Active").alias("basis"))
    by_ncu = pl.DataFrame()
    if ctx.ncu is not None:
        from tracekit.analysis.ncu_views import tensor_core_utilization

        tcu = tensor_core_utilization(ctx.ncu)
        idle = tcu.filter((pl.col("family") == "gemm") & (pl.col("tensor_pipe_pct") < 100 * ctx.config.tensor_active_min))
        by_ncu = fam.join(idle.select("short_name").unique(), on="short_name").with_columns(
            pl.lit("ncu: tensor pipe").alias("basis")
        )
    cols = ["name", "short_name", "duration_ns", "basis"]
    parts = [f.select([c for c in cols if c in f.columns]) for f in (by_name, by_metric, by_ncu) if f.height]
    if not parts:
        return []
    hit = pl.concat(parts, how="diagonal_relaxed")
    # one basis per kernel name (name first)
    names = hit.group_by("name").agg(pl.col("basis").first())
    inst = fam.join(names, on="name")
    t = int(inst["duration_ns"].sum())
    total = int(t * (1 - 1 / ctx.config.tensor_speedup))
    sev = ctx.config.severity(ctx.share(total))
    if sev is None:
        return []
    ev = inst.group_by("short_name" if "short_name" in inst.columns else "name", "basis").agg(
        pl.len().alias("launches"), pl.col("duration_ns").sum().alias("time_ns"), pl.col("name").first()
    ).sort("time_ns", descending=True)
    gemm_t = int(fam["duration_ns"].sum())
    short = ev[ev.columns[0]].head(3).to_list()
    return [Finding(
        "no_tensor_cores", sev,
        f"{fmt_ns(t)} of GEMM time ({t / max(gemm_t, 1):.0%} of all GEMM time, {ctx.per_step(t)}) runs without tensor "
        f"cores ({', '.join(short)})",
        time_ns=total, share=ctx.share(total), evidence=ev,
        advice="Run the matmuls in bf16/fp16 (torch.autocast(dtype=torch.bfloat16), model.to(torch.bfloat16)) or at "
        "least allow TF32 for fp32 (torch.backends.cuda.matmul.allow_tf32 = True, "
        "torch.set_float32_matmul_precision('high')); keep GEMM dimensions multiples of 8/16.",
        next=[f"tracekit capture ncu --preset kernel-drilldown -k '{_ncu_arg_regex(short)}' -c 5 -- {_cmd(ctx)}"],
    )]


def _step_ends(ctx: Context) -> pl.DataFrame | None:
    it = ctx.window.iterations
    if it.height == 0:
        return None
    steady = it.slice(ctx.window.warmup_steps)
    if "iteration" not in steady.columns:
        steady = steady.with_row_index("iteration")
    return steady.select("iteration", "w_end")


def _growth_inside(ctx: Context, mu: pl.DataFrame, dev: dict[str, Any], lo: int, hi: int, growth: float) -> str:
    """Which NVTX range the growth between ``lo`` and ``hi`` happens in: the range name whose
    instances inside that span (the step ranges themselves left out) add the most, from
    :func:`~tracekit.analysis.memory.layer_memory`; "" without nested ranges there."""
    nvtx = ctx.nvtx
    if nvtx.height == 0 or growth <= 0:
        return ""
    import warnings

    from tracekit.errors import EmptyResultWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EmptyResultWarning)
        lm = layer_memory(mu, nvtx, per_step=False)
    for key, value in dev.items():
        if key in lm.columns:
            lm = lm.filter(pl.col(key) == value)
    steps = ctx.window.iterations
    if "range_id" in steps.columns:
        lm = lm.join(steps.select(pl.col("range_id").cast(pl.Int64)).unique(), on="range_id", how="anti")
    lm = lm.filter((pl.col("start_ns") >= lo) & (pl.col("end_ns") <= hi))
    if lm.height == 0:
        return ""
    per = lm.group_by("name").agg(pl.col("net_growth_bytes").sum(), pl.col("level").min()).sort(
        ["net_growth_bytes", "level", "name"], descending=[True, False, False]
    )
    top = per.row(0, named=True)
    if top["net_growth_bytes"] <= 0:
        return "; no NVTX range inside the steps grows: it happens between them"
    return _growth_in_layers(lm, top["name"], growth) or f"; {min(top['net_growth_bytes'] / growth, 1.0):.0%} of it inside NVTX range {top['name']!r}"


def _growth_in_layers(lm: pl.DataFrame, top: str, growth: float) -> str:
    """The layers' share of the growth when the range that grows most holds the layers (the
    model's root-module or ``forward`` range: naming it says nothing), with the sub-block
    (``self_attn``, ``mlp``) that grows most; "" otherwise. Layers and blocks are those of
    :func:`~tracekit.analysis.layers.layer_of` on the ranges' paths."""
    parent_path = pl.when(pl.col("path").str.contains("/")).then(pl.col("path").str.replace(r"/[^/]*$", ""))
    layer, block = layer_of(pl.col("path"))
    p_layer, p_block = layer_of(parent_path)
    lm = lm.with_columns(layer.alias("_layer"), block.alias("_block"), p_layer.alias("_p_layer"), p_block.alias("_p_block"))
    own = lm.filter(pl.col("_layer").is_not_null() & pl.col("_p_layer").is_null())  # each layer's outermost range
    holders = set(own.select(parent_path.str.split("/").alias("_up")).explode("_up")["_up"].drop_nulls().to_list())
    total = int(own["net_growth_bytes"].sum())
    if top not in holders or total <= 0:
        return ""
    grew = own.filter(pl.col("net_growth_bytes") > 0)
    n_grew, n_all = grew["_layer"].n_unique(), own["_layer"].n_unique()
    where = (f"NVTX range {grew['name'][0]!r}" if grew["name"].n_unique() == 1
             else f"the layer ranges ({n_grew} of {n_all} layers grow)")
    subs = lm.filter(pl.col("_block").is_not_null() & pl.col("_p_layer").is_not_null() & pl.col("_p_block").is_null())
    per_block = subs.group_by("_block").agg(pl.col("net_growth_bytes").sum()).sort(["net_growth_bytes", "_block"], descending=[True, False])
    most = ""
    if per_block.height and per_block["net_growth_bytes"][0] > total / 2:
        most = f", most in {'its' if n_grew == 1 else 'their'} {per_block['_block'][0]!r} sub-ranges"
    return f"; {min(total / growth, 1.0):.0%} of it inside {where}{most}"


def memory_growth(ctx: Context) -> list[Finding]:
    """``memory_growth``: device memory in use (``memory_timeline``) at the end of each
    steady iteration rises step over step. The growth per step is the least-squares slope
    over the steady steps; it must exceed ``growth_min_bytes`` and at least
    ``growth_monotonic`` of the step-to-step changes must be increases. The projected OOM is
    (GPU memory − in use at the last step) / slope steps. The title names the NVTX range
    inside the steps whose instances add most of the growth between the first and last steady
    step ends (:func:`~tracekit.analysis.memory.layer_memory`), or says it happens between
    ranges; when that range holds the model's layers (a root-module or ``forward`` range), the
    layers' share instead, with how many of them grow and the sub-block (``self_attn``) that
    grows most. ``time_ns`` is null: the cost is memory, not time."""
    mu = getattr(ctx.trace, "memory_usage", None)
    if mu is None or mu.height == 0:
        return []
    ends = _step_ends(ctx)
    if ends is None or ends.height < 3:
        return []
    tl = memory_timeline(mu)
    if tl.height == 0:
        return []
    keys = [c for c in (*ctx.rk, "device_id") if c in tl.columns]
    out: list[Finding] = []
    gpus = getattr(ctx.trace, "gpus", pl.DataFrame())
    for (dev_key, part) in tl.sort([*keys, "start_ns"]).group_by(keys, maintain_order=True):
        pts = ends.select(pl.col("iteration").cast(pl.Int64), pl.col("w_end").cast(pl.Int64).alias("start_ns")).sort("start_ns").join_asof(
            part.select("start_ns", "in_use_bytes"), on="start_ns", strategy="backward"
        ).with_columns(pl.col("in_use_bytes").fill_null(0))
        y = pts["in_use_bytes"].to_numpy().astype(np.float64)
        x = pts["iteration"].to_numpy().astype(np.float64)
        # least-squares slope in closed form (np.polyfit calls BLAS, whose buffers OpenBLAS
        # maps on first use and, without room, ends the process with exit 1)
        xc = x - x.mean() if x.size else x
        den = float((xc * xc).sum())
        slope = float((xc * (y - y.mean())).sum() / den) if den > 0 else 0.0
        d = np.diff(y) / np.maximum(np.diff(x), 1)
        ups = float((d > 0).mean()) if d.size else 0.0
        if slope < ctx.config.growth_min_bytes or ups < ctx.config.growth_monotonic:
            continue
        dev = dict(zip(keys, dev_key if isinstance(dev_key, tuple) else (dev_key,), strict=False))
        total_mem = None
        if gpus.height and "total_memory_bytes" in gpus.columns:
            g = gpus.filter(pl.col("device_id") == dev.get("device_id"))
            if "rank" in dev and "rank" in gpus.columns:
                g = g.filter(pl.col("rank") == dev["rank"])
            if g.height and g["total_memory_bytes"][0] is not None:
                total_mem = int(g["total_memory_bytes"][0])
        last = float(y[-1])
        steps_left = int((total_mem - last) / slope) if total_mem else None
        step_ns = ctx.window.step_ns or 0
        oom = (
            f"; at this rate the {total_mem / 2**30:.0f} GiB GPU is full in ~{steps_left:,} more steps"
            f" (~{fmt_ns(steps_left * step_ns)})" if steps_left is not None and total_mem else ""
        )
        sev = "high" if steps_left is not None and steps_left <= ctx.config.oom_high_steps else "medium"
        ev = pts.rename({"iteration": "step", "start_ns": "step_end_ns"}).with_columns(pl.col("in_use_bytes").diff().alias("delta_bytes"))
        dev_txt = ", ".join(f"{k} {v}" for k, v in dev.items())
        ends_ns = pts["start_ns"]
        inside = _growth_inside(ctx, mu, dev, int(ends_ns[0]), int(ends_ns[-1]), last - float(y[0]))
        out.append(Finding(
            "memory_growth", sev,
            f"Device memory in use grows {slope / 2**20:.1f} MiB per step ({dev_txt}: {y[0] / 2**20:.0f} → "
            f"{last / 2**20:.0f} MiB over {y.size} steps){inside}{oom}",
            time_ns=None, share=None, evidence=ev,
            advice="Something keeps tensors alive across steps: lists of outputs or losses kept with their graph "
            "(append loss.item() or .detach()), caches that never evict, growing KV caches without a cap. "
            "torch.cuda.memory._record_memory_history() + _dump_snapshot() shows which allocations stay.",
            next=[f"tracekit capture nsys --cuda-memory-usage -- {_cmd(ctx)}",
                  "python -c \"import torch; torch.cuda.memory._record_memory_history()\"  # then _dump_snapshot('snap.pickle')"],
        ))
    return out


def _ncu_rows(ctx: Context) -> pl.DataFrame | None:
    """ncu's kernels with speed-of-light and roofline numbers, matched to this trace's
    kernels in the window, with their share of the window's kernel time."""
    from tracekit.analysis.ncu_views import roofline, speed_of_light
    from tracekit.analysis.nsys_ncu import join_ncu_to_nsys

    rep: Any = ctx.ncu
    sol = speed_of_light(rep)
    roof = roofline(rep)
    ncu = rep.kernels
    matched, _ = join_ncu_to_nsys(ctx.kernels, ncu, use_nvtx=False)
    if matched.height == 0:
        return None
    per_id = sol.select("id", "short_name", "compute_throughput_pct", "memory_throughput_pct", "dram_throughput_pct", "bound").join(
        roof.select("id", "arithmetic_intensity", "pct_of_attainable", pl.col("bound").alias("roofline_bound")), on="id", how="left"
    )
    # per kernel name: the profiled launches' mean, weighted by the window's time of that name
    prof = matched.select("short_name", pl.col("ncu_id").alias("id")).join(per_id.drop("short_name"), on="id")
    by_name = prof.group_by("short_name").agg(
        pl.len().alias("profiled"), *[pl.col(c).mean() for c in ("compute_throughput_pct", "memory_throughput_pct",
                                                                   "dram_throughput_pct", "arithmetic_intensity",
                                                                   "pct_of_attainable")],
        pl.col("bound").mode().first(), pl.col("roofline_bound").mode().first(),
    )
    k = ctx.kernels_w
    t = k.group_by("short_name").agg(pl.col("duration_ns").sum().alias("time_ns"), pl.len().alias("launches"))
    total = int(k["duration_ns"].sum()) if k.height else 0
    return by_name.join(t, on="short_name").with_columns((pl.col("time_ns") / max(total, 1)).alias("kernel_share")).sort(
        "time_ns", descending=True
    )


def ncu_kernels(ctx: Context) -> list[Finding]:
    """``memory_bound_kernel`` / ``compute_bound_kernel`` (with ``ncu=``): the kernels that
    make up ``ncu_top_share`` of the window's kernel time, matched to the ncu report by name,
    whose speed-of-light bound (ncu's SOLBottleneck rule, :func:`speed_of_light`) is memory or
    compute and whose throughput on that side is below ``efficiency_min`` of peak.
    ``time_ns`` = window time × (1 − throughput %/100): the time at 100 % of the bounding
    unit's peak would be this much shorter."""
    if ctx.ncu is None:
        return []
    rows = _ncu_rows(ctx)
    if rows is None or rows.height == 0:
        return [Finding("memory_bound_kernel", "info", "The ncu report's kernels match none of this trace's kernels",
                        advice="Profile the same program and the same kernels (tracekit capture both).")]
    rows = rows.with_columns(pl.col("kernel_share").cum_sum().alias("_cum"))
    rows = rows.filter((pl.col("_cum") - pl.col("kernel_share")) < ctx.config.ncu_top_share)
    out: list[Finding] = []
    # the bounding side: ncu's verdict, or for "high_throughput"/"balanced" the busier unit
    side = (
        pl.when(pl.col("bound").is_in(["compute", "memory"])).then(pl.col("bound"))
        .when(pl.col("bound").is_in(["high_throughput", "balanced"]))
        .then(pl.when(pl.col("compute_throughput_pct") >= pl.col("memory_throughput_pct")).then(pl.lit("compute")).otherwise(pl.lit("memory")))
    )
    rows = rows.with_columns(side.alias("_side"))
    for bound, cat, col in (("memory", "memory_bound_kernel", "memory_throughput_pct"),
                            ("compute", "compute_bound_kernel", "compute_throughput_pct")):
        sel = rows.filter((pl.col("_side") == bound) & (pl.col(col) < 100 * ctx.config.efficiency_min))
        if sel.height == 0:
            continue
        sel = sel.with_columns((pl.col("time_ns") * (1 - pl.col(col) / 100)).round(0).cast(pl.Int64).alias("time_at_stake_ns"))
        total = int(sel["time_at_stake_ns"].sum())
        sev = ctx.config.severity(ctx.share(total))
        if sev is None:
            continue
        top = sel.sort("time_at_stake_ns", descending=True)
        first = top.row(0, named=True)
        what = "memory" if bound == "memory" else "compute"
        out.append(Finding(
            cat, sev,
            f"{top.height} {what}-bound kernel(s) far from their roofline: '{first['short_name']}' reaches "
            f"{first[col]:.0f} % of peak {what} throughput over {fmt_ns(first['time_ns'])} in the window",
            time_ns=total, share=ctx.share(total),
            evidence=top.select("short_name", "launches", "profiled", "time_ns", "kernel_share", "bound",
                                "compute_throughput_pct", "memory_throughput_pct", "dram_throughput_pct",
                                "arithmetic_intensity", "pct_of_attainable", "time_at_stake_ns"),
            advice=("Memory-bound: fuse it with its neighbours (fewer round trips to DRAM), use wider/vectorised "
                    "loads, lower precision for activations/KV cache (fp8), or larger batches to raise intensity."
                    if bound == "memory" else
                    "Compute-bound below peak: check the pipe it uses (tensor cores vs FMA), occupancy and tile "
                    "shapes; pad GEMM dimensions to multiples of 64/128 and try another kernel (torch.compile "
                    "max-autotune, cuBLASLt heuristics)."),
            next=[f"tracekit capture ncu --set full -k '{_ncu_arg_regex([first['short_name']])}' -c 3 -- {_cmd(ctx)}"],
        ))
    return out


GPU_RULES = (no_tensor_cores, memory_growth, ncu_kernels)

