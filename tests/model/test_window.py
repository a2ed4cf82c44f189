"""A day trains on its window: the run's newest applied days before it, then itself (`window_days`).

The worker's side (it reads the window from the feature store, a resumed day reads the same rows) is in
tests/workload/test_worker_inprocess.py; here, the trainer's rule and what a checkpoint written before
the window existed keeps.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workload.model.hparams import HParams
from workload.model.trainer import FORMAT, Trainer

FEATURES = ("a", "b", "c")


def _day(seed: int, rows: int = 120) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, len(FEATURES))).astype(np.float32)
    return x, (x[:, 0] + rng.normal(size=rows) > 1.5).astype(np.float32)


def _apply(trainer: Trainer, shard: str, x: np.ndarray, y: np.ndarray) -> None:
    trainer.begin_shard(shard, x)
    assert trainer.train_shard(x, y, lambda: True)
    trainer.finish_shard({})


def test_the_window_is_the_runs_newest_applied_days_then_the_day_itself() -> None:
    trainer = Trainer("r", HParams(hidden=(4,), window_days=3), FEATURES, torch.device("cpu"))
    assert trainer.window("d0") == ["d0"], "a run's first day has nothing before it"
    for day in ("d0", "d1", "d2"):
        _apply(trainer, day, *_day(int(day[1])))
    assert trainer.window("d3") == ["d1", "d2", "d3"]
    trainer.applied = ["d0", "d1"]  # a rewind cut the lineage back: the window follows it
    assert trainer.window("d2") == ["d0", "d1", "d2"]
    trainer.applied = ["d0", "d1", "d2"]  # a day already in the lineage is not read twice
    assert trainer.window("d1") == ["d0", "d2", "d1"]
    alone = Trainer("r", HParams(hidden=(4,), window_days=1), FEATURES, torch.device("cpu"))
    alone.applied = ["d0", "d1"]
    assert alone.window("d2") == ["d2"]


def test_only_the_days_own_rows_enter_the_normalisation_statistics() -> None:
    """The window's earlier days were folded in when they were applied: folding them again would weigh
    them `window_days` times."""
    trainer = Trainer("r", HParams(hidden=(4,), window_days=2), FEATURES, torch.device("cpu"))
    (x0, y0), (x1, y1) = _day(0), _day(1)
    _apply(trainer, "d0", x0, y0)
    trainer.begin_shard("d1", x1)
    assert trainer.train_shard(np.concatenate([x0, x1]), np.concatenate([y0, y1]), lambda: True)
    both = np.concatenate([x0, x1]).astype(np.float64)
    assert float(trainer.norm.count) == len(both)
    assert np.allclose(trainer.norm.mean.numpy(), both.mean(0))


def test_a_checkpoint_from_before_the_window_goes_on_training_each_day_alone() -> None:
    """Format 3 had no window: its lineage keeps window_days 1 instead of taking today's default, and a
    checkpoint written now records the window it trains with."""
    trainer = Trainer("r", HParams(hidden=(4,)), FEATURES, torch.device("cpu"))
    state = trainer.state_dict()
    assert state["format"] == FORMAT == 4 and state["hparams"]["window_days"] == HParams().window_days == 7
    old = {**state, "format": 3, "hparams": {k: v for k, v in state["hparams"].items() if k != "window_days"}}
    assert Trainer.from_state(old, torch.device("cpu")).hp.window_days == 1
    assert Trainer.from_state(state, torch.device("cpu")).hp.window_days == 7


@pytest.mark.parametrize("value", [0, -1, 2.0, True, "7"])
def test_window_days_is_a_whole_number_of_at_least_one(value: object) -> None:
    allowed = "must be a whole number >= 1"
    with pytest.raises(ValueError, match=rf"^run 'x': window_days={value!r} is not allowed; {allowed}"):
        HParams.from_dict({"window_days": value}, where="run 'x'")
