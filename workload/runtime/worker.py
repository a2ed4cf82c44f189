"""The worker: claim a shard, warm-start from the run's checkpoint, train, checkpoint, report, ack.

Order matters for fault tolerance. The checkpoint that records a shard as applied is promoted
before the report is written and before the ack; a worker that finds its claimed shard already
in the checkpoint just re-renders the report and acks (death between checkpoint and ack).
Mid-shard checkpoints every `checkpoint_interval_s` bound the work a hard kill loses; SIGTERM
(spot preemption notice) stops at the next batch, checkpoints if that fits the budget, releases
the lease so a peer resumes at once, and exits 143 within `term_grace_s` whatever it was waiting on.

Failures are classified (workload.core.errors): an item fault is dead-lettered at once; an
infrastructure fault releases the item at no cost, backs off, and exits `EXIT_INFRA` if it persists.
Everything written to the share is fenced by the lease token (workload.share.checkpoint), so a worker
frozen past its lease changes nothing when it wakes. A watchdog gives the lease up and exits
`EXIT_STALLED` when the worker is stuck in I/O. The exit code says what happened:
0 all done, 4 drained with dead letters, 3 a persistent infrastructure fault, 143 SIGTERM.
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
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import redis
import torch

from workload.core import faults
from workload.core.errors import (
    EXIT_DEAD_LETTERS,
    EXIT_DONE,
    EXIT_INFRA,
    EXIT_STALLED,
    EXIT_TERMINATED,
    InfraFault,
    ItemFault,
    NonFinite,
    describe,
    is_infra,
)
from workload.data import features
from workload.data.dataset import Dataset, DatasetError
from workload.model import calibration, export, metrics, report
from workload.model.trainer import HParams, Trainer
from workload.queue import plan
from workload.queue.workqueue import Lease, QueueInterrupted, QueueUnavailable, WorkQueue
from workload.share.checkpoint import CheckpointStore, Loaded
from workload.share.paths import check_name, share_paths

log = logging.getLogger(__name__)



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
    term_grace_s: float = 13.0  # SIGTERM ends the process within this, whatever it waits on
    plot_interval_s: float = 30.0  # pictures are redrawn at most this often, and after a run's last shard
    redis_retry_s: float = 300.0
    infra_give_up_s: float = 300.0  # an infrastructure fault persisting this long: exit EXIT_INFRA
    infra_backoff_s: float = 1.0  # first pause after an infrastructure fault; doubles up to 30 s
    stall_s: float = 300.0  # no progress (stuck in I/O) this long: give the lease up, exit EXIT_STALLED

    def __post_init__(self) -> None:
        checks = [("lease_ttl_s", self.lease_ttl_s > 0), ("checkpoint_interval_s", self.checkpoint_interval_s > 0),
                  ("max_attempts", self.max_attempts >= 1), ("keep_checkpoints", self.keep_checkpoints >= 1),
                  ("term_grace_s", self.term_grace_s > 0), ("infra_give_up_s", self.infra_give_up_s > 0),
                  ("infra_backoff_s", self.infra_backoff_s > 0), ("stall_s", self.stall_s > 0)]
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


class PermanentError(ItemFault):
    """Retrying cannot help (bad hyperparameters, a checkpoint from other features): dead-letter now."""


class Outcome(Enum):
    DONE = "done"  # applied (or found applied) and acked
    RELEASED = "released"  # preempted, or given back at no cost to be claimed again at once
    FAILED = "failed"  # an item fault or an error: dead-lettered or retried later
    INFRA = "infra"  # an infrastructure fault: released at no cost; back off
    LOST = "lost"  # the lease was lost


class Heartbeat(threading.Thread):
    """Extends the lease in the background while the worker makes progress; sets `lost` when the
    lease is no longer ours. A connection error is not a lost lease: the lease stays valid until its
    deadline, so beats are retried until then. No progress for `stall_s` (a read that never
    returns): give the lease up at no cost and exit, instead of renewing it forever."""

    def __init__(self, queue: WorkQueue, lease: Lease, ttl_s: float, interval_s: float,
                 progress: Any = None, stall_s: float = float("inf")) -> None:
        super().__init__(daemon=True, name="heartbeat")
        self.queue, self.lease, self.ttl_s, self.interval_s = queue, lease, ttl_s, interval_s
        self.lost = threading.Event()
        self._done = threading.Event()
        self._valid_until = time.monotonic() + ttl_s
        self._progress = progress or (lambda: time.monotonic())
        self.stall_s = stall_s

    def beat(self) -> bool | None:
        """One heartbeat: True renewed, False lost (Redis said so, or the validity ran out), None when
        Redis did not answer but the lease may still be valid."""
        sent = time.monotonic()  # the server's deadline is later than sent + ttl: a safe lower bound
        try:
            if self.queue.heartbeat(self.lease, self.ttl_s) is None:
                self.lost.set()
                return False
            self._valid_until = sent + self.ttl_s
            return True
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if time.monotonic() >= self._valid_until:
                log.warning("heartbeat for %s failed (%s) and the lease's validity ran out", self.lease.item.id, exc)
                self.lost.set()
                return False
            log.warning("heartbeat for %s failed (%s); the lease is valid for %.1fs more: retrying",
                        self.lease.item.id, exc, self._valid_until - time.monotonic())
            return None

    def confirm(self) -> bool:
        """Ownership proven by Redis now (the check before a promotion), riding out a blip while the
        lease is still valid; False only when it is really lost."""
        while not self.lost.is_set():
            ok = self.beat()
            if ok is not None:
                return ok
            time.sleep(min(0.2, max(0.0, self._valid_until - time.monotonic())))
        return False

    def run(self) -> None:
        while not self._done.wait(self.interval_s) and not self.lost.is_set():
            stuck = time.monotonic() - self._progress()
            if stuck > self.stall_s:
                self._give_up(stuck)
            ok = self.beat()
            while ok is None and not self._done.wait(min(0.5, self.interval_s)):
                ok = self.beat()

    def _give_up(self, stuck: float) -> None:
        log.error("watchdog: no progress on %s for %.0fs (stuck in I/O: a hung share, a FIFO?); giving the "
                  "lease up at no cost and exiting %d", self.lease.item.id, stuck, EXIT_STALLED)
        try:
            self.queue.release(self.lease)
        except Exception as exc:  # noqa: BLE001 - exiting anyway: the lease then expires
            log.error("could not release %s: %s", self.lease.item.id, exc)
        logging.shutdown()
        os._exit(EXIT_STALLED)

    def stop(self) -> None:
        self._done.set()


class Worker:
    def __init__(self, cfg: WorkerConfig, queue: WorkQueue) -> None:
        self.cfg, self.queue = cfg, queue
        self.datasets_dir, self.output_dir = share_paths(cfg.share)
        self.stop = threading.Event()
        self._datasets: dict[str, Dataset] = {}
        self._progress_at = time.monotonic()  # set again by process() before its heartbeat reads it
        self._infra_since: float | None = None
        self._infra_backoff = cfg.infra_backoff_s
        self._last_infra = ""

    def touch(self) -> None:
        """The training thread made progress (the watchdog reads this)."""
        self._progress_at = time.monotonic()

    def install_signal_handlers(self) -> None:
        def hard_exit() -> None:
            log.error("still running %.0fs after SIGTERM: exiting %d now", self.cfg.term_grace_s, EXIT_TERMINATED)
            logging.shutdown()
            os._exit(EXIT_TERMINATED)

        def handle(signum: int, _frame: Any) -> None:
            if self.stop.is_set():
                return
            log.warning("%s received: stopping at the next batch boundary", signal.Signals(signum).name)
            self.stop.set()
            self.queue.interrupt.set()  # stop waiting for an unreachable Redis
            timer = threading.Timer(self.cfg.term_grace_s, hard_exit)
            timer.daemon = True
            timer.start()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    # -- the loop ----------------------------------------------------------------------------------
    def run(self) -> int:
        log.info("worker %s starting (lease %.0fs, checkpoint every %.0fs)", self.cfg.worker_id,
                 self.cfg.lease_ttl_s, self.cfg.checkpoint_interval_s)
        try:
            return self._loop()
        except QueueInterrupted as exc:
            log.warning("worker %s stopped by signal (%s); exiting %d", self.cfg.worker_id, exc, EXIT_TERMINATED)
            return EXIT_TERMINATED

    def _loop(self) -> int:
        waiting_logged = False
        while not self.stop.is_set():
            lease = self.queue.claim(self.cfg.worker_id, self.cfg.lease_ttl_s)
            if lease:
                waiting_logged = False
                outcome = self.process(lease)
                if outcome is Outcome.INFRA:
                    code = self._back_off()
                    if code is not None:
                        return code
                elif outcome is Outcome.DONE:
                    self._infra_since, self._infra_backoff = None, self.cfg.infra_backoff_s
                continue
            counts = self.queue.counts()
            if counts.drained:
                if not self.queue.seeded():
                    if self.restore():
                        continue
                    log.error("the queue is empty and was never seeded, and the share %s records no runs: "
                              "run `python -m workload seed` first; exiting %d", self.cfg.share, EXIT_INFRA)
                    return EXIT_INFRA
                if counts.dead:
                    self._log_dead_letters()
                    log.error("queue drained: %d done, %d DEAD-LETTERED of %d; exiting %d (see `python -m "
                              "workload status`; `requeue` after fixing)", counts.done, counts.dead,
                              counts.total, EXIT_DEAD_LETTERS)
                    return EXIT_DEAD_LETTERS
                log.info("queue drained: %d done of %d; exiting 0", counts.done, counts.total)
                return EXIT_DONE
            if not waiting_logged:
                log.info("nothing to claim (%d pending behind peers, %d leased): waiting for peers to finish "
                         "or their leases to expire", counts.pending, counts.leased)
                waiting_logged = True
            self.stop.wait(self.cfg.idle_poll_s)
        log.warning("worker %s stopped by signal; exiting %d", self.cfg.worker_id, EXIT_TERMINATED)
        return EXIT_TERMINATED

    def _back_off(self) -> int | None:
        """After an infrastructure fault: pause (doubling), or EXIT_INFRA once it has persisted."""
        now = time.monotonic()
        self._infra_since = self._infra_since or now
        if now - self._infra_since >= self.cfg.infra_give_up_s:
            log.error("infrastructure fault for %.0fs, giving up: %s; no item was charged an attempt; exiting %d",
                      now - self._infra_since, self._last_infra, EXIT_INFRA)
            return EXIT_INFRA
        log.warning("infrastructure fault; retrying in %.1fs (giving up after %.0fs): %s", self._infra_backoff,
                    self.cfg.infra_give_up_s, self._last_infra)
        self.stop.wait(self._infra_backoff)
        self._infra_backoff = min(self._infra_backoff * 2, 30.0)
        return None

    def _log_dead_letters(self) -> None:
        for run, r in self.queue.snapshot()["runs"].items():
            for item, d in r["dead"].items():
                log.error("dead-lettered in run %s: %s: %s", run, item, d["error"])

    def restore(self) -> bool:
        """Refill a wiped (or never filled) queue from the share; False when the share records no runs."""
        if not plan.runs(self.cfg.share):
            return False
        got = plan.restore(self.queue, self.cfg.share)
        log.warning("the queue was empty and unseeded (Redis lost its data?): restored it from the share: %d "
                    "run(s), %d item(s) enqueued, %d already applied in the checkpoints (marked done)",
                    got["runs"], got["enqueued"], got["already_applied"])
        return True

    def process(self, lease: Lease) -> Outcome:
        item = lease.item
        log.info("claimed %s (token %d, %d failed attempts before)", item.id, lease.token, lease.attempts)
        faults.point("claimed")
        self.touch()
        beat = Heartbeat(self.queue, lease, self.cfg.lease_ttl_s, self.cfg.heartbeat_interval,
                         progress=lambda: self._progress_at, stall_s=self.cfg.stall_s)
        beat.start()
        try:
            return self._apply(lease, beat)
        except LeaseLost:
            log.warning("lost the lease on %s: abandoning it (the new owner resumes from the last "
                        "promoted checkpoint)", item.id)
            return Outcome.LOST
        except ItemFault as exc:
            state = self.queue.release(lease, error=str(exc), permanent=True)
            log.error("%s can never succeed: %s -> %s", item.id, exc, state)
            return Outcome.FAILED
        except QueueUnavailable:
            raise  # Redis is gone for longer than the retry budget: nothing to release with; exit EXIT_INFRA
        except Exception as exc:  # noqa: BLE001 - classified: the platform's fault, or one attempt
            if is_infra(exc):
                self._last_infra = f"{item.id}: {describe(exc)}"
                state = self.queue.release(lease)
                log.error("infrastructure fault on %s (no attempt charged) -> %s: %s", item.id, state, describe(exc))
                return Outcome.INFRA
            log.exception("failed on %s", item.id)
            state = self.queue.release(lease, error=describe(exc))
            log.error("%s released after error -> %s", item.id, state)
            return Outcome.FAILED
        finally:
            beat.stop()

    def dataset(self, name: str) -> Dataset:
        if name not in self._datasets:
            try:
                check_name(name, "dataset")
            except ValueError as exc:
                raise DatasetError(str(exc)) from None
            root = (self.datasets_dir / name).resolve()
            if not root.is_relative_to(self.datasets_dir.resolve()):
                raise DatasetError(f"dataset name {name!r} is not a folder name under {self.datasets_dir}")
            self._datasets[name] = Dataset(root)
        return self._datasets[name]

    def hparams(self, lease: Lease) -> HParams:
        """The run's hyperparameters: from the share (the truth), else from Redis (older queues)."""
        item = lease.item
        try:
            rec = plan.spec(self.cfg.share, item.run)
            if rec is not None:
                if rec.dataset != item.dataset:
                    raise PermanentError(f"item {item.id} names dataset {item.dataset!r}, but run {item.run!r} "
                                         f"trains on {rec.dataset!r} ({self.cfg.share}/runs/{item.run}.json)")
                spec = rec.hparams
            else:
                spec = self.queue.spec(item.run)
            return HParams.from_dict(spec, where=f"run {item.run!r} hyperparameters")
        except (KeyError, ValueError) as exc:
            raise PermanentError(str(exc).strip('"')) from exc

    # -- one item ----------------------------------------------------------------------------------
    def _apply(self, lease: Lease, beat: Heartbeat) -> Outcome:
        item = lease.item
        try:  # validated at claim too: a run name becomes a folder on the share
            check_name(item.run, "run")
        except ValueError as exc:
            raise PermanentError(str(exc)) from None  # no attempt can fix a name: dead-letter it now
        dataset = self.dataset(item.dataset)
        dataset.resolve(item.shard)  # refuses paths outside the dataset and pickle files
        hp = self.hparams(lease)
        run_dir = self.output_dir / item.run
        store = CheckpointStore(run_dir, keep=self.cfg.keep_checkpoints)
        if not store.fence(lease.token):
            if not beat.confirm():
                raise LeaseLost  # frozen past our lease: a newer owner already fenced the run
            # The share holds a higher token than Redis handed us: Redis lost its counter (a wiped or
            # stale volume). Raise it past the share's and claim again; a write under our token would
            # be ignored by every reader.
            floor = store.highest_token()
            self.queue.raise_token(floor)
            state = self.queue.release(lease)
            log.warning("%s: the share holds lease token %d, above ours (%d): the queue's token counter was "
                        "behind; raised it and released the item (%s)", item.id, floor, lease.token, state)
            return Outcome.RELEASED
        loaded = store.load()
        self.touch()

        if loaded and item.shard in loaded.state["applied"]:
            log.info("%s is already in checkpoint %s: re-rendering the report and acking",
                     item.id, loaded.path.name)
            trainer = Trainer.from_state(loaded.state)
            self._report(store, lease, beat, loaded, trainer, dataset)
            faults.point("before-ack")
            self._ack(lease)
            return Outcome.DONE
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
                log.warning("run %s: checkpoint hyperparameters %s differ from the share's %s; the checkpoint's "
                            "lineage wins", item.run, trainer.hp, hp)
        else:
            trainer = Trainer(item.run, hp, features.FEATURE_NAMES, feature_version=features.FEATURE_VERSION)
        faults.point("read")
        examples = dataset.examples([item.shard])
        self.touch()
        if self.stop.is_set():
            self._release_preempted(lease)
            return Outcome.RELEASED
        resumed = trainer.progress
        log.info("%s: training on %d rows, %s", item.id, len(examples.y),
                 f"resuming at epoch {resumed['epoch']} batch {resumed['batch']}"
                 if resumed and resumed["shard"] == item.shard else
                 f"warm start after {len(trainer.applied)} shard(s)" if trainer.applied else "cold start")
        trainer.begin_shard(item.shard, examples.x)

        last_save = time.monotonic()
        save_cost = 1.0

        def checkpoint() -> None:
            nonlocal last_save, save_cost
            started = time.monotonic()
            check_finite(trainer, item.id)
            if store.save(trainer.state_dict(), path=store.next_path(lease.token), may_promote=beat.confirm) is None:
                raise LeaseLost
            last_save = time.monotonic()
            save_cost = last_save - started

        def after_step() -> bool:
            self.touch()
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
            return Outcome.RELEASED
        train_s = time.monotonic() - started

        path = store.next_path(lease.token)
        calibrated_on = calibration.refit(trainer, dataset, item.shard)
        test = dataset.test_examples()
        self.touch()
        test_scores = trainer.score(test.x)
        check_finite(trainer, item.id, loss=trainer.last_epoch_loss(), scores=test_scores)
        entry: dict[str, Any] = {
            "shard": item.shard, "time": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "checkpoint": path.name, "train_rows": int(len(examples.y)), "train_frauds": int(examples.y.sum()),
            "first_day": str(examples.day.min()) if len(examples.day) else "",
            "last_day": str(examples.day.max()) if len(examples.day) else "",
            "train_accuracy": trainer.train_accuracy(len(examples.y)),
            "train_seconds": round(train_s, 3), **metrics.evaluate(test_scores, test.y, test.day, test.card),
            **calibration.assess(trainer, test, test_scores, calibrated_on),
        }
        trainer.finish_shard(entry)
        state = trainer.state_dict()
        if store.save(state, path=path, may_promote=beat.confirm) is None:
            raise LeaseLost
        self.touch()
        faults.point("after-promote")
        last_of_run = self.queue.pending_in_run(item.run) == 0
        promoted = Loaded(state=state, path=path, seq=int(path.name[5:13]), token=lease.token)
        self._report(store, lease, beat, promoted, trainer, dataset, test_scores,
                     draw=last_of_run or report.plots_stale(run_dir, self.cfg.plot_interval_s))
        log.info("%s applied: average precision %.3f (base rate %.4f), ROC AUC %.3f", item.id,
                 entry["average_precision"], entry["base_rate"], entry["roc_auc"])
        faults.point("before-ack")
        self._ack(lease)
        return Outcome.DONE

    def _report(self, store: CheckpointStore, lease: Lease, beat: Heartbeat, source: Loaded, trainer: Trainer,
                dataset: Dataset, test_scores: np.ndarray | None = None, draw: bool = True) -> None:
        """Rewrite the report from `source`, the newest promoted checkpoint, only while it is: a worker
        whose lease is gone, or whose checkpoint a newer lease has superseded, writes nothing. Pictures
        are redrawn only when `draw` (two PNGs cost more than training a tutorial-sized day)."""
        faults.point("report")
        if not beat.confirm():
            raise LeaseLost
        newest = store.manifests()
        if newest and newest[0][0] > lease.token:
            log.warning("%s: a newer lease (token %d) owns the run: not rewriting its report", lease.item.id,
                        newest[0][0])
            raise LeaseLost
        pr = None
        if draw:
            test = dataset.test_examples()
            pr = metrics.pr_curve(trainer.score(test.x) if test_scores is None else test_scores, test.y)
        report.write(store.dir.parent, source.state, pr, draw=draw, kept=store.retained(),
                     stamp=(source.token, source.seq))
        self.touch()

    def _ack(self, lease: Lease) -> None:
        res = self.queue.ack(lease)
        if res.state == "acked":
            log.info("acked %s", lease.item.id)
            # We acked the run's last day: results to $OUTPUT_URI (a failure there only warns).
            if os.environ.get(export.OUTPUT_URI_ENV) and self.queue.pending_in_run(lease.item.run) == 0:
                export.export_finished_run(self.cfg.share, lease.item.run)
        elif res.state == "already-done":
            log.warning("%s was already acked by %s: nothing to do", lease.item.id, res.by)
        else:
            log.warning("ack of %s refused: token %d no longer holds the lease (a newer owner has it; its "
                        "checkpoint records our work if it was promoted)", lease.item.id, lease.token)

    def _release_preempted(self, lease: Lease) -> None:
        state = self.queue.release(lease)
        log.warning("released %s for a peer (%s)", lease.item.id, state)


def check_finite(trainer: Trainer, where: str, loss: float | None = None, scores: np.ndarray | None = None) -> None:
    """NonFinite (an item fault: nothing is promoted) when the weights, the normalisation statistics,
    the loss or the scores hold NaN or infinity."""
    tensors = {f"weights {k}": v for k, v in trainer.model.state_dict().items()}
    tensors |= {f"averaged weights {k}": v for k, v in trainer.averaged.state_dict().items()}
    tensors |= {f"feature normaliser {k}": v for k, v in trainer.norm.state().items()}
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise NonFinite(f"{where}: training produced non-finite {name} (NaN or infinity); nothing was "
                            "promoted: check the day's data for extreme values")
    if loss is not None and not np.isfinite(loss):
        raise NonFinite(f"{where}: the training loss is {loss}; nothing was promoted")
    if scores is not None and not np.isfinite(scores).all():
        raise NonFinite(f"{where}: the model's test scores are non-finite (NaN or infinity); nothing was "
                        "promoted: check the test days' data for extreme values")


__all__ = ["EXIT_TERMINATED", "Heartbeat", "InfraFault", "LeaseLost", "PermanentError",
           "Worker", "WorkerConfig", "check_finite", "default_worker_id"]
