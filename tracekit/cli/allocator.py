"""jemalloc's settings for the command about to run, set before polars is imported.

polars allocates with jemalloc, which keeps freed pages for reuse for about 10 s. A command
that works through an 11 GB export in steps (``diff``: one run, then the other; ``report``:
section by section) then holds each step's freed working memory on top of the next step's:
on two 30 M-kernel runs ``tracekit diff`` peaked at 4.14 GB. With ``dirty_decay_ms:0`` the
pages go back as they are freed, for some system time (page faults when they are touched
again: +0.7 s on a 3 s command over a 1 M-kernel export), so that is kept for such commands
on an input of at least :data:`BIG_INPUT_BYTES` (:data:`DECAY_NOW`).

Every other command gets :data:`EAGER_LARGE`: jemalloc serves allocations of 128 KiB and
more from one arena of their own, whatever the thread, so that the next step's columns reuse
the pages of the last step's (on a 1 M-kernel, 5 M-call export ``tracekit stats -r
cuda_gpu_kern_sum,nvtx_gpu_proj_sum,cuda_kern_exec_sum`` peaked at 384–420 MiB with the
default and 294–336 MiB with it, with fewer page faults, ~100 k instead of ~175 k, and no
more time: benchmarks/README.md, "Issue 28, twelfth session"). That arena keeps freed pages
with the same delay as the others in the jemalloc polars ships (a dropped 40 MB column stays
resident until the delay passes: measured), not handing them back at once as jemalloc's
documentation describes for its own build. ``summary`` and ``diagnose`` get
:data:`DECAY_NOW` from a smaller input than the other stepped commands
(:data:`DECAY_NOW_FROM`); ``stats`` gets :data:`DECAY_SHORT` (the same, with freed pages back
after 0.2 s) on any input.

A value of ``_RJEM_MALLOC_CONF`` the user set is left alone.

The export's rows come out of SQLite through ADBC, which allocates with the C library's
malloc. glibc serves blocks from 128 KiB on by mapping them, but raises that threshold each
time such a block is freed (up to 32 MiB), after which big blocks come from heaps it keeps:
:func:`map_large_blocks` fixes the threshold at :data:`MMAP_THRESHOLD`, so that the read
buffers of a first run go back when freed (h1x, the three big stats reports with the
column cache empty: 379–388 → 330–361 MiB; no change once the columns are cached).
``MALLOC_MMAP_THRESHOLD_`` in the environment is left alone.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path

__all__ = [
    "BIG_INPUT_BYTES", "DECAY_NOW", "DECAY_NOW_FROM", "DECAY_SHORT", "DECAY_SHORT_COMMANDS", "EAGER_LARGE", "MMAP_THRESHOLD", "STEPPED_COMMANDS", "map_large_blocks", "tune_allocator",
]

#: Inputs from this size on (bytes; a folder: its files) count as big.
BIG_INPUT_BYTES = 1 << 30
#: jemalloc options: freed pages go back to the system at once.
DECAY_NOW = "dirty_decay_ms:0,muzzy_decay_ms:0"
#: jemalloc options: allocations from 128 KiB on come from the arena that frees at once.
EAGER_LARGE = "oversize_threshold:131072"
#: Commands that work through a whole export in steps.
STEPPED_COMMANDS = frozenset({"diff", "report", "summary", "diagnose", "export"})
#: Input bytes from which a command gets :data:`DECAY_NOW` when not :data:`BIG_INPUT_BYTES`:
#: ``summary`` and ``diagnose`` from 192 MiB. Their steps free and allocate columns of
#: millions of rows one after another, and with jemalloc's delay the pages of the last
#: steps' columns were held on top of the next step's: on the 363 MB, 1 M-kernel h1x export
#: a warm ``summary`` peaked at 444–472 MiB with :data:`EAGER_LARGE` and 321–322 MiB with
#: pages returned at once (any delay, 1–20 ms, kept 355–413 MiB), for 1.5–1.8 s more system
#: time (page faults: 0.29 M → 1.34 M), 4.0–4.5 s → 5.8–6.2 s in all
#: (benchmarks/README.md, "Issue 28, thirteenth session"); on the 222 MB, 1.09 M-kernel
#: d1x export (a decode with per-layer NVTX ranges) 290–318 MiB with :data:`EAGER_LARGE`
#: and 251 MiB with this, 3.0–4.6 s → 3.9–4.4 s ("Issue 37", second session).
DECAY_NOW_FROM = {"summary": 192 << 20, "diagnose": 192 << 20}
#: jemalloc options: :data:`EAGER_LARGE`, and freed pages go back after 0.2 s instead of ~10 s.
DECAY_SHORT = f"{EAGER_LARGE},dirty_decay_ms:200,muzzy_decay_ms:0"
#: Commands that get :data:`DECAY_SHORT` whatever their input's size (when they do not get
#: :data:`DECAY_NOW`): ``stats``. Its reports free one whole-column step before the next
#: allocates. On the h1x export (363 MB, 1 M kernels, 5 M calls) the three big reports with the
#: column cache empty peaked at 354–382 MiB with :data:`EAGER_LARGE` and 297–322 MiB with this
#: (a 500 ms delay: 311–345, 1 s: 303–344), in as much time (benchmarks/README.md, "Issue 28,
#: fourteenth session"). It was kept for inputs from 256 MiB until the grid of export shapes
#: (issue 44) showed the same on smaller ones at no cost in time: on the 206 MB
#: ``k1m_a1_v1_n100k`` the warm run 282–285 → 255–264 MiB, on the 97 MB ``k200_a6_v1_n100k``
#: 222–223 → 209–210, the cold ``cuda_kern_exec_sum`` 252–256 → 233–234, each in as much time, and on
#: the 25 MB ``k200_a1_v0_n1k`` no change (benchmarks/README.md, "Session 24"). ``summary`` and
#: ``diagnose`` below their :data:`DECAY_NOW_FROM` too: on ``k200_a6_v1_n100k`` (97 MB) a cold
#: ``summary`` 253–260 → 225 MiB, warm 219–224 → 215, ``diagnose`` cold 222–223 → 221, warm
#: 211–214 → 208–209, in as much time (2.1–2.3 s cold); on ``k200_a1_v0_n1k`` (25 MB)
#: 216–227 → 205–222 MiB. Pages returned at once (:data:`DECAY_NOW`) gave 196–228 MiB on
#: the two but 25–35 % more time (page faults), where these small inputs' memory is mostly
#: the interpreter's and polars' own (benchmarks/README.md, "Session 25").
DECAY_SHORT_COMMANDS = frozenset({"stats", "summary", "diagnose"})
_VARIABLE = "_RJEM_MALLOC_CONF"
#: Commands that start the user's program, which would inherit the variable.
_RUNS_PROGRAMS = frozenset({"capture"})
#: Bytes from which glibc maps each block (:func:`map_large_blocks`).
MMAP_THRESHOLD = 128 << 10
_M_MMAP_THRESHOLD = -3  # glibc's malloc.h


def _size(path: Path) -> int:
    """Bytes of a file, or of the files directly in a folder (an nsys parquetdir/arrowdir, a
    folder of per-rank exports); 0 when neither."""
    try:
        if path.is_file():
            return path.stat().st_size
        if path.is_dir():
            return sum(e.stat().st_size for e in os.scandir(path) if e.is_file())
    except OSError:
        return 0
    return 0


def _kineto(path: Path) -> bool:
    """Whether ``path`` is a torch.profiler trace, or a folder holding some (by content; the
    standard library only: this runs before polars is imported)."""
    from tracekit.kineto.sniff import is_kineto

    try:
        if path.is_file():
            return path.name.lower().endswith((".json", ".json.gz", ".gz")) and is_kineto(path)
        if path.is_dir():
            with os.scandir(path) as entries:
                return any(e.is_file() and e.name.lower().endswith((".json", ".json.gz")) and is_kineto(Path(e.path))
                           for e in entries)
    except OSError:
        return False
    return False


def tune_allocator(argv: Sequence[str], env: MutableMapping[str, str] | None = None,
                   *, min_bytes: int | None = None) -> str | None:
    """Set jemalloc's options in ``env`` (default ``os.environ``) for the command line
    ``argv`` (without the program) and return them: :data:`DECAY_NOW` for a
    :data:`STEPPED_COMMANDS` command on an input of at least ``min_bytes`` (default: the
    command's :data:`DECAY_NOW_FROM`, else :data:`BIG_INPUT_BYTES`), :data:`DECAY_SHORT` for
    a command of :data:`DECAY_SHORT_COMMANDS`, else :data:`EAGER_LARGE`; :data:`DECAY_NOW` whenever an input is a torch.profiler trace (or a
    folder of them). None, and ``env`` untouched, when ``env`` has a jemalloc setting
    already, ``argv`` is empty or runs ``capture`` (the program it profiles would inherit it). Must run before polars is imported (jemalloc reads it once)."""
    env = os.environ if env is None else env
    if _VARIABLE in env or not argv or argv[0] in _RUNS_PROGRAMS:
        return None
    value = EAGER_LARGE
    if min_bytes is None:
        min_bytes = DECAY_NOW_FROM.get(argv[0], BIG_INPUT_BYTES)
    if any(_kineto(Path(arg)) for arg in argv[1:] if not arg.startswith("-")):
        # a torch.profiler trace is decoded in batches into staged columns: freed pages given back
        # at once keep its first open near 1.5 × the JSON's size (2.6 × with the default decay;
        # benchmarks/README.md, "Kineto open")
        env[_VARIABLE] = DECAY_NOW
        return DECAY_NOW
    if argv[0] in STEPPED_COMMANDS:
        total = sum(_size(Path(arg)) for arg in argv[1:] if not arg.startswith("-"))
        if total >= min_bytes:
            value = DECAY_NOW
    if value == EAGER_LARGE and argv[0] in DECAY_SHORT_COMMANDS:
        value = DECAY_SHORT
    env[_VARIABLE] = value
    return value


def map_large_blocks(env: Mapping[str, str] | None = None) -> bool:
    """Fix glibc's mmap threshold at :data:`MMAP_THRESHOLD` (``mallopt``) for this process;
    True when set. False, and nothing done, where ``MALLOC_MMAP_THRESHOLD_`` is in ``env``
    (default ``os.environ``: the user's own setting) or the C library is not glibc."""
    env = os.environ if env is None else env
    if "MALLOC_MMAP_THRESHOLD_" in env or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # musl and others have no mallopt
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
