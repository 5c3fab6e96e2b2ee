"""Forward passes of a model, found from what every transformer's timeline shows.

A forward pass runs the model's layer stack once, and every layer runs attention once: a
model of ``L`` layers launches its attention ``L`` times per forward (twice per decoder layer
with cross-attention), whatever the prompt length, the batch or the kernels the libraries
pick for them. Around the stack, once per forward, run the embedding gather (first) and the
LM head and sampling (last); ``generate()``'s stopping criteria and streamers then copy a few
bytes to the host, which waits for them before it launches the next forward.

:func:`forward_passes` reads that from one GPU's operations:

1. **Attention sites**: runs of consecutive attention kernels (:data:`ATTENTION_NAMES`: flash,
   FMHA, cuDNN's SDPA, …); where a model runs attention as plain matrix products, its softmax
   kernels (:data:`SOFTMAX_NAMES`) mark the sites instead (both are tried; the reading that
   explains more forwards wins).
2. **The forward loop**: of the loops in the operation sequence
   (:func:`tracekit.analysis.run.loops.find_loops`, every attention kernel counted as one
   name), the one with the most instances that each hold the same number ``L ≥ 2`` of
   attention sites (one value per model: a draft and a target model, an encoder and a
   decoder, have their own). Layers hold one site each and so are never taken for forwards;
   a loop around several forwards (a ``generate()`` call) has fewer instances.
3. **Boundaries**: between the last site of one forward and the first of the next, a forward
   starts after the last device-to-host copy (the host synchronised on the sampled tokens),
   else after the longest GPU idle gap, else where the loop's instance starts.

Each forward gets its GPU span and busy time, its operations, its attention sites, the rows
its embedding gather read (``tokens_in``: the grid of PyTorch's ``vectorized_gather_kernel``
is one block per gathered row, i.e. batch × tokens; null where another kernel gathered), a
code of the matrix-product kernels it ran (``gemm_set``: the tile shapes change with the
number of tokens) and whether it ended with a device-to-host copy (``host_sync``).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import polars as pl

from tracekit.analysis.run.loops import HOST_COPY_NAME, find_loops, idle_before, name_codes

__all__ = ["ATTENTION_NAMES", "FORWARD_COLUMNS", "GATHER_NAME", "GEMM_NAMES", "FEW_LOOKUPS", "POSITIONAL_NAMES", "inside_few_forwards", "token_lookup_names", "SOFTMAX_NAMES", "ForwardPasses", "forward_passes"]

#: Kernel names of attention (flash attention, FMHA, cuDNN's and PyTorch's SDPA kernels,
#: paged/decode attention of serving engines).
ATTENTION_NAMES = r"(?i)flash|fmha|sdpa|attention|_attn|attn_|mha_fwd|paged_attn|decode_attn"
#: Inductor's pointwise and reduction kernels, named after the operations they fuse
#: (``triton_per_fused__fused_rms_norm__scaled_dot_product_cudnn_attention_…`` is the norm and
#: reshapes around an attention call, not the attention).
FUSED_NAMES = r"^triton_(?:poi|per|red)_fused"
#: Softmax kernels: the attention sites of models that run attention as matrix products.
SOFTMAX_NAMES = r"(?i)softmax"
#: Matrix products (cuBLAS, cuBLASLt's nvjet, CUTLASS, Triton/Inductor ``mm`` kernels).
GEMM_NAMES = r"(?i)gemm|gemv|nvjet|cutlass|xmma|cublas|matmul|Kernel2|_mm_|triton_mm|splitKreduce"
#: PyTorch's embedding gather whose grid has one block per gathered row.
GATHER_NAME = r"vectorized_gather_kernel"
#: The kernels of an embedding lookup (``nn.Embedding`` runs ``index_select``).
EMBEDDING_NAMES = r"indexSelect(?:Small|Large)Index|vectorized_gather_kernel|(?i:embedding)"
#: Rotary position embeddings (``vllm::rotary_embedding_kernel``, RoPE): every layer runs one,
#: so they are no token embedding lookup, though :data:`EMBEDDING_NAMES` matches them.
POSITIONAL_NAMES = r"(?i)rotary|rope_|_rope"
#: A GPU whose operations hold at least one and at most this many token embedding lookups ran
#: that many forwards with a visible lookup (tokens enter a model once per forward): a loop
#: with more instances than lookups that starts right after them (within one instance) is the
#: layer stack of those forwards (a vLLM or SGLang engine step's one prefill: 36 layers, 1
#: lookup), not forwards or steps. With more lookups no loop is judged so (Inductor and CUDA
#: graphs hide some forwards' lookups), nor where a lookup lies elsewhere (a gather in a
#: training run's set-up or evaluation).
FEW_LOOKUPS = 2


def token_lookup_names(names: pl.Series) -> pl.Series:
    """Which kernel ``names`` (text) are token embedding lookups: :data:`EMBEDDING_NAMES`, not
    :data:`POSITIONAL_NAMES` (rotary embeddings, one per layer) nor an embedding's backward."""
    s = names.cast(pl.Utf8).fill_null("")
    return s.str.contains(EMBEDDING_NAMES) & ~s.str.contains(POSITIONAL_NAMES) & ~s.str.contains(r"(?i)backward")


def inside_few_forwards(lookups: np.ndarray, bounds: np.ndarray) -> bool:
    """Whether a loop whose instances start at operation positions ``bounds`` (the last value:
    where the last one stops) holds the layers of the few forwards whose token embedding
    lookups lie at ``lookups`` (positions, :data:`FEW_LOOKUPS` at most): more instances than
    lookups, a lookup from one instance's length before the loop to its first instance's end
    (the forward opens with it), and none in the loop's later instances (a gather after the
    loop, the sampler's, is the forward's tail)."""
    if not 0 < lookups.size <= FEW_LOOKUPS or bounds.size - 1 <= lookups.size:
        return False
    first = int(bounds[1] - bounds[0]) if bounds.size > 1 else 0
    opens = bool(((lookups >= bounds[0] - first) & (lookups < bounds[0] + first)).any())
    within = bool(((lookups >= bounds[0] + first) & (lookups < bounds[-1])).any())
    return opens and not within


#: PyTorch's ``index_select`` kernel for at most 16 rows (its grid follows the row width).
SMALL_GATHER_NAME = r"indexSelectSmallIndex"
#: Kernels that pick the next token (argmax, top-k, sort, sampling).
SAMPLING_NAMES = r"(?i)argmax|topk|top_k|multinomial|sampl|radix_sort|sort_|gumbel"
#: At least this many forwards make a loop of forwards.
MIN_FORWARDS = 3
#: A number of attention sites per instance is a model's depth when at least this share of
#: the loop's instances (and at least :data:`MIN_FORWARDS`) hold it.
DEPTH_SHARE = 0.05

#: Attention kernels alone mark the sites when the loop they give has at least this share of
#: instances with a model's number of sites; else softmax kernels are tried as sites too (a
#: decode that runs attention as matrix products at some lengths).
CLEAN_SHARE = 0.8

#: Columns of :attr:`ForwardPasses.frame`, in order.
FORWARD_COLUMNS: dict[str, pl.DataType | type[pl.DataType]] = {
    "forward": pl.Int64, "model": pl.Int64, "attention": pl.Int64, "first_op": pl.Int64, "stop_op": pl.Int64,
    "start_ns": pl.Int64, "end_ns": pl.Int64, "gpu_busy_ns": pl.Int64, "ops": pl.Int64, "idle_before_ns": pl.Int64,
    "tokens_in": pl.Int64, "few_tokens": pl.Boolean, "embedding": pl.Boolean, "sampling": pl.Boolean, "gemm_set": pl.Int64,
    "host_sync": pl.Boolean, "token_ns": pl.Int64,
}


@dataclass(frozen=True)
class ForwardPasses:
    """The forward passes of one GPU's operations (:func:`forward_passes`).

    ``frame``: one row per forward (:data:`FORWARD_COLUMNS`): ``forward`` (0-based, in time
    order), ``model`` (index into ``depths``; -1 when its number of attention sites is none of
    them: an encoder's forward run together with the decoder's first), ``attention`` (its
    attention sites), ``first_op``/``stop_op`` (its operations' rows in the sequence given,
    ``[first_op, stop_op)``), ``start_ns``/``end_ns`` (GPU span), ``gpu_busy_ns`` (union of its
    operations), ``ops``, ``idle_before_ns`` (GPU idle between the previous forward's end and
    its start; 0 for the first), ``tokens_in`` (rows its embedding gather read, or null),
    ``gemm_set`` (a code of the distinct matrix-product kernels it ran: equal codes, same
    kernels), ``host_sync`` (a device-to-host copy among its operations after its last
    attention site), ``token_ns`` (when the first such copy after its sampling, or after its
    LM head where nothing samples, ended: its token on the host; null without one),
    ``embedding`` (an embedding lookup opened it), ``few_tokens`` (that lookup gathered at most
    :data:`FEW_ROWS` rows), ``sampling`` (sampling kernels after its last attention site). ``sites``: ``"attention"`` or ``"softmax"``; ``depths``: the attention
    sites per forward of each model, the model with most forwards first; ``anchors``: the
    loop's once-per-forward operation names (text names only)."""

    frame: pl.DataFrame
    sites: str
    depths: tuple[int, ...]
    anchors: tuple[str, ...] = ()

    @property
    def count(self) -> int:
        return self.frame.height

    def evidence(self) -> str:
        """One sentence: how many forwards, of which models, found how."""
        what = "attention kernels" if self.sites == "attention" else "softmax kernels (attention as matrix products)"
        per = self.frame.group_by("model").len()
        parts = []
        for m, d in enumerate(self.depths):
            n = per.filter(pl.col("model") == m)["len"]
            parts.append(f"{int(n[0]) if n.len() else 0} of {d}")
        odd = per.filter(pl.col("model") < 0)["len"]
        tail = f" (+{int(odd[0])} with another number)" if odd.len() else ""
        return (f"{self.count} forward passes, each running the layer stack once: "
                + ", ".join(parts) + f" {what} per forward{tail}")


def _masks(names: pl.Series, codes: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Per operation, which kinds of kernel it is. With ``codes``, ``names`` are the distinct
    names (``names[code]``): each pattern is matched once per name, not once per operation."""
    s = names.cast(pl.Utf8).fill_null("")
    out = {
        "attention": (s.str.contains(ATTENTION_NAMES) & ~s.str.contains(FUSED_NAMES)).to_numpy(),
        "softmax": s.str.contains(SOFTMAX_NAMES).to_numpy(),
        "d2h": (s == HOST_COPY_NAME).to_numpy(),
        "gemm": s.str.contains(GEMM_NAMES).to_numpy(),
        "gather": s.str.contains(GATHER_NAME).to_numpy(),
        "embedding": token_lookup_names(s).to_numpy(),
        "small_gather": s.str.contains(SMALL_GATHER_NAME).to_numpy(),
        "sampling": s.str.contains(SAMPLING_NAMES).to_numpy(),
    }
    if codes is None:
        return out
    at = np.clip(codes, 0, max(len(s) - 1, 0))
    known = codes >= 0
    return {k: (v[at] & known) if len(s) else np.zeros(codes.size, dtype=bool) for k, v in out.items()}


def _site_starts(mask: np.ndarray) -> np.ndarray:
    """Positions of the first operation of each run of consecutive ``mask`` operations."""
    prev = np.concatenate([[False], mask[:-1]])
    return np.nonzero(mask & ~prev)[0]


def _best_loop(codes: np.ndarray, site_mask: np.ndarray, starts: np.ndarray, ends: np.ndarray,
               min_forwards: int, embedding: np.ndarray | None = None) -> tuple[tuple[int, float], object, np.ndarray, np.ndarray] | None:
    """The loop whose instances are forwards, for one choice of attention sites: the most
    instances holding a model's number of sites (ties: the larger share of its instances);
    where ``embedding`` marks token embedding lookups, no loop of the layers of a few forwards
    (:func:`inside_few_forwards`)."""
    sites = _site_starts(site_mask)
    if sites.size < 2 * min_forwards:
        return None
    marked = np.where(site_mask, int(codes.max()) + 1, codes)  # every attention kernel one name
    lookups = np.flatnonzero(embedding) if embedding is not None else np.empty(0, dtype=np.int64)
    best = None
    for lp in find_loops(marked, starts, ends, min_repeats=min_forwards):
        bounds = np.append(lp.bounds, lp.stop)
        if inside_few_forwards(lookups, bounds):
            continue  # the layers of the few forwards there are
        per = np.diff(np.searchsorted(sites, bounds))
        values, counts = np.unique(per, return_counts=True)
        depths = values[(counts >= max(min_forwards, DEPTH_SHARE * per.size)) & (values >= 2)]
        if depths.size == 0:
            continue
        if not _whole_stacks(sites, bounds, per):
            continue
        clean = np.isin(per, depths)
        key = (int(clean.sum()), float(clean.mean()))
        if best is None or key > best[0]:
            best = (key, lp, per, depths)
    return best


#: Looks up the grid (``grid_x``) of some kernels: given their ``ops`` rows (``device_id``,
#: ``correlation_id``, ``start_ns``), one value per row (null where unknown).
GridLookup = Callable[[pl.DataFrame], pl.Series]


#: A loop's instances are whole forwards when at least this share of the stretches between
#: one instance's last attention site and the next one's first hold more operations than the
#: usual stretch between two sites of one instance (the head and tail of a forward: LM head,
#: sampling, embedding); instances that cut a stack between two layers do not.
WHOLE_SHARE = 0.75


def _whole_stacks(sites: np.ndarray, bounds: np.ndarray, per: np.ndarray) -> bool:
    """Whether the loop's instances (``bounds``) hold whole layer stacks (:data:`WHOLE_SHARE`)."""
    first = np.searchsorted(sites, bounds[:-1])
    inner = np.diff(sites)
    idx = np.arange(inner.size)
    # site k to k + 1 lies within one instance when k + 1 is not an instance's first site
    starts_at = np.zeros(sites.size, dtype=bool)
    starts_at[first[(per > 0) & (first < sites.size)]] = True
    within = inner[~starts_at[idx + 1]]
    across = inner[starts_at[idx + 1]]
    if within.size == 0 or across.size == 0:
        return True
    return float(np.mean(across > np.median(within))) >= WHOLE_SHARE


def forward_passes(ops: pl.DataFrame, labels: pl.Series | None = None, *, grid: GridLookup | None = None,
                   min_forwards: int = MIN_FORWARDS) -> ForwardPasses | None:
    """The forward passes in one GPU's operations (see the module doc).

    Parameters
    ----------
    ops
        One GPU's operations sorted by start: ``start_ns``, ``end_ns`` (ns), ``name`` (text, or
        integer codes with ``labels``); optional ``grid_x`` (kernels' grid, for ``tokens_in``).
    labels
        When ``name`` holds integer codes: the text of each code (``labels[code]``).
    grid
        Where ``ops`` has no ``grid_x``: a lookup of the embedding gathers' grids
        (:data:`GridLookup`), for ``tokens_in``.

    Returns
    -------
    :class:`ForwardPasses`, or ``None`` when no loop of at least ``min_forwards`` instances
    holding two or more attention sites each is found (not a transformer's forwards: a
    convolutional model, a microbenchmark, a loop of one layer).
    """
    if ops.height < 4 * min_forwards or "name" not in ops.columns:
        return None
    names = ops["name"]
    if names.dtype.is_integer():
        if labels is None:
            return None
        codes = name_codes(names)
        distinct = pl.Series(labels)
    else:  # codes of the distinct names in order of first appearance (deterministic)
        distinct = names.drop_nulls().unique(maintain_order=True)
        codes = names.replace_strict(distinct, pl.int_range(distinct.len(), dtype=pl.Int64, eager=True), default=-1,
                                     return_dtype=pl.Int64).fill_null(-1).to_numpy()
    m = _masks(distinct, codes)
    starts = ops["start_ns"].to_numpy()
    ends = ops["end_ns"].to_numpy()
    choices = [("attention", m["attention"]), ("attention", m["attention"] | m["softmax"]), ("softmax", m["softmax"])]
    found = None
    for label, mask in choices:  # attention kernels alone first: sampling runs a softmax too
        if not mask.any():
            continue
        got = _best_loop(codes, mask, starts, ends, min_forwards, m["embedding"])
        if got is not None and (found is None or got[0] > found[0][0]):
            found = (got, label, mask)
        if found is not None and found[0][0][1] >= CLEAN_SHARE:
            break
    if found is None:
        return None
    (_, loop, per, depths), label, mask = found
    frame = _forward_rows(loop, per, depths, mask, m, ops, codes, starts, ends, grid)
    if frame.height < min_forwards:
        return None
    order = frame.filter(pl.col("model") >= 0).group_by("attention").len().sort(["len", "attention"], descending=[True, False])
    ranked = tuple(int(a) for a in order["attention"])
    remap = {a: i for i, a in enumerate(ranked)}
    frame = frame.with_columns(pl.col("attention").replace_strict(remap, default=-1, return_dtype=pl.Int64).alias("model"))
    anchors = tuple(dict.fromkeys(str(distinct[int(a)]) for a in getattr(loop, "anchors", ()) if 0 <= int(a) < len(distinct)))
    return ForwardPasses(frame.select([pl.col(c).cast(t) for c, t in FORWARD_COLUMNS.items()]), label, ranked, anchors)


def _token_copy(last_site: int, stop: int, d2h: np.ndarray, sampling: np.ndarray, gemm: np.ndarray) -> int | None:
    """The first device-to-host copy after a forward's sampling (after its LM head's product
    where nothing samples), in ``[last_site, stop)``: its token reaching the host."""
    sampled = np.nonzero(sampling[last_site:stop])[0]
    if sampled.size:
        after = last_site + int(sampled[-1])
    else:
        g = np.nonzero(gemm[last_site:stop])[0]
        after = last_site + (int(g[-1]) if g.size else 0)
    copies = np.nonzero(d2h[after:stop])[0]
    return after + int(copies[0]) if copies.size else None


def _forward_rows(loop, per: np.ndarray, depths: np.ndarray, mask: np.ndarray, m: dict[str, np.ndarray],  # noqa: ANN001
                  ops: pl.DataFrame, codes: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                  lookup: GridLookup | None) -> pl.DataFrame:
    """One row per forward of ``loop`` (instances without an attention site are folded into
    the forward before them), with boundaries placed at the host's synchronisation."""
    sites = _site_starts(mask)
    site_end = np.nonzero(mask & ~np.concatenate([mask[1:], [False]]))[0]  # last op of each run
    bounds = np.append(loop.bounds, loop.stop)
    keep = per > 0
    first_site = np.searchsorted(sites, bounds[:-1])[keep]  # index into sites of each forward's first site
    n_sites = per[keep]
    lo = bounds[:-1][keep].astype(np.int64)
    stop = int(loop.stop)
    gap = idle_before(starts, ends)
    d2h = m["d2h"]
    cut = lo.copy()
    emb = m["embedding"]
    if lo.size > 1:  # the first forward's head: as far back as the others' heads reach, twice over
        heads = sites[first_site[1:]] - lo[1:]
        lo[0] = max(0, int(sites[first_site[0]]) - 2 * int(np.median(heads)), int(lo[0]) - int(np.median(heads)))
    for j in range(lo.size):
        s0 = int(sites[first_site[j]])  # this forward's first attention op
        a = int(site_end[first_site[j - 1] + n_sites[j - 1] - 1]) + 1 if j else int(lo[0])  # after the previous stack
        a = min(a, s0)
        # the forward begins with its embedding lookup (the last one before its first
        # attention: a mixture of experts gathers tokens after the previous one's attention);
        # without one, after the host's last synchronisation before it, else after the longest
        # idle gap, else where the loop's instance starts
        e = np.nonzero(emb[a:s0])[0]
        hits = np.nonzero(d2h[a:s0])[0]
        if e.size:
            cut[j] = a + int(e[-1])
        elif hits.size:
            cut[j] = a + int(hits[-1]) + 1
        elif j and s0 > a:
            cut[j] = a + int(np.argmax(gap[a : s0 + 1]))
        cut[j] = min(max(int(cut[j]), a), s0)
    stops = np.append(cut[1:], stop)
    # a forward ends with the host's synchronisation after its stack (the sampled tokens'
    # copies): the last device-to-host copy after its token's before the next embedding
    # lookup (an encoder's, or the next forward's). What runs between that and the next
    # forward (the host preparing the next call: position ids, a new request's inputs, an
    # encoder) belongs to no forward of this loop
    sampling, gemm = m["sampling"], m["gemm"]
    last_sites = np.array([int(site_end[first_site[j] + n_sites[j] - 1]) for j in range(lo.size)], dtype=np.int64)
    for j in range(lo.size):
        ls, b = int(last_sites[j]), int(stops[j])
        tail = np.nonzero(d2h[ls:b])[0]
        if not tail.size:
            continue
        token = _token_copy(ls, b, d2h, sampling, gemm)
        if token is not None:
            nxt = np.nonzero(emb[token:b])[0]
            if nxt.size:
                inside = np.nonzero(d2h[token : token + int(nxt[0])])[0]
                stops[j] = token + int(inside[-1]) + 1
                continue
        stops[j] = ls + int(tail[-1]) + 1
    spans = [(int(cut[j]), int(stops[j]), int(n_sites[j]), int(last_sites[j])) for j in range(lo.size)]
    # another stack between two forwards, opened by its own embedding lookup (an encoder run
    # once per request before the decoder's first step): a forward of its own
    both = mask | m["softmax"] | m["attention"]
    extra = []
    before = np.nonzero(d2h[: int(cut[0])])[0]
    regions = [(int(before[-1]) + 1 if before.size else 0, int(cut[0]))]
    regions += [(int(stops[j]), int(cut[j + 1])) for j in range(lo.size - 1)]
    for a, b in regions:
        if b - a < 4:
            continue
        runs = _site_starts(both[a:b])
        e = np.nonzero(emb[a:b])[0]
        if runs.size >= 2 and e.size and e[0] < runs[0]:
            last = a + int(np.nonzero(both[a:b])[0][-1])
            extra.append((a + int(e[0]), b, int(runs.size), last))
    spans = sorted(spans + extra)
    prev_end = np.maximum.accumulate(ends)
    grid: np.ndarray | None = None
    if "grid_x" in ops.columns:
        grid = ops["grid_x"].cast(pl.Float64).to_numpy()
    elif lookup is not None:  # only the gathers' grids are looked up
        at = np.nonzero(m["gather"])[0]
        grid = np.full(starts.size, np.nan)
        if at.size:
            keys = [c for c in ("device_id", "correlation_id", "start_ns") if c in ops.columns]
            grid[at] = lookup(ops[at.tolist()].select(keys)).cast(pl.Float64).to_numpy()
    gemm_codes = np.where(gemm, codes, -1)
    # attention run as matrix products: the products on either side of each softmax site
    # (scores, weighted values) follow the cached length, not the tokens; leave them out
    soft = np.nonzero(mask & m["softmax"])[0]
    gpos = np.nonzero(gemm)[0]
    if soft.size and gpos.size:
        at = np.searchsorted(gpos, soft)
        gemm_codes[gpos[np.clip(at - 1, 0, gpos.size - 1)]] = -1
        gemm_codes[gpos[np.clip(at, 0, gpos.size - 1)]] = -1
    rows: list[tuple[object, ...]] = []
    for a, b, n_here, last_site in spans:
        if b <= a:
            continue
        st, en = starts[a:b], ends[a:b]
        run_end = np.maximum.accumulate(en)
        new = np.concatenate([[True], st[1:] > run_end[:-1]])
        idx = np.nonzero(new)[0]
        block_end = np.append(run_end[idx[1:] - 1], run_end[-1])
        busy = int((block_end - st[idx]).sum())
        # the embedding lookup at its head: the rows it gathered (batch × tokens)
        first_site_op = a + int(np.nonzero(both[a:b])[0][0]) if both[a:b].any() else b
        head = np.nonzero(emb[a:first_site_op])[0]
        tokens, few = None, False
        if head.size:
            at_head = a + int(head[-1])
            few = bool(m["small_gather"][at_head])  # index_select's kernel for at most 16 rows
            if grid is not None and m["gather"][at_head] and not np.isnan(grid[at_head]):
                tokens = int(grid[at_head])
        distinct = np.unique(gemm_codes[a:b])
        distinct = distinct[distinct >= 0]
        sig = zlib.crc32(distinct.astype(np.int64).tobytes()) if distinct.size else 0
        sync = bool(d2h[last_site:b].any())
        sampled = bool(sampling[last_site:b].any())
        tc = _token_copy(last_site, b, d2h, sampling, gemm)
        token = int(ends[tc]) if tc is not None else None
        rows.append((len(rows), n_here, n_here, a, b, int(st.min()), int(en.max()), busy, b - a,
                     int(max(st.min() - prev_end[a - 1], 0)) if a else 0, tokens, few, bool(head.size), sampled, sig, sync, token))
    frame = pl.DataFrame(rows, schema=["forward", "model", "attention", "first_op", "stop_op", "start_ns", "end_ns", "gpu_busy_ns",
                                       "ops", "idle_before_ns", "tokens_in", "few_tokens", "embedding", "sampling", "gemm_set",
                                       "host_sync", "token_ns"], orient="row")
    dset = {int(d) for d in depths}
    return frame.with_columns(pl.when(pl.col("attention").is_in(list(dset))).then(pl.col("attention")).otherwise(-1).alias("model"))


# -- which forwards make tokens -------------------------------------------------------------

#: Columns :func:`read_tokens` adds to the forwards.
READING_COLUMNS: dict[str, pl.DataType | type[pl.DataType]] = {
    "role": pl.Utf8, "phase": pl.Utf8, "engine_step": pl.Int64,
}
#: A forward that runs other matrix-product kernels than the model's usual decode forward is a
#: prompt's forward (prefill) when its embedding gathered more rows than this …
FEW_ROWS = 16
#: … and more than this many times the decode forwards' rows; where the rows are not known,
#: when its GPU busy time is over this many times the median decode forward's.
PREFILL_ROWS_FACTOR = 2.0
PREFILL_BUSY_FACTOR = 1.05
#: The forwards make tokens when at least this share of the main model's begin with an
#: embedding lookup.
EMBEDDING_SHARE = 0.9


@dataclass(frozen=True)
class TokenReading:
    """What :func:`read_tokens` read of the forwards: ``forwards`` (:class:`ForwardPasses`'
    frame plus ``role``: ``main`` for the model that does most of the GPU work, ``encoder`` for
    another stack run just before one of its forwards without sampling (an encoder-decoder's
    encoder), ``draft`` for another model whose forwards run between the main model's
    (assisted generation's draft), ``other``; ``phase``: ``prefill``/``decode`` of the main model's forwards, null for the
    others; ``engine_step``: the host steps, each ending with a device-to-host copy),
    ``serving`` (continuous batching seen), ``tokens`` (why these forwards make tokens, or
    ``None``: then they are a model's forwards without tokens, a diffusion sampler's or an
    image classifier's) and ``notes`` (what cannot be known)."""

    passes: ForwardPasses
    forwards: pl.DataFrame
    main: int
    serving: bool
    tokens: str | None
    notes: tuple[str, ...] = ()

    @property
    def main_forwards(self) -> pl.DataFrame:
        return self.forwards.filter(pl.col("role") == "main")


def read_tokens(fp: ForwardPasses) -> TokenReading:
    """Prefill and decode forwards, the host's steps and whether the forwards make tokens.

    The **main model** is the one whose forwards hold the most GPU busy time (a forward with
    another number of attention sites that holds at least the main model's, an encoder run
    with a decoder's first step, counts as the main model's). Its usual forward, the
    matrix-product kernels most of its forwards run (``gemm_set``), is a decode step; a
    forward with other kernels is a **prefill** when its embedding gathered more than
    :data:`FEW_ROWS` rows and :data:`PREFILL_ROWS_FACTOR` times a decode forward's, or, where
    the rows are not known, when it kept the GPU busy :data:`PREFILL_BUSY_FACTOR` times the
    median decode forward (a prompt does more work; forwards that only batch other rows, a
    verify step's few candidate tokens, do not). Another model's forwards that run between the
    main model's are a **draft** (speculative decoding). **Engine steps** end with a
    device-to-host copy; it is **serving** (continuous batching) when steps run a prompt's
    forward together with a decode forward of other requests, at least twice or with decode
    batches of varying rows. The forwards **make tokens** when :data:`EMBEDDING_SHARE` of the
    main model's begin with an embedding lookup and either a prefill is followed by decode
    forwards or (a capture that starts mid-generation) every forward gathers few rows and
    samples."""
    f = fp.frame
    busy = f.filter(pl.col("model") >= 0).group_by("model").agg(pl.col("gpu_busy_ns").sum()).sort(
        ["gpu_busy_ns", "model"], descending=[True, False])
    main = int(busy["model"][0]) if busy.height else 0
    depth = fp.depths[main] if fp.depths else 0
    is_main = (pl.col("model") == main) | ((pl.col("model") < 0) & (pl.col("attention") >= depth))
    # a stack of its own run just before the main model's forward, without sampling: an encoder
    encoder = (pl.col("model") < 0) & ~pl.col("sampling") & is_main.shift(-1).fill_null(False) & ~is_main
    f = f.with_columns(pl.when(is_main).then(pl.lit("main")).when(encoder).then(pl.lit("encoder")).otherwise(pl.lit("other")).alias("role"))
    # another model's forwards between the main model's: a draft
    pos = pl.int_range(pl.len())
    main_pos = f.with_columns(pos.alias("_i")).filter(pl.col("role") == "main")["_i"]
    if main_pos.len() >= 2:
        lo, hi = int(main_pos.min()), int(main_pos.max())  # type: ignore[arg-type]
        f = f.with_columns(pl.when((pl.col("role") == "other") & (pos > lo) & (pos < hi)).then(pl.lit("draft"))
                           .otherwise(pl.col("role")).alias("role"))
    mf = f.filter(pl.col("role") == "main")
    modal = mf.group_by("gemm_set").len().sort(["len", "gemm_set"], descending=[True, False])
    usual = int(modal["gemm_set"][0]) if modal.height else 0
    dec = mf.filter(pl.col("gemm_set") == usual)
    dec_rows = dec["tokens_in"].drop_nulls()
    # a decode forward's rows: known from its gather's grid, else at most FEW_ROWS (index_select's
    # kernel for few rows) or not known
    limit = max(float(FEW_ROWS), PREFILL_ROWS_FACTOR * float(dec_rows.median())) if dec_rows.len() else float(FEW_ROWS)  # type: ignore[arg-type]
    busy_med = float(dec["gpu_busy_ns"].median() or 0) if dec.height else 0.0  # type: ignore[arg-type]
    known = pl.col("tokens_in").is_not_null()
    heavy = pl.when(known).then(pl.col("tokens_in") > limit).otherwise(pl.col("gpu_busy_ns") > PREFILL_BUSY_FACTOR * busy_med)
    after_encoder = (pl.col("role").shift(1) == "encoder").fill_null(False)
    prefill = (pl.col("role") == "main") & ((pl.col("gemm_set") != usual) & heavy | (pl.col("model") < 0) | after_encoder)
    f = f.with_columns(pl.when(prefill).then(pl.lit("prefill")).when(pl.col("role") == "main").then(pl.lit("decode"))
                       .otherwise(None).alias("phase"))
    # host steps: each ends with the forward that copies to the host
    f = f.with_columns((pl.col("host_sync").cast(pl.Int64).cum_sum().shift(1, fill_value=0)).alias("engine_step"))
    mf = f.filter(pl.col("role") == "main")
    per_step = mf.group_by("engine_step").agg((pl.col("phase") == "prefill").sum().alias("p"), (pl.col("phase") == "decode").sum().alias("d"))
    mixed = per_step.filter((pl.col("p") > 0) & (pl.col("d") > 0)).height
    dec_rows = mf.filter(pl.col("phase") == "decode")["tokens_in"].drop_nulls()
    varying = dec_rows.n_unique() >= 3
    serving = mixed >= 2 or (mixed >= 1 and varying)
    n_pre = int((mf["phase"] == "prefill").sum())
    n_dec = int((mf["phase"] == "decode").sum())
    emb = float(mf["embedding"].mean() or 0) if mf.height else 0.0  # type: ignore[arg-type]
    samp = float(mf["sampling"].mean() or 0) if mf.height else 0.0  # type: ignore[arg-type]
    sync = float(mf["host_sync"].mean() or 0) if mf.height else 0.0  # type: ignore[arg-type]
    few = float(mf.filter(pl.col("phase") == "decode")["few_tokens"].mean() or 0) if n_dec else 0.0  # type: ignore[arg-type]
    tokens = None
    notes: list[str] = []
    if emb >= EMBEDDING_SHARE and n_pre and n_dec >= n_pre:
        rows = mf.filter(pl.col("phase") == "prefill")["tokens_in"].drop_nulls()
        shown = (f" of {int(rows.min()):,}–{int(rows.max()):,} rows" if rows.len() and rows.min() != rows.max()  # type: ignore[arg-type]
                 else f" of {int(rows[0]):,} rows" if rows.len() else "")
        tokens = (f"each forward begins with an embedding lookup; {n_pre} prompt forward(s){shown} (other matrix-product "
                  f"kernels, more rows or more work than the usual forward) each followed by one-token forwards"
                  + (", which end by sampling" if samp >= EMBEDDING_SHARE else "")
                  + (" and copying to the host" if sync >= EMBEDDING_SHARE else ""))
    elif emb >= EMBEDDING_SHARE and n_dec and few >= EMBEDDING_SHARE and samp >= EMBEDDING_SHARE:
        tokens = ("each forward gathers at most 16 embedding rows and ends by sampling: one-token forwards; the prompt's "
                  "forward is not in the capture")
    if tokens is not None and sync < 0.5:
        notes.append("the host does not wait for each token (no device-to-host copy after most forwards): a compiled or "
                     "asynchronous loop, so host time per token cannot be read off the GPU's")
    return TokenReading(fp, f, main, serving and tokens is not None, tokens, tuple(notes))


def add_graph_replays(reading: TokenReading, launches: pl.DataFrame | None, keys: dict[str, object], *,
                      min_replays: int = MIN_FORWARDS) -> TokenReading:
    """``reading`` with the replays of CUDA graphs on the same GPU (``keys``: ``device_id``,
    ``rank``) as decode forwards of the main model: ``torch.compile(mode="reduce-overhead")``
    and serving engines capture the decode forward in a graph, whose kernels a graph-level
    trace does not show, while the prompt's forward runs eagerly. Graphs replayed at least
    ``min_replays`` times count (one per request in ``generate()`` with a static cache)."""
    if launches is None or launches.height == 0 or reading.tokens is None:
        return reading
    sel = pl.all_horizontal([pl.col(k) == v for k, v in keys.items() if k in launches.columns] or [pl.lit(True)])
    g = launches.filter(sel)
    if g.height == 0:
        return reading
    counts = g.group_by("graph_exec_id").len().filter(pl.col("len") >= min_replays)
    g = g.join(counts.select("graph_exec_id"), on="graph_exec_id")
    if g.height == 0:
        return reading
    f = reading.forwards
    rows = g.select(
        pl.lit(-1, pl.Int64).alias("forward"), pl.lit(reading.main, pl.Int64).alias("model"), pl.lit(None, pl.Int64).alias("attention"),
        pl.lit(None, pl.Int64).alias("first_op"), pl.lit(None, pl.Int64).alias("stop_op"), "start_ns", "end_ns",
        pl.col("gpu_time_ns").alias("gpu_busy_ns"), pl.col("kernels").fill_null(1).cast(pl.Int64).alias("ops"),
        pl.lit(0, pl.Int64).alias("idle_before_ns"), pl.lit(None, pl.Int64).alias("tokens_in"), pl.lit(False).alias("few_tokens"),
        pl.lit(False).alias("embedding"), pl.lit(False).alias("sampling"), pl.lit(-1, pl.Int64).alias("gemm_set"),
        pl.lit(True).alias("host_sync"), pl.lit(None, pl.Int64).alias("token_ns"), pl.lit("main").alias("role"),
        pl.lit("decode").alias("phase"), pl.lit(None, pl.Int64).alias("engine_step"))
    out = pl.concat([f, rows.select(f.columns)], how="vertical_relaxed").sort("start_ns").with_columns(
        pl.int_range(pl.len(), dtype=pl.Int64).alias("forward"),
        pl.col("host_sync").cast(pl.Int64).cum_sum().shift(1, fill_value=0).alias("engine_step"))
    n = int(counts["len"].sum())
    note = (f"{n:,} replays of {counts.height} CUDA graph(s) run the decode forwards (their kernels are inside the graphs: "
            "a graph-level trace does not show their attention)")
    return TokenReading(reading.passes, out, reading.main, reading.serving, reading.tokens, (*reading.notes, note))
