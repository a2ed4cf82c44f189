"""Settings that only work in pairs, checked on both halves.

- Both Jobs ignore preemptions. The loader runs on the same spot-heavy cluster as the workers: without
  the rule, a node reclaimed under it spends its small backoffLimit (3) and fails `pulumi up`; the
  training Job's rule alone (tested elsewhere) does not cover it.
- The stack's Redis fsyncs every write, as the Redis that `make local` and the tests start does: the
  queue tests' claim that a SIGKILLed Redis keeps every acknowledged write (no fencing token handed out
  twice) holds for the stack only if its Redis is configured the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from infra import render
from infra.render import Rendered
from workload.redis_server import RedisServer

STACKS = render.stack_names()
JOB = "kubernetes:batch/v1:Job"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
IGNORE_PREEMPTION = {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}


def redis_args(r: Rendered) -> list[str]:
    (redis,) = r.one(DEPLOYMENT).inputs["spec"]["template"]["spec"]["containers"]
    return redis["args"]


def flag(args: list[str], name: str) -> str:
    """The value after ``name``, which must appear once (a second one would silently win)."""
    assert args.count(name) == 1, f"{name} appears {args.count(name)} times in {args}"
    return args[args.index(name) + 1]


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("job", ["loader", "training"])
def test_both_jobs_ignore_preemption_first(stack: str, job: str, rendered: Callable[..., Rendered]) -> None:
    spec: dict[str, Any] = rendered(stack).one(JOB, job).inputs["spec"]
    rules = spec["podFailurePolicy"]["rules"]
    # First match wins: after a FailJob rule on an exit code, a preempted pod exiting with that code would fail the Job.
    assert rules[0] == IGNORE_PREEMPTION
    assert spec["template"]["spec"]["restartPolicy"] == "Never"  # podFailurePolicy requires it


@pytest.mark.parametrize("stack", STACKS)
def test_the_stacks_redis_fsyncs_every_write_like_the_local_one(
    stack: str, rendered: Callable[..., Rendered], redis_server: RedisServer
) -> None:
    args = redis_args(rendered(stack))
    assert flag(args, "--appendonly") == "yes"
    assert flag(args, "--appendfsync") == "always"
    local = redis_server.client().config_get("append*")
    assert (local["appendonly"], local["appendfsync"]) == ("yes", flag(args, "--appendfsync"))
