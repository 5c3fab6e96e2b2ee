"""GPU busy time, utilization bins, stream concurrency and idle gaps, checked against
interval arithmetic on the raw rows."""

from __future__ import annotations

import shutil
import sqlite3
import warnings
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit.analysis.gpu_time import (
    busy_time,
    gpu_ops,
    idle_gaps,
    stream_concurrency,
    utilization,
)
from tracekit.errors import DamagedRowsWarning

from .conftest import NSYS_CORPUS, SAMPLES

TP2 = SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"
CLOVER = NSYS_CORPUS / "nsys2024.5_pipit_cloverleaf_4xa100.sqlite"
MFU = NSYS_CORPUS / "nsys2026.2_nsysai_mfu_2xh100_nccl_slice.sqlite"


def _open(path: Path) -> tracekit.NsysTrace:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tracekit.open(path)  # type: ignore[return-value]


def _raw_intervals(path: Path) -> dict[int, list[tuple[int, int, int]]]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    names = {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
    out: dict[int, list[tuple[int, int, int]]] = {}
    for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        if t in names:
            for dev, s, e, strm in con.execute(f"SELECT deviceId, start, end, streamId FROM {t}"):
                out.setdefault(dev, []).append((s, e, strm))
    con.close()
    return out


def _union(iv: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for s, e in sorted(iv):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [(a, b) for a, b in merged]


@pytest.mark.parametrize("path", [TP2, CLOVER, MFU], ids=lambda p: p.stem)
def test_busy_time_is_the_union_of_op_intervals(path: Path) -> None:
    t = _open(path)
    busy = busy_time(gpu_ops(t.kernels, t.memcpys, t.memsets))
    raw = _raw_intervals(path)
    assert sorted(busy["device_id"]) == sorted(raw)
    for row in busy.iter_rows(named=True):
        iv = raw[row["device_id"]]
        u = _union([(s, e) for s, e, _ in iv])
        assert row["busy_ns"] == sum(b - a for a, b in u)
        assert row["span_ns"] == max(e for _, e, _ in iv) - min(s for s, _, _ in iv)
        assert row["summed_ns"] == sum(e - s for s, e, _ in iv)
        assert row["utilization"] == pytest.approx(row["busy_ns"] / row["span_ns"])


def test_utilization_bins_add_up_to_busy_time() -> None:
    t = _open(CLOVER)
    ops = gpu_ops(t.kernels, t.memcpys, t.memsets)
    bins = utilization(ops, bin_ns=5_000_000)
    busy = busy_time(ops)
    per_dev = bins.group_by("device_id").agg(pl.col("busy_ns").sum()).sort("device_id")
    assert per_dev["busy_ns"].to_list() == busy.sort("device_id")["busy_ns"].to_list()
    assert bins["utilization"].max() <= 1.0 + 1e-12 and bins["utilization"].min() >= 0
    # every bin of the window is listed, idle ones too
    n_bins = bins.group_by("device_id").len()["len"].unique().to_list()
    assert len(n_bins) == 1
    with pytest.raises(ValueError, match="positive"):
        utilization(ops, bin_ns=0)


def _sweep(iv: list[tuple[int, int, int]]) -> dict[int, int]:
    """Time with k streams busy: a plain event sweep over each stream's merged intervals."""
    per_stream: dict[int, list[tuple[int, int]]] = {}
    for s, e, strm in iv:
        per_stream.setdefault(strm, []).append((s, e))
    events = sorted((p, d) for u in per_stream.values() for a, b in _union(u) for p, d in ((a, 1), (b, -1)))
    out: dict[int, int] = {}
    active, last = 0, None
    for t, d in events:
        if last is not None and t > last:
            out[active] = out.get(active, 0) + t - last
        active += d
        last = t
    return out


@pytest.mark.parametrize("shift", [0, 150_000], ids=["as_captured", "streams_overlapping"])
def test_stream_concurrency_by_brute_force(shift: int, tmp_path: Path) -> None:
    path = MFU
    if shift:
        # a copy where every 5th kernel moves to a new stream and earlier, so streams overlap
        path = tmp_path / "overlap.sqlite"
        shutil.copyfile(MFU, path)
        con = sqlite3.connect(path)
        con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET streamId = streamId + 1000, start = start - ?, end = end - ? WHERE rowid % 5 = 0", (shift, shift))
        con.commit()
        con.close()
    t = _open(path)
    ops = gpu_ops(t.kernels, t.memcpys, t.memsets)
    conc = stream_concurrency(ops)
    busy = busy_time(ops)
    raw = _raw_intervals(path)
    for row in busy.iter_rows(named=True):
        mine = conc.filter(pl.col("device_id") == row["device_id"])
        assert dict(zip(mine["streams"], mine["time_ns"], strict=True)) == {k: v for k, v in _sweep(raw[row["device_id"]]).items() if v}
        assert mine["time_ns"].sum() == row["span_ns"]
        assert mine.filter(pl.col("streams") == 0)["time_ns"].sum() == row["idle_ns"]
    if shift:
        assert conc["streams"].max() >= 2


def test_idle_gaps_are_the_holes_of_the_busy_union() -> None:
    t = _open(TP2)
    ops = gpu_ops(t.kernels, t.memcpys, t.memsets)
    gaps = idle_gaps(ops, t.cuda_api, min_gap_ns=0)
    busy = busy_time(ops)
    per_dev = gaps.group_by("device_id").agg(pl.col("duration_ns").sum()).sort("device_id")
    assert per_dev["duration_ns"].to_list() == busy.sort("device_id")["idle_ns"].to_list()
    assert set(gaps["cause"]) <= {"dependency", "sync_wait", "host_copy", "launch_bound", "untraced"}
    big = idle_gaps(ops, t.cuda_api, min_gap_ns=1_000_000)
    assert (big["duration_ns"] >= 1_000_000).all() and big.height < gaps.height


def test_idle_gap_cause_from_the_cpu_side() -> None:
    """sync_ns of a gap = the time *Synchronize calls of the thread that launched the next
    operation overlap it — checked with SQL on the raw API rows for every gap a sync touches —
    and such a gap is sync_wait only when they fill half of it."""
    t = _open(TP2)
    gaps = idle_gaps(gpu_ops(t.kernels, t.memcpys, t.memsets), t.cuda_api, min_gap_ns=10_000)
    touched = gaps.filter(pl.col("sync_ns") > 0)
    assert touched.height > 0
    con = sqlite3.connect(f"file:{TP2}?mode=ro", uri=True)
    for row in touched.iter_rows(named=True):
        # the launching thread of the next op is the one whose call ended the gap
        overlap = con.execute(
            "SELECT sum(min(r.end, ?) - max(r.start, ?)) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s "
            "ON s.id = r.nameId WHERE (s.value LIKE '%Synchronize%' OR s.value LIKE '%Query%') AND r.start < ? AND r.end > ? AND r.globalTid IN "
            "(SELECT globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE start = ?)",
            (row["end_ns"], row["start_ns"], row["end_ns"], row["start_ns"], row["next_launched_ns"]),
        ).fetchone()[0]
        assert overlap == row["sync_ns"]
        assert (row["cause"] == "sync_wait") == (row["sync_ns"] >= 0.5 * row["duration_ns"]) or row["cause"] == "dependency"
    con.close()
    dep = gaps.filter(pl.col("cause") == "dependency")
    assert (dep["next_launched_ns"] <= dep["start_ns"]).all()


def test_multi_rank_busy_time_and_gaps() -> None:
    files = [SAMPLES / "llm_tp2_nccl_per_rank" / f"llm_tp2_nccl_per_rank_rank{r}.sqlite" for r in (0, 1)]
    traces = [_open(p) for p in files]
    ops = pl.concat([gpu_ops(t.kernels, t.memcpys, t.memsets).with_columns(pl.lit(r).alias("rank")) for r, t in enumerate(traces)])
    api = pl.concat([t.cuda_api.with_columns(pl.lit(r).alias("rank")) for r, t in enumerate(traces)])
    busy = busy_time(ops)
    gaps = idle_gaps(ops, api, min_gap_ns=50_000)
    for r, t in enumerate(traces):
        single_ops = gpu_ops(t.kernels, t.memcpys, t.memsets)
        assert busy.filter(pl.col("rank") == r).drop("rank").equals(busy_time(single_ops))
        assert gaps.filter(pl.col("rank") == r).drop("rank").equals(idle_gaps(single_ops, t.cuda_api, min_gap_ns=50_000))
    assert utilization(ops, bin_ns=10_000_000)["rank"].n_unique() == 2


def test_idle_gap_causes_cover_their_share() -> None:
    """A gap's cause must fill cause_share (50 %) of it: on the decode sample the synchronising
    calls fill 11.7 % of the 7 gaps they touch, so none of them is sync_wait any more; every
    labelled gap's own kind fills at least half of it (recomputed from the columns)."""
    import polars as pl

    import tracekit
    from tracekit.analysis.gpu_time import gpu_ops, idle_gaps

    from .conftest import SAMPLES

    t = tracekit.open(SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite")
    g = idle_gaps(gpu_ops(t.kernels, t.memcpys, t.memsets), t.cuda_api)
    touched = g.filter(pl.col("sync_ns") > 0)
    assert touched.height == 7 and touched["sync_ns"].sum() / touched["duration_ns"].sum() < 0.2
    assert g.filter(pl.col("cause") == "sync_wait").height == 0
    half = 0.5 * pl.col("duration_ns")
    for cause, col in (("sync_wait", "sync_ns"), ("host_copy", "copy_ns"), ("launch_bound", "launch_ns"), ("cuda_api", "other_api_ns")):
        assert g.filter((pl.col("cause") == cause) & (pl.col(col) < half)).height == 0
    untraced = g.filter(pl.col("cause") == "untraced")
    for col in ("sync_ns", "copy_ns", "launch_ns", "other_api_ns"):
        assert untraced.filter(pl.col(col) >= half).height == 0


def test_gaps_inside_other_cuda_calls_have_their_own_cause() -> None:
    """Before its loop the planted memory-growth workload sits in cudaMalloc while the GPU idles:
    those gaps are cuda_api, not untraced (nor sync_wait)."""
    import polars as pl

    import tracekit
    from tracekit.analysis.gpu_time import gpu_ops, idle_gaps

    from .conftest import SAMPLES

    t = tracekit.open(SAMPLES / "planted" / "planted_memory_growth" / "planted_memory_growth.sqlite")
    g = idle_gaps(gpu_ops(t.kernels, t.memcpys, t.memsets), t.cuda_api)
    api = g.filter(pl.col("cause") == "cuda_api")
    assert api.height > 0 and (api["other_api_ns"] >= 0.5 * api["duration_ns"]).all()


def test_utilization_refuses_a_grid_a_damaged_end_time_would_need(tmp_path: Path) -> None:
    """Issue 19.1: one kernel end of INT64_MAX in a copy of TP2 made utilization() ask for ~73 TB;
    the loader now warns with the count and gpu_ops leaves the kernel out; a frame that still
    carries such an end is one ValueError naming the span, before anything is allocated."""
    copy = tmp_path / "t.sqlite"
    shutil.copyfile(TP2, copy)
    con = sqlite3.connect(copy)
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = 9223372036854775807 "
                "WHERE rowid = (SELECT min(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL)")  # fmt: skip
    con.commit()
    con.close()
    t = tracekit.open(copy, column_cache=False)
    with pytest.warns(DamagedRowsWarning, match="1 kernels row.*end more than an hour past the last start"):
        kernels = t.kernels
    # gpu_ops leaves that kernel out (issue 19.1), so the grid is the intact one's less nothing
    ops = gpu_ops(kernels, t.memcpys, t.memsets)
    assert ops.height == kernels.height - 1 + t.memcpys.height + t.memsets.height
    assert utilization(ops).height > 0
    # a frame that still carries the end (built by hand from the table) is refused, not allocated
    damaged = ops.vstack(ops.head(1).with_columns(pl.lit(9223372036854775807, pl.Int64).alias("end_ns")))
    with pytest.raises(ValueError, match="damaged end time"):
        utilization(damaged)
    # the intact sample passes the same check
    intact = _open(TP2)
    assert utilization(gpu_ops(intact.kernels, intact.memcpys, intact.memsets)).height > 0


def test_idle_gaps_in_small_chunks_equal_one_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gap × call pairs are worked through a bounded chunk at a time: chunks of 7 pairs give
    the gaps of one chunk, on one process and on a set of ranks."""
    from tracekit.analysis import gpu_time
    from tracekit.analysis._frames import gpu_ops

    one = tracekit.open(SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite")
    ranks = tracekit.open_many(SAMPLES / "llm_tp2_nccl_per_rank")
    for t in (one, ranks):
        ops = gpu_ops(t.kernels, t.memcpys, t.memsets, columns=["name"])
        whole = gpu_time.idle_gaps(ops, t.cuda_api)
        monkeypatch.setattr(gpu_time, "_PAIRS_PER_CHUNK", 7)
        small = gpu_time.idle_gaps(ops, t.cuda_api)
        monkeypatch.undo()
        assert whole.height > 100 and small.equals(whole)
        assert whole.filter(pl.col("launch_ns") > 0).height > 0  # calls were matched


def _call_ranges_by_as_of_joins(g: pl.DataFrame, api: pl.DataFrame, tk: list[str]) -> pl.DataFrame:
    """The index ranges as three as-of joins by thread gave them (the code before 2026-11-30)."""
    lo = g.sort([*tk, "start_ns"]).join_asof(
        api.select(*tk, pl.col("_as").alias("start_ns"), pl.col("_ai").alias("_lo")),
        on="start_ns", by=tk, strategy="backward", check_sortedness=False,
    )
    hi = g.sort([*tk, "end_ns"]).join_asof(
        api.select(*tk, pl.col("_as").alias("end_ns"), pl.col("_ai").alias("_hi")),
        on="end_ns", by=tk, strategy="backward", check_sortedness=False, allow_exact_matches=False,
    )
    first_in = g.sort([*tk, "start_ns"]).join_asof(
        api.select(*tk, pl.col("_as").alias("start_ns"), pl.col("_ai").alias("_first")),
        on="start_ns", by=tk, strategy="forward", check_sortedness=False,
    ).select("_gap", "_first")
    rng = lo.select("_gap", "_lo").join(hi.select("_gap", "_hi"), on="_gap").join(first_in, on="_gap", how="left")
    return rng.select("_gap", pl.coalesce("_lo", "_first").alias("_lo"), "_hi")


@pytest.mark.parametrize("block", [None, 7])
@pytest.mark.parametrize("which", ["tp2", "tp2_ranks", "mfu"])
def test_call_ranges_equal_as_of_joins(which: str, block: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each gap's range of calls of its thread (a binary search in the thread's run of calls)
    equals what as-of joins by thread give, on real calls: spans drawn at random between the
    calls' own start times (ties with a call's start on both ends, before the first call and
    after the last, threads without a call): one process of 6 threads, two ranks of 3, two
    processes of 2."""
    import random

    from tracekit.analysis import gpu_time

    if block is not None:  # each run's gaps searched a few at a time
        monkeypatch.setattr(gpu_time, "_GAPS_PER_SEARCH", block)
    trace = {"tp2": lambda: _open(TP2), "tp2_ranks": lambda: tracekit.open_many(SAMPLES / "llm_tp2_nccl_per_rank"),
             "mfu": lambda: _open(MFU)}[which]()
    cuda_api = trace.cuda_api
    rk = ["rank"] if "rank" in cuda_api.columns else []
    tk = [*rk, "global_tid"]
    threads = cuda_api.get_column("global_tid").unique()
    api = gpu_time._calls_by_thread(cuda_api, rk, threads)
    rnd = random.Random(7)
    keys = api.select(tk).unique(maintain_order=True).rows()
    starts = api.get_column("_as").to_list()
    rows = []
    for i in range(3000):
        key = rnd.choice(keys)
        a, b = sorted(rnd.choice(starts) + rnd.choice((0, 0, 1, -1, 5_000)) for _ in range(2))
        rows.append((i, *key, a, b))
    lo_all, hi_all = min(starts), max(starts)
    rows += [(3000, *keys[0], lo_all - 10, lo_all - 5), (3001, *keys[0], hi_all + 5, hi_all + 10),
             (3002, *((-1,) * len(tk)), lo_all, hi_all)]  # before every call, after every call, no such thread
    schema = {"_gap": pl.UInt32, **{c: api.schema[c] for c in tk}, "start_ns": pl.Int64, "end_ns": pl.Int64}
    g = pl.DataFrame(rows, schema=schema, orient="row")
    got = gpu_time._call_ranges(g, api, tk).sort("_gap")
    want = _call_ranges_by_as_of_joins(g, api, tk).filter(pl.col("_lo").is_not_null() | pl.col("_hi").is_not_null())
    got = got.filter(pl.col("_lo").is_not_null() | pl.col("_hi").is_not_null())
    assert api.select(tk).n_unique() >= 4  # the threads' runs
    assert got.height > 2500 and got.equals(want.sort("_gap").cast(got.schema))  # type: ignore[arg-type]


def test_call_ranges_ignore_calls_without_a_start_and_null_keys() -> None:
    """As the as-of joins: a call without a start (a damaged export) is no gap's first call, and
    a gap or call whose thread key is null (a rank-less report beside ranked ones) matches
    nothing; 300 random small cases with both agree with the joins."""
    import random

    from tracekit.analysis.gpu_time import _call_ranges

    api = pl.DataFrame({"global_tid": [1, 1, 1], "_as": [None, 10, 20]}).sort("global_tid", "_as").with_row_index("_ai")
    g = pl.DataFrame({"_gap": [0], "global_tid": [1], "start_ns": [5], "end_ns": [12]}, schema_overrides={"_gap": pl.UInt32})
    assert _call_ranges(g, api, ["global_tid"]).rows() == [(0, 1, 1)]  # the call at 10, not the one without a start
    api = pl.DataFrame({"rank": [None, 0], "global_tid": [1, 1], "_as": [10, 10]}).sort("rank", "global_tid", "_as").with_row_index("_ai")
    g = pl.DataFrame({"_gap": [0, 1], "rank": [None, 0], "global_tid": [1, 1], "start_ns": [12, 12], "end_ns": [15, 15]},
                     schema_overrides={"_gap": pl.UInt32})
    assert _call_ranges(g, api, ["rank", "global_tid"]).rows() == [(1, 1, 1)]  # the null rank's gap: no calls
    rnd = random.Random(1)
    for _ in range(300):
        tk = ["rank", "global_tid"] if rnd.random() < 0.5 else ["global_tid"]
        calls = [(rnd.randint(0, 2), rnd.randint(1, 4), rnd.choice([None, *range(0, 100, 7)])) for _ in range(rnd.randint(0, 60))]
        api = pl.DataFrame(calls, schema={"rank": pl.Int64, "global_tid": pl.Int64, "_as": pl.Int64}, orient="row")
        api = api.select(*tk, "_as").sort([*tk, "_as"]).with_row_index("_ai")
        spans = [(i, rnd.randint(0, 2), rnd.randint(1, 5), *sorted((rnd.randint(-5, 105), rnd.randint(-5, 105))))
                 for i in range(rnd.randint(0, 30))]
        g = pl.DataFrame(spans, schema={"_gap": pl.UInt32, "rank": pl.Int64, "global_tid": pl.Int64, "start_ns": pl.Int64,
                                        "end_ns": pl.Int64}, orient="row").select("_gap", *tk, "start_ns", "end_ns")
        some = pl.col("_lo").is_not_null() | pl.col("_hi").is_not_null()
        got = _call_ranges(g, api, tk).filter(some).sort("_gap")
        want = _call_ranges_by_as_of_joins(g, api, tk).filter(some).sort("_gap")
        assert got.equals(want.cast(got.schema)), (api, g)  # type: ignore[arg-type]


@pytest.mark.parametrize("which", ["tp2", "tp2_ranks", "mfu", "clover"])
def test_call_kinds_by_name_membership_equal_the_join_on_names(which: str) -> None:
    """Each call's kind code (``_k``), found by membership of its name in each kind's names,
    equals what the join of the calls' names to the names' kinds gave (the code before
    2026-11-30), on real calls and with some names made null (kind 3, "other")."""
    from tracekit.analysis import gpu_time

    trace = {"tp2": lambda: _open(TP2), "tp2_ranks": lambda: tracekit.open_many(SAMPLES / "llm_tp2_nccl_per_rank"),
             "mfu": lambda: _open(MFU), "clover": lambda: _open(CLOVER)}[which]()
    cuda_api = trace.cuda_api
    cuda_api = cuda_api.with_columns(pl.when(pl.int_range(pl.len()) % 7 == 3).then(None).otherwise(pl.col("name")).alias("name"))
    rk = ["rank"] if "rank" in cuda_api.columns else []
    got = gpu_time._calls_by_thread(cuda_api, rk, cuda_api.get_column("global_tid").unique())
    n = pl.col("_n")
    kind = (
        pl.when(n.str.contains(gpu_time.SYNC_API_PATTERN)).then(0)
        .when(n.str.contains(gpu_time.COPY_API_PATTERN) & ~n.str.contains("Async")).then(1)
        .when(n.str.contains(gpu_time.LAUNCH_API_PATTERN)).then(2)
        .otherwise(3)
    ).cast(pl.UInt8)
    names = cuda_api.select(pl.col("name").unique()).with_columns(pl.col("name").fill_null("").alias("_n"))
    codes = cuda_api.select("name").join(names.select("name", kind.alias("_k")), on="name", how="left",
                                         maintain_order="left").get_column("_k").fill_null(3)
    cols = [*rk, "global_tid", "_as", "_ae", "_k"]
    want = cuda_api.select(*rk, "global_tid", pl.col("start_ns").alias("_as"), pl.col("end_ns").alias("_ae")).with_columns(codes)
    assert set(got.get_column("_k").unique().to_list()) >= {0, 2, 3}  # syncs, launches and others were told apart
    assert got.height == cuda_api.height and got.select(cols).sort(cols).equals(want.select(cols).sort(cols))


def test_next_operation_beside_the_gaps_equals_the_join() -> None:
    """The gaps' next operation put beside them row by row where its keys are the gaps' own,
    in order, equals the left join on the keys; any other case (a missing or extra row, a
    different order, a null key) takes the join. 500 random cases and the real gaps of TP2."""
    import random

    from tracekit.analysis.gpu_time import _with_next

    rnd = random.Random(3)
    on = ["device_id", "end_ns"]
    fast = 0
    for _ in range(500):
        n = rnd.randint(0, 12)
        keys = sorted({(rnd.randint(0, 2), rnd.randint(0, 50)) for _ in range(n)})
        gaps = pl.DataFrame(keys, schema={"device_id": pl.Int64, "end_ns": pl.Int64}, orient="row").with_columns(
            pl.int_range(pl.len()).alias("start_ns"))
        nxt_keys = list(keys)
        shape = rnd.choice(["same", "same", "drop", "extra", "swap", "null"])
        if shape == "drop" and nxt_keys:
            nxt_keys.pop(rnd.randrange(len(nxt_keys)))
        elif shape == "extra" and nxt_keys:
            nxt_keys.insert(rnd.randrange(len(nxt_keys)), rnd.choice(nxt_keys))
        elif shape == "swap" and len(nxt_keys) > 1:
            i = rnd.randrange(len(nxt_keys) - 1)
            nxt_keys[i], nxt_keys[i + 1] = nxt_keys[i + 1], nxt_keys[i]
        nxt = pl.DataFrame(nxt_keys, schema={"device_id": pl.Int64, "end_ns": pl.Int64}, orient="row").with_columns(
            pl.int_range(pl.len()).cast(pl.Utf8).alias("next_op"), (pl.int_range(pl.len()) * 10).alias("global_tid"))
        if shape == "null" and gaps.height:
            gaps = gaps.with_columns(pl.when(pl.int_range(pl.len()) == 0).then(None).otherwise(pl.col("device_id")).alias("device_id"))
            nxt = nxt.with_columns(pl.when(pl.int_range(pl.len()) == 0).then(None).otherwise(pl.col("device_id")).alias("device_id"))
        got = _with_next(gaps, nxt, on)
        want = gaps.join(nxt, on=on, how="left", maintain_order="left")
        assert got.equals(want), (shape, gaps, nxt)
        fast += shape == "same" and gaps.height > 0
    assert fast > 100
    ops = _open(TP2).kernels
    gaps = idle_gaps(ops, _open(TP2).cuda_api)
    assert gaps.height > 100 and gaps.get_column("next_op").null_count() < gaps.height


@pytest.mark.parametrize("source", ["tp2", "tp2_ranks"])
def test_next_operation_is_the_first_in_row_order_of_those_starting_together(source: str) -> None:
    """Where several operations start where a gap ends, the gap's next operation is the first
    of them in the table's rows: TP2's kernels (one export, and the per-rank exports with
    their ``rank`` key) with a renamed copy of each kernel that ends a gap, put after every
    original row (the originals are picked) and before them (the copies are); every other
    column of the gaps is unchanged."""
    trace = _open(TP2) if source == "tp2" else tracekit.open_many(SAMPLES / "llm_tp2_nccl_per_rank")
    ops, api = trace.kernels, trace.cuda_api
    assert ("rank" in ops.columns) == (source == "tp2_ranks")
    plain = idle_gaps(ops, api)
    keys = [c for c in ("rank", "device_id") if c in ops.columns]
    twins = ops.join(plain.select(*keys, pl.col("end_ns").alias("start_ns")), on=[*keys, "start_ns"],
                     how="semi").with_columns(pl.lit("twin").alias("name"))
    assert twins.height >= plain.height > 100
    after = idle_gaps(pl.concat([ops, twins]), api)
    before = idle_gaps(pl.concat([twins, ops]), api)
    assert after.equals(plain)
    assert before.drop("next_op").equals(plain.drop("next_op"))
    assert before.get_column("next_op").to_list() == ["twin"] * plain.height


def test_rows_where_equals_a_filter() -> None:
    """``rows_where`` gives the filter's rows in order (a slice where they are one run), with
    null conditions dropped as a filter drops them: random windows and scattered masks on a
    real kernel table."""
    import random

    from tracekit.analysis._frames import rows_where

    k = _open(TP2).kernels.sort("start_ns")
    starts = k.get_column("start_ns").to_list()
    rnd = random.Random(5)
    runs = 0
    for _ in range(200):
        a, b = sorted((rnd.choice(starts), rnd.choice(starts) + rnd.choice((0, 1, -1))))
        cond = rnd.choice([
            (pl.col("start_ns") >= a) & (pl.col("start_ns") < b),  # one run
            (pl.col("start_ns") >= a) & (pl.col("device_id") == rnd.randint(0, 1)),  # scattered
            pl.when(pl.col("start_ns") >= a).then(pl.col("start_ns") < b),  # null outside: dropped
            pl.lit(True), pl.lit(False),
        ])
        got, want = rows_where(k, cond), k.filter(cond)
        assert got.equals(want)
        runs += want.height > 1
    assert runs > 50


def test_calls_of_one_thread_in_order_or_not_come_back_sorted() -> None:
    """One launching thread's calls: taken as they are when their starts are in order, sorted
    when not (checked on the starts alone); either way sorted by start and numbered."""
    from tracekit.analysis import gpu_time

    api = _open(TP2).cuda_api
    tid = api.group_by("global_tid").len().sort("len", descending=True)["global_tid"][0]
    one = api.filter(pl.col("global_tid") == tid)
    assert one.height > 100 and one.get_column("start_ns").is_sorted()
    want = gpu_time._calls_by_thread(one, [], pl.Series([tid]))
    assert want.get_column("_as").is_sorted() and want.get_column("_ai").to_list() == list(range(one.height))
    shuffled = one.sample(fraction=1.0, shuffle=True, seed=1)
    got = gpu_time._calls_by_thread(shuffled, [], pl.Series([tid]))
    assert got.get_column("_as").is_sorted()
    cols = ["global_tid", "_as", "_ae", "_k", "_ai"]
    assert got.select(cols).equals(want.select(cols))
