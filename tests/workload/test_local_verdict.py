"""`make local`'s exit code when its workers end differently: the verdict over real processes' exit statuses
(exit codes and deaths by signal, as subprocess reports them)."""

from __future__ import annotations

import subprocess

import pytest

from workload.core.errors import (
    EXIT_DEAD_LETTERS,
    EXIT_DONE,
    EXIT_FAILED,
    EXIT_INFRA,
    EXIT_STALLED,
    EXIT_TERMINATED,
)
from workload.runtime.local import verdict

KILLED = "kill -KILL $$"  # a worker that vanished (the OOM killer): subprocess reports -9
TERMINATED = "kill -TERM $$"  # died of an unhandled SIGTERM: -15


def ended(*how: str | int) -> list[int]:
    """Real processes that end as told (an exit code, or a shell line that kills itself); their codes."""
    procs = [subprocess.Popen(["sh", "-c", h if isinstance(h, str) else f"exit {h}"]) for h in how]
    return [p.wait(timeout=30) for p in procs]


@pytest.mark.parametrize(("how", "expected"), [
    ((EXIT_DONE, EXIT_DONE, EXIT_DONE), EXIT_DONE),
    ((EXIT_DONE, EXIT_DEAD_LETTERS), EXIT_DEAD_LETTERS),  # one saw the queue end with dead letters
    ((EXIT_DEAD_LETTERS, EXIT_INFRA), EXIT_INFRA),  # infrastructure first: nothing was dead-lettered for it
    ((EXIT_INFRA, EXIT_DEAD_LETTERS, EXIT_DONE), EXIT_INFRA),
    ((EXIT_DEAD_LETTERS, EXIT_STALLED), EXIT_STALLED),
    ((EXIT_STALLED, EXIT_INFRA), EXIT_INFRA),  # both infrastructure: the share or Redis before the watchdog
    ((EXIT_DONE, EXIT_FAILED), EXIT_FAILED),  # a bug in one worker is not success
    ((EXIT_DONE, KILLED), EXIT_FAILED),  # killed by a signal: a negative code, never success
    ((EXIT_DONE, TERMINATED), EXIT_FAILED),
    ((EXIT_DONE, EXIT_TERMINATED), EXIT_FAILED),  # preempted: not success either
    ((KILLED, EXIT_DEAD_LETTERS), EXIT_DEAD_LETTERS),
    ((KILLED, EXIT_INFRA), EXIT_INFRA),
    ((EXIT_DONE,), EXIT_DONE),
], ids=["all-done", "done+dead", "dead+infra", "infra+dead+done", "dead+stalled", "stalled+infra", "done+bug",
        "done+sigkill", "done+sigterm", "done+143", "sigkill+dead", "sigkill+infra", "one-done"])
def test_the_verdict_over_workers_that_end_differently(how: tuple[str | int, ...], expected: int) -> None:
    codes = ended(*how)
    assert verdict(codes) == expected
    assert verdict(list(reversed(codes))) == expected  # whichever worker ended first
