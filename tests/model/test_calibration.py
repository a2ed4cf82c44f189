"""Calibrated probabilities on simulated days: what the report says is what export and score give, and
the calibration never sees a test day or a label younger than the delay."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from workload import cli
from workload.data import dataset as ds
from workload.data import features, simulator
from workload.model import calibration, metrics, report
from workload.model.export import MODEL_FILE
from workload.model.hparams import HParams
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
    (root / ds.HISTORY).mkdir()
    for day in sorted((root / ds.TRAINING).iterdir())[:HISTORY_DAYS]:
        day.rename(root / ds.HISTORY / day.name)
    ds.write_manifest(root)
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
    state = trainer.state_dict()
    assert store.save(state, path=store.next_path(1), may_promote=lambda: True) is not None
    report.write(output / "cal", state, None, draw=False)
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
    first_test = min(pd.Timestamp(f["first"]) for f in data.files if f["role"] == ds.TESTING)
    cutoff = first_test - pd.Timedelta(seconds=features.LABEL_DELAY_SECONDS)
    assert days and all(data.entry(d)["role"] == ds.TRAINING for d in days)
    assert all(pd.Timestamp(data.entry(d)["last"]) <= cutoff for d in days)
    # The newest usable ones: the training day right after the last one used is younger than the delay.
    later = [s for s in data.training_shards() if s > days[-1]]
    assert later and pd.Timestamp(data.entry(later[0])["last"]) > cutoff
    # And what the trainer holds was fitted on exactly those days' labels.
    ex = data.examples(days)
    expected = calibration.fit_platt(trainer.logits(ex.x), ex.y)
    assert (float(trainer.calibration["scale"]), float(trainer.calibration["shift"])) == expected


def test_a_format_2_checkpoint_loads_uncalibrated_and_an_older_one_is_refused_in_one_line() -> None:
    state = Trainer("old", HParams(hidden=(4,)), ("a", "b"), torch.device("cpu")).state_dict()
    del state["calibration"]
    state["format"] = 2
    old = Trainer.from_state(state, torch.device("cpu"))
    assert (float(old.calibration["scale"]), float(old.calibration["shift"])) == (1.0, 0.0)
    x = np.array([[0.5, -1.0], [2.0, 0.0]], dtype=np.float32)
    np.testing.assert_array_equal(old.score(x), old.score(x, calibrated=False))
    state["format"] = 1
    with pytest.raises(ValueError, match=r"^checkpoint format 1 is not supported \(readable: 2, 3, 4, 5\); start a new "
                                         r"run with this code version$"):
        Trainer.from_state(state, torch.device("cpu"))
