"""Datasets shaped like real exports, made from the tiny simulated one: what users bring."""

from __future__ import annotations

import io
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from workload.data import schema

INT_COLUMNS = [c for c, kind in schema.COLUMNS.items() if kind == "int"]
DAY3 = "training/2018-04-03.parquet"


def copy_files(src: Path, dest: Path, keep: Callable[[str], bool] = lambda rel: True,
               role_of: Callable[[str], str] | None = None) -> Path:
    """The day files of `src` under `dest` (no manifest: a user's folder), optionally some, or moved to another role."""
    for path in sorted(src.glob("*/*.parquet")):
        rel = f"{path.parent.name}/{path.name}"
        if keep(rel):
            role = role_of(rel) if role_of else path.parent.name
            (dest / role).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest / role / path.name)
    return dest


def shuffled(frame: pd.DataFrame, seed: int) -> pd.DataFrame:
    """Rows in any order: what an export of a partitioned table gives."""
    return frame.sample(frac=1.0, random_state=seed).reset_index(drop=True)


def real_export(src: Path, dest: Path) -> Path:
    """Every day of `src` as real exports write it, no two days alike: rows shuffled; timestamps with
    ``Z``, ``+02:00`` offsets, BigQuery's `` UTC`` or a zone-aware Parquet type; integer columns as
    floats or as text. Testing days become CSV files; training days stay Parquet under the same
    names (a shard's name seeds its batch order, so only then can the weights be compared)."""
    for i, path in enumerate(sorted(src.glob("*/*.parquet"))):
        frame = shuffled(pd.read_parquet(path), seed=i)
        utc = frame[schema.TX_DATETIME].dt.tz_localize("UTC")
        style = i % 4
        if style == 0:  # ISO 8601 with Z, integers written as 12.0
            frame[schema.TX_DATETIME] = utc.dt.strftime("%Y-%m-%dT%H:%M:%SZ")
            frame[INT_COLUMNS] = frame[INT_COLUMNS].astype(np.float64)
        elif style == 1:  # local time with an offset, IDs as text
            frame[schema.TX_DATETIME] = utc.dt.tz_convert("Europe/Paris").map(lambda t: t.isoformat())
            frame[schema.TERMINAL_ID] = frame[schema.TERMINAL_ID].astype(str)
        elif style == 2:  # a zone-aware timestamp type, float IDs
            frame[schema.TX_DATETIME] = utc.dt.tz_convert("America/New_York")
            frame[schema.TRANSACTION_ID] = frame[schema.TRANSACTION_ID].astype(np.float64)
            frame[schema.CUSTOMER_ID] = frame[schema.CUSTOMER_ID].astype(np.float64)
        else:  # BigQuery's export: "2018-04-01 00:00:31 UTC"
            frame[schema.TX_DATETIME] = utc.dt.strftime("%Y-%m-%d %H:%M:%S UTC")
        folder = dest / path.parent.name
        folder.mkdir(parents=True, exist_ok=True)
        if path.parent.name == "testing":
            frame.to_csv(folder / f"{path.stem}.csv", index=False)
        else:
            frame.to_parquet(folder / path.name, index=False)
    return dest


# -- a bank's export: its own column names, no simulator columns, CSV with offsets ------------------------
BANK_COLUMNS = {"tx_id": schema.TRANSACTION_ID, "ts": schema.TX_DATETIME, "card_id": schema.CUSTOMER_ID,
                "merchant_id": schema.TERMINAL_ID, "amount": schema.TX_AMOUNT, "is_fraud": schema.TX_FRAUD}
BANK_NAMES = {ours: theirs for theirs, ours in BANK_COLUMNS.items()}
EXTRA = "MERCHANT_COUNTRY"


def bank_day(frame: pd.DataFrame, seed: int, label: str = "keep") -> pd.DataFrame:
    """One day as a payment processor exports it: rows shuffled (ties in time keep IDs out of order),
    local time with a +02:00 offset, every ID a float, columns in another order under their own names,
    one extra column, none of the simulator's. `label`: "keep", "absent" or "empty" (a day to score)."""
    out = shuffled(frame[list(schema.COLUMNS)], seed)
    out[schema.TX_DATETIME] = (out[schema.TX_DATETIME].dt.tz_localize("UTC").dt.tz_convert("Etc/GMT-2")
                               .map(lambda t: t.isoformat()))
    for column in (schema.TRANSACTION_ID, schema.CUSTOMER_ID, schema.TERMINAL_ID):
        out[column] = out[column].astype(np.float64)
    out[EXTRA] = np.where(out[schema.TERMINAL_ID] % 3 == 0, "FR", "DE")
    if label == "absent":
        out = out.drop(columns=[schema.TX_FRAUD])
    elif label == "empty":
        out[schema.TX_FRAUD] = np.nan
    columns = list(out.columns)
    np.random.default_rng(seed).shuffle(columns)
    return out[columns].rename(columns=BANK_NAMES)


def bank_export(src: Path, dest: Path, keep: Callable[[str], bool] = lambda rel: True,
                role_of: Callable[[str], str] | None = None, label: str = "keep") -> Path:
    """The days of `src` as a bank's CSV files under `dest` (same day names, `.csv`); `role_of` moves
    a day to another role (``scoring`` days get their label as `label` says); returns `dest`."""
    for i, path in enumerate(sorted(src.glob("*/*.parquet"))):
        rel = f"{path.parent.name}/{path.name}"
        if not keep(rel):
            continue
        role = role_of(rel) if role_of else path.parent.name
        (dest / role).mkdir(parents=True, exist_ok=True)
        day = bank_day(pd.read_parquet(path), seed=i, label=label if role == "scoring" else "keep")
        day.to_csv(dest / role / f"{path.stem}.csv", index=False)
    return dest


def write_mapping(path: Path) -> Path:
    """The bank's column mapping as a YAML file (what --columns takes)."""
    path.write_text("".join(f"{theirs}: {ours}\n" for theirs, ours in BANK_COLUMNS.items()))
    return path


# -- files that can never be read as they are: each must be refused in one line naming it -------------
def csv_bytes(frame: pd.DataFrame, **kwargs) -> bytes:
    buf = io.StringIO()
    frame.to_csv(buf, index=False, **kwargs)
    return buf.getvalue().encode()


def _text_amount(f: pd.DataFrame) -> bytes:
    f[schema.TX_AMOUNT] = f[schema.TX_AMOUNT].astype(str)
    f.loc[4, schema.TX_AMOUNT] = "12.50 EUR"
    return csv_bytes(f)


def _bad_date(f: pd.DataFrame) -> bytes:
    f[schema.TX_DATETIME] = f[schema.TX_DATETIME].astype(str)
    f.loc[2, schema.TX_DATETIME] = "31/13/2018 25:61"
    return csv_bytes(f)


BAD_FILES = {
    "empty": (".csv", lambda f: b"", "empty file (0 bytes)"),
    "header only": (".csv", lambda f: csv_bytes(f.iloc[:0]), "the file has a header but no rows"),
    "corrupt parquet": (".parquet", lambda f: f.to_parquet(index=False)[:-300] + b"\0" * 300,
                        "not a readable Parquet file"),
    "zero rows": (".parquet", lambda f: f.iloc[:0].to_parquet(index=False), "the file has no rows"),
    "wrong separator": (".csv", lambda f: csv_bytes(f, sep=";"),
                        "read a single column 'TRANSACTION_ID;TX_DATETIME;CUSTOMER_ID;"),
    "text in a number": (".csv", _text_amount, "column TX_AMOUNT must hold numbers: line 6 has '12.50 EUR'"),
    "unparseable date": (".csv", _bad_date, "column TX_DATETIME has an unparseable timestamp '31/13/2018 25:61' "
                                            "(line 4)"),
}


def plant(folder: Path, case: str, dataset_src: Path) -> Path:
    """Replace day 3 of `folder` by the bad file of `case`; returns the user's path of that file."""
    suffix, make, _ = BAD_FILES[case]
    (folder / DAY3).unlink()
    bad = (folder / DAY3).with_suffix(suffix)
    bad.write_bytes(make(pd.read_parquet(dataset_src / DAY3)))
    return bad


def one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, stderr
    return errors[0]
