"""Imports go one way (docs: /shared DESIGN.md's picture): loaders (nsys, ncu) → analysis →
reports (stats, diagnosis, model, comparison, scale, multi) → viz/widgets/report → cli, and no
module imports, directly or through others, one that imports it back. Static imports at any
depth of a module (function bodies included); ``if TYPE_CHECKING:`` blocks are annotations."""

from __future__ import annotations

import ast
from pathlib import Path

import tracekit

PKG = Path(tracekit.__file__).parent
LOADERS = ("tracekit.nsys", "tracekit.ncu")
ABOVE_LOADERS = ("tracekit.analysis", "tracekit.stats", "tracekit.diagnosis", "tracekit.model", "tracekit.comparison",
                 "tracekit.scale", "tracekit.multi", "tracekit.viz", "tracekit.widgets", "tracekit.report", "tracekit.cli",
                 "tracekit.export")
ABOVE_ANALYSIS = ABOVE_LOADERS[1:]


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def _imports(path: Path, known: dict[str, Path]) -> set[str]:
    found: set[str] = set()

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            t = node.test
            if (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"):
                for n in node.orelse:
                    self.visit(n)
                return
            self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            found.update(a.name for a in node.names if a.name.startswith("tracekit"))

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            if node.module and node.module.startswith("tracekit") and node.level == 0:
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    found.add(full if full in known else node.module)

    Visitor().visit(ast.parse(path.read_text()))
    return {m for m in found if m in known}


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {m: _imports(p, known) - {m} for m, p in known.items()}


def _in(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_loaders_import_no_upper_layer() -> None:
    bad = {m: sorted(e for e in es if _in(e, ABOVE_LOADERS)) for m, es in _graph().items() if _in(m, LOADERS)}
    assert {m: e for m, e in bad.items() if e} == {}


def test_analyses_import_no_report_or_view() -> None:
    bad = {m: sorted(e for e in es if _in(e, ABOVE_ANALYSIS)) for m, es in _graph().items() if _in(m, ("tracekit.analysis",))}
    assert {m: e for m, e in bad.items() if e} == {}


def test_no_import_cycles() -> None:
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert cycles == []


def test_the_checks_see_real_edges() -> None:
    """The graph is not empty-handed: known one-way edges are there."""
    g = _graph()
    assert "tracekit.analysis.attribution" in g["tracekit.stats.nvtx_projection"]
    assert "tracekit.nsys.trace" in g["tracekit.analysis.nccl"]
