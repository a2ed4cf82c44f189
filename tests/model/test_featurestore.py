"""The feature store: each day's features computed once, on the share, and never trusted blindly."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import shutil
from pathlib import Path

import google_crc32c
import numpy as np
import pytest

from workload.data import dataset as ds
from workload.data import features, featurestore, simulator
from workload.data.dayfile import DatasetError
from workload.data.manifest import MANIFEST, write_manifest

SPEC = simulator.SimulationSpec(customers=300, terminals=120, train_days=10, test_days=2, start_date="2018-04-01",
                                seed=5)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("src") / "fraud"
    simulator.generate(root, SPEC)
    write_manifest(root)
    return root


@pytest.fixture
def root(source: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "fraud"
    shutil.copytree(source, copy)
    return copy


def _fresh(root: Path) -> ds.Dataset:
    return ds.Dataset(root)


def _forbid_computing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: ds.Dataset, rel: str) -> None:
        raise AssertionError(f"features of {rel} were computed again")

    monkeypatch.setattr(ds.Dataset, "compute_features", refuse)


def test_seeded_features_are_stored_once_and_loaded_as_computed(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = _fresh(root)
    assert data.ensure_features() == (SPEC.train_days + SPEC.test_days, 0)
    days = data.training_shards()
    direct = {rel: data.compute_features(rel) for rel in days}
    for rel in days:
        arrays, entry = featurestore.paths(root, rel)
        assert arrays.is_file() and entry.is_file()
        assert arrays.parent == root / "features" / features.FEATURE_VERSION / "training"
    assert _fresh(root).ensure_features() == (0, SPEC.train_days + SPEC.test_days)

    _forbid_computing(monkeypatch)  # from here on, every worker only loads
    loaded = _fresh(root)
    for rel in days:
        ex = loaded.examples([rel])
        np.testing.assert_array_equal(ex.x, direct[rel]["x"])
        for key in ("y", "day", "card", "known"):
            np.testing.assert_array_equal(getattr(ex, key), direct[rel][key])
        assert ex.x.dtype == np.float32 and ex.day.dtype == np.dtype("datetime64[D]")
    test = loaded.test_examples()
    assert len(test.y) == sum(f["rows"] for f in loaded.files if f["role"] == "testing")


def test_a_worker_computes_and_stores_missing_days(root: Path) -> None:
    data = _fresh(root)
    rel = data.training_shards()[4]
    ex = data.examples([rel])
    assert featurestore.paths(root, rel)[0].is_file()
    np.testing.assert_array_equal(_fresh(root).stored_features(rel)["x"], ex.x)


@pytest.mark.parametrize("damage", ["flip a byte", "truncate", "wrong checksum", "wrong sha256 of an older entry",
                                    "garbage entry"])
def test_a_damaged_stored_day_is_recomputed_never_trusted(root: Path, damage: str,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    data = _fresh(root)
    rel = data.training_shards()[6]
    good = data.examples([rel]).x
    arrays, entry = featurestore.paths(root, rel)
    raw = bytearray(arrays.read_bytes())
    if damage == "flip a byte":
        raw[len(raw) // 2] ^= 0xFF
        arrays.write_bytes(bytes(raw))
    elif damage == "truncate":
        arrays.write_bytes(bytes(raw[: len(raw) // 3]))
    elif damage == "wrong checksum":
        meta = json.loads(entry.read_text())
        entry.write_text(json.dumps({**meta, "crc32c": "00000000"}))
    elif damage == "wrong sha256 of an older entry":  # written before the store took CRC32C
        meta = {k: v for k, v in json.loads(entry.read_text()).items() if k != "crc32c"}
        entry.write_text(json.dumps({**meta, "sha256": "0" * 64}))
    else:
        entry.write_text("{not json")
    said = (rf"^{arrays}: checksum mismatch with {entry.name} \(damaged or replaced\)$" if damage != "garbage entry"
            else rf"^{entry}: unreadable \(")
    with pytest.raises(featurestore.StaleFeatures, match=said):
        _fresh(root).stored_features(rel)
    with caplog.at_level(logging.WARNING, logger="workload.data.dataset"):
        again = _fresh(root).examples([rel]).x
    np.testing.assert_array_equal(again, good)
    assert f"recomputing the features of {rel}" in caplog.text
    np.testing.assert_array_equal(_fresh(root).stored_features(rel)["x"], good)  # repaired on the share


@pytest.mark.parametrize("tamper", ["a list", "another version", "more rows"])
def test_a_tampered_entry_is_refused_in_one_line_naming_the_file_and_what_it_says(root: Path, tamper: str) -> None:
    """The warning that makes a worker recompute a day says which file and why: an entry that is not an
    object, one of another feature version, one whose row count is not the stored day's."""
    data = _fresh(root)
    rel = data.training_shards()[2]
    rows = len(data.examples([rel]).y)
    arrays, entry = featurestore.paths(root, rel)
    meta = json.loads(entry.read_text())
    if tamper == "a list":
        entry.write_text(json.dumps([meta]))
        said = rf"^{re.escape(str(entry))}: not a feature manifest entry$"
    elif tamper == "another version":
        entry.write_text(json.dumps({**meta, "version": "0-old"}))
        said = (rf"^{re.escape(str(entry))}: features of version '0-old', this code computes "
                rf"{re.escape(repr(features.FEATURE_VERSION))}$")
    else:
        entry.write_text(json.dumps({**meta, "rows": rows + 1}))
        said = rf"^{re.escape(str(arrays))}: {rows} rows, its entry says {rows + 1}$"
    with pytest.raises(featurestore.StaleFeatures, match=said):
        _fresh(root).stored_features(rel)


def test_a_new_feature_version_never_reads_the_old_files(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = _fresh(root)
    rel = data.training_shards()[3]
    data.examples([rel])
    monkeypatch.setattr(features, "FEATURE_VERSION", "test-next")
    with pytest.raises(featurestore.StaleFeatures, match="missing"):
        _fresh(root).stored_features(rel)
    # An entry claiming another version is refused even where the new version's files should be.
    (old_arrays,) = (root / "features").glob(f"*/training/{Path(rel).stem}.npy")
    new_arrays, new_entry = featurestore.paths(root, rel)
    new_arrays.parent.mkdir(parents=True)
    shutil.copyfile(old_arrays, new_arrays)
    shutil.copyfile(old_arrays.with_suffix(".json"), new_entry)
    with pytest.raises(featurestore.StaleFeatures, match="version"):
        _fresh(root).stored_features(rel)


def test_a_changed_history_day_makes_later_days_stale(root: Path) -> None:
    data = _fresh(root)
    assert data.ensure_features()[0] == SPEC.train_days + SPEC.test_days
    manifest = json.loads((root / MANIFEST).read_text())
    manifest["files"][2]["frauds"] += 1  # as if day 3's file had been replaced by one with another label
    (root / MANIFEST).write_text(json.dumps(manifest))
    computed, kept = _fresh(root).ensure_features()
    assert computed > 0 and kept >= 2  # days before it are untouched, days whose window reads it are redone


def test_days_appended_later_get_features_when_seeded(source: Path, tmp_path: Path) -> None:
    root = tmp_path / "fraud"
    shutil.copytree(source, root)
    last = sorted((root / "training").iterdir())[-1]
    held = tmp_path / last.name
    shutil.move(last, held)
    write_manifest(root)
    assert _fresh(root).ensure_features() == (SPEC.train_days + SPEC.test_days - 1, 0)
    shutil.move(held, last)
    write_manifest(root)
    computed, kept = _fresh(root).ensure_features()
    # The appended day, and the test days whose windows now read it.
    assert computed == 1 + SPEC.test_days and kept == SPEC.train_days - 1


def test_a_stored_file_holding_pickled_objects_is_refused_unread(root: Path) -> None:
    """Even with a checksum that matches (someone with write access to the share replaced both), an
    object array is refused by its header: nothing stored is ever unpickled."""
    data = _fresh(root)
    rel = data.training_shards()[2]
    data.examples([rel])
    arrays, entry = featurestore.paths(root, rel)
    with open(arrays, "wb") as f:
        np.save(f, np.array([{"boom": 1}], dtype=object), allow_pickle=True)
    raw = arrays.read_bytes()
    meta = json.loads(entry.read_text())
    entry.write_text(json.dumps({**meta, "bytes": len(raw), "crc32c": _crc32c(raw)}))
    with pytest.raises(featurestore.StaleFeatures, match="dtype object, expected <f4"):
        _fresh(root).stored_features(rel)


def test_a_day_file_replaced_after_seeding_is_read_again_not_served_from_the_store(root: Path) -> None:
    """Features are bound to the bytes they came from: a day damaged after seeding fails as it would
    without the store (its item is dead-lettered), instead of training on what it used to hold."""
    data = _fresh(root)
    data.ensure_features()
    rel = data.training_shards()[5]
    (root / rel).write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(featurestore.StaleFeatures, match="other dataset files than the share now holds"):
        _fresh(root).stored_features(rel)
    with pytest.raises((OSError, DatasetError), match="2018-04-06.parquet"):
        _fresh(root).examples([rel])


def _arrays(n: int = 3, width: int = len(features.FEATURE_NAMES)) -> dict[str, np.ndarray]:
    return {"x": np.arange(n * width, dtype="<f4").reshape(n, width), "y": np.zeros(n, "<f4"),
            "day": np.full(n, np.datetime64("2018-04-01", "D")), "card": np.arange(n, dtype="<i8"),
            "known": np.ones(n, bool), "ids": np.arange(n, dtype="<i8") + 100}


def test_a_stored_days_layout_is_checked_array_by_array() -> None:
    """The record the store reads back in place: every array in its dtype and C order, none cut short, x one column
    per feature, nothing after the last; each refusal names the array and what it saw."""
    data = featurestore._to_bytes(_arrays())
    back = featurestore._from_bytes(bytearray(data))
    assert all(np.array_equal(back[k], v) for k, v in _arrays().items())
    with pytest.raises(ValueError, match=r"^array ids: truncated$"):
        featurestore._from_bytes(bytearray(data[:-1]))
    with pytest.raises(ValueError, match=r"^unexpected layout: x \(3, \d+\), 1 trailing bytes$"):
        featurestore._from_bytes(bytearray(data + b"\0"))
    with pytest.raises(ValueError, match=rf"^unexpected layout: x \(3, {len(features.FEATURE_NAMES) + 1}\), 0 "):
        featurestore._from_bytes(bytearray(featurestore._to_bytes(_arrays(width=len(features.FEATURE_NAMES) + 1))))
    fortran = _arrays()
    buf = io.BytesIO()
    for name, dtype in featurestore._ARRAYS:
        np.lib.format.write_array(buf, np.asfortranarray(fortran[name], dtype=dtype), allow_pickle=False)
    with pytest.raises(ValueError, match=r"^array x: dtype float32 \(Fortran order\), expected <f4$"):
        featurestore._from_bytes(bytearray(buf.getvalue()))


REL = "training/2018-04-01.parquet"
INPUTS = [{"path": REL, "rows": 3, "frauds": 0, "first_day": "2018-04-01", "last_day": "2018-04-01"}]


def test_an_entry_names_its_day_file_rows_and_checksum_one_key_a_line(tmp_path: Path) -> None:
    """The entry beside a stored day, as a person inspecting the share reads it: which day file it is for, the
    feature version and names, its rows, the array file's size and checksum, the inputs, one key per line."""
    featurestore.store(tmp_path, REL, _arrays(), INPUTS)
    arrays, entry = featurestore.paths(tmp_path, REL)
    raw = arrays.read_bytes()
    assert entry.read_text() == json.dumps(
        {"version": features.FEATURE_VERSION, "layout": featurestore.LAYOUT, "names": list(features.FEATURE_NAMES),
         "day_file": REL, "rows": 3, "bytes": len(raw), "crc32c": _crc32c(raw), "inputs": INPUTS}, indent=1) + "\n"


def _crc32c(raw: bytes) -> str:
    """The entry's checksum, as Cloud Storage's own tool computes it (hex of the CRC32C)."""
    return f"{google_crc32c.value(raw):08x}"


def test_the_checksum_is_google_crc32cs_c_extension_here_and_in_the_image() -> None:
    """The venv's and the training image's google-crc32c wheel (workload/requirements.lock) has its C extension:
    a 1M-row day checks in ~0.01 s (sha256 took 0.13 s of an H200 worker's day)."""
    assert google_crc32c.implementation == "c" and featurestore.FAST_CRC


def test_an_entry_from_before_crc32c_is_checked_with_its_sha256_and_used(tmp_path: Path) -> None:
    """A share seeded before the store took CRC32C: its days are checked with the sha256 their entries record and
    used as they are, not recomputed; a damaged one is still refused."""
    featurestore.store(tmp_path, REL, _arrays(), INPUTS)
    arrays, entry = featurestore.paths(tmp_path, REL)
    raw = arrays.read_bytes()
    old = {k: v for k, v in json.loads(entry.read_text()).items() if k != "crc32c"}
    entry.write_text(json.dumps({**old, "sha256": hashlib.sha256(raw).hexdigest()}))
    np.testing.assert_array_equal(featurestore.load(tmp_path, REL, INPUTS)["x"], _arrays()["x"])
    arrays.write_bytes(raw[:-1] + bytes([raw[-1] ^ 1]))
    with pytest.raises(featurestore.StaleFeatures, match="checksum mismatch"):
        featurestore.load(tmp_path, REL, INPUTS)


def test_without_the_c_extension_the_store_writes_and_checks_sha256(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """google-crc32c's pure-Python fallback would take tens of seconds over a 1M-row day: a process without the C
    extension writes sha256 and checks it; an entry holding only a CRC32C is refused as one it cannot check (the
    dataset recomputes that day), saying why."""
    featurestore.store(tmp_path, "training/a.parquet", _arrays(), INPUTS)  # CRC32C, as the pods write
    monkeypatch.setattr(featurestore, "FAST_CRC", False)
    featurestore.store(tmp_path, REL, _arrays(), INPUTS)
    arrays, entry = featurestore.paths(tmp_path, REL)
    meta = json.loads(entry.read_text())
    assert "crc32c" not in meta and meta["sha256"] == hashlib.sha256(arrays.read_bytes()).hexdigest()
    np.testing.assert_array_equal(featurestore.load(tmp_path, REL, INPUTS)["x"], _arrays()["x"])
    _, crc_entry = featurestore.paths(tmp_path, "training/a.parquet")
    with pytest.raises(featurestore.StaleFeatures, match=rf"^{re.escape(str(crc_entry))}: its CRC32C needs "
                                                         r"google-crc32c's C extension, which this Python lacks$"):
        featurestore.load(tmp_path, "training/a.parquet", INPUTS)


def test_a_day_is_stored_in_the_stores_dtypes_whatever_it_was_computed_in(tmp_path: Path) -> None:
    """Features computed in float64, labels as integers, days in nanoseconds, narrower ints: stored as the store's
    dtypes (float32, datetime64[D], int64, bool), so that loading them is not refused as a damaged file."""
    given = {"x": _arrays()["x"].astype(np.float64), "y": np.array([0, 1, 0]),
             "day": np.array(["2018-04-01T10:00", "2018-04-01T23:59", "2018-04-01T00:00"], dtype="datetime64[ns]"),
             "card": np.array([7, 8, 9], dtype=np.int32), "known": np.array([1, 0, 1], dtype=np.uint8),
             "ids": np.array([100, 101, 102], dtype=np.int32)}
    featurestore.store(tmp_path, REL, given, INPUTS)
    back = featurestore.load(tmp_path, REL, INPUTS)
    assert {k: v.dtype.str for k, v in back.items()} == dict(featurestore._ARRAYS)
    np.testing.assert_array_equal(back["x"], _arrays()["x"])
    assert back["y"].tolist() == [0.0, 1.0, 0.0] and back["known"].tolist() == [True, False, True]
    assert back["day"].tolist() == [np.datetime64("2018-04-01", "D").item()] * 3
    assert back["card"].tolist() == [7, 8, 9] and back["ids"].tolist() == [100, 101, 102]


def test_a_stored_day_whose_arrays_disagree_in_length_is_refused_naming_each_length(tmp_path: Path) -> None:
    """Whole, with a matching checksum (written so), but one label short: refused by its layout, naming every
    array's length and what they must be, never read as a day of three rows."""
    short = {**_arrays(), "y": np.zeros(2, "<f4")}
    featurestore.store(tmp_path, REL, short, INPUTS)
    arrays, _ = featurestore.paths(tmp_path, REL)
    with pytest.raises(featurestore.StaleFeatures, match=rf"^{re.escape(str(arrays))}: unreadable \(arrays of "
                       r"different lengths \(x 3, y 2, day 3, card 3, known 3, ids 3\): each must have x's 3 rows\)$"):
        featurestore.load(tmp_path, REL, INPUTS)


def test_a_day_file_that_holds_less_than_its_size_when_read_is_refused_naming_it(tmp_path: Path) -> None:
    """A file rewritten under the reader (another pod on the share) can hold fewer bytes than its size said a moment
    before. A sysfs file does so every time (size 4096, a few bytes of text): stored in the day file's place, it is
    refused as changed while read, naming the file, instead of being viewed with a zero-filled tail."""
    shrinking = Path("/sys/devices/system/cpu/online")
    assert shrinking.stat().st_size > len(shrinking.read_bytes()), "the stand-in must read shorter than its size"
    featurestore.store(tmp_path, REL, _arrays(), INPUTS)
    arrays, entry = featurestore.paths(tmp_path, REL)
    arrays.unlink()
    arrays.symlink_to(shrinking)
    said = rf"^{re.escape(str(entry))}: unreadable \({re.escape(str(arrays))}: changed while read\)$"
    with pytest.raises(featurestore.StaleFeatures, match=said):
        featurestore.load(tmp_path, REL, INPUTS)


def test_a_stored_day_larger_than_a_read_chunk_loads_whole_writable_and_checked(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The file is read chunk by chunk into one array (the CRC32C taken of each chunk): a day spanning several chunks,
    the last one partial, comes back equal and writable (the trainer normalises in place), and a byte flipped in any
    chunk is caught."""
    monkeypatch.setattr(featurestore, "CHUNK", 4096)
    stored = _arrays(n=1000)
    featurestore.store(tmp_path, REL, stored, INPUTS)
    arrays, _ = featurestore.paths(tmp_path, REL)
    assert arrays.stat().st_size > 3 * featurestore.CHUNK and arrays.stat().st_size % featurestore.CHUNK
    back = featurestore.load(tmp_path, REL, INPUTS)
    for name, _dtype in featurestore._ARRAYS:
        np.testing.assert_array_equal(back[name], stored[name])
        assert back[name].flags.writeable, name
    raw = bytearray(arrays.read_bytes())
    raw[2 * featurestore.CHUNK + 7] ^= 1
    arrays.write_bytes(bytes(raw))
    with pytest.raises(featurestore.StaleFeatures, match="checksum mismatch"):
        featurestore.load(tmp_path, REL, INPUTS)


def test_without_anonymous_mappings_a_day_is_read_into_a_bytearray_alike(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Where mmap takes no flags (Windows), the day is read into a bytearray as before: equal, writable, checked."""
    stored = _arrays(n=50)
    featurestore.store(tmp_path, REL, stored, INPUTS)
    assert isinstance(featurestore._buffer(8).base.obj, featurestore.mmap.mmap)  # .base: a memoryview of it
    monkeypatch.delattr(featurestore.mmap, "MAP_ANONYMOUS")
    assert isinstance(featurestore._buffer(8).base.obj, bytearray)
    back = featurestore.load(tmp_path, REL, INPUTS)
    for name, _dtype in featurestore._ARRAYS:
        np.testing.assert_array_equal(back[name], stored[name])
        assert back[name].flags.writeable, name


def test_a_day_file_that_holds_more_than_its_size_when_read_is_refused_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file appended to between its size's reading and its end's (a writer on the share) is refused as changed
    while read, naming the file, rather than read short: as if its size were read 16 bytes before the append."""
    featurestore.store(tmp_path, REL, _arrays(), INPUTS)
    arrays, entry = featurestore.paths(tmp_path, REL)
    real = os.fstat

    def earlier(fd: int) -> object:
        st = real(fd)
        return type("Stat", (), {"st_size": st.st_size - 16})()

    monkeypatch.setattr(featurestore.os, "fstat", earlier)
    said = rf"^{re.escape(str(entry))}: unreadable \({re.escape(str(arrays))}: changed while read\)$"
    with pytest.raises(featurestore.StaleFeatures, match=said):
        featurestore.load(tmp_path, REL, INPUTS)


def test_an_emptied_day_file_is_refused_as_damaged_naming_it(tmp_path: Path) -> None:
    """A day file cut to nothing (a full disk, a copy stopped at its start) reads as no bytes, whose size and checksum
    are not its entry's: refused as damaged, like any other damage, naming the file and its entry."""
    featurestore.store(tmp_path, REL, _arrays(), INPUTS)
    arrays, entry = featurestore.paths(tmp_path, REL)
    arrays.write_bytes(b"")
    said = rf"^{re.escape(str(arrays))}: checksum mismatch with {re.escape(entry.name)} \(damaged or replaced\)$"
    with pytest.raises(featurestore.StaleFeatures, match=said):
        featurestore.load(tmp_path, REL, INPUTS)
