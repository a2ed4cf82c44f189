"""The queue's repair and observer calls against a real Redis: requeue of dead letters, restore from the
share (mark_done, raise_token, seeded), what status reads, ack/release results, and riding out an outage."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from workload.queue.workqueue import Item, QueueInterrupted, QueueUnavailable, WorkQueue, connect
from workload.runtime.redis_server import RedisServer


def make_queue(server: RedisServer, **kw) -> WorkQueue:
    return WorkQueue(connect(server.url, server.password), prefix="t", **kw)


def items(run: str, n: int, start: int = 0) -> list[Item]:
    return [Item(run=run, shard=f"training/day{i:02d}.parquet", dataset="d", seq=i) for i in range(start, start + n)]


def kill_first(q: WorkQueue, owner: str = "w1") -> str:
    """Dead-letter the next item (a permanent error); returns its id."""
    lease = q.claim(owner, 30)
    assert lease and q.release(lease, error=f"bad {lease.item.id}", permanent=True) == "dead"
    return lease.item.id


def test_max_attempts_must_be_positive(redis_server: RedisServer) -> None:
    with pytest.raises(ValueError, match=r"^max_attempts must be >= 1, got 0$"):
        make_queue(redis_server, max_attempts=0)
    q = make_queue(redis_server, max_attempts=1)  # one attempt: the first error dead-letters
    q.enqueue(items("a", 1))
    lease = q.claim("w1", 30)
    assert lease and q.release(lease, error="boom") == "dead"


def test_requeue_puts_dead_letters_back_by_run_or_by_item(redis_server: RedisServer) -> None:
    q = make_queue(redis_server, max_attempts=3)
    q.enqueue(items("a", 3) + items("b", 2))
    dead_a = [kill_first(q), kill_first(q)]  # runs are claimed in name order: a first
    assert dead_a == ["a/training/day00.parquet", "a/training/day01.parquet"]
    q.claim("w9", 30)  # holds a/day02, so the next claims reach b
    dead_b = kill_first(q)
    assert q.counts().dead == 3

    assert q.requeue(item_id="a/training/day01.parquet") == ["a/training/day01.parquet"]
    assert q.requeue(run="b") == [dead_b]
    assert q.requeue(run="b") == []
    assert sorted(q.snapshot()["runs"]["a"]["dead"]) == ["a/training/day00.parquet"]
    assert q.requeue() == ["a/training/day00.parquet"]
    snap = q.snapshot()["runs"]
    assert snap["a"]["dead"] == {} and snap["a"]["attempts"] == {} and snap["a"]["errors"] == {}
    assert snap["a"]["pending"] == ["a/training/day00.parquet", "a/training/day01.parquet"]  # in day order
    lease = q.claim("w1", 30)
    assert lease and lease.item.id == dead_b and lease.attempts == 0


def test_restore_marks_what_the_share_records_and_keeps_tokens_above_it(redis_server: RedisServer) -> None:
    q = make_queue(redis_server)
    q.enqueue(items("a", 3))
    assert q.mark_done([]) == 0
    assert q.mark_done(items("a", 2)) == 2
    assert q.mark_done(items("a", 2)) == 0  # no longer pending
    assert q.pending_in_run("a") == 1 and q.pending_in_run("b") == 0
    c = q.counts()
    assert (c.pending, c.done, c.total) == (1, 2, 3)

    assert q.raise_token(41) == 41
    assert q.raise_token(7) == 41  # never lowered
    lease = q.claim("w1", 30)
    assert lease and lease.item.seq == 2 and lease.token == 42
    late = Item(run="a", shard="training/day00.parquet", dataset="d", seq=0)
    from dataclasses import replace
    result = q.ack(replace(lease, item=late))  # a worker that trained a restored day anyway
    assert (result.state, result.by) == ("already-done", "restore from the share") and result


def test_seeded_is_recorded_where_every_version_looks(redis_server: RedisServer) -> None:
    q = make_queue(redis_server)
    assert not q.seeded()
    q.mark_seeded()
    assert q.seeded()
    raw = connect(redis_server.url, redis_server.password)
    # The stored layout is a format: an upgraded worker, `status` and redis-cli read these same keys.
    q.put_spec("a", {"lr": 0.1})
    assert raw.get("t:seeded") == b"1" and raw.hget("t:specs", "a") == b'{"lr": 0.1}'
    assert not WorkQueue(raw, prefix="u").seeded()
    assert WorkQueue(raw).keys.items == "spottrain:items"  # the default prefix the loader and workers share


def test_a_missing_spec_is_named(redis_server: RedisServer) -> None:
    with pytest.raises(KeyError, match=r"run 'a' has no hyperparameters in Redis \(seed it first\)"):
        make_queue(redis_server).spec("a")


def test_a_different_spec_for_an_existing_run_names_both(redis_server: RedisServer) -> None:
    q = make_queue(redis_server)
    q.put_spec("a", {"lr": 0.001, "epochs": 2})
    q.put_spec("a", {"epochs": 2, "lr": 0.001})  # the same spec, keys in another order
    with pytest.raises(ValueError) as caught:
        q.put_spec("a", {"lr": 0.1, "epochs": 2})
    assert str(caught.value) == (
        "run 'a' already exists with hyperparameters {'epochs': 2, 'lr': 0.001}; got {'lr': 0.1, 'epochs': 2}. "
        "A run is one model lineage: give the new hyperparameters a new run name.")


def test_ack_says_who_made_an_item_done(redis_server: RedisServer) -> None:
    q = make_queue(redis_server)
    q.enqueue(items("a", 2))
    lease = q.claim("w1", 30)
    assert lease
    first = q.ack(lease)
    assert (first.state, first.by) == ("acked", "w1") and first
    again = q.ack(lease)  # a retried ack (the reply was lost)
    assert (again.state, again.by) == ("already-done", "w1") and again
    other = q.claim("w2", 30)
    assert other
    q.release(other)
    refused = q.ack(other)
    assert (refused.state, refused.by) == ("refused", "") and not refused


def test_release_modes_and_a_refused_release(redis_server: RedisServer, caplog) -> None:
    q = make_queue(redis_server, max_attempts=2)
    q.enqueue(items("a", 1))
    lease = q.claim("w1", 30)
    assert lease and q.release(lease) == "pending"  # preempted: costs nothing
    assert q.snapshot()["runs"]["a"]["attempts"] == {}
    lease = q.claim("w1", 30)
    assert lease and q.release(lease, error="boom") == "pending"
    snap = q.snapshot()["runs"]["a"]
    assert snap["attempts"] == {lease.item.id: 1} and snap["errors"] == {lease.item.id: "boom"}
    lease = q.claim("w1", 30)
    assert lease and lease.attempts == 1
    with caplog.at_level(logging.WARNING, logger="workload.queue.workqueue"):
        assert q.release(lease, permanent=True) == "dead"  # permanent without text: still dead at once
        assert q.release(lease, error="late") is None
    assert (f"release of {lease.item.id} refused: token {lease.token} no longer holds the lease"
            in [r.getMessage() for r in caplog.records])
    assert q.snapshot()["runs"]["a"]["dead"][lease.item.id]["error"] == ""  # permanent, and no text was given


def test_heartbeat_moves_the_deadline_on(redis_server: RedisServer) -> None:
    q = make_queue(redis_server)
    q.enqueue(items("a", 1))
    lease = q.claim("w1", 1)
    assert lease
    now = q.snapshot()["now_ms"]
    assert now - 1000 <= lease.deadline_ms - 1000 <= now  # claimed within the last second, for 1 s
    deadline = q.heartbeat(lease, 3600)
    after = q.snapshot()["now_ms"]
    assert deadline and now + 3_600_000 <= deadline <= after + 3_600_000  # ttl counted from the server's now
    assert int(q.snapshot()["runs"]["a"]["lease"]["deadline"]) == deadline


def test_holds_is_false_once_the_lease_is_gone(redis_server: RedisServer) -> None:
    q = make_queue(redis_server)
    q.enqueue(items("a", 2))
    lease = q.claim("w1", 30)
    assert lease and q.holds(lease)
    assert q.ack(lease)
    assert not q.holds(lease)  # no lease on the run at all
    nxt = q.claim("w1", 30)
    assert nxt and not q.holds(lease) and q.holds(nxt)


def test_snapshot_shows_each_run_as_status_prints_it(redis_server: RedisServer) -> None:
    q = make_queue(redis_server, max_attempts=3)
    q.enqueue(items("a", 3) + items("b", 4))
    la = q.claim("w1", 30)
    assert la and la.item.run == "a"
    assert q.release(la, error="flaky") == "pending"
    la = q.claim("w1", 30)
    assert la and q.ack(la)
    dead = kill_first(q, "w2")  # a/day01
    la = q.claim("w4", 30)  # a/day02, so that the next claim reaches b
    lb = q.claim("w3", 30)
    assert la and lb and lb.item.id == "b/training/day00.parquet"
    assert q.release(la) == "pending"
    before_ms = int(time.time() * 1000)
    snap = q.snapshot()
    after_ms = int(time.time() * 1000)
    assert before_ms - 1000 <= snap["now_ms"] <= after_ms + 1000  # the server's clock, in milliseconds
    assert isinstance(snap["now_ms"], int)  # whole milliseconds, like the lease deadlines it is compared with
    a, b = snap["runs"]["a"], snap["runs"]["b"]
    assert list(snap["runs"]) == ["a", "b"]
    assert (a["total"], a["done"], b["total"], b["done"]) == (3, 1, 4, 0)
    assert list(a["dead"]) == [dead] and a["dead"][dead]["owner"] == "w2" and b["dead"] == {}
    assert a["attempts"] == {"a/training/day00.parquet": 1, dead: 1} and b["attempts"] == {}
    assert a["errors"] == {dead: f"bad {dead}"} and b["errors"] == {}  # the ack cleared day00's error
    assert a["pending"] == ["a/training/day02.parquet"] and a["lease"] is None
    assert b["pending"] == [f"b/training/day0{i}.parquet" for i in (1, 2, 3)] and a["lease"] is None
    assert b["lease"]["item"] == lb.item.id and b["lease"]["owner"] == "w3"
    assert int(b["lease"]["token"]) == lb.token and int(b["lease"]["deadline"]) == lb.deadline_ms
    c = q.counts()
    assert (c.pending, c.leased, c.done, c.dead, c.total) == (4, 1, 1, 1, 7) and not c.drained


class Backoff(threading.Event):
    """The interrupt event the worker's SIGTERM handler sets, recording each wait instead of sleeping
    through it: the retry schedule is checked without a test that takes as long as the backoff."""

    def __init__(self, stop_after: int) -> None:
        super().__init__()
        self.waits: list[float] = []
        self.stop_after = stop_after

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(float(timeout or 0))
        return len(self.waits) >= self.stop_after  # True: SIGTERM arrived during this wait


def down_queue(redis_server: RedisServer, retry_for_s: float, interrupt: threading.Event | None) -> WorkQueue:
    """A queue whose Redis is down (killed): no client-side retries, so each call fails at once."""
    redis_server.kill()
    client = redis.Redis(host="127.0.0.1", port=redis_server.port, password=redis_server.password,
                         retry=Retry(NoBackoff(), 0))
    return WorkQueue(client, prefix="t", retry_for_s=retry_for_s, interrupt=interrupt)


def test_an_outage_is_waited_out_with_doubling_backoff_until_sigterm(redis_server: RedisServer, caplog) -> None:
    backoff = Backoff(stop_after=8)
    q = down_queue(redis_server, retry_for_s=3600, interrupt=backoff)
    with caplog.at_level(logging.WARNING, logger="workload.queue.workqueue"), pytest.raises(QueueInterrupted) as caught:
        q.claim("w1", 30)
    assert backoff.waits == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0]  # capped at 5 s
    assert str(caught.value).startswith("stopped while Redis was unreachable (during claim): ")
    assert isinstance(caught.value, QueueUnavailable)  # the worker treats both as an infrastructure fault
    assert "Redis unreachable during claim (" in caplog.text and "retrying in 0.2s" in caplog.text


def test_an_outage_longer_than_the_budget_is_an_infrastructure_fault(redis_server: RedisServer) -> None:
    backoff = Backoff(stop_after=1000)
    q = down_queue(redis_server, retry_for_s=1.0, interrupt=backoff)
    with pytest.raises(QueueUnavailable) as caught:
        q.counts()
    assert backoff.waits == [0.2, 0.4, 0.8] and not isinstance(caught.value, QueueInterrupted)
    assert str(caught.value).startswith("Redis unreachable for 1s during counts: ")
    assert isinstance(caught.value.__cause__, redis.ConnectionError)


def test_a_wrong_password_is_not_waited_out(redis_server: RedisServer) -> None:
    backoff = Backoff(stop_after=1000)
    q = WorkQueue(connect(redis_server.url, "wrong"), prefix="t", retry_for_s=3600, interrupt=backoff)
    with pytest.raises(redis.AuthenticationError):
        q.counts()
    assert backoff.waits == []


def test_without_a_stop_event_an_outage_is_still_waited_out(redis_server: RedisServer) -> None:
    q = down_queue(redis_server, retry_for_s=0.5, interrupt=None)  # waits 0.2 s, then 0.4 s is past the budget
    with pytest.raises(QueueUnavailable, match=r"^Redis unreachable for 0s during reap: "):
        q.reap()


def test_an_outage_names_the_call_it_stopped(redis_server: RedisServer) -> None:
    """The worker's EXIT_INFRA message says which queue call could not reach Redis."""
    q = down_queue(redis_server, retry_for_s=0, interrupt=Backoff(stop_after=1000))
    lease = None
    calls = {
        "enqueue": lambda: q.enqueue(items("a", 1)), "put_spec": lambda: q.put_spec("a", {}),
        "spec": lambda: q.spec("a"), "claim": lambda: q.claim("w1", 30), "holds": lambda: q.holds(lease),
        "ack": lambda: q.ack(lease), "release": lambda: q.release(lease), "reap": q.reap,
        "raise_token": lambda: q.raise_token(3), "requeue": q.requeue, "mark_done": lambda: q.mark_done(items("a", 1)),
        "mark_seeded": q.mark_seeded, "seeded": q.seeded, "pending_in_run": lambda: q.pending_in_run("a"),
        "counts": q.counts, "snapshot": q.snapshot, "known": q.known, "reapply": lambda: q.reapply(lease, []),
    }
    from workload.queue.workqueue import Lease
    lease = Lease(item=items("a", 1)[0], token=1, owner="w1", deadline_ms=0, attempts=0)
    for what, call in calls.items():
        with pytest.raises(QueueUnavailable) as caught:
            call()
        assert str(caught.value).startswith(f"Redis unreachable for 0s during {what}: "), what


def test_status_reads_each_view_in_one_transaction(redis_server: RedisServer) -> None:
    """`counts` and `snapshot` read in MULTI/EXEC, so `status` never shows a torn view (an item both
    pending and done, or none of them): counted by the server itself."""
    q = make_queue(redis_server)
    q.enqueue(items("a", 2))
    raw = connect(redis_server.url, redis_server.password)

    def transactions() -> int:
        return int(raw.info("commandstats").get("cmdstat_exec", {}).get("calls", 0))

    before = transactions()
    q.counts()
    assert transactions() == before + 1
    q.snapshot()
    assert transactions() == before + 2
    q.known()  # what restore compares with the share: ids, specs and token from one instant
    assert transactions() == before + 3


def test_status_shows_ids_that_are_not_utf8(redis_server: RedisServer) -> None:
    """A queue holding bytes that are not UTF-8 (hand-made entries) is still shown, never a crash."""
    q = make_queue(redis_server, max_attempts=5)
    raw = connect(redis_server.url, redis_server.password)
    bad = b"a/\xff.parquet"  # a valid item stored under an id that is not UTF-8
    raw.hset("t:items", mapping={bad: '{"run": "a", "shard": "\ufffd.parquet", "dataset": "d", "seq": 1}'.encode(),
                                 b"a/\xfe": b"not json", b"a/\xfdx": b"{}"})
    raw.sadd("t:runs", "a")
    raw.zadd("t:pending:a", {b"a/\xfe": 0, bad: 1, b"a/\xfdx": 2})
    lease = q.claim("w1", 30)  # dead-letters a/\xfe on the way
    assert lease and lease.item.id == "a/\ufffd.parquet"
    q.release(lease, error="boom")
    raw.hset("t:errors", bad, b"disk \xff")  # an error text in another encoding
    lease = q.claim("w1", 30)
    assert lease
    snap = q.snapshot()["runs"]["a"]
    assert snap["lease"]["item"] == "a/\ufffd.parquet" and snap["pending"] == ["a/\ufffdx"]
    assert list(snap["dead"]) == ["a/\ufffd"] and snap["total"] == 3
    assert snap["attempts"] == {"a/\ufffd.parquet": 1, "a/\ufffd": 1}
    assert snap["errors"]["a/\ufffd.parquet"] == "disk \ufffd"


def test_status_places_dead_letters_of_runs_named_like_paths(redis_server: RedisServer) -> None:
    """Runs in a hand-made queue may be named `team` and `team/a`: an item is shown under the run its JSON
    names when that run has a queue, else under the longest run its id starts with, and an id no run
    owns does not break `status`."""
    raw = connect(redis_server.url, redis_server.password)
    q = make_queue(redis_server)
    planted = {"team/a/x": ("team/a", b"not json"), "team/a/y": ("team/a", b'{"run": "team"}'),
               "team/z": ("team", b"[]"), "ghost/w": ("team", b"{}"), "team": ("team", b"{}"),
               "team x": ("team", b"{}")}
    for i, (item_id, (run, text)) in enumerate(planted.items()):
        raw.hset("t:items", item_id, text)
        raw.sadd("t:runs", run)
        raw.zadd(f"t:pending:{run}", {item_id: i})
    assert q.claim("w1", 30) is None  # every one is malformed: all dead-lettered
    runs = q.snapshot()["runs"]
    assert sorted(runs["team/a"]["dead"]) == ["team/a/x"]
    assert sorted(runs["team"]["dead"]) == ["team", "team/a/y", "team/z"]  # an id that is the run's own name
    assert runs["team"]["total"] + runs["team/a"]["total"] == 4 and q.counts().dead == 6


def test_known_reads_the_ids_the_runs_with_hyperparameters_and_the_token_together(redis_server: RedisServer) -> None:
    """What restore compares with the share; ids or run names that are not UTF-8 (hand-made entries) are shown
    with a replacement character, never a crash."""
    q = make_queue(redis_server)
    assert q.known() == (set(), set(), 0)
    q.enqueue(items("a", 2) + items("b", 1))
    q.put_spec("a", {"lr": 0.1})
    assert q.claim("w1", 30) and q.claim("w2", 30)
    raw = connect(redis_server.url, redis_server.password)
    raw.hset("t:items", b"c/\xff", b"{}")
    raw.hset("t:specs", b"r\xfe", b"{}")
    assert q.known() == ({"a/training/day00.parquet", "a/training/day01.parquet", "b/training/day00.parquet",
                          "c/\ufffd"}, {"a", "r\ufffd"}, 2)


def test_reapply_puts_done_days_back_and_reorders_pending_ones_only_under_the_runs_lease(
        redis_server: RedisServer) -> None:
    """After a rewind: a done later day goes back to pending (returned) and is acked afresh, a pending one moves to
    its new place; a stale lease changes nothing."""
    q = make_queue(redis_server)
    q.enqueue(items("a", 4))
    for _ in range(2):
        done = q.claim("w1", 30)
        assert done and q.ack(done)
    stale = done
    lease = q.claim("w1", 30)
    assert lease and lease.item.seq == 2
    day01, day03 = items("a", 1, start=1)[0].id, items("a", 1, start=3)[0].id
    assert q.reapply(stale, [(day01, 5)]) is None
    assert (q.counts().done, q.pending_in_run("a")) == (2, 1)
    assert q.reapply(lease, [(day01, 5), (day03, 4), ("a/training/unknown.parquet", 1)]) == [day01]
    c = q.counts()
    assert (c.pending, c.leased, c.done, c.total) == (2, 1, 1, 4)
    assert q.snapshot()["runs"]["a"]["pending"] == [day03, day01]  # by their new seq: 4, then 5
    assert q.ack(lease)
    order = []
    while (nxt := q.claim("w1", 30)) is not None:
        order.append(nxt.item.id)
        assert q.ack(nxt).state == "acked"  # day01's earlier ack was forgotten: acked afresh
    assert order == [day03, day01]


@pytest.mark.parametrize(("exc", "waited_out"), [
    (redis.ConnectionError("Connection refused"), True),
    (redis.TimeoutError("Timeout reading from socket"), True),
    (redis.AuthenticationError("invalid password"), False),  # a ConnectionError, but waiting will not fix it
    (redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."), True),
    (redis.exceptions.ReadOnlyError("You can't write against a read only replica."), True),
    (redis.exceptions.MasterDownError("Link with MASTER is down"), True),
    (redis.exceptions.TryAgainError("Multiple keys request during rehashing of slot"), True),
    (redis.exceptions.ClusterDownError("The cluster is down"), True),
    (redis.ResponseError("BUSY Redis is busy running a script. You can only call SCRIPT KILL"), True),
    (redis.ResponseError("LOADING Redis is loading the dataset in memory"), True),
    (redis.ResponseError("Error running script (call to f_1): @user_script:3: -MISCONF Redis is configured to "
                         "save RDB snapshots, but it's currently unable to persist to disk"), True),
    (redis.ResponseError("ERR unknown command 'FOO'"), False),
    (redis.ResponseError("BUSYKEY Target key name already exists."), False),  # a code that only starts like BUSY
    (redis.ResponseError("ERR wrong number of arguments, BUSY or not"), False),  # the code inside, not as one
    (redis.RedisError("BUSY but not a reply from the server"), False),
    (ValueError("LOADING"), False),
])
def test_transient_waits_out_what_passes_and_nothing_else(exc: BaseException, waited_out: bool) -> None:
    from workload.queue.workqueue import transient

    assert transient(exc) is waited_out


def test_a_redis_out_of_memory_is_waited_out_as_unable_to_serve(redis_server: RedisServer, caplog) -> None:
    """A real state that passes: Redis over its maxmemory refuses every write (noeviction) until memory is freed."""
    backoff = Backoff(stop_after=1000)
    q = WorkQueue(connect(redis_server.url, redis_server.password), prefix="t", retry_for_s=1.0, interrupt=backoff)
    raw = connect(redis_server.url, redis_server.password)
    raw.config_set("maxmemory", 1)
    try:
        with caplog.at_level(logging.WARNING, logger="workload.queue.workqueue"), \
                pytest.raises(QueueUnavailable) as caught:
            q.enqueue(items("a", 1))
    finally:
        raw.config_set("maxmemory", 0)
    assert backoff.waits == [0.2, 0.4, 0.8]
    assert str(caught.value).startswith("Redis unable to serve for 1s during enqueue: ")
    assert "maxmemory" in str(caught.value) and "Redis unable to serve during enqueue (" in caplog.text
    assert q.enqueue(items("a", 1)) == 1  # memory back: the same call goes through


def test_a_script_called_with_other_arguments_than_its_own_is_refused_naming_both(redis_server: RedisServer) -> None:
    """A programming error caught before Redis sees it: a script's arguments are passed by name, all of them."""
    q = make_queue(redis_server)
    with pytest.raises(TypeError) as caught:
        q._ack(run="a", token=1)
    assert str(caught.value) == "script arguments are ('run', 'token', 'owner', 'id'), got ('run', 'token')"
