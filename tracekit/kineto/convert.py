"""A Kineto trace → a folder of Parquet files shaped like ``nsys export --type parquetdir``.

One file per nsys export table that Kineto can fill (``CUPTI_ACTIVITY_KIND_KERNEL``,
``…_RUNTIME``, ``…_MEMCPY``, ``…_MEMSET``, ``…_SYNCHRONIZATION``, ``NVTX_EVENTS``,
``StringIds``, ``ThreadNames``, ``PROCESSES``, ``TARGET_INFO_GPU``,
``TARGET_INFO_SESSION_START_TIME``, ``ANALYSIS_DETAILS``, ``META_DATA_EXPORT``), with nsys's
column names and encodings (``globalTid`` = pid·2²⁴ + tid, names as ``StringIds`` ids), so
:class:`~tracekit.nsys.columnar.ExportFolder` and every reader, analysis and report read it as
they read nsys's own export. Columns Kineto does not record are left out (the readers make them
null). What only Kineto has goes to ``KINETO_*`` files in tracekit's own column names (CPU
operators, memory events, GPU-side annotations, the extra kernel and API arguments, the trace's
top-level fields); ``docs/kineto.md`` lists every mapping.

The folder is made once per trace, in tracekit's cache (:func:`converted_folder`): keyed by the
file's identity and content fingerprint, written to a temporary folder then renamed, so a
conversion that fails leaves nothing behind. The trace file is only read.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from tracekit.errors import TraceFormatError
from tracekit.kineto.parse import Document, as_int, as_text
from tracekit.kineto.stage import CATEGORY, GPU_EXTRA, KINETO_CATEGORIES, Staged, stage

__all__ = ["CATEGORY", "KINETO_CATEGORIES", "build_tables", "convert", "converted_folder", "read_trace"]

log = logging.getLogger(__name__)

#: Version of the converted folder's layout (part of its cache key): bump on any change.
FORMAT = "kineto-2"
#: nsys ``NVTX_EVENTS.eventType`` of a push/pop range.
NVTX_PUSH_POP = 59
TID_BITS = 0x1000000


def _global(pid: int | None, tid: int | None) -> int | None:
    if pid is None:
        return None
    return (pid % TID_BITS) * TID_BITS + (0 if tid is None else tid % TID_BITS)


def _global_tid(pid: pl.Expr | str, tid: pl.Expr | str) -> pl.Expr:
    """:func:`_global` over columns."""
    pid, tid = pl.col(pid) if isinstance(pid, str) else pid, pl.col(tid) if isinstance(tid, str) else tid
    return (pid % TID_BITS) * TID_BITS + (tid % TID_BITS).fill_null(0)


class _Strings:
    """Text → ``StringIds`` id, in first-seen order."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def __call__(self, text: Any) -> int | None:
        if text is None:
            return None
        text = str(text)
        got = self.ids.get(text)
        if got is None:
            got = self.ids[text] = len(self.ids)
        return got

    def column(self, values: pl.Series) -> pl.Series:
        """The ids of a Utf8 column (null stays null), interned in the column's order."""
        for text in values.drop_nulls().unique(maintain_order=True).to_list():
            self(text)
        return values.replace_strict(self.ids, default=None, return_dtype=pl.Int64)

    def frame(self) -> pl.DataFrame:
        return pl.DataFrame({"id": range(len(self.ids)), "value": list(self.ids)}, schema={"id": pl.Int64, "value": pl.Utf8})


def build_tables(staged: Staged, doc: Document, path: Path) -> dict[str, pl.DataFrame]:
    """The folder's tables (file stem → frame) from the staged events (:func:`read_trace`).
    Raises :class:`TraceFormatError` for a trace with no Kineto events or no GPU work."""
    n = staged.counts
    if not staged.kineto_seen:
        msg = (f"{path} is a Chrome trace but not a PyTorch profiler (Kineto) trace: no schemaVersion, deviceProperties "
               "or Kineto event categories (kernel, cpu_op, cuda_runtime); tracekit reads torch.profiler's traces")
        raise TraceFormatError(msg)
    if not n["kernel"] + n["memcpy"] + n["memset"]:
        cpu = n["cpu_op"] + n["annotation"]
        msg = (f"{path} is a PyTorch profiler trace with no GPU activity ({cpu:,} CPU events, no kernels or copies): "
               "profile with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] on a GPU run to analyse GPU time")
        raise TraceFormatError(msg)
    if staged.other:
        log.debug("%s: events of categories not converted: %s", path, dict(staged.other))
    strings = _Strings()
    tables: dict[str, pl.DataFrame] = {}

    # processes and threads: the CPU side's pids; GPU events use pid = device, tid = stream
    _release_freed_memory()
    runtime = staged.take("runtime", "driver")
    cpu_threads = pl.concat([runtime.select("pid", "tid")] + [f.select("pid", "tid") for k in _CPU_KINDS for f in staged.parts[k]])
    main_pid = _main_pid(runtime["pid"] if runtime.height else cpu_threads["pid"])
    cpu_pids: set[int] = set(cpu_threads["pid"].drop_nulls().unique().to_list()) | {main_pid}

    tables.update(_gpu_tables(staged, runtime, strings, main_pid))
    if runtime.height:
        tables["CUPTI_ACTIVITY_KIND_RUNTIME"], tables["KINETO_RUNTIME_ARGS"] = _runtime(runtime, n["runtime"], strings)
    if n["annotation"]:
        notes = pl.concat(staged.parts["annotation"])
        tables["NVTX_EVENTS"] = notes.select(
            pl.col("start_ns").alias("start"), pl.col("end_ns").alias("end"),
            pl.lit(NVTX_PUSH_POP, dtype=pl.Int64).alias("eventType"), pl.col("name").alias("text"),
            pl.when(pl.col("pid").is_not_null()).then(_global_tid("pid", "tid")).alias("globalTid"),
            pl.lit(0, dtype=pl.Int64).alias("domainId"),
        ).sort("start", "end", descending=[False, True], maintain_order=True)
    tables["KINETO_CPU_OPS"] = _sorted(staged.take(*_CPU_KINDS), ["start_ns", "end_ns"], [False, True])
    if n["memory"]:
        tables["KINETO_MEMORY_EVENTS"] = _sorted(staged.take("memory"), ["start_ns"], [False])
    if n["gpu_annotation"]:
        tables["KINETO_GPU_ANNOTATIONS"] = _sorted(staged.take("gpu_annotation"), ["start_ns"], [False])

    pids = sorted(cpu_pids)
    tables["PROCESSES"] = pl.DataFrame({
        "globalPid": [_global(p, 0) for p in pids], "pid": pids, "name": [staged.process_names.get(p) for p in pids],
    }, schema={"globalPid": pl.Int64, "pid": pl.Int64, "name": pl.Utf8})
    thread_names = staged.thread_names
    pairs = cpu_threads.drop_nulls().unique()
    seen = sorted(set(zip(pairs["pid"].to_list(), pairs["tid"].to_list(), strict=True))
                  | {k for k in thread_names if k[0] in cpu_pids and k[1] is not None})
    tables["ThreadNames"] = pl.DataFrame({
        "nameId": [strings(thread_names.get(k)) for k in seen], "priority": [None] * len(seen),
        "globalTid": [_global(*k) for k in seen],
    }, schema={"nameId": pl.Int64, "priority": pl.Int64, "globalTid": pl.Int64})

    tables.update(_target_info(doc, tables, staged.span, path))
    tables["StringIds"] = strings.frame()
    return tables


_CPU_KINDS = ("cpu_op", "annotation", "python_function")


def _sorted(frame: pl.DataFrame, by: list[str], descending: list[bool]) -> pl.DataFrame:
    """``frame.sort(by, descending=descending, maintain_order=True)``, made a column at a time
    and letting go of each unsorted column once sorted (the caller hands ``frame`` over), so
    the frame is not held twice."""
    order = frame.select(pl.arg_sort_by(by, descending=descending, maintain_order=True)).to_series()
    columns: list[pl.Series | None] = list(frame.get_columns())
    del frame
    out = []
    for i, column in enumerate(columns):
        columns[i] = None
        if column is not None:
            out.append(column.gather(order))
        del column
    return pl.DataFrame(out)


def _release_freed_memory() -> None:
    """Hand the heap's freed pages back to the system (glibc keeps them after the batches'
    many small objects are gone; elsewhere a no-op)."""
    import ctypes
    import ctypes.util
    import sys

    if sys.platform != "linux":
        return
    with contextlib.suppress(OSError, AttributeError, TypeError):
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)


def _main_pid(pids: pl.Series) -> int:
    """The most frequent pid (the first seen among equals), 0 when there is none."""
    counts = (pl.DataFrame({"pid": pids}).with_row_index("first").drop_nulls("pid")
              .group_by("pid").agg(pl.len().alias("n"), pl.col("first").min())
              .sort(["n", "first"], descending=[True, False]))
    return int(counts["pid"][0]) if counts.height else 0


def _gpu_tables(staged: Staged, runtime: pl.DataFrame, strings: _Strings, main_pid: int) -> dict[str, pl.DataFrame]:
    """Kernels, copies, memsets and syncs with nsys's columns; the extra kernel/copy arguments
    in ``KINETO_GPU_ARGS``. ``globalPid`` is the launching process, found through the runtime
    call of the same correlation id (else the trace's main process)."""
    launcher = (runtime.select(pl.col("correlationId").alias("_c"), pl.col("pid").alias("_launcher"))
                .drop_nulls().unique("_c", keep="first", maintain_order=True))
    out: dict[str, pl.DataFrame] = {}
    extra: list[pl.DataFrame] = []
    base = ["start", "end", "deviceId", "contextId", "streamId", "correlationId", "globalPid"]
    for kind, table in (("kernel", "CUPTI_ACTIVITY_KIND_KERNEL"), ("memcpy", "CUPTI_ACTIVITY_KIND_MEMCPY"),
                        ("memset", "CUPTI_ACTIVITY_KIND_MEMSET"), ("sync", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION")):
        if not staged.counts[kind]:
            continue
        ev = staged.take(kind)
        ev = ev.join(launcher, left_on="correlationId", right_on="_c", how="left", maintain_order="left")
        ev = ev.with_columns((pl.col("_launcher").fill_null(main_pid) % TID_BITS * TID_BITS).alias("globalPid"))
        if kind == "kernel":
            from tracekit.ncu.schema import short_name_of

            names = ev["name"]
            ids = strings.column(names)
            text = names.fill_null("None")
            distinct = text.unique(maintain_order=True).to_list()
            short = text.replace_strict(distinct, [short_name_of(t) for t in distinct], return_dtype=pl.Utf8)
            cols = ev.select(*base, demangledName=ids, shortName=strings.column(short), registersPerThread="registersPerThread",
                             gridX="gridX", gridY="gridY", gridZ="gridZ", blockX="blockX", blockY="blockY", blockZ="blockZ")
        elif kind == "memcpy":
            cols = ev.select(*base, "bytes", "copyKind", "srcKind", "dstKind")
        elif kind == "memset":
            cols = ev.select(*base, "bytes", "memKind")
        else:
            cols = ev.select(*base, "syncType")
        out[table] = cols
        if kind != "sync":
            extra.append(ev.select(pl.lit(kind, dtype=pl.Utf8).alias("kind"), pl.col("correlationId").alias("correlation_id"),
                                   pl.col("deviceId").alias("device_id"), pl.col("start").alias("start_ns"), *GPU_EXTRA))
    if extra:
        out["KINETO_GPU_ARGS"] = pl.concat(extra)
    return out


GPU_ARGS_SCHEMA: dict[str, Any] = {
    "kind": pl.Utf8, "correlation_id": pl.Int64, "device_id": pl.Int64, "start_ns": pl.Int64, **GPU_EXTRA,
}


def _runtime(events: pl.DataFrame, n_runtime: int, strings: _Strings) -> tuple[pl.DataFrame, pl.DataFrame]:
    gtid = events.select(pl.when(pl.col("pid").is_not_null()).then(_global_tid("pid", "tid"))).to_series()
    api = pl.DataFrame({
        "start": events["start"], "end": events["end"],
        "eventClass": pl.Series([0] * n_runtime + [1] * (events.height - n_runtime), dtype=pl.Int64),
        "globalTid": gtid, "correlationId": events["correlationId"], "nameId": strings.column(events["name"]),
    })
    args = pl.DataFrame({"correlation_id": events["correlationId"], "global_tid": gtid, "start_ns": events["start"],
                         "external_id": events["external_id"], "cbid": events["cbid"]})
    order = api["start"].arg_sort()
    return api[order], args[order]


CPU_OPS_SCHEMA: dict[str, Any] = {
    "category": pl.Utf8, "name": pl.Utf8, "pid": pl.Int64, "tid": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64,
    "duration_ns": pl.Int64, "external_id": pl.Int64, "record_function_id": pl.Int64, "ev_idx": pl.Int64,
    "sequence_number": pl.Int64, "fwd_thread_id": pl.Int64, "input_dims": pl.Utf8, "input_types": pl.Utf8,
    "input_strides": pl.Utf8, "concrete_inputs": pl.Utf8, "call_stack": pl.Utf8, "module_hierarchy": pl.Utf8,
    "collective_name": pl.Utf8, "in_msg_nelems": pl.Int64, "out_msg_nelems": pl.Int64, "group_size": pl.Int64,
    "dtype": pl.Utf8, "process_group_name": pl.Utf8, "process_group_desc": pl.Utf8, "process_group_ranks": pl.Utf8,
}
MEMORY_SCHEMA: dict[str, Any] = {
    "pid": pl.Int64, "tid": pl.Int64, "start_ns": pl.Int64, "device_type": pl.Int64, "device_id": pl.Int64,
    "address": pl.Int64, "bytes": pl.Int64, "total_allocated_bytes": pl.Int64, "total_reserved_bytes": pl.Int64,
}


def _target_info(doc: Document, tables: dict[str, pl.DataFrame], span: tuple[Any, Any] | None,
                 path: Path) -> dict[str, pl.DataFrame]:
    """GPUs, the capture window, the session's epoch and the export's metadata."""
    out: dict[str, pl.DataFrame] = {}
    props = doc.deviceProperties if isinstance(doc.deviceProperties, list) else []
    props = [p for p in props if isinstance(p, dict)]
    used: set[int] = set()
    for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        if t in tables:
            used.update(d for d in tables[t]["deviceId"].drop_nulls().unique().to_list())
    rows = {as_int(p.get("id")): p for p in props}
    known = {i for i in rows if i is not None}
    if len(known) == 1 and len(used) == 1 and not used & known:
        # one GPU, which the runtime numbered otherwise than the properties (ROCm under
        # HIP_VISIBLE_DEVICES: kernels on device 2 or 9, properties of device 0): the same GPU
        rows = {next(iter(used)): rows[next(iter(known))]}
        known = set()
    ids = sorted(known | used)
    out["TARGET_INFO_GPU"] = pl.DataFrame({
        "id": ids,
        "name": [as_text(rows.get(i, {}).get("name")) for i in ids],
        "busLocation": [None] * len(ids), "uuid": [None] * len(ids), "chipName": [None] * len(ids),
        "totalMemory": [as_int(rows.get(i, {}).get("totalGlobalMem")) for i in ids],
        "smCount": [as_int(rows.get(i, {}).get("numSms")) for i in ids],
        "computeMajor": [as_int(rows.get(i, {}).get("computeMajor")) for i in ids],
        "computeMinor": [as_int(rows.get(i, {}).get("computeMinor")) for i in ids],
        "l2CacheSize": [None] * len(ids), "memoryBandwidth": [None] * len(ids), "clockRate": [None] * len(ids),
    }, schema={"id": pl.Int64, "name": pl.Utf8, "busLocation": pl.Utf8, "uuid": pl.Utf8, "chipName": pl.Utf8,
               "totalMemory": pl.Int64, "smCount": pl.Int64, "computeMajor": pl.Int64, "computeMinor": pl.Int64,
               "l2CacheSize": pl.Int64, "memoryBandwidth": pl.Int64, "clockRate": pl.Int64})
    starts = [tables[t]["start"].min() for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME",
                                                  "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET", "NVTX_EVENTS")
              if t in tables]
    ends = [tables[t]["end"].max() for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME",
                                              "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET", "NVTX_EVENTS")
            if t in tables]
    if tables["KINETO_CPU_OPS"].height:
        starts.append(tables["KINETO_CPU_OPS"]["start_ns"].min())
        ends.append(tables["KINETO_CPU_OPS"]["end_ns"].max())
    if span is not None:
        starts.append(span[0])
        ends.append(span[1])
    lo = min(int(v) for v in starts if isinstance(v, int))
    hi = max(int(v) for v in ends if isinstance(v, int))
    out["ANALYSIS_DETAILS"] = pl.DataFrame({"startTime": [lo], "stopTime": [hi], "duration": [hi - lo]},
                                           schema={"startTime": pl.Int64, "stopTime": pl.Int64, "duration": pl.Int64})
    base = as_int(doc.baseTimeNanoseconds)
    # without a base time, Kineto counted from the Unix epoch (µs since 2001 are > 1e15)
    epoch = base if base is not None else (0 if lo >= 10**18 else None)
    if epoch is not None:
        utc = _dt.datetime.fromtimestamp((epoch + lo) / 1e9, tz=_dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
        out["TARGET_INFO_SESSION_START_TIME"] = pl.DataFrame({"utcEpochNs": [epoch], "utcTime": [utc], "localTime": [None]},
                                                             schema={"utcEpochNs": pl.Int64, "utcTime": pl.Utf8, "localTime": pl.Utf8})
    schema_version = as_text(doc.schemaVersion)
    meta = {
        "EXPORT_PRODUCT_NAME": "PyTorch Profiler (Kineto)",
        "EXPORT_PRODUCT_VERSION": f"kineto schema {schema_version}" if schema_version else "kineto",
        "EXPORT_SOURCE_FILE": path.name,
        "TRACEKIT_KINETO_FORMAT": FORMAT,
    }
    out["META_DATA_EXPORT"] = pl.DataFrame({"name": list(meta), "value": list(meta.values())}, schema={"name": pl.Utf8, "value": pl.Utf8})
    top = {k: msgspec.json.encode(v).decode() for k, v in msgspec.structs.asdict(doc).items() if k != "traceEvents" and v is not None}
    out["KINETO_META"] = pl.DataFrame({"name": list(top), "value": list(top.values())}, schema={"name": pl.Utf8, "value": pl.Utf8})
    return out


# -- the cached folder --------------------------------------------------------------------------
def read_trace(path: Path) -> dict[str, pl.DataFrame]:
    """The folder's tables of the trace at ``path``: its events read a batch at a time into
    columns (:func:`tracekit.kineto.stage.stage`), then the tables built from them."""
    staged, doc = stage(path)
    return build_tables(staged, doc, path)


def convert(path: Path, folder: Path) -> None:
    """Read the trace at ``path`` and write its tables into the existing, empty ``folder``."""
    tables = read_trace(path)
    for name, frame in tables.items():
        frame.write_parquet(folder / f"{name}.parquet", statistics=False)


#: Traces of at least this many bytes on disk are converted in a child process: its decode's
#: memory is gone when it exits, and its allocator gives freed pages back at once (the CLI's
#: ``DECAY_NOW``, which a process that has loaded polars can no longer set); the process that
#: opens the trace then only reads the Parquet folder. Smaller ones convert in this process
#: (a child's start-up, ~0.5 s, would dominate).
CHILD_BYTES = 2 << 20
#: jemalloc's options for the child (``tracekit.cli.allocator.DECAY_NOW``).
_CHILD_MALLOC_CONF = "dirty_decay_ms:0,muzzy_decay_ms:0"
#: The decays ``import polars`` writes at the front of ``_RJEM_MALLOC_CONF`` (polars 1.x-2.x).
_POLARS_DECAY = {"dirty_decay_ms": "500", "muzzy_decay_ms": "1000"}


def _child_malloc_conf(conf: str | None) -> str:
    """The child's ``_RJEM_MALLOC_CONF``, from this process's value ``conf``: with
    :data:`_CHILD_MALLOC_CONF` put last (jemalloc takes an option's last value) unless ``conf``
    chooses other decays than polars' own.

    ``import polars`` rewrites the variable as its defaults (``dirty_decay_ms:500,
    muzzy_decay_ms:1000``) followed by the value set before it, if any. So in a process that has
    loaded polars it is never unset, and keeping a set value kept polars' 500 ms: the child
    held freed pages (the 86 MB GPT-2 trace: 246 MiB instead of 164 MiB). A decay set by the
    user (or the CLI) still wins; the other options are kept either way."""
    if not conf or not conf.strip():
        return _CHILD_MALLOC_CONF
    last: dict[str, str] = {}
    for option in conf.split(","):
        key, _, value = option.partition(":")
        last[key.strip()] = value.strip()
    if all(last.get(key, default) == default for key, default in _POLARS_DECAY.items()):
        return f"{conf},{_CHILD_MALLOC_CONF}"
    return conf


def convert_isolated(path: Path, folder: Path) -> None:
    """:func:`convert`, in a child process for a trace of :data:`CHILD_BYTES` or more (unless
    ``TRACEKIT_KINETO_IN_PROCESS=1``); a :class:`TraceFormatError` of the child is raised here
    with its own line."""
    import subprocess
    import sys

    if path.stat().st_size < CHILD_BYTES or os.environ.get("TRACEKIT_KINETO_IN_PROCESS", "").strip() not in ("", "0"):
        convert(path, folder)
        return
    env = dict(os.environ)
    env["_RJEM_MALLOC_CONF"] = _child_malloc_conf(env.get("_RJEM_MALLOC_CONF"))
    proc = subprocess.run([sys.executable, "-m", "tracekit.kineto.convert", str(path), str(folder)], env=env,
                          capture_output=True, text=True, check=False)
    if proc.returncode == 0:
        return
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else f"exit status {proc.returncode}"
    if proc.returncode == 2:  # the child's TraceFormatError, one line
        raise TraceFormatError(last)
    msg = (f"{path.name}: converting the torch.profiler trace failed in a child process (exit {proc.returncode}: {last[:300]}); "
           "set TRACEKIT_KINETO_IN_PROCESS=1 to convert it in this process and see the whole error")
    raise TraceFormatError(msg)


def _main(argv: list[str]) -> int:
    """``python -m tracekit.kineto.convert TRACE FOLDER`` (what :func:`convert_isolated` runs):
    exit 2 with the one-line error for a bad trace."""
    import sys

    try:
        convert(Path(argv[0]), Path(argv[1]))
    except TraceFormatError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    return 0


def _key(path: Path) -> str:
    from tracekit.cache import export_key

    return export_key(path, salt=FORMAT)


def converted_folder(path: str | Path) -> tuple[Path, Path | None]:
    """The nsys-shaped folder of the Kineto trace at ``path`` (made on first use), and a
    temporary folder to delete when done with it (None when the folder is in the cache).

    Cached under ``<cache_dir>/kineto/<name>.<key>``, the key made of the file's path, size,
    modification time, inode and content fingerprint (:func:`tracekit.cache.export_key`), so a
    changed trace is converted again. Written to a temporary folder beside it and renamed into
    place, so a failed or interrupted conversion leaves no folder that looks complete. When the
    cache cannot be written (read-only home, a folder of another user) the conversion goes to a
    temporary folder instead."""
    from tracekit.cache import cache_dir, folder_state

    path = Path(path)
    root = cache_dir() / "kineto"
    key = _key(path)
    final = root / f"{path.name[:80]}.{key}"
    if (final / "META_DATA_EXPORT.parquet").is_file():
        return final, None
    usable = folder_state(root) == "ok"
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}." if usable else "tracekit-kineto-", dir=root if usable else None))
    try:
        convert_isolated(path, tmp)
        if not usable:
            return tmp, tmp
        try:
            os.rename(tmp, final)
        except OSError:  # another process converted it meanwhile
            if not (final / "META_DATA_EXPORT.parquet").is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
        return final, None
    except BaseException:
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp)
        raise


if __name__ == "__main__":
    import sys

    sys.exit(_main(sys.argv[1:]))
