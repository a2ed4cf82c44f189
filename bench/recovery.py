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
import time
from dataclasses import dataclass
from pathlib import Path

from tests.workload.harness import Cluster
from workload.runtime.redis_server import RedisServer
from workload.share.checkpoint import CheckpointStore

# "training on N rows (M of the day's), ...": the window's rows, then the day's own (Attempt.train)
_TRAINING = re.compile(r"^(\S+ \S+) INFO \S+ \[(\S+)\]: (\S+): training on \d+ rows \(\d+ of the day's\), "
                       r"(warm|cold) start", re.M)
_RESUMING = re.compile(r"(\S+): training on \d+ rows \(\d+ of the day's\), resuming at epoch (\d+) batch (\d+)")


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
    store = CheckpointStore(cluster.share / "output" / "main")
    queue = cluster.queue()
    trials = []
    try:
        cluster.seed({"main": hparams})
        workers = {name: cluster.start_worker(name) for name in ("w0", "w1")}
        seen_shards: set[str] = set()
        for n, sig in enumerate(signals):
            # The next shard that starts training from its first batch, and the worker training it.
            def fresh_start() -> tuple[str, str] | None:
                for name in workers:
                    for m in _TRAINING.finditer(cluster.log(name)):
                        if m[3] not in seen_shards:
                            return name, m[3]
                return None

            victim, item = _wait(fresh_start, 120, "a shard to start training")
            started = time.time()
            seen_shards.add(item)
            delay = rng.uniform(checkpoint_interval_s, 2 * checkpoint_interval_s)
            time.sleep(delay)
            peer = next(name for name in workers if name != victim)
            log_before = len(cluster.log(peer))
            signalled = time.time()
            workers[victim].send_signal(sig)
            if sig == signal.SIGKILL:
                workers[victim].wait(30)  # dead at once: the manifest now holds its last promotion
            promoted = store.manifest.stat().st_mtime if store.manifest.exists() else 0.0

            def lease_owner(p: str = peer) -> bool:
                lease = queue.snapshot()["runs"]["main"]["lease"]
                return bool(lease and lease["owner"] == p)

            _wait(lease_owner, lease_ttl_s + 30, f"{peer} to take {item} over")
            claimed = time.time()
            code = workers[victim].wait(30)
            exited = time.time()
            if sig == signal.SIGTERM:  # its final checkpoint was promoted before its release
                promoted = store.manifest.stat().st_mtime if store.manifest.exists() else 0.0
            resumed_at = _wait(lambda p=peer, n=log_before: _RESUMING.search(cluster.log(p)[n:]), 60,
                               f"{peer} to resume training")
            resumed = time.time()
            resume_point = (int(resumed_at[2]), int(resumed_at[3]))
            if sig == signal.SIGTERM and promoted >= signalled:
                ckpt = store.load()
                progress = ckpt.state["progress"] if ckpt else None
                saved_point = (progress["epoch"], progress["batch"]) if progress else None
                lost = 0.0 if saved_point == resume_point else float("nan")
                detail = (f"exit {code} {exited - signalled:.1f}s after the signal; final checkpoint at "
                          f"epoch/batch {saved_point}, peer resumed at {resume_point}")
            else:
                lost = signalled - max(promoted, started)
                detail = f"exit {code}; peer resumed at epoch/batch {resume_point}"
            trials.append(RecoveryTrial(signal=sig.name, kill_after_s=delay, lost_s=lost,
                                        claim_s=claimed - signalled, resume_s=resumed - signalled, detail=detail))
            cluster.procs.remove(workers.pop(victim))
            workers[f"w{n + 2}"] = cluster.start_worker(f"w{n + 2}")
        return trials
    finally:
        cluster.stop()
        cluster.server.kill()
