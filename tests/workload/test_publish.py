"""Publishing datasets from a folder: real exports as they are, the rules a dataset keeps over time,
and one-line errors that name the user's own file."""

from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import google_crc32c
import numpy as np
import pandas as pd
import pytest
import zygote
from exports import BAD_FILES, DAY3, copy_files, one_error_line, plant, real_export, shuffled
from harness import HPARAMS, ROOT, Cluster, is_stopped, same_weights

from workload.data import dataset as ds
from workload.data import features, publish, schema
from workload.data.dayfile import DatasetError, read_transactions
from workload.data.manifest import MANIFEST, write_manifest
from workload.data.reading import Reading
from workload.data.source import LocalSource

pytestmark = pytest.mark.timeout(300)


def publish_from(folder: Path, root: Path) -> publish.Outcome:
    return publish.publish(root, LocalSource(folder))


def same_examples(a: ds.Examples, b: ds.Examples) -> None:
    np.testing.assert_array_equal(a.x, b.x)
    np.testing.assert_array_equal(a.y, b.y)
    np.testing.assert_array_equal(a.day, b.day)


# -- real exports -----------------------------------------------------------------------------------
def test_real_exports_read_exactly_as_the_canonical_files(tmp_path: Path, dataset_src: Path) -> None:
    """Shuffled rows, Z / +02:00 / UTC / zone-typed timestamps, floats and text for integers: each
    day reads to the same frame, value for value, as the simulator's own file."""
    export = real_export(dataset_src, tmp_path / "export")
    assert {p.suffix for p in export.glob("*/*")} == {".csv", ".parquet"}
    for original in sorted(dataset_src.glob("*/*.parquet")):
        shaped = next((export / original.parent.name).glob(f"{original.stem}.*"))
        pd.testing.assert_frame_equal(read_transactions(shaped), read_transactions(original), check_exact=True)


def test_ties_in_time_are_ordered_by_transaction_id_whatever_the_file_order(tmp_path: Path, dataset_src: Path) -> None:
    """Real days are sorted by the second at best; within a second IDs come in any order. Features
    must not depend on that order."""
    ordered, scrambled = tmp_path / "ordered", tmp_path / "scrambled"
    for i, path in enumerate(sorted(dataset_src.glob("*/*.parquet"))):
        frame = pd.read_parquet(path)
        frame[schema.TX_DATETIME] = frame[schema.TX_DATETIME].dt.floor("h")  # hundreds of ties a day
        for root, rows in ((ordered, frame), (scrambled, shuffled(frame, seed=i))):
            (root / path.parent.name).mkdir(parents=True, exist_ok=True)
            rows.to_parquet(root / path.parent.name / path.name, index=False)
    assert pd.read_parquet(scrambled / DAY3)[schema.TX_DATETIME].duplicated().sum() > 100
    a, b = publish_from(ordered, tmp_path / "share" / "a"), publish_from(scrambled, tmp_path / "share" / "b")
    data_a, data_b = ds.Dataset(a.root), ds.Dataset(b.root)
    frame = data_b._read(DAY3)
    keys = list(zip(frame[schema.TX_DATETIME], frame[schema.TRANSACTION_ID], strict=True))
    assert keys == sorted(keys), "rows are ordered by time, ties by transaction ID"
    for shard in data_a.training_shards():
        same_examples(data_a.examples([shard]), data_b.examples([shard]))
    same_examples(data_a.test_examples(), data_b.test_examples())


def test_a_real_export_trains_to_the_reference_weights(cluster: Cluster, tmp_path: Path,
                                                        reference_state: dict) -> None:
    export = real_export(cluster.dataset_src, tmp_path / "export")
    runs = tmp_path / "runs.json"
    runs.write_text(json.dumps({"main": HPARAMS}))
    out = seed(cluster, "--datasets", str(export), "--runs-file", str(runs))
    assert out.returncode == 0, out.stderr
    cluster.start_worker("w")
    assert cluster.wait_all() == [0], cluster.log("w")
    assert same_weights(cluster.final_state(), reference_state), "a real export trains as the canonical files"


# -- the rules of a dataset over time -------------------------------------------------------------
def test_new_days_are_appended_and_nothing_is_copied_twice(tmp_path: Path, dataset_src: Path) -> None:
    folder = copy_files(dataset_src, tmp_path / "export", keep=lambda rel: rel != "training/2018-04-06.parquet")
    root = tmp_path / "datasets" / "d"
    first = publish_from(folder, root)
    assert (len(first.copied), first.unchanged) == (7, 0)
    manifest = (root / MANIFEST).read_bytes()
    again = publish_from(folder, root)
    assert (again.copied, again.unchanged) == ([], 7)
    assert (root / MANIFEST).read_bytes() == manifest, "an unchanged source rewrites nothing"

    running = ds.Dataset(root)  # a worker's view, opened before the day arrives
    copy_files(dataset_src, folder, keep=lambda rel: rel == "training/2018-04-06.parquet")
    grown = publish_from(folder, root)
    assert (grown.copied, grown.unchanged) == (["training/2018-04-06.parquet"], 7)
    assert ds.Dataset(root).training_shards()[-1] == "training/2018-04-06.parquet"
    same_examples(running.examples(["training/2018-04-06.parquet"]),
                  ds.Dataset(dataset_src).examples(["training/2018-04-06.parquet"]))
    recorded = json.loads((root / MANIFEST).read_text())
    assert recorded["source"] == str(folder.resolve())
    entry = next(e for e in recorded["files"] if e["path"] == "training/2018-04-06.parquet")
    assert entry["source"]["uri"] == str(folder / "training/2018-04-06.parquet")
    assert entry["source"]["size"] == (folder / "training/2018-04-06.parquet").stat().st_size


def test_a_changed_day_is_refused_by_name_and_nothing_is_published(tmp_path: Path, dataset_src: Path) -> None:
    folder = copy_files(dataset_src, tmp_path / "export", keep=lambda rel: rel != "training/2018-04-06.parquet")
    root = tmp_path / "datasets" / "d"
    publish_from(folder, root)
    manifest = (root / MANIFEST).read_bytes()
    frame = pd.read_parquet(folder / DAY3)
    frame.loc[0, schema.TX_AMOUNT] += 1
    frame.to_parquet(folder / DAY3, index=False)
    copy_files(dataset_src, folder, keep=lambda rel: rel == "training/2018-04-06.parquet")  # a new day, too
    with pytest.raises(DatasetError) as err:
        publish_from(folder, root)
    message = str(err.value)
    assert f"{DAY3} ({folder / DAY3}) changed since it was published" in message and "immutable" in message
    assert (root / MANIFEST).read_bytes() == manifest
    assert not (root / "training/2018-04-06.parquet").exists()


def test_another_source_for_a_published_dataset_is_refused(tmp_path: Path, dataset_src: Path) -> None:
    root = tmp_path / "datasets" / "d"
    one, two = copy_files(dataset_src, tmp_path / "one").resolve(), copy_files(dataset_src, tmp_path / "two").resolve()
    publish_from(one, root)
    with pytest.raises(DatasetError) as err:
        publish_from(two, root)
    assert str(err.value) == (f"dataset 'd' on the share was published from {one}; refusing to feed it from {two}: a "
                              "dataset has one source. Publish this one under a new dataset name (--dataset NAME)")


def renumbered(folder: Path) -> Path:
    """Each file numbering its transactions from 0: what per-day exports of a row counter give."""
    for path in folder.glob("*/*.parquet"):
        frame = pd.read_parquet(path)
        frame[schema.TRANSACTION_ID] = np.arange(len(frame))
        frame.to_parquet(path, index=False)
    return folder


def test_transaction_ids_must_be_unique_across_the_dataset(tmp_path: Path, dataset_src: Path) -> None:
    folder = renumbered(copy_files(dataset_src, tmp_path / "export"))
    root = tmp_path / "datasets" / "d"
    with pytest.raises(DatasetError, match=r"TRANSACTION_ID 0 is in both .*/export/\w+/2018-04-0\d\.parquet and "
                                              r".*/export/\w+/2018-04-0\d\.parquet; transaction IDs must be unique"):
        publish_from(folder, root)
    assert not root.exists() and list(root.parent.iterdir()) == [publish.lock_path(root)], \
        "nothing published, no staging left"


def test_a_new_day_reusing_published_ids_is_refused(tmp_path: Path, dataset_src: Path) -> None:
    folder = copy_files(dataset_src, tmp_path / "export", keep=lambda rel: rel != "training/2018-04-06.parquet")
    root = tmp_path / "datasets" / "d"
    publish_from(folder, root)
    day6 = pd.read_parquet(dataset_src / "training/2018-04-06.parquet")
    day6[schema.TRANSACTION_ID] -= day6[schema.TRANSACTION_ID].min()  # 0, 1, ... like the first day
    day6.to_parquet(folder / "training/2018-04-06.parquet", index=False)
    with pytest.raises(DatasetError, match=r"TRANSACTION_ID 0 is in both .*2018-04-0[16]\.parquet and"):
        publish_from(folder, root)
    assert "training/2018-04-06.parquet" not in ds.Dataset(root).training_shards()


def test_training_and_testing_days_must_not_overlap(tmp_path: Path, dataset_src: Path) -> None:
    folder = copy_files(dataset_src, tmp_path / "export")
    same_day = pd.read_parquet(folder / "training/2018-04-06.parquet")
    same_day[schema.TRANSACTION_ID] += 10**9  # other IDs: only the date gives it away
    same_day.to_parquet(folder / "testing/2018-04-06.parquet", index=False)
    with pytest.raises(DatasetError) as err:
        publish_from(folder, tmp_path / "datasets" / "d")
    message = str(err.value)
    assert f"{folder}/testing/2018-04-06.parquet (testing, 2018-04-06..2018-04-06)" in message
    assert f"{folder}/training/2018-04-06.parquet (training, 2018-04-06..2018-04-06)" in message
    assert "overlaps" in message and "a day is history, training, testing or scoring, never two of them" in message


def test_history_days_feed_features_but_are_never_trained_or_evaluated(tmp_path: Path, dataset_src: Path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    history = {"training/2018-04-01.parquet", "training/2018-04-02.parquet"}
    folder = copy_files(dataset_src, tmp_path / "export",
                        role_of=lambda rel: "history" if rel in history else rel.split("/")[0])
    with caplog.at_level(logging.WARNING):
        out = publish_from(folder, tmp_path / "datasets" / "d")
    data, full = ds.Dataset(out.root), ds.Dataset(dataset_src)
    assert data.training_shards() == ["training/2018-04-03.parquet", "training/2018-04-04.parquet",
                                      "training/2018-04-05.parquet", "training/2018-04-06.parquet"]
    assert sorted(e["path"] for e in data.files if e["role"] == "history") == sorted(
        f"history/{Path(r).name}" for r in history)
    same_examples(data.examples([DAY3]), full.examples([DAY3]))  # the history days fill the windows
    same_examples(data.test_examples(), full.test_examples())
    warnings = [r.getMessage() for r in caplog.records if "features look back" in r.getMessage()]
    assert warnings == [f"dataset d: features look back {features.LOOKBACK_DAYS} days (features.LOOKBACK_DAYS), "
                        "but the first training/test day 2018-04-03 has 2 day(s) of history before it: 6 "
                        "training/test file(s) get shortened feature windows; put earlier days in history/ to "
                        "give them full history"], "warned once, with what is wanted and what exists"


def test_a_zero_row_day_on_the_share_is_an_item_error(tmp_path: Path, dataset_src: Path) -> None:
    root = tmp_path / "d"
    shutil.copytree(dataset_src, root)
    pd.read_parquet(root / DAY3).iloc[:0].to_parquet(root / DAY3, index=False)
    with pytest.raises(DatasetError, match=f"{root / DAY3}: the file has no rows"):
        ds.Dataset(root).examples([DAY3])


# -- seed: errors name the user's file, in one line, and publish nothing ---------------------------
def seed(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return zygote.run(["workload", "seed", *args], cluster.env(), ROOT, 120)


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_bad_file_is_refused_in_one_line_naming_the_users_file(cluster: Cluster, tmp_path: Path, case: str) -> None:
    folder = copy_files(cluster.dataset_src, tmp_path / "export")
    bad = plant(folder, case, cluster.dataset_src)
    out = seed(cluster, "--datasets", str(folder), "--dataset", "mine")
    assert out.returncode == 2, out.stderr
    line = one_error_line(out.stderr)
    assert f"dataset problem: {bad}: {BAD_FILES[case][2]}" in line, line
    datasets = cluster.share / "datasets"
    assert not (datasets / "mine").exists() and list(datasets.iterdir()) == [datasets / ".mine.lock"], \
        "nothing published, nothing left"
    assert cluster.counts().total == 0


def test_the_warning_and_the_sync_figures_of_seed(cluster: Cluster, tmp_path: Path) -> None:
    folder = copy_files(cluster.dataset_src, tmp_path / "export")
    first, again = (seed(cluster, "--datasets", str(folder)) for _ in range(2))
    assert first.returncode == again.returncode == 0, first.stderr + again.stderr
    assert f"synced {folder.resolve()} into {cluster.share / 'datasets' / 'fraud'}: 8 file(s) copied, 0 unchanged" \
        in first.stderr
    assert "8 file(s) copied" not in again.stderr and ": 0 file(s) copied, 8 unchanged" in again.stderr
    assert first.stderr.count("features look back") == 1


def test_a_folder_laid_out_by_hand_is_not_overwritten(tmp_path: Path, dataset_src: Path) -> None:
    root = tmp_path / "datasets" / "d"
    (root / "training").mkdir(parents=True)
    (root / "training" / "mine.parquet").write_bytes(b"someone's file")
    with pytest.raises(DatasetError) as err:
        publish_from(copy_files(dataset_src, tmp_path / "export"), root)
    assert str(err.value) == (f"{root} is on the share without a manifest.json (not published by seed): remove it, "
                              "or publish under another dataset name (--dataset NAME)")
    assert (root / "training" / "mine.parquet").read_bytes() == b"someone's file"
    assert sorted(p.name for p in root.parent.iterdir()) == [".d.lock", "d"], "no staging left"


def test_racing_loaders_never_unpublish_a_day(cluster: Cluster, tmp_path: Path) -> None:
    """A reload racing a slower loader, each listing the source at another time: the slower one is
    frozen just before it writes its manifest; the faster one, which saw one more day, must not
    publish (and enqueue) that day only to have the slower one's manifest drop it."""
    late = ("training/2018-04-05.parquet", "training/2018-04-06.parquet")
    folder = copy_files(cluster.dataset_src, tmp_path / "export", keep=lambda rel: rel not in late)
    assert seed(cluster, "--datasets", str(folder)).returncode == 0
    copy_files(cluster.dataset_src, folder, keep=lambda rel: rel == late[0])
    logs = {name: tmp_path / f"{name}.log" for name in ("slow", "fast")}

    def start(name: str, **extra: str) -> subprocess.Popen[bytes]:
        with open(logs[name], "wb") as out:
            return subprocess.Popen([sys.executable, "-m", "workload", "seed", "--datasets", str(folder)],
                                    env=cluster.env(**extra), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)

    slow = start("slow", WORKLOAD_FAULT="mid-write:1", WORKLOAD_FAULT_ACTION="stop")  # mid-manifest
    cluster.procs.append(slow)
    cluster.wait_for(lambda: is_stopped(slow), what="the slow loader to freeze while writing its manifest")
    copy_files(cluster.dataset_src, folder, keep=lambda rel: rel == late[1])
    fast = start("fast")
    cluster.procs.append(fast)
    cluster.wait_for(lambda: fast.poll() is not None or "waiting for its turn" in logs["fast"].read_text(),
                     what="the fast loader to finish or wait")
    slow.send_signal(signal.SIGCONT)
    codes = [slow.wait(120), fast.wait(120)]
    assert codes == [0, 0], logs["slow"].read_text() + logs["fast"].read_text()
    root = cluster.share / "datasets" / "fraud"
    published = set(ds.Dataset(root).training_shards())
    assert {f"training/2018-04-0{d}.parquet" for d in range(1, 7)} == published
    queue = cluster.queue()
    queued = {json.loads(v)["shard"] for v in queue.redis.hvals(queue.keys.items)}
    assert queued == published, "every published day is queued, and nothing else"


def test_the_next_seed_removes_a_killed_loaders_staging_copy(cluster: Cluster, tmp_path: Path) -> None:
    folder = copy_files(cluster.dataset_src, tmp_path / "export")
    killed = zygote.run(["workload", "seed", "--datasets", str(folder)], cluster.env(WORKLOAD_FAULT="mid-write:1"),
                        ROOT, 120)
    assert killed.returncode == -signal.SIGKILL
    datasets = cluster.share / "datasets"
    left = list(datasets.glob(".fraud.staging-*"))
    assert len(left) == 1 and (left[0] / DAY3).exists(), "the killed loader left its staging copy"
    out = seed(cluster, "--datasets", str(folder))
    assert out.returncode == 0, out.stderr
    assert f"removing {left[0]}, left by a loader that was stopped mid-copy" in out.stderr
    assert sorted(p.name for p in datasets.iterdir()) == [".fraud.lock", "fraud"]
    assert len(ds.Dataset(datasets / "fraud").training_shards()) == 6


# -- in-process: what publish records, refuses and tells the user (mutmut picks tests by what they call here) --
PUBLISHER = "workload.data.publish"  # the logger whose lines seed prints on stderr
DAY6 = "training/2018-04-06.parquet"


def identity(path: Path) -> tuple[int, str]:
    """A file's size and CRC32C as Cloud Storage reports it (base64 of the big-endian checksum)."""
    data = path.read_bytes()
    return len(data), base64.b64encode(google_crc32c.Checksum(data).digest()).decode("ascii")


def flip_a_byte(path: Path) -> None:
    """Change `path` in place, keeping its size."""
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))


def publisher_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == PUBLISHER]


def test_a_day_changed_at_the_same_size_is_refused_with_what_was_published_and_what_is_there_now(
        tmp_path: Path, dataset_src: Path) -> None:
    folder = copy_files(dataset_src, tmp_path / "export")
    root = tmp_path / "datasets" / "d"
    publish_from(folder, root)
    (was_size, was_crc), manifest = identity(folder / DAY3), (root / MANIFEST).read_bytes()
    flip_a_byte(folder / DAY3)
    now_size, now_crc = identity(folder / DAY3)
    assert now_size == was_size and now_crc != was_crc
    with pytest.raises(DatasetError) as err:
        publish_from(folder, root)
    assert str(err.value) == (f"{DAY3} ({folder / DAY3}) changed since it was published ({was_size} bytes, crc32c "
                              f"{was_crc}; now {now_size} bytes, crc32c {now_crc}); published days are immutable: "
                              "restore it, or publish the changed data under a new dataset name (--dataset NAME)")
    assert (root / MANIFEST).read_bytes() == manifest


def test_a_refusal_of_changed_days_names_the_first_and_counts_the_others(tmp_path: Path, dataset_src: Path) -> None:
    folder = copy_files(dataset_src, tmp_path / "export")
    root = tmp_path / "datasets" / "d"
    publish_from(folder, root)
    was = identity(folder / DAY3)
    for rel in (DAY3, "training/2018-04-04.parquet"):
        flip_a_byte(folder / rel)
    now = identity(folder / DAY3)
    with pytest.raises(DatasetError) as err:
        publish_from(folder, root)
    assert str(err.value) == (f"{DAY3} ({folder / DAY3}) changed since it was published ({was[0]} bytes, crc32c "
                              f"{was[1]}; now {now[0]} bytes, crc32c {now[1]}); published days are immutable: restore "
                              "it, or publish the changed data under a new dataset name (--dataset NAME) (and 1 more "
                              "changed file(s))")


def test_a_dataset_laid_out_by_hand_records_no_source_and_is_fed_by_none(tmp_path: Path, dataset_src: Path) -> None:
    root = tmp_path / "datasets" / "d"
    shutil.copytree(dataset_src, root)
    write_manifest(root)  # validated in place, as before sources were recorded
    manifest = (root / MANIFEST).read_bytes()
    assert publish.recorded_source(root) is None
    folder = copy_files(dataset_src, tmp_path / "export").resolve()
    with pytest.raises(DatasetError) as err:
        publish_from(folder, root)
    assert str(err.value) == (f"dataset 'd' on the share records no source (laid out by hand or an older seed); "
                              f"refusing to feed it from {folder}: a dataset has one source. Publish this one under "
                              "a new dataset name (--dataset NAME)")
    assert (root / MANIFEST).read_bytes() == manifest


def test_the_recorded_source_is_where_the_dataset_was_published_from(tmp_path: Path, dataset_src: Path) -> None:
    """`seed` with the simulator asks it before simulating: None while the dataset is absent."""
    root = tmp_path / "share" / "datasets" / "d"  # no share/ yet: publishing makes the folders it is placed in
    assert publish.recorded_source(root) is None
    folder = copy_files(dataset_src, tmp_path / "export")
    out = publish_from(folder, root)
    assert publish.recorded_source(root) == out.source == str(folder.resolve())


MAPPING = Reading(columns=(("amount", schema.TX_AMOUNT),), timezone="UTC")


def test_a_column_mapping_is_recorded_and_the_dataset_keeps_it_across_appends(tmp_path: Path,
                                                                             dataset_src: Path) -> None:
    folder = tmp_path / "export"
    for path in sorted(dataset_src.glob("*/*.parquet")):  # the amount under the user's own name
        (folder / path.parent.name).mkdir(parents=True, exist_ok=True)
        frame = pd.read_parquet(path).rename(columns={schema.TX_AMOUNT: "amount"})
        frame.to_parquet(folder / path.parent.name / path.name, index=False)
    held = (folder / DAY6).read_bytes()
    (folder / DAY6).unlink()
    root = tmp_path / "datasets" / "d"
    publish.publish(root, LocalSource(folder), MAPPING)
    (folder / DAY6).write_bytes(held)
    grown = publish.publish(root, LocalSource(folder), MAPPING)
    assert grown.copied == [DAY6]
    assert json.loads((root / MANIFEST).read_text())["reading"] == {"columns": {"amount": schema.TX_AMOUNT},
                                                                       "datetime_format": None, "timezone": "UTC"}
    assert ds.Dataset(root).transactions(DAY6)[schema.TX_AMOUNT].sum() == pytest.approx(
        pd.read_parquet(dataset_src / DAY6)[schema.TX_AMOUNT].sum())
    with pytest.raises(DatasetError) as err:
        publish.publish(root, LocalSource(folder))
    assert str(err.value) == ("dataset 'd' on the share was published with column mapping {amount->TX_AMOUNT}, "
                              "datetime format ISO 8601, timezone UTC; refusing column mapping {none}, datetime "
                              "format ISO 8601: a changed mapping or date format is a new dataset. Publish it under "
                              "a new dataset name (--dataset NAME)")


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_bad_file_is_refused_naming_the_users_file_in_process(tmp_path: Path, dataset_src: Path, case: str) -> None:
    """The in-process twin of the `seed` test above: the error names the user's file, never its staging copy."""
    folder = copy_files(dataset_src, tmp_path / "export")
    bad = plant(folder, case, dataset_src)
    root = tmp_path / "datasets" / "d"
    with pytest.raises(DatasetError) as err:
        publish_from(folder, root)
    assert str(err.value).startswith(f"{bad}: {BAD_FILES[case][2]}"), str(err.value)
    assert list(root.parent.iterdir()) == [publish.lock_path(root)], "nothing published, no staging left"


def test_a_pickle_in_the_source_is_refused_by_the_users_name_before_anything_is_copied(tmp_path: Path,
                                                                                      dataset_src: Path) -> None:
    folder = copy_files(dataset_src, tmp_path / "export")
    (folder / "training" / "2018-04-09.pkl").write_bytes(b"cos\nsystem\n")
    root = tmp_path / "datasets" / "d"
    with pytest.raises(DatasetError) as err:
        publish_from(folder, root)
    assert str(err.value) == (f"{folder / 'training' / '2018-04-09.pkl'}: .pkl files are never read (unpickling a "
                              "file from a shared volume runs arbitrary code); convert it to Parquet or CSV")
    assert list(root.parent.iterdir()) == [publish.lock_path(root)]


def test_a_training_day_without_labels_is_refused_naming_the_label(tmp_path: Path, dataset_src: Path) -> None:
    folder = copy_files(dataset_src, tmp_path / "export")
    pd.read_parquet(folder / DAY3).drop(columns=[schema.TX_FRAUD]).to_parquet(folder / DAY3, index=False)
    with pytest.raises(DatasetError) as err:
        publish_from(folder, tmp_path / "datasets" / "d")
    assert str(err.value) == (f"{folder / DAY3}: missing column(s) ['TX_FRAUD']; a day needs {list(schema.COLUMNS)} "
                              "(unlabelled days go in scoring/)")


def test_unlabelled_scoring_days_publish_and_grow_a_dataset_that_requires_no_role(tmp_path: Path,
                                                                                 dataset_src: Path) -> None:
    """What `score` publishes: scoring/ days only (required=()), without labels, one more each time."""
    folder = tmp_path / "export" / "scoring"
    folder.mkdir(parents=True)
    days = [f"2018-04-0{d}.parquet" for d in (7, 8)]
    pd.read_parquet(dataset_src / "testing" / days[0]).drop(columns=[schema.TX_FRAUD]).to_parquet(
        folder / days[0], index=False)
    root = tmp_path / "datasets" / "d"
    first = publish.publish(root, LocalSource(folder.parent), required=())
    assert first.copied == [f"scoring/{days[0]}"]
    pd.read_parquet(dataset_src / "testing" / days[1]).drop(columns=[schema.TX_FRAUD]).to_parquet(
        folder / days[1], index=False)
    grown = publish.publish(root, LocalSource(folder.parent), required=())
    assert (grown.copied, grown.unchanged) == ([f"scoring/{days[1]}"], 1)
    assert sorted(e["path"] for e in ds.Dataset(root).files) == [f"scoring/{d}" for d in days]


def test_a_dataset_without_testing_days_is_refused_naming_the_source(tmp_path: Path, dataset_src: Path) -> None:
    folder = copy_files(dataset_src, tmp_path / "export", keep=lambda rel: rel.startswith("training/")).resolve()
    root = tmp_path / "datasets" / "d"
    with pytest.raises(DatasetError) as err:
        publish_from(folder, root)
    assert str(err.value) == (f"{folder}: no testing/ files; a dataset has training/ and testing/ folders of Parquet "
                              "or CSV files (and optionally history/ for feature history, scoring/ for unlabelled "
                              "days to score)")
    assert not root.exists()


def test_a_published_day_altered_on_the_share_stops_an_append_naming_the_users_file(tmp_path: Path,
                                                                                    dataset_src: Path) -> None:
    """Every published day is read again, as its role demands (labels on all but scoring/ days), for the rules
    that span the dataset. A copy on the share altered since (its labels dropped) stops the append, and the
    error names the day as the user knows it: the file it was published from (read_transactions' `where`)."""
    folder = copy_files(dataset_src, tmp_path / "export", keep=lambda rel: rel != DAY6)
    root = tmp_path / "datasets" / "d"
    publish_from(folder, root)
    pd.read_parquet(root / DAY3).drop(columns=[schema.TX_FRAUD]).to_parquet(root / DAY3, index=False)
    manifest = (root / MANIFEST).read_bytes()
    copy_files(dataset_src, folder, keep=lambda rel: rel == DAY6)
    with pytest.raises(DatasetError) as err:
        publish_from(folder, root)
    assert str(err.value).startswith(f"{folder / DAY3}: missing column(s) ['TX_FRAUD']; "), str(err.value)
    assert (root / MANIFEST).read_bytes() == manifest and not (root / DAY6).exists()


def test_columns_outside_the_schema_are_named_as_ignored(tmp_path: Path, dataset_src: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    folder = copy_files(dataset_src, tmp_path / "export")
    for path, extra in ((folder / DAY3, "MERCHANT_COUNTRY"), (folder / DAY6, "CHANNEL")):
        pd.read_parquet(path).assign(**{extra: "x"}).to_parquet(path, index=False)
    with caplog.at_level(logging.INFO, logger=PUBLISHER):
        publish_from(folder, tmp_path / "datasets" / "d")
    ignored = [line for line in publisher_lines(caplog) if "ignored" in line]
    assert ignored == [f"{folder.resolve()}: ignored column(s): CHANNEL, MERCHANT_COUNTRY (not in the schema: never "
                       "features)"]


def test_each_publish_tells_the_user_what_it_added(tmp_path: Path, dataset_src: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """The line `seed` prints: the dataset, published (first time) or extended, from where, how many files, the
    days they span (a file may hold several), transactions and frauds."""
    day1, day2 = "training/2018-04-01.parquet", "training/2018-04-02.parquet"
    folder = copy_files(dataset_src, tmp_path / "export", keep=lambda rel: rel not in (day2, DAY6))
    pd.concat([pd.read_parquet(dataset_src / rel) for rel in (day1, day2)]).to_parquet(folder / day1, index=False)
    uri, root = str(folder.resolve()), tmp_path / "datasets" / "d"
    frames = [pd.read_parquet(p) for p in sorted(folder.glob("*/*.parquet"))]
    rows, frauds = sum(len(f) for f in frames), sum(int(f[schema.TX_FRAUD].sum()) for f in frames)
    with caplog.at_level(logging.INFO, logger=PUBLISHER):
        publish_from(folder, root)
    assert f"dataset {root} published from {uri}: 6 file(s), 2018-04-01..2018-04-08, {rows} transactions, " \
           f"{frauds} fraudulent ({100 * frauds / rows:.2f}%)" in publisher_lines(caplog)
    caplog.clear()
    copy_files(dataset_src, folder, keep=lambda rel: rel == DAY6)
    day6 = pd.read_parquet(folder / DAY6)
    rows, frauds = len(day6), int(day6[schema.TX_FRAUD].sum())
    with caplog.at_level(logging.INFO, logger=PUBLISHER):
        publish_from(folder, root)
    assert f"dataset {root} extended from {uri}: 1 file(s), 2018-04-06..2018-04-06, {rows} transactions, " \
           f"{frauds} fraudulent ({100 * frauds / rows:.2f}%)" in publisher_lines(caplog)


def test_an_unchanged_source_publishes_nothing_and_says_nothing_of_a_publish(tmp_path: Path, dataset_src: Path,
                                                                             caplog: pytest.LogCaptureFixture) -> None:
    folder = copy_files(dataset_src, tmp_path / "export")
    root = tmp_path / "datasets" / "d"
    first = publish_from(folder, root)
    manifest = (root / MANIFEST).stat()
    listed = json.loads((root / MANIFEST).read_text())["files"]
    assert first.source == str(folder.resolve())
    assert sorted(first.entries, key=lambda e: e["path"]) == sorted(listed, key=lambda e: e["path"])
    caplog.clear()  # the first publish's lines, captured when an earlier test left the root logger at INFO
    with caplog.at_level(logging.INFO, logger=PUBLISHER):
        again = publish_from(folder, root)
    assert (again.copied, again.unchanged, again.source) == ([], 8, str(folder.resolve()))
    assert sorted(again.entries, key=lambda e: e["path"]) == sorted(listed, key=lambda e: e["path"])
    after = (root / MANIFEST).stat()
    assert (after.st_ino, after.st_mtime_ns) == (manifest.st_ino, manifest.st_mtime_ns), "the manifest is not replaced"
    assert [line for line in publisher_lines(caplog) if "features look back" not in line] == [], \
        "nothing published, nothing gone: only the dataset's history warning"


def test_a_day_gone_from_the_source_stays_published_with_a_warning(tmp_path: Path, dataset_src: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    folder = copy_files(dataset_src, tmp_path / "export")
    root = tmp_path / "datasets" / "d"
    publish_from(folder, root)
    (folder / DAY6).unlink()
    with caplog.at_level(logging.INFO, logger=PUBLISHER):
        again = publish_from(folder, root)
    assert (again.copied, again.unchanged) == ([], 7)
    assert f"{folder.resolve()}: 1 published file(s) are no longer in the source and stay on the share (days are " \
           f"immutable), for example {DAY6}" in publisher_lines(caplog)
    assert ds.Dataset(root).training_shards()[-1] == DAY6


def test_appended_days_are_moved_in_and_their_folder_flushed_before_the_manifest_names_them(
        tmp_path: Path, dataset_src: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The manifest is the publishing point: after a power cut it must not name a day whose rename into the
    dataset was lost. Every os.fsync / os.replace is recorded around the real calls (as test_atomic_writes.py)."""
    late = ("training/2018-04-05.parquet", DAY6)
    folder = copy_files(dataset_src, tmp_path / "export", keep=lambda rel: rel not in late)
    root = tmp_path / "datasets" / "d"
    publish_from(folder, root)
    copy_files(dataset_src, folder, keep=lambda rel: rel in late)
    events: list[tuple[str, object]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        events.append(("fsync", (st.st_ino, stat.S_ISDIR(st.st_mode))))
        real_fsync(fd)

    def replace(src, dst, *args, **kwargs):
        events.append(("replace", Path(dst)))
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    assert publish_from(folder, root).copied == list(late)
    moved = [events.index(("replace", root / rel)) for rel in late]
    named = events.index(("replace", root / MANIFEST))
    flushed = [i for i, e in enumerate(events) if e == ("fsync", ((root / "training").stat().st_ino, True))]
    assert any(max(moved) < i < named for i in flushed), f"training/ is not fsynced between the moves and the " \
                                                        f"manifest: {events}"
