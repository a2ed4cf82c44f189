"""A stray file in the share's runs/ folder (a copy of a record under another name, `{}`) is named and skipped
like a stale record: the runs recorded beside it are still restored into a wiped Redis and reconciled into one
restored from an older snapshot. Real files on a share folder, a real redis-server."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from workload.model import lineage
from workload.queue import plan
from workload.queue.workqueue import WorkQueue, connect
from workload.runtime.redis_server import RedisServer
from workload.share.paths import runs_dir

STRAYS = {"main copy.json": None, "stray.json": "{}\n"}  # None: a byte-for-byte copy of main's record


def _share(tmp_path: Path, dataset_src: Path) -> Path:
    share = tmp_path / "share"
    shutil.copytree(dataset_src, share / "datasets" / "fraud")
    for run in ("main", "other"):
        plan.record(share, plan.RunSpec(run=run, dataset="fraud", hparams={"epochs": 1, "seed": len(run)}))
    for name, text in STRAYS.items():
        (runs_dir(share) / name).write_text(text if text is not None else (runs_dir(share) / "main.json").read_text())
    return share


def _queue(server: RedisServer) -> WorkQueue:
    return WorkQueue(connect(server.url, server.password), retry_for_s=5)


def _each_named(caplog: pytest.LogCaptureFixture, share: Path) -> None:
    for name in STRAYS:
        lines = [r for r in caplog.records if str(runs_dir(share) / name) in r.getMessage()]
        assert lines, f"{name} was not named"
        assert all(r.levelno == logging.WARNING and r.getMessage().startswith("skipped, not a run: ") for r in lines)


def test_a_wiped_queue_is_restored_from_the_share_past_stray_files(tmp_path: Path, dataset_src: Path,
                                                                  redis_server: RedisServer,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    share = _share(tmp_path, dataset_src)
    assert set(plan.runs(share)) == {"main", "other"}
    q = _queue(redis_server)
    # what a worker does on a wiped Redis (before: PlanError, every worker exit 1)
    got = plan.restore(q, share, lineage.applied_days)
    assert got == {"runs": 2, "enqueued": 12, "already_applied": 0}
    snap = q.snapshot()["runs"]
    assert {r: len(s["pending"]) for r, s in snap.items()} == {"main": 6, "other": 6}
    _each_named(caplog, share)


def test_a_queue_from_an_older_snapshot_gets_the_run_it_lacks_past_stray_files(
        tmp_path: Path, dataset_src: Path, redis_server: RedisServer) -> None:
    share = _share(tmp_path, dataset_src)
    q = _queue(redis_server)
    main = plan.runs(share)["main"]
    q.put_spec("main", main.hparams)  # the snapshot was taken when only main was seeded
    q.enqueue(plan.items(share, {"main": main}))
    q.mark_seeded()
    # before: "cannot compare" logged, other never trained, exit 0
    closed = plan.reconcile(q, share, lineage.applied_days)
    assert closed is not None and closed.missing_runs == ["other"] and len(closed.missing_items) == 6
    assert not plan.gap(q, share)
    assert {r: len(s["pending"]) for r, s in q.snapshot()["runs"].items()} == {"main": 6, "other": 6}
