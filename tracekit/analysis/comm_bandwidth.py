"""Algorithm and bus bandwidth of NCCL calls, as nccl-tests defines them, against the link peak.

For a call moving a message of ``bytes`` (NCCL's payload size, see
:mod:`tracekit.analysis.nccl_payloads`) in time ``t`` on ``n`` ranks:

=================  ===========================  ======================
op                 algorithm bandwidth          bus factor
=================  ===========================  ======================
AllReduce          bytes / t                    2 (n − 1) / n
AllGather          n × bytes / t                (n − 1) / n
ReduceScatter      n × bytes / t                (n − 1) / n
AllToAll           n × bytes / t                (n − 1) / n
Broadcast, Reduce  bytes / t                    1
Send, Recv         bytes / t                    1
=================  ===========================  ======================

(nccl-tests ``src/*.cu``: AllGather's "size" is the gathered buffer, n × the per-rank
message NCCL's payload reports; same for ReduceScatter's input.) ``busbw = algbw × factor``
is comparable with the per-direction bandwidth of one GPU's links, whatever ``n`` is.

``t`` is the kernel's duration. A kernel starts when its rank arrives and spins until the
last rank does, so on ranks that arrive early the figure includes waiting; the
``sync_duration_ns`` of :func:`tracekit.analysis.ranks.collective_skew` (first end − last
start) excludes it.

Bandwidths are in GB/s (1e9 bytes/s: ``bytes / ns``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import polars as pl

from tracekit.analysis._frames import rank_keys

__all__ = [
    "BUS_FACTORS",
    "LINK_PEAKS_GBPS",
    "bandwidth_by_size",
    "bandwidth_summary",
    "collective_bandwidth",
    "link_peaks",
    "sync_bandwidth",
]

#: op → (message multiplier of the algorithm bandwidth, bus factor), as functions of n.
BUS_FACTORS: dict[str, tuple[str, str]] = {
    "AllReduce": ("1", "2*(n-1)/n"),
    "AllGather": ("n", "(n-1)/n"),
    "ReduceScatter": ("n", "(n-1)/n"),
    "AllToAll": ("n", "(n-1)/n"),
    "Broadcast": ("1", "1"),
    "Reduce": ("1", "1"),
    "Send": ("1", "1"),
    "Recv": ("1", "1"),
}

#: Per-direction peak of one GPU's GPU-to-GPU links, GB/s, by a substring of the GPU name
#: (first match wins). NVLink 5 (Blackwell): 18 links × 50 GB/s; NVLink 4 (Hopper): 18 × 25;
#: NVLink 3 (A100): 12 × 25; A800/H800: 8 links; PCIe cards: the x16 slot.
LINK_PEAKS_GBPS: tuple[tuple[str, float, str], ...] = (
    ("GB300", 900.0, "NVLink 5"),
    ("GB200", 900.0, "NVLink 5"),
    ("B300", 900.0, "NVLink 5"),
    ("B200", 900.0, "NVLink 5"),
    ("B100", 900.0, "NVLink 5"),
    ("H800", 200.0, "NVLink 4 (8 links)"),
    ("H100 PCIe", 64.0, "PCIe 5.0 x16"),
    ("H100", 450.0, "NVLink 4"),
    ("H200", 450.0, "NVLink 4"),
    ("GH200", 450.0, "NVLink 4"),
    ("H20", 450.0, "NVLink 4"),
    ("A800", 200.0, "NVLink 3 (8 links)"),
    ("A100-PCIE", 32.0, "PCIe 4.0 x16"),
    ("A100 PCIe", 32.0, "PCIe 4.0 x16"),
    ("A100", 300.0, "NVLink 3"),
    ("V100-PCIE", 16.0, "PCIe 3.0 x16"),
    ("V100", 150.0, "NVLink 2"),
    ("L40", 32.0, "PCIe 4.0 x16"),
    ("L4", 32.0, "PCIe 4.0 x16"),
    ("RTX PRO 6000", 64.0, "PCIe 5.0 x16"),
    ("RTX", 32.0, "PCIe 4.0 x16"),
)


def link_peaks(gpus: pl.DataFrame, *, override_gbps: float | Mapping[int, float] | None = None) -> pl.DataFrame:
    """The per-direction link peak of each GPU of a ``gpus`` table.

    Returns ``[rank,] device_id, gpu_name, link_peak_gbps, link`` (``link`` names the
    assumption, ``"given"`` for an override; null peak when the GPU is not in
    :data:`LINK_PEAKS_GBPS`). The table knows the GPU model, not the topology: two H100 on
    PCIe without NVLink get the NVLink figure; pass ``override_gbps`` (one value, or per
    ``device_id``) when you know better.
    """
    keys = rank_keys(gpus)
    names = gpus["name"].to_list()
    peaks: list[float | None] = []
    links: list[str | None] = []
    for dev, name in zip(gpus["device_id"].to_list(), names, strict=True):
        given = override_gbps.get(dev) if isinstance(override_gbps, Mapping) else override_gbps
        if given is not None:
            peaks.append(float(given))
            links.append("given")
            continue
        hit = next(((p, lk) for key, p, lk in LINK_PEAKS_GBPS if name and key.lower() in name.lower()), (None, None))
        peaks.append(hit[0])
        links.append(hit[1])
    return gpus.select(*keys, "device_id", pl.col("name").alias("gpu_name")).with_columns(
        pl.Series("link_peak_gbps", peaks, dtype=pl.Float64), pl.Series("link", links, dtype=pl.Utf8)
    )


def _factor(text: str, n: pl.Expr) -> pl.Expr:
    return {
        "1": pl.lit(1.0),
        "n": n.cast(pl.Float64),
        "2*(n-1)/n": 2.0 * (n - 1) / n,
        "(n-1)/n": (n - 1) / n.cast(pl.Float64),
    }[text]


def collective_bandwidth(
    nccl: pl.DataFrame,
    *,
    gpus: pl.DataFrame | None = None,
    nranks: int | None = None,
    link_peak_gbps: float | Mapping[int, float] | None = None,
) -> pl.DataFrame:
    """Algorithm and bus bandwidth of each NCCL call with a size and a kernel.

    Parameters
    ----------
    nccl
        An NCCL calls table (``bytes``, ``op``, ``comm_nranks``, ``gpu_duration_ns``,
        ``device_id``; ``rank`` when present).
    gpus
        The ``gpus`` table, for the link peak (:func:`link_peaks`).
    nranks
        Ranks of every communicator, when the table does not know them (``comm_nranks``
        null: per-rank reports without the communicator's set-up in the capture).
    link_peak_gbps
        Override of the link peak (one value or per ``device_id``).

    Returns
    -------
    The calls that have ``bytes`` and ``gpu_duration_ns`` > 0, with ``bw_nranks`` (the n used),
    ``algbw_gbps``, ``bus_factor``, ``busbw_gbps`` (null where n is unknown and the op needs
    it), ``link_peak_gbps``, ``link`` and ``peak_fraction`` (busbw / peak).
    """
    calls = nccl.filter(
        pl.col("bytes").is_not_null() & (pl.col("gpu_duration_ns") > 0) & pl.col("op").is_in(list(BUS_FACTORS))
    )
    if calls.height == 0 and nccl.height > 0:
        import warnings

        from tracekit.errors import EmptyResultWarning

        no_bytes = nccl.filter(pl.col("bytes").is_null()).height
        no_kernel = nccl.filter(~(pl.col("gpu_duration_ns") > 0).fill_null(False)).height
        other = nccl.filter(~pl.col("op").is_in(list(BUS_FACTORS))).height
        warnings.warn(
            f"collective_bandwidth: none of the {nccl.height} NCCL calls has a size, a kernel and a collective op "
            f"({no_bytes} without bytes: capture NCCL's NVTX payloads with nsys ≥ 2023.1 and --include-blobs export; "
            f"{no_kernel} without a kernel; {other} not a collective)",
            EmptyResultWarning, stacklevel=2,
        )
    n = pl.lit(nranks, pl.Int64) if nranks is not None else pl.col("comm_nranks")
    calls = calls.with_columns(n.alias("bw_nranks"))
    n = pl.col("bw_nranks")
    mult: pl.Expr = pl.lit(None, pl.Float64)
    factor: pl.Expr = pl.lit(None, pl.Float64)
    for op, (m, f) in BUS_FACTORS.items():
        mult = pl.when(pl.col("op") == op).then(_factor(m, n)).otherwise(mult)
        factor = pl.when(pl.col("op") == op).then(_factor(f, n)).otherwise(factor)
    t = pl.col("gpu_duration_ns").cast(pl.Float64)
    calls = calls.with_columns(
        (pl.col("bytes") * mult / t).alias("algbw_gbps"),
        factor.alias("bus_factor"),
    ).with_columns((pl.col("algbw_gbps") * pl.col("bus_factor")).alias("busbw_gbps"))
    if gpus is not None and gpus.height:
        peaks = link_peaks(gpus, override_gbps=link_peak_gbps).drop("gpu_name")
        keys = [k for k in rank_keys(calls, peaks)]
        calls = calls.join(peaks, on=[*keys, "device_id"], how="left", maintain_order="left")
    else:
        value = link_peak_gbps if isinstance(link_peak_gbps, (int, float)) else None
        calls = calls.with_columns(
            pl.lit(value, pl.Float64).alias("link_peak_gbps"),
            pl.lit("given" if value is not None else None, pl.Utf8).alias("link"),
        )
    return calls.with_columns((pl.col("busbw_gbps") / pl.col("link_peak_gbps")).alias("peak_fraction"))


def bandwidth_summary(bw: pl.DataFrame, *, by: Sequence[str] = ("op",)) -> pl.DataFrame:
    """Bandwidth per group of :func:`collective_bandwidth` rows.

    Returns ``by`` columns plus ``calls``, ``total_bytes``, ``total_gpu_ns`` (kernels shared by
    grouped calls counted once: ``kernel_share``),
    ``median_algbw_gbps``, ``median_busbw_gbps``, ``max_busbw_gbps``, ``busbw_gbps``
    (time-weighted: Σ bytes × multiplier × factor / Σ time), ``link_peak_gbps`` (max) and
    ``peak_fraction`` (max busbw / peak), sorted by total time.
    """
    by = list(by)
    moved = pl.col("busbw_gbps") * pl.col("gpu_duration_ns")
    out = bw.group_by(by).agg(
        pl.len().alias("calls"),
        pl.col("bytes").sum().alias("total_bytes"),
        (pl.col("gpu_duration_ns") * pl.col("kernel_share").fill_null(1.0)).sum().round(0).cast(pl.Int64).alias("total_gpu_ns")
        if "kernel_share" in bw.columns else pl.col("gpu_duration_ns").sum().alias("total_gpu_ns"),
        pl.col("algbw_gbps").median().alias("median_algbw_gbps"),
        pl.col("busbw_gbps").median().alias("median_busbw_gbps"),
        pl.col("busbw_gbps").max().alias("max_busbw_gbps"),
        (moved.sum() / pl.col("gpu_duration_ns").filter(pl.col("busbw_gbps").is_not_null()).sum()).alias("busbw_gbps"),
        pl.col("link_peak_gbps").max(),
    )
    return out.with_columns((pl.col("max_busbw_gbps") / pl.col("link_peak_gbps")).alias("peak_fraction")).sort(
        "total_gpu_ns", descending=True
    )


def bandwidth_by_size(bw: pl.DataFrame) -> pl.DataFrame:
    """:func:`bandwidth_summary` per (``op``, ``bytes``), by message size."""
    return bandwidth_summary(bw, by=("op", "bytes")).sort("op", "bytes")


def sync_bandwidth(skew: pl.DataFrame) -> pl.DataFrame:
    """Bandwidth of matched collectives over the time all ranks spent in them together.

    Input: :func:`tracekit.analysis.ranks.collective_skew` (``op``, ``bytes``,
    ``match_ranks``, ``sync_duration_ns`` = first end − last start). A kernel that starts
    early spins until the last rank arrives; this window leaves that wait out, so it is the
    better estimate of the transfer itself (an upper bound on bandwidth when a rank finished
    before the last one started, as small sends do: those rows, with a window ≤ 0, are
    dropped). p2p pairs (``Recv/Send``) count as one Send.

    Returns the rows with ``bytes`` and a positive window, plus ``algbw_gbps``,
    ``bus_factor`` and ``busbw_gbps`` (n = ``match_ranks``).
    """
    rows = skew.filter(pl.col("bytes").is_not_null() & (pl.col("sync_duration_ns") > 0))
    op = pl.when(pl.col("op").str.contains("/")).then(pl.lit("Send")).otherwise(pl.col("op"))
    rows = rows.with_columns(op.alias("_op"), pl.col("match_ranks").alias("_n"))
    n = pl.col("_n")
    mult: pl.Expr = pl.lit(None, pl.Float64)
    factor: pl.Expr = pl.lit(None, pl.Float64)
    for name, (m, f) in BUS_FACTORS.items():
        mult = pl.when(pl.col("_op") == name).then(_factor(m, n)).otherwise(mult)
        factor = pl.when(pl.col("_op") == name).then(_factor(f, n)).otherwise(factor)
    t = pl.col("sync_duration_ns").cast(pl.Float64)
    rows = rows.with_columns((pl.col("bytes") * mult / t).alias("algbw_gbps"), factor.alias("bus_factor"))
    return rows.with_columns((pl.col("algbw_gbps") * pl.col("bus_factor")).alias("busbw_gbps")).drop("_op", "_n")
