"""Resuming from a checkpoint restores torch's random state: the next draws are the uninterrupted ones.

The MLP draws nothing at random while training today (batch order has its own generator), so a lost
RNG state changes nothing yet; a model with dropout would silently lose bit-for-bit resume. Here
every batch boundary draws a dropout mask from the global generator, as dropout would, so a restore
that forgets the state (or restores it before rebuilding the model) is caught.
"""

from __future__ import annotations

import io

import numpy as np
import torch

from workload.data import features
from workload.model.lineage import checkpoint_of, trainer_from
from workload.model.trainer import HParams, Trainer

HP = HParams(hidden=(16,), epochs=2, batch_size=64, seed=11)
SHARD = "training/2018-04-02.parquet"


def shard() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    x = rng.normal(size=(500, len(features.FEATURE_NAMES)))
    y = (rng.random(500) < 0.05).astype(np.float32)
    return x, y


def dropout_mask() -> torch.Tensor:
    return torch.nn.functional.dropout(torch.ones(32), p=0.5, training=True)


def train(trainer: Trainer, x: np.ndarray, y: np.ndarray, steps: int | None, masks: list[torch.Tensor]) -> bool:
    """Train until ``steps`` batch boundaries have passed (None: to the end), drawing a mask at each."""
    done = 0

    def after_step() -> bool:
        nonlocal done
        masks.append(dropout_mask())
        done += 1
        return steps is None or done < steps

    trainer.begin_shard(SHARD, x)
    return trainer.train_shard(x, y, after_step)


def through_a_file(state: dict) -> dict:
    """The checkpoint's round trip: torch.save, then torch.load(weights_only=True) as the worker loads it."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def test_restored_trainer_draws_what_the_uninterrupted_one_draws() -> None:
    x, y = shard()
    trainer = Trainer("main", HP, features.FEATURE_NAMES, torch.device("cpu"))
    assert not train(trainer, x, y, steps=5, masks=[])  # interrupted mid-shard, 5 masks drawn
    saved = through_a_file(checkpoint_of(trainer))

    uninterrupted: list[torch.Tensor] = []
    assert train(trainer, x, y, steps=None, masks=uninterrupted)
    expected_weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    next_draw = torch.rand(4)

    torch.manual_seed(12345)  # a new process: whatever state the global generator happens to be in
    torch.rand(100)
    restored = trainer_from(saved, torch.device("cpu"))
    assert restored.progress == {"shard": SHARD, "epoch": 0, "batch": 5, "epochs": trainer.hp.epochs}
    resumed: list[torch.Tensor] = []
    assert train(restored, x, y, steps=None, masks=resumed)

    assert len(resumed) == len(uninterrupted) == 2 * int(np.ceil(500 / HP.batch_size)) - 5
    for a, b in zip(resumed, uninterrupted, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(torch.rand(4), next_draw)
    for name, tensor in restored.model.state_dict().items():
        assert torch.equal(tensor, expected_weights[name]), name


def test_the_random_state_differs_from_a_fresh_seed_so_the_test_can_fail() -> None:
    """Guard on the test above: after training, the saved state is not what seeding alone recreates."""
    x, y = shard()
    trainer = Trainer("main", HP, features.FEATURE_NAMES, torch.device("cpu"))
    train(trainer, x, y, steps=5, masks=[])
    saved = checkpoint_of(trainer)["rng"]["torch"]
    Trainer("main", HP, features.FEATURE_NAMES, torch.device("cpu"))  # seeds and initialises a model
    assert not torch.equal(torch.get_rng_state(), saved)
