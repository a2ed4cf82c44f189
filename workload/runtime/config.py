"""The worker's settings: lease, heartbeat, checkpoint and stop budgets, validated once."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from workload.core import preemption


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class WorkerConfig:
    share: Path
    redis_url: str
    redis_password: str | None = field(default=None, repr=False)
    prefix: str = "spottrain"
    worker_id: str = field(default_factory=default_worker_id)
    lease_ttl_s: float = 30.0
    heartbeat_s: float | None = None  # default: a third of the lease TTL
    checkpoint_interval_s: float = 10.0
    max_attempts: int = 5
    idle_poll_s: float = 0.5
    keep_checkpoints: int = 3
    term_budget_s: float = preemption.CHECKPOINT_BUDGET_S  # a final checkpoint after SIGTERM if the last took less
    term_grace_s: float = preemption.STOP_WITHIN_S  # SIGTERM ends the process within this, whatever it waits on
    plot_interval_s: float = 30.0  # pictures are redrawn at most this often, and after a run's last shard
    redis_retry_s: float = 300.0
    infra_give_up_s: float = 300.0  # an infrastructure fault persisting this long: exit EXIT_INFRA
    infra_backoff_s: float = 1.0  # first pause after an infrastructure fault; doubles up to 30 s
    stall_s: float = 300.0  # no progress (stuck in I/O) this long: give the lease up, exit EXIT_STALLED
    # Runs of one day of one dataset a worker leases and trains as one stacked model (runtime/packing.py); 1 trains
    # one item at a time, as before packing existed. The GPU default is to be chosen from measurements on a GPU.
    pack_runs: int = 1

    def __post_init__(self) -> None:
        checks = [("lease_ttl_s", self.lease_ttl_s > 0), ("checkpoint_interval_s", self.checkpoint_interval_s > 0),
                  ("max_attempts", self.max_attempts >= 1), ("keep_checkpoints", self.keep_checkpoints >= 1),
                  ("term_grace_s", self.term_grace_s > 0), ("infra_give_up_s", self.infra_give_up_s > 0),
                  ("infra_backoff_s", self.infra_backoff_s > 0), ("stall_s", self.stall_s > 0),
                  ("pack_runs", self.pack_runs >= 1)]
        for name, ok in checks:
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r} is not allowed: it must be positive")
        if self.heartbeat_s is not None and not 0 < self.heartbeat_s < self.lease_ttl_s:
            raise ValueError(f"heartbeat_s={self.heartbeat_s} must be > 0 and below lease_ttl_s={self.lease_ttl_s}")

    @property
    def heartbeat_interval(self) -> float:
        return self.heartbeat_s or self.lease_ttl_s / 3
