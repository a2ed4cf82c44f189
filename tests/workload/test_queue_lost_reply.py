"""A reply that Redis sent and the worker never read: the command ran, the connection died before its answer
arrived. A real TCP proxy sits between the worker's client and a real redis-server and, when armed, closes
both ends as soon as Redis's next reply reaches it, without forwarding it. redis-py then reconnects (through
the proxy) and sends the same command again: the queue must recognise a retried claim as it recognises a
retried ack, and charge nothing for the lost reply."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest

from workload.queue.workqueue import Item, WorkQueue, connect
from workload.runtime.redis_server import RedisServer

pytestmark = pytest.mark.timeout(30)


class ReplyDropper:
    """A TCP proxy to Redis. `arm()`: the next reply Redis sends on any connection is swallowed and that
    connection closed on both sides, so the client sees its connection die after the command was executed."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.armed = threading.Event()
        self.match = b""
        self.times = 0
        self.dropped: list[bytes] = []
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, match: bytes = b"", times: int = 1) -> None:
        """Drop the next reply (that contains `match`: another, a heartbeat's, goes through), `times` times."""
        self.match, self.times = match, times
        self.armed.set()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            with self.lock:
                self.sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if replies and self.armed.is_set() and self.match in data:
                    with self.lock:
                        if self.armed.is_set():
                            self.times -= 1
                            if self.times <= 0:
                                self.armed.clear()
                            self.dropped.append(data)
                            _close(src, dst)
                            return
                dst.sendall(data)
        _close(src, dst)

    def close(self) -> None:
        self.listener.close()
        with self.lock:
            _close(*self.sockets)


def _close(*socks: socket.socket) -> None:
    for s in socks:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        s.close()


@pytest.fixture
def dropper(redis_server: RedisServer) -> Iterator[ReplyDropper]:
    proxy = ReplyDropper(redis_server.port)
    try:
        yield proxy
    finally:
        proxy.close()


def through(proxy: ReplyDropper, server: RedisServer, **kw: object) -> WorkQueue:
    return WorkQueue(connect(f"redis://127.0.0.1:{proxy.port}/0", server.password), prefix="t", **kw)


def test_a_claim_whose_reply_was_lost_is_recognised_when_retried_and_costs_no_attempt(
        redis_server: RedisServer, dropper: ReplyDropper) -> None:
    q = through(dropper, redis_server, max_attempts=1)
    assert q.claim("w0", 30) is None  # the claim script is loaded now: the armed reply is the claim's own
    q.enqueue([Item(run="a", shard="training/day0.parquet", dataset="d", seq=0)])
    dropper.arm()  # the claim below runs in Redis; its reply never reaches the worker
    lease = q.claim("w1", 30)
    assert b"training/day0.parquet" in b"".join(dropper.dropped), f"no claim reply was dropped: {dropper.dropped}"
    assert lease is not None, "the retried claim did not get the lease its lost reply carried"
    assert (lease.item.run, lease.attempts) == ("a", 0)
    assert q.heartbeat(lease, 30), "the lease returned on retry is not the one Redis holds"
    assert q.ack(lease).state == "acked"
    c = q.counts()
    assert (c.done, c.dead, c.pending, c.leased) == (1, 0, 0, 0)
    assert redis_server.client().hget("t:attempts", "a/training/day0.parquet") is None


def test_a_new_claim_by_the_same_worker_still_takes_the_next_run(redis_server: RedisServer) -> None:
    """Recognising a retry must not make a worker's second, genuine claim return its first lease again."""
    q = WorkQueue(connect(redis_server.url, redis_server.password), prefix="t")
    q.enqueue([Item(run=r, shard="training/day0.parquet", dataset="d", seq=0) for r in ("a", "b")])
    first, second = q.claim("w1", 30), q.claim("w1", 30)
    assert first and second and {first.item.run, second.item.run} == {"a", "b"}
    assert second.token == first.token + 1


def test_counts_read_after_the_clients_own_retries_ran_out_are_read_whole(
        redis_server: RedisServer, dropper: ReplyDropper) -> None:
    """redis-py retries a transaction 3 times itself, then raises and empties the pipeline; the queue's own retry
    (Redis restarting: an infrastructure fault) must send the commands again, not an empty pipeline whose []
    a worker once failed to unpack (`ValueError: not enough values to unpack (expected 3, got 0)`)."""
    q = through(dropper, redis_server, retry_for_s=30)
    q.enqueue([Item(run="a", shard=f"training/day{i}.parquet", dataset="d", seq=i) for i in range(3)])
    lease = q.claim("w1", 30)
    assert lease and q.ack(lease).state == "acked"
    dropper.arm(b"+QUEUED", times=4)  # the counts transaction's replies, once and for each of redis-py's 3 retries
    c = q.counts()
    assert len(dropper.dropped) == 4 and not dropper.armed.is_set()
    assert (c.done, c.dead, c.pending, c.leased, c.total) == (1, 0, 2, 0, 3)
