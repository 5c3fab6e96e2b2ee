"""Generation phases against the model: MFU and MBU of the prefill and of a decode step.

:func:`phase_efficiency` puts :func:`tracekit.analysis.run.phases.phase_summary` (time to first
token, time per output token) next to what the model says a prefill of ``batch × prompt_len``
tokens and a decode step of ``batch`` tokens cost (:func:`tracekit.model.costs.model_costs`):

* prefill: FLOPs and bytes of ``phase="prefill"`` at the config's ``batch`` and
  ``prompt_len``; measured time = the time to first token;
* decode: the mean over the decode steps of ``phase="decode"`` at ``context_len`` =
  ``prompt_len + i`` for step ``i`` (the KV cache grows by one token a step; FLOPs and bytes are
  linear in it, so the mean step is the step at the mean context); measured time = the median
  time per output token.

``mfu`` = FLOPs / (time × peak FLOP/s), ``mbu`` = bytes / (time × peak bandwidth),
``efficiency`` = the roofline minimum / time. The model describes one tensor-parallel shard and
pipeline stage (``tp``, ``pp`` of the config): give the trace's degrees.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from tracekit.model.config import TransformerConfig, load_model
from tracekit.model.costs import model_costs, peaks

__all__ = ["phase_costs", "phase_efficiency"]


def _totals(cfg: TransformerConfig, gpu: Any) -> tuple[float, float, float | None]:
    c = model_costs(cfg, gpu=gpu)
    minimum = c["min_time_ns"].sum() if c["min_time_ns"].null_count() < c.height else None
    return float(c["flops"].sum()), float(c["bytes"].sum()), (float(minimum) if minimum is not None else None)  # type: ignore[arg-type]


def phase_costs(model: Any, *, decode_steps: int, gpu: Any = None) -> pl.DataFrame:
    """The model's FLOPs, bytes and minimum time of the prefill and of the mean decode step.

    Parameters
    ----------
    model
        A :class:`~tracekit.model.config.TransformerConfig` or anything
        :func:`~tracekit.model.config.load_model` takes; ``batch`` and ``prompt_len`` describe
        the request(s) of the trace.
    decode_steps
        Decode steps measured (the context grows by one per step).
    gpu
        GPU name, spec or Nsight Compute report (:func:`~tracekit.model.costs.peaks`).

    Returns
    -------
    ``phase``, ``tokens`` (per step), ``flops``, ``bytes``, ``predicted_min_ns`` (null without
    a GPU), one row each for ``prefill`` and ``decode``.
    """
    cfg: TransformerConfig = load_model(model)
    pre = cfg.with_(phase="prefill")
    pf, pb, pm = _totals(pre, gpu)
    n = max(int(decode_steps), 1)
    dec = [_totals(cfg.with_(phase="decode", context_len=cfg.prompt_len + i + 1), gpu) for i in range(n)]
    df_, db_ = sum(d[0] for d in dec) / n, sum(d[1] for d in dec) / n
    dm = sum(d[2] for d in dec) / n if all(d[2] is not None for d in dec) else None  # type: ignore[misc]
    return pl.DataFrame(
        {"phase": ["prefill", "decode"], "tokens": [cfg.batch * cfg.prompt_len, cfg.batch], "flops": [pf, df_],
         "bytes": [pb, db_], "predicted_min_ns": [pm, dm]},
        schema={"phase": pl.Utf8, "tokens": pl.Int64, "flops": pl.Float64, "bytes": pl.Float64, "predicted_min_ns": pl.Float64},
    )


def phase_efficiency(summary: pl.DataFrame, model: Any, *, gpu: Any = None) -> pl.DataFrame:
    """``summary`` (:func:`tracekit.analysis.run.phases.phase_summary`) with the model's costs and
    the measured efficiency of each phase.

    Returns ``summary``'s columns plus ``time_ns`` (prefill: ``ttft_ns``; decode:
    ``tpot_median_ns``), ``tokens``, ``flops``, ``bytes``, ``predicted_min_ns``, ``mfu``,
    ``mbu``, ``efficiency`` (0–1 when the model's bound holds), ``gpu`` (the peaks' source).
    """
    cfg: TransformerConfig = load_model(model)
    steps = summary.filter(pl.col("phase") == "decode")["steps"]
    costs = phase_costs(cfg, decode_steps=int(steps[0]) if steps.len() else 1, gpu=gpu)
    flops_s, bw, name = peaks(gpu, cfg.dtype)
    out = summary.join(costs, on="phase", how="left").with_columns(
        pl.when(pl.col("phase") == "prefill").then(pl.col("ttft_ns").cast(pl.Float64)).otherwise(pl.col("tpot_median_ns")).alias("time_ns"),
    )
    t = pl.col("time_ns") * 1e-9
    return out.with_columns(
        (pl.col("flops") / (t * flops_s) if flops_s else pl.lit(None, pl.Float64)).alias("mfu"),
        (pl.col("bytes") / (t * bw) if bw else pl.lit(None, pl.Float64)).alias("mbu"),
        (pl.col("predicted_min_ns") / pl.col("time_ns")).alias("efficiency"),
        pl.lit(name, pl.Utf8).alias("gpu"),
    )
