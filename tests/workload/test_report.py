"""The report: rendered from checkpoint history; pictures throttled, never stale at a run's end."""

from __future__ import annotations

import os
import time
from pathlib import Path

from workload.model import report


def test_pictures_are_stale_when_missing_or_older_than_the_interval(tmp_path: Path) -> None:
    assert report.plots_stale(tmp_path, 30)
    picture = tmp_path / "metrics.png"
    picture.write_bytes(b"png")
    assert not report.plots_stale(tmp_path, 30)
    old = time.time() - 31
    os.utime(picture, (old, old))
    assert report.plots_stale(tmp_path, 30)


def test_report_keeps_the_tutorial_shape_and_says_how_it_compares_to_the_base_rate(tmp_path: Path) -> None:
    entry = {"shard": "training/2018-04-01.parquet", "time": "t", "checkpoint": "ckpt-00000001-t1.pt",
             "train_accuracy": 0.99, "accuracy": 0.97, "average_precision": 0.6, "base_rate": 0.03,
             "roc_auc": 0.9, "precision_top100": 0.8, "recall_at_1pct_fpr": 0.5}
    state = {"run": "main", "hparams": {"lr": 0.1}, "history": [entry]}
    path = report.write(tmp_path, state, None, draw=False)
    text = path.read_text()
    for line in ("time: t", "training dataset: training/2018-04-01.parquet",
                 f"model checkpoint: {tmp_path / 'checkpoints' / 'ckpt-00000001-t1.pt'}",
                 "accuracy on training data: 0.9900", "accuracy on testing data: 0.9700",
                 "average precision (AUPRC) on testing data: 0.6000 (base rate 0.0300: 20.0x better than guessing)"):
        assert line in text
    assert "predicting 'legitimate' for every transaction scores 0.9700" in text
    assert report.latest_metrics(tmp_path) == entry
    assert not (tmp_path / "metrics.png").exists()


def test_the_report_says_worse_than_guessing_and_shows_the_fields_figures(tmp_path: Path) -> None:
    entry = {"shard": "training/2018-04-01.parquet", "time": "t", "checkpoint": "c.pt", "train_accuracy": 0.9,
             "accuracy": 0.9, "average_precision": 0.027, "base_rate": 0.03, "roc_auc": 0.45,
             "card_precision_top100": 0.12, "precision_top100": 0.1, "recall_at_1pct_fpr": 0.0}
    text = report.render("main", {}, [entry], tmp_path)
    assert "(base rate 0.0300: worse than guessing (0.9x the base rate))" in text
    assert "better than guessing" not in text
    assert "card precision of the top 100 cards per test day (CP@100): 0.1200" in text
    line = report.figures_line(entry)
    assert "average precision 0.027" in line and "ROC AUC 0.450" in line and "card precision@100 0.120" in line
    no_fraud = {**entry, "average_precision": float("nan"), "base_rate": 0.0}
    assert "no fraud on the test days: undefined" in report.render("main", {}, [no_fraud], tmp_path)
