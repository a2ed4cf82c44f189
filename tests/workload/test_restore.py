"""The queue rebuilt from the share after Redis lost everything: what each run's newest checkpoint records is
marked done (not left pending for a worker's already-applied path to hide), the rest is pending in day order,
and the token counter starts above every token on the share, for two runs trained to different depths."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from trained import DAYS, QUICK, Trained

from workload.model.lineage import applied_days
from workload.queue import plan
from workload.queue.workqueue import WorkQueue, connect
from workload.runtime.redis_server import RedisServer
from workload.share.checkpoint import CheckpointStore

pytestmark = pytest.mark.timeout(120)


def test_restore_marks_each_runs_applied_days_done_and_starts_tokens_above_the_share(
        redis_server: RedisServer, tmp_path: Path) -> None:
    env = Trained(tmp_path / "share", redis_server)
    share, queue = env.share, env.queue
    # "b-shallow" is trained first (one day, low tokens), "a-deep" later (three days, the highest tokens): the
    # floor must be the highest over every run, not the last run read.
    env.seed("b-shallow")
    env.train(1)
    env.seed("a-deep")
    env.train(3)
    tokens = {run: CheckpointStore(share / "output" / run).highest_token() for run in ("a-deep", "b-shallow")}
    assert tokens["a-deep"] > tokens["b-shallow"] > 0

    queue.redis.flushall()
    assert plan.restore(queue, share, applied_days) == {"runs": 2, "enqueued": 8, "already_applied": 4}

    runs = queue.snapshot()["runs"]
    assert {run: (r["total"], r["done"]) for run, r in runs.items()} == {"a-deep": (4, 3), "b-shallow": (4, 1)}
    assert runs["a-deep"]["pending"] == [f"a-deep/{DAYS[3]}"]
    assert runs["b-shallow"]["pending"] == [f"b-shallow/{d}" for d in DAYS[1:]]
    assert queue.seeded()
    lease = queue.claim("w2", 10)
    assert lease is not None and lease.item.id == f"a-deep/{DAYS[3]}"
    assert lease.token > max(tokens.values())
    assert plan.restore(queue, share, applied_days) == {"runs": 2, "enqueued": 0, "already_applied": 0}  # idempotent


def test_restore_of_a_share_with_runs_but_no_checkpoints_marks_nothing(redis_server: RedisServer,
                                                                        tmp_path: Path) -> None:
    env = Trained(tmp_path / "share", redis_server)
    share, queue = env.share, env.queue
    env.seed("fresh")
    queue.redis.flushall()
    assert plan.restore(queue, share, applied_days) == {"runs": 1, "enqueued": 4, "already_applied": 0}
    assert queue.spec("fresh") == QUICK, "the share's hyperparameters, back in the wiped Redis"
    assert queue.snapshot()["runs"]["fresh"]["pending"] == [f"fresh/{d}" for d in DAYS]
    assert queue.claim("w1", 10).token == 1


def test_gap_names_what_a_queue_behind_the_share_lacks_and_reconcile_closes_it_once(
        redis_server: RedisServer, tmp_path: Path) -> None:
    """In-process (the worker reaches gap and reconcile only at its start and end): a wiped queue lacks the run,
    its four items and its token floor; reconcile adds them, marks the applied days done, and a second call
    finds nothing."""
    env = Trained(tmp_path / "share", redis_server)
    share, queue = env.share, env.queue
    env.seed("a")
    env.train(2)
    floor = CheckpointStore(share / "output" / "a").highest_token()
    assert floor > 0
    level = plan.gap(queue, share)
    assert not level
    assert level.line() == "share vs queue: the share's plan is 1 run(s), 4 item(s); the queue holds them all"
    assert plan.reconcile(queue, share, applied_days) is None

    queue.redis.flushall()
    ids = [f"a/{d}" for d in DAYS]
    behind = plan.gap(queue, share)
    assert behind == plan.Gap(runs=1, items=4, missing_runs=["a"], missing_items=ids, token=0, token_floor=floor)
    assert behind.line() == (
        "share vs queue: the share's plan is 1 run(s), 4 item(s); the queue is BEHIND: it lacks 1 run(s) (a), "
        f"4 item(s) ({ids[0]}, {ids[1]}, {ids[2]} and 1 more), a token counter at 0, below the share's {floor} "
        "(Redis restored from an older snapshot?); a worker adds them at start and before it exits")
    assert plan.reconcile(queue, share, applied_days) == behind
    runs = queue.snapshot()["runs"]
    assert (runs["a"]["total"], runs["a"]["done"], runs["a"]["pending"]) == (4, 2, ids[2:])
    assert not plan.gap(queue, share) and plan.reconcile(queue, share, applied_days) is None
    assert queue.claim("w2", 10).token > floor


def test_a_share_whose_one_run_lost_its_dataset_plans_nothing_and_names_the_run_once_per_check(
        redis_server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """No live run: the plan is empty, so an empty queue is not behind it (no token floor: no checkpoint to be above),
    and gap and restore each name the skipped run once, not once per read of the records."""
    share = tmp_path / "share"
    plan.record(share, plan.RunSpec(run="gone", dataset="retired", hparams=QUICK))
    queue = WorkQueue(connect(redis_server.url, redis_server.password))
    skipped = (f"run gone is skipped: its dataset 'retired' is gone from the share ({share}/datasets/retired/"
               f"{plan.MANIFEST} is missing); publish it again (seed --dataset retired --datasets SOURCE) or retire "
               f"the run by removing {share}/runs/gone.json")
    with caplog.at_level(logging.WARNING, logger="workload.queue.plan"):
        found = plan.gap(queue, share)
        assert [r.getMessage() for r in caplog.records] == [skipped]
        caplog.clear()
        assert plan.restore(queue, share, applied_days) == {"runs": 0, "enqueued": 0, "already_applied": 0}
        assert [r.getMessage() for r in caplog.records] == [skipped]
    assert found == plan.Gap(runs=0, items=0, missing_runs=[], missing_items=[], token=0, token_floor=0)
    assert not found
    assert found.line() == "share vs queue: the share's plan is 0 run(s), 0 item(s); the queue holds them all"
    assert queue.known() == (set(), set(), 0) and queue.seeded()
