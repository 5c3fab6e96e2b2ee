"""engine="dask": per-rank reductions as tasks on a real dask.distributed cluster.

The cluster is real: a ``LocalCluster`` of worker processes, or a ``dask scheduler`` and two
``dask worker`` processes started here on 127.0.0.1. Results must equal what the process-pool
engine's tables give through the same analyses, and a worker killed mid-run must not lose a
report (Dask reschedules its tasks).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit.analysis._frames import gpu_ops
from tracekit.analysis.attribution import launch_info
from tracekit.analysis.comm import activity_segments, categorize_ops, overlap_breakdown
from tracekit.analysis.run.iterations import iterations

from .conftest import SAMPLES

pytest.importorskip("distributed")

PER_RANK = SAMPLES / "llm_tp2_nccl_per_rank"
pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore:.*Port .* is already in use.*:UserWarning"),
]


def _sorted(frame: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    return frame.sort(keys).select(sorted(frame.columns))


def _same_as_process_pool(rs: object, ts: tracekit.multi.TraceSet) -> None:  # type: ignore[name-defined]
    ks = ts.kernels.group_by("rank", "pid", "device_id", "name").agg(
        pl.len().cast(pl.Int64).alias("kernels"), pl.col("duration_ns").sum().alias("total_ns")
    )
    ours = rs.kernel_summary.select("rank", "pid", "device_id", "name", "kernels", "total_ns")  # type: ignore[attr-defined]
    assert _sorted(ours, ["rank", "name"]).equals(_sorted(ks, ["rank", "name"]))
    nccl_cols = ["rank", "call_index", "op", "bytes", "host_start_ns", "gpu_start_ns", "gpu_duration_ns"]
    assert _sorted(rs.nccl.select(nccl_cols), ["rank", "call_index"]).equals(  # type: ignore[attr-defined]
        _sorted(ts.nccl.select(nccl_cols), ["rank", "call_index"])
    )
    ops = gpu_ops(ts.kernels, ts.memcpys, ts.memsets)
    its = iterations(launch_info(ops, ts.cuda_api), ts.nvtx)
    cols = ["rank", "iteration", "start_ns", "end_ns", "kernels", "gpu_busy_ns", "gpu_idle_ns"]
    assert _sorted(rs.iterations.select(cols), ["rank", "iteration"]).equals(_sorted(its.select(cols), ["rank", "iteration"]))  # type: ignore[attr-defined]
    ov = overlap_breakdown(activity_segments(categorize_ops(ts.kernels, ts.memcpys, ts.memsets)))
    cols = ["rank", "device_id", "span_ns", "compute_only_ns", "communication_only_ns", "overlap_ns", "idle_ns"]
    assert _sorted(rs.overlap.select(cols), ["rank"]).equals(_sorted(ov.select(cols), ["rank"]))  # type: ignore[attr-defined]


def test_local_cluster_equals_process_pool() -> None:
    ts = tracekit.open_many(PER_RANK, max_workers=1)
    rs = tracekit.open_many(PER_RANK, engine="dask", max_workers=2)
    assert type(rs).__name__ == "ReducedSet" and len(rs) == 2 and rs.failures == []
    assert rs.ranks["rank"].to_list() == ts.ranks["rank"].to_list()
    _same_as_process_pool(rs, ts)
    with pytest.raises(tracekit.TracekitError, match="raw rows"):
        _ = rs.kernels
    skew = rs.skew_by_rank()
    assert skew["collectives"].to_list() == [81, 81]
    d = tracekit.diagnose(rs)
    assert d.window.method == "per_rank" and "host_bound" in d.findings["category"].to_list()


def _start_cluster(tmp_path: Path) -> tuple[Path, subprocess.Popen[bytes], dict[str, subprocess.Popen[bytes]]]:
    dask = shutil.which("dask", path=str(Path(sys.executable).parent))
    if dask is None:
        pytest.skip("the dask command line is not installed")
    sched_file = tmp_path / "scheduler.json"
    sched = subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                              "--scheduler-file", str(sched_file)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers = {
        name: subprocess.Popen([dask, "worker", "--scheduler-file", str(sched_file), "--name", name, "--nthreads", "1",
                                "--nworkers", "1", "--no-dashboard", "--host", "127.0.0.1"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for name in ("w1", "w2")
    }
    deadline = time.monotonic() + 60
    while not sched_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return sched_file, sched, workers


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()


def _copies(tmp_path: Path, n: int) -> Path:
    """``n`` ranks of one job: copies of the two per-rank exports made into rank ``i`` of an
    ``n``-rank job on node ``i // 2`` (host name, RANK and WORLD_SIZE changed; plain copies
    are not one run and are refused)."""
    from tests.conftest import mutated_copy

    folder = tmp_path / "ranks"
    folder.mkdir()
    for i in range(n):
        src = PER_RANK / f"llm_tp2_nccl_per_rank_rank{i % 2}.sqlite"
        mutated_copy(src, folder / f"job_rank{i}.sqlite",
                     f"UPDATE TARGET_INFO_SYSTEM_ENV SET value = 'node{i // 2}' WHERE name = 'Hostname'",
                     f"UPDATE META_DATA_CAPTURE SET value = 'RANK=\"{i}\"' WHERE value LIKE 'RANK=%'",
                     f"UPDATE META_DATA_CAPTURE SET value = 'WORLD_SIZE=\"{n}\"' WHERE value LIKE 'WORLD_SIZE=%'")
    return folder


def test_scheduler_and_two_workers(tmp_path: Path) -> None:
    from distributed import Client

    sched_file, sched, workers = _start_cluster(tmp_path)
    try:
        with Client(scheduler_file=str(sched_file), timeout=60) as client:
            client.wait_for_workers(2, timeout=60)
            rs = tracekit.open_many(PER_RANK, engine="dask", client=client)
            ts = tracekit.open_many(PER_RANK, max_workers=1)
            _same_as_process_pool(rs, ts)
            address = client.scheduler.address
        by_address = tracekit.open_many(PER_RANK, engine="dask", client=address)  # a scheduler address works too
        assert by_address.kernel_summary.height == rs.kernel_summary.height
    finally:
        _stop([*workers.values(), sched])


def test_worker_killed_mid_run_loses_nothing(tmp_path: Path) -> None:
    """Kill one of two workers while it holds tasks: Dask reschedules them on the other and
    every report comes back (24 reports, ranks from their environments)."""
    from distributed import Client

    folder = _copies(tmp_path, 24)
    sched_file, sched, workers = _start_cluster(tmp_path)
    try:
        with Client(scheduler_file=str(sched_file), timeout=60) as client:
            client.wait_for_workers(2, timeout=60)
            result: dict[str, object] = {}
            run = threading.Thread(target=lambda: result.update(rs=tracekit.open_many(folder, engine="dask", client=client)))
            run.start()
            victim = None
            deadline = time.monotonic() + 120
            while victim is None and time.monotonic() < deadline and run.is_alive():
                info = client.scheduler_info()["workers"]
                processing = client.processing()
                for addr, w in info.items():
                    if w.get("name") == "w1" and processing.get(addr):
                        victim = workers["w1"]
                time.sleep(0.05)
            assert victim is not None, "worker w1 never held a task"
            victim.send_signal(signal.SIGKILL)
            run.join(timeout=300)
            rs = result["rs"]
            assert len(rs) == 24 and rs.failures == []  # type: ignore[arg-type, attr-defined]
            assert sorted(rs.ranks["rank"].to_list()) == list(range(24))  # type: ignore[attr-defined]
            assert victim.poll() is not None
    finally:
        _stop([*workers.values(), sched])


def test_torch_profiler_ranks_on_dask() -> None:
    """A folder of torch.profiler traces (two ranks of a 128-rank job, HTA's test data) reduced
    on a LocalCluster: the same ranks and kernel totals as the in-process set, and a diagnosis
    whose cross-rank straggler rule runs on the reductions (start skew; the waiting GPUs' raw
    rows stay on the workers)."""
    folder = SAMPLES / "kineto" / "sampled_2rank"
    ts = tracekit.open_many(folder, max_workers=1)
    rs = tracekit.open_many(folder, engine="dask", max_workers=2)
    assert rs.failures == [] and rs.ranks["rank"].to_list() == ts.ranks["rank"].to_list() == [0, 1]
    want = ts.kernels.group_by("rank").agg(pl.col("duration_ns").sum()).sort("rank")["duration_ns"].to_list()
    got = rs.kernel_summary.group_by("rank").agg(pl.col("total_ns").sum()).sort("rank")["total_ns"].to_list()
    assert got == want
    d = tracekit.diagnose(rs)
    cats = d.findings["category"].to_list()
    assert d.window.method == "per_rank" and "straggler" in cats
    assert d.findings.filter(pl.col("category") == "straggler")["title"][0].startswith("Rank 1 starts last")
