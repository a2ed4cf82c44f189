"""Fault injection for the crash tests: SIGKILL this process at a named point.

Set ``WORKLOAD_FAULT=<point>[:<n>]`` to die at the n-th time (default 1st) the process reaches
``point``. Unset (always, outside tests), a call is one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

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
        os.kill(os.getpid(), signal.SIGKILL)
