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

import hashlib
import io
import os
import re
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
_SEPARATORS = {";": "';'", "\t": "a tab", "|": "'|'", ",": "','"}
_NANOSECOND_TIMES = (pd.Timestamp.min.tz_localize("UTC"), pd.Timestamp.max.tz_localize("UTC"))  # what we store
_TIMESTAMP_EXAMPLES = "2018-04-01 00:00:31, 2018-04-01T00:00:31Z, 2018-04-01 00:00:31+02:00, 2018-04-01 00:00:31 UTC"
_NAMED_DAY = re.compile(r"(?<!\d)(\d{4})-?(\d{2})-?(\d{2})(?!\d)")
LATE_DAYS = 31  # a row dated further than this from its file's day is refused: a placeholder, not a late posting
_PLAIN_NUMBER = r"-?(?:0|[1-9]\d{0,18})(?:\.0*)?"  # an ID written as a whole number, no leading zero
_OFFSET_AT_END = r"(?:Z|[+-]\d{2}:?\d{2}|UTC)$"
# What a timestamp may read as: before or after, a placeholder ("1900-01-01"), a wrong epoch unit or format.
_PLAUSIBLE = (pd.Timestamp("1970-01-01"), pd.Timestamp("2200-01-01"))
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
    """A value as the user wrote it: text quoted, numbers plain (never numpy's or pandas' repr)."""
    if isinstance(value, pd.Timestamp):
        return str(value)
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
    if csv:
        frame = _read_csv(data, where, reading)
    else:
        try:
            frame = pq.read_table(io.BytesIO(data)).to_pandas()
        except Exception as exc:  # noqa: BLE001 - whatever the parser says, these bytes will never parse
            raise DatasetError(f"{where}: not a readable Parquet file ({one_line(exc)})") from None
    if frame.empty:
        what = "a header but no rows" if csv else "no rows"
        raise DatasetError(f"{where}: the file has {what}; a day file holds at least one transaction")
    return validate(frame, where, first_line=reading.dialect.header + 1 if csv else None, reading=reading,
                    labels=labels)


def _read_csv(data: bytes, where: str, reading: Reading) -> pd.DataFrame:
    """A CSV file in its declared dialect (``Reading.dialect``); refused in one line naming the declaration
    that would read it when it does not match."""
    d = reading.dialect
    ids_as_text = {reading.source_of(c): str for c in schema.IDS}  # "000123" keeps its zeros
    try:
        frame = pd.read_csv(io.BytesIO(data), dtype=ids_as_text, sep=d.separator, decimal=d.decimal,
                            quotechar=d.quote, encoding=d.encoding, skiprows=d.header - 1)
    except UnicodeDecodeError:
        bom = data[:2] in (b"\xff\xfe", b"\xfe\xff")  # Excel's "Unicode text": UTF-16 with a byte-order mark
        fits = "utf-16" if bom else next((enc for enc in ("utf-8", "cp1252") if _decodes(data, enc)), "latin-1")
        raise DatasetError(f"{where}: not {d.encoding} text; it reads as {fits}: declare csv: {{encoding: {fits}}} in "
                           "the mapping file") from None
    except Exception as exc:  # noqa: BLE001 - whatever the parser says, these bytes will never parse
        raise DatasetError(f"{where}: not a readable CSV file ({one_line(exc)})") from None
    if len(frame.columns) == 1 and len(schema.COLUMNS) > 1:
        header = str(frame.columns[0])
        seen = next((sep for sep in (";", "\t", "|", ",") if sep in header and sep != d.separator), None)
        hint = (f"it looks separated by {_SEPARATORS.get(seen, repr(seen))}: declare csv: {{separator: {seen!r}}} in "
                "the mapping file" if seen else f"no {d.separator!r} in the header")
        raise DatasetError(f"{where}: read a single column {header[:80]!r} ({hint}); CSV files must be separated by "
                           f"{d.separator!r} (as declared) with the columns {','.join(schema.COLUMNS)}")
    return frame


def _decodes(data: bytes, encoding: str) -> bool:
    try:
        data.decode(encoding)
    except UnicodeDecodeError:
        return False
    return True


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
        comma = isinstance(values.iloc[i], str) and re.fullmatch(r"-?\d+,\d+", values.iloc[i].strip())
        hint = "; a decimal comma? declare csv: {decimal: ','} in the mapping file" if comma else ""
        raise DatasetError(f"{where}: column {column} must hold numbers: {at(i)} has {_shown(values.iloc[i])}{hint}")
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


def _offsets(values: pd.Series, name: str, where: str, at: Callable[[int], str]) -> pd.Series:
    """A column of UTC offsets (+02:00, +0200, -05:00, Z, UTC) as timedeltas; refused naming the first other value."""
    text = values.astype(str).str.strip()
    parts = text.str.extract(r"^([+-])(\d{2}):?(\d{2})$")
    minutes = parts[1].astype(float) * 60 + parts[2].astype(float)
    minutes = minutes.where(parts[0] != "-", -minutes)
    minutes = minutes.where(~text.isin(["Z", "UTC", "+00:00"]), 0.0)
    bad = np.flatnonzero(minutes.isna().to_numpy())
    if len(bad):
        i = int(bad[0])
        raise DatasetError(f"{where}: column {name} must hold UTC offsets such as +02:00 or Z: {at(i)} has "
                           f"{_shown(values.iloc[i])}")
    return pd.to_timedelta(minutes, unit="min")


def _parsed(values: pd.Series, name: str, where: str, at: Callable[[int], str], fmt: str | None
            ) -> tuple[pd.Series, np.ndarray]:
    """The values as UTC instants (naive ones read as if UTC), and which of them carried no offset."""
    if pd.api.types.is_datetime64_any_dtype(values):
        naive = np.full(len(values), getattr(values.dtype, "tz", None) is None)
        return pd.to_datetime(values, utc=True), naive
    if fmt in EPOCHS:
        numbers = _numbers(values, name, where, at)
        return pd.to_datetime(numbers, unit=EPOCHS[fmt], utc=True, errors="coerce"), np.zeros(len(values), bool)
    if pd.api.types.is_numeric_dtype(values):  # booleans too
        raise DatasetError(f"{where}: column {name} holds numbers ({at(0)}: {_shown(values.iloc[0])}); "
                           f"it must hold timestamps such as {_TIMESTAMP_EXAMPLES}, {_DECLARE}")
    naive = ~values.astype(str).str.strip().str.contains(_OFFSET_AT_END, regex=True).to_numpy()
    return _parse_text(values, fmt), naive


def _timestamps(values: pd.Series, where: str, at: Callable[[int], str], reading: Reading = AS_IS,
                offsets: pd.Series | None = None) -> pd.Series:
    """Wall-clock times in the dataset's zone (``Reading.day_zone``: UTC unless declared), without a zone:
    naive values are wall-clock times there already, values with an offset (Z, +02:00, UTC, a zone-aware
    type, an epoch, the offset column) are converted. Naive values of a mapped export need a declared zone."""
    name, fmt = reading.source_of(schema.TX_DATETIME), reading.datetime_format
    parsed, naive = _parsed(values, name, where, at, fmt)
    bad = np.flatnonzero(~parsed.between(*_NANOSECOND_TIMES).to_numpy())
    if len(bad):  # unparseable (NaT), or beyond what nanoseconds hold (an export's "never", 9999-12-31)
        i = int(bad[0])
        what = "an unparseable" if pd.isna(parsed.iloc[i]) else "an out-of-range"
        allowed = (f"in the declared format {fmt!r} or in ISO 8601" if fmt
                   else f"such as {_TIMESTAMP_EXAMPLES}, {_DECLARE}")
        raise DatasetError(f"{where}: column {name} has {what} timestamp {_shown(values.iloc[i])} ({at(i)}); "
                           f"write timestamps {allowed}")
    zone = reading.day_zone()
    wall = parsed.dt.tz_convert(None)  # a naive value as written
    if offsets is not None:
        instant = (wall - _offsets(offsets, reading.offset_column or "", where, at)).dt.tz_localize("UTC")
        _check_zone(wall, instant, naive, values, offsets, where, at, reading)
        parsed, naive = parsed.where(~naive, instant), np.zeros(len(values), bool)
    if naive.any() and reading.naive_zone() is None:
        i = int(np.flatnonzero(naive)[0])
        raise DatasetError(f"{where}: column {name} has timestamps without a UTC offset ({at(i)}: "
                           f"{_shown(values.iloc[i])}); declare the zone they are local times in (timezone: "
                           "Europe/Berlin or timezone: UTC in the mapping file, or --timezone), or name a column of "
                           "offsets (offset_column)")
    local = parsed.dt.tz_convert(zone).dt.tz_localize(None)
    out = wall.where(naive, local).astype("datetime64[ns]")
    implausible = np.flatnonzero(~out.between(*_PLAUSIBLE, inclusive="left").to_numpy())
    if len(implausible):
        i = int(implausible[0])
        raise DatasetError(f"{where}: column {name} has the timestamp {_shown(values.iloc[i])} ({at(i)}), read as "
                           f"{out.iloc[i]}; timestamps from {_PLAUSIBLE[0].year} to {_PLAUSIBLE[1].year - 1} are read "
                           "(a placeholder date, or a wrong --datetime-format or epoch unit)")
    return out


def _check_zone(wall: pd.Series, instant: pd.Series, naive: np.ndarray, values: pd.Series, offsets: pd.Series,
                where: str, at: Callable[[int], str], reading: Reading) -> None:
    """A declared zone that disagrees with the offsets the file carries is refused: it would move days."""
    if not reading.timezone:
        return
    local = instant.dt.tz_convert(reading.timezone).dt.tz_localize(None)
    wrong = np.flatnonzero(naive & (local != wall).to_numpy())
    if len(wrong):
        i = int(wrong[0])
        raise DatasetError(f"{where}: {at(i)}: {_shown(values.iloc[i])} at offset {_shown(offsets.iloc[i])} is "
                           f"{local.iloc[i]} in {reading.timezone}: the declared timezone does not match the offsets "
                           f"in {reading.offset_column}; declare the zone the times were recorded in")


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


def _ids(values: pd.Series, name: str, where: str, at: Callable[[int], str]) -> tuple[np.ndarray, pd.Series | None]:
    """An ID column's int64 keys, and its values as given when they are text (None: numbers, kept as today).

    Numbers (and text that is a plain whole number: ``123``, ``123.0``) are their own key; any other text
    (``NB000873369``, ``000123``, a hash of any length) is keyed by a stable hash into [2**62, 2**63), apart
    from the numbers below 2**62. Two texts with one key are refused (never merged)."""
    if not (pd.api.types.is_object_dtype(values) or pd.api.types.is_string_dtype(values)):  # numbers, times
        return _integers(_numbers(values, name, where, at), values, name, where, at), None
    text = values.astype(str)
    plain = text.str.fullmatch(_PLAIN_NUMBER).to_numpy()
    if plain.all():
        return _integers(_numbers(values, name, where, at), values, name, where, at), None
    keys = np.array([_text_key(v) for v in text], dtype=np.int64)
    keys[plain] = [int(v.split(".")[0]) for v in text[plain]]
    pairs = pd.DataFrame({"key": keys, "given": text}).drop_duplicates()
    clash = pairs[pairs["key"].duplicated(keep=False)]
    if len(clash):
        a, b = clash["given"].iloc[:2]
        raise DatasetError(f"{where}: column {name}: {a!r} and {b!r} have the same internal key; they cannot be told "
                           "apart (rename one)")
    return keys, text


def _text_key(value: str) -> int:
    digest = int.from_bytes(hashlib.blake2b(value.encode("utf-8"), digest_size=8).digest(), "big")
    return (1 << 62) | (digest & ((1 << 62) - 1))


def tie_breaker(frame: pd.DataFrame) -> str:
    """The column that orders rows of one instant: the transaction IDs as given (text sorts as text, so
    ``NB000000000684`` sorts as 684 did), or the numbers themselves."""
    text = schema.AS_GIVEN[schema.TRANSACTION_ID]
    return text if text in frame.columns else schema.TRANSACTION_ID


def given_ids(frame: pd.DataFrame, column: str = schema.TRANSACTION_ID) -> np.ndarray:
    """The IDs of `column` as the bank gave them: its text where the file's were text, else the numbers."""
    text = schema.AS_GIVEN[column]
    return frame[text].to_numpy(dtype=object) if text in frame.columns else frame[column].to_numpy()


def _offset_column(frame: pd.DataFrame, where: str, reading: Reading) -> pd.Series | None:
    """The declared column of UTC offsets, if any; refused when the file lacks it."""
    if not reading.offset_column:
        return None
    if reading.offset_column not in frame.columns:
        raise DatasetError(f"{where}: the offset column {reading.offset_column!r} of the mapping file is not in the "
                           f"file; it has {[str(c) for c in frame.columns][:20]}")
    return frame[reading.offset_column].reset_index(drop=True)


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
    texts: dict[str, pd.Series] = {}
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
            out[column] = _timestamps(values, where, at, reading, _offset_column(frame, where, reading))
            continue
        if column in schema.IDS:
            keys, given = _ids(values, name, where, at)
            out[column] = keys
            if given is not None:
                texts[column] = given
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
    for column, given in texts.items():
        out[schema.AS_GIVEN[column]] = given
    _check_values(out, frame, where, at, reading)
    _check_calendar(out[schema.TX_DATETIME], where, at, reading, values_of=frame[schema.TX_DATETIME])
    # Real exports come in any order within a day; the features need time order, and ties in time
    # need one order whoever reads the file: by transaction ID.
    out = out.sort_values([schema.TX_DATETIME, tie_breaker(out)], kind="stable", ignore_index=True)
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
    ids = out[schema.TRANSACTION_ID].to_numpy()
    order = np.argsort(ids, kind="stable")
    twice = np.flatnonzero(np.diff(ids[order]) == 0)
    if len(twice):
        shown = given_ids(out)[order[twice[0]]]
        raise DatasetError(f"{where}: {reading.source_of(schema.TRANSACTION_ID)} {shown} appears more than "
                           "once; transaction IDs must be unique across the dataset")


def named_day(name: str) -> pd.Timestamp | None:
    """The calendar day a file's name says it is for (``2018-04-02.parquet``, ``tx_20180402.csv``), if any."""
    found = _NAMED_DAY.search(Path(name).stem)
    if not found:
        return None
    try:
        return pd.Timestamp(f"{found[1]}-{found[2]}-{found[3]}")
    except ValueError:
        return None


def day_of(times: pd.Series, name: str) -> tuple[pd.Timestamp, np.ndarray | None]:
    """A file's place in its dataset, and which of its rows are dated on it (None: a file of several days).

    The rule (docs/architecture.md): the day its name carries; else the day most (over half) of its rows
    fall on; else, a file of several days, its first. Never its oldest row alone: card data carries late
    postings and placeholder dates."""
    dates = times.dt.normalize()
    named = named_day(name)
    if named is not None:  # a file named for a day is about that day (none of its rows on it is refused)
        return named, (dates == named).to_numpy()
    counts = dates.value_counts(sort=False).sort_index()
    mode = counts.idxmax()
    if 2 * counts.max() > len(dates):
        return mode, (dates == mode).to_numpy()
    return dates.min(), None


def _check_calendar(times: pd.Series, where: str, at: Callable[[int], str], reading: Reading,
                    values_of: pd.Series) -> None:
    """A file named for a day holds mostly that day's rows (else the dates were misread: day and month
    swapped, another zone); no row is dated more than LATE_DAYS from its file's day (a placeholder)."""
    day, on_day = day_of(times, where)
    if on_day is None:
        return
    name = reading.source_of(schema.TX_DATETIME)
    if not on_day.any():
        common = times.dt.normalize().value_counts().idxmax()
        raise DatasetError(f"{where}: named for {day.date()}, but none of its {len(times)} rows is dated on that day "
                           f"(most are on {common.date()}, e.g. {at(0)}: {_shown(values_of.iloc[0])}); check the "
                           "declared datetime format (day and month swapped?) and timezone")
    far = np.flatnonzero((times.dt.normalize() - day).abs().to_numpy() > np.timedelta64(LATE_DAYS, "D"))
    if len(far):
        i = int(far[0])
        raise DatasetError(f"{where}: column {name} has {_shown(values_of.iloc[i])} ({at(i)}), read as "
                           f"{times.iloc[i]}: more than {LATE_DAYS} days from the file's day {day.date()} (a "
                           "placeholder date, or a file of many days named for one?); late postings up to that are "
                           "kept with the day they came with")


def describe(frame: pd.DataFrame, rel: str) -> dict[str, Any]:
    """The manifest entry of a validated file: role, its day (its place in the dataset, ``day_of``), first and
    last day and instant of the rows on it, counts, and the rows dated on other days (late postings)."""
    when = frame[schema.TX_DATETIME]
    day, on_day = day_of(when, rel)
    core = when[on_day] if on_day is not None and on_day.any() else when
    late = {} if on_day is None or on_day.all() else {"late": int((~on_day).sum())}
    return {"path": rel, "role": rel.split("/")[0], "first": str(when.min().date()), "last": str(when.max().date()),
            "day": str(day.date()), "start": core.min().isoformat(), "end": core.max().isoformat(),
            "rows": len(frame), "frauds": int(frame[schema.TX_FRAUD].sum()), **late}


def place(entry: dict[str, Any]) -> str:
    """Where a manifest file goes in its dataset's order: its day (its first day in older manifests)."""
    return entry.get("day") or entry["first"]


def source_name(entry: dict[str, Any]) -> str:
    """The user's name for a manifest file: where it was copied from, else its path in the dataset."""
    return (entry.get("source") or {}).get("uri") or entry["path"]
