"""PyTorch profiler (Kineto) traces opened as nsys-shaped tables (``tracekit.kineto``): every
table checked against the trace's own JSON (read here with the standard library, times summed
as exact decimals), the structure, the CLI's commands, a folder of ranks, and damaged input."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import tracekit
from tracekit.errors import TraceFormatError
from tracekit.kineto import KinetoTrace
from tracekit.opening import sniff

ROOT = Path(__file__).resolve().parents[1]
KINETO = ROOT / "sample_traces" / "kineto"
DDP = KINETO / "ddp_nccl_1rank" / "nccl_data.json.gz"
RANKS = KINETO / "sampled_2rank"
CPU_ONLY = next((KINETO / "cpu_only").glob("*.json.gz"))
GPU_TRACES = sorted(p for p in [*KINETO.glob("*/*.json.gz"), *KINETO.glob("public/*/*.json.gz")] if p.parent.name != "cpu_only")


@pytest.fixture(autouse=True, scope="module")
def _cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A cache folder of this module's own (conversions are written there, once per trace)."""
    root = tmp_path_factory.mktemp("kineto_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACEKIT_CACHE", str(root))
        yield root


def _events(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as fh:
        return json.load(fh)


def _ns(us: Any) -> int:
    """µs as JSON wrote them → exact ns (json gives floats: its repr is the shortest text
    that reads back the same, which for Kineto's three decimals is that text)."""
    return round(Decimal(repr(us)) * 1000) if isinstance(us, float) else int(us) * 1000


def _of(doc: dict[str, Any], *cats: str) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and str(e.get("cat", "")).lower() in cats]


@pytest.mark.parametrize("path", GPU_TRACES, ids=lambda p: p.parent.name + "/" + p.name[:20])
def test_tables_equal_the_json(path: Path) -> None:
    doc = _events(path)
    trace = tracekit.open(path)
    assert isinstance(trace, KinetoTrace) and sniff(path) == "kineto"
    for cats, table in ((("kernel",), trace.kernels), (("gpu_memcpy",), trace.memcpys), (("gpu_memset",), trace.memsets),
                        (("cuda_runtime", "cuda_driver"), trace.cuda_api), (("cuda_sync",), trace.syncs)):
        ev = _of(doc, *cats)
        assert table.height == len(ev), cats
        assert int(table["duration_ns"].sum()) == sum(_ns(e["dur"]) for e in ev), cats
        assert sorted(table["start_ns"].to_list()) == sorted(_ns(e["ts"]) for e in ev), cats
    kernels = _of(doc, "kernel")
    assert sorted(trace.kernels["name"].to_list()) == sorted(e["name"] for e in kernels)
    assert trace.kernels["pid"].null_count() == 0 and trace.kernels["device_id"].null_count() == 0
    api = _of(doc, "cuda_runtime", "cuda_driver")
    assert sorted(trace.cuda_api.filter(pl.col("api") == "driver")["name"].to_list()) == sorted(
        e["name"] for e in api if e["cat"] == "cuda_driver")
    # user annotations are NVTX push/pop ranges on their thread; aten ops are not
    notes = _of(doc, "user_annotation")
    assert trace.nvtx.height == len(notes)
    assert set(trace.nvtx["event_type_id"]) <= {59}  # nsys NvtxPushPopRange
    assert sorted(trace.nvtx["name"].to_list()) == sorted(e["name"] for e in notes)
    ops = _of(doc, "cpu_op")
    assert trace.cpu_ops.filter(pl.col("category") == "cpu_op").height == len(ops)
    assert not set(trace.nvtx["name"]) & {e["name"] for e in ops if not e["name"].startswith("ProfilerStep#")}


def test_kernel_launch_configuration() -> None:
    doc = _events(DDP)
    trace = tracekit.open(DDP)
    first = min(_of(doc, "kernel"), key=lambda e: Decimal(repr(e["ts"])))
    row = trace.kernels.filter(pl.col("correlation_id") == first["args"]["correlation"]).row(0, named=True)
    a = first["args"]
    assert (row["grid_x"], row["grid_y"], row["grid_z"]) == tuple(a["grid"])
    assert (row["block_x"], row["block_y"], row["block_z"]) == tuple(a["block"])
    assert row["registers_per_thread"] == a["registers per thread"]
    assert (row["device_id"], row["stream_id"], row["context_id"]) == (a["device"], a["stream"], a["context"])
    assert row["start_ns"] == _ns(first["ts"]) and row["duration_ns"] == _ns(first["dur"])
    assert row["short_name"] and row["short_name"] in row["name"]
    extra = trace.gpu_args.filter(pl.col("correlation_id") == a["correlation"]).row(0, named=True)
    assert extra["shared_memory_bytes"] == a["shared memory"]
    assert extra["est_achieved_occupancy_pct"] == a["est. achieved occupancy %"]
    # the launching call's thread and the CPU operator that issued it
    flow = trace.flows.filter(pl.col("correlation_id") == a["correlation"]).row(0, named=True)
    call = next(e for e in _of(doc, "cuda_runtime") if e["args"].get("correlation") == a["correlation"])
    assert flow["api_name"] == call["name"] and flow["tid"] == call["tid"]
    op = next(e for e in _of(doc, "cpu_op", "user_annotation") if e["args"].get("External id") == call["args"]["External id"])
    assert flow["op_name"] == op["name"]


def test_times_are_exact_nanoseconds_and_on_the_traces_clock() -> None:
    doc = _events(DDP)
    trace = tracekit.open(DDP)
    assert trace.base_time_ns == doc["baseTimeNanoseconds"] == trace.meta.session_epoch_ns
    raw = next(e for e in _of(doc, "kernel") if isinstance(e["ts"], float) and not e["ts"].is_integer())
    assert _ns(raw["ts"]) in set(trace.kernels["start_ns"].to_list())
    # older Kineto counted µs from the Unix epoch: the session epoch is then 0
    old = tracekit.open(RANKS / "sampled_rank-0.json.gz")
    assert old.meta.session_epoch_ns == 0 and old.kernels["start_ns"].min() > 10**18


def test_profiler_steps_are_the_iterations() -> None:
    doc = _events(DDP)
    steps = sorted((e for e in _of(doc, "user_annotation") if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
    s = tracekit.structure(tracekit.open(DDP))
    assert s.method == "nvtx" and s.kind == "training"
    assert s.iterations["name"].to_list() == [e["name"] for e in steps]
    assert s.iterations["start_ns"].to_list() == [_ns(e["ts"]) for e in steps]
    assert s.iterations["duration_ns"].to_list() == [_ns(e["dur"]) for e in steps]


def test_nccl_calls_carry_pytorchs_sizes() -> None:
    doc = _events(DDP)
    calls = tracekit.open(DDP).nccl
    kernels = [e for e in _of(doc, "kernel") if e["name"].startswith("ncclKernel_AllReduce")]
    assert calls.filter(pl.col("op") == "AllReduce").height == len(kernels) > 0
    want = {e["args"]["correlation"]: min(e["args"]["In msg nelems"], e["args"]["Out msg nelems"]) * 4 for e in kernels}
    got = calls.filter(pl.col("op") == "AllReduce").select("correlation_id", "bytes", "size_source", "comm_nranks")
    assert dict(zip(got["correlation_id"], got["bytes"], strict=True)) == want
    assert set(got["size_source"]) == {"kineto"} and set(got["comm_nranks"]) == {2}


def test_gpus_processes_threads_and_distributed_info() -> None:
    doc = _events(DDP)
    trace = tracekit.open(DDP)
    props = doc["deviceProperties"]
    assert trace.gpus["device_id"].to_list() == [p["id"] for p in props]
    row = trace.gpus.row(0, named=True)
    assert (row["name"], row["total_memory_bytes"], row["sm_count"], row["compute_capability"]) == (
        props[0]["name"], props[0]["totalGlobalMem"], props[0]["numSms"], f"{props[0]['computeMajor']}.{props[0]['computeMinor']}")
    assert trace.device_properties.height == len(props)
    info = trace.distributed_info.row(0, named=True)
    assert (info["rank"], info["world_size"], info["backend"]) == (0, 2, "nccl")
    main = trace.kernels["pid"].unique().to_list()
    assert main == [2910249] and 2910249 in trace.processes["pid"].to_list()
    assert trace.threads.height >= 2


def test_plain_json_opens_like_gzip(tmp_path: Path) -> None:
    plain = tmp_path / "triton.pt.trace.json"
    plain.write_bytes(gzip.decompress((KINETO / "triton_1kernel" / "triton_example.json.gz").read_bytes()))
    before = plain.stat().st_mtime_ns, plain.read_bytes()
    a = tracekit.open(plain)
    b = tracekit.open(KINETO / "triton_1kernel" / "triton_example.json.gz")
    assert a.kernels.drop("global_pid").equals(b.kernels.drop("global_pid"))
    assert (plain.stat().st_mtime_ns, plain.read_bytes()) == before  # opened read-only
    assert a.folder == tracekit.open(plain).folder  # converted once, then reused


def test_folder_of_ranks() -> None:
    ranks = tracekit.open_many(RANKS, max_workers=1)
    assert ranks.ranks["rank"].to_list() == [0, 1]
    assert set(ranks.ranks["rank_source"]) == {"env:RANK"}  # distributedInfo, given as RANK
    per_rank = ranks.kernels.group_by("rank").len().sort("rank")["len"].to_list()
    assert per_rank == [len(_of(_events(p), "kernel")) for p in sorted(RANKS.glob("*.json.gz"))]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "tracekit.cli.main", *args], capture_output=True, text=True, env=env,
                          check=False, timeout=300)


def test_stats_kernel_totals_equal_the_json() -> None:
    proc = _cli("stats", "-r", "cuda_gpu_kern_sum", "--format", "csv", str(DDP))
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines()[1:] if line]
    total = sum(int(line.split(",")[1]) for line in rows)
    assert total == sum(_ns(e["dur"]) for e in _of(_events(DDP), "kernel"))


@pytest.mark.slow
def test_summary_diagnose_and_report(tmp_path: Path) -> None:
    summary = _cli("summary", str(DDP))
    assert summary.returncode == 0, summary.stderr
    assert "training: 3 steady steps" in summary.stdout and "top kernels" in summary.stdout
    diagnose = _cli("diagnose", str(DDP))
    assert diagnose.returncode == 0, diagnose.stderr
    assert "training" in diagnose.stdout and "exposed_communication" in diagnose.stdout
    html = tmp_path / "r.html"
    report = _cli("report", str(DDP), "-o", str(html))
    assert report.returncode == 0, report.stderr
    assert html.stat().st_size > 10_000
    ranks = _cli("summary", str(RANKS))
    assert ranks.returncode == 0, ranks.stderr
    assert "ranks" in ranks.stdout and "2 (0–1)" in ranks.stdout


# -- bad input ---------------------------------------------------------------------------------
def _refused(path: Path, cache: Path, *words: str) -> None:
    before = sorted(p.name for p in (cache / "kineto").iterdir()) if (cache / "kineto").is_dir() else []
    with pytest.raises(TraceFormatError) as err:
        tracekit.open(path)
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg
    for w in words:
        assert w in msg, msg
    after = sorted(p.name for p in (cache / "kineto").iterdir()) if (cache / "kineto").is_dir() else []
    assert after == before  # nothing half-written left in the cache


def test_cut_gzip_is_refused(tmp_path: Path, _cache: Path) -> None:
    data = DDP.read_bytes()
    cut = tmp_path / "rank0.pt.trace.json.gz"
    cut.write_bytes(data[: len(data) // 2])
    _refused(cut, _cache, "cut-off gzip")


def test_truncated_json_is_refused(tmp_path: Path, _cache: Path) -> None:
    text = gzip.decompress(DDP.read_bytes())
    cut = tmp_path / "rank0.pt.trace.json"
    cut.write_bytes(text[: len(text) // 2])
    assert sniff(cut) == "kineto"
    _refused(cut, _cache, "truncated")


def test_other_chrome_trace_is_refused(tmp_path: Path, _cache: Path) -> None:
    other = tmp_path / "chrome.json"
    other.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "blink", "name": "Paint", "pid": 1, "tid": 1,
                                                   "ts": 10, "dur": 5}], "displayTimeUnit": "ms"}))
    _refused(other, _cache, "not a PyTorch profiler")


def test_empty_trace_events_is_refused(tmp_path: Path, _cache: Path) -> None:
    doc = _events(KINETO / "triton_1kernel" / "triton_example.json.gz")
    doc["traceEvents"] = []
    empty = tmp_path / "empty.pt.trace.json"
    empty.write_text(json.dumps(doc))
    _refused(empty, _cache, "empty traceEvents")


def test_cpu_only_trace_is_refused_in_one_line(_cache: Path) -> None:
    _refused(CPU_ONLY, _cache, "no GPU activity", "ProfilerActivity.CUDA")
    proc = _cli("summary", str(CPU_ONLY))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_not_json_is_not_kineto(tmp_path: Path) -> None:
    junk = tmp_path / "junk.json.gz"
    junk.write_bytes(gzip.compress(b"[1, 2, 3]"))
    with pytest.raises(TraceFormatError):
        tracekit.open(junk)


def test_a_large_trace_converts_in_a_child_to_the_same_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trace of CHILD_BYTES or more is converted in a child process (its decode's memory gone
    when it exits); the folder it writes holds the same tables as a conversion in this process."""
    from tracekit.kineto import convert as C

    text = tmp_path / "rank0.pt.trace.json"
    text.write_bytes(gzip.decompress(DDP.read_bytes()))
    assert text.stat().st_size >= C.CHILD_BYTES
    child, here = tmp_path / "child", tmp_path / "here"
    child.mkdir()
    here.mkdir()
    C.convert_isolated(text, child)
    monkeypatch.setenv("TRACEKIT_KINETO_IN_PROCESS", "1")
    C.convert_isolated(text, here)
    names = sorted(p.name for p in child.iterdir())
    assert names == sorted(p.name for p in here.iterdir()) and "CUPTI_ACTIVITY_KIND_KERNEL.parquet" in names
    for name in names:
        assert pl.read_parquet(child / name).equals(pl.read_parquet(here / name)), name
