"""Dataset files: the tutorial schema in Parquet or CSV, clear errors, no pickle, no path escapes."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from workload.data import features, featurestore, schema, simulator
from workload.data.dataset import Dataset
from workload.data.dayfile import DatasetError, check_suffix, one_line, read_transactions, validate
from workload.data.manifest import MANIFEST, write_manifest
from workload.data.reading import Reading
from workload.data.rules import history_shortfall


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
    data.compute_features("training/2018-04-04.parquet")
    assert caplog.text.count("leaving training/2018-04-02.parquet out of feature history and evaluation: ") == 1
    reason = f"{root}/training/2018-04-02.parquet: not a readable Parquet file"
    warned = [r.getMessage() for r in caplog.records if "out of feature history" in r.getMessage()]
    assert len(warned) == 1
    assert warned[0].startswith("leaving training/2018-04-02.parquet out of feature history and evaluation: "
                                f"{reason} (")


@pytest.mark.timeout(20)
def test_a_fifo_named_like_a_day_is_refused_without_blocking(tmp_path: Path) -> None:
    """Opening a FIFO for reading blocks until a writer comes: a worker would hang on it forever."""
    fifo = tmp_path / "2018-04-01.parquet"
    os.mkfifo(fifo)
    with pytest.raises(DatasetError, match=f"{fifo}: not a regular file"):
        read_transactions(fifo)


# --- files as users bring them, and the one-line refusals they get ----------------------------------------


def _as_exported(frame: pd.DataFrame) -> pd.DataFrame:
    """The day as an export writes it: rows shuffled, two rows tied in time with the larger ID first,
    timestamps in two styles with zones, IDs as floats, terminals as text, the label as a boolean."""
    out = frame.copy()
    out.loc[6, schema.TX_DATETIME] = out.loc[5, schema.TX_DATETIME]  # a tie: IDs 5 and 6 of the day
    out = out.iloc[[6, 5, *range(len(out) - 1, 6, -1), *range(5)]].reset_index(drop=True)
    utc = out[schema.TX_DATETIME].dt.tz_localize("UTC")
    paris = utc.dt.tz_convert("Europe/Paris").map(lambda t: t.isoformat())
    out[schema.TX_DATETIME] = utc.dt.strftime("%Y-%m-%dT%H:%M:%SZ").where(out.index % 2 == 0, paris)
    out[schema.TRANSACTION_ID] = out[schema.TRANSACTION_ID].astype(np.float64)
    out[schema.TERMINAL_ID] = out[schema.TERMINAL_ID].astype(str)
    out[schema.TX_FRAUD] = out[schema.TX_FRAUD].astype(bool)
    out.loc[out[schema.TRANSACTION_ID] == out[schema.TRANSACTION_ID].min() + 9, schema.TX_AMOUNT] = 0.0  # a card check
    return out


def test_an_exported_day_reads_as_the_canonical_one(tmp_path: Path, dataset_src: Path) -> None:
    canonical = day(tmp_path, dataset_src)
    exported = _as_exported(canonical)
    expected = canonical[list(schema.COLUMNS)].copy()  # the simulator's own columns are read past
    expected.loc[6, schema.TX_DATETIME] = expected.loc[5, schema.TX_DATETIME]  # ordered by ID within the tie
    expected.loc[9, schema.TX_AMOUNT] = 0.0
    (tmp_path / "d.csv").write_bytes(exported.to_csv(index=False).encode())
    got = read_transactions(tmp_path / "d.csv")
    pd.testing.assert_frame_equal(got, expected, check_exact=True)
    aware = exported.assign(TX_DATETIME=pd.to_datetime(exported[schema.TX_DATETIME], utc=True, format="mixed")
                            .dt.tz_convert("America/New_York"))
    aware.to_parquet(tmp_path / "d.parquet")
    pd.testing.assert_frame_equal(read_transactions(tmp_path / "d.parquet"), expected, check_exact=True)


def _styled(frame: pd.DataFrame) -> pd.DataFrame:
    """TX_DATETIME written row by row in the four styles the error messages suggest, two of them zoned."""
    when = frame[schema.TX_DATETIME]
    styles = [when.dt.strftime("%Y-%m-%d %H:%M:%S"), when.dt.strftime("%Y-%m-%dT%H:%M:%SZ"),
              (when + pd.Timedelta(hours=2)).dt.strftime("%Y-%m-%d %H:%M:%S+02:00"),
              when.dt.strftime("%Y-%m-%d %H:%M:%S UTC")]
    return frame.assign(TX_DATETIME=[styles[i % 4].iloc[i] for i in range(len(frame))])


def _csv(frame: pd.DataFrame, **kwargs) -> bytes:
    return frame.to_csv(index=False, **kwargs).encode()


def _at(frame: pd.DataFrame, row: int, column: str, value) -> pd.DataFrame:
    out = frame.astype({column: object})
    out.loc[row, column] = value
    return out


@pytest.mark.parametrize(("make", "message"), [
    (lambda f: b"", ": empty file (0 bytes); a day file holds a header and at least one transaction"),
    (lambda f: _csv(f.iloc[:0]), ": the file has a header but no rows; a day file holds at least one transaction"),
    (lambda f: _csv(f, sep=";"), ": read a single column 'TRANSACTION_ID;TX_DATETIME;CUSTOMER_ID;TERMINAL_ID;TX_AMOUNT;"
     "TX_TIME_SECONDS;TX_' (it looks separated by ';': declare csv: {separator: ';'} in the mapping file); CSV "
     "files must be separated by ',' (as declared) with the columns "
     "TRANSACTION_ID,TX_DATETIME,CUSTOMER_ID,TERMINAL_ID,TX_AMOUNT,TX_FRAUD"),
    (lambda f: _csv(f, sep="\t"), "(it looks separated by a tab: declare csv: {separator: '\\t'} in the mapping "
                                  "file)"),
    (lambda f: _csv(f[[schema.TRANSACTION_ID]]), ": read a single column 'TRANSACTION_ID' (no ',' in the header); "),
    (lambda f: _csv(_at(f, 3, schema.TX_AMOUNT, "12 EUR")),
     ": column TX_AMOUNT must hold numbers: line 5 has '12 EUR'"),
    (lambda f: _csv(_at(f, 4, schema.TX_DATETIME, "2018-04-02 25:00:00")),
     ": column TX_DATETIME has an unparseable timestamp '2018-04-02 25:00:00' (line 6); write timestamps such as "
     "2018-04-01 00:00:31, 2018-04-01T00:00:31Z, 2018-04-01 00:00:31+02:00, 2018-04-01 00:00:31 UTC"),
    (lambda f: _csv(_at(f, 2, schema.CUSTOMER_ID, "")),
     ": column CUSTOMER_ID has a missing value (line 4); none are allowed"),
    (lambda f: _csv(_at(f, 1, schema.TX_FRAUD, -1)), ": column TX_FRAUD must be 0 or 1: line 3 has -1"),
    (lambda f: _csv(_at(f, 2, schema.TX_AMOUNT, -1.5)), ": column TX_AMOUNT has negative amounts (line 4: -1.5); "
     "amounts must be >= 0"),
    (lambda f: _csv(_at(f, 1, schema.TX_FRAUD, 2.0**63)), ": column TX_FRAUD must hold integers: line 3 has "
     "9.223372036854776e+18"),
    (lambda f: _csv(_at(f, 1, schema.TX_FRAUD, "inf")), ": column TX_FRAUD must hold integers: line 3 has inf"),
    (lambda f: _csv(_at(f, 3, schema.TRANSACTION_ID, f[schema.TRANSACTION_ID].iloc[7])),
     ": TRANSACTION_ID 684 appears more than once; transaction IDs must be unique across the dataset"),
    # Unix time where a timestamp belongs: the message shows the first row's own value.
    (lambda f: _csv(f.assign(TX_DATETIME=f[schema.TX_TIME_SECONDS])),
     ": column TX_DATETIME holds numbers (line 2: 87090); it must hold timestamps such as 2018-04-01 00:00:31, "),
    # An export's "never": parsed, but later than nanoseconds since 1970 reach.
    (lambda f: _csv(_at(f, 2, schema.TX_DATETIME, "9999-12-31 23:59:59")),
     ": column TX_DATETIME has an out-of-range timestamp '9999-12-31 23:59:59' (line 4); write timestamps such as "),
    # Rows in the four documented styles, one of them no date at all: the bad row is named, not a restyled one.
    (lambda f: _csv(_at(_styled(f), 7, schema.TX_DATETIME, "2018-02-30 10:00:00")),
     ": column TX_DATETIME has an unparseable timestamp '2018-02-30 10:00:00' (line 9); write timestamps such as "),
    # Excel's "Unicode text" export: UTF-16 with a byte-order mark.
    (lambda f: f.to_csv(index=False).encode("utf-16"),
     ": not utf-8 text; it reads as utf-16: declare csv: {encoding: utf-16} in the mapping file"),
])
def test_a_bad_csv_is_refused_in_one_line_naming_the_users_file_and_line(
        tmp_path: Path, dataset_src: Path, make, message: str) -> None:
    path = tmp_path / "2018-04-02.csv"
    path.write_bytes(make(day(tmp_path, dataset_src)))
    with pytest.raises(DatasetError) as err:
        read_transactions(path, where="gs://bucket/exports/2018-04-02.csv")
    shown = str(err.value)
    where = "gs://bucket/exports/2018-04-02.csv"
    assert shown.startswith(where + message) if message.startswith(":") else message in shown
    assert shown.startswith("gs://bucket/exports/2018-04-02.csv: ") and "\n" not in shown


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda f: f.assign(CUSTOMER_ID=f[schema.TX_DATETIME]), "column CUSTOMER_ID must hold numbers, saw dtype "
     "datetime64[ns]"),
    (lambda f: f.assign(TX_DATETIME=f[schema.TX_FRAUD] == 1),
     "column TX_DATETIME holds numbers (row 1: False); it must hold timestamps such as 2018-04-01 00:00:31"),
    (lambda f: f.assign(TX_AMOUNT=f[schema.TX_AMOUNT].where(f.index != 4)), "column TX_AMOUNT has a missing value "
     "(row 5)"),
    (lambda f: f.assign(TX_AMOUNT=pd.to_timedelta(f[schema.TX_TIME_SECONDS], unit="s")),
     "column TX_AMOUNT must hold numbers, saw dtype timedelta64["),
])
def test_a_bad_parquet_is_refused_naming_the_row(tmp_path: Path, dataset_src: Path, mutate, message: str) -> None:
    path = tmp_path / "bad.parquet"
    mutate(day(tmp_path, dataset_src)).to_parquet(path)
    with pytest.raises(DatasetError) as err:
        read_transactions(path)
    assert str(err.value).startswith(f"{path}: {message}")


def test_refusals_by_file_type_say_what_is_allowed(tmp_path: Path) -> None:
    with pytest.raises(DatasetError) as err:
        check_suffix("day.json", where="gs://b/day.json")
    assert str(err.value) == "gs://b/day.json: unsupported file type '.json'; allowed: .parquet, .csv"
    with pytest.raises(DatasetError) as err:
        check_suffix(tmp_path / "day.PKL")
    assert str(err.value).startswith(f"{tmp_path / 'day.PKL'}: .pkl files are never read (unpickling a file from")


def test_a_librarys_multi_line_error_is_cut_to_its_first_line() -> None:
    assert one_line(ValueError("  first\nsecond\n")) == "first"
    assert one_line(KeyError()) == "KeyError"


# --- the rules across a dataset's files, and its manifest --------------------------------------------------


def _copy(dataset_src: Path, to: Path) -> Path:
    for role in ("training", "testing"):
        shutil.copytree(dataset_src / role, to / role)
    return to


def test_the_manifest_records_each_files_role_span_and_counts_in_order(tmp_path: Path, dataset_src: Path) -> None:
    root = _copy(dataset_src, tmp_path / "d")
    (root / "history").mkdir()
    early = day(tmp_path, dataset_src, "training/2018-04-01.parquet")
    early = early.assign(TX_DATETIME=early[schema.TX_DATETIME] - pd.Timedelta(days=3),
                         TRANSACTION_ID=early[schema.TRANSACTION_ID] + 10**6)
    early.to_csv(root / "history" / "b-early.csv", index=False)
    (root / "training" / ".hidden.parquet").write_bytes(b"an editor's scratch file")
    (root / "testing" / "notes").mkdir()
    entries = write_manifest(root)
    on_disk = json.loads((root / MANIFEST).read_text())
    assert on_disk == {"source": None, "files": entries}
    training = [f"training/2018-04-0{i}.parquet" for i in range(1, 7)]
    testing = ["testing/2018-04-07.parquet", "testing/2018-04-08.parquet"]
    assert [e["path"] for e in entries] == ["history/b-early.csv", *training, *testing]
    frame = read_transactions(root / "testing" / "2018-04-08.parquet")
    when = frame[schema.TX_DATETIME]
    assert entries[-1] == {"path": "testing/2018-04-08.parquet", "role": "testing", "first": "2018-04-08",
                           "last": "2018-04-08", "day": "2018-04-08", "start": when.min().isoformat(),
                           "end": when.max().isoformat(), "rows": len(frame),
                           "frauds": int(frame[schema.TX_FRAUD].sum())}
    assert entries[0]["role"] == "history" and entries[0]["first"] == entries[0]["last"] == "2018-03-29"
    assert Dataset(root).training_shards() == [f"training/2018-04-0{i}.parquet" for i in range(1, 7)]
    # Training and test days' features go to the feature store; history days only feed windows: never stored.
    data = Dataset(root)
    data.examples(["training/2018-04-02.parquet"])
    assert featurestore.paths(root, "training/2018-04-02.parquet")[0].is_file()
    history = data.examples(["history/b-early.csv"])
    assert np.array_equal(history.ids, np.sort(early[schema.TRANSACTION_ID].to_numpy()))
    assert not featurestore.paths(root, "history/b-early.csv")[0].exists()


def _test_export_starting_at(root: Path, when: pd.Timestamp) -> dict:
    """The test day's file rewritten as a user's CSV export whose first row is at `when`: its manifest entry."""
    test = read_transactions(root / "testing" / "2018-04-07.parquet")
    test.loc[0, schema.TX_DATETIME] = when
    (root / "testing" / "2018-04-07.parquet").unlink()
    test.to_csv(root / "testing" / "export-7.csv", index=False)
    return next(e for e in write_manifest(root) if e["path"] == "testing/export-7.csv")


def test_a_test_days_row_at_the_last_training_instant_is_a_late_posting_not_a_second_role(
        tmp_path: Path, dataset_src: Path) -> None:
    """A day's place is its calendar day (most of its rows): one row of the first test day dated at the last
    training instant is a late posting, kept and counted with its day; the days keep their roles and order."""
    root = _copy(dataset_src, tmp_path / "d")
    train_end = read_transactions(root / "training" / "2018-04-06.parquet")[schema.TX_DATETIME].max()
    entry = _test_export_starting_at(root, train_end)
    assert (entry["day"], entry["first"], entry["late"]) == ("2018-04-07", "2018-04-06", 1)
    assert entry["start"] > train_end.isoformat()
    assert Dataset(root).training_shards() == [f"training/2018-04-0{i}.parquet" for i in range(1, 7)]


OVERLAP_6 = ("testing/export.csv (testing, 2018-04-06..2018-04-06) overlaps training/2018-04-06.parquet "
             "(training, 2018-04-06..2018-04-06) in time; a day is history, training, testing or scoring, "
             "never two of them")


def test_a_day_in_two_roles_is_refused(tmp_path: Path, dataset_src: Path) -> None:
    """A test export of the last training day's own transactions (under other IDs and amounts)."""
    root = _copy(dataset_src, tmp_path / "d")
    train = read_transactions(root / "training" / "2018-04-06.parquet")
    train.assign(TRANSACTION_ID=train[schema.TRANSACTION_ID] + 10**6, TX_AMOUNT=train[schema.TX_AMOUNT] + 0.5).to_csv(
        root / "testing" / "export.csv", index=False)
    with pytest.raises(DatasetError) as err:
        write_manifest(root)
    assert str(err.value) == OVERLAP_6
    assert not (root / MANIFEST).exists()


def test_files_of_one_role_may_overlap_in_time(tmp_path: Path, dataset_src: Path) -> None:
    """An export split by terminal rather than by day: two training files cover the same hours."""
    root = _copy(dataset_src, tmp_path / "d")
    frame = read_transactions(root / "training" / "2018-04-06.parquet")
    (root / "training" / "2018-04-06.parquet").unlink()
    odd = frame[schema.TERMINAL_ID] % 2 == 1
    frame[odd].to_parquet(root / "training" / "2018-04-06-odd.parquet")
    frame[~odd].to_parquet(root / "training" / "2018-04-06-even.parquet")
    entries = write_manifest(root)
    halves = [e for e in entries if e["first"] == "2018-04-06"]
    assert [e["path"] for e in halves] == ["training/2018-04-06-even.parquet", "training/2018-04-06-odd.parquet"]
    assert sum(e["rows"] for e in halves) == len(frame)
    # Each half's features see the other half's earlier rows: a file starting on the target's last day is history.
    whole = pd.concat([read_transactions(root / "training" / f"2018-04-0{d}.parquet") for d in range(1, 6)] + [frame],
                      ignore_index=True)
    expected = features.compute(whole, np.r_[np.zeros(len(whole) - len(frame), dtype=bool), odd.to_numpy()])
    got = Dataset(root).compute_features("training/2018-04-06-odd.parquet")
    np.testing.assert_array_equal(got["x"], expected["x"])


def test_an_id_in_two_files_is_refused_naming_both(tmp_path: Path, dataset_src: Path) -> None:
    root = _copy(dataset_src, tmp_path / "d")
    test = read_transactions(root / "testing" / "2018-04-08.parquet")
    reused = int(read_transactions(root / "training" / "2018-04-03.parquet")[schema.TRANSACTION_ID].iloc[9])
    test.loc[4, schema.TRANSACTION_ID] = reused
    test.to_parquet(root / "testing" / "2018-04-08.parquet")
    with pytest.raises(DatasetError) as err:
        write_manifest(root)
    assert str(err.value) == (f"TRANSACTION_ID {reused} is in both training/2018-04-03.parquet and "
                              "testing/2018-04-08.parquet; transaction IDs must be unique across the dataset")


def test_a_dataset_without_test_days_is_refused(tmp_path: Path, dataset_src: Path) -> None:
    root = tmp_path / "d"
    shutil.copytree(dataset_src / "training", root / "training")
    with pytest.raises(DatasetError) as err:
        write_manifest(root)
    assert str(err.value) == (f"{root}: no testing/ files; a dataset has training/ and testing/ folders of Parquet or "
                              "CSV files (and optionally history/ for feature history, scoring/ for unlabelled days to "
                              "score)")


def _entry(role: str, first: str) -> dict:
    return {"role": role, "first": first}


def test_history_shortfall_counts_the_days_that_get_shortened_windows() -> None:
    lookback = features.LOOKBACK_DAYS
    start = pd.Timestamp("2018-01-01")
    days = [str((start + pd.Timedelta(days=d)).date()) for d in (0, lookback - 1, lookback, lookback + 5)]
    assert history_shortfall([]) is None
    full = [_entry("history", days[0]), _entry("training", days[2]), _entry("testing", days[3])]
    assert history_shortfall(full) is None
    got = history_shortfall([_entry("history", days[0]), _entry("testing", days[3]), _entry("training", days[1]),
                             _entry("training", days[2])])
    assert got == (f"features look back {lookback} days (features.LOOKBACK_DAYS), but the first training/test day "
                   f"{days[1]} has {lookback - 1} day(s) of history before it: 1 training/test file(s) get shortened "
                   "feature windows; put earlier days in history/ to give them full history")
    assert "has 0 day(s) of history before it: 2 training/test" in history_shortfall(
        [_entry("training", days[0]), _entry("testing", days[1])])


@pytest.mark.parametrize(("content", "problem"), [
    (None, "missing; run `python -m workload seed` to lay the dataset out"),
    ("{not json", "unreadable manifest (Expecting property name"),
    ('{"files": {}}', "unreadable manifest ('files'); run seed again"),
    ("[]", "unreadable manifest ("),
])
def test_a_missing_or_broken_manifest_is_refused_naming_it(tmp_path: Path, content: str | None, problem: str) -> None:
    if content is not None:
        (tmp_path / MANIFEST).write_text(content)
    with pytest.raises(DatasetError) as err:
        Dataset(tmp_path)
    assert str(err.value).startswith(f"{tmp_path / MANIFEST}: {problem}")


def test_training_shards_follow_the_first_day_whatever_the_manifest_order(tmp_path: Path) -> None:
    files = [{"path": "training/c.csv", "role": "training", "first": "2018-04-02", "last": "2018-04-02"},
             {"path": "testing/a.csv", "role": "testing", "first": "2018-04-01", "last": "2018-04-01"},
             {"path": "training/b.csv", "role": "training", "first": "2018-04-01", "last": "2018-04-03"},
             {"path": "training/z.csv", "role": "training", "first": "2018-04-01", "last": "2018-04-01"},
             {"path": "training/y.csv", "role": "training", "first": "2018-04-01", "last": "2018-04-01"}]
    (tmp_path / MANIFEST).write_text(json.dumps({"source": None, "files": files}))
    assert Dataset(tmp_path).training_shards() == [
        "training/y.csv", "training/z.csv", "training/b.csv", "training/c.csv"]


def test_test_examples_are_every_test_row_in_time_order_once(tmp_path: Path, dataset_src: Path) -> None:
    data = Dataset(dataset_src, cache_rows=1)
    got = data.test_examples()
    expected = [read_transactions(dataset_src / "testing" / f"2018-04-0{d}.parquet") for d in (7, 8)]
    assert np.array_equal(got.ids, np.concatenate([f[schema.TRANSACTION_ID] for f in expected]))
    assert np.array_equal(got.y, np.concatenate([f[schema.TX_FRAUD] for f in expected]).astype(np.float32))
    assert data.test_examples() is got
    data.compute_features("training/2018-04-06.parquet")  # reads six days
    # The cache stays under its bound (one file at least, never more than cache_rows), keeping the latest read.
    assert list(data._cache) == ["training/2018-04-06.parquet"]
    both = data.examples(["training/2018-04-05.parquet", "training/2018-04-06.parquet"])
    assert len(both.ids) == len(both.x) == len(both.card) == len(both.day) == len(both.known) == sum(
        len(read_transactions(dataset_src / "training" / f"2018-04-0{d}.parquet")) for d in (5, 6))


def test_a_day_published_after_the_dataset_was_opened_is_found(tmp_path: Path, dataset_src: Path) -> None:
    root = _copy(dataset_src, tmp_path / "d")
    (root / "testing" / "2018-04-08.parquet").rename(tmp_path / "later.parquet")
    write_manifest(root)
    data = Dataset(root)
    shutil.move(tmp_path / "later.parquet", root / "testing" / "2018-04-08.parquet")
    write_manifest(root)
    assert data.resolve("testing/2018-04-08.parquet") == (root / "testing" / "2018-04-08.parquet").resolve()
    assert data.entry("testing/2018-04-08.parquet")["first"] == "2018-04-08"


def test_errors_in_a_copied_file_name_where_the_user_had_it(tmp_path: Path, dataset_src: Path) -> None:
    root = _copy(dataset_src, tmp_path / "d")
    write_manifest(root)
    manifest = json.loads((root / MANIFEST).read_text())
    manifest["files"][2]["source"] = {"uri": "gs://bucket/exports/day3.parquet"}
    (root / MANIFEST).write_text(json.dumps(manifest))
    (root / manifest["files"][2]["path"]).write_bytes(b"garbage")
    with pytest.raises(DatasetError) as err:
        Dataset(root).examples([manifest["files"][2]["path"]])
    path = root / manifest["files"][2]["path"]
    assert str(err.value).startswith(f"{path} (from gs://bucket/exports/day3.parquet): not a readable Parquet file (")


def test_a_days_features_are_those_of_its_rows_after_all_its_history(tmp_path: Path, dataset_src: Path) -> None:
    """The dataset is shorter than LOOKBACK_DAYS: day 3's window is days 1 to 3, whole; later days add nothing."""
    frames = [read_transactions(dataset_src / "training" / f"2018-04-0{d}.parquet") for d in (1, 2, 3)]
    whole = pd.concat(frames, ignore_index=True)
    target = np.r_[np.zeros(len(whole) - len(frames[2]), dtype=bool), np.ones(len(frames[2]), dtype=bool)]
    expected = features.compute(whole, target)
    got = Dataset(dataset_src).compute_features("training/2018-04-03.parquet")
    assert set(got) == set(expected)
    for key in expected:
        np.testing.assert_array_equal(got[key], expected[key], err_msg=key)


def test_validate_refuses_a_frame_without_rows() -> None:
    empty = pd.DataFrame({c: [] for c in schema.COLUMNS})
    with pytest.raises(DatasetError) as err:
        validate(empty, "gs://b/day.parquet")
    assert str(err.value) == "gs://b/day.parquet: the file has no rows; a day file holds at least one transaction"


def test_a_dataset_without_training_days_is_refused(tmp_path: Path, dataset_src: Path) -> None:
    root = tmp_path / "d"
    shutil.copytree(dataset_src / "testing", root / "testing")
    with pytest.raises(DatasetError, match=f"^{root}: no training/ files; a dataset has training/ and testing/"):
        write_manifest(root)


def test_the_read_cache_holds_up_to_cache_rows_transactions(tmp_path: Path, dataset_src: Path) -> None:
    days = [f"training/2018-04-0{d}.parquet" for d in (1, 2)]
    rows = sum(len(read_transactions(dataset_src / d)) for d in days)
    data = Dataset(dataset_src, cache_rows=rows)
    data.compute_features(days[1])  # its window: days 1 and 2, exactly cache_rows transactions
    assert list(data._cache) == days


def test_a_history_day_exactly_lookback_days_before_is_in_the_window(tmp_path: Path, dataset_src: Path) -> None:
    """Day 1's window starts LOOKBACK_DAYS before it, at midnight: a history file of that very day is read."""
    root = _copy(dataset_src, tmp_path / "d")
    first = read_transactions(root / "training" / "2018-04-01.parquet")
    back = pd.Timedelta(days=features.LOOKBACK_DAYS)
    old = first.assign(TX_DATETIME=first[schema.TX_DATETIME] - back,
                       TRANSACTION_ID=first[schema.TRANSACTION_ID] + 10**6)
    (root / "history").mkdir()
    old.to_parquet(root / "history" / "old.parquet")
    write_manifest(root)
    whole = pd.concat([old, first], ignore_index=True)
    expected = features.compute(whole, np.r_[np.zeros(len(old), dtype=bool), np.ones(len(first), dtype=bool)])
    got = Dataset(root).compute_features("training/2018-04-01.parquet")
    alone = features.compute(first, np.ones(len(first), dtype=bool))
    assert not np.array_equal(alone["x"], expected["x"])  # the history day does change day 1's features
    np.testing.assert_array_equal(got["x"], expected["x"])


# --- more files as exports write them ---------------------------------------------------------------------


def test_timestamps_in_every_documented_style_in_one_file_read_as_utc(tmp_path: Path, dataset_src: Path) -> None:
    canonical = day(tmp_path, dataset_src)
    (tmp_path / "d.csv").write_bytes(_csv(_styled(canonical)))
    pd.testing.assert_frame_equal(read_transactions(tmp_path / "d.csv"), canonical[list(schema.COLUMNS)],
                                  check_exact=True)


def test_day_first_dates_are_refused_unless_their_format_is_declared(tmp_path: Path, dataset_src: Path) -> None:
    """A European export: 05/04/2018 is 5 April to the bank, 4 May to a guess. Undeclared, the file is
    refused naming line and value; declared, every row reads as the bank meant it."""
    frame = day(tmp_path, dataset_src, "testing/2018-04-07.parquet")
    frame[schema.TX_DATETIME] -= pd.Timedelta(days=2)  # 5 April: both readings are dates
    export = frame.assign(TX_DATETIME=frame[schema.TX_DATETIME].dt.strftime("%d/%m/%Y %H:%M:%S"))
    (tmp_path / "test_dataset.csv").write_bytes(_csv(export))
    with pytest.raises(DatasetError) as err:
        read_transactions(tmp_path / "test_dataset.csv")
    first = export[schema.TX_DATETIME].iloc[0]
    assert str(err.value).startswith(f"{tmp_path / 'test_dataset.csv'}: column TX_DATETIME has an unparseable "
                                     f"timestamp '{first}' (line 2); write timestamps such as 2018-04-01 00:00:31, ")
    assert "--datetime-format '%d/%m/%Y %H:%M'" in str(err.value)
    got = read_transactions(tmp_path / "test_dataset.csv", reading=Reading(datetime_format="%d/%m/%Y %H:%M:%S"))
    expected = frame[list(schema.COLUMNS)].sort_values([schema.TX_DATETIME, schema.TRANSACTION_ID], ignore_index=True)
    pd.testing.assert_frame_equal(got, expected, check_exact=True)
    assert str(got[schema.TX_DATETIME].iloc[0].date()) == "2018-04-05"


def test_a_declared_format_still_reads_iso_and_names_a_value_that_fits_neither(tmp_path: Path,
                                                                               dataset_src: Path) -> None:
    frame = day(tmp_path, dataset_src)
    export = frame.assign(TX_DATETIME=frame[schema.TX_DATETIME].dt.strftime("%d/%m/%Y %H:%M:%S").astype(object))
    export.loc[3, schema.TX_DATETIME] = str(frame[schema.TX_DATETIME].iloc[3])  # one row in ISO 8601
    (tmp_path / "d.csv").write_bytes(_csv(export))
    reading = Reading(datetime_format="%d/%m/%Y %H:%M:%S")
    pd.testing.assert_frame_equal(read_transactions(tmp_path / "d.csv", reading=reading),
                                  frame[list(schema.COLUMNS)], check_exact=True)
    export.loc[5, schema.TX_DATETIME] = "02.04.2018 10:00"
    (tmp_path / "d.csv").write_bytes(_csv(export))
    with pytest.raises(DatasetError) as err:
        read_transactions(tmp_path / "d.csv", where="gs://b/d.csv", reading=reading)
    assert str(err.value) == ("gs://b/d.csv: column TX_DATETIME has an unparseable timestamp '02.04.2018 10:00' "
                              "(line 7); write timestamps in the declared format '%d/%m/%Y %H:%M:%S' or in ISO 8601")


def test_epoch_timestamps_are_read_only_when_declared(tmp_path: Path, dataset_src: Path) -> None:
    frame = day(tmp_path, dataset_src)
    seconds = (frame[schema.TX_DATETIME] - pd.Timestamp("1970-01-01")) // pd.Timedelta(seconds=1)
    for fmt, values in (("epoch-s", seconds), ("epoch-ms", seconds * 1000)):
        frame.assign(TX_DATETIME=values).to_parquet(tmp_path / "d.parquet")
        got = read_transactions(tmp_path / "d.parquet", reading=Reading(datetime_format=fmt))
        pd.testing.assert_frame_equal(got, frame[list(schema.COLUMNS)], check_exact=True)
    with pytest.raises(DatasetError, match="column TX_DATETIME holds numbers"):
        read_transactions(tmp_path / "d.parquet")


def test_narrow_and_wide_parquet_types_read_exactly_as_int64_and_float64(tmp_path: Path, dataset_src: Path) -> None:
    """Spark writes int32 and float32 columns; a warehouse's 64-bit IDs exceed what a float holds exactly."""
    canonical = day(tmp_path, dataset_src)
    big = canonical[schema.TRANSACTION_ID] + 2**62  # snowflake-style IDs: float64 would round them
    export = canonical.assign(TRANSACTION_ID=big, CUSTOMER_ID=canonical[schema.CUSTOMER_ID].astype(np.int32),
                              TX_AMOUNT=canonical[schema.TX_AMOUNT].astype(np.float32))
    export.to_parquet(tmp_path / "d.parquet")
    got = read_transactions(tmp_path / "d.parquet")
    expected = canonical.assign(TRANSACTION_ID=big,
                                TX_AMOUNT=canonical[schema.TX_AMOUNT].astype(np.float32).astype(np.float64))
    expected = expected[list(schema.COLUMNS)]
    pd.testing.assert_frame_equal(got, expected, check_exact=True)
    assert int(got[schema.TRANSACTION_ID].iloc[0]) == 2**62 + 677


def test_a_refused_file_type_is_named_as_the_user_wrote_it(tmp_path: Path) -> None:
    for name, problem in (("day.json", "unsupported file type '.json'"), ("day.pkl", ".pkl files are never read")):
        (tmp_path / name).write_bytes(b"{}")
        with pytest.raises(DatasetError) as err:
            read_transactions(tmp_path / name, where=f"gs://bucket/exports/{name}")
        assert str(err.value).startswith(f"gs://bucket/exports/{name}: {problem}")


def test_a_late_posting_behind_a_later_day_of_the_other_role_is_kept_with_its_day(
        tmp_path: Path, dataset_src: Path) -> None:
    """The last test day's export carries a row from the last training day's noon, behind a test day (04-07):
    kept with 04-08 (its day), counted, and no feature history for the days before 04-08."""
    root = _copy(dataset_src, tmp_path / "d")
    test = read_transactions(root / "testing" / "2018-04-08.parquet")
    test.loc[0, schema.TX_DATETIME] = pd.Timestamp("2018-04-06 12:00:00")
    (root / "testing" / "2018-04-08.parquet").unlink()
    test.to_csv(root / "testing" / "test_dataset.csv", index=False)
    entry = next(e for e in write_manifest(root) if e["path"] == "testing/test_dataset.csv")
    assert (entry["day"], entry["first"], entry["late"]) == ("2018-04-08", "2018-04-06", 1)
    inputs = {f["path"] for f in Dataset(root).feature_inputs("testing/2018-04-07.parquet")}
    assert "testing/test_dataset.csv" not in inputs and "training/2018-04-06.parquet" in inputs


def test_a_history_day_the_share_cannot_open_fails_the_shard_not_its_features(
        tmp_path: Path, dataset_src: Path, caplog) -> None:
    """Out of file descriptors (EMFILE) is the platform's fault: the shard is retried later, never trained
    on a window silently missing that day."""
    import errno
    import resource

    root = _copy(dataset_src, tmp_path / "d")
    history = read_transactions(root / "training" / "2018-04-01.parquet")
    (root / "history").mkdir()
    history.assign(TX_DATETIME=history[schema.TX_DATETIME] - pd.Timedelta(days=1),
                   TRANSACTION_ID=history[schema.TRANSACTION_ID] + 10**6).to_parquet(root / "history" / "h.parquet")
    write_manifest(root)
    data = Dataset(root)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest_free = os.open(os.devnull, os.O_RDONLY)
    os.close(lowest_free)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))  # no new file descriptor can be opened
    try:
        with pytest.raises(OSError) as err:
            data.compute_features("training/2018-04-01.parquet")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert err.value.errno == errno.EMFILE and err.value.filename == str(root / "history" / "h.parquet")
    assert "out of feature history" not in caplog.text
    assert len(data.compute_features("training/2018-04-01.parquet")["y"]) == len(history)


def test_the_same_day_in_training_and_testing_is_refused(tmp_path: Path, dataset_src: Path) -> None:
    """One export copied into both folders: two files with the very same first and last instant."""
    root = _copy(dataset_src, tmp_path / "d")
    shutil.copy(root / "training" / "2018-04-06.parquet", root / "testing" / "2018-04-06.parquet")
    with pytest.raises(DatasetError) as err:
        write_manifest(root)
    assert str(err.value) == ("testing/2018-04-06.parquet (testing, 2018-04-06..2018-04-06) overlaps "
                              "training/2018-04-06.parquet (training, 2018-04-06..2018-04-06) in time; a day is "
                                                            "history, training, testing or scoring, never two of them")


def test_a_long_history_file_is_in_the_window_of_each_day_it_reaches(tmp_path: Path) -> None:
    """A bank's history often comes as one dump of many weeks, then daily files: the dump starts more
    than LOOKBACK_DAYS before a day whose window still reaches its end, and must be found (windows are
    looked up by first day, so a long file's start must not hide it). The same transactions as daily
    files give the same features."""
    spec = simulator.SimulationSpec(customers=60, terminals=40, train_days=features.LOOKBACK_DAYS + 8,
                                    test_days=1, start_date="2018-01-01", seed=3)
    daily = tmp_path / "daily"
    simulator.generate(daily, spec)
    days = sorted((daily / "training").iterdir())
    history, training = days[:-4], days[-4:]
    (daily / "history").mkdir()
    for path in history:
        path.rename(daily / "history" / path.name)
    dump = shutil.copytree(daily, tmp_path / "dump")
    shutil.rmtree(dump / "history")
    (dump / "history").mkdir()
    frames = [pd.read_parquet(daily / "history" / p.name) for p in history]
    # named for no day: a file named for one day must be about it (dayfile.day_of)
    pd.concat(frames, ignore_index=True).to_parquet(dump / "history" / "dump.parquet", index=False)
    for root in (daily, dump):
        write_manifest(root)
    first = f"training/{training[0].name}"
    assert (pd.Timestamp(training[0].stem) - pd.Timestamp(history[0].stem)).days > features.LOOKBACK_DAYS
    got, want = Dataset(dump).compute_features(first), Dataset(daily).compute_features(first)
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_the_share_holds_datasets_and_output_side_by_side(tmp_path: Path) -> None:
    """The layout DESIGN.md names (/mnt/share/datasets/<name>, /mnt/share/output/<run>), in one place."""
    from workload.share.paths import share_paths

    assert share_paths(tmp_path) == (tmp_path / "datasets", tmp_path / "output")
    assert share_paths(str(tmp_path)) == (tmp_path / "datasets", tmp_path / "output")  # type: ignore[arg-type]


def test_run_records_live_in_runs_beside_them(tmp_path: Path) -> None:
    """Every share already written keeps its run records in runs/ (docs/architecture.md): a renamed folder would
    leave a later `pulumi up`'s loader blind to every run seeded before it."""
    from workload.share.paths import runs_dir

    assert runs_dir(tmp_path) == tmp_path / "runs"
    assert runs_dir(str(tmp_path)) == tmp_path / "runs"  # type: ignore[arg-type]


# -- a day sent twice under new IDs (check_not_resent), on the rows' hashes as RowHashes.of makes them --------------
def _hashes(*spans: tuple[int, int]) -> np.ndarray:
    """Row hashes as RowHashes.of gives them (unique, sorted, uint64), from half-open spans of stand-in values."""
    return np.unique(np.concatenate([np.arange(a, b, dtype=np.uint64) for a, b in spans]))


def _resent_message(later: str, n: int, earlier: str, smaller: int) -> str:
    return (f"{later} repeats {n} transactions of {earlier} (same card, terminal, time and amount) under other "
            f"transaction IDs ({n} of {smaller} rows, {100 * n / smaller:.1f} %; a day repeating 50% or more of "
            "another is refused): a day sent twice would be learned twice; remove one of them")


# Each case: the files' row hashes (in manifest order), their row counts, and the refusal (None: accepted).
# Names are the user's ("bank/x.csv"), unlike the keys ("training/x"): the message must use the names.
RESENT_CASES = {
    "one file": ({"a": _hashes((0, 100))}, {"a": 100}, None),
    "two files, nothing shared": ({"a": _hashes((0, 100)), "b": _hashes((100, 200))}, {"a": 100, "b": 100}, None),
    "half the smaller day shared: re-sent": (
        {"a": _hashes((0, 100)), "b": _hashes((50, 150))}, {"a": 100, "b": 100}, ("b", 50, "a")),
    "one row short of half: a coincidence": (
        {"a": _hashes((0, 100)), "b": _hashes((51, 151))}, {"a": 100, "b": 100}, None),
    "the smaller day sets the share": (
        {"a": _hashes((0, 1000)), "b": _hashes((980, 1010))}, {"a": 1000, "b": 30}, ("b", 20, "a")),
    "below the floor of 20 rows, even all of a small day": (
        {"a": _hashes((0, 1000)), "b": _hashes((981, 1000))}, {"a": 1000, "b": 19}, None),
    "the floor reached by a small day": (
        {"a": _hashes((0, 20)), "b": _hashes((0, 20))}, {"a": 20, "b": 20}, ("b", 20, "a")),
    "counted against the file's rows, not its distinct rows": (
        {"a": _hashes((0, 100)), "b": _hashes((70, 130))}, {"a": 100, "b": 130}, None),
    "the later file named as the copy, whatever the values' order": (
        {"b": _hashes((500, 540)), "a": _hashes((0, 10), (500, 530))}, {"b": 40, "a": 40}, ("a", 30, "b")),
    "three files: the pair that shares, though the third holds some of its rows": (
        {"a": _hashes((0, 40)), "b": _hashes((15, 25), (1000, 1030)), "c": _hashes((5, 35))},
        {"a": 40, "b": 40, "c": 30}, ("c", 30, "a")),
    "a row in three files counts for each pair: c repeats 60 of a's 100, b only 40": (
        {"a": _hashes((0, 100)), "b": _hashes((0, 40), (1000, 1060)), "c": _hashes((0, 60), (2000, 2040))},
        {"a": 100, "b": 100, "c": 100}, ("c", 60, "a")),
    "rows shared by four files, none past the threshold": (
        {k: _hashes((0, 19), (1000 * (i + 1), 1000 * (i + 1) + 40)) for i, k in enumerate("abcd")},
        dict.fromkeys("abcd", 59), None),
    "three copies: the second named first, as the copy of the first": (
        {"a": _hashes((0, 30)), "b": _hashes((0, 30)), "c": _hashes((0, 30))}, {"a": 30, "b": 30, "c": 30},
        ("b", 30, "a")),
}


def test_a_near_miss_from_30_percent_is_warned_of_with_the_threshold() -> None:
    """48.9 % of a day re-sent under new IDs was published without a word: from RESENT_NEAR it is warned of."""
    from workload.data.rules import check_not_resent
    names = {"a": "bank/a.csv", "b": "bank/b.csv"}
    assert check_not_resent({"a": _hashes((0, 100)), "b": _hashes((71, 171))}, names, {"a": 100, "b": 100}) == []
    assert check_not_resent({"a": _hashes((0, 100)), "b": _hashes((70, 170))}, names, {"a": 100, "b": 100}) == [
        "bank/b.csv repeats 30 transactions of bank/a.csv (same card, terminal, time and amount) under other IDs (30 "
        "of 100 rows, 30.0 %; refused from 50%): check it is not the same day sent again"]


@pytest.mark.parametrize("case", list(RESENT_CASES))
def test_a_day_repeating_anothers_rows_under_new_ids_is_refused_past_its_threshold(case: str) -> None:
    """Refused when two days share at least max(RESENT_MIN_ROWS, RESENT_SHARE x the smaller day's rows)
    rows; the message names the later file as the copy of the earlier, by the user's names."""
    from workload.data.rules import RESENT_MIN_ROWS, RESENT_SHARE, check_not_resent
    assert (RESENT_SHARE, RESENT_MIN_ROWS) == (0.5, 20)  # the cases' thresholds
    rows, sizes, refusal = RESENT_CASES[case]
    names = {rel: f"bank/{rel}.csv" for rel in rows}
    if refusal is None:
        check_not_resent(rows, names, sizes)
        return
    later, n, earlier = refusal
    with pytest.raises(DatasetError) as err:
        check_not_resent(rows, names, sizes)
    assert str(err.value) == _resent_message(names[later], n, names[earlier], min(sizes[later], sizes[earlier]))


def test_a_renumbered_copy_of_a_day_is_refused_by_its_rows_not_its_ids(tmp_path: Path, dataset_src: Path) -> None:
    """Through the manifest's checks: the rows' card, terminal, time and amount make a row's identity;
    its ID and its position in the file do not. A cent's difference is another transaction."""
    root = _copy(dataset_src, tmp_path / "d")
    original = pd.read_parquet(root / "training" / "2018-04-03.parquet")
    copy = original.assign(TRANSACTION_ID=original[schema.TRANSACTION_ID] + 10**9).iloc[::-1]
    copy.to_csv(root / "training" / "2018-04-03b.csv", index=False)
    with pytest.raises(DatasetError) as err:
        write_manifest(root)
    assert str(err.value) == _resent_message("training/2018-04-03b.csv", len(original),
                                             "training/2018-04-03.parquet", len(original))
    copy.assign(TX_AMOUNT=copy[schema.TX_AMOUNT] + 0.01).to_csv(root / "training" / "2018-04-03b.csv",
                                                                index=False)
    entries = write_manifest(root)
    assert "training/2018-04-03b.csv" in [e["path"] for e in entries]


def test_a_days_feature_inputs_are_its_windows_files_as_the_manifest_and_the_share_describe_them(
        tmp_path: Path, dataset_src: Path) -> None:
    """What the feature store records, and compares, for a day: each file its window reads, with the
    manifest's description and the share's size and modification time; a file gone, with why. These
    are the keys features stored by earlier releases were recorded with: renaming one would mark every
    stored day stale."""
    root = _copy(dataset_src, tmp_path / "d")
    write_manifest(root)
    manifest = {e["path"]: e for e in json.loads((root / MANIFEST).read_text())["files"]}
    window = ["training/2018-04-01.parquet", "training/2018-04-02.parquet", "training/2018-04-03.parquet"]
    described = ("path", "rows", "frauds", "first", "last", "start", "end")

    def expected(rel: str, seen: dict) -> dict:
        return {**{k: manifest[rel][k] for k in described}, **seen}

    def on_disk(rel: str) -> dict:
        st = (root / rel).stat()
        return {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns}

    got = Dataset(root).feature_inputs("training/2018-04-03.parquet")
    assert got == [expected(rel, on_disk(rel)) for rel in window]
    (root / window[0]).unlink()
    got = Dataset(root).feature_inputs("training/2018-04-03.parquet")
    assert got == [expected(window[0], {"missing": "No such file or directory"}),
                   *(expected(rel, on_disk(rel)) for rel in window[1:])]


def test_check_dataset_asks_for_the_roles_its_caller_requires() -> None:
    """score publishes scoring/ days alone (required=("scoring",)); seed needs training and testing.
    A caller requiring nothing still refuses a dataset with no day at all."""
    from workload.data.rules import RowHashes, check_dataset
    scoring = {"path": "scoring/2018-05-01.csv", "role": "scoring", "first": "2018-05-01", "last": "2018-05-01",
               "start": "2018-05-01T00:00:00+00:00", "end": "2018-05-01T23:00:00+00:00", "rows": 2, "frauds": 0}
    keys = {scoring["path"]: RowHashes(ids=np.array([1, 2]), rows=np.array([11, 12], dtype=np.uint64))}
    check_dataset([scoring], keys, "bank/", required=("scoring",))
    with pytest.raises(DatasetError, match=r"^bank/: no training/ files; a dataset has training/ and testing/"):
        check_dataset([scoring], keys, "bank/")
    with pytest.raises(DatasetError) as err:
        check_dataset([], {}, "bank/", required=())
    assert str(err.value) == "bank/: no day files in history/, training/, testing/, scoring/"


def _span(path: str, role: str, first: str, last: str | None = None) -> dict:
    last = last or first
    return {"path": path, "role": role, "first": first, "last": last, "start": f"{first}T00:00:00+00:00",
            "end": f"{last}T12:00:00+00:00", "rows": 1, "frauds": 0}


def test_training_after_the_first_testing_day_is_refused_naming_the_earliest_such_day() -> None:
    """Training on the first testing day itself is not refused here (the roles' overlap rule refuses it
    when they share an instant); a training day after it is, the earliest one named, by the user's name."""
    from workload.data.rules import check_training_before_testing
    tests = [_span("testing/b.csv", "testing", "2018-04-09"), _span("testing/a.csv", "testing", "2018-04-07")]
    check_training_before_testing([_span("training/x.csv", "training", "2018-04-07"), *tests])
    check_training_before_testing([_span("training/only.csv", "training", "2018-05-01")])  # nothing to test on
    late = [_span("training/z.csv", "training", "2018-04-11"),
            {**_span("training/y.csv", "training", "2018-04-08"), "source": {"uri": "gs://bank/exports/y.csv"}},
            _span("training/w.csv", "training", "2018-04-10")]
    with pytest.raises(DatasetError) as err:
        check_training_before_testing([_span("training/v.csv", "training", "2018-04-01"), *late, *tests])
    assert str(err.value) == ("gs://bank/exports/y.csv (2018-04-08) is after the first testing day 2018-04-07: "
                              "features and labels from after the test period would leak into training")


def test_the_manifest_records_how_its_files_are_read_unless_as_they_are(tmp_path: Path) -> None:
    from workload.data.manifest import save_manifest
    entry = _span("training/a.csv", "training", "2018-04-01")
    save_manifest(tmp_path, [entry], source="gs://bank/exports")
    assert json.loads((tmp_path / MANIFEST).read_text()) == {"source": "gs://bank/exports", "files": [entry]}
    reading = Reading(columns=(("card", schema.CUSTOMER_ID),), datetime_format="%d/%m/%Y %H:%M")
    save_manifest(tmp_path, [entry], source=None, reading=reading)
    assert json.loads((tmp_path / MANIFEST).read_text()) == {
        "source": None, "reading": {"columns": {"card": schema.CUSTOMER_ID}, "datetime_format": "%d/%m/%Y %H:%M"},
        "files": [entry]}


def test_a_hand_laid_dataset_reads_its_scoring_days_without_labels(tmp_path: Path, dataset_src: Path) -> None:
    """write_manifest and a worker's reads apply each role's rule: a scoring/ day may lack the label
    column (it reads as 0, never as a label), a training day may not."""
    root = _copy(dataset_src, tmp_path / "d")
    (root / "scoring").mkdir()
    tomorrow = read_transactions(root / "testing" / "2018-04-08.parquet")
    tomorrow = tomorrow.assign(TX_DATETIME=tomorrow[schema.TX_DATETIME] + pd.Timedelta(days=1),
                               TRANSACTION_ID=tomorrow[schema.TRANSACTION_ID] + 10**6)
    tomorrow.drop(columns=[schema.TX_FRAUD]).to_csv(root / "scoring" / "2018-04-09.csv", index=False)
    entries = write_manifest(root)
    assert entries[-1]["path"] == "scoring/2018-04-09.csv" and entries[-1]["frauds"] == 0
    got = Dataset(root).transactions("scoring/2018-04-09.csv")
    assert (got[schema.TX_FRAUD] == 0).all() and len(got) == len(tomorrow)
    tomorrow.drop(columns=[schema.TX_FRAUD]).to_csv(root / "training" / "2018-04-06.csv", index=False)
    (root / "training" / "2018-04-06.parquet").unlink()
    (root / "scoring" / "2018-04-09.csv").unlink()
    with pytest.raises(DatasetError, match=r"training/2018-04-06\.csv: missing column\(s\) \['TX_FRAUD'\]"):
        write_manifest(root)
    # A published training day read by a worker is held to its labels too (here: replaced since).
    (root / "training" / "2018-04-06.csv").unlink()
    tomorrow.assign(TX_DATETIME=tomorrow[schema.TX_DATETIME] - pd.Timedelta(days=3)).to_csv(
        root / "training" / "2018-04-06.csv", index=False)
    write_manifest(root)
    tomorrow.drop(columns=[schema.TX_FRAUD]).to_csv(root / "training" / "2018-04-06.csv", index=False)
    with pytest.raises(DatasetError, match=r"training/2018-04-06\.csv: missing column\(s\) \['TX_FRAUD'\]"):
        Dataset(root).transactions("training/2018-04-06.csv")
    with pytest.raises(DatasetError, match=r"missing column\(s\) \['TX_FRAUD'\]"):  # labels unless told otherwise
        read_transactions(root / "training" / "2018-04-06.csv")


def test_the_read_cache_keeps_at_most_its_rows_and_rereads_a_day_pushed_out(tmp_path: Path, dataset_src: Path) -> None:
    """Least recently read days go first, and the count of cached rows follows what goes: a day pushed
    out is read from the share again (here: gone from it), one still cached is not."""
    root = _copy(dataset_src, tmp_path / "d")
    write_manifest(root)
    days = [f"training/2018-04-0{i}.parquet" for i in range(1, 5)]
    rows = sorted(len(read_transactions(root / d)) for d in days)
    assert rows[-1] + rows[-2] < rows[0] + rows[1] + rows[2]
    data = Dataset(root, cache_rows=rows[-1] + rows[-2])  # any two days fit, no three do

    def gone(rel: str) -> bool:
        (root / rel).rename(root / "away.parquet")
        try:
            data.transactions(rel)
            return False
        except FileNotFoundError:
            return True
        finally:
            (root / "away.parquet").rename(root / rel)

    for d in days[:3]:
        data.transactions(d)
    assert gone(days[0]) and not gone(days[1]) and not gone(days[2])
    data.transactions(days[1])  # days[2] is now the least recently read
    data.transactions(days[3])
    assert gone(days[2]) and not gone(days[1]) and not gone(days[3])


def test_ensure_features_stores_training_and_testing_days_past_history_and_scoring_ones(
        tmp_path: Path, dataset_src: Path) -> None:
    """History days come first in time; they are skipped, not the end of the walk."""
    root = _copy(dataset_src, tmp_path / "d")
    (root / "history").mkdir()
    early = read_transactions(root / "training" / "2018-04-01.parquet")
    early.assign(TX_DATETIME=early[schema.TX_DATETIME] - pd.Timedelta(days=1),
                 TRANSACTION_ID=early[schema.TRANSACTION_ID] + 10**6).to_parquet(root / "history" / "a.parquet")
    write_manifest(root)
    assert Dataset(root).ensure_features() == (8, 0)
    assert Dataset(root).ensure_features() == (0, 8)


def test_a_partial_renumbered_resend_is_found_whatever_its_rows_positions(tmp_path: Path, dataset_src: Path) -> None:
    """RowHashes.of hashes the rows' values only: the last two thirds of a day, sent again renumbered, sit at
    other positions in their file than in the original and still match."""
    from workload.data.rules import RowHashes
    original = read_transactions(dataset_src / "training" / "2018-04-03.parquet")
    part = original.iloc[len(original) // 3:].assign(TRANSACTION_ID=lambda f: f[schema.TRANSACTION_ID] + 10**9)
    part = read_transactions(_written(tmp_path / "part.parquet", part))
    a, b = RowHashes.of(original), RowHashes.of(part)
    assert len(np.intersect1d(a.rows, b.rows)) == len(part)
    assert len(a.rows) == len(original)


def _written(path: Path, frame: pd.DataFrame) -> Path:
    frame.to_parquet(path, index=False)
    return path


def test_an_id_in_two_files_names_them_in_manifest_order_whatever_the_ids_order() -> None:
    """Real IDs come in any order; the file listed first in the manifest is named first (a sort that
    does not keep equal IDs in their files' order would swap them: 1000 shuffled IDs show it)."""
    from workload.data.rules import check_unique_ids
    rng = np.random.default_rng(4)  # numpy's default sort puts this duplicate's second file first
    first, second = rng.permutation(1000).astype(np.int64), (rng.permutation(1000) + 1000).astype(np.int64)
    second[-1] = first[500]
    names = {"training/a.parquet": "bank/a.csv", "testing/b.parquet": "bank/b.csv"}
    with pytest.raises(DatasetError) as err:
        check_unique_ids({"training/a.parquet": first, "testing/b.parquet": second}, names)
    assert str(err.value) == (f"TRANSACTION_ID {first[500]} is in both bank/a.csv and bank/b.csv; transaction IDs "
                              "must be unique across the dataset")
    check_unique_ids({}, names)
    check_unique_ids({"training/a.parquet": first}, names)


# -- a bank's columns (validate's column rules, _columns), as the column mapping names them ----------------------
BANK = Reading(columns=(("amount", schema.TX_AMOUNT), ("card", schema.CUSTOMER_ID), ("fraud", schema.TX_FRAUD),
                        ("secs", schema.TX_TIME_SECONDS)), timezone="UTC")


def _bank_day(dataset_src: Path) -> pd.DataFrame:
    frame = pd.read_parquet(dataset_src / "training/2018-04-02.parquet").iloc[:50]
    return frame.rename(columns={schema.TX_AMOUNT: "amount", schema.CUSTOMER_ID: "card", schema.TX_FRAUD: "fraud",
                                 schema.TX_TIME_SECONDS: "secs"})


def test_a_mapped_day_reads_under_the_schemas_names_its_extra_columns_named_as_ignored(dataset_src: Path) -> None:
    bank = _bank_day(dataset_src).assign(merchant_name="acme")
    got = validate(bank, "bank/d.csv", reading=BANK)
    assert list(got.columns) == list(schema.COLUMNS)
    canonical = pd.read_parquet(dataset_src / "training/2018-04-02.parquet").iloc[:50]
    pd.testing.assert_frame_equal(got, validate(canonical, "d.parquet"))
    assert got.attrs["ignored"] == ["merchant_name"]  # the simulator's known extras are read past, not named
    three = Reading(columns=BANK.columns[:3], timezone="UTC")
    assert validate(bank.drop(columns=["secs"]), "bank/d.csv", reading=three).attrs["ignored"] == ["merchant_name"]


@pytest.mark.parametrize(("change", "reading", "message"), [
    # A mapped optional column the file lacks: the mapping is wrong, named with what the file has.
    (lambda f: f.drop(columns=["secs"]), BANK,
     "bank/d.csv: column(s) ['secs'] of the column mapping (column mapping {amount->TX_AMOUNT, card->CUSTOMER_ID, "
     "fraud->TX_FRAUD, secs->TX_TIME_SECONDS}, datetime format ISO 8601, timezone UTC) are not in the file; it has "
     "['TRANSACTION_ID', 'TX_DATETIME', 'card', 'TERMINAL_ID', 'amount', 'TX_TIME_DAYS', 'fraud', "
     "'TX_FRAUD_SCENARIO']"),
    # ... listing at most 20 of the file's columns.
    (lambda f: f.drop(columns=["secs"]).assign(**{f"x{i:02}": 0 for i in range(20)}), BANK,
     "are not in the file; it has ['TRANSACTION_ID', 'TX_DATETIME', 'card', 'TERMINAL_ID', 'amount', 'TX_TIME_DAYS', "
     "'fraud', 'TX_FRAUD_SCENARIO', 'x00', 'x01', 'x02', 'x03', 'x04', 'x05', 'x06', 'x07', 'x08', 'x09', 'x10', "
     "'x11']"),
    # A mapped required column the file lacks: the required columns' rule, in the user's names.
    (lambda f: f.drop(columns=["amount"]), BANK,
     "bank/d.csv: missing column(s) ['amount']; a day needs ['TRANSACTION_ID', 'TX_DATETIME', 'card', 'TERMINAL_ID', "
     "'amount', 'fraud']"),
    (lambda f: f.drop(columns=["fraud"]), BANK,
     "bank/d.csv: missing column(s) ['fraud']; a day needs ['TRANSACTION_ID', 'TX_DATETIME', 'card', 'TERMINAL_ID', "
     "'amount', 'fraud'] (unlabelled days go in scoring/)"),
    (lambda f: f.drop(columns=["fraud", "amount"]), BANK,
     "bank/d.csv: missing column(s) ['amount', 'fraud']; a day needs ['TRANSACTION_ID', 'TX_DATETIME', 'card', "
     "'TERMINAL_ID', 'amount', 'fraud']"),
    (lambda f: f.assign(CUSTOMER_ID=1), BANK,
     "bank/d.csv: column(s) ['CUSTOMER_ID'] given twice (a mapped column and one of that name); map one, or drop "
     "the other"),
])
def test_a_mapped_days_column_problems_are_named_in_the_users_names(dataset_src: Path, change, reading: Reading,
                                                                     message: str) -> None:
    with pytest.raises(DatasetError) as err:
        validate(change(_bank_day(dataset_src)), "bank/d.csv", reading=reading)
    if message.startswith("bank/d.csv: "):  # the whole message
        assert str(err.value) == message
    else:
        assert str(err.value).startswith("bank/d.csv: ") and str(err.value).endswith(message), str(err.value)


def test_an_unlabelled_day_reads_its_empty_or_absent_label_as_integer_zero(dataset_src: Path) -> None:
    """A scoring day's label column may be absent or present and empty; it reads as 0 (int64, like a
    labelled day's), never as a label. A training day (validate's default) needs its labels."""
    bank = _bank_day(dataset_src)
    for frame in (bank.drop(columns=["fraud"]), bank.assign(fraud=np.nan)):
        got = validate(frame, "bank/d.csv", reading=BANK, labels=False)
        assert got[schema.TX_FRAUD].dtype == np.int64 and (got[schema.TX_FRAUD] == 0).all()
        with pytest.raises(DatasetError, match="missing column|has a missing value"):
            validate(frame, "bank/d.csv", reading=BANK)
    with pytest.raises(DatasetError, match=r"bank/d\.csv: missing column\(s\) \['amount'\]; a day needs \["
                                           r"'TRANSACTION_ID', 'TX_DATETIME', 'card', 'TERMINAL_ID', 'amount'\]$"):
        validate(bank.drop(columns=["fraud", "amount"]), "bank/d.csv", reading=BANK, labels=False)


def test_native_timestamps_are_read_as_they_are_whatever_format_is_declared(dataset_src: Path) -> None:
    """A declared format (epoch-s, a strftime pattern) is how text or numbers are read; a Parquet
    column already of timestamps needs none, and is not read as numbers."""
    frame = pd.read_parquet(dataset_src / "training/2018-04-02.parquet").iloc[:20]
    plain = validate(frame, "d.parquet")
    for fmt in ("epoch-s", "epoch-ms", "%d/%m/%Y %H:%M"):
        got = validate(frame, "d.parquet", reading=Reading(datetime_format=fmt))
        pd.testing.assert_frame_equal(got, plain)


@pytest.mark.parametrize(("value", "message"), [
    ("soon", "d.csv: column TX_DATETIME must hold numbers: row 4 has 'soon'"),
    (1e300, "d.csv: column TX_DATETIME has an unparseable timestamp 1e+300 (row 4); write timestamps in the "
            "declared format 'epoch-s' or in ISO 8601"),
])
def test_a_bad_epoch_is_refused_naming_its_row(dataset_src: Path, value, message: str) -> None:
    frame = pd.read_parquet(dataset_src / "training/2018-04-02.parquet").iloc[:20]
    seconds = (frame[schema.TX_DATETIME].astype("int64") // 10**9).astype(object)
    seconds.iloc[3] = value
    with pytest.raises(DatasetError) as err:
        validate(frame.assign(TX_DATETIME=seconds), "d.csv", reading=Reading(datetime_format="epoch-s"))
    assert str(err.value) == message


def test_a_dataset_reads_its_files_by_the_mapping_its_manifest_records(tmp_path: Path, dataset_src: Path) -> None:
    from workload.data.dayfile import describe
    from workload.data.manifest import save_manifest
    from workload.data.rules import RowHashes
    root = tmp_path / "d"
    (root / "training").mkdir(parents=True)
    bank = _bank_day(dataset_src)
    bank.to_csv(root / "training" / "d.csv", index=False)
    frame = validate(bank, "d.csv", reading=BANK)
    save_manifest(root, [describe(frame, "training/d.csv")], source=None, reading=BANK)
    assert RowHashes.of(frame).ids.tolist() == frame[schema.TRANSACTION_ID].tolist()
    data = Dataset(root)
    assert data.reading == BANK
    pd.testing.assert_frame_equal(data.transactions("training/d.csv"), frame)


def test_feature_windows_are_found_whatever_order_the_manifest_lists_files_in(tmp_path: Path,
                                                                              dataset_src: Path) -> None:
    """A manifest edited by hand, or written by an older release, need not be in time order: the files
    a day's window reads are found by their days, not their position."""
    root = _copy(dataset_src, tmp_path / "d")
    files = write_manifest(root)
    days = [f["path"] for f in files]
    expected = {rel: sorted(Dataset(root).feature_inputs(rel), key=lambda e: e["path"]) for rel in days}
    assert len(expected["testing/2018-04-08.parquet"]) == 8
    for order in (files[::-1], files[3:] + files[:3], files[1::2] + files[::2]):
        (root / MANIFEST).write_text(json.dumps({"source": None, "files": order}))
        data = Dataset(root)
        for rel in days:
            assert sorted(data.feature_inputs(rel), key=lambda e: e["path"]) == expected[rel], rel


def test_a_manifest_without_files_loads_and_has_nothing_to_train(tmp_path: Path) -> None:
    (tmp_path / MANIFEST).write_text(json.dumps({"source": None, "files": []}))
    data = Dataset(tmp_path)
    assert data.training_shards() == [] and data.files == []


def test_a_symbolic_link_named_like_a_day_is_refused_not_followed(tmp_path: Path, dataset_src: Path) -> None:
    link = tmp_path / "d.parquet"
    link.symlink_to(dataset_src / "training/2018-04-02.parquet")
    with pytest.raises(DatasetError) as err:
        read_transactions(link, "bank/d.parquet")
    assert str(err.value) == ("bank/d.parquet: a symbolic link; links are never followed, put the file itself in the "
                              "dataset")


def test_shared_reads_read_each_window_once_and_again_under_a_new_manifest(tmp_path: Path, dataset_src: Path) -> None:
    """A pack's runs of one window (runtime/packing.py) read it once: inside `shared_reads` equal reads give the same
    arrays, each file's features read once; outside it, and under a replaced manifest, every read reads."""
    root = _copy(dataset_src, tmp_path / "d")
    write_manifest(root)
    data = Dataset(root)
    window = [f"training/2018-04-0{d}.parquet" for d in (1, 2, 3)]
    with data.shared_reads():
        first = data.day_and_window(window)
        assert data.day_and_window(window) is first and data.examples(window[-1:]) is first[0]
        assert dict(data.reads) == dict.fromkeys(window, 1)
        np.testing.assert_array_equal(first[1].x[-len(first[0].x):], first[0].x)  # the day last in its window
        shorter, two = data.day_and_window(window[1:]), data.examples(window[:2])  # overlapping: no file read again
        assert dict(data.reads) == dict.fromkeys(window, 1)
        n1 = len(data.examples(window[:1]).x)
        np.testing.assert_array_equal(shorter[1].x, first[1].x[n1:])
        np.testing.assert_array_equal(two.x, first[1].x[:len(two.x)])
        (root / MANIFEST).write_text((root / MANIFEST).read_text() + "\n")  # replaced: another manifest
        assert data.refresh()
        assert data.day_and_window(window) is not first and dict(data.reads) == dict.fromkeys(window, 2)
    data.examples(window[:1])
    data.examples(window[:1])
    assert data.reads[window[0]] == 4 and data._shared is None
