"""The share is the truth: what its run records and published days say must be trained is trained,
whatever Redis says, and nothing in Redis or on the share that is stale stops the healthy runs.

Through the command line, against a real redis-server and real worker processes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from exports import copy_files
from harness import ROOT, Cluster
from test_worker_faults import assert_exactly_once

pytestmark = pytest.mark.timeout(300)


def cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "workload", *args], env=cluster.env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


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
