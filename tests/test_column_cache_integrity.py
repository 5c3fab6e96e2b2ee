"""The column cache never serves numbers the export does not hold: checksums, content
fingerprints, safe temporary files, an owner check, and a size limit that parses strictly."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tracekit.errors import TracekitError
from tracekit.nsys import database
from tracekit.nsys.column_cache import CacheIntegrityWarning, max_bytes

from .conftest import SAMPLES
from .test_nsys_fast_paths import _trace

DECODE = SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(database, "PARALLEL_MIN_ROWS", 2)
    monkeypatch.setattr(database, "CACHE_MIN_ROWS", 2)
    root = tmp_path / "cache"
    monkeypatch.setenv("TRACEKIT_CACHE", str(root))
    return root


def _kernel_files(root: Path) -> list[Path]:
    return sorted(root.rglob("CUPTI_ACTIVITY_KIND_KERNEL.*.arrow"))


def test_a_flipped_byte_in_a_cached_column_is_caught(cache: Path) -> None:
    """One byte flipped in the data of a cached column (the duration a report prints) made every
    later run report other kernel times, silently: the checksum now catches it."""
    expected = _trace(DECODE, column_cache=False).kernels
    _ = _trace(DECODE).kernels  # fills the cache
    files = _kernel_files(cache)
    assert files
    for f in files:  # flip one byte in the middle of each column's data
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0x40
        f.write_bytes(bytes(data))
    with pytest.warns(CacheIntegrityWarning, match="failed its checksum"):
        again = _trace(DECODE).kernels
    assert again.equals(expected, null_equal=True)
    assert _trace(DECODE).kernels.equals(expected, null_equal=True)  # rebuilt, no warning now


def test_a_broken_footer_is_caught_not_a_panic(cache: Path) -> None:
    """A flipped byte in the Arrow footer made polars panic (a BaseException) on every open."""
    _ = _trace(DECODE).kernels
    for f in _kernel_files(cache):
        data = bytearray(f.read_bytes())
        data[-12] ^= 0xFF
        f.write_bytes(bytes(data))
        f.with_name(f.name + ".b2").unlink()  # no checksum to catch it first: the reader must
    expected = _trace(DECODE, column_cache=False).kernels
    assert _trace(DECODE).kernels.equals(expected, null_equal=True)


def test_an_export_rewritten_in_place_gets_a_new_key(cache: Path, tmp_path: Path) -> None:
    """cp -p / rsync -t --inplace keep size and mtime: the content fingerprint (SQLite's file
    change counter, first and last pages) tells the new content from the old."""
    copy = tmp_path / "t.sqlite"
    shutil.copyfile(DECODE, copy)
    old = _trace(copy)
    before = old.kernels
    key = old.db.column_cache.key  # type: ignore[union-attr]
    st = copy.stat()
    con = sqlite3.connect(copy)
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = end + 1000")
    con.commit()
    con.close()
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert copy.stat().st_size == st.st_size and copy.stat().st_mtime_ns == st.st_mtime_ns
    new = _trace(copy)
    assert new.db.column_cache.key != key  # type: ignore[union-attr]
    assert (new.kernels["duration_ns"] - before["duration_ns"] == 1000).all()


def test_temporary_files_never_follow_a_planted_symlink(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The old writer opened the predictable <column>.arrow.<pid>.tmp: a symlink planted under
    that name made it write through the link. Names now come from mkstemp (O_EXCL), folders are
    0700: the planted links are never opened."""
    first = _trace(DECODE)
    _ = first.kernels  # learn the column file names in one cache …
    names = [p.name for p in _kernel_files(cache)]
    key = first.db.column_cache.key  # type: ignore[union-attr]
    other = tmp_path / "other"
    monkeypatch.setenv("TRACEKIT_CACHE", str(other))
    folder = other / "columns" / key
    folder.mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    for name in names:  # … and plant the old temporary names as links in another
        (folder / f"{name}.{os.getpid()}.tmp").symlink_to(victim)
    assert _trace(DECODE).kernels.height > 0
    assert victim.read_text() == "precious"
    assert len(_kernel_files(other)) == len(names)
    assert (cache / "columns").stat().st_mode & 0o777 == 0o700  # a folder tracekit made


def test_a_cache_folder_of_another_user_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to give the folder to another user")
    monkeypatch.setattr(database, "CACHE_MIN_ROWS", 2)
    root = tmp_path / "shared"
    (root / "columns").mkdir(parents=True)
    os.chown(root / "columns", 12345, 12345)
    monkeypatch.setenv("TRACEKIT_CACHE", str(root))
    with pytest.warns(CacheIntegrityWarning, match="belongs to another user"):
        t = _trace(DECODE)
    assert t.kernels.height > 0 and not list((root / "columns").iterdir())


@pytest.mark.parametrize(("value", "expected"), [("inf", 2**63 - 1), ("none", 2**63 - 1), ("1e400", 2**63 - 1), ("2.5", 2_500_000_000), ("", 5_000_000_000)])
def test_size_limit_values(value: str, expected: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEKIT_COLUMN_CACHE_MAX_GB", value)
    assert max_bytes() == expected


@pytest.mark.parametrize("value", ["nan", "-1", "lots"])
def test_size_limit_nonsense_is_one_line(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEKIT_COLUMN_CACHE_MAX_GB", value)
    with pytest.raises(TracekitError, match="TRACEKIT_COLUMN_CACHE_MAX_GB"):
        max_bytes()
    r = subprocess.run([sys.executable, "-m", "tracekit.cli.main", "summary", "--findings", "0", str(DECODE)],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "TRACEKIT_COLUMN_CACHE_MAX_GB": value})
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "TRACEKIT_COLUMN_CACHE_MAX_GB" in r.stderr


def test_the_checksum_written_beside_a_column_is_that_of_its_file(cache: Path) -> None:
    """Columns are written by polars straight into their temporary file and checksummed from
    it, a chunk at a time: the sum beside each file equals the sum of the file's bytes (with
    chunks smaller than the file, as for a large column), and no temporary file is left."""
    from tracekit.cache import checksum, checksum_file

    assert _trace(DECODE).kernels.height > 0
    files = _kernel_files(cache)
    assert len(files) > 10
    for file in files:
        expected = Path(f"{file}.b2").read_text().strip()
        assert checksum(file.read_bytes()) == expected
        with file.open("rb") as fh:
            assert checksum_file(fh, chunk=4096) == expected
    assert not list(cache.rglob("*.tmp"))


def test_a_column_checksummed_with_blake2_still_verifies(cache: Path) -> None:
    """A cache written where the xxhash package was missing carries BLAKE2b sums (``b2:``):
    a later run with xxhash verifies them by their own algorithm and reads the columns without
    a warning, while a wrong sum of either kind fails."""
    import hashlib
    import warnings

    from tracekit.cache import verify

    expected = _trace(DECODE, column_cache=False).kernels
    _ = _trace(DECODE).kernels
    files = _kernel_files(cache)
    for file in files:
        Path(f"{file}.b2").write_text("b2:" + hashlib.blake2b(file.read_bytes(), digest_size=16).hexdigest())
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheIntegrityWarning)
        assert _trace(DECODE).kernels.equals(expected, null_equal=True)
    data = files[0].read_bytes()
    assert not verify(data, "b2:" + "0" * 32)
    assert not verify(data, "xxh3:" + "0" * 32)
    assert not verify(data, "md5:whatever")
    from tracekit.cache import verify_file

    for wrong in ("b2:" + "0" * 32, "xxh3:" + "0" * 32, "md5:whatever"):
        with files[0].open("rb") as fh:
            assert not verify_file(fh, wrong)


def test_a_column_is_read_from_the_file_it_verified(tmp_path: Path) -> None:
    """The cache checksums a file and reads it through the same descriptor: another process
    renaming a different file over the name in between changes nothing read (cache files are
    replaced by rename only)."""
    import polars as pl

    from tracekit.cache import checksum_file, verify_file
    from tracekit.nsys.column_cache import _read_verified

    first, second = tmp_path / "col.arrow", tmp_path / "other.arrow"
    pl.DataFrame({"x": [1, 2, 3]}).write_ipc(first)
    pl.DataFrame({"x": [7, 8, 9, 10]}).write_ipc(second)
    with first.open("rb") as fh:
        expected = checksum_file(fh)
    with first.open("rb") as fh:
        assert verify_file(fh, expected)
        os.replace(second, first)  # a fresh copy renamed over the name, mid-read
        assert _read_verified(fh)["x"].to_list() == [1, 2, 3]
    assert pl.read_ipc(first)["x"].to_list() == [7, 8, 9, 10]


def test_a_descriptor_number_reused_reads_the_new_file(tmp_path: Path) -> None:
    """Closed descriptors are reused, so ``/proc/self/fd/N`` names another file on the next
    read: nothing read before under that name may come back (no reader cache keyed by path)."""
    import polars as pl

    from tracekit.nsys.column_cache import _read_verified

    files = []
    for i, values in enumerate(([1, 2, 3], [4.5, 5.5], ["a", "b", "c", "d"])):
        files.append(tmp_path / f"c{i}.arrow")
        pl.DataFrame({"x": values}).write_ipc(files[-1])
    numbers = set()
    for f, values in zip(files, ([1, 2, 3], [4.5, 5.5], ["a", "b", "c", "d"]), strict=True):
        with f.open("rb") as fh:
            numbers.add(fh.fileno())
            assert _read_verified(fh)["x"].to_list() == values
    assert len(numbers) == 1  # the same descriptor number each time: the case this guards


def test_with_little_memory_left_a_column_is_read_into_memory_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """polars' read of a mapped file aborted under a tight address-space limit where the read
    from memory fitted (tests/test_out_of_memory.py); with less than twice the file plus
    DESCRIPTOR_READ_SLACK left the cache reads the file into memory, with room through its
    descriptor — the same column either way."""
    import polars as pl

    from tracekit.nsys import column_cache as cc

    export = tmp_path / "x.sqlite"
    export.write_bytes(b"not read")
    column = pl.Series("x", range(100_000), dtype=pl.Int64)
    ways: list[bool] = []
    real = cc._read_verified

    def spy(fh, *, by_descriptor: bool = True):  # noqa: ANN001, ANN202
        ways.append(by_descriptor)
        return real(fh, by_descriptor=by_descriptor)

    monkeypatch.setattr(cc, "_read_verified", spy)
    for free, expected in ((1 << 40, True), (cc.DESCRIPTOR_READ_SLACK, False), (None, True)):
        cache = cc.ColumnCache(export, root=tmp_path / "cache", free_memory=lambda free=free: free)
        cache.put("T", '"x"', column)
        got = cache.get("T", '"x"')
        assert got is not None and got.equals(column)
        assert ways[-1] is expected
