"""bench/mutmut_plugin.py, the pytest plugin `make mutation` loads into mutmut's test runs: a mutant's tests
run fastest first by mutmut's recorded durations, and nothing else about the run changes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _bench_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))

TESTS = """
import gc

def test_slow(): pass
def test_fast(): pass
def test_unmeasured(): pass
def test_middle(): pass
def test_heap_is_frozen_after_collection(): assert gc.get_freeze_count() > 0
"""


def _order(result: pytest.RunResult) -> list[str]:
    return [line.split("::")[1].split()[0] for line in result.outlines if "::test_" in line and "PASSED" in line]


def test_a_mutants_tests_run_fastest_first_and_unmeasured_ones_last(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_m=TESTS)
    durations = {"test_m.py::test_slow": 3.0, "test_m.py::test_fast": 0.1, "test_m.py::test_middle": 1.0,
                 "test_m.py::test_heap_is_frozen_after_collection": 0.1}
    (pytester.path / "mutmut-stats.json").write_text(json.dumps({"duration_by_test": durations}))
    result = pytester.runpytest_subprocess("-p", "bench.mutmut_plugin", "-v")
    result.assert_outcomes(passed=5)
    assert _order(result) == ["test_fast", "test_heap_is_frozen_after_collection", "test_middle", "test_slow",
                              "test_unmeasured"]


@pytest.mark.parametrize("stats", [None, "{not json", '{"tests_by_mangled_function_name": {}}'],
                         ids=["missing", "garbled", "no-durations"])
def test_without_recorded_durations_pytests_order_is_kept(pytester: pytest.Pytester, stats: str | None) -> None:
    pytester.makepyfile(test_m=TESTS)
    if stats is not None:
        (pytester.path / "mutmut-stats.json").write_text(stats)
    result = pytester.runpytest_subprocess("-p", "bench.mutmut_plugin", "-v")
    result.assert_outcomes(passed=5)
    assert _order(result) == ["test_slow", "test_fast", "test_unmeasured", "test_middle",
                              "test_heap_is_frozen_after_collection"]


def test_a_call_of_a_method_renamed_to_main_is_filed_under_the_module_that_defines_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """infra/binauthz.py sets its dynamic provider's ``__module__`` to ``__main__`` (dill pickles it by value):
    mutmut's stats run names a call by that, so the plugin finds the module holding the method's mutants and
    renames what mutmut recorded before mutmut files it under the test."""
    import types

    from mutmut.state import state

    from bench import mutmut_plugin

    module = types.ModuleType("infra.signer_under_test")
    module.__dict__["mutants_xǁ_Signerǁcreate__mutmut"] = {}
    monkeypatch.setitem(sys.modules, module.__name__, module)
    assert mutmut_plugin._defined_in("__main__.xǁ_Signerǁdiff") == "__main__.xǁ_Signerǁdiff", "no such mutants"
    monkeypatch.setattr(state(), "_stats", set())  # mutmut's own set is put back afterwards
    state()._stats.update({"__main__.xǁ_Signerǁcreate", "infra.binauthz.x_member_of"})
    mutmut_plugin.pytest_runtest_teardown()
    assert state()._stats == {"infra.signer_under_test.xǁ_Signerǁcreate", "infra.binauthz.x_member_of"}
