"""Trainer pieces: normalisation that survives constant-so-far features, hyperparameter errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workload.hparams import default_seed, parse_runs
from workload.trainer import HParams, Normalizer


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
