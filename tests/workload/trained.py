"""Runs trained in the pytest process on a small dataset (a real Redis, a real share folder): what the
restore and rare-path tests start from. The dataset is made once, when the tests are collected: mutation
runs fork from a process that collected them."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from workload.data import dataset as ds
from workload.data import simulator
from workload.data.manifest import write_manifest
from workload.queue import plan
from workload.queue.workqueue import WorkQueue, connect
from workload.runtime.redis_server import RedisServer
from workload.runtime.worker import Outcome, Worker, WorkerConfig
from workload.share.paths import METRICS_PNG

SPEC = simulator.SimulationSpec(customers=100, terminals=80, train_days=4, test_days=1, start_date="2018-04-01",
                                seed=13)
QUICK = {"epochs": 1, "batch_size": 256, "hidden": [8]}
DAYS = [f"training/2018-04-0{d}.parquet" for d in (1, 2, 3, 4)]
_TMP = tempfile.TemporaryDirectory(prefix="trained-")


def _dataset() -> Path:
    root = Path(_TMP.name) / "fraud"
    simulator.generate(root, SPEC)
    write_manifest(root)
    ds.Dataset(root).ensure_features()
    return root


DATASET = _dataset()


class Trained:
    """One share with the dataset published, one queue, one in-process worker."""

    def __init__(self, share: Path, server: RedisServer) -> None:
        self.share = share
        shutil.copytree(DATASET, share / "datasets" / "fraud")
        self.queue = WorkQueue(connect(server.url, server.password))
        config = WorkerConfig(share=share, redis_url=server.url, redis_password=server.password, worker_id="w1",
                              lease_ttl_s=10, checkpoint_interval_s=600, idle_poll_s=0.05, plot_interval_s=3600)
        self.worker = Worker(config, self.queue)

    def seed(self, run: str) -> None:
        """What `seed` does for one new run: record it on the share, then enqueue its days."""
        spec = plan.RunSpec(run=run, dataset="fraud", hparams=QUICK)
        plan.record(self.share, spec)
        self.queue.put_spec(run, QUICK)
        (self.share / "output" / run).mkdir(parents=True, exist_ok=True)
        (self.share / "output" / run / METRICS_PNG).touch()  # pictures just drawn: only the last day redraws them
        self.queue.enqueue(plan.items(self.share, {run: spec}))
        self.queue.mark_seeded()

    def train(self, days: int) -> None:
        for _ in range(days):
            assert self.worker.process(self.queue.claim("w1", 10)) is Outcome.DONE
