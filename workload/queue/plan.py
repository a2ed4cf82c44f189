"""What must be trained, read from the share: the share is the truth, Redis a cache of the queue.

`seed` records each run here (its dataset and hyperparameters) before it enqueues anything. The
items of a run are the training days in its dataset's manifest, in chronological order. Whatever
must rebuild the queue (a wiped Redis, new days appended to a dataset, a new run) derives it from
these two facts; what was already trained is in each run's checkpoints.

    <share>/runs/<run>.json   {"run": ..., "dataset": ..., "hparams": {...}}

A run's record is created once and never changed: a run is one model lineage.

`restore` rebuilds a wiped queue from these records: every item is enqueued again (idempotently),
the days a run's checkpoint already records are marked done without training, and the fencing
token counter is raised above every token on the share.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workload.data.dataset import Dataset
from workload.data.manifest import MANIFEST
from workload.queue.workqueue import Item, WorkQueue
from workload.share.fsutil import FILE_MODE, fsync_dir
from workload.share.paths import check_name, runs_dir, share_paths

log = logging.getLogger(__name__)


class PlanError(ValueError):
    """A run record that conflicts with what is asked, or cannot be read."""


@dataclass(frozen=True)
class RunSpec:
    run: str
    dataset: str
    hparams: dict[str, Any]

    def to_json(self) -> str:
        return json.dumps({"run": self.run, "dataset": self.dataset, "hparams": self.hparams}, sort_keys=True,
                          indent=1) + "\n"


def _read(path: Path) -> RunSpec:
    try:
        data = json.loads(path.read_text())
        spec = RunSpec(run=check_name(data["run"], "run"), dataset=check_name(data["dataset"], "dataset"),
                       hparams=dict(data["hparams"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise PlanError(f"{path}: not a run record ({exc}); expected {{run, dataset, hparams}}") from exc
    if path.stem != spec.run:
        raise PlanError(f"{path}: records run {spec.run!r}, but the file is named for {path.stem!r}")
    return spec


def record(share: Path, spec: RunSpec) -> bool:
    """Record `spec` if its run is new (True); False if the same spec is already recorded.

    The file is written whole under a temporary name and linked into place, so two seeders racing
    cannot both create it and no reader ever sees half a record. A different spec for an existing
    run is refused: give new hyperparameters a new run name."""
    check_name(spec.run, "run")
    check_name(spec.dataset, "dataset")
    folder = runs_dir(share)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{spec.run}.json"
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{spec.run}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), FILE_MODE)
            f.write(spec.to_json())
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            seen = _read(path)
            if seen != spec:
                raise PlanError(
                    f"run {spec.run!r} already exists with hyperparameters {seen.hparams} on dataset {seen.dataset!r}; "
                    f"got {spec.hparams} on dataset {spec.dataset!r}. A run is one model lineage: "
                    "give the new hyperparameters a new run name.") from None
            return False
    finally:
        Path(tmp).unlink(missing_ok=True)
    fsync_dir(folder)
    return True


def spec(share: Path, run: str) -> RunSpec | None:
    """The recorded spec of `run`, or None if seed never recorded it (PlanError if unreadable)."""
    path = runs_dir(share) / f"{check_name(run, 'run')}.json"
    return _read(path) if path.exists() else None


def runs(share: Path) -> dict[str, RunSpec]:
    """Every run recorded on the share, by name. A file there that is no run record (a copy of one under
    another name, `{}`, a damaged record) is named, with what to do, and skipped, as a stale record is in
    `live`: one stray file never stops the healthy runs from being restored and trained. `spec` still
    refuses it when its own run is asked for."""
    folder = runs_dir(share)
    if not folder.is_dir():
        return {}
    found = {}
    for path in sorted(folder.glob("*.json")):
        if path.name.startswith("."):
            continue
        try:
            spec = _read(path)
        except PlanError as exc:
            log.warning("skipped, not a run: %s; remove it (a run's record is runs/<run>.json, written by seed)", exc)
            continue
        found[spec.run] = spec
    return found


def live(share: Path) -> dict[str, RunSpec]:
    """The recorded runs whose dataset is published; each run whose dataset is gone is named, with what
    to do, and skipped, so that one stale record never stops the healthy runs from seeding or training."""
    datasets_dir, _ = share_paths(share)
    found = {}
    for name, rs in runs(share).items():
        manifest = datasets_dir / rs.dataset / MANIFEST
        if manifest.exists():
            found[name] = rs
        else:
            log.warning("run %s is skipped: its dataset %r is gone from the share (%s is missing); publish it "
                        "again (seed --dataset %s --datasets SOURCE) or retire the run by removing %s", name,
                        rs.dataset, manifest, rs.dataset, runs_dir(share) / f"{name}.json")
    return found


def items(share: Path, only: dict[str, RunSpec] | None = None) -> list[Item]:
    """The (run, training day) items of every live run (or of `only`), in chronological order."""
    datasets_dir, _ = share_paths(share)
    datasets: dict[str, Dataset] = {}
    out = []
    for spec in (live(share) if only is None else only).values():
        if spec.dataset not in datasets:
            datasets[spec.dataset] = Dataset(datasets_dir / spec.dataset)
        shards = datasets[spec.dataset].training_shards()
        out += [Item(run=spec.run, shard=shard, dataset=spec.dataset, seq=i) for i, shard in enumerate(shards)]
    return out


def retired_items(share: Path) -> list[Item]:
    """The items of day versions a publish retired (``workload.data.cycle``: an older version of a day, a
    scored day now labelled): the manifest no longer has them, so there is nothing to train; `seed` marks
    any still pending done (a worker would find no such day)."""
    datasets_dir, _ = share_paths(share)
    out = []
    for spec in live(share).values():
        retired = Dataset(datasets_dir / spec.dataset).retired
        out += [Item(run=spec.run, shard=path, dataset=spec.dataset, seq=0) for path in retired]
    return out


AppliedDays = Callable[[Path], set[str]]  # a run's output folder -> the days its newest checkpoint records


def restore(queue: WorkQueue, share: Path, applied_days: AppliedDays) -> dict[str, int]:
    """Rebuild the queue from the share (idempotent; several workers may race through it).

    `applied_days` reads the run's newest checkpoint (the worker passes `workload.model.lineage.applied_days`:
    the checkpoint format is the lineage's). Returns counts: runs, items enqueued anew, items marked done
    because the run's newest checkpoint already records them."""
    from workload.share.checkpoint import CheckpointStore  # torch: only workers pay for it

    specs = live(share)
    _, output_dir = share_paths(share)
    for rs in specs.values():
        try:
            queue.put_spec(rs.run, rs.hparams)
        except ValueError as exc:
            log.warning("run %s: Redis holds other hyperparameters than the share; the share wins: %s", rs.run, exc)
    todo = items(share, specs)
    added = queue.enqueue(todo)
    applied: dict[str, set[str]] = {}
    floor = 0
    for run in specs:
        floor = max(floor, CheckpointStore(output_dir / run).highest_token())
        applied[run] = applied_days(output_dir / run)
    queue.raise_token(floor)
    done = queue.mark_done([it for it in todo if it.shard in applied[it.run]])
    queue.mark_seeded()
    return {"runs": len(specs), "enqueued": added, "already_applied": done}


@dataclass(frozen=True)
class Gap:
    """What the queue lacks of the share's plan: a Redis wiped, or restored from an older snapshot."""

    runs: int
    items: int
    missing_runs: list[str]
    missing_items: list[str]
    token: int
    token_floor: int

    def __bool__(self) -> bool:
        return bool(self.missing_runs or self.missing_items or self.token < self.token_floor)

    def line(self) -> str:
        """One line for `status` and the worker's log."""
        head = f"share vs queue: the share's plan is {self.runs} run(s), {self.items} item(s)"
        if not self:
            return head + "; the queue holds them all"
        lacks = []
        if self.missing_runs:
            lacks.append(f"{len(self.missing_runs)} run(s) ({_some(self.missing_runs)})")
        if self.missing_items:
            lacks.append(f"{len(self.missing_items)} item(s) ({_some(self.missing_items)})")
        if self.token < self.token_floor:
            lacks.append(f"a token counter at {self.token}, below the share's {self.token_floor}")
        return (head + "; the queue is BEHIND: it lacks " + ", ".join(lacks) +
                " (Redis restored from an older snapshot?); a worker adds them at start and before it exits")


def _some(names: list[str], shown: int = 3) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def gap(queue: WorkQueue, share: Path) -> Gap:
    """Compare the queue with the share's plan (run records plus published days)."""
    from workload.share.checkpoint import CheckpointStore  # torch: only workers and status pay for it

    specs = live(share)
    todo = items(share, specs)
    ids, spec_runs, token = queue.known()
    _, output_dir = share_paths(share)
    floor = max((CheckpointStore(output_dir / run).highest_token() for run in specs), default=0)
    return Gap(runs=len(specs), items=len(todo), missing_runs=sorted(set(specs) - spec_runs),
               missing_items=[it.id for it in todo if it.id not in ids], token=token, token_floor=floor)


def reconcile(queue: WorkQueue, share: Path, applied_days: AppliedDays) -> Gap | None:
    """Bring a queue that is behind the share up to it (as `restore` does for an empty one); returns
    the gap it closed, None when there was none. Idempotent: workers may race through it."""
    found = gap(queue, share)
    if not found:
        return None
    log.warning("%s", found.line())
    got = restore(queue, share, applied_days)
    log.warning("reconciled the queue from the share: added %d item(s), %d of them already applied in the "
                "checkpoints (marked done); token counter at least %d", got["enqueued"], got["already_applied"],
                found.token_floor)
    return found


def unconfirmed(queue: WorkQueue, share: Path, applied_days: AppliedDays) -> list[Item]:
    """The items Redis calls done that their run's newest valid checkpoint does not record as applied, in
    date order per run: "done" is the share's word, not Redis's."""
    specs = live(share)
    done = queue.done_ids()
    todo = [it for it in items(share, specs) if it.id in done]
    _, output_dir = share_paths(share)
    applied = {run: applied_days(output_dir / run) for run in {it.run for it in todo}}
    return [it for it in todo if it.shard not in applied[it.run]]


def confirm_done(queue: WorkQueue, share: Path, applied_days: AppliedDays) -> list[str]:
    """Check what Redis calls done against the share; where they disagree the share wins: those days go back
    to pending at their place in date order, to be trained (a late one rewinds its run), and the
    disagreement is logged once, by the worker that moved them. Returns the ids put back."""
    missing = unconfirmed(queue, share, applied_days)
    back = queue.mark_pending(missing)
    if back:
        log.warning("share vs queue: Redis calls %d day(s) done that their run's newest checkpoint on the share "
                    "does not record (%s): Redis restored from an older snapshot, or the share's output from an "
                    "older backup? The share wins: put them back to pending in date order, to be trained",
                    len(back), _some(back))
    return back



@dataclass(frozen=True)
class Truth:
    """Redis's done days against each run's newest valid checkpoint on the share: what `status` shows as
    applied, and where the two disagree."""

    applied: dict[str, int]  # run -> days of its plan that its newest checkpoint on the share records
    planned: dict[str, int]  # run -> days of its plan
    done_not_applied: list[str]  # item ids Redis calls done that the share does not record
    applied_not_done: list[str]  # item ids the share records that Redis does not call done

    def line(self) -> str | None:
        """One line where Redis and the share disagree (which days, how many); None where they agree."""
        parts = []
        if self.done_not_applied:
            parts.append(f"Redis calls {len(self.done_not_applied)} day(s) done that their run's newest checkpoint "
                         f"on the share does not record ({_some(self.done_not_applied)}): a worker puts them back "
                         "to pending and trains them")
        if self.applied_not_done:
            parts.append(f"the share records {len(self.applied_not_done)} day(s) applied that Redis does not call "
                         f"done ({_some(self.applied_not_done)}): a worker acks them without training")
        return "share vs queue: DISAGREE: " + "; ".join(parts) if parts else None


def truth(queue: WorkQueue, share: Path, applied_days: AppliedDays) -> Truth:
    """Compare what Redis calls done with what the share's newest checkpoints record, run by run (`applied_days`
    as in `restore`). The share is the truth: "applied" is what its checkpoints record."""
    specs = live(share)
    todo = items(share, specs)
    done = queue.done_ids()
    _, output_dir = share_paths(share)
    on_share = {run: applied_days(output_dir / run) for run in specs}
    applied = {run: 0 for run in specs}
    planned = {run: 0 for run in specs}
    for it in todo:
        planned[it.run] += 1
        applied[it.run] += it.shard in on_share[it.run]
    return Truth(applied=applied, planned=planned,
                 done_not_applied=[it.id for it in todo if it.id in done and it.shard not in on_share[it.run]],
                 applied_not_done=[it.id for it in todo if it.id not in done and it.shard in on_share[it.run]])


def not_done(queue: WorkQueue, share: Path, applied_days: AppliedDays) -> str | None:
    """Why the share's plan is not done although Redis may say the queue is drained, in words; None when
    every day of the share's plan is in its run's newest checkpoint (or Redis holds it pending, leased or
    dead-lettered: the caller counts those). What `wait-drained` waits on, besides the queue's counts."""
    specs = live(share)
    if not specs:
        return None
    if not queue.seeded():
        return (f"the queue is empty and unseeded while the share records {len(specs)} run(s) (Redis lost its "
                "data?): a worker restores it from the share")
    lacking = gap(queue, share)
    if lacking.missing_items:  # a token counter behind alone leaves nothing untrained
        return (f"the queue lacks {len(lacking.missing_items)} item(s) of the share's plan "
                f"({_some(lacking.missing_items)}): a worker adds them")
    missing = unconfirmed(queue, share, applied_days)
    if missing:
        ids = [it.id for it in missing]
        return (f"Redis calls {len(ids)} day(s) done that their run's newest checkpoint on the share does not "
                f"record ({_some(ids)}): a worker trains them")
    return None
