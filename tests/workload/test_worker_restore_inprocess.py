"""The worker in the pytest process (shared set-up: inprocess.py): fencing against a queue behind the share, a
wiped or older queue restored from the share, late days that rewind the run to the boundary before them, and
preemption (a stop before or mid-day, SIGTERM, the grace period), ending bit for bit.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import torch
from inprocess import DAYS, QUICK, SPEC, Share, local_time_zone, share_env, withhold

from workload.core.errors import EXIT_DONE, EXIT_INFRA, EXIT_TERMINATED
from workload.data import dataset as ds
from workload.data import simulator
from workload.data.manifest import write_manifest
from workload.model import metrics, plots
from workload.model.lineage import trainer_from
from workload.queue import plan
from workload.queue.workqueue import QueueUnavailable, WorkQueue, connect
from workload.runtime.redis_server import RedisServer
from workload.runtime.steps import Outcome
from workload.runtime.worker import Worker
from workload.share.checkpoint import CheckpointStore
from workload.share.paths import METRICS_PNG, PR_CURVE_PNG

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Share]:
    yield from share_env(tmp_path)


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


def test_days_redis_calls_done_that_the_share_lacks_are_trained_before_the_worker_exits_0(
        env: Share, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The in-process twin of test_done_is_the_shares.py: the run's output restored from a backup taken after day 1
    while Redis calls all three days done. The worker puts days 2 and 3 back to pending, says so once, trains them
    in date order and only then exits 0."""
    queue = env.seed()
    worker = Worker(env.config(), queue)
    assert worker.process(queue.claim("w1", 10)) is Outcome.DONE
    run_dir = env.share / "output" / "main"
    shutil.copytree(run_dir, tmp_path / "backup")
    assert worker.run() == EXIT_DONE and env.state()["applied"] == DAYS
    shutil.rmtree(run_dir)
    shutil.copytree(tmp_path / "backup", run_dir)
    assert env.state()["applied"] == DAYS[:1] and queue.counts().done == 3
    with caplog.at_level("WARNING", logger="workload.queue.plan"):
        assert Worker(env.config(worker_id="w2"), queue).run() == EXIT_DONE
    state = env.state()
    assert state["applied"] == DAYS and [h["shard"] for h in state["history"]] == DAYS
    said = [r.getMessage() for r in caplog.records if "does not record" in r.getMessage()]
    head = f"share vs queue: Redis calls 2 day(s) done that their run's newest checkpoint on the share does not " \
           f"record (main/{DAYS[1]}, main/{DAYS[2]})"
    assert len(said) == 1 and said[0].startswith(head), said


def test_a_worker_whose_view_of_the_dataset_is_stale_reads_the_manifest_again_at_claim(
        env: Share, tmp_path: Path) -> None:
    """Worker A reads the dataset while day 2 is held back and trains day 1; day 2 is then published (a backfill)
    and worker B trains it. A, claiming day 3, must not compute day 3's features from its old view (without
    day 2's transactions in the customers' and terminals' history): it reads the manifest again at the claim,
    and the run ends bit for bit the in-order run's."""
    publish = withhold(env, [DAYS[1]])
    queue = env.seed()
    a, b = Worker(env.config(worker_id="a"), queue), Worker(env.config(worker_id="b"), queue)
    assert a.process(queue.claim("a", 10)) is Outcome.DONE and env.state()["applied"] == DAYS[:1]
    publish(DAYS[1])
    queue.enqueue(plan.items(env.share))
    assert b.process(queue.claim("b", 10)) is Outcome.DONE and env.state()["applied"] == DAYS[:2]
    assert a.run() == EXIT_DONE
    (tmp_path / "in-order").mkdir()
    gen = share_env(tmp_path / "in-order")
    ordered = next(gen)
    try:
        assert Worker(ordered.config(), ordered.seed()).run() == EXIT_DONE
        expected = ordered.state()
    finally:
        gen.close()
    state = env.state()
    assert state["applied"] == expected["applied"] == DAYS
    assert all(torch.equal(state[part][k], expected[part][k]) for part in ("model", "averaged")
               for k in expected[part]), "day 3 trained on features of a stale view of the dataset"


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


def test_a_late_day_whose_boundary_checkpoint_is_gone_goes_back_to_the_nearest_kept_one(env: Share) -> None:
    """Four days, day 2 published after days 1, 3 and 4 were applied, and the checkpoint that ends day 1 removed
    from the share meanwhile (pruned by retention, or by hand): the reports written since say it was pruned, and
    day 2 goes back to the nearest kept boundary (none: a cold start, promoted), day 1 and the later days go back
    to pending, day 2 is released at no cost, and the four days are then applied in date order."""
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

    publish(DAYS4[1])
    queue.enqueue(plan.items(env.share))
    lease = queue.claim("w1", 10)
    assert lease.item.shard == DAYS4[1]
    assert worker.process(lease) is Outcome.RELEASED
    assert store.load().state["applied"] == [], "the cold start promoted as the newest"
    c = queue.counts()
    assert (c.pending, c.leased, c.done, c.dead) == (4, 0, 0, 0), "days 1, 3 and 4 back to pending with day 2"
    for day in DAYS4:
        lease = queue.claim("w1", 10)
        assert lease.item.shard == day and lease.attempts == 0
        assert worker.process(lease) is Outcome.DONE
    assert env.state()["applied"] == DAYS4


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
