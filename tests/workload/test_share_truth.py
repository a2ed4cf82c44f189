"""The share is the truth: what its run records and published days say must be trained is trained,
whatever Redis says, and nothing in Redis or on the share that is stale stops the healthy runs.

Through the command line, against a real redis-server and real worker processes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zygote
from exports import copy_files
from harness import HPARAMS, ROOT, Cluster, same_weights
from test_worker_faults import assert_exactly_once

from workload.core.errors import EXIT_INFRA
from workload.data.dataset import Dataset

pytestmark = pytest.mark.timeout(300)

QUICK = {"epochs": 2, "batch_size": 256, "hidden": [8]}  # a second run: its days train in a blink


def cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return zygote.run(["workload", *args], cluster.env(), ROOT, 120)


def test_a_stale_run_record_is_named_and_the_healthy_run_trains(cluster: Cluster, tmp_path: Path,
                                                               reference_state: dict) -> None:
    """A run whose dataset was deleted from the share, beside a healthy run: after a Redis wipe the worker
    restores the healthy run alone and trains it to the undisturbed weights; seed names the stale run."""
    runs_file = tmp_path / "old.json"
    runs_file.write_text(json.dumps({"old": {"epochs": 1}}))
    folder = copy_files(cluster.dataset_src, tmp_path / "export")
    out = cli(cluster, "seed", "--dataset", "other", "--datasets", str(folder), "--runs-file", str(runs_file))
    assert out.returncode == 0, out.stderr
    cluster.seed()
    shutil.rmtree(cluster.share / "datasets" / "other")
    cluster.wipe_redis()
    cluster.start_worker("w")
    assert cluster.wait_all() == [0], cluster.log("w")
    named = "run old is skipped: its dataset 'other' is gone from the share"
    assert named in cluster.log("w")
    assert_exactly_once(cluster, reference_state)
    again = cli(cluster, "seed", "--runs-file", str(cluster.share.parent / "runs.json"))
    assert again.returncode == 0 and named in again.stderr, again.stderr
    assert f"or retire the run by removing {cluster.share / 'runs' / 'old.json'}" in again.stderr


def seed_twice(cluster: Cluster, tmp_path: Path) -> Path:
    """Seed run main on four days; copy Redis's AOF; append two days and add run second (12 items).
    Returns the AOF copy: a Redis backup from before the second seed."""
    late = ("training/2018-04-05.parquet", "training/2018-04-06.parquet")
    folder = copy_files(cluster.dataset_src, tmp_path / "export", keep=lambda rel: rel not in late)
    runs_file = tmp_path / "runs.json"
    runs_file.write_text(json.dumps({"main": HPARAMS}))
    assert cli(cluster, "seed", "--datasets", str(folder), "--runs-file", str(runs_file)).returncode == 0
    backup = cluster.copy_redis(tmp_path / "aof-before")
    copy_files(cluster.dataset_src, folder, keep=lambda rel: rel in late)
    runs_file.write_text(json.dumps({"main": HPARAMS, "second": QUICK}))
    out = cli(cluster, "seed", "--datasets", str(folder), "--runs-file", str(runs_file))
    assert out.returncode == 0 and cluster.counts().total == 12, out.stderr
    return backup


def assert_share_plan_done(cluster: Cluster, reference: dict) -> None:
    """Both runs hold every day once, in date order; main's weights are the undisturbed run's."""
    shards = Dataset(cluster.share / "datasets" / "fraud").training_shards()
    assert len(shards) == 6
    for run in ("main", "second"):
        assert cluster.final_state(run)["applied"] == shards, f"run {run}: every day applied once, in date order"
    assert same_weights(cluster.final_state("main"), reference)
    c = cluster.counts()
    assert (c.total, c.done, c.dead, c.pending, c.leased) == (12, 12, 0, 0, 0)


def test_a_redis_restored_from_before_a_second_seed_is_brought_up_to_the_share(cluster: Cluster, tmp_path: Path,
                                                                             reference_state: dict) -> None:
    """Redis comes back from an AOF copied before a second seed added a run and appended two days: the
    worker adds what the share's plan holds and the queue lacks, trains it all, and only then exits 0."""
    backup = seed_twice(cluster, tmp_path)
    cluster.restore_redis(backup)
    assert cluster.counts().total == 4
    behind = cli(cluster, "status")
    assert "share vs queue: the share's plan is 2 run(s), 12 item(s); the queue is BEHIND: it lacks 1 run(s) " \
           "(second), 8 item(s) (main/training/2018-04-05.parquet, " in behind.stdout, behind.stdout
    cluster.start_worker("w")
    assert cluster.wait_all() == [0], cluster.log("w")
    assert_share_plan_done(cluster, reference_state)
    log = cluster.log("w")
    assert 0 <= log.find("the queue is BEHIND") < log.find("claimed "), "reconciled at start, before any claim"
    after = cli(cluster, "status")
    assert "share vs queue: the share's plan is 2 run(s), 12 item(s); the queue holds them all" in after.stdout


def test_a_redis_that_goes_back_in_time_mid_run_is_caught_up_before_the_worker_exits(
        cluster: Cluster, tmp_path: Path, reference_state: dict) -> None:
    """The worker starts on a complete queue; mid-run Redis comes back from the older backup. Draining
    what that Redis holds is not the end: before exiting 0 the worker finds the share's plan ahead of
    the queue, adds the run and days it lacks, and trains them."""
    backup = seed_twice(cluster, tmp_path)
    cluster.start_worker("w")
    cluster.wait_for(lambda: cluster.counts().done >= 2, timeout_s=120, what="two days done")
    cluster.restore_redis(backup)
    assert cluster.wait_all() == [0], cluster.log("w")
    assert "the queue is BEHIND" in cluster.log("w")
    assert_share_plan_done(cluster, reference_state)


def test_redis_out_of_memory_and_frozen_past_the_lease_charge_no_attempt(cluster: Cluster,
                                                                         reference_state: dict) -> None:
    """The platform fails, not the item: Redis at maxmemory under noeviction (every write answers OOM)
    for longer than the lease, then SIGSTOPped past the lease TTL three times, while one worker trains
    and an idle peer polls (and would reap an expired lease the moment Redis answers). Nothing is
    dead-lettered, no attempt is charged (two would dead-letter), no traceback, and the weights are
    the undisturbed run's."""
    cluster.env_extra.update(MAX_ATTEMPTS="2")
    cluster.seed()
    w = cluster.start_worker("w")
    cluster.wait_for(lambda: cluster.counts().leased == 1, what="the first claim")
    cluster.start_worker("idle")
    admin = cluster.server.client()
    ttl = float(cluster.env()["LEASE_TTL_SECONDS"])
    cluster.wait_for(lambda: cluster.counts().done >= 1, timeout_s=120, what="the first day done")
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", "1")
    cluster.wait_for(lambda: "unable to serve" in cluster.log("w"), what="the worker to meet the OOM replies")
    time.sleep(ttl + 1)  # the fault outlasts the lease
    admin.config_set("maxmemory", "0")
    for target in (2, 3, 4):
        cluster.wait_for(lambda t=target: cluster.counts().done >= t or w.poll() is not None, timeout_s=120,
                         what=f"{target} days done")
        cluster.server.proc.send_signal(signal.SIGSTOP)
        time.sleep(ttl + 1)
        cluster.server.proc.send_signal(signal.SIGCONT)
    assert cluster.wait_all() == [0, 0], cluster.log("w") + cluster.log("idle")
    queue = cluster.queue()
    assert queue.redis.hgetall(queue.keys.attempts) == {}, "an attempt was charged for the platform's fault"
    assert "Traceback" not in cluster.log("w") + cluster.log("idle")
    assert_exactly_once(cluster, reference_state)


def test_a_redis_out_of_memory_for_good_ends_the_worker_with_exit_3_and_no_traceback(cluster: Cluster) -> None:
    """OOM that outlasts the Redis retry budget: an infrastructure exit (3), one line, nothing charged."""
    cluster.seed()
    admin = cluster.server.client()
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", "1")
    cluster.start_worker("w", REDIS_RETRY_SECONDS="2")
    assert cluster.wait_all() == [EXIT_INFRA], cluster.log("w")
    admin.config_set("maxmemory", "0")
    log = cluster.log("w")
    assert "Traceback" not in log and "ERROR workload [w]: Redis unable to serve for 2s during " in log, log
    c = cluster.counts()
    assert (c.pending, c.dead) == (6, 0) and admin.hlen(cluster.queue().keys.attempts) == 0


def test_wait_drained_on_a_redis_wiped_mid_run_waits_for_the_share_and_says_why(cluster: Cluster) -> None:
    """Redis is wiped while the only worker is frozen mid-run, and the scorer's `wait-drained` starts: an empty,
    unseeded queue is not a drained one. With a short deadline it exits 3 saying why in one line; with a long
    one it waits until the worker (thawed) restored the queue from the share and trained every day, and only then
    exits 0, the share's newest checkpoint holding every day of the plan."""
    cluster.seed({"main": QUICK})
    w = cluster.start_worker("w")
    cluster.wait_for(lambda: cluster.counts().done >= 2, timeout_s=120, what="two days done")
    os.kill(w.pid, signal.SIGSTOP)
    try:
        cluster.wipe_redis()
        short = cli(cluster, "wait-drained", "--timeout", "0.3", "--poll", "0.1")
        (line,) = [x for x in short.stderr.splitlines() if " ERROR " in x]
        assert short.returncode == EXIT_INFRA and line.endswith(
            "queue not drained after 0s: 0 pending, 0 leased, but the queue is empty and unseeded while the share "
            "records 1 run(s) (Redis lost its data?): a worker restores it from the share"), short.stderr
        err = cluster.share.parent / "scorer.log"
        with err.open("w") as sink:
            scorer = subprocess.Popen([sys.executable, "-m", "workload", "wait-drained", "--timeout", "150", "--poll",
                                       "0.5"], env=cluster.env(), cwd=ROOT, stderr=sink, text=True)
        cluster.wait_for(lambda: "but the queue is empty and unseeded" in err.read_text(), what="the scorer waiting")
    finally:
        os.kill(w.pid, signal.SIGCONT)
    assert scorer.wait(timeout=150) == 0, err.read_text()
    shards = Dataset(cluster.share / "datasets" / "fraud").training_shards()
    assert cluster.final_state()["applied"] == shards, "wait-drained exited 0 before the share held every day"
    assert cluster.wait_all() == [0], cluster.log("w")
