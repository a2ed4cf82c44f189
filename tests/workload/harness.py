"""Test harness: a tiny dataset on a local share, a real Redis, real worker processes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

if __package__:  # imported as tests.workload.harness (bench/recovery.py), not from tests/workload on sys.path
    from . import zygote
else:
    import zygote

from workload.data import simulator
from workload.data.manifest import MANIFEST, write_manifest
from workload.queue.workqueue import Counts, Lease, WorkQueue, connect
from workload.runtime.redis_server import RedisServer
from workload.share.checkpoint import CheckpointStore

ROOT = Path(__file__).resolve().parents[2]
# A worker: a child of the test's zygote (zygote.py), or of the test itself under ZYGOTE=0.
Proc = subprocess.Popen[bytes] | zygote.ForkedProcess
TINY = simulator.SimulationSpec(customers=400, terminals=300, train_days=6, test_days=2,
                                start_date="2018-04-01", seed=7)
# Enough epochs that a shard takes ~1 s: kills land mid-training and mid-shard checkpoints happen. Each day
# alone (window_days 1): with the default window (all of a 6-day run's days so far) a day would take up to 6x
# longer as the run grows, and the fault tests' timing is per day; the window's own resume is tested in
# test_worker_restore_inprocess.py.
HPARAMS = {"epochs": 40, "batch_size": 64, "hidden": [32, 16], "window_days": 1}


def make_dataset(folder: Path) -> Path:
    """The tiny dataset, simulated once and validated, laid out as seed would."""
    root = folder / "fraud"
    if not (root / MANIFEST).exists():
        simulator.generate(root, TINY)
        write_manifest(root)
    return root


# Set by `make mutation` (bench/mutation.py) for a group whose Group.fixture_cache allows it: a folder where an
# expensive fixture built by unmutated code is kept for every mutant's test session (see built_once).
FIXTURE_CACHE_ENV = "MUTATION_FIXTURE_CACHE"
BUILT_AT = ".built-at"  # in a kept folder: where it was built


def built_once(name: str, target: Path, build: Callable[[Path], None]) -> Path:
    """``build(target)``, or under `make mutation` a copy of the folder it built the first time.

    mutmut runs each mutant's tests in a fresh pytest session, so a module fixture that runs `workload local`
    (tens of seconds) is paid once per mutant. Where the harness allows it (``FIXTURE_CACHE_ENV``), the folder
    built in a session with no mutant active (mutmut's clean and stats runs: MUTANT_UNDER_TEST empty or
    "stats") is kept, and later sessions start from a copy of it. A session with a mutant active never fills
    the cache: its folder was built by the mutant. Outside `make mutation` this is ``build(target)``."""
    cache = os.environ.get(FIXTURE_CACHE_ENV)
    kept = Path(cache) / name if cache else None
    if kept is not None and kept.is_dir():
        shutil.copytree(kept, target, symlinks=True)
        # What the workers wrote names the folder they wrote it in (a report's checkpoint paths): as if the
        # copy had been built where it now is.
        built_at = (kept / BUILT_AT).read_text()
        (target / BUILT_AT).unlink()
        for path in target.rglob("*"):
            if path.suffix in (".txt", ".json", ".jsonl") and path.is_file():
                text = path.read_text()
                if built_at in text:
                    path.write_text(text.replace(built_at, str(target)))
        return target
    build(target)
    if kept is not None and os.environ.get("MUTANT_UNDER_TEST", "") in ("", "stats"):
        staging = kept.with_name(f".{name}.{os.getpid()}")
        shutil.copytree(target, staging, symlinks=True)
        (staging / BUILT_AT).write_text(str(target))
        try:
            staging.rename(kept)  # atomic; a concurrent session that got there first keeps its copy
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
    return target


class JobSucceeded(AssertionError):
    """A test tried to start a pod that Kubernetes would not start: the Job already has a success."""


@dataclass
class Cluster:
    """One Redis, one share, and the worker processes of a test."""

    server: RedisServer
    share: Path
    dataset_src: Path
    env_extra: dict[str, str] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)
    # Every pod of the current work-queue Job, removed from `procs` or not: once one exited 0,
    # Kubernetes starts no new pod (the Job is complete when the others end), so neither may a test.
    job: list[Proc] = field(default_factory=list)

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "REDIS_URL": self.server.url, "REDIS_PASSWORD": self.server.password,
                "SHARE_DIR": str(self.share), "TORCH_THREADS": "1", "PYTHONPATH": str(ROOT),
                "LEASE_TTL_SECONDS": "3", "CHECKPOINT_INTERVAL_SECONDS": "0.3", "MAX_ATTEMPTS": "50",
                "REDIS_RETRY_SECONDS": "60", **self.env_extra, **extra}

    def queue(self) -> WorkQueue:
        return WorkQueue(connect(self.server.url, self.server.password))

    def seed(self, runs: dict[str, dict] | None = None) -> None:
        target = self.share / "datasets" / "fraud"
        if not target.exists():
            shutil.copytree(self.dataset_src, target)
        runs_file = self.share.parent / "runs.json"
        runs_file.write_text(json.dumps(runs or {"main": HPARAMS}))
        argv = ["workload", "seed", "--runs-file", str(runs_file)]
        if not zygote.enabled():
            out = subprocess.run([sys.executable, "-m", *argv], env=self.env(), cwd=ROOT, capture_output=True,
                                 text=True, timeout=120)
            assert out.returncode == 0, out.stderr
            return
        log = self.share.parent / "seed.log"
        log.unlink(missing_ok=True)
        code = zygote.Zygote.get().start(argv, self.env(), ROOT, log, None).wait(120)
        assert code == 0, log.read_text(errors="replace")

    def job_succeeded(self) -> bool:
        """Whether a pod of the current Job exited 0: then Kubernetes replaces no pod, preempted or not."""
        return any(p.poll() == 0 for p in self.job)

    def new_job(self) -> None:
        """A new Job is applied (after a fix and `requeue`): its pods may start again."""
        self.job.clear()

    def start_worker(self, name: str, preexec_fn=None, **extra: str) -> Proc:
        if self.job_succeeded():
            raise JobSucceeded(f"cannot start {name}: a pod of this work-queue Job exited 0, and Kubernetes "
                               "then starts no new pod (call new_job() for a new Job)")
        argv, log_path = ["workload", "worker", "--worker-id", name], self.share.parent / f"{name}.log"
        if zygote.enabled() and preexec_fn is None:
            proc = zygote.Zygote.get().start(argv, self.env(**extra), ROOT, log_path, None)
        else:
            with open(log_path, "ab") as log:
                proc = subprocess.Popen([sys.executable, "-m", *argv], env=self.env(**extra), cwd=ROOT, stdout=log,
                                        stderr=subprocess.STDOUT, preexec_fn=preexec_fn)
        self.procs.append(proc)
        self.job.append(proc)
        return proc

    def log(self, name: str) -> str:
        path = self.share.parent / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_all(self, timeout_s: float = 180) -> list[int]:
        deadline = time.monotonic() + timeout_s
        codes = []
        for p in self.procs:
            codes.append(p.wait(max(0.1, deadline - time.monotonic())))
        return codes

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()

    def counts(self) -> Counts:
        return self.queue().counts()

    def wipe_redis(self) -> None:
        """Restart Redis without its data (a lost volume): same port and password, nothing in it."""
        self.server.kill()
        shutil.rmtree(self.server.data_dir / "appendonlydir", ignore_errors=True)
        for f in self.server.data_dir.glob("*.aof"):
            f.unlink()
        self.server.start()

    def _aof(self) -> list[Path]:
        """Redis's append-only file(s): one appendonly.aof, or appendonlydir/ (Redis 7)."""
        return [p for p in self.server.data_dir.iterdir() if p.name == "appendonlydir" or p.suffix == ".aof"]

    def copy_redis(self, to: Path) -> Path:
        """Redis's AOF as it is now (every write is fsynced to it): a backup to restore later."""
        to.mkdir(parents=True)
        for p in self._aof():
            (shutil.copytree if p.is_dir() else shutil.copyfile)(p, to / p.name)
        return to

    def restore_redis(self, backup: Path) -> None:
        """Restart Redis from an older AOF copy (a volume restored from a backup): same port and password."""
        self.server.kill()
        for p in self._aof():
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        for p in backup.iterdir():
            (shutil.copytree if p.is_dir() else shutil.copyfile)(p, self.server.data_dir / p.name)
        self.server.start()

    def outside_share(self) -> set[str]:
        """Every path under the test's folder that is not the share, Redis's data or a log: what a
        hostile item must never create."""
        base = self.share.parent
        return {str(p.relative_to(base)) for p in base.rglob("*")
                if not p.is_relative_to(self.share) and not p.is_relative_to(self.server.data_dir)
                and p.suffix != ".log" and p.name != "runs.json"}

    def final_state(self, run: str = "main") -> dict:
        loaded = CheckpointStore(self.share / "output" / run).load()
        assert loaded is not None, "no checkpoint"
        return loaded.state

    def wait_for(self, predicate, timeout_s: float = 60, what: str = "condition") -> float:
        start = time.monotonic()
        while not predicate():
            assert time.monotonic() - start < timeout_s, f"timed out waiting for {what}"
            time.sleep(0.05)
        return time.monotonic() - start


def poll_claim(q: WorkQueue, owner: str, ttl_s: float, timeout_s: float = 10) -> Lease:
    """Claim as an idle worker does, polling every 10 ms until an expired lease is reaped and taken. (Redis
    cannot tell nobody calling from its own outage: after a silent spell longer than a third of a lease's
    TTL, the first claim forgives that lease the spell once; polling on, it expires.)"""
    deadline = time.monotonic() + timeout_s
    while not (lease := q.claim(owner, ttl_s=ttl_s)):
        assert time.monotonic() < deadline, "the expired lease was never reaped"
        time.sleep(0.01)
    return lease


def is_stopped(proc: Proc) -> bool:
    """Whether `proc` is frozen by SIGSTOP (state T in /proc)."""
    try:
        return Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def same_weights(a: dict, b: dict) -> bool:
    """The trained weights and the averaged ones that score, bit for bit."""
    return all(a[part].keys() == b[part].keys() and all(torch.equal(a[part][k], b[part][k]) for k in a[part])
               for part in ("model", "averaged"))


def interruptible() -> None:
    """A `preexec_fn`: SIGINT back to its default in the child, as a terminal's Ctrl-C finds it. A test run
    started as a shell's background job inherits SIGINT ignored, and Python then installs no KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
