"""Chaos run: N workers drain M runs while a spot fleet's faults land on them.

What a spot fleet does to the Job, compressed into a minute: each disturbance lands at a random
instant (the schedule comes from one seed, printed, so a failure can be replayed) and is drawn from:

* SIGKILL (a node vanished) or SIGTERM (a spot notice): the worker is replaced as Kubernetes
  replaces a pod of a work-queue Job: only while none of its pods has exited 0 (after a success
  Kubernetes starts no new pod, so a worker exiting 0 too early would strand a peer's item);
* SIGSTOP for longer than the lease TTL, then SIGCONT (a frozen VM): the worker wakes up stale and
  must change nothing;
* a full share: an extra worker whose writes fail with EFBIG (RLIMIT_FSIZE, so no root is needed)
  must exit EXIT_INFRA having charged no attempt and dead-lettered nothing;
* Redis restored from an old backup (its AOF copied when only half the runs were seeded: runs,
  items, done marks and the token counter all go back in time): the workers catch the queue up from
  the share and must not exit 0 before the share's plan is applied;
* Redis out of memory (maxmemory under noeviction: every write answers OOM) or frozen (SIGSTOP), each
  for longer than the lease: the platform's fault, which must charge no attempt and lose no lease.

On top, Redis is SIGKILLed and restarted once (keeping its data) and wiped once (restarted empty:
the workers restore the queue from the share); the dataset is published without its day ``BACKFILL``,
which arrives early in the run (a backfill: a new manifest version while workers hold the old one, the
runs that applied later days rewound); and the share's output folder is copied once and put back later
(restored from an older backup, Redis current: the days Redis calls done that it lacks are trained again).
At the end every run must hold every shard exactly once, in order, nothing may be leased or pending or
dead, the surviving workers must exit 0, and each run's weights must equal an undisturbed run's, bit for bit.

``python -m bench.chaos [--workers N] [--runs M] [--events K] [--seed S]`` exits 1 on any violation.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.workload.exports import copy_files
from tests.workload.harness import HPARAMS, ROOT, Cluster, make_dataset, same_weights
from workload.core.errors import EXIT_INFRA
from workload.data.dataset import Dataset
from workload.queue.workqueue import WorkQueue
from workload.runtime.redis_server import RedisServer
from workload.share.checkpoint import CheckpointStore

DISTURBANCES = ("kill", "term", "stop", "full", "redis-old", "redis-oom", "redis-freeze")
BACKFILL = "training/2018-04-05.parquet"  # published mid-run: later than most claims, so it is a backfill


@dataclass(frozen=True)
class ChaosConfig:
    workers: int = 4
    runs: int = 8
    events: int = 20  # worker disturbances (drawn from DISTURBANCES); the Redis restart and wipe come on top
    seed: int | None = None  # None: drawn at random and printed
    gap_s: tuple[float, float] = (0.3, 2.0)  # pause before each disturbance, uniform
    lease_ttl_s: float = 3.0
    checkpoint_interval_s: float = 0.3
    timeout_s: float = 300.0


@dataclass
class ChaosResult:
    seed: int
    workers: int
    runs: int
    shards: int
    kills: int = 0
    terms: int = 0
    stops: int = 0
    full_shares: int = 0
    redis_restarts: int = 0
    redis_wipes: int = 0
    redis_old: int = 0
    redis_ooms: int = 0
    redis_freezes: int = 0
    backfills: int = 0  # a day published mid-run: a new manifest version under the workers' feet
    share_restores: int = 0  # the share's output put back from an older copy
    not_replaced: int = 0  # pods that ended after a peer exited 0: Kubernetes starts no replacement
    wall_s: float = 0.0
    lost_work_s: float = 0.0  # upper bound: per SIGKILL of a lease holder, time since its run's last promote
    violations: list[str] = field(default_factory=list)

    def summary(self) -> str:
        verdict = "OK" if not self.violations else f"{len(self.violations)} VIOLATION(S)"
        return (f"chaos seed={self.seed}: {self.workers} workers, {self.runs} runs x {self.shards} shards; "
                f"{self.kills} SIGKILL, {self.terms} SIGTERM, {self.stops} SIGSTOP past the lease, "
                f"{self.full_shares} full share, {self.redis_restarts} Redis restart, {self.redis_wipes} Redis wipe, "
                f"{self.redis_old} Redis from an old backup, {self.redis_ooms} Redis OOM, {self.redis_freezes} Redis "
                f"freeze, {self.backfills} backfill, {self.share_restores} share output from an older backup, "
                f"{self.not_replaced} pod(s) not replaced after a success; "
                f"wall {self.wall_s:.1f}s; lost work <= {self.lost_work_s:.2f}s (sum over SIGKILLs): {verdict}")


def run_specs(runs: int) -> dict[str, dict]:
    """M runs of the test hyperparameters with different seeds: distinct lineages, same cost."""
    return {f"run{i}": {**HPARAMS, "seed": i} for i in range(runs)}


def _cluster(base: Path, dataset_src: Path, cfg: ChaosConfig) -> Cluster:
    cluster = Cluster(server=RedisServer(base / "redis").start(), share=base / "share", dataset_src=dataset_src)
    cluster.share.mkdir(parents=True)
    cluster.env_extra.update(LEASE_TTL_SECONDS=str(cfg.lease_ttl_s),
                             CHECKPOINT_INTERVAL_SECONDS=str(cfg.checkpoint_interval_s), MAX_ATTEMPTS="50")
    return cluster


def reference_states(base: Path, dataset_src: Path, cfg: ChaosConfig) -> dict[str, dict]:
    """Each run's final checkpoint from undisturbed workers: what the chaos run must reproduce."""
    cluster = _cluster(base, dataset_src, cfg)
    try:
        cluster.seed(run_specs(cfg.runs))
        for i in range(min(2, cfg.workers)):
            cluster.start_worker(f"ref{i}")
        codes = cluster.wait_all(cfg.timeout_s)
        if set(codes) != {0}:
            raise RuntimeError(f"undisturbed reference workers exited {codes}: {cluster.log('ref0')[-2000:]}")
        return {run: cluster.final_state(run) for run in run_specs(cfg.runs)}
    finally:
        cluster.stop()
        cluster.server.kill()


def _lost_work_s(cluster: Cluster, run: str, claimed_at_ms: int, killed_at: float) -> float:
    """Training time since the run's last promoted checkpoint (or since the claim): lost by a SIGKILL."""
    manifest = CheckpointStore(cluster.share / "output" / run).manifest
    last = manifest.stat().st_mtime if manifest.exists() else 0.0
    return max(0.0, killed_at - max(last, claimed_at_ms / 1000))


def verify(cluster: Cluster, reference: dict[str, dict], codes: dict[str, int | None]) -> list[str]:
    """Every violation of exactly-once, drained, clean exit and bit-for-bit weights, in words."""
    problems = []
    shards = Dataset(cluster.share / "datasets" / "fraud").training_shards()
    for run, ref in reference.items():
        loaded = CheckpointStore(cluster.share / "output" / run).load()
        if loaded is None:
            problems.append(f"{run}: no checkpoint at all")
            continue
        applied = loaded.state["applied"]
        duplicated = sorted({s for s in applied if applied.count(s) > 1})
        lost = [s for s in shards if s not in applied]
        if duplicated:
            problems.append(f"{run}: shard(s) applied more than once: {duplicated}")
        if lost:
            problems.append(f"{run}: shard(s) never applied: {lost}")
        if not duplicated and not lost and applied != shards:
            problems.append(f"{run}: shards applied out of order: {applied}")
        if [h["shard"] for h in loaded.state["history"]] != applied:
            problems.append(f"{run}: report history does not match the applied shards")
        if loaded.state["progress"] is not None:
            problems.append(f"{run}: final checkpoint is mid-shard: {loaded.state['progress']}")
        if not same_weights(loaded.state, ref):
            problems.append(f"{run}: final weights differ from the undisturbed run")
    c = cluster.counts()
    if c.pending or c.leased:
        problems.append(f"queue not drained: {c.pending} pending, {c.leased} leased")
    if c.done != len(shards) * len(reference) or c.dead:
        problems.append(f"queue: {c.done} done and {c.dead} dead, expected {len(shards) * len(reference)} done")
    for name, code in codes.items():
        if code != 0:
            problems.append(f"surviving worker {name} exited {code}: {cluster.log(name)[-1500:]}")
    return problems


def run_chaos(cfg: ChaosConfig, workdir: Path) -> ChaosResult:
    seed = cfg.seed if cfg.seed is not None else random.SystemRandom().randrange(2**31)
    rng = random.Random(seed)
    dataset_src = make_dataset(workdir / "dataset")
    reference = reference_states(workdir / "reference", dataset_src, cfg)
    shards = len(Dataset(dataset_src).training_shards())
    result = ChaosResult(seed=seed, workers=cfg.workers, runs=cfg.runs, shards=shards)

    cluster = _cluster(workdir / "chaos", dataset_src, cfg)
    try:
        specs = run_specs(cfg.runs)
        export = copy_files(dataset_src, workdir / "export", keep=lambda rel: rel != BACKFILL)
        _seed(cluster, export, dict(list(specs.items())[:max(1, cfg.runs // 2)]))
        backup = cluster.copy_redis(workdir / "chaos-redis-backup")  # half the runs: a queue behind the share
        _seed(cluster, export, specs)
        fleet = _Fleet(cluster, result)
        for _ in range(cfg.workers):
            fleet.spawn()
        # The Redis restart and wipe, the backfill and the share's restore come early, so that they always
        # happen before the queue drains; the share's output is copied one event before it is put back.
        restart_at = rng.randrange(min(cfg.events, 3))
        wipe_at = rng.choice([e for e in range(min(cfg.events, 4)) if e != restart_at] or [restart_at])
        schedule = _Schedule(restart_at, wipe_at, backfill_at=rng.randrange(min(cfg.events, 2)),
                             share_old_at=1 + rng.randrange(max(1, min(cfg.events, 4) - 1)))
        started = time.monotonic()
        _disturb(fleet, cfg, rng, backup, schedule, (dataset_src, export, specs))
        codes = fleet.wait(time.monotonic() + cfg.timeout_s)
        result.wall_s = time.monotonic() - started
        result.violations += verify(cluster, reference, codes)
        return result
    finally:
        cluster.stop()
        cluster.server.kill()


@dataclass(frozen=True)
class _Schedule:
    """The events at which the one-off faults land."""

    restart_at: int
    wipe_at: int
    backfill_at: int
    share_old_at: int  # the share's output put back at this event (or the last), copied at the first


def _seed(cluster: Cluster, folder: Path, runs: dict[str, dict]) -> None:
    """`seed --datasets folder`: publish what the folder holds (new days only) and enqueue every run's days."""
    runs_file = cluster.share.parent / "runs.json"
    runs_file.write_text(json.dumps(runs))
    out = subprocess.run([sys.executable, "-m", "workload", "seed", "--datasets", str(folder), "--runs-file",
                          str(runs_file)], env=cluster.env(), cwd=ROOT, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"seed exited {out.returncode}: {out.stderr[-2000:]}")


def _one_off(fleet: _Fleet, event: int, schedule: _Schedule, rng: random.Random,
             data: tuple[Path, Path, dict[str, dict]]) -> None:
    """The faults that land once: Redis restarted and wiped, the backfill."""
    cluster, result = fleet.cluster, fleet.result
    if event == schedule.restart_at:
        cluster.server.kill()
        time.sleep(rng.uniform(0.5, 1.5))
        cluster.server.start()
        result.redis_restarts += 1
    if event == schedule.wipe_at:
        cluster.wipe_redis()
        result.redis_wipes += 1
    if event == schedule.backfill_at:
        dataset_src, export, specs = data
        copy_files(dataset_src, export, keep=lambda rel: rel == BACKFILL)
        _seed(cluster, export, specs)
        result.backfills += 1


def _share_old(fleet: _Fleet, event: int, share_old_at: int, last: bool) -> None:
    """The share's output copied once a day is trained (at the first event), and put back at `share_old_at` (or
    the last event) once a run holds more days than the copy: a restore that always loses trained days."""
    cluster, result = fleet.cluster, fleet.result
    output, backup = cluster.share / "output", cluster.share.parent / "output-backup"
    if result.share_restores:
        return
    if not backup.exists():
        _wait(lambda: any(_days_applied(output).values()))
        with fleet.frozen():  # a consistent copy, as a backup of a quiesced share would be
            shutil.copytree(output, backup)
        if not last:
            return
    if event >= share_old_at or last:
        copied = _days_applied(backup)
        _wait(lambda: any(n > copied.get(run, 0) for run, n in _days_applied(output).items()))
        with fleet.frozen():
            shutil.rmtree(output)
            shutil.copytree(backup, output)
        result.share_restores += 1


def _days_applied(output: Path) -> dict[str, int]:
    """How many days each run's newest checkpoint under `output` records."""
    found = {}
    for run_dir in sorted(output.glob("*")) if output.is_dir() else []:
        loaded = CheckpointStore(run_dir).load()
        found[run_dir.name] = len(loaded.state["applied"]) if loaded else 0
    return found


def _wait(predicate: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Poll `predicate` until true or `timeout_s` passed (the fault then lands as things are)."""
    end = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < end:
        time.sleep(0.2)


def _disturb(fleet: _Fleet, cfg: ChaosConfig, rng: random.Random, backup: Path, schedule: _Schedule,
             data: tuple[Path, Path, dict[str, dict]]) -> None:
    """The events, each after a random pause, until the queue drains or no pod is left to disturb."""
    cluster, result = fleet.cluster, fleet.result
    queue = cluster.queue()
    for event in range(cfg.events):
        time.sleep(rng.uniform(*cfg.gap_s))
        if queue.counts().drained and queue.seeded():
            break
        _one_off(fleet, event, schedule, rng, data)
        _share_old(fleet, event, schedule.share_old_at, last=event == cfg.events - 1)
        kind = rng.choice(DISTURBANCES)
        if kind.startswith("redis-"):
            _disturb_redis(cluster, kind, backup, rng, cfg, result)
            continue
        if kind == "full":
            fleet.spawn_full()
            result.full_shares += 1
            continue
        if not fleet.live:
            break  # every pod ended and the Job succeeded: nothing left to disturb
        name = rng.choice(sorted(fleet.live))
        if kind == "stop":
            fleet.freeze(name, lambda: cfg.lease_ttl_s * rng.uniform(1.3, 2.0))  # past its lease: a peer takes over
        else:
            fleet.end(name, signal.SIGKILL if kind == "kill" else signal.SIGTERM, queue)


class _Fleet:
    """The Job's pods: started, replaced as Kubernetes replaces them, signalled, and waited for at the end."""

    def __init__(self, cluster: Cluster, result: ChaosResult) -> None:
        self.cluster, self.result = cluster, result
        self.live: dict[str, subprocess.Popen[bytes]] = {}
        self.full: dict[str, subprocess.Popen[bytes]] = {}
        self.spawned = 0

    def spawn(self) -> None:
        """A pod, unless one of this work-queue Job's pods exited 0: then Kubernetes starts no more."""
        if self.cluster.job_succeeded():
            self.result.not_replaced += 1
            return
        name = f"w{self.spawned}"
        self.spawned += 1
        self.live[name] = self.cluster.start_worker(name)

    def spawn_full(self) -> None:
        """A worker on a node whose share is full: every write past 16 KiB fails (EFBIG)."""
        if self.cluster.job_succeeded():
            return
        name = f"full{self.spawned}"
        self.spawned += 1
        self.full[name] = self.cluster.start_worker(name, preexec_fn=_limit_file_size, INFRA_GIVE_UP_SECONDS="2")

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """Every live pod SIGSTOPped for the duration (well inside a lease), then SIGCONT."""
        procs = [p for p in [*self.live.values(), *self.full.values()] if p.poll() is None]
        for p in procs:
            p.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            for p in procs:
                p.send_signal(signal.SIGCONT)

    def freeze(self, name: str, for_s: Callable[[], float]) -> None:
        """SIGSTOP for `for_s()` seconds (drawn only when the pod is alive), then SIGCONT."""
        proc = self.live[name]
        if proc.poll() is None:
            proc.send_signal(signal.SIGSTOP)
            time.sleep(for_s())
            proc.send_signal(signal.SIGCONT)
            self.result.stops += 1

    def end(self, name: str, sig: signal.Signals, queue: WorkQueue) -> None:
        """SIGKILL or SIGTERM a pod (checking how it ended), then replace it."""
        result, cluster = self.result, self.cluster
        proc = self.live.pop(name)
        held = [(run, r["lease"]) for run, r in queue.snapshot()["runs"].items()
                if r["lease"] and r["lease"]["owner"] == name]
        if proc.poll() is None:
            proc.send_signal(sig)
            killed_at = time.time()
            code = proc.wait(30)
            if sig == signal.SIGKILL:
                result.kills += 1
                result.lost_work_s += sum(_lost_work_s(cluster, run, int(lease["claimed_at"]), killed_at)
                                          for run, lease in held)
            else:
                result.terms += 1
                # Before its handlers are installed (still importing) a worker dies of the signal; it
                # cannot have claimed anything yet, so that is fine. Afterwards it must exit 143 (or 0).
                started_up = "starting (lease" in cluster.log(name)
                if code not in (143, 0) and not (code == -signal.SIGTERM and not started_up):
                    result.violations.append(f"{name} exited {code} after SIGTERM: {cluster.log(name)[-1500:]}")
        elif proc.returncode != 0:
            result.violations.append(f"{name} exited {proc.returncode} undisturbed: {cluster.log(name)[-1500:]}")
        cluster.procs.remove(proc)
        self.spawn()  # Kubernetes replaces a failed or preempted pod, but none once a pod succeeded

    def wait(self, deadline: float) -> dict[str, int | None]:
        """The pods' exit codes (None: still running at `deadline`); a full-share worker's are checked here."""
        codes: dict[str, int | None] = {}
        for name, proc in self.live.items():
            try:
                codes[name] = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[name] = None
        for name, proc in self.full.items():
            try:
                code = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                code = None
            # It exits EXIT_INFRA once it hit the full share, or 0 if the queue drained before it wrote.
            if code not in (0, EXIT_INFRA) or (code == EXIT_INFRA and "File too large" not in self.cluster.log(name)):
                self.result.violations.append(
                    f"full-share worker {name} exited {code}: {self.cluster.log(name)[-1500:]}")
        return codes


def _disturb_redis(cluster: Cluster, kind: str, backup: Path, rng: random.Random, cfg: ChaosConfig,
                   result: ChaosResult) -> None:
    """Redis goes back in time, runs out of memory, or freezes: the platform's faults."""
    if kind == "redis-old":
        cluster.restore_redis(backup)
        result.redis_old += 1
        return
    hold = cfg.lease_ttl_s * rng.uniform(1.3, 2.0)  # past every lease
    if kind == "redis-oom":
        admin = cluster.server.client()
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", "1")
        time.sleep(hold)
        admin.config_set("maxmemory", "0")
        result.redis_ooms += 1
        return
    assert cluster.server.proc is not None
    cluster.server.proc.send_signal(signal.SIGSTOP)
    time.sleep(hold)
    cluster.server.proc.send_signal(signal.SIGCONT)
    result.redis_freezes += 1


def _limit_file_size() -> None:
    """preexec_fn: this process may write no file past 16 KiB (a checkpoint is ~30 KiB): a full share
    without root. Python ignores SIGXFSZ, so the write fails with EFBIG instead of killing it."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--workers", type=int, default=ChaosConfig.workers)
    p.add_argument("--runs", type=int, default=ChaosConfig.runs)
    p.add_argument("--events", type=int, default=ChaosConfig.events, help="worker and Redis disturbances")
    p.add_argument("--seed", type=int, help="replay a schedule (default: random, printed)")
    p.add_argument("--dir", type=Path, help="keep the clusters' files here (default: a temp folder)")
    args = p.parse_args(argv)
    # Worker processes started through the tests' harness are fresh interpreters here, as a pod's are (the
    # harness forks them from a zygote that imported torch, to spare the test suite's CPU: tests/workload/zygote.py).
    os.environ.setdefault("ZYGOTE", "0")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    print(f"chaos seed {seed} (replay with --seed {seed}): {args.workers} workers, {args.runs} runs, "
          f"{args.events} disturbances (worker and Redis faults) + 1 Redis restart + 1 Redis wipe", flush=True)
    cfg = ChaosConfig(workers=args.workers, runs=args.runs, events=args.events, seed=seed)
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        workdir = args.dir or Path(tmp)
        result = run_chaos(cfg, workdir)
    print(result.summary())
    for v in result.violations:
        print(f"VIOLATION: {v}", file=sys.stderr)
    return 1 if result.violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
