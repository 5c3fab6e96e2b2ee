"""Per-range device memory (layer_memory) against a replay of the raw export rows.

The replay reads ``CUDA_GPU_MEMORY_USAGE_EVENTS`` and ``NVTX_EVENTS`` with sqlite3 and walks
each process's events on each device in a plain loop: it shares no code with tracekit.
"""

from __future__ import annotations

import shutil
import sqlite3
import warnings
from collections import defaultdict
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit.analysis.memory import layer_memory, layer_memory_summary
from tracekit.errors import EmptyResultWarning

from .conftest import SAMPLES

TRAIN = SAMPLES / "llm_train_emit_nvtx_1gpu" / "llm_train_emit_nvtx_1gpu.sqlite"
TP2 = SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"
TP2_RANK1 = SAMPLES / "llm_tp2_nccl_per_rank" / "llm_tp2_nccl_per_rank_rank1.sqlite"
PID_UNIT = 1 << 24
MIB = 1 << 20
HOST_KINDS = (0, 1)  # ENUM_CUDA_MEM_KIND: pageable, pinned
RANGE_TYPES = (59, 60, 70, 71)  # push/pop and start/end ranges


def _open(path: Path) -> tracekit.NsysTrace:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tracekit.open(path)  # type: ignore[return-value]


def _replay(path: Path) -> dict[tuple[int, int], dict[str, int]]:
    """(range_id, device_id) → the expected numbers, computed event by event."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        mem = con.execute(
            "SELECT rowid, start, globalPid, deviceId, address, bytes, memoryOperationType FROM CUDA_GPU_MEMORY_USAGE_EVENTS "
            f"WHERE memKind NOT IN {HOST_KINDS}"
        ).fetchall()
        rng = con.execute(
            "SELECT rowid, start, end, globalTid FROM NVTX_EVENTS "
            f"WHERE eventType IN {RANGE_TYPES} AND end IS NOT NULL AND endGlobalTid IS NULL"
        ).fetchall()
    finally:
        con.close()
    # a free releases the size of the latest allocation at its address (CUPTI reports some
    # frees with size 0); events of one process and device, in time order, frees first
    latest: dict[tuple[int, int, int], int] = {}
    per_dev: dict[tuple[int, int], list[tuple[int, int, int, int]]] = defaultdict(list)
    for rowid, start, gpid, dev, address, size, op in sorted(mem, key=lambda r: (r[1], r[6] == 0, r[0])):
        if op == 0:
            latest[(gpid, dev, address)] = size
            per_dev[(gpid, dev)].append((start, 1, rowid, size))
        else:
            per_dev[(gpid, dev)].append((start, 0, rowid, -(size or latest.get((gpid, dev, address), 0))))
    for events in per_dev.values():
        events.sort()
    expected: dict[tuple[int, int], dict[str, int]] = {}
    for range_id, start, end, gtid in rng:
        gpid = gtid // PID_UNIT * PID_UNIT
        for (p, dev), events in per_dev.items():
            if p != gpid:
                continue
            total = 0
            entry = None
            peak = None
            allocated = freed = n_allocs = n_frees = 0
            for t, order, _rowid, delta in events:
                if t >= end:
                    break
                if t >= start and entry is None:
                    entry = total
                    peak = total
                total += delta
                if t >= start:
                    peak = max(peak, total)  # type: ignore[type-var]
                    if order == 1:
                        allocated += delta
                        n_allocs += 1
                    else:
                        freed -= delta
                        n_frees += 1
            if entry is None:  # nothing inside the range
                entry = peak = total
            expected[(range_id, dev)] = {
                "in_use_at_entry_bytes": entry, "in_use_at_exit_bytes": total, "peak_inside_bytes": peak,  # type: ignore[dict-item]
                "net_growth_bytes": total - entry, "allocated_bytes": allocated, "freed_bytes": freed,
                "n_allocs": n_allocs, "n_frees": n_frees, "start_ns": start, "end_ns": end,
            }
    return expected


NUMBERS = ["in_use_at_entry_bytes", "in_use_at_exit_bytes", "peak_inside_bytes", "net_growth_bytes",
           "allocated_bytes", "freed_bytes", "n_allocs", "n_frees", "start_ns", "end_ns"]


def _check_against_replay(path: Path) -> pl.DataFrame:
    t = _open(path)
    got = layer_memory(t.memory_usage, t.nvtx)
    expected = _replay(path)
    assert got.height == len(expected) > 0
    for row in got.iter_rows(named=True):
        want = expected[(row["range_id"], row["device_id"])]
        assert {k: row[k] for k in NUMBERS} == want, row["name"]
    return got


@pytest.fixture
def boundary_copy(tmp_path: Path) -> Path:
    """A copy of the training export with device allocations and frees planted at the edges of
    the first ``layer.0`` range (the capture itself allocates inside only one range)."""
    copy = tmp_path / "boundaries.sqlite"
    shutil.copyfile(TRAIN, copy)
    con = sqlite3.connect(copy)
    s, e = con.execute(
        "SELECT n.start, n.end FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId "
        "WHERE coalesce(n.text, s.value) = 'layer.0' ORDER BY n.start LIMIT 1"
    ).fetchone()
    gpid = con.execute("SELECT globalPid FROM CUDA_GPU_MEMORY_USAGE_EVENTS WHERE memKind = 2 LIMIT 1").fetchone()[0]
    rows = [  # (start, address, bytes, memKind, operation): 0 alloc, 1 free
        (s, 0x7000_0000_0000, 1 * MIB, 2, 0),  # exactly at the start: inside
        (s + 10, 0x7000_0000_0000, 0, 2, 1),  # a free without a size, at the same ns as …
        (s + 10, 0x7000_1000_0000, 2 * MIB, 2, 0),  # … an allocation: the free applies first
        (s + 20, 0x7000_2000_0000, 8 * MIB, 1, 0),  # pinned host memory: not counted
        (e, 0x7000_3000_0000, 4 * MIB, 2, 0),  # exactly at the end: after the range
    ]
    con.executemany(
        "INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS (start, globalPid, deviceId, contextId, address, pc, bytes, memKind, "
        "memoryOperationType, correlationId) VALUES (?, ?, 0, 1, ?, 0, ?, ?, ?, 0)",
        [(t, gpid, a, b, k, op) for t, a, b, k, op in rows],
    )
    con.commit()
    con.close()
    return copy


@pytest.mark.parametrize("path", [TRAIN, TP2, TP2_RANK1], ids=lambda p: p.stem)
def test_every_range_matches_the_replay(path: Path) -> None:
    got = _check_against_replay(path)
    # every closed range of the processes with memory events, on each of their devices
    assert got.select("range_id", "device_id").is_unique().all()


def test_training_sample_numbers() -> None:
    """The one allocation the training capture made inside its ranges (16 MiB in step 0's
    backward), and the layers that allocated nothing."""
    t = _open(TRAIN)
    got = layer_memory(t.memory_usage, t.nvtx, ranges=r"^(step\.\d+|layer\.\d+|attn|mlp|backward|optimizer)$")
    back = got.filter(pl.col("name") == "backward").sort("start_ns")
    assert back["phase"].to_list() == ["backward", "backward"] and back["step"].to_list() == [0, 1]
    assert back["allocated_bytes"].to_list() == [16 * MIB, 0] and back["net_growth_bytes"].to_list() == [16 * MIB, 0]
    assert back["n_allocs"].to_list() == [1, 0]
    layers = got.filter(pl.col("name").str.starts_with("layer."))
    assert layers.height == 8 and (layers["net_growth_bytes"] == 0).all() and set(layers["phase"]) == {"forward"}
    assert sorted(layers.filter(pl.col("name") == "layer.2")["instance"].to_list()) == [0, 1]
    assert layers["step"].to_list() == [0, 0, 0, 0, 1, 1, 1, 1]
    summary = layer_memory_summary(got)
    row = summary.filter(pl.col("name") == "backward").row(0, named=True)
    assert (row["instances"], row["mean_net_growth_bytes"], row["total_net_growth_bytes"]) == (2, 8 * MIB, 16 * MIB)
    per_step = layer_memory_summary(got, by=("name", "step"))
    assert per_step.filter(pl.col("name") == "attn")["instances"].to_list() == [4, 4]


def test_boundary_events(boundary_copy: Path) -> None:
    got = _check_against_replay(boundary_copy)
    layer0 = got.filter(pl.col("name") == "layer.0").sort("start_ns").row(0, named=True)
    entry = layer0["in_use_at_entry_bytes"]
    assert layer0["allocated_bytes"] == 3 * MIB and layer0["freed_bytes"] == 1 * MIB
    assert (layer0["n_allocs"], layer0["n_frees"]) == (2, 1)
    assert layer0["net_growth_bytes"] == 2 * MIB == layer0["in_use_at_exit_bytes"] - entry
    # the free at s + 10 applies before the allocation at s + 10: the peak is entry + 2 MiB, not + 3
    assert layer0["peak_inside_bytes"] == entry + 2 * MIB
    # the allocation at exactly the end counts in the next range's entry, and in step 0
    nxt = got.filter((pl.col("name") == "layer.1") & (pl.col("step") == 0)).row(0, named=True)
    assert nxt["in_use_at_entry_bytes"] == entry + 6 * MIB
    # attn starts 1830 ns after layer.0: all three events are before it
    attn = got.filter((pl.col("name") == "attn") & (pl.col("start_ns") > layer0["start_ns"])).sort("start_ns").row(0, named=True)
    assert attn["in_use_at_entry_bytes"] == entry + 2 * MIB and attn["n_allocs"] == 0
    # host memory only when asked for
    pinned = layer_memory(_open(boundary_copy).memory_usage, _open(boundary_copy).nvtx, ranges=r"^layer\.0$", kinds=["Pinned"])
    assert pinned.sort("start_ns")["allocated_bytes"].to_list() == [8 * MIB, 0]


def test_options() -> None:
    t = _open(TRAIN)
    no_steps = layer_memory(t.memory_usage, t.nvtx, ranges=r"^attn$", per_step=False)
    assert no_steps.height == 8 and no_steps["step"].null_count() == 8
    by_layer = layer_memory(t.memory_usage, t.nvtx, ranges=r"^attn$", per_step=r"^layer\.")
    assert by_layer["step"].to_list() == list(range(8))  # each attn sits in its own layer.N
    phases = layer_memory(t.memory_usage, t.nvtx, ranges=r"^(attn|optimizer)$", phases={"update": "optimizer"})
    assert set(phases.filter(pl.col("name") == "optimizer")["phase"]) == {"update"}
    assert set(phases.filter(pl.col("name") == "attn")["phase"]) == {"forward"}


def test_empty_inputs_say_why() -> None:
    t = _open(TRAIN)
    cases = [
        (dict(memory_usage=t.memory_usage.clear(), nvtx=t.nvtx), "no CUDA memory usage events"),
        (dict(memory_usage=t.memory_usage, nvtx=t.nvtx.clear()), "no closed NVTX"),
        (dict(memory_usage=t.memory_usage, nvtx=t.nvtx, ranges="^no such range$"), "no NVTX range label matches"),
        (dict(memory_usage=t.memory_usage, nvtx=t.nvtx, kinds=["Managed"]), "no memory events of kinds"),
        (dict(memory_usage=t.memory_usage.with_columns(pl.col("global_pid") + 1), nvtx=t.nvtx), "no process with NVTX ranges"),
    ]
    for kwargs, why in cases:
        with pytest.warns(EmptyResultWarning, match=why):
            out = layer_memory(**kwargs)  # type: ignore[arg-type]
        assert out.height == 0 and "net_growth_bytes" in out.columns
        assert layer_memory_summary(out).height == 0


def test_multi_rank_tables_give_each_rank_its_rows() -> None:
    files = [SAMPLES / "llm_tp2_nccl_per_rank" / f"llm_tp2_nccl_per_rank_rank{r}.sqlite" for r in (0, 1)]
    singles, mem_all, nvtx_all = [], [], []
    for rank, path in enumerate(files):
        t = _open(path)
        singles.append(layer_memory(t.memory_usage, t.nvtx))
        mem_all.append(t.memory_usage.with_columns(pl.lit(rank).alias("rank")))
        nvtx_all.append(t.nvtx.with_columns(pl.lit(rank).alias("rank")))
    both = layer_memory(pl.concat(mem_all), pl.concat(nvtx_all))
    for rank, single in enumerate(singles):
        assert single.height > 0
        assert both.filter(pl.col("rank") == rank).drop("rank").equals(single)
    summary = layer_memory_summary(both)
    assert set(summary["rank"]) == {0, 1}


def test_invalid_patterns_are_one_line() -> None:
    """A pattern that is not a regular expression was polars' multi-line ComputeError naming an
    internal expression (col("label").str.contains(...)); the widget's Memory tab showed it."""
    from tracekit.errors import TracekitError

    t = _open(TRAIN)
    for kwargs, option in ((dict(ranges="layer.(\\d"), "ranges='layer.(\\\\d'"), (dict(per_step="["), "per_step='['"),
                           (dict(phases={"update": "optim("}), "phases['update']='optim('")):
        with pytest.raises(TracekitError) as info:
            layer_memory(t.memory_usage, t.nvtx, **kwargs)  # type: ignore[arg-type]
        message = str(info.value)
        assert message.startswith(f"layer_memory: {option} is not a valid regular expression (")
        assert "\n" not in message
