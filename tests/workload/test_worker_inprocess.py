"""The worker driven in the pytest process (shared set-up: inprocess.py), against a real Redis and real files on
a share folder: the whole loop (exit codes, exactly-once and in-order application, acks only after promotion),
item faults and their dead letters, lost leases at promotion and report time, and the worker's configuration.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import torch
from harness import poll_claim
from inprocess import DAYS, QUICK, Share, dead, local_time_zone, returns, share_env, walk

from workload.core.errors import EXIT_DEAD_LETTERS, EXIT_DONE, ItemFault
from workload.data import dataset as ds
from workload.data import features
from workload.model import metrics
from workload.model.hparams import HParams
from workload.model.lineage import Checkpoint, checkpoint_of, trainer_from
from workload.model.report import rendered_from as report_source
from workload.queue import plan
from workload.queue.workqueue import Item
from workload.runtime.heartbeat import Heartbeat, LeaseLost
from workload.runtime.steps import Attempt, Outcome
from workload.runtime.worker import Worker, WorkerConfig
from workload.share.checkpoint import CheckpointStore
from workload.share.paths import METRICS_PNG

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Share]:
    yield from share_env(tmp_path)


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


def test_the_walk_of_one_claimed_day_returns_to_a_module_it_left_at_most_ten_times(env: Share) -> None:
    """docs/architecture.md's numbered walk, measured: from `Worker.process` to the ack, each step one call into
    the queue, the store, the lineage, the dataset or the report; a step that does another module's bookkeeping
    shows as a return to a module the walk had left."""
    queue = env.seed({"main": QUICK}, drawn=False)  # the pictures are drawn: the walk's longest path
    worker = Worker(env.config(), queue)
    assert worker.process(queue.claim("w1", 10)) is Outcome.DONE  # day 1: the next day warm-starts
    lease = queue.claim("w1", 10)
    stops = walk(lambda: worker.process(lease))
    assert queue.snapshot()["runs"]["main"]["done"] and env.state()["applied"] == DAYS[:2]
    assert returns(stops) <= 10, stops
    assert stops[-1] == "workload.runtime.heartbeat" and "workload.model.lineage" in stops, stops
    assert "workload.model.trainer" not in stops, "the protocol asks the lineage, never the trainer"


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
        attempt.report(Checkpoint.of(ours), None, draw=False)
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
