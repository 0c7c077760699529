"""The import graph of ``harness``, ``analysis`` and ``data_recipes`` has no cycle, and no module at a package's top
level is named like a standard-library module (``harness/inspect.py`` once shadowed ``inspect``).

The graph is read from the source with :mod:`ast`, so nothing is imported: an edge ``a → b`` is an import of ``b``
that runs when ``a`` is imported — at module level, including inside module-level ``if`` / ``try`` / ``with`` blocks
and class bodies, but not inside functions (deferred until called) nor under ``if TYPE_CHECKING:`` (never run).
``from x import y`` is an edge to ``x.y`` when ``y`` is a submodule, else to ``x``; ``import x.y`` is an edge to
``x.y``. Importing ``x.y`` also runs the packages above it (``x/__init__.py``): those are edges too, except the
packages the importing module itself sits in — ``harness.config.load`` importing ``harness.config.schema`` is the
normal package pattern, not a cycle through ``harness/config/__init__.py``. But ``from harness.config import X``
inside ``harness.config.load`` names the package itself: an edge to ``harness.config``, a cycle when the package's
``__init__`` imports ``load``.
"""

from __future__ import annotations

import ast
import sys
from collections import deque
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import ROOT

PACKAGES = ("harness", "analysis", "data_recipes")


def module_files() -> dict[str, Path]:
    """``{dotted module name: file}`` for every module of the packages (a package is its ``__init__.py``)."""
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``typing.TYPE_CHECKING``."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_time_imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements that run when a module with this body is imported."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue  # runs when called, not when imported
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from import_time_imports(node.orelse)
        else:  # if / try / with / for / class bodies run at import time
            for field in ("body", "orelse", "finalbody"):
                block = getattr(node, field, None)
                if isinstance(block, list):
                    yield from import_time_imports(block)
            for clause in [*getattr(node, "handlers", []), *getattr(node, "cases", [])]:
                yield from import_time_imports(clause.body)


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute name of a ``from`` import's module (relative imports resolved against ``module``)."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _deepest_known(name: str, modules: dict[str, Path]) -> str | None:
    """``name`` or its longest prefix that is one of ``modules`` (None for a module from outside the packages)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in modules:
            return candidate
    return None


def _runs(importer: str, target: str, modules: dict[str, Path]) -> list[str]:
    """The modules that importing ``target`` runs, as seen from ``importer``: ``target`` and the packages above it,
    except the packages ``importer`` itself sits in (already being imported when ``importer`` runs)."""
    parts = target.split(".")
    ancestors = [".".join(parts[:n]) for n in range(1, len(parts))]
    outside = [p for p in ancestors if p in modules and p != importer and not importer.startswith(p + ".")]
    return [target, *outside]


def import_graph(modules: dict[str, Path]) -> dict[str, dict[str, int]]:
    """``{module: {imported module: line}}`` over the packages' modules, import-time imports only."""
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        edges: dict[str, int] = {}
        is_package = path.name == "__init__.py"
        for node in import_time_imports(ast.parse(path.read_text(encoding="utf-8"), str(path)).body):
            if isinstance(node, ast.Import):
                targets = [_deepest_known(alias.name, modules) for alias in node.names]
            else:
                source = _absolute(module, is_package, node)
                targets = [
                    f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else _deepest_known(source, modules)
                    for alias in node.names
                ]
            for target in filter(None, targets):
                for runs in _runs(module, target, modules):
                    if runs != module:
                        edges.setdefault(runs, node.lineno)
        graph[module] = edges
    return graph


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def shortest_cycle(graph: dict[str, dict[str, int]], component: list[str]) -> list[str]:
    """One shortest cycle through the component's first module: ``[a, b, …, a]``."""
    start, members = component[0], set(component)
    previous: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(graph[node]):
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                return [*reversed(path), start]
            if child in members and child not in previous:
                previous[child] = node
                queue.append(child)
    raise AssertionError(f"no cycle through {start} in {component}")  # a component always has one


def describe(graph: dict[str, dict[str, int]], modules: dict[str, Path], cycle: list[str]) -> str:
    """``a (a.py:12) → b (b.py:3) → a``: each step with the line that imports the next module."""
    steps = [f"{a} ({modules[a].relative_to(ROOT).as_posix()}:{graph[a][b]})" for a, b in zip(cycle, cycle[1:])]
    return " → ".join([*steps, cycle[-1]])


MODULES = module_files()
GRAPH = import_graph(MODULES)


def test_the_graph_is_read():
    """The walk finds the packages and edges between them (so the cycle test cannot pass on an empty graph)."""
    for package in PACKAGES:
        assert package in MODULES, f"{package}/__init__.py not found"
    assert sum(len(edges) for edges in GRAPH.values()) > len(PACKAGES)
    assert "harness.core.store" in GRAPH["analysis.frames"]


def test_no_import_cycle():
    components = strongly_connected(GRAPH)
    cycles = [
        describe(GRAPH, MODULES, shortest_cycle(GRAPH, c)) + f"   [component: {', '.join(c)}]" for c in components
    ]
    assert not cycles, "import cycles (module-level imports):\n  " + "\n  ".join(cycles)


def test_no_top_level_module_shadows_the_standard_library():
    """``python path/to/package/script.py`` puts the package directory first on sys.path, where a module named
    like a standard-library one (``inspect``, ``io``…) replaces it for every library imported afterwards."""
    clashes = [
        module for module in MODULES if module.count(".") == 1 and module.split(".")[1] in sys.stdlib_module_names
    ]
    assert not clashes, "modules named like a standard-library module: " + ", ".join(
        MODULES[m].relative_to(ROOT).as_posix() for m in clashes
    )
