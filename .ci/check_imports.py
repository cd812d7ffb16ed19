"""Fails on an import circle among the package's modules, function-local imports included.

lint-imports (pyproject.toml, [tool.importlinter]) checks the layers between subpackages;
this checks what it cannot see: a circle inside one layer (a -> b -> a), including one
hidden by importing inside a function. Imports under ``if TYPE_CHECKING:`` are left out
(they never run). Prints the module count and the function-local imports it found.

Usage: python .ci/check_imports.py [PACKAGE_DIR]   (default: zephon_jax)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(node: ast.AST, name: str, is_package: bool, known: set[str]) -> list[str]:
    """The package modules that one import statement in module ``name`` loads."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            anchor = name.split(".") if is_package else name.split(".")[:-1]
            anchor = anchor[: len(anchor) - node.level + 1]
            base = ".".join(anchor + ([base] if base else []))
        # ``from package import module`` loads that module; ``from module import name``
        # loads the module.
        targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    else:
        return []
    return [t for t in targets if t in known]


def type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` blocks."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return skipped


def graph(root: Path) -> tuple[dict[str, set[str]], list[str]]:
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    known = set(files)
    edges: dict[str, set[str]] = {name: set() for name in files}
    local: list[str] = []
    for name, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        skipped = type_checking_nodes(tree)
        functions = [
            n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        ]
        in_function = {id(inner) for f in functions for inner in ast.walk(f)}
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            targets = imported(node, name, path.name == "__init__.py", known)
            edges[name].update(t for t in targets if t != name)
            if targets and id(node) in in_function:
                local.append(f"{path}:{getattr(node, 'lineno', 0)}: {ast.unparse(node)}")
    return edges, local


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "zephon_jax").resolve()
    edges, local = graph(root)
    found = circles(edges)
    print(f"imports: {len(edges)} modules, {len(local)} function-local imports of the package")
    for line in local:
        print(f"   local: {line}")
    for component in found:
        print(f"CI: import circle among {', '.join(component)}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
