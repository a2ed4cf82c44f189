"""Queue throughput: client *processes* doing claim + ack against the real Redis server.

Processes, not threads: the Python client holds the GIL while it encodes commands, so threads
would measure the interpreter. Forked (the clients touch no torch state), and the clock starts
only once every client has connected.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import dataclass
from multiprocessing.synchronize import Event

from workload.queue.workqueue import Item, WorkQueue, connect

RUNS = 16  # >= 2x the most clients: a run is leased to one worker at a time, so clients need runs


@dataclass(frozen=True)
class QueueFigure:
    clients: int
    pairs: int
    seconds: float

    @property
    def per_s(self) -> float:
        return self.pairs / self.seconds


def _client(url: str, password: str, prefix: str, name: str, go: Event, seconds: float,
            out: mp.Queue) -> None:
    queue = WorkQueue(connect(url, password), prefix)
    queue.counts()  # connect and load the scripts before the clock starts
    out.put("ready")
    go.wait()
    stop = time.monotonic() + seconds
    pairs = 0
    while time.monotonic() < stop:
        lease = queue.claim(name, 30.0)
        if lease is None:
            continue
        if queue.ack(lease):
            pairs += 1
    out.put(pairs)


def seed(url: str, password: str, prefix: str, items_per_run: int) -> None:
    """RUNS runs of `items_per_run` items each, enqueued and the queue marked seeded as `seed` leaves it
    (no share here: the clients only claim and ack, and nothing reads a dataset or a run record)."""
    queue = WorkQueue(connect(url, password), prefix)
    for run in range(RUNS):
        queue.put_spec(f"r{run}", {})
    queue.enqueue(Item(run=f"r{run}", shard=f"s{i:06d}", dataset="none", seq=i)
                  for run in range(RUNS) for i in range(items_per_run))
    queue.mark_seeded()


def measure(url: str, password: str, prefix: str, clients: int, seconds: float) -> QueueFigure:
    """`clients` processes claim and ack for `seconds`; counts completed claim+ack pairs."""
    ctx = mp.get_context("fork")
    out: mp.Queue = ctx.Queue()
    go = ctx.Event()
    procs = [ctx.Process(target=_client, args=(url, password, prefix, f"c{i}", go, seconds, out))
             for i in range(clients)]
    for p in procs:
        p.start()
    for _ in procs:
        out.get(timeout=60)
    go.set()
    pairs = sum(out.get(timeout=seconds + 60) for _ in procs)
    for p in procs:
        p.join(10)
    return QueueFigure(clients=clients, pairs=pairs, seconds=seconds)
