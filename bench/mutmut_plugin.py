"""pytest plugin for `make mutation` only: mutmut's pytest command line loads it (``-p bench.mutmut_plugin`` in
``[tool.mutmut] pytest_add_cli_args``, pyproject.toml); `make test` never does. It changes what a mutant's run
costs, never its verdict: the same tests run, with the same fixtures and assertions.

- A mutant's tests run fastest first. mutmut stops a mutant's run at the first failing test (``-x``), so a
  mutant that a quick test kills should not wait for the slow ones. mutmut's fork runner sorts a mutant's
  tests by their measured duration; its fork server (``process_isolation = "forkserver"``, mutmut 3.8)
  hands them over in set order, so they are sorted here, by the durations mutmut recorded in its stats run
  (``mutmut-stats.json`` in the folder the tests run in).
- Everything loaded by the time the tests are collected is moved out of the garbage collector's sight
  (``gc.freeze()``): the fork server forks every mutant's run from a process that collected the tests, and a
  full collection there walks every object of pandas, torch and the Pulumi SDKs, copying the memory pages
  it touches, for objects that live as long as the process anyway.
- Calls of functions whose ``__module__`` the code set to ``"__main__"`` are filed in the stats run under the
  module that defines them. infra/binauthz.py does that to its Pulumi dynamic provider's class and methods (so
  that dill pickles them by value); mutmut names a call by the called function's ``__module__``, so no test
  was ever mapped to those methods and all their mutants were "no tests", never run. Which tests run for a
  mutant changes here, not what a run decides.
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import pytest
from mutmut.state import state

STATS = Path("mutmut-stats.json")


def _durations() -> dict[str, float]:
    try:
        return json.loads(STATS.read_text())["duration_by_test"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}  # mutmut's stats run has not written them yet: keep pytest's order


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    durations = _durations()
    if durations:  # sorted() is stable: tests of equal duration keep pytest's order
        items[:] = sorted(items, key=lambda item: durations.get(item.nodeid, float("inf")))


def pytest_collection_finish() -> None:
    gc.freeze()


def _defined_in(name: str) -> str:
    """``__main__.<mangled>`` as ``<module>.<mangled>``, the module holding mutmut's dict of that function's
    mutants (``mutants_<mangled>__mutmut``); any other name as it is."""
    if not name.startswith("__main__."):
        return name
    mangled = name.removeprefix("__main__.")
    holder = f"mutants_{mangled}__mutmut"
    found = next((m for m, module in list(sys.modules.items()) if holder in getattr(module, "__dict__", {})), None)
    return f"{found}.{mangled}" if found else name


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown() -> None:
    """Before mutmut's stats run files the functions a test called under the test (its own teardown hook), the
    names of calls recorded as ``__main__.`` are put under their module. Not by replacing mutmut's recording
    function: the signer's pickle (by value) would then carry a reference to this module."""
    recorded = state()._stats
    renamed = {_defined_in(name) for name in recorded}
    if renamed != recorded:
        recorded.clear()
        recorded.update(renamed)
