"""The worker: claim a shard, warm-start from the run's checkpoint, train, checkpoint, report, ack.

Order matters for fault tolerance. The checkpoint that records a shard as applied is promoted
before the report is written and before the ack; a worker that finds its claimed shard already
in the checkpoint just re-renders the report and acks (death between checkpoint and ack).
Mid-shard checkpoints every `checkpoint_interval_s` bound the work a hard kill loses; SIGTERM
(spot preemption notice) stops at the next batch, checkpoints if that fits the budget, releases
the lease so a peer resumes at once, and exits 143. Exit 0 only when the queue is drained.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import redis

from workload import export, faults, features, metrics, report
from workload.checkpoint import CheckpointStore
from workload.dataset import Dataset, DatasetError
from workload.paths import share_paths
from workload.queue import Lease, QueueUnavailable, WorkQueue
from workload.trainer import HParams, Trainer

log = logging.getLogger(__name__)

EXIT_DRAINED = 0
EXIT_TERMINATED = 143  # 128 + SIGTERM: not success, so a Job never mistakes preemption for completion


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class WorkerConfig:
    share: Path
    redis_url: str
    redis_password: str | None = field(default=None, repr=False)
    prefix: str = "spottrain"
    worker_id: str = field(default_factory=default_worker_id)
    lease_ttl_s: float = 30.0
    heartbeat_s: float | None = None  # default: a third of the lease TTL
    checkpoint_interval_s: float = 10.0
    max_attempts: int = 5
    idle_poll_s: float = 0.5
    keep_checkpoints: int = 3
    term_budget_s: float = 8.0  # of the ~15 s spot notice: what a final checkpoint may use
    plot_interval_s: float = 30.0  # pictures are redrawn at most this often, and after a run's last shard
    redis_retry_s: float = 300.0

    def __post_init__(self) -> None:
        checks = [("lease_ttl_s", self.lease_ttl_s > 0), ("checkpoint_interval_s", self.checkpoint_interval_s > 0),
                  ("max_attempts", self.max_attempts >= 1), ("keep_checkpoints", self.keep_checkpoints >= 1)]
        for name, ok in checks:
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r} is not allowed: it must be positive")
        if self.heartbeat_s is not None and not 0 < self.heartbeat_s < self.lease_ttl_s:
            raise ValueError(f"heartbeat_s={self.heartbeat_s} must be > 0 and below lease_ttl_s={self.lease_ttl_s}")

    @property
    def heartbeat_interval(self) -> float:
        return self.heartbeat_s or self.lease_ttl_s / 3


class LeaseLost(Exception):
    """Our lease expired or was taken over: stop, promote nothing, ack nothing."""


class PermanentError(Exception):
    """Retrying cannot help (bad hyperparameters, a checkpoint from other features): dead-letter now."""


class Heartbeat(threading.Thread):
    """Extends the lease in the background; sets `lost` when it is no longer ours."""

    def __init__(self, queue: WorkQueue, lease: Lease, ttl_s: float, interval_s: float) -> None:
        super().__init__(daemon=True, name="heartbeat")
        self.queue, self.lease, self.ttl_s, self.interval_s = queue, lease, ttl_s, interval_s
        self.lost = threading.Event()
        self._done = threading.Event()
        self._valid_until = time.monotonic() + ttl_s

    def beat(self) -> bool:
        """One synchronous heartbeat (also the fencing check before promoting a checkpoint)."""
        try:
            if self.queue.heartbeat(self.lease, self.ttl_s) is None:
                self.lost.set()
                return False
            self._valid_until = time.monotonic() + self.ttl_s
            return True
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            log.warning("heartbeat for %s failed (%s)", self.lease.item.id, exc)
            if time.monotonic() > self._valid_until:
                self.lost.set()
            return False

    def run(self) -> None:
        while not self._done.wait(self.interval_s) and not self.lost.is_set():
            self.beat()

    def stop(self) -> None:
        self._done.set()


class Worker:
    def __init__(self, cfg: WorkerConfig, queue: WorkQueue) -> None:
        self.cfg, self.queue = cfg, queue
        self.datasets_dir, self.output_dir = share_paths(cfg.share)
        self.stop = threading.Event()
        self._datasets: dict[str, Dataset] = {}

    def install_signal_handlers(self) -> None:
        def handle(signum: int, _frame: Any) -> None:
            log.warning("%s received: stopping at the next batch boundary", signal.Signals(signum).name)
            self.stop.set()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    # -- the loop ----------------------------------------------------------------------------------
    def run(self) -> int:
        log.info("worker %s starting (lease %.0fs, checkpoint every %.0fs)", self.cfg.worker_id,
                 self.cfg.lease_ttl_s, self.cfg.checkpoint_interval_s)
        waiting_logged = False
        while not self.stop.is_set():
            lease = self.queue.claim(self.cfg.worker_id, self.cfg.lease_ttl_s)
            if lease:
                waiting_logged = False
                self.process(lease)
                continue
            counts = self.queue.counts()
            if counts.drained:
                log.info("queue drained: %d done, %d dead-lettered of %d; exiting 0",
                         counts.done, counts.dead, counts.total)
                return EXIT_DRAINED
            if not waiting_logged:
                log.info("nothing to claim (%d pending behind peers, %d leased): waiting for peers to finish "
                         "or their leases to expire", counts.pending, counts.leased)
                waiting_logged = True
            self.stop.wait(self.cfg.idle_poll_s)
        log.warning("worker %s stopped by signal; exiting %d", self.cfg.worker_id, EXIT_TERMINATED)
        return EXIT_TERMINATED

    def process(self, lease: Lease) -> None:
        item = lease.item
        log.info("claimed %s (token %d, %d failed attempts before)", item.id, lease.token, lease.attempts)
        faults.point("claimed")
        beat = Heartbeat(self.queue, lease, self.cfg.lease_ttl_s, self.cfg.heartbeat_interval)
        beat.start()
        try:
            self._apply(lease, beat)
        except LeaseLost:
            log.warning("lost the lease on %s: abandoning it (the new owner resumes from the last "
                        "promoted checkpoint)", item.id)
        except (DatasetError, PermanentError) as exc:
            state = self.queue.release(lease, error=str(exc), permanent=True)
            log.error("%s can never succeed: %s -> %s", item.id, exc, state)
        except QueueUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - any other failure costs one attempt
            log.exception("failed on %s", item.id)
            state = self.queue.release(lease, error=f"{type(exc).__name__}: {exc}")
            log.error("%s released after error -> %s", item.id, state)
        finally:
            beat.stop()

    def dataset(self, name: str) -> Dataset:
        if name not in self._datasets:
            root = (self.datasets_dir / name).resolve()
            if "/" in name or name in ("", ".", "..") or not root.is_relative_to(self.datasets_dir.resolve()):
                raise DatasetError(f"dataset name {name!r} is not a folder name under {self.datasets_dir}")
            self._datasets[name] = Dataset(root)
        return self._datasets[name]

    # -- one item ----------------------------------------------------------------------------------
    def _apply(self, lease: Lease, beat: Heartbeat) -> None:
        item = lease.item
        dataset = self.dataset(item.dataset)
        dataset.resolve(item.shard)  # refuses paths outside the dataset and pickle files
        try:
            hp = HParams.from_dict(self.queue.spec(item.run), where=f"run {item.run!r} hyperparameters")
        except (KeyError, ValueError) as exc:
            raise PermanentError(str(exc)) from exc
        run_dir = self.output_dir / item.run
        store = CheckpointStore(run_dir, keep=self.cfg.keep_checkpoints)
        loaded = store.load()

        if loaded and item.shard in loaded.state["applied"]:
            log.info("%s is already in checkpoint %s: re-rendering the report and acking",
                     item.id, loaded.path.name)
            trainer = Trainer.from_state(loaded.state)
            self._report(run_dir, trainer, dataset)
            self._ack(lease)
            return
        if loaded and loaded.state["progress"] and loaded.state["progress"]["shard"] != item.shard:
            log.warning("checkpoint %s is mid-way through %s, not %s: starting from the last shard boundary",
                        loaded.path.name, loaded.state["progress"]["shard"], item.shard)
            loaded = store.load(accept=lambda s: s["progress"] is None)

        if loaded:
            trainer = Trainer.from_state(loaded.state)
            if (trainer.feature_names, trainer.feature_version) != (features.FEATURE_NAMES,
                                                                    features.FEATURE_VERSION):
                raise PermanentError(f"checkpoint {loaded.path} was trained on features {trainer.feature_names} "
                                     f"version {trainer.feature_version!r}, this code computes "
                                     f"{features.FEATURE_NAMES} version {features.FEATURE_VERSION!r}: "
                                     "start a new run")
            if trainer.hp != hp:
                log.warning("run %s: checkpoint hyperparameters %s differ from the queue's %s; the checkpoint's "
                            "lineage wins", item.run, trainer.hp, hp)
        else:
            trainer = Trainer(item.run, hp, features.FEATURE_NAMES, feature_version=features.FEATURE_VERSION)
        examples = dataset.examples([item.shard])
        if self.stop.is_set():
            self._release_preempted(lease)
            return
        resumed = trainer.progress
        log.info("%s: training on %d rows, %s", item.id, len(examples.y),
                 f"resuming at epoch {resumed['epoch']} batch {resumed['batch']}"
                 if resumed and resumed["shard"] == item.shard else
                 f"warm start after {len(trainer.applied)} shard(s)" if trainer.applied else "cold start")
        trainer.begin_shard(item.shard, examples.x)

        def promote() -> bool:
            return not beat.lost.is_set() and beat.beat()

        last_save = time.monotonic()
        save_cost = 1.0

        def checkpoint() -> None:
            nonlocal last_save, save_cost
            started = time.monotonic()
            if store.save(trainer.state_dict(), path=store.next_path(lease.token), may_promote=promote) is None:
                raise LeaseLost
            last_save = time.monotonic()
            save_cost = last_save - started

        def after_step() -> bool:
            if beat.lost.is_set():
                raise LeaseLost
            if self.stop.is_set():
                if save_cost < self.cfg.term_budget_s:
                    checkpoint()
                else:
                    log.warning("no time for a final checkpoint (last took %.1fs)", save_cost)
                return False
            if time.monotonic() - last_save >= self.cfg.checkpoint_interval_s:
                checkpoint()
            return True

        started = time.monotonic()
        if not trainer.train_shard(examples.x, examples.y, after_step):
            self._release_preempted(lease)
            return
        train_s = time.monotonic() - started

        path = store.next_path(lease.token)
        test = dataset.test_examples()
        test_scores = trainer.score(test.x)
        entry: dict[str, Any] = {
            "shard": item.shard, "time": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "checkpoint": path.name, "train_rows": int(len(examples.y)), "train_frauds": int(examples.y.sum()),
            "first_day": str(examples.day.min()) if len(examples.day) else "",
            "last_day": str(examples.day.max()) if len(examples.day) else "",
            "train_accuracy": trainer.train_accuracy(len(examples.y)),
            "train_seconds": round(train_s, 3), **metrics.evaluate(test_scores, test.y, test.day, test.card),
        }
        trainer.finish_shard(entry)
        if store.save(trainer.state_dict(), path=path, may_promote=promote) is None:
            raise LeaseLost
        faults.point("after-promote")
        last_of_run = self.queue.pending_in_run(item.run) == 0
        self._report(run_dir, trainer, dataset, test_scores, draw=last_of_run or report.plots_stale(
            run_dir, self.cfg.plot_interval_s))
        log.info("%s applied: average precision %.3f (base rate %.4f), ROC AUC %.3f", item.id,
                 entry["average_precision"], entry["base_rate"], entry["roc_auc"])
        faults.point("before-ack")
        self._ack(lease)

    def _report(self, run_dir: Path, trainer: Trainer, dataset: Dataset, test_scores: np.ndarray | None = None,
                draw: bool = True) -> None:
        """Rewrite the report from the trainer's history; redraw the pictures only when `draw`
        (drawing two PNGs costs more than training a tutorial-sized day)."""
        pr = None
        if draw:
            test = dataset.test_examples()
            pr = metrics.pr_curve(trainer.score(test.x) if test_scores is None else test_scores, test.y)
        report.write(run_dir, trainer.state_dict(), pr, draw=draw)

    def _ack(self, lease: Lease) -> None:
        if self.queue.ack(lease):
            log.info("acked %s", lease.item.id)
            # We acked the run's last day: results to $OUTPUT_URI (a failure there only warns).
            if os.environ.get(export.OUTPUT_URI_ENV) and self.queue.pending_in_run(lease.item.run) == 0:
                export.export_finished_run(self.cfg.share, lease.item.run)
        else:
            log.warning("ack of %s refused: a newer owner holds it (its checkpoint records our work if it "
                        "was promoted)", lease.item.id)

    def _release_preempted(self, lease: Lease) -> None:
        state = self.queue.release(lease)
        log.warning("released %s for a peer (%s)", lease.item.id, state)
