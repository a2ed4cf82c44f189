"""Recovery: real worker processes, one SIGKILLed or SIGTERMed mid-shard, a peer waiting to take over.

Lost training work is measured on the wall clock: a SIGKILL loses the training done since the run's
last promoted checkpoint (the manifest's mtime), or since training of the shard began if none was
promoted for it yet. A SIGTERM should lose nothing: the victim checkpoints at the next batch
boundary, and the figure is confirmed by the peer resuming at exactly that checkpoint's batch.
Resume is the time from the signal until the peer holds the item's lease, and until it trains again.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.workload.harness import Cluster
from workload.queue.workqueue import WorkQueue
from workload.runtime.redis_server import RedisServer
from workload.share.checkpoint import CheckpointStore

# "training on N rows (M of the day's), ...": the window's rows, then the day's own (Attempt.train)
_TRAINING = re.compile(r"^(\S+ \S+) INFO \S+ \[(\S+)\]: (\S+): training on \d+ rows \(\d+ of the day's\), "
                       r"(warm|cold) start", re.M)
# A day taken over: resumed from the victim's last mid-day checkpoint, or started again from its first batch when the
# victim died before promoting one (a SIGKILL within the first interval, as the miniature's 0.3 s ones can be when
# the machine is loaded): lost work is then everything since the day started.
_TAKEN_OVER = re.compile(r"(\S+): training on \d+ rows \(\d+ of the day's\), "
                         r"(?:resuming at epoch (\d+) batch (\d+)|(?:warm|cold) start)")


def takeover_point(log: str, item: str) -> tuple[int, int] | None:
    """Where a peer's `log` says it began training `item`: the (epoch, batch) it resumed at, (0, 0) when it began
    the day again from its first batch; None before it said either."""
    for m in _TAKEN_OVER.finditer(log):
        if m[1] == item:
            return (int(m[2]), int(m[3])) if m[2] is not None else (0, 0)
    return None


@dataclass(frozen=True)
class RecoveryTrial:
    signal: str
    kill_after_s: float  # into the shard's training
    lost_s: float  # training work redone by the peer
    claim_s: float  # signal -> the peer holds the lease
    resume_s: float  # signal -> the peer trains again (checkpoint loaded, features computed)
    detail: str


def _wait(predicate, timeout_s: float, what: str, poll_s: float = 0.02):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout_s
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(poll_s)


def run_trials(base: Path, dataset_src: Path, hparams: dict, signals: list[signal.Signals],
               checkpoint_interval_s: float, lease_ttl_s: float, seed: int = 0) -> list[RecoveryTrial]:
    import random

    rng = random.Random(seed)
    cluster = Cluster(server=RedisServer(base / "redis").start(), share=base / "share", dataset_src=dataset_src)
    cluster.share.mkdir(parents=True)
    cluster.env_extra.update(LEASE_TTL_SECONDS=str(lease_ttl_s), CHECKPOINT_INTERVAL_SECONDS=str(checkpoint_interval_s),
                             TORCH_THREADS="1")
    trials = []
    try:
        cluster.seed({"main": hparams})
        bench = _Bench(cluster, CheckpointStore(cluster.share / "output" / "main"), cluster.queue(),
                       {name: cluster.start_worker(name) for name in ("w0", "w1")}, set(), lease_ttl_s)
        for n, sig in enumerate(signals):
            victim, trial = bench.trial(sig, lambda: rng.uniform(checkpoint_interval_s, 2 * checkpoint_interval_s))
            trials.append(trial)
            cluster.procs.remove(bench.workers.pop(victim))
            bench.workers[f"w{n + 2}"] = cluster.start_worker(f"w{n + 2}")
        return trials
    finally:
        cluster.stop()
        cluster.server.kill()


@dataclass
class _Bench:
    """Two workers on one run, and the shards whose training a trial already interrupted."""

    cluster: Cluster
    store: CheckpointStore
    queue: WorkQueue
    workers: dict[str, subprocess.Popen[bytes]]
    seen_shards: set[str]
    lease_ttl_s: float

    def fresh_start(self) -> tuple[str, str] | None:
        """The next shard that starts training from its first batch, and the worker training it."""
        for name in self.workers:
            for m in _TRAINING.finditer(self.cluster.log(name)):
                if m[3] not in self.seen_shards:
                    return name, m[3]
        return None

    def promoted(self) -> float:
        return self.store.manifest.stat().st_mtime if self.store.manifest.exists() else 0.0

    def trial(self, sig: signal.Signals, draw_delay: Callable[[], float]) -> tuple[str, RecoveryTrial]:
        """Signal the worker of a freshly started shard `draw_delay()` seconds into it; time its peer's takeover."""
        cluster = self.cluster
        victim, item = _wait(self.fresh_start, 120, "a shard to start training")
        started = time.time()
        self.seen_shards.add(item)
        delay = draw_delay()
        time.sleep(delay)
        peer = next(name for name in self.workers if name != victim)
        log_before = len(cluster.log(peer))
        signalled = time.time()
        self.workers[victim].send_signal(sig)
        if sig == signal.SIGKILL:
            self.workers[victim].wait(30)  # dead at once: the manifest now holds its last promotion
        promoted = self.promoted()

        def lease_owner(p: str = peer) -> bool:
            lease = self.queue.snapshot()["runs"]["main"]["lease"]
            return bool(lease and lease["owner"] == p)

        _wait(lease_owner, self.lease_ttl_s + 30, f"{peer} to take {item} over")
        claimed = time.time()
        code = self.workers[victim].wait(30)
        exited = time.time()
        if sig == signal.SIGTERM:  # its final checkpoint was promoted before its release
            promoted = self.promoted()
        resume_point = _wait(lambda p=peer, n=log_before: takeover_point(cluster.log(p)[n:], item), 60,
                             f"{peer} to resume training")
        resumed = time.time()
        if sig == signal.SIGTERM and promoted >= signalled:
            lost, detail = self.saved_at(resume_point, f"exit {code} {exited - signalled:.1f}s after the signal")
        else:
            lost = signalled - max(promoted, started)
            detail = f"exit {code}; peer resumed at epoch/batch {resume_point}"
        return victim, RecoveryTrial(signal=sig.name, kill_after_s=delay, lost_s=lost, claim_s=claimed - signalled,
                                     resume_s=resumed - signalled, detail=detail)

    def saved_at(self, resume_point: tuple[int, int], exit_text: str) -> tuple[float, str]:
        """After a SIGTERM whose final checkpoint was promoted: nothing lost if the peer resumed at its batch."""
        ckpt = self.store.load()
        progress = ckpt.state["progress"] if ckpt else None
        saved_point = (progress["epoch"], progress["batch"]) if progress else None
        lost = 0.0 if saved_point == resume_point else float("nan")
        return lost, f"{exit_text}; final checkpoint at epoch/batch {saved_point}, peer resumed at {resume_point}"
