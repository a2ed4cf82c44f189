"""A run's first days train more epochs until it has made `min_steps` steps, and a resume keeps the count."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workload.model.hparams import HParams
from workload.model.lineage import checkpoint_of, trainer_from
from workload.model.trainer import MAX_EPOCH_FACTOR, Trainer

FEATURES = ("a", "b", "c")


def _day(seed: int, rows: int = 200) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, len(FEATURES))).astype(np.float32)
    return x, (x[:, 0] + rng.normal(size=rows) > 1.5).astype(np.float32)


def test_the_first_days_train_more_epochs_until_the_run_has_min_steps() -> None:
    hp = HParams(hidden=(4,), epochs=2, batch_size=50, min_steps=30, seed=1)
    trainer = Trainer("r", hp, FEATURES, torch.device("cpu"))
    counts = []
    for day in range(3):
        x, y = _day(day)
        trainer.begin_shard(f"d{day}", x)
        counts.append(trainer.progress["epochs"])
        assert trainer.train_shard(x, y, lambda: True)
        trainer.finish_shard({})
    # 4 batches a day: 30 steps need 8 epochs on day one; day two starts at 32 steps: the plain 2.
    assert counts == [8, 2, 2] and trainer.steps == 8 * 4 + 2 * 4 + 2 * 4
    capped = Trainer("r", HParams(hidden=(4,), epochs=2, batch_size=50, min_steps=10_000), FEATURES)
    assert capped.epochs_for(200, 1) == MAX_EPOCH_FACTOR * 2
    assert Trainer("r", HParams(hidden=(4,), epochs=3, batch_size=50), FEATURES).epochs_for(200, 1) == 3
    # A day of one batch or less needs every missing step as an epoch of its own.
    one_batch = Trainer("r", HParams(hidden=(4,), epochs=2, batch_size=64, min_steps=10), FEATURES)
    assert (one_batch.epochs_for(50, 1), one_batch.epochs_for(64, 1), one_batch.epochs_for(65, 1)) == (10, 10, 5)
    # A long window lowers the epochs; min_steps still raises them while the run is short of steps.
    both = Trainer("r", HParams(hidden=(4,), epochs=4, batch_size=50, min_steps=30, full_window_days=1), FEATURES)
    assert (both.epochs_for(200, 4), both.epochs_for(400, 4), both.epochs_for(10_000, 4)) == (8, 4, 1)


@pytest.mark.parametrize("stop_after", [1, 4, 13, 21])  # in the first epoch, at its end, mid-way, in the extra
def test_a_resumed_first_day_trains_the_same_epochs_bit_for_bit(stop_after: int) -> None:
    hp = HParams(hidden=(4,), epochs=2, batch_size=50, min_steps=30, seed=2)
    x, y = _day(7)
    whole = Trainer("r", hp, FEATURES, torch.device("cpu"))
    whole.begin_shard("d0", x)
    assert whole.train_shard(x, y, lambda: True)

    first = Trainer("r", hp, FEATURES, torch.device("cpu"))
    first.begin_shard("d0", x)
    left = iter(range(stop_after - 1, -1, -1))
    assert not first.train_shard(x, y, lambda: next(left) > 0)
    resumed = trainer_from(checkpoint_of(first), torch.device("cpu"))
    resumed.begin_shard("d0", x)
    assert resumed.train_shard(x, y, lambda: True)
    assert resumed.steps == whole.steps == 32
    for k, v in whole.model.state_dict().items():
        assert torch.equal(v, resumed.model.state_dict()[k]), k


@pytest.mark.parametrize("value", [-1, 2.5, True])
def test_min_steps_is_a_whole_number_of_at_least_zero(value: object) -> None:
    with pytest.raises(ValueError, match=rf"^run 'x': min_steps={value!r} is not allowed; must be a whole number >= 0"):
        HParams.from_dict({"min_steps": value}, where="run 'x'")
