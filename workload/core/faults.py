"""Fault injection for the crash tests: disturb this process at a named point.

``WORKLOAD_FAULT=<point>[:<n>]`` fires at the n-th time (default the 1st) the process reaches
``point``; ``WORKLOAD_FAULT_ACTION`` says what happens there:

* ``kill`` (default): SIGKILL itself: a node that vanished;
* ``stop``: SIGSTOP itself: a frozen VM, a long GC pause. The test resumes it with SIGCONT after
  its lease expired, and it must then change nothing (fencing);
* ``term``: SIGTERM itself and carry on: a spot preemption notice at exactly that instant;
* ``hang``: block the calling thread forever, the rest of the process (the heartbeat) running on:
  a read from a hung NFS mount, which the watchdog must end.

Points, in the order an item meets them:

* ``claimed``: the lease was just granted, nothing read yet;
* ``read``: the day's files are about to be read (where a hung share blocks);
* ``mid-write``: half of a file written under its temporary name (checkpoints, manifests, reports);
* ``checkpoint-written``: a checkpoint file is complete under its final name, not yet promoted;
* ``promote``: ownership was last confirmed (Redis said the lease is ours), immediately before the
  promotion takes effect on the share: the check-then-act window that fencing at the storage closes;
* ``after-promote``: the shard's final checkpoint is promoted, the report not yet written;
* ``report``: immediately before the report, metrics and pictures are rewritten;
* ``before-ack``: everything is on the share; the queue does not know yet;
* ``acked``: the queue recorded the ack; whether it finished the run (and exports it) is not decided yet.

And in ``seed``, while a dataset is published (workload.data.publish):

* ``staged``: the new days are copied to the staging folder and validated; nothing is published yet;
* ``day-moved``: one new day was moved into the published dataset (fires once per day), the manifest
  not yet replaced: the day is on the share, unnamed;
* ``published``: the manifest names the new days (or the first publish's folder was renamed into
  place); the staging folder is not removed yet.

Unset (always, outside tests), a call is one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import threading

POINTS = ("claimed", "read", "mid-write", "checkpoint-written", "promote", "after-promote", "report", "before-ack",
          "acked", "staged", "day-moved", "published")
ACTIONS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "term": signal.SIGTERM}

_hits: dict[str, int] = {}


def point(name: str) -> None:
    spec = os.environ.get("WORKLOAD_FAULT")
    if not spec:
        return
    target, _, nth = spec.partition(":")
    if target != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] == int(nth or 1):
        action = os.environ.get("WORKLOAD_FAULT_ACTION", "kill")
        if action == "hang":
            threading.Event().wait()
        if action not in ACTIONS:
            raise ValueError(f"WORKLOAD_FAULT_ACTION={action!r} is not allowed: use one of {sorted(ACTIONS)} or hang")
        os.kill(os.getpid(), ACTIONS[action])
