"""bench/mutation_equivalent.toml, the explained survivors `make mutation` loads: it loads, every entry is well
formed and names a module that exists, every shared reason is used, and a malformed entry is refused naming it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from bench import mutation

ROOT = Path(__file__).resolve().parent.parent


def test_the_data_file_loads_and_every_entry_is_well_formed() -> None:
    data = tomllib.loads(mutation.EQUIVALENT_FILE.read_text())
    entries, reasons = data["equivalent"], data["reasons"]
    assert set(data) == {"reasons", "equivalent"}
    rules = mutation.load_equivalent()
    assert rules == mutation.EQUIVALENT and len(rules) >= len(entries) > 100
    for i, entry in enumerate(entries, 1):
        assert set(entry) in ({"module", "before", "after", "why"}, {"module", "before", "after", "reason"}), i
        assert entry["module"] == "*" or (ROOT / entry["module"]).is_file(), f"entry {i}: {entry['module']}"
        assert entry["before"] and isinstance(entry["before"], str), i
        afters = [entry["after"]] if isinstance(entry["after"], str) else entry["after"]
        assert afters and all(isinstance(a, str) and a != entry["before"] for a in afters), i
        why = entry.get("why") or reasons[entry["reason"]]
        assert isinstance(why, str) and why.strip() == why and "\n" not in why, i
    used = {e["reason"] for e in entries if "reason" in e}
    assert used == set(reasons), f"shared reasons no entry uses: {sorted(set(reasons) - used)}"
    assert sum(len(e["after"]) if isinstance(e["after"], list) else 1 for e in entries) == len(rules)


def test_the_rules_explain_what_they_did_before_the_move() -> None:
    """Three rules as bench/mutation.py declared them, read back from the data file unchanged."""
    explains = [e for e in mutation.EQUIVALENT if e.explains("workload/model/metrics.py",
                                                              'order = np.argsort(-scores, kind="mergesort")',
                                                              "order = np.argsort(-scores, kind=None)")]
    assert [e.why for e in explains][:1] == [tomllib.loads(mutation.EQUIVALENT_FILE.read_text())["reasons"]["TIES"]]
    assert mutation._why("workload/cli.py", 'level = os.environ.get("LOG_LEVEL", "INFO").upper()',
                         'level = os.environ.get("LOG_LEVEL", "info").upper()').startswith("the default is upper-cased")
    assert mutation._why("workload/cli.py", "x = 1", "x = 2") == ""


@pytest.mark.parametrize(("text", "error"), [
    ('[[equivalent]]\nmodule = "a.py"\nbefore = "x"\nafter = "y"\n', "give exactly one of why"),
    ('[[equivalent]]\nmodule = "a.py"\nbefore = "x"\nafter = "y"\nwhy = "w"\nreason = "R"\n', "give exactly one"),
    ('[[equivalent]]\nmodule = "a.py"\nbefore = "x"\nafter = "y"\nreason = "R"\n', "reason 'R' is not in [reasons]"),
    ('[[equivalent]]\nmodule = "a.py"\nbefore = ""\nafter = "y"\nwhy = "w"\n', "before must be the non-empty text"),
    ('[[equivalent]]\nmodule = "a.py"\nbefore = "x"\nafter = []\nwhy = "w"\n', "after must be a text or a non-empty"),
    ('[[equivalent]]\nmodule = "a.py"\nbefore = "x"\nafter = [1]\nwhy = "w"\n', "after must be a text or a non-empty"),
    ('[[equivalent]]\nbefore = "x"\nafter = "y"\nwhy = "w"\n', "module must be a path"),
    ('[[equivalent]]\nmodule = "a.py"\nbefore = "x"\nafter = "y"\nwhy = ""\n', "why must be a non-empty text"),
    ('[[equivalent]]\nmodule = "a.py"\nbefore = "x"\nafter = "y"\nwhy = "w"\nwhen = 1\n', "unknown key(s) ['when']"),
    ('[reasons]\nR = 3\n', "[reasons] must map names to non-empty texts"),
    ('[other]\n', "unknown table(s) ['other']"),
])
def test_a_malformed_entry_is_refused_in_one_line_naming_it(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "equivalent.toml"
    path.write_text('[reasons]\nOK = "fine"\n' + text if not text.startswith("[reasons]") else text)
    with pytest.raises(ValueError, match=re.escape(error)) as err:
        mutation.load_equivalent(path)
    assert "\n" not in str(err.value) and str(err.value).startswith(str(path))
    if "[[equivalent]]" in text:
        assert ": entry 1: " in str(err.value)


def test_an_entry_with_several_afters_is_one_rule_each_in_the_files_order(tmp_path: Path) -> None:
    path = tmp_path / "equivalent.toml"
    path.write_text('[reasons]\nR = "shared"\n\n[[equivalent]]\nmodule = "*"\nbefore = "a"\nafter = ["b", "c"]\n'
                    'reason = "R"\n\n[[equivalent]]\nmodule = "m.py"\nbefore = "d"\nafter = "e"\nwhy = "own"\n')
    assert mutation.load_equivalent(path) == (mutation.Equivalent("*", "a", "b", "shared"),
                                              mutation.Equivalent("*", "a", "c", "shared"),
                                              mutation.Equivalent("m.py", "d", "e", "own"))
