"""A dataset's manifest (``manifest.json``), its publishing point: a file not in it does not exist for workers.

It records each file's role, its first and last day and time, taken from ``TX_DATETIME`` (never from
file names), where it came from, and how its files are read (``workload.data.reading``: the user's
column names, their date format). It is written when a dataset is published (``workload.data.publish``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from workload.data.cycle import CYCLE, RETIRED, Cycle
from workload.data.dayfile import ROLES, DatasetError, describe, labelled, place, read_transactions
from workload.data.reading import AS_IS, Reading
from workload.data.rules import RowHashes, check_dataset
from workload.share.fsutil import atomic_write_text

MANIFEST = "manifest.json"


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
                  reading: Reading = AS_IS, cycle: Cycle | None = None,
                  retired: list[dict[str, Any]] | None = None) -> None:
    """The manifest is the publishing point: a file not in it does not exist for workers. `cycle`: the
    daily cycle's rule (``workload.data.cycle``), `retired`: the entries that left the manifest."""
    order = {role: i for i, role in enumerate(ROLES)}
    files = sorted(entries, key=lambda e: (order[e["role"]], place(e), e["path"]))
    record = {"source": source, **({"reading": reading.record()} if reading != AS_IS else {}),
              **({CYCLE: cycle.record()} if cycle else {}), "files": files, **({RETIRED: retired} if retired else {})}
    atomic_write_text(root / MANIFEST, json.dumps(record, indent=1) + "\n")


def manifest_reading(manifest: dict[str, Any]) -> Reading:
    """How the files of a published dataset are read (the default for manifests that record none)."""
    return Reading.from_record(manifest.get("reading"))


def manifest_cycle(manifest: dict[str, Any]) -> Cycle | None:
    """The daily cycle a published dataset follows; None for a fixed holdout."""
    return Cycle.from_record(manifest.get(CYCLE))


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
            keys[rel] = RowHashes.of(frame)
    check_dataset(entries, keys, str(root))
    save_manifest(root, entries, source=None)
    return entries
