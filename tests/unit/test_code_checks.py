"""The CI's code checks (.ci/check_code.py, .ci/check_imports.py) on small source trees written
here, each clean or breaking one rule, and on the package itself."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import zephon_jax

CI = Path(__file__).resolve().parents[2] / ".ci"
PACKAGE = Path(zephon_jax.__file__).parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"ci_{name}", CI / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


check_code = _load("check_code")
check_imports = _load("check_imports")


def _tree(root: Path, files: dict[str, str]) -> Path:
    """Package ``pkg`` under ``root`` with ``files`` (path in the package -> source)."""
    package = root / "pkg"
    for path, source in {"__init__.py": "", **files}.items():
        target = package / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(textwrap.dedent(source))
    return package


OWNER = """
    class Store:
        def __init__(self):
            self._rows = []

        def _grow(self):
            self._rows.append(0)

        def size(self):
            self._grow()  # its own private names: fine
            return len(self._rows)


    def _helper():
        return 1


    def helper():
        return _helper()
"""

CLEAN = {
    "store.py": OWNER,
    "user.py": """
        import json

        from pkg import store
        from pkg.store import Store, helper


        class Local:
            def __init__(self):
                self._seen = 0

            def same(self, other: "Local") -> bool:
                return other._seen == self._seen  # this module's own class


        def use(s: Store, encoder) -> int:
            json.dumps(encoder._spec if hasattr(encoder, "_spec") else None)  # not ours
            return s.size() + helper() + store.helper() + len(store.__name__)
    """,
}


def _function(name: str, lines: int) -> str:
    """Source of a function ``name`` exactly ``lines`` lines long."""
    return f"def {name}():\n" + "    x = 0\n" * (lines - 2) + "    return x\n"


def _private_uses(tmp_path: Path, user: str) -> list[str]:
    root = _tree(tmp_path, {"store.py": OWNER, "sub/__init__.py": "", "sub/user.py": user})
    return [f"{f.path}:{f.key}" for f in check_code.private_uses(root)]


def test_clean_tree_passes_both_checks(tmp_path):
    root = _tree(tmp_path, {**CLEAN, "long_enough.py": _function("f", 80)})
    assert check_code.check(root, frozenset(), frozenset()) == ([], [])
    assert check_imports.circles(check_imports.graph(root)[0]) == []


def test_function_over_80_lines_fails_with_its_place_and_length(tmp_path):
    source = "class Big:\n" + textwrap.indent(_function("build", 81), "    ")
    root = _tree(tmp_path, {**CLEAN, "big.py": source, "ok.py": _function("f", 80)})
    found = check_code.long_functions(root)
    assert [str(f) for f in found] == ["big.py:2: Big.build is 81 lines long (at most 80)"]
    failures, _ = check_code.check(root, frozenset(), frozenset())
    assert failures == found


def test_allow_list_lets_a_listed_function_pass_and_notes_a_stale_entry(tmp_path):
    root = _tree(tmp_path, {"big.py": _function("build", 90)})
    allowed = frozenset({("big.py", "build"), ("gone.py", "old")})
    failures, notes = check_code.check(root, allowed, frozenset())
    assert failures == []
    assert notes == [
        "long function gone.py: old is allowed but not found: remove it from the allow-list"
    ]


@pytest.mark.parametrize(
    "user, found",
    [
        ("from pkg.store import _helper\n", ["sub/user.py:from pkg.store import _helper"]),
        ("from ..store import Store, _helper\n", ["sub/user.py:from pkg.store import _helper"]),
        ("from pkg import store\nstore._helper()\n", ["sub/user.py:store._helper"]),
        ("import pkg.store as s\ns._helper()\n", ["sub/user.py:s._helper"]),
        ("import pkg.store\npkg.store._helper()\n", ["sub/user.py:pkg.store._helper"]),
        (
            "from pkg.store import Store\ndef f(s: Store | None):\n    return s._rows\n",
            ["sub/user.py:s._rows"],
        ),
        (
            "from pkg import store\nclass Holder:\n    def __init__(self):\n"
            "        self.store = store.Store()\n    def n(self):\n"
            "        return self.store._grow()\n",
            ["sub/user.py:self.store._grow"],
        ),
        ("def f(anything):\n    return anything._rows\n", ["sub/user.py:anything._rows"]),
    ],
    ids=["import", "relative", "module", "alias", "dotted", "param", "self-attr", "untyped"],
)
def test_private_name_of_another_module_fails(tmp_path, user, found):
    assert _private_uses(tmp_path, user) == found
    failures, _ = check_code.check(tmp_path / "pkg", frozenset(), frozenset())
    assert len(failures) == len(found)


def test_private_names_of_own_module_and_of_other_libraries_pass(tmp_path):
    assert _private_uses(tmp_path, CLEAN["user.py"]) == []


def test_import_circle_is_found_also_through_a_function_local_import(tmp_path):
    root = _tree(
        tmp_path,
        {
            "a.py": "from pkg import b\n",
            "b.py": "def later():\n    from pkg.a import x\n",
            "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n",
            "d.py": "from pkg import c\n",
        },
    )
    edges, local = check_imports.graph(root)
    assert check_imports.circles(edges) == [["pkg.a", "pkg.b"]]
    assert [line.split(": ", 1)[1] for line in local] == ["from pkg.a import x"]


@pytest.mark.parametrize("script", ["check_code.py", "check_imports.py"])
def test_scripts_exit_1_on_a_breach_and_0_on_a_clean_tree(tmp_path, script):
    bad = _tree(
        tmp_path / "bad",
        {"a.py": "from pkg.b import _x\n", "b.py": "from pkg import a\n_x = 1\n"},
    )
    clean = _tree(tmp_path / "clean", CLEAN)
    for root, code in ((bad, 1), (clean, 0)):
        run = subprocess.run(
            [sys.executable, str(CI / script), str(root)], capture_output=True, text=True
        )
        assert run.returncode == code, run.stdout + run.stderr


def test_the_package_passes_both_checks():
    failures, _ = check_code.check(PACKAGE)
    assert [str(f) for f in failures] == []
    assert check_imports.circles(check_imports.graph(PACKAGE)[0]) == []


def test_the_allow_lists_hold_only_what_is_found_today():
    """Each allow-list entry matches a breach in the package (an entry that no longer does
    is noted by the script; here it must be removed)."""
    _, notes = check_code.check(PACKAGE)
    assert notes == []
