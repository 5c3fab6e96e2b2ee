"""Loops in a GPU's sequence of operations, found from the names that run once per instance.

A training step, a ``generate()`` call, a decode token and a benchmark repetition each launch
some operations exactly once: the loss and the embedding's backward once per step, the
sampling kernel and the token's device-to-host copy once per token, the prompt's attention
once per ``generate()`` call. :func:`find_loops` groups the operation names of one GPU by how
often they ran; a group of names that ran ``c`` times each, always in the same order within
each of ``c`` disjoint stretches of the sequence, marks a loop of ``c`` instances (its
*anchors*). Loops nest: calls hold tokens, steps hold layers; the rarest loop that covers most
of the sequence is the outermost.

This is robust where a plain period search is not: operations on other streams (NCCL
all-reduces overlapping the backward, copies) interleave differently in each instance, the
first instance runs extra set-up kernels, and a model's layers repeat more often than its
steps (a period search finds the layer). Instance boundaries sit a fixed number of operations before each instance's first anchor,
within the operations that precede the first anchor alike in every instance, where the GPU
idles longest before most instances (a step starts after the host prepared it): the batch's
copy to the GPU belongs to its step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import polars as pl

__all__ = ["HOST_COPY_NAME", "Loop", "find_loops", "host_copy_codes", "idle_before", "main_loop", "name_codes", "split_at_host_copies", "token_loop"]

#: At most this many names of one count are compared with each other (their alignment is
#: checked pairwise).
_MAX_NAMES = 64


@dataclass(frozen=True)
class Loop:
    """One loop of a sequence of operations (indices into that sequence).

    ``count`` instances; ``anchors`` the name codes that run exactly once in each, in order;
    ``bounds[j]`` the index of instance ``j``'s first operation; ``stop`` one past the last
    instance's last operation; ``coverage`` the share of the sequence's operations inside
    instances of at most :data:`_TYPICAL` times the median instance's operations.
    """

    count: int
    anchors: tuple[int, ...]
    bounds: np.ndarray
    stop: int
    coverage: float
    #: Share of the operations' summed time inside those instances.
    time_coverage: float = 1.0

    @property
    def regular(self) -> float:
        """Share of the instances after the first (which may be a warm-up with extra work) that
        hold the most common number of operations (± 0.5 %, rounded down): 1.0 for a loop whose
        every instance launches the same work."""
        sizes = self.sizes()
        rest = sizes[1:] if sizes.size > 1 else sizes
        values, counts = np.unique(rest, return_counts=True)
        mode = int(values[np.argmax(counts)])
        return float(np.mean(np.abs(rest - mode) <= int(0.005 * mode)))

    @property
    def ops_per_instance(self) -> float:
        """Median operations per instance."""
        sizes = self.sizes()
        return float(np.median(sizes)) if sizes.size else 0.0

    def sizes(self) -> np.ndarray:
        """Operations in each instance."""
        return np.diff(np.append(self.bounds, self.stop))


def idle_before(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For each operation (sorted by start), how long the GPU was idle just before it: its
    start minus the latest end of the operations before it (0 for the first; negative values,
    overlap, become 0; so do those next to a missing time, NaN where a damaged export's cell
    read as null). ns."""
    if starts.size == 0:
        return np.zeros(0, dtype=np.int64)
    gap = np.zeros(starts.size, dtype=np.int64)
    if starts.dtype.kind == "f" or ends.dtype.kind == "f":
        prev = np.fmax.accumulate(ends)  # the latest end known so far, skipping missing ones
        d = starts[1:] - prev[:-1]
        gap[1:] = np.where(d > 0, d, 0)  # NaN > 0 is false: no gap where a time is missing
        return gap
    prev_end = np.maximum.accumulate(ends)
    # in place: no temporaries the size of the operations (2 M: 32 MB less at the structure's peak)
    np.subtract(starts[1:], prev_end[:-1], out=gap[1:])
    del prev_end
    np.maximum(gap[1:], 0, out=gap[1:])
    return gap


def _aligned_with(ref: np.ndarray, other: np.ndarray) -> bool:
    """``other``'s j-th occurrence sits between ``ref``'s j-th and (j+1)-th for every j, or
    between its (j-1)-th and j-th for every j."""
    after = bool(np.all(other > ref)) and bool(np.all(other[:-1] < ref[1:]))
    if after:
        return True
    return bool(np.all(other < ref)) and bool(np.all(other[1:] > ref[:-1]))


def _group(positions: np.ndarray) -> np.ndarray | None:
    """Rows of ``positions`` (names × occurrences) that are mutually aligned with the row
    aligned with the most others; ``None`` when no instance structure holds."""
    k = positions.shape[0]
    if k == 1:
        return np.array([0])
    best: list[int] = []
    for r in range(k):
        members = [r] + [a for a in range(k) if a != r and _aligned_with(positions[r], positions[a])]
        if len(members) > len(best):
            best = members
        if len(best) == k:
            break
    rows = np.array(sorted(best))
    sub = positions[rows]
    # instances must not overlap: the last anchor of one before the first anchor of the next
    if sub.shape[1] > 1 and not np.all(sub.max(axis=0)[:-1] < sub.min(axis=0)[1:]):
        return None
    return rows


#: Instance boundaries are chosen over at most this many instances and this many operations
#: before the first anchor (the search is a matrix of both).
_BOUND_INSTANCES = 2000
_BOUND_LEAD = 4096
#: Offsets of that matrix worked through at a time.
_OFFSETS_AT_ONCE = 256
#: The operations before an instance's first anchor match the first instance's in at least this
#: share of instances, position by position.
_LEAD_MATCH = 0.8
#: An instance starts up to two operations away from the usual offset only where the GPU idled
#: more than twice as long there, and by at least this much (ns).
_CLEAR_GAP_NS = 5_000
#: :attr:`Loop.coverage` counts the instances of at most this many times the median size.
_TYPICAL = 3.0


def _bounds(lo: np.ndarray, hi: np.ndarray, gap: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Each instance's first operation: ``d`` operations before its first anchor, the same
    ``d`` for every instance (± 2 for operations of other streams interleaving differently);
    where the number of operations between one instance's last anchor and the next one's
    first varies, right after the previous instance's last anchor or at the first anchor,
    whichever follows the longer idle gaps (median over instances).

    The ``d`` operations before the first anchor must be the same in every instance, the
    first one included (at least :data:`_LEAD_MATCH` of them, position by position): what comes
    before the first instance is start-up, not the end of an instance, so the prefix cannot
    reach back into the previous instance. Within that prefix, ``d`` is where the GPU idles
    longest before most instances (the lower quartile over instances of the idle time at that
    offset: a gap that only the cold first instance has does not count); ``d`` = 0 when none
    idles."""
    c = lo.size
    bounds = lo.astype(np.int64).copy()
    if c < 2:
        return bounds
    room = lo[1:] - hi[:-1] - 1  # operations between one instance's last anchor and the next one's first
    if int(room.max()) - int(room.min()) > max(2, int(0.02 * float(np.median(room)))):
        # the operations between anchors vary (an engine step that also runs a prompt's
        # forward before the copy of the sampled tokens that ends it): an instance starts
        # either right after the previous one's last anchor or at its own first anchor,
        # whichever follows longer idle gaps (the host prepares each step)
        after = np.concatenate([[max(int(lo[0]) - int(np.median(room)), 0)], hi[:-1] + 1]).astype(np.int64)
        after = np.minimum(after, lo)
        return after if float(np.median(gap[after])) > float(np.median(gap[lo])) else bounds
    dmax = int(min(int(room.min()), int(lo[0]), _BOUND_LEAD))
    if dmax <= 0:
        return bounds
    pick = lo
    if pick.size > _BOUND_INSTANCES:
        pick = pick[np.linspace(0, pick.size - 1, _BOUND_INSTANCES).astype(np.int64)]
    # per offset: share of instances whose op there is instance 0's
    same = _per_offset(pick, dmax, lambda at: (codes[at] == codes[at[:1]]).mean(axis=0))
    bad = np.nonzero(same[1:] < _LEAD_MATCH)[0]
    dmax = int(bad[0]) if bad.size else dmax  # the last offset before the first mismatch
    score = _per_offset(pick, dmax, lambda at: np.quantile(gap[at], 0.25, axis=0))
    best = int(np.argmax(score))  # ties: the smallest offset
    lower = np.concatenate([[-1], hi[:-1]])  # a bound stays after the previous instance's last anchor
    for j in range(c):
        at_j = max(int(lo[j]) - best, int(lower[j]) + 1, 0)
        a = max(at_j - 2, int(lower[j]) + 1, 0)
        b = min(at_j + 2, int(lo[j]))
        bounds[j] = at_j
        if b >= a:  # a clearly longer idle gap next to the usual place marks this instance's start
            k = a + int(np.argmax(gap[a : b + 1]))
            if gap[k] > 2 * gap[at_j] + _CLEAR_GAP_NS:
                bounds[j] = k
    return bounds


def _per_offset(pick: np.ndarray, dmax: int, figure: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """``figure(at)`` for offsets 0 … ``dmax``, where ``at`` is the instances × offsets matrix
    of positions ``pick - offset`` and ``figure`` gives one value per column: the matrix a
    block of :data:`_OFFSETS_AT_ONCE` offsets at a time (2,000 × 4,097 of them whole were
    65 MB each), each offset's value its own column's as over the whole matrix."""
    out = np.empty(dmax + 1)
    for a in range(0, dmax + 1, _OFFSETS_AT_ONCE):
        at = pick[:, None] - np.arange(a, min(a + _OFFSETS_AT_ONCE, dmax + 1))[None, :]
        out[a : a + at.shape[1]] = figure(at)
    return out


def _unique_codes(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.unique(codes, return_inverse=True, return_counts=True)`` of small integer codes
    (names' codes, -1 for none) by counting, not sorting: no sorted copy and permutation of
    the operations (2 M operations: 32 MB less). Codes spread wider than the operations are
    many (StringIds ids of a damaged export: one id of 10^15) are sorted as ``np.unique``
    does: the counts would take memory for every value in between."""
    if codes.size == 0:
        return codes.astype(np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    low = int(codes.min())
    if int(codes.max()) - low > 2 * codes.size + 1024:
        uniq, inverse, counts = np.unique(codes, return_inverse=True, return_counts=True)
        return uniq, inverse.reshape(-1), counts
    shifted = codes - low if low else codes
    per = np.bincount(shifted)
    present = np.flatnonzero(per)
    # each operation's rank as 4 bytes where the names fit (always, short of 2^31 names)
    rank = np.zeros(per.size, dtype=np.int32 if present.size < 1 << 31 else np.int64)
    rank[present] = np.arange(present.size)
    return present + low, rank[shifted], per[present]


def find_loops(
    codes: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    *,
    min_repeats: int = 3,
    min_coverage: float = 0.0,
) -> list[Loop]:
    """Every loop of one GPU's operations, rarest (outermost) first.

    Parameters
    ----------
    codes
        The operations' names as integers (equal names, equal codes), sorted by start.
    starts, ends
        Their start and end times (ns), same order.
    min_repeats
        A loop has at least this many instances.
    min_coverage
        Only loops whose instances cover at least this share of the operations (0–1).

    Returns
    -------
    One :class:`Loop` per count of runs that a group of aligned names (one or more) shares,
    sorted by ``count``; :func:`main_loop` picks the iteration among them.
    """
    n = int(codes.size)
    if n < min_repeats:
        return []
    # one array the size of the operations made at a time where it can be (1 M operations:
    # the order, the idle gaps, then the busy times; the names' ranks gone before the gaps)
    uniq, inverse, counts = _unique_codes(codes)
    order = np.argsort(inverse, kind="stable")  # positions grouped by name, in time order
    del inverse
    gap = idle_before(starts, ends)
    busy: np.ndarray | None = None  # busy[i]: summed time of operations before i (made when a loop needs it)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    loops: list[Loop] = []
    for c in np.unique(counts[counts >= min_repeats]):
        c = int(c)
        names = np.nonzero(counts == c)[0][:_MAX_NAMES]
        positions = np.stack([order[offsets[i] : offsets[i] + c] for i in names])
        rows = _group(positions)
        if rows is None:
            continue
        sub = positions[rows]
        lo = sub.min(axis=0)  # first anchor of each instance
        hi = sub.max(axis=0)  # last anchor of each instance
        bounds = _bounds(lo, hi, gap, codes)
        tail = int(np.median(bounds[1:] - hi[:-1] - 1)) if c > 1 else 0  # ops of an instance after its last anchor
        stop = min(int(hi[-1]) + 1 + tail, n)
        sizes = np.diff(np.append(bounds, stop))
        # only instances of about the usual size count: one instance that holds the rest of the
        # program (a name that runs a few times at start-up and once more at the end) is no loop
        usual = sizes <= _TYPICAL * np.median(sizes)
        coverage = float(sizes[usual].sum()) / n
        if coverage < min_coverage:
            continue
        if busy is None:
            # in place: each operation's own time (end - start, 0 when negative), then summed
            busy = np.zeros(n + 1, dtype=np.float64)
            np.subtract(ends, starts, out=busy[1:])
            np.maximum(busy[1:], 0, out=busy[1:])
            np.cumsum(busy[1:], out=busy[1:])
            total_time = float(busy[-1])
        ends_at = np.append(bounds[1:], stop)
        inside = float((busy[ends_at[usual]] - busy[bounds[usual]]).sum())
        loops.append(Loop(c, tuple(int(uniq[i]) for i in names[rows]), bounds, stop, coverage,
                          inside / total_time if total_time > 0 else 1.0))
    return loops


#: :func:`main_loop`: a loop is regular when at least this share of its instances hold the same
#: number of operations (:attr:`Loop.regular`).
REGULAR = 0.8
#: :func:`main_loop`: the main loop's instances of the usual size cover at least this share of
#: the operations (a long start-up, compilation say, can hold most of a short run's operations).
MAIN_COVERAGE = 0.25
#: :func:`main_loop`: … and hold at least this share of the operations' summed time (a loop of
#: a few-microsecond copies beside the convolutions that take the time is not the program's).
MAIN_TIME_COVERAGE = 0.1
#: :func:`main_loop`: of the loops that qualify, those within this share of the best coverage
#: compete (the outermost of them wins): a loop around a few of the steps does not.
COVERAGE_SLACK = 0.1


def main_loop(loops: list[Loop], *, host_copies: frozenset[int] = frozenset()) -> Loop | None:
    """The loop that is the program's iteration, of :func:`find_loops`' loops.

    Of the loops whose usual-size instances cover :data:`MAIN_COVERAGE` of the operations and
    :data:`MAIN_TIME_COVERAGE` of their time,
    the first kind found of: regular loops (:data:`REGULAR`) with at least two anchor names (a
    training step, a ``generate()`` call, a decode step); regular loops of one anchor name (a
    step whose only once-per-step operation is a copy: one name repeating is weaker evidence
    than several, so it is only taken when no regular loop of several names exists, and a name
    that runs every fourth step, the loss logged every fourth step, does not make four steps
    one iteration); loops anchored on a device-to-host copy (``host_copies``: the codes of such
    copies' names) whose instances differ in size (a serving engine's steps, which end by
    copying the sampled tokens to the host and run a prefill when a request arrives); loops of
    several anchor names whose instances differ in size. Of that kind, the outermost (fewest
    instances) of those covering within :data:`COVERAGE_SLACK` of the best. ``None`` when no
    loop qualifies."""
    big = [lp for lp in loops if lp.coverage >= MAIN_COVERAGE and lp.time_coverage >= MAIN_TIME_COVERAGE]
    for pick in (
        lambda lp: len(lp.anchors) >= 2 and lp.regular >= REGULAR,
        lambda lp: lp.regular >= REGULAR,
        lambda lp: bool(host_copies.intersection(lp.anchors)),
        lambda lp: len(lp.anchors) >= 2,
    ):
        found = [lp for lp in big if pick(lp)]
        if found:
            best = max(lp.coverage for lp in found)
            return min((lp for lp in found if lp.coverage >= best - COVERAGE_SLACK), key=lambda lp: lp.count)
    return None


def token_loop(loops: list[Loop], main: Loop) -> Loop:
    """The loop of one-token steps around ``main`` (:func:`main_loop`): ``main`` itself, or,
    when ``main`` is regular and a regular loop nested in it (more instances, about the same
    coverage) has more anchor names, that one: several ``generate()`` calls (``main``) of one
    forward per token each. Layers nest too but run fewer once-per-instance names than a
    whole forward (embedding, final norm, LM head, sampling)."""
    if main.regular < REGULAR:
        return main
    inner = [lp for lp in loops if lp.count > main.count and lp.regular >= REGULAR and lp.coverage >= main.coverage - COVERAGE_SLACK
             and len(lp.anchors) > len(main.anchors)]
    if not inner:
        return main
    return max(inner, key=lambda lp: (len(lp.anchors), -lp.count))


#: The name :func:`~tracekit.analysis._frames.gpu_ops` gives a device-to-host copy.
HOST_COPY_NAME = "[CUDA memcpy Device-to-Host]"


def name_codes(names: pl.Series) -> np.ndarray:
    """Integer codes of operation ``names`` for :func:`find_loops` (equal names, equal codes;
    -1 for a missing name): the names themselves when already codes (a big export's narrow
    read), else their categorical codes."""
    if not names.dtype.is_integer():
        names = names.cast(pl.Categorical).to_physical()
    return names.fill_null(-1).to_numpy().astype(np.int64, copy=False)


def host_copy_codes(names: pl.Series, codes: np.ndarray, labels: pl.Series | None = None) -> frozenset[int]:
    """The codes of ``names`` that are device-to-host copies; where ``names`` are integer codes
    (a big export's narrow read), ``labels`` gives each code's text (none without it)."""
    if names.dtype.is_integer():
        if labels is None:
            return frozenset()
        return frozenset(int(c) for c in np.nonzero((pl.Series(labels) == HOST_COPY_NAME).fill_null(False).to_numpy())[0])
    if names.dtype != pl.Utf8:
        return frozenset()
    hit = (names == HOST_COPY_NAME).fill_null(False).to_numpy()
    return frozenset(int(c) for c in np.unique(codes[hit]))


#: :func:`split_at_host_copies`: an instance is split only when it holds more than this many
#: times the median instance's operations …
SPLIT_SIZE = 1.5
#: … and each part holds at least this share of the median instance's operations.
SPLIT_PART = 0.5


def split_at_host_copies(bounds: np.ndarray, stop: int, codes: np.ndarray, gap: np.ndarray,
                         host_copies: frozenset[int]) -> np.ndarray:
    """``bounds`` (a token loop's instance starts, ``stop`` one past the last) with every
    oversized instance cut after each device-to-host copy inside it that the GPU idles after
    (``gap``: :func:`idle_before`, ns) and that leaves at least :data:`SPLIT_PART` of a median
    instance on either side. The first instance is left whole (a cold first step compiles,
    autotunes and copies to the host as it pleases). A one-token step ends by copying the sampled ids to the host,
    and the host waits for them before it launches the next step; a step whose kernels are not
    the loop's (a compiled prompt forward specialised to the prompt's length runs none of the
    decode step's kernel names) would otherwise be glued to the step before it."""
    if not host_copies or bounds.size < 2:
        return bounds
    sizes = np.diff(np.append(bounds, stop))
    median = float(np.median(sizes))
    if median <= 0:
        return bounds
    copies = np.nonzero(np.isin(codes, np.fromiter(host_copies, dtype=np.int64)))[0]
    extra: list[int] = []
    for a, b in zip(bounds[1:], np.append(bounds[2:], stop), strict=True):
        if b - a <= SPLIT_SIZE * median:
            continue
        last = int(a)
        for p in copies[(copies >= a) & (copies < b - 1)]:
            cut = int(p) + 1
            if gap[cut] > 0 and cut - last >= SPLIT_PART * median and b - cut >= SPLIT_PART * median:
                extra.append(cut)
                last = cut
    if not extra:
        return bounds
    return np.sort(np.concatenate([bounds, np.array(extra, dtype=bounds.dtype)]))
