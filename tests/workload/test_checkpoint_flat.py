"""Checkpoints that stay flat in the days applied: the history kept once in segments, boundaries pruned to a
ladder (docs/architecture.md, "Where each rule lives"). Unit-level, on real files."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from workload.share import checkpoint
from workload.share.checkpoint import SEGMENT, CheckpointStore, ladder


def state(days: int) -> dict:
    history = [{"shard": f"d{i}", "checkpoint": f"ckpt-{i + 1:08d}-t1.pt", "time": "t", "ap": i / 7}
               for i in range(days)]
    return {"model": {"w": torch.zeros(2)}, "history": history, "progress": None}


def save(store: CheckpointStore, days: int, token: int = 1) -> Path:
    path = store.save(state(days), path=store.next_path(token), may_promote=lambda: True, boundary=True)
    assert path is not None
    return path


def test_the_history_is_kept_once_in_segments_and_loads_whole(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    small = save(store, 3)
    path = save(store, 2 * SEGMENT + 5)
    raw = torch.load(path, weights_only=True)
    assert len(raw["history"]) == 5 and len(raw["history@segments"]) == 2  # the file carries the tail only
    assert len(list(store.segments_dir.iterdir())) == 2
    assert path.stat().st_size < 2 * small.stat().st_size
    assert store.load().state["history"] == state(2 * SEGMENT + 5)["history"]
    save(store, 2 * SEGMENT + 6)
    assert len(list(store.segments_dir.iterdir())) == 2  # shared by the later checkpoint, not written again


def test_a_torn_segment_falls_back_to_the_previous_checkpoint(tmp_path: Path, caplog) -> None:
    store = CheckpointStore(tmp_path)
    save(store, 3)
    save(store, SEGMENT + 1)
    segment = next(store.segments_dir.iterdir())
    segment.write_text(json.dumps([{"shard": "forged"}] * SEGMENT))
    checkpoint._segment_cache.clear()  # another process: nothing parsed yet
    with caplog.at_level(logging.WARNING):
        loaded = store.load()
    assert loaded is not None and len(loaded.state["history"]) == 3
    assert "does not match its sha256" in caplog.text


def test_the_ladder_keeps_the_newest_boundaries_and_about_two_a_doubling() -> None:
    alive: list[int] = []
    counts = {}
    for top in range(1, 2001):
        alive.append(top)
        rungs = ladder(alive, top)
        assert set(alive[-checkpoint.RECENT_BOUNDARIES:]) <= rungs
        alive = [s for s in alive if s in rungs]
        counts[top] = len(alive)
    assert counts[100] <= 18 and counts[2000] <= 26 and 1 in alive  # 8 + 2 log2(N), the first day kept
    gaps = [b - a for a, b in zip(alive, alive[1:], strict=False)]
    assert all(g <= max(2000 - a, 1) // 2 + 1 for a, g in zip(alive, gaps, strict=False))  # about k/2 more days


def test_retention_prunes_old_boundaries_by_the_ladder_never_the_newest(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=2)
    for days in range(1, 41):
        save(store, days)
    kept = sorted(int(p.name[5:13]) for p in store.dir.glob("ckpt-*"))
    assert kept[-checkpoint.RECENT_BOUNDARIES:] == list(range(33, 41))
    assert len(kept) < 20 and 1 in kept


def test_ladder_pruning_never_deletes_a_newer_lease_tokens_file(tmp_path: Path) -> None:
    """A newer lease's checkpoint written but not promoted yet (no manifest of its own names it): the older
    lease's pruning, however many boundaries it drops, leaves it, and every file its own manifest names."""
    store = CheckpointStore(tmp_path, keep=1)
    save(store, 1)
    newer = store.dir / checkpoint.checkpoint_name(2, 9)
    newer.write_bytes(b"lease 9's write, not promoted yet")
    for days in range(2, 40):
        save(store, days)
    assert newer.exists()
    named = store.retained()
    assert {p.name for p in store.dir.glob("ckpt-*")} == named | {newer.name}
    assert len(named) < 20
