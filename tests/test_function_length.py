"""No function in workload/ is longer than a screen: a reader checks each one on its own (issue 19)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 60  # lines, from `def` to the function's last line, docstring and comments included

# "module.py:qualified.name": why splitting it would hurt. Empty: every function fits.
ALLOWED: dict[str, str] = {}


def long_functions(package: Path, limit: int = LIMIT) -> dict[str, int]:
    """Every function (nested and methods too) of `package` over `limit` lines, by module:qualified name."""
    found: dict[str, int] = {}
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        stack: list[tuple[ast.AST, str]] = [(tree, "")]
        while stack:
            node, prefix = stack.pop()
            for child in ast.iter_child_nodes(node):
                name = f"{prefix}{getattr(child, 'name', '')}"
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = child.end_lineno - child.lineno + 1
                    if lines > limit:
                        found[f"{path.relative_to(package.parent)}:{name}"] = lines
                    stack.append((child, f"{name}."))
                elif isinstance(child, ast.ClassDef):
                    stack.append((child, f"{name}."))
                else:
                    stack.append((child, prefix))
    return found


def test_no_function_in_workload_is_over_the_limit() -> None:
    over = {name: n for name, n in long_functions(ROOT / "workload").items() if name not in ALLOWED}
    assert not over, f"functions over {LIMIT} lines (split them, or explain in ALLOWED): {over}"


def test_the_allow_list_names_only_long_functions_that_exist() -> None:
    """An entry whose function was split or renamed goes, so the list cannot hide a new long function."""
    assert set(ALLOWED) <= set(long_functions(ROOT / "workload"))


def test_the_measure_counts_every_line_of_nested_functions_and_methods(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    body = "\n".join(f"        x{i} = {i}" for i in range(58))
    (package / "m.py").write_text(f"class C:\n    def method(self):\n{body}\n        return 1\n\n"
                                  f"def outer():\n    def inner():\n{body}\n        return 1\n    return inner\n")
    assert long_functions(package, limit=60) == {"pkg/m.py:outer": 62}, "60 lines are allowed, 62 are not"
    assert long_functions(package, limit=59) == {"pkg/m.py:C.method": 60, "pkg/m.py:outer": 62,
                                                  "pkg/m.py:outer.inner": 60}
