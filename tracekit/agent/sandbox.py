"""What the MCP server may touch: files under its roots, opened without writing beside them,
and SQL that can only read.

* :class:`Roots` resolves a path the agent gives (symlinks followed, ``..`` collapsed) and
  refuses it unless it lies under one of the folders the server was started with.
* :func:`readable` turns such a path into what :func:`tracekit.open` may read without writing
  anything in the root: a ``.sqlite`` export (refused when a non-empty ``-wal`` file beside it
  would make SQLite create ``-shm`` there), an nsys ``parquetdir``/``arrowdir`` folder, an
  Nsight Compute report, a ``.nsys-rep`` through its export (the one beside it when it is fresh,
  else one in :func:`tracekit.cache.cache_dir`, never beside it), or a folder of per-rank
  reports (each file checked the same way).
* :func:`check_select` accepts one ``SELECT``/``WITH`` statement and refuses anything that could
  write or read outside tracekit's tables (``COPY``, ``CREATE``, ``INSERT``, ``ATTACH``,
  ``PRAGMA``, polars' ``read_csv(...)``/``read_parquet(...)`` table functions …).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from tracekit.errors import TracekitError

__all__ = ["MAX_PATH_CHARS", "Roots", "check_select", "quoted", "readable", "table_names_in"]

#: Characters of a path this server takes (Linux's PATH_MAX).
MAX_PATH_CHARS = 4096
#: Characters of a path an error message quotes.
QUOTED_CHARS = 200


def quoted(text: str) -> str:
    """``text`` for an error message: cut to :data:`QUOTED_CHARS` characters with ``…``."""
    return text if len(text) <= QUOTED_CHARS else text[: QUOTED_CHARS - 1] + "…"


class Roots:
    """The folders the server may read (each resolved once, symlinks followed)."""

    def __init__(self, roots: Sequence[str | os.PathLike[str]]) -> None:
        if not roots:
            msg = "give at least one --root DIR: the folders whose traces the server may open"
            raise TracekitError(msg)
        resolved = []
        for r in roots:
            p = Path(r).expanduser().resolve()
            if not p.is_dir():
                msg = f"--root {r}: not a folder; give folders that hold traces"
                raise TracekitError(msg)
            resolved.append(p)
        self.paths: tuple[Path, ...] = tuple(dict.fromkeys(resolved))

    def __repr__(self) -> str:
        return f"Roots({', '.join(map(str, self.paths))})"

    def contains(self, path: Path) -> bool:
        """Whether the resolved ``path`` is one of the roots or lies under one."""
        return any(path == r or path.is_relative_to(r) for r in self.paths)

    def resolve(self, path: str | os.PathLike[str], *, what: str = "path") -> Path:
        """``path`` resolved (a relative path is taken under the first root where it exists,
        else under the first root); raises one line when it is outside every root."""
        text = os.fspath(path)
        if "\x00" in text:
            msg = f"{what}: a path cannot hold a NUL character; give the path of a trace under {self.names()}"
            raise TracekitError(msg)
        if not text.strip():
            msg = f"{what}: give the path of a trace under {self.names()}"
            raise TracekitError(msg)
        if len(text) > MAX_PATH_CHARS:
            msg = f"{what} {quoted(text)}: a path of {len(text):,} characters; give one of at most {MAX_PATH_CHARS}"
            raise TracekitError(msg)
        try:
            p = Path(text).expanduser()
            if not p.is_absolute():
                p = next((r / p for r in self.paths if os.path.lexists(r / p)), self.paths[0] / p)
            resolved = p.resolve()
            resolved.exists()  # a name too long for the file system fails here, in one line
        except RuntimeError as exc:  # Path.resolve: "Symlink loop from …"
            msg = f"{what} {quoted(text)}: {exc}; give the path of a trace, not a link that leads back to itself"
            raise TracekitError(msg) from None
        except OSError as exc:
            msg = f"{what} {quoted(text)}: {exc.strerror or exc}; give the path of a trace under {self.names()}"
            raise TracekitError(msg) from None
        if not self.contains(resolved):
            msg = (f"{quoted(text)} is outside the folders this server may read ({self.names()}); give a path under them, "
                   "or restart the server with another --root")
            raise TracekitError(msg)
        return resolved

    def names(self) -> str:
        """The roots, comma-separated (for messages)."""
        return ", ".join(str(r) for r in self.paths)


def readable(path: Path, roots: Roots) -> Path | list[Path]:
    """What tracekit may open for the resolved ``path`` without writing next to it: the path
    itself, the export of a ``.nsys-rep`` (see the module doc), or for a folder of per-rank
    reports the list of their readable files. Raises one line (a
    :class:`~tracekit.errors.TracekitError`) for a missing, damaged or unreadable file, as
    :func:`tracekit.open` would."""
    from tracekit.opening import sniff

    if path.is_dir():
        from tracekit.nsys.columnar import folder_format

        if folder_format(path) is None:
            return _rank_files(path, roots)
        for member in path.iterdir():  # a parquetdir/arrowdir whose table files link out of the roots
            if not roots.contains(member.resolve()):
                msg = f"{member} links outside the folders this server may read ({roots.names()}); give an export without such links"
                raise TracekitError(msg)
    kind = sniff(path)  # the CLI's one-line errors: missing, empty, not a trace, unreadable
    if kind == "nsys-sqlite":
        _refuse_pending_wal(path)
        return path
    if kind == "nsys-report":
        return _export_of(path, roots)
    return path


def _rank_files(folder: Path, roots: Roots) -> list[Path]:
    """The reports :func:`tracekit.open_many` would read in ``folder``, each made readable."""
    from tracekit.multi import _resolve

    out: list[Path] = []
    for f in _resolve(folder):  # TraceNotFoundError (one line) when the folder holds none
        real = f.resolve()
        if not roots.contains(real):  # a symlink inside the root that points out of it
            msg = f"{f} links outside the folders this server may read ({roots.names()}); give a folder without such links"
            raise TracekitError(msg)
        got = readable(real, roots)
        out.extend(got if isinstance(got, list) else [got])
    return out


def _refuse_pending_wal(path: Path) -> None:
    from tracekit.nsys.database import _beside

    wal = _beside(path, "-wal")
    if wal is not None:
        msg = (f"{wal.name} holds committed rows not yet in {path.name}; reading them could make SQLite create "
               f"{path.name}-shm beside it, and this server never writes there: checkpoint it first "
               f"(sqlite3 {path.name} 'PRAGMA wal_checkpoint') or open it with tracekit directly")
        raise TracekitError(msg)


def _export_of(report: Path, roots: Roots) -> Path:
    """The SQLite export of ``report`` without writing beside it: the export beside it when it
    is fresh (made by tracekit, or by hand and newer than the report: what
    :func:`tracekit.nsys.export.export_report` reads too), else the one in the cache folder,
    made there with an nsys found on this machine when missing or stale."""
    from tracekit.nsys.export import _is_fresh, cached_export_path, export_with, no_nsys
    from tracekit.tools import find_tool

    beside = report.with_suffix(".sqlite")
    stamp = beside.with_name(beside.name + ".tracekit.json")  # read by _is_fresh: checked before it is
    for near in (beside, stamp):
        if near.is_symlink() and not roots.contains(near.resolve()):
            msg = f"{near} links outside the folders this server may read ({roots.names()}); give a report without such a link"
            raise TracekitError(msg)
    if beside.is_file() and _is_fresh(beside, report):
        real = beside.resolve()  # the export beside it may be a link out of the roots
        if not roots.contains(real):
            msg = f"{beside} links outside the folders this server may read ({roots.names()}); give a report without such a link"
            raise TracekitError(msg)
        _refuse_pending_wal(real)
        return real
    target = cached_export_path(report)
    if _is_fresh(target, report):
        return target
    tool = find_tool("nsys", required=False)
    if tool is None:
        raise no_nsys(report)
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # nsys runs in the worker's process group: the server's deadline kills it with the worker
    return export_with(tool, report, target)


# -- SQL ---------------------------------------------------------------------------------------

#: Words that only a statement that writes, changes the session or reaches outside the
#: registered tables uses; refused anywhere in the query (as bare words: quoted identifiers
#: and string literals are left out of the check).
FORBIDDEN = frozenset({
    "insert", "update", "delete", "drop", "create", "alter", "attach", "detach", "copy", "pragma", "truncate",
    "grant", "revoke", "vacuum", "merge", "load", "install", "call", "execute", "exec", "set", "into", "begin",
    "commit", "rollback", "savepoint", "release", "import", "export", "upsert", "reindex", "analyze", "checkpoint",
})
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*|;|\S")
#: polars' SQL table functions that read files (read_csv, read_parquet, read_ipc, read_json,
#: and any scan_*/read_* to come), as a word anywhere in the text.
_FILE_FUNCTION = re.compile(r"(?i)(?<![A-Za-z0-9_])(?:read|scan)_[A-Za-z0-9_]*")


def _strip(sql: str) -> tuple[str, list[str]]:
    """``sql`` with comments and string literals blanked and quoted identifiers replaced by a
    placeholder; the quoted identifiers' texts."""
    out: list[str] = []
    quoted: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if sql.startswith("--", i):
            j = sql.find("\n", i)
            i = n if j < 0 else j
            out.append(" ")
        elif sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            if j < 0:
                raise TracekitError("query: a /* comment is never closed")
            if "/*" in sql[i + 2 : j]:  # polars nests block comments; this checker would not
                raise TracekitError("query: a /* comment inside a /* comment is refused here")
            i = j + 2
            out.append(" ")
        elif c in "'\"`":
            j = i + 1
            text = []
            while True:
                if j >= n:
                    raise TracekitError(f"query: a {c} quote is never closed")
                if sql[j] == c:
                    if j + 1 < n and sql[j + 1] == c:  # doubled quote inside
                        text.append(c)
                        j += 2
                        continue
                    break
                text.append(sql[j])
                j += 1
            if c == "'":
                out.append(" '' ")
            else:
                quoted.append("".join(text))
                out.append(" _quoted_identifier_ ")
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out), quoted


def check_select(sql: str) -> str:
    """``sql`` when it is one read-only query (``SELECT`` or ``WITH … SELECT``; one trailing
    ``;`` allowed); else a :class:`~tracekit.errors.TracekitError` whose one line says why.

    Refused: any other statement, several statements, the words in :data:`FORBIDDEN` outside
    quotes (``COPY``, ``CREATE``, ``INSERT``, ``ATTACH``, ``PRAGMA``, ``SELECT … INTO`` …) and
    polars' file-reading table functions (``read_csv``, ``read_parquet``, ``read_ipc``,
    ``read_json``, any ``read_*``/``scan_*`` name)."""
    if not isinstance(sql, str) or not sql.strip():
        raise TracekitError("query: give one SELECT statement, e.g. SELECT name, count(*) FROM kernels GROUP BY name")
    # the raw text first, comments and strings included: this checker's reading of comments and
    # quotes need not be polars' ($$-quoted strings, nested /* */ comments), so a file-reading
    # function is refused wherever its name appears (a kernel name holding "thread_" is not one)
    reader = _FILE_FUNCTION.search(sql)
    if reader:
        msg = f"query: {reader.group(0)} is refused: queries read tracekit's tables only (kernels, cuda_api, nvtx …), not files"
        raise TracekitError(msg)
    if "$" in sql:
        raise TracekitError("query: '$' (dollar-quoted strings, parameters) is refused here; quote strings with '...'")
    stripped, quoted = _strip(sql)
    for name in quoted:  # polars calls "read_csv"('/etc/passwd') as it calls read_csv(...)
        if name.lower().startswith(("read_", "scan_")):
            msg = f"query: {name} is refused: queries read tracekit's tables only (kernels, cuda_api, nvtx …), not files"
            raise TracekitError(msg)
    tokens = _TOKEN.findall(stripped)
    while tokens and tokens[-1] == ";":
        tokens.pop()
    if not tokens:
        raise TracekitError("query: give one SELECT statement, e.g. SELECT name, count(*) FROM kernels GROUP BY name")
    first = tokens[0].lower()
    if first not in ("select", "with") and tokens[0] != "(":
        msg = f"query: only a read-only SELECT (or WITH … SELECT) is run here, not {tokens[0].upper()}"
        raise TracekitError(msg)
    if ";" in tokens:
        raise TracekitError("query: give one statement (no ';' between statements)")
    for t in tokens:
        low = t.lower()
        if low in FORBIDDEN:
            msg = f"query: {t.upper()} is refused: only read-only SELECT queries over tracekit's tables are run here"
            raise TracekitError(msg)
        if low.startswith(("read_", "scan_")):
            msg = f"query: {t} is refused: queries read tracekit's tables only (kernels, cuda_api, nvtx …), not files"
            raise TracekitError(msg)
    return sql.strip().rstrip(";").strip()


def table_names_in(sql: str, known: Sequence[str]) -> list[str]:
    """The names of ``known`` that ``sql`` mentions as a bare or quoted identifier (the tables
    to register before running it)."""
    stripped, quoted = _strip(sql)
    words = {t.lower() for t in _TOKEN.findall(stripped)} | {q.lower() for q in quoted}
    return [k for k in known if k.lower() in words]
