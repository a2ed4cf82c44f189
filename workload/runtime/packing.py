"""A sweep's runs trained packed by one worker (issue 33): the items a packed claim leased (`WorkQueue.claim_also`:
one day of one dataset, each run's own lease), taken through the protocol of runtime/steps.py together.

Each run keeps everything the protocol gives a run alone: its lease, heartbeat and fencing token; steps 1-6 (fence,
load, rewind, resume, read) as `Attempt.prepare`; its own mid-day checkpoints (`PeriodicCheckpoints`, its slice of
the stacked state written back first); steps 8-11 (close the day, save and promote, report, ack) as
`Attempt.finish`. Only step 7 is shared: the runs whose stacked tensors agree (`packed.pack_key`: device, features,
widths, batch size) and that train the same rows (the same window of days) train as one `packed.Pack`; a run that
packs with none trains alone, as today. And the reads: runs of the same window read its days once, one set of arrays
for all (`Dataset.shared_reads`: step 6's window, step 8's calibration days), each run still folding them into its own
statistics and calibration. Whatever stops one run stops only that run: a lost lease (its
`after_step` says False, nothing of it is written after), an item fault (dead-lettered alone), an error (its
attempt alone). SIGTERM stops every run at the next step, each released; their final checkpoints share one budget
(`steps.StopBudget`): all of them must fit the grace period, not each one.

A packed run ends within `packed.SOLO_TOLERANCE` of its solo training (tests/model/test_packed.py); a run that
resumes from its checkpoint the same way (packed with the same runs, or alone after alone) ends bit for bit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field

from workload.model import packed
from workload.model.trainer import shard_seed
from workload.queue.workqueue import Lease
from workload.runtime.heartbeat import LeaseLost
from workload.runtime.steps import Attempt, Outcome, PeriodicCheckpoints, Ready, StopBudget

log = logging.getLogger(__name__)

Settle = Callable[[Lease, Exception], Outcome]  # the worker's classification of what stopped one item


@dataclass
class Member:
    """One run of the pack: its attempt (lease, heartbeat, store), what it trains, and how it ended."""

    attempt: Attempt
    ready: Ready
    outcome: Outcome | None = None
    error: Exception | None = field(default=None, repr=False)

    @property
    def day(self) -> str:
        return self.attempt.item.shard

    def key(self) -> tuple:
        """What a pack's runs must share: the stacked tensors' shapes and the rows they train (the window)."""
        t = self.ready.run.trainer
        return packed.pack_key(t), tuple(t.window(self.day))


def train_packed(attempts: list[Attempt], settle: Settle) -> list[Outcome]:
    """The leased items of one day, each through steps 1-6 alone, trained in packs, each through 8-11 alone;
    `settle` classifies what stopped one of them (the worker's rule). The outcomes, in `attempts`' order.
    Reads are shared (`Dataset.shared_reads`): runs of the same window read its days once, not once a run."""
    with ExitStack() as shared:
        for data in {id(a.dataset): a.dataset for a in attempts}.values():
            shared.enter_context(data.shared_reads())
        return _train_packed(attempts, settle)


def _train_packed(attempts: list[Attempt], settle: Settle) -> list[Outcome]:
    outcomes: dict[int, Outcome] = {}
    members: list[tuple[int, Member]] = []
    for i, attempt in enumerate(attempts):
        try:
            ready = attempt.prepare()
        except Exception as exc:  # noqa: BLE001 - classified by the worker, for this run alone
            outcomes[i] = settle(attempt.lease, exc)
            continue
        if isinstance(ready, Outcome):
            outcomes[i] = ready
        else:
            members.append((i, Member(attempt, ready)))
    budget = StopBudget(attempts[0].cfg.term_budget_s) if attempts else None  # one for every run, whatever its pack
    for group in groups([m for _, m in members]):
        train_group(group, budget)
    for i, m in members:
        outcomes[i] = m.outcome if m.outcome is not None else settle(m.attempt.lease, m.error or LeaseLost())
    return [outcomes[i] for i in range(len(attempts))]


def groups(members: list[Member]) -> list[list[Member]]:
    """Members that train as one stacked model, in claim order: one group per key."""
    by_key: dict[tuple, list[Member]] = {}
    for m in members:
        by_key.setdefault(m.key(), []).append(m)
    return list(by_key.values())


def train_group(group: list[Member], budget: StopBudget | None = None) -> None:
    """Step 7 for runs that pack, then steps 8-11 for each run that finished the day; each member's `outcome`
    (or `error`, for the worker to settle) is set. A run that packs with none trains alone, as today. After SIGTERM
    (`budget`: the final checkpoints of every run of the claim) a group not yet begun is given back untrained, and
    the stopped runs are released before any finished run's day is closed: a peer gets them at once."""
    if group[0].attempt.stop.is_set():
        for m in group:
            m.outcome = m.attempt.release_for_peer()
        return
    if len(group) == 1:
        train_alone(group[0], budget)
        return
    try:
        finished, train_s = train_together(group, budget)
    except Exception as exc:  # noqa: BLE001 - the pack's own failure (making it, training it) is every member's
        for m in group:
            m.error = m.error or exc
        return
    for m, done in zip(group, finished, strict=True):
        if m.error is None and not done:  # stopped by SIGTERM, its final checkpoint written: a peer resumes it
            m.outcome = m.attempt.release_for_peer()
    for m, done in zip(group, finished, strict=True):
        if m.error is not None or not done:
            continue
        try:
            m.outcome = m.attempt.finish(m.ready, train_s)
        except Exception as exc:  # noqa: BLE001 - classified by the worker, for this run alone
            m.error = exc


def train_together(group: list[Member], budget: StopBudget | None = None) -> tuple[list[bool], float]:
    """Step 7 for the group as one `packed.Pack`, each run with its own mid-day checkpoints (its slice of the
    stacked state written back first); whatever stops one run is kept as its `error`. Per run whether it
    finished the day, and the seconds the pack trained."""
    for m in group:
        m.ready.run.begin_day(m.day, m.ready.examples, m.ready.window, f"{m.attempt.item.id} (packed, {len(group)})")
    window = group[0].ready.window
    pack = packed.Pack([m.ready.run.trainer for m in group], shard_seed)
    budget = budget or StopBudget(group[0].attempt.cfg.term_budget_s)  # after SIGTERM: all the runs' final ones
    checkpoints = [PeriodicCheckpoints(m.attempt, m.ready.run, sync=lambda r=r: pack.trainer(r), budget=budget)
                   for r, m in enumerate(group)]

    def after_step(r: int) -> bool:
        try:
            return checkpoints[r].after_step()
        except Exception as exc:  # noqa: BLE001 - a lost lease or a failed save stops this run alone
            group[r].error = exc
            log.warning("%s stops, the other runs of its pack train on: %s", group[r].attempt.item.id,
                        type(exc).__name__)
            return False

    started = time.monotonic()
    finished = pack.train_shard(window.x, window.y, after_step)
    return finished, time.monotonic() - started


def train_alone(m: Member, budget: StopBudget | None = None) -> None:
    """Steps 7-11 of one run, exactly as `Attempt.run` takes them (its final checkpoint within `budget`)."""
    try:
        train_s = m.attempt.train(m.ready.run, m.ready.examples, m.ready.window, budget)
        m.outcome = m.attempt.release_for_peer() if train_s is None else m.attempt.finish(m.ready, train_s)
    except Exception as exc:  # noqa: BLE001 - classified by the worker
        m.error = exc
