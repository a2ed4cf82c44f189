"""The worker: claim an item, take it through the protocol's steps (runtime/steps.py), repeat until
the queue is drained; exit with a code that says what happened.

SIGTERM (spot preemption notice) stops at the next batch, checkpoints if that fits the budget,
releases the lease so a peer resumes at once, and exits 143 within `term_grace_s` whatever it was
waiting on. Failures are classified (workload.core.errors): an item fault is dead-lettered at once; an
infrastructure fault releases the item at no cost, backs off, and exits `EXIT_INFRA` if it persists.
Everything written to the share is fenced by the lease token (workload.share.checkpoint), so a worker
frozen past its lease changes nothing when it wakes. A watchdog (runtime/heartbeat.py) gives the lease
up and exits `EXIT_STALLED` when the worker is stuck in I/O. The exit code (workload.core.errors) says
what happened: 0 all done, 4 drained with dead letters, 3 a persistent infrastructure fault (or an empty
queue with no runs on the share), 5 stalled (the watchdog), 143 SIGTERM; before the loop starts, the
command (workload.cli) exits 2 on bad configuration and 6 when given a GPU that CUDA cannot use.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

from workload.core import faults
from workload.core.errors import (
    EXIT_DEAD_LETTERS,
    EXIT_DONE,
    EXIT_INFRA,
    EXIT_TERMINATED,
    ItemFault,
    describe,
    is_infra,
)
from workload.data.dataset import Dataset
from workload.data.dayfile import DatasetError
from workload.model import lineage, trainer
from workload.model.hparams import HParams
from workload.queue import plan
from workload.queue.workqueue import Lease, QueueInterrupted, QueueUnavailable, WorkQueue
from workload.runtime import packing
from workload.runtime.config import WorkerConfig, default_worker_id
from workload.runtime.heartbeat import Heartbeat, LeaseLost
from workload.runtime.steps import Attempt, Outcome
from workload.share.paths import check_name, share_paths

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


def preload_pictures(device: torch.device) -> threading.Thread | None:
    """On a GPU pod, matplotlib (the report's pictures) is imported on a thread while the GPU trains: its ~0.5 s
    import otherwise stood between a run's first (or last) day and its ack, ~10 % of a 1,000,000-row day on an H200
    (issue 33). A CPU pod's one core trains: it imports when it first draws, as before."""
    if device.type != "cuda":
        return None
    # Not a daemon: an exit while it imports waits for it (well under a second) rather than tearing an import down.
    thread = threading.Thread(target=importlib.import_module, args=("workload.model.plots",), name="preload-plots")
    thread.start()
    return thread


class Worker:
    def __init__(self, cfg: WorkerConfig, queue: WorkQueue) -> None:
        self.cfg, self.queue = cfg, queue
        self.datasets_dir = share_paths(cfg.share)[0]
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
        preload_pictures(trainer.default_device())
        try:
            return self._loop()
        except QueueInterrupted as exc:
            log.warning("worker %s stopped by signal (%s); exiting %d", self.cfg.worker_id, exc, EXIT_TERMINATED)
            return EXIT_TERMINATED

    def _loop(self) -> int:
        waiting_logged = False
        self.reconcile()
        while not self.stop.is_set():
            lease = self.queue.claim(self.cfg.worker_id, self.cfg.lease_ttl_s)
            if lease:
                waiting_logged = False
                more = self.queue.claim_also(lease, self.cfg.lease_ttl_s, self.cfg.pack_runs - 1)
                outcome = self.process_pack([lease, *more]) if more else self.process(lease)
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
                if self.reconcile():  # the share's plan holds more than Redis: a restore from an old snapshot
                    continue
                if self.confirm_done():  # Redis calls days done that the share's checkpoints lack
                    continue
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
        got = plan.restore(self.queue, self.cfg.share, lineage.applied_days)
        log.warning("the queue was empty and unseeded (Redis lost its data?): restored it from the share: %d "
                    "run(s), %d item(s) enqueued, %d already applied in the checkpoints (marked done)",
                    got["runs"], got["enqueued"], got["already_applied"])
        return True

    def reconcile(self) -> bool:
        """Add to the queue what the share's plan holds and Redis lacks (True when anything was): exit 0
        means the share's plan is done, not only the queue Redis happens to hold."""
        try:
            return plan.reconcile(self.queue, self.cfg.share, lineage.applied_days) is not None
        except (plan.PlanError, DatasetError) as exc:
            log.warning("cannot compare the queue with the share's plan: %s", exc)
            return False

    def confirm_done(self) -> bool:
        """Before exiting: every day Redis calls done must be in its run's newest checkpoint on the share;
        those that are not go back to pending to be trained (True when any did)."""
        try:
            return bool(plan.confirm_done(self.queue, self.cfg.share, lineage.applied_days))
        except (plan.PlanError, DatasetError) as exc:
            log.warning("cannot check the queue's done days against the share: %s", exc)
            return False

    def process(self, lease: Lease) -> Outcome:
        """One claimed item: its heartbeat runs while `_apply` takes it through the protocol's steps;
        whatever stops it is classified (`_settle`)."""
        item = lease.item
        log.info("claimed %s (token %d, %d failed attempts before)", item.id, lease.token, lease.attempts)
        faults.point("claimed")
        self.touch()
        beat = Heartbeat(self.queue, lease, self.cfg.lease_ttl_s, self.cfg.heartbeat_interval,
                         progress=lambda: self._progress_at, stall_s=self.cfg.stall_s)
        beat.start()
        try:
            return self._apply(lease, beat)
        except QueueUnavailable:
            raise  # Redis is gone for longer than the retry budget: nothing to release with; exit EXIT_INFRA
        except Exception as exc:  # noqa: BLE001 - classified: the platform's fault, or one attempt
            return self._settle(lease, exc)
        finally:
            beat.stop()

    def process_pack(self, leases: list[Lease]) -> Outcome:
        """Items of one day of one dataset (a packed claim), each with its own heartbeat, trained packed
        (runtime/packing.py); each one's failure is classified alone (`_settle`). INFRA when any met an
        infrastructure fault (the loop backs off), DONE when all are done, else the first other outcome."""
        beats: list[Heartbeat] = []
        try:
            attempts, outcomes = [], []
            for lease in leases:
                log.info("claimed %s packed (token %d, %d failed attempts before)", lease.item.id, lease.token,
                         lease.attempts)
                beats.append(Heartbeat(self.queue, lease, self.cfg.lease_ttl_s, self.cfg.heartbeat_interval,
                                       progress=lambda: self._progress_at, stall_s=self.cfg.stall_s))
                beats[-1].start()
            faults.point("claimed")
            self.touch()
            for lease, beat in zip(leases, beats, strict=True):
                try:
                    attempts.append(self._attempt(lease, beat))
                except QueueUnavailable:
                    raise
                except Exception as exc:  # noqa: BLE001 - classified: this item alone
                    outcomes.append(self._settle(lease, exc))
            outcomes += packing.train_packed(attempts, self._settle)
        finally:
            for beat in beats:
                beat.stop()
        if Outcome.INFRA in outcomes:
            return Outcome.INFRA
        return next((o for o in outcomes if o is not Outcome.DONE), Outcome.DONE)

    def _apply(self, lease: Lease, beat: Heartbeat) -> Outcome:
        """The item's inputs, checked before the share is touched, then the protocol's steps."""
        return self._attempt(lease, beat).run()

    def _attempt(self, lease: Lease, beat: Heartbeat) -> Attempt:
        """The attempt at an item, its inputs checked before the share is touched."""
        item = lease.item
        try:  # validated at claim too: a run name becomes a folder on the share
            check_name(item.run, "run")
        except ValueError as exc:
            raise ItemFault(str(exc)) from None  # no attempt can fix a name: dead-letter it now
        dataset = self.dataset(item.dataset)
        dataset.resolve(item.shard)  # refuses paths outside the dataset and pickle files
        hp = self.hparams(lease)
        return Attempt(self.cfg, self.queue, lease, beat, dataset, hp, touch=self.touch, stop=self.stop)

    def _settle(self, lease: Lease, exc: Exception) -> Outcome:
        """What a failed attempt costs, by its class (workload.core.errors): a lost lease nothing (the
        new owner goes on), an item fault the item (dead-lettered), an infrastructure fault nothing
        (released; the loop backs off), anything else one attempt."""
        item = lease.item
        if isinstance(exc, LeaseLost):
            log.warning("lost the lease on %s: abandoning it (the new owner resumes from the last "
                        "promoted checkpoint)", item.id)
            # Lost from here, perhaps not in Redis: a lease Redis kept through its own outage goes back
            # at no cost (refused when a newer owner holds it).
            self.queue.release(lease)
            return Outcome.LOST
        if isinstance(exc, ItemFault):
            state = self.queue.release(lease, error=str(exc), permanent=True)
            log.error("%s can never succeed: %s -> %s", item.id, exc, state)
            return Outcome.FAILED
        if is_infra(exc):
            self._last_infra = f"{item.id}: {describe(exc)}"
            state = self.queue.release(lease)
            log.error("infrastructure fault on %s (no attempt charged) -> %s: %s", item.id, state, describe(exc))
            return Outcome.INFRA
        log.error("failed on %s", item.id, exc_info=exc)
        state = self.queue.release(lease, error=describe(exc))
        log.error("%s released after error -> %s", item.id, state)
        return Outcome.FAILED

    def dataset(self, name: str) -> Dataset:
        """The item's dataset as its manifest on the share is now: read again when the manifest changed since
        this worker read it (a backfill or new days published meanwhile), so no claim works from a stale view."""
        if name in self._datasets and self._datasets[name].refresh():
            log.warning("dataset %s: its manifest changed since this worker read it (days published meanwhile): "
                        "read it again", name)
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
                    raise ItemFault(f"item {item.id} names dataset {item.dataset!r}, but run {item.run!r} "
                                    f"trains on {rec.dataset!r} ({self.cfg.share}/runs/{item.run}.json)")
                spec = rec.hparams
            else:
                spec = self.queue.spec(item.run)
            return HParams.from_dict(spec, where=f"run {item.run!r} hyperparameters")
        except (KeyError, ValueError) as exc:
            raise ItemFault(str(exc).strip('"')) from exc


__all__ = ["Outcome", "Worker", "WorkerConfig", "default_worker_id"]
