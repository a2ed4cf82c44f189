"""Datasets on the share: ``datasets/<name>/{history,training,testing,scoring}/*.{parquet,csv}`` plus a manifest.

One file of transactions is read and checked here, whoever reads it (``seed`` before publishing,
workers before training), and so are the rules that span a whole dataset: transaction IDs unique
across all files, training and test days apart, how much history the features get.

The manifest (written when a dataset is published, see ``workload.data.publish``) records each file's
role, its first and last day and time, taken from ``TX_DATETIME`` (never from file names), where
it came from, and how its files are read (``workload.data.reading``: the user's column names, their
date format); workers pull feature history from earlier files through it. ``history/`` files only
feed feature windows: never trained on, never evaluated. ``scoring/`` files are unlabelled (the label
column absent or empty): featurised from the same history as the others, scored, never trained on.

Files come as real exports do, and are accepted as they are: rows in any order (a file is ordered
by ``TX_DATETIME``, ties by ``TRANSACTION_ID``), time-zone-aware timestamps (normalised to UTC),
integer columns typed as floats or text (converted when no value changes), columns in any order,
extra columns (left out of the features). Dates are never guessed: text that is not ISO 8601 needs a
declared format. What cannot be read so is refused with one line that names the user's file, the row
and the value.

Paths from queue items are validated here: they must stay inside the dataset folder, and pickle
is never read (a pickle on a shared read-write volume is remote code execution).
"""

from __future__ import annotations

import bisect
import io
import json
import logging
import os
import stat
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from workload.core.errors import ItemFault, is_infra
from workload.data import features, featurestore, schema
from workload.data.reading import AS_IS, EPOCHS, Reading
from workload.share.fsutil import atomic_write_text

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
HISTORY, TRAINING, TESTING, SCORING = "history", "training", "testing", "scoring"
ROLES = (HISTORY, TRAINING, TESTING, SCORING)  # the folders of a dataset; history/ and scoring/ are optional
REQUIRED_ROLES = (TRAINING, TESTING)
_PICKLE_SUFFIXES = {".pkl", ".pickle", ".p", ".joblib", ".npy", ".npz"}
_SEPARATORS = {";": "';'", "\t": "a tab", "|": "'|'"}
_NANOSECOND_TIMES = (pd.Timestamp.min.tz_localize("UTC"), pd.Timestamp.max.tz_localize("UTC"))  # what we store
_TIMESTAMP_EXAMPLES = "2018-04-01 00:00:31, 2018-04-01T00:00:31Z, 2018-04-01 00:00:31+02:00, 2018-04-01 00:00:31 UTC"
_DECLARE = "or declare the file's format (--datetime-format '%d/%m/%Y %H:%M', epoch-s, epoch-ms)"
# Rows of one day repeating another day's (same card, terminal, second and amount) under new IDs: a
# re-sent day. This share of the smaller day's rows (and at least this many) is no coincidence.
RESENT_SHARE, RESENT_MIN_ROWS = 0.5, 20
_ROW_KEY = (schema.CUSTOMER_ID, schema.TERMINAL_ID, schema.TX_DATETIME, schema.TX_AMOUNT)


class DatasetError(ItemFault, ValueError):
    """A dataset file or path that can never be trained on as it is (the item is dead-lettered)."""


def check_suffix(path: Path | str, where: str | None = None) -> None:
    """Refuse pickle and any file type but Parquet and CSV, by name, before a byte is read."""
    suffix = Path(path).suffix.lower()
    where = where or str(path)
    if suffix in _PICKLE_SUFFIXES:
        raise DatasetError(
            f"{where}: {suffix} files are never read (unpickling a file from a shared volume runs "
            f"arbitrary code); convert it to Parquet or CSV")
    if suffix not in schema.ALLOWED_SUFFIXES:
        raise DatasetError(f"{where}: unsupported file type {suffix!r}; allowed: {', '.join(schema.ALLOWED_SUFFIXES)}")


def _read_bytes(path: Path, where: str) -> bytes:
    """The file's bytes. OSError here is the storage's fault (retried); what the bytes hold is judged later.

    A FIFO or device named ``*.parquet`` would block a worker forever, and a symbolic link would read
    (and echo in errors) a file outside the dataset: only regular files are read, links never followed."""
    mode = os.lstat(path).st_mode
    if stat.S_ISLNK(mode):
        raise DatasetError(f"{where}: a symbolic link; links are never followed, put the file itself in the dataset")
    if not stat.S_ISREG(mode):
        raise DatasetError(f"{where}: not a regular file; a dataset holds Parquet or CSV files")
    return path.read_bytes()


def _shown(value: Any) -> str:
    """A value as the user wrote it: text quoted, numbers plain (never numpy's repr)."""
    return repr(value.item() if isinstance(value, np.generic) else value)


def one_line(exc: BaseException) -> str:
    """An exception's first line: messages stay one line, whatever a library says."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def labelled(rel: str) -> bool:
    """Whether dataset file `rel` must carry labels: every role's but scoring/'s."""
    return not rel.startswith(f"{SCORING}/")


def read_transactions(path: Path, where: str | None = None, reading: Reading = AS_IS,
                      labels: bool = True) -> pd.DataFrame:
    """Read, validate and order one file of the tutorial schema.

    `where` is the user's own name for the file (a gs:// URI, their local path): errors name it,
    not the copy on the share. Unreadable storage raises OSError; anything wrong with the bytes
    themselves raises DatasetError in one line. `labels` False (a scoring/ day): the label
    column may be absent or empty."""
    path = Path(path)
    where = where or str(path)
    check_suffix(path, where)
    data = _read_bytes(path, where)
    if not data:
        raise DatasetError(f"{where}: empty file (0 bytes); a day file holds a header and at least one transaction")
    csv = path.suffix.lower() == ".csv"
    try:
        frame = pd.read_csv(io.BytesIO(data)) if csv else pq.read_table(io.BytesIO(data)).to_pandas()
    except Exception as exc:  # noqa: BLE001 - whatever the parser says, these bytes will never parse
        kind = "CSV" if csv else "Parquet"
        raise DatasetError(f"{where}: not a readable {kind} file ({one_line(exc)})") from None
    if csv and len(frame.columns) == 1 and len(schema.COLUMNS) > 1:
        header = str(frame.columns[0])
        seen = next((name for sep, name in _SEPARATORS.items() if sep in header), None)
        hint = f"it looks separated by {seen}" if seen else "no ',' in the header"
        raise DatasetError(f"{where}: read a single column {header[:80]!r} ({hint}); "
                           f"CSV files must be comma-separated with the columns {','.join(schema.COLUMNS)}")
    if frame.empty:
        what = "a header but no rows" if csv else "no rows"
        raise DatasetError(f"{where}: the file has {what}; a day file holds at least one transaction")
    return validate(frame, where, first_line=2 if csv else None, reading=reading, labels=labels)


def _position(first_line: int | None) -> Callable[[int], str]:
    """How a user finds row i of their file: the line in a CSV (header on line 1), else the row."""
    if first_line is None:
        return lambda i: f"row {i + 1}"
    return lambda i: f"line {i + first_line}"


def _numbers(values: pd.Series, column: str, where: str, at: Callable[[int], str]) -> pd.Series:
    """`values` as numbers; text columns are converted, and the first text that is no number is shown.

    Numbers (booleans too) come back as they are: `validate` checks that an integer column's values are whole."""
    if pd.api.types.is_datetime64_any_dtype(values) or pd.api.types.is_timedelta64_dtype(values):
        raise DatasetError(f"{where}: column {column} must hold numbers, saw dtype {values.dtype}")
    converted = pd.to_numeric(values, errors="coerce")
    bad = np.flatnonzero(converted.isna().to_numpy())
    if len(bad):
        i = int(bad[0])
        raise DatasetError(f"{where}: column {column} must hold numbers: {at(i)} has {_shown(values.iloc[i])}")
    return converted


def _parse_text(values: pd.Series, fmt: str | None) -> pd.Series:
    """Text timestamps in the declared format, else ISO 8601 (BigQuery's " UTC" suffix read as an
    offset); NaT where neither fits. pandas is never asked to infer a format: it would guess."""
    text = values.astype(str).str.strip().str.replace(r" UTC$", "+00:00", regex=True)
    parsed = pd.to_datetime(text, format="ISO8601", utc=True, errors="coerce")
    if fmt:
        declared = pd.to_datetime(text, format=fmt, utc=True, errors="coerce")
        parsed = declared.where(declared.notna(), parsed)
    return parsed


def _timestamps(values: pd.Series, where: str, at: Callable[[int], str], fmt: str | None = None) -> pd.Series:
    """Timestamps in UTC without a zone; naive ones are taken as UTC, aware ones (Z, +02:00, UTC) converted."""
    column = schema.TX_DATETIME
    if pd.api.types.is_datetime64_any_dtype(values):
        parsed = pd.to_datetime(values, utc=True)
    elif fmt in EPOCHS:
        numbers = _numbers(values, column, where, at)
        parsed = pd.to_datetime(numbers, unit=EPOCHS[fmt], utc=True, errors="coerce")
    elif pd.api.types.is_numeric_dtype(values):  # booleans too
        raise DatasetError(f"{where}: column {column} holds numbers ({at(0)}: {_shown(values.iloc[0])}); "
                           f"it must hold timestamps such as {_TIMESTAMP_EXAMPLES}, {_DECLARE}")
    else:
        parsed = _parse_text(values, fmt)
    bad = np.flatnonzero(~parsed.between(*_NANOSECOND_TIMES).to_numpy())
    if len(bad):  # unparseable (NaT), or beyond what nanoseconds hold (an export's "never", 9999-12-31)
        i = int(bad[0])
        what = "an unparseable" if pd.isna(parsed.iloc[i]) else "an out-of-range"
        allowed = (f"in the declared format {fmt!r} or in ISO 8601" if fmt
                   else f"such as {_TIMESTAMP_EXAMPLES}, {_DECLARE}")
        raise DatasetError(f"{where}: column {column} has {what} timestamp {_shown(values.iloc[i])} ({at(i)}); "
                           f"write timestamps {allowed}")
    return parsed.dt.tz_convert(None).astype("datetime64[ns]")


def _columns(frame: pd.DataFrame, where: str, reading: Reading, labels: bool) -> pd.DataFrame:
    """`frame` under the schema's names (the user's mapped), required columns checked; extras named
    in ``attrs["ignored"]``. Unlabelled: the label column absent, or present with no value at all."""
    renames = reading.renames()
    absent = [src for src, dst in renames.items() if src not in frame.columns and dst not in schema.COLUMNS]
    if absent:
        raise DatasetError(f"{where}: column(s) {absent} of the column mapping ({reading.describe()}) are not in the "
                           f"file; it has {[str(c) for c in frame.columns][:20]}")
    frame = frame.rename(columns=renames)
    twice = sorted({str(c) for c in frame.columns[frame.columns.duplicated()]})
    if twice:
        raise DatasetError(f"{where}: column(s) {twice} given twice (a mapped column and one of that name); "
                           "map one, or drop the other")
    if not labels and schema.TX_FRAUD in frame.columns and frame[schema.TX_FRAUD].isna().all():
        frame = frame.drop(columns=[schema.TX_FRAUD])
    required = [c for c in schema.COLUMNS if labels or c != schema.TX_FRAUD]
    missing = [reading.source_of(c) for c in required if c not in frame.columns]
    if missing:
        need = [reading.source_of(c) for c in required]
        label_only = labels and missing == [reading.source_of(schema.TX_FRAUD)]
        raise DatasetError(f"{where}: missing column(s) {missing}; a day needs {need}"
                           + (" (unlabelled days go in scoring/)" if label_only else ""))
    frame.attrs["ignored"] = sorted(str(c) for c in frame.columns if c not in schema.KNOWN)
    return frame


def _integers(numbers: pd.Series, values: pd.Series, column: str, where: str, at: Callable[[int], str]) -> np.ndarray:
    """An integer column as int64: whole numbers below 2**63, or refused naming the first that is not."""
    if pd.api.types.is_integer_dtype(numbers):
        return numbers.to_numpy(dtype=np.int64)
    real = numbers.to_numpy(dtype=np.float64)  # whole and below 2**63, or refused
    lossy = ~np.isfinite(real) | (np.floor(real) != real) | (np.abs(real) >= 2.0**63)
    if lossy.any():
        i = int(np.flatnonzero(lossy)[0])
        raise DatasetError(f"{where}: column {column} must hold integers: {at(i)} has {_shown(values.iloc[i])}")
    return real.astype(np.int64)


def validate(frame: pd.DataFrame, where: str, first_line: int | None = None, reading: Reading = AS_IS,
             labels: bool = True) -> pd.DataFrame:
    """The schema's columns with their kinds, ordered by time then transaction ID; DatasetError otherwise.

    `first_line` is the file line of the first row in a CSV (so messages say "line N"), None for Parquet.
    Columns are named as the user named them (`reading`); an unlabelled day's TX_FRAUD reads as 0."""
    at = _position(first_line)
    frame = _columns(frame, where, reading, labels)
    if frame.empty:
        raise DatasetError(f"{where}: the file has no rows; a day file holds at least one transaction")
    out = pd.DataFrame(index=range(len(frame)))
    for column, kind in schema.COLUMNS.items():
        if column not in frame.columns:  # the label of an unlabelled day: never read as one
            out[column] = np.zeros(len(frame), dtype=np.int64)
            continue  # (the label is the last column of schema.COLUMNS)
        values = frame[column].reset_index(drop=True)
        name = reading.source_of(column)
        if values.isna().any():
            row = int(np.flatnonzero(values.isna().to_numpy())[0])
            raise DatasetError(f"{where}: column {name} has a missing value ({at(row)}); none are allowed")
        if kind == "datetime":
            out[column] = _timestamps(values, where, at, reading.datetime_format)
            continue
        numbers = _numbers(values, name, where, at)
        if kind == "int":
            out[column] = _integers(numbers, values, name, where, at)
            continue
        real = numbers.to_numpy(dtype=np.float64)
        if not np.isfinite(real).all():
            i = int(np.flatnonzero(~np.isfinite(real))[0])
            raise DatasetError(f"{where}: column {name} has a non-finite value "
                               f"({at(i)}: {_shown(values.iloc[i])}); amounts must be finite")
        out[column] = real
    _check_values(out, frame, where, at, reading)
    # Real exports come in any order within a day; the features need time order, and ties in time
    # need one order whoever reads the file: by transaction ID.
    out = out.sort_values([schema.TX_DATETIME, schema.TRANSACTION_ID], kind="stable", ignore_index=True)
    out.attrs["ignored"] = frame.attrs["ignored"]
    return out


def _check_values(out: pd.DataFrame, frame: pd.DataFrame, where: str, at: Callable[[int], str],
                  reading: Reading) -> None:
    """Amounts >= 0, labels 0 or 1, IDs unique within the file."""
    negative = np.flatnonzero(out[schema.TX_AMOUNT].to_numpy() < 0)
    if len(negative):
        i = int(negative[0])
        raise DatasetError(f"{where}: column {reading.source_of(schema.TX_AMOUNT)} has negative amounts ({at(i)}: "
                           f"{out[schema.TX_AMOUNT].iloc[i]}); amounts must be >= 0")
    not_label = np.flatnonzero(~out[schema.TX_FRAUD].isin([0, 1]).to_numpy())
    if len(not_label):
        i = int(not_label[0])
        raise DatasetError(f"{where}: column {reading.source_of(schema.TX_FRAUD)} must be 0 or 1: {at(i)} has "
                           f"{_shown(frame[schema.TX_FRAUD].iloc[i])}")
    ids = np.sort(out[schema.TRANSACTION_ID].to_numpy())
    twice = np.flatnonzero(np.diff(ids) == 0)
    if len(twice):
        raise DatasetError(f"{where}: {reading.source_of(schema.TRANSACTION_ID)} {ids[twice[0]]} appears more than "
                           "once; transaction IDs must be unique across the dataset")


# -- the files of a dataset ----------------------------------------------------------------------
def describe(frame: pd.DataFrame, rel: str) -> dict[str, Any]:
    """The manifest entry of a validated file: role, first and last day and instant, counts."""
    when = frame[schema.TX_DATETIME]
    return {"path": rel, "role": rel.split("/")[0], "first": str(when.min().date()), "last": str(when.max().date()),
            "start": when.min().isoformat(), "end": when.max().isoformat(), "rows": len(frame),
            "frauds": int(frame[schema.TX_FRAUD].sum())}


def source_name(entry: dict[str, Any]) -> str:
    """The user's name for a manifest file: where it was copied from, else its path in the dataset."""
    return (entry.get("source") or {}).get("uri") or entry["path"]


def read_ids(path: Path, where: str, reading: Reading = AS_IS) -> np.ndarray:
    """Only the TRANSACTION_ID column of a published file (whole-dataset checks need no more)."""
    if path.suffix.lower() == ".parquet":
        try:
            return pq.read_table(io.BytesIO(_read_bytes(path, where)), columns=[
                reading.source_of(schema.TRANSACTION_ID)]).column(0).to_numpy().astype(np.int64)
        except (ValueError, KeyError, TypeError):
            pass  # typed differently than we write it: the full read converts it
    return read_transactions(path, where, reading, labelled(path.parent.name + "/"))[schema.TRANSACTION_ID].to_numpy()


@dataclass(frozen=True)
class Keys:
    """What the rules spanning a dataset need of one file: its IDs, and a hash of each row's card,
    terminal, second and amount (a re-sent day repeats those under new IDs)."""

    ids: np.ndarray
    rows: np.ndarray

    @classmethod
    def of(cls, frame: pd.DataFrame) -> Keys:
        rows = pd.util.hash_pandas_object(frame[list(_ROW_KEY)], index=False).to_numpy()
        return cls(ids=frame[schema.TRANSACTION_ID].to_numpy(), rows=np.unique(rows))


def check_not_resent(rows: dict[str, np.ndarray], names: dict[str, str], sizes: dict[str, int]) -> None:
    """No day repeats another day's transactions under new IDs (an export re-sent, renumbered): it
    would be trained on twice, or tested on after training. A handful of equal rows is coincidence.

    A row in several files counts for every pair of them (a day sent three times, or a re-sent day
    that another day partly repeats, is still measured against each file it repeats)."""
    if len(rows) < 2:
        return
    rels = list(rows)
    values = np.concatenate([rows[r] for r in rels])
    owner = np.repeat(np.arange(len(rels)), [len(rows[r]) for r in rels])
    order = np.lexsort((owner, values))  # equal rows together, their files in manifest order
    v, o = values[order], owner[order]
    starts = np.flatnonzero(np.r_[True, v[1:] != v[:-1]])
    lengths = np.diff(np.r_[starts, len(v)])
    earlier, later = [], []
    for length in np.unique(lengths[lengths > 1]):  # rows in `length` files: each pair of those files
        files = o[starts[lengths == length][:, None] + np.arange(length)]
        i, j = np.triu_indices(length, 1)
        earlier.append(files[:, i].ravel())
        later.append(files[:, j].ravel())
    if not earlier:
        return
    pairs, counts = np.unique(np.stack([np.concatenate(earlier), np.concatenate(later)]), axis=1,
                              return_counts=True)
    for (a, b), n in zip(pairs.T, counts, strict=True):
        smaller = min(sizes[rels[a]], sizes[rels[b]])
        if n >= max(RESENT_MIN_ROWS, RESENT_SHARE * smaller):
            raise DatasetError(f"{names[rels[b]]} repeats {n} transactions of {names[rels[a]]} (same card, terminal, "
                               "time and amount) under other transaction IDs: a day sent twice would be learned "
                               "twice; remove one of them")


def check_unique_ids(ids: dict[str, np.ndarray], names: dict[str, str]) -> None:
    """Transaction IDs unique across the whole dataset: a duplicate would be trained on twice, or
    tested on after training, and dropping one silently loses a row. Names the two files."""
    if not ids:
        return
    rels = list(ids)
    values = np.concatenate([ids[r] for r in rels])
    owner = np.repeat(np.arange(len(rels)), [len(ids[r]) for r in rels])
    order = np.argsort(values, kind="stable")
    same = np.flatnonzero(np.diff(values[order]) == 0)
    if len(same):
        a, b = order[same[0]], order[same[0] + 1]
        raise DatasetError(f"{schema.TRANSACTION_ID} {values[a]} is in both {names[rels[owner[a]]]} and "
                           f"{names[rels[owner[b]]]}; transaction IDs must be unique across the dataset")


def check_roles_apart(entries: list[dict[str, Any]]) -> None:
    """No instant belongs to two roles: a day both trained on (or used as history) and evaluated
    would score the model on what it saw. Files of different roles must not overlap in time."""
    spans = sorted(((pd.Timestamp(e["start"]), pd.Timestamp(e["end"]), e) for e in entries if "start" in e),
                   key=lambda s: (s[0], s[1]))
    for i, (_, end, a) in enumerate(spans):
        for other_start, _, b in spans[i + 1:]:
            if other_start > end:
                break
            if a["role"] != b["role"]:
                raise DatasetError(
                    f"{source_name(b)} ({b['role']}, {b['first']}..{b['last']}) overlaps {source_name(a)} "
                    f"({a['role']}, {a['first']}..{a['last']}) in time; a day is history, training, "
                    "testing or scoring, never two of them")


def check_layout(entries: list[dict[str, Any]], where: str, required: tuple[str, ...] = REQUIRED_ROLES) -> None:
    for role in required:
        if not any(e["role"] == role for e in entries):
            raise DatasetError(f"{where}: no {role}/ files; a dataset has {TRAINING}/ and {TESTING}/ folders of "
                               f"Parquet or CSV files (and optionally {HISTORY}/ for feature history, {SCORING}/ for "
                               "unlabelled days to score)")
    if not entries:
        raise DatasetError(f"{where}: no day files in {'/, '.join(ROLES)}/")


def history_shortfall(entries: list[dict[str, Any]]) -> str | None:
    """A warning when the first training or test days' feature windows reach before the first day
    the dataset has; None when every one gets its full LOOKBACK_DAYS."""
    if not entries:
        return None
    first_available = min(pd.Timestamp(e["first"]) for e in entries)
    targets = sorted(pd.Timestamp(e["first"]) for e in entries if e["role"] in (TRAINING, TESTING))
    want = features.LOOKBACK_DAYS
    short = [t for t in targets if (t - first_available).days < want]
    if not short:
        return None
    have = (targets[0] - first_available).days
    return (f"features look back {want} days (features.LOOKBACK_DAYS), but the first training/test day "
            f"{targets[0].date()} has {have} day(s) of history before it: {len(short)} training/test file(s) "
            f"get shortened feature windows; put earlier days in {HISTORY}/ to give them full history")


def check_training_before_testing(entries: list[dict[str, Any]]) -> None:
    """No training day after the first testing day: its features and labels would carry what
    happened during the test period into the model that is tested on it."""
    tests = [e["first"] for e in entries if e["role"] == TESTING]
    late = sorted((e for e in entries if e["role"] == TRAINING and tests and e["first"] > min(tests)),
                  key=lambda e: e["first"])
    if late:
        raise DatasetError(f"{source_name(late[0])} ({late[0]['first']}) is after the first testing day {min(tests)}: "
                           "features and labels from after the test period would leak into training")


def check_dataset(entries: list[dict[str, Any]], keys: dict[str, Keys], where: str,
                  required: tuple[str, ...] = REQUIRED_ROLES) -> None:
    """Every rule that spans the files of one dataset."""
    check_layout(entries, where, required)
    check_roles_apart(entries)
    check_training_before_testing(entries)
    names = {e["path"]: source_name(e) for e in entries}
    check_unique_ids({rel: k.ids for rel, k in keys.items()}, names)
    check_not_resent({e["path"]: keys[e["path"]].rows for e in entries if e["path"] in keys}, names,
                     {e["path"]: e["rows"] for e in entries})


def read_manifest(root: Path) -> dict[str, Any]:
    path = root / MANIFEST
    try:
        data = json.loads(path.read_text())
        if not isinstance(data.get("files"), list):
            raise KeyError("files")
    except FileNotFoundError as exc:
        raise DatasetError(f"{path}: missing; run `python -m workload seed` to lay the dataset out") from exc
    except (ValueError, KeyError, AttributeError) as exc:
        raise DatasetError(f"{path}: unreadable manifest ({exc}); run seed again") from exc
    return data


def save_manifest(root: Path, entries: Iterable[dict[str, Any]], source: str | None,
                  reading: Reading = AS_IS) -> None:
    """The manifest is the publishing point: a file not in it does not exist for workers."""
    order = {role: i for i, role in enumerate(ROLES)}
    files = sorted(entries, key=lambda e: (order[e["role"]], e["first"], e["path"]))
    record = {"source": source, **({"reading": reading.record()} if reading != AS_IS else {}), "files": files}
    atomic_write_text(root / MANIFEST, json.dumps(record, indent=1) + "\n")


def manifest_reading(manifest: dict[str, Any]) -> Reading:
    """How the files of a published dataset are read (the default for manifests that record none)."""
    return Reading.from_record(manifest.get("reading"))


def write_manifest(root: Path) -> list[dict[str, Any]]:
    """Validate a dataset folder laid out by hand or by the simulator, in place, and record it.

    (``seed`` publishes through ``workload.data.publish``, which also records where files came from.)"""
    entries, keys = [], {}
    for role in ROLES:
        folder = root / role
        if not folder.is_dir():
            continue
        for path in sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")):
            rel = f"{role}/{path.name}"
            frame = read_transactions(path, labels=labelled(rel))
            entries.append(describe(frame, rel))
            keys[rel] = Keys.of(frame)
    check_dataset(entries, keys, str(root))
    save_manifest(root, entries, source=None)
    return entries


@dataclass(frozen=True)
class Examples:
    """Model inputs for a set of transactions: features, labels, each row's day and card, and whether
    the card was already known compromised (a fraud confirmed by the row's time minus the delay)."""

    x: np.ndarray  # float32 [n, len(features.FEATURE_NAMES)]
    y: np.ndarray  # float32 [n]
    day: np.ndarray  # datetime64[D] [n]
    card: np.ndarray  # int64 [n]: CUSTOMER_ID
    known: np.ndarray  # bool [n]
    ids: np.ndarray  # int64 [n]: each row's TRANSACTION_ID (what `score` writes next to the score)

    @classmethod
    def concat(cls, parts: list[dict[str, np.ndarray]]) -> Examples:
        if len(parts) == 1:
            return cls(**parts[0])
        return cls(**{k: np.concatenate([p[k] for p in parts]) for k in ("x", "y", "day", "card", "known", "ids")})


class Dataset:
    """A validated dataset folder. Reads are cached per process (consecutive shards share history),
    up to `cache_rows` transactions (~80 bytes each in memory)."""

    def __init__(self, root: Path, cache_rows: int = 10_000_000) -> None:
        self.root = Path(root)
        self._cache: OrderedDict[str, pd.DataFrame] = OrderedDict()
        self._cache_rows = cache_rows
        self._cached_rows = 0
        self._load()

    def _load(self) -> None:
        manifest = read_manifest(self.root)
        self.files: list[dict[str, Any]] = manifest["files"]
        self.reading = manifest_reading(manifest)
        self._by_path = {f["path"]: f for f in self.files}
        # Files by first day, for windows found by bisection: a day's cost must not grow with the days
        # before it (years of daily files).
        self._by_first = sorted(range(len(self.files)), key=lambda i: self.files[i]["first"])
        self._firsts = [self.files[i]["first"] for i in self._by_first]
        self._longest = max(((pd.Timestamp(f["last"]) - pd.Timestamp(f["first"])).days for f in self.files), default=0)
        self._test: Examples | None = None
        self._skipped: set[str] = set()

    def _overlapping(self, start: pd.Timestamp, last: pd.Timestamp) -> list[dict[str, Any]]:
        """The files with a day in [start, last], in manifest order."""
        lo = bisect.bisect_left(self._firsts, str((start - pd.Timedelta(days=self._longest)).date()))
        hi = bisect.bisect_right(self._firsts, str(last.date()))
        hits = sorted(i for i in self._by_first[lo:hi] if pd.Timestamp(self.files[i]["last"]) >= start)
        return [self.files[i] for i in hits]

    def training_shards(self) -> list[str]:
        """Training files in chronological order of their first transaction."""
        train = [f for f in self.files if f["role"] == TRAINING]
        return [f["path"] for f in sorted(train, key=lambda f: (f["first"], f["last"], f["path"]))]

    def resolve(self, rel: str) -> Path:
        """The file a queue item names, refused unless it is a manifest file inside the dataset folder."""
        root = self.root.resolve()
        candidate = (root / rel).resolve()
        if Path(rel).is_absolute() or not candidate.is_relative_to(root):
            raise DatasetError(f"item path {rel!r} is outside the datasets folder {root}; refused")
        check_suffix(candidate)
        if rel not in self._by_path:
            self._load()  # days are appended while workers run: a new day's item may outrun our manifest
        if rel not in self._by_path:
            raise DatasetError(f"item path {rel!r} is not a file of the dataset manifest {root / MANIFEST}")
        return candidate

    def _read(self, rel: str) -> pd.DataFrame:
        if rel in self._cache:
            self._cache.move_to_end(rel)
            return self._cache[rel]
        path = self.resolve(rel)
        source = source_name(self._by_path[rel])
        where = f"{path} (from {source})" if source != rel else str(path)
        frame = read_transactions(path, where, self.reading, labelled(rel))
        self._cache[rel] = frame
        self._cached_rows += len(frame)  # kept, not summed: a read must not cost more with every day cached
        while len(self._cache) > 1 and self._cached_rows > self._cache_rows:
            self._cached_rows -= len(self._cache.popitem(last=False)[1])
        return frame

    def transactions(self, rel: str) -> pd.DataFrame:
        """Dataset file `rel`, read and validated (time order, ties by ID); cached like every read."""
        return self._read(rel)

    def _window(self, targets: list[str]) -> tuple[pd.DataFrame, np.ndarray]:
        """Target files' rows plus LOOKBACK_DAYS of earlier days, sorted; and the mask of target rows.

        Transaction IDs are unique across the dataset (checked when it was published), so files
        never share a row and none is dropped here."""
        for t in targets:
            self.resolve(t)  # refuses paths outside the manifest; reloads it for a day appended since
        first = min(pd.Timestamp(self._by_path[t]["first"]) for t in targets)
        last = max(pd.Timestamp(self._by_path[t]["last"]) for t in targets)
        start = first - pd.Timedelta(days=features.LOOKBACK_DAYS)
        parts = []
        for f in self._overlapping(start, last):  # every target is in it: its days are within [first, last]
            is_target = f["path"] in targets
            try:
                frame = self._read(f["path"])
            except (OSError, DatasetError) as exc:
                if is_target or is_infra(exc):
                    raise  # a sick share must not silently change a day's features
                # One bad day must not poison every shard whose window reaches it: that day is
                # dead-lettered as its own item; here it is left out of the history, loudly.
                if f["path"] not in self._skipped:
                    log.warning("leaving %s out of feature history and evaluation: %s", f["path"], exc)
                    self._skipped.add(f["path"])
                continue
            parts.append(frame.assign(_target=is_target))
        frame = pd.concat(parts, ignore_index=True)
        end = last + pd.Timedelta(days=1)
        days = frame[schema.TX_DATETIME]
        frame = frame[frame["_target"] | ((days >= start) & (days < end))]
        frame = frame.sort_values([schema.TX_DATETIME, schema.TRANSACTION_ID], kind="stable")
        frame = frame.reset_index(drop=True)
        target = frame.pop("_target").to_numpy(dtype=bool)
        return frame, target

    def entry(self, rel: str) -> dict[str, Any]:
        """The manifest entry of dataset file `rel`."""
        self.resolve(rel)
        return self._by_path[rel]

    def compute_features(self, rel: str) -> dict[str, np.ndarray]:
        """Features of one file's rows, computed from its window (``features.compute``'s columns)."""
        frame, target = self._window([rel])
        return features.compute(frame, target)

    def feature_inputs(self, rel: str) -> list[dict[str, Any]]:
        """The dataset files a day's feature window reads (itself and LOOKBACK_DAYS before it): their
        manifest entries and their size and modification time on the share. If any of them changes (a
        day replaced, damaged, or re-described), the day's stored features are stale: recomputing them
        reads the files again, so a damaged day fails as it would have without the store."""
        entry = self.entry(rel)
        first, last = pd.Timestamp(entry["first"]), pd.Timestamp(entry["last"])
        start = first - pd.Timedelta(days=features.LOOKBACK_DAYS)
        keys = ("path", "rows", "frauds", "first", "last", "start", "end")
        out = []
        for f in self._overlapping(start, last):
            try:
                st = (self.root / f["path"]).stat()
                seen: dict[str, Any] = {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
            except OSError as exc:
                seen = {"missing": exc.strerror or str(exc)}
            out.append({**{k: f.get(k) for k in keys}, **seen})
        return out

    def stored_features(self, rel: str) -> dict[str, np.ndarray]:
        """Day `rel`'s features from the feature store; ``featurestore.StaleFeatures`` if there are no
        valid ones."""
        return featurestore.load(self.root, rel, self.feature_inputs(rel))

    def day_features(self, rel: str) -> dict[str, np.ndarray]:
        """Day `rel`'s features: stored ones if valid, else computed now (on this CPU) and stored."""
        try:
            return self.stored_features(rel)
        except featurestore.StaleFeatures as why:
            if featurestore.paths(self.root, rel)[1].exists():  # a missing day is the normal first time
                log.warning("recomputing the features of %s: %s", rel, why)
        out = self.compute_features(rel)
        try:
            featurestore.store(self.root, rel, out, self.feature_inputs(rel))
        except OSError as exc:  # a read-only or full share costs recomputation later, not this item
            log.warning("could not store the features of %s (%s): they will be computed again", rel, exc)
        return out

    def ensure_features(self) -> tuple[int, int]:
        """Compute and store the features of every training and testing day that lacks valid ones (what
        seed runs once the dataset is published); returns (computed, already stored)."""
        computed = kept = 0
        for f in sorted(self.files, key=lambda f: (f["first"], f["path"])):
            if f["role"] not in featurestore.STORED_ROLES:
                continue
            try:
                self.stored_features(f["path"])
                kept += 1
            except featurestore.StaleFeatures:
                self.day_features(f["path"])
                computed += 1
        return computed, kept

    def examples(self, targets: list[str]) -> Examples:
        """The target files' examples, each file's features from the feature store (computed and
        stored there first if no valid ones are)."""
        parts = []
        for rel in targets:
            if self.entry(rel)["role"] in featurestore.STORED_ROLES:
                parts.append(self.day_features(rel))
            else:
                parts.append(self.compute_features(rel))
        return Examples.concat(parts)

    def test_examples(self) -> Examples:
        """All testing files, featurised with their history; loaded once per process."""
        if self._test is None:
            tests = sorted((f for f in self.files if f["role"] == TESTING), key=lambda f: (f["first"], f["path"]))
            self._test = self.examples([f["path"] for f in tests])
        return self._test
