"""Flags and paths that the main tests never take: an export while the newest checkpoint is mid-day,
`score --days all`, files nested deeper than a role folder, a storage fault while storing features."""

from __future__ import annotations

import contextlib
import json
import logging
import resource
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from safetensors import safe_open
from trained import DATASET, DAYS, Trained

from workload import cli
from workload.data import dataset as ds
from workload.data import featurestore, publish, schema
from workload.data.manifest import MANIFEST
from workload.data.source import LocalSource
from workload.model.export import HEADER_KEY, MODEL_FILE
from workload.model.lineage import checkpoint_of, trainer_from
from workload.runtime.redis_server import RedisServer
from workload.share.checkpoint import CheckpointStore

pytestmark = pytest.mark.timeout(120)


def user_folder(tmp_path: Path) -> Path:
    """The dataset as a user's folder: days only, no manifest, no stored features."""
    folder = tmp_path / "export"
    shutil.copytree(DATASET, folder, ignore=shutil.ignore_patterns("manifest.json", featurestore.FOLDER))
    return folder


def ids_of(folder: Path, *roles: str) -> list[int]:
    return sorted(int(i) for role in roles for p in sorted((folder / role).glob("*.parquet"))
                  for i in pd.read_parquet(p)[schema.TRANSACTION_ID])


def save_mid_day(share: Path, run: str, day: str) -> None:
    """A checkpoint promoted part-way through `day` (as a periodic checkpoint or a preemption leaves it), under a
    new lease: the newest in the run's folder."""
    store = CheckpointStore(share / "output" / run)
    loaded = store.load()
    assert loaded is not None
    trainer = trainer_from(loaded.state)
    examples = ds.Dataset(share / "datasets" / "fraud").examples([day])
    trainer.begin_shard(day, examples.x)
    assert trainer.train_shard(examples.x, examples.y, lambda: False) is False  # stopped after one batch
    token = store.highest_token() + 1
    assert store.fence(token)
    assert store.save(checkpoint_of(trainer), path=store.next_path(token), may_promote=lambda: True, boundary=True)
    newest = store.load()
    assert newest is not None
    progress = newest.state["progress"]
    assert {k: progress[k] for k in ("shard", "epoch", "batch")} == {"shard": day, "epoch": 0, "batch": 1}


@pytest.fixture
def exported(redis_server: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """Run "main" trained on two days, then checkpointed mid-way through the third, then exported."""
    env = Trained(tmp_path / "share", redis_server)
    env.seed("main")
    env.train(2)
    save_mid_day(env.share, "main", DAYS[2])
    assert cli.main(["export", "--share", str(env.share), "--run", "main", "--to", str(tmp_path / "results")]) == 0
    capsys.readouterr()
    return tmp_path / "results" / "main"


def test_an_export_while_the_newest_checkpoint_is_mid_day_takes_the_last_finished_day(exported: Path) -> None:
    with safe_open(str(exported / MODEL_FILE), framework="pt") as f:
        state = json.loads(f.metadata()[HEADER_KEY])["state"]
    assert state["applied"] == DAYS[:2]
    assert not state.get("progress")
    assert len((exported / "metrics.jsonl").read_text().splitlines()) == 2
    assert (exported / "report.txt").read_text().count("training dataset: ") == 2


def test_score_days_all_scores_every_training_and_testing_day(exported: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A dataset without scoring/ days: `--days all` scores every labelled day, each exactly once."""
    folder = user_folder(tmp_path)
    every, testing = tmp_path / "all.parquet", tmp_path / "testing.parquet"
    model = str(exported / MODEL_FILE)
    assert cli.main(["score", "--model", model, "--datasets", str(folder), "--out", str(every), "--days", "all",
                     "--allow-short-history"]) == 0  # the first day has no earlier day
    assert cli.main(["score", "--model", model, "--datasets", str(folder), "--out", str(testing), "--days",
                     "testing"]) == 0
    capsys.readouterr()
    scored = pd.read_parquet(every)
    assert sorted(scored[schema.TRANSACTION_ID]) == ids_of(folder, "training", "testing")
    assert sorted(pd.read_parquet(testing)[schema.TRANSACTION_ID]) == ids_of(folder, "testing")
    # The testing days' scores do not depend on what else is scored: the same windows, the same model (up to
    # float32 rounding in a batch of another shape).
    both = scored.merge(pd.read_parquet(testing), on=schema.TRANSACTION_ID, suffixes=("_all", "_testing"))
    assert len(both) == len(ids_of(folder, "testing"))
    np.testing.assert_allclose(both["score_all"], both["score_testing"], rtol=1e-5)
    assert not (folder / MANIFEST).exists()


def test_files_nested_deeper_than_a_role_folder_are_ignored_and_named(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """training/extra/DAY.parquet is not a day of the dataset (a user's sub-folder of notes, backups or another
    export): never published, never trained, and the warning names it."""
    folder = user_folder(tmp_path)
    (folder / "training" / "extra").mkdir()
    nested = folder / "training" / "extra" / "2018-04-05.parquet"
    shutil.copy(folder / "testing" / "2018-04-05.parquet", nested)
    (folder / "testing" / "old").mkdir()
    shutil.copy(folder / "training" / "2018-04-02.parquet", folder / "testing" / "old" / "copy.parquet")
    with caplog.at_level(logging.WARNING, logger="workload.data.source"):
        listed = LocalSource(folder).files()
    assert sorted(f.rel for f in listed) == sorted([*DAYS, "testing/2018-04-05.parquet"])
    assert "ignoring 2 file(s) not directly in history/, training/, testing/" in caplog.text
    assert str(nested) in caplog.text
    root = tmp_path / "share" / "fraud"
    root.parent.mkdir()
    outcome = publish.publish(root, LocalSource(folder))
    assert sorted(outcome.copied) == sorted([*DAYS, "testing/2018-04-05.parquet"])
    assert not (root / "training" / "extra").exists() and not (root / "testing" / "old").exists()


@contextlib.contextmanager
def writes_fail_beyond(limit: int) -> Iterator[None]:
    """Writes past `limit` bytes fail with EFBIG (SIGXFSZ ignored): a storage fault, for real."""
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, old_limit[1]))
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)


def test_a_storage_fault_while_storing_features_costs_a_recomputation_not_the_day(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The features are computed and returned; nothing half-written is left in the store, and the next
    reader computes them again (and stores them, once the share is healthy)."""
    root = tmp_path / "fraud"
    shutil.copytree(DATASET, root, ignore=shutil.ignore_patterns(featurestore.FOLDER))
    day = DAYS[1]
    expected = ds.Dataset(root).compute_features(day)
    with caplog.at_level(logging.WARNING, logger="workload.data.dataset"), writes_fail_beyond(1024):
        got = ds.Dataset(root).examples([day])
    np.testing.assert_array_equal(got.x, expected["x"])
    np.testing.assert_array_equal(got.ids, expected["ids"])
    assert f"could not store the features of {day}" in caplog.text and "File too large" in caplog.text
    store = root / featurestore.FOLDER
    assert not store.exists() or [p for p in store.rglob("*") if p.is_file()] == []
    with pytest.raises(featurestore.StaleFeatures):
        ds.Dataset(root).stored_features(day)
    ds.Dataset(root).examples([day])
    np.testing.assert_array_equal(ds.Dataset(root).stored_features(day)["x"], expected["x"])
