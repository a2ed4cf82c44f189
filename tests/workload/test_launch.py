"""The scheduled loader starts training only for work to train (issue 22, Build 5), against a real Redis.

`seed --launch-job FILE` decides after enqueueing. Where it decides to launch, it reaches for the pod's
Kubernetes credentials, which do not exist here: the command then fails with the infrastructure exit code
and one line saying so. That failure is how these tests see the decision. The HTTP call to the API server
itself is not tested (no API server can run on these machines).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from harness import HPARAMS, ROOT, Cluster

from workload.core import errors
from workload.queue import plan

NOT_IN_A_POD = "cannot create the training Job: not in a pod with a service-account token"


def _scheduled_seed(cluster: Cluster, job_file: Path) -> subprocess.CompletedProcess[str]:
    runs_file = cluster.share.parent / "runs.json"
    runs_file.write_text(json.dumps({"main": HPARAMS}))
    env = cluster.env()
    env.pop("KUBERNETES_SERVICE_HOST", None)
    return subprocess.run(
        [sys.executable, "-m", "workload", "seed", "--runs-file", str(runs_file), "--launch-job", str(job_file)],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )


def test_training_is_launched_for_new_or_pending_work_and_never_when_nothing_is_new(
    cluster: Cluster, tmp_path: Path
) -> None:
    shutil.copytree(cluster.dataset_src, cluster.share / "datasets" / "fraud")
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "t"}}))

    first = _scheduled_seed(cluster, job_file)  # new days enqueued: launch
    assert first.returncode == errors.EXIT_INFRA, first.stderr
    assert [line for line in first.stderr.splitlines() if NOT_IN_A_POD in line], first.stderr
    assert cluster.counts().pending > 0  # the queue was filled before the launch was tried: nothing lost

    again = _scheduled_seed(cluster, job_file)  # nothing added, but pending work left: launch
    assert again.returncode == errors.EXIT_INFRA, again.stderr
    assert NOT_IN_A_POD in again.stderr

    cluster.queue().mark_done(plan.items(cluster.share))  # everything trained
    idle = _scheduled_seed(cluster, job_file)
    assert idle.returncode == 0, idle.stderr
    assert "nothing new: no training Job" in idle.stderr
    assert NOT_IN_A_POD not in idle.stderr


def test_a_broken_job_template_is_one_line_and_costs_nothing(cluster: Cluster, tmp_path: Path) -> None:
    shutil.copytree(cluster.dataset_src, cluster.share / "datasets" / "fraud")
    job_file = tmp_path / "job.json"
    job_file.write_text('{"kind": "Pod"}')
    out = _scheduled_seed(cluster, job_file)
    assert out.returncode == errors.EXIT_INFRA, out.stderr
    (line,) = [x for x in out.stderr.splitlines() if "training Job template" in x]
    assert line.endswith(f"training Job template {job_file}: not a Job manifest (kind 'Pod')")
    c = cluster.counts()
    assert c.pending > 0 and c.dead == 0  # enqueued, nothing charged
