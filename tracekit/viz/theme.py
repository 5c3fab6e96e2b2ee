"""Colours, sizes and the two registered altair themes: ``tracekit`` (screen) and ``tracekit_paper``.

The palette is Okabe & Ito's (2008), safe for the common colour-vision deficiencies and in
grey-scale print. Paper figures use 9 pt labels and 10 pt titles in Liberation Sans (bundled
in ``tracekit/viz/fonts``, SIL OFL 1.1; metrically compatible with Arial/Helvetica) and fit a
single column (241 pt, 3.35 in) or the full text width of a two-column layout (506 pt, 7 in).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: Okabe–Ito: orange, sky blue, bluish green, yellow, blue, vermillion, reddish purple, black.
PALETTE: tuple[str, ...] = (
    "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#56B4E9", "#E69F00", "#F0E442", "#000000",
)  # fmt: skip

#: Colour of each kernel family of :mod:`tracekit.taxonomy` and of each GPU operation kind:
#: one distinct colour each, the same in every view (Okabe–Ito first, then Paul Tol's muted
#: scheme for the families beyond its eight colours).
FAMILY_COLORS: dict[str, str] = {
    "gemm": "#0072B2",  # blue
    "attention": "#D55E00",  # vermillion
    "normalization": "#009E73",  # bluish green
    "softmax": "#CC79A7",  # reddish purple
    "elementwise": "#56B4E9",  # sky blue
    "reduction": "#E69F00",  # orange
    "embedding": "#882255",  # wine
    "communication": "#000000",  # black
    "copy": "#999933",  # olive: copy and fill kernels
    "memcpy": "#A6761D",  # brown: CUDA memcpy operations
    "memset": "#44AA99",  # teal: CUDA memset operations
    "graph": "#332288",  # indigo: a CUDA graph replay traced whole, its kernels unknown
    "other": "#BBBBBB",  # grey
}

#: Colour of each category of the temporal breakdown.
BREAKDOWN_COLORS: dict[str, str] = {
    "compute": "#0072B2",
    "communication": "#D55E00",
    "overlap": "#CC79A7",
    "memcpy": "#E69F00",
    "idle": "#DDDDDD",
}

#: Figure widths in points (1 pt = 1/72 in; vl-convert maps one Vega pixel to one point).
WIDTHS_PT: dict[str, float] = {
    "column": 241.0,  # 3.35 in: ACM/IEEE single column
    "single": 241.0,
    "double": 506.0,  # 7.03 in: both columns
    "page": 506.0,
}

FONT_FAMILY = "Liberation Sans"
FONT_STACK = "Liberation Sans, Arial, Helvetica, sans-serif"
FONT_DIR = Path(__file__).with_name("fonts")

SCREEN_THEME = "tracekit"
PAPER_THEME = "tracekit_paper"


def width_pt(width: str | float) -> float:
    """A figure width in points from a name (``"column"``, ``"double"``) or a number of points."""
    if isinstance(width, int | float):
        if width <= 0:
            msg = f"width must be positive, not {width}"
            raise ValueError(msg)
        return float(width)
    try:
        return WIDTHS_PT[width]
    except KeyError:
        msg = f"unknown width {width!r}; use one of {', '.join(WIDTHS_PT)} or a number of points"
        raise ValueError(msg) from None


def family_scale(families: list[str] | None = None) -> dict[str, list[str]]:
    """``domain``/``range`` for an altair colour scale over kernel families.

    Every known family is always in the domain, in a fixed order, so that a family has the
    same colour in every chart and in charts concatenated together (Vega-Lite unions the
    domains of a shared scale; per-chart domains in different orders gave one family two
    colours). Unknown names in ``families`` are appended with colours no family uses.
    """
    names = list(FAMILY_COLORS)
    extra_names = [n for n in dict.fromkeys(families or []) if n not in FAMILY_COLORS]
    spare = [c for c in (*PALETTE, "#117733", "#DDCC77", "#AA4499", "#88CCEE") if c not in FAMILY_COLORS.values()]
    colors = [FAMILY_COLORS[n] for n in names] + [spare[i % len(spare)] if spare else "#777777" for i in range(len(extra_names))]
    return {"domain": names + extra_names, "range": colors}


def _base_config(font: str, label: float, title: float, *, paper: bool) -> dict[str, Any]:
    weight = "normal" if paper else "bold"
    return {
        "font": font,
        "background": "white",
        "padding": 2 if paper else 5,
        "view": {"stroke": None} if paper else {"stroke": "#DDDDDD"},
        "range": {"category": list(PALETTE), "ordinal": {"scheme": "blues"}},
        "axis": {
            "labelFont": font,
            "titleFont": font,
            "labelFontSize": label,
            "titleFontSize": title,
            "titleFontWeight": weight,
            "labelColor": "#222222",
            "titleColor": "#000000",
            "tickColor": "#555555",
            "domainColor": "#555555",
            "gridColor": "#E5E5E5",
            "labelLimit": 110 if paper else 260,
            "titlePadding": 3 if paper else 6,
        },
        "legend": {
            "labelFont": font,
            "titleFont": font,
            "labelFontSize": label,
            "titleFontSize": title,
            "titleFontWeight": "normal" if paper else "bold",
            "symbolSize": 40 if paper else 80,
            "symbolOpacity": 1,
            "labelLimit": 160 if paper else 260,
            **(
                {
                    "orient": "bottom",
                    "direction": "horizontal",
                    "columns": 3,
                    "titleOrient": "top",
                    "labelLimit": 120,
                    "gradientLength": 140,
                    "columnPadding": 6,
                }
                if paper
                else {}
            ),  # fmt: skip
        },
        "header": {
            "labelFont": font,
            "titleFont": font,
            "labelFontSize": label,
            "titleFontSize": title,
            "titleFontWeight": "normal",
        },
        "title": {"font": font, "fontSize": title, "fontWeight": weight, "anchor": "start", "subtitleFont": font,
                  "subtitleFontSize": label, "subtitleColor": "#444444", "subtitlePadding": 2},
        "text": {"font": font, "fontSize": label},
        "mark": {"font": font},
        "line": {"strokeWidth": 1.0 if paper else 1.5},
        "point": {"size": 16 if paper else 40},
        "bar": {"binSpacing": 0},
    }


def paper_config() -> dict[str, Any]:
    """The ``tracekit_paper`` theme's config: 9 pt labels, 10 pt titles, bundled font, no frame."""
    return _base_config(FONT_FAMILY, 9, 10, paper=True)


def screen_config() -> dict[str, Any]:
    """The ``tracekit`` theme's config: the same palette, larger text, system sans-serif."""
    return _base_config(FONT_STACK, 11, 12, paper=False)


_registered = False


def register_themes() -> None:
    """Register ``tracekit`` and ``tracekit_paper`` with ``alt.theme`` (idempotent, enables neither)."""
    global _registered
    if _registered:
        return
    from tracekit.viz._deps import import_altair

    alt = import_altair()

    def _screen() -> Any:
        return alt.theme.ThemeConfig(config=screen_config())

    def _paper() -> Any:
        view = {"stroke": None, "continuousWidth": 200, "continuousHeight": 130}
        return alt.theme.ThemeConfig(config={**paper_config(), "view": view})

    alt.theme.register(SCREEN_THEME, enable=False)(_screen)
    alt.theme.register(PAPER_THEME, enable=False)(_paper)

    _registered = True


def use(name: str = SCREEN_THEME) -> None:
    """Enable a theme globally for altair (``"tracekit"``, ``"tracekit_paper"`` or any altair theme)."""
    register_themes()
    from tracekit.viz._deps import import_altair

    import_altair().theme.enable(name)


_fonts_registered = False


def register_fonts() -> None:
    """Make the bundled font known to vl-convert (once per process)."""
    global _fonts_registered
    if _fonts_registered:
        return
    from tracekit.viz._deps import import_vl_convert

    import_vl_convert().register_font_directory(str(FONT_DIR.resolve()))
    _fonts_registered = True
