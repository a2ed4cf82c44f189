"""The lease's heartbeat: renew it while the worker makes progress, notice when it is lost, and give
it up (exit `EXIT_STALLED`) when the worker is stuck in I/O instead of renewing it forever."""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import redis

from workload.core.errors import EXIT_STALLED
from workload.queue.workqueue import Lease, WorkQueue, transient

log = logging.getLogger(__name__)


class LeaseLost(Exception):
    """Our lease expired or was taken over: stop, promote nothing, ack nothing."""


class Heartbeat(threading.Thread):
    """Extends the lease in the background while the worker makes progress; sets `lost` when the
    lease is no longer ours. A connection error is not a lost lease: the lease stays valid until its
    deadline, so beats are retried until then. No progress for `stall_s` (a read that never
    returns): give the lease up at no cost and exit, instead of renewing it forever."""

    def __init__(self, queue: WorkQueue, lease: Lease, ttl_s: float, interval_s: float,
                 progress: Any = None, stall_s: float = float("inf")) -> None:
        super().__init__(daemon=True, name="heartbeat")
        self.queue, self.lease, self.ttl_s, self.interval_s = queue, lease, ttl_s, interval_s
        self.lost = threading.Event()
        self._done = threading.Event()
        self._valid_until = time.monotonic() + ttl_s
        self._progress = progress or (lambda: time.monotonic())
        self.stall_s = stall_s

    def beat(self) -> bool | None:
        """One heartbeat: True renewed, False lost (Redis said so, or the validity ran out), None when
        Redis did not answer but the lease may still be valid."""
        sent = time.monotonic()  # the server's deadline is later than sent + ttl: a safe lower bound
        try:
            if self.queue.heartbeat(self.lease, self.ttl_s) is None:
                self.lost.set()
                return False
            self._valid_until = sent + self.ttl_s
            return True
        except redis.RedisError as exc:
            if not transient(exc):  # out of memory, loading, unreachable: Redis's fault, not the lease's
                raise
            if time.monotonic() >= self._valid_until:
                log.warning("heartbeat for %s failed (%s) and the lease's validity ran out", self.lease.item.id, exc)
                self.lost.set()
                return False
            log.warning("heartbeat for %s failed (%s); the lease is valid for %.1fs more: retrying",
                        self.lease.item.id, exc, self._valid_until - time.monotonic())
            return None

    def confirm(self) -> bool:
        """Ownership proven by Redis now (the check before a promotion), riding out a blip while the
        lease is still valid; False only when it is really lost."""
        while not self.lost.is_set():
            ok = self.beat()
            if ok is not None:
                return ok
            time.sleep(min(0.2, max(0.0, self._valid_until - time.monotonic())))
        return False

    def run(self) -> None:
        while not self._done.wait(self.interval_s) and not self.lost.is_set():
            stuck = time.monotonic() - self._progress()
            if stuck > self.stall_s:
                self._give_up(stuck)
            ok = self.beat()
            while ok is None and not self._done.wait(min(0.5, self.interval_s)):
                ok = self.beat()

    def _give_up(self, stuck: float) -> None:
        log.error("watchdog: no progress on %s for %.0fs (stuck in I/O: a hung share, a FIFO?); giving the "
                  "lease up at no cost and exiting %d", self.lease.item.id, stuck, EXIT_STALLED)
        try:
            self.queue.release(self.lease)
        except Exception as exc:  # noqa: BLE001 - exiting anyway: the lease then expires
            log.error("could not release %s: %s", self.lease.item.id, exc)
        logging.shutdown()
        os._exit(EXIT_STALLED)

    def stop(self) -> None:
        self._done.set()
