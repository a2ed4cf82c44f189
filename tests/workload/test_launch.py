"""The scheduled loader records what it added for the launcher (issue 22, Build 5; issue 36), against a real Redis.

`seed --request-launch` enqueues and then adds to the launch request in Redis; it posts nothing and reads no
Kubernetes credentials (the loader's account may not create Jobs). The launcher's half, which reads the request
and posts the Jobs, is tested in test_launch_inprocess.py and test_cli_units.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import zygote
from exports import BANK_COLUMNS, bank_export
from harness import HPARAMS, ROOT, Cluster

from workload.core import errors
from workload.queue import plan
from workload.queue.workqueue import LaunchRequest

TOMORROW = "testing/2018-04-08.parquet"  # the last day: tomorrow's transactions, as a scoring/ day


def _scheduled_seed(cluster: Cluster, *extra: str) -> subprocess.CompletedProcess[str]:
    runs_file = cluster.share.parent / "runs.json"
    runs_file.write_text(json.dumps({"main": HPARAMS}))
    env = cluster.env()
    env.pop("KUBERNETES_SERVICE_HOST", None)
    return zygote.run(["workload", "seed", "--runs-file", str(runs_file), "--request-launch", *extra], env, ROOT, 120)


def test_each_load_adds_what_it_enqueued_to_the_launch_request_and_posts_nothing(cluster: Cluster) -> None:
    shutil.copytree(cluster.dataset_src, cluster.share / "datasets" / "fraud")
    first = _scheduled_seed(cluster)
    assert first.returncode == 0, first.stderr
    added = cluster.counts().pending
    assert added > 0 and f"launch requested: {added} new item(s), 0 new scoring day(s)" in first.stderr
    assert cluster.queue().launch_request() == LaunchRequest(loads=1, added=added)
    assert "Job" not in first.stderr  # no post, no credentials looked for

    again = _scheduled_seed(cluster)  # nothing new: one more load, nothing added; the first one's request kept
    assert again.returncode == 0, again.stderr
    assert "launch requested: 0 new item(s), 0 new scoring day(s)" in again.stderr
    assert cluster.queue().launch_request() == LaunchRequest(loads=2, added=added)


def test_new_scoring_days_are_in_the_request_and_never_enqueued(cluster: Cluster, tmp_path: Path) -> None:
    """A bank's export (own column names, float IDs, offsets, shuffled rows); tomorrow arrives unlabelled."""
    export = bank_export(cluster.dataset_src, tmp_path / "export", keep=lambda rel: rel != TOMORROW)
    columns = tmp_path / "columns.json"
    columns.write_text(json.dumps(BANK_COLUMNS))
    bank = ("--datasets", str(export), "--columns", str(columns))
    first = _scheduled_seed(cluster, *bank)
    assert first.returncode == 0, first.stderr
    cluster.queue().mark_done(plan.items(cluster.share))  # everything trained, no scoring day yet
    bank_export(cluster.dataset_src, export, keep=lambda rel: rel == TOMORROW,
                role_of=lambda rel: "scoring", label="absent")  # fmt: skip
    tomorrow = _scheduled_seed(cluster, *bank)  # a new scoring/ day, nothing to train
    assert tomorrow.returncode == 0, tomorrow.stderr
    assert "launch requested: 0 new item(s), 1 new scoring day(s)" in tomorrow.stderr
    assert cluster.counts().pending == 0  # a scoring day is never enqueued for training
    assert cluster.queue().launch_request().scoring_days == 1
    again = _scheduled_seed(cluster, *bank)  # published already: nothing new to score
    assert "launch requested: 0 new item(s), 0 new scoring day(s)" in again.stderr
    assert cluster.queue().launch_request().scoring_days == 1


def _wait_drained(cluster: Cluster, timeout_s: float, **extra: str) -> subprocess.Popen[str]:
    """`wait-drained` against the cluster's Redis; a share without run records unless SHARE_DIR is given (these
    tests mark days done without training them: the share's side is test_share_truth's and test_launch_inprocess's)."""
    extra.setdefault("SHARE_DIR", str(cluster.share.parent / "no-plan"))
    return subprocess.Popen(
        [sys.executable, "-m", "workload", "wait-drained", "--timeout", str(timeout_s), "--poll", "0.1"],
        env=cluster.env(**extra), cwd=ROOT, stderr=subprocess.PIPE, text=True,
    )


def test_the_scorer_waits_until_nothing_is_pending_or_leased(cluster: Cluster) -> None:
    """The scoring pod's init step (real processes, a real Redis): a peer's live lease keeps it waiting
    until acked; past its deadline it exits 3 (the scoring Job retries it), naming what it waited for."""
    cluster.seed()
    queue = cluster.queue()
    lease = queue.claim("peer", ttl_s=600)
    assert lease is not None
    queue.mark_done(plan.items(cluster.share))  # every other item trained: one still leased
    assert (cluster.counts().pending, cluster.counts().leased) == (0, 1)

    timed_out = _wait_drained(cluster, 0.5)
    _, err = timed_out.communicate(timeout=60)
    assert timed_out.returncode == errors.EXIT_INFRA, err
    assert "queue not drained after 0s: 0 pending, 1 leased" in err

    waiting = _wait_drained(cluster, 600)
    assert waiting.stderr is not None
    for line in waiting.stderr:  # it has looked at the queue and is waiting
        if "waiting for training to finish: 0 pending, 1 leased" in line:
            break
    assert waiting.poll() is None
    assert queue.ack(lease)
    waiting.wait(timeout=60)
    assert waiting.returncode == 0, waiting.stderr.read()

    cluster.server.kill()  # Redis gone for longer than the retry budget: an infrastructure exit
    gone = _wait_drained(cluster, 600, REDIS_RETRY_SECONDS="0.5")
    _, err = gone.communicate(timeout=60)
    assert gone.returncode == errors.EXIT_INFRA, err
