"""Offline rendering of charts in Jupyter: no CDN, ever (GPU clusters are often air-gapped).

:func:`enable_notebook` registers and enables the ``tracekit`` renderer: each chart becomes an
``alt.JupyterChart`` widget (``anywidget``) whose JavaScript — Vega, Vega-Lite and vega-embed —
is vl-convert's offline bundle inside the widget, so selections can be read back in Python.
It is altair's ``jupyter`` renderer in offline mode, minus two costs: the bundle is built once
and kept in ``~/.cache/tracekit``, and the chart is not rebuilt from its dict (which validates
every data row and takes seconds). Without ``anywidget`` it registers ``tracekit_html``:
plain HTML outputs with the bundle inlined (about 0.9 MB per chart; selections stay in the
browser).
"""

from __future__ import annotations

import copy
import hashlib
import os
from typing import Any

from tracekit.cache import cache_dir
from tracekit.viz._deps import has_anywidget, import_altair, import_vl_convert
from tracekit.viz.theme import SCREEN_THEME, use

WIDGET_RENDERER = "tracekit"
HTML_RENDERER = "tracekit_html"

_offline_ready = False


def enable_offline_widgets() -> None:
    """Make ``alt.JupyterChart`` load its JavaScript from vl-convert's bundle (cached on disk)."""
    global _offline_ready
    if _offline_ready:
        return
    alt = import_altair()
    vlc = import_vl_convert()
    jc = alt.JupyterChart
    key = hashlib.sha256(
        f"{alt.__version__}|{getattr(vlc, '__version__', '?')}".encode()
    ).hexdigest()[:16]
    cache = cache_dir() / f"jupyterchart-esm-{key}.js"
    esm: str | None = None
    try:
        if cache.is_file():
            esm = cache.read_text(encoding="utf-8")
    except OSError:
        esm = None
    if esm and hasattr(jc, "_is_offline"):
        jc._esm = esm
        jc._is_offline = True
    else:
        jc.enable_offline()
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(str(jc._esm), encoding="utf-8")
            tmp.replace(cache)
        except OSError:  # read-only home: build it again next time
            pass
    _offline_ready = True


def _widget_renderer(spec: dict[str, Any], **metadata: Any) -> Any:
    alt = import_altair()
    enable_offline_widgets()
    spec = copy.copy(spec)
    datasets = spec.pop("datasets", None)
    kind = next(
        (k for k in ("facet", "layer", "hconcat", "vconcat", "concat", "repeat") if k in spec), None
    )
    cls = {
        "facet": alt.FacetChart, "layer": alt.LayerChart, "hconcat": alt.HConcatChart,
        "vconcat": alt.VConcatChart, "concat": alt.ConcatChart, "repeat": alt.RepeatChart,
    }.get(kind or "", alt.Chart)  # fmt: skip
    chart = cls.from_dict(spec, validate=False)  # the spec was validated by to_dict()
    if datasets is not None:
        chart.datasets = datasets
    return alt.JupyterChart(chart, embed_options=metadata.get("embed_options"))._repr_mimebundle_()


def _html_renderer(spec: dict[str, Any], **metadata: Any) -> dict[str, str]:
    import uuid

    from tracekit.viz.export import embed_script, javascript_bundle

    element = f"tk-{uuid.uuid4().hex[:12]}"
    body = (
        f'<div id="{element}"></div>'
        "<script>if (typeof window.vegaEmbed === 'undefined') {"
        f"{javascript_bundle()}"
        "}</script>"
        f"<script>{embed_script(spec, element)}</script>"
    )
    return {"text/html": body}


_warnings_hooked = False


def warnings_as_notes() -> None:
    """Show tracekit's own warnings (an incomplete export, damaged rows, an empty result) as
    one line in the cell's output, not as a two-line ``file:line`` message on stderr; other
    warnings are shown as before. Idempotent; :func:`enable_notebook` calls it."""
    global _warnings_hooked
    if _warnings_hooked:
        return
    import warnings

    previous = warnings.showwarning

    def show(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
             line: str | None = None) -> None:
        if not getattr(category, "__module__", "").startswith("tracekit") or file is not None:
            previous(message, category, filename, lineno, file, line)
            return
        try:
            from IPython.display import display

            from tracekit.viz.notes import Note

            display(Note(f"{category.__name__}: {message}"))  # type: ignore[no-untyped-call]
        except ImportError:  # not in IPython
            previous(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    _warnings_hooked = True


def enable_notebook(*, theme: str = SCREEN_THEME, widget: bool | None = None) -> str:
    """Render altair charts offline in this notebook and use tracekit's screen theme.

    Parameters
    ----------
    theme
        Theme to enable (``"tracekit"``; ``"tracekit_paper"`` previews paper figures).
    widget
        ``True``: charts as ``JupyterChart`` widgets (needs ``anywidget``); ``False``: inline
        HTML; ``None``: the widget when ``anywidget`` is installed.

    Returns
    -------
    The renderer's name (``"tracekit"`` or ``"tracekit_html"``).
    """
    alt = import_altair()
    use(theme)
    warnings_as_notes()
    if widget is None:
        widget = has_anywidget()
    if widget:
        enable_offline_widgets()
        alt.renderers.register(WIDGET_RENDERER, _widget_renderer)
        alt.renderers.enable(WIDGET_RENDERER)
        return WIDGET_RENDERER
    alt.renderers.register(HTML_RENDERER, _html_renderer)
    alt.renderers.enable(HTML_RENDERER)
    return HTML_RENDERER
