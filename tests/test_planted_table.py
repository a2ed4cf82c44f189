"""`make planted`'s table stays true to the tree: a refactor that moves a planted bug's source text, or
renames a test that must catch it, fails here in `make test` instead of in the next planted run (or,
worse, planting nothing). No pytest runs: source text and test names are read from the files."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bench import planted

ROOT = Path(__file__).resolve().parents[1]
IDS = [b.id for b in planted.BUGS]


def test_bug_ids_are_unique() -> None:
    assert len(IDS) == len(set(IDS))


@pytest.mark.parametrize("bug", planted.BUGS, ids=IDS)
def test_every_edit_applies_exactly_once_and_leaves_valid_python(bug: planted.Bug, tmp_path: Path) -> None:
    for e in bug.edits:
        source = ROOT / e.file
        assert source.is_file(), f"{bug.id}: {e.file} does not exist; update BUGS in bench/planted.py"
        copy = tmp_path / e.file
        if not copy.exists():
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_text(source.read_text())
        assert e.before != e.after, f"{bug.id}: an edit that changes nothing"
    planted.plant(tmp_path, bug)  # Stale unless each `before` is found exactly once
    for e in bug.edits:
        ast.parse((tmp_path / e.file).read_text(), filename=e.file)  # a planted bug, not a syntax error


def _test_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {node.name for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")}


@pytest.mark.parametrize("bug", planted.BUGS, ids=IDS)
def test_every_named_test_exists(bug: planted.Bug) -> None:
    assert bug.tests, f"{bug.id}: no test is named to catch it"
    for node in bug.tests:
        file, sep, name = node.partition("::")
        assert sep and name, f"{bug.id}: {node!r} is not file::test_function"
        assert (ROOT / file).is_file(), f"{bug.id}: {file} does not exist; update BUGS in bench/planted.py"
        assert name in _test_functions(ROOT / file), f"{bug.id}: no test {name} in {file}"


def test_plant_refuses_text_found_twice_or_not_at_all(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("x = 1\nx = 1\n")
    twice = planted.Bug("t", "twice", (planted.Edit("m.py", "x = 1\n", "x = 2\n"),), ("t.py::test_t",))
    with pytest.raises(planted.Stale, match="found 2 times"):
        planted.plant(tmp_path, twice)
    gone = planted.Bug("t", "gone", (planted.Edit("m.py", "y = 1\n", "y = 2\n"),), ("t.py::test_t",))
    with pytest.raises(planted.Stale, match="found 0 times"):
        planted.plant(tmp_path, gone)
    assert (tmp_path / "m.py").read_text() == "x = 1\nx = 1\n"
