"""tracekit.export: Perfetto protobuf and Chrome JSON timelines, read back with the protobuf
classes the ``perfetto`` package ships and compared with the loader's tables, on the samples
(1 GPU, 2 GPUs one report per rank, the NCCL one)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit.cli.main import main
from tracekit.errors import MissingDependencyError, TracekitError
from tracekit.export import build_model, chrome_json, parse_window, perfetto

pytest.importorskip("perfetto")
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TracePacket, TrackEvent  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DECODE = ROOT / "sample_traces/llm_decode_1gpu/llm_decode_1gpu.sqlite"
NCCL = ROOT / "sample_traces/llm_tp2_nccl/llm_tp2_nccl.sqlite"
PER_RANK = ROOT / "sample_traces/llm_tp2_nccl_per_rank"
TRAIN = ROOT / "sample_traces/llm_train_emit_nvtx_1gpu/llm_train_emit_nvtx_1gpu.sqlite"


# -- reading a file back with perfetto's protobuf classes --------------------------------------------------
@dataclass
class Slice:
    track: int
    start: int
    end: int
    name: str
    cat: str
    args: dict[str, object]
    flows: list[int]
    terminating: list[int]


@dataclass
class ReadBack:
    tracks: dict[int, object] = field(default_factory=dict)
    slices: list[Slice] = field(default_factory=list)
    instants: list[tuple[int, int, str]] = field(default_factory=list)
    counters: dict[int, list[tuple[int, float]]] = field(default_factory=lambda: defaultdict(list))

    def track_name(self, uuid: int) -> str:
        d = self.tracks[uuid]
        if d.HasField("process"):
            return d.process.process_name
        return d.name

    def by_cat(self, cat: str) -> list[Slice]:
        return [s for s in self.slices if s.cat == cat]


def read_back(path: Path) -> ReadBack:
    """Parse the file as one ``Trace`` message and rebuild slices from BEGIN/END pairs: an END
    closes the innermost open slice of its track (a stack), so a file that does not nest, or
    that names an iid it never interned, fails here."""
    trace = Trace()
    trace.ParseFromString(path.read_bytes())
    out = ReadBack()
    names: dict[int, str] = {}
    cats: dict[int, str] = {}
    arg_names: dict[int, str] = {}
    arg_strings: dict[int, str] = {}
    open_: dict[int, list[Slice]] = defaultdict(list)
    # one sequence whose incremental state (the interned strings) is cleared by its first packet
    assert trace.packet[0].sequence_flags & TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    assert {p.trusted_packet_sequence_id for p in trace.packet} == {7}
    for p in trace.packet:
        if p.HasField("track_event") and p.track_event.name_iid:
            assert p.sequence_flags & TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
        if p.HasField("interned_data"):
            d = p.interned_data
            names.update({e.iid: e.name for e in d.event_names})
            cats.update({e.iid: e.name for e in d.event_categories})
            arg_names.update({e.iid: e.name for e in d.debug_annotation_names})
            arg_strings.update({e.iid: e.str.decode() for e in d.debug_annotation_string_values})
        if p.HasField("track_descriptor"):
            out.tracks[p.track_descriptor.uuid] = p.track_descriptor
        if not p.HasField("track_event"):
            continue
        te = p.track_event
        if te.type == TrackEvent.TYPE_SLICE_BEGIN:
            args = {}
            for a in te.debug_annotations:
                args[arg_names[a.name_iid]] = arg_strings[a.string_value_iid] if a.HasField("string_value_iid") else a.int_value
            s = Slice(te.track_uuid, p.timestamp, -1, names[te.name_iid], cats[te.category_iids[0]], args,
                      list(te.flow_ids), list(te.terminating_flow_ids))
            open_[te.track_uuid].append(s)
        elif te.type == TrackEvent.TYPE_SLICE_END:
            s = open_[te.track_uuid].pop()
            assert p.timestamp >= s.start
            s.end = p.timestamp
            out.slices.append(s)
        elif te.type == TrackEvent.TYPE_INSTANT:
            out.instants.append((te.track_uuid, p.timestamp, names[te.name_iid]))
        elif te.type == TrackEvent.TYPE_COUNTER:
            value = te.double_counter_value if te.HasField("double_counter_value") else te.counter_value
            out.counters[te.track_uuid].append((p.timestamp, value))
    assert all(not v for v in open_.values()), "slices left open"
    for s in out.slices:
        assert s.track in out.tracks
    assert all(out.tracks[u].HasField("counter") for u in out.counters), "counter events on a track that is not a counter"
    for d in out.tracks.values():  # parents exist; a thread belongs to its parent process
        if d.HasField("parent_uuid"):
            parent = out.tracks[d.parent_uuid]
            if d.HasField("thread"):
                assert parent.HasField("process") and parent.process.pid == d.thread.pid
    pids = [d.process.pid for d in out.tracks.values() if d.HasField("process")]
    assert len(pids) == len(set(pids))
    return out


def _nested(slices: list[Slice]) -> bool:
    """Within each track, any two slices are disjoint or one holds the other."""
    by: dict[int, list[Slice]] = defaultdict(list)
    for s in slices:
        by[s.track].append(s)
    for items in by.values():
        items.sort(key=lambda s: (s.start, -s.end))
        stack: list[int] = []
        for s in items:
            while stack and stack[-1] <= s.start:
                stack.pop()
            if stack and s.end > stack[-1]:
                return False
            stack.append(s.end)
    return True


# -- fixtures ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def decode() -> object:
    return tracekit.open(DECODE)


@pytest.fixture(scope="module")
def nccl_trace() -> object:
    return tracekit.open(NCCL)


@pytest.fixture(scope="module")
def per_rank() -> object:
    return tracekit.open_many(PER_RANK)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, decode: object, nccl_trace: object, per_rank: object) -> dict:
    out = {}
    folder = tmp_path_factory.mktemp("export")
    for key, trace in (("decode", decode), ("nccl", nccl_trace), ("per_rank", per_rank)):
        path = folder / f"{key}.pftrace"
        summary = perfetto(trace, path)
        out[key] = (trace, path, summary, read_back(path))
    return out


def _with_report(frame: pl.DataFrame) -> pl.DataFrame:
    return frame if "report" in frame.columns else frame.with_columns(pl.lit(0, pl.Int64).alias("report"))


def _stream_tracks(rb: ReadBack) -> dict[int, str]:
    return {u: d.name for u, d in rb.tracks.items() if d.name.startswith("GPU ") and "· stream" in d.name}


SAMPLES = ("decode", "nccl", "per_rank")


# -- counts against the loader's tables -------------------------------------------------------------------
@pytest.mark.parametrize("key", SAMPLES)
def test_slice_counts_equal_table_rows(exported: dict, key: str) -> None:
    trace, _, summary, rb = exported[key]
    got = Counter(s.cat for s in rb.slices)
    assert got["kernel"] == trace.kernels.height > 0
    assert got["memcpy"] == trace.memcpys.height
    assert got["memset"] == trace.memsets.height
    assert got["cuda_api"] == trace.cuda_api.height
    closed_push_pop = trace.nvtx.filter((pl.col("event_type") == "PushPop") & pl.col("end_ns").is_not_null()).height
    assert got["nvtx"] == closed_push_pop
    assert got["nccl"] == trace.nccl.filter(pl.col("host_start_ns").is_not_null()).height
    assert summary.slices == {c: got[c] for c in summary.slices}


@pytest.mark.parametrize("key", SAMPLES)
def test_slices_per_stream_track_equal_kernels_per_stream(exported: dict, key: str) -> None:
    trace, _, _, rb = exported[key]
    per_track: dict[int, Counter] = defaultdict(Counter)
    for s in rb.slices:
        per_track[s.track][s.cat] += 1
    k = _with_report(trace.kernels).group_by("report", "pid", "device_id", "stream_id").len()
    tracks = _stream_tracks(rb)
    # a stream track is named "GPU d · stream s" under its process (pid in the process track)
    expected = Counter()
    for _report, pid, dev, stream, n in k.iter_rows():
        expected[(pid, f"GPU {dev} · stream {stream}")] += n
    got = Counter()
    for uuid, name in tracks.items():
        parent = rb.tracks[rb.tracks[uuid].parent_uuid]
        pid = parent.process.pid % 10_000_000
        got[(pid, name)] += per_track[uuid]["kernel"]
    assert got == expected
    # and nothing but GPU operations on stream tracks
    assert {c for u in tracks for c in per_track[u]} <= {"kernel", "memcpy", "memset"}


@pytest.mark.parametrize("key", SAMPLES)
def test_flows_equal_launches_with_a_gpu_operation(exported: dict, key: str) -> None:
    trace, _, summary, rb = exported[key]
    ops = pl.concat([_with_report(f).select("report", "pid", "correlation_id") for f in (trace.kernels, trace.memcpys, trace.memsets)])
    api = _with_report(trace.cuda_api).select("report", "pid", "correlation_id")
    launches = api.join(ops.unique(), on=["report", "pid", "correlation_id"], how="semi").unique().height
    starts = [f for s in rb.slices for f in s.flows]
    ends = [f for s in rb.slices for f in s.terminating]
    assert len(starts) == len(set(starts)) == launches == summary.flows > 0
    assert set(starts) == set(ends) and len(ends) == len(starts)
    src = {f: s for s in rb.slices for f in s.flows}
    dst = {f: s for s in rb.slices for f in s.terminating}
    for fid, s in src.items():
        d = dst[fid]
        assert s.cat == "cuda_api" and d.cat in ("kernel", "memcpy", "memset")
        assert s.args["correlation_id"] == d.args["correlation_id"]
        assert s.start <= d.start  # a launch precedes its work


def test_kernel_values_match_the_table(exported: dict) -> None:
    trace, _, _, rb = exported["decode"]
    k = trace.kernels.sort("start_ns")
    got = {(s.start, s.end): s for s in rb.by_cat("kernel")}
    for row in k.head(5).vstack(k.tail(5)).iter_rows(named=True):
        s = got[(row["start_ns"], row["end_ns"])]
        assert s.name == row["name"]
        assert s.args["grid"] == f"({row['grid_x']},{row['grid_y']},{row['grid_z']})"
        assert s.args["block"] == f"({row['block_x']},{row['block_y']},{row['block_z']})"
        assert s.args["correlation_id"] == row["correlation_id"]
        assert s.args["registers_per_thread"] == row["registers_per_thread"]
        assert s.args["family"] == tracekit.taxonomy.kernel_family(row["name"])
        assert _stream_tracks(rb)[s.track] == f"GPU {row['device_id']} · stream {row['stream_id']}"


def test_memcpy_bytes_and_kinds(exported: dict) -> None:
    trace, _, _, rb = exported["nccl"]
    got = sorted((s.start, s.args["bytes"], s.args["copy_kind"]) for s in rb.by_cat("memcpy"))
    want = sorted(trace.memcpys.select("start_ns", "bytes", "copy_kind").iter_rows())
    assert got == want
    assert all(s.name == f"Memcpy {s.args['copy_kind']}" for s in rb.by_cat("memcpy"))


def test_cuda_api_calls_sit_on_their_thread(exported: dict) -> None:
    trace, _, _, rb = exported["nccl"]
    per_thread = Counter()
    for s in rb.by_cat("cuda_api"):
        d = rb.tracks[s.track]
        assert d.HasField("thread")
        per_thread[(d.thread.pid, d.thread.tid)] += 1
    want = Counter({(p, t): n for p, t, n in trace.cuda_api.group_by("pid", "tid").len().iter_rows()})
    assert per_thread == want
    names = {s.name for s in rb.by_cat("cuda_api")}
    assert "cudaLaunchKernel" in names and not any(n.endswith("_v7000") for n in names)


@pytest.mark.parametrize("key", SAMPLES)
def test_thread_tracks_nest(exported: dict, key: str) -> None:
    _, _, _, rb = exported[key]
    assert _nested(rb.slices)
    # NVTX push/pop ranges hold the CUDA calls made inside them on the same thread
    thread = [s for s in rb.slices if rb.tracks[s.track].HasField("thread")]
    assert {s.cat for s in thread} == {"cuda_api", "nvtx"}


def test_one_process_per_rank_in_a_trace_set(exported: dict) -> None:
    trace, _, _, rb = exported["per_rank"]
    procs = [d for d in rb.tracks.values() if d.HasField("process")]
    assert len(procs) == trace.ranks.height == 2
    assert sorted(p.process.process_name.split(" · ")[0] for p in procs) == ["rank 0", "rank 1"]
    assert len({p.process.pid for p in procs}) == 2


def test_ranks_of_a_single_report_come_from_its_nccl_calls(exported: dict) -> None:
    trace, _, _, rb = exported["nccl"]
    labels = {d.process.pid: d.process.process_name for d in rb.tracks.values() if d.HasField("process")}
    want = dict(trace.nccl.select("pid", "rank").unique().iter_rows())
    assert {pid: int(name.split(" · ")[0].removeprefix("rank ")) for pid, name in labels.items()} == want


@pytest.mark.parametrize("key", ("nccl", "per_rank"))
def test_nccl_calls_with_op_bytes_and_peer(exported: dict, key: str) -> None:
    trace, _, _, rb = exported[key]
    got = sorted((s.start, s.end, s.args["op"], s.args.get("bytes"), s.args.get("peer")) for s in rb.by_cat("nccl"))
    want = sorted(trace.nccl.filter(pl.col("host_start_ns").is_not_null()).select(
        "host_start_ns", "host_end_ns", "op", "bytes", "peer").iter_rows())
    assert got == want and len(got) > 0
    assert all(rb.track_name(s.track).startswith("NCCL calls") for s in rb.by_cat("nccl"))


def test_gpu_metric_counters(exported: dict) -> None:
    trace, _, summary, rb = exported["nccl"]
    gm = trace.gpu_metrics.filter(pl.col("metric").is_in(["sms_active", "tensor_active", "dram_read_bandwidth",
                                                           "dram_write_bandwidth"]) & (pl.col("timestamp_ns") >= 0))
    by_label = {}
    for uuid, d in rb.tracks.items():
        if d.HasField("counter") and d.name.endswith("%]"):
            gpu = rb.tracks[d.parent_uuid].name
            by_label[(gpu, d.name)] = rb.counters[uuid]
    want = gm.group_by("device_id", "metric_label").agg(pl.col("timestamp_ns"), pl.col("value"))
    assert len(by_label) == want.height == 8
    for dev, label, ts, vals in want.iter_rows():
        samples = by_label[(f"GPU {dev}", label)]
        assert sorted(samples) == sorted(zip(ts, map(float, vals), strict=True))
    memory_tracks = [u for u, d in rb.tracks.items() if d.name.endswith("memory in use")]
    assert summary.counter_samples == sum(len(v) for v in rb.counters.values())
    assert gm.height + sum(len(rb.counters[u]) for u in memory_tracks) == summary.counter_samples


def test_memory_counter_matches_the_memory_timeline(exported: dict) -> None:
    from tracekit.analysis.memory import memory_timeline

    trace, _, _, rb = exported["decode"]
    tl = memory_timeline(trace.memory_usage)
    tracks = [u for u, d in rb.tracks.items() if d.name == "GPU 0 memory in use"]
    assert len(tracks) == 1
    d = rb.tracks[tracks[0]]
    assert d.counter.unit == d.counter.UNIT_SIZE_BYTES
    samples = rb.counters[tracks[0]]
    last = tl.group_by("start_ns", maintain_order=True).agg(pl.col("in_use_bytes").last())
    assert samples == list(zip(last["start_ns"].to_list(), last["in_use_bytes"].to_list(), strict=True))
    assert max(v for _, v in samples) == tl["in_use_bytes"].max()


def test_nvtx_ranges_of_an_emit_nvtx_trace(tmp_path: Path) -> None:
    trace = tracekit.open(TRAIN)
    path = tmp_path / "train.pftrace"
    perfetto(trace, path)
    rb = read_back(path)
    nv = trace.nvtx.filter((pl.col("event_type") == "PushPop") & pl.col("end_ns").is_not_null())
    got = Counter(s.name for s in rb.by_cat("nvtx"))
    assert got == Counter(nv["name"].fill_null("(unnamed)").to_list())
    assert len(rb.by_cat("memset")) == trace.memsets.height == 16
    assert _nested(rb.slices)


# -- window and ranks -------------------------------------------------------------------------------------
def test_given_window_keeps_overlapping_slices(tmp_path: Path, decode: object) -> None:
    k = decode.kernels.sort("start_ns")
    lo, hi = int(k["start_ns"][100]), int(k["start_ns"][200])
    path = tmp_path / "w.pftrace"
    s = perfetto(decode, path, window=(lo, hi))
    rb = read_back(path)
    want = k.filter((pl.col("start_ns") < hi) & ((pl.col("end_ns") > lo) | (pl.col("start_ns") >= lo))).height
    assert len(rb.by_cat("kernel")) == want == s.slices["kernel"]
    assert all(x.start < hi and (x.end > lo or x.start >= lo) for x in rb.slices)
    assert all(lo <= ts < hi for samples in rb.counters.values() for ts, _ in samples)
    assert s.window == (lo, hi) and s.window_source == "given"
    # each flow still has both ends
    assert {f for x in rb.slices for f in x.flows} == {f for x in rb.slices for f in x.terminating}


def test_steady_window_is_the_diagnosis_window(tmp_path: Path, decode: object) -> None:
    d = tracekit.diagnose(decode)
    s = perfetto(decode, tmp_path / "s.pftrace", window="steady")
    assert s.window == (d.window.start_ns, d.window.end_ns)
    assert s.window_source.startswith("steady state (nvtx)")


@pytest.mark.parametrize("path", sorted((ROOT / "sample_traces").rglob("*.sqlite")), ids=lambda p: p.stem)
def test_steady_bounds_are_the_diagnosis_window_of_every_sample(path: Path) -> None:
    """steady_bounds searches as diagnose does (launch columns for the measured steps only)."""
    from tracekit.export.events import steady_bounds

    d = tracekit.diagnose(tracekit.open(path))
    lo, hi, why = steady_bounds(tracekit.open(path))
    a = d.window.analysed()
    assert (lo, hi) == (a.start_ns, a.end_ns)
    assert d.window.method in why
    assert ("diagnose analyses" in why) == d.window.sampled


def test_steady_bounds_of_a_sampled_window_are_the_analysed_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a big trace (sampling forced here on the decode sample's 26 steps) --window steady is
    the sample diagnose's rules read, and says where the whole window is."""
    import functools

    from tracekit.diagnosis import config
    from tracekit.export.events import parse_window, steady_bounds

    small = functools.partial(config.DiagnoseConfig, exact_steps=8, sample_steps=4, max_window_ops=50)
    path = ROOT / "sample_traces" / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
    d = tracekit.diagnose(tracekit.open(path), config=small())
    monkeypatch.setattr(config, "DiagnoseConfig", small)
    assert d.window.sampled and d.window.sample_steps == 4
    lo, hi, why = steady_bounds(tracekit.open(path))
    assert (lo, hi) == (d.window.sample_start_ns, d.window.sample_end_ns)
    assert d.window.start_ns <= lo < hi <= d.window.end_ns and hi - lo < d.window.duration_ns
    whole = why.rsplit("--window ", 1)[1].rstrip(")")
    w_lo, w_hi = parse_window(whole)  # type: ignore[misc]
    assert (w_lo, w_hi) == (d.window.start_ns, d.window.end_ns)


def test_ranks_filter_a_trace_set(tmp_path: Path, per_rank: object) -> None:
    path = tmp_path / "r1.pftrace"
    s = perfetto(per_rank, path, ranks=[1])
    rb = read_back(path)
    procs = [d.process.process_name for d in rb.tracks.values() if d.HasField("process")]
    assert len(procs) == 1 and procs[0].startswith("rank 1 ·")
    assert s.slices["kernel"] == per_rank.kernels.filter(pl.col("rank") == 1).height
    assert s.slices["nccl"] == per_rank.nccl.filter(pl.col("rank") == 1).height


def test_ranks_errors_are_one_line(per_rank: object, decode: object, tmp_path: Path) -> None:
    with pytest.raises(TracekitError, match=r"rank\(s\) 5 not in this trace; it has rank\(s\) 0, 1"):
        build_model(per_rank, ranks=[5])
    with pytest.raises(TracekitError, match="no rank information"):
        build_model(decode, ranks=[0])


@pytest.mark.parametrize(("text", "want"), [
    ("100:200", (100, 200)), ("1.5s:2s", (1_500_000_000, 2_000_000_000)), ("300ms:", (300_000_000, 2**62)),
    (":20us", (0, 20_000)), ("steady", "steady"), (" Steady ", "steady"),
])
def test_parse_window(text: str, want: object) -> None:
    assert parse_window(text) == want


@pytest.mark.parametrize("text", ["100", "a:b", "200:100", "1h:2h"])
def test_parse_window_errors(text: str) -> None:
    with pytest.raises(TracekitError, match="window"):
        parse_window(text)


# -- streaming, files -------------------------------------------------------------------------------------
def test_small_chunks_write_the_same_events(tmp_path: Path, exported: dict) -> None:
    trace, path, _, rb = exported["nccl"]
    small = tmp_path / "small.pftrace"
    perfetto(trace, small, chunk_rows=7)
    rb2 = read_back(small)
    key = lambda s: (s.track, s.start, s.end, s.name, s.cat, tuple(sorted(s.args.items())), tuple(s.flows), tuple(s.terminating))  # noqa: E731
    assert sorted(map(key, rb2.slices)) == sorted(map(key, rb.slices))
    assert dict(rb2.counters) == dict(rb.counters)


def _decoded(path: Path) -> tuple[object, ...]:
    """The events a file decodes to, order aside: slices (with arguments and flows), instants,
    counter samples and track descriptors."""
    rb = read_back(path)
    key = lambda s: (s.track, s.start, s.end, s.name, s.cat, tuple(sorted(s.args.items())), tuple(s.flows), tuple(s.terminating))  # noqa: E731
    return (sorted(map(key, rb.slices)), sorted(rb.instants), {k: sorted(v) for k, v in rb.counters.items()},
            {u: d.SerializeToString() for u, d in rb.tracks.items()})


def _json_events(path: Path) -> list[str]:
    return sorted(json.dumps(e, sort_keys=True) for e in json.loads(path.read_text())["traceEvents"])


@pytest.mark.parametrize("key", SAMPLES)
def test_time_slices_write_the_same_events(tmp_path: Path, exported: dict, key: str) -> None:
    """Built and written in time slices of 50 rows per table (dozens of them, with NVTX ranges
    and API calls open across their boundaries), the timeline decodes to the same events as in
    one time slice, in both formats, with the same counts."""
    from tracekit.export.events import stream_model

    trace, path, summary, _ = exported[key]
    n_slices = sum(1 for kind, _ in stream_model(trace, slice_rows=50).events if kind == "slices")
    assert n_slices > 20
    one, small = tmp_path / "one.pftrace", tmp_path / "small.pftrace"
    s1 = perfetto(trace, one, slice_rows=10**9)
    s2 = perfetto(trace, small, slice_rows=50, chunk_rows=7)
    assert _decoded(small) == _decoded(one) == _decoded(path)
    assert _nested(read_back(small).slices)
    for s in (s1, s2):
        assert (s.slices, s.flows, s.instants, s.counter_samples, s.tracks) == (
            summary.slices, summary.flows, summary.instants, summary.counter_samples, summary.tracks)
    j1, j2 = tmp_path / "one.json", tmp_path / "small.json"
    chrome_json(trace, j1, slice_rows=10**9)
    chrome_json(trace, j2, slice_rows=50, chunk_rows=11)
    assert _json_events(j1) == _json_events(j2)


@pytest.mark.parametrize("key", SAMPLES)
def test_packed_flow_keys_match_the_joins(exported: dict, key: str) -> None:
    """Flow ids from sorted packed (report, pid, correlation id) keys equal the ids the joins of
    the key columns give (the way taken when keys do not pack), on every row."""
    from tracekit.export import events as E

    trace = exported[key][0]
    ops = [E._keep_rows(E._Columns(trace, name, cols), None, None)[0] for name, cols in (
        ("kernels", E._KERNEL_COLS), ("memcpys", E._MEMCPY_COLS), ("memsets", E._MEMSET_COLS))]
    api = E._keep_rows(E._Columns(trace, "cuda_api", E._API_COLS), None, None, timed_only=True)[0]
    (packed_ops, packed_api), (joined_ops, joined_api) = E._flows(ops, api), E._flows_joined(ops, api)
    assert all(a.equals(b) for a, b in zip(packed_ops, joined_ops, strict=True)) and packed_api.equals(joined_api)
    assert packed_api.drop_nulls().len() == packed_ops[0].drop_nulls().len() + packed_ops[1].drop_nulls().len() + (
        packed_ops[2].drop_nulls().len()) > 0


def test_one_export_is_read_a_column_at_a_time(tmp_path: Path) -> None:
    """Exporting an export opened afresh builds none of its large tables (they are read a
    column at a time and only the window's rows kept)."""
    trace = tracekit.open(DECODE)
    perfetto(trace, tmp_path / "w.pftrace", window=(100_000_000, 200_000_000))
    assert not any(trace.is_loaded(name) for name in ("kernels", "memcpys", "memsets", "cuda_api"))


def test_written_atomically(tmp_path: Path, decode: object) -> None:
    path = tmp_path / "out.pftrace"
    path.write_bytes(b"old")
    perfetto(decode, path, window=(0, 50_000_000))
    assert path.read_bytes() != b"old" and read_back(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.pftrace"]
    with pytest.raises(TracekitError):
        perfetto(decode, tmp_path / "bad.pftrace", window="oops")
    assert not (tmp_path / "bad.pftrace").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.pftrace"]


def test_empty_window_is_a_valid_empty_timeline(tmp_path: Path, decode: object) -> None:
    path = tmp_path / "empty.pftrace"
    s = perfetto(decode, path, window=(1, 2))
    rb = read_back(path)
    assert rb.slices == [] and sum(s.slices.values()) == 0 and s.flows == 0
    k = decode.kernels
    assert s.notes == [f"no slice overlaps the window 1:2 ns (times since the session start); its kernels run from "
                       f"{k['start_ns'].min()} to {k['end_ns'].max()} ns"]


def test_partly_overlapping_slices_go_to_an_overlap_track(tmp_path: Path) -> None:
    """A damaged copy of a real export: one kernel made to end inside the next one on its stream."""
    copy = tmp_path / "damaged.sqlite"
    shutil.copy(DECODE, copy)
    with sqlite3.connect(copy) as db:
        rows = db.execute("SELECT rowid, start, end, streamId FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start").fetchall()
        a = next(r for i, r in enumerate(rows[:-1]) if rows[i + 1][3] == r[3])
        b = next(r for r in rows if r[1] > a[1] and r[3] == a[3])
        db.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = ? WHERE rowid = ?", (b[1] + (b[2] - b[1]) // 2, a[0]))
    trace = tracekit.open(copy, column_cache=False)
    decoded = []
    for slice_rows in (10**9, 5):  # one time slice; the crossing kernel on the next time slice
        path = tmp_path / f"d{slice_rows}.pftrace"
        s = perfetto(trace, path, slice_rows=slice_rows)
        rb = read_back(path)
        overlap = [u for u, d in rb.tracks.items() if d.name.endswith("(overlap 1)")]
        assert len(overlap) == 1
        assert [x.cat for x in rb.slices if x.track == overlap[0]] == ["kernel"]
        assert s.slices["kernel"] == trace.kernels.height
        assert _nested(rb.slices)
        decoded.append(_decoded(path))
    assert decoded[0] == decoded[1]


def test_missing_package_says_which_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, decode: object) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "perfetto.trace_builder.proto_builder", None)
    with pytest.raises(MissingDependencyError, match=r"tracekit\[export\]"):
        perfetto(decode, tmp_path / "x.pftrace")


# -- Chrome JSON ------------------------------------------------------------------------------------------
def test_chrome_json_has_the_same_timeline(tmp_path: Path, exported: dict) -> None:
    trace, _, summary, rb = exported["per_rank"]
    path = tmp_path / "t.json"
    s = chrome_json(trace, path)
    doc = json.loads(path.read_text())
    ev = doc["traceEvents"]
    x = Counter(e["cat"] for e in ev if e["ph"] == "X")
    assert dict(x) == {c: n for c, n in summary.slices.items() if n}
    assert sum(e["ph"] == "s" for e in ev) == sum(e["ph"] == "f" for e in ev) == summary.flows == s.flows
    assert sum(e["ph"] == "C" for e in ev) == summary.counter_samples
    procs = sorted(e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name")
    assert [p.split(" · ")[0] for p in procs] == ["rank 0", "rank 1"]
    k = trace.kernels.sort("start_ns").row(0, named=True)
    first = min((e for e in ev if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    assert first["name"] == k["name"]
    assert round(first["ts"] * 1000) == k["start_ns"] and round(first["dur"] * 1000) == k["duration_ns"]
    assert first["args"]["grid"] == f"({k['grid_x']},{k['grid_y']},{k['grid_z']})"


# -- CLI --------------------------------------------------------------------------------------------------
def test_cli_export_perfetto(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.pftrace"
    assert main(["export", "perfetto", str(DECODE), "-o", str(out), "--window", "steady"]) == 0
    printed = capsys.readouterr().out
    assert "perfetto" in printed and "steady state" in printed
    rb = read_back(out)
    assert rb.by_cat("kernel")


def test_cli_chrome_json_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.json"
    assert main(["export", "perfetto", str(NCCL), "-f", "chrome-json", "-o", str(out), "--ranks", "1"]) == 0
    doc = json.loads(out.read_text())
    procs = [e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"]
    assert any(p.startswith("rank 1 ·") for p in procs) and not any(p.startswith("rank 0 ·") for p in procs)
    capsys.readouterr()
    assert main(["export", "perfetto", str(NCCL), "--window", "x:y", "-o", str(tmp_path / "e.pftrace")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tracekit: error: window 'x:y'") and err.count("\n") == 1
    assert main(["export", "perfetto", str(NCCL), "--format", "svg"]) == 2
    assert "choose perfetto or chrome-json" in capsys.readouterr().err


def test_cli_unknown_metric_names_are_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--metrics foo`` wrote the same file as ``--metrics none`` without a word (review finding)."""
    out = tmp_path / "m.pftrace"
    assert main(["export", "perfetto", str(DECODE), "-o", str(out), "--metrics", "tensor_active,foo"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tracekit: error: --metrics: 'foo' not in the trace; its GPU metrics: ")
    assert "'tensor_active'" in err and err.count("\n") == 1 and not out.exists()
    assert main(["export", "perfetto", str(DECODE), "-o", str(out), "--metrics", "tensor_active"]) == 0


def test_cli_default_metrics_on_a_trace_without_gpu_metrics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A plain ``export perfetto`` of a capture without ``--gpu-metrics-devices`` failed with
    "--metrics: 'sms_active', … not in the trace" although no --metrics was given (found by
    running every command on every bundled export)."""
    assert tracekit.open(TRAIN).gpu_metrics.is_empty()
    for fmt, name in (("perfetto", "t.pftrace"), ("chrome-json", "t.json")):
        out = tmp_path / name
        assert main(["export", "perfetto", str(TRAIN), "-f", fmt, "-o", str(out)]) == 0
        assert "error" not in capsys.readouterr().err and out.stat().st_size > 0
    rb = read_back(tmp_path / "t.pftrace")
    gpu_counters = [u for u, d in rb.tracks.items() if d.HasField("parent_uuid") and rb.tracks[d.parent_uuid].name.startswith("GPU ")
                    and not rb.tracks[d.parent_uuid].HasField("process")]
    assert not gpu_counters and rb.tracks  # no GPU metric counters; the rest written
    assert main(["export", "perfetto", str(TRAIN), "-o", str(tmp_path / "u.pftrace"), "--metrics", "tensor_active"]) == 2
    assert "none: the trace has no GPU metrics" in capsys.readouterr().err


def test_cli_help_lists_export(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "export" in capsys.readouterr().out
    assert main(["export", "--help"]) == 0
    assert "perfetto" in capsys.readouterr().out


# -- the steady-state window's tie rule -------------------------------------------------------------------
def test_loop_search_breaks_ties_by_lowest_rank(decode: object) -> None:
    """Two ranks with the same GPU time: the lowest rank is searched first, whatever the row
    order, and its iterations are those of the rank alone."""
    from tracekit.analysis.run.structure import kernel_loop_iterations

    k = decode.kernels.select("device_id", "start_ns", "end_ns", "duration_ns", "name")
    shifted = k.with_columns(pl.col("start_ns") + 1_000, pl.col("end_ns") + 1_000)
    a = pl.concat([k.with_columns(pl.lit(0, pl.Int64).alias("rank")), shifted.with_columns(pl.lit(1, pl.Int64).alias("rank"))])
    b = pl.concat([shifted.with_columns(pl.lit(1, pl.Int64).alias("rank")), k.with_columns(pl.lit(0, pl.Int64).alias("rank"))])
    la, lb = kernel_loop_iterations(a), kernel_loop_iterations(b)
    assert la and la[0].keys == {"rank": 0, "device_id": 0} and lb[0].keys == la[0].keys
    assert la[0].iterations.height > 0 and la[0].iterations.equals(lb[0].iterations)
    alone = kernel_loop_iterations(k.with_columns(pl.lit(0, pl.Int64).alias("rank")))
    assert la[0].iterations["start_ns"].to_list() == alone[0].iterations["start_ns"].to_list()


@pytest.mark.parametrize("metrics", ["all", ["tensor_active"], []])
def test_metric_choice(tmp_path: Path, metrics: object) -> None:
    trace = tracekit.open(NCCL)  # fresh: samples are read from the export, not the loaded table
    path = tmp_path / "m.pftrace"
    perfetto(trace, path, metrics=metrics)
    rb = read_back(path)
    gm = trace.gpu_metrics.filter(pl.col("timestamp_ns") >= 0)
    if metrics != "all":
        gm = gm.filter(pl.col("metric").is_in(metrics))
    gpu_counters = [u for u, d in rb.tracks.items() if d.HasField("parent_uuid") and rb.tracks[d.parent_uuid].name.startswith("GPU ")
                    and not rb.tracks[d.parent_uuid].HasField("process")]
    assert sum(len(rb.counters[u]) for u in gpu_counters) == gm.height
    assert len(gpu_counters) == gm.select("device_id", "metric").n_unique()


def test_paths_are_opened_and_ncu_reports_refused(tmp_path: Path) -> None:
    s = perfetto(DECODE, tmp_path / "p.pftrace")
    assert s.slices["kernel"] == tracekit.open(DECODE).kernels.height
    ncu = next((ROOT / "sample_traces/ncu").rglob("*.ncu-rep"), None)
    if ncu is None:
        pytest.skip("no ncu report")
    with pytest.raises(TracekitError, match="no timeline to export"):
        perfetto(ncu, tmp_path / "n.pftrace")
    assert not (tmp_path / "n.pftrace").exists()


def test_chrome_json_keeps_nesting_order(tmp_path: Path) -> None:
    """Within a thread, an enclosing slice comes before the slices it holds (readers keep the
    file's order for equal timestamps)."""
    trace = tracekit.open(TRAIN)
    path = tmp_path / "train.json"
    chrome_json(trace, path, chunk_rows=500)
    ev = [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]
    seen: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for e in ev:
        seen[(e["pid"], e["tid"])].append((e["ts"], -e["dur"]))
    assert all(v == sorted(v) for v in seen.values())
    assert Counter(e["cat"] for e in ev)["nvtx"] == trace.nvtx.filter(
        (pl.col("event_type") == "PushPop") & pl.col("end_ns").is_not_null()).height


def test_an_export_without_events_says_so(tmp_path: Path, corpus_dir: Path) -> None:
    path = corpus_dir / "incomplete_cardiac_report1.sqlite"
    if not path.exists():
        pytest.skip("corpus file missing")
    with pytest.warns(UserWarning, match="incomplete export"):
        trace = tracekit.open(path)
        s = perfetto(trace, tmp_path / "e.pftrace")
    assert sum(s.slices.values()) == 0 and read_back(tmp_path / "e.pftrace").slices == []
    assert s.notes == ["the trace has no CUDA, NVTX or NCCL events to draw (was it captured with --trace=cuda,nvtx?)"]


def _corpus() -> list[Path]:
    from tests.conftest import corpus_files

    return corpus_files()


@pytest.mark.parametrize("path", _corpus(), ids=lambda p: p.stem)
def test_every_corpus_export(tmp_path: Path, path: Path) -> None:
    """nsys 2020.5 … 2026.2 exports: the file reads back, nests, and holds every kernel and API call."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trace = tracekit.open(path)
        out = tmp_path / "c.pftrace"
        s = perfetto(trace, out)
    rb = read_back(out)
    got = Counter(x.cat for x in rb.slices)
    assert got["kernel"] == trace.kernels.height and got["cuda_api"] == trace.cuda_api.height
    assert len({f for x in rb.slices for f in x.flows}) == s.flows
    assert _nested(rb.slices)


def test_repeated_pids_across_reports_stay_apart(tmp_path: Path) -> None:
    """Two ranks whose processes have the same pid (a report and a copy of it made into the
    next node's rank 1: another host name and RANK; plain copies are not one run)."""
    from tests.conftest import mutated_copy

    src = PER_RANK / "llm_tp2_nccl_per_rank_rank0.sqlite"
    folder = tmp_path / "job"
    folder.mkdir()
    shutil.copy(src, folder / "copy_rank0.sqlite")
    mutated_copy(src, folder / "copy_rank1.sqlite",
                 "UPDATE TARGET_INFO_SYSTEM_ENV SET value = 'node1' WHERE name = 'Hostname'",
                 "UPDATE META_DATA_CAPTURE SET value = 'RANK=\"1\"' WHERE value = 'RANK=\"0\"'")
    ranks = tracekit.open_many(folder)
    assert ranks.unrelated is None and ranks.ranks["rank"].to_list() == [0, 1]
    path = tmp_path / "two.pftrace"
    perfetto(ranks, path)
    rb = read_back(path)
    pid = int(tracekit.open(src).kernels["pid"][0])
    procs = sorted(d.process.pid for d in rb.tracks.values() if d.HasField("process"))
    assert procs == [10_000_000 + pid, 20_000_000 + pid]
    threads = {(d.thread.pid, d.thread.tid) for d in rb.tracks.values() if d.HasField("thread")}
    assert {p for p, _ in threads} == set(procs)
    assert all(t // 10_000_000 == p // 10_000_000 for p, t in threads)
    assert len(rb.by_cat("kernel")) == 2 * tracekit.open(src).kernels.height


def test_nvtx_marks_and_start_end_ranges(tmp_path: Path) -> None:
    """A copy of the emit_nvtx sample with two push/pop ranges turned into marks and five into
    start/end ranges, one of which made to end after the range it started in."""
    copy = tmp_path / "marks.sqlite"
    shutil.copy(TRAIN, copy)
    with sqlite3.connect(copy) as db:
        rows = [r[0] for r in db.execute("SELECT rowid FROM NVTX_EVENTS WHERE eventType = 59 ORDER BY start LIMIT 8")]
        db.execute(f"UPDATE NVTX_EVENTS SET eventType = 34, end = NULL WHERE rowid IN ({rows[1]}, {rows[2]})")
        db.execute(f"UPDATE NVTX_EVENTS SET eventType = 60 WHERE rowid IN ({','.join(map(str, rows[3:8]))})")
        end4 = db.execute(f"SELECT end FROM NVTX_EVENTS WHERE rowid = {rows[3]}").fetchone()[0]
        db.execute(f"UPDATE NVTX_EVENTS SET end = ? WHERE rowid = {rows[4]}", (end4 + 1000,))
    trace = tracekit.open(copy, column_cache=False)
    nv = trace.nvtx
    marks = nv.filter(pl.col("event_type") == "Mark").sort("start_ns")
    start_end = nv.filter(pl.col("event_type") == "StartEnd")
    assert marks.height == 2 and start_end.height == 5
    path = tmp_path / "m.pftrace"
    s = perfetto(trace, path)
    rb = read_back(path)
    assert [(ts, name) for _, ts, name in sorted(rb.instants, key=lambda x: x[1])] == list(
        zip(marks["start_ns"].to_list(), marks["name"].to_list(), strict=True))
    assert all(rb.tracks[t].HasField("thread") for t, _, _ in rb.instants) and s.instants == 2
    se = [x for x in rb.by_cat("nvtx") if rb.track_name(x.track).startswith("NVTX start/end ranges")]
    assert sorted((x.start, x.end) for x in se) == sorted(start_end.select("start_ns", "end_ns").iter_rows())
    assert {rb.track_name(x.track) for x in se} == {"NVTX start/end ranges", "NVTX start/end ranges (overlap 1)"}
    pushpop = nv.filter((pl.col("event_type") == "PushPop") & pl.col("end_ns").is_not_null()).height
    assert len(rb.by_cat("nvtx")) == pushpop + 5 and _nested(rb.slices)
    out = tmp_path / "m.json"
    chrome_json(trace, out)
    ev = json.loads(out.read_text())["traceEvents"]
    assert sorted(e["name"] for e in ev if e["ph"] == "i") == sorted(marks["name"].to_list())


def test_nsys_columnar_folders_export_like_their_sqlite(tmp_path: Path, nsys_columnar: Path) -> None:
    """nsys's parquetdir and arrowdir exports of one report (tests/data/nsys_columnar.tar.xz),
    read a column at a time in 20-row time slices, give the events of its SQLite export."""
    base = nsys_columnar / "memfusion_report1"
    want = tmp_path / "sqlite.pftrace"
    s = perfetto(tracekit.open(base.with_suffix(".sqlite"), column_cache=False), want)
    assert s.slices["kernel"] > 0 and s.flows > 0
    for kind in ("parquetdir", "arrowdir"):
        got = tmp_path / f"{kind}.pftrace"
        trace = tracekit.open(base.with_suffix(f".{kind}"))
        perfetto(trace, got, slice_rows=20)
        assert _decoded(got) == _decoded(want)
        assert not trace.is_loaded("cuda_api")


def test_the_same_export_is_the_same_bytes_run_after_run(tmp_path: Path) -> None:
    """Three processes at once write byte-identical files of
    a 300 k-kernel, two-process NCCL export: the names are interned in order of first use.
    There the kernel names come as categoricals (the diagnosis read the kernel table a
    column at a time, so the trace does not hold it), and a categorical's unique() came out
    in an order that depends on the threads' timing: under load, three runs gave three
    different files with the same slices, and this test failed in one of three tries."""
    import subprocess
    import sys

    from .conftest import build_big_trace

    big = build_big_trace(tmp_path, 300_000, seed=NCCL)
    env = {**os.environ, "TRACEKIT_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    code = "import sys; from tracekit.cli.main import main; sys.exit(main(sys.argv[1:]))"
    tracekit.open(big).columns_on_demand("kernels", ["start_ns"])["start_ns"]  # the column cache filled first
    # three at once: on 2 cores the threads' timing varies most (the order varied under load)
    logs = [(tmp_path / f"e{i}.log").open("w") for i in range(3)]
    runs = [subprocess.Popen([sys.executable, "-c", code, "export", "perfetto", str(big), "--window", "steady", "-o",
                              str(tmp_path / f"e{i}.pftrace")], env=env, stdout=subprocess.DEVNULL, stderr=logs[i])
            for i in range(3)]  # fmt: skip
    codes = [r.wait(timeout=300) for r in runs]
    for log in logs:
        log.close()
    assert codes == [0, 0, 0], (tmp_path / "e0.log").read_text()
    outs = [(tmp_path / f"e{i}.pftrace").read_bytes() for i in range(3)]
    assert outs[0] == outs[1] == outs[2]
    assert len(read_back(tmp_path / "e0.pftrace").slices) > 1000
