"""`make local` end to end on the default dataset: a report, pictures, a model that finds fraud,
and a second run that trains nothing new."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench import baselines
from workload.data import features
from workload.data.dataset import Dataset
from workload.model import metrics
from workload.model.trainer import HParams, Trainer

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(420)


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    base = tmp_path_factory.mktemp("local")
    out = subprocess.run([sys.executable, "-m", "workload", "local", "--dir", str(base), "--workers", "2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stdout + out.stderr
    return base, out


def test_local_leaves_report_pictures_and_checkpoints(local_run) -> None:
    base, out = local_run
    run_dir = base / "share" / "output" / "main"
    shards = Dataset(base / "share" / "datasets" / "fraud").training_shards()
    report = (run_dir / "report.txt").read_text()
    assert report.count("training dataset: ") == len(shards) == 21
    assert "accuracy on testing data" in report and "average precision (AUPRC)" in report
    for picture in ("metrics.png", "pr_curve.png"):
        assert (run_dir / picture).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(list((run_dir / "checkpoints").glob("ckpt-*.pt"))) >= 1
    assert f"report:  {run_dir / 'report.txt'}" in out.stdout
    assert "21/21 shards applied" in out.stdout
    # The summary: AP with CP@100 next to it, and the newest model's two alert rules.
    assert re.search(r"test days: average precision \d\.\d{3} vs base rate \d\.\d{4}; card precision@100 \d\.\d{3};",
                     out.stdout), out.stdout
    assert "top 100 cards a day: threshold" in out.stdout and "1% false-positive rate: threshold" in out.stdout
    # The report ends with the newest model's reliability tables, calibrated on days the delay allows.
    assert "before calibration" in report and "after calibration" in report
    assert report.count("calibration: fitted on 7 day(s)") >= 1, report


def test_the_model_finds_fraud_better_than_a_linear_baseline(local_run) -> None:
    """Against logistic regression on the same features, trained the same way (shard by shard, in
    order, warm-started): the network must do at least as well. A logistic regression fitted on all
    training days at once (Newton) is the ceiling of the shard-by-shard protocol; stay close to it."""
    base, _ = local_run
    lines = (base / "share" / "output" / "main" / "metrics.jsonl").read_text().splitlines()
    final = json.loads(lines[-1])
    data = Dataset(base / "share" / "datasets" / "fraud")
    shards = [(s, data.examples([s])) for s in data.training_shards()]
    test = data.test_examples()
    linear = Trainer("baseline", HParams(hidden=()), features.FEATURE_NAMES)
    for shard, ex in shards:
        linear.begin_shard(shard, ex.x)
        linear.train_shard(ex.x, ex.y, lambda: True)
        linear.finish_shard({})
    same_protocol = metrics.evaluate(linear.score(test.x), test.y, test.day)["average_precision"]
    x, y = np.concatenate([e.x for _, e in shards]), np.concatenate([e.y for _, e in shards])
    all_at_once = metrics.evaluate(baselines.logistic_regression_baseline(x, y, test.x), test.y, test.day)
    model = final["average_precision"]
    print(f"average precision: model {model:.3f}, logistic regression shard by shard {same_protocol:.3f}, "
          f"logistic regression on all days at once {all_at_once['average_precision']:.3f}, "
          f"base rate {final['base_rate']:.4f}")
    assert model >= 0.5
    assert model >= same_protocol
    assert model >= all_at_once["average_precision"] - 0.03
    assert model > 10 * final["base_rate"]


def test_a_second_local_run_trains_nothing_new(local_run) -> None:
    base, _ = local_run
    ckpts = base / "share" / "output" / "main" / "checkpoints"
    before = sorted(p.name for p in ckpts.iterdir())
    report_before = (base / "share" / "output" / "main" / "report.txt").read_text()
    out = subprocess.run([sys.executable, "-m", "workload", "local", "--dir", str(base)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "nothing new to train" in out.stderr
    assert sorted(p.name for p in ckpts.iterdir()) == before
    assert (base / "share" / "output" / "main" / "report.txt").read_text() == report_before
