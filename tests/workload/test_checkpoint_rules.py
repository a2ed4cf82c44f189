"""Checkpoint store rules one at a time: what a manifest entry records, which file wins, what a refused
file says, what retention keeps and sweeps, and loading that never unpickles, even when asked to."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import time
import zipfile
from pathlib import Path

import pytest
import torch
from test_checkpoint import save, state  # one way to write a test checkpoint

from workload.share import checkpoint as ckpt
from workload.share.checkpoint import CheckpointStore


def entries(store: CheckpointStore, token: int) -> list[dict]:
    return json.loads(store.manifest_path(token).read_text())["entries"]


def test_keep_is_three_by_default_and_at_least_one(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^keep must be >= 1, got 0$"):
        CheckpointStore(tmp_path, keep=0)
    store = CheckpointStore(tmp_path)
    for step in range(1, 6):
        save(store, step, progress={"batch": step})
    assert [e["seq"] for e in entries(store, 1)] == [5, 4, 3]  # no boundary at all: the newest three
    assert store.load().path.name == "ckpt-00000005-t1.pt"


def test_a_manifest_entry_records_token_hash_and_boundary(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "output" / "main")  # folders are made on first write
    path = save(store, 1, token=5)
    mid = save(store, 2, token=5, progress={"batch": 3})
    assert entries(store, 5) == [
        {"file": mid.name, "seq": 2, "token": 5, "sha256": hashlib.sha256(mid.read_bytes()).hexdigest(),
         "boundary": False},
        {"file": path.name, "seq": 1, "token": 5, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
         "boundary": True},
    ]
    loaded = store.load()
    assert (loaded.path, loaded.seq, loaded.token) == (mid, 2, 5)


def test_a_bit_flip_torch_reads_without_complaint_is_caught_by_the_hash(tmp_path: Path, caplog) -> None:
    store = CheckpointStore(tmp_path)
    save(store, 1)
    latest = save(store, 7)
    data = latest.read_bytes()
    seven = torch.tensor([7.0]).numpy().tobytes()
    assert data.count(seven) == 3
    latest.write_bytes(data.replace(seven, torch.tensor([8.0]).numpy().tobytes()))
    assert torch.load(latest, weights_only=True)["model"]["w"].tolist() == [8.0, 8.0, 8.0]  # torch cannot tell
    with caplog.at_level(logging.WARNING, logger="workload.share.checkpoint"):
        loaded = store.load()
    assert loaded and loaded.state["step"] == 1
    assert (f"checkpoint {latest} is unusable (sha256 does not match the manifest (torn or corrupted file)); "
            "falling back to the previous one") in [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("content", [{"step": 3}, [1, 2], torch.ones(2)])
def test_a_file_that_is_not_a_training_checkpoint_is_refused(tmp_path: Path, caplog, content) -> None:
    store = CheckpointStore(tmp_path)
    save(store, 1)
    other = store.dir / "ckpt-00000009-t1.pt"
    torch.save(content, other)
    store.manifest_path(1).unlink()  # the folder scan finds it first
    with caplog.at_level(logging.WARNING, logger="workload.share.checkpoint"):
        loaded = store.load()
    assert loaded and loaded.state["step"] == 1
    assert f"checkpoint {other} is unusable (not a training checkpoint (no 'model' entry))" in caplog.text


class Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_an_environment_asking_torch_to_unpickle_is_not_obeyed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    """TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 (set by old tooling) turns torch.load's default into unpickling,
    read at each call; the store pins weights_only=True, so the smuggled object's code still never runs."""
    store = CheckpointStore(tmp_path)
    save(store, 1)
    marker = tmp_path / "pwned"
    evil = store.save({"model": {}, "x": Payload(str(marker))}, path=store.next_path(1), may_promote=lambda: True,
                      boundary=True)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with caplog.at_level(logging.WARNING, logger="workload.share.checkpoint"):
        loaded = store.load()
    assert not marker.exists(), "the checkpoint was unpickled"
    assert loaded and loaded.state["step"] == 1 and f"checkpoint {evil} is unusable" in caplog.text


def on_gpu(data: bytes) -> bytes:
    """The same checkpoint as a GPU worker writes it: its tensors tagged with device cuda:0."""
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            part = src.read(info)
            if info.filename.endswith("/data.pkl"):
                assert b"X\x03\x00\x00\x00cpu" in part
                part = part.replace(b"X\x03\x00\x00\x00cpu", b"X\x06\x00\x00\x00cuda:0")
            dst.writestr(info, part)
    return out.getvalue()


@pytest.mark.skipif(torch.cuda.is_available(), reason="shows a CPU-only machine loading a GPU's checkpoint")
def test_a_checkpoint_written_on_a_gpu_loads_on_a_machine_without_one(tmp_path: Path) -> None:
    """Optimizer state stays on the device in `Trainer.state_dict`: loading maps it to the CPU."""
    store = CheckpointStore(tmp_path)
    path = save(store, 4)
    gpu = on_gpu(path.read_bytes())
    with pytest.raises(RuntimeError, match="CUDA"):
        torch.load(io.BytesIO(gpu), weights_only=True)
    store.save({**state(4), "from": "gpu"}, path=store.next_path(1), may_promote=lambda: True, boundary=True)
    newest = store.load().path
    newest.write_bytes(gpu)
    store.manifest_path(1).unlink()  # no hash to compare: the folder scan reads the GPU file as it is
    loaded = store.load()
    assert loaded and loaded.path == newest and loaded.state["model"]["w"].device.type == "cpu"


def test_an_old_manifest_without_tokens_orders_below_tokened_entries(tmp_path: Path) -> None:
    """Entries written before tokens existed count as token 0."""
    store = CheckpointStore(tmp_path)
    old = store.dir / "ckpt-00000005-t0.pt"
    new = store.dir / "ckpt-00000002-t1.pt"
    store.dir.mkdir(parents=True)
    torch.save(state(5), old)
    torch.save(state(2), new)
    torch.save(state(9), store.dir / "ckpt-00000009-t2.pt")  # never promoted: the manifest must be what is read
    store.manifest_path(1).write_text(json.dumps({"entries": [{"file": old.name, "seq": 5},
                                                             {"file": new.name, "seq": 2, "token": 1}]}))
    loaded = store.load()
    assert loaded.path == new and loaded.token == 1
    loaded = store.load(accept=lambda s: s["step"] == 5)
    assert loaded.path == old and loaded.token == 0


def test_the_folder_scan_reads_seq_and_token_from_the_name(tmp_path: Path, caplog) -> None:
    store = CheckpointStore(tmp_path)
    store.dir.mkdir(parents=True)
    torch.save(state(2), store.dir / "ckpt-00000002-t7.pt")
    torch.save(state(3), store.dir / "ckpt-00000003-t6.pt")
    with caplog.at_level(logging.WARNING, logger="workload.share.checkpoint"):
        loaded = store.load()
    assert (loaded.seq, loaded.token, loaded.state["step"]) == (2, 7, 2)  # the higher token wins
    assert f"no readable checkpoint manifest in {store.dir}; scanning the folder" in caplog.text
    assert store.retained() == {"ckpt-00000002-t7.pt", "ckpt-00000003-t6.pt"}
    assert CheckpointStore(tmp_path / "none").load() is None


def test_a_manifest_naming_a_foreign_file_falls_back_to_the_previous_manifest(tmp_path: Path, caplog) -> None:
    store = CheckpointStore(tmp_path)
    assert store.fence(3)
    save(store, 1, token=3)
    store.manifest_path(4).write_text(json.dumps({"entries": [{"file": "../../etc/passwd", "seq": 9}]}))
    with caplog.at_level(logging.WARNING, logger="workload.share.checkpoint"):
        loaded = store.load()
    assert loaded and loaded.token == 3
    assert (f"checkpoint manifest {store.manifest_path(4)} is unreadable (entry '../../etc/passwd' is not a "
            "checkpoint file name); trying the previous one") in [r.getMessage() for r in caplog.records]


def test_a_manifest_gone_between_listing_and_reading_falls_back_to_the_next_manifest(tmp_path: Path) -> None:
    """A manifest that vanishes after it was listed (pruned) is skipped for the next one, not for an
    unverified folder scan."""
    store = CheckpointStore(tmp_path, keep=1)
    assert store.fence(3)
    kept = save(store, 1, token=3)
    unnamed = store.dir / "ckpt-00000005-t3.pt"  # a newer file no manifest names
    torch.save(state(5), unnamed)
    store.manifest_path(4).symlink_to(tmp_path / "pruned.json")  # listed, but reading finds nothing
    loaded = store.load()
    assert loaded and loaded.path == kept
    assert store.retained() == {kept.name}


def test_highest_token_counts_manifests_and_checkpoint_files(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    assert store.highest_token() == 0  # no folder yet
    store.dir.mkdir(parents=True)
    assert store.highest_token() == 0
    torch.save(state(1), store.dir / "ckpt-00000001-t9.pt")  # a stale writer's file that was never promoted
    assert store.highest_token() == 9
    assert store.fence(12)
    assert store.highest_token() == 12


def test_fencing_again_with_the_same_token_keeps_the_manifest(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    assert store.fence(4)
    save(store, 1, token=4)
    before = store.manifest_path(4).read_text()
    assert store.fence(4)  # a worker that re-fences after a retry: still the owner
    assert store.manifest_path(4).read_text() == before
    assert not store.fence(3)


def test_a_fence_overtaken_while_writing_takes_its_manifest_back(tmp_path: Path, monkeypatch) -> None:
    """Lease 5 froze mid-write of its manifest, past its lease; lease 6 fenced meanwhile."""
    store = CheckpointStore(tmp_path)
    assert store.fence(4)
    fired: list[str] = []

    def point(name: str) -> None:
        if name == "mid-write" and not fired:
            fired.append(name)
            assert CheckpointStore(tmp_path).fence(6)

    monkeypatch.setattr(ckpt.faults, "point", point)
    assert store.fence(5) is False
    assert fired and not store.manifest_path(5).exists() and store.manifest == store.manifest_path(6)


def test_save_refuses_a_path_that_is_not_one_of_its_checkpoints(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "a")
    elsewhere = tmp_path / "b" / "checkpoints" / "ckpt-00000001-t1.pt"
    with pytest.raises(ValueError) as caught:
        store.save(state(1), path=elsewhere, may_promote=lambda: True, boundary=True)
    assert str(caught.value) == f"{elsewhere} is not a checkpoint path of {store.dir}; use next_path()"
    with pytest.raises(ValueError, match="use next_path"):
        store.save(state(1), path=store.dir / "model.pt", may_promote=lambda: True, boundary=True)
    assert not elsewhere.exists()


def test_save_passes_the_fault_points_in_order(tmp_path: Path, monkeypatch) -> None:
    """The fault and chaos tests kill a worker at these named points (WORKLOAD_FAULT)."""
    seen: list[str] = []
    monkeypatch.setattr(ckpt.faults, "point", seen.append)
    save(CheckpointStore(tmp_path), 1)
    assert seen == ["mid-write", "checkpoint-written", "promote", "mid-write"]


def test_discarding_says_why(tmp_path: Path, caplog) -> None:
    store = CheckpointStore(tmp_path)
    assert store.fence(5)
    stale = store.next_path(5)
    with caplog.at_level(logging.WARNING, logger="workload.share.checkpoint"):
        assert store.save(state(1), path=stale, may_promote=lambda: False, boundary=True) is None
        assert store.fence(6)
        assert store.save(state(1), path=stale, may_promote=lambda: True, boundary=True) is None
    said = [r.getMessage() for r in caplog.records]
    assert f"lease lost before promoting {stale.name}: discarding it (fencing)" in said
    assert (f"lease token 6 wrote manifest-t000000000006.json after ours (5): we are stale; discarding {stale.name} "
            "(fencing)") in said
    assert not stale.exists()


def test_retention_keeps_files_named_by_any_manifest_past_a_vanished_one(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=1)
    assert store.fence(2)
    named_by_2 = save(store, 1, token=2)
    assert store.fence(3)
    store.manifest_path(3).unlink()
    store.manifest_path(3).symlink_to(tmp_path / "gone.json")  # listed, then found missing
    assert store.fence(4)
    store.manifest_path(4).write_text(json.dumps({"entries": []}))
    save(store, 2, token=4, progress={"batch": 1})
    assert named_by_2.exists(), "manifest 2 still names it"


def test_stale_temp_files_are_swept_and_fresh_ones_kept(tmp_path: Path) -> None:
    """A writer killed mid-write leaves `.ckpt-….tmp`; one idle for over ten minutes is swept on the next
    promotion, a younger one (a writer still at work) is not."""
    store = CheckpointStore(tmp_path)
    save(store, 1)
    now = time.time()
    ages = {f".ckpt-0000000{i}-t1.pt.{i}.tmp": 700.0 for i in range(6)}
    ages |= {".manifest.fresh.tmp": 10.0, ".ckpt-x.pt.edge.tmp": 600.3}
    for name, age in ages.items():
        (store.dir / name).write_bytes(b"half a checkpoint")
        os.utime(store.dir / name, (now - age, now - age))
    (store.dir / ".dangling.tmp").symlink_to(tmp_path / "renamed-away")  # its writer moved it on: skipped
    (store.dir / "notes.TMP").write_text("not ours")
    os.utime(store.dir / "notes.TMP", (0, 0))
    save(store, 2)
    left = sorted(p.name for p in store.dir.iterdir() if "tmp" in p.name.lower())
    assert left == [".dangling.tmp", ".manifest.fresh.tmp", "notes.TMP"]


@pytest.mark.parametrize("lease_held", [False, True])
def test_a_newer_lease_pruning_the_stale_file_first_is_no_error(tmp_path: Path, lease_held: bool) -> None:
    """Lease 5 wrote its file and checks its lease; meanwhile lease 6 promotes and its retention deletes
    that unnamed file. Lease 5 then discards a file that is already gone: a None, not a crash."""
    store = CheckpointStore(tmp_path)
    assert store.fence(5)
    stale = store.next_path(5)
    newer = CheckpointStore(tmp_path)

    def lease_check() -> bool:
        assert newer.fence(6)
        save(newer, 2, token=6)  # its retention runs now
        assert not stale.exists()
        return lease_held

    assert store.save(state(1), path=stale, may_promote=lease_check, boundary=True) is None
    assert store.load().token == 6


def test_retention_racing_another_collector_is_no_error(tmp_path: Path, monkeypatch) -> None:
    """Two writers' retention runs at once: what one lists, the other may have deleted already."""
    store = CheckpointStore(tmp_path, keep=1)
    for token in (1, 2, 3, 4):
        assert store.fence(token)
        save(store, token, token=token)
    listed = store.manifests()
    gone_manifest = (0, store.manifest_path(0))  # listed, then deleted by the other collector
    monkeypatch.setattr(store, "manifests", lambda: [*listed, gone_manifest])
    real_iterdir = Path.iterdir

    def iterdir(self: Path):
        yield from real_iterdir(self)
        if self == store.dir:
            yield self / "ckpt-00000001-t0.pt"  # listed, then deleted by the other collector

    monkeypatch.setattr(Path, "iterdir", iterdir)
    store._collect(4)
    assert not store.manifest_path(1).exists()  # beyond the newest three, below our token: pruned
    assert store.load().token == 4


def test_a_fence_taken_back_after_a_collector_removed_it_is_no_error(tmp_path: Path, monkeypatch) -> None:
    """Overtaken while writing its manifest, lease 5 takes it back; a newer lease's retention may have
    pruned it already (it is below that lease's token): still a plain False."""
    store = CheckpointStore(tmp_path)
    assert store.fence(4)
    real_manifests = CheckpointStore.manifests

    def manifests(self: CheckpointStore) -> list:
        if store.manifest_path(5).exists():  # lease 5's write just landed: lease 6 fences, then prunes it
            store.manifest_path(5).unlink()
            assert CheckpointStore(tmp_path).fence(6)
        return real_manifests(self)

    monkeypatch.setattr(CheckpointStore, "manifests", manifests)
    assert store.fence(5) is False
    assert real_manifests(store)[0][0] == 6


@pytest.mark.parametrize(("seq", "token"), [(1, 0), (7, 42), (99_999_999, 10**12), (10**8, 3)])
def test_a_checkpoint_name_parses_back_to_the_numbers_that_made_it(seq: int, token: int) -> None:
    name = ckpt.checkpoint_name(seq, token)
    assert ckpt.parse_checkpoint_name(name) == (seq, token)
    assert ckpt.parse_manifest_name(ckpt.manifest_name(token)) == token
    assert CheckpointStore(Path("/run")).next_path(token).name == ckpt.checkpoint_name(1, token)


@pytest.mark.parametrize("name", ["ckpt-00000001-t1.pt.tmp", ".ckpt-00000001-t1.pt.x1y2.tmp", "ckpt-1-t1.pt",
                                  "ckpt-00000001-t.pt", "manifest-t000000000001.json", "model.pt"])
def test_other_file_names_are_not_checkpoints(name: str) -> None:
    assert ckpt.parse_checkpoint_name(name) is None


@pytest.mark.parametrize("name", ["manifest-t000000000001.json.tmp", "manifest-t1.json", "manifest-t.json",
                                  "ckpt-00000001-t1.pt", "manifest.json"])
def test_other_file_names_are_not_manifests(name: str) -> None:
    assert ckpt.parse_manifest_name(name) is None


def test_a_lease_is_superseded_by_the_highest_token_that_fenced_after_it(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    assert store.superseded_by(5) is None, "no folder yet"
    assert store.fence(5) and store.fence(7) and not store.fence(6)
    assert [store.superseded_by(t) for t in (4, 5, 6, 7, 8)] == [7, 7, 7, None, None]
