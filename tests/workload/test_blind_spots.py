"""Rules that no test looked at until a review planted a bug in each (issue 34's blind spots), each now
checked through the product's own functions on real files: a loader that finds the publish lock held waits
its turn, and leaves the holder's staging folder alone; checkpoint retention never deletes a file of a
higher lease token; a day's stored features depend on every file its window reads (the feature window
plus the label delay, on a dataset longer than that); the calibration refit includes the day just trained."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from workload.data import dataset as ds
from workload.data import features, featurestore, publish, simulator
from workload.data.source import LocalSource
from workload.model import calibration
from workload.model.hparams import HParams
from workload.model.trainer import Trainer
from workload.share.checkpoint import CheckpointStore, checkpoint_name

pytestmark = pytest.mark.timeout(120)

# -- the publish lock ----------------------------------------------------------------------------------------
_HOLD = ("import fcntl, os, sys\n"
         "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o664)\n"
         "fcntl.lockf(fd, fcntl.LOCK_EX)\n"
         "print('held', flush=True)\n"
         "sys.stdin.read()\n")


@contextlib.contextmanager
def another_loader_holds(lock: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process holding the dataset's publishing lock, as a loader mid-publish does, until the block ends.
    (A lock taken in this process would not block a publish in it: POSIX record locks are per process.)"""
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"held\n"
        yield proc
    finally:
        if proc.stdin:
            proc.stdin.close()  # the holder exits: its lock goes with it
        proc.wait(10)


def _publish_in_a_thread(root: Path, src: Path) -> tuple[threading.Thread, list]:
    got: list = []

    def run() -> None:
        try:
            got.append(publish.publish(root, LocalSource(src)))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            got.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, got


def _while_held(root: Path, live_staging: Path | None, seconds: float = 1.5) -> list[str]:
    """What the waiting loader did to the share while the lock was held elsewhere (it should do nothing)."""
    seen: list[str] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not seen:
        if root.exists():
            seen.append(f"published {root} while another loader held the lock")
        ours = [p for p in root.parent.glob(f".{root.name}.staging-*") if p != live_staging]
        if ours:
            seen.append(f"staged {ours[0].name} while another loader held the lock")
        if live_staging is not None and not live_staging.exists():
            seen.append(f"deleted the lock holder's staging folder {live_staging.name}")
        time.sleep(0.02)
    return seen


def test_a_loader_that_finds_the_publish_lock_held_waits_its_turn(tmp_path: Path, dataset_src: Path) -> None:
    root = tmp_path / "datasets" / "fraud"
    root.parent.mkdir(parents=True)
    with another_loader_holds(publish.lock_path(root)):
        thread, got = _publish_in_a_thread(root, dataset_src)
        seen = _while_held(root, None)
        assert not seen, seen
        assert thread.is_alive() and not got, f"the loader did not wait for the lock: {got}"
    thread.join(60)
    assert got and isinstance(got[0], publish.Outcome), got
    assert (root / ds.MANIFEST).exists() and got[0].copied, "after its turn came, it published"


def test_a_waiting_loader_leaves_the_lock_holders_staging_folder_alone(tmp_path: Path, dataset_src: Path) -> None:
    root = tmp_path / "datasets" / "fraud"
    live = root.parent / f".{root.name}.staging-0123456789ab"  # the lock holder's copy, mid-way
    (live / ds.TRAINING).mkdir(parents=True)
    (live / ds.TRAINING / "2018-04-01.parquet").write_bytes(b"half a day")
    with another_loader_holds(publish.lock_path(root)):
        thread, got = _publish_in_a_thread(root, dataset_src)
        seen = _while_held(root, live)
        assert not seen, seen
    thread.join(60)
    assert got and isinstance(got[0], publish.Outcome), got
    assert not live.exists(), "once it holds the lock, whatever staging it finds is a dead loader's: removed"


# -- checkpoint retention and lease tokens ------------------------------------------------------------------------
def _state(step: int) -> dict:
    return {"w": torch.full((2,), float(step)), "progress": {"epoch": 0, "batch": step}}  # mid-day: not a boundary


def test_retention_never_deletes_a_checkpoint_of_a_higher_lease_token(tmp_path: Path) -> None:
    """What a writer's retention sees if a newer lease wrote its first checkpoint just after the writer checked
    that no higher manifest exists: a file of token 5 that no manifest names yet. Token 4 prunes what it may
    (an unnamed file of token 3, its own superseded checkpoints) and nothing of token 5."""
    store = CheckpointStore(tmp_path / "run", keep=1)
    assert store.fence(4)
    first = store.save(_state(1), path=store.next_path(4), may_promote=lambda: True, boundary=False)
    newer = store.dir / checkpoint_name(50, 5)
    older = store.dir / checkpoint_name(49, 3)
    for path in (newer, older):
        torch.save(_state(9), path)
    last = store.save(_state(2), path=store.next_path(4), may_promote=lambda: True, boundary=False)
    assert first is not None and last is not None
    assert newer.exists(), "retention deleted a checkpoint of a higher lease token"
    assert not older.exists() and not first.exists(), "retention ran: it pruned what it may"
    assert last.name in store.retained()


# -- a day's recorded feature inputs, and the calibration refit, on a dataset longer than the lookback ------------
LOOKBACK = features.LOOKBACK_DAYS  # the feature window plus the label delay
LONG = simulator.SimulationSpec(customers=20, terminals=10, train_days=LOOKBACK + 4, test_days=1,
                                start_date="2018-04-01", seed=5)


@pytest.fixture(scope="module")
def long_dataset(tmp_path_factory: pytest.TempPathFactory) -> ds.Dataset:
    base = tmp_path_factory.mktemp("long")
    simulator.generate(base / "days", LONG)
    return ds.Dataset(publish.publish(base / "datasets" / "fraud", LocalSource(base / "days")).root)


def test_a_days_stored_features_depend_on_every_day_its_window_and_label_delay_reach(long_dataset: ds.Dataset) -> None:
    data = long_dataset
    shards = data.training_shards()
    day = shards[-1]
    inputs = [e["path"] for e in data.feature_inputs(day)]
    assert inputs == shards[-(LOOKBACK + 1):], "the recorded inputs are the day and the LOOKBACK_DAYS before it"
    data.day_features(day)
    assert data.stored_features(day)  # valid as stored
    reached = shards[-(LOOKBACK + 1)]  # read for labels only (older than the 30-day window, within the delay)
    st = (data.root / reached).stat()
    os.utime(data.root / reached, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    with pytest.raises(featurestore.StaleFeatures):
        data.stored_features(day)  # a changed file in the lookback makes the stored features stale


def test_the_calibration_refit_includes_the_day_just_trained(long_dataset: ds.Dataset) -> None:
    """The worker refits after training a day, before the day is recorded as applied: the day itself must be
    among the calibration days when it is old enough (here an early day: every late one is within the label
    delay of the test day, and never eligible)."""
    data = long_dataset
    trainer = Trainer("cal", HParams(seed=1), features.FEATURE_NAMES, torch.device("cpu"), features.FEATURE_VERSION)
    early = data.training_shards()[3]
    assert calibration.eligible_days(data, [early]) == [early]
    assert calibration.refit(trainer, data, early) == [early]
    ex = data.examples([early])
    expected = calibration.fit_platt(trainer.logits(ex.x), ex.y)
    assert (trainer.calibration["scale"], trainer.calibration["shift"]) == pytest.approx(expected)
