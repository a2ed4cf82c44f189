"""The project's imports, read from the source of every module (imports inside functions and under
``if TYPE_CHECKING:`` included): no cycles, no private names across modules, and workload's layers
pointing down only. A cycle or an upward import makes modules that cannot be read, tested or changed
alone; a private name crossing a module is a contract nobody declared.

import-linter holds the same layers (pyproject.toml, [tool.importlinter]); this test also covers infra/,
policy/ and bench/, which import-linter's contract does not."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("workload", "infra", "policy", "bench")
SKIP_DIRS = {"venv", ".venv", "__pycache__"}  # policy/venv is the policy pack's own virtualenv

# workload's layers, top to bottom. A module may import its own subpackage and any layer below its own;
# the subpackages of one layer (model, queue) are independent of each other.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"workload.__main__"}),
    frozenset({"workload.cli"}),
    frozenset({"workload.runtime"}),
    frozenset({"workload.model", "workload.queue"}),
    frozenset({"workload.data"}),
    frozenset({"workload.share"}),
    frozenset({"workload.core"}),
)


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the project's packages (a package is its __init__)."""
    found = {}
    for package in PACKAGES:
        for dirpath, dirnames, filenames in os.walk(root / package):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            for filename in filenames:
                if filename.endswith(".py"):
                    path = Path(dirpath) / filename
                    parts = path.relative_to(root).with_suffix("").parts
                    found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


@dataclass(frozen=True)
class Use:
    """One module's use of another: an import (`name` empty), or a name taken from it."""

    source: str
    target: str
    name: str
    line: int


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` reads from (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    parts = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
    return ".".join([*parts, *([node.module] if node.module else [])])


def _owner(dotted: str, modules: dict[str, Path]) -> str | None:
    """The longest project module that `dotted` names or lies in."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in modules:
            return ".".join(parts[:n])
    return None


def uses(module: str, modules: dict[str, Path]) -> Iterator[Use]:
    """Every import of a project module in `module`, and every name it takes from one (`from m import x`,
    `m.x` through a name bound to module m)."""
    path = modules[module]
    tree = ast.parse(path.read_text(), str(path))
    bound: dict[str, str] = {}  # local name -> the project module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if target := _owner(alias.name, modules):
                    yield Use(module, target, "", node.lineno)
                    local = alias.asname or alias.name.split(".")[0]
                    bound[local] = alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, path.name == "__init__.py", node)
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    yield Use(module, f"{base}.{alias.name}", "", node.lineno)
                    bound[alias.asname or alias.name] = f"{base}.{alias.name}"
                elif base in modules:
                    yield Use(module, base, alias.name, node.lineno)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (chain := _chain(node)) and chain[0] in bound:
            dotted = [*bound[chain[0]].split("."), *chain[1:]]
            n = next(i for i in range(len(dotted), 0, -1) if ".".join(dotted[:i]) in modules)
            if n < len(dotted):  # the first name past the module: what is taken from it
                yield Use(module, ".".join(dotted[:n]), dotted[n], node.lineno)


def _chain(node: ast.Attribute) -> list[str] | None:
    """`a.b.c` as ["a", "b", "c"]; None when the chain does not start at a plain name."""
    names: list[str] = []
    cur: ast.expr = node
    while isinstance(cur, ast.Attribute):
        names.append(cur.attr)
        cur = cur.value
    return [cur.id, *reversed(names)] if isinstance(cur, ast.Name) else None


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports (`from m import x` imports m; `from p import m`, p.m)."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module in modules:
        graph[module] |= {u.target for u in uses(module, modules) if u.target != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
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


def private_uses(modules: dict[str, Path]) -> list[str]:
    return [f"{modules[u.source].relative_to(ROOT)}:{u.line} uses {u.target}.{u.name}"
            for module in sorted(modules) for u in uses(module, modules)
            if u.name and _private(u.name) and u.target != u.source]


def layer_of(module: str) -> tuple[int, str] | None:
    """(layer number, top is 0; the layer's package) of a workload module; None outside the layers."""
    for number, layer in enumerate(LAYERS):
        for package in layer:
            if module == package or module.startswith(package + "."):
                return number, package
    return None


def _in_workload(module: str) -> bool:
    return module == "workload" or module.startswith("workload.")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports by a workload module of a module in its own layer (another package) or a layer above.
    infra/, policy/ and bench/ stand outside the layers and may use any of them; so may every module use
    the package root (its version), which imports nothing."""
    bad = []
    for source in sorted(m for m in graph if _in_workload(m)):
        for target in sorted(t for t in graph[source] if _in_workload(t) and t != "workload"):
            here, there = layer_of(source), layer_of(target)
            if here is None or there is None or (there[1] != here[1] and there[0] <= here[0]):
                bad.append(f"{source} -> {target}")
    return bad


@pytest.fixture(scope="module")
def modules() -> dict[str, Path]:
    return module_files()


def test_the_walk_sees_every_package_and_the_nested_imports(modules: dict[str, Path]) -> None:
    """A walk that missed a package, a function-level import or a TYPE_CHECKING one would pass vacuously."""
    assert {"workload", "workload.core.errors", "infra.render", "policy.offline", "bench.mutation"} <= set(modules)
    graph = import_graph(modules)
    assert "workload.model.hparams" in graph["infra.config"], "infra.config imports it inside a function"
    assert "infra.render" in graph["policy.offline"]
    assert not any(name.startswith(("policy.venv", "tests")) for name in modules)


def test_no_import_cycles(modules: dict[str, Path]) -> None:
    assert cycles(import_graph(modules)) == []


def test_no_module_uses_another_modules_private_names(modules: dict[str, Path]) -> None:
    assert private_uses(modules) == []


def test_workload_imports_only_point_down_its_layers(modules: dict[str, Path]) -> None:
    """entry points -> runtime -> model | queue -> data -> share -> core; every workload module sits in one."""
    graph = import_graph(modules)
    assert [m for m in graph if m.startswith("workload.") and layer_of(m) is None] == []
    assert graph["workload"] == set(), "the package root is imported by every layer: it imports nothing"
    assert upward_imports(graph) == []


def test_import_linter_holds_the_same_layers() -> None:
    """`lint-imports` with the contract in pyproject.toml: the layers as the tool the ecosystem knows."""
    lint = Path(sys.executable).with_name("lint-imports")
    assert lint.exists(), "import-linter is pinned in requirements-test.txt"
    done = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 kept, 0 broken" in done.stdout
