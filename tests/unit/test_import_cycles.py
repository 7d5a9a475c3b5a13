"""No import cycle inside ``zeroloss/`` (issue 15), counting imports inside functions too, between
modules and between its subpackages (``zeroloss.ledger``, ``zeroloss.integrations.replication``, ...: issue 30).

A cycle tells of a misplaced responsibility (the sweep loop that knew Celery, the registry that
imported the task backend). Imports under ``if TYPE_CHECKING:`` do not run and are not counted.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "zeroloss"
LAYERS = ("core", "ledger", "runtime", "integrations", "ops")


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import that can run: at module level and inside functions, not TYPE_CHECKING."""
    found: list[ast.Import | ast.ImportFrom] = []
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            todo.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return found


@functools.cache  # parsing every module is most of this file's time; the tree does not change
def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        deps: set[str] = set()
        for node in _imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in modules)
                continue
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                full = f"{target}.{alias.name}"
                if full in modules:
                    deps.add(full)
                elif target in modules:
                    deps.add(target)
        graph[name] = deps - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
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
                    work.append((child, iter(sorted(graph.get(child, ())))))
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
                    found.append(sorted(component))
    return found


def test_the_graph_sees_the_package_and_its_lazy_imports():
    graph = import_graph()
    assert "zeroloss.ledger.persist" in graph and "zeroloss.ledger.service" in graph
    # A function-level import is an edge: the app's ready() imports the task runner.
    assert "zeroloss.integrations.tasks_backend.runner" in graph["zeroloss.apps"]
    # And a cycle is found where there is one.
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_inside_zeroloss():
    assert cycles(import_graph()) == []


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between the subpackages of ``zeroloss`` (each one node)."""
    # A layer's subpackages (zeroloss.runtime.worker, ...) are nodes; a layer's own modules are not.
    subpackages = {
        ".".join(("zeroloss", *p.parent.relative_to(PACKAGE).parts))
        for p in PACKAGE.glob("*/**/__init__.py")
        if "migrations" not in p.parts and p.parent.parent.name in {"zeroloss", *LAYERS}
    } - {f"zeroloss.{layer}" for layer in LAYERS if layer != "ledger"}

    def node(module: str) -> str | None:
        parts = module.split(".")
        for size in (3, 2):
            if ".".join(parts[:size]) in subpackages:
                return ".".join(parts[:size])
        return None

    packages: dict[str, set[str]] = {}
    for module, deps in graph.items():
        source = node(module)
        if source is None:
            continue
        targets = {node(dep) for dep in deps} - {None, source}
        packages.setdefault(source, set()).update(t for t in targets if t is not None)
    return packages


def test_the_package_graph_collapses_subpackages():
    packages = package_graph(import_graph())
    assert {"zeroloss.ledger", "zeroloss.runtime.worker", "zeroloss.admin"} <= set(packages)
    assert "zeroloss.ledger" in packages["zeroloss.runtime.worker"]


def test_no_import_cycle_between_zeroloss_subpackages():
    # Replication and transports hang on the ledger's hooks (zeroloss.ledger.hooks), not on imports.
    assert cycles(package_graph(import_graph())) == []


#: What an outcome's side effects go through; the ledger tells them by its event stream
#: (zeroloss.ledger.events), never by import. Matched by module name wherever the layers put it.
SIDE_EFFECTS = {
    "telemetry",
    "signals",
    "notices",
    "logs",
    "metrics",
    "wakeup",
    "delivery",
    "processing",
}
SIDE_EFFECT_LIBRARIES = ("django.dispatch", "django.core.signals", "opentelemetry", "prometheus_client")


def side_effect_imports(source: str, package: list[str]) -> list[str]:
    """The modules of ``SIDE_EFFECTS`` a module imports, counting type-only and function-local imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            targets = [f"{module}.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            inside = target.startswith("zeroloss.") and SIDE_EFFECTS & set(target.split(".")[1:])
            if inside or target.startswith(SIDE_EFFECT_LIBRARIES):
                found.append(target)
    return found


def test_the_ledger_imports_none_of_its_side_effects():
    ledger = PACKAGE / "ledger"
    found = {
        path.name: side_effect_imports(path.read_text(), ["zeroloss", "ledger"])
        for path in sorted(ledger.rglob("*.py"))
    }
    assert {name: names for name, names in found.items() if names} == {}


def test_the_side_effect_scan_sees_every_kind_of_import():
    source = """
from typing import TYPE_CHECKING
from .. import telemetry
from . import events
if TYPE_CHECKING:
    from .processing import Delivery
def later():
    from django.dispatch import Signal
    import zeroloss.integrations.telemetry.tracing
"""
    assert side_effect_imports(source, ["zeroloss", "ledger"]) == [
        "zeroloss.telemetry",
        "zeroloss.ledger.processing.Delivery",
        "django.dispatch.Signal",
        "zeroloss.integrations.telemetry.tracing",
    ]
