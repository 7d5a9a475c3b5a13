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
    # A function-level import is an edge: the app's ready() imports what it connects.
    assert "zeroloss._ready" in graph["zeroloss.apps"]
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


# -- layers: core <- ledger <- runtime <- integrations <- ops <- the public face --------------------
#: The layers, lowest first (CONTRIBUTING.md, "Package layers"): a module imports from its own
#: layer and the ones before it only. The root, admin/ and management/ are the top.
LAYER_ORDER = ("core", "ledger", "runtime", "integrations", "ops")
#: Real modules at the root that import nothing of zeroloss: every layer may use them.
LEAVES = {"zeroloss.exceptions", "zeroloss.signals"}
#: The root's own modules; every other module at the root (and zeroloss.schedules.*,
#: zeroloss.telemetry.*) keeps a documented import path and only re-exports.
FACE = {
    "zeroloss",
    "zeroloss.apps",
    "zeroloss._ready",
    "zeroloss.testing",
    "zeroloss.urls",
    "zeroloss.pytest_plugin",
    *LEAVES,
}
#: Arrows still running up, each with its reason (the goal is none).
UPWARD: dict[tuple[str, str], str] = {}


def layer_of(module: str) -> int:
    parts = module.split(".")
    if module in LEAVES:
        return 0
    if len(parts) > 1 and parts[1] in LAYER_ORDER:
        return LAYER_ORDER.index(parts[1])
    return len(LAYER_ORDER)


def every_import(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import, type-only (``if TYPE_CHECKING:``) and function-local ones included."""
    return [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]


def _targets(name: str, path: Path, node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> set[str]:
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in modules}
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    base = package[: len(package) - node.level + 1] if node.level else []
    target = ".".join([*base, *([node.module] if node.module else [])])
    found = set()
    for alias in node.names:
        if f"{target}.{alias.name}" in modules:
            found.add(f"{target}.{alias.name}")
        elif target in modules:
            found.add(target)
    return found


@functools.cache
def full_graph() -> dict[str, set[str]]:
    """The import graph counting every import (type-only and function-local ones too)."""
    modules = _modules()
    return {
        name: {
            t
            for node in every_import(ast.parse(path.read_text()))
            for t in _targets(name, path, node, modules)
        }
        - {name}
        for name, path in modules.items()
    }


def upward_arrows(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {
        (source, target)
        for source, targets in graph.items()
        for target in targets
        if layer_of(target) > layer_of(source)
    }


def _is_shim(module: str) -> bool:
    parts = module.split(".")
    return (
        module not in FACE
        and (len(parts) == 2 or parts[1] in {"schedules", "telemetry"})
        and parts[1]
        not in {
            "admin",
            "management",
            "migrations",
            *LAYER_ORDER,
        }
    )


def test_imports_run_down_the_layers_only():
    upward = upward_arrows(full_graph())
    new = sorted(upward - set(UPWARD))
    assert new == [], (
        "an import runs up the layers (core <- ledger <- runtime <- integrations <- ops <- root): "
        + ", ".join(f"{a} -> {b}" for a, b in new)
    )
    assert sorted(set(UPWARD) - upward) == [], "an allowed upward arrow is gone: take it out of UPWARD"


def test_the_leaves_import_nothing_of_zeroloss():
    graph = full_graph()
    assert {leaf: sorted(graph[leaf]) for leaf in LEAVES if graph[leaf]} == {}


def test_a_public_path_only_re_exports_and_nothing_inside_imports_it():
    graph = full_graph()
    shims = {m for m in graph if _is_shim(m)}
    assert {"zeroloss.service", "zeroloss.conf", "zeroloss.models", "zeroloss.schedules.spec"} <= shims
    for shim in shims:
        tree = ast.parse(_modules()[shim].read_text())
        for node in tree.body:
            re_export = isinstance(node, ast.Import | ast.ImportFrom | ast.If | ast.FunctionDef) or (
                isinstance(node, ast.Expr | ast.Assign)
                and (
                    isinstance(node, ast.Expr) or any(getattr(t, "id", "") == "__all__" for t in node.targets)
                )
            )
            assert re_export, (
                f"{shim} (a documented import path) holds code at line {node.lineno}: move it to its layer"
            )
    importers = {
        source: sorted(targets & shims)
        for source, targets in graph.items()
        if targets & shims and not _is_shim(source)
    }
    assert importers == {}, "inside zeroloss, import the defining module, not a documented re-export"


def test_the_layer_scan_counts_type_only_and_function_local_imports():
    modules = {"zeroloss.core.a": Path("core/a.py"), "zeroloss.ops.b": Path("ops/b.py")}
    tree = ast.parse("if TYPE_CHECKING:\n    from ..ops import b\ndef f():\n    from ..ops.b import x\n")
    targets = {
        t
        for node in every_import(tree)
        for t in _targets("zeroloss.core.a", Path("core/a.py"), node, modules)
    }
    assert targets == {"zeroloss.ops.b"}
    assert upward_arrows({"zeroloss.core.a": targets}) == {("zeroloss.core.a", "zeroloss.ops.b")}
    assert layer_of("zeroloss.exceptions") == 0 and layer_of("zeroloss.admin.views") == len(LAYER_ORDER)


# -- imports inside functions ----------------------------------------------------------------------
#: At most this many imports run inside a function, each deferring something real (Django's app
#: registry, an optional dependency) and saying which on its line or the one above ("# deferred: ...").
MAX_DEFERRED = 25


def deferred_imports(source: str) -> list[int]:
    """The lines of the imports a function runs (``import_module()`` calls included)."""
    found = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for statement in function.body:
            for node in ast.walk(statement):
                calls_import = (
                    isinstance(node, ast.Call)
                    and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
                )
                if isinstance(node, ast.Import | ast.ImportFrom | ast.Call) and (
                    not isinstance(node, ast.Call) or calls_import
                ):
                    found.append(node.lineno)
    return sorted(set(found))


def test_imports_inside_functions_defer_something_and_say_what():
    found: dict[str, list[int]] = {}
    unexplained = []
    for name, path in sorted(_modules().items()):
        lines = path.read_text().splitlines()
        for lineno in deferred_imports(path.read_text()):
            found.setdefault(name, []).append(lineno)
            said = " ".join(lines[max(lineno - 2, 0) : lineno]).lower()
            if "# deferred" not in said:
                unexplained.append(f"{path.relative_to(PACKAGE.parent)}:{lineno}")
    total = sum(len(n) for n in found.values())
    assert total <= MAX_DEFERRED, f"{total} imports inside functions (at most {MAX_DEFERRED}): {found}"
    assert unexplained == [], (
        "an import inside a function says what it defers (# deferred: ...): " + ", ".join(unexplained)
    )


def test_the_deferred_scan_sees_nested_imports_and_import_module():
    source = "import os\ndef f():\n    import json\n    def g():\n        importlib.import_module('x')\n"
    assert deferred_imports(source) == [3, 5]
