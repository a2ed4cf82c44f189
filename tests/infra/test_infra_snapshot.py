"""`make render` for every stack declares exactly what the committed snapshot says (tests/infra/snapshot.py).

A refactoring of infra/ leaves these files byte for byte; a change meant to alter a stack regenerates them with
``python -m tests.infra.snapshot`` in a commit of its own that says what changed and why."""

from __future__ import annotations

import difflib

import pytest

from tests.infra import snapshot


@pytest.mark.parametrize("stack", snapshot.stacks())
def test_the_rendered_stack_is_the_committed_snapshot(stack: str) -> None:
    expected = snapshot.path(stack).read_text()
    actual = snapshot.dumps(stack)
    if actual != expected:
        lines = expected.splitlines(True), actual.splitlines(True)
        diff = "".join(difflib.unified_diff(*lines, "committed", "now", n=2))
        pytest.fail(f"{stack} renders differently from {snapshot.path(stack).name} "
                    f"(regenerate deliberately: python -m tests.infra.snapshot {stack}):\n{diff[:6000]}")


def test_every_stack_has_a_snapshot_and_no_snapshot_is_left_over() -> None:
    assert sorted(p.stem for p in snapshot.SNAPSHOT_DIR.glob("*.json")) == sorted(snapshot.stacks())
