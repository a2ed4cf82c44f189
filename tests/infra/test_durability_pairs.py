"""Settings that only work in pairs, checked on both halves.

The stack's Redis fsyncs every write, as the Redis that `make local` and the tests start does: the queue
tests' claim that a SIGKILLed Redis keeps every acknowledged write (no fencing token handed out twice)
holds for the stack only if its Redis is configured the same way. (The other pair of issue 13, both Jobs
ignoring preemption, is played through the Job controller's rules in test_infra_jobs.py.)
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from infra import render
from infra.render import Rendered
from workload.runtime.redis_server import RedisServer

STACKS = render.stack_names()
DEPLOYMENT = "kubernetes:apps/v1:Deployment"


def redis_args(r: Rendered) -> list[str]:
    (redis,) = r.one(DEPLOYMENT).inputs["spec"]["template"]["spec"]["containers"]
    return redis["args"]


def flag(args: list[str], name: str) -> str:
    """The value after ``name``, which must appear once (a second one would silently win)."""
    assert args.count(name) == 1, f"{name} appears {args.count(name)} times in {args}"
    return args[args.index(name) + 1]


@pytest.mark.parametrize("stack", STACKS)
def test_the_stacks_redis_fsyncs_every_write_like_the_local_one(
    stack: str, rendered: Callable[..., Rendered], redis_server: RedisServer
) -> None:
    args = redis_args(rendered(stack))
    assert flag(args, "--appendonly") == "yes"
    assert flag(args, "--appendfsync") == "always"
    local = redis_server.client().config_get("append*")
    assert (local["appendonly"], local["appendfsync"]) == ("yes", flag(args, "--appendfsync"))
