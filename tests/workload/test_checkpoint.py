"""Checkpoint store: atomic promotion, verified loading with fallback, fencing, no unpickling."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from workload.share.checkpoint import CheckpointStore


def state(step: int, progress: dict | None = None) -> dict:
    return {"model": {"w": torch.full((3,), float(step))}, "step": step, "progress": progress}


def save(store: CheckpointStore, step: int, token: int = 1, progress: dict | None = None) -> Path:
    path = store.save(state(step, progress), path=store.next_path(token), may_promote=lambda: True,
                      boundary=progress is None)
    assert path is not None
    return path


def test_latest_wins_and_old_mid_day_ones_are_collected_but_every_day_boundary_stays(tmp_path: Path) -> None:
    """A late day rewinds the run to the boundary before it: end-of-day checkpoints are never pruned."""
    store = CheckpointStore(tmp_path, keep=2)
    for step in range(1, 6):
        save(store, step, progress=None if step in (1, 3) else {"shard": "d", "epoch": 0, "batch": step})
    loaded = store.load()
    assert loaded and loaded.state["step"] == 5 and loaded.seq == 5
    assert sorted(p.name for p in store.dir.glob("ckpt-*")) == [
        "ckpt-00000001-t1.pt", "ckpt-00000003-t1.pt", "ckpt-00000004-t1.pt", "ckpt-00000005-t1.pt"]


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_corrupt_latest_falls_back_to_previous_with_a_warning(tmp_path: Path, caplog, damage: str) -> None:
    store = CheckpointStore(tmp_path)
    save(store, 1)
    latest = save(store, 2)
    data = latest.read_bytes()
    if damage == "flip":
        latest.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    elif damage == "truncate":
        latest.write_bytes(data[: len(data) // 2])
    else:
        latest.unlink()
    with caplog.at_level(logging.WARNING):
        loaded = store.load()
    assert loaded and loaded.state["step"] == 1
    assert f"checkpoint {latest} is unusable" in caplog.text and "falling back" in caplog.text


def test_unreadable_manifest_scans_the_folder(tmp_path: Path, caplog) -> None:
    store = CheckpointStore(tmp_path)
    save(store, 1)
    save(store, 2)
    store.manifest.write_text("{not json")
    with caplog.at_level(logging.WARNING):
        loaded = store.load()
    assert loaded and loaded.state["step"] == 2
    assert "manifest" in caplog.text


def test_a_writer_that_lost_its_lease_promotes_nothing(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    save(store, 1, token=5)
    stale = store.next_path(token=4)
    assert store.save(state(99), path=stale, may_promote=lambda: False, boundary=True) is None
    assert not stale.exists()
    loaded = store.load()
    assert loaded and loaded.state["step"] == 1
    assert [e["file"] for e in json.loads(store.manifest.read_text())["entries"]] == ["ckpt-00000001-t5.pt"]


def test_the_last_shard_boundary_is_kept_for_resume(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=2)
    save(store, 1)  # boundary
    for step in range(2, 6):
        save(store, step, progress={"shard": "b", "epoch": 0, "batch": step})
    boundary = store.load(accept=lambda s: s["progress"] is None)
    assert boundary and boundary.state["step"] == 1


class Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_checkpoints_are_never_unpickled(tmp_path: Path, caplog) -> None:
    """A checkpoint smuggling an object is refused by weights_only loading: its code never runs."""
    store = CheckpointStore(tmp_path)
    save(store, 1)
    marker = tmp_path / "pwned"
    evil = store.next_path(token=1)
    torch.save({"model": {}, "x": Payload(str(marker))}, evil)
    with caplog.at_level(logging.WARNING):
        loaded = store.load()  # the manifest does not list it: the folder scan finds it
        store.manifest.unlink()
        loaded = store.load()
    assert loaded and loaded.state["step"] == 1
    assert not marker.exists()
    assert f"checkpoint {evil} is unusable" in caplog.text


def test_a_stale_writer_is_fenced_by_the_storage(tmp_path: Path) -> None:
    """Lease 5 checked its lease, then froze; lease 6 fenced the run and promoted. When 5 wakes up and
    promotes, the share refuses it: nothing it writes is loaded, and it deletes nothing."""
    store = CheckpointStore(tmp_path, keep=1)
    assert store.fence(5)
    first = save(store, 1, token=5)
    stale_path = store.next_path(5)  # lease 5 is about to write this when it freezes
    assert store.fence(6)  # the new owner adopts what 5 promoted
    newer = save(store, 2, token=6)
    assert store.save(state(99), path=stale_path, may_promote=lambda: True, boundary=True) is None
    assert not stale_path.exists()
    assert store.load().state["step"] == 2
    assert first.exists() or first.name not in store.retained()
    assert newer.exists() and all((store.dir / n).exists() for n in store.retained())
    assert not store.fence(5), "a lower token can never fence again"


def test_a_stale_manifest_is_never_read(tmp_path: Path) -> None:
    """Even a stale manifest that does land (written before the fence check could see lease 7's)
    is ignored: the loader trusts the highest token only, and retention keeps what any manifest names."""
    store = CheckpointStore(tmp_path, keep=1)
    assert store.fence(6)
    base = save(store, 1, token=6)
    assert store.fence(7)
    save(store, 2, token=7, progress={"shard": "b", "epoch": 0, "batch": 3})
    stale = tmp_path / "checkpoints" / "ckpt-00000009-t6.pt"
    torch.save(state(66), stale)
    store.manifest_path(6).write_text(json.dumps({"entries": [{"file": stale.name, "seq": 9, "token": 6}]}))
    assert store.load().state["step"] == 2
    save(store, 3, token=7, progress={"shard": "b", "epoch": 0, "batch": 4})
    assert base.exists(), "the newest shard-boundary checkpoint of lease 7 was deleted"
    assert store.load(accept=lambda s: s["progress"] is None).state["step"] == 1


def test_files_on_the_share_are_readable_by_the_group(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    path = save(store, 1)
    assert path.stat().st_mode & 0o040 and store.manifest.stat().st_mode & 0o040


def test_a_report_from_an_older_checkpoint_does_not_overwrite_a_newer_one(tmp_path: Path) -> None:
    from workload.model import report

    def st(n: int) -> SimpleNamespace:
        h = {"shard": "", "time": "t", "checkpoint": "", "train_accuracy": 1.0,
             "accuracy": 1.0, "average_precision": 0.5, "base_rate": 0.1, "roc_auc": 0.5, "precision_top100": 0.1,
             "recall_at_1pct_fpr": 0.1}
        return SimpleNamespace(run="r", hparams={}, reapplied=[], history=[
            dict(h, shard=f"d{i}", checkpoint=f"ckpt-0000000{i + 1}-t1.pt") for i in range(n)])

    assert report.write(tmp_path, st(3), None, draw=False, kept={"ckpt-00000003-t1.pt"}, stamp=(7, 3))
    assert report.write(tmp_path, st(2), None, draw=False, stamp=(6, 9)) is None
    text = (tmp_path / "report.txt").read_text()
    assert text.count("training dataset: ") == 3 and report.rendered_from(tmp_path) == (7, 3)
    assert "pruned" in text and "ckpt-00000003-t1.pt\n" in text


def test_late_retention_by_a_stale_writer_deletes_nothing_a_newer_lease_names(tmp_path: Path) -> None:
    """The race a check cannot close: lease 7 adopted lease 5's checkpoint while lease 6 (stale) was
    promoting its own; lease 6's retention then runs. It must not delete what lease 7 loads."""
    store = CheckpointStore(tmp_path, keep=1)
    assert store.fence(5)
    f5 = save(store, 1, token=5)
    assert store.fence(6) and store.fence(7)  # both adopt [f5]
    g6 = tmp_path / "checkpoints" / "ckpt-00000002-t6.pt"  # lease 6's late promotion lands
    torch.save(state(2), g6)
    store.manifest_path(6).write_text(json.dumps({"entries": [{"file": g6.name, "seq": 2, "token": 6,
                                                                "boundary": True}]}))
    store._collect(6)
    assert f5.exists(), "lease 6 deleted the checkpoint lease 7 resumes from"
    assert store.load().state["step"] == 1
