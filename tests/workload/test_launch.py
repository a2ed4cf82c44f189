"""The scheduled loader starts training only for work to train (issue 22, Build 5), against a real Redis.

`seed --launch-job FILE` decides after enqueueing. Where it decides to launch, it reaches for the pod's
Kubernetes credentials, which do not exist here: the command then fails with the infrastructure exit code
and one line saying so. That failure is how these tests see the decision. The HTTP call itself is tested in
test_launch_inprocess.py, against an HTTPS server on loopback.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from exports import BANK_COLUMNS, bank_export
from harness import HPARAMS, ROOT, Cluster

from workload.core import errors
from workload.queue import plan

TOMORROW = "testing/2018-04-08.parquet"  # the last day: tomorrow's transactions, as a scoring/ day
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


# -- scoring on the schedule (issue 22, Build 6) -----------------------------------------------------
NO_SCORING_POD = "cannot create the scoring Job: not in a pod with a service-account token"


def _bank_seed(cluster: Cluster, export: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The scheduled loader with a schedule and an output bucket: syncs `export`, may launch both Jobs."""
    jobs = {}
    for kind in ("training", "scoring"):
        jobs[kind] = tmp_path / f"{kind}.json"
        jobs[kind].write_text(json.dumps({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": kind}}))
    columns = tmp_path / "columns.json"
    columns.write_text(json.dumps(BANK_COLUMNS))
    runs_file = tmp_path / "runs.json"
    runs_file.write_text(json.dumps({"main": HPARAMS}))
    env = cluster.env()
    env.pop("KUBERNETES_SERVICE_HOST", None)
    return subprocess.run(
        [sys.executable, "-m", "workload", "seed", "--runs-file", str(runs_file), "--datasets", str(export),
         "--columns", str(columns), "--launch-job", str(jobs["training"]), "--launch-scoring", str(jobs["scoring"])],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_scoring_is_launched_for_new_scoring_days_and_never_when_nothing_is_new(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A bank's export (own column names, float IDs, offsets, shuffled rows); tomorrow arrives unlabelled."""
    export = bank_export(cluster.dataset_src, tmp_path / "export", keep=lambda rel: rel != TOMORROW)
    first = _bank_seed(cluster, export, tmp_path)  # new training days: training is launched first
    assert first.returncode == errors.EXIT_INFRA, first.stderr
    assert NOT_IN_A_POD in first.stderr

    cluster.queue().mark_done(plan.items(cluster.share))  # everything trained, no scoring day yet
    idle = _bank_seed(cluster, export, tmp_path)
    assert idle.returncode == 0, idle.stderr
    assert "nothing new: no training Job" in idle.stderr
    assert "nothing new to score: no scoring Job" in idle.stderr

    bank_export(cluster.dataset_src, export, keep=lambda rel: rel == TOMORROW,
                role_of=lambda rel: "scoring", label="absent")  # fmt: skip
    tomorrow = _bank_seed(cluster, export, tmp_path)  # a new scoring/ day, nothing to train: score only
    assert tomorrow.returncode == errors.EXIT_INFRA, tomorrow.stderr
    assert "nothing new: no training Job" in tomorrow.stderr
    assert [line for line in tomorrow.stderr.splitlines() if NO_SCORING_POD in line], tomorrow.stderr
    assert cluster.counts().pending == 0  # a scoring day is never enqueued for training

    again = _bank_seed(cluster, export, tmp_path)  # published already: nothing to score again
    assert again.returncode == 0, again.stderr
    assert "nothing new to score: no scoring Job" in again.stderr
    assert NO_SCORING_POD not in again.stderr


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
