"""`steps.StopBudget`, the seconds after SIGTERM for final checkpoints: one run alone keeps the rule it always had
(its last save's cost against `term_budget_s`); the runs of a pack share it, each final checkpoint counted at its
expected cost or at the time really spent, whichever is more (the real SIGTERM: test_worker_packing_inprocess.py)."""

from __future__ import annotations

import time

from workload.runtime.steps import StopBudget


def test_one_run_alone_saves_when_its_last_save_took_less_than_the_budget() -> None:
    assert StopBudget(8.0).take(7.9)
    assert not StopBudget(8.0).take(8.0)
    assert not StopBudget(0.0).take(0.0)


def test_a_packs_final_checkpoints_fit_the_budget_together() -> None:
    budget = StopBudget(2.5)
    assert [budget.take(1.0) for _ in range(3)] == [True, True, False]  # 1 + 1 fit, a third would end at 3 s
    assert budget.take(0.4)  # a cheaper one still fits what is left


def test_time_really_spent_counts_when_it_is_more_than_was_expected() -> None:
    budget = StopBudget(0.3)
    assert budget.take(0.01)
    time.sleep(0.3)  # the first save took far longer than expected
    assert not budget.take(0.01)
