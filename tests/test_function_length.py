"""No function in workload/, infra/ or policy/ is longer than a screen: a reader checks each one on its own
(issues 19 and 37); no infra component's constructor takes more than its args object and the shared pieces
(issue 37)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 60  # lines, from `def` to the function's last line, docstring and comments included
PACKAGES = ("workload", "infra", "policy")

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


def _all_long_functions() -> dict[str, int]:
    return {name: n for package in PACKAGES for name, n in long_functions(ROOT / package).items()}


def test_no_function_in_workload_infra_or_policy_is_over_the_limit() -> None:
    over = {name: n for name, n in _all_long_functions().items() if name not in ALLOWED}
    assert not over, f"functions over {LIMIT} lines (split them, or explain in ALLOWED): {over}"


def test_the_allow_list_names_only_long_functions_that_exist() -> None:
    """An entry whose function was split or renamed goes, so the list cannot hide a new long function."""
    assert set(ALLOWED) <= set(_all_long_functions())


def test_the_measure_counts_every_line_of_nested_functions_and_methods(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    body = "\n".join(f"        x{i} = {i}" for i in range(58))
    (package / "m.py").write_text(f"class C:\n    def method(self):\n{body}\n        return 1\n\n"
                                  f"def outer():\n    def inner():\n{body}\n        return 1\n    return inner\n")
    assert long_functions(package, limit=60) == {"pkg/m.py:outer": 62}, "60 lines are allowed, 62 are not"
    assert long_functions(package, limit=59) == {"pkg/m.py:C.method": 60, "pkg/m.py:outer": 62,
                                                  "pkg/m.py:outer.inner": 60}


# A component takes one args object and the shared pieces (infra.platform's bundle, or what it is wired to):
# at most this many parameters besides ``self``, ``name`` and ``opts`` (issue 37).
COMPONENT_PARAMETERS = 3


def _init_parameters(cls: ast.ClassDef) -> list[str]:
    for init in (f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"):
        a = init.args
        names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
        names += [p.arg for p in (a.vararg, a.kwarg) if p is not None]
        return [n for n in names if n not in ("self", "name", "opts")]
    return []


def wide_components(package: Path, limit: int = COMPONENT_PARAMETERS) -> dict[str, list[str]]:
    """Every ``pulumi.ComponentResource`` subclass (direct, or through a class of the same module) whose
    ``__init__`` takes more than ``limit`` parameters besides ``self``, ``name`` and ``opts``."""
    found: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        components: set[str] = set()
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            bases = {ast.unparse(b) for b in cls.bases}
            if "pulumi.ComponentResource" in bases or bases & components:
                components.add(cls.name)
                if len(rest := _init_parameters(cls)) > limit:
                    found[f"{path.relative_to(package.parent)}:{cls.name}"] = rest
    return found


def test_no_component_constructor_takes_more_than_an_args_object_and_the_shared_pieces() -> None:
    wide = wide_components(ROOT / "infra")
    assert not wide, f"component constructors over {COMPONENT_PARAMETERS} parameters besides name and opts: {wide}"
    assert len(wide_components(ROOT / "infra", limit=0)) >= 10, "the measure finds the components"


def test_the_component_measure_sees_subclasses_and_every_kind_of_parameter(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "m.py").write_text(
        "import pulumi\n"
        "class A(pulumi.ComponentResource):\n    def __init__(self, name, a, b, c, opts=None): pass\n"
        "class B(A):\n    def __init__(self, name, a, b, *, c, d, opts=None): pass\n"
        "class C(pulumi.ComponentResource):\n    def __init__(self, name, a, *rest, opts=None): pass\n"
        "class D:\n    def __init__(self, name, a, b, c, d): pass\n"
    )
    assert wide_components(package, limit=3) == {"pkg/m.py:B": ["a", "b", "c", "d"]}
    assert set(wide_components(package, limit=1)) == {"pkg/m.py:A", "pkg/m.py:B", "pkg/m.py:C"}
