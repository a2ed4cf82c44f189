"""One attempt at a claimed item, step by step in the order of DESIGN.md's checkpoint protocol.

`Attempt.run` is the protocol, one numbered step a line, each step one call into the checkpoint store
(workload.share.checkpoint), the run's lineage (workload.model.lineage), the report or the queue; the
worker's loop has claimed the item and started its heartbeat (docs/architecture.md lists the walk):

 1. fence: claim the run's checkpoints on the share under our lease token (the store);
 2. load: the run's newest checkpoint to start the day from (the lineage);
    a day the checkpoint already records is only reported and acked (death between promotion and ack);
 3. rewind: where the day is late (later days applied), the boundary before it (the lineage),
 4. and the later days put back to pending, under our lease (the queue);
 5. resume: the lineage from that checkpoint, or a new one (the lineage);
 6. read: the day's examples and its window's from the dataset (the lineage, which knows the window);
 7. train: with periodic mid-day checkpoints; stopped by SIGTERM, the item is released (the lineage);
 8. close the day: calibrate, score the test days, record the day (the lineage);
 9. save and promote: the checkpoint that records the day as applied (the store);
10. report: report.txt, metrics.jsonl and pictures from that checkpoint (the report);
11. ack (the queue).

Order matters for fault tolerance. The checkpoint that records a day as applied is promoted before
the report is written and before the ack. Whether a lease may still write is decided by the checkpoint
store (the one place of the fencing rule); a step that learns the lease is gone raises `LeaseLost` and
writes nothing more.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import numpy as np

from workload.core import faults
from workload.data.dataset import Dataset, Examples
from workload.data.dayfile import DatasetError
from workload.model import export, lineage, report
from workload.model.hparams import HParams
from workload.model.lineage import Checkpoint, ClosedDay, Lineage
from workload.queue import plan
from workload.queue.workqueue import Lease, WorkQueue
from workload.runtime.config import WorkerConfig
from workload.runtime.heartbeat import Heartbeat, LeaseLost
from workload.share.checkpoint import CheckpointStore
from workload.share.paths import share_paths

log = logging.getLogger(__name__)


class Outcome(Enum):
    DONE = "done"  # applied (or found applied) and acked
    RELEASED = "released"  # preempted, or given back at no cost to be claimed again at once
    FAILED = "failed"  # an item fault or an error: dead-lettered or retried later
    INFRA = "infra"  # an infrastructure fault: released at no cost; back off
    LOST = "lost"  # the lease was lost


@dataclass(frozen=True)
class Ready:
    """An item ready to train (after steps 1-6): its lineage, the day's examples and its window's."""

    run: Lineage
    examples: Examples
    window: Examples


class Attempt:
    """One lease's work on its item. `touch` tells the watchdog the attempt made progress; `stop` is
    the SIGTERM flag, read at every batch boundary."""

    def __init__(self, cfg: WorkerConfig, queue: WorkQueue, lease: Lease, beat: Heartbeat, dataset: Dataset,
                 hp: HParams, *, touch: Callable[[], None], stop: threading.Event) -> None:
        self.cfg, self.queue, self.lease, self.beat = cfg, queue, lease, beat
        self.item = lease.item
        self.dataset, self.hp = dataset, hp
        self.touch, self.stop = touch, stop
        self.run_dir = share_paths(cfg.share)[1] / self.item.run
        self.store = CheckpointStore(self.run_dir, keep=cfg.keep_checkpoints)

    def run(self) -> Outcome:
        """The protocol (the module docstring numbers its steps): up to the day's rows, training, the rest."""
        ready = self.prepare()  # 1-6
        if isinstance(ready, Outcome):
            return ready
        train_s = self.train(ready.run, ready.examples, ready.window)  # 7
        if train_s is None:
            return self.release_for_peer()
        return self.finish(ready, train_s)  # 8-11

    def prepare(self) -> Ready | Outcome:
        """Steps 1-6, one a line: the lineage resumed and the day's rows read, ready to train; or the outcome
        when there is nothing to train (applied already, a token to catch up, stopped)."""
        if not self.fence():  # 1
            return self.catch_up_token()
        found = self.load_checkpoint()  # 2
        if found and found.state.has_applied(self.item.shard):
            return self.ack_applied(found)
        start = lineage.start_for(self.store, found, self.item.shard, self.dataset.training_shards,  # 3
                                  self.item.run)
        self.put_back(start.again)  # 4
        run = Lineage.resume(self.item.run, self.hp, start)  # 5
        if start.detour:  # the boundary before the day was pruned: the days it lacks first, then this day
            return self.detour(run)
        examples, window = self.read_day(run)  # 6
        if self.stop.is_set():
            return self.release_for_peer()
        return Ready(run, examples, window)

    def finish(self, ready: Ready, train_s: float) -> Outcome:
        """Steps 8-11, one a line, after the day trained (alone, or packed: runtime/packing.py)."""
        closed = ready.run.close_day(self.dataset, self.item.shard, ready.examples, ready.window, train_s,  # 8
                                     self.store, self.lease.token, self.touch)
        self.save_and_promote(closed)  # 9
        self.report(closed.checkpoint, closed.pr, draw=self.pictures_due())  # 10
        faults.point("before-ack")
        self.ack()  # 11
        return Outcome.DONE

    # -- 1. fence -----------------------------------------------------------------------------------
    def fence(self) -> bool:
        """Claim the run on the share under our token before anything is read or written."""
        if self.store.fence(self.lease.token):
            return True
        if not self.beat.confirm():
            raise LeaseLost  # frozen past our lease: a newer owner already fenced the run
        return False

    def catch_up_token(self) -> Outcome:
        """The share holds a higher token than Redis handed us while the lease is ours: Redis lost its
        counter (a wiped or stale volume). Raise it past the share's and claim again; a write under our
        token would be ignored by every reader."""
        floor = self.store.highest_token()
        self.queue.raise_token(floor)
        state = self.queue.release(self.lease)
        log.warning("%s: the share holds lease token %d, above ours (%d): the queue's token counter was "
                    "behind; raised it and released the item (%s)", self.item.id, floor, self.lease.token, state)
        return Outcome.RELEASED

    # -- 2. load ------------------------------------------------------------------------------------
    def load_checkpoint(self) -> Checkpoint | None:
        """The run's newest checkpoint to start the day from (`lineage.newest`)."""
        found = lineage.newest(self.store, self.item.shard)
        self.touch()
        return found

    def ack_applied(self, found: Checkpoint) -> Outcome:
        """The day is in the checkpoint already (death between promotion and ack): report and ack."""
        log.info("%s is already in checkpoint %s: re-rendering the report and acking", self.item.id, found.path.name)
        self.report(found, Lineage.as_saved(found).pr_curve(self.dataset))
        faults.point("before-ack")
        self.ack()
        return Outcome.DONE

    # -- 4. put the later days back -----------------------------------------------------------------
    def put_back(self, again: tuple[tuple[str, int], ...]) -> None:
        """After a rewind, the days after ours back to pending in date order, under our lease (LeaseLost
        when it is gone)."""
        if again and self.queue.reapply(self.lease, [(f"{self.item.run}/{d}", i) for d, i in again]) is None:
            raise LeaseLost

    def detour(self, run: Lineage) -> Outcome:
        """The rewind's own boundary was pruned: promote the nearest kept one again (its state, with this
        rewind's record) so the days it lacks, put back to pending, are trained on it in date order; then give
        this day back to be claimed after them. Dying before the promotion leaves the old newest checkpoint,
        whose days the queue re-acks, and this day detours again."""
        state = run.checkpoint(self.item.id)
        if self.store.save(state.to_checkpoint(), path=self.store.next_path(self.lease.token),
                           boundary=state.is_boundary, may_promote=self.beat.confirm) is None:
            raise LeaseLost
        self.touch()
        return self.release_for_peer()

    # -- 6. read ------------------------------------------------------------------------------------
    def read_day(self, run: Lineage) -> tuple[Examples, Examples]:
        """The day's examples, and those of the window it trains on (`Lineage.read`)."""
        faults.point("read")
        examples, window = run.read(self.dataset, self.item.shard)
        self.touch()
        return examples, window

    # -- 7. train with periodic checkpoints ---------------------------------------------------------
    def train(self, run: Lineage, examples: Examples, window: Examples,
              budget: StopBudget | None = None) -> float | None:
        """Train the day from where the lineage stands; seconds it took, or None when stopped (SIGTERM); its final
        checkpoint within `budget` (shared with a packed claim's other runs), or a budget of its own."""
        checkpoints = PeriodicCheckpoints(self, run, budget=budget)
        return run.train_day(self.item.shard, examples, window, checkpoints.after_step, self.item.id)

    # -- 9. save and promote ------------------------------------------------------------------------
    def save_and_promote(self, closed: ClosedDay) -> None:
        """The checkpoint that records the day as applied, promoted only while the lease is ours."""
        promoted = self.store.save(closed.raw, path=closed.checkpoint.path, may_promote=self.beat.confirm,
                                   boundary=closed.checkpoint.state.is_boundary)
        if promoted is None:
            raise LeaseLost
        self.touch()
        faults.point("after-promote")

    # -- 10. report -------------------------------------------------------------------------------------
    def pictures_due(self) -> bool:
        """Two PNGs cost more than training a tutorial-sized day: drawn after a run's last day, or when old."""
        return self.queue.pending_in_run(self.item.run) == 0 or report.plots_stale(self.run_dir,
                                                                                    self.cfg.plot_interval_s)

    def report(self, source: Checkpoint, pr: tuple[np.ndarray, np.ndarray] | None, draw: bool = True) -> None:
        """Rewrite the report from `source`, the newest promoted checkpoint, only while it is: a worker
        whose lease is gone, or whose checkpoint a newer lease has superseded, writes nothing."""
        faults.point("report")
        if not self.beat.confirm():
            raise LeaseLost
        newer = self.store.superseded_by(self.lease.token)
        if newer is not None:
            log.warning("%s: a newer lease (token %d) owns the run: not rewriting its report", self.item.id, newer)
            raise LeaseLost
        kept = self.store.retained()
        report.write(self.run_dir, source.state, pr if draw else None, draw=draw, kept=kept,
                     stamp=(source.token, source.seq))
        self.touch()

    # -- 11. ack ----------------------------------------------------------------------------------------
    def ack(self) -> None:
        res = self.queue.ack(self.lease)
        if res.state == "acked":
            log.info("acked %s", self.item.id)
            faults.point("acked")
            # We acked the run's last day: results to $OUTPUT_URI (a failure there only warns). Judged by
            # the ack itself: asked afterwards, a peer that just claimed the next day makes the run look done.
            if res.finished_run:
                self.export()
        elif res.state == "already-done" and res.by == self.lease.owner:
            # Our own ack, sent again after its reply was lost (the connection died after Redis ran it): we never
            # learnt whether it finished the run, so the share decides (`export` exports only a complete run).
            log.warning("%s: the reply to our ack was lost; its retry found the item acked (by us)", self.item.id)
            if self.queue.pending_in_run(self.item.run) == 0:
                self.export()
        elif res.state == "already-done":
            log.warning("%s was already acked by %s: nothing to do", self.item.id, res.by)
        else:
            log.warning("ack of %s refused: token %d no longer holds the lease (a newer owner has it; its "
                        "checkpoint records our work if it was promoted)", self.item.id, self.lease.token)

    def export(self) -> None:
        """The run's results to $OUTPUT_URI, when set: the share's newest state, and only when it holds every day
        of the run's plan (a rewind under way exports nothing; its last day's worker will)."""
        if not os.environ.get(export.OUTPUT_URI_ENV):
            return
        try:
            spec = plan.spec(self.cfg.share, self.item.run)
            days = None if spec is None else [it.shard for it in plan.items(self.cfg.share, {spec.run: spec})]
        except (plan.PlanError, DatasetError) as exc:  # acked already: nothing here may cost the item anything
            log.warning("run %s: not exported: its plan on the share cannot be read: %s", self.item.run, exc)
            return
        export.export_finished_run(self.cfg.share, self.item.run, days)

    def release_for_peer(self) -> Outcome:
        """Stopped (SIGTERM): give the item back at no cost so a peer resumes it at once."""
        state = self.queue.release(self.lease)
        log.warning("released %s for a peer (%s)", self.item.id, state)
        return Outcome.RELEASED


class StopBudget:
    """The seconds after SIGTERM for final checkpoints (`term_budget_s`), shared by the runs that stop together: a
    pack's K runs must all fit the grace period, not each one (K saves that each fit would not). A final checkpoint
    starts only if it is expected to end within the budget: the time spent so far (since the first run stopped, or
    the expected costs of the final checkpoints started, whichever is more) plus its own expected cost (its last
    save's). One run alone: its last save's cost against the budget, as ever."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self.since: float | None = None  # when the first run stopped
        self.planned = 0.0  # seconds after `since` the final checkpoints started are expected to end by

    def take(self, cost: float) -> bool:
        """Whether a final checkpoint expected to take `cost` seconds fits what is left; counted if it does."""
        now = time.monotonic()
        self.since = now if self.since is None else self.since
        spent = max(now - self.since, self.planned)
        if spent + cost >= self.budget_s:
            return False
        self.planned = spent + cost
        return True


class PeriodicCheckpoints:
    """Mid-day checkpoints every `checkpoint_interval_s` of training, so a hard kill loses little;
    after SIGTERM one last checkpoint if its expected cost (the last one's) fits what is left of the `budget`
    (`StopBudget`: a pack's runs share one), then stop."""

    def __init__(self, attempt: Attempt, run: Lineage, sync: Callable[[], object] = lambda: None,
                 budget: StopBudget | None = None) -> None:
        self.attempt, self.run = attempt, run
        self.sync = sync  # writes the trainer's state back before a save (a packed run's: `Pack.trainer`)
        self.budget = budget or StopBudget(attempt.cfg.term_budget_s)
        self.last_save = time.monotonic()
        self.save_cost = 1.0  # a guess until the first save is measured

    def after_step(self) -> bool:
        """At each batch boundary: False stops training (SIGTERM); raises LeaseLost when the lease is gone."""
        a, cfg = self.attempt, self.attempt.cfg
        a.touch()
        if a.beat.lost.is_set():
            raise LeaseLost
        if a.stop.is_set():
            if self.budget.take(self.save_cost):
                self.save()
            else:
                log.warning("%s: no time for a final checkpoint (the last took %.1fs; what is left of the %.1fs "
                            "after SIGTERM is spent or promised to its pack's other runs)", a.item.id, self.save_cost,
                            self.budget.budget_s)
            return False
        if time.monotonic() - self.last_save >= cfg.checkpoint_interval_s:
            self.save()
        return True

    def save(self) -> None:
        a = self.attempt
        started = time.monotonic()
        self.sync()
        state = self.run.checkpoint(a.item.id)
        path = a.store.next_path(a.lease.token)
        if a.store.save(state.to_checkpoint(), path=path, may_promote=a.beat.confirm,
                        boundary=state.is_boundary) is None:
            raise LeaseLost
        self.last_save = time.monotonic()
        self.save_cost = self.last_save - started
