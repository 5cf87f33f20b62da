"""The package's shape: modules import in one direction and stay a readable size."""

from __future__ import annotations

import ast
from pathlib import Path

import agl

ROOT = Path(agl.__file__).parent
#: No module of agl/ is longer than this (lines).
MAX_LINES = 800
#: The only imports from agl.core to the rest of agl: lazy, and only when a Trainer is asked for them
#: (``otlp_endpoint``, ``report_to``); neither target imports the Trainer back (DESIGN.md, dependency rule).
CORE_REACHES_UP = {("agl.core.trainer", "agl.otel.export"), ("agl.core.reporting", "agl.report_writers")}


def module_name(path: Path) -> str:
    parts = ("agl", *path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(name: str, path: Path, modules: set[str]) -> set[str]:
    """The agl modules ``path`` imports, type-only and function-level imports included (the top package excluded:
    it only re-exports lazily)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            for alias in node.names:
                target = f"{base}.{alias.name}"
                found.add(target if target in modules else base)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in modules and m not in (name, "agl")}


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in ROOT.rglob("*.py")}
    return {name: imported(name, path, set(paths)) for name, path in paths.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_two_agl_modules_import_each_other_even_for_types_only() -> None:
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_type_only_cycle() -> None:
    graph = import_graph()
    graph["agl.core.algorithm"].add("agl.core.trainer")  # what algorithm.py imported for TrainContext's type
    assert any({"agl.core.algorithm", "agl.core.trainer"} <= set(c) for c in cycles(graph))


def test_core_imports_nothing_above_it_but_its_two_lazy_reaches() -> None:
    graph = import_graph()
    up = {(m, dep) for m, deps in graph.items() if m.startswith("agl.core") for dep in deps}
    assert {(m, dep) for m, dep in up if not dep.startswith("agl.core")} == CORE_REACHES_UP


def test_no_module_is_longer_than_800_lines() -> None:
    sizes = {
        p.relative_to(ROOT).as_posix(): len(p.read_text(encoding="utf-8").splitlines()) for p in ROOT.rglob("*.py")
    }
    assert {path: n for path, n in sizes.items() if n > MAX_LINES} == {}
