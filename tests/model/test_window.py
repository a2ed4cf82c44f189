"""A day trains on its window: the run's newest applied days before it, then itself (`window_days`).

The worker's side (it reads the window from the feature store, a resumed day reads the same rows) is in
tests/workload/test_worker_restore_inprocess.py; here, the trainer's rule and what a checkpoint written before
the window existed keeps.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workload.model.hparams import HParams
from workload.model.lineage import FORMAT, checkpoint_of, trainer_from
from workload.model.trainer import Trainer

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
    state = checkpoint_of(trainer)
    assert state["format"] == FORMAT == 5 and state["hparams"]["window_days"] == HParams().window_days == 14
    old = {**state, "format": 3,
           "hparams": {k: v for k, v in state["hparams"].items() if k not in ("window_days", "full_window_days")}}
    assert (trainer_from(old, torch.device("cpu")).hp.window_days,
            trainer_from(old, torch.device("cpu")).hp.full_window_days) == (1, 0)
    assert trainer_from(state, torch.device("cpu")).hp.window_days == 14


def test_a_windows_epochs_drop_once_it_holds_more_than_full_window_days() -> None:
    """The default: 4 epochs over a window of up to 7 days (so a run of a few days or a week trains as with a
    7-day window), then ceil(4 * 7 / days): about 28 days of rows a day, each row about 28 times over its life."""
    hp = HParams()
    assert (hp.epochs, hp.full_window_days, hp.window_days) == (4, 7, 14)
    trainer = Trainer("r", HParams(hidden=(4,)), FEATURES, torch.device("cpu"))
    assert [trainer.window_epochs(days) for days in (1, 4, 7, 8, 9, 10, 13, 14, 15, 27, 28)] == \
        [4, 4, 4, 4, 4, 3, 3, 2, 2, 2, 1]
    off = Trainer("r", HParams(hidden=(4,), full_window_days=0, epochs=6), FEATURES)
    assert off.window_epochs(28) == 6
    assert Trainer("r", HParams(hidden=(4,), full_window_days=1), FEATURES).window_epochs(30) == 1  # at least one
    assert Trainer("r", HParams(hidden=(4,), full_window_days=3, epochs=4), FEATURES).window_epochs(5) == 3  # 2.4 up
    # A run's own epochs hold on any window up to full_window_days, however many they are: 40 on one day is 40.
    many = Trainer("r", HParams(hidden=(4,), epochs=40, window_days=1), FEATURES)
    assert [many.window_epochs(days) for days in (1, 7, 8)] == [40, 40, 35]


def test_a_day_begins_with_its_windows_epochs_and_a_format_4_lineage_keeps_epochs_on_every_window() -> None:
    """The count is fixed when a day begins, from the window it reads (the run's applied days): with
    full_window_days 1, a window of 2 or 3 days trains ceil(4 / days) = 2 epochs. A format-4 checkpoint (a window, no
    full_window_days) keeps `epochs` on every window."""
    trainer = Trainer("r", HParams(hidden=(4,), epochs=4, full_window_days=1, window_days=3), FEATURES,
                      torch.device("cpu"))
    epochs = []
    for i in range(4):
        x, y = _day(i)
        trainer.begin_shard(f"d{i}", x)
        epochs.append(trainer.progress["epochs"])
        assert trainer.train_shard(x, y, lambda: True)
        trainer.finish_shard({})
    assert epochs == [4, 2, 2, 2]  # windows of 1, 2, 3 and 3 days
    state = checkpoint_of(trainer)
    old = {**state, "format": 4, "hparams": {k: v for k, v in state["hparams"].items() if k != "full_window_days"}}
    lineage = trainer_from(old, torch.device("cpu"))
    assert lineage.hp.full_window_days == 0 and lineage.hp.window_days == 3
    lineage.begin_shard("d4", _day(4)[0])
    assert lineage.progress["epochs"] == 4


@pytest.mark.parametrize("value", [-1, 2.0, True, "28"])
def test_full_window_days_is_a_whole_number_of_at_least_zero(value: object) -> None:
    allowed = "must be a whole number >= 0"
    with pytest.raises(ValueError, match=rf"^run 'x': full_window_days={value!r} is not allowed; {allowed}"):
        HParams.from_dict({"full_window_days": value}, where="run 'x'")


@pytest.mark.parametrize("value", [0, -1, 2.0, True, "7"])
def test_window_days_is_a_whole_number_of_at_least_one(value: object) -> None:
    allowed = "must be a whole number >= 1"
    with pytest.raises(ValueError, match=rf"^run 'x': window_days={value!r} is not allowed; {allowed}"):
        HParams.from_dict({"window_days": value}, where="run 'x'")
