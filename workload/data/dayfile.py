"""One day's file of transactions, read and checked, whoever reads it (``seed`` before publishing,
workers before training, ``score``).

Files come as real exports do, and are accepted as they are: rows in any order (a file is ordered
by ``TX_DATETIME``, ties by ``TRANSACTION_ID``), time-zone-aware timestamps (normalised to UTC),
integer columns typed as floats or text (converted when no value changes), columns in any order,
extra columns (left out of the features). Dates are never guessed: text that is not ISO 8601 needs a
declared format. What cannot be read so is refused with one line that names the user's file, the row
and the value. Pickle is never read (a pickle on a shared read-write volume is remote code execution).

A dataset's folders are its roles: ``history/`` files only feed feature windows (never trained on,
never evaluated); ``scoring/`` files are unlabelled (the label column absent or empty): featurised from
the same history as the others, scored, never trained on.
"""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from workload.core.errors import ItemFault
from workload.data import schema
from workload.data.reading import AS_IS, EPOCHS, Reading

HISTORY, TRAINING, TESTING, SCORING = "history", "training", "testing", "scoring"
ROLES = (HISTORY, TRAINING, TESTING, SCORING)  # the folders of a dataset; history/ and scoring/ are optional
REQUIRED_ROLES = (TRAINING, TESTING)
_PICKLE_SUFFIXES = {".pkl", ".pickle", ".p", ".joblib", ".npy", ".npz"}
_SEPARATORS = {";": "';'", "\t": "a tab", "|": "'|'"}
_NANOSECOND_TIMES = (pd.Timestamp.min.tz_localize("UTC"), pd.Timestamp.max.tz_localize("UTC"))  # what we store
_TIMESTAMP_EXAMPLES = "2018-04-01 00:00:31, 2018-04-01T00:00:31Z, 2018-04-01 00:00:31+02:00, 2018-04-01 00:00:31 UTC"
_DECLARE = "or declare the file's format (--datetime-format '%d/%m/%Y %H:%M', epoch-s, epoch-ms)"


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


def describe(frame: pd.DataFrame, rel: str) -> dict[str, Any]:
    """The manifest entry of a validated file: role, first and last day and instant, counts."""
    when = frame[schema.TX_DATETIME]
    return {"path": rel, "role": rel.split("/")[0], "first": str(when.min().date()), "last": str(when.max().date()),
            "start": when.min().isoformat(), "end": when.max().isoformat(), "rows": len(frame),
            "frauds": int(frame[schema.TX_FRAUD].sum())}


def source_name(entry: dict[str, Any]) -> str:
    """The user's name for a manifest file: where it was copied from, else its path in the dataset."""
    return (entry.get("source") or {}).get("uri") or entry["path"]
