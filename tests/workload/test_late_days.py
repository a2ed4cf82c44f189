"""Chronological order, always: a day that arrives after later days were applied (a backfill, or a
dead day requeued) makes the run go back to the boundary before it and apply it and every later day
again, in date order, ending with the weights of an in-order run.

Through the command line, against a real redis-server and real worker processes."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import zygote
from exports import copy_files
from harness import HPARAMS, ROOT, Cluster, same_weights

from workload.core.errors import EXIT_DEAD_LETTERS
from workload.data.dataset import Dataset
from workload.runtime.redis_server import RedisServer
from workload.share.checkpoint import CheckpointStore
from workload.share.paths import REPORT_TXT

pytestmark = pytest.mark.timeout(300)

LATE = "training/2018-04-03.parquet"
LATER = ["training/2018-04-04.parquet", "training/2018-04-05.parquet", "training/2018-04-06.parquet"]


def cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return zygote.run(["workload", *args], cluster.env(), ROOT, 120)


def assert_in_order(cluster: Cluster, reference: dict) -> None:
    """Every day once, in date order, the in-order run's weights, and the report says what was re-applied."""
    shards = Dataset(cluster.share / "datasets" / "fraud").training_shards()
    final = cluster.final_state()
    assert final["applied"] == shards, "every day applied once, in date order"
    assert [h["shard"] for h in final["history"]] == shards
    assert same_weights(final, reference)
    c = cluster.counts()
    assert (c.total, c.done, c.dead, c.pending, c.leased) == (6, 6, 0, 0, 0)
    text = (cluster.share / "output" / "main" / REPORT_TXT).read_text()
    assert f"{', '.join(LATER)}, because {LATE} arrived after {LATER[-1]} was applied" in text, text


def train_all_but_one_day_then_backfill(cluster: Cluster, tmp_path: Path) -> None:
    """Seed run main without LATE, train it to the end, then publish LATE and seed again."""
    folder = copy_files(cluster.dataset_src, tmp_path / "export", keep=lambda rel: rel != LATE)
    runs_file = tmp_path / "runs.json"
    runs_file.write_text(json.dumps({"main": HPARAMS}))
    assert cli(cluster, "seed", "--datasets", str(folder), "--runs-file", str(runs_file)).returncode == 0
    cluster.start_worker("w1")
    assert cluster.wait_all() == [0], cluster.log("w1")
    assert LATE not in cluster.final_state()["applied"]
    copy_files(cluster.dataset_src, folder, keep=lambda rel: rel == LATE)
    out = cli(cluster, "seed", "--datasets", str(folder), "--runs-file", str(runs_file))
    assert out.returncode == 0 and cluster.counts().pending == 1, out.stderr


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory: pytest.TempPathFactory, dataset_src: Path) -> Path:
    """The share and Redis's data after train_all_but_one_day_then_backfill, built once for the module: its
    two seeds and five days of training cost ~13 s of CPU, paid by each of five tests before."""
    base = tmp_path_factory.mktemp("backfilled")
    server = RedisServer(base / "redis").start()
    cluster = Cluster(server=server, share=base / "share", dataset_src=dataset_src)
    cluster.share.mkdir()
    try:
        train_all_but_one_day_then_backfill(cluster, base)
        cluster.copy_redis(base / "aof")
    finally:
        cluster.stop()
        server.kill()
    return base


def backfilled_into(cluster: Cluster, backfilled: Path) -> None:
    """This test's cluster as `backfilled` left its own: the same share and the same Redis data."""
    shutil.copytree(backfilled / "share", cluster.share, dirs_exist_ok=True)
    cluster.restore_redis(backfilled / "aof")
    assert LATE not in cluster.final_state()["applied"] and cluster.counts().pending == 1


# Where the worker that rewinds is killed: not at all; after the later days were put back, before the
# late day is read; mid-way through the late day; with the late day promoted but not acked.
@pytest.mark.parametrize("kill", [None, "read:1", "checkpoint-written:2", "before-ack:1"])
def test_a_backfilled_earlier_day_is_applied_in_date_order(cluster: Cluster, backfilled: Path,
                                                           reference_state: dict, kill: str | None) -> None:
    """Five days trained, then the missing earlier day is published and seeded: the run goes back to the
    end of the day before it, applies it and the three later days again, and ends as an in-order run,
    also when the worker doing so is killed mid-rewind and another one finishes."""
    backfilled_into(cluster, backfilled)
    if kill:
        cluster.start_worker("victim", WORKLOAD_FAULT=kill)
        assert cluster.wait_all() == [-9], cluster.log("victim")
        assert "rewinding run main to ckpt-" in cluster.log("victim")
        cluster.procs.clear()
    cluster.start_worker("w2")
    assert cluster.wait_all() == [0], cluster.log("w2")
    assert_in_order(cluster, reference_state)


def test_a_backfill_whose_boundary_was_pruned_restarts_from_the_nearest_kept_one(cluster: Cluster, backfilled: Path,
                                                                                reference_state: dict) -> None:
    """The boundary checkpoint before the late day is gone (pruned by retention's ladder, or deleted): the run
    goes back to the nearest kept boundary before it, the days it lacks are applied again first, then the late
    day and the later ones, in date order: nothing is refused, and the run ends as an in-order run."""
    backfilled_into(cluster, backfilled)
    before = cluster.final_state()["applied"]
    store = CheckpointStore(cluster.share / "output" / "main")
    boundary = store.load(accept=lambda s: s["applied"] == before[:2] and s["progress"] is None)
    assert boundary is not None
    boundary.path.unlink()
    cluster.start_worker("w2")
    assert cluster.wait_all() == [0], cluster.log("w2")
    assert "was pruned; the nearest kept one is ckpt-" in cluster.log("w2")
    assert_in_order(cluster, reference_state)


def test_a_dead_day_requeued_after_later_days_is_applied_in_date_order(cluster: Cluster,
                                                                       reference_state: dict) -> None:
    """A day that is no Parquet is dead-lettered and the run moves on to the later days; once the file is
    fixed and the day requeued, the run goes back to the end of the day before it and re-applies the rest."""
    cluster.seed()
    day = cluster.share / "datasets" / "fraud" / LATE
    day.write_bytes(b"PAR1 this is not parquet")
    cluster.start_worker("w1")
    assert cluster.wait_all() == [EXIT_DEAD_LETTERS], cluster.log("w1")
    assert cluster.final_state()["applied"] == ["training/2018-04-01.parquet", "training/2018-04-02.parquet", *LATER]
    shutil.copyfile(cluster.dataset_src / LATE, day)
    out = cli(cluster, "requeue", "--item", f"main/{LATE}")
    assert out.returncode == 0 and "requeued 1 dead-lettered item(s)" in out.stdout, out.stdout + out.stderr
    cluster.procs.clear()
    cluster.start_worker("w2")
    assert cluster.wait_all() == [0], cluster.log("w2")
    assert "rewinding run main to ckpt-" in cluster.log("w2")
    assert_in_order(cluster, reference_state)


def test_a_history_day_published_after_the_run_trained_is_named_with_how_to_retrain(cluster: Cluster,
                                                                                     tmp_path: Path) -> None:
    """The run trains five days; then the day before them arrives as history/ (feature windows only). Nothing
    retrains (a run is one lineage), but seed names, in one line, the run and the days trained without it, and
    how to train with it."""
    first = "training/2018-04-01.parquet"
    folder = copy_files(cluster.dataset_src, tmp_path / "export", keep=lambda rel: rel != first)
    runs_file = tmp_path / "runs.json"
    runs_file.write_text(json.dumps({"main": {"epochs": 1, "batch_size": 256, "hidden": [8]}}))
    assert cli(cluster, "seed", "--datasets", str(folder), "--runs-file", str(runs_file)).returncode == 0
    cluster.start_worker("w1")
    assert cluster.wait_all() == [0], cluster.log("w1")
    copy_files(cluster.dataset_src, folder, keep=lambda rel: rel == first, role_of=lambda rel: "history")
    out = cli(cluster, "seed", "--datasets", str(folder), "--runs-file", str(runs_file))
    assert out.returncode == 0, out.stderr
    (line,) = [x for x in out.stderr.splitlines() if "before history day(s)" in x]
    assert "run main trained " in line and " day(s) (training/2018-04-02.parquet" in line, line
    assert "before history day(s) history/2018-04-01.parquet that their feature windows read were published" in line
    assert line.endswith("To train with them, seed the same hyperparameters under a new run name"), line
    again = cli(cluster, "seed", "--datasets", str(folder), "--runs-file", str(runs_file))
    assert "before history day(s)" not in again.stderr, "said once, when the day arrives"
