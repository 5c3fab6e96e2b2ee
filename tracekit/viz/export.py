"""Figures to files through vl-convert (no browser, no network) and charts to offline HTML.

:func:`save` writes SVG, PDF or PNG with the paper theme, at a column or page width, with the
bundled font. The output is byte-stable: the same chart gives the same bytes, run after run
(vl-convert's PDF writer orders embedded fonts at random; :func:`canonical_pdf` renumbers the
objects in a fixed order).
"""

from __future__ import annotations

import copy
import json
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from tracekit.viz._deps import import_altair, import_vl_convert
from tracekit.viz.theme import (
    PAPER_THEME,
    SCREEN_THEME,
    paper_config,
    register_fonts,
    register_themes,
    screen_config,
    width_pt,
)

FORMATS = ("svg", "pdf", "png")


def _vl_version() -> str:
    alt = import_altair()
    major, minor = alt.SCHEMA_VERSION.lstrip("v").split(".")[:2]
    return f"v{major}_{minor}"


def _is_single_view(spec: dict[str, Any]) -> bool:
    return not any(k in spec for k in ("facet", "hconcat", "vconcat", "concat", "repeat"))


def chart_spec(
    chart: Any,
    *,
    theme: str = PAPER_THEME,
    width: str | float | None = None,
    height: float | None = None,
) -> dict[str, Any]:
    """The Vega-Lite spec of ``chart`` with a theme's config applied and, optionally, a size.

    ``width`` is the figure's total width in points (or ``"column"`` / ``"double"``): single
    views and layers are fitted to it, axes and legend included (Vega-Lite ``autosize: fit``);
    faceted and concatenated charts get their panels scaled to share it.
    """
    register_themes()
    spec = copy.deepcopy(chart) if isinstance(chart, dict) else chart.to_dict(validate=True)
    base = (
        paper_config() if theme == PAPER_THEME else screen_config() if theme == SCREEN_THEME else {}
    )
    config = _merge(base, spec.get("config", {}))
    # vl-convert keeps the top-level "$schema"; the theme goes in as plain config
    spec["config"] = config
    if width is not None:
        total = width_pt(width)
        legend = config.setdefault("legend", {})
        if legend.get("orient") == "bottom":
            # as many legend columns as fit the figure: a label past its right edge is lost
            limit = float(legend.get("labelLimit", 120))
            legend["columns"] = max(1, min(int(legend.get("columns", 3)), int(total // (limit + 30))))
        if _is_single_view(spec):
            spec["width"] = total
            spec["autosize"] = {"type": "fit-x" if height is None else "fit", "contains": "padding"}
            if height is not None:
                spec["height"] = height
            elif "height" not in spec or not isinstance(spec.get("height"), int | float):
                spec["height"] = round(total * 0.55)
        else:
            _scale_panels(spec, total, height)
    return spec


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _scale_panels(spec: dict[str, Any], total: float, height: float | None) -> None:
    # Leave room for axis labels and a legend; the panels share what is left.
    usable = max(total - 90.0, 60.0)
    if "facet" in spec and "spec" in spec:
        columns = spec.get("columns") or 1
        inner = spec["spec"]
        inner["width"] = usable / columns
        if height is not None:
            inner["height"] = height
    for key in ("hconcat", "vconcat", "concat"):
        if key in spec:
            parts = spec[key]
            share = usable / len(parts) if key == "hconcat" else usable
            for part in parts:
                if isinstance(part, dict) and _is_single_view(part):
                    part["width"] = share


def to_bytes(
    chart: Any,
    format: str,  # noqa: A002 - mirrors the file suffix
    *,
    width: str | float | None = "column",
    height: float | None = None,
    theme: str = PAPER_THEME,
    scale: float = 2.0,
) -> bytes:
    """Render ``chart`` to SVG, PDF or PNG bytes (see :func:`save`)."""
    fmt = format.lower().lstrip(".")
    if fmt not in FORMATS:
        msg = f"unknown figure format {format!r}; use one of {', '.join(FORMATS)}"
        raise ValueError(msg)
    vlc = import_vl_convert()
    register_fonts()
    spec = chart_spec(chart, theme=theme, width=width, height=height)
    version = _vl_version()
    if fmt == "svg":
        return str(vlc.vegalite_to_svg(spec, vl_version=version)).encode()
    if fmt == "png":
        return bytes(vlc.vegalite_to_png(spec, vl_version=version, scale=scale))
    return canonical_pdf(bytes(vlc.vegalite_to_pdf(spec, vl_version=version)))


def save(
    chart: Any,
    path: str | Path,
    *,
    width: str | float | None = "column",
    height: float | None = None,
    theme: str = PAPER_THEME,
    scale: float = 2.0,
) -> Path:
    """Write a figure for a paper: ``.svg``, ``.pdf`` or ``.png`` (from the suffix).

    Parameters
    ----------
    chart
        An altair chart (or a Vega-Lite spec as a dict).
    path
        The output file; its suffix picks the format.
    width
        ``"column"`` (241 pt, one column of a two-column paper), ``"double"`` (506 pt, the
        whole text width), a number of points, or ``None`` to keep the chart's own size.
    height
        Plot height in points (default: 0.55 × width for single views).
    theme
        ``"tracekit_paper"`` (9/10 pt Liberation Sans, colour-blind-safe palette) or
        ``"tracekit"``.
    scale
        Pixel density of PNG output (2 → 144 dpi at the given width in points).

    Returns
    -------
    The path written. PDFs embed the font subset; SVGs reference it by name
    (``Liberation Sans``, then Arial/Helvetica); output bytes depend only on the input.

    Examples
    --------
    >>> import tracekit.viz as tv
    >>> tv.save(tv.top_kernels_chart(trace.kernels, n=10), "fig_top.pdf", width="column")  # doctest: +SKIP
    """
    from tracekit.viz.notes import message_of

    missing = message_of(chart)
    if missing is not None:  # never an empty figure on disk
        from tracekit.errors import UnsupportedReportError

        msg = f"{Path(path).name} not written: {missing}"
        raise UnsupportedReportError(msg)
    path = Path(path)
    data = to_bytes(chart, path.suffix, width=width, height=height, theme=theme, scale=scale)
    path.parent.mkdir(parents=True, exist_ok=True)
    # through a temporary name in the same folder, then a rename: a figure a LaTeX build or a
    # viewer is reading is never seen half-written
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def save_figures(
    figures: Any,
    folder: str | Path,
    *,
    formats: tuple[str, ...] = ("pdf", "svg"),
    width: str | float | None = "column",
    theme: str = PAPER_THEME,
) -> Any:
    """Write several figures: ``figures`` maps a name to a chart or to ``(chart, width)``.

    A chart with no data (a message chart: what the trace lacks) is not written; its row says
    why. Returns a polars frame, one row per figure and format: ``figure``, ``file`` (null
    when not written), ``bytes`` and ``note``.
    """
    import polars as pl

    from tracekit.viz.notes import message_of

    folder = Path(folder)
    rows: list[dict[str, Any]] = []
    for name, item in figures.items():
        chart, w = item if isinstance(item, tuple) else (item, width)
        missing = message_of(chart)
        for fmt in formats:
            if missing is not None:
                rows.append({"figure": name, "file": None, "bytes": None, "note": f"not written: {missing}"})
                continue
            path = save(chart, folder / f"{name}.{fmt}", width=w, theme=theme)
            rows.append({"figure": name, "file": path.name, "bytes": path.stat().st_size, "note": ""})
    return pl.DataFrame(rows, schema={"figure": pl.Utf8, "file": pl.Utf8, "bytes": pl.Int64, "note": pl.Utf8})


# -- deterministic PDF -------------------------------------------------------------------------------
_OBJ = re.compile(rb"(\d+) 0 obj\n")
_REF = re.compile(rb"(\d+) 0 R\b")
_LENGTH = re.compile(rb"/Length (\d+)")


def _parse_pdf(pdf: bytes) -> tuple[dict[int, tuple[bytes, bytes | None]], bytes, bytes] | None:
    """Objects of an uncompressed-xref PDF as ``{num: (dict_text, stream_or_None)}``, header, trailer."""
    objects: dict[int, tuple[bytes, bytes | None]] = {}
    first = _OBJ.search(pdf)
    if first is None:
        return None
    header = pdf[: first.start()]
    pos = first.start()
    while True:
        m = _OBJ.match(pdf, pos)
        if m is None:
            break
        num = int(m.group(1))
        body_start = m.end()
        end_obj = pdf.find(b"\nendobj", body_start)
        stream_at = pdf.find(b"\nstream\n", body_start)
        if stream_at != -1 and stream_at < end_obj:
            text = pdf[body_start:stream_at]
            length = _LENGTH.search(text)
            if length is None:
                return None
            data_start = stream_at + len(b"\nstream\n")
            data = pdf[data_start : data_start + int(length.group(1))]
            tail = data_start + len(data)
            if not pdf.startswith(b"\nendstream\nendobj", tail):
                return None
            objects[num] = (text, data)
            pos = tail + len(b"\nendstream\nendobj")
        else:
            objects[num] = (pdf[body_start:end_obj], None)
            pos = end_obj + len(b"\nendobj")
        while pos < len(pdf) and pdf[pos : pos + 1] in (b"\n", b"\r", b" "):
            pos += 1
        if pdf.startswith(b"xref", pos):
            break
    trailer_at = pdf.find(b"trailer", pos)
    if trailer_at == -1:
        return None
    trailer = pdf[trailer_at : pdf.find(b"startxref", trailer_at)]
    return objects, header, trailer


_FONT_DICT = re.compile(rb"/Font <<\s*((?:/[A-Za-z0-9_.-]+ \d+ 0 R\s*)+)>>")
_FONT_ENTRY = re.compile(rb"/([A-Za-z0-9_.-]+) (\d+) 0 R")
_BASE_FONT = re.compile(rb"/BaseFont /(?:[A-Z]{6}\+)?([^\s/]+)")
_CONTENTS = re.compile(rb"/Contents (\d+) 0 R")


def _canonical_font_names(objects: dict[int, tuple[bytes, bytes | None]]) -> None:
    """Name each resource font after its sorted position (``fo0`` = first base font name).

    svg2pdf hands out ``/fo0``, ``/fo1`` … in hash-map order; the content streams that use
    them are rewritten with the same renaming.
    """
    import zlib

    for num, (text, data) in list(objects.items()):
        found = _FONT_DICT.search(text)
        if found is None:
            continue
        entries = [(m.group(1), int(m.group(2))) for m in _FONT_ENTRY.finditer(found.group(1))]

        def key(entry: tuple[bytes, int]) -> bytes:
            target = objects.get(entry[1], (b"", None))[0]
            base = _BASE_FONT.search(target)
            return base.group(1) if base else entry[0]

        ordered = sorted(entries, key=key)
        names = sorted(name for name, _ in entries)
        rename = {old: new for (old, _), new in zip(ordered, names, strict=True)}
        renamed = sorted((rename[name], ref) for name, ref in entries)
        body = b"".join(b"/%s %d 0 R\n      " % entry for entry in renamed)
        text = text[: found.start(1)] + body.rstrip() + b"\n    " + text[found.end(1) :]
        objects[num] = (text, data)
        if all(old == new for old, new in rename.items()):
            continue
        pattern = re.compile(
            rb"/(" + b"|".join(re.escape(n) for n in rename) + rb")(?![A-Za-z0-9_.-])"
        )
        targets = [num] if data is not None else [int(m.group(1)) for m in _CONTENTS.finditer(text)]
        for target in targets:
            t_text, t_data = objects[target]
            if t_data is None:
                continue
            flate = b"/FlateDecode" in t_text
            raw = zlib.decompress(t_data) if flate else t_data
            raw = pattern.sub(lambda m, table=rename: b"/" + table[m.group(1)], raw)  # type: ignore[misc]
            new_data = zlib.compress(raw, 6) if flate else raw
            t_text = _LENGTH.sub(b"/Length %d" % len(new_data), t_text, count=1)
            objects[target] = (t_text, new_data)


def canonical_pdf(pdf: bytes) -> bytes:
    """Renumber and reorder a vl-convert PDF's objects by a walk from its root.

    svg2pdf numbers the objects of embedded fonts in hash-map order, so the same figure can come
    out in different byte orders. Objects are renumbered in the order a depth-first walk from
    ``/Root`` then ``/Info`` first meets them, written in that order, and the cross-reference
    table is rebuilt. Input that does not look like svg2pdf output is returned unchanged.
    """
    parsed = _parse_pdf(pdf)
    if parsed is None:
        return pdf
    objects, header, trailer = parsed
    _canonical_font_names(objects)
    roots = [int(m.group(1)) for m in re.finditer(rb"/(?:Root|Info) (\d+) 0 R", trailer)]
    order: list[int] = []
    seen: set[int] = set()

    def visit(num: int) -> None:
        stack = [num]
        while stack:
            n = stack.pop()
            if n in seen or n not in objects:
                continue
            seen.add(n)
            order.append(n)
            refs = [int(r.group(1)) for r in _REF.finditer(objects[n][0])]
            stack.extend(reversed(refs))

    for r in roots:
        visit(r)
    order += sorted(n for n in objects if n not in seen)
    new = {old: i + 1 for i, old in enumerate(order)}

    def renumber(text: bytes) -> bytes:
        return _REF.sub(lambda m: b"%d 0 R" % new.get(int(m.group(1)), int(m.group(1))), text)

    out = bytearray(header)
    offsets: list[int] = []
    for old in order:
        text, data = objects[old]
        offsets.append(len(out))
        out += b"%d 0 obj\n" % new[old] + renumber(text)
        if data is not None:
            out += b"\nstream\n" + data + b"\nendstream"
        out += b"\nendobj\n\n"
    xref_at = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f\r\n" % (len(order) + 1)
    for off in offsets:
        out += b"%010d 00000 n\r\n" % off
    out += renumber(trailer) + b"startxref\n%d\n%%%%EOF" % xref_at
    return bytes(out)


# -- offline HTML -------------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def javascript_bundle() -> str:
    """Vega, Vega-Lite and vega-embed as one script that defines ``window.vegaEmbed`` (offline).

    vl-convert builds the bundle (a few seconds); it is kept in ``$XDG_CACHE_HOME/tracekit``
    (``~/.cache/tracekit``), keyed by the vl-convert and Vega-Lite versions.
    """
    import hashlib

    vlc = import_vl_convert()
    version = _vl_version()
    key = hashlib.sha256(f"{getattr(vlc, '__version__', '?')}|{version}".encode()).hexdigest()[:16]
    cache = (
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        / "tracekit"
        / f"vega-bundle-{key}.js"
    )
    try:
        if cache.is_file():
            return cache.read_text(encoding="utf-8")
    except OSError:
        pass
    bundle = str(vlc.javascript_bundle(vl_version=version))
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(bundle, encoding="utf-8")
        tmp.replace(cache)
    except OSError:  # a read-only home is fine: build it again next time
        pass
    return bundle


def embed_script(spec: dict[str, Any], element_id: str) -> str:
    """A ``<script>`` body that renders ``spec`` into ``#element_id`` with the bundled vega-embed."""
    payload = json.dumps(spec, separators=(",", ":"), sort_keys=True).replace("</", "<\\/")
    return (
        f"vegaEmbed({json.dumps('#' + element_id)}, {payload}, "
        '{"actions": {"export": true, "source": false, "compiled": false, "editor": false}, "renderer": "svg"})'
        ".catch(function (e) { window.__tracekit_errors = (window.__tracekit_errors || []).concat([String(e)]);"
        " console.error(e); });"
    )


def to_html(chart: Any, *, theme: str = SCREEN_THEME, title: str = "tracekit chart") -> str:
    """One self-contained HTML page showing ``chart`` (JavaScript inlined, no network)."""
    import html

    spec = chart_spec(chart, theme=theme)
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title>"
        f"<script>{javascript_bundle()}</script></head>"
        f'<body><div id="vis"></div><script>{embed_script(spec, "vis")}</script></body></html>\n'
    )
