"""Faults a real cluster produces every week, against real processes, a real Redis and real files:
a full or read-only share, Redis blips, a wiped Redis, hostile queue items, extreme data, a read that
never returns. Nothing may be lost, nothing charged to an item that is not at fault, and no worker may
report success that did not happen."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import zygote
from harness import ROOT, Cluster
from test_worker_faults import assert_exactly_once

from workload.core.errors import EXIT_DEAD_LETTERS, EXIT_INFRA, EXIT_STALLED
from workload.data import features, featurestore
from workload.queue.workqueue import WorkQueue, connect
from workload.runtime.worker import Worker, WorkerConfig
from workload.share.checkpoint import CheckpointStore

pytestmark = pytest.mark.timeout(300)


def _mount(*args: str) -> bool:
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


@pytest.fixture
def small_output(cluster: Cluster):
    """The share's output folder on a 3 MiB tmpfs (root only: skipped elsewhere)."""
    target = cluster.share / "output"
    target.mkdir(parents=True)
    if not _mount("-t", "tmpfs", "-o", "size=3m", "tmpfs", str(target)):
        pytest.skip("needs root to mount a size-limited tmpfs")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], capture_output=True)


def fill(folder: Path) -> Path:
    """Fill the file system under `folder` to the last byte."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        for size in (65536, 512, 1):
            while True:
                try:
                    os.write(fd, b"\0" * size)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    break
    finally:
        os.close(fd)
    return filler


def all_finite(store: CheckpointStore) -> bool:
    for path in store.dir.glob("ckpt-*.pt"):
        state = torch.load(path, weights_only=True)
        if not all(torch.isfinite(v).all() for v in state["model"].values()):
            return False
    return True


@pytest.mark.parametrize("fault", ["full", "read-only"])
def test_a_full_or_read_only_share_loses_nothing(cluster: Cluster, reference_state: dict, small_output: Path,
                                                 fault: str) -> None:
    cluster.env_extra.update(INFRA_GIVE_UP_SECONDS="4", LEASE_TTL_SECONDS="5")
    cluster.seed()
    cluster.start_worker("a")
    cluster.start_worker("b")
    cluster.wait_for(lambda: cluster.counts().done >= 2, timeout_s=120, what="two days applied")
    store = CheckpointStore(small_output / "main")
    if fault == "full":
        filler = fill(small_output)
    else:
        assert _mount("-o", "remount,ro", str(small_output))
    codes = cluster.wait_all(120)
    logs = cluster.log("a") + cluster.log("b")
    assert codes == [EXIT_INFRA, EXIT_INFRA], logs
    cause = "No space left on device" if fault == "full" else "Read-only file system"
    assert cause in logs and str(small_output / "main") in logs and "infrastructure fault for" in logs
    snap = cluster.queue().snapshot()["runs"]["main"]
    assert snap["dead"] == {} and snap["attempts"] == {}, "an infrastructure fault must cost no attempt"
    before = store.load()
    assert before is not None and len(before.state["applied"]) >= 2, "the previous checkpoint is intact"
    if fault == "full":
        filler.unlink()
    else:
        assert _mount("-o", "remount,rw", str(small_output))
    cluster.procs.clear()
    cluster.start_worker("c")
    assert cluster.wait_all() == [0], cluster.log("c")
    assert_exactly_once(cluster, reference_state)


def test_redis_blips_cost_no_attempt(cluster: Cluster, reference_state: dict) -> None:
    """Five Redis restarts of 2 s each while a worker trains: the lease outlives each blip."""
    cluster.env_extra.update(LEASE_TTL_SECONDS="10")
    cluster.seed()
    worker = cluster.start_worker("a")
    cluster.wait_for(lambda: "training on" in cluster.log("a"), timeout_s=120, what="training to start")
    restarts = 0
    while restarts < 5:
        assert worker.poll() is None, "the run finished before five blips: " + cluster.log("a")
        cluster.server.kill()
        time.sleep(2)
        cluster.server.start()
        restarts += 1
        time.sleep(0.5)
    assert cluster.wait_all() == [0], cluster.log("a")
    assert "lost the lease" not in cluster.log("a")
    snap = cluster.queue().snapshot()["runs"]["main"]
    assert snap["attempts"] == {} and snap["dead"] == {}
    assert_exactly_once(cluster, reference_state)


def test_a_wiped_redis_is_restored_from_the_share(cluster: Cluster, reference_state: dict) -> None:
    cluster.seed()
    cluster.start_worker("a")
    cluster.start_worker("b")
    cluster.wait_for(lambda: cluster.counts().done >= 2, timeout_s=120, what="two days applied")
    cluster.wipe_redis()
    assert cluster.wait_all() == [0, 0], cluster.log("a") + cluster.log("b")
    assert "restored it from the share" in cluster.log("a") + cluster.log("b")
    assert_exactly_once(cluster, reference_state)


def test_an_unseeded_queue_never_reads_as_success(cluster: Cluster) -> None:
    worker = cluster.start_worker("a")
    assert worker.wait(120) == EXIT_INFRA
    assert "never seeded" in cluster.log("a")


def test_malformed_items_are_dead_lettered_at_first_claim(cluster: Cluster, reference_state: dict) -> None:
    cluster.seed()
    r = cluster.server.client()
    hostile = {  # id -> (the list it sits in, raw item, what the error must say)
        "main/bad-json": ("main", "{not json", "not valid JSON"),
        "main/training/x.parquet": ("main", {"run": "main", "shard": "training/x.parquet", "seq": 0},
                                    "missing field(s) ['dataset']"),
        "main/training/y.parquet": ("main", {"run": "main", "shard": "training/y.parquet", "dataset": "fraud",
                                             "seq": "late"}, "field 'seq' must be a int"),
        "main/training/z.parquet": ("main", {"run": "other", "shard": "training/z.parquet", "dataset": "fraud",
                                             "seq": 0}, "names run 'other' but sits in the queue of run 'main'"),
        "../../../escape/training/2018-04-01.parquet": (
            "../../../escape", {"run": "../../../escape", "shard": "training/2018-04-01.parquet",
                                "dataset": "fraud", "seq": 0}, "run '../../../escape' is not allowed"),
        "/tmp/abs/training/2018-04-01.parquet": (
            "/tmp/abs", {"run": "/tmp/abs", "shard": "training/2018-04-01.parquet", "dataset": "fraud",
                         "seq": 0}, "run '/tmp/abs' is not allowed"),
        "main//etc/hostname": ("main", {"run": "main", "shard": "/etc/hostname", "dataset": "fraud", "seq": 0},
                               "must be a relative path inside the dataset folder"),
        "main/training/2018-04-02.parquet#": ("main", {"run": "main", "shard": "training/2018-04-02.parquet",
                                                       "dataset": "../..", "seq": 0}, "dataset '../..' is not allowed"),
    }
    for item_id, (run, raw, _) in hostile.items():
        r.hset("spottrain:items", item_id, raw if isinstance(raw, str) else json.dumps(raw))
        r.sadd("spottrain:runs", run)
        r.zadd(f"spottrain:pending:{run}", {item_id: -1})
    cluster.start_worker("a")
    assert cluster.wait_all() == [EXIT_DEAD_LETTERS], cluster.log("a")
    snap = cluster.queue().snapshot()["runs"]
    dead = {i: d for run in snap.values() for i, d in run["dead"].items()}
    assert set(dead) == set(hostile)
    for item_id, (_, _, message) in hostile.items():
        assert dead[item_id]["attempts"] == 1, item_id
        assert message in dead[item_id]["error"], (item_id, dead[item_id]["error"])
    out = zygote.run(["workload", "status"], cluster.env(), ROOT, 60)
    assert out.returncode == 0, out.stderr
    assert "dead: main/bad-json after 1 attempt(s): queue item 'main/bad-json': not valid JSON" in out.stdout
    assert "escape" in out.stdout and "/tmp/abs" in out.stdout
    assert cluster.outside_share() == set(), "a hostile item wrote outside the share"
    assert not Path("/tmp/abs").exists()
    c = cluster.counts()
    assert (c.pending, c.leased, c.done, c.dead) == (0, 0, 6, len(hostile))
    shards = cluster.final_state()["applied"]
    assert len(shards) == 6 and cluster.final_state()["progress"] is None


def _with_extreme_amounts(cluster: Cluster) -> Path:
    target = cluster.share / "datasets" / "fraud"
    shutil.copytree(cluster.dataset_src, target)
    day = target / "training" / "2018-04-03.parquet"
    frame = pd.read_parquet(day)
    frame.loc[frame.index[:2], "TX_AMOUNT"] = 1e308
    frame.to_parquet(day)
    return day


def test_extreme_amounts_keep_every_feature_and_weight_finite(cluster: Cluster) -> None:
    _with_extreme_amounts(cluster)
    cluster.seed()
    cluster.start_worker("a")
    assert cluster.wait_all() == [0], cluster.log("a")
    state = cluster.final_state()
    assert len(state["applied"]) == 6
    assert all(torch.isfinite(v).all() for v in state["model"].values())
    assert all(pd.notna(h["average_precision"]) for h in state["history"])
    assert all_finite(CheckpointStore(cluster.share / "output" / "main"))


def test_non_finite_training_is_an_item_fault_and_nothing_is_promoted(cluster: Cluster, monkeypatch) -> None:
    """Without the amount cap (the old features), 1e308 overflows the window sums to NaN: the worker's
    own guard must then fail those days with a clear error and promote nothing non-finite."""
    _with_extreme_amounts(cluster)
    cluster.seed()
    # seed stored every day's features with the cap; the worker must compute them itself, uncapped.
    shutil.rmtree(cluster.share / "datasets" / "fraud" / featurestore.FOLDER)
    monkeypatch.setattr(features, "AMOUNT_CAP", float("inf"))
    cfg = WorkerConfig(share=cluster.share, redis_url=cluster.server.url, redis_password=cluster.server.password,
                       worker_id="inproc", lease_ttl_s=10, checkpoint_interval_s=0.3, max_attempts=50,
                       plot_interval_s=3600)
    queue = WorkQueue(connect(cluster.server.url, cluster.server.password))
    assert Worker(cfg, queue).run() == EXIT_DEAD_LETTERS
    dead = queue.snapshot()["runs"]["main"]["dead"]
    # Day 3 poisons its own features and, through their history windows, the later days' and the
    # test days' (so every day's scores): each day fails on its own, once, with the reason.
    assert len(dead) == 6 and "main/training/2018-04-03.parquet" in dead
    assert all("non-finite" in d["error"] and d["attempts"] == 1 for d in dead.values()), dead
    store = CheckpointStore(cluster.share / "output" / "main")
    assert all_finite(store), "a non-finite checkpoint was written"
    loaded = store.load()
    assert loaded is None or loaded.state["applied"] == [], "nothing was applied"


def test_a_blocked_read_gives_the_lease_up_and_exits(cluster: Cluster) -> None:
    """A day whose read never returns (a hung NFS mount; a FIFO is refused by the dataset before it is
    opened): the watchdog stops renewing the lease, gives it back at no cost and exits EXIT_STALLED,
    instead of hanging forever with a lease no peer can take over."""
    cluster.env_extra.update(STALL_SECONDS="3", LEASE_TTL_SECONDS="30")
    cluster.seed()
    worker = cluster.start_worker("a", WORKLOAD_FAULT="read:2", WORKLOAD_FAULT_ACTION="hang")
    cluster.wait_for(lambda: "claimed main/training/2018-04-02.parquet" in cluster.log("a"), timeout_s=120,
                     what="the second day to be claimed")
    started = time.monotonic()
    assert worker.wait(60) == EXIT_STALLED, cluster.log("a")
    assert time.monotonic() - started < 30, "bounded: before the 30 s lease would even have expired"
    assert "watchdog: no progress on main/training/2018-04-02.parquet" in cluster.log("a")
    snap = cluster.queue().snapshot()["runs"]["main"]
    assert snap["lease"] is None and snap["attempts"] == {}, "given back at once, at no cost"
    assert snap["pending"][0] == "main/training/2018-04-02.parquet"
    cluster.procs.clear()
    cluster.start_worker("b")
    assert cluster.wait_all() == [0], "a peer takes the day over"


def test_sigterm_ends_a_worker_waiting_for_redis(cluster: Cluster) -> None:
    cluster.env_extra.update(REDIS_RETRY_SECONDS="300", LEASE_TTL_SECONDS="3")
    cluster.seed()
    worker = cluster.start_worker("a")
    cluster.wait_for(lambda: "training on" in cluster.log("a"), timeout_s=120, what="training to start")
    cluster.server.kill()
    cluster.wait_for(lambda: "Redis unreachable" in cluster.log("a"), timeout_s=60, what="waiting for Redis")
    worker.send_signal(signal.SIGTERM)
    started = time.monotonic()
    assert worker.wait(20) == 143, cluster.log("a")
    assert time.monotonic() - started < 15, "within the spot grace period"
