"""bench/mutmut_plugin.py, the pytest plugin `make mutation` loads into mutmut's test runs: a mutant's tests
run fastest first by mutmut's recorded durations, and nothing else about the run changes."""

from __future__ import annotations

import json
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
