"""Calibrated probabilities on simulated days: what the report says is what export and score give, and
the calibration never sees a test day or a label younger than the delay."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from workload import cli
from workload.data import dataset as ds
from workload.data import features, publish, simulator, source
from workload.data.dayfile import HISTORY, TESTING, TRAINING
from workload.data.manifest import write_manifest
from workload.model import calibration, metrics, report
from workload.model.export import MODEL_FILE
from workload.model.hparams import HParams
from workload.model.lineage import LineageState, checkpoint_of, trainer_from
from workload.model.trainer import Trainer
from workload.share.checkpoint import CheckpointStore
from workload.share.paths import share_paths

# ~3k transactions a day. The simulator's fraud rate climbs for four weeks (terminals stay compromised
# 28 days) and then holds at ~5%: those four weeks are history, so that training, calibration and test
# days share one base rate, and four test days hold enough fraud for several bins of 30 frauds or more.
SPEC = simulator.SimulationSpec(customers=1500, terminals=1200, train_days=42, test_days=4,
                                start_date="2018-04-01", seed=1)
HISTORY_DAYS = 28
HP = HParams(epochs=2, seed=3)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Trainer, dict]:
    """A run trained day by day as the worker does (train, calibrate, evaluate, record), saved on a share."""
    share = tmp_path_factory.mktemp("share")
    root = share / "datasets" / "fraud"
    simulator.generate(root, SPEC)
    (root / HISTORY).mkdir()
    for day in sorted((root / TRAINING).iterdir())[:HISTORY_DAYS]:
        day.rename(root / HISTORY / day.name)
    write_manifest(root)
    data = ds.Dataset(root)
    test = data.test_examples()
    trainer = Trainer("cal", HP, features.FEATURE_NAMES, torch.device("cpu"), features.FEATURE_VERSION)
    shards = data.training_shards()
    for shard in shards:
        ex = data.examples([shard])
        trainer.begin_shard(shard, ex.x)
        trainer.train_shard(ex.x, ex.y, lambda: True)
        entry = {"shard": shard, "time": "t", "checkpoint": "c", "train_accuracy": 1.0}
        if shard == shards[-1]:  # the worker's steps after training a day (only the last one's are read here)
            days = calibration.refit(trainer, data, shard)
            scores = trainer.score(test.x)
            entry |= calibration.assess(trainer, test, scores, days)
        trainer.finish_shard({**entry, **metrics.evaluate(trainer.score(test.x), test.y, test.day, test.card)})
    _, output = share_paths(share)
    store = CheckpointStore(output / "cal")
    assert store.fence(1)
    state = checkpoint_of(trainer)
    assert store.save(state, path=store.next_path(1), may_promote=lambda: True, boundary=True) is not None
    report.write(output / "cal", LineageState.read(state), None, draw=False)
    return share, trainer, state


def test_calibrated_probabilities_match_the_observed_fraud_rate_per_bin(trained) -> None:
    _, trainer, state = trained
    last = state["history"][-1]
    checked = [r for r in last["reliability"] if r["frauds"] >= 30]
    assert len(checked) >= 2, last["reliability"]
    for r in checked:
        se = np.sqrt(r["observed"] * (1 - r["observed"]) / r["n"])
        assert r["low"] - 2 * se <= r["observed"] <= r["high"] + 2 * se, r
    assert last["ece"] < last["ece_raw"] and last["brier"] < last["brier_raw"], last
    assert len(last["calibration_days"]) == calibration.CALIBRATION_DAYS


def test_export_and_score_give_the_reports_probabilities(trained, tmp_path: Path, capsys) -> None:
    share, trainer, state = trained
    assert cli.main(["export", "--share", str(share), "--run", "cal", "--to", str(tmp_path / "out")]) == 0
    out = tmp_path / "scores.parquet"
    assert cli.main(["score", "--model", str(tmp_path / "out" / "cal" / MODEL_FILE), "--datasets",
                     str(share / "datasets" / "fraud"), "--days", "testing", "--out", str(out)]) == 0
    capsys.readouterr()
    scored = pd.read_parquet(out)
    data = ds.Dataset(share / "datasets" / "fraud")
    test = data.test_examples()
    by_id = scored.set_index("TRANSACTION_ID").loc[test.ids]
    # `score` scores day by day, the report all test days at once: float32 matrix products of other
    # shapes may differ in the last bit, never more.
    np.testing.assert_allclose(by_id["score"].to_numpy(), trainer.score(test.x), rtol=1e-5, atol=0)
    last = state["history"][-1]
    table = metrics.reliability(by_id["score"].to_numpy(), test.y)
    assert [(r["low"], r["n"], r["frauds"]) for r in table] == [(r["low"], r["n"], r["frauds"]) for r in
                                                                 last["reliability"]]
    assert [r["predicted"] for r in table] == pytest.approx([r["predicted"] for r in last["reliability"]], rel=1e-5)
    for rule, column in metrics.ALERT_COLUMNS.items():
        np.testing.assert_array_equal(by_id[column].to_numpy(),
                                      by_id["score"].to_numpy() >= last["alerts"][rule]["threshold"])
    cards = last["alerts"]["top100_cards"]
    assert 90 <= cards["alerts_per_day"] <= 110 and cards["precision"] > 0.2, cards
    text = (share / "output" / "cal" / "report.txt").read_text()
    assert "after calibration" in text and "top 100 cards a day: threshold" in text
    assert json.loads((share / "output" / "cal" / "metrics.jsonl").read_text().splitlines()[-1])["alerts"] == \
        last["alerts"]


def test_calibration_sees_no_test_day_and_no_label_younger_than_the_delay(trained) -> None:
    share, trainer, _ = trained
    data = ds.Dataset(share / "datasets" / "fraud")
    everything = [f["path"] for f in data.files]
    days = calibration.eligible_days(data, everything)
    first_test = min(pd.Timestamp(f["first"]) for f in data.files if f["role"] == TESTING)
    cutoff = first_test - pd.Timedelta(seconds=features.LABEL_DELAY_SECONDS)
    assert days and all(data.entry(d)["role"] == TRAINING for d in days)
    assert all(pd.Timestamp(data.entry(d)["last"]) <= cutoff for d in days)
    # The newest usable ones: the training day right after the last one used is younger than the delay.
    later = [s for s in data.training_shards() if s > days[-1]]
    assert later and pd.Timestamp(data.entry(later[0])["last"]) > cutoff
    # And what the trainer holds was fitted on exactly those days' labels.
    ex = data.examples(days)
    expected = calibration.fit_platt(trainer.logits(ex.x), ex.y)
    assert (float(trainer.calibration["scale"]), float(trainer.calibration["shift"])) == expected


def test_a_format_2_checkpoint_loads_uncalibrated_and_an_older_one_is_refused_in_one_line() -> None:
    state = checkpoint_of(Trainer("old", HParams(hidden=(4,)), ("a", "b"), torch.device("cpu")))
    del state["calibration"]
    state["format"] = 2
    old = trainer_from(state, torch.device("cpu"))
    assert (float(old.calibration["scale"]), float(old.calibration["shift"])) == (1.0, 0.0)
    x = np.array([[0.5, -1.0], [2.0, 0.0]], dtype=np.float32)
    np.testing.assert_array_equal(old.score(x), old.score(x, calibrated=False))
    state["format"] = 1
    with pytest.raises(ValueError, match=r"^checkpoint format 1 is not supported \(readable: 2, 3, 4, 5\); start a new "
                                         r"run with this code version$"):
        trainer_from(state, torch.device("cpu"))


# fit_platt, eligible_days and assess on small inputs (no training): the fit is the minimum of the log-loss of
# sigmoid(scale * logit + shift) plus a ridge of `ridge` per row towards (1, 0), ridge * n * |(scale, shift) - (1, 0)|^2
# / 2, so its gradient vanishes there: the penalised score equations below hold to rounding (~1e-15 per row).
GRADIENT_ATOL = 1e-10  # per row


def sigmoid(eta: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0.0, -eta))  # no overflow for any finite eta


def penalised_gradient(z: np.ndarray, y: np.ndarray, scale: float, shift: float, ridge: float) -> np.ndarray:
    """The penalised log-loss's gradient in (scale, shift) at the fit, per row."""
    p, n = sigmoid(scale * z + shift), len(y)
    return np.array([z @ (p - y) + ridge * n * (scale - 1.0), np.sum(p - y) + ridge * n * shift]) / n


def logistic_day(true_scale: float, true_shift: float, n: int = 4000, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """Logits of a day's rows and labels drawn as fraud with probability sigmoid(true_scale * logit + true_shift)."""
    rng = np.random.default_rng(seed)
    z = rng.normal(-3.0, 2.0, n)
    return z, (rng.random(n) < sigmoid(true_scale * z + true_shift)).astype(np.float64)


def test_platt_fit_finds_a_scale_below_one_and_solves_its_penalised_score_equations() -> None:
    z, y = logistic_day(0.5, -1.0)
    for ridge in (None, 1e-3, 1.0):  # None: the default, 1e-6
        scale, shift = calibration.fit_platt(z, y) if ridge is None else calibration.fit_platt(z, y, ridge)
        ridge = 1e-6 if ridge is None else ridge
        assert type(scale) is float and type(shift) is float
        np.testing.assert_allclose(penalised_gradient(z, y, scale, shift, ridge), 0.0, atol=GRADIENT_ATOL)
        if ridge < 1.0:  # a ridge of 1 per row pulls the fit most of the way back to (1, 0)
            assert abs(scale - 0.5) < 0.05 and abs(shift + 1.0) < 0.15, (ridge, scale, shift)
        else:
            assert 0.5 < scale < 1.0 and -1.0 < shift < 0.0, (scale, shift)


def test_a_separable_day_gets_a_finite_sharper_fit_that_solves_its_penalised_score_equations() -> None:
    z = np.r_[np.linspace(-4.0, -0.5, 200), np.linspace(0.5, 3.0, 10)]
    y = np.r_[np.zeros(200), np.ones(10)]  # every fraud above every legitimate row: the log-loss alone has no minimum
    for ridge in (1e-6, 1e-3):
        scale, shift = calibration.fit_platt(z, y, ridge)
        assert np.isfinite([scale, shift]).all() and scale > 1.0, (scale, shift)
        np.testing.assert_allclose(penalised_gradient(z, y, scale, shift, ridge), 0.0, atol=GRADIENT_ATOL)


def test_a_reversed_ranking_keeps_scale_one_and_fits_only_the_shift() -> None:
    rng = np.random.default_rng(0)
    z = rng.normal(0.0, 1.0, 2000)
    y = (rng.random(2000) < sigmoid(-z - 2.0)).astype(np.float64)  # fraud where the logit is low
    for ridge in (1e-6, 1e-3):
        scale, shift = calibration.fit_platt(z, y, ridge)
        assert scale == 1.0 and type(shift) is float
        # The shift alone minimises the log-loss of sigmoid(logit + shift) plus ridge * n * shift^2 / 2.
        residual = (np.sum(sigmoid(z + shift) - y) + ridge * len(y) * shift) / len(y)
        assert abs(residual) < GRADIENT_ATOL, (ridge, shift, residual)
        assert -2.5 < shift < -1.5, shift  # the day's fraud rate (~16 %) from logits around 0


def test_wide_logits_converge_where_full_newton_steps_cycled() -> None:
    """Logits spread over tens of units: full Newton steps overshot, cycled to the 100-step limit and returned
    (2603066.9, -401999.9) here; a reversed ranking on narrow logits became (1372000.6, -714500.0) instead of the
    shift-only fit. Step halving converges on both."""
    rng = np.random.default_rng(2)
    z = rng.normal(0.0, 5.0, 2000)
    y = (rng.random(2000) < sigmoid(0.3 * z - 3.0)).astype(np.float64)
    scale, shift = calibration.fit_platt(z, y)
    np.testing.assert_allclose(penalised_gradient(z, y, scale, shift, 1e-6), 0.0, atol=GRADIENT_ATOL)
    assert abs(scale - 0.3) < 0.05 and abs(shift + 3.0) < 0.3, (scale, shift)

    rng = np.random.default_rng(0)
    z = rng.normal(-2.0, 1.0, 2000)
    y = (rng.random(2000) < sigmoid(-0.5 * z - 2.0)).astype(np.float64)
    scale, shift = calibration.fit_platt(z, y)
    assert scale == 1.0
    assert abs((np.sum(sigmoid(z + shift) - y) + 1e-6 * len(y) * shift) / len(y)) < GRADIENT_ATOL


@pytest.mark.parametrize("seed", range(12))
def test_any_day_with_both_classes_gets_the_fit_that_solves_its_score_equations(seed: int) -> None:
    """Days of every shape a model's logits take: sizes, centres, spreads, and how well they rank."""
    rng = np.random.default_rng(1000 + seed)
    n = int(rng.integers(50, 3000))
    z = rng.normal(rng.normal(0.0, 3.0), rng.uniform(0.2, 10.0), n)
    y = (rng.random(n) < sigmoid(rng.normal(0.0, 1.0) * z + rng.normal(-3.0, 2.0))).astype(np.float64)
    y[:2] = (0.0, 1.0)  # both classes, whatever was drawn
    scale, shift = calibration.fit_platt(z, y)
    if scale == 1.0:  # the shift-only fit: its own score equation
        assert abs((np.sum(sigmoid(z + shift) - y) + 1e-6 * n * shift) / n) < GRADIENT_ATOL
    else:
        assert scale > 0.0
        np.testing.assert_allclose(penalised_gradient(z, y, scale, shift, 1e-6), 0.0, atol=GRADIENT_ATOL)


def test_a_day_without_fraud_or_without_legitimate_rows_stays_uncalibrated() -> None:
    z = np.array([-3.0, -1.0, 0.5, 2.0])
    for logits, labels in (([], []), (z, np.zeros(4)), (z, np.ones(4)), (z[:1], [1.0]), (z[:1], [0.0])):
        assert calibration.fit_platt(np.asarray(logits), np.asarray(labels)) == (1.0, 0.0)


def test_a_single_fraud_is_enough_for_a_fit() -> None:
    z = np.linspace(-5.0, 0.0, 50)
    for where in (49, 30):  # the highest logit (a separable day), and one in the middle
        y = np.zeros(50)
        y[where] = 1.0
        scale, shift = calibration.fit_platt(z, y)
        assert (scale, shift) != (1.0, 0.0)
        np.testing.assert_allclose(penalised_gradient(z, y, scale, shift, 1e-6), 0.0, atol=GRADIENT_ATOL)


def test_logits_and_labels_of_any_numeric_dtype_give_the_same_float64_fit() -> None:
    z, y = logistic_day(0.5, -1.0, n=500, seed=3)
    z32 = z.astype(np.float32)  # what Trainer.logits gives
    expected = calibration.fit_platt(z32.astype(np.float64), y)
    for logits in (z32, z32.astype(np.longdouble), list(z32.astype(np.float64))):
        for labels in (y, y.astype(np.float32), y.astype(bool), y.astype(np.int64), y.tolist()):
            assert calibration.fit_platt(logits, labels) == expected


def test_extreme_logits_give_a_finite_fit_without_overflow_warnings() -> None:
    z, y = logistic_day(0.5, -1.0)
    z, y = np.r_[z, -1000.0, -800.0, 900.0, 1000.0], np.r_[y, 0.0, 0.0, 1.0, 1.0]  # a float32 network can say so
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scale, shift = calibration.fit_platt(z, y)
    assert 0.4 < scale < 0.6, scale
    np.testing.assert_allclose(penalised_gradient(z, y, scale, shift, 1e-6), 0.0, atol=GRADIENT_ATOL)


def test_without_test_days_the_newest_applied_days_are_used(tmp_path: Path) -> None:
    spec = simulator.SimulationSpec(customers=20, terminals=10, train_days=calibration.CALIBRATION_DAYS + 2,
                                    test_days=0, start_date="2018-04-01", seed=1)
    simulator.generate(tmp_path / "days", spec)
    # Laid out as `score` publishes a folder: no role required, so no testing/ day either.
    data = ds.Dataset(publish.publish(tmp_path / "fraud", source.LocalSource(tmp_path / "days"), required=()).root)
    shards = data.training_shards()
    assert len(shards) == calibration.CALIBRATION_DAYS + 2 and not any(f["role"] == TESTING for f in data.files)
    assert calibration.eligible_days(data, [*reversed(shards), shards[-1]]) == shards[-calibration.CALIBRATION_DAYS:]


def test_assess_reports_the_fitted_numbers_and_the_figures_before_and_after_calibration() -> None:
    rng = np.random.default_rng(4)
    n = 60
    test = ds.Examples(x=rng.normal(size=(n, len(features.FEATURE_NAMES))).astype(np.float32),
                       y=(rng.random(n) < 0.2).astype(np.float32),
                       day=np.repeat(np.array(["2018-05-01", "2018-05-02"], dtype="datetime64[D]"), n // 2),
                       card=rng.integers(0, 15, n), known=np.zeros(n, dtype=bool), ids=np.arange(n))
    trainer = Trainer("assess", HParams(epochs=1, hidden=(8,)), features.FEATURE_NAMES,
                      feature_version=features.FEATURE_VERSION)
    trainer.set_calibration(0.5, -1.5)
    scores = trainer.score(test.x)
    days = ["training/2018-04-20.parquet", "training/2018-04-21.parquet"]
    entry = calibration.assess(trainer, test, scores, days)
    raw = trainer.score(test.x, calibrated=False)
    assert not np.array_equal(raw, scores)
    assert entry == {
        "calibration_days": days, "calibration_scale": 0.5, "calibration_shift": -1.5,
        "brier_raw": metrics.brier(raw, test.y), "brier": metrics.brier(scores, test.y),
        "ece_raw": metrics.expected_calibration_error(raw, test.y),
        "ece": metrics.expected_calibration_error(scores, test.y),
        "reliability_raw": metrics.reliability(raw, test.y), "reliability": metrics.reliability(scores, test.y),
        "alerts": metrics.alert_thresholds(scores, test.y, test.day, test.card),
    }
    assert type(entry["calibration_scale"]) is float and type(entry["calibration_shift"]) is float
