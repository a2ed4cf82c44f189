"""The queue rebuilt from the share after Redis lost everything: what each run's newest checkpoint records is
marked done (not left pending for a worker's already-applied path to hide), the rest is pending in day order,
and the token counter starts above every token on the share, for two runs trained to different depths."""

from __future__ import annotations

from pathlib import Path

import pytest
from trained import DAYS, Trained

from workload.queue import plan
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
    assert plan.restore(queue, share) == {"runs": 2, "enqueued": 8, "already_applied": 4}

    runs = queue.snapshot()["runs"]
    assert {run: (r["total"], r["done"]) for run, r in runs.items()} == {"a-deep": (4, 3), "b-shallow": (4, 1)}
    assert runs["a-deep"]["pending"] == [f"a-deep/{DAYS[3]}"]
    assert runs["b-shallow"]["pending"] == [f"b-shallow/{d}" for d in DAYS[1:]]
    assert queue.seeded()
    lease = queue.claim("w2", 10)
    assert lease is not None and lease.item.id == f"a-deep/{DAYS[3]}"
    assert lease.token > max(tokens.values())
    assert plan.restore(queue, share) == {"runs": 2, "enqueued": 0, "already_applied": 0}  # idempotent


def test_restore_of_a_share_with_runs_but_no_checkpoints_marks_nothing(redis_server: RedisServer,
                                                                        tmp_path: Path) -> None:
    env = Trained(tmp_path / "share", redis_server)
    share, queue = env.share, env.queue
    env.seed("fresh")
    queue.redis.flushall()
    assert plan.restore(queue, share) == {"runs": 1, "enqueued": 4, "already_applied": 0}
    assert queue.snapshot()["runs"]["fresh"]["pending"] == [f"fresh/{d}" for d in DAYS]
    assert queue.claim("w1", 10).token == 1
