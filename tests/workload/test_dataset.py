"""Dataset files: the tutorial schema in Parquet or CSV, clear errors, no pickle, no path escapes."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from workload import features, schema
from workload.dataset import Dataset, DatasetError, read_transactions, write_manifest


def day(tmp_path: Path, dataset_src: Path, name: str = "training/2018-04-02.parquet") -> pd.DataFrame:
    return pd.read_parquet(dataset_src / name)


def test_parquet_and_csv_read_alike(tmp_path: Path, dataset_src: Path) -> None:
    frame = day(tmp_path, dataset_src)
    csv = tmp_path / "d.csv"
    frame.to_csv(csv, index=False)
    a, b = read_transactions(dataset_src / "training/2018-04-02.parquet"), read_transactions(csv)
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert list(a.columns) == list(schema.COLUMNS)


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda f: f.drop(columns=[schema.TX_AMOUNT]), "missing column(s) ['TX_AMOUNT']"),
    (lambda f: f.assign(TX_AMOUNT=np.nan), "column TX_AMOUNT has a missing value (row 1)"),
    (lambda f: f.assign(TX_AMOUNT=f[schema.TX_AMOUNT].astype(str).where(f.index != 3, "12 EUR")),
     "column TX_AMOUNT must hold numbers: row 4 has '12 EUR'"),
    (lambda f: f.assign(CUSTOMER_ID=f[schema.CUSTOMER_ID] + 0.5), "column CUSTOMER_ID must hold integers: row 1 has"),
    (lambda f: f.assign(TX_DATETIME="yesterday"), "column TX_DATETIME has an unparseable timestamp 'yesterday'"),
    (lambda f: f.assign(TX_DATETIME=f[schema.TX_TIME_SECONDS]), "column TX_DATETIME holds numbers"),
    (lambda f: pd.concat([f, f.iloc[-1:]]), "appears more than once; transaction IDs must be unique"),
    (lambda f: f.assign(TX_FRAUD=2), "column TX_FRAUD must be 0 or 1: row 1 has 2"),
    (lambda f: f.assign(TX_AMOUNT=-1.0), "negative amounts"),
    (lambda f: f.assign(TX_AMOUNT=np.inf), "column TX_AMOUNT has a non-finite value (row 1: inf)"),
    (lambda f: f.iloc[:0], "the file has no rows"),
])
def test_schema_problems_name_file_and_column(tmp_path: Path, dataset_src: Path, mutate, message: str) -> None:
    path = tmp_path / "bad.parquet"
    mutate(day(tmp_path, dataset_src)).to_parquet(path)
    with pytest.raises(DatasetError) as err:
        read_transactions(path)
    assert str(path) in str(err.value) and message in str(err.value)


def test_pickle_is_refused_before_reading(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    for name in ("x.pkl", "x.pickle", "x.joblib"):
        (tmp_path / name).write_bytes(pickle.dumps(Exploit()))
        with pytest.raises(DatasetError, match="never read"):
            read_transactions(tmp_path / name)
    assert not marker.exists()


def test_item_paths_must_stay_inside_the_dataset(tmp_path: Path, dataset_src: Path) -> None:
    data = Dataset(dataset_src)
    assert data.resolve("training/2018-04-01.parquet").is_file()
    for bad in ("../../etc/passwd", "/etc/passwd", "training/../../fraud2/x.parquet"):
        with pytest.raises(DatasetError, match="outside the datasets folder"):
            data.resolve(bad)
    with pytest.raises(DatasetError, match="not a file of the dataset manifest"):
        data.resolve("training/2018-05-01.parquet")


def test_tutorial_layout_with_one_multi_day_test_file(tmp_path: Path, dataset_src: Path) -> None:
    """The tutorial's testing/test_dataset.csv spans several days: dates come from TX_DATETIME."""
    root = tmp_path / "tutorial"
    shutil.copytree(dataset_src / "training", root / "training")
    tests = [pd.read_parquet(p) for p in sorted((dataset_src / "testing").glob("*.parquet"))]
    (root / "testing").mkdir()
    pd.concat(tests).to_csv(root / "testing" / "test_dataset.csv", index=False)
    entries = write_manifest(root)
    test_entry = next(e for e in entries if e["role"] == "testing")
    assert (test_entry["first"], test_entry["last"]) == ("2018-04-07", "2018-04-08")
    same = Dataset(dataset_src).test_examples()
    got = Dataset(root).test_examples()
    np.testing.assert_array_equal(got.x, same.x)
    np.testing.assert_array_equal(got.y, same.y)
    assert got.x.shape[1] == len(features.FEATURE_NAMES)


def test_a_broken_history_day_is_left_out_not_fatal(tmp_path: Path, dataset_src: Path, caplog) -> None:
    root = tmp_path / "d"
    shutil.copytree(dataset_src, root)
    (root / "training" / "2018-04-02.parquet").write_bytes(b"garbage")
    data = Dataset(root)
    with pytest.raises(DatasetError, match="2018-04-02.parquet: not a readable Parquet file"):
        data.examples(["training/2018-04-02.parquet"])
    ex = data.examples(["training/2018-04-03.parquet"])
    assert len(ex.y) > 0
    assert "leaving training/2018-04-02.parquet out of feature history" in caplog.text


@pytest.mark.timeout(20)
def test_a_fifo_named_like_a_day_is_refused_without_blocking(tmp_path: Path) -> None:
    """Opening a FIFO for reading blocks until a writer comes: a worker would hang on it forever."""
    fifo = tmp_path / "2018-04-01.parquet"
    os.mkfifo(fifo)
    with pytest.raises(DatasetError, match=f"{fifo}: not a regular file"):
        read_transactions(fifo)
