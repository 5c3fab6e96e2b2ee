"""GPU op → API call → NVTX range attribution, checked against the nsys rule evaluated with
plain SQL on the raw export rows."""

from __future__ import annotations

import functools
import shutil
import sqlite3
import warnings
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit.analysis.attribution import (
    attribute_nvtx,
    enclosing_ranges,
    launch_info,
    nvtx_coverage,
    nvtx_ranges,
)
from tracekit.analysis.gpu_time import gpu_ops

from .conftest import NSYS_CORPUS, SAMPLES

DECODE = SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
TRAIN = SAMPLES / "llm_train_emit_nvtx_1gpu" / "llm_train_emit_nvtx_1gpu.sqlite"
TP2 = SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"
ALLREDUCE = SAMPLES / "custom_allreduce_2gpu" / "custom_allreduce_2gpu.sqlite"
SAXPY = NSYS_CORPUS / "nsys2022.2_pipit_saxpy_mpi_cuda.sqlite"
MFU = NSYS_CORPUS / "nsys2026.2_nsysai_mfu_2xh100_nccl_slice.sqlite"
PER_RANK = [SAMPLES / "llm_tp2_nccl_per_rank" / f"llm_tp2_nccl_per_rank_rank{r}.sqlite" for r in (0, 1)]


def _open(path: Path) -> tracekit.NsysTrace:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tracekit.open(path)  # type: ignore[return-value]


def _sql(path: Path, query: str, *args: object) -> list[tuple]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return con.execute(query, args).fetchall()
    finally:
        con.close()


# the nsys rule, straight in SQL: for each kernel's launch call, the enclosing ranges on the
# same thread (open ranges end at the last range timestamp); innermost = latest start
_RANGES_SQL = """
CREATE TEMP TABLE rng AS
SELECT rowid AS id, start, coalesce(end, ?) AS end, globalTid FROM NVTX_EVENTS
WHERE eventType IN (59, 60, 70, 71) AND endGlobalTid IS NULL
"""
_INNERMOST_SQL = """
SELECT
  (SELECT n.id FROM rng n WHERE n.globalTid = r.globalTid AND n.start <= r.start AND n.end >= r.end
    ORDER BY n.start DESC, n.id DESC LIMIT 1),
  (SELECT count(*) FROM rng n WHERE n.globalTid = r.globalTid AND n.start <= r.start AND n.end >= r.end)
FROM CUPTI_ACTIVITY_KIND_KERNEL k
LEFT JOIN api r
  ON r.correlationId = k.correlationId AND k.globalPid = (r.globalTid / 16777216) * 16777216
ORDER BY k.rowid
"""


@functools.cache
def _sql_innermost(path: Path) -> list[tuple[int | None, int]]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        last = con.execute(
            "SELECT max(max(start), max(coalesce(end, 0))) FROM NVTX_EVENTS WHERE eventType IN (59, 60, 70, 71)"
        ).fetchone()[0]
        con.execute(_RANGES_SQL, (last,))
        con.execute("CREATE INDEX temp.rng_thread ON rng (globalTid, start)")
        con.execute(
            "CREATE TEMP TABLE api AS SELECT correlationId, globalTid, start, end FROM CUPTI_ACTIVITY_KIND_RUNTIME "
            "WHERE eventClass IN (0, 1)"
        )
        con.execute("CREATE INDEX temp.api_corr ON api (correlationId)")
        return [(rid, depth) for rid, depth in con.execute(_INNERMOST_SQL)]
    finally:
        con.close()


# -- launch_info -------------------------------------------------------------------------
def test_launch_info_joins_on_correlation_id_and_process() -> None:
    trace = _open(ALLREDUCE)
    ours = launch_info(trace.kernels, trace.cuda_api)
    expected = _sql(
        ALLREDUCE,
        "SELECT r.globalTid, r.start, r.end FROM CUPTI_ACTIVITY_KIND_KERNEL k LEFT JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
        "ON r.correlationId = k.correlationId AND k.globalPid = (r.globalTid / 16777216) * 16777216 ORDER BY k.rowid",
    )
    assert ours.select("global_tid", "api_start_ns", "api_end_ns").rows() == expected
    assert ours.height == trace.kernels.height
    # correlation ids repeat across the two processes: joining on them alone over-matches
    loose = _sql(ALLREDUCE, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId")[0][0]
    assert loose > ours["api_start_ns"].count()
    assert (ours["pid"] == ours["global_tid"] // (1 << 24) % (1 << 24)).all()


def test_launch_info_prefers_the_cuda_row_over_a_wrapper() -> None:
    # this 2022 export records each CUDA call twice: an eventClass 67 wrapper and the runtime row
    trace = _open(SAXPY)
    ours = launch_info(trace.kernels, trace.cuda_api)
    assert ours.height == trace.kernels.height == 5
    assert set(ours["api_name"]) == {"cudaLaunchKernel_v7000"}


def test_launch_info_keeps_rows_without_a_traced_call() -> None:
    trace = _open(MFU)  # a time slice: some kernels' launches fall outside it
    ours = launch_info(trace.kernels, trace.cuda_api)
    missing = _sql(
        MFU,
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k WHERE NOT EXISTS (SELECT 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
        "WHERE r.correlationId = k.correlationId AND k.globalPid = (r.globalTid / 16777216) * 16777216)",
    )[0][0]
    assert ours.height == trace.kernels.height
    assert ours["api_start_ns"].null_count() == missing > 0


# -- attribute_nvtx ----------------------------------------------------------------------
@pytest.mark.parametrize("path", [DECODE, TRAIN, TP2, SAXPY, ALLREDUCE], ids=lambda p: p.stem)
def test_innermost_range_and_depth_follow_the_nsys_rule(path: Path) -> None:
    trace = _open(path)
    ours = attribute_nvtx(launch_info(trace.kernels, trace.cuda_api), trace.nvtx, fallback="none")
    expected = _sql_innermost(path)
    assert ours["nvtx_range_id"].to_list() == [rid for rid, _ in expected]
    assert ours["nvtx_depth"].to_list() == [d for _, d in expected]
    thread = ours["attribution"] == "thread"
    assert thread.to_list() == [rid is not None for rid, _ in expected]


def test_path_lists_the_enclosing_ranges_outermost_first() -> None:
    trace = _open(DECODE)
    ours = attribute_nvtx(launch_info(trace.kernels, trace.cuda_api), trace.nvtx)
    assert ours.height == trace.kernels.height
    paths = set(ours["nvtx_path"])
    assert "step.0/layer.0/attn" in paths and "step.7/layer.3/mlp" in paths
    row = ours.filter(pl.col("nvtx_path") == "step.0/layer.0/attn").row(0, named=True)
    assert row["nvtx_range"] == "attn" and row["nvtx_depth"] == 3
    name = _sql(DECODE, "SELECT text FROM NVTX_EVENTS WHERE rowid = ?", row["nvtx_range_id"])[0][0]
    assert name == "attn"


def test_named_domains_are_prefixed_and_torch_names_shortened_in_paths() -> None:
    trace = _open(TP2)
    ours = attribute_nvtx(launch_info(trace.kernels, trace.cuda_api), trace.nvtx)
    nccl = ours.filter(pl.col("name").str.starts_with("ncclDevKernel_AllReduce"))
    assert set(nccl["nvtx_range"]) == {"NCCL:ncclAllReduce"}
    assert all(p.split("/")[-1] == "NCCL:ncclAllReduce" for p in nccl["nvtx_path"])
    train = _open(TRAIN)
    a = attribute_nvtx(launch_info(train.kernels, train.cuda_api), train.nvtx)
    mm = a.filter(pl.col("nvtx_range").str.starts_with("aten::mm, seq"))
    assert mm.height and all(p.endswith("/aten::mm") for p in mm["nvtx_path"])


def _with_moved_launches(tmp_path: Path) -> tuple[Path, list[int]]:
    """A copy of the decode export where the layer.0/attn launches of step.0 come from a thread
    with no ranges (what PyTorch's autograd threads and NCCL proxies look like)."""
    copy = tmp_path / "moved.sqlite"
    shutil.copyfile(DECODE, copy)
    con = sqlite3.connect(copy)
    s, e, g = con.execute("SELECT start, end, globalTid FROM NVTX_EVENTS WHERE rowid = 3").fetchone()  # step.0/layer.0/attn
    corr = [r[0] for r in con.execute(
        "SELECT correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE globalTid = ? AND start >= ? AND end <= ? "
        "AND correlationId IN (SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL)", (g, s, e))]
    con.executemany("UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET globalTid = globalTid + 1 WHERE correlationId = ?", [(c,) for c in corr])
    con.commit()
    con.close()
    return copy, corr


def test_fallback_to_another_thread_of_the_process_is_flagged(tmp_path: Path) -> None:
    path, corr = _with_moved_launches(tmp_path)
    trace = _open(path)
    ops = launch_info(trace.kernels, trace.cuda_api)
    moved = pl.col("correlation_id").is_in(corr)
    none = attribute_nvtx(ops, trace.nvtx, fallback="none").filter(moved)
    assert none.height == len(corr) > 0
    assert set(none["attribution"]) == {"none"} and none["nvtx_range"].null_count() == none.height
    fb = attribute_nvtx(ops, trace.nvtx, fallback="process").filter(moved)
    assert set(fb["attribution"]) == {"process_fallback"}
    # the ranges open on the main thread at those moments: step.0/layer.0/attn
    assert set(fb["nvtx_path"]) == {"step.0/layer.0/attn"} and set(fb["nvtx_range_id"]) == {3}
    # everything else is untouched
    rest = attribute_nvtx(ops, trace.nvtx).filter(~moved)
    assert set(rest["attribution"]) == {"thread"}


def test_crossing_start_end_ranges_use_the_exact_rule(tmp_path: Path) -> None:
    """Start/end ranges need not nest; one that crosses layer boundaries forces the exact path."""
    copy = tmp_path / "crossing.sqlite"
    shutil.copyfile(DECODE, copy)
    con = sqlite3.connect(copy)
    s2, g = con.execute("SELECT start, globalTid FROM NVTX_EVENTS WHERE rowid = 3").fetchone()
    e5 = con.execute("SELECT end FROM NVTX_EVENTS WHERE rowid = 6").fetchone()[0]  # layer.1/attn
    con.execute(
        "INSERT INTO NVTX_EVENTS (start, end, eventType, globalTid, text, domainId) VALUES (?, ?, 60, ?, 'window', 0)",
        (s2 + 1, e5 - 1, g),
    )
    # and an open range: no end
    last = con.execute("SELECT max(start) FROM NVTX_EVENTS").fetchone()[0]
    con.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, globalTid, text, domainId) VALUES (?, NULL, 59, ?, 'tail', 0)", (last - 5_000_000, g))
    con.commit()
    con.close()
    trace = _open(copy)
    ours = attribute_nvtx(launch_info(trace.kernels, trace.cuda_api), trace.nvtx, fallback="none")
    expected = _sql_innermost(copy)
    assert ours["nvtx_range_id"].to_list() == [rid for rid, _ in expected]
    window = _sql(copy, "SELECT rowid FROM NVTX_EVENTS WHERE text = 'window'")[0][0]
    assert window in set(ours["nvtx_range_id"])
    ranges = nvtx_ranges(trace.nvtx)
    tail = ranges.filter(pl.col("name") == "tail").row(0, named=True)
    assert tail["is_open"] and tail["end_ns"] == ranges["end_ns"].max()


def test_multi_rank_tables_match_each_rank_alone() -> None:
    traces = [_open(p) for p in PER_RANK]
    ops = pl.concat([launch_info(t.kernels, t.cuda_api).with_columns(pl.lit(r).alias("rank")) for r, t in enumerate(traces)])
    api = pl.concat([t.cuda_api.with_columns(pl.lit(r).alias("rank")) for r, t in enumerate(traces)])
    nvtx = pl.concat([t.nvtx.with_columns(pl.lit(r).alias("rank")) for r, t in enumerate(traces)])
    kernels = pl.concat([t.kernels.with_columns(pl.lit(r).alias("rank")) for r, t in enumerate(traces)])
    both = attribute_nvtx(launch_info(kernels, api), nvtx)
    assert both.height == ops.height
    for r, t in enumerate(traces):
        alone = attribute_nvtx(launch_info(t.kernels, t.cuda_api), t.nvtx)
        mine = both.filter(pl.col("rank") == r)
        assert mine["nvtx_range_id"].to_list() == alone["nvtx_range_id"].to_list()
        assert mine["nvtx_path"].to_list() == alone["nvtx_path"].to_list()
    cov = nvtx_coverage(both)
    assert cov["rank"].to_list() == [0, 1]


def test_coverage_is_the_attributed_share_of_gpu_time() -> None:
    trace = _open(ALLREDUCE)
    ops = gpu_ops(trace.kernels, trace.memcpys, trace.memsets)
    a = attribute_nvtx(launch_info(ops, trace.cuda_api), trace.nvtx)
    cov = nvtx_coverage(a).row(0, named=True)
    total = sum(
        _sql(ALLREDUCE, f"SELECT coalesce(sum(end - start), 0) FROM {t}")[0][0]
        for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY")
    )
    assert cov["gpu_time_ns"] == total
    kernels_in = [rid is not None for rid, _ in _sql_innermost(ALLREDUCE)]
    k_dur = [d for (d,) in _sql(ALLREDUCE, "SELECT end - start FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY rowid")]
    kernel_thread_ns = sum(d for d, inside in zip(k_dur, kernels_in, strict=True) if inside)
    assert a.filter((pl.col("op_kind") == "kernel") & (pl.col("attribution") == "thread"))["duration_ns"].sum() == kernel_thread_ns
    assert cov["coverage"] == pytest.approx((cov["thread_ns"] + cov["process_fallback_ns"]) / total)
    assert 0.99 < cov["coverage"] < 1.0
    assert cov["none_ns"] == total - cov["thread_ns"] - cov["process_fallback_ns"] > 0


def test_enclosing_ranges_lists_every_level() -> None:
    trace = _open(DECODE)
    ops = launch_info(trace.kernels, trace.cuda_api)
    pairs = enclosing_ranges(ops, trace.nvtx)
    depths = [d for _, d in _sql_innermost(DECODE)]
    assert pairs.height == sum(depths)
    per_op = pairs.group_by("op_index").agg(pl.col("level").max() + 1).sort("op_index")
    assert per_op["level"].to_list() == [d for d in depths if d]


def test_range_ids_are_nvtx_rows_and_parents_nest() -> None:
    trace = _open(TRAIN)
    ranges = nvtx_ranges(trace.nvtx)
    raw = dict(_sql(TRAIN, "SELECT rowid, start FROM NVTX_EVENTS WHERE eventType = 59"))
    assert ranges.height == len(raw)
    assert all(raw[r] == s for r, s in zip(ranges["range_id"], ranges["start_ns"], strict=True))
    parents = ranges.join(
        ranges.select(pl.col("range_id").alias("parent_id"), pl.col("start_ns").alias("ps"), pl.col("end_ns").alias("pe"), pl.col("level").alias("pl")),
        on="parent_id",
    )
    assert ((parents["ps"] <= parents["start_ns"]) & (parents["pe"] >= parents["end_ns"])).all()
    assert (parents["pl"] + 1 == parents["level"]).all()


def test_bad_arguments_are_explained() -> None:
    trace = _open(DECODE)
    with pytest.raises(ValueError, match="launch_info"):
        attribute_nvtx(trace.kernels, trace.nvtx)
    with pytest.raises(ValueError, match="fallback"):
        attribute_nvtx(launch_info(trace.kernels, trace.cuda_api), trace.nvtx, fallback="thread")


@pytest.mark.parametrize("path", [DECODE, TP2, SAXPY], ids=lambda p: p.stem)
def test_merge_join_paths_equal_a_hash_join(path: Path) -> None:
    """The launch join's merge: stacked ops (kernels then memcpys then memsets, each sorted:
    merged run by run), the same keys shuffled (many runs: binary search into the unique
    API keys, or a sort of the left side when the API keys repeat) all give the pairs of
    polars' hash join. SAXPY has wrapper API rows, so its correlation ids repeat."""
    from tracekit.analysis import attribution

    trace = _open(path)
    ops = pl.concat([trace.table(t, ["correlation_id"]) for t in ("kernels", "memcpys", "memsets")])
    api = trace.table("cuda_api", ["correlation_id"])
    left = ops.drop_nulls().rename({"correlation_id": "_key"}).with_row_index("_lrow")
    right = api.drop_nulls().rename({"correlation_id": "_key"}).with_row_index("_arow")
    shuffled = left.sample(fraction=1.0, shuffle=True, seed=3)
    for lhs in (left, shuffled):
        expected = lhs.join(right, on="_key", how="inner").select("_lrow", "_arow").sort("_lrow", "_arow")
        got = attribution._merge_join(lhs, right)
        assert got.sort("_lrow", "_arow").equals(expected)
        assert got.height > 0
    if path == DECODE:  # one process: the stacked ops are sorted runs, merged run by run
        assert 1 < (left["_key"].diff() < 0).sum() + 1 < attribution.MERGE_RUNS
        assert (shuffled["_key"].diff() < 0).sum() + 1 >= attribution.MERGE_RUNS


def test_innermost_starts_by_neighbours_equals_the_order_keeping_unique(tmp_path: Path) -> None:
    """One row per (thread, start), the last in sort order: kept by comparing each row with
    the next on a sorted tree (equal starts included: the coarse-clock copy floors NVTX times
    to 100 µs), and by ``unique`` on a tree that is not sorted so. Both give the rows the
    order-keeping ``unique`` gives."""
    from tracekit.analysis.attribution import _nvtx_tree, innermost_starts
    from tracekit.stats.nvtx_projection import _TREE_COLUMNS

    from .test_stats_nvtx_projection import _coarse_copy

    def reference(tree: pl.DataFrame) -> pl.DataFrame:
        return tree.select("_thr", pl.col("start_ns").alias("_s"), "_idx").unique(subset=["_thr", "_s"], keep="last", maintain_order=True)

    for path in (DECODE, TP2, _coarse_copy(tmp_path)):
        tree = _nvtx_tree(_open(path).table("nvtx", _TREE_COLUMNS), [], paths=False)
        starts = innermost_starts(tree)
        assert starts.equals(reference(tree))
        shuffled = tree.sample(fraction=1.0, shuffle=True, seed=1)
        assert innermost_starts(shuffled).equals(reference(shuffled))
        if path.name == "coarse.sqlite":
            assert starts.height < tree.height  # equal starts on a thread: one row kept for them


def _pointer_jump_every_row(prev: pl.Series, end: pl.Series) -> pl.Series:
    """The parent search as it was: every row recomputed each round (the reference)."""
    t = pl.DataFrame({"end": end, "cand": prev})
    for _ in range(200):
        t = t.with_columns(pl.col("end").gather(pl.col("cand")).alias("_ce"))
        active = (pl.col("_ce") < pl.col("end")).fill_null(False)
        if not t.select(active.any()).item():
            break
        t = t.with_columns(pl.when(active).then(pl.col("cand").gather(pl.col("cand"))).otherwise(pl.col("cand")).alias("cand"))
    return t["cand"]


@pytest.mark.parametrize("seed", range(40))
def test_pointer_jumping_on_the_jumping_rows_only_gives_the_same_parents(seed: int) -> None:
    """Random ranges on a few threads, nested, crossing, open (null end) and empty, sorted as
    the range tree sorts them: the same parent candidates as recomputing every row each round."""
    import random

    from tracekit.analysis.attribution import _pointer_jump_parents

    rng = random.Random(seed)
    rows = []
    for _ in range(rng.randint(0, 300)):
        start = rng.randint(0, 1000)
        length = rng.choice([0, 1, 5, 50, 400, None])
        rows.append({"global_tid": rng.randint(1, 3), "start_ns": start, "end_ns": None if length is None else start + length})
    frame = pl.DataFrame(rows, schema={"global_tid": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64})
    frame = frame.sort(["global_tid", "start_ns", "end_ns"], descending=[False, False, True]).with_row_index("_idx")
    prev = frame.select(pl.when(pl.col("global_tid") == pl.col("global_tid").shift(1)).then(pl.col("_idx").cast(pl.Int64) - 1))
    prev_s, end = prev.to_series(), frame["end_ns"]
    assert _pointer_jump_parents(prev_s, end).equals(_pointer_jump_every_row(prev_s, end), check_names=False)
    assert prev_s.equals(prev.to_series())  # the input is not changed in place


@pytest.mark.parametrize("which", ["planted_memory_growth", "tp2_per_rank"])
def test_nvtx_cut_to_a_span_keeps_the_whole_tables_range_ids(which: str) -> None:
    """``nvtx_overlapping`` cuts the table to a span (a sampled diagnosis window keeps only
    those rows) and each row keeps its number in the whole table, per rank: every closed range
    of the cut has the ``range_id``, ``parent_id``, ``level`` and ``path`` the whole table
    gives it, and none that overlaps the span is missing. Numbered afresh, the ids of a cut
    named other ranges (the memory-growth rule then took a step range for a layer). Checked
    on nested steps and layers of one process and on a two-rank set."""
    from tracekit.analysis.attribution import WHOLE_ROW, nvtx_overlapping, nvtx_ranges

    if which == "tp2_per_rank":
        nvtx = tracekit.open_many(PER_RANK).nvtx
    else:
        nvtx = _open(SAMPLES / "planted" / which / f"{which}.sqlite").nvtx
    whole = nvtx_ranges(nvtx)
    starts = whole["start_ns"].sort()
    a, b = int(starts[starts.len() // 3]) + 1, int(starts[2 * starts.len() // 3])  # the middle third of the ranges
    cut = nvtx_overlapping(nvtx, a, b)
    assert WHOLE_ROW in cut.columns and 0 < cut.height < nvtx.height
    keys = ["rank"] if "rank" in nvtx.columns else []
    closed = ~pl.col("is_open")
    got = nvtx_ranges(cut).filter(closed).sort([*keys, "range_id"])
    want = whole.filter(closed & (pl.col("end_ns") > a) & (pl.col("start_ns") < b)).sort([*keys, "range_id"])
    assert want.height > 2 and want["level"].max() >= 1  # nested ranges in the span
    assert got.equals(want)
    # numbered afresh (the cut without its column), the ids are not the whole table's
    fresh = nvtx_ranges(cut.drop(WHOLE_ROW)).filter(closed).sort([*keys, "range_id"])
    assert not fresh["range_id"].equals(want["range_id"])
