"""The real `Worker`, run in this process against a real Redis server, with its phases timed.

Nothing in `workload/` knows it is being measured: the queue is a `WorkQueue` subclass that notes
when a claim that returned a lease started and when its ack finished, and the phases are timed by
wrapping the worker's collaborators (checkpoint store, dataset, trainer, metrics, report) for the
duration of the measurement. Times are exclusive: a checkpoint written from inside `train_shard`
counts as checkpointing, not training.
"""

from __future__ import annotations

import inspect
import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from workload.data.dataset import Dataset
from workload.model import calibration, lineage, metrics, report, trainer
from workload.model.trainer import HParams, Trainer
from workload.queue import plan
from workload.queue.workqueue import Item, Lease, WorkQueue, connect
from workload.runtime.redis_server import RedisServer
from workload.runtime.worker import Worker, WorkerConfig
from workload.share.checkpoint import CheckpointStore

# (owner, attribute, phase): what the worker does with an item besides claiming and acking it.
PHASES: list[tuple[Any, str, str]] = [
    (WorkQueue, "spec", "queue"),
    (CheckpointStore, "load", "load checkpoint"),
    (CheckpointStore, "save", "checkpoint"),
    (Dataset, "examples", "features"),
    (Dataset, "test_examples", "test features"),  # includes its own `examples` call
    (Trainer, "begin_shard", "statistics"),  # the day's rows into the normalisation statistics (float64, CPU)
    (Trainer, "train_shard", "training"),
    (Trainer, "score", "scoring"),
    (Trainer, "logits", "scoring"),  # calibration's fit scores the days it fits on
    (calibration, "refit", "calibration"),
    (calibration, "assess", "calibration"),
    (lineage.Lineage, "resume", "resume"),
    (lineage.LineageState, "of", "state copy"),
    (metrics, "evaluate", "metrics"),
    (report, "write", "report"),
]


@dataclass
class ItemTiming:
    item: str
    total_s: float  # claim call start -> ack return
    phases: dict[str, float]

    @property
    def training_s(self) -> float:
        return self.phases.get("training", 0.0)

    @property
    def overhead_s(self) -> float:
        return self.total_s - self.training_s


@dataclass
class PhaseClock:
    """Exclusive wall time per phase, for the item being processed."""

    totals: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    _stack: list[float] = field(default_factory=list)
    _inside_whole: int = 0  # > 0 while a phase that keeps its nested calls runs

    def timed(self, phase: str, fn: Callable[..., Any], whole: bool = False) -> Callable[..., Any]:
        """`fn`, timed as `phase`; a `whole` phase keeps the time of the phases it calls."""
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self._inside_whole:
                return fn(*args, **kwargs)
            self._inside_whole += whole
            self._stack.append(0.0)
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - started
                self._inside_whole -= whole
                self.totals[phase] += elapsed - self._stack.pop()
                if self._stack:
                    self._stack[-1] += elapsed
        return wrapper

    def take(self) -> dict[str, float]:
        out, self.totals = dict(self.totals), defaultdict(float)
        return out


class TimedQueue(WorkQueue):
    """A `WorkQueue` that records, per item, claim start to ack end and the phases in between."""

    def __init__(self, *args: Any, clock: PhaseClock, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.clock = clock
        self.items: list[ItemTiming] = []
        self._claimed: tuple[float, float] | None = None

    def claim(self, owner: str, ttl_s: float) -> Lease | None:
        started = time.perf_counter()
        lease = super().claim(owner, ttl_s)
        if lease is not None:
            self.clock.take()  # phases of this item start now
            self._claimed = (started, time.perf_counter() - started)
        return lease

    def ack(self, lease: Lease) -> bool:
        started = time.perf_counter()
        ok = super().ack(lease)
        ended = time.perf_counter()
        assert self._claimed is not None
        phases = {"claim": self._claimed[1], **self.clock.take(), "ack": ended - started}
        self.items.append(ItemTiming(item=lease.item.id, total_s=ended - self._claimed[0], phases=phases))
        return ok


@contextmanager
def instrumented(clock: PhaseClock, device: torch.device) -> Iterator[None]:
    """Wrap the worker's collaborators with `clock`, and pin the trainer's device, for a while."""
    # As defined (a classmethod stays one when put back), not as looked up (a bound method).
    saved = [(owner, attr, inspect.getattr_static(owner, attr)) for owner, attr, _ in PHASES]
    saved.append((trainer, "default_device", trainer.default_device))
    try:
        for owner, attr, phase in PHASES:
            setattr(owner, attr, clock.timed(phase, getattr(owner, attr), whole=attr == "test_examples"))
        trainer.default_device = lambda: device
        yield
    finally:
        for owner, attr, original in saved:
            setattr(owner, attr, original)


def seed(queue: WorkQueue, share: Path, dataset: str, runs: dict[str, HParams]) -> list[Item]:
    """What `python -m workload seed` does once the dataset and its features are on the share (see
    `seed` in workload/cli.py): record each run on the share (the truth a worker restores the queue from
    and checks its exit against), put its spec, enqueue every recorded run's days, mark the queue seeded.
    Returns the items of `runs`."""
    for run, hp in runs.items():
        plan.record(share, plan.RunSpec(run=run, dataset=dataset, hparams=hp.to_dict()))
        queue.put_spec(run, hp.to_dict())
    queue.enqueue(plan.items(share))
    queue.mark_seeded()
    return [it for it in plan.items(share) if it.run in runs]


def run_items(server: RedisServer, share: Path, prefix: str, run: str, hp: HParams, device: torch.device,
              dataset: str = "fraud", **config: Any) -> list[ItemTiming]:
    """Seed `run` over every training day of `dataset` as `seed` does, drain the queue with one in-process
    `Worker`, time each item. Runs seeded earlier on the same share and prefix are done already."""
    clock = PhaseClock()
    queue = TimedQueue(connect(server.url, server.password), prefix, clock=clock)
    items = seed(queue, share, dataset, {run: hp})
    cfg = WorkerConfig(share=share, redis_url=server.url, redis_password=server.password, prefix=prefix,
                       worker_id=f"bench-{prefix}", **config)
    with instrumented(clock, device):
        code = Worker(cfg, queue).run()
    if code != 0 or len(queue.items) != len(items):
        raise RuntimeError(f"in-process worker exited {code} after {len(queue.items)}/{len(items)} items")
    return queue.items


def run_sweep(server: RedisServer, share: Path, prefix: str, runs: dict[str, HParams], device: torch.device,
              rows: int, budget_s: float = math.inf, dataset: str = "fraud", **config: Any) -> tuple[int, float]:
    """(samples over all runs, seconds): the worker's packed path (`pack_runs` = the number of runs), claim to ack,
    training `runs` (seeded as `seed` does) on `dataset`'s one `rows`-row day as one stacked model; stopped as
    SIGTERM stops it (each run's final checkpoint, released) at the first step after `budget_s`. Samples are
    what each run's newest checkpoint records as trained."""
    queue = WorkQueue(connect(server.url, server.password), prefix)
    seed(queue, share, dataset, runs)
    cfg = WorkerConfig(share=share, redis_url=server.url, redis_password=server.password, prefix=prefix,
                       worker_id=f"bench-{prefix}", pack_runs=len(runs), **config)
    worker = Worker(cfg, queue)
    timer = threading.Timer(budget_s, worker.stop.set) if math.isfinite(budget_s) else None
    with instrumented(PhaseClock(), device):
        started = time.perf_counter()
        if timer:
            timer.start()
        code = worker.run()
        seconds = time.perf_counter() - started
    if timer:
        timer.cancel()
    if code not in (0, 143):
        raise RuntimeError(f"in-process packed worker exited {code}")
    samples = 0
    for run, hp in runs.items():
        found = CheckpointStore(share / "output" / run).load()
        steps = int(found.state["steps"]) if found else 0
        epochs, batch = divmod(steps, math.ceil(rows / hp.batch_size))
        samples += epochs * rows + min(batch * hp.batch_size, rows)
    return samples, seconds
