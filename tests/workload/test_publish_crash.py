"""`seed` killed (SIGKILL, a real process) between every pair of steps of publishing a dataset and of
appending days to it: what readers of the share see, and what the next `seed` does. The manifest is the
publishing point: before it, readers see the dataset as it was; after it, all of the new days. The next
`seed` finishes the job, enqueues every day once, and removes only staging folders old enough to be dead."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import zygote
from harness import HPARAMS, ROOT, Cluster

from workload.data import dataset as ds
from workload.data import publish
from workload.data.manifest import MANIFEST
from workload.data.source import LocalSource

pytestmark = pytest.mark.timeout(300)

HELD_BACK = ("training/2018-04-05.parquet", "training/2018-04-06.parquet")  # appended by the second seed


def user_folder(dataset_src: Path, folder: Path, keep) -> Path:
    """The days of the tiny dataset that `keep` selects, as a user's folder (no manifest)."""
    for path in sorted(dataset_src.glob("*/*.parquet")):
        rel = str(path.relative_to(dataset_src))
        if keep(rel):
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, folder / rel)
    return folder


def seed(cluster: Cluster, folder: Path, fault: str = "") -> subprocess.CompletedProcess[str]:
    runs = cluster.share.parent / "runs.json"
    runs.write_text(json.dumps({"main": HPARAMS}))
    env = cluster.env(**({"WORKLOAD_FAULT": fault} if fault else {}))
    return zygote.run(["workload", "seed", "--runs-file", str(runs), "--datasets", str(folder)], env, ROOT, 120)


def staging(cluster: Cluster) -> list[Path]:
    return sorted((cluster.share / "datasets").glob(".fraud.staging-*"))


def published(root: Path) -> list[str]:
    """What a reader of the share sees: the days the manifest names (none if it names nothing yet)."""
    if not (root / MANIFEST).exists():
        return []
    return sorted(e["path"] for e in ds.Dataset(root).files)


def check_recovery(cluster: Cluster, folder: Path, days: list[str]) -> None:
    """The next seed publishes every day once, enqueues each training day once, and leaves the dataset whole."""
    out = seed(cluster, folder)
    assert out.returncode == 0, out.stderr
    root = cluster.share / "datasets" / "fraud"
    assert published(root) == days
    for rel in days:
        assert (root / rel).read_bytes() == (folder / rel).read_bytes(), rel
    ds.Dataset(root).examples([d for d in days if d.startswith("training/")])  # every day reads
    c = cluster.queue().counts()
    assert c.total == sum(d.startswith("training/") for d in days) and c.pending == c.total


# Points of a first publish: staged (copied and validated), mid-write (the staging manifest half written),
# published (renamed into place, staging not cleaned: nothing left to clean, the folder is the dataset).
@pytest.mark.parametrize("point", ["staged", "mid-write:1", "published"])
def test_a_seed_killed_while_publishing_a_new_dataset(cluster: Cluster, dataset_src: Path, tmp_path: Path,
                                                      point: str) -> None:
    folder = user_folder(dataset_src, tmp_path / "export", lambda rel: True)
    days = sorted(str(p.relative_to(folder)) for p in folder.glob("*/*.parquet"))
    out = seed(cluster, folder, fault=point)
    assert out.returncode == -9, out.stderr
    root = cluster.share / "datasets" / "fraud"
    if point == "published":
        assert published(root) == days and not staging(cluster)
    else:
        assert not root.exists(), "nothing of a dataset is visible before its manifest is"
        assert len(staging(cluster)) == 1
    assert cluster.queue().counts().total == 0, "nothing is enqueued before the dataset is published"
    check_recovery(cluster, folder, days)


# Points of an append of two days: staged, the first day moved in, the second moved in, the manifest half
# written, the manifest replaced.
@pytest.mark.parametrize("point", ["staged", "day-moved:1", "day-moved:2", "mid-write:1", "published"])
def test_a_seed_killed_while_appending_days(cluster: Cluster, dataset_src: Path, tmp_path: Path, point: str) -> None:
    folder = user_folder(dataset_src, tmp_path / "export", lambda rel: rel not in HELD_BACK)
    assert seed(cluster, folder).returncode == 0
    root = cluster.share / "datasets" / "fraud"
    before, manifest = published(root), (root / MANIFEST).read_bytes()
    reader = ds.Dataset(root)  # a worker that opened the dataset before the append
    user_folder(dataset_src, folder, lambda rel: rel in HELD_BACK)
    days = sorted([*before, *HELD_BACK])
    out = seed(cluster, folder, fault=point)
    assert out.returncode == -9, out.stderr
    if point == "published":
        assert published(root) == days
    else:
        assert published(root) == before and (root / MANIFEST).read_bytes() == manifest
        moved = {"staged": 0, "day-moved:1": 1, "day-moved:2": 2, "mid-write:1": 2}[point]
        assert sum((root / rel).exists() for rel in HELD_BACK) == moved  # on the share, named by nothing
    assert len(staging(cluster)) == 1, "the killed seeder's staging folder is left for the next to judge"
    assert sorted(f["path"] for f in reader.files) == before
    reader.examples([d for d in before if d.startswith("training/")])  # the old days still read as before
    check_recovery(cluster, folder, days)
    assert not staging(cluster), "the next seed, holding the dataset's lock, removes the killed one's staging folder"


def test_the_next_seed_removes_its_datasets_staging_folders_and_no_other_datasets(cluster: Cluster, dataset_src: Path,
                                                                                  tmp_path: Path) -> None:
    folder = user_folder(dataset_src, tmp_path / "export", lambda rel: rel not in HELD_BACK)
    assert seed(cluster, folder).returncode == 0
    datasets = cluster.share / "datasets"
    dead = datasets / ".fraud.staging-0123456789ab"
    live = datasets / ".fraud.staging-ba9876543210"
    other = datasets / ".fraud2.staging-0123456789ab"  # another dataset's, however old
    for path in (dead, live, other):
        (path / "training").mkdir(parents=True)
        (path / "training" / "2018-04-05.parquet").write_bytes(b"half a copy")
    day_old = time.time() - 86400 - 60
    for path in (dead, other):
        os.utime(path, (day_old, day_old))
    user_folder(dataset_src, folder, lambda rel: rel in HELD_BACK)
    assert seed(cluster, folder).returncode == 0
    # Only the holder of the dataset's publishing lock stages: under it, every staging folder of the
    # dataset is a killed loader's, however fresh; another dataset's is not this lock's to judge.
    assert not dead.exists() and not live.exists()
    assert other.exists()


# -- in-process: what the next publish does with the leftovers (mutmut picks tests by what they call here) --
def test_a_publish_removes_its_datasets_staging_folders_and_says_so(tmp_path: Path, dataset_src: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """The twin of the `seed` test above, in this process: every staging folder of the dataset goes (only
    the lock's holder stages), another dataset's stays, and the user is told what was removed."""
    datasets = tmp_path / "datasets"
    dead = datasets / ".fraud.staging-0123456789ab"
    other = datasets / ".fraud2.staging-0123456789ab"
    for path in (dead, other):
        (path / "training").mkdir(parents=True)
        (path / "training" / "2018-04-05.parquet").write_bytes(b"half a copy")
    folder = user_folder(dataset_src, tmp_path / "export", lambda rel: True)
    with caplog.at_level(logging.WARNING, logger="workload.data.publish"):
        publish.publish(datasets / "fraud", LocalSource(folder))
    assert not dead.exists() and other.exists()
    assert f"dataset fraud: removing {dead}, left by a loader that was stopped mid-copy" in caplog.messages
    assert sorted(p.name for p in datasets.iterdir()) == [".fraud.lock", ".fraud2.staging-0123456789ab", "fraud"]


def test_a_leftover_the_publisher_cannot_remove_does_not_stop_the_publish(tmp_path: Path, dataset_src: Path) -> None:
    """Removing a killed loader's leftovers is best effort: one that cannot be removed (here a file where a
    staging folder would be) stays for a later seed, and the dataset is published all the same."""
    datasets = tmp_path / "datasets"
    datasets.mkdir()
    stuck = datasets / ".fraud.staging-0123456789ab"
    stuck.write_bytes(b"not a folder")
    folder = user_folder(dataset_src, tmp_path / "export", lambda rel: True)
    out = publish.publish(datasets / "fraud", LocalSource(folder))
    assert len(out.copied) == 8 and published(datasets / "fraud") == sorted(out.copied)
    assert stuck.read_bytes() == b"not a folder"
