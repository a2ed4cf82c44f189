"""A file's identity is its content, not its size: a change that keeps the size (a day rewritten in place, a
copy corrupted in transit, a byte flipped on a disk) is noticed at every place identity is recorded or
compared: the feature store's record of a day's inputs, the sync's "already on the share" decision, and the
re-verification of each copy."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from workload.data import dataset as ds
from workload.data import featurestore, publish, simulator
from workload.data.dayfile import DatasetError
from workload.data.manifest import MANIFEST
from workload.data.source import LocalSource, SourceError

SPEC = simulator.SimulationSpec(customers=200, terminals=80, train_days=6, test_days=1, start_date="2018-04-01",
                                seed=11)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("src") / "fraud"
    simulator.generate(root, SPEC)
    for sidecar in root.glob("*.json"):  # a user's folder holds the days only
        sidecar.unlink()
    return root


@pytest.fixture
def folder(source: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "export"
    shutil.copytree(source, copy)
    return copy


def flip_a_byte(path: Path) -> None:
    """Damage `path` in place without changing its size."""
    st = path.stat()
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))
    assert path.stat().st_size == st.st_size


def test_a_source_day_changed_in_place_at_the_same_size_is_refused_by_name(folder: Path, tmp_path: Path) -> None:
    """The sync's "already have it" decision: same size, other bytes is a changed day (days are immutable),
    never "unchanged, skip"."""
    root = tmp_path / "share" / "fraud"
    root.parent.mkdir()
    publish.publish(root, LocalSource(folder))
    day = "training/2018-04-03.parquet"
    before, manifest = (root / day).read_bytes(), (root / MANIFEST).read_bytes()
    flip_a_byte(folder / day)
    with pytest.raises(DatasetError, match=r"^training/2018-04-03\.parquet \(.*2018-04-03\.parquet\) changed "
                                              r"since it was published"):
        publish.publish(root, LocalSource(folder))
    assert (root / day).read_bytes() == before
    assert (root / MANIFEST).read_bytes() == manifest


def test_the_same_bytes_again_are_already_on_the_share(folder: Path, tmp_path: Path) -> None:
    """The other side of the decision: identical bytes, even rewritten (a new modification time), copy nothing."""
    root = tmp_path / "share" / "fraud"
    root.parent.mkdir()
    publish.publish(root, LocalSource(folder))
    day = folder / "training" / "2018-04-03.parquet"
    day.write_bytes(day.read_bytes())
    again = publish.publish(root, LocalSource(folder))
    assert again.copied == [] and again.unchanged == SPEC.train_days + SPEC.test_days + len(
        list((folder / "history").glob("*")))


def test_a_copy_that_differs_from_the_listing_at_the_same_size_is_refused(folder: Path, tmp_path: Path) -> None:
    """The re-verification of a copy: the file changed (same size) between the listing and the copy, as an
    object replaced mid-sync or bytes corrupted in transit; the copy must not be published under the listed
    identity."""
    src = LocalSource(folder)
    listed = {f.rel: f for f in src.files()}
    day = "testing/2018-04-07.parquet"
    flip_a_byte(folder / day)
    with pytest.raises(SourceError, match=r"2018-04-07\.parquet: changed while it was being copied"):
        src.fetch(listed[day], tmp_path / "copy" / day)
    src.fetch(src.files()[0], tmp_path / "copy" / "ok.parquet")  # an unchanged file copies


def test_a_window_input_rewritten_in_place_at_the_same_size_makes_stored_features_stale(
        folder: Path, tmp_path: Path) -> None:
    """The feature store's record of a day's inputs: a day earlier in the window rewritten at the same size
    (even with the same bytes) makes every stored day whose window reads it stale, and only those."""
    root = tmp_path / "share" / "fraud"
    root.parent.mkdir()
    publish.publish(root, LocalSource(folder))
    data = ds.Dataset(root)
    data.ensure_features()
    days = data.training_shards()
    stored = {rel: data.stored_features(rel) for rel in days}
    target = root / days[1]
    st = target.stat()
    target.write_bytes(target.read_bytes())  # rewritten in place: the same size, a new modification time
    assert target.stat().st_size == st.st_size and target.stat().st_mtime_ns != st.st_mtime_ns
    fresh = ds.Dataset(root)
    with pytest.raises(featurestore.StaleFeatures, match="other dataset files than the share now holds"):
        fresh.stored_features(days[1])
    np.testing.assert_array_equal(fresh.stored_features(days[0])["x"], stored[days[0]]["x"])  # before it: kept
    for rel in days[2:]:
        if days[1] in [i["path"] for i in fresh.feature_inputs(rel)]:
            with pytest.raises(featurestore.StaleFeatures):
                fresh.stored_features(rel)
    assert fresh.ensure_features()[0] >= 2


def test_a_window_input_damaged_in_place_is_never_served_from_the_store(folder: Path, tmp_path: Path) -> None:
    """A byte flipped in a published day, same size: its stored features are not used; reading it again
    refuses the damaged file by name (or, if the damage still parses, gives the day's features afresh)."""
    root = tmp_path / "share" / "fraud"
    root.parent.mkdir()
    publish.publish(root, LocalSource(folder))
    data = ds.Dataset(root)
    data.ensure_features()
    rel = data.training_shards()[3]
    flip_a_byte(root / rel)
    with pytest.raises(featurestore.StaleFeatures, match="other dataset files than the share now holds"):
        ds.Dataset(root).stored_features(rel)
