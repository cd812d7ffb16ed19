"""Fails on a function over 80 lines, or a use of another module's private name, in the package.

Two house rules, checked on the source with ``ast``:

- No function (method, nested function) is longer than ``MAX_FUNCTION_LINES`` lines, from
  its ``def`` to its last line. Each one over is printed as ``path:line``, its name and length.
- No module uses a private (``_underscore``, not dunder) name of another module of the
  package: ``from package.x import _name`` (relative imports too), ``module._name`` where
  ``module`` is an imported package module (``import package.x as module``,
  ``from package import x``, ``package.x._name``), and ``obj._name`` where ``obj`` is known
  to hold an instance of a class of another package module: a parameter annotated with that
  class (``obj: Cls``, ``obj: Cls | None``), or ``self.obj`` assigned such a parameter or
  ``Cls(...)``, or annotated with the class, in the class's methods. Give the owner a public
  name (a method or function with a docstring) instead.

The allow-lists below name what is over today and is being rewritten; they must only shrink.
An entry that no longer matches anything is printed as a note (remove it).

Usage: python .ci/check_code.py [PACKAGE_DIR]   (default: zephon_jax)
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

MAX_FUNCTION_LINES = 80

# Functions over MAX_FUNCTION_LINES lines allowed for now: (path in the package, qualified
# name). This list must only shrink: remove an entry once its function is short; never add one.
LONG_FUNCTIONS_ALLOWED: frozenset[tuple[str, str]] = frozenset()

# Uses of another module's private names allowed for now: (path in the package, the use as
# written). Empty: a module that needs another's member uses its public name.
PRIVATE_USES_ALLOWED: frozenset[tuple[str, str]] = frozenset()


@dataclass(frozen=True)
class Finding:
    """One breach of a rule: where (``path`` in the package, ``line``), the allow-list
    ``key`` (a function's qualified name, or a private use as written) and the message."""

    path: str
    line: int
    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


@dataclass
class Module:
    """One source file of the package: its dotted ``name``, ``path`` in the package, tree."""

    name: str
    path: str
    is_package: bool
    tree: ast.Module


def is_private(name: str) -> bool:
    """``_name`` and ``__name``, but not ``_`` or a dunder ``__name__``."""
    return name.startswith("_") and name != "_" and not (name.endswith("__") and len(name) > 4)


def load_modules(root: Path) -> dict[str, Module]:
    """Every ``.py`` file under the package directory ``root``, by dotted module name."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        relative = path.relative_to(root).as_posix()
        modules[name] = Module(name, relative, is_package, ast.parse(path.read_text(), str(path)))
    return modules


# ----- long functions --------------------------------------------------------------------


def long_functions(root: Path, limit: int = MAX_FUNCTION_LINES) -> list[Finding]:
    """The functions under ``root`` longer than ``limit`` lines, in file and line order."""
    found = []
    for module in load_modules(root).values():
        for qualname, node in functions(module.tree):
            length = node.end_lineno - node.lineno + 1 if node.end_lineno else 0
            if length > limit:
                message = f"{qualname} is {length} lines long (at most {limit})"
                found.append(Finding(module.path, node.lineno, qualname, message))
    return found


def functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, ast.FunctionDef]]:
    """Every function in ``tree`` with its qualified name (``Class.method``, ``outer.inner``)."""
    found: list[tuple[str, ast.FunctionDef]] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            qualname = f"{prefix}{node.name}"
            if not isinstance(node, ast.ClassDef):
                found.append((qualname, node))  # type: ignore[arg-type]
            found += functions(node, qualname + ".")
        else:
            found += functions(node, prefix)
    return found


# ----- private names ---------------------------------------------------------------------


class Names:
    """What the names bound by one module's imports refer to in the package."""

    def __init__(self, module: Module, modules: dict[str, Module]):
        self.module = module
        self.modules = modules
        self.package = next(iter(modules)).split(".")[0] if modules else ""
        self.module_of: dict[str, str] = {}  # local name -> package module
        self.class_of: dict[str, tuple[str, str]] = {}  # local name -> (module, class)

    def base(self, node: ast.ImportFrom) -> str:
        """The absolute module a ``from ... import`` statement imports from."""
        if not node.level:
            return node.module or ""
        anchor = self.module.name.split(".")
        anchor = anchor if self.module.is_package else anchor[:-1]
        anchor = anchor[: len(anchor) - node.level + 1]
        return ".".join(anchor + ([node.module] if node.module else []))

    def classes(self, module: str) -> set[str]:
        """The names of the top-level classes of package module ``module``."""
        tree = self.modules[module].tree
        return {n.name for n in tree.body if isinstance(n, ast.ClassDef)}

    def bind(self, node: ast.Import | ast.ImportFrom) -> None:
        """Notes the package modules and classes that ``node`` binds to local names."""
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == self.package:
                    local = alias.asname or alias.name.split(".")[0]
                    self.module_of[local] = alias.name if alias.asname else self.package
            return
        base = self.base(node)
        for alias in node.names:
            local = alias.asname or alias.name
            if f"{base}.{alias.name}" in self.modules:
                self.module_of[local] = f"{base}.{alias.name}"
            elif base in self.modules and alias.name in self.classes(base):
                self.class_of[local] = (base, alias.name)

    def module_named(self, node: ast.expr) -> str | None:
        """The package module that expression ``node`` (``a`` or ``a.b.c``) names, if any."""
        if isinstance(node, ast.Name):
            return self.module_of.get(node.id)
        if isinstance(node, ast.Attribute):
            outer = self.module_named(node.value)
            if outer is not None and f"{outer}.{node.attr}" in self.modules:
                return f"{outer}.{node.attr}"
        return None

    def class_named(self, annotation: ast.expr | None) -> tuple[str, str] | None:
        """The other module's class an annotation names: ``Cls``, ``mod.Cls``, ``Cls | None``,
        ``Optional[Cls]`` or one of these as a string; else ``None``."""
        if annotation is None:
            return None
        if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
            try:
                return self.class_named(ast.parse(annotation.value, mode="eval").body)
            except SyntaxError:
                return None
        if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
            sides = [annotation.left, annotation.right]
            if any(isinstance(s, ast.Constant) and s.value is None for s in sides):
                return self.class_named(next(s for s in sides if not isinstance(s, ast.Constant)))
            return None
        if isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value) == "Optional":
            return self.class_named(annotation.slice)
        if isinstance(annotation, ast.Name):
            return self.class_of.get(annotation.id)
        if isinstance(annotation, ast.Attribute):
            owner = self.module_named(annotation.value)
            if owner is not None and annotation.attr in self.classes(owner):
                return (owner, annotation.attr)
        return None


def private_uses(root: Path) -> list[Finding]:
    """The uses of other modules' private names under ``root``, in file and line order."""
    modules = load_modules(root)
    owners = attribute_owners(modules)
    found: list[Finding] = []
    for module in modules.values():
        names = Names(module, modules)
        for node in ast.walk(module.tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names.bind(node)
                if isinstance(node, ast.ImportFrom):
                    found += private_imports(module, names, node)
        found += private_module_attributes(module, names)
        found += private_instance_attributes(module, names)
        found += foreign_attributes(module, owners[module.name])
    unique = {(f.path, f.line, f.key): f for f in found}
    return sorted(unique.values(), key=lambda f: (f.path, f.line, f.key))


def private_imports(module: Module, names: Names, node: ast.ImportFrom) -> list[Finding]:
    """``from package.x import _name`` in ``module``, ``x`` being another package module."""
    base = names.base(node)
    if base.split(".")[0] != names.package or base == module.name:
        return []
    return [
        Finding(
            module.path,
            node.lineno,
            f"from {base} import {alias.name}",
            f"imports {alias.name}, a private name of {base}",
        )
        for alias in node.names
        if is_private(alias.name)
    ]


def private_module_attributes(module: Module, names: Names) -> list[Finding]:
    """``mod._name`` in ``module``, ``mod`` naming another package module."""
    found = []
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            owner = names.module_named(node.value)
            if owner is not None and owner != module.name:
                use = ast.unparse(node)
                found.append(
                    Finding(module.path, node.lineno, use, f"{use}: a private name of {owner}")
                )
    return found


def private_instance_attributes(module: Module, names: Names) -> list[Finding]:
    """``param._name`` and ``self.attr._name`` in ``module`` on instances of other package
    modules' classes (known from annotations and assignments; see the module docstring)."""
    found = []
    for node in ast.walk(module.tree):
        if isinstance(node, ast.ClassDef):
            found += instance_uses(module, names, node, self_attributes(names, node))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += instance_uses(module, names, node, {})
    return list({(f.path, f.line, f.key): f for f in found}.values())


def defined_attributes(tree: ast.AST) -> set[str]:
    """The attribute names that the classes of ``tree`` define: in a class body (methods,
    class attributes) or as ``self.name = ...`` in their methods."""
    defined: set[str] = set()
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        for item in cls.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(item.name)
            for target, _, _ in assignments(item):
                if isinstance(target, ast.Name):
                    defined.add(target.id)
        for node in ast.walk(cls):
            for target, _, _ in assignments(node):
                if isinstance(target, ast.Attribute) and ast.unparse(target.value) == "self":
                    defined.add(target.attr)
    return defined


def attribute_owners(modules: dict[str, Module]) -> dict[str, dict[str, set[str]]]:
    """Per module, the private attribute names that its classes define, and for each the
    other modules whose classes define it: ``{module: {name: owners}}`` (empty owners for
    a name the module defines itself)."""
    defined = {name: defined_attributes(m.tree) for name, m in modules.items()}
    by_name: dict[str, set[str]] = {}
    for module, names in defined.items():
        for name in filter(is_private, names):
            by_name.setdefault(name, set()).add(module)
    return {
        module: {name: set() if module in owners else owners for name, owners in by_name.items()}
        for module in modules
    }


def foreign_attributes(module: Module, owners: dict[str, set[str]]) -> list[Finding]:
    """``obj._name`` (``obj`` not ``self`` or ``cls``) in ``module`` where no class of
    ``module`` defines ``_name`` but a class of another package module does (``owners``,
    from :func:`attribute_owners`): that module's private attribute, whatever ``obj`` is."""
    found = []
    for node in ast.walk(module.tree):
        if not (isinstance(node, ast.Attribute) and is_private(node.attr)):
            continue
        receiver = ast.unparse(node.value)
        if not owners.get(node.attr) or receiver in ("self", "cls"):
            continue
        use = ast.unparse(node)
        where = " or ".join(sorted(owners[node.attr]))
        found.append(Finding(module.path, node.lineno, use, f"{use}: a private name of {where}"))
    return found


def parameter_classes(names: Names, function: ast.AST) -> dict[str, tuple[str, str]]:
    """The parameters of ``function`` annotated with another module's class."""
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return {}
    args = function.args
    every = args.posonlyargs + args.args + args.kwonlyargs
    typed = {a.arg: names.class_named(a.annotation) for a in every}
    return {name: cls for name, cls in typed.items() if cls is not None}


def self_attributes(names: Names, cls: ast.ClassDef) -> dict[str, tuple[str, str]]:
    """The attributes ``self.x`` of class ``cls`` that hold another module's class: annotated
    with it, or assigned ``Cls(...)`` or a parameter annotated with it, in its methods."""
    held: dict[str, tuple[str, str]] = {}
    for item in cls.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            if (owner := names.class_named(item.annotation)) is not None:
                held[item.target.id] = owner
    for method in cls.body:
        if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        parameters = parameter_classes(names, method)
        for node in ast.walk(method):
            for target, value, annotation in assignments(node):
                if not (isinstance(target, ast.Attribute) and ast.unparse(target.value) == "self"):
                    continue
                owner = names.class_named(annotation)
                if owner is None and isinstance(value, ast.Name):
                    owner = parameters.get(value.id)
                if owner is None and isinstance(value, ast.Call):
                    owner = names.class_named(value.func)
                if owner is not None:
                    held[target.attr] = owner
    return held


def assignments(node: ast.AST) -> list[tuple[ast.expr, ast.expr | None, ast.expr | None]]:
    """(target, value, annotation) of each single-target assignment that ``node`` is."""
    if isinstance(node, ast.Assign):
        return [(t, node.value, None) for t in node.targets]
    if isinstance(node, ast.AnnAssign):
        return [(node.target, node.value, node.annotation)]
    return []


def instance_uses(
    module: Module, names: Names, scope: ast.AST, held: dict[str, tuple[str, str]]
) -> list[Finding]:
    """The private attribute uses on other modules' instances in ``scope`` (a class, whose
    ``self.x`` are ``held``, or a function, whose annotated parameters are known)."""
    found = []
    for function in ast.walk(scope):
        parameters = parameter_classes(names, function)
        for node in ast.walk(function):
            if not (isinstance(node, ast.Attribute) and is_private(node.attr)):
                continue
            value = node.value
            owner = None
            if isinstance(value, ast.Name):
                owner = parameters.get(value.id)
            elif isinstance(value, ast.Attribute) and ast.unparse(value.value) == "self":
                owner = held.get(value.attr)
            if owner is not None and owner[0] != module.name:
                use = ast.unparse(node)
                message = f"{use}: a private name of {owner[0]}.{owner[1]}"
                found.append(Finding(module.path, node.lineno, use, message))
    return found


# ----- the check -------------------------------------------------------------------------


def check(
    root: Path,
    long_allowed: frozenset[tuple[str, str]] = LONG_FUNCTIONS_ALLOWED,
    private_allowed: frozenset[tuple[str, str]] = PRIVATE_USES_ALLOWED,
) -> tuple[list[Finding], list[str]]:
    """The findings under package directory ``root`` not allowed, and notes on the allow-list
    entries that match nothing (to remove)."""
    failures, notes = [], []
    for findings, allowed, kind in (
        (long_functions(root), long_allowed, "long function"),
        (private_uses(root), private_allowed, "private use"),
    ):
        keys = {(f.path, f.key) for f in findings}
        failures += [f for f in findings if (f.path, f.key) not in allowed]
        notes += [
            f"{kind} {path}: {key} is allowed but not found: remove it from the allow-list"
            for path, key in sorted(allowed - keys)
        ]
    return failures, notes


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "zephon_jax").resolve()
    failures, notes = check(root)
    for note in notes:
        print(f"   note: {note}")
    for failure in failures:
        print(f"CI: {failure}", file=sys.stderr)
    print(f"code: {len(failures)} breaches of the function length and private name rules")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
