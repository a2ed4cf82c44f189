"""What `make local`'s Redis server promises beyond its configuration (test_local_inprocess.py): it dies with the
thread that started it, it is out of the terminal's reach (its own session), it makes its data folder, and a child
whose parent died before it could ask Linux for the signal ends itself. Real processes and signals."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

from workload.runtime.redis_server import RedisServer, die_with_parent


def test_a_server_makes_its_nested_folder_and_runs_in_a_session_of_its_own(tmp_path: Path) -> None:
    """Ctrl-C in `make local`'s terminal reaches the terminal's process group, not Redis: `local` stops it itself,
    after the workers, so their last acks still land."""
    s = RedisServer(tmp_path / "a" / "b" / "redis").start()
    try:
        assert s.client().ping()
        pid = s.proc.pid
        assert os.getsid(pid) == pid != os.getsid(0)
        assert os.getpgid(pid) == pid != os.getpgid(0)
    finally:
        s.stop()


def test_a_server_started_by_a_thread_that_ends_is_stopped_with_it(tmp_path: Path) -> None:
    """The server asked Linux for SIGTERM when the thread that started it ends (prctl PR_SET_PDEATHSIG): a `make
    local` killed however it dies leaves no Redis behind."""
    box: list[RedisServer] = []
    t = threading.Thread(target=lambda: box.append(RedisServer(tmp_path / "r").start()))
    t.start()
    t.join()
    (s,) = box
    try:
        assert s.proc.wait(timeout=10) == 0  # SIGTERM: a clean shutdown (AOF flushed), exit 0
    finally:
        s.kill()


def test_a_child_whose_parent_died_before_it_armed_the_signal_ends_itself() -> None:
    """The race prctl cannot close: the parent dies between fork and prctl, so no signal will come. The child sees
    a parent that is no longer the one that made it and sends itself the signal."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        arm = die_with_parent(sig)  # the parent it records: this process
        middle = os.fork()
        if middle == 0:  # pragma: no cover - runs in the forked processes
            code = 100
            try:
                child = os.fork()
                if child == 0:
                    # As redis-server is, after its exec: the signal's default action, whatever handler this test
                    # process was left with by an earlier test in it (an in-process worker's SIGTERM handler).
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    arm()  # its parent is `middle`, not the process arm was made for
                    os._exit(0)
                _, status = os.waitpid(child, 0)
                code = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 101
            finally:
                os._exit(code)
        _, status = os.waitpid(middle, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == sig
    # The parent it was made for is still there: arming changes nothing else.
    arm = die_with_parent()
    child = os.fork()
    if child == 0:  # pragma: no cover
        arm()
        os._exit(7)
    _, status = os.waitpid(child, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 7
