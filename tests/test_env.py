"""tracekit.env.count_from_env: the bounded paths' thresholds (report, diff, nvtx_kern_sum)
read one way: unset or empty is the default, a whole number is taken, anything else is one
error line naming the variable."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tracekit.comparison_by_column import BOUNDED_MIN_OPS, bounded_min_ops
from tracekit.errors import TracekitError
from tracekit.report.bounded import MIN_KERNELS, min_kernels
from tracekit.stats.nvtx_projection import KERN_SUM_WINDOWED_FROM, _windowed_from

CASES: list[tuple[str, Callable[[], int], int]] = [
    ("TRACEKIT_DIFF_BOUNDED_MIN_OPS", bounded_min_ops, BOUNDED_MIN_OPS),
    ("TRACEKIT_REPORT_BOUNDED_MIN_KERNELS", min_kernels, MIN_KERNELS),
    ("TRACEKIT_KERN_SUM_WINDOWED_FROM", _windowed_from, KERN_SUM_WINDOWED_FROM),
]


@pytest.mark.parametrize(("name", "read", "default"), CASES, ids=[c[0] for c in CASES])
def test_thresholds_from_the_environment(monkeypatch: pytest.MonkeyPatch, name: str, read: Callable[[], int], default: int) -> None:
    monkeypatch.delenv(name, raising=False)
    assert read() == default
    monkeypatch.setenv(name, " ")
    assert read() == default
    monkeypatch.setenv(name, "12")
    assert read() == 12
    monkeypatch.setenv(name, "2e6")
    with pytest.raises(TracekitError, match=rf"^{name}='2e6' is not a count"):
        read()
