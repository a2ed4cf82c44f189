"""The worker under real faults: SIGKILL at every dangerous point, SIGTERM, a Redis restart, poison.

Each disturbed run must end with every shard applied exactly once, nothing leased or pending,
the surviving workers exiting 0, and (CPU, fixed seeds) the same weights as an undisturbed run.
"""

from __future__ import annotations

import pickle
import random
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass

import pandas as pd
import pytest
import zygote
from harness import ROOT, Cluster, is_stopped, same_weights

from workload.core.errors import EXIT_DEAD_LETTERS
from workload.data.dataset import Dataset
from workload.model.report import rendered_from as report_source
from workload.queue.workqueue import Item
from workload.share.checkpoint import CheckpointStore

pytestmark = pytest.mark.timeout(300)


def assert_exactly_once(cluster: Cluster, reference: dict) -> None:
    shards = Dataset(cluster.share / "datasets" / "fraud").training_shards()
    state = cluster.final_state()
    assert state["applied"] == shards, "every shard applied once, in chronological order"
    assert [h["shard"] for h in state["history"]] == shards
    assert state["progress"] is None
    c = cluster.counts()
    assert (c.pending, c.leased, c.done, c.dead) == (0, 0, len(shards), 0)
    assert same_weights(state, reference), "weights differ from the undisturbed run"
    report = (cluster.share / "output" / "main" / "report.txt").read_text()
    assert report.count("training dataset: ") == len(shards)


# The SIGKILL points, in turns: each victim of a chain starts where the previous one's lease expired, so one seed,
# one pair of peers and one run's training serve several points (each Python worker costs ~4 s of CPU to import
# torch; five separate clusters cost the suite ~80 s more CPU). Each point still fires in its own process and is
# asserted by that process's SIGKILL exit. The chains keep enough days in front of each victim: a victim killed at
# its Nth checkpoint or promotion needs days left to train, so the points that let a victim ack days come first.
KILL_CHAINS = [("before-ack:3", "mid-write:2", "claimed"), ("after-promote:2", "checkpoint-written:3")]


@pytest.mark.timeout(600)  # several victims one after the other, each waiting out a lease
@pytest.mark.parametrize("points", KILL_CHAINS, ids="+".join)
def test_sigkill_at_a_dangerous_point(cluster: Cluster, reference_state: dict, points: tuple[str, ...]) -> None:
    """Workers in turn SIGKILL themselves, each at its `point`; each lease expires and the next worker
    reaps it; at the end two peers finish the work."""
    cluster.seed()
    shards = len(Dataset(cluster.share / "datasets" / "fraud").training_shards())
    for i, point in enumerate(points):
        victim = cluster.start_worker(f"victim{i}", WORKLOAD_FAULT=point)
        assert victim.wait(120) == -signal.SIGKILL, f"{point}: no SIGKILL there\n{cluster.log(f'victim{i}')}"
        cluster.procs.remove(victim)
        assert cluster.counts().done < shards, f"{point}: the run ended, the next point has nothing to disturb"
    cluster.start_worker("peer")
    cluster.start_worker("peer2")
    assert cluster.wait_all() == [0, 0], cluster.log("peer") + cluster.log("peer2")
    attempts = cluster.queue().snapshot()["runs"]["main"]["attempts"]
    assert sum(attempts.values()) == len(points), f"each victim's lease expired once and was reaped: {attempts}"
    assert_exactly_once(cluster, reference_state)


def test_random_sigkills_bit_for_bit(cluster: Cluster, reference_state: dict) -> None:
    """Workers SIGKILLed at random instants, again and again, end with the undisturbed weights."""
    rng = random.Random(20261122)
    cluster.seed()
    workers = [cluster.start_worker(f"w{i}") for i in range(2)]
    kills = 0
    while kills < 6 and not cluster.counts().drained:
        time.sleep(rng.uniform(0.3, 2.0))
        i = rng.randrange(len(workers))
        if workers[i].poll() is None:
            workers[i].send_signal(signal.SIGKILL)
            workers[i].wait()
            kills += 1
        else:
            assert workers[i].returncode == 0, cluster.log(f"w{i}")
        cluster.procs.remove(workers[i])
        if cluster.job_succeeded():
            break  # a work-queue Job replaces no pod once one exited 0: the others finish alone
        workers[i] = cluster.start_worker(f"w{i}-{kills}")
    assert kills >= 3, "the run finished before the test could disturb it"
    assert set(cluster.wait_all()) == {0}
    assert_exactly_once(cluster, reference_state)


def test_sigterm_releases_and_a_peer_resumes_at_once(cluster: Cluster, reference_state: dict) -> None:
    cluster.env_extra.update(LEASE_TTL_SECONDS="60", CHECKPOINT_INTERVAL_SECONDS="60")
    cluster.seed()
    workers = {name: cluster.start_worker(name) for name in ("a", "b")}
    queue = cluster.queue()

    def lease() -> dict:
        return queue.snapshot()["runs"]["main"]["lease"] or {}

    cluster.wait_for(lambda: "nothing to claim" in cluster.log("a") + cluster.log("b"), what="one worker idle")
    # Either worker may train the third shard: the run's lease is free between an ack and the next claim,
    # and on a loaded machine the idle worker's poll can win it.
    cluster.wait_for(lambda: "warm start after 2 shard(s)" in cluster.log("a") + cluster.log("b"),
                     what="third shard training")
    cluster.wait_for(lambda: bool(lease()), what="the third shard's lease")
    held = lease()
    holder, shard = held["owner"], held["item"]
    peer = "b" if holder == "a" else "a"
    time.sleep(0.1)  # mid-shard (a shard trains ~1 s); the periodic checkpoint is a minute away
    workers[holder].send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    assert workers[holder].wait(10) == 143, cluster.log(holder)
    exit_s = time.monotonic() - t0
    taken = cluster.wait_for(lambda: lease().get("owner") == peer, timeout_s=5, what="peer takes over")
    assert exit_s < 10 and taken < 5  # far below the 60 s lease TTL: the lease was released, not expired
    assert f"released {shard} for a peer" in cluster.log(holder)
    assert workers[peer].wait(120) == 0
    cluster.procs.remove(workers[holder])
    assert "resuming at epoch" in cluster.log(peer), "the peer continues from the SIGTERM checkpoint"
    assert_exactly_once(cluster, reference_state)
    assert cluster.queue().snapshot()["runs"]["main"]["attempts"] == {}  # preemption costs no attempt


def test_redis_restart_mid_run(cluster: Cluster, reference_state: dict) -> None:
    cluster.env_extra.update(LEASE_TTL_SECONDS="20")
    cluster.seed()
    cluster.start_worker("a")
    cluster.start_worker("b")
    cluster.wait_for(lambda: cluster.counts().done >= 2, what="two shards done")
    cluster.server.kill()  # SIGKILL: AOF with fsync always keeps every acknowledged write
    time.sleep(2)
    cluster.server.start()
    assert cluster.wait_all() == [0, 0], cluster.log("a") + cluster.log("b")
    assert "Redis unreachable" in cluster.log("a") + cluster.log("b")
    assert_exactly_once(cluster, reference_state)


def test_poison_and_hostile_items_are_dead_lettered(cluster: Cluster, tmp_path) -> None:
    cluster.env_extra.update(MAX_ATTEMPTS="2", LEASE_TTL_SECONDS="5")
    cluster.seed()
    data = cluster.share / "datasets" / "fraud"
    poison = data / "training" / "2018-04-03.parquet"
    poison.write_bytes(b"PAR1 this is not parquet")
    schema_bad = data / "training" / "2018-04-05.parquet"
    pd.read_parquet(schema_bad).drop(columns=["TX_AMOUNT"]).to_parquet(schema_bad)
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    (data / "training" / "evil.pkl").write_bytes(pickle.dumps(Exploit()))
    cluster.queue().enqueue([Item(run="main", shard="training/evil.pkl", dataset="fraud", seq=100),
                             Item(run="main", shard="../../../../etc/passwd", dataset="fraud", seq=101),
                             Item(run="ghost", shard="training/2018-04-01.parquet", dataset="fraud", seq=0)])
    cluster.start_worker("a")
    cluster.start_worker("b")
    assert cluster.wait_all() == [EXIT_DEAD_LETTERS] * 2, "drained with dead letters: not success"
    runs = cluster.queue().snapshot()["runs"]["main"]
    dead = runs["dead"]
    assert set(dead) == {"main/training/2018-04-03.parquet", "main/training/2018-04-05.parquet",
                         "main/training/evil.pkl", "main/../../../../etc/passwd"}
    schema_dead = dead["main/training/2018-04-05.parquet"]
    assert schema_dead["attempts"] == 1, "a schema error is permanent: no retries"
    assert "2018-04-05.parquet: missing column(s) ['TX_AMOUNT']" in schema_dead["error"]
    # Bytes that are no Parquet never become one: an item fault at once (storage errors are OSError).
    assert dead["main/training/2018-04-03.parquet"]["attempts"] == 1
    assert "2018-04-03.parquet: not a readable Parquet file" in dead["main/training/2018-04-03.parquet"]["error"]
    assert "never read" in dead["main/training/evil.pkl"]["error"] and dead["main/training/evil.pkl"]["attempts"] == 1
    assert "must be a relative path inside the dataset folder" in dead["main/../../../../etc/passwd"]["error"]
    assert not marker.exists(), "the pickle was unpickled"
    state = cluster.final_state()
    assert state["applied"] == ["training/2018-04-01.parquet", "training/2018-04-02.parquet",
                                "training/2018-04-04.parquet", "training/2018-04-06.parquet"]
    logs = cluster.log("a") + cluster.log("b")
    assert "2018-04-05.parquet: training on" not in logs, "a schema-invalid day must never start training"
    assert "2018-04-04.parquet: training on" in logs
    ghost = cluster.queue().snapshot()["runs"]["ghost"]["dead"]["ghost/training/2018-04-01.parquet"]
    assert ghost["attempts"] == 1 and "run 'ghost' has no hyperparameters" in ghost["error"]
    c = cluster.counts()
    assert (c.pending, c.leased, c.done, c.dead) == (0, 0, 4, 5)
    # After the fix, `requeue` brings the day back and it trains in date order: the run goes back to the
    # end of 04-02 and applies the later days again (04-05 stays dead); nothing is lost.
    shutil.copyfile(cluster.dataset_src / "training" / "2018-04-03.parquet", poison)
    out = zygote.run(["workload", "requeue", "--item", "main/training/2018-04-03.parquet"], cluster.env(), ROOT, 60)
    assert out.returncode == 0 and "requeued 1 dead-lettered item(s)" in out.stdout, out.stdout + out.stderr
    assert "main/training/2018-04-03.parquet (was: " in out.stdout
    cluster.procs.clear()
    cluster.start_worker("fixed")
    assert cluster.wait_all() == [EXIT_DEAD_LETTERS], "the other dead letters are still there"
    assert cluster.final_state()["applied"] == ["training/2018-04-01.parquet", "training/2018-04-02.parquet",
                                                "training/2018-04-03.parquet", "training/2018-04-04.parquet",
                                                "training/2018-04-06.parquet"]
    assert cluster.counts().dead == 4


# The SIGSTOP points, in pairs: the second victim is the first one's peer, and the first one, resumed, is the
# second one's peer, so one seed and two workers serve two points (each Python worker costs ~4 s of CPU to import
# torch: seven separate runs of three processes cost the suite ~40 s more CPU). A pair's second point must fire
# only after its worker acked a day (the test waits for the peer's progress before it may freeze): claimed:2,
# report:2 and before-ack:2 do; the others may fire within the peer's first day (the checkpoint interval is a
# time), so each of them starts a chain, and after-promote:1 fires before any ack.
STOP_CHAINS = [("mid-write:4", "claimed:2"), ("checkpoint-written:3", "report:2"), ("promote:3", "before-ack:2"),
               ("after-promote:1",)]
STALE = ("lost the lease", "already acked by", "refused: token")


@dataclass
class Frozen:
    """A victim frozen at its point: its name, the token and item it held, the days done at that moment."""

    name: str
    proc: subprocess.Popen[bytes]
    token: int
    item: str
    done: int
    resumed_at: float = 0.0


def frozen(cluster: Cluster, name: str, proc: subprocess.Popen[bytes]) -> Frozen:
    cluster.wait_for(lambda: is_stopped(proc), timeout_s=120, what=f"{name} to freeze")
    log = cluster.log(name)
    return Frozen(name, proc, int(re.findall(r"\(token (\d+),", log)[-1]),
                  re.findall(r"claimed (\S+) \(token", log)[-1], cluster.counts().done)


def peer_progresses(cluster: Cluster, victim: Frozen) -> None:
    cluster.wait_for(lambda: cluster.counts().done >= min(victim.done + 1, 6), timeout_s=120,
                     what=f"a peer to take over from {victim.name} and make progress")


def assert_nothing_late(cluster: Cluster, victim: Frozen) -> None:
    run_dir = cluster.share / "output" / "main"
    late = [p.name for p in run_dir.rglob("*") if p.is_file() and re.search(rf"-t0*{victim.token}\.", p.name)
            and p.stat().st_mtime >= victim.resumed_at]
    assert not late, f"the stale {victim.name} (token {victim.token}) wrote {late} after it was resumed"


def resume(cluster: Cluster, victim: Frozen) -> None:
    """SIGCONT, and the resumed victim notices it is stale and writes nothing under its stale token."""
    seen = len(cluster.log(victim.name))
    victim.resumed_at = time.time()
    victim.proc.send_signal(signal.SIGCONT)
    cluster.wait_for(lambda: any(m in cluster.log(victim.name)[seen:] for m in STALE), timeout_s=60,
                     what=f"the resumed {victim.name} to notice it is stale")
    assert_nothing_late(cluster, victim)


@pytest.mark.parametrize("points", STOP_CHAINS, ids="+".join)
def test_a_worker_frozen_past_its_lease_changes_nothing(cluster: Cluster, reference_state: dict,
                                                       points: tuple[str, ...]) -> None:
    """SIGSTOP at each point (a frozen VM): the lease expires, a peer takes over and makes progress, the
    frozen worker is resumed and notices it is stale. Alone: the peer is then SIGKILLed and the resumed worker
    reaps its lease and finishes the run. In a pair, the peer is the second victim, frozen at its own point once
    it made progress; the resumed first victim takes over from it and makes progress, the second one is
    resumed, the first one SIGKILLed, and the second finishes the run alone. Exactly once, bit for bit, one
    report block per day, and no victim wrote anything under its stale token after it was resumed. (No third
    worker: the once-stale worker finishing the run is the harder case; a fresh worker reaping a SIGKILLed
    one's lease is what test_sigkill_at_a_dangerous_point proves.)"""
    cluster.seed()
    first = frozen(cluster, "victim0", cluster.start_worker("victim0", WORKLOAD_FAULT=points[0],
                                                            WORKLOAD_FAULT_ACTION="stop"))
    victims = [first]
    if len(points) == 1:
        peer = cluster.start_worker("peer")
        peer_progresses(cluster, first)
        resume(cluster, first)
        finisher = first.proc
    else:
        second = cluster.start_worker("victim1", WORKLOAD_FAULT=points[1], WORKLOAD_FAULT_ACTION="stop")
        peer_progresses(cluster, first)
        victims.append(frozen(cluster, "victim1", second))
        assert victims[1].done > first.done, f"{points[1]} fired before the peer made progress"
        resume(cluster, first)
        peer_progresses(cluster, victims[1])  # the resumed first victim is the second one's peer
        resume(cluster, victims[1])
        peer, finisher = first.proc, second
    if peer.poll() is None:
        peer.send_signal(signal.SIGKILL)
        peer.wait()
    cluster.procs.remove(peer)
    assert cluster.procs == [finisher]
    assert cluster.wait_all() == [0], cluster.log(victims[-1].name)
    assert_exactly_once(cluster, reference_state)
    run_dir = cluster.share / "output" / "main"
    for v in victims:
        assert_nothing_late(cluster, v)  # again: the first victim worked on after it was resumed
        log = cluster.log(v.name)
        after = log.split("lost the lease")[-1] if "lost the lease" in log else ""
        assert f"acked {v.item}\n" not in after and f"{v.item} applied" not in after, v.name
    store = CheckpointStore(run_dir)
    final = store.load()
    assert report_source(run_dir) == (final.token, final.seq), "the report comes from the newest checkpoint"
    assert all((store.dir / name).exists() for name in store.retained()), "a named checkpoint was deleted"
