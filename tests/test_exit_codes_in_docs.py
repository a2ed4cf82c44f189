"""Every exit code README.md and docs/architecture.md name is the code's (workload/core/errors.py `EXIT_*`), the
README's table of exit codes lists each of them once with its meaning, and no sentence says a worker exits 0
while items are dead-lettered (it exits 4)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from workload.core import errors

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/architecture.md")
CODES = {name: value for name, value in vars(errors).items() if name.startswith("EXIT_")}
# What the README's table must say of each code: a word of its meaning.
MEANING = {"EXIT_DONE": "every item", "EXIT_FAILED": "unexpected", "EXIT_BAD_CONFIG": "configuration",
           "EXIT_INFRA": "infrastructure", "EXIT_DEAD_LETTERS": "dead-lettered", "EXIT_STALLED": "watchdog",
           "EXIT_GPU_UNUSABLE": "GPU", "EXIT_TERMINATED": "SIGTERM"}
# "exits 3", "exiting 0", "exit code 4", "Exits 0 when ..., 4 when ..., 143 on ..." (each number of such a list).
NAMED = re.compile(r"\b(?:exits?|exiting|exit code)\s+(\d+)((?:[^.;|\n]*?,\s*(?:or\s+)?\d+\s+(?:when|on|if)\b)*)",
                   re.IGNORECASE)


def named_codes(text: str) -> list[int]:
    found = []
    for m in NAMED.finditer(text):
        found.append(int(m[1]))
        found += [int(n) for n in re.findall(r",\s*(?:or\s+)?(\d+)\s+(?:when|on|if)\b", m[2])]
    return found


def test_the_pattern_finds_codes_in_prose_and_lists() -> None:
    assert named_codes("the worker exits 3; Exits 0 when done, 4 when drained, 143 on SIGTERM.") == [3, 0, 4, 143]
    assert named_codes("exit code 7 and exiting 0") == [7, 0]


@pytest.mark.parametrize("doc", DOCS)
def test_every_exit_code_a_doc_names_is_the_codes(doc: str) -> None:
    named = named_codes((ROOT / doc).read_text())
    assert set(named) - set(CODES.values()) == set(), f"{doc} names exit codes that workload/core/errors.py lacks"


def test_the_readmes_exit_table_lists_every_code_once_with_its_meaning() -> None:
    rows = re.findall(r"^\| (\d+) \| ([^|]+) \|", (ROOT / "README.md").read_text(), re.MULTILINE)
    table = {int(code): meaning for code, meaning in rows}
    assert sorted(int(code) for code, _ in rows) == sorted(CODES.values())
    for name, value in CODES.items():
        assert MEANING[name].lower() in table[value].lower(), (name, value, table[value])


@pytest.mark.parametrize("doc", DOCS)
def test_no_doc_says_a_worker_exits_0_with_dead_letters(doc: str) -> None:
    for line in (ROOT / doc).read_text().splitlines():
        if re.search(r"\bexits? 0\b", line) and "dead-letter" in line:
            assert re.search(rf"\b{errors.EXIT_DEAD_LETTERS} when\b", line), line
