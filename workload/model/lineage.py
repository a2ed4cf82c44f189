"""A run's lineage, typed: what its checkpoints hold, the questions the worker asks of them, the rewind rule,
and the calls the protocol makes on the trainer.

`LineageState` is the checkpoint format. It alone reads and writes a checkpoint's keys (the plain dict of
tensors and numbers that `torch.save` writes and `torch.load(weights_only=True)` reads back), and it owns the
upgrades of older formats: whatever a checkpoint written by an older version lacks is filled in here, as
that version trained (see `READABLE`). Everything else asks it: which days are applied, where a day stands
mid-way, whether a checkpoint is a day boundary, which days a late day must re-apply.

The rewind rule lives here too (`Rewind`): a day that arrives after later days were applied goes back to
the boundary checkpoint that holds exactly the days before it, and the days after it are applied again in
date order; where retention pruned that boundary, the nearest kept one before it is promoted again and the days
it lacks are applied first (`Start.detour`). The checkpoint store keeps the newest boundaries and a ladder of
older ones (`LineageState.is_boundary`, handed to it at save; `workload.share.checkpoint.ladder`),
the queue puts the later days back (`WorkQueue.reapply`, called only by `Attempt.rewind`), and `restore`
marks done only what a checkpoint records (`applied_days`).

`Lineage` wraps a `Trainer` with the calls the protocol needs: start or resume, train a day, close a day
(score the test days, calibrate, record the day's history entry), and the state to checkpoint.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

import workload
from workload.core.errors import ItemFault, NonFinite
from workload.data import features
from workload.data.dataset import Dataset, Examples
from workload.model import calibration, metrics
from workload.model.hparams import HParams
from workload.model.trainer import Trainer
from workload.share.checkpoint import CheckpointStore, Loaded, parse_checkpoint_name

log = logging.getLogger(__name__)

# 5: hparams carry full_window_days; 4: hparams carry window_days; 3: calibration (scale, shift); 2: averaged weights,
# feature version, last-epoch accuracy
FORMAT = 5
# A format-2 checkpoint loads uncalibrated and is calibrated at its next applied day; one of format 2 or 3 trained
# each day alone, and keeps doing so (window_days 1); one before format 5 trained `epochs` epochs on every window,
# and keeps doing so (full_window_days 0). One written before rewinds existed records none.
READABLE = (2, 3, 4, 5)
TRAINING_ONLY = ("optimizer", "rng", "progress")  # not needed to score; the optimizer is 2x the weights


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@dataclass(frozen=True)
class LineageState:
    """One checkpoint of a run's lineage. `read` takes the dict a checkpoint file holds (any readable
    format), `to_checkpoint` gives the dict to write (always `FORMAT`). History entries are shared, not copied,
    between states, trainers and checkpoint dicts: an entry is never changed once its day is closed, and copying
    thousands of them at every save made a day's cost grow with the days before it."""

    run: str
    hparams: dict[str, Any]
    feature_names: tuple[str, ...]
    feature_version: str
    model: dict[str, torch.Tensor]
    averaged: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    norm: dict[str, torch.Tensor]
    rng: dict[str, torch.Tensor]
    steps: int
    applied: tuple[str, ...]
    progress: dict[str, Any] | None  # {"shard", "epoch", "batch", "epochs"[, "correct"]} while mid-day
    history: tuple[dict[str, Any], ...]
    reapplied: tuple[dict[str, Any], ...] = ()
    calibration: dict[str, torch.Tensor] | None = None  # None: uncalibrated (format 2)
    code_version: str = field(default=workload.__version__)

    # -- the format ------------------------------------------------------------------------------
    @classmethod
    def read(cls, raw: dict[str, Any]) -> LineageState:
        """A checkpoint's dict, upgraded from whichever readable format wrote it."""
        fmt = raw.get("format")
        if fmt not in READABLE:
            raise ValueError(f"checkpoint format {fmt!r} is not supported (readable: "
                             f"{', '.join(map(str, READABLE))}); start a new run with this code version")
        # Before format 4 every day trained alone, and before format 5 every window `epochs` epochs: the lineage
        # goes on as it was trained, not with today's defaults.
        hparams = {**({"window_days": 1} if fmt < 4 else {}),
                   **({"full_window_days": 0} if fmt < 5 else {}), **raw["hparams"]}
        return cls(run=raw["run"], hparams=hparams, feature_names=tuple(raw["feature_names"]),
                   feature_version=str(raw["feature_version"]), model=raw["model"], averaged=raw["averaged"],
                   optimizer=raw["optimizer"], norm=raw["norm"], rng=raw["rng"], steps=int(raw["steps"]),
                   applied=tuple(raw["applied"]), progress=dict(raw["progress"]) if raw["progress"] else None,
                   history=tuple(raw["history"]),
                   reapplied=tuple(dict(r) for r in raw.get("reapplied", [])),
                   calibration=raw.get("calibration"), code_version=str(raw.get("code_version", "")))

    def to_checkpoint(self) -> dict[str, Any]:
        """The dict a checkpoint file holds (format `FORMAT`)."""
        out = {
            "format": FORMAT, "code_version": self.code_version, "run": self.run, "hparams": dict(self.hparams),
            "feature_names": list(self.feature_names), "feature_version": self.feature_version,
            "model": self.model, "averaged": self.averaged, "optimizer": self.optimizer, "norm": self.norm,
            "rng": self.rng, "steps": self.steps, "applied": list(self.applied), "progress": self.progress,
            "history": list(self.history), "reapplied": [dict(r) for r in self.reapplied],
        }
        if self.calibration is not None:
            out["calibration"] = self.calibration
        return out

    def scoring_entries(self) -> dict[str, Any]:
        """What a model file keeps (`export`): the checkpoint less what only training needs."""
        return scoring_entries(self.to_checkpoint())

    @classmethod
    def from_scoring_entries(cls, entries: dict[str, Any], where: str) -> LineageState:
        """A model file's entries (`scoring_entries`), the training-only parts taken from a fresh trainer of
        the same shape, so `read` applies its checks (format, hyperparameters) to what the file holds."""
        hp = HParams.from_dict(entries["hparams"], where=f"{where}: hparams")
        fresh = cls.of(Trainer(entries["run"], hp, tuple(entries["feature_names"]), device=torch.device("cpu")))
        return cls.read({**fresh.to_checkpoint(), **entries})

    # -- a trainer in and out ----------------------------------------------------------------------
    @classmethod
    def of(cls, trainer: Trainer) -> LineageState:
        """The trainer's whole state, to checkpoint: resuming from it continues bit for bit."""
        return cls(
            run=trainer.run, hparams=trainer.hp.to_dict(), feature_names=tuple(trainer.feature_names),
            feature_version=trainer.feature_version,
            model={k: v.detach().cpu() for k, v in trainer.model.state_dict().items()},
            averaged={k: v.detach().cpu() for k, v in trainer.averaged.state_dict().items()},
            optimizer=trainer.optimizer.state_dict(), norm=trainer.norm.state(),
            rng={"torch": torch.get_rng_state()}, steps=trainer.steps, applied=tuple(trainer.applied),
            progress=trainer._progress_state(), history=tuple(trainer.history),
            reapplied=tuple(dict(r) for r in trainer.reapplied),
            calibration={k: v.clone() for k, v in trainer.calibration.items()})

    def trainer(self, device: torch.device | None = None) -> Trainer:
        """The trainer this state was taken from (the global torch RNG restored with it)."""
        hp = HParams.from_dict(self.hparams, where="checkpoint hparams")
        trainer = Trainer(self.run, hp, self.feature_names, device, self.feature_version)
        trainer.model.load_state_dict(self.model)
        trainer.averaged.load_state_dict(self.averaged)
        trainer.load_optimizer(self.optimizer)
        trainer.norm.load(self.norm)
        torch.set_rng_state(self.rng["torch"])
        trainer.applied = list(self.applied)
        trainer.steps = self.steps
        progress = dict(self.progress) if self.progress else None
        if progress and "correct" in progress:
            trainer._correct = torch.tensor(int(progress.pop("correct")), device=trainer.device)
        trainer.progress = progress
        trainer.history = list(self.history)
        trainer.reapplied = [dict(r) for r in self.reapplied]
        if self.calibration is not None:
            trainer.set_calibration(float(self.calibration["scale"]), float(self.calibration["shift"]))
        return trainer

    # -- what the runtime asks ---------------------------------------------------------------------
    @property
    def is_boundary(self) -> bool:
        """A day boundary: no day is half-trained (what a late day rewinds to; retention keeps the newest ones
        and a ladder of older ones)."""
        return self.progress is None

    @property
    def mid_day(self) -> str | None:
        """The day this checkpoint is part-way through, or None at a boundary."""
        return self.progress["shard"] if self.progress else None

    def has_applied(self, day: str) -> bool:
        return day in self.applied


def scoring_entries(raw: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint dict less what only training needs; ValueError for one mid-way through a day."""
    if raw.get("progress"):
        raise ValueError(f"state is mid-way through {raw['progress']}; export a shard-boundary checkpoint")
    return {k: v for k, v in raw.items() if k not in TRAINING_ONLY}


def checkpoint_of(trainer: Trainer) -> dict[str, Any]:
    """The checkpoint dict of `trainer` (`LineageState.of(trainer).to_checkpoint()`)."""
    return LineageState.of(trainer).to_checkpoint()


def trainer_from(raw: dict[str, Any], device: torch.device | None = None) -> Trainer:
    """The trainer a checkpoint dict of any readable format holds."""
    return LineageState.read(raw).trainer(device)


# -- checkpoints on the share ------------------------------------------------------------------------
@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint of the run as the store holds it: its state, and where it is (file, seq, lease token)."""

    state: LineageState
    path: Path
    seq: int
    token: int

    @classmethod
    def of(cls, loaded: Loaded) -> Checkpoint:
        return cls(LineageState.read(loaded.state), loaded.path, loaded.seq, loaded.token)

    @classmethod
    def promoted(cls, state: LineageState, path: Path) -> Checkpoint:
        """What `CheckpointStore.save` just promoted at `path`, without reading it back."""
        parsed = parse_checkpoint_name(path.name)
        if parsed is None:
            raise ValueError(f"{path} is not a checkpoint file name")
        return cls(state, path, parsed[0], parsed[1])


def _boundary(raw: dict[str, Any]) -> bool:
    return raw.get("progress") is None


def load(store: CheckpointStore, accept: Callable[[dict[str, Any]], bool] = lambda raw: True) -> Checkpoint | None:
    found = store.load(accept=accept)
    return Checkpoint.of(found) if found else None


def newest(store: CheckpointStore, day: str) -> Checkpoint | None:
    """The run's newest checkpoint to start `day` from; one mid-way through another day is passed over for
    the last day boundary (that day was dead-lettered or requeued, and the run moved on)."""
    found = load(store)
    if not found or found.state.has_applied(day) or found.state.is_boundary or found.state.mid_day == day:
        return found
    log.warning("checkpoint %s is mid-way through %s, not %s: starting from the last shard boundary",
                found.path.name, found.state.mid_day, day)
    return load(store, accept=_boundary)


def newest_boundary(store: CheckpointStore) -> Checkpoint | None:
    """The newest checkpoint at a day boundary with at least one day applied (what export and score read)."""
    return load(store, accept=lambda raw: _boundary(raw) and bool(raw.get("applied")))


def applied_days(run_dir: Path) -> set[str]:
    """The days the newest checkpoint under `run_dir` records as applied (none without one)."""
    found = CheckpointStore(run_dir).load()  # not upgraded: only its applied list is asked for
    return set(found.state.get("applied", ())) if found else set()


# -- the rewind rule ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rewind:
    """`day` arrived after `later` days were applied: go back to the boundary that holds exactly `earlier`
    (or a cold start when that is nothing), and apply again, after `day`, every day of `order` after it."""

    day: str
    later: tuple[str, ...]
    earlier: tuple[str, ...]
    again: tuple[tuple[str, int], ...]  # (day, its place in the dataset's order), to put back to pending

    @classmethod
    def needed(cls, state: LineageState | None, day: str, order: list[str]) -> Rewind | None:
        """The rewind that applying `day` to `state` needs, in the dataset's `order`; None when `day` goes on
        the end (or is not a training day: reading it refuses it). An applied day the order no longer has
        is an older version of a day (late labels, `workload.data.cycle`): it is undone as a later day is."""
        if state is None or day not in order:
            return None
        pos = {d: i for i, d in enumerate(order)}
        mine = pos[day]
        later = tuple(d for d in state.applied if pos.get(d, len(order)) > mine)
        if not later:
            return None
        earlier = tuple(d for d in state.applied if pos.get(d, len(order)) < mine)
        return cls(day=day, later=later, earlier=earlier, again=tuple((d, pos[d]) for d in order[mine + 1:]))

    def is_target(self, raw: dict[str, Any]) -> bool:
        """Whether a checkpoint is the boundary to go back to."""
        return _boundary(raw) and tuple(raw["applied"]) == self.earlier

    def target(self, store: CheckpointStore) -> Checkpoint | None:
        """The boundary to go back to; None for a cold start. When retention pruned it (docs/architecture.md,
        Checkpoints), the nearest kept boundary before it: its applied days a prefix of `earlier` (a cold start
        when none is); the caller then trains the days missing from it first (`Start.detour`). Nothing is
        refused: however far back the day is, the run can go back to a kept boundary or start cold."""
        found = load(store, accept=self.is_target)
        if found is not None or not self.earlier:
            return found
        return load(store, accept=self.is_prefix)

    def is_prefix(self, raw: dict[str, Any]) -> bool:
        """Whether a checkpoint is a boundary that holds the first days of `earlier`, in order (or none)."""
        applied = tuple(raw["applied"])
        return _boundary(raw) and applied == self.earlier[:len(applied)]

    def record(self, target: Checkpoint | None, order: list[str] | None = None) -> dict[str, Any]:
        """The lineage's record of this rewind (the report lists each); `order`: the dataset's, which names an
        older version of the day (late labels)."""
        older = [d for d in self.later if order is not None and d not in order]
        why = (f"{self.day} carries new labels for {older[0]} (late labels)" if older else
               f"{self.day} arrived after {self.later[-1]} was applied (a backfill or a requeued day)")
        return {"day": self.day, "reapplied": list(self.later),
                "from": target.path.name if target else "a cold start", "why": why, "time": _now()}


@dataclass(frozen=True)
class Start:
    """Where a day starts: the checkpoint to resume from (None: a cold start); after a rewind, the days to
    put back to pending (with their places in the dataset's order) and the lineage's rewind records."""

    checkpoint: Checkpoint | None
    again: tuple[tuple[str, int], ...] = ()
    reapplied: tuple[dict[str, Any], ...] | None = None
    # The rewind's own boundary was pruned: the kept boundary before it (`checkpoint`) lacks these earlier days,
    # so they go back to pending (with `again`), that boundary is promoted again as the newest, and the day is
    # released to be claimed after them, not trained now.
    detour: tuple[tuple[str, int], ...] = ()


def start_for(store: CheckpointStore, found: Checkpoint | None, day: str, order: Callable[[], list[str]],
              run: str) -> Start:
    """Chronological order, always: when `found` (the run's newest checkpoint) already holds days later than
    `day` in `order()` (the dataset's training days in date order; `Dataset.training_shards`), a backfill or a
    dead day requeued after the run moved on, the day starts from the newest boundary that holds none of them
    (or a cold start), and those later days are applied again after it. Nothing is promoted here: a worker
    dying mid-rewind leaves the old checkpoint newest, and the next attempt rewinds again."""
    if found is None:
        return Start(None)
    days = order()
    rewind = Rewind.needed(found.state, day, days)
    if rewind is None:
        return Start(found)
    target = rewind.target(store)
    held = len(target.state.applied) if target else 0
    if held < len(rewind.earlier):
        pos = {d: i for i, d in enumerate(days)}
        missing = tuple((d, pos[d]) for d in rewind.earlier[held:])
        record = rewind.record(target, days)
        log.warning("%s/%s: the boundary holding %d day(s) before it was pruned; the nearest kept one is %s: "
                    "it is promoted again, and %s and every day after it go back to pending and are applied "
                    "again in date order", run, day, len(rewind.earlier), record["from"], missing[0][0])
        return Start(target, (*missing, *rewind.again), (*found.state.reapplied, record), detour=missing)
    record = rewind.record(target, days)
    log.warning("%s/%s: %s; rewinding run %s to %s and applying %s again after it", run, day, record["why"], run,
                record["from"], ", ".join(record["reapplied"]))
    return Start(target, rewind.again, (*found.state.reapplied, record))


# -- the lineage in the worker -------------------------------------------------------------------------
@dataclass(frozen=True)
class ClosedDay:
    """A day trained and evaluated: the checkpoint that records it as applied (not saved yet) and the dict to
    write there, and the precision-recall curve on the test days."""

    checkpoint: Checkpoint
    raw: dict[str, Any]
    pr: tuple[np.ndarray, np.ndarray]


class Lineage:
    """A run's lineage while a worker trains it: the trainer, and the protocol's calls on it."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer

    @classmethod
    def resume(cls, run: str, hp: HParams, start: Start) -> Lineage:
        """The lineage from `start`'s checkpoint (a new one without), with its rewind records; a checkpoint of
        other features is refused (ItemFault: start a new run)."""
        if start.checkpoint is None:
            trainer = Trainer(run, hp, features.FEATURE_NAMES, feature_version=features.FEATURE_VERSION)
        else:
            trainer = start.checkpoint.state.trainer()
            if (trainer.feature_names, trainer.feature_version) != (features.FEATURE_NAMES,
                                                                    features.FEATURE_VERSION):
                raise ItemFault(f"checkpoint {start.checkpoint.path} was trained on features "
                                f"{trainer.feature_names} version {trainer.feature_version!r}, this code computes "
                                f"{features.FEATURE_NAMES} version {features.FEATURE_VERSION!r}: start a new run")
            if trainer.hp != hp:
                log.warning("run %s: checkpoint hyperparameters %s differ from the share's %s; the checkpoint's "
                            "lineage wins", run, trainer.hp, hp)
        if start.reapplied is not None:
            trainer.reapplied = [dict(r) for r in start.reapplied]
        return cls(trainer)

    @classmethod
    def as_saved(cls, checkpoint: Checkpoint) -> Lineage:
        """The lineage exactly as `checkpoint` holds it (to re-render its report), whatever its features."""
        return cls(checkpoint.state.trainer())

    def read(self, data: Dataset, day: str) -> tuple[Examples, Examples]:
        """The day's examples, and those of the window it trains on (`Trainer.window`: the run's newest applied
        days before it, then the day itself)."""
        return data.day_and_window(self.trainer.window(day))

    def train_day(self, day: str, examples: Examples, window: Examples,
                  after_step: Callable[[], bool], label: str) -> float | None:
        """Train `day` from where the lineage stands on its `window`; seconds it took, or None when
        `after_step` stopped it."""
        self.begin_day(day, examples, window, label)
        started = time.monotonic()
        if not self.trainer.train_shard(window.x, window.y, after_step):
            return None
        return time.monotonic() - started

    def begin_day(self, day: str, examples: Examples, window: Examples, label: str) -> None:
        """Where the day starts (said in the log): its own rows folded into the statistics once, or resumed."""
        t = self.trainer
        resumed = t.progress
        log.info("%s: training on %d rows (%d of the day's), %s", label, len(window.y), len(examples.y),
                 f"resuming at epoch {resumed['epoch']} batch {resumed['batch']}"
                 if resumed and resumed["shard"] == day else
                 f"warm start after {len(t.applied)} shard(s)" if t.applied else "cold start")
        t.begin_shard(day, examples.x)

    def checkpoint(self, label: str) -> LineageState:
        """The state to checkpoint mid-day; NonFinite (nothing is promoted) when it holds NaN or infinity."""
        self.check_finite(label)
        return LineageState.of(self.trainer)

    def close_day(self, data: Dataset, day: str, examples: Examples, window: Examples, train_s: float,
                  store: CheckpointStore, token: int, touch: Callable[[], None]) -> ClosedDay:
        """Calibrate, score the test days and record the day as applied in the history, naming the checkpoint
        of lease `token` it goes into; nothing non-finite gets that far."""
        t = self.trainer
        path = store.next_path(token)
        calibrated_on = calibration.refit(t, data, day)
        test = data.test_examples()
        touch()
        test_logits = t.logits(test.x)  # one pass over the test days for both the calibrated and the raw scores
        test_scores = t.probabilities(test_logits)
        label = f"{t.run}/{day}"
        self.check_finite(label, loss=t.last_epoch_loss(), scores=test_scores)
        entry: dict[str, Any] = {
            "shard": day, "time": _now(), "checkpoint": path.name, "train_rows": int(len(examples.y)),
            "train_frauds": int(examples.y.sum()),
            "first_day": str(examples.day.min()) if len(examples.day) else "",
            "last_day": str(examples.day.max()) if len(examples.day) else "",
            "window_rows": int(len(window.y)), "train_accuracy": t.train_accuracy(len(window.y)),
            "train_seconds": round(train_s, 3), "test_window": data.test_window(),
            **metrics.evaluate(test_scores, test.y, test.day, test.card),
            **calibration.assess(t, test, test_scores, calibrated_on, raw=t.probabilities(test_logits, False)),
        }
        t.finish_shard(entry)
        log.info("%s applied: average precision %.3f (base rate %.4f), ROC AUC %.3f", label,
                 entry["average_precision"], entry["base_rate"], entry["roc_auc"])
        state = LineageState.of(t)
        return ClosedDay(Checkpoint.promoted(state, path), state.to_checkpoint(), metrics.pr_curve(test_scores, test.y))

    def pr_curve(self, data: Dataset, test_scores: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The precision-recall curve on the test days (scored now unless `test_scores` are given)."""
        test = data.test_examples()
        return metrics.pr_curve(self.trainer.score(test.x) if test_scores is None else test_scores, test.y)

    def check_finite(self, where: str, loss: float | None = None, scores: np.ndarray | None = None) -> None:
        """NonFinite (an item fault: nothing is promoted) when the weights, the normalisation statistics,
        the loss or the scores hold NaN or infinity."""
        t = self.trainer
        tensors = {f"weights {k}": v for k, v in t.model.state_dict().items()}
        tensors |= {f"averaged weights {k}": v for k, v in t.averaged.state_dict().items()}
        tensors |= {f"feature normaliser {k}": v for k, v in t.norm.state().items()}
        for name, tensor in tensors.items():
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                raise NonFinite(f"{where}: training produced non-finite {name} (NaN or infinity); nothing was "
                                "promoted: check the day's data for extreme values")
        if loss is not None and not np.isfinite(loss):
            raise NonFinite(f"{where}: the training loss is {loss}; nothing was promoted")
        if scores is not None and not np.isfinite(scores).all():
            raise NonFinite(f"{where}: the model's test scores are non-finite (NaN or infinity); nothing was "
                            "promoted: check the test days' data for extreme values")


__all__ = ["FORMAT", "READABLE", "Checkpoint", "ClosedDay", "Lineage", "LineageState", "Rewind", "Start",
           "applied_days", "checkpoint_of", "load", "newest", "newest_boundary", "scoring_entries", "start_for",
           "trainer_from"]
