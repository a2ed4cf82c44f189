"""The queue rebuilt from the share after Redis lost everything: what each run's newest checkpoint records is
marked done (not left pending for a worker's already-applied path to hide), the rest is pending in day order,
and the token counter starts above every token on the share, for two runs trained to different depths."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from workload.data import dataset as ds
from workload.data import simulator
from workload.queue import plan
from workload.queue.workqueue import WorkQueue, connect
from workload.runtime.redis_server import RedisServer
from workload.runtime.worker import Outcome, Worker, WorkerConfig
from workload.share.checkpoint import CheckpointStore
from workload.share.paths import METRICS_PNG

pytestmark = pytest.mark.timeout(120)

SPEC = simulator.SimulationSpec(customers=100, terminals=80, train_days=4, test_days=1, start_date="2018-04-01",
                                seed=13)
QUICK = {"epochs": 1, "batch_size": 256, "hidden": [8]}
DAYS = [f"training/2018-04-0{d}.parquet" for d in (1, 2, 3, 4)]
_TMP = tempfile.TemporaryDirectory(prefix="restore-")


def _dataset() -> Path:
    root = Path(_TMP.name) / "fraud"
    simulator.generate(root, SPEC)
    ds.write_manifest(root)
    ds.Dataset(root).ensure_features()
    return root


DATASET = _dataset()  # made at collection: mutation runs fork from a process that collected the tests


def seed(share: Path, queue: WorkQueue, run: str) -> None:
    """What `seed` does for one new run: record it on the share, then enqueue its days."""
    spec = plan.RunSpec(run=run, dataset="fraud", hparams=QUICK)
    plan.record(share, spec)
    queue.put_spec(run, QUICK)
    (share / "output" / run).mkdir(parents=True, exist_ok=True)
    (share / "output" / run / METRICS_PNG).touch()  # pictures just drawn: only the last day redraws them
    queue.enqueue(plan.items(share, {run: spec}))
    queue.mark_seeded()


def train(worker: Worker, queue: WorkQueue, days: int) -> None:
    for _ in range(days):
        assert worker.process(queue.claim("w1", 10)) is Outcome.DONE


def test_restore_marks_each_runs_applied_days_done_and_starts_tokens_above_the_share(
        redis_server: RedisServer, tmp_path: Path) -> None:
    share = tmp_path / "share"
    shutil.copytree(DATASET, share / "datasets" / "fraud")
    queue = WorkQueue(connect(redis_server.url, redis_server.password))
    config = WorkerConfig(share=share, redis_url=redis_server.url, redis_password=redis_server.password,
                          worker_id="w1", lease_ttl_s=10, checkpoint_interval_s=600, idle_poll_s=0.05,
                          plot_interval_s=3600)
    worker = Worker(config, queue)
    # "b-shallow" is trained first (one day, low tokens), "a-deep" later (three days, the highest tokens): the
    # floor must be the highest over every run, not the last run read.
    seed(share, queue, "b-shallow")
    train(worker, queue, 1)
    seed(share, queue, "a-deep")
    train(worker, queue, 3)
    tokens = {run: CheckpointStore(share / "output" / run).highest_token() for run in ("a-deep", "b-shallow")}
    assert tokens["a-deep"] > tokens["b-shallow"] > 0

    queue.redis.flushall()
    assert plan.restore(queue, share) == {"runs": 2, "enqueued": 8, "already_applied": 4}

    runs = queue.snapshot()["runs"]
    assert {run: (r["total"], r["done"]) for run, r in runs.items()} == {"a-deep": (4, 3), "b-shallow": (4, 1)}
    assert runs["a-deep"]["pending"] == [f"a-deep/{DAYS[3]}"]
    assert runs["b-shallow"]["pending"] == [f"b-shallow/{d}" for d in DAYS[1:]]
    assert queue.seeded()
    lease = queue.claim("w2", 10)
    assert lease is not None and lease.item.id == f"a-deep/{DAYS[3]}"
    assert lease.token > max(tokens.values())
    assert plan.restore(queue, share) == {"runs": 2, "enqueued": 0, "already_applied": 0}  # idempotent


def test_restore_of_a_share_with_runs_but_no_checkpoints_marks_nothing(redis_server: RedisServer,
                                                                        tmp_path: Path) -> None:
    share = tmp_path / "share"
    shutil.copytree(DATASET, share / "datasets" / "fraud")
    queue = WorkQueue(connect(redis_server.url, redis_server.password))
    seed(share, queue, "fresh")
    queue.redis.flushall()
    assert plan.restore(queue, share) == {"runs": 1, "enqueued": 4, "already_applied": 0}
    assert queue.snapshot()["runs"]["fresh"]["pending"] == [f"fresh/{d}" for d in DAYS]
    assert queue.claim("w1", 10).token == 1
