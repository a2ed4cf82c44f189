"""Checkpoint store: atomic promotion, verified loading with fallback, fencing, no unpickling."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from workload.checkpoint import CheckpointStore


def state(step: int, progress: dict | None = None) -> dict:
    return {"model": {"w": torch.full((3,), float(step))}, "step": step, "progress": progress}


def save(store: CheckpointStore, step: int, token: int = 1, progress: dict | None = None) -> Path:
    path = store.save(state(step, progress), path=store.next_path(token), may_promote=lambda: True)
    assert path is not None
    return path


def test_latest_wins_and_old_ones_are_collected(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=2)
    for step in range(1, 5):
        save(store, step)
    loaded = store.load()
    assert loaded and loaded.state["step"] == 4 and loaded.seq == 4
    assert sorted(p.name for p in store.dir.glob("ckpt-*")) == ["ckpt-00000003-t1.pt", "ckpt-00000004-t1.pt"]


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
    assert store.save(state(99), path=stale, may_promote=lambda: False) is None
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
