"""`make local` end to end on the default dataset: a report, pictures, a model that finds fraud,
and a second run that trains nothing new."""

from __future__ import annotations

import json
import os
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


def workload(cwd: Path, *argv: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    """`python -m workload ARGV` of this checkout, run from `cwd` as a user runs it from their checkout."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "workload", *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """`make local` in a user's checkout (a git work tree): no --dir, so the folder is ./local."""
    checkout = tmp_path_factory.mktemp("checkout")
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    out = workload(checkout, "local", "--workers", "2")
    assert out.returncode == 0, out.stdout + out.stderr
    return checkout / "local", out


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
    assert f"page:    {run_dir / 'report.html'}" in out.stdout and (run_dir / "report.html").is_file()
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
    out = workload(base.parent, "local", timeout=120)
    assert out.returncode == 0, out.stderr
    assert "nothing new to train" in out.stderr
    assert sorted(p.name for p in ckpts.iterdir()) == before
    assert (base / "share" / "output" / "main" / "report.txt").read_text() == report_before


COLUMNS_YAML = """\
columns: {tx_id: TRANSACTION_ID, ts: TX_DATETIME, card_id: CUSTOMER_ID, merchant_id: TERMINAL_ID,
          amount: TX_AMOUNT, is_fraud: TX_FRAUD}
timezone: UTC
"""
USERS = {"TRANSACTION_ID": "tx_id", "TX_DATETIME": "ts", "CUSTOMER_ID": "card_id", "TERMINAL_ID": "merchant_id",
         "TX_AMOUNT": "amount", "TX_FRAUD": "is_fraud"}


def bank_export(src: Path, dest: Path) -> None:
    """The tiny dataset as README's Bring-your-data section shows a user's: CSV days in the user's column
    names, dates day first to the minute."""
    import pandas as pd

    for path in sorted(src.glob("*/*.parquet")):
        frame = pd.read_parquet(path)[list(USERS)].rename(columns=USERS)
        frame["ts"] = pd.to_datetime(frame["ts"]).dt.strftime("%d/%m/%Y %H:%M")
        (dest / path.parent.name).mkdir(parents=True, exist_ok=True)
        frame.to_csv(dest / path.parent.name / f"{path.stem}.csv", index=False)


def test_readmes_own_data_path_works_as_written_after_make_local_and_the_folder_remembers_it(
        local_run, dataset_src: Path) -> None:
    """README: `make local`, then `make local ARGS="--datasets export/ --columns columns.yaml --datetime-format
    '%d/%m/%Y %H:%M'"` (today's main: "a dataset has one source", naming a `--dataset` that `local` lacks); then
    again with `--dir` alone; and `status` of the ended folders. git sees none of it."""
    checkout = local_run[0].parent
    bank_export(dataset_src, checkout / "export")
    (checkout / "columns.yaml").write_text(COLUMNS_YAML)
    out = workload(checkout, "local", "--datasets", "export/", "--columns", "columns.yaml",
                   "--datetime-format", "%d/%m/%Y %H:%M")
    assert out.returncode == 0, out.stdout + out.stderr
    own = checkout / "local-export"
    assert f"page:    {own / 'share' / 'output' / 'main' / 'report.html'}" in out.stdout, out.stdout
    assert "run main: 6/6 shards applied" in out.stdout, out.stdout
    again = workload(checkout, "local", "--dir", "local-export", timeout=120)
    assert again.returncode == 0 and "nothing new to train" in again.stderr, again.stderr
    assert (f"as {own / 'local.json'} remembers: --datasets {checkout / 'export'} --columns "
            f"{checkout / 'columns.yaml'} --datetime-format '%d/%m/%Y %H:%M'") in again.stderr, again.stderr
    status = workload(checkout, "status", "--dir", "local-export", timeout=120)
    assert status.returncode == 0 and "run main: 6/6 shards applied" in status.stdout, status.stdout + status.stderr
    exported = workload(checkout, "export", "--share", "local-export/share", "--run", "main", "--to", "results",
                        timeout=120)
    assert exported.returncode == 0, exported.stderr
    page = own / "share" / "output" / "main" / "report.html"
    assert (checkout / "results" / "main" / "report.html").read_bytes() == page.read_bytes()
    untracked = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=checkout,
                               capture_output=True, text=True, check=True).stdout.split()
    assert not [p for p in untracked if p.startswith("local")], untracked  # bank data is never an untracked file
    assert "columns.yaml" in untracked and "results/main/report.html" in untracked
