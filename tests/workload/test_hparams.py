"""The hyperparameter rules at their edges: every bound the README states is accepted at its edge and refused
just past it, with the key in the message; a run without a seed gets one fixed by its name."""

from __future__ import annotations

import re

import pytest

from workload.model.hparams import HParams, default_seed, parse_runs

EDGES = {"hidden": [1], "lr": 0.999, "weight_decay": 0, "epochs": 1, "batch_size": 1, "pos_weight_cap": 1,
         "seed": 2**63 - 1, "ema_decay": 0, "min_steps": 0, "window_days": 1, "full_window_days": 0}


def test_every_bound_is_accepted_at_its_edge_and_every_value_is_kept() -> None:
    hp = HParams.from_dict(EDGES)
    assert hp.to_dict() == {**EDGES, "lr": 0.999, "weight_decay": 0.0, "pos_weight_cap": 1.0, "ema_decay": 0.0}
    other = {"hidden": [3, 2], "lr": 0.25, "weight_decay": 0.5, "epochs": 7, "batch_size": 9, "pos_weight_cap": 3.5,
             "seed": 0, "ema_decay": 0.5, "min_steps": 11, "window_days": 3,
             "full_window_days": 5}  # none of them a default
    assert HParams.from_dict(other).to_dict() == other


@pytest.mark.parametrize(("key", "value", "shown"), [
    ("hidden", [4, 0], "(4, 0)"), ("lr", 1, "1.0"), ("lr", 1.5, "1.5"), ("weight_decay", -1, "-1.0"),
    ("epochs", 0, "0"), ("batch_size", 0, "0"), ("pos_weight_cap", 0.5, "0.5"), ("seed", 2**63, str(2**63)),
    ("ema_decay", -0.5, "-0.5"), ("ema_decay", 1, "1.0"), ("min_steps", -1, "-1"), ("window_days", 0, "0"),
    ("full_window_days", -1, "-1"),
])
def test_a_value_just_past_its_bound_is_refused_naming_the_key(key: str, value: object, shown: str) -> None:
    with pytest.raises(ValueError, match=rf"^hyperparameters: {key}={re.escape(shown)} is not allowed; must be "):
        HParams.from_dict({**EDGES, key: value})


def test_errors_name_where_the_hyperparameters_came_from() -> None:
    with pytest.raises(ValueError, match=r"^hyperparameters: expected an object of hyperparameters, got list \[1\]$"):
        HParams.from_dict([1])
    with pytest.raises(ValueError, match=r"^runs\.json: runs 'a' and 'b' have the same hyperparameters .*; they would "
                                         "train the same model twice: change one, or give it another seed$"):
        parse_runs({"a": {"seed": 3}, "b": {"seed": 3}}, "runs.json")


def test_a_runs_default_seed_is_fixed_by_its_name() -> None:
    """Part of every recorded run's identity (its checkpoints, its queue spec): the same name, the same seed, on
    any machine and in any release."""
    assert (default_seed("main"), default_seed("a")) == (2034265613, 310482890)
    assert parse_runs({"main": None}, "runs")["main"].seed == 2034265613
