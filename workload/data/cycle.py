"""The daily cycle: a dataset that rolls forward one labelled day a night.

A dataset published with a cycle (``seed --test-window N``, recorded in its manifest as ``"cycle"``) has
no ``testing/`` folder: its labelled days are all in ``training/``, and the rule picks the roles. The
newest ``N`` labelled days test; every older one trains. When tonight's labelled day arrives, it becomes
a test day and the oldest test day becomes a training day, at the end of every run's order, so the runs
warm-start on it as on any appended day (``workload.queue.plan`` enqueues it). A dataset without a cycle
keeps its folders' roles (a fixed holdout), exactly as before.

Two kinds of late arrival are versions of a day, never a change in place (published days are
immutable):

- **Late labels** (a chargeback weeks later): the bank sends the day's file again with other labels and
  the same transactions. It is published beside the old one as a new version (``training/v2/D.parquet``, the
  manifest entry says ``"from"`` which source file and ``"version"``); the old entry leaves the manifest
  for its ``"retired"`` list. Each run's lineage then holds a day the dataset no longer has: the new
  version's item rewinds it to the boundary before that day and re-applies every later day in date
  order (``workload.model.lineage.Rewind``).
- **A scored day's labels**: the day scored last night (``scoring/``, unlabelled) arrives labelled in
  ``training/``; the unlabelled copy holds the same transactions, so it is retired.

``workload.data.publish`` applies these rules; ``workload.data.dataset`` reads the roles through
`effective_roles`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

import numpy as np

from workload.data.dayfile import SCORING, TESTING, TRAINING, DatasetError, source_name

CYCLE = "cycle"  # the manifest's key
RETIRED = "retired"  # the manifest's key: entries that left it (older versions, scored days now labelled)


@dataclass(frozen=True)
class Cycle:
    """The rule that moves the test window: the newest `test_days` labelled days test."""

    test_days: int

    def __post_init__(self) -> None:
        if isinstance(self.test_days, bool) or not isinstance(self.test_days, int) or self.test_days < 1:
            raise DatasetError(f"test days: {self.test_days!r}; the daily cycle needs a whole number of test "
                               "days of at least 1 (the newest N labelled days test, older ones train)")

    def record(self) -> dict[str, Any]:
        return {"test_days": self.test_days}

    @classmethod
    def from_record(cls, record: Any) -> Cycle | None:
        if record is None:
            return None
        if not isinstance(record, dict) or "test_days" not in record:
            raise DatasetError(f"manifest {CYCLE}: {record!r}; expected {{test_days: N}}")
        return cls(test_days=record["test_days"])

    def describe(self) -> str:
        return f"the daily cycle (the newest {self.test_days} labelled day(s) test, older ones train)"


def describe(cycle: Cycle | None) -> str:
    return cycle.describe() if cycle else "a fixed holdout (testing/ days test)"


def effective_roles(files: list[dict[str, Any]], cycle: Cycle | None) -> list[dict[str, Any]]:
    """The manifest's entries with the roles the cycle gives them (the entries themselves without one)."""
    if cycle is None:
        return files
    labelled = sorted((f for f in files if f["role"] == TRAINING), key=lambda f: (f["first"], f["last"], f["path"]))
    testing = {f["path"] for f in labelled[-cycle.test_days:]}
    return [{**f, "role": TESTING} if f["path"] in testing else f for f in files]


def check_folders(entries: list[dict[str, Any]], cycle: Cycle | None, where: str) -> None:
    """A cycle's dataset has no testing/ folder: the rule picks the test days."""
    fixed = [e for e in entries if e["role"] == TESTING]
    if cycle is not None and fixed:
        raise DatasetError(f"{where}: {source_name(fixed[0])} is in {TESTING}/, but the dataset follows "
                           f"{cycle.describe()}: put every labelled day in {TRAINING}/ and the rule picks the "
                           "test days")


def version_path(rel: str, version: int) -> str:
    """Where version `version` of source file `rel` is published: training/D.parquet -> training/v2/D.parquet.
    No source file has that shape (a source's files are ``role/file``), so no name is ever taken twice."""
    p = PurePosixPath(rel)
    return str(p.parent / f"v{version}" / p.name)


def unversioned(rel: str) -> str:
    """The day file a version stands for (training/v2/D.parquet -> training/D.parquet); any other path as it is.
    A version trains as its day (the trainer's batch order is seeded by this name)."""
    parts = rel.split("/")
    if len(parts) == 3 and re.fullmatch(r"v[0-9]+", parts[1]):
        return f"{parts[0]}/{parts[2]}"
    return rel


def source_rel(entry: dict[str, Any]) -> str:
    """The source file a manifest entry was published from (a version's, its original name)."""
    return entry.get("from", entry["path"])


def same_transactions(a_ids: np.ndarray, a_rows: np.ndarray, b_ids: np.ndarray, b_rows: np.ndarray) -> bool:
    """The same transactions (IDs, and each row's card, terminal, time and amount), labels aside."""
    return (np.array_equal(np.sort(a_ids), np.sort(b_ids)) and np.array_equal(a_rows, b_rows))


def scored_now_labelled(published: list[dict[str, Any]], added: list[dict[str, Any]],
                        keys: dict[str, Any]) -> dict[str, str]:
    """Scoring days whose transactions a newly added labelled day holds: scoring path -> that day's path."""
    out = {}
    for s in (e for e in published if e["role"] == SCORING):
        for a in (e for e in added if e["role"] == TRAINING):
            ks, ka = keys[s["path"]], keys[a["path"]]
            if same_transactions(ks.ids, ks.rows, ka.ids, ka.rows):
                out[s["path"]] = a["path"]
    return out
