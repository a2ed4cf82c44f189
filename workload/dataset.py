"""Datasets on the share: ``datasets/<name>/{training,testing}/*.{parquet,csv}`` plus a manifest.

The manifest (written by ``seed``) records each file's first and last day, taken from
``TX_DATETIME`` (never from file names), so feature windows can pull earlier days from the share.
Paths from queue items are validated here: they must stay inside the dataset folder, and pickle
is never read (a pickle on a shared read-write volume is remote code execution).
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from workload import features, featurestore, schema
from workload.fsutil import atomic_write_text

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
ROLES = ("training", "testing")
_PICKLE_SUFFIXES = {".pkl", ".pickle", ".p", ".joblib", ".npy", ".npz"}


class DatasetError(ValueError):
    """A dataset file or path that can never be trained on as it is (the item is dead-lettered)."""


def check_suffix(path: Path) -> None:
    suffix = path.suffix.lower()
    if suffix in _PICKLE_SUFFIXES:
        raise DatasetError(
            f"{path}: {suffix} files are never read (unpickling a file from a shared volume runs "
            f"arbitrary code); convert it to Parquet or CSV")
    if suffix not in schema.ALLOWED_SUFFIXES:
        raise DatasetError(f"{path}: unsupported file type {suffix!r}; allowed: {', '.join(schema.ALLOWED_SUFFIXES)}")


def read_transactions(path: Path) -> pd.DataFrame:
    """Read and validate one file of the tutorial schema; errors name the file and the column."""
    path = Path(path)
    check_suffix(path)
    try:
        if path.suffix.lower() == ".parquet":
            frame = pq.read_table(path).to_pandas()
        else:
            frame = pd.read_csv(path)
    except FileNotFoundError:
        raise
    except Exception as exc:  # noqa: BLE001 - unreadable bytes: retried, then dead-lettered
        raise OSError(f"{path}: unreadable {path.suffix} file: {exc}") from exc
    return validate(frame, str(path))


def validate(frame: pd.DataFrame, where: str) -> pd.DataFrame:
    missing = [c for c in schema.COLUMNS if c not in frame.columns]
    if missing:
        raise DatasetError(f"{where}: missing column(s) {missing}; the schema is {list(schema.COLUMNS)}")
    out = pd.DataFrame(index=range(len(frame)))
    for column, kind in schema.COLUMNS.items():
        values = frame[column].reset_index(drop=True)
        if values.isna().any():
            row = int(np.flatnonzero(values.isna().to_numpy())[0])
            raise DatasetError(f"{where}: column {column} has a missing value (row {row}); none are allowed")
        if kind == "datetime":
            try:
                values = pd.to_datetime(values)
            except (ValueError, TypeError) as exc:
                raise DatasetError(f"{where}: column {column} is not a timestamp: {exc}") from exc
            out[column] = values.astype("datetime64[ns]")
        elif kind == "int":
            if not pd.api.types.is_numeric_dtype(values) or not np.all(np.mod(values.to_numpy(), 1) == 0):
                raise DatasetError(f"{where}: column {column} must hold integers, saw dtype {values.dtype}")
            out[column] = values.astype(np.int64)
        else:
            if not pd.api.types.is_numeric_dtype(values):
                raise DatasetError(f"{where}: column {column} must hold numbers, saw dtype {values.dtype}")
            if not np.isfinite(values.to_numpy(dtype=np.float64)).all():
                raise DatasetError(f"{where}: column {column} has a non-finite value; amounts must be finite")
            out[column] = values.astype(np.float64)
    if (out[schema.TX_AMOUNT] < 0).any():
        raise DatasetError(f"{where}: column {schema.TX_AMOUNT} has negative amounts; amounts must be >= 0")
    if not out[schema.TX_FRAUD].isin([0, 1]).all():
        raise DatasetError(f"{where}: column {schema.TX_FRAUD} must be 0 or 1")
    ids = out[schema.TRANSACTION_ID].to_numpy()
    if len(ids) and not (np.diff(ids) > 0).all():
        kind = "duplicate" if len(np.unique(ids)) < len(ids) else "unsorted"
        raise DatasetError(f"{where}: column {schema.TRANSACTION_ID} has {kind} values; "
                           "it must be unique and increasing")
    return out


@dataclass(frozen=True)
class Examples:
    """Model inputs for a set of transactions: features, labels, each row's day and card, and whether
    the card was already known compromised (a fraud confirmed by the row's time minus the delay)."""

    x: np.ndarray  # float32 [n, len(features.FEATURE_NAMES)]
    y: np.ndarray  # float32 [n]
    day: np.ndarray  # datetime64[D] [n]
    card: np.ndarray  # int64 [n]: CUSTOMER_ID
    known: np.ndarray  # bool [n]

    @classmethod
    def concat(cls, parts: list[dict[str, np.ndarray]]) -> Examples:
        if len(parts) == 1:
            return cls(**parts[0])
        return cls(**{k: np.concatenate([p[k] for p in parts]) for k in ("x", "y", "day", "card", "known")})


def describe(root: Path, rel: str) -> dict[str, Any]:
    frame = read_transactions(root / rel)
    if frame.empty:
        raise DatasetError(f"{root / rel}: the file has no transactions")
    days = frame[schema.TX_DATETIME]
    return {"path": rel, "role": rel.split("/")[0], "first": str(days.min().date()),
            "last": str(days.max().date()), "rows": len(frame), "frauds": int(frame[schema.TX_FRAUD].sum())}


def write_manifest(root: Path) -> list[dict[str, Any]]:
    """Validate every file of the dataset and record its day range; returns the entries."""
    entries = []
    for role in ROLES:
        folder = root / role
        if not folder.is_dir():
            raise DatasetError(f"{root}: no {role}/ folder; a dataset has training/ and testing/ folders")
        files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
        if not files:
            raise DatasetError(f"{folder}: no data files")
        for path in files:
            check_suffix(path)
            entries.append(describe(root, f"{role}/{path.name}"))
    atomic_write_text(root / MANIFEST, json.dumps({"files": entries}, indent=1) + "\n")
    return entries


class Dataset:
    """A validated dataset folder. Reads are cached per process (consecutive shards share history),
    up to `cache_rows` transactions (~80 bytes each in memory)."""

    def __init__(self, root: Path, cache_rows: int = 10_000_000) -> None:
        self.root = Path(root)
        path = self.root / MANIFEST
        try:
            self.files: list[dict[str, Any]] = json.loads(path.read_text())["files"]
        except FileNotFoundError as exc:
            raise DatasetError(f"{path}: missing; run `python -m workload seed` to lay the dataset out") from exc
        except (ValueError, KeyError) as exc:
            raise DatasetError(f"{path}: unreadable manifest ({exc}); run seed again") from exc
        self._by_path = {f["path"]: f for f in self.files}
        self._cache: OrderedDict[str, pd.DataFrame] = OrderedDict()
        self._cache_rows = cache_rows
        self._test: Examples | None = None
        self._skipped: set[str] = set()

    def training_shards(self) -> list[str]:
        """Training files in chronological order of their first transaction."""
        train = [f for f in self.files if f["role"] == "training"]
        return [f["path"] for f in sorted(train, key=lambda f: (f["first"], f["last"], f["path"]))]

    def resolve(self, rel: str) -> Path:
        """The file a queue item names, refused unless it is a manifest file inside the dataset folder."""
        root = self.root.resolve()
        candidate = (root / rel).resolve()
        if Path(rel).is_absolute() or not candidate.is_relative_to(root):
            raise DatasetError(f"item path {rel!r} is outside the datasets folder {root}; refused")
        check_suffix(candidate)
        if rel not in self._by_path:
            raise DatasetError(f"item path {rel!r} is not a file of the dataset manifest {root / MANIFEST}")
        return candidate

    def _read(self, rel: str) -> pd.DataFrame:
        if rel in self._cache:
            self._cache.move_to_end(rel)
            return self._cache[rel]
        frame = read_transactions(self.resolve(rel))
        self._cache[rel] = frame
        while len(self._cache) > 1 and sum(len(f) for f in self._cache.values()) > self._cache_rows:
            self._cache.popitem(last=False)
        return frame

    def _window(self, targets: list[str]) -> tuple[pd.DataFrame, np.ndarray]:
        """Target files' rows plus LOOKBACK_DAYS of earlier days, sorted; and the mask of target rows."""
        first = min(pd.Timestamp(self._by_path[t]["first"]) for t in targets)
        last = max(pd.Timestamp(self._by_path[t]["last"]) for t in targets)
        start = first - pd.Timedelta(days=features.LOOKBACK_DAYS)
        parts = []
        for f in self.files:
            is_target = f["path"] in targets
            if is_target or (pd.Timestamp(f["last"]) >= start and pd.Timestamp(f["first"]) <= last):
                try:
                    frame = self._read(f["path"])
                except (OSError, DatasetError) as exc:
                    if is_target:
                        raise
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
        frame = frame.drop_duplicates(schema.TRANSACTION_ID, keep="first")  # a day in two files
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

    def examples(self, targets: list[str]) -> Examples:
        """The target files' examples, each file's features from the feature store (computed and
        stored there first if no valid ones are)."""
        parts = []
        for rel in targets:
            if self.entry(rel)["role"] in featurestore.STORED_ROLES:
                parts.append(featurestore.day_features(self, rel))
            else:
                parts.append(self.compute_features(rel))
        return Examples.concat(parts)

    def test_examples(self) -> Examples:
        """All testing files, featurised with their history; loaded once per process."""
        if self._test is None:
            tests = sorted((f for f in self.files if f["role"] == "testing"), key=lambda f: (f["first"], f["path"]))
            self._test = self.examples([f["path"] for f in tests])
        return self._test
