"""The tools package's house rules, checked on its source with ``ast``: small functions,
only public names of other modules, and no import cycle among ``zephon_jax.tools`` modules."""

from __future__ import annotations

import ast
from pathlib import Path

import zephon_jax.tools

TOOLS = Path(zephon_jax.tools.__file__).parent
PACKAGE = "zephon_jax.tools"
MAX_FUNCTION_LINES = 80


def _modules() -> dict[str, ast.Module]:
    return {
        f"{PACKAGE}.{path.stem}": ast.parse(path.read_text(), str(path))
        for path in sorted(TOOLS.glob("*.py"))
        if path.stem != "__init__"
    }


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _imported_modules(tree: ast.Module) -> set[str]:
    """Every module an ``import`` statement anywhere in ``tree`` names (or may name: the
    ``x`` of ``from p import x`` is counted as ``p.x`` too)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as a path, or None."""
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [node, nxt] if nxt in path else [node, nxt]
            if nxt not in state and (found := visit(nxt, path + [node])):
                return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node, [])):
            return found
    return None


def test_no_function_in_tools_is_longer_than_80_lines():
    long = [
        f"{name}.{node.name}: {node.end_lineno - node.lineno + 1} lines"
        for name, tree in _modules().items()
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert long == []


def test_tools_import_no_private_name_of_another_module():
    found = []
    for name, tree in _modules().items():
        module_aliases = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module != name:
                found += [
                    f"{name}: from {node.module} import {a.name}"
                    for a in node.names
                    if _private(a.name)
                ]
                module_aliases.update(a.asname or a.name for a in node.names)
            elif isinstance(node, ast.Import):
                module_aliases.update(a.asname or a.name.split(".")[0] for a in node.names)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in module_aliases
                and _private(node.attr)
            ):
                found.append(f"{name}: {node.value.id}.{node.attr}")
    assert found == []


def test_no_import_cycle_among_tools_modules():
    modules = _modules()
    graph = {
        name: {m for m in _imported_modules(tree) if m in modules and m != name}
        for name, tree in modules.items()
    }
    assert _cycle(graph) is None


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
