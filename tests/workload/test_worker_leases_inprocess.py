"""The worker in the pytest process (shared set-up: inprocess.py): infrastructure faults that cost no attempt
(a full disk, the back-off and when it gives up), leases and heartbeats (renewal, Redis outages, takeovers), and
the watchdog that gives a stuck worker's lease up.
"""

from __future__ import annotations

import os
import resource
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import poll_claim
from inprocess import Share, share_env, writes_may_fail

from workload.core import faults
from workload.core.errors import EXIT_INFRA
from workload.data.dayfile import DatasetError
from workload.runtime.heartbeat import Heartbeat
from workload.runtime.steps import Outcome
from workload.runtime.worker import Worker
from workload.share.checkpoint import CheckpointStore

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Share]:
    yield from share_env(tmp_path)


# -- infrastructure faults ----------------------------------------------------------------------------


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
