"""The packed claim (`WorkQueue.claim_also`) against a real Redis: a worker holding one run's day also leases other
runs whose next day is the same day of the same dataset, each lease its own (token, deadline, attempts, ack,
release, expiry), never a run someone holds, never a run's later day before its earlier one."""

from __future__ import annotations

import time

from workload.queue.workqueue import Item, WorkQueue, connect
from workload.runtime.redis_server import RedisServer


def make_queue(server: RedisServer, **kw) -> WorkQueue:
    return WorkQueue(connect(server.url, server.password), prefix="t", **kw)


def days(run: str, n: int, dataset: str = "d", first: int = 0) -> list[Item]:
    return [Item(run=run, shard=f"training/day{i:02d}.parquet", dataset=dataset, seq=i) for i in range(first, n)]


def test_a_packed_claim_leases_the_runs_whose_next_day_is_the_same_day_each_lease_its_own(
        redis_server: RedisServer) -> None:
    q = make_queue(redis_server)
    # a, b, d: day00 next; c: day01 next (its day00 done); e: another dataset; a: held by a peer
    q.enqueue([*days("a", 2), *days("b", 2), *days("c", 2, first=1), *days("d", 2), *days("e", 2, dataset="x"),
               *days("f", 2)])
    held = q.claim("peer", 30)
    assert held and held.item.run == "a"  # runs in name order: a is the peer's
    first = q.claim("w1", 30)
    assert first and first.item.run == "b" and first.item.shard == "training/day00.parquet"
    more = q.claim_also(first, 30, count=5)
    assert [m.item.run for m in more] == ["d", "f"]  # not a (held), c (day01 next), e (another dataset)
    assert all(m.item.shard == first.item.shard and m.owner == "w1" for m in more)
    tokens = [first.token, *(m.token for m in more)]
    assert len(set(tokens)) == 3 and held.token < min(tokens)
    assert q.counts().leased == 4
    assert q.claim_also(first, 30, count=5) == []  # nothing of that day is left unleased
    # Each lease is its own: one acked, one released at no cost, one failed, each alone.
    assert q.ack(more[0]).state == "acked"
    assert q.release(more[1]) == "pending"
    assert q.release(first, error="bad hparams", permanent=True) == "dead"
    snap = q.snapshot()["runs"]
    assert snap["d"]["done"] == 1 and snap["f"]["pending"][0] == more[1].item.id and snap["f"]["attempts"] == {}
    assert list(snap["b"]["dead"]) == [first.item.id] and snap["a"]["lease"]["owner"] == "peer"


def test_a_packed_claim_takes_at_most_count_and_what_it_can_get(redis_server: RedisServer) -> None:
    q = make_queue(redis_server)
    q.enqueue([*days("a", 1), *days("b", 1), *days("c", 1), *days("d", 1)])
    first = q.claim("w1", 30)
    assert first
    assert q.claim_also(first, 30, count=0) == []
    assert [m.item.run for m in q.claim_also(first, 30, count=2)] == ["b", "c"]
    assert [m.item.run for m in q.claim_also(first, 30, count=2)] == ["d"]  # fewer wait: what it got


def test_one_packed_lease_expires_alone_and_a_peer_takes_that_run_only(redis_server: RedisServer) -> None:
    """The lease of one run of a pack lapses (its heartbeat stopped): the reap charges that item one attempt
    and a peer claims it; the worker's other leases still heartbeat and ack, its stale one is refused."""
    q = make_queue(redis_server)
    q.enqueue([*days("a", 1), *days("b", 1), *days("c", 1)])
    first = q.claim("w1", 30)
    assert first
    short, long = q.claim_also(first, 30, count=2)
    assert q.heartbeat(short, ttl_s=0.001)
    deadline = time.monotonic() + 10
    while not (taken := q.claim("peer", 30)):
        assert time.monotonic() < deadline, "the 1 ms lease never expired"
        time.sleep(0.005)
    assert taken.item.id == short.item.id and taken.attempts == 1
    assert q.heartbeat(short, 30) is None and q.ack(short).state == "refused"
    assert q.heartbeat(first, 30) and q.heartbeat(long, 30)
    assert q.ack(first).state == "acked" and q.ack(long).state == "acked"


def test_a_resent_packed_claim_gets_back_the_leases_it_made(redis_server: RedisServer) -> None:
    """A packed claim whose reply was lost and is sent again (same claim id) leases nothing new and returns
    the leases it made, charged nothing: otherwise they would lapse at the cost of an attempt each."""
    q = make_queue(redis_server)
    q.enqueue([*days("a", 1), *days("b", 1), *days("c", 1), *days("d", 1)])
    first = q.claim("w1", 30)
    assert first
    args = dict(owner="w1", ttl_ms=30_000, max_attempts=5, claim="c1", dataset="d", shard=first.item.shard,
                count=2)
    sent = q._claim_also(**args)
    again = q._claim_also(**args)
    assert sorted(r[5] for r in sent) == sorted(r[5] for r in again) == [b"b", b"c"]
    assert sorted(int(r[1]) for r in sent) == sorted(int(r[1]) for r in again)
    assert q.counts().pending == 1
