"""Trainer pieces: normalisation that survives constant-so-far features, hyperparameter errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workload.hparams import default_seed, parse_runs
from workload.trainer import HParams, Normalizer, Trainer


def test_features_constant_so_far_are_left_unscaled() -> None:
    # First-day shape: terminal features all 0 (no label is 7 days old yet). Dividing a later
    # day's 0.8 by that day's std (0) would blow it up; it must pass through unscaled instead.
    norm = Normalizer(2)
    norm.update(np.c_[np.array([1.0, 2.0, 3.0, 4.0]), np.zeros(4)])
    out = norm.apply(np.array([[2.5, 0.8]]))
    assert out.dtype == torch.float32
    np.testing.assert_allclose(out.numpy(), [[0.0, 0.8]], atol=1e-6)


def test_running_statistics_match_the_whole_data() -> None:
    rng = np.random.default_rng(0)
    parts = [rng.normal(i, 1 + i, size=(50 + 10 * i, 3)) for i in range(4)]
    norm = Normalizer(3)
    for part in parts:
        norm.update(part)
    whole = np.concatenate(parts)
    np.testing.assert_allclose(norm.mean.numpy(), whole.mean(0), rtol=1e-12)
    np.testing.assert_allclose((norm.m2 / norm.count).numpy(), whole.var(0), rtol=1e-12)


@pytest.mark.parametrize(("spec", "message"), [
    ({"lr": 0}, "lr=0.0 is not allowed; must be 0 < lr < 1"),
    ({"epochs": 0}, "epochs=0 is not allowed"),
    ({"hidden": [64, 0]}, "hidden=(64, 0) is not allowed"),
    ({"learning_rate": 0.1}, "unknown key(s) ['learning_rate']"),
    ({"batch_size": "big"}, "run 'x'"),
])
def test_bad_hyperparameters_name_the_key(spec: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        HParams.from_dict(spec, where="run 'x'")
    assert message in str(err.value) and "run 'x'" in str(err.value)


def test_no_hidden_layer_is_logistic_regression() -> None:
    assert HParams.from_dict({"hidden": []}).hidden == ()


def _day(seed: int, n: int = 700) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.1).astype(np.float32)
    x = (rng.normal(size=(n, 4)) + y[:, None]).astype(np.float32)
    return x, y


def _train(stop_at: int | None) -> Trainer:
    """Two days of training; with `stop_at`, interrupted after that many steps of the second day
    (11 batches an epoch), saved, reloaded from the state dict alone, and finished."""
    hp = HParams(hidden=(8,), epochs=2, batch_size=64, ema_decay=0.9)
    trainer = Trainer("r", hp, ("a", "b", "c", "d"), torch.device("cpu"), feature_version="v")
    for i, shard in enumerate(("d1", "d2")):
        x, y = _day(i)
        trainer.begin_shard(shard, x)
        steps = {"n": 0}

        def after_step(steps: dict = steps, shard: str = shard) -> bool:
            steps["n"] += 1
            return stop_at is None or shard != "d2" or steps["n"] != stop_at

        if not trainer.train_shard(x, y, after_step):
            state = trainer.state_dict()
            if state["progress"]["epoch"] == hp.epochs - 1:  # in the last epoch: the count travels with it
                assert state["progress"]["correct"] >= 0
            trainer = Trainer.from_state(state, torch.device("cpu"))
            trainer.begin_shard(shard, x)
            assert trainer.train_shard(x, y, lambda: True)
        accuracy = trainer.train_accuracy(len(y))
        trainer.finish_shard({"shard": shard, "train_accuracy": accuracy})
    return trainer


def test_resuming_mid_epoch_on_cpu_is_bit_for_bit_averaged_weights_and_accuracy_included() -> None:
    whole = _train(None)
    for stop_at in (4, 11, 12, 16):  # in the first epoch, at its end, and twice in the last
        resumed = _train(stop_at)
        for part in ("model", "averaged"):
            a, b = whole.state_dict()[part], resumed.state_dict()[part]
            assert all(torch.equal(a[k], b[k]) for k in a), f"{part} differs after a stop at step {stop_at}"
        assert resumed.history == whole.history
    assert 0 < whole.history[-1]["train_accuracy"] <= 1
    x, _ = _day(5)
    np.testing.assert_array_equal(whole.score(x), _train(3).score(x))


def test_the_averaged_weights_score_and_differ_from_the_raw_ones() -> None:
    trainer = _train(None)
    raw = {k: v for k, v in trainer.model.state_dict().items()}
    avg = trainer.averaged.state_dict()
    assert any(not torch.equal(raw[k], avg[k]) for k in raw)
    x, _ = _day(7)
    with torch.no_grad():
        expected = torch.sigmoid(trainer.averaged(trainer.norm.apply(x))).numpy()
    np.testing.assert_array_equal(trainer.score(x), expected)


def test_ema_decay_is_validated() -> None:
    with pytest.raises(ValueError, match=r"ema_decay=1.0 is not allowed; must be 0 <= ema_decay < 1"):
        HParams.from_dict({"ema_decay": 1}, where="run 'x'")


@pytest.mark.parametrize(("spec", "message"), [
    ({"hidden": "64"}, "hidden='64' is not allowed; must be a list of layer sizes"),
    ({"hidden": 64}, "hidden=64 is not allowed"),
    ({"hidden": [64.0]}, "hidden=[64.0] is not allowed"),
    ({"epochs": 2.7}, "epochs=2.7 is not allowed; must be a whole number >= 1"),
    ({"epochs": 2.0}, "epochs=2.0 is not allowed"),
    ({"epochs": True}, "epochs=True is not allowed"),
    ({"lr": "0.01"}, "lr='0.01' is not allowed"),
    ({"lr": float("nan")}, "lr=nan is not allowed"),
    ({"seed": -1}, "seed=-1 is not allowed"),
])
def test_types_are_strict_never_coerced(spec: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        HParams.from_dict(spec, where="run 'x'")
    assert message in str(err.value) and "run 'x'" in str(err.value)


def test_a_sweep_gets_distinct_stable_seeds_unless_given() -> None:
    runs = parse_runs({"main": {}, "wide": {"hidden": [128, 64]}, "fixed": {"seed": 3}}, "runs")
    assert runs["fixed"].seed == 3
    assert runs["main"].seed == default_seed("main") != runs["wide"].seed == default_seed("wide")
    assert parse_runs({"main": None}, "runs")["main"] == runs["main"]  # YAML `main:` is an empty spec


@pytest.mark.parametrize(("specs", "message"), [
    ({"a": {"seed": 1}, "b": {"seed": 1}}, "runs 'a' and 'b' have the same hyperparameters"),
    ({"../x": {}}, "run name '../x' is not allowed"),
    ({"main": {"lr": 2}}, "run 'main': lr=2.0 is not allowed"),
    ({"main": [1]}, "run 'main': expected an object of hyperparameters"),
    ({}, "expected a non-empty object"),
    ([], "expected a non-empty object"),
])
def test_bad_sweeps_name_the_source_and_the_run(specs, message: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_runs(specs, "config runs")
    assert message in str(err.value) and str(err.value).startswith("config runs")
