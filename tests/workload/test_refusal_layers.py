"""Each layer that refuses a pickle or a path escape holds on its own, checked by what it does.

The layers overlap: the queue refuses, at claim, an item whose shard climbs out of its dataset;
``check_suffix`` refuses pickle by name and anything off the allowlist; ``read_transactions`` asks it
before opening; ``Dataset.resolve`` refuses paths outside the dataset, then bad suffixes, then paths
the manifest does not list. A test through the outer layers passes
with any one inner layer gone (the next one refuses too, with another message), so each case here
gets past every layer but the one under test, and asserts the exception type (``DatasetError``:
the item is dead-lettered, not retried as an ``OSError``) and that the file was never opened,
watched with CPython's audit hook on every ``open`` in this process.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest

from workload.data import schema
from workload.data.dataset import Dataset
from workload.data.dayfile import DatasetError, check_suffix, read_transactions
from workload.data.manifest import MANIFEST
from workload.queue.workqueue import Item, MalformedItem, WorkQueue, connect
from workload.runtime.redis_server import RedisServer

PICKLE_SUFFIXES = (".pkl", ".pickle", ".p", ".joblib", ".npy", ".npz", ".PKL", ".Pickle")

_opened: list[str] | None = None


def _audit(event: str, args: tuple) -> None:
    if event == "open" and _opened is not None and isinstance(args[0], str | bytes | os.PathLike):
        _opened.append(os.path.realpath(os.fsdecode(args[0])))


sys.addaudithook(_audit)  # once per process; records only inside `opens()`


@contextmanager
def opens() -> Iterator[list[str]]:
    """Real paths of every file this process opens (builtins.open, os.open) inside the block."""
    global _opened
    _opened = []
    try:
        yield _opened
    finally:
        _opened = None


def refused(call, path: Path) -> DatasetError:
    """Run ``call()``: it must raise exactly DatasetError without ever opening ``path``."""
    with opens() as opened, pytest.raises(Exception) as err:
        call()
    assert err.type is DatasetError, f"{err.type.__name__}: {err.value}"
    assert os.path.realpath(path) not in opened, f"{path} was opened"
    return err.value


class Exploit:
    """Unpickling this creates ``marker``: proof that a pickle was loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture
def dataset(tmp_path: Path, dataset_src: Path) -> Path:
    root = tmp_path / "datasets" / "fraud"
    shutil.copytree(dataset_src, root)
    return root


def list_in_manifest(root: Path, rel: str) -> None:
    """What a tampered manifest on the read-write share could say: ``rel`` is a training file."""
    manifest = json.loads((root / MANIFEST).read_text())
    template = next(f for f in manifest["files"] if f["role"] == "training")
    manifest["files"].append({**template, "path": rel})
    (root / MANIFEST).write_text(json.dumps(manifest))


def csv_day(dataset_src: Path, to: Path) -> Path:
    """A valid day of transactions as CSV: if a refusal fails, reading it succeeds and nothing else stops it."""
    to.parent.mkdir(parents=True, exist_ok=True)
    pd.read_parquet(dataset_src / "training" / "2018-04-02.parquet").to_csv(to, index=False)
    return to


# --- the claim: a shard climbing out of its dataset is never leased ---------------------------------------


def _refused_at_claim(redis_server: RedisServer, bad: Item) -> None:
    """`bad` is never leased, is dead-lettered on its first claim, and parsing it raises the item fault."""
    queue = WorkQueue(connect(redis_server.url, redis_server.password), prefix="t")
    assert queue.enqueue([bad]) == 1
    assert queue.claim("w1", 30) is None, "the item was leased"
    dead = queue.snapshot()["runs"]["hostile"]["dead"]
    assert set(dead) == {bad.id} and dead[bad.id]["attempts"] == 1, dead
    with pytest.raises(Exception) as err:
        Item.parse(bad.to_json(), bad.id, bad.run)
    assert err.type is MalformedItem  # exactly the queue's item fault


@pytest.mark.parametrize("shard", ["../../../../etc/passwd", "/etc/passwd", "training/../../other/day.parquet"])
def test_the_claim_dead_letters_a_shard_climbing_out_without_leasing_it(redis_server: RedisServer, shard: str) -> None:
    """The first layer, with nothing behind it: no worker is handed a lease on the item (so nothing opens the
    path), it is dead-lettered on its first claim, and parsing it raises the queue's item fault."""
    _refused_at_claim(redis_server, Item(run="hostile", shard=shard, dataset="fraud", seq=0))


@pytest.mark.parametrize("name", ["..", "../outside", "/etc", "a/b", ".hidden"])
def test_the_claim_dead_letters_a_bad_dataset_name_without_leasing_it(redis_server: RedisServer, name: str) -> None:
    """The claim's own check of the dataset name (the worker re-checks it, with the same message, so only
    the lease tells the layers apart): the item is never leased, and is dead-lettered on its first claim."""
    _refused_at_claim(redis_server, Item(run="hostile", shard="training/2018-04-02.parquet", dataset=name, seq=0))


# --- check_suffix: the pickle denylist and the allowlist, each alone -----------------------------------


@pytest.mark.parametrize("suffix", PICKLE_SUFFIXES)
def test_pickle_suffixes_are_refused_even_where_the_allowlist_would_admit_them(
    suffix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """numpy's .npy is a plausible data format to allow one day: the denylist must still hold."""
    monkeypatch.setattr(schema, "ALLOWED_SUFFIXES", (*schema.ALLOWED_SUFFIXES, suffix.lower()))
    with pytest.raises(Exception) as err:
        check_suffix(Path(f"training/day{suffix}"))
    assert err.type is DatasetError


@pytest.mark.parametrize("name", ["day.json", "day.parquet.gz", "day", "day.CSV.bak"])
def test_suffixes_off_the_allowlist_are_refused(name: str) -> None:
    with pytest.raises(Exception) as err:
        check_suffix(Path(name))
    assert err.type is DatasetError


@pytest.mark.parametrize("name", ["day.parquet", "day.csv", "DAY.CSV", "2018-04-02.Parquet"])
def test_allowed_suffixes_pass_in_any_case(name: str) -> None:
    check_suffix(Path(name))


# --- read_transactions: asks before it opens ----------------------------------------------------------


@pytest.mark.parametrize("suffix", [".pkl", ".joblib", ".npy"])
def test_read_transactions_never_opens_a_pickle(tmp_path: Path, suffix: str) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / f"day{suffix}"
    path.write_bytes(pickle.dumps(Exploit(marker)))
    refused(lambda: read_transactions(path), path)
    assert not marker.exists()


# --- Dataset.resolve: escapes refused even when the manifest lists them ----------------------------------


def test_a_listed_path_climbing_out_of_the_dataset_is_refused(dataset: Path, dataset_src: Path) -> None:
    outside = csv_day(dataset_src, dataset.parent / "other" / "training" / "secret.csv")
    rel = "../other/training/secret.csv"
    list_in_manifest(dataset, rel)
    data = Dataset(dataset)
    refused(lambda: data.resolve(rel), outside)
    refused(lambda: data.examples([rel]), outside)


def test_a_listed_absolute_path_is_refused(dataset: Path, dataset_src: Path) -> None:
    outside = csv_day(dataset_src, dataset.parent / "elsewhere.csv")
    list_in_manifest(dataset, str(outside))
    data = Dataset(dataset)
    refused(lambda: data.resolve(str(outside)), outside)


def test_a_listed_symlink_pointing_out_of_the_dataset_is_refused(dataset: Path, dataset_src: Path) -> None:
    outside = csv_day(dataset_src, dataset.parent / "secret" / "day.csv")
    (dataset / "training" / "2018-04-09.csv").symlink_to(outside)
    list_in_manifest(dataset, "training/2018-04-09.csv")
    data = Dataset(dataset)
    refused(lambda: data.resolve("training/2018-04-09.csv"), outside)


def test_a_listed_pickle_inside_the_dataset_is_refused_by_resolve(dataset: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = dataset / "training" / "2018-04-09.pkl"
    evil.write_bytes(pickle.dumps(Exploit(marker)))
    list_in_manifest(dataset, "training/2018-04-09.pkl")
    data = Dataset(dataset)
    refused(lambda: data.resolve("training/2018-04-09.pkl"), evil)
    refused(lambda: data.examples(["training/2018-04-09.pkl"]), evil)
    assert not marker.exists()


def test_a_file_inside_the_dataset_but_not_in_the_manifest_is_refused(dataset: Path, dataset_src: Path) -> None:
    stray = csv_day(dataset_src, dataset / "training" / "2018-04-09.csv")
    data = Dataset(dataset)
    refused(lambda: data.resolve("training/2018-04-09.csv"), stray)


def test_the_refusals_leave_listed_files_readable(dataset: Path, dataset_src: Path) -> None:
    """Control: the same calls on a file the manifest lists inside the dataset do open and read it."""
    day = csv_day(dataset_src, dataset / "training" / "copy.csv")
    list_in_manifest(dataset, "training/copy.csv")
    data = Dataset(dataset)
    assert data.resolve("training/copy.csv") == day.resolve()
    with opens() as opened:
        frame = read_transactions(data.resolve("training/copy.csv"))
    assert len(frame) > 0 and os.path.realpath(day) in opened
