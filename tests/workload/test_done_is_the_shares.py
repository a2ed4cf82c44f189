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
    cluster.new_job()
    cluster.start_worker("w2")
    assert cluster.wait_all() == [0, 0], cluster.log("w2")
    final = cluster.final_state()
    assert final["applied"] == days and same_weights(final, reference_state)
    log = cluster.log("w2")
    assert log.count("that their run's newest checkpoint on the share does not record") == 1, log
    assert f"Redis calls {len(days) - len(behind)} day(s) done" in log, log
