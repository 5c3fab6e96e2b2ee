"""Optional imports of the ``notebook`` extra, each raising one helpful error when missing."""

from __future__ import annotations

from types import ModuleType


def import_altair() -> ModuleType:
    """``altair``, or :class:`~tracekit.errors.MissingDependencyError` naming the extra."""
    try:
        import altair
    except ImportError:
        from tracekit.errors import missing_extra

        raise missing_extra("altair", "notebook") from None
    return altair


def import_vl_convert() -> ModuleType:
    """``vl_convert`` (vl-convert-python), or an error naming the extra."""
    try:
        import vl_convert
    except ImportError:
        from tracekit.errors import missing_extra

        raise missing_extra("vl-convert-python", "notebook") from None
    return vl_convert


def import_ipywidgets() -> ModuleType:
    """``ipywidgets``, or an error naming the extra."""
    try:
        import ipywidgets
    except ImportError:
        from tracekit.errors import missing_extra

        raise missing_extra("ipywidgets", "notebook") from None
    module: ModuleType = ipywidgets
    return module


def has_anywidget() -> bool:
    """Whether ``anywidget`` (behind ``alt.JupyterChart``) is importable."""
    try:
        import anywidget  # noqa: F401
    except ImportError:
        return False
    return True
