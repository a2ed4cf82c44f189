"""Done is the share's word, not Redis's: a worker exits 0 only when every day Redis calls done is in its run's
newest checkpoint on the share; where not, those days are trained first, in date order, and the model ends bit
for bit the undisturbed run's.

Through the command line, against a real redis-server and real worker processes."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest
from harness import Cluster, same_weights
from test_share_truth import cli

from workload.core.errors import EXIT_INFRA

pytestmark = pytest.mark.timeout(300)


def test_a_share_restored_from_an_older_backup_is_trained_up_to_redis_before_exit_0(
        cluster: Cluster, tmp_path: Path, reference_state: dict) -> None:
    """The run's output folder is backed up after three days (the worker paused for the copy), the run finishes,
    and the output is then restored from that backup while Redis stays current (six days done). A worker started
    now finds nothing pending; it checks Redis's six against the share's three, puts the other days back to
    pending, trains them, and only then exits 0 with the undisturbed run's weights."""
    cluster.seed()
    run_dir = cluster.share / "output" / "main"
    worker = cluster.start_worker("w1")
    cluster.wait_for(lambda: cluster.counts().done >= 3, timeout_s=120, what="three days done")
    os.kill(worker.pid, signal.SIGSTOP)
    try:
        shutil.copytree(run_dir, tmp_path / "backup")
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    assert cluster.wait_all() == [0], cluster.log("w1")
    days = list(reference_state["applied"])
    assert cluster.final_state()["applied"] == days
    shutil.rmtree(run_dir)
    shutil.copytree(tmp_path / "backup", run_dir)
    behind = cluster.final_state()["applied"]
    assert behind == days[:len(behind)] and len(behind) < len(days)
    assert cluster.counts().done == len(days), "Redis still calls every day done"
    lost = days[len(behind):]
    status = cli(cluster, "status")
    assert f"run main: {len(behind)}/{len(days)} shards applied (Redis calls {len(days)} done)" in status.stdout, \
        status.stdout
    (line,) = [x for x in status.stdout.splitlines() if "DISAGREE" in x]
    assert line.startswith(f"share vs queue: DISAGREE: Redis calls {len(lost)} day(s) done that their run's newest "
                           f"checkpoint on the share does not record (main/{lost[0]}"), line
    scorer = cli(cluster, "wait-drained", "--timeout", "0.2", "--poll", "0.1")  # the scorer waits for the share
    assert scorer.returncode == EXIT_INFRA and f"but Redis calls {len(lost)} day(s) done that" in scorer.stderr, \
        scorer.stderr
    cluster.new_job()
    cluster.start_worker("w2")
    assert cluster.wait_all() == [0, 0], cluster.log("w2")
    final = cluster.final_state()
    assert final["applied"] == days and same_weights(final, reference_state)
    agreed = cli(cluster, "status").stdout
    assert f"run main: {len(days)}/{len(days)} shards applied, 0 pending" in agreed and "DISAGREE" not in agreed, agreed
    log = cluster.log("w2")
    assert log.count("that their run's newest checkpoint on the share does not record") == 1, log
    assert f"Redis calls {len(days) - len(behind)} day(s) done" in log, log


def test_make_locals_summary_counts_what_the_share_records_not_what_redis_calls_done(
        tmp_path: Path, dataset_src: Path, redis_server, capsys) -> None:
    """`make local`'s closing summary is a status too: a Redis that calls every day done over a share whose run
    has no checkpoint yet shows 0 applied and the one disagreement line (it showed Redis's 6/6)."""
    from workload.model import lineage
    from workload.queue import plan
    from workload.queue.workqueue import WorkQueue, connect
    from workload.runtime.local import summary

    share = tmp_path / "share"
    shutil.copytree(dataset_src, share / "datasets" / "fraud")
    plan.record(share, plan.RunSpec(run="main", dataset="fraud", hparams={"epochs": 1}))
    queue = WorkQueue(connect(redis_server.url, redis_server.password), retry_for_s=5)
    plan.restore(queue, share, lineage.applied_days)
    days = plan.items(share, plan.live(share))
    assert queue.mark_done(days) == len(days) == 6
    summary(queue, share)
    out = capsys.readouterr().out
    assert "  run main: 0/6 shards applied, 0 dead-lettered" in out, out
    assert "share vs queue: DISAGREE: Redis calls 6 day(s) done that their run's newest checkpoint" in out, out
