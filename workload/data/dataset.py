"""A published dataset on the share (``datasets/<name>/{history,training,testing,scoring}/*`` plus its
manifest, ``workload.data.manifest``), as workers read it: each day's file (``workload.data.dayfile``)
with the feature history of earlier files, and the features stored for it.

Paths from queue items are validated here: they must stay inside the dataset folder, be files of the
manifest, and pickle is never read.
"""

from __future__ import annotations

import bisect
import logging
from collections import Counter, OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from workload.core.errors import is_infra
from workload.data import features, featurestore, schema
from workload.data.cycle import RETIRED, effective_roles
from workload.data.dayfile import (
    TESTING,
    TRAINING,
    DatasetError,
    check_suffix,
    labelled,
    place,
    read_transactions,
    source_name,
    tie_breaker,
)
from workload.data.manifest import MANIFEST, manifest_cycle, manifest_reading, read_manifest

log = logging.getLogger(__name__)


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
    up to `cache_rows` transactions (~80 bytes each in memory). `reads` counts each file's features loaded
    from the feature store or computed (what `examples` costs: the file read, its checksum, its arrays)."""

    def __init__(self, root: Path, cache_rows: int = 10_000_000) -> None:
        self.root = Path(root)
        self._cache: OrderedDict[str, pd.DataFrame] = OrderedDict()
        self._cache_rows = cache_rows
        self._cached_rows = 0
        self.reads: Counter[str] = Counter()
        self._shared: dict[tuple, Any] | None = None  # `shared_reads`' examples while it lasts
        self._load()

    def _load(self) -> None:
        self._seen = self._manifest_stat()
        manifest = read_manifest(self.root)
        self.cycle = manifest_cycle(manifest)
        self.retired = [r["path"] for r in manifest.get(RETIRED, [])]  # day versions that left the manifest
        # With the daily cycle (workload.data.cycle) the rule gives the labelled days their roles.
        self.files: list[dict[str, Any]] = effective_roles(manifest["files"], self.cycle)
        self.reading = manifest_reading(manifest)
        self._by_path = {f["path"]: f for f in self.files}
        self._last_times: dict[tuple[str, str], pd.Timestamp] = {}
        # Files by first day, for windows found by bisection: a day's cost must not grow with the days
        # before it (years of daily files).
        self._by_first = sorted(range(len(self.files)), key=lambda i: self.files[i]["first"])
        self._firsts = [self.files[i]["first"] for i in self._by_first]
        self._longest = max(((pd.Timestamp(f["last"]) - pd.Timestamp(f["first"])).days for f in self.files), default=0)
        self._test: Examples | None = None
        self._skipped: set[str] = set()

    def _manifest_stat(self) -> tuple[int, int, int] | None:
        try:
            st = (self.root / MANIFEST).stat()
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def refresh(self) -> bool:
        """Reload a manifest that a publish replaced since (True when it did): a day appended or backfilled, or,
        with the daily cycle, the test window moved (a worker's day order and test days must be tonight's).
        Publishing replaces the file, so its (inode, size, mtime) shows any change; the read cache is kept
        (published days are immutable)."""
        if self._manifest_stat() == self._seen:
            return False
        self._load()
        return True

    _fresh = refresh  # the readers' check before they use the file list

    def _overlapping(self, start: pd.Timestamp, last: pd.Timestamp) -> list[dict[str, Any]]:
        """The files with a day in [start, last], in manifest order."""
        lo = bisect.bisect_left(self._firsts, str((start - pd.Timedelta(days=self._longest)).date()))
        hi = bisect.bisect_right(self._firsts, str(last.date()))
        # A file is history only from its own day on: a late posting it carries was not there the days before.
        hits = sorted(i for i in self._by_first[lo:hi]
                      if pd.Timestamp(self.files[i]["last"]) >= start and place(self.files[i]) <= str(last.date()))
        return [self.files[i] for i in hits]

    def training_shards(self) -> list[str]:
        """Training files in the order of their days (``dayfile.day_of``: never their oldest row)."""
        self._fresh()
        train = [f for f in self.files if f["role"] == TRAINING]
        return [f["path"] for f in sorted(train, key=lambda f: (place(f), f["first"], f["last"], f["path"]))]

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
        tie = tie_breaker(frame)
        if tie != schema.TRANSACTION_ID:  # text IDs: numbers of other days' files tie-break as their text
            frame = frame.assign(**{tie: frame[tie].fillna(frame[schema.TRANSACTION_ID].astype(str))})
        frame = frame.sort_values([schema.TX_DATETIME, tie], kind="stable")
        frame = frame.reset_index(drop=True)
        target = frame.pop("_target").to_numpy(dtype=bool)
        return frame, target

    def entry(self, rel: str) -> dict[str, Any]:
        """The manifest entry of dataset file `rel`."""
        self.resolve(rel)
        return self._by_path[rel]

    def known_entry(self, rel: str) -> dict[str, Any]:
        """The manifest entry of `rel` as `entry` gives it, without its path checks when the manifest names it
        (the manifest's own paths): a run's applied days are asked for every day, and checking each path on the
        share made a day's cost grow with the days before it."""
        found = self._by_path.get(rel)
        return found if found is not None else self.entry(rel)

    def last_time(self, rel: str) -> pd.Timestamp:
        """The last transaction time of dataset file `rel` (`known_entry`'s "last"), parsed once per manifest."""
        entry = self.known_entry(rel)
        key = (rel, entry["last"])
        if key not in self._last_times:
            self._last_times[key] = pd.Timestamp(entry["last"])
        return self._last_times[key]

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
        for f in sorted(self.files, key=lambda f: (place(f), f["path"])):
            if f["role"] not in featurestore.STORED_ROLES:
                continue
            try:
                self.stored_features(f["path"])
                kept += 1
            except featurestore.StaleFeatures:
                self.day_features(f["path"])
                computed += 1
        return computed, kept

    @contextmanager
    def shared_reads(self) -> Iterator[None]:
        """While it lasts, equal reads are one: `examples` and `day_and_window` of the same days (under the same
        manifest and feature set) return the same arrays, and each file is read once whatever reads it (a window,
        the calibration days): a pack's runs of one day (runtime/packing.py) read their common window once, not once
        a run. Nothing outside it is kept; a nested use keeps the outer one's reads. The arrays are shared: a reader
        must not write into them (none does)."""
        if self._shared is not None:
            yield
            return
        self._shared = {}
        try:
            yield
        finally:
            self._shared = None

    def _once(self, kind: str, days: list[str], read: Any) -> Any:
        """`read()`, or while `shared_reads` lasts what it gave for the same days: keyed by what makes two reads
        equal (this dataset's manifest as it is now, the days, the feature set)."""
        if self._shared is None:
            return read()
        key = (kind, self._seen, tuple(days), features.FEATURE_VERSION, tuple(features.FEATURE_NAMES))
        if key not in self._shared:
            self._shared[key] = read()
        return self._shared[key]

    def examples(self, targets: list[str]) -> Examples:
        """The target files' examples, each file's features from the feature store (computed and
        stored there first if no valid ones are)."""
        return self._once("examples", targets, lambda: self._examples(targets))

    def _examples(self, targets: list[str]) -> Examples:
        return Examples.concat([self._once("file", [rel], lambda rel=rel: self._file_examples(rel)) for rel in targets])

    def _file_examples(self, rel: str) -> dict[str, np.ndarray]:
        self.reads[rel] += 1
        if self.entry(rel)["role"] in featurestore.STORED_ROLES:
            return self.day_features(rel)
        return self.compute_features(rel)

    def day_and_window(self, window: list[str]) -> tuple[Examples, Examples]:
        """The examples of `window`'s last day, and those of the whole window (its days in order, the day last)."""
        def read() -> tuple[Examples, Examples]:
            examples = self.examples(window[-1:])
            earlier = window[:-1]
            return examples, (Examples.concat([vars(self.examples(earlier)), vars(examples)]) if earlier else examples)
        return self._once("window", window, read)

    def test_files(self) -> list[dict[str, Any]]:
        """The testing files' manifest entries, oldest first (with the daily cycle: tonight's test window)."""
        self._fresh()
        return sorted((f for f in self.files if f["role"] == TESTING), key=lambda f: (place(f), f["path"]))

    def test_window(self) -> list[str]:
        """The test files a day is evaluated on, as the manifest names them (each history entry records it)."""
        return [f["path"] for f in self.test_files()]

    def test_examples(self) -> Examples:
        """All testing files, featurised with their history; loaded once per manifest."""
        tests = self.test_files()
        if self._test is None:
            self._test = self.examples([f["path"] for f in tests])
        return self._test
