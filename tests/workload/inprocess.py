"""What the in-process worker tests share: a tiny dataset simulated once per process, one real Redis and one
share folder per test (`env`), seeded the way `python -m workload seed` does, and helpers to hold days back,
set the local time zone and let writes fail.

The fault tests (test_worker_faults.py, test_infra_faults.py) prove the worker under real signals, as
`python -m workload` subprocesses; mutation testing cannot see into those, so the test_worker_*_inprocess.py
files drive the same code in the pytest process. The dataset is tiny (three days of a few dozen rows) and a day
trains in one epoch, so each module runs in seconds.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workload.data import dataset as ds
from workload.data import simulator
from workload.data.manifest import write_manifest
from workload.model import plots
from workload.queue import plan
from workload.queue.workqueue import WorkQueue, connect
from workload.runtime.redis_server import RedisServer
from workload.runtime.worker import WorkerConfig
from workload.share.checkpoint import CheckpointStore
from workload.share.paths import METRICS_PNG

SPEC = simulator.SimulationSpec(customers=100, terminals=80, train_days=3, test_days=1, start_date="2018-04-01",
                                seed=11)
QUICK = {"epochs": 1, "batch_size": 256, "hidden": [8]}
assert plots  # matplotlib imported with the tests, not in each (mutation) run
DAYS = [f"training/2018-04-0{d}.parquet" for d in (1, 2, 3)]


_TMP = tempfile.TemporaryDirectory(prefix="worker-inprocess-")  # removed when the process ends


def _small_dataset() -> Path:
    """Three training days and one test day, features stored as seed stores them."""
    root = Path(_TMP.name) / "fraud"
    simulator.generate(root, SPEC)
    write_manifest(root)
    ds.Dataset(root).ensure_features()
    return root


# Made when the module is collected: mutation testing forks each mutant's run from a process that has
# collected the tests, so no run pays for the simulation again.
SMALL_DATASET = _small_dataset()


@dataclass
class Share:
    """One real Redis and one share folder, seeded in-process the way `python -m workload seed` does."""

    server: RedisServer
    share: Path
    src: Path

    def client_queue(self, retry_for_s: float = 5.0) -> WorkQueue:
        return WorkQueue(connect(self.server.url, self.server.password), retry_for_s=retry_for_s)

    def seed(self, runs: dict[str, dict] | None = None, queue: WorkQueue | None = None,
             drawn: bool = True) -> WorkQueue:
        """`drawn`: each run's pictures were just drawn (by a peer, say), so only a run's last day redraws
        them: drawing two PNGs costs more than training these days, and only the first test looks at them."""
        target = self.share / "datasets" / "fraud"
        if not target.exists():
            shutil.copytree(self.src, target)
        queue = queue or self.client_queue()
        for run, hp in (runs or {"main": QUICK}).items():
            plan.record(self.share, plan.RunSpec(run=run, dataset="fraud", hparams=hp))
            queue.put_spec(run, hp)
            if drawn:
                (self.share / "output" / run).mkdir(parents=True, exist_ok=True)
                (self.share / "output" / run / METRICS_PNG).touch()  # the worker reads only its age
        queue.enqueue(plan.items(self.share))
        queue.mark_seeded()
        return queue

    def config(self, **kw: object) -> WorkerConfig:
        base: dict[str, object] = dict(share=self.share, redis_url=self.server.url,
                                       redis_password=self.server.password, worker_id="w1", lease_ttl_s=10,
                                       checkpoint_interval_s=600, idle_poll_s=0.05, plot_interval_s=3600)
        return WorkerConfig(**{**base, **kw})  # type: ignore[arg-type]

    def state(self, run: str = "main") -> dict:
        loaded = CheckpointStore(self.share / "output" / run).load()
        assert loaded is not None, f"run {run} has no checkpoint"
        return loaded.state


def share_env(tmp_path: Path) -> Iterator[Share]:
    """Each test module's `env` fixture: a real Redis and a share folder under `tmp_path`, the server killed after."""
    server = RedisServer(tmp_path / "redis").start()
    share = tmp_path / "share"
    share.mkdir()
    try:
        yield Share(server, share, SMALL_DATASET)
    finally:
        server.kill()


def dead(queue: WorkQueue, run: str = "main") -> dict:
    return queue.snapshot()["runs"][run]["dead"]


@contextlib.contextmanager
def local_time_zone(name: str) -> Iterator[None]:
    """The process's local time zone set to `name` (TZ and tzset), restored after."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = name
    time.tzset()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = old
        time.tzset()


@contextlib.contextmanager
def writes_may_fail() -> Iterator[tuple[int, int]]:
    """SIGXFSZ ignored, so writes beyond RLIMIT_FSIZE fail with EFBIG instead of killing pytest; the limit
    and the handler are restored after. Yields the limit as it was."""
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        yield old_limit
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)


def withhold(env: Share, days: list[str], spec: simulator.SimulationSpec = SPEC) -> Callable[[str], None]:
    """The dataset published on the share without `days` (their files held back); the function returned
    publishes one of them late, as a backfill does (seed, given a new day, enqueues it)."""
    target = env.share / "datasets" / "fraud"
    simulator.generate(target, spec)
    held = {day: (target / day).read_bytes() for day in days}
    for day in days:
        (target / day).unlink()
    write_manifest(target)
    ds.Dataset(target).ensure_features()

    def publish(day: str) -> None:
        (target / day).write_bytes(held.pop(day))
        write_manifest(target)
        ds.Dataset(target).ensure_features()

    return publish


# -- the walk of one claimed day ---------------------------------------------------------------------------------------
PROTOCOL = ("workload.runtime.worker", "workload.runtime.steps")  # the loop and the protocol's steps
HOOKS = ("workload.core.faults",)  # fault-injection points: inert unless a fault test names one


def _getters() -> set[object]:
    """The code of every property of the workload's classes: reading `item.id` is not a stop of the walk."""
    codes: set[object] = set()
    for name, module in list(sys.modules.items()):
        if not name.startswith("workload.") or module is None:
            continue
        for cls in [v for v in vars(module).values() if isinstance(v, type) and v.__module__ == name]:
            for attr in vars(cls).values():
                fget = getattr(attr, "fget", None) or getattr(attr, "func", None)
                if fget is not None and hasattr(fget, "__code__"):
                    codes.add(fget.__code__)
    return codes


def walk(work: Callable[[], object]) -> list[str]:
    """The modules one claimed day's walk visits, as a reader follows it from `Worker.process` to the ack: each
    call that the loop or a protocol step (a function of worker.py or steps.py) makes into another workload module,
    in order, calls in a row into one module counted once. Property reads and the fault hooks are no stops."""
    getters, stops = _getters(), []

    def profile(frame: Any, event: str, _arg: object) -> None:
        caller = frame.f_back
        if event != "call" or caller is None or frame.f_code in getters:
            return
        module, by = frame.f_globals.get("__name__", ""), caller.f_globals.get("__name__", "")
        if by in PROTOCOL and module.startswith("workload.") and module not in PROTOCOL + HOOKS:
            if not stops or stops[-1] != module:
                stops.append(module)

    sys.setprofile(profile)
    try:
        work()
    finally:
        sys.setprofile(None)
    return stops


def returns(stops: list[str]) -> int:
    """How many times the walk comes back to a module it had left (each stop of a module seen before)."""
    return sum(1 for i, module in enumerate(stops) if module in stops[:i])
