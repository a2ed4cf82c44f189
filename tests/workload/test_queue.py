"""Queue semantics against a real Redis server: every state transition and its fencing."""

from __future__ import annotations

import time

import pytest
from harness import poll_claim

from workload.queue.workqueue import Counts, Item, WorkQueue, connect
from workload.runtime.redis_server import RedisServer


def make_queue(server: RedisServer, **kw) -> WorkQueue:
    return WorkQueue(connect(server.url, server.password), prefix="t", **kw)


def items(run: str, n: int) -> list[Item]:
    return [Item(run=run, shard=f"training/day{i:02d}.parquet", dataset="d", seq=i) for i in range(n)]


def test_password_is_required(redis_server: RedisServer) -> None:
    import redis

    with pytest.raises(redis.AuthenticationError):
        connect(redis_server.url).ping()


def test_enqueue_is_idempotent_and_skips_done_items(redis_server: RedisServer) -> None:
    q = make_queue(redis_server)
    assert q.enqueue(items("a", 3)) == 3
    assert q.enqueue(items("a", 3)) == 0
    lease = q.claim("w1", ttl_s=30)
    assert lease and q.ack(lease)
    assert q.enqueue(items("a", 3)) == 0  # a done item is not enqueued again
    c = q.counts()
    assert (c.pending, c.leased, c.done, c.total) == (2, 0, 1, 3)


def test_one_worker_per_run_in_chronological_order(redis_server: RedisServer) -> None:
    q = make_queue(redis_server)
    q.enqueue(list(reversed(items("a", 3))) + items("b", 2))
    l1, l2 = q.claim("w1", 30), q.claim("w2", 30)
    assert l1 and l2
    assert {l1.item.run, l2.item.run} == {"a", "b"}
    assert q.claim("w3", 30) is None  # both runs are leased: a third worker gets nothing
    order = []
    lease = l1 if l1.item.run == "a" else l2
    while lease:
        order.append(lease.item.seq)
        assert q.ack(lease)
        lease = q.claim("w1", 30)
        if lease and lease.item.run != "a":
            q.ack(lease)
            lease = q.claim("w1", 30)
    assert order == [0, 1, 2]


def test_an_ack_says_whether_it_finished_its_run_even_once_a_peer_has_claimed_the_next_day(
        redis_server: RedisServer) -> None:
    q = make_queue(redis_server)
    q.enqueue(items("a", 2) + items("b", 1))
    first = q.claim("w1", 30)
    assert first and first.item.run == "a"
    acked = q.ack(first)
    assert (acked.state, acked.left, acked.finished_run) == ("acked", 1, False)
    peer = q.claim("w2", 30)  # a's last day: nothing of run a is pending now, and it is not done
    assert peer and peer.item.run == "a" and q.pending_in_run("a") == 0
    last = q.ack(peer)
    assert (last.state, last.by, last.left, last.finished_run) == ("acked", "w2", 0, True)
    again = q.ack(peer)  # a retried ack (its reply lost) finished nothing this time
    assert (again.state, again.by, again.left, again.finished_run) == ("already-done", "w2", -1, False)
    other = q.claim("w1", 30)
    assert other and other.item.run == "b"
    assert q.ack(other).finished_run  # run b's only day: a's items count for nothing there


def test_stale_owner_cannot_ack_heartbeat_or_release(redis_server: RedisServer) -> None:
    q = make_queue(redis_server)
    q.enqueue(items("a", 1))
    stale = q.claim("w1", ttl_s=0.2)
    assert stale
    time.sleep(0.3)
    fresh = poll_claim(q, "w2", ttl_s=30)  # reaps the expired lease, then takes the item over
    assert fresh and fresh.item == stale.item and fresh.token > stale.token
    assert fresh.attempts == 1  # the expiry counted as a failed attempt
    assert not q.ack(stale)
    assert q.heartbeat(stale, 30) is None
    assert q.release(stale, error="x") is None
    assert not q.holds(stale) and q.holds(fresh)
    assert q.ack(fresh)
    assert q.counts().done == 1


def test_fencing_checks_the_owner_too(redis_server: RedisServer) -> None:
    """A token handed out twice (a Redis restored from a stale disk) still fences: the owner differs."""
    from dataclasses import replace

    q = make_queue(redis_server)
    q.enqueue(items("a", 1))
    lease = q.claim("w1", 30)
    assert lease
    impostor = replace(lease, owner="w2")
    assert not q.holds(impostor) and q.heartbeat(impostor, 30) is None
    assert not q.ack(impostor) and q.release(impostor) is None
    assert q.holds(lease) and q.ack(lease)


def test_heartbeat_keeps_the_lease_alive(redis_server: RedisServer) -> None:
    q = make_queue(redis_server)
    q.enqueue(items("a", 1))
    lease = q.claim("w1", ttl_s=0.5)
    assert lease
    for _ in range(4):
        time.sleep(0.25)
        assert q.heartbeat(lease, 0.5)
    assert q.reap() == 0
    assert q.ack(lease)


def test_release_without_error_costs_no_attempt(redis_server: RedisServer) -> None:
    q = make_queue(redis_server, max_attempts=1)
    q.enqueue(items("a", 1))
    for _ in range(3):
        lease = q.claim("w1", 30)
        assert lease and lease.attempts == 0
        assert q.release(lease) == "pending"
    assert q.counts().pending == 1


def test_errors_dead_letter_after_max_attempts(redis_server: RedisServer) -> None:
    q = make_queue(redis_server, max_attempts=3)
    q.enqueue(items("a", 2))
    states = []
    for i in range(3):
        lease = q.claim("w1", 30)
        assert lease and lease.item.seq == 0
        states.append(q.release(lease, error=f"boom {i}"))
    assert states == ["pending", "pending", "dead"]
    snap = q.snapshot()["runs"]["a"]
    assert snap["dead"]["a/training/day00.parquet"]["error"] == "boom 2"
    assert snap["dead"]["a/training/day00.parquet"]["attempts"] == 3
    nxt = q.claim("w1", 30)  # the run goes on with its next shard
    assert nxt and nxt.item.seq == 1


def test_permanent_error_dead_letters_at_once(redis_server: RedisServer) -> None:
    q = make_queue(redis_server, max_attempts=5)
    q.enqueue(items("a", 1))
    lease = q.claim("w1", 30)
    assert lease and q.release(lease, error="pickle refused", permanent=True) == "dead"
    c = q.counts()
    assert c.drained and c.dead == 1


def test_expired_leases_dead_letter_after_max_attempts(redis_server: RedisServer) -> None:
    q = make_queue(redis_server, max_attempts=2)
    q.enqueue(items("a", 1))
    assert q.claim("w1", ttl_s=0.1)
    assert poll_claim(q, "w1", ttl_s=0.1)  # the first expiry (reaped by polling: see poll_claim)
    deadline = time.monotonic() + 10
    while not q.reap():
        assert time.monotonic() < deadline, "a 0.1 s lease never expired"
        time.sleep(0.01)
    c = q.counts()
    assert c.drained and c.dead == 1
    assert "stopped heartbeating" in q.snapshot()["runs"]["a"]["dead"]["a/training/day00.parquet"]["error"]


def test_drained_only_when_nothing_pending_or_leased(redis_server: RedisServer) -> None:
    q = make_queue(redis_server)
    q.enqueue(items("a", 1))
    assert not q.counts().drained
    lease = q.claim("w1", 30)
    assert lease
    c = q.counts()
    assert (c.pending, c.leased, c.drained) == (0, 1, False)
    q.ack(lease)
    assert q.counts().drained


def test_run_spec_is_recorded_once(redis_server: RedisServer) -> None:
    q = make_queue(redis_server)
    q.put_spec("a", {"lr": 0.001})
    q.put_spec("a", {"lr": 0.001})
    with pytest.raises(ValueError, match="run 'a' already exists"):
        q.put_spec("a", {"lr": 0.1})
    assert q.spec("a") == {"lr": 0.001}


def test_survives_a_redis_restart(redis_server: RedisServer) -> None:
    q = make_queue(redis_server, retry_for_s=30)
    q.enqueue(items("a", 2))
    lease = q.claim("w1", 60)
    assert lease
    redis_server.kill()  # hard kill: appendfsync always keeps every acknowledged write
    redis_server.start()
    assert q.holds(lease)
    assert q.ack(lease)
    assert q.counts().done == 1 and q.counts().pending == 1


def test_the_keys_name_where_the_scripts_keep_each_record(redis_server: RedisServer) -> None:
    """Keys is the map an operator (and `status`) reads the queue by, and the Lua scripts are handed its
    names: a record kept anywhere else would be invisible to both."""
    q = make_queue(redis_server)
    q.enqueue(items("a", 2))
    lease = q.claim("w1", ttl_s=30)
    assert lease
    r, keys = q.redis, q.keys
    assert r.zscore(keys.leases, "a") is not None, "the lease deadline lives in keys.leases"
    assert int(r.get(keys.token)) == lease.token, "the fencing counter lives in keys.token"
    assert q.ack(lease)
    assert r.hget(keys.acked_by, lease.item.id).decode() == "w1", "the acking owner lives in keys.acked_by"
    assert r.sismember(keys.done, lease.item.id)


def test_every_key_the_scripts_write_is_one_that_keys_names(redis_server: RedisServer) -> None:
    """No script spells a key name: through every transition (enqueue, claim, heartbeat, release,
    dead-letter, requeue, expiry, restore, ack) each key in Redis is one Keys names for the queue's
    prefix, and a queue with another prefix on the same server is left alone."""
    q = make_queue(redis_server, max_attempts=2)
    other = WorkQueue(q.redis, prefix="u")
    other.enqueue(items("a", 1))
    q.enqueue([*items("a", 3), *items("b", 1)])
    q.mark_seeded()
    lease = q.claim("w1", ttl_s=30)
    assert lease and q.heartbeat(lease, ttl_s=30)
    assert q.release(lease, error="boom") == "pending"
    assert q.release(q.claim("w1", ttl_s=30), permanent=True) == "dead"
    assert q.requeue() == ["a/training/day00.parquet"]
    expiring = q.claim("w1", ttl_s=0.001)
    assert expiring and expiring.item.run == "a"
    deadline = time.monotonic() + 10
    while not q.reap():  # waits for the server's clock to pass a 1 ms lease
        assert time.monotonic() < deadline, "a 1 ms lease never expired"
        time.sleep(0.005)
    assert q.mark_done(items("a", 3)[1:2]) == 1
    assert q.raise_token(100) == 100
    lease = q.claim("w2", ttl_s=30)
    assert lease and q.ack(lease)
    assert q.release(q.claim("w2", ttl_s=30), permanent=True) == "dead"  # a/day02

    k = q.keys
    named = {k.items, k.runs, k.attempts, k.errors, k.done, k.dead, k.acked_by, k.token, k.seeded, k.leases, k.alive,
             *(k.pending(run) for run in ("a", "b")), *(k.lease(run) for run in ("a", "b"))}
    seen = {key.decode() for key in q.redis.keys("*") if not key.startswith(b"u:")}
    assert seen - named == set(), "keys a script named itself"
    assert {k.items, k.attempts, k.errors, k.done, k.dead, k.acked_by, k.token, k.pending("b")} <= seen
    assert other.counts() == Counts(pending=1, leased=0, done=0, dead=0, total=1)


def test_a_frozen_redis_fails_a_call_after_its_retries_instead_of_hanging(redis_server: RedisServer) -> None:
    """A Redis that stops answering (SIGSTOP: a stuck node) must not hang the worker's call forever: each
    try times out and is retried, then the call fails, for WorkQueue to classify as an infrastructure fault.
    Once Redis answers again, the same client works."""
    import os
    import signal

    import redis

    timeout_s = 0.3
    client = connect(redis_server.url, redis_server.password, timeout_s=timeout_s)
    assert client.ping()
    os.kill(redis_server.proc.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(redis.TimeoutError):
            client.ping()
        waited = time.monotonic() - started
    finally:
        os.kill(redis_server.proc.pid, signal.SIGCONT)
    assert waited >= 4 * timeout_s, f"gave up after {waited:.2f}s: the call was not retried 3 times"
    assert waited < 10, f"took {waited:.2f}s: the tries did not time out after {timeout_s}s each"
    assert client.ping()


def test_a_claim_leases_for_exactly_its_ttl_on_the_servers_clock(redis_server: RedisServer) -> None:
    """The lease deadline is the server's time plus the TTL, in milliseconds: a unit slip would hand a
    dead worker's item to a peer late (or a live worker's early)."""
    q = make_queue(redis_server)
    q.enqueue(items("a", 1))
    secs, micros = q.redis.time()
    before_ms = secs * 1000 + micros // 1000
    lease = q.claim("w1", ttl_s=1000)
    secs, micros = q.redis.time()
    after_ms = secs * 1000 + micros // 1000
    assert lease and before_ms + 1_000_000 <= lease.deadline_ms <= after_ms + 1_000_000
