"""The launch join kept in the column cache (:mod:`tracekit.analysis.op_launches`) serving
the diagnosis and the NCCL calls table of a big export (issue 28).

The generation phases' operations (``OpsByColumn.narrow_launched``), the operations launched
in the sampled steps (``OpsByColumn.launched_within``) and the NCCL kernels' launching calls
(``_nccl_kernel_rows``) are read from the kept join instead of joining the API table again.
Each is compared here with :func:`~tracekit.analysis.attribution.launch_info` on the same
export's whole tables (real exports: the bundled samples, the LLM-stack captures with CUDA
graphs, and the public corpus, whose 2022 exports have calls that match twice).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit.analysis import nccl as nccl_mod
from tracekit.analysis import op_launches
from tracekit.analysis._frames import gpu_ops, within_any
from tracekit.analysis.attribution import launch_info, launch_pairs
from tracekit.diagnosis import ops_by_column as obc
from tracekit.nsys import database

from .conftest import NSYS_CORPUS, SAMPLES, llm_capture, llm_capture_names

EXPORTS = [
    *(p for p in sorted(SAMPLES.rglob("*.sqlite")) if "per_rank" not in p.name),
    *(llm_capture(n) for n in llm_capture_names()),
    *sorted(NSYS_CORPUS.glob("*.sqlite")),
]
LAUNCH = ["tid", "global_tid", "api_start_ns", "api_end_ns"]


@pytest.fixture
def cached(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every export's tables served by a real column cache (small tables allowed in) and
    diagnosed a column at a time."""
    monkeypatch.setattr(obc, "MIN_KERNELS", 0)
    monkeypatch.setattr(database, "CACHE_MIN_ROWS", 1)
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TRACEKIT_COLUMN_CACHE", "1")


def _open(path: Path):  # type: ignore[no-untyped-def]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tracekit.open(path)


def _source(path: Path) -> obc.OpsByColumn | None:
    trace = _open(path)
    return obc.by_column(trace) if trace.db.has_table("CUPTI_ACTIVITY_KIND_KERNEL") else None


def _matches_twice(trace) -> bool:  # type: ignore[no-untyped-def]
    ops = gpu_ops(trace.kernels, trace.memcpys, trace.memsets)
    pairs = launch_pairs(ops, trace.cuda_api, how="inner")
    return pairs.height > pairs["_lrow"].n_unique()


@pytest.mark.usefixtures("cached")
@pytest.mark.parametrize("path", EXPORTS, ids=lambda p: p.stem)
def test_narrow_launched_is_launch_info(path: Path) -> None:
    source = _source(path)
    if source is None:
        pytest.skip("no kernel table")
    cols = ["device_id", "start_ns", "end_ns", "op_kind"]
    whole = _open(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = source.narrow_launched(cols, whole.cuda_api)
        expected = launch_info(source.narrow([*cols, "global_pid", "correlation_id"]), whole.cuda_api,
                               columns=("global_tid", "api_start_ns")).select(*cols, "global_tid", "api_start_ns")
        if got is None:  # only where some operation matches two calls
            assert _matches_twice(whole)
            return
    assert got.equals(expected)
    assert got["api_start_ns"].null_count() < got.height  # launches were found, not all null


@pytest.mark.usefixtures("cached")
@pytest.mark.parametrize("path", EXPORTS, ids=lambda p: p.stem)
def test_launched_within_is_launch_info_filtered(path: Path) -> None:
    """The operations whose call starts in some range, from the kept join's call starts: the
    rows and launch columns of ``launch_info`` on the whole operations, filtered the same way."""
    source = _source(path)
    if source is None:
        pytest.skip("no kernel table")
    whole = _open(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ops = launch_info(gpu_ops(whole.kernels, whole.memcpys, whole.memsets, whole.graph_trace), whole.cuda_api)
    starts = ops["api_start_ns"].drop_nulls()
    if starts.len() < 10:
        pytest.skip("too few launches")
    lo, hi = int(starts.min()), int(starts.max())  # type: ignore[arg-type]
    span = hi - lo
    ranges = pl.DataFrame({"start_ns": [lo + span // 10, lo + span // 2], "end_ns": [lo + span // 4, lo + span // 2 + span // 5]})
    got = source.launched_within(ranges["start_ns"], ranges["end_ns"], whole.cuda_api)
    if got is None:
        assert _matches_twice(whole)
        return
    expected = ops.filter(within_any(ops["api_start_ns"], ranges["start_ns"], ranges["end_ns"])).drop("api_name")
    assert expected.height > 0
    assert got.select(expected.columns).equals(expected)


@pytest.mark.usefixtures("cached")
@pytest.mark.parametrize("path", [SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite", SAMPLES / "llm_tp2pp2_nccl" / "llm_tp2pp2_nccl.sqlite",
                                  SAMPLES / "custom_allreduce_2gpu" / "custom_allreduce_2gpu.sqlite"], ids=lambda p: p.stem)
def test_nccl_calls_from_the_kept_join_equal_the_whole_tables(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not path.exists():
        pytest.skip("not bundled")
    whole = _open(path)
    whole.kernels  # noqa: B018  (the loaded tables: the whole-table path)
    expected = whole.nccl
    used: list[int] = []
    real = op_launches.launches_at

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        got = real(*args, **kwargs)
        used.append(0 if got is None else got.height)
        return got

    monkeypatch.setattr(nccl_mod, "launches_at", counting)
    got = _open(path).nccl
    assert used and used[0] > 0, "the NCCL kernels' calls came from the kept join"
    assert got.equals(expected)
    assert expected.height > 0
