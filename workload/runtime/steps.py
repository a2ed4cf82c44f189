"""One attempt at a claimed item, step by step in the order of DESIGN.md's checkpoint protocol:

claim (the worker's loop) -> fence -> load checkpoint and data -> train with periodic checkpoints ->
save and promote -> report -> ack. `Attempt.run` is that list; each step is a method a reader can
check against the protocol on its own.

Order matters for fault tolerance. The checkpoint that records a day as applied is promoted before
the report is written and before the ack; a worker that finds its claimed day already in the
checkpoint only re-renders the report and acks (death between promotion and ack). Whether a lease may
still write is decided by the checkpoint store (workload.share.checkpoint, the one place of the
fencing rule); a step that learns the lease is gone raises `LeaseLost` and writes nothing more.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workload.core import faults
from workload.core.errors import ItemFault, NonFinite
from workload.data import features
from workload.data.dataset import Dataset, Examples
from workload.model import calibration, export, metrics, report
from workload.model.trainer import HParams, Trainer
from workload.queue.workqueue import Lease, WorkQueue
from workload.runtime.config import WorkerConfig
from workload.runtime.heartbeat import Heartbeat, LeaseLost
from workload.share.checkpoint import CheckpointStore, Loaded
from workload.share.paths import share_paths

log = logging.getLogger(__name__)


class Outcome(Enum):
    DONE = "done"  # applied (or found applied) and acked
    RELEASED = "released"  # preempted, or given back at no cost to be claimed again at once
    FAILED = "failed"  # an item fault or an error: dead-lettered or retried later
    INFRA = "infra"  # an infrastructure fault: released at no cost; back off
    LOST = "lost"  # the lease was lost


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
        """The protocol, one step a line; the worker's loop has claimed the item."""
        if not self.fence():
            return self.catch_up_token()
        loaded = self.load_checkpoint()
        if loaded and self.item.shard in loaded.state["applied"]:
            return self.ack_applied(loaded)
        loaded, rewound = self.rewind(loaded)
        trainer = self.warm_start(loaded)
        if rewound is not None:
            trainer.reapplied = rewound
        examples, window = self.read_day(trainer)
        if self.stop.is_set():
            return self.release_for_peer()
        train_s = self.train(trainer, examples, window)
        if train_s is None:
            return self.release_for_peer()
        path, test_scores = self.evaluate(trainer, examples, window, train_s)
        promoted = self.save_and_promote(trainer, path)
        self.report(promoted, trainer, test_scores, draw=self.pictures_due())
        entry = trainer.history[-1]
        log.info("%s applied: average precision %.3f (base rate %.4f), ROC AUC %.3f", self.item.id,
                 entry["average_precision"], entry["base_rate"], entry["roc_auc"])
        faults.point("before-ack")
        self.ack()
        return Outcome.DONE

    # -- fence --------------------------------------------------------------------------------------
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

    # -- load checkpoint and data -------------------------------------------------------------------
    def load_checkpoint(self) -> Loaded | None:
        """The run's newest checkpoint; one mid-way through another day is passed over for the last
        day boundary (that day was dead-lettered or requeued, and the run moved on)."""
        loaded = self.store.load()
        self.touch()
        if not loaded or self.item.shard in loaded.state["applied"] or not loaded.state["progress"]:
            return loaded
        if loaded.state["progress"]["shard"] != self.item.shard:
            log.warning("checkpoint %s is mid-way through %s, not %s: starting from the last shard boundary",
                        loaded.path.name, loaded.state["progress"]["shard"], self.item.shard)
            loaded = self.store.load(accept=lambda s: s["progress"] is None)
        return loaded

    def ack_applied(self, loaded: Loaded) -> Outcome:
        """The day is in the checkpoint already (death between promotion and ack): report and ack."""
        log.info("%s is already in checkpoint %s: re-rendering the report and acking", self.item.id, loaded.path.name)
        self.report(loaded, Trainer.from_state(loaded.state))
        faults.point("before-ack")
        self.ack()
        return Outcome.DONE

    def rewind(self, loaded: Loaded | None) -> tuple[Loaded | None, list[dict[str, Any]] | None]:
        """Chronological order, always: when the checkpoint already holds days later than ours (a
        backfill, or a dead day requeued after the run moved on), go back to the newest boundary
        checkpoint that holds none of them (or a cold start), and put those later days back to pending
        in date order, under our lease, to be applied again after ours. Nothing is promoted here: a
        worker dying mid-rewind leaves the old checkpoint newest, and the next attempt rewinds again.
        Returns the checkpoint to warm-start from and, after a rewind, the lineage's rewind records."""
        order = self.dataset.training_shards()
        if not loaded or self.item.shard not in order:
            return loaded, None  # nothing to rewind; read_day refuses a day the dataset lacks
        pos = {shard: i for i, shard in enumerate(order)}
        mine = pos[self.item.shard]
        later = [d for d in loaded.state["applied"] if pos.get(d, -1) > mine]
        if not later:
            return loaded, None
        earlier = [d for d in loaded.state["applied"] if pos.get(d, -1) < mine]
        target = self.store.load(accept=lambda s: s["progress"] is None and list(s["applied"]) == earlier)
        if target is None and earlier:
            raise ItemFault(f"run {self.item.run}: day {self.item.shard} arrived after later days were applied "
                            f"({later[0]} ...), and the boundary checkpoint before it is no longer in "
                            f"{self.store.dir}: retrain from scratch by seeding a new run name with the same "
                            "hyperparameters (seed --runs-file), which applies every day in date order")
        put_back = self.queue.reapply(self.lease, [(f"{self.item.run}/{d}", pos[d]) for d in order[mine + 1:]])
        if put_back is None:
            raise LeaseLost
        record = {"day": self.item.shard, "reapplied": later,
                  "from": target.path.name if target else "a cold start",
                  "why": f"{self.item.shard} arrived after {later[-1]} was applied (a backfill or a requeued day)",
                  "time": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")}
        log.warning("%s: %s; rewinding run %s to %s and applying %s again after it", self.item.id, record["why"],
                    self.item.run, record["from"], ", ".join(record["reapplied"]))
        return target, [*loaded.state.get("reapplied", []), record]

    def warm_start(self, loaded: Loaded | None) -> Trainer:
        """The run's lineage from its checkpoint, or a new one; a checkpoint of other features is refused."""
        if not loaded:
            return Trainer(self.item.run, self.hp, features.FEATURE_NAMES, feature_version=features.FEATURE_VERSION)
        trainer = Trainer.from_state(loaded.state)
        if (trainer.feature_names, trainer.feature_version) != (features.FEATURE_NAMES, features.FEATURE_VERSION):
            raise ItemFault(f"checkpoint {loaded.path} was trained on features {trainer.feature_names} "
                            f"version {trainer.feature_version!r}, this code computes "
                            f"{features.FEATURE_NAMES} version {features.FEATURE_VERSION!r}: start a new run")
        if trainer.hp != self.hp:
            log.warning("run %s: checkpoint hyperparameters %s differ from the share's %s; the checkpoint's "
                        "lineage wins", self.item.run, trainer.hp, self.hp)
        return trainer

    def read_day(self, trainer: Trainer) -> tuple[Examples, Examples]:
        """The day's examples, and those of the window it trains on (`Trainer.window`: the run's newest
        applied days before it, then the day itself)."""
        faults.point("read")
        examples = self.dataset.examples([self.item.shard])
        earlier = trainer.window(self.item.shard)[:-1]
        window = Examples.concat([vars(self.dataset.examples(earlier)), vars(examples)]) if earlier else examples
        self.touch()
        return examples, window

    # -- train with periodic checkpoints ------------------------------------------------------------
    def train(self, trainer: Trainer, examples: Examples, window: Examples) -> float | None:
        """Train the day from where the trainer stands; seconds it took, or None when stopped (SIGTERM)."""
        resumed = trainer.progress
        log.info("%s: training on %d rows (%d of the day's), %s", self.item.id, len(window.y), len(examples.y),
                 f"resuming at epoch {resumed['epoch']} batch {resumed['batch']}"
                 if resumed and resumed["shard"] == self.item.shard else
                 f"warm start after {len(trainer.applied)} shard(s)" if trainer.applied else "cold start")
        trainer.begin_shard(self.item.shard, examples.x)
        checkpoints = PeriodicCheckpoints(self, trainer)
        started = time.monotonic()
        if not trainer.train_shard(window.x, window.y, checkpoints.after_step):
            return None
        return time.monotonic() - started

    # -- save and promote ---------------------------------------------------------------------------
    def evaluate(self, trainer: Trainer, examples: Examples, window: Examples,
                 train_s: float) -> tuple[Path, np.ndarray]:
        """Score the test days and close the day in the trainer's history, naming the checkpoint it
        goes into; nothing non-finite gets that far. Returns that checkpoint's path and the scores."""
        path = self.store.next_path(self.lease.token)
        calibrated_on = calibration.refit(trainer, self.dataset, self.item.shard)
        test = self.dataset.test_examples()
        self.touch()
        test_scores = trainer.score(test.x)
        check_finite(trainer, self.item.id, loss=trainer.last_epoch_loss(), scores=test_scores)
        entry: dict[str, Any] = {
            "shard": self.item.shard, "time": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "checkpoint": path.name, "train_rows": int(len(examples.y)), "train_frauds": int(examples.y.sum()),
            "first_day": str(examples.day.min()) if len(examples.day) else "",
            "last_day": str(examples.day.max()) if len(examples.day) else "",
            "window_rows": int(len(window.y)), "train_accuracy": trainer.train_accuracy(len(window.y)),
            "train_seconds": round(train_s, 3), **metrics.evaluate(test_scores, test.y, test.day, test.card),
            **calibration.assess(trainer, test, test_scores, calibrated_on),
        }
        trainer.finish_shard(entry)
        return path, test_scores

    def save_and_promote(self, trainer: Trainer, path: Path) -> Loaded:
        """The checkpoint that records the day as applied, promoted only while the lease is ours."""
        state = trainer.state_dict()
        promoted = self.store.save(state, path=path, may_promote=self.beat.confirm)
        if promoted is None:
            raise LeaseLost
        self.touch()
        faults.point("after-promote")
        return Loaded.promoted(state, promoted)

    # -- report -------------------------------------------------------------------------------------
    def pictures_due(self) -> bool:
        """Two PNGs cost more than training a tutorial-sized day: drawn after a run's last day, or when old."""
        return self.queue.pending_in_run(self.item.run) == 0 or report.plots_stale(self.run_dir,
                                                                                    self.cfg.plot_interval_s)

    def report(self, source: Loaded, trainer: Trainer, test_scores: np.ndarray | None = None,
               draw: bool = True) -> None:
        """Rewrite the report from `source`, the newest promoted checkpoint, only while it is: a worker
        whose lease is gone, or whose checkpoint a newer lease has superseded, writes nothing."""
        faults.point("report")
        if not self.beat.confirm():
            raise LeaseLost
        newer = self.store.superseded_by(self.lease.token)
        if newer is not None:
            log.warning("%s: a newer lease (token %d) owns the run: not rewriting its report", self.item.id, newer)
            raise LeaseLost
        pr = None
        if draw:
            test = self.dataset.test_examples()
            pr = metrics.pr_curve(trainer.score(test.x) if test_scores is None else test_scores, test.y)
        report.write(self.run_dir, source.state, pr, draw=draw, kept=self.store.retained(),
                     stamp=(source.token, source.seq))
        self.touch()

    # -- ack ----------------------------------------------------------------------------------------
    def ack(self) -> None:
        res = self.queue.ack(self.lease)
        if res.state == "acked":
            log.info("acked %s", self.item.id)
            faults.point("acked")
            # We acked the run's last day: results to $OUTPUT_URI (a failure there only warns). Judged by
            # the ack itself: asked afterwards, a peer that just claimed the next day makes the run look done.
            if os.environ.get(export.OUTPUT_URI_ENV) and res.finished_run:
                export.export_finished_run(self.cfg.share, self.item.run)
        elif res.state == "already-done":
            log.warning("%s was already acked by %s: nothing to do", self.item.id, res.by)
        else:
            log.warning("ack of %s refused: token %d no longer holds the lease (a newer owner has it; its "
                        "checkpoint records our work if it was promoted)", self.item.id, self.lease.token)

    def release_for_peer(self) -> Outcome:
        """Stopped (SIGTERM): give the item back at no cost so a peer resumes it at once."""
        state = self.queue.release(self.lease)
        log.warning("released %s for a peer (%s)", self.item.id, state)
        return Outcome.RELEASED


class PeriodicCheckpoints:
    """Mid-day checkpoints every `checkpoint_interval_s` of training, so a hard kill loses little;
    after SIGTERM one last checkpoint if the last one's cost fits `term_budget_s`, then stop."""

    def __init__(self, attempt: Attempt, trainer: Trainer) -> None:
        self.attempt, self.trainer = attempt, trainer
        self.last_save = time.monotonic()
        self.save_cost = 1.0  # a guess until the first save is measured

    def after_step(self) -> bool:
        """At each batch boundary: False stops training (SIGTERM); raises LeaseLost when the lease is gone."""
        a, cfg = self.attempt, self.attempt.cfg
        a.touch()
        if a.beat.lost.is_set():
            raise LeaseLost
        if a.stop.is_set():
            if self.save_cost < cfg.term_budget_s:
                self.save()
            else:
                log.warning("no time for a final checkpoint (last took %.1fs)", self.save_cost)
            return False
        if time.monotonic() - self.last_save >= cfg.checkpoint_interval_s:
            self.save()
        return True

    def save(self) -> None:
        a = self.attempt
        started = time.monotonic()
        check_finite(self.trainer, a.item.id)
        path = a.store.next_path(a.lease.token)
        if a.store.save(self.trainer.state_dict(), path=path, may_promote=a.beat.confirm) is None:
            raise LeaseLost
        self.last_save = time.monotonic()
        self.save_cost = self.last_save - started


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
