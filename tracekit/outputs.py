"""Writing a user's output file (a report, a CSV) under its final name only once it is whole.

Standard library only, so the CLI can use it before the heavy imports.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from tracekit.errors import TracekitError


def write_output(path: Path, write: Callable[[BinaryIO], object], *, make_parents: bool = False) -> None:
    """Call ``write(file)`` on a fresh temporary file in ``path``'s folder (``mkstemp``), give
    it the permissions a new file gets (umask; ``mkstemp`` makes 0600), then rename it to
    ``path``: an interrupted run never leaves a half-written file under the final name.

    ``make_parents`` creates a missing folder first. An OS error (a full disk, a folder of that
    name, no permission) is one :class:`TracekitError`; the temporary file is removed.
    """
    try:
        if make_parents:
            path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        msg = f"cannot write {path}: {exc.strerror or exc}"
        raise TracekitError(msg) from exc
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            msg = f"cannot write {path}: {exc.strerror or exc}"
            raise TracekitError(msg) from exc
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
