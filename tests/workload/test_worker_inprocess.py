"""The worker driven in the pytest process, against a real Redis and real files on a share folder.

The fault tests (test_worker_faults.py, test_infra_faults.py) prove the worker under real signals,
as `python -m workload` subprocesses; mutation testing cannot see into those, so these tests drive
the same code here: exit codes, exactly-once and in-order application, acks only after promotion,
dead letters with their error, infrastructure faults that cost no attempt, heartbeats and lost
leases, hyperparameters from the share or Redis, a wiped queue restored from the share. The dataset
is tiny (three days of a few dozen rows) and a day trains in one epoch, so the module runs in seconds.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
import os
import re
import resource
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
import torch
from harness import poll_claim

from workload.core import faults
from workload.core.errors import EXIT_DEAD_LETTERS, EXIT_DONE, EXIT_INFRA, EXIT_TERMINATED, ItemFault, NonFinite
from workload.data import dataset as ds
from workload.data import features, simulator
from workload.data.dayfile import DatasetError
from workload.data.manifest import write_manifest
from workload.model import metrics, plots
from workload.model.hparams import HParams
from workload.model.lineage import Checkpoint, Lineage, checkpoint_of, trainer_from
from workload.model.report import rendered_from as report_source
from workload.model.trainer import Trainer
from workload.queue import plan
from workload.queue.workqueue import Item, QueueUnavailable, WorkQueue, connect
from workload.runtime.heartbeat import Heartbeat, LeaseLost
from workload.runtime.redis_server import RedisServer
from workload.runtime.steps import Attempt, Outcome
from workload.runtime.worker import Worker, WorkerConfig
from workload.share.checkpoint import CheckpointStore
from workload.share.paths import METRICS_PNG, PR_CURVE_PNG

pytestmark = pytest.mark.timeout(60)

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


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Share]:
    server = RedisServer(tmp_path / "redis").start()
    share = tmp_path / "share"
    share.mkdir()
    try:
        yield Share(server, share, SMALL_DATASET)
    finally:
        server.kill()


def dead(queue: WorkQueue, run: str = "main") -> dict:
    return queue.snapshot()["runs"][run]["dead"]


# -- the whole loop ------------------------------------------------------------------------------------
def test_every_day_is_applied_once_in_order_each_acked_after_its_promotion(env: Share) -> None:
    """A seeded queue: exit 0, the checkpoint records the days in order, the report and metrics are
    written (pictures after the run's last day), and each ack happens when the promoted checkpoint
    already records that day and no later one."""
    queue = env.seed(drawn=False)
    seen_at_ack: list[tuple[str, list[str]]] = []
    real_ack = queue.ack

    def observed_ack(lease):  # an observer on the real queue: what the share holds when the ack goes out
        seen_at_ack.append((lease.item.shard, list(env.state()["applied"])))
        return real_ack(lease)

    queue.ack = observed_ack  # type: ignore[method-assign]
    worker = Worker(env.config(), queue)
    started, wall = datetime.now(UTC).replace(microsecond=0), time.monotonic()
    with local_time_zone("Asia/Kolkata"):  # UTC+05:30: a local time in the history would show
        assert worker.run() == EXIT_DONE
    wall, ended = time.monotonic() - wall, datetime.now(UTC)
    assert seen_at_ack == [(d, DAYS[: i + 1]) for i, d in enumerate(DAYS)]
    state = env.state()
    assert state["run"] == "main"
    assert state["applied"] == DAYS and [h["shard"] for h in state["history"]] == DAYS
    assert state["progress"] is None
    c = queue.counts()
    assert (c.pending, c.leased, c.done, c.dead, c.total) == (0, 0, 3, 0, 3)
    run_dir = env.share / "output" / "main"
    report = (run_dir / "report.txt").read_text()
    assert report.count("training dataset: ") == 3
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["shard"] for m in lines] == DAYS
    data = ds.Dataset(env.share / "datasets" / "fraud")
    for entry, day in zip(state["history"], DAYS, strict=True):
        examples = data.examples([day])
        assert entry["train_rows"] == len(examples.y) > 0
        assert entry["train_frauds"] == int(examples.y.sum())
        assert entry["first_day"] == entry["last_day"] == day[9:19]
        assert 0 <= entry["train_seconds"] <= wall and 0 <= entry["train_accuracy"] <= 1
        assert type(entry["train_seconds"]) is float and entry["train_seconds"] == round(entry["train_seconds"], 3)
        when = datetime.strptime(entry["time"], "%Y-%m-%d %H:%M:%S UTC").replace(tzinfo=UTC)
        assert started <= when <= ended, (entry["time"], started, ended)
        assert entry["checkpoint"].startswith("ckpt-") and entry["checkpoint"].endswith(".pt")
        assert (run_dir / "checkpoints" / entry["checkpoint"]).exists() or entry is not state["history"][-1]
    assert (run_dir / METRICS_PNG).stat().st_size > 0, "the pictures are drawn"
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", h["time"]) for h in state["history"])
    seq, token = re.fullmatch(r"ckpt-(\d{8})-t(\d+)\.pt", state["history"][-1]["checkpoint"]).groups()
    assert report_source(run_dir) == (int(token), int(seq)), "the report names the checkpoint it shows"
    test = data.test_examples()
    scores = trainer_from(state).score(test.x)
    expected = metrics.evaluate(scores, test.y, test.day, test.card)
    assert {k: state["history"][-1][k] for k in expected} == pytest.approx(expected, nan_ok=True)
    assert Worker(env.config(worker_id="w2"), queue).run() == EXIT_DONE, "a drained queue: exit 0 at once"


def test_an_idle_worker_waits_for_a_leased_item_and_takes_it_when_the_lease_expires(env: Share) -> None:
    """Nothing pending, one item leased by a peer that then vanishes: no exit 0 (Kubernetes would start
    no other pod), the item is claimed after the lease expires and applied."""
    queue = env.seed()
    first = queue.claim("gone", ttl_s=30)
    assert first is not None and first.item.shard == DAYS[0]
    done = threading.Event()
    result: list[int] = []

    def run() -> None:
        result.append(Worker(env.config(), queue).run())
        done.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert not done.wait(0.8), f"exited {result} while a peer held a lease"
    # The peer dies: its lease expires (shortened here rather than waited for).
    queue.redis.zadd(queue.keys.leases, {"main": 0})
    assert done.wait(30), "the worker never took the expired lease"
    assert result == [EXIT_DONE]
    assert env.state()["applied"] == DAYS


# -- item faults: dead letters ------------------------------------------------------------------------------
def test_item_faults_are_dead_lettered_at_once_with_their_error(env: Share) -> None:
    """Bad hyperparameters on the share, and an item naming another dataset than its run's record: each
    is dead-lettered on its first attempt with a one-line error naming the fault; the good run trains;
    the worker exits 4."""
    queue = env.seed({"main": QUICK, "bad": {**QUICK, "epochs": 0}})
    shutil.copytree(env.src, env.share / "datasets" / "other")
    stray = Item(run="second", shard=DAYS[0], dataset="other", seq=0)
    queue.enqueue([stray])
    queue.put_spec("second", QUICK)
    plan.record(env.share, plan.RunSpec(run="second", dataset="fraud", hparams=QUICK))
    assert Worker(env.config(), queue).run() == EXIT_DEAD_LETTERS
    bad = dead(queue, "bad")
    assert set(bad) == {f"bad/{d}" for d in DAYS}
    for entry in bad.values():
        assert entry["attempts"] == 1
        assert entry["error"].startswith("run 'bad' hyperparameters: epochs") and "\n" not in entry["error"]
    entry = dead(queue, "second")[stray.id]
    assert entry["attempts"] == 1
    assert entry["error"] == (f"item {stray.id} names dataset 'other', but run 'second' trains on 'fraud' "
                              f"({env.share}/runs/second.json)")
    assert env.state()["applied"] == DAYS
    assert not (env.share / "output" / "bad" / "checkpoints").exists()


def test_hyperparameters_come_from_redis_when_the_share_has_no_record(env: Share) -> None:
    """An older queue: the run is not recorded on the share; Redis's spec trains it. A run with neither
    is dead-lettered with the reason, unquoted."""
    queue = env.seed()
    shutil.rmtree(env.share / "runs")
    queue.put_spec("legacy", {**QUICK, "hidden": [4]})
    queue.enqueue([Item(run="legacy", shard=DAYS[0], dataset="fraud", seq=0),
                   Item(run="nospec", shard=DAYS[0], dataset="fraud", seq=0)])
    worker = Worker(env.config(), queue)
    assert worker.run() == EXIT_DEAD_LETTERS
    assert env.state("legacy")["hparams"]["hidden"] == [4]
    assert env.state("main")["hparams"]["hidden"] == [8]
    entry = dead(queue, "nospec")[f"nospec/{DAYS[0]}"]
    assert entry["error"] == "run 'nospec' has no hyperparameters in Redis (seed it first)"


def test_a_share_record_wins_over_redis_for_hyperparameters(env: Share) -> None:
    queue = env.seed({"main": {**QUICK, "hidden": [6]}})
    queue.redis.hset(queue.keys.specs, "main", json.dumps({**QUICK, "hidden": [5]}))
    lease = queue.claim("w1", 10)
    assert lease is not None
    assert Worker(env.config(), queue).hparams(lease) == HParams.from_dict({**QUICK, "hidden": [6]})


def test_a_checkpoint_of_other_features_is_refused_permanently(env: Share) -> None:
    """A run whose checkpoint was trained on other features cannot warm-start: dead-lettered, nothing promoted."""
    queue = env.seed()
    assert Worker(env.config(), queue).process(queue.claim("w1", 10)) is Outcome.DONE
    store = CheckpointStore(env.share / "output" / "main")
    loaded = store.load()
    state = {**loaded.state, "feature_version": "v0-old"}
    token = loaded.token + 100
    queue.raise_token(token)
    assert store.save(state, path=store.next_path(loaded.token), may_promote=lambda: True, boundary=True) is not None
    lease = queue.claim("w1", 10)
    assert Worker(env.config(), queue).process(lease) is Outcome.FAILED
    entry = dead(queue)[lease.item.id]
    assert entry["attempts"] == 1
    assert "version 'v0-old'" in entry["error"] and entry["error"].endswith(": start a new run")
    assert f"version {features.FEATURE_VERSION!r}" in entry["error"]


def test_check_finite_names_what_is_not_finite() -> None:
    hp = HParams.from_dict(QUICK)
    trainer = Trainer("main", hp, features.FEATURE_NAMES, feature_version=features.FEATURE_VERSION)
    Lineage(trainer).check_finite("main/x", loss=0.5, scores=np.array([0.1, 0.9]))
    Lineage(trainer).check_finite("main/x")
    with pytest.raises(NonFinite, match=r"^main/x: the training loss is inf; nothing was promoted$"):
        Lineage(trainer).check_finite("main/x", loss=math.inf)
    with pytest.raises(NonFinite, match=r"^main/x: the training loss is nan"):
        Lineage(trainer).check_finite("main/x", loss=math.nan)
    with pytest.raises(NonFinite, match=r"^main/x: the model's test scores are non-finite \(NaN or infinity\); "
                       r"nothing was promoted: check the test days' data for extreme values$"):
        Lineage(trainer).check_finite("main/x", scores=np.array([0.1, np.nan]))
    with torch.no_grad():
        next(iter(trainer.averaged.parameters())).view(-1)[0] = math.inf
    with pytest.raises(NonFinite, match=r"^main/x: training produced non-finite averaged weights "):
        Lineage(trainer).check_finite("main/x")
    trainer = Trainer("main", hp, features.FEATURE_NAMES, feature_version=features.FEATURE_VERSION)
    with torch.no_grad():
        next(iter(trainer.model.parameters())).view(-1)[0] = math.nan
    with pytest.raises(NonFinite, match=r"^main/x: training produced non-finite weights "):
        Lineage(trainer).check_finite("main/x")
    trainer = Trainer("main", hp, features.FEATURE_NAMES, feature_version=features.FEATURE_VERSION)
    key, value = next(iter(trainer.norm.state().items()))
    value.view(-1)[0] = math.nan
    trainer.norm.load({**trainer.norm.state(), key: value})
    with pytest.raises(NonFinite, match=rf"^main/x: training produced non-finite feature normaliser {key} "):
        Lineage(trainer).check_finite("main/x")


@pytest.mark.parametrize("interval_s", [0.001, 600], ids=["at-a-mid-day-checkpoint", "at-the-end-of-the-day"])
def test_a_day_that_trains_to_nan_is_dead_lettered_and_nothing_is_promoted(env: Share, interval_s: float) -> None:
    """A lineage whose weights went non-finite: the next day trains to NaN, is dead-lettered with the
    reason (found before a mid-day checkpoint, or at the end of the day), and no checkpoint of that day
    is promoted."""
    queue = env.seed()
    assert Worker(env.config(), queue).process(queue.claim("w1", 10)) is Outcome.DONE
    store = CheckpointStore(env.share / "output" / "main")
    loaded = store.load()
    model = {k: v.clone() for k, v in loaded.state["model"].items()}
    next(iter(model.values())).view(-1)[0] = math.nan
    assert store.save({**loaded.state, "model": model}, path=store.next_path(loaded.token),
                      may_promote=lambda: True, boundary=True) is not None
    files = set((store.dir).glob("ckpt-*.pt"))
    lease = queue.claim("w1", 10)
    assert Worker(env.config(checkpoint_interval_s=interval_s), queue).process(lease) is Outcome.FAILED
    entry = dead(queue)[lease.item.id]
    assert entry["attempts"] == 1 and entry["error"].startswith(f"{lease.item.id}: training produced non-finite ")
    assert "nothing was promoted" in entry["error"]
    assert set(store.dir.glob("ckpt-*.pt")) == files, "no mid-day checkpoint of NaN weights either"
    assert store.load().state["applied"] == DAYS[:1]


@pytest.mark.parametrize(("weights", "scale", "error"), [
    ("model", 1e19, "the training loss is inf; nothing was promoted"),
    ("averaged", 1e30, "the model's test scores are non-finite (NaN or infinity); nothing was promoted"),
], ids=["loss-overflows", "test-scores-overflow"])
def test_finite_but_huge_weights_that_overflow_are_dead_lettered(env: Share, weights: str, scale: float,
                                                                  error: str) -> None:
    """Weights that are finite but huge (a lineage gone astray): the raw ones overflow the day's loss to
    infinity, though every weight stays finite (its gradient is bounded); the averaged ones, which score,
    overflow the test scores. Each is caught on its own and dead-lettered; nothing is promoted."""
    queue = env.seed()
    assert Worker(env.config(), queue).process(queue.claim("w1", 10)) is Outcome.DONE
    store = CheckpointStore(env.share / "output" / "main")
    loaded = store.load()
    huge = {k: v.clone() * scale for k, v in loaded.state[weights].items()}
    assert store.save({**loaded.state, weights: huge}, path=store.next_path(loaded.token),
                      may_promote=lambda: True, boundary=True) is not None
    lease = queue.claim("w1", 10)
    assert Worker(env.config(), queue).process(lease) is Outcome.FAILED
    entry = dead(queue)[lease.item.id]
    assert entry["attempts"] == 1 and entry["error"].startswith(f"{lease.item.id}: {error}"), entry["error"]
    assert store.load().state["applied"] == DAYS[:1]


def test_a_checkpoint_that_does_not_load_costs_one_attempt_and_is_retried(env: Share) -> None:
    """An error that is neither the item's nor the platform's (here a checkpoint missing a layer): one
    attempt is charged, with the error, and the item goes back to pending for a retry."""
    queue = env.seed()
    assert Worker(env.config(), queue).process(queue.claim("w1", 10)) is Outcome.DONE
    store = CheckpointStore(env.share / "output" / "main")
    loaded = store.load()
    model = dict(loaded.state["model"])
    model.pop(next(iter(model)))
    assert store.save({**loaded.state, "model": model}, path=store.next_path(loaded.token),
                      may_promote=lambda: True, boundary=True) is not None
    lease = queue.claim("w1", 10)
    assert Worker(env.config(), queue).process(lease) is Outcome.FAILED
    snap = queue.snapshot()["runs"]["main"]
    assert snap["attempts"] == {lease.item.id: 1} and not snap["dead"]
    assert snap["errors"][lease.item.id].startswith("RuntimeError: "), snap["errors"]
    assert lease.item.id in snap["pending"]


def test_a_worker_frozen_past_its_lease_promotes_nothing(env: Share) -> None:
    """Lease 1 expires and a peer takes the day (lease 2) before lease 1's holder starts; its heartbeat
    has not noticed. Nothing of lease 1's is promoted, the peer applies the day; lease 1's holder,
    waking again once the peer has fenced the run, gives up without touching the queue's token."""
    queue = env.seed()
    stale = queue.claim("stale", ttl_s=0.2)
    time.sleep(0.4)
    fresh = poll_claim(queue, "peer", ttl_s=30)
    assert fresh.item == stale.item and fresh.token > stale.token
    worker = Worker(env.config(worker_id="stale", lease_ttl_s=30, heartbeat_s=10), queue)
    assert worker.process(stale) is Outcome.LOST
    ckpts = env.share / "output" / "main" / "checkpoints"
    assert not list(ckpts.glob(f"ckpt-*-t{stale.token}.pt"))
    assert not (env.share / "output" / "main" / "report.txt").exists()
    assert Worker(env.config(worker_id="peer"), queue).process(fresh) is Outcome.DONE
    token = int(queue.redis.get(queue.keys.token))
    assert worker.process(stale) is Outcome.LOST
    assert int(queue.redis.get(queue.keys.token)) == token
    assert env.state()["applied"] == [stale.item.shard]


def test_a_report_from_a_checkpoint_a_newer_lease_superseded_is_not_written(env: Share) -> None:
    """The lease still confirms, but a newer lease (a higher token) has promoted a checkpoint of the run
    since: the report is that lease's to render. Ours raises LeaseLost and leaves report.txt alone."""
    queue = env.seed()
    worker = Worker(env.config(), queue)
    assert worker.process(queue.claim("w1", 10)) is Outcome.DONE
    store = CheckpointStore(env.share / "output" / "main")
    ours = store.load()
    lease = queue.claim("w1", 10)
    assert store.save(ours.state, path=store.next_path(lease.token + 1), may_promote=lambda: True,
                      boundary=True) is not None
    report = env.share / "output" / "main" / "report.txt"
    report.write_text("the newer lease's report\n")
    beat = Heartbeat(queue, lease, ttl_s=10, interval_s=1)
    assert beat.confirm(), "our lease still holds"
    with pytest.raises(LeaseLost):
        attempt = Attempt(worker.cfg, queue, lease, beat, worker.dataset("fraud"), worker.hparams(lease),
                          touch=worker.touch, stop=worker.stop)
        attempt.report(Checkpoint.of(ours), Lineage(trainer_from(ours.state)), draw=False)
    assert report.read_text() == "the newer lease's report\n"


def test_a_stopped_heartbeat_beats_no_more_though_its_lease_still_holds(env: Share) -> None:
    """Heartbeat.run in the caller's thread, stopped before it starts: it returns at once, without a beat,
    although the lease is not lost (the loop ends on stop *or* loss, not only on both)."""
    queue = env.seed()
    beat = Heartbeat(queue, queue.claim("w1", 10), ttl_s=10, interval_s=0.01)
    beats, renew = [], beat.beat

    def counted() -> bool | None:
        beats.append(time.monotonic())
        if len(beats) == 3:
            beat.lost.set()  # ends a loop that would not stop by itself
        return renew()

    beat.beat = counted
    beat.stop()
    beat.run()
    assert beats == [] and not beat.lost.is_set()
    assert beat.confirm(), "the lease is still ours"


@pytest.mark.parametrize("run", ["a/b", "..", "/etc"])
def test_the_worker_refuses_a_bad_run_name_on_its_own_as_an_item_fault(env: Share, run: str) -> None:
    """The second layer, without the claim-time check in front of it: a run name that cannot name a folder
    on the share is an item fault (dead-lettered at once, not retried), named by the rule."""
    queue = env.seed()
    lease = queue.claim("w1", 10)
    bad = dataclasses.replace(lease, item=dataclasses.replace(lease.item, run=run))
    beat = Heartbeat(queue, lease, ttl_s=10, interval_s=1)
    with pytest.raises(ItemFault, match=rf"^run {re.escape(repr(run))} is not allowed: use "):
        Worker(env.config(), queue)._apply(bad, beat)
    assert {p.name for p in (env.share / "output").iterdir()} == {"main"}, "nothing written for the bad run"


def test_a_checkpoint_mid_way_through_another_day_is_not_resumed_from(env: Share) -> None:
    """Day 2 was checkpointed mid-way, then dead-lettered, and the run moved on: day 3 warm-starts from the
    last day boundary (the model after day 1), bit for bit, not from half of day 2."""
    queue = env.seed({"main": {**QUICK, "batch_size": 8}})
    worker = Worker(env.config(), queue)
    assert worker.process(queue.claim("w1", 10)) is Outcome.DONE
    store = CheckpointStore(env.share / "output" / "main")
    boundary = store.load()
    data = ds.Dataset(env.share / "datasets" / "fraud")
    day2, day3 = data.examples([DAYS[1]]), data.examples([DAYS[2]])
    lease = queue.claim("w1", 10)
    half = trainer_from(copy.deepcopy(boundary.state))  # training updates the optimizer's tensors in place
    half.begin_shard(DAYS[1], day2.x)
    assert not half.train_shard(day2.x, day2.y, lambda: False), "stopped after its first batch"
    assert store.save(checkpoint_of(half), path=store.next_path(lease.token), may_promote=lambda: True,
                      boundary=False) is not None
    assert queue.release(lease, error="a bad day", permanent=True) == "dead"
    lease = queue.claim("w1", 10)
    assert lease.item.shard == DAYS[2]
    assert worker.process(lease) is Outcome.DONE
    state = env.state()
    assert state["applied"] == [DAYS[0], DAYS[2]] and state["progress"] is None
    assert state["history"][-1]["checkpoint"].startswith("ckpt-00000003-"), "day 3: no mid-day checkpoint"
    expected = trainer_from(boundary.state)
    window = data.examples(expected.window(DAYS[2]))  # day 1 (the boundary's lineage), then day 3: not day 2
    assert expected.window(DAYS[2]) == [DAYS[0], DAYS[2]]
    expected.begin_shard(DAYS[2], day3.x)
    assert expected.train_shard(window.x, window.y, lambda: True)
    got = trainer_from(state).model.state_dict()
    assert all(torch.equal(got[k], v) for k, v in expected.model.state_dict().items())


# -- infrastructure faults ----------------------------------------------------------------------------
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


def test_a_full_disk_costs_no_attempt_backs_off_and_exits_3(env: Share, caplog: pytest.LogCaptureFixture) -> None:
    """Writes beyond RLIMIT_FSIZE fail with EFBIG (SIGXFSZ ignored): every checkpoint write fails. The
    item is released at no cost each time, the worker backs off and exits 3 once the fault has lasted
    infra_give_up_s; nothing is dead-lettered and nothing promoted."""
    queue = env.seed()
    calls: list[float] = []
    worker = Worker(env.config(infra_give_up_s=0.6, infra_backoff_s=0.2), queue)
    real = worker.process

    def observed(lease):
        calls.append(time.monotonic())
        return real(lease)

    worker.process = observed  # type: ignore[method-assign]
    with writes_may_fail() as old_limit:
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, old_limit[1]))
        code = worker.run()
    assert code == EXIT_INFRA
    # What the operator reads as the worker exits 3: how long, and the last fault with its item and errno.
    assert any(r.message.startswith("infrastructure fault for ") and ", giving up: main/training/2018-04-0" in r.message
               and "EFBIG" in r.message for r in caplog.records), [r.message for r in caplog.records]
    snap = queue.snapshot()["runs"]["main"]
    assert not snap["dead"] and not snap.get("attempts"), snap
    c = queue.counts()
    assert (c.pending, c.leased, c.done, c.dead) == (3, 0, 0, 0)
    assert CheckpointStore(env.share / "output" / "main").load() is None
    gaps = [b - a for a, b in zip(calls, calls[1:], strict=False)]
    assert len(calls) >= 2 and gaps[0] >= 0.2, f"no back-off between attempts: {gaps}"
    if len(gaps) > 1:
        assert gaps[1] >= 0.4, f"the back-off doubles: {gaps}"


def test_a_success_between_infrastructure_faults_starts_the_give_up_clock_again(env: Share) -> None:
    """Disk full, then a day that succeeds (and takes longer than infra_give_up_s), then disk full again:
    the success proves the platform recovered, so the new fault gets its own give-up window (more tries)
    instead of exiting 3 at once."""
    queue = env.seed()
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    worker = Worker(env.config(infra_give_up_s=0.5, infra_backoff_s=0.2), queue)
    real = worker.process
    outcomes: list[Outcome] = []

    def observed(lease):
        healthy = len(outcomes) == 1  # the second try finds the disk fixed, the others full
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit if healthy else (2048, old_limit[1]))
        outcomes.append(real(lease))
        if healthy:
            time.sleep(0.6)  # a long day: past infra_give_up_s since the first fault
        return outcomes[-1]

    worker.process = observed  # type: ignore[method-assign]
    with writes_may_fail():
        code = worker.run()
    assert code == EXIT_INFRA
    assert outcomes[:3] == [Outcome.INFRA, Outcome.DONE, Outcome.INFRA] and len(outcomes) >= 4, outcomes
    assert not queue.snapshot()["runs"]["main"]["attempts"]


def test_the_back_off_doubles_until_the_fault_has_lasted_too_long_and_success_resets_it(env: Share) -> None:
    worker = Worker(env.config(infra_give_up_s=0.5, infra_backoff_s=0.2), env.client_queue())
    waits = []
    for _ in range(2):
        started = time.monotonic()
        assert worker._back_off() is None
        waits.append(time.monotonic() - started)
    assert waits[0] >= 0.2 and waits[1] >= 0.4, waits
    started = time.monotonic()
    assert worker._back_off() == EXIT_INFRA, "0.6 s after the first fault, past 0.5 s: give up"
    assert time.monotonic() - started < 0.35, "giving up does not wait first"


def test_the_back_off_is_capped_at_30_seconds(env: Share) -> None:
    worker = Worker(env.config(infra_give_up_s=1000, infra_backoff_s=5), env.client_queue())
    worker.stop.set()  # waits return at once; the next pause is what is left
    worker._back_off()
    assert worker._infra_backoff == 10.0, "each pause doubles the last"
    worker._back_off()
    assert worker._infra_backoff == 20.0
    worker._back_off()
    assert worker._infra_backoff == 30.0
    worker._back_off()
    assert worker._infra_backoff == 30.0


def test_a_dataset_folder_that_leads_outside_the_share_is_refused(env: Share, tmp_path: Path) -> None:
    env.seed()
    outside = tmp_path / "elsewhere"
    shutil.copytree(env.src, outside)
    (env.share / "datasets" / "sneaky").symlink_to(outside)
    worker = Worker(env.config(), env.client_queue())
    with pytest.raises(DatasetError, match=r"^dataset name 'sneaky' is not a folder name under "):
        worker.dataset("sneaky")
    assert worker.dataset("fraud") is worker.dataset("fraud"), "a dataset is opened once"
    for name in ("..", "a/b", ""):
        with pytest.raises(DatasetError, match=rf"^dataset {name!r} is not allowed: use "):
            worker.dataset(name)


# -- leases and heartbeats -------------------------------------------------------------------------------
def beat_for(beat: Heartbeat, seconds: float) -> None:
    """Run the beat loop in the test's own thread (its calls are the test's, for tracebacks and coverage) until
    a timer stops it after `seconds`."""
    stopper = threading.Timer(seconds, beat.stop)
    stopper.start()
    beat.run()
    stopper.join()


def test_heartbeats_keep_a_short_lease_alive_and_notice_a_takeover(env: Share) -> None:
    queue = env.seed()
    lease = queue.claim("w1", ttl_s=0.6)
    beat = Heartbeat(queue, lease, ttl_s=0.6, interval_s=0.15)
    beat_for(beat, 1.5)  # two TTLs
    assert queue.holds(lease) and not beat.lost.is_set(), "renewed past two TTLs"
    time.sleep(0.8)
    peer = poll_claim(queue, "w2", ttl_s=10)
    assert peer is not None and peer.item == lease.item
    assert beat.beat() is False and beat.lost.is_set()
    assert beat.confirm() is False


def test_a_heartbeat_rides_out_a_redis_restart_while_the_lease_is_valid(env: Share) -> None:
    queue = env.seed()
    lease = queue.claim("w1", ttl_s=5)
    beat = Heartbeat(queue, lease, ttl_s=5, interval_s=1)
    assert beat.beat() is True
    env.server.kill()
    assert beat.beat() is None and not beat.lost.is_set(), "Redis silent, lease still valid: not lost"
    env.server.start()  # same port and data (append-only file): the lease is still there
    assert beat.confirm() is True, "ownership confirmed once Redis is back"
    assert not beat.lost.is_set()


def test_a_heartbeat_without_redis_loses_the_lease_when_its_validity_runs_out(env: Share) -> None:
    queue = env.seed()
    lease = queue.claim("w1", ttl_s=0.5)
    beat = Heartbeat(queue, lease, ttl_s=0.5, interval_s=0.1)
    env.server.kill()
    started = time.monotonic()
    assert beat.confirm() is False and beat.lost.is_set()
    assert time.monotonic() - started < 3
    beat.lost.clear()
    stopper = threading.Timer(3, beat.stop)  # a bound, should the loop never see the lease lost
    stopper.start()
    beat.run()
    stopper.cancel()
    assert beat.lost.is_set(), "the beat loop gives up too"


class _WatchedHeartbeat(Heartbeat):
    """The real heartbeat, noting each beat's end and answer; `on_miss` runs after a beat Redis did not answer,
    so a test can bring Redis back at a known moment instead of racing the beats with a timer."""

    def __init__(self, *args: object, on_miss: object = None, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.beats: list[tuple[float, bool | None]] = []
        self.on_miss = on_miss

    def beat(self) -> bool | None:
        ok = super().beat()
        self.beats.append((time.monotonic(), ok))
        if ok is None and callable(self.on_miss):
            self.on_miss()
        return ok


def test_confirm_rides_out_an_outage_shorter_than_the_lease_and_answers_soon_after_redis_is_back(env: Share) -> None:
    """Redis comes back right after confirm()'s first unanswered beat (restarted in this thread: a server
    started from another thread dies with that thread, RedisServer asks for PR_SET_PDEATHSIG, which follows
    the starting thread). confirm() tries again within 0.2 s, so it proves ownership well inside the lease."""
    queue = env.seed()
    lease = queue.claim("w1", ttl_s=5)
    back: list[float] = []

    def restart() -> None:
        if not back:
            env.server.start()
            back.append(time.monotonic())

    beat = _WatchedHeartbeat(queue, lease, ttl_s=5, interval_s=1, on_miss=restart)
    env.server.kill()
    assert beat.confirm() is True, "the lease outlived the outage: ownership confirmed"
    answered = time.monotonic()
    assert back and [ok for _, ok in beat.beats] == [None, True]
    assert answered - back[0] < 0.7, f"confirmed {answered - back[0]:.2f}s after Redis was back (retries every 0.2 s)"
    assert not beat.lost.is_set() and queue.holds(lease)


def test_confirm_keeps_trying_until_the_lease_runs_out_and_answers_false_soon_after(env: Share) -> None:
    """Redis stays down past the lease: confirm() retries while the lease may still be ours (giving it up
    earlier would throw away valid work), and answers False soon after its validity has run out."""
    queue = env.seed()
    lease = queue.claim("w1", ttl_s=1.5)
    env.server.kill()
    started = time.monotonic()
    beat = _WatchedHeartbeat(queue, lease, ttl_s=1.5, interval_s=0.5)
    assert beat.confirm() is False and beat.lost.is_set()
    took = time.monotonic() - started
    assert took >= 1.5, f"gave the lease up after {took:.2f}s, while it was still valid"
    # One unanswered beat costs the client's own retries (about 0.7 s), then confirm() waits 0.2 s at most.
    assert took < 3.0, f"answered {took - 1.5:.2f}s after the lease ran out"
    assert len(beat.beats) >= 2 and beat.beats[0][1] is None, "tried again while the lease was valid"


def test_the_beat_loop_retries_a_missed_beat_within_half_a_second_and_keeps_the_lease(env: Share) -> None:
    """The loop as Worker.process runs it, in its own thread: a beat Redis did not answer is retried every
    0.5 s (not one interval later, when the lease may have run out), so the lease is renewed as soon as Redis
    is back and stays ours; stop() ends the loop, and the thread never holds the process's exit up."""
    queue = env.seed()
    lease = queue.claim("w1", ttl_s=5)
    missed = threading.Event()
    beat = _WatchedHeartbeat(queue, lease, ttl_s=5, interval_s=1.2, on_miss=missed.set)
    env.server.kill()
    beat.start()
    try:
        assert beat.daemon, "a daemon: a worker whose main thread has finished exits without waiting for a beat"
        assert missed.wait(5), "the loop beat within its interval"
        env.server.start()  # here: a server started from the heartbeat's thread would die with it
        back = time.monotonic()
        deadline = back + 3
        while not any(ok for at, ok in beat.beats if at > back) and time.monotonic() < deadline:
            time.sleep(0.02)
        renewed = [at for at, ok in beat.beats if ok and at > back]
        assert renewed, f"no renewal in 3 s after Redis was back: {beat.beats}"
        assert renewed[0] - back < 0.9, f"renewed {renewed[0] - back:.2f}s after Redis was back (retry every 0.5 s)"
        assert not beat.lost.is_set() and queue.holds(lease)
    finally:
        beat.stop()
        beat.join(3)
    assert not beat.is_alive(), "stop() ends the loop"


def test_the_beat_loop_renews_the_lease_once_an_interval(env: Share) -> None:
    queue = env.seed()
    lease = queue.claim("w1", ttl_s=10)
    beat = _WatchedHeartbeat(queue, lease, ttl_s=10, interval_s=0.1)
    beat_for(beat, 1.05)
    assert all(ok for _, ok in beat.beats)
    assert 7 <= len(beat.beats) <= 10, f"{len(beat.beats)} renewals in 1 s at a 0.1 s interval"


def test_the_watchdog_gives_the_lease_up_at_no_cost_and_exits_5(env: Share, monkeypatch: pytest.MonkeyPatch) -> None:
    """No progress for stall_s: the lease is released (no attempt charged) and the process exits 5.
    os._exit is recorded here instead of ending pytest (test_infra_faults.py proves the real exit)."""
    queue = env.seed()
    lease = queue.claim("w1", ttl_s=10)
    exits: list[int] = []
    monkeypatch.setattr(os, "_exit", lambda code: exits.append(code))
    stuck_since = time.monotonic()
    beat = Heartbeat(queue, lease, ttl_s=10, interval_s=0.1, progress=lambda: stuck_since, stall_s=0.3)
    stopper = threading.Timer(5, beat.stop)  # a bound; the loop ends by itself once the lease is released
    stopper.start()
    beat.run()  # in the test's thread: the recorded os._exit returns, and the next beat finds the lease gone
    stopper.cancel()
    assert exits and exits[0] == 5
    assert time.monotonic() - stuck_since >= 0.3
    c = queue.counts()
    assert (c.pending, c.leased) == (3, 0)
    assert not queue.snapshot()["runs"]["main"].get("attempts")


def test_a_worker_stuck_in_a_read_gives_its_lease_up_and_exits_5(env: Share, monkeypatch: pytest.MonkeyPatch) -> None:
    """The day's read never returns (the `hang` fault: a hung share): the worker's watchdog sees no progress
    for stall_s, releases the lease at no cost and exits 5 (recorded here; the stuck thread stays stuck)."""
    queue = env.seed()
    exits: list[int] = []
    monkeypatch.setattr(os, "_exit", lambda code: exits.append(code))
    monkeypatch.setenv("WORKLOAD_FAULT", "read")
    monkeypatch.setenv("WORKLOAD_FAULT_ACTION", "hang")
    monkeypatch.setattr(faults, "_hits", {})
    worker = Worker(env.config(stall_s=0.5, heartbeat_s=0.1), queue)
    lease = queue.claim("w1", 10)
    threading.Thread(target=worker.process, args=(lease,), daemon=True).start()
    deadline = time.monotonic() + 10
    while not exits and time.monotonic() < deadline:
        time.sleep(0.05)
    assert exits == [5]
    c = queue.counts()
    assert (c.pending, c.leased) == (3, 0) and not queue.snapshot()["runs"]["main"]["attempts"]


def test_progress_keeps_the_watchdog_quiet(env: Share, monkeypatch: pytest.MonkeyPatch) -> None:
    queue = env.seed()
    lease = queue.claim("w1", ttl_s=10)
    exits: list[int] = []
    monkeypatch.setattr(os, "_exit", lambda code: exits.append(code))
    first = queue.redis.zscore(queue.keys.leases, "main")
    beat = Heartbeat(queue, lease, ttl_s=10, interval_s=0.1, stall_s=0.3)  # progress: now, always
    stopper = threading.Timer(0.8, beat.stop)
    stopper.start()
    beat.run()
    stopper.join()
    assert not exits and queue.holds(lease)
    assert queue.redis.zscore(queue.keys.leases, "main") > first, "the beats went on, extending the lease"


# -- fencing, restore, preemption ---------------------------------------------------------------------
def test_a_queue_behind_the_share_raises_its_token_and_the_applied_day_is_acked_not_retrained(env: Share,
                                                                                            tmp_path: Path) -> None:
    """Redis lost its data and was seeded again (not restored): the share holds a higher lease token than
    Redis hands out. The worker raises the counter, claims again, finds the day applied, re-renders the
    report and acks; nothing is trained twice."""
    queue = env.seed()
    for _ in range(2):
        assert Worker(env.config(), queue).process(queue.claim("w1", 10)) is Outcome.DONE
    high = CheckpointStore(env.share / "output" / "main").highest_token()
    queue.redis.flushall()
    queue = env.seed(queue=queue)
    lease = queue.claim("w1", 10)
    assert lease.token < high
    worker = Worker(env.config(), queue)
    assert worker.process(lease) is Outcome.RELEASED
    assert not queue.snapshot()["runs"]["main"].get("attempts")
    again = queue.claim("w1", 10)
    assert again.item == lease.item and again.token > high
    run_dir = env.share / "output" / "main"
    for name in ("report.txt", METRICS_PNG, PR_CURVE_PNG):
        (run_dir / name).unlink(missing_ok=True)
    assert worker.process(again) is Outcome.DONE
    assert (run_dir / "report.txt").exists(), "the report is re-rendered"
    # ...with its pictures, the precision-recall one drawn from the checkpoint's model on the test days
    state, test = env.state(), ds.Dataset(env.share / "datasets" / "fraud").test_examples()
    expected = tmp_path / "expected"
    plots.write_plots(expected, state["history"], metrics.pr_curve(trainer_from(state).score(test.x), test.y),
                      run="main", hparams=state["hparams"])
    assert (run_dir / PR_CURVE_PNG).read_bytes() == (expected / PR_CURVE_PNG).read_bytes()
    assert (run_dir / METRICS_PNG).stat().st_size > 0
    assert worker.run() == EXIT_DONE
    assert env.state()["applied"] == DAYS


def test_a_wiped_queue_is_restored_from_the_share(env: Share, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis lost everything: the worker refills the queue from the share (the applied day marked done,
    not retrained), finishes the run, redraws the pictures only for its last day, and exports the run to
    $OUTPUT_URI after acking that day."""
    queue = env.seed()
    worker = Worker(env.config(keep_checkpoints=1), queue)
    exported = tmp_path / "exported"
    monkeypatch.setenv("OUTPUT_URI", str(exported))
    png = env.share / "output" / "main" / METRICS_PNG
    assert worker.process(queue.claim("w1", 10)) is Outcome.DONE
    assert png.stat().st_size == 0 and not exported.exists(), "not the last day: no pictures, no export"
    queue.redis.flushall()
    assert worker.run() == EXIT_DONE
    assert png.stat().st_size > 0, "the run's last day redraws the pictures"
    last = png.parent / "checkpoints" / env.state()["history"][-1]["checkpoint"]
    assert png.stat().st_mtime_ns >= last.stat().st_mtime_ns, "...after that day's checkpoint, not before"
    jsonl = list(exported.rglob("metrics.jsonl"))
    assert len(jsonl) == 1 and len(jsonl[0].read_text().splitlines()) == len(DAYS), \
        "the run is exported once it is finished, with all its days"
    assert env.state()["applied"] == DAYS
    c = queue.counts()
    assert (c.done, c.total) == (3, 3)
    # One checkpoint kept, besides every day's boundary (a late day rewinds to it): the report names
    # each day's checkpoint as kept, and would say which ones the manifest no longer keeps.
    lines = [line for line in (png.parent / "report.txt").read_text().splitlines() if "model checkpoint:" in line]
    kept = CheckpointStore(png.parent, keep=1).retained()
    assert len(lines) == len(DAYS) and kept
    for line, entry in zip(lines, env.state()["history"], strict=True):
        assert line.endswith(entry["checkpoint"]) if entry["checkpoint"] in kept else \
            line.endswith(f"{entry['checkpoint']} (pruned: only the newest checkpoints are kept)"), line
    assert not any("pruned" in line for line in lines), "every day's boundary checkpoint is kept"


def test_a_queue_wiped_while_the_worker_runs_is_restored_from_the_share(env: Share) -> None:
    """The loop's own restore (run() reconciles once at its start; Redis may lose its data any time after): the
    applied day marked done, the others enqueued again, and the queue seeded; with no runs on the share, nothing."""
    queue = env.seed()
    worker = Worker(env.config(), queue)
    assert worker.process(queue.claim("w1", 10)) is Outcome.DONE
    queue.redis.flushall()
    assert not queue.seeded() and queue.counts().total == 0
    assert worker.restore()
    c = queue.counts()
    assert (c.done, c.pending, c.total) == (1, len(DAYS) - 1, len(DAYS)) and queue.seeded()
    empty = Share(env.server, env.share.parent / "empty-share", env.src)
    empty.share.mkdir()
    queue.redis.flushall()
    assert not Worker(empty.config(), empty.client_queue()).restore()
    assert queue.counts().total == 0


def test_a_queue_wiped_between_two_days_is_restored_by_the_loop_and_the_run_finishes(env: Share) -> None:
    """Redis loses everything right after the first day's ack, past the loop's opening reconcile: the loop finds
    the queue empty and unseeded, restores it from the share and goes on claiming (not stopping as if signalled):
    exit 0, every day applied once."""
    queue = env.seed()
    worker = Worker(env.config(), queue)
    real = worker.process
    wiped: list[str] = []

    def then_wiped(lease):
        outcome = real(lease)
        if not wiped:
            queue.redis.flushall()
            wiped.append(lease.item.shard)
        return outcome

    worker.process = then_wiped  # type: ignore[method-assign]
    assert worker.run() == EXIT_DONE
    assert wiped == [DAYS[0]]
    state = env.state()
    assert state["applied"] == DAYS and [h["shard"] for h in state["history"]] == DAYS, "day 1 not trained again"
    c = queue.counts()
    assert (c.pending, c.leased, c.done, c.total) == (0, 0, 3, 3) and queue.seeded()


def test_a_run_recorded_on_the_share_while_the_worker_runs_is_trained_before_it_exits(env: Share) -> None:
    """The queue drains, but the share's plan holds a run Redis lacks (recorded after the loop's opening
    reconcile: a Redis restored from an older snapshot looks the same): the loop adds it and trains it, and
    exits 0 only once the share's plan is done."""
    queue = env.seed()
    worker = Worker(env.config(), queue)
    real = worker.process

    def recording_a_run(lease):
        plan.record(env.share, plan.RunSpec(run="second", dataset="fraud", hparams=QUICK))
        return real(lease)

    worker.process = recording_a_run  # type: ignore[method-assign]
    assert worker.run() == EXIT_DONE
    assert env.state()["applied"] == env.state("second")["applied"] == DAYS
    c = queue.counts()
    assert (c.pending, c.leased, c.done, c.total) == (0, 0, 6, 6)


def test_a_share_plan_that_cannot_be_read_adds_nothing_and_a_drained_queue_exits_0(
        env: Share, caplog: pytest.LogCaptureFixture) -> None:
    """A run record on the share that is not one: reconcile names it, skips it (test_plan_stray.py) and reports
    nothing added (True would send the loop round again forever); the drained queue exits 0."""
    queue = env.seed()
    assert queue.mark_done(plan.items(env.share)) == len(DAYS)
    broken = env.share / "runs" / "broken.json"
    broken.write_text("{not json")
    worker = Worker(env.config(), queue)
    assert worker.reconcile() is False
    assert any(r.message.startswith(f"skipped, not a run: {broken}: not a run record")
               for r in caplog.records), [r.message for r in caplog.records]
    result: list[int] = []
    t = threading.Thread(target=lambda: result.append(worker.run()), daemon=True)
    t.start()
    t.join(10)
    worker.stop.set()  # a bound: a loop that went round forever ends here, with 143
    t.join(5)
    assert result == [EXIT_DONE]


def test_a_backfilled_day_rewinds_the_run_to_the_boundary_before_it_and_applies_the_later_days_again(
        env: Share) -> None:
    """The in-process twin of test_late_days.py: day 2 published after days 1 and 3 were applied. Its attempt goes
    back to the checkpoint that ends day 1, puts day 3 back to pending under its lease, and the run ends with every
    day applied once in date order, the rewind recorded with what it re-applied and from where."""
    target = env.share / "datasets" / "fraud"
    simulator.generate(target, SPEC)
    late = target / DAYS[1]
    held = late.read_bytes()
    late.unlink()
    write_manifest(target)
    ds.Dataset(target).ensure_features()
    queue = env.seed()
    worker = Worker(env.config(), queue)
    for _ in range(2):
        assert worker.process(queue.claim("w1", 10)) is Outcome.DONE
    assert env.state()["applied"] == [DAYS[0], DAYS[2]]
    boundary = env.state()["history"][0]["checkpoint"]
    late.write_bytes(held)
    write_manifest(target)
    ds.Dataset(target).ensure_features()
    queue.enqueue(plan.items(env.share))
    assert (queue.counts().pending, queue.counts().done) == (1, 2)

    assert worker.process(queue.claim("w1", 10)) is Outcome.DONE  # day 2, after rewinding
    state = env.state()
    assert state["applied"] == DAYS[:2]
    (record,) = state["reapplied"]
    assert {k: record[k] for k in ("day", "reapplied", "from", "why")} == {
        "day": DAYS[1], "reapplied": [DAYS[2]], "from": boundary,
        "why": f"{DAYS[1]} arrived after {DAYS[2]} was applied (a backfill or a requeued day)"}
    c = queue.counts()
    assert (c.pending, c.done, c.total) == (1, 2, 3), "day 3 is pending again, to follow day 2"
    assert worker.run() == EXIT_DONE
    state = env.state()
    assert state["applied"] == DAYS and [h["shard"] for h in state["history"]] == DAYS
    assert [r["day"] for r in state["reapplied"]] == [DAYS[1]]


def test_a_day_before_every_applied_one_rewinds_to_a_cold_start(env: Share) -> None:
    target = env.share / "datasets" / "fraud"
    simulator.generate(target, SPEC)
    first = target / DAYS[0]
    held = first.read_bytes()
    first.unlink()
    write_manifest(target)
    ds.Dataset(target).ensure_features()
    queue = env.seed()
    worker = Worker(env.config(), queue)
    assert worker.run() == EXIT_DONE
    first.write_bytes(held)
    write_manifest(target)
    ds.Dataset(target).ensure_features()
    queue.enqueue(plan.items(env.share))
    assert worker.process(queue.claim("w1", 10)) is Outcome.DONE
    assert env.state()["applied"] == DAYS[:1]
    assert env.state()["reapplied"][0]["from"] == "a cold start"
    assert env.state()["reapplied"][0]["reapplied"] == DAYS[1:]
    assert worker.run() == EXIT_DONE and env.state()["applied"] == DAYS


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


def test_every_rewind_of_a_lineage_is_recorded_in_utc_including_one_from_a_checkpoint_without_records(
        env: Share) -> None:
    """Days published newest first: day 3, then day 2, then day 1. Each late day rewinds the run to a cold start,
    and the lineage keeps every rewind's record, the first one's carried on by the second, each stamped with the
    UTC time it happened (the process's local zone is UTC+05:30 here). The first rewind starts from a checkpoint
    written before rewinds were recorded (no "reapplied" entry): it has none to carry on."""
    publish = withhold(env, DAYS[:2])
    queue = env.seed()
    worker = Worker(env.config(), queue)
    assert worker.run() == EXIT_DONE and env.state()["applied"] == [DAYS[2]]
    store = CheckpointStore(env.share / "output" / "main")
    loaded = store.load()
    older = {k: v for k, v in loaded.state.items() if k != "reapplied"}
    assert store.save(older, path=store.next_path(loaded.token), may_promote=lambda: True, boundary=True) is not None
    assert "reapplied" not in store.load().state

    def late(day: str) -> tuple[datetime, datetime]:
        publish(day)
        queue.enqueue(plan.items(env.share))
        started = datetime.now(UTC).replace(microsecond=0)
        with local_time_zone("Asia/Kolkata"):
            assert worker.run() == EXIT_DONE
        return started, datetime.now(UTC)

    first = late(DAYS[1])
    assert env.state()["applied"] == DAYS[1:]
    second = late(DAYS[0])
    state = env.state()
    assert state["applied"] == DAYS and [h["shard"] for h in state["history"]] == DAYS
    records = state["reapplied"]
    assert [{k: r[k] for k in ("day", "reapplied", "from", "why")} for r in records] == [
        {"day": DAYS[1], "reapplied": [DAYS[2]], "from": "a cold start",
         "why": f"{DAYS[1]} arrived after {DAYS[2]} was applied (a backfill or a requeued day)"},
        {"day": DAYS[0], "reapplied": DAYS[1:], "from": "a cold start",
         "why": f"{DAYS[0]} arrived after {DAYS[2]} was applied (a backfill or a requeued day)"}]
    for record, (started, ended) in zip(records, (first, second), strict=True):
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", record["time"]), record["time"]
        when = datetime.strptime(record["time"], "%Y-%m-%d %H:%M:%S UTC").replace(tzinfo=UTC)
        assert started <= when <= ended, (record["time"], started, ended)
    report = (env.share / "output" / "main" / "report.txt").read_text()
    assert [line for line in report.splitlines() if line.startswith("re-applied at ")] == [
        f"re-applied at {r['time']}: {', '.join(r['reapplied'])}, because {r['why']}; the run went back to "
        f"a cold start and applied {r['day']} and every later day in date order" for r in records]


DAYS4 = [f"training/2018-04-0{d}.parquet" for d in (1, 2, 3, 4)]


def test_a_late_day_whose_boundary_checkpoint_is_gone_is_dead_lettered_with_what_to_do(env: Share) -> None:
    """Four days, day 2 published after days 1, 3 and 4 were applied, and the checkpoint that ends day 1 removed
    from the share meanwhile (by hand, or by an older version's retention): the reports written since say it was
    pruned, and day 2, which cannot rewind to it, is dead-lettered at once with what to do; the run is untouched."""
    publish = withhold(env, [DAYS4[1]], dataclasses.replace(SPEC, train_days=4))
    queue = env.seed()
    worker = Worker(env.config(), queue)
    for _ in range(2):
        assert worker.process(queue.claim("w1", 10)) is Outcome.DONE
    store = CheckpointStore(env.share / "output" / "main")
    assert store.load().state["applied"] == [DAYS4[0], DAYS4[2]]
    gone = store.load().state["history"][0]["checkpoint"]
    for _, path in store.manifests():
        entries = json.loads(path.read_text())["entries"]
        path.write_text(json.dumps({"entries": [e for e in entries if e["file"] != gone]}))
    (store.dir / gone).unlink()
    assert worker.process(queue.claim("w1", 10)) is Outcome.DONE
    state = env.state()
    assert state["applied"] == [DAYS4[0], DAYS4[2], DAYS4[3]]
    lines = [line for line in (env.share / "output" / "main" / "report.txt").read_text().splitlines()
             if line.startswith("model checkpoint: ")]
    assert lines == [f"model checkpoint: {store.dir / gone} (pruned: only the newest checkpoints are kept)",
                     *(f"model checkpoint: {store.dir / h['checkpoint']}" for h in state["history"][1:])]

    newest = store.load().path
    publish(DAYS4[1])
    queue.enqueue(plan.items(env.share))
    lease = queue.claim("w1", 10)
    assert lease.item.shard == DAYS4[1]
    assert worker.process(lease) is Outcome.FAILED
    entry = dead(queue)[lease.item.id]
    assert entry["attempts"] == 1
    assert entry["error"] == (
        f"run main: day {DAYS4[1]} arrived after later days were applied ({DAYS4[2]} ...), and the boundary "
        f"checkpoint before it is no longer in {store.dir}: retrain from scratch by seeding a new run name with "
        "the same hyperparameters (seed --runs-file), which applies every day in date order")
    assert store.load().path == newest, "nothing promoted"
    c = queue.counts()
    assert (c.pending, c.leased, c.done, c.dead) == (0, 0, 3, 1), "days 3 and 4 stay done: nothing was rewound"


def test_keep_checkpoints_bounds_the_mid_day_checkpoints_kept_on_the_share(env: Share) -> None:
    """A checkpoint at every batch, `keep_checkpoints` 2: after the day the share holds the newest two, the day's
    boundary and the mid-day one before it, and the manifest keeps exactly those."""
    queue = env.seed({"main": {**QUICK, "batch_size": 8}})
    worker = Worker(env.config(checkpoint_interval_s=1e-9, keep_checkpoints=2), queue)
    assert worker.process(queue.claim("w1", 10)) is Outcome.DONE
    boundary = env.state()["history"][-1]["checkpoint"]
    seq, token = re.fullmatch(r"ckpt-(\d{8})-t(\d+)\.pt", boundary).groups()
    assert int(seq) >= 4, "mid-day checkpoints were written, and the older ones pruned"
    files = sorted(p.name for p in (env.share / "output" / "main" / "checkpoints").glob("ckpt-*.pt"))
    assert files == [f"ckpt-{int(seq) - 1:08d}-t{token}.pt", boundary]
    assert CheckpointStore(env.share / "output" / "main").retained() == set(files)


def test_an_empty_never_seeded_queue_with_no_runs_on_the_share_exits_3(env: Share) -> None:
    assert Worker(env.config(), env.client_queue()).run() == EXIT_INFRA


def test_a_stop_before_training_releases_the_day_at_no_cost(env: Share) -> None:
    queue = env.seed()
    worker = Worker(env.config(), queue)
    worker.stop.set()
    lease = queue.claim("w1", 10)
    assert worker.process(lease) is Outcome.RELEASED
    assert queue.counts().pending == 3 and not queue.snapshot()["runs"]["main"].get("attempts")
    assert worker.run() == EXIT_TERMINATED


@pytest.mark.parametrize("interval_s", [600, 0.001], ids=["first-save", "after-interval-saves"])
def test_a_stop_mid_day_checkpoints_releases_and_a_peer_resumes_it(env: Share, interval_s: float) -> None:
    """SIGTERM's flag set at a batch boundary: a final mid-day checkpoint (also when interval checkpoints
    came before it, whose measured cost decides there is time for it), the day released at no cost; the
    next worker resumes it from there and applies it once."""
    queue = env.seed({"main": {**QUICK, "epochs": 2, "batch_size": 8}})
    worker = Worker(env.config(checkpoint_interval_s=interval_s, keep_checkpoints=50), queue)
    steps = 0
    real_touch = worker.touch

    def touch() -> None:  # three touches before training, then one per batch: preemption after batch 3
        nonlocal steps
        steps += 1
        if steps == 6:
            worker.stop.set()
        real_touch()

    worker.touch = touch  # type: ignore[method-assign]
    lease = queue.claim("w1", 10)
    assert worker.process(lease) is Outcome.RELEASED
    mid = env.state()
    assert mid["applied"] == [] and mid["progress"]["shard"] == DAYS[0]
    assert (mid["progress"]["epoch"], mid["progress"]["batch"]) == (0, 3), "the final checkpoint is at the stop"
    assert not queue.snapshot()["runs"]["main"].get("attempts")
    assert Worker(env.config(worker_id="w2"), queue).run() == EXIT_DONE
    assert env.state()["applied"] == DAYS


def test_each_day_trains_on_its_window_and_one_resumed_mid_way_ends_bit_for_bit(env: Share, tmp_path: Path) -> None:
    """`window_days` 2: each day trains on the run's newest applied day and itself, read from the feature
    store; a third day stopped after three batches and resumed by a peer reads the same window and ends
    with exactly the weights of an undisturbed run on another share."""
    hp = {**QUICK, "epochs": 2, "batch_size": 32, "window_days": 2}
    assert Worker(env.config(), env.seed({"main": hp})).run() == EXIT_DONE
    whole = env.state()
    data = ds.Dataset(env.share / "datasets" / "fraud")
    rows = [len(data.examples([d]).y) for d in DAYS]
    assert [h["train_rows"] for h in whole["history"]] == rows
    assert [h["window_rows"] for h in whole["history"]] == [rows[0], rows[0] + rows[1], rows[1] + rows[2]]

    other = Share(RedisServer(tmp_path / "redis-2").start(), tmp_path / "share-2", env.src)
    other.share.mkdir()
    try:
        queue = other.seed({"main": hp})
        worker = Worker(other.config(), queue)
        for _ in DAYS[:2]:
            assert worker.process(queue.claim("w1", 10)) is Outcome.DONE
        touches = 0
        real_touch = worker.touch

        def touch() -> None:  # three touches before training, then one per batch: a stop after batch 3
            nonlocal touches
            touches += 1
            if touches == 6:
                worker.stop.set()
            real_touch()

        worker.touch = touch  # type: ignore[method-assign]
        assert worker.process(queue.claim("w1", 10)) is Outcome.RELEASED
        mid = other.state()
        assert mid["progress"]["shard"] == DAYS[2] and (mid["progress"]["epoch"], mid["progress"]["batch"]) == (0, 3)
        assert Worker(other.config(worker_id="w2"), queue).run() == EXIT_DONE
        resumed = other.state()
    finally:
        other.server.kill()
    assert resumed["applied"] == whole["applied"] == DAYS and resumed["steps"] == whole["steps"]
    for part in ("model", "averaged"):
        for k, v in whole[part].items():
            assert torch.equal(v, resumed[part][k]), (part, k)


def test_mid_day_checkpoints_are_written_every_interval(env: Share) -> None:
    queue = env.seed({"main": {**QUICK, "batch_size": 8}})
    worker = Worker(env.config(checkpoint_interval_s=0.001, keep_checkpoints=50), queue)
    lease = queue.claim("w1", 10)
    assert worker.process(lease) is Outcome.DONE
    kept = list((env.share / "output" / "main" / "checkpoints").glob("ckpt-*.pt"))
    assert len(kept) > 2, kept


def test_sigterm_sets_the_stop_flag_and_the_worker_exits_143(env: Share) -> None:
    queue = env.seed()
    worker = Worker(env.config(term_grace_s=3600), queue)
    old = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    before = set(threading.enumerate())
    try:
        worker.install_signal_handlers()
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 5
        while not worker.stop.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)  # a second signal changes nothing
    finally:
        signal.signal(signal.SIGTERM, old[0])
        signal.signal(signal.SIGINT, old[1])
        timers = [t for t in threading.enumerate() if t not in before and isinstance(t, threading.Timer)]
        for t in timers:
            t.cancel()  # the hour-long grace timer: not left behind in the test process
    assert len(timers) == 1, "the second signal starts no second timer"
    assert worker.stop.is_set() and queue.interrupt.is_set()
    assert worker.run() == EXIT_TERMINATED
    assert queue.counts().pending == 3


def test_a_worker_still_running_after_the_grace_period_exits_143(env: Share, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM starts a daemon timer (it must not hold the process open) that exits 143 after term_grace_s.
    os._exit is recorded here instead of ending pytest (test_worker_faults.py proves the real exit)."""
    exits: list[int] = []
    monkeypatch.setattr(os, "_exit", lambda code: exits.append(code))
    worker = Worker(env.config(term_grace_s=0.2), env.client_queue())
    old = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    before = set(threading.enumerate())
    try:
        worker.install_signal_handlers()
        os.kill(os.getpid(), signal.SIGTERM)
        timers = [t for t in threading.enumerate() if t not in before]
        assert not exits, "no exit before the grace period"
        for t in timers:
            t.join(5)  # before any assertion: a timer left running would end pytest itself after monkeypatch
    finally:
        signal.signal(signal.SIGTERM, old[0])
        signal.signal(signal.SIGINT, old[1])
    assert exits == [EXIT_TERMINATED]
    assert len(timers) == 1 and timers[0].daemon, "one daemon timer: it must not hold the process open"


def test_a_signal_while_redis_is_unreachable_exits_143_and_a_long_outage_raises(env: Share) -> None:
    queue = env.seed()
    env.server.kill()
    queue.interrupt.set()
    assert Worker(env.config(), queue).run() == EXIT_TERMINATED
    short = WorkQueue(connect(env.server.url, env.server.password), retry_for_s=0.1)
    with pytest.raises(QueueUnavailable):
        Worker(env.config(), short).run()


# -- configuration ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("key, value", [("lease_ttl_s", 0), ("checkpoint_interval_s", 0), ("max_attempts", 0),
                                        ("keep_checkpoints", 0), ("term_grace_s", 0), ("infra_give_up_s", 0),
                                        ("infra_backoff_s", 0), ("stall_s", 0)])
def test_a_config_value_that_is_not_positive_is_refused_by_name(key: str, value: float) -> None:
    with pytest.raises(ValueError, match=rf"^{key}=0 is not allowed: it must be positive$"):
        WorkerConfig(share=Path("/s"), redis_url="redis://x", **{key: value})


def test_config_bounds_and_the_heartbeat_default() -> None:
    ok = WorkerConfig(share=Path("/s"), redis_url="redis://x", lease_ttl_s=0.1, checkpoint_interval_s=0.1,
                      max_attempts=1, keep_checkpoints=1, term_grace_s=0.1, infra_give_up_s=0.1,
                      infra_backoff_s=0.1, stall_s=0.1)
    assert ok.heartbeat_interval == pytest.approx(0.1 / 3)
    assert WorkerConfig(share=Path("/s"), redis_url="redis://x", lease_ttl_s=9, heartbeat_s=2).heartbeat_interval == 2
    for bad in (0, 9, 10, -1):
        with pytest.raises(ValueError, match=rf"^heartbeat_s={bad} must be > 0 and below lease_ttl_s=9$"):
            WorkerConfig(share=Path("/s"), redis_url="redis://x", lease_ttl_s=9, heartbeat_s=bad)
    assert "secret" not in repr(WorkerConfig(share=Path("/s"), redis_url="redis://x", redis_password="secret"))
    assert WorkerConfig(share=Path("/s"), redis_url="redis://x").worker_id.endswith(f"-{os.getpid()}")

