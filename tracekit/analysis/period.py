"""The repeating part of a sequence of GPU operation names: one period per step of a loop
that NVTX does not mark (:func:`find_period`). Used by the diagnosis window and the
generation phases."""

from __future__ import annotations

import numpy as np

__all__ = ["find_period"]

#: Only the last this many operations are searched (a loop repeats: its tail tells the period).
_TAIL = 50_000


def find_period(
    codes: np.ndarray, *, match: float = 0.95, min_repeats: int = 3, coverage: float = 0.5
) -> tuple[int, int, int] | None:
    """``(period, first, stop)`` of the repeating part of ``codes`` (ints), or ``None``.

    The repeating part ``codes[first:stop]`` holds at least ``min_repeats`` periods; inside
    it every element equals the one ``period`` later, except for at most ``1 - match`` of
    them. It is grown in both directions from an anchor three quarters into the sequence, so
    a prologue (set-up) and an epilogue (final reductions) are left out.
    """
    n = codes.size
    if n < 2 * min_repeats:
        return None
    off = max(n - _TAIL, 0)
    tail = codes[off:]
    m = tail.size
    anchor = (3 * m) // 4
    max_p = max(m // min_repeats, 1)
    ps = np.arange(1, min(max_p, anchor) + 1)
    keep = tail[anchor - ps] == tail[anchor]
    for k in (1, 2):  # cheap pruning on the next elements too
        if anchor + k < m:
            keep &= tail[anchor + k - ps] == tail[anchor + k]
    for p in ps[keep]:
        p = int(p)
        eq = tail[:-p] == tail[p:]  # eq[i]: element i repeats at i + p
        a = min(anchor - p, eq.size - 1)
        if a < 0:
            continue
        tol = 1 - match
        right = eq[a:]
        bad_r = np.cumsum(~right)
        ok_r = np.nonzero(bad_r <= tol * np.arange(1, right.size + 1))[0]
        hi = a + (int(ok_r[-1]) + 1 if ok_r.size else 0)
        left = eq[: a][::-1]
        bad_l = np.cumsum(~left)
        ok_l = np.nonzero(bad_l <= tol * np.arange(1, left.size + 1))[0]
        lo = a - (int(ok_l[-1]) + 1 if ok_l.size else 0)
        while lo < hi and not eq[lo]:
            lo += 1  # a tolerated mismatch at the edge belongs to the prologue
        while hi > lo and not eq[hi - 1]:
            hi -= 1
        if hi - lo + p >= min_repeats * p and hi - lo + p >= coverage * m:
            return p, lo + off, hi + p + off
    return None
