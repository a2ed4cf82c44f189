"""The worker under the rules of a Kubernetes work-queue Job, and the checks that guard them.

In a work-queue Job (``completions`` unset), once any pod exits 0 Kubernetes starts no new pod: an
idle worker that exits 0 while a peer still holds a lease strands that item if the peer then dies.
A queue item's dataset name becomes a folder on the share, so it is refused at claim and again
where the worker opens the dataset. A worker whose heartbeat thread has not yet noticed that its
lease was taken over must still not promote: promotion asks Redis, not the thread's flag.
"""

from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path

import pytest
from harness import Cluster, JobSucceeded, is_stopped, poll_claim
from test_worker_faults import assert_exactly_once

from workload.core.errors import EXIT_DEAD_LETTERS
from workload.data.dayfile import DatasetError
from workload.queue.workqueue import Item
from workload.runtime.worker import Outcome, Worker, WorkerConfig

pytestmark = pytest.mark.timeout(300)

# A day trains in a fraction of a second: these tests are about verdicts, not the model.
QUICK = {"epochs": 2, "batch_size": 256, "hidden": [8]}
BAD_DATASETS = ["..", ".", "", "a/b", "/abs", "../outside"]


def test_an_idle_worker_waits_for_a_leased_item_whose_holder_then_dies(cluster: Cluster,
                                                                       reference_state: dict) -> None:
    """W1 freezes holding the last day; W2 finds nothing pending but one item leased and must wait (an
    exit 0 there would stop Kubernetes from ever starting another pod). W1 is then SIGKILLed and NOT
    replaced: W2 alone takes the expired lease, finishes, exits 0, and the weights are the undisturbed ones."""
    cluster.env_extra.update(LEASE_TTL_SECONDS="15")  # W2 starts (~3 s; more when loaded), idles, then expiry
    cluster.seed()
    w1 = cluster.start_worker("w1", WORKLOAD_FAULT="claimed:6", WORKLOAD_FAULT_ACTION="stop")
    cluster.wait_for(lambda: is_stopped(w1), timeout_s=120, what="W1 to freeze holding the last day")
    c = cluster.counts()
    assert (c.pending, c.leased, c.done) == (0, 1, 5), c
    w2 = cluster.start_worker("w2")
    waiting = "nothing to claim (0 pending behind peers, 1 leased)"
    cluster.wait_for(lambda: waiting in cluster.log("w2") or w2.poll() is not None, timeout_s=60,
                     what="W2 to say it waits for the leased item")
    assert w2.poll() is None and waiting in cluster.log("w2"), \
        f"W2 exited {w2.returncode} while a peer held a lease:\n{cluster.log('w2')}"
    time.sleep(2.0)  # four idle polls (0.5 s each)
    assert w2.poll() is None, f"W2 exited {w2.returncode} while a peer held a lease:\n{cluster.log('w2')}"
    assert cluster.counts().leased == 1, "W1's lease expired while W2 was being watched: widen the TTL"
    w1.send_signal(signal.SIGKILL)
    w1.wait()
    cluster.procs.remove(w1)
    assert w2.wait(120) == 0, cluster.log("w2")
    with pytest.raises(JobSucceeded):  # the harness is a work-queue Job: no pod after a success
        cluster.start_worker("w3")
    assert "claimed main/training/2018-04-06.parquet" in cluster.log("w2")
    assert_exactly_once(cluster, reference_state)


def test_queue_items_with_bad_dataset_names_are_dead_lettered_at_claim(cluster: Cluster, tmp_path: Path) -> None:
    """Each hostile dataset name is dead-lettered on its first claim, with a one-line error naming the
    item and the dataset; the good items train; nothing is written outside the share. Real datasets sit
    where the names would lead (an absolute path, a nested folder, beside the datasets folder) so a
    missing check would find something to read."""
    cluster.env_extra.update(MAX_ATTEMPTS="3")
    cluster.seed({"main": QUICK})
    src = cluster.share / "datasets" / "fraud"
    elsewhere = tmp_path / "elsewhere"
    for target in (elsewhere, cluster.share / "datasets" / "a" / "b", cluster.share / "outside"):
        shutil.copytree(src, target)
    names = [*BAD_DATASETS, str(elsewhere)]
    days = sorted(p.name for p in (src / "training").iterdir())
    # One run per bad name (a run is leased to one worker at a time), each naming a real day.
    items = [Item(run=f"hostile{i}", shard=f"training/{days[i % len(days)]}", dataset=name, seq=0)
             for i, name in enumerate(names)]
    queue = cluster.queue()
    assert queue.enqueue(items) == len(items)
    for it in items:
        queue.put_spec(it.run, QUICK)
    before = cluster.outside_share()
    cluster.start_worker("a")
    assert cluster.wait_all() == [EXIT_DEAD_LETTERS], cluster.log("a")
    snap = cluster.queue().snapshot()["runs"]
    for it in items:
        dead = snap[it.run]["dead"]
        assert set(dead) == {it.id}, f"dataset {it.dataset!r} was not dead-lettered: {snap[it.run]}"
        entry = dead[it.id]
        assert entry["attempts"] == 1, f"dataset {it.dataset!r}: a bad name is permanent, not retried"
        assert entry["error"].startswith(f"queue item {it.id!r}: dataset {it.dataset!r} is not allowed: use "), \
            entry["error"]
        assert "\n" not in entry["error"]
        assert not (cluster.share / "output" / it.run).exists(), f"run {it.run} wrote to the share"
    c = cluster.counts()
    assert (c.pending, c.leased, c.done, c.dead) == (0, 0, len(days), len(items))
    assert cluster.final_state()["applied"] == [f"training/{d}" for d in days]
    assert cluster.outside_share() == before, "something was written outside the share"
    assert all(f"{it.id}: training on" not in cluster.log("a") for it in items)


@pytest.mark.parametrize("name", [*BAD_DATASETS, "/etc", "..hidden", ".hidden", "x" * 64])
def test_the_worker_refuses_a_bad_dataset_name_on_its_own(cluster: Cluster, name: str) -> None:
    """The second layer, without the claim-time check in front of it: Worker.dataset refuses the name
    with the naming rule before it resolves any path (a nested folder that exists would otherwise load)."""
    shutil.copytree(cluster.dataset_src, cluster.share / "datasets" / "a" / "b")
    worker = Worker(WorkerConfig(share=cluster.share, redis_url=cluster.server.url,
                                 redis_password=cluster.server.password), cluster.queue())
    with pytest.raises(DatasetError) as err:
        worker.dataset(name)
    assert str(err.value).startswith(f"dataset {name!r} is not allowed: use "), str(err.value)
    assert not worker._datasets, "nothing was opened"


def test_a_worker_whose_heartbeat_has_not_noticed_the_takeover_does_not_promote(cluster: Cluster) -> None:
    """Deterministic, in one process: lease 1 expires and a peer claims the item (lease 2) before lease
    1's holder starts on it; lease 1's heartbeat thread beats only every 10 s, so its `lost` flag still
    says "held" when training ends. The promotion must ask Redis and refuse: no checkpoint of lease 1's
    token is promoted or left on the share. The peer then applies the day normally."""
    cluster.seed({"main": QUICK})
    queue = cluster.queue()
    stale = queue.claim("stale", ttl_s=0.2)
    assert stale is not None
    time.sleep(0.4)
    fresh = poll_claim(queue, "peer", ttl_s=30)
    assert fresh is not None and fresh.item == stale.item and fresh.token > stale.token
    cfg = WorkerConfig(share=cluster.share, redis_url=cluster.server.url, redis_password=cluster.server.password,
                       worker_id="stale", lease_ttl_s=30, heartbeat_s=10, checkpoint_interval_s=600)
    worker = Worker(cfg, queue)
    assert worker.process(stale) is Outcome.LOST
    ckpts = cluster.share / "output" / "main" / "checkpoints"
    assert not list(ckpts.glob(f"ckpt-*-t{stale.token}.pt")), "the stale lease's checkpoint was promoted"
    assert not (cluster.share / "output" / "main" / "report.txt").exists()
    peer = Worker(WorkerConfig(share=cluster.share, redis_url=cluster.server.url,
                               redis_password=cluster.server.password, worker_id="peer", lease_ttl_s=30,
                               checkpoint_interval_s=600), queue)
    assert peer.process(fresh) is Outcome.DONE
    state = cluster.final_state()
    assert state["applied"] == [stale.item.shard]
    assert [h["checkpoint"] for h in state["history"]][0].endswith(f"-t{fresh.token}.pt")
