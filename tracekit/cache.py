"""Where tracekit keeps files it can rebuild: exports of reports, column caches, widget assets."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any, BinaryIO

#: Version of the column cache's stored layout (part of each export's folder key). 4: the
#: columns of an export carrying an index are read in rowid order (``NOT INDEXED``); earlier
#: versions could cache a column in the index's order, which no longer lines up.
COLUMN_CACHE_FORMAT = "4"


def switched_off(variable: str) -> bool:
    """Whether the environment variable ``variable`` turns a feature that is on by default off:
    ``0``, ``off``, ``false`` or ``no`` (any case, blanks around)."""
    return os.environ.get(variable, "1").strip().lower() in ("0", "off", "false", "no")


def column_cache_enabled() -> bool:
    """False when ``TRACEKIT_COLUMN_CACHE`` is ``0``, ``off``, ``false`` or ``no``."""
    return not switched_off("TRACEKIT_COLUMN_CACHE")


def cache_dir() -> Path:
    """``$TRACEKIT_CACHE``, else ``$XDG_CACHE_HOME/tracekit``, else ``~/.cache/tracekit``."""
    if os.environ.get("TRACEKIT_CACHE"):
        return Path(os.environ["TRACEKIT_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tracekit"


# -- shared by the caches (standard library only: the CLI's cached-report path imports no polars)


def fingerprint(export: Path) -> str:
    """A cheap content fingerprint of a SQLite file: its 100-byte header (file change counter,
    page count), first page and last page (at most 128 KiB read)."""
    h = hashlib.blake2b(digest_size=16)
    with export.open("rb") as fh:
        head = fh.read(65536)
        h.update(head)
        size = os.fstat(fh.fileno()).st_size
        if size > 65536:
            fh.seek(max(size - 65536, 65536))
            h.update(fh.read(65536))
    return h.hexdigest()


def export_key(export: Path, salt: str = "") -> str:
    """A 24-hex-digit key of an export's identity and content: its resolved path, size,
    modification time (ns), inode, ``salt`` (a cache's format version) and :func:`fingerprint`
    (so an export rewritten in place with its size and mtime kept gets a new key too)."""
    st = export.stat()
    identity = f"{export.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}|{salt}|{fingerprint(export)}"
    return hashlib.sha256(identity.encode()).hexdigest()[:24]


def folder_state(root: Path) -> str:
    """``"ok"``, ``"unwritable"`` (cannot be created: caching is skipped quietly) or
    ``"foreign"`` (owned by another user: a shared or planted folder is never used)."""
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = root.stat()
    except OSError:
        return "unwritable"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return "foreign"
    return "ok"


def _hasher(algo: str | None) -> tuple[Any, str] | None:
    """A streaming hasher and its prefix: ``algo`` ``"xxh3"`` or ``"b2"``, or None for xxh3
    where the xxhash package is installed, else b2; None when xxh3 is asked for without it."""
    if algo != "b2":
        try:
            import xxhash
        except ImportError:
            if algo == "xxh3":
                return None
        else:
            return xxhash.xxh3_128(), "xxh3:"
    return hashlib.blake2b(digest_size=16), "b2:"


def checksum_file(fh: BinaryIO, chunk: int = 1 << 20, *, algo: str | None = None) -> str:
    """:func:`checksum` of the rest of an open binary file, read ``chunk`` bytes at a time
    into one reused buffer (no copy of the whole file in memory). ``algo``: ``"xxh3"`` or
    ``"b2"`` (default: xxh3 where the xxhash package is installed, else b2); ``""`` when
    xxh3 is asked for and cannot be computed here (it then matches no stored checksum)."""
    hasher = _hasher(algo)
    if hasher is None:
        return ""
    h, prefix = hasher
    buf = bytearray(chunk)
    view = memoryview(buf)
    while True:
        n = fh.readinto(buf)  # type: ignore[attr-defined]
        if not n:
            break
        h.update(view[:n])
    return prefix + h.hexdigest()


def verify_file(fh: BinaryIO, expected: str) -> bool:
    """Whether the rest of the open file ``fh`` has the checksum ``expected`` (``algo:hex``,
    as :func:`checksum` gives), read a chunk at a time."""
    algo, _, _ = expected.partition(":")
    if algo not in ("xxh3", "b2"):
        return False
    return checksum_file(fh, algo=algo) == expected


def checksum(data: bytes | memoryview) -> str:
    """``xxh3:<hex>`` (XXH3-128) or, without the xxhash package, ``b2:<hex>`` (BLAKE2b-128)."""
    hasher = _hasher(None)
    assert hasher is not None  # None only when xxh3 is asked for by name
    h, prefix = hasher
    h.update(data)
    return prefix + h.hexdigest()


def verify(data: bytes | memoryview, expected: str) -> bool:
    """Whether ``data`` has the checksum ``expected`` (``algo:hex``, as :func:`checksum`
    gives); False for an unknown algorithm, or xxh3 without the xxhash package."""
    algo, _, _ = expected.partition(":")
    hasher = _hasher(algo) if algo in ("xxh3", "b2") else None
    if hasher is None:
        return False
    h, prefix = hasher
    h.update(data)
    return prefix + h.hexdigest() == expected


def write_atomic(path: Path, data: bytes | memoryview, tmp_names: list[str]) -> None:
    """``data`` to ``path`` through a fresh ``mkstemp`` name in its folder (O_EXCL: a name
    planted there, symlink or not, is never opened), then a rename."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp_names.append(name)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(name, path)
    tmp_names.remove(name)
