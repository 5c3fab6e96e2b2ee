"""``TracePicker``: choose a trace file in a folder from a notebook; the last one is remembered.

A folder box, a list of its sub-folders and trace files (Nsight Systems ``.sqlite`` /
``.nsys-rep`` / ``.qdrep``, Nsight Compute ``.ncu-rep``, torch.profiler ``.pt.trace.json(.gz)``)
with their sizes, and the path picked (trait ``value``). The last trace picked in any notebook
is kept in ``~/.cache/tracekit/last_trace.json`` (:func:`last_trace`), so a notebook opened
again starts from it.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracekit.viz._deps import import_ipywidgets

widgets = import_ipywidgets()
import traitlets  # noqa: E402

#: File names the picker lists (what :func:`tracekit.open` reads).
TRACE_SUFFIXES: tuple[str, ...] = (".sqlite", ".nsys-rep", ".qdrep", ".ncu-rep", ".pt.trace.json", ".pt.trace.json.gz")
_UP = ".."


def _memory_file() -> Path:
    from tracekit.cache import cache_dir

    return cache_dir() / "last_trace.json"


def last_trace() -> Path | None:
    """The trace last picked with a :class:`TracePicker` (``None`` when none was, or when it
    no longer exists)."""
    try:
        data = json.loads(_memory_file().read_text(encoding="utf-8"))
        path = Path(str(data["path"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return path if path.is_file() else None


def remember(path: str | Path) -> None:
    """Keep ``path`` as the last trace (a read-only home is fine: nothing is kept)."""
    target = _memory_file()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"path": str(Path(path).resolve())}), encoding="utf-8")
        tmp.replace(target)
    except OSError:
        pass


def is_trace(path: Path) -> bool:
    """Whether the picker lists ``path`` as a trace."""
    name = path.name.lower()
    return path.is_file() and name.endswith(TRACE_SUFFIXES)


def _size(path: Path) -> str:
    try:
        n = float(path.stat().st_size)
    except OSError:
        return "?"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


class TracePicker(widgets.VBox):  # type: ignore[misc,name-defined]
    """Pick a trace file in a folder.

    Parameters
    ----------
    folder
        Where to start (default: the folder of ``value``, else of the last trace picked, else
        the current folder).
    value
        A trace to start with; ``""``: the last trace picked (:func:`last_trace`), if any.
    on_pick
        Called with the path each time a trace is picked.

    The trait ``value`` is the path picked (a string, ``""`` for none); ``folder`` the folder
    listed. Picking a folder in the list opens it; picking a file sets ``value`` and
    remembers it.
    """

    value = traitlets.Unicode("")
    folder = traitlets.Unicode("")

    def __init__(self, folder: str | Path = "", value: str | Path = "", *,
                 on_pick: Callable[[str], None] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._callbacks: list[Callable[[str], None]] = [on_pick] if on_pick else []
        self._listing = False
        start = Path(value) if value else last_trace()
        if folder:
            where = Path(folder)
        elif start is not None:
            where = start.parent
        else:
            where = Path.cwd()
        w = widgets
        self.folder_box = w.Text(description="folder", layout=w.Layout(width="70%"), continuous_update=False)
        self.up_button = w.Button(description="up", icon="arrow-up", tooltip="the folder above",
                                  layout=w.Layout(width="auto"))
        self.refresh_button = w.Button(description="refresh", icon="refresh", layout=w.Layout(width="auto"))
        self.listing = w.Select(options=[], rows=8, layout=w.Layout(width="95%"))
        self.status = w.HTML()
        self.up_button.on_click(lambda _b: self._go(Path(self.folder).parent))
        self.refresh_button.on_click(lambda _b: self._list())
        self.folder_box.observe(lambda c: self._go(Path(c["new"]).expanduser()), names="value")
        self.listing.observe(self._on_select, names="value")
        self.children = (w.HBox([self.folder_box, self.up_button, self.refresh_button]), self.listing, self.status)
        self._go(where)
        if start is not None and start.is_file():
            self.pick(start, remember_it=False)  # a notebook's parameter is not a pick
        else:
            self._show_status()

    # -- public -------------------------------------------------------------------------------------
    def on_pick(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(path)`` each time a trace is picked."""
        self._callbacks.append(callback)

    def pick(self, path: str | Path, *, remember_it: bool = True) -> None:
        """Pick ``path`` (as a click on it does): set ``value``, remember it (unless
        ``remember_it`` is false), run the callbacks."""
        p = Path(path).expanduser()
        if not p.is_file():
            self.status.value = f"<i>{html.escape(str(p))} is not a file</i>"
            return
        if p.parent.resolve() != Path(self.folder).resolve():
            self._go(p.parent)
        if remember_it:
            remember(p)
        self.value = str(p)
        self._listing = True
        try:
            if p.name in [v for _, v in self.listing.options]:
                self.listing.value = p.name
        finally:
            self._listing = False
        self._show_status()
        if remember_it:  # the start value is not news for the callbacks
            for callback in self._callbacks:
                callback(self.value)

    def traces(self) -> list[Path]:
        """The trace files of the folder listed."""
        try:
            return sorted(p for p in Path(self.folder).iterdir() if is_trace(p))
        except OSError:
            return []

    # -- internals -----------------------------------------------------------------------------------
    def _go(self, folder: Path) -> None:
        if not folder.is_dir():
            self.status.value = f"<i>{html.escape(str(folder))} is not a folder</i>"
            return
        self.folder = str(folder)
        self._list()

    def _list(self) -> None:
        folder = Path(self.folder)
        self._listing = True
        try:
            if self.folder_box.value != self.folder:
                self.folder_box.value = self.folder
            try:
                entries = sorted(folder.iterdir(), key=lambda p: (not p.is_dir(), p.name.lower()))
            except OSError as exc:
                entries = []
                self.status.value = f"<i>cannot list {html.escape(str(folder))}: {html.escape(exc.strerror or str(exc))}</i>"
            options: list[tuple[str, str]] = [("▲ .. (the folder above)", _UP)]
            for p in entries:
                if p.name.startswith("."):
                    continue
                if p.is_dir():
                    options.append((f"▸ {p.name}/", p.name + "/"))
                elif is_trace(p):
                    options.append((f"{p.name}   ({_size(p)})", p.name))
            self.listing.options = options
            current = Path(self.value).name if self.value and Path(self.value).parent.resolve() == folder.resolve() else None
            self.listing.value = current if current in [v for _, v in options] else None
        finally:
            self._listing = False
        self._show_status()

    def _on_select(self, change: dict[str, Any]) -> None:
        if self._listing or change["new"] is None:
            return
        name = str(change["new"])
        if name == _UP:
            self._go(Path(self.folder).resolve().parent)
        elif name.endswith("/"):
            self._go(Path(self.folder) / name[:-1])
        else:
            self.pick(Path(self.folder) / name)

    def _show_status(self) -> None:
        n = len(self.traces())
        found = f"{n} trace{'s' if n != 1 else ''} here" if n else "no trace files here (.sqlite, .nsys-rep, .ncu-rep …)"
        picked = f"<b>{html.escape(self.value)}</b>" if self.value else "<i>none picked</i>"
        self.status.value = f"<small>{found} · trace: {picked}</small>"
