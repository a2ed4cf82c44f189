"""A packed worker (PACK_RUNS=2) SIGKILLed mid-day, as `python -m workload worker` processes: each run's mid-day
checkpoint is its own, a packed peer resumes each run from it, and every run ends done, in order, within
`packed.SOLO_TOLERANCE` of the same sweep trained packed and undisturbed (a sweep of three short days, so that
the whole test costs seconds: a packed step on CPU is vmap's, tens of milliseconds)."""

from __future__ import annotations

import re
import shutil
import signal
from pathlib import Path

import pytest
import torch
from harness import Cluster

from workload.data import dataset as ds
from workload.data.manifest import write_manifest
from workload.model import packed
from workload.queue.workqueue import WorkQueue, connect
from workload.share.checkpoint import CheckpointStore

pytestmark = pytest.mark.timeout(300)

HP = {"epochs": 4, "batch_size": 64, "hidden": [32, 16], "window_days": 1}  # 44 steps a day
SWEEP = {"main": HP, "twin": {**HP, "seed": 2, "lr": 3e-3}}


def three_days(cluster: Cluster) -> list[str]:
    """The tiny dataset on the cluster's share with its first three training days only."""
    target = cluster.share / "datasets" / "fraud"
    shutil.copytree(cluster.dataset_src, target)
    days = ds.Dataset(target).training_shards()
    for day in days[3:]:
        (target / day).unlink()
    write_manifest(target)
    ds.Dataset(target).ensure_features()
    return days[:3]


def trained(cluster: Cluster, days: list[str]) -> dict[str, dict]:
    prefix = cluster.env_extra.get("QUEUE_PREFIX", "spottrain")
    c = WorkQueue(connect(cluster.server.url, cluster.server.password), prefix=prefix).counts()
    assert (c.pending, c.leased, c.done, c.dead) == (0, 0, len(SWEEP) * len(days), 0)
    out = {run: cluster.final_state(run) for run in SWEEP}
    assert all(s["applied"] == days and s["progress"] is None for s in out.values())
    return out


def test_sigkill_of_a_packed_worker_mid_day_then_a_packed_peer_resumes_every_run(cluster: Cluster,
                                                                                   tmp_path: Path) -> None:
    undisturbed = Cluster(cluster.server, tmp_path / "undisturbed", cluster.dataset_src,
                          env_extra={"QUEUE_PREFIX": "undisturbed", "PACK_RUNS": "2"})
    undisturbed.share.mkdir()
    undisturbed.env_extra["SHARE_DIR"] = str(undisturbed.share)
    days = three_days(undisturbed)
    undisturbed.seed(SWEEP)
    undisturbed.start_worker("ref")
    assert undisturbed.wait_all() == [0], undisturbed.log("ref")
    reference = trained(undisturbed, days)

    assert three_days(cluster) == days
    cluster.seed(SWEEP)
    cluster.env_extra.update(PACK_RUNS="2")
    # The 4th checkpoint file written: each run's 2nd mid-day checkpoint of the first day (main's promoted,
    # twin's complete, not promoted): twin loses one checkpoint interval, main less. A checkpoint after every
    # step, so the count does not depend on how fast the machine trains (at the cluster's 0.3 s an idle
    # machine trained a whole day between two checkpoints).
    victim = cluster.start_worker("victim", WORKLOAD_FAULT="checkpoint-written:4",
                                  CHECKPOINT_INTERVAL_SECONDS="0.001")
    assert victim.wait(120) == -signal.SIGKILL, cluster.log("victim")
    cluster.procs.remove(victim)
    for run in SWEEP:
        progress = CheckpointStore(cluster.share / "output" / run).load().state["progress"]
        assert progress and progress["shard"] == days[0] and (progress["epoch"], progress["batch"]) > (0, 0), run
    cluster.start_worker("peer")
    assert cluster.wait_all() == [0], cluster.log("peer")
    for run in SWEEP:  # each run warm-starts from its own checkpoint, packed
        assert re.search(rf"{run}/{re.escape(days[0])} \(packed, 2\): .*resuming at epoch", cluster.log("peer"))
    got = trained(cluster, days)
    for run in SWEEP:
        assert got[run]["steps"] == reference[run]["steps"]
        for part in ("model", "averaged"):
            for k, v in reference[run][part].items():
                torch.testing.assert_close(got[run][part][k], v, **packed.SOLO_TOLERANCE, msg=f"{run} {part} {k}")
